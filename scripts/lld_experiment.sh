#!/usr/bin/env bash
# The pre-registered LLD experiment of docs/experiments/lld.md, stage by stage.
#   scripts/lld_experiment.sh warmstart        # demonstrations + the intermediate SFT warm-start
#   scripts/lld_experiment.sh calibrate        # stage A: vanilla GRPO, seed 0, lr 5e-4 / 7e-4 / 1e-3
#   LR=7e-4 scripts/lld_experiment.sh main     # stage B: GRPO, GRPO+LLDS, GRPO+LLDS-MA, seeds 0-2
#   LR=7e-4 scripts/lld_experiment.sh secondary  # stage B, arm 4: GRPO+LLDS lambda 0.5
#   scripts/lld_experiment.sh report           # the tables and verdicts (scripts/lld_report.py lld); PLOTS=DIR: figures
# Runs go to $OUT (default runs/lld); JOBS runs at a time, one torch thread each.
# SMALL=1 shrinks every budget, and seeds 0-2 to seed 0 (a smoke test of the stages, minutes; not the experiment).
set -euo pipefail
SG=${SEARCHGYM:-searchgym}
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-runs/lld}
JOBS=${JOBS:-2}
if [ "${SMALL:-0}" = 1 ]; then
  STEPS=${STEPS:-2}; EVALQ=2; EVAL_EVERY=2; SFT_EVALQ=2; EPOCHS=1; DEMO_ARGS="--episodes 20"; WORLDS=""
  MODEL="--tiny-layers 1 --tiny-hidden 32"; SEEDS="0"
  SIZES="--questions-per-step 1 --group-size 2 --minibatch-size 2 --max-turn-tokens 8 --probe-size 2 --onpolicy-probe-size 2"
else
  STEPS=${STEPS:-45}; EVALQ=200; EVAL_EVERY=15; SFT_EVALQ=1000; EPOCHS=3; DEMO_ARGS=""; WORLDS="1 2"
  MODEL="--tiny-layers 3 --tiny-hidden 128"; SEEDS="0 1 2"
  SIZES="--questions-per-step 10 --group-size 5 --minibatch-size 5"
fi
mkdir -p "$OUT"

grpo() {  # grpo NAME LR SEED [extra options...]
  local name=$1 lr=$2 seed=$3; shift 3
  local dir="$OUT/$name/s$seed"
  [ -f "$dir/checkpoint.pt" ] && { echo "skip $dir (done)"; return 0; }
  mkdir -p "$dir"
  /usr/bin/time -f "%e" -o "$dir/wall_s" "$SG" train grpo --init "$OUT/sft/checkpoint.pt" --run-dir "$dir" \
    --seed "$seed" --lr "$lr" --steps "$STEPS" $SIZES --temperature 1 --kl-coef 0 --entropy-coef 0 \
    --eval-questions "$EVALQ" --eval-batch 100 --eval-every "$EVAL_EVERY" --save-every 0 --threads 1 \
    --no-progress --no-tensorboard "$@" > "$dir/log.txt" 2>&1
  echo "done $dir ($(cat "$dir/wall_s") s)"
}
export -f grpo
export SG OUT STEPS EVALQ EVAL_EVERY SIZES

case "${1:-}" in
  warmstart)
    $SG demos --split train --max-turn-tokens 48 $DEMO_ARGS --out "$OUT/d0.jsonl"
    for s in $WORLDS; do for sp in train validation test; do
      $SG demos --world-seed "$s" --split "$sp" --max-turn-tokens 48 --out "$OUT/d${s}_${sp}.jsonl"
    done; done
    cat "$OUT"/d0.jsonl $(for s in $WORLDS; do echo "$OUT"/d"${s}"_*.jsonl; done) > "$OUT/demos.jsonl"
    $SG train sft --run-dir "$OUT/sft" --demos "$OUT/demos.jsonl" $MODEL \
      --epochs "$EPOCHS" --batch-size 16 --lr 2e-3 --lr-schedule constant --max-turn-tokens 48 \
      --max-context-tokens 1024 --eval-questions "$SFT_EVALQ" --eval-batch 100 --threads 2 --no-progress
    ;;
  calibrate)
    printf '%s\n' 5e-4 7e-4 1e-3 | xargs -P "$JOBS" -I{} bash -c 'grpo grpo_lr{} {} 0 --llds none'
    ;;
  main)
    : "${LR:?set LR to the lr stage A chose}"
    {
      for s in $SEEDS; do
        echo "grpo_lr$LR $LR $s --llds none"
        echo "llds_lr$LR $LR $s --llds action --lambda 0.2"
        echo "lldsma_lr$LR $LR $s --llds action --lambda 0.2 --llds-ma --llds-ma-schedule code"
      done
    } | xargs -P "$JOBS" -L 1 bash -c 'grpo "$@"' _
    ;;
  secondary)
    : "${LR:?set LR to the lr stage A chose}"
    printf '%s\n' $SEEDS | xargs -P "$JOBS" -I{} bash -c "grpo llds05_lr$LR $LR {} --llds action --lambda 0.5"
    ;;
  report)
    "$PY" "$HERE/lld_report.py" lld "$OUT" ${PLOTS:+--plots "$PLOTS"}
    ;;
  *)
    sed -n 2,10p "$0"; exit 2
    ;;
esac
