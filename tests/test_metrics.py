"""kevin_jax.metrics: JSONL + TensorBoard writing, resume-friendly reads, progress/ETA lines."""

import glob
import json

import numpy as np

from kevin_jax import metrics


def test_jsonl_and_tensorboard(tmp_path):
  with metrics.MetricWriter(str(tmp_path)) as w:
    w.write(1, {"reward/mean": np.float32(0.5), "n": 3, "name": "a", "bad": float("nan")})
    w.write(2, {"reward/mean": 0.75, "per_turn": [0.1, 0.2]})
  lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert lines[0] == {"step": 1, "reward/mean": 0.5, "n": 3, "name": "a", "bad": "nan"}
  assert lines[1]["per_turn"] == [0.1, 0.2]
  assert glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))


def test_resumed_run_keeps_last_record_per_step(tmp_path):
  with metrics.MetricWriter(str(tmp_path), tensorboard=False) as w:
    w.write(1, {"x": 1.0})
    w.write(2, {"x": 2.0})
  with metrics.MetricWriter(str(tmp_path), tensorboard=False) as w:  # Resume rewrites step 2.
    w.write(2, {"x": 2.5})
    w.write(3, {"x": 3.0})
  recs = metrics.read_metrics(str(tmp_path / "metrics.jsonl"))
  assert list(recs) == [1, 2, 3]
  assert recs[2]["x"] == 2.5


def test_progress_rate_and_eta():
  t = [0.0]
  lines = []
  p = metrics.Progress(10, "rl", every_s=5.0, clock=lambda: t[0], log=lines.append)
  t[0] = 2.0
  assert p.update(1) == "rl: 1/10 (10%) 0.5 it/s ETA 0:00:18"  # The first update always logs.
  t[0] = 4.0
  assert p.update(0) is None  # Within every_s of the last line: quiet.
  t[0] = 10.0
  line = p.update(1, reward=0.25)
  # 2 steps in 10 s = 0.2/s; 8 left -> 40 s.
  assert line == "rl: 2/10 (20%) 0.2 it/s ETA 0:00:40 reward=0.25"
  t[0] = 11.0
  assert p.update(1) is None
  t[0] = 50.0
  assert p.update(7).startswith("rl: 10/10 (100%)")  # The last update always logs.
  assert len(lines) == 3


def test_progress_unknown_rate():
  p = metrics.Progress(5, "x", clock=lambda: 0.0, log=lambda s: None)
  assert p.line() == "x: 0/5 (0%) 0 it/s ETA ?"
