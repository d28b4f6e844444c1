#!/usr/bin/env bash
# The pre-registered study of docs/experiments/learn2.md (RL beyond imitation), stage by stage.
#   scripts/learn2_experiment.sh warmstart        # headroom demonstrations, then 2 SFT epochs on them from sft_ext2
#   RECIPE=1 scripts/learn2_experiment.sh warmstart   # or: `searchgym warmstart --recipe headroom` from nothing
#   scripts/learn2_experiment.sh headroom         # bench headroom on the warm-start and on sft_ext2 (the gate)
#   scripts/learn2_experiment.sh runs [SEEDS]     # control, grpo, scst, sft per seed, seed-major, JOBS at a time
#   scripts/learn2_experiment.sh lever NAME SEED ADVANTAGE [OPTIONS...]   # one extra paired GRPO arm
#   scripts/learn2_experiment.sh summarize        # one small JSON per finished run into docs/experiments/learn2/
# Runs go to $OUT (default runs/learn2); BASE names the oracle warm-start (default: the cached sft_ext2
# stage); MIX the demonstrator. RECIPE=1 builds the warm-start with the package's recipe instead (no cached
# file: its world has one passage per search, so every stage then plays --topk 1, and the recipe's
# demonstrations are the continued-SFT arm's). SMALL=1 shrinks every budget (a smoke test on a tiny model).
set -euo pipefail
SG=${SEARCHGYM:-searchgym}
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-runs/learn2}
JOBS=${JOBS:-2}
SUMMARIES=${SUMMARIES:-$HERE/../docs/experiments/learn2}
MIX=${MIX:-mix:oracle=0.1,shortcut=0.9}
ENVSIZE="--max-turn-tokens 48 --max-context-tokens 1024"
if [ "${SMALL:-0}" = 1 ]; then
  BASE=${BASE:-}; STEPS=${STEPS:-2}; MODEL="--tiny-layers 1 --tiny-hidden 32"; ENVSIZE="--max-turn-tokens 8"
  DEMOS="--episodes 8"; WARMSFT="--epochs 1 --batch-size 4"; SFTARM="--epochs 1 --batch-size 4"
  SIZES="--questions-per-step 2 --group-size 2 --minibatch-size 2"
  EVAL="--eval-questions 2 --eval-batch 2 --eval-every 1"; PROBES="--probe-size 2 --onpolicy-probe-size 2 --probe-every 1"
  HEADROOM="--questions 2 --samples 2"
else
  BASE=${BASE:-$HERE/../../shared/cache/lld2_warmstart/sft_ext2/checkpoint.pt}; STEPS=${STEPS:-40}; MODEL=""
  DEMOS=""; WARMSFT="--epochs 2 --batch-size 16"; SFTARM="--epochs 3 --batch-size 120"
  SIZES="--questions-per-step 48 --group-size 5 --minibatch-size 120"
  EVAL="--eval-questions 1000 --eval-batch 100 --eval-every 20"
  PROBES="--probe-size 64 --onpolicy-probe-size 64 --probe-every 10"
  HEADROOM="--questions 300 --samples 8"
fi
WARM=$OUT/warmstart/checkpoint.pt
if [ "${RECIPE:-0}" = 1 ]; then
  ENVSIZE="$ENVSIZE --topk 1"; BASE=""
  RECIPE_SIZE=""; [ "${SMALL:-0}" = 1 ] && RECIPE_SIZE="--layers 1 --hidden 32 --epochs 1 --batch-size 4 --demos-per-world 8"
fi
mkdir -p "$OUT" "$SUMMARIES"

grpo() {  # grpo ARM SEED LR ADVANTAGE [options...]
  local arm=$1 seed=$2 lr=$3 adv=$4; shift 4
  local dir="$OUT/$arm/s$seed"
  [ -f "$dir/checkpoint.pt" ] && { echo "skip $dir (done)"; return 0; }
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  /usr/bin/time -f "%e" -o "$dir/wall_s" "$SG" train grpo --init "$WARM" $ENVSIZE --run-dir "$dir" --overwrite \
    --seed "$seed" --steps "$STEPS" --lr "$lr" --warmup-steps 0 --lr-schedule constant $SIZES \
    --temperature 1 --advantage "$adv" --reward em --llds none --kl-coef 0 --entropy-coef 0 --weight-decay 0 \
    --adam-betas 0.9,0.999 $PROBES --ledger-size 0 --eval-split test $EVAL --save-every 0 --threads 1 \
    --no-progress --no-tensorboard "$@" > "$dir/log.txt" 2>&1 || { echo "FAILED $dir (see $dir/log.txt)"; return 1; }
  echo "done $dir ($(cat "$dir/wall_s") s)"
  "$PY" "$HERE/lld_report.py" learn2-summarize "$OUT" --out "$SUMMARIES" --only "$arm/s$seed"
}

