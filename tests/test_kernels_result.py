"""Reward math and feedback rendering (kevin_jax/kernels/result.py)."""

import json
import math

import pytest

from kevin_jax.kernels.evaluator import EvaluatorConfig
from kevin_jax.kernels.result import EvalResult, finalize, make_result, score


@pytest.mark.parametrize("status,speedup,kw,expected", [
    ("correct", 2.0, {}, 2.3),
    ("correct", 0.5, {}, 0.8),
    ("correct", None, {}, 0.3),
    ("incorrect", 5.0, {}, 0.0),
    ("runtime_error", None, {}, 0.0),
    ("correct", 4.0, {"speedup_cap": 1.5}, 1.8),
    ("correct", 3.0, {"log_speedup": True}, 2.3),
    ("correct", 15.0, {"log_speedup": True, "speedup_cap": 3.0}, 3.3),
    ("correct", 2.0, {"correct_weight": 0.0}, 2.0),
])
def test_score(status, speedup, kw, expected):
  assert score(status, speedup, **kw) == pytest.approx(expected)


def test_score_from_config():
  cfg = EvaluatorConfig(correct_weight=0.5, speedup_cap=2.0)
  r = make_result("t", "correct", cfg=cfg, speedup=3.0, ref_time_ms=3.0, cand_time_ms=1.0)
  assert r.score == pytest.approx(2.5)
  cfg = EvaluatorConfig(log_speedup=True)
  r = make_result("t", "correct", cfg=cfg, speedup=1.0, ref_time_ms=1.0, cand_time_ms=1.0)
  assert r.score == pytest.approx(0.3 + math.log2(2.0))


def test_feedback_per_status():
  f = make_result("t", "format_error", "unknown kernel 'k2'").feedback
  assert f.startswith("Format error: unknown kernel 'k2'\n") and "```plan" in f
  log = "kernel.cu(4): error: identifier \"q\" is undefined\n" + "x" * 5000
  f = make_result("t", "compile_error", "e", details={"compile_log": log}).feedback
  assert f.startswith("Compilation failed (NVRTC):\nkernel.cu(4): error")
  assert len(f) <= 2000 and "more characters]" in f
  f = make_result("t", "runtime_error", "launch 1 (k): illegal memory access").feedback
  assert f == "Runtime error: launch 1 (k): illegal memory access"
  assert make_result("t", "timeout", "launch 1 (k) did not finish in time").feedback.startswith("Timeout: ")
  r = make_result("t", "correct", speedup=2.4612, ref_time_ms=1.013, cand_time_ms=0.41158,
                  details={"kernel_ms": [["a", 0.1], ["b", 0.31]]})
  assert r.feedback == ("Correct. Your kernels took 0.4116 ms vs 1.013 ms for the PyTorch reference: speedup 2.46x. "
                        "Per launch (ms): a 0.1, b 0.31")
  assert make_result("t", "compiled").feedback.startswith("Compiled and validated")


def test_incorrect_feedback_names_the_output_and_the_error():
  mm = {"output": "out", "dtype": "float32", "shape": [4096], "bad": 1234, "numel": 4096, "atol": 1e-4, "rtol": 1e-4,
        "trial": 2, "distribution": "normal", "nonfinite": 0, "max_abs_err": 0.3125, "max_rel_err": 1.5,
        "first_index": [17], "expected": 1.25, "got": 0.9375}
  r = make_result("t", "incorrect", "output 'out' does not match the reference", details={"mismatch": mm})
  assert r.feedback == (
      "Incorrect: output 'out' does not match the reference\n"
      "Output out (float32[4096]): 1,234 of 4,096 elements outside tolerance (atol=0.0001, rtol=0.0001) in trial 2 "
      "(normal inputs). Max abs error 0.3125, max rel error 1.5. First bad element at index [17]: expected 1.25, "
      "got 0.9375.")
  assert r.score == 0.0


def test_round_trip_through_json():
  r = make_result("level1/19_ReLU", "correct", speedup=1.5, ref_time_ms=1.5, cand_time_ms=1.0,
                  flags=["excessive_speedup", "excessive_speedup"], times={"compile": 0.1})
  assert r.flags == ["excessive_speedup"]
  back = EvalResult.from_dict(json.loads(json.dumps(r.to_dict())))
  assert back == r and back.correct
  r.status = "incorrect"
  finalize(r)
  assert r.score == 0.0 and r.feedback.startswith("Incorrect")


def test_timing_budget_settings_reach_the_worker_and_are_checked():
  s = EvaluatorConfig(timing_max_s=0.5, timing_min_runs=30).worker_settings()
  assert s["timing_max_s"] == 0.5 and s["timing_min_runs"] == 30 and s["timing_runs"] == 100
  assert EvaluatorConfig().worker_settings()["timing_max_s"] == 0.0  # Off by default: KernelBench's 100 runs.
  for bad in (dict(timing_max_s=-1.0), dict(timing_min_runs=0)):
    with pytest.raises(ValueError, match="timing_max_s must be >= 0 and timing_min_runs >= 1"):
      EvaluatorConfig(**bad)
