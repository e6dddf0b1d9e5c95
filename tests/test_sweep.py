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
  """Each command's config + overrides is accepted by the real flag parser (no typo'd fields); one process parses
  them all, one after another."""
  argvs, want = [], []
  for name in sweep.SWEEPS:
    checkpoint = "runs/x/hf" if name in sweep.NEEDS_CHECKPOINT else ""
    for run, argv in sweep.commands(name, str(tmp_path), [], checkpoint=checkpoint):
      argvs.append(argv[2:])
      want.append((name, run))
  # kevin_jax.main's two flags, defined afresh per command: ml_collections reads the overrides off sys.argv when
  # the config flag is defined.
  code = ("import json, sys; from absl import flags; from ml_collections import config_flags\n"
          "for argv in json.loads(sys.argv[1]):\n"
          "  sys.argv = argv; fv = flags.FlagValues()\n"
          "  config_flags.DEFINE_config_file('config', None, '', flag_values=fv, lock_config=True)\n"
          "  flags.DEFINE_string('workdir', None, '', flag_values=fv)\n"
          "  fv(argv); c = fv.config\n"
          "  print(c.mode, c.tasks.source, c.rl.gamma, c.rl.return_mode, c.rollout.turns, c.rollout.trajectories, "
          "c.total_steps, c.evaluation.split, len(c.evaluation.budgets))")
  r = subprocess.run([sys.executable, "-c", code, json.dumps(argvs)], cwd=ROOT, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  got = dict(zip(want, r.stdout.splitlines()))
  assert len(got) == len(argvs)
  assert got[("aggregation", "max_g0.8")].split()[:4] == ["train", "bundled", "0.8", "max"]
  assert got[("world_gamma", "max_g0.8")].split()[1:7] == ["generated", "0.8", "max", "4", "16", "16"]
  assert got[("world_mode", "single_64x1")].split()[1:7] == ["generated", "0.4", "sum", "1", "64", "16"]
  assert got[("world", "s1")].split()[:2] == ["train", "generated"]
  assert got[("table2", "heldout_styles")].split()[:2] == ["evaluate", "generated"]
  assert got[("table2", "heldout_styles")].split()[-2:] == ["heldout_styles", "3"]  # 16 x 8, 32 x 4, 128 x 1.


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


def test_default_before_after_table_only_and_compact(tmp_path):
  names = [n for n, _ in sweep.commands("default", str(tmp_path), [], only="multi_s1,single_s0")]
  assert names == ["multi_s1", "single_s0"]
  argv = dict(sweep.commands("default", str(tmp_path), []))
  assert "--config=configs/singleturn.py:same_budget" in argv["single_s0"] and "--config.seed=1" in argv["multi_s1"]
  with pytest.raises(SystemExit, match="has runs"):
    sweep.commands("default", str(tmp_path), [], only="multi_s7")
  d = tmp_path / "default" / "multi_s0"
  os.makedirs(d / "checkpoints" / "20")
  os.makedirs(d / "sft" / "hf")
  os.makedirs(d / "hf")
  with open(d / "metrics.jsonl", "w") as f:
    for s in (1, 2):
      f.write(json.dumps({"step": s, "reward/mean": 0.1 * s, "correct/rate": 0.2, "speedup/mean_correct": 1.0}) + "\n")
  with open(d / "eval_metrics.jsonl", "w") as f:
    for s, score, rate in ((0, 0.2, 0.1), (2, 0.3, 0.25)):
      f.write(json.dumps({"step": s, "train/tasks": 30, "train/kernel/score_mean": score,
                          "train/kernel/correct_rate": rate, "train/perf_best": 2 * score,
                          "test/tasks": 10, "test/kernel/score_mean": score / 2}) + "\n")
  evals = {e["split"]: e for e in sweep.before_after("default", str(tmp_path))}
  assert set(evals) == {"train", "test"} and evals["train"]["step"] == 2 and evals["train"]["tasks"] == 30
  assert evals["train"]["before"]["kernel/correct_rate"] == 0.1 and evals["train"]["after"]["perf_best"] == 0.6
  sweep.collect("default", str(tmp_path), last=2)
  md = open(tmp_path / "default" / "summary.md").read()
  assert "| multi_s0 | train | 30 | 0 -> 2 | 0.200 -> 0.300 (+50%) | 10.0% -> 25.0% |" in md
  assert "| multi_s0 | test | 10 | 0 -> 2 | 0.100 -> 0.150 (+50%) | ? -> ? |" in md
  assert len(open(tmp_path / "default" / "before_after.csv").readlines()) == 1 + 2 * 2
  assert sweep.main(["default", "--root", str(tmp_path), "--compact"]) == 0
  assert not os.path.exists(d / "checkpoints") and not os.path.exists(d / "sft" / "hf")
  assert not os.path.exists(d / "hf")
  assert os.path.exists(d / "metrics.jsonl")


def test_overrides_after_double_dash_reach_every_command(tmp_path, capsys):
  # argparse alone would take the empty match of a trailing positional and reject what follows `--`.
  assert sweep.main(["default", "--root", str(tmp_path), "--only", "multi_s0,single_s0", "--",
                     "--config.total_steps=3", "--config.rollout.turns=2"]) == 0
  printed = [line for line in capsys.readouterr().out.splitlines() if "kevin_jax.main" in line]
  assert len(printed) == 2
  assert all(line.endswith("--config.total_steps=3 --config.rollout.turns=2") for line in printed)
  assert "--config=configs/singleturn.py:same_budget" in printed[1]
