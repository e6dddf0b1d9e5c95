#!/usr/bin/env bash
# Runs several stages on a GPU host in one call, each with its own time limit, so one failing stage does not
# cost the others. Logs go to $OUT/logs/<stage>.log, a one-line status per stage to $OUT/summary.txt; stages
# write results under $OUT/<anything>. At the end everything but summary.txt and weights is packed into
# $OUT/all.tar.gz (the device tool returns at most 8 files of at most 16 MiB).
#
#   experiments/gpu_session.sh 'name=seconds=command' ...
#
# KEEP=<directory under $OUT> (e.g. a warm start's HF export, weights included) also comes back whole, as
# keep.tgz.part00, part01, ... of at most 15 MiB each (at most 6 parts, gzipped): `cat keep.tgz.part* > X.tgz`
# rebuilds the archive here, which a later call can carry (experiments/default_phases.sh starts from one).
#
# Carried wheels in .whl/ (ml-collections and tensorboardX, which the GPU image lacks: `pip download --no-deps
# ml-collections tensorboardX -d .whl`) are installed to /tmp/site first.
set -u
source "$(dirname "$0")/gpu_common.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/logs"
install_carried_wheels && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=1
gpu_info | tee "$OUT/summary.txt"
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
pack_results /tmp/all.tar.gz "$OUT" '*rollouts*' . >> "$OUT/summary.txt"
rm -f /tmp/keep.tgz.part*
if [ -n "${KEEP:-}" ]; then split_keep "$OUT/$KEEP" /tmp/keep.tgz.part >> "$OUT/summary.txt"; fi
cp "$OUT/summary.txt" /tmp/summary.txt
find "$OUT" -mindepth 1 -delete && mv /tmp/all.tar.gz /tmp/summary.txt "$OUT/"
if ls /tmp/keep.tgz.part* >/dev/null 2>&1; then mv /tmp/keep.tgz.part* "$OUT/"; fi
echo "=== summary"; cat "$OUT/summary.txt"
