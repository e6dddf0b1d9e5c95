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


# --- novelty ------------------------------------------------------------------------------------------------------

def _cand(body: str, plan: str = "launch k grid=(1,) block=(1,) args=(out)") -> str:
  return f"```cuda\n{body}\n```\n```plan\n{plan}\n```"


def test_normalize_ignores_comments_and_layout_only():
  a = _cand('extern "C" __global__ void k(float* y) {\n  y[0] = 1.0f;  // one\n}')
  b = _cand('/* same kernel */ extern "C" __global__ void k(float* y) { y[0] =\n 1.0f; }', "launch k grid=(1,) "
            "block=(1,) args=(out)  # one thread")
  assert km.normalize(a) == km.normalize(b)
  assert km.normalize(a) != km.normalize(a.replace("1.0f", "2.0f"))
  assert km.kernel_tokens("x[i % L] += 2.5e-3f;") == ["x", "[", "i", "%", "L", "]", "+", "=", "2.5e-3f", ";"]


def test_corpus_index_by_hand():
  """Token bigrams (n=2) of three tiny 'kernels' whose Jaccard indices are easy to count."""
  idx = km.CorpusIndex(["a b c d", "a b x y", "a b c d"], n=2)  # The duplicate is one response.
  assert len(idx) == 2
  assert idx.is_copy("a  b c\nd // trailing comment") and not idx.is_copy("a b c")
  # "a b c" -> {ab, bc}; vs "a b c d" {ab, bc, cd}: 2 / 3; vs "a b x y" {ab, bx, xy}: 1 / 4.
  assert idx.nearest("a b c") == pytest.approx(2 / 3)
  # "a b x z" -> {ab, bx, xz}: vs doc 2 {ab, bx, xy}: 2 / 4; vs doc 1: 1 / 5.
  assert idx.nearest("a b x z") == pytest.approx(0.5)
  # A repeated unseen gram counts once: "q r q r" -> {qr, rq}: nothing shared.
  assert idx.nearest("q r q r") == 0.0
  assert idx.nearest("a b c d") == 1.0
  assert km.CorpusIndex([], n=2).nearest("a b") == 0.0
  with pytest.raises(ValueError):
    km.CorpusIndex(["a"], n=0)


def test_novelty_summary_by_hand():
  idx = km.CorpusIndex(["a b c d", "a b x y"], n=2)
  s = km.novelty_summary(["a b c d", "a b c", "a b c", "a b x z"], idx)
  # One copy, three novel kernels of which two are the same text; nearest 1, 2/3, 2/3, 1/2.
  assert s == {"correct_kernels": 4.0, "novel_share": 0.75, "novel_distinct": 2.0,
               "nearest_jaccard_mean": pytest.approx((1 + 2 / 3 + 2 / 3 + 0.5) / 4)}
  assert km.novelty_summary([], idx) == {"correct_kernels": 0.0, "novel_share": 0.0, "novel_distinct": 0.0,
                                         "nearest_jaccard_mean": 0.0}


def test_rl_step_metrics_report_novelty_of_the_correct_kernels():
  from kevin_jax.rl import prompts  # pylint: disable=g-import-not-at-top
  from kevin_jax.rl import rollout as ro  # pylint: disable=g-import-not-at-top
  from kevin_jax.rl.step_metrics import rollout_metrics  # pylint: disable=g-import-not-at-top
  texts = ["a b c d", "a b c", "q r s"]  # A corpus copy, a near copy, and a wrong kernel.
  statuses = ["correct", "correct", "incorrect"]
  turns = [ro.Turn("t", traj=k, turn=0, prompt_ids=[1], response_ids=[1, 2], logprobs=np.zeros(2), response=t,
                   parsed=prompts.ParsedResponse("Okay,", t, "", ""), finish_reason="eos",
                   result={"status": s, "score": 1.0 if s == "correct" else 0.0})
           for k, (t, s) in enumerate(zip(texts, statuses))]
  m = rollout_metrics(turns, ro.RolloutTimes(1.0, 1.0, 6, 3), np.zeros(3), np.zeros(3),
                      km.CorpusIndex(["a b c d"], n=2))
  assert m["novelty/correct_kernels"] == 2.0 and m["novelty/novel_share"] == 0.5
  assert m["novelty/nearest_jaccard_mean"] == pytest.approx((1.0 + 2 / 3) / 2)
  assert "novelty/novel_share" not in rollout_metrics(turns, ro.RolloutTimes(), np.zeros(3), np.zeros(3))
