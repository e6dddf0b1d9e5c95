#!/usr/bin/env bash
# Runs one job longer than a device call (10 minutes) on a warm GPU host: `start` launches it detached (setsid) from
# a private copy of the repository, then every call (`start` included) waits for it, up to a limit, and returns
# its log so far. The job survives the end of a call as long as the machine stays warm (the next call follows
# within its idle window, and the machine is held under 30 minutes in all). When it has ended, the waiting call
# packs its workdir (checkpoints and safetensors left out) into $OUT/<name>.tar.gz, and KEEP=<dir under the
# workdir> (e.g. hf) comes back as keep.tgz.part00, 01, ... of 15 MiB.
#
# Unreliable on this workplace's GPU host: the machine goes back after 30 s idle, and the reply between two calls
# can take longer than that by itself (it lost the default job four times, sixteenth and seventeenth sessions).
# Prefer work that fits one call, or phases that each return what the next needs (experiments/default_phases.sh).
#
#   experiments/gpu_detached.sh start NAME WAIT_S 'command using $WORKDIR'   # launch, then wait up to WAIT_S
#   experiments/gpu_detached.sh wait NAME WAIT_S                             # wait again (a later call)
#
# The command runs from /tmp/detached/NAME/src, a copy of this checkout: later calls re-send the working tree, and
# a worker process started mid-job must not import from a tree being rewritten. $WORKDIR is /tmp/detached/NAME/work.
# DETACHED_ROOT replaces /tmp/detached (the tests use it). Carried wheels in .whl/ are installed to /tmp/site first
# (experiments/gpu_common.sh, shared with experiments/gpu_session.sh).
set -u
source "$(dirname "$0")/gpu_common.sh"
mode=${1:?start or wait}; name=${2:?job name}; wait_s=${3:?seconds to wait}
OUT=${OUT:-/tmp/out}
base=${DETACHED_ROOT:-/tmp/detached}/$name
mkdir -p "$OUT"
if [ "$mode" = start ]; then
  cmd=${4:?command}
  if [ -e "$base" ]; then echo "$base exists: a job named $name was started on this machine already" >&2; exit 2; fi
  mkdir -p "$base/src" "$base/work"
  tar cf - --exclude=./.git --exclude=./.venv --exclude=./runs . | tar xf - -C "$base/src"
  install_carried_wheels
  gpu_info > "$base/gpu.txt"
  date +%s > "$base/started"
  # Every descriptor of the detached process points to its log or /dev/null, none to this call's output.
  # The command runs in a bash of its own, so that its `exit N` still leaves N in $base/rc.
  (cd "$base/src" && exec env PYTHONPATH="$base/src:/tmp/site" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false \
     TF_CPP_MIN_LOG_LEVEL=1 WORKDIR="$base/work" \
     setsid nohup bash -c 'bash -c "$1"; echo $? > "$2"' _ "$cmd" "$base/rc") > "$base/job.log" 2>&1 < /dev/null &
  echo "started $name at $(date -u +%H:%M:%S): $cmd"
elif [ "$mode" != wait ]; then
  echo "mode must be start or wait, got $mode" >&2; exit 2
fi
[ -d "$base" ] || { echo "no job named $name on this machine (a fresh machine: the job was lost)" >&2; exit 3; }
deadline=$(( $(date +%s) + wait_s ))
while [ ! -e "$base/rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 2; done
elapsed=$(( $(date +%s) - $(cat "$base/started") ))
cp "$base/job.log" "$base/gpu.txt" "$OUT/"
if [ ! -e "$base/rc" ]; then
  echo "=== $name still running after ${elapsed}s; last lines:"; tail -n 15 "$base/job.log"; exit 0
fi
echo "=== $name ended with rc=$(cat "$base/rc") after ${elapsed}s; last lines:"; tail -n 25 "$base/job.log"
echo "rc=$(cat "$base/rc") elapsed_s=$elapsed" > "$OUT/status.txt"
pack_results "$OUT/$name.tar.gz" "$base" work/rollouts work  # Over 15 MiB: the evaluations' rollouts still come.
if [ -n "${KEEP:-}" ]; then split_keep "$base/work/$KEEP" "$OUT/keep.tgz.part"; fi
ls -la "$OUT"
