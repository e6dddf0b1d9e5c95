"""The CPU smoke run as a user types it, end to end:

  python -m kevin_jax.main --config=configs/multiturn.py:runlocal --config.evaluator.backend=scripted

in a subprocess on one CPU device (tests/conftest.py's fake-device XLA_FLAGS removed) with a temporary --workdir:
the warm start, 2 RL steps, the evaluations before and after, the Hugging Face export, at a peak resident memory
under 4 GiB (the runlocal preset's promise, configs/multiturn.py).
"""

import json
import os
import subprocess
import sys

from kevin_jax import metrics as metrics_lib
from kevin_jax import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = ["-m", "kevin_jax.main", "--config=configs/multiturn.py:runlocal", "--config.evaluator.backend=scripted"]
# Runs the command as its only child and writes that child's peak resident memory (ru_maxrss) to argv[1].
_PEAK = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
         "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(rc)")


def _user_env() -> dict[str, str]:
  """This environment without tests/conftest.py's XLA flags (fake CPU devices, optimisation level); JAX_PLATFORMS=cpu
  stays: the smoke run is the CPU one."""
  env = dict(os.environ)
  ours = ("xla_force_host_platform_device_count", "xla_backend_optimization_level")
  flags = [f for f in env.pop("XLA_FLAGS", "").split() if not any(o in f for o in ours)]
  if flags:
    env["XLA_FLAGS"] = " ".join(flags)
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
  return env


def test_runlocal_cpu_smoke_run_end_to_end(tmp_path):
  wd, peak_file = tmp_path / "run", tmp_path / "peak"
  r = subprocess.run([sys.executable, "-c", _PEAK, str(peak_file), sys.executable, *COMMAND, f"--workdir={wd}"],
                     cwd=ROOT, env=_user_env(), capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-4000:]
  assert "devices: [CpuDevice(id=0)]" in r.stderr  # One CPU device, as on the user's machine.
  # The warm start: its steps, its export, which RL started from.
  sft_steps = metrics_lib.read_metrics(str(wd / "sft" / "metrics.jsonl"))
  assert list(sft_steps) == [1, 2] and "eval/loss" in sft_steps[2]
  assert runtime.is_hf_checkpoint(str(wd / "sft" / "hf"))
  # RL: 2 steps of 2 tasks x 2 trajectories x 2 turns, both updates applied.
  recs = metrics_lib.read_metrics(str(wd / "metrics.jsonl"))
  assert list(recs) == [1, 2]
  for m in recs.values():
    assert m["batch/rows"] == 8 and m["batch/seq_len"] == 2048
    assert m["learner/updates_applied"] == 2 and m["learner/nonfinite_update"] == -1
  # The evaluations before and after RL (the test split, 2 tasks x 2 trajectories x 2 turns) and the export.
  evals = [json.loads(l) for l in open(wd / "eval_metrics.jsonl")]
  assert [e["step"] for e in evals] == [0, 2] and all(e["test/tasks"] == 2 for e in evals)
  assert runtime.is_hf_checkpoint(str(wd / "hf"))
  assert sorted(os.listdir(wd / "checkpoints")) == ["1", "2"]
  peak_bytes = int(peak_file.read_text()) * (1 if sys.platform == "darwin" else 1024)
  assert peak_bytes < 4 * 2**30, f"peak resident memory {peak_bytes / 2**30:.2f} GiB"
