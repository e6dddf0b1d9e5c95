"""experiments/default_phases.sh on CPU (runlocal preset, scripted reward): RL from a gzipped HF export with no
evaluations, then the evaluation of RL's export alone; clear errors on a missing or wrong archive."""

import json
import os
import subprocess
import sys
import tarfile

import jax

from configs import multiturn
from kevin_jax import metrics as metrics_lib
from kevin_jax import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "default_phases.sh")
OVERRIDES = ["--config.evaluator.backend=scripted", "--config.logging.tensorboard=False",
             "--config.sft.before_rl=False", "--config.sampler.max_new_tokens=16"]


def _phase(args, tmp_path):
  env = dict(os.environ, OUT=str(tmp_path / "out"), PHASES_TMP=str(tmp_path), JAX_PLATFORMS="cpu",
             PHASES_CONFIG="configs/multiturn.py:runlocal", PYTHONPATH=ROOT,
             PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])  # python3 = this Python.
  env.pop("XLA_FLAGS", None)  # One CPU device, as a user's run (tests/conftest.py fakes 8 in this process).
  return subprocess.run(["bash", SCRIPT, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _tgz(directory, path):
  with tarfile.open(path, "w:gz") as t:
    t.add(directory, arcname=".")
  return str(path)


def test_rl_then_eval_phases_from_archives(tmp_path):
  c = multiturn.get_config("runlocal")
  policy = runtime.build_policy(c)
  runtime.export_hf(policy, runtime.initial_params(c, policy, jax.random.key(0)), str(tmp_path / "start"))
  start = _tgz(tmp_path / "start", tmp_path / "start.tgz")

  r = _phase(["rl", "0", start, *OVERRIDES], tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  rl = tmp_path / "out" / "rl"
  assert list(metrics_lib.read_metrics(str(rl / "metrics.jsonl"))) == [1, 2]  # runlocal: 2 steps.
  assert not (rl / "eval_metrics.jsonl").exists()  # No evaluations in this phase.
  assert runtime.is_hf_checkpoint(str(rl / "hf"))

  r = _phase(["eval", "0", _tgz(rl / "hf", tmp_path / "rl.tgz"), *OVERRIDES], tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  after = tmp_path / "out" / "after"
  lines = [json.loads(l) for l in open(after / "eval_metrics.jsonl")]
  assert [r["step"] for r in lines] == [0] and lines[0]["test/tasks"] == 2  # runlocal: 2 test tasks.
  assert not (after / "hf").exists() and not list(metrics_lib.read_metrics(str(after / "metrics.jsonl")))
  assert "evaluating the starting policy only" in r.stderr


def test_missing_or_wrong_archive_and_unknown_phase(tmp_path):
  r = _phase(["rl", "0", str(tmp_path / "nope.tgz")], tmp_path)
  assert r.returncode == 2 and "no file" in r.stderr
  (tmp_path / "notahf").mkdir()
  (tmp_path / "notahf" / "x.txt").write_text("x")
  r = _phase(["eval", "0", _tgz(tmp_path / "notahf", tmp_path / "bad.tgz")], tmp_path)
  assert r.returncode == 2 and "holds no HF export" in r.stderr
  r = _phase(["train", "0"], tmp_path)
  assert r.returncode == 2 and "warm, rl or eval" in r.stderr
