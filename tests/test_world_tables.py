"""experiments/world_tables.py and the world sweeps' --collect: tables computed from synthetic run directories."""

import csv
import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import sweep  # pylint: disable=g-import-not-at-top,wrong-import-position
import world_tables  # pylint: disable=g-import-not-at-top,wrong-import-position


def _turns(scores: dict[str, list[float]], step: int) -> list[dict]:
  """Rollout records: one kernel per score, correct when the score is > 0."""
  return [{"step": step, "task_id": t, "traj": i, "turn": 0,
           "result": {"status": "correct" if s > 0 else "incorrect", "score": s}}
          for t, ss in scores.items() for i, s in enumerate(ss)]


def _write(path, lines):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.writelines(json.dumps(x) + "\n" for x in lines)


def _metrics(score, correct, novel, tasks=2):
  return {"tasks": tasks, "kernel/score_mean": score, "kernel/correct_rate": correct, "fast_1_best": 0.5,
          "correct_best": 1.0, "perf_best": 1.2, "perf_avg": 0.9, "novelty/novel_share": novel}


def _one_job(run_dir, last, before: dict, after: dict, metrics_before, metrics_after, split="heldout_compositions"):
  _write(os.path.join(run_dir, "eval_metrics.jsonl"),
         [{"step": 0, **{f"{split}/{k}": v for k, v in metrics_before.items()}},
          {"step": last, **{f"{split}/{k}": v for k, v in metrics_after.items()}}])
  _write(os.path.join(run_dir, "eval_rollouts", f"step_000000_{split}.jsonl"), _turns(before, 0))
  _write(os.path.join(run_dir, "eval_rollouts", f"step_{last:06d}_{split}.jsonl"), _turns(after, last))


def test_paired_change_and_task_level_results_left_out():
  before = _turns({"a": [0.0, 1.0], "b": [0.5, 0.5], "c": [1.0, 1.0]}, 0)
  after = _turns({"a": [1.0, 1.0], "b": [1.5, 0.5], "c": [1.0, 1.0]}, 5)
  after[-1]["result"]["flags"] = ["evaluator_error"]  # c's second kernel: no verdict, left out (c stays at 1.0).
  mean, se, n = world_tables.paired_change(before, after, "score")
  # Per-task changes: a +0.5, b +0.5, c 0.0 -> mean 1/3, s.d. sqrt(1/12), s.e. sqrt(1/12)/sqrt(3) = 1/6.
  assert n == 3 and mean == pytest.approx(1 / 3) and se == pytest.approx(1 / 6)
  mean, se, n = world_tables.paired_change(before, after, "correct")  # a: 0.5 -> 1.0; b, c unchanged.
  assert mean == pytest.approx(0.5 / 3)
  assert world_tables.paired_change([], after, "score")[2] == 0


