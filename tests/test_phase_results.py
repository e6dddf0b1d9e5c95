"""experiments/phase_results.py on the committed records of the default job's phased runs (README "Results")."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import phase_results  # pylint: disable=g-import-not-at-top,wrong-import-position

RESULTS = os.path.join(ROOT, "experiments", "results")


def test_seed0_record_summary():
  r = phase_results.summarize(os.path.join(RESULTS, "2026-12-04_twentieth", "default_s0_fitted"))
  assert (r["tasks"], r["rl_steps"], r["tasks_up"], r["tasks_down"]) == (30, 24, 27, 3)
  assert r["warm"]["score"] == pytest.approx(1.1165, abs=1e-4)
  assert r["after"]["score"] == pytest.approx(1.4810, abs=1e-4)
  assert r["gain"] == pytest.approx(0.3265, abs=1e-4)
  assert (r["warm"]["correct"], r["after"]["correct"]) == pytest.approx((0.740, 0.850), abs=1e-3)
  # Every task has 16 kernels in both evaluations, so the per-task mean change equals the overall change.
  assert r["task_change"] == pytest.approx(r["after"]["score"] - r["warm"]["score"], abs=1e-9)
  assert r["task_change_se"] == pytest.approx(0.076, abs=1e-3)
  assert [round(x, 3) for x in r["warm"]["turns"]] == [0.650, 1.217, 1.285, 1.314]
  assert r["ceiling"] > r["after"]["score"]
  table = phase_results.table([r])
  assert "1.116 → 1.481 (+32.7 %)" in table and "| 27 / 3 |" in table


def test_running_mean():
  assert phase_results.running_mean([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
  assert phase_results.running_mean([2.0], window=5) == [2.0]


def test_cli_writes_the_plot(tmp_path):
  rows = phase_results.main([os.path.join(RESULTS, "2026-12-04_nineteenth", "default_s1_fitted"), "--out",
                             str(tmp_path)])
  assert rows[0]["rl_steps"] == 28 and round(100 * rows[0]["gain"], 1) == 19.1
  assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_single_versus_multi_turn_from_one_warm_start():
  runs = [os.path.join(RESULTS, "2026-12-04_twentyfirst", r) for r in ("default_s0_cache", "single_s0_cache",
                                                                        "default_s1_cache")]
  rows = [phase_results.summarize(r) for r in runs]
  assert [r["rl_steps"] for r in rows] == [30, 30, 30]
  assert [round(100 * r["gain"], 1) for r in rows] == [38.5, 31.4, 36.1]
  # Seed 1 has its own warm start, so only the single-turn run is paired with the first.
  (p,) = phase_results.paired_with_first(rows)
  assert p["run"] == "single_s0_cache" and (p["up"], p["down"]) == (8, 13)
  assert p["mean"] == pytest.approx(rows[1]["after"]["score"] - rows[0]["after"]["score"], abs=1e-9)
  assert (round(p["mean"], 3), round(p["se"], 3)) == (-0.079, 0.083)
  turns = phase_results.turns_table(rows)
  assert "| single_s0_cache | 0.650 → 1.552 | 1.217 → 1.476 | 1.285 → 1.445 | 1.314 → 1.396 |" in turns
