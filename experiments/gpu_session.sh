#!/usr/bin/env bash
# Runs several stages on a GPU host in one call, each with its own time limit, so one failing stage does not
# cost the others. Logs go to $OUT/logs/<stage>.log, a one-line status per stage to $OUT/summary.txt; stages
# write results under $OUT/<anything>. At the end everything but summary.txt and weights is packed into
# $OUT/all.tar.gz (the device tool returns at most 8 files of at most 16 MiB).
#
#   experiments/gpu_session.sh 'name=seconds=command' ...
#
# KEEP=<directory under $OUT> (e.g. a warm start's HF export, weights included) also comes back whole, as
# keep.tar.part00, part01, ... of at most 15 MiB each (at most 6 parts): `cat keep.tar.part* | tar x -C DEST`
# rebuilds it here, and a later call can carry DEST (e.g. to start RL from it with --config.init_from=DEST).
#
# Carried wheels in .whl/ (ml-collections and tensorboardX, which the GPU image lacks: `pip download --no-deps
# ml-collections tensorboardX -d .whl`) are installed to /tmp/site first.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/logs"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,power.draw --format=csv | tee "$OUT/summary.txt"
for spec in "$@"; do
  name=${spec%%=*}; rest=${spec#*=}; limit=${rest%%=*}; cmd=${rest#*=}
  start=$(date +%s)
  echo "=== $name (limit ${limit}s): $cmd"
  timeout -k 15 "$limit" bash -c "$cmd" >"$OUT/logs/$name.log" 2>&1
  rc=$?
  line="$name rc=$rc $(( $(date +%s) - start ))s"
  echo "$line" | tee -a "$OUT/summary.txt"
  tail -n 25 "$OUT/logs/$name.log"
done
# The device tool returns files of at most 16 MiB: weights and checkpoints (Orbax dirs, safetensors) stay behind,
# and if the pack is still too large, so do rollout JSONL files (metrics, logs and evaluation reports come back).
excl=(--exclude='*/checkpoints' --exclude='*.safetensors')
tar czf /tmp/all.tar.gz "${excl[@]}" -C "$OUT" .
echo "all.tar.gz leaves out checkpoints/ and *.safetensors" >> "$OUT/summary.txt"
if [ "$(stat -c %s /tmp/all.tar.gz)" -gt $((15 * 1024 * 1024)) ]; then
  echo "all.tar.gz was over 15 MiB: packed again without rollout files" >> "$OUT/summary.txt"
  tar czf /tmp/all.tar.gz "${excl[@]}" --exclude='*rollouts*' -C "$OUT" .
fi
rm -f /tmp/keep.tar.part*
if [ -n "${KEEP:-}" ]; then
  if [ -d "$OUT/$KEEP" ]; then
    tar cf - -C "$OUT/$KEEP" . | split -b 15M -d -a 2 - /tmp/keep.tar.part
    if [ "$(ls /tmp/keep.tar.part* | wc -l)" -gt 6 ]; then
      echo "KEEP=$KEEP is over 6 x 15 MiB: not returned" >> "$OUT/summary.txt"; rm -f /tmp/keep.tar.part*
    else
      echo "KEEP=$KEEP returned as $(ls /tmp/keep.tar.part* | wc -l) keep.tar.part* files" >> "$OUT/summary.txt"
    fi
  else
    echo "KEEP=$KEEP: no such directory under \$OUT" >> "$OUT/summary.txt"
  fi
fi
cp "$OUT/summary.txt" /tmp/summary.txt
find "$OUT" -mindepth 1 -delete && mv /tmp/all.tar.gz /tmp/summary.txt "$OUT/"
if ls /tmp/keep.tar.part* >/dev/null 2>&1; then mv /tmp/keep.tar.part* "$OUT/"; fi
echo "=== summary"; cat "$OUT/summary.txt"
