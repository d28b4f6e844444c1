#!/usr/bin/env bash
# The pre-registered learning study of docs/experiments/learn.md, stage by stage.
#   scripts/learn_experiment.sh gns              # the gradient noise scale at the warm-start (the batch rule's input)
#   scripts/learn_experiment.sh runs [SEEDS]     # control, lr1e-4, lr3e-4 per seed, seed-major, JOBS at a time
#   scripts/learn_experiment.sh lever NAME SEED LR [OPTIONS...]   # one extra paired arm (the protocol's levers)
#   scripts/learn_experiment.sh summarize        # one small JSON per finished run into docs/experiments/learn/
# Runs go to $OUT (default runs/learn); WARM names the checkpoint GRPO starts from (default: the cached
# sft_ext2 stage). SMALL=1 shrinks every budget (a smoke test of the stages on a tiny random model).
set -euo pipefail
SG=${SEARCHGYM:-searchgym}
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-runs/learn}
JOBS=${JOBS:-2}
SUMMARIES=${SUMMARIES:-$HERE/../docs/experiments/learn}
if [ "${SMALL:-0}" = 1 ]; then
  WARM=${WARM:-}; STEPS=${STEPS:-2}; NGROUPS=4; MODEL="--tiny-layers 1 --tiny-hidden 32 --max-turn-tokens 8"
  SIZES="--questions-per-step 2 --group-size 2 --minibatch-size 2"
  EVAL="--eval-questions 2 --eval-batch 2 --eval-every 1"; PROBES="--probe-size 2 --onpolicy-probe-size 2 --probe-every 1"
  TESTQ=2
else
  WARM=${WARM:-$HERE/../../shared/cache/lld2_warmstart/sft_ext2/checkpoint.pt}; STEPS=${STEPS:-100}; NGROUPS=512
  MODEL=""; SIZES="--questions-per-step 48 --group-size 5 --minibatch-size 120"
  EVAL="--eval-questions 500 --eval-batch 100 --eval-every 50"
  PROBES="--probe-size 64 --onpolicy-probe-size 64 --probe-every 5"; TESTQ=500
fi
INIT=${WARM:+--init $WARM}
mkdir -p "$OUT"

grpo() {  # grpo ARM SEED LR [options...]
  local arm=$1 seed=$2 lr=$3; shift 3
  local dir="$OUT/$arm/s$seed"
  [ -f "$dir/checkpoint.pt" ] && { echo "skip $dir (done)"; return 0; }
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  /usr/bin/time -f "%e" -o "$dir/wall_s" "$SG" train grpo $INIT $MODEL --run-dir "$dir" --overwrite \
    --seed "$seed" --steps "$STEPS" --lr "$lr" --warmup-steps 0 --lr-schedule constant $SIZES \
    --temperature 1 --advantage group --reward em --llds none --kl-coef 0 --entropy-coef 0 --weight-decay 0 \
    --adam-betas 0.9,0.999 $PROBES --ledger-size 0 --eval-split test $EVAL --save-every 0 --threads 1 \
    --no-progress --no-tensorboard "$@" > "$dir/log.txt" 2>&1 || { echo "FAILED $dir (see $dir/log.txt)"; return 1; }
  "$PY" "$HERE/lld_report.py" gate "$dir/checkpoint.pt" --split test --questions "$TESTQ" --threads 1 \
    --out "$dir/sampled_test.json" > /dev/null
  echo "done $dir ($(cat "$dir/wall_s") s)"
  "$PY" "$HERE/lld_report.py" learn-summarize "$OUT" --out "$SUMMARIES" --only "$arm/s$seed"
}
export -f grpo
export SG PY HERE OUT STEPS INIT MODEL SIZES EVAL PROBES TESTQ SUMMARIES

case "${1:-}" in
  gns)
    # shellcheck disable=SC2086
    "$SG" bench gns $INIT $MODEL --seed 0 --groups "$NGROUPS" $SIZES --temperature 1 --kl-coef 0 \
      --entropy-coef 0 --threads 1 --json > "$OUT/gns.json"
    cp "$OUT/gns.json" "$SUMMARIES/gns_warmstart.json" 2>/dev/null || { mkdir -p "$SUMMARIES"; cp "$OUT/gns.json" "$SUMMARIES/gns_warmstart.json"; }
    cat "$OUT/gns.json"
    ;;
  runs)
    shift
    seeds=${*:-0 1 2}
    {
      for s in $seeds; do
        echo "control $s 0 --eval-at-start"
        echo "lr1e-4 $s 1e-4 --no-eval-at-start"
        echo "lr3e-4 $s 3e-4 --no-eval-at-start"
      done
    } | xargs -P "$JOBS" -L 1 bash -c 'grpo "$@"' _
    ;;
  lever)
    shift
    grpo "$@" --no-eval-at-start
    ;;
  summarize)
    "$PY" "$HERE/lld_report.py" learn-summarize "$OUT" --out "$SUMMARIES"
    ;;
  *)
    sed -n 2,8p "$0"; exit 2
    ;;
esac
