#!/usr/bin/env bash
# One call on a lent GPU (the `device` tool's `run`; 10 minutes a call): trains a drafter for the
# embedded Gemma 3 270M from configs/train_$DRAFTER.py (eagle by default, medusa or distilled), the same config
# CPU training uses, and brings back the trained drafter, its metrics and its curve in $OUT.
#
#   device run: DRAFTER=eagle bash benchmarks/gpu_train.sh [--config.key=value ...]
#   a CPU dry run: SPECJAX_VENV=.venv ARG=:tiny OUT=/tmp/out bash benchmarks/gpu_train.sh
#   the instructions recipe continues the default recipe's drafter; on a bare machine that is the
#   shipped one: ARG=:instructions bash benchmarks/gpu_train.sh --config.init_from=embedded
#
# A fresh machine is bare: the first step installs specjax with the CUDA wheels (`.[cuda]`). Training
# stops at TRAIN_S seconds (default 420, so the call ends inside its limit) and keeps its Orbax
# checkpoints; what it reached is exported either way. The drafter comes back as drafter.tar
# (Orbax weights + drafter.json with the command and data recipe).
set -uo pipefail
OUT=${OUT:?set OUT to the folder that comes back}
ARG=${ARG:-}
DRAFTER=${DRAFTER:-eagle}
RUN_DIR=results/train_${DRAFTER}-gpu${ARG//[:,=]/_}
VENV=${SPECJAX_VENV:-}
if [ -z "$VENV" ]; then
  VENV=.venv-gpu
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q -e '.[cuda,report]' || exit 1
fi
export PYTHONUNBUFFERED=1
"$VENV/bin/python" -c 'import jax; print("devices:", jax.devices())' | tee "$OUT/devices.txt"
timeout "${TRAIN_S:-420}" "$VENV/bin/python" -m specjax.train --config="configs/train_${DRAFTER}.py$ARG" \
  --config.output_dir="$RUN_DIR" "$@" 2>&1 | grep -v orbax | tee "$OUT/train.log"
status=${PIPESTATUS[0]}
echo "train exit status: $status" | tee -a "$OUT/train.log"
for f in metrics.jsonl curve.png; do [ -f "$RUN_DIR/$f" ] && cp "$RUN_DIR/$f" "$OUT/"; done
[ -d "$RUN_DIR/drafter" ] && tar -C "$RUN_DIR" -cf "$OUT/drafter.tar" drafter
exit "$status"
