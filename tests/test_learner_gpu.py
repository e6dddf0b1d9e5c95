"""GPU checks of the learner (skipped without a CUDA GPU): the mock-topology memory check and cuDNN attention.

Each runs in a fresh subprocess with the GPU visible (tests/conftest.py pins this process to fake CPU devices).
"""

import json
import os
import subprocess
import sys

import pytest

from tests.test_common import gpu_subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.gpu
def test_memcheck_compiles_for_8_gpus_on_one(tmp_path):
  """jax_mock_gpu_topology: the step compiles for an 8-GPU FSDP mesh on a 1-GPU host, without weights."""
  out = tmp_path / "r.json"
  proc = subprocess.run(
      [sys.executable, "-m", "kevin_jax.rl.memcheck", "--preset", "small", "--seq-len", "2048", "--mesh",
       "fsdp=8", "--micro-batch", "1", "--remat", "full", "--backend", "gpu", "--json", str(out)],
      cwd=ROOT, env=gpu_subprocess_env(), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  r = json.loads(out.read_text())
  assert r["backend"] == "gpu" and r["mesh"] == {"fsdp": 8} and r["attention"] == "cudnn"
  assert r["devices"].startswith("8 x") and r["fits"]
  b = r["per_device_bytes"]
  assert b["temporaries"] > 0 and b["aliased"] >= b["state_params"] + b["state_master"] + b["state_optimizer"]


@pytest.mark.gpu
def test_cudnn_and_xla_attention_give_the_same_learner_step(tmp_path):
  """One learner step of the 'small' preset in bf16 with each attention: same gradient norm (bf16 noise aside).

  (The loss itself says little here: with recomputed old log-probs the first update's loss is -mean(A).)
  """
  norms = {}
  for impl in ("cudnn", "xla"):
    out = tmp_path / impl
    proc = subprocess.run(
        [sys.executable, "experiments/bench_learner.py", "--presets", "small", "--seq-len", "1024",
         "--micro-batch", "small=2", "--steps", "1", "--attention", impl, "--out", str(out)],
        cwd=ROOT, env=gpu_subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((out / "bench_learner.json").read_text())["results"][0]
    norms[impl] = r["grad_norm"]
  assert abs(norms["cudnn"] - norms["xla"]) <= 3e-2 * norms["xla"], norms
