"""experiments/sweep.py: the paper's ablation grid as commands, and the collected table."""

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import sweep  # pylint: disable=g-import-not-at-top,wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_aggregation_grid_commands(tmp_path):
  cmds = sweep.commands("aggregation", str(tmp_path), ["--config.total_steps=3"])
  assert [n for n, _ in cmds] == ["sum_g0.4", "sum_g0.8", "max_g0.4", "max_g0.8"]
  argv = dict(cmds)["max_g0.8"]
  assert "--config.rl.gamma=0.8" in argv and "--config.rl.return_mode=max" in argv
  assert f"--workdir={tmp_path}/aggregation/max_g0.8" in argv and argv[-1] == "--config.total_steps=3"
  budgets = {n: argv for n, argv in sweep.commands("turns", str(tmp_path), [])}
  assert "--config.rollout.trajectories=16" in budgets["turns4"]  # 16 x 4 = 64 x 1 kernels.


def test_every_sweep_command_parses_as_a_config(tmp_path):
  """Each command's config + overrides is accepted by the real flag parser (no typo'd fields)."""
  for name in sweep.SWEEPS:
    for _, argv in sweep.commands(name, str(tmp_path), []):
      code = ("import sys; from absl import flags; from kevin_jax import main; "
              "flags.FLAGS(sys.argv); c = flags.FLAGS.config; "
              "print(c.rl.gamma, c.rl.return_mode, c.rollout.turns, c.rollout.trajectories)")
      r = subprocess.run([sys.executable, "-c", code, *argv[3:]], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
      assert r.returncode == 0, (argv, r.stderr[-500:])


def test_collect_table(tmp_path):
  for run, rewards in (("sum_g0.4", [0.1, 0.5, 0.9]), ("max_g0.8", [0.2, 0.2])):
    d = tmp_path / "aggregation" / run
    os.makedirs(d)
    with open(d / "metrics.jsonl", "w") as f:
      for s, r in enumerate(rewards, 1):
        f.write(json.dumps({"step": s, "reward/mean": r, "correct/rate": r / 2, "speedup/mean_correct": 1.0}) + "\n")
  rows = {r["run"]: r for r in sweep.collect("aggregation", str(tmp_path), last=2)}
  assert rows["sum_g0.4"]["steps"] == 3 and rows["sum_g0.4"]["reward/mean"] == pytest.approx(0.7)
  assert rows["max_g0.8"]["correct/rate"] == pytest.approx(0.1)
  assert rows["sum_g0.8"]["steps"] == 0  # Not run yet.
  for f in ("summary.md", "summary.csv", "curves.png"):
    assert os.path.getsize(tmp_path / "aggregation" / f) > 0