def test_world_collect_main_result_with_seeds_mean(tmp_path):
  root = tmp_path / "sweeps"
  # Seed 0: one job (steps 0 and 12). Seed 1: a job in phases (before/ and after/, each a step-0 record).
  _one_job(str(root / "world" / "s0"), 12, {"a": [0.0, 1.0], "b": [0.5, 0.5]}, {"a": [1.0, 1.0], "b": [1.5, 0.5]},
           _metrics(0.5, 0.75, 0.0), _metrics(1.0, 1.0, 0.2))
  s1 = root / "world" / "s1"
  _write(str(s1 / "before" / "eval_metrics.jsonl"),
         [{"step": 0, **{f"heldout_compositions/{k}": v for k, v in _metrics(0.7, 0.5, 0.1).items()}}])
  _write(str(s1 / "after" / "eval_metrics.jsonl"),
         [{"step": 0, **{f"heldout_compositions/{k}": v for k, v in _metrics(1.1, 0.75, 0.4).items()}}])
  _write(str(s1 / "before" / "eval_rollouts" / "step_000000_heldout_compositions.jsonl"),
         _turns({"a": [0.0, 1.0], "b": [1.0, 1.0]}, 0))
  _write(str(s1 / "after" / "eval_rollouts" / "step_000000_heldout_compositions.jsonl"),
         _turns({"a": [1.0, 1.0], "b": [1.0, 1.0]}, 0))
  _write(str(s1 / "rl" / "metrics.jsonl"), [{"step": s, "reward/mean": 0.1} for s in (1, 2, 3)])
  rows = sweep.collect("world", str(root), last=2)
  assert [r["run"] for r in rows] == ["s0", "s1"]  # The RL curves' table: one row per run ...
  assert [r["steps"] for r in rows] == [0, 3]  # ... s1's from its RL phase (s0 wrote no metrics.jsonl here).
  main = list(csv.DictReader(open(root / "world" / "main_result.csv")))
  by_run = {r["run"]: r for r in main}
  assert set(by_run) == {"s0", "s1", "mean"} and by_run["s0"]["step"] == "12" and by_run["s1"]["step"] == "3"
  # s0: per-task score changes a +0.5, b +0.5 -> +0.5 +- 0; s1: a +0.5, b 0 -> +0.25 +- 0.25.
  assert float(by_run["s0"]["task_score_change"]) == pytest.approx(0.5)
  assert float(by_run["s0"]["task_score_change_se"]) == pytest.approx(0.0)
  assert float(by_run["s1"]["task_score_change"]) == pytest.approx(0.25)
  assert float(by_run["s1"]["task_score_change_se"]) == pytest.approx(0.25)
  # The seeds' mean +- s.e. over seeds (|a - b| / 2 for two): score after 1.05 +- 0.05, novelty after 0.3 +- 0.1.
  m = by_run["mean"]
  assert float(m["kernel/score_mean/after"]) == pytest.approx(1.05)
  assert float(m["kernel/score_mean/after_se"]) == pytest.approx(0.05)
  assert float(m["novelty/novel_share/after"]) == pytest.approx(0.3)
  assert float(m["novelty/novel_share/after_se"]) == pytest.approx(0.1)
  assert float(m["task_score_change"]) == pytest.approx(0.375)
  assert float(m["task_score_change_se"]) == pytest.approx(0.125)
  md = (root / "world" / "main_result.md").read_text()
  assert "### heldout_compositions" in md
  assert "| s0 | 2 | 12 | 0.500 -> 1.000 | 75.0% -> 100.0% |" in md
  assert "| mean | 2 |  | 0.600 ± 0.100 -> 1.050 ± 0.050 |" in md and md.rstrip().endswith("0.375 ± 0.125 |")
  assert (root / "world" / "main_result.png").stat().st_size > 0


def test_phases_whose_rl_phase_evaluates_its_end(tmp_path):
  """before/ (a step-0 record) and rl/ with its own closing evaluation at its last step (no after/): that pair."""
  run = tmp_path / "s0"
  _write(str(run / "before" / "eval_metrics.jsonl"),
         [{"step": 0, **{f"heldout_compositions/{k}": v for k, v in _metrics(0.4, 0.5, 0.0).items()}}])
  _write(str(run / "before" / "eval_rollouts" / "step_000000_heldout_compositions.jsonl"),
         _turns({"a": [0.0, 1.0], "b": [1.0, 1.0]}, 0))
  assert world_tables.evaluations(str(run)) is None  # No evaluation of the trained policy yet.
  _write(str(run / "rl" / "metrics.jsonl"), [{"step": s, "reward/mean": 0.1} for s in range(1, 8)])
  _write(str(run / "rl" / "eval_metrics.jsonl"),
         [{"step": 7, **{f"heldout_compositions/{k}": v for k, v in _metrics(0.9, 1.0, 0.5).items()}}])
  _write(str(run / "rl" / "eval_rollouts" / "step_000007_heldout_compositions.jsonl"),
         _turns({"a": [1.0, 1.0], "b": [1.0, 2.0]}, 7))
  e = world_tables.evaluations(str(run))["heldout_compositions"]
  assert e["step"] == 7 and e["before"]["kernel/score_mean"] == 0.4 and e["after"]["kernel/score_mean"] == 0.9
  assert world_tables.paired_change(e["rows_before"], e["rows_after"], "score")[:2] == pytest.approx((0.5, 0.0))


