#!/usr/bin/env bash
# LLD-5's dial levels (lld5.md, part 1): the sampler-learner gap each level of the mismatch dial opens, from
# learn2's warm-start, in short GRPO runs at the study's rate (3 steps of 16 questions x 5 samples, updates of
# 40, no probes, no evaluation, one thread). Prints one line per level from the runs' mismatch/ metrics.
#   scripts/lld5_dial_levels.sh [WARMSTART]        # runs go to $OUT (default runs/lld5_dial)
# SMALL=1 shrinks every size (a smoke test on a tiny model, no warm-start needed).
set -euo pipefail
SG=${SEARCHGYM:-searchgym}
PY=${PYTHON:-python}
OUT=${OUT:-runs/lld5_dial}
WARM=${1:-runs/learn2/warmstart/checkpoint.pt}
LR=${LR:-1e-3}
if [ "${SMALL:-0}" = 1 ]; then
  START="--tiny-layers 1 --tiny-hidden 16"; SIZES="--questions-per-step 2 --group-size 2 --minibatch-size 2"
  ENVSIZE="--max-turn-tokens 8 --max-turns 2"; STEPS=2
else
  START="--init $WARM"; SIZES="--questions-per-step 16 --group-size 5 --minibatch-size 40"
  ENVSIZE="--max-turn-tokens 48 --max-context-tokens 1024"; STEPS=3
fi
LEVELS=${LEVELS:-"bf16:--sampler-dtype=bfloat16 noise0.1:--sampler-noise=0.1 noise0.3:--sampler-noise=0.3 noise1:--sampler-noise=1.0 stale1:--sampler-stale=1 stale2:--sampler-stale=2"}
mkdir -p "$OUT"
for level in $LEVELS; do
  name=${level%%:*}; opts=${level#*:}
  # shellcheck disable=SC2086
  "$SG" train grpo $START $ENVSIZE $SIZES ${opts//,/ } --run-dir "$OUT/$name" --overwrite --seed 0 --steps "$STEPS" \
    --lr "$LR" --lr-schedule constant --warmup-steps 0 --temperature 1 --llds none --kl-coef 0 --entropy-coef 0 \
    --weight-decay 0 --probe-size 0 --onpolicy-probe-size 0 --ledger-size 0 --eval-questions 0 --save-every 0 \
    --threads 1 --no-progress --no-tensorboard > "$OUT/$name.log" 2>&1 || { echo "FAILED $name (see $OUT/$name.log)"; exit 1; }
done
"$PY" - "$OUT" $LEVELS <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
keys = ("mismatch/kl_k3", "mismatch/gap_mean", "mismatch/gap_abs_p99", "mismatch/ratio_p01", "mismatch/ratio_p99")
print("| level | options | " + " | ".join(k.split("/")[1] + " (median over steps)" for k in keys) + " |")
print("| --- | --- |" + " --- |" * len(keys))
for level in sys.argv[2:]:
    name, opts = level.split(":", 1)
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("step", 0) > 0]
    cells = [f"{statistics.median(float(r[k]) for r in rows):.4g}" for k in keys]
    print(f"| {name} | `{opts.replace('=', ' ')}` | " + " | ".join(cells) + " |")
PY
