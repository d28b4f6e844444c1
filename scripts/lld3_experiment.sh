#!/usr/bin/env bash
# The pre-registered collapse study of docs/experiments/lld3.md.
#   scripts/lld3_experiment.sh runs [SEEDS]       # control, grpo, llds, ledger, sapo per seed, seed-major, JOBS at a time
#   scripts/lld3_experiment.sh arm ARM SEED       # one run of one arm
#   scripts/lld3_experiment.sh summarize          # one small JSON per finished run into docs/experiments/lld3/
# Runs go to $OUT (default runs/lld3); WARM names the checkpoint GRPO starts from (default: the cached
# sft_ext2 stage, its sha256 checked). SMALL=1 shrinks every budget (a smoke test on a tiny random model).
set -euo pipefail
SG=${SEARCHGYM:-searchgym}
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-runs/lld3}
JOBS=${JOBS:-2}
SUMMARIES=${SUMMARIES:-$HERE/../docs/experiments/lld3}
WARM_SHA256=95b3335a
if [ "${SMALL:-0}" = 1 ]; then
  WARM=${WARM:-}; STEPS=${STEPS:-2}; MODEL="--tiny-layers 1 --tiny-hidden 32 --max-turn-tokens 8"
  SIZES="--questions-per-step 2 --group-size 2 --minibatch-size 2"
  RAMP="--lr 1e-3 --warmup-start-lr 1e-4 --warmup-steps 2"
  EVAL="--eval-questions 2 --eval-batch 2 --eval-every 1"
  PROBES="--probe-size 2 --onpolicy-probe-size 2 --probe-every 1 --ledger-size 4"; TESTQ=2
else
  WARM=${WARM:-$HERE/../../shared/cache/lld2_warmstart/sft_ext2/checkpoint.pt}; STEPS=${STEPS:-100}; MODEL=""
  SIZES="--questions-per-step 48 --group-size 5 --minibatch-size 120"
  RAMP="--lr 1e-3 --warmup-start-lr 1e-4 --warmup-steps 80"  # GRPO's schedule counts training steps
  EVAL="--eval-questions 500 --eval-batch 100 --eval-every 25"
  PROBES="--probe-size 64 --onpolicy-probe-size 64 --probe-every 5 --ledger-size 200"; TESTQ=500
  if [ "${1:-}" = runs ] || [ "${1:-}" = arm ]; then  # the stages that train from it
    [ -f "$WARM" ] || { echo "warm-start $WARM: no such file (set WARM=PATH)" >&2; exit 1; }
    sha=$(sha256sum "$WARM" | cut -c1-${#WARM_SHA256})
    [ "$sha" = "$WARM_SHA256" ] || { echo "warm-start $WARM: sha256 $sha..., expected $WARM_SHA256..." >&2; exit 1; }
  fi
fi
INIT=${WARM:+--init $WARM}
mkdir -p "$OUT"

arm_options() {  # the options that make ARM what lld3.md's table says
  case "$1" in
    control) echo "--lr 0 --warmup-steps 0 --llds none" ;;
    grpo) echo "$RAMP --llds none" ;;
    llds) echo "$RAMP --llds action --lambda 0.2" ;;
    ledger) echo "$RAMP --llds action --lambda 0.2 --llds-ledger --ledger-lambda 0.2" ;;
    sapo) echo "$RAMP --llds none --sapo-coef 0.2 --sapo-threshold 0.8" ;;
    *) echo "unknown arm $1 (control, grpo, llds, ledger, sapo)" >&2; return 1 ;;
  esac
}

run_arm() {  # run_arm ARM SEED
  local arm=$1 seed=$2 dir="$OUT/$1/s$2" options start
  options=$(arm_options "$arm")
  [ -f "$dir/checkpoint.pt" ] && { echo "skip $dir (done)"; return 0; }
  [ "$arm" = control ] && start=--eval-at-start || start=--no-eval-at-start
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  /usr/bin/time -f "%e" -o "$dir/wall_s" "$SG" train grpo $INIT $MODEL --run-dir "$dir" --overwrite \
    --seed "$seed" --steps "$STEPS" $options --lr-schedule constant $SIZES --temperature 1 \
    --advantage group --reward em --kl-coef 0 --entropy-coef 0 --weight-decay 0 --adam-betas 0.9,0.999 \
    $PROBES --eval-split test $EVAL $start --save-every 0 --threads 1 --no-progress --no-tensorboard \
    > "$dir/log.txt" 2>&1 || { echo "FAILED $dir (see $dir/log.txt)"; return 1; }
  "$PY" "$HERE/lld_report.py" gate "$dir/checkpoint.pt" --split test --questions "$TESTQ" --threads 1 \
    --out "$dir/sampled_test.json" > /dev/null
  echo "done $dir ($(cat "$dir/wall_s") s)"
  "$PY" "$HERE/lld_report.py" lld3-summarize "$OUT" --out "$SUMMARIES" --only "$arm/s$seed"
}
export -f arm_options run_arm
export SG PY HERE OUT STEPS INIT MODEL SIZES RAMP EVAL PROBES TESTQ SUMMARIES

case "${1:-}" in
  runs)
    shift
    for s in ${*:-0 1 2}; do
      for arm in control grpo llds ledger sapo; do echo "$arm $s"; done
    done | xargs -P "$JOBS" -L 1 bash -c 'run_arm "$@"' _
    ;;
  arm)
    shift
    run_arm "$@"
    ;;
  summarize)
    "$PY" "$HERE/lld_report.py" lld3-summarize "$OUT" --out "$SUMMARIES"
    ;;
  *)
    sed -n 2,7p "$0"; exit 2
    ;;
esac