sft() {  # sft SEED: continued SFT on the same demonstrations, compute-matched to the GRPO arms
  local seed=$1 dir="$OUT/sft/s$1"
  [ -f "$dir/checkpoint.pt" ] && { echo "skip $dir (done)"; return 0; }
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  /usr/bin/time -f "%e" -o "$dir/wall_s" "$SG" train sft --init "$WARM" $ENVSIZE --run-dir "$dir" --overwrite \
    --demos "$OUT/demos_headroom.jsonl" --keep-unrewarded $SFTARM --lr 3e-4 --warmup-steps 0 \
    --lr-schedule constant --seed "$seed" --eval-split test ${EVAL% --eval-every*} --threads 1 \
    --no-progress --no-tensorboard > "$dir/log.txt" 2>&1 || { echo "FAILED $dir (see $dir/log.txt)"; return 1; }
  echo "done $dir ($(cat "$dir/wall_s") s)"
  "$PY" "$HERE/lld_report.py" learn2-summarize "$OUT" --out "$SUMMARIES" --only "sft/s$seed"
}

arm() {  # arm NAME SEED: one arm of the protocol
  case $1 in
    control) grpo control "$2" 0 group --eval-at-start ;;
    grpo) grpo grpo "$2" 3e-4 group --no-eval-at-start ;;
    scst) grpo scst "$2" 3e-4 greedy --no-eval-at-start ;;
    sft) sft "$2" ;;
  esac
}
export -f grpo sft arm
export SG PY HERE OUT STEPS WARM MODEL SIZES EVAL PROBES SUMMARIES ENVSIZE SFTARM

case "${1:-}" in
  warmstart)
    if [ "${RECIPE:-0}" = 1 ]; then
      # shellcheck disable=SC2086
      "$SG" warmstart --recipe headroom --run-dir "$OUT/warmstart" --overwrite --seed 0 --threads 2 $RECIPE_SIZE \
        --eval-questions "$(set -- $EVAL; echo "$2")" --headroom-questions 0 --no-progress
      cp "$OUT/warmstart/demos.jsonl" "$OUT/demos_headroom.jsonl"
      sha256sum "$WARM"
      exit 0
    fi
    # shellcheck disable=SC2086
    "$SG" demos --split train $ENVSIZE $DEMOS --demonstrator "$MIX" --seed 0 --out "$OUT/demos_headroom.jsonl"
    # shellcheck disable=SC2086
    /usr/bin/time -f "%e" -o "$OUT/warmstart_wall_s" "$SG" train sft ${BASE:+--init $BASE} $MODEL $ENVSIZE \
      --run-dir "$OUT/warmstart" --overwrite --demos "$OUT/demos_headroom.jsonl" --keep-unrewarded $WARMSFT \
      --lr 5e-4 --warmup-steps 0 --lr-schedule constant --seed 0 --eval-split test ${EVAL% --eval-every*} \
      --threads 2 --no-progress --no-tensorboard
    sha256sum "$WARM"
    ;;
  headroom)
    for name in warmstart ${BASE:+base}; do
      ckpt=$WARM; [ "$name" = base ] && ckpt=$BASE
      # shellcheck disable=SC2086
      "$SG" bench headroom --init "$ckpt" $ENVSIZE $HEADROOM --temperatures 1 --seed 0 --threads 2 \
        --out "$OUT/headroom_$name.jsonl" --json > "$SUMMARIES/headroom_$name.json"
      echo "wrote $SUMMARIES/headroom_$name.json"
    done
    ;;
  runs)
    shift
    seeds=${*:-0 1 2}
    for s in $seeds; do for a in control grpo scst sft; do echo "$a $s"; done; done \
      | xargs -P "$JOBS" -L 1 bash -c 'arm "$@"' _
    ;;
  lever)
    shift
    name=$1 seed=$2 adv=$3; shift 3
    grpo "$name" "$seed" 3e-4 "$adv" --no-eval-at-start "$@"
    ;;
  summarize)
    "$PY" "$HERE/lld_report.py" learn2-summarize "$OUT" --out "$SUMMARIES"
    ;;
  *)
    sed -n '2,/SMALL=1/p' "$0"; exit 2
    ;;
esac
