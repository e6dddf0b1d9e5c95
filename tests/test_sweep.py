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


def test_evidence_before_after_table_only_and_compact(tmp_path):
  names = [n for n, _ in sweep.commands("evidence", str(tmp_path), [], only="multi_s1,single_s0")]
  assert names == ["multi_s1", "single_s0"]
  argv = dict(sweep.commands("evidence", str(tmp_path), []))
  assert "--config=configs/singleturn.py:same_budget" in argv["single_s0"] and "--config.seed=1" in argv["multi_s1"]
  with pytest.raises(SystemExit, match="has runs"):
    sweep.commands("evidence", str(tmp_path), [], only="multi_s7")
  d = tmp_path / "evidence" / "multi_s0"
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
  evals = {e["split"]: e for e in sweep.before_after("evidence", str(tmp_path))}
  assert set(evals) == {"train", "test"} and evals["train"]["step"] == 2 and evals["train"]["tasks"] == 30
  assert evals["train"]["before"]["kernel/correct_rate"] == 0.1 and evals["train"]["after"]["perf_best"] == 0.6
  sweep.collect("evidence", str(tmp_path), last=2)
  md = open(tmp_path / "evidence" / "summary.md").read()
  assert "| multi_s0 | train | 30 | 0 -> 2 | 0.200 -> 0.300 (+50%) | 10.0% -> 25.0% |" in md
  assert "| multi_s0 | test | 10 | 0 -> 2 | 0.100 -> 0.150 (+50%) | ? -> ? |" in md
  assert len(open(tmp_path / "evidence" / "before_after.csv").readlines()) == 1 + 2 * 2
  assert sweep.main(["evidence", "--root", str(tmp_path), "--compact"]) == 0
  assert not os.path.exists(d / "checkpoints") and not os.path.exists(d / "sft" / "hf")
  assert not os.path.exists(d / "hf")
  assert os.path.exists(d / "metrics.jsonl")


def test_overrides_after_double_dash_reach_every_command(tmp_path, capsys):
  # `sweep.py evidence --only multi_s0 -- --config.x=...` was rejected by argparse before (2026-12-01).
  assert sweep.main(["evidence", "--root", str(tmp_path), "--only", "multi_s0,multi_s0_lr5e-5", "--",
                     "--config.total_steps=3", "--config.rollout.turns=2"]) == 0
  printed = [line for line in capsys.readouterr().out.splitlines() if "kevin_jax.main" in line]
  assert len(printed) == 2
  assert all(line.endswith("--config.total_steps=3 --config.rollout.turns=2") for line in printed)
  assert "--config.optimizer.learning_rate=5e-5" in printed[1]


def test_step0_from_another_run_and_pinned_temperature(tmp_path):
  """A run that skipped its step-0 evaluation takes it from its STEP0_FROM run; the pre-0.6 evidence runs pin the
  temperature they were run at."""
  argv = dict(sweep.commands("evidence", str(tmp_path), []))
  assert "--config.sampler.temperature=0.9" in argv["multi_s0"]
  assert "--config.sampler.temperature=0.9" not in argv["multi_s0_t0.6_20"]
  assert "--config.evaluation.in_training_first=False" in argv["multi_s0_t0.6_20"]
  assert "--config.evaluation.in_training_first=True" in argv["multi_s1_t0.6_20"]
  root = tmp_path / "evidence"
  for name, recs in (("multi_s0_t0.6", [(0, 0.5), (12, 0.55)]), ("multi_s0_t0.6_20", [(20, 0.6)])):
    os.makedirs(root / name)
    with open(root / name / "eval_metrics.jsonl", "w") as f:
      for step, score in recs:
        f.write(json.dumps({"step": step, "train/tasks": 30, "train/kernel/score_mean": score}) + "\n")
  evals = {e["run"]: e for e in sweep.before_after("evidence", str(tmp_path))}
  e = evals["multi_s0_t0.6_20"]
  assert (e["step0_from"], e["step"], e["before"]["kernel/score_mean"], e["after"]["kernel/score_mean"]) == (
      "multi_s0_t0.6", 20, 0.5, 0.6)
  assert evals["multi_s0_t0.6"]["step0_from"] == "multi_s0_t0.6"
  sweep.collect("evidence", str(tmp_path), last=1)
  md = open(root / "summary.md").read()
  assert "| multi_s0_t0.6_20 | train | 30 | 0 (multi_s0_t0.6) -> 20 | 0.500 -> 0.600 (+20%) |" in md


def test_evidence_commands_reproduce_the_recorded_runs(tmp_path):
  """Every recorded evidence run (experiments/results/*/evidence/<run>/config.json) is what its command gives
  today: seed, sampling temperature, warm-start corpus and RL steps (the defaults changed after some were run:
  pinned)."""
  recorded = {}
  for folder in sorted(os.listdir(os.path.join(ROOT, "experiments", "results"))):
    ev = os.path.join(ROOT, "experiments", "results", folder, "evidence")
    for name in (os.listdir(ev) if os.path.isdir(ev) else []):
      if os.path.isfile(os.path.join(ev, name, "config.json")):
        with open(os.path.join(ev, name, "config.json"), encoding="utf-8") as f:
          recorded[name] = json.load(f)
  argv = dict(sweep.commands("evidence", str(tmp_path), []))
  runs = sorted(set(recorded) & set(argv))
  assert len(runs) >= 20 and "multi_s0_mix_t0.6" in runs and "multi_s0" in runs
  got = {r: _fields(argv[r][3:], ("seed", "sampler.temperature", "sft.corpus_kinds", "sft.corpus_reasoning",
                                   "total_steps")) for r in runs}
  old_kinds = ["single", "fix_wrong", "speed_up", "fix_then_speed_up"]  # The defaults before 2026-12-03.
  for r in runs:
    c = recorded[r]
    want = [c["seed"], c["sampler"]["temperature"], list(c["sft"].get("corpus_kinds", old_kinds)),
            c["sft"].get("corpus_reasoning", "quote"), c["total_steps"]]
    assert got[r] == want, r


def _fields(args: list[str], names) -> list:
  """The named fields of the config that `--config=FILE[:ARG] --config.a.b=V ...` gives (values parsed as
  literals where the field is not a string; test_every_sweep_command_parses_as_a_config runs the real parser)."""
  import ast  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  path, _, arg = args[0].removeprefix("--config=").partition(":")
  c = importlib.import_module(path.removesuffix(".py").replace("/", ".")).get_config(arg)
  for a in args[1:]:
    if a.startswith("--config."):
      key, _, value = a.removeprefix("--config.").partition("=")
      *parents, leaf = key.split(".")
      node = c
      for p in parents:
        node = node[p]
      node[leaf] = value if isinstance(node[leaf], str) else type(node[leaf])(ast.literal_eval(value))
  out = []
  for n in names:
    node = c
    for p in n.split("."):
      node = node[p]
    out.append(list(node) if isinstance(node, tuple) else node)
  return out
