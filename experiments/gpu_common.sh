# Shared by experiments/gpu_session.sh and experiments/gpu_detached.sh (sourced, not run): what a GPU-host call
# needs before and after its work, within the device tool's limits (at most 8 files back, 16 MiB each).

# Carried wheels in .whl/ (ml-collections and tensorboardX, which the GPU image lacks: `pip download --no-deps
# ml-collections tensorboardX -d .whl`) go to /tmp/site; the caller puts /tmp/site on PYTHONPATH.
install_carried_wheels() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
}

# The GPU, its driver and clocks, as CSV, to stdout.
gpu_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,power.draw --format=csv 2>&1
}

# pack_results TARBALL DIR ROLLOUTS NAME...: NAMEs under DIR into TARBALL (gzip), weights and checkpoints left
# out; if that is over 15 MiB, packed again without the paths matching the tar pattern ROLLOUTS. Says so on stdout.
pack_results() {
  local tarball=$1 dir=$2 rollouts=$3; shift 3
  local excl=(--exclude='*/checkpoints' --exclude='*.safetensors')
  tar czf "$tarball" "${excl[@]}" -C "$dir" "$@"
  echo "$(basename "$tarball") leaves out checkpoints/ and *.safetensors"
  if [ "$(stat -c %s "$tarball")" -gt $((15 * 1024 * 1024)) ]; then
    echo "$(basename "$tarball") was over 15 MiB: packed again without $rollouts"
    tar czf "$tarball" "${excl[@]}" --exclude="$rollouts" -C "$dir" "$@"
  fi
}

# split_keep DIR PREFIX: DIR as a gzipped tar split into PREFIX00, PREFIX01, ... of 15 MiB, at most 6 (none if
# more). bf16 weights shrink to ~80 % (the small policy's 56.7 MB export to ~45 MB: 3 parts, and small enough to
# carry back to a later call beside the 64 MiB working tree's other ~10 MB). `cat PREFIX* > x.tgz` rebuilds the
# archive, `tar xzf x.tgz -C DEST` the directory. Says what it returned on stdout.
split_keep() {
  local dir=$1 prefix=$2
  rm -f "$prefix"*
  if [ ! -d "$dir" ]; then echo "KEEP: no directory $dir"; return; fi
  tar czf - -C "$dir" . | split -b 15M -d -a 2 - "$prefix"
  if [ "$(ls "$prefix"* | wc -l)" -gt 6 ]; then
    echo "KEEP=$dir is over 6 x 15 MiB: not returned"; rm -f "$prefix"*
  else
    echo "KEEP=$dir returned as $(ls "$prefix"* | wc -l) $(basename "$prefix")* files"
  fi
}
