"""GPU checks of the warm start (skipped without a CUDA GPU), each in a subprocess that sees the GPU.

- cuDNN and XLA attention give the same SFT step on the 'small' preset in bf16 (loss and gradient norm);
- the default job (configs/sft.py: small preset, bf16, cuDNN, bundled corpus) learns in 30 steps and exports.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.test_common import gpu_subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.gpu
def test_cudnn_and_xla_attention_give_the_same_sft_step(tmp_path):
  proc = subprocess.run(
      [sys.executable, "experiments/bench_sft.py", "--stage", "step", "--seq-lens", "2048", "--attention",
       "cudnn,xla", "--steps", "1", "--out", str(tmp_path)],
      cwd=ROOT, env=gpu_subprocess_env(), capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  r = {x["attention"]: x for x in (json.loads(l[7:]) for l in proc.stdout.splitlines() if l.startswith("RESULT "))}
  assert "error" not in r["cudnn"] and "error" not in r["xla"], r
  # The second step's loss (after one identical update) agrees to bf16 noise.
  assert abs(r["cudnn"]["loss"] - r["xla"]["loss"]) <= 2e-2 * r["xla"]["loss"], r


@pytest.mark.gpu
def test_default_sft_learns_and_exports(tmp_path):
  work = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "kevin_jax.main", "--config=configs/sft.py", f"--workdir={work}",
       "--config.sft.steps=30", "--config.sft.eval_every_steps=30", "--config.sft.sample_prompts=2",
       "--config.sft.sample_max_new_tokens=256", "--config.logging.tensorboard=False"],
      cwd=ROOT, env=gpu_subprocess_env(), capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  recs = {}
  for line in open(work / "metrics.jsonl"):
    rec = json.loads(line)
    recs[rec["step"]] = rec
  assert sorted(recs) == list(range(1, 31))
  first, last = recs[1]["train/loss"], recs[30]["train/loss"]
  assert abs(first - 9.01) < 0.3 and last < first - 2.0, (first, last)  # ln(8192) = 9.01 at random init.
  assert recs[30]["eval/loss"] < first - 2.0 and recs[30]["heldout_tasks/loss"] < first - 1.0
  assert (work / "hf" / "model.safetensors").is_file() and (work / "hf" / "tokenizer.json").is_file()