def test_ablation_collect_has_no_seeds_mean(tmp_path):
  root = tmp_path / "sweeps"
  for run, after in (("grpo", 0.9), ("trloo", 1.3)):
    _one_job(str(root / "world_estimator" / run), 16, {"a": [0.5]}, {"a": [after]}, _metrics(0.5, 0.5, 0.0),
             _metrics(after, 0.5, 0.0))
  sweep.collect("world_estimator", str(root), last=2)
  main = list(csv.DictReader(open(root / "world_estimator" / "main_result.csv")))
  assert [r["run"] for r in main] == ["grpo", "trloo"]
  assert float(main[1]["task_score_change"]) == pytest.approx(0.8)
  assert math.isnan(float(main[1]["task_score_change_se"]))  # One task: no standard error.
  md = (root / "world_estimator" / "summary.md").read_text()  # The sweep's before/after table names both runs.
  assert "| trloo | heldout_compositions | 2 | 0 -> 16 | 0.500 -> 1.300 (+160%) |" in md


def test_table2_collect_from_reports(tmp_path):
  root = tmp_path / "sweeps"
  def budget(k, n, perf_by_turn):
    per_turn = [{"turn": t + 1, "correct_best": 1.0, "perf_best": p, "fast_1_best": float(p >= 1), "correct_avg": 0.5,
                 "perf_avg": p / 2, "correct_avg_x": 0} for t, p in enumerate(perf_by_turn)]
    return {"trajectories": k, "turns": n, "kernels": k * n, **per_turn[-1], "per_turn": per_turn}
  for split, perf in (("heldout_compositions", 1.5), ("heldout_styles", 0.8)):
    rep = {"tasks": 10, "budgets": [budget(16, 8, [0.5, 1.0, 1.0, 1.2, 1.2, 1.3, 1.4, perf]),
                                    budget(32, 4, [0.6, 1.0, 1.1, 1.2]), budget(128, 1, [0.9])]}
    os.makedirs(root / "table2" / split / "eval")
    json.dump(rep, open(root / "table2" / split / "eval" / "report.json", "w"))
  rows = sweep.collect("table2", str(root), last=2)
  final = {(r["run"], r["shape"]): r for r in rows if r["row"] == "final"}
  assert final[("heldout_compositions", "16x8")]["perf_best"] == 1.5
  assert final[("heldout_styles", "16x8")]["fast_1_best"] == 0.0 and final[("heldout_styles", "128x1")]["turn"] == 1
  assert len([r for r in rows if r["row"] == "turn"]) == 2 * (8 + 4 + 1)
  md = (root / "table2" / "table2.md").read_text()
  assert "| heldout_compositions | 10 | 16x8 | 128 | 100.0% | 1.50x | 100.0% | 50.0% | 0.75x |" in md
  assert "| heldout_styles | 32x4 | 0.60x | 1.00x | 1.10x | 1.20x |" in md
  assert len(list(csv.DictReader(open(root / "table2" / "table2.csv")))) == 2 * (3 + 13)
  assert (root / "table2" / "table2.png").stat().st_size > 0


def test_checkpoint_and_init_from_reach_the_commands(tmp_path):
  with pytest.raises(SystemExit, match="--checkpoint"):
    sweep.commands("table2", str(tmp_path), [])
  with pytest.raises(SystemExit, match="--init-from"):
    sweep.commands("world", str(tmp_path), [], checkpoint="x")
  argv = dict(sweep.commands("table2", str(tmp_path), ["--config.evaluation.max_tasks=2"], checkpoint="runs/w/hf"))
  assert "--config.evaluation.checkpoint=runs/w/hf" in argv["heldout_styles"]
  assert argv["heldout_styles"][-1] == "--config.evaluation.max_tasks=2"  # Extra overrides come last and win.
  argv = dict(sweep.commands("world_gamma", str(tmp_path), [], init_from="runs/w/s0/sft/hf"))
  assert len(argv) == 4 and all("--config.init_from=runs/w/s0/sft/hf" in a for a in argv.values())
  assert all("--config.total_steps=16" in a and "--config.time_budget_s=0" in a for a in argv.values())
