"""experiments/bench_sampler.py's readers of the JAX worker's XLA dump (CPU: written PTX/HLO files)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import bench_sampler  # pylint: disable=g-import-not-at-top,wrong-import-position

_PTX = """//
.version 8.4
.target sm_90a
.visible .entry fusion_12(
\t.param .u64 p0
)
{
\tgriddepcontrol.wait;
\tld.global.u32 %r1, [%rd1];
\tgriddepcontrol.launch_dependents;
\tret;
}
.visible .entry triton_qkv(
\t.param .u64 p0
)
{
\tgriddepcontrol.wait;
\tret;
}
.entry helper_not_visible(
)
{
\tret;
}
"""


def test_grid_dep_counts(tmp_path):
  (tmp_path / "module_0007.jit__decode.sm_9.0_gpu_after_optimizations.ptx").write_text(_PTX)
  (tmp_path / "module_0003.jit__prefill.sm_9.0_gpu_after_optimizations.ptx").write_text(_PTX)  # not decode
  (tmp_path / "module_0007.jit__decode.after_optimizations.txt").write_text("griddepcontrol.wait")  # not PTX
  assert bench_sampler._grid_dep_in_decode_ptx(str(tmp_path)) == {
      "files": 1, "entries": 3, "wait": 2, "launch_dependents": 1}


def test_grid_dep_without_dump(tmp_path):
  empty = {"files": 0, "entries": 0, "wait": 0, "launch_dependents": 0}
  assert bench_sampler._grid_dep_in_decode_ptx(str(tmp_path / "missing")) == empty
  assert bench_sampler._grid_dep_in_decode_ptx(str(tmp_path)) == empty
