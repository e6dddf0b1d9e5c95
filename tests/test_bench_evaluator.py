"""bench_evaluator.py --compare-suite: status changes and speedup ratios between two suite checks (no GPU)."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import bench_evaluator  # pylint: disable=g-import-not-at-top,wrong-import-position


def _check(path, rows):
  with open(path, "w", encoding="utf-8") as f:
    json.dump({"wall_s": 100.0, "gpu": {"device_name": "GPU"}, "rows": [
        {"task": t, "solution": s, "status": st, "speedup": sp} for t, s, st, sp in rows]}, f)
  return str(path)


def test_compare_suites_reports_ratios_and_status_changes(tmp_path):
  old = _check(tmp_path / "old.json", [("a", "naive", "correct", 1.0), ("a", "opt", "correct", 2.0),
                                       ("b", "opt", "correct", 4.0), ("b", "wrong", "incorrect", None)])
  new = _check(tmp_path / "new.json", [("a", "naive", "correct", 1.004), ("a", "opt", "correct", 1.96),
                                       ("b", "opt", "correct", 4.0), ("b", "wrong", "runtime_error", None)])
  md = bench_evaluator.compare_suites(old, new)
  assert "status changes: 1 of 4 solutions" in md and "- b wrong: incorrect -> runtime_error" in md
  assert ("over 3 solutions correct in both: median 1.0000, min 0.9800, max 1.0040; worst 0.9800 (a opt); "
          "1 outside +-1 %") in md
  assert "- a opt: 0.9800" in md and "- a naive" not in md


def test_phase_breakdown_means_and_table():
  """details.breakdown of several results: the mean per phase and task, one table row per phase."""
  class R:
    def __init__(self, host, gpu=None, malloc=0):
      self.details = {"breakdown": {"host_ms": host, "n": {}, **({"gpu_ms": gpu} if gpu else {}),
                                    "cuda_malloc": malloc, "cuda_free": malloc}}
  b = bench_evaluator.phase_breakdown([R({"timing": 300.0, "timing/draw": 40.0}, {"timing": 290.0}, 4),
                                       R({"timing": 200.0}, {"timing": 210.0}, 2)])
  assert b["host_ms"] == {"timing": 250.0, "timing/draw": 20.0} and b["gpu_ms"] == {"timing": 250.0}
  assert b["cuda_malloc"] == 3.0
  lines = bench_evaluator.phase_lines({"relu": {"phases": b}, "mm": {"phases": {"host_ms": {"load": 1.5}}}})
  assert "| phase | relu host | relu GPU | mm host | mm GPU |" in lines
  assert "| timing/draw | 20.00 | - | - | - |" in lines and "| load | - | - | 1.50 | - |" in lines
  assert bench_evaluator.phase_lines({"relu": {"phases": {}}}) == []
