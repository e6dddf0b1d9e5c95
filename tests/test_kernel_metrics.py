"""kevin_jax.rl.kernel_metrics against hand-computed values."""

import numpy as np
import pytest

from kevin_jax.rl import kernel_metrics as km


def test_trajectory_performance_and_task_summary():
  # 3 trajectories x 3 turns.
  correct = np.array([[0, 1, 1],
                      [0, 0, 0],
                      [1, 0, 1]], bool)
  speedup = np.array([[9.0, 0.8, 1.6],   # turn-1 speedup 9 is incorrect: ignored.
                      [5.0, 5.0, 5.0],   # never correct: perf 0.
                      [1.2, 3.0, 0.9]])
  c, p = km.trajectory_performance(correct, speedup)
  np.testing.assert_array_equal(c, [True, False, True])
  np.testing.assert_allclose(p, [1.6, 0.0, 1.2])
  s = km.task_summary(correct, speedup)
  assert s["correct_best"] == 1.0 and s["correct_avg"] == pytest.approx(2 / 3)
  assert s["perf_best"] == pytest.approx(1.6) and s["perf_avg"] == pytest.approx((1.6 + 1.2) / 3)
  assert s["fast_1_best"] == 1.0 and s["fast_1_avg"] == pytest.approx(2 / 3)
  assert s["fast_1.5_best"] == 1.0 and s["fast_1.5_avg"] == pytest.approx(1 / 3)
  # Only the first turn: trajectory 3 is correct at 1.2x, the others not.
  s1 = km.task_summary(correct, speedup, turns=1)
  assert s1["correct_avg"] == pytest.approx(1 / 3) and s1["perf_best"] == pytest.approx(1.2)
  assert s1["fast_1.5_best"] == 0.0


def test_suite_summary_averages_tasks():
  a = {"perf_best": 1.0, "correct_avg": 0.5}
  b = {"perf_best": 0.0, "correct_avg": 0.25}
  assert km.suite_summary([a, b]) == {"perf_best": 0.5, "correct_avg": 0.375}
  assert km.suite_summary([]) == {}


def test_monitors():
  assert km.not_okay_ratio(["Okay, so", "  Okay, x", "Okay Amigos", "Hmm"]) == 0.5
  assert km.repeated_ngram_ratio([1, 2, 3, 4, 5, 6], n=2) == 0.0
  # 1 2 1 2 1 2: bigrams (1,2),(2,1),(1,2),(2,1),(1,2): 2 unique of 5 -> 0.6 repeated.
  assert km.repeated_ngram_ratio([1, 2, 1, 2, 1, 2], n=2) == pytest.approx(0.6)
  assert km.repeated_ngram_ratio([7] * 3, n=4) == 0.0


def test_turn_score_table():
  t = km.turn_score_table(np.array([[0.0, 1.3], [0.3, 2.0]]))
  assert t == {"mean": [0.15, 1.65], "max": [0.3, 2.0]}


def test_shape_errors():
  with pytest.raises(ValueError, match="matching"):
    km.trajectory_performance(np.zeros((2, 3), bool), np.zeros((2, 2)))


def test_kernel_summary_hand_computed():
  statuses = ["correct", "incorrect", "correct", "format_error"]
  scores = [1.5, 0.0, 0.8, 0.0]  # 0.3 + 1.2 and 0.3 + 0.5
  speedups = [1.2, 3.0, 0.5, 0.0]  # The incorrect kernel's 3.0 must not count.
  s = km.kernel_summary(statuses, scores, speedups)
  assert s["score_mean"] == pytest.approx(0.575)
  assert s["correct_rate"] == pytest.approx(0.5)
  assert s["speedup_mean_correct"] == pytest.approx(0.85)
  assert km.kernel_summary(["incorrect"], [0.0], [2.0])["speedup_mean_correct"] == 0.0
  with pytest.raises(ValueError):
    km.kernel_summary([], [], [])


def test_gpu_work_counts_each_evaluation_once():
  a = {"eval_id": "a", "status": "correct", "times": {"compile": 0.1, "gpu_total": 1.5}}
  b = {"eval_id": "b", "status": "incorrect", "times": {"gpu_total": 0.25}}
  static = {"eval_id": "c", "status": "compile_error", "times": {"compile": 0.2}}  # never reached the GPU
  fmt = {"status": "format_error"}  # no evaluator result at all
  cached = {"eval_id": "d", "status": "correct", "flags": ["cached"], "times": {"total": 0.0}}  # an earlier batch's
  got = km.gpu_work([a, b, dict(a), static, fmt, a, cached, dict(cached)])  # same eval_id: the same evaluation
  assert got == {"gpu_runs": 2.0, "gpu_s": 1.75, "cached": 2.0}
  assert km.gpu_work([]) == {"gpu_runs": 0.0, "gpu_s": 0.0, "cached": 0.0}
