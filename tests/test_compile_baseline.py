"""kevin_jax/kernels/compile_baseline.py's result fields (the GPU timing itself: tests/test_kernelbench_reference.py's
GPU test) and the setting that turns it on (off by default)."""

import types

from kevin_jax.kernels import compile_baseline
from kevin_jax.kernels.evaluator import EvaluatorConfig


def _res(status="correct", cand_ms=0.5):
  return {"status": status, "cand_time_ms": cand_ms, "details": {}}


def test_speedup_against_the_compiled_reference(monkeypatch):
  monkeypatch.setattr(compile_baseline, "reference_ms", lambda w, state: 2.0)
  res = _res()
  compile_baseline.attach(None, types.SimpleNamespace(task_id="t"), res)
  assert res["details"] == {"compile_ref_ms": 2.0, "speedup_compile": 4.0}


def test_a_failed_compile_is_na_with_its_reason(monkeypatch):
  monkeypatch.setattr(compile_baseline, "reference_ms", lambda w, state: "n/a: BackendCompilerFailed: no triton")
  res = _res()
  compile_baseline.attach(None, types.SimpleNamespace(task_id="t"), res)
  assert res["status"] == "correct"
  assert res["details"] == {"compile_ref_ms": "n/a", "speedup_compile": "n/a",
                            "compile_error": "BackendCompilerFailed: no triton"}


def test_only_correct_timed_results_get_it(monkeypatch):
  calls = []
  monkeypatch.setattr(compile_baseline, "reference_ms", lambda w, state: calls.append(1) or 1.0)
  for res in (_res("incorrect"), _res(cand_ms=None)):
    compile_baseline.attach(None, types.SimpleNamespace(task_id="t"), res)
    assert res["details"] == {}
  assert not calls


def test_off_by_default_and_passed_to_the_workers():
  assert EvaluatorConfig().worker_settings()["compile_baseline"] is False
  assert EvaluatorConfig(compile_baseline=True).worker_settings()["compile_baseline"] is True
