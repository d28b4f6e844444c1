#!/usr/bin/env bash
# The pre-registered LLD experiment of docs/experiments/lld.md, stage by stage.
#   scripts/lld_experiment.sh warmstart        # demonstrations + the intermediate SFT warm-start
#   scripts/lld_experiment.sh calibrate        # stage A: vanilla GRPO, seed 0, lr 5e-4 / 7e-4 / 1e-3
#   LR=7e-4 scripts/lld_experiment.sh main     # stage B: GRPO, GRPO+LLDS, GRPO+LLDS-MA, seeds 0-2
#   LR=7e-4 scripts/lld_experiment.sh secondary  # stage B, arm 4: GRPO+LLDS lambda 0.5
#   scripts/lld_experiment.sh report           # the tables (scripts/lld_report.py) and the plots
# Runs go to $OUT (default runs/lld); JOBS runs at a time, one torch thread each.
set -euo pipefail
SG=${SEARCHGYM:-searchgym}
OUT=${OUT:-runs/lld}
JOBS=${JOBS:-2}
STEPS=${STEPS:-45}
mkdir -p "$OUT"

grpo() {  # grpo NAME LR SEED [extra options...]
  local name=$1 lr=$2 seed=$3; shift 3
  local dir="$OUT/$name/s$seed"
  [ -f "$dir/checkpoint.pt" ] && { echo "skip $dir (done)"; return 0; }
  mkdir -p "$dir"
  /usr/bin/time -f "%e" -o "$dir/wall_s" "$SG" train grpo --init "$OUT/sft/checkpoint.pt" --run-dir "$dir" \
    --seed "$seed" --lr "$lr" --steps "$STEPS" --questions-per-step 10 --group-size 5 --minibatch-size 5 \
    --temperature 1 --kl-coef 0 --entropy-coef 0 --eval-questions 200 --eval-batch 100 --eval-every 15 \
    --save-every 0 --threads 1 --no-progress --no-tensorboard "$@" > "$dir/log.txt" 2>&1
  echo "done $dir ($(cat "$dir/wall_s") s)"
}
export -f grpo
export SG OUT STEPS

case "${1:-}" in
  warmstart)
    $SG demos --split train --max-turn-tokens 48 --out "$OUT/d0.jsonl"
    for s in 1 2; do for sp in train validation test; do
      $SG demos --world-seed $s --split $sp --max-turn-tokens 48 --out "$OUT/d${s}_${sp}.jsonl"
    done; done
    cat "$OUT"/d0.jsonl "$OUT"/d1_*.jsonl "$OUT"/d2_*.jsonl > "$OUT/demos.jsonl"
    $SG train sft --run-dir "$OUT/sft" --demos "$OUT/demos.jsonl" --tiny-layers 3 --tiny-hidden 128 \
      --epochs 3 --batch-size 16 --lr 2e-3 --lr-schedule constant --max-turn-tokens 48 \
      --max-context-tokens 1024 --eval-questions 1000 --eval-batch 100 --threads 2 --no-progress
    ;;
  calibrate)
    printf '%s\n' 5e-4 7e-4 1e-3 | xargs -P "$JOBS" -I{} bash -c 'grpo grpo_lr{} {} 0 --llds none'
    ;;
  main)
    : "${LR:?set LR to the lr stage A chose}"
    {
      for s in 0 1 2; do
        echo "grpo_lr$LR $LR $s --llds none"
        echo "llds_lr$LR $LR $s --llds action --lambda 0.2"
        echo "lldsma_lr$LR $LR $s --llds action --lambda 0.2 --llds-ma --llds-ma-schedule code"
      done
    } | xargs -P "$JOBS" -L 1 bash -c 'grpo "$@"' _
    ;;
  secondary)
    : "${LR:?set LR to the lr stage A chose}"
    printf '%s\n' 0 1 2 | xargs -P "$JOBS" -I{} bash -c "grpo llds05_lr$LR $LR {} --llds action --lambda 0.5"
    ;;
  report)
    python "$(dirname "$0")/lld_report.py" "$OUT"
    ;;
  *)
    sed -n 2,9p "$0"; exit 2
    ;;
esac
