#!/usr/bin/env bash
# The pre-registered LLD-2 experiment of docs/experiments/lld2.md, stage by stage.
#   scripts/lld2_experiment.sh warmstart      # demonstrations + the SFT warm-start (3 epochs, linear decay)
#   scripts/lld2_experiment.sh gate [CKPT]    # the warm-start gate: validation EM (greedy) and sampled reward
#   scripts/lld2_experiment.sh extend N       # gate not met: half an epoch more (N = 1, 2), from the last stage
#   scripts/lld2_experiment.sh runs [SEEDS]   # arms A-D, seed-major, JOBS at a time (default seeds 0 1 2 3 4)
#   scripts/lld2_experiment.sh summarize      # one small JSON per finished run into docs/experiments/lld2/
# Runs go to $OUT (default runs/lld2); WARM names the checkpoint GRPO starts from (default: the last SFT stage).
# SMALL=1 shrinks every budget (a smoke test of the stages, minutes on a laptop; not the experiment).
set -euo pipefail
SG=${SEARCHGYM:-searchgym}
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-runs/lld2}
JOBS=${JOBS:-2}
SUMMARIES=${SUMMARIES:-$HERE/../docs/experiments/lld2}
if [ "${SMALL:-0}" = 1 ]; then
  STEPS=${STEPS:-2}; EVALQ=2; EVAL_EVERY=2; GATEQ=2; EPOCHS=1; DEMO_ARGS="--episodes 20"; MODEL="--tiny-layers 1 --tiny-hidden 32"
  PROBES="--probe-size 2 --onpolicy-probe-size 2 --ledger-size 8"; WORLDS=""
  SIZES="--questions-per-step 1 --group-size 2 --minibatch-size 2 --max-turn-tokens 8"
else
  STEPS=${STEPS:-80}; EVALQ=500; EVAL_EVERY=40; GATEQ=500; EPOCHS=3; DEMO_ARGS=""; MODEL="--tiny-layers 3 --tiny-hidden 128"
  PROBES="--probe-size 64 --onpolicy-probe-size 64 --ledger-size 200"; WORLDS="1 2"
  SIZES="--questions-per-step 10 --group-size 5 --minibatch-size 5"
fi
mkdir -p "$OUT"

last_stage() {  # the newest SFT stage's checkpoint
  local c="$OUT/sft/checkpoint.pt"
  for n in 1 2; do [ -f "$OUT/sft_ext$n/checkpoint.pt" ] && c="$OUT/sft_ext$n/checkpoint.pt"; done
  echo "$c"
}

grpo() {  # grpo ARM SEED [options...]
  local arm=$1 seed=$2; shift 2
  local dir="$OUT/$arm/s$seed" warm=${WARM:-$(last_stage)}
  [ -f "$dir/checkpoint.pt" ] && { echo "skip $dir (done)"; return 0; }
  mkdir -p "$dir"
  /usr/bin/time -f "%e" -o "$dir/wall_s" "$SG" train grpo --init "$warm" --run-dir "$dir" --overwrite \
    --seed "$seed" --steps "$STEPS" --lr 1.2e-3 --warmup-steps "$STEPS" --warmup-start-lr 1e-4 \
    $SIZES --temperature 1 --kl-coef 0 --entropy-coef 0 \
    --eval-questions "$EVALQ" --eval-batch 100 --eval-every "$EVAL_EVERY" --onpolicy-heldout-split validation \
    $PROBES --save-every 0 --threads 1 --no-progress --no-tensorboard "$@" > "$dir/log.txt" 2>&1
  echo "done $dir ($(cat "$dir/wall_s") s)"
  "$PY" "$HERE/lld_report.py" summarize "$OUT" --out "$SUMMARIES" --only "$arm/s$seed"
}
export -f grpo last_stage
export SG PY HERE OUT STEPS EVALQ EVAL_EVERY PROBES SIZES SUMMARIES

case "${1:-}" in
  warmstart)
    $SG demos --split train --max-turn-tokens 48 $DEMO_ARGS --out "$OUT/d0.jsonl"
    for s in $WORLDS; do for sp in train validation test; do
      $SG demos --world-seed "$s" --split "$sp" --max-turn-tokens 48 --out "$OUT/d${s}_${sp}.jsonl"
    done; done
    cat "$OUT"/d0.jsonl $(for s in $WORLDS; do echo "$OUT"/d"${s}"_*.jsonl; done) > "$OUT/demos.jsonl"
    $SG train sft --run-dir "$OUT/sft" --overwrite --demos "$OUT/demos.jsonl" $MODEL \
      --epochs "$EPOCHS" --batch-size 16 --lr 2e-3 --warmup-steps 20 --lr-schedule linear --max-turn-tokens 48 \
      --max-context-tokens 1024 --eval-split validation --eval-questions "$GATEQ" --eval-batch 100 \
      --threads 2 --no-progress --no-tensorboard
    ;;
  gate)
    ckpt=${2:-$(last_stage)}
    "$PY" "$HERE/lld_report.py" gate "$ckpt" --questions "$GATEQ" --out "$SUMMARIES/gate_$(basename "$(dirname "$ckpt")").json"
    ;;
  extend)
    n=${2:?extend 1 or extend 2}
    prev=$(last_stage)
    "$PY" -c "import random,sys; l=open(sys.argv[1]).readlines(); random.Random(int(sys.argv[3])).shuffle(l); open(sys.argv[2],'w').writelines(l[:len(l)//2])" \
      "$OUT/demos.jsonl" "$OUT/demos_half$n.jsonl" "$n"
    $SG train sft --init "$prev" --run-dir "$OUT/sft_ext$n" --overwrite --demos "$OUT/demos_half$n.jsonl" \
      --epochs 1 --batch-size 16 --lr 1e-3 --warmup-steps 0 --lr-schedule linear --max-turn-tokens 48 \
      --max-context-tokens 1024 --eval-split validation --eval-questions "$GATEQ" --eval-batch 100 \
      --threads 2 --no-progress --no-tensorboard
    ;;
  runs)
    shift
    seeds=${*:-0 1 2 3 4}
    {
      for s in $seeds; do
        echo "A $s --llds none"
        echo "D $s --llds none --skip-zero-signal"
        echo "B $s --llds action --lambda 0.2"
        echo "C $s --llds action --lambda 0.2 --llds-ledger --ledger-lambda 0.2 --ledger-batch 5"
      done
    } | xargs -P "$JOBS" -L 1 bash -c 'grpo "$@"' _
    ;;
  summarize)
    "$PY" "$HERE/lld_report.py" summarize "$OUT" --out "$SUMMARIES"
    ;;
  *)
    sed -n 2,9p "$0"; exit 2
    ;;
esac
