"""GPU tests of the evaluator's hardening (run on a GPU host: `python -m pytest -q -m gpu tests/test_evaluator_gpu_hardening.py`).

The attacks of tests/data/eval/adversarial/ that need a GPU to show themselves: kernels that behave differently
once timing starts (memoised and rescaled results, late out-of-bounds writes, late input mutation, a clock
switch), a guard copy, resource abuse (local memory, a 4 GiB __device__ array), a signature hidden from the
parser, a host include, an enormous grid and a plan too slow for the evaluation's wall budget. Every one must be
caught without a score and the evaluator must keep serving. Budget: about 2 minutes on one H100 or H200.
"""

import os
import time

import pytest

from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig

pytestmark = pytest.mark.gpu

DATA = os.path.join(os.path.dirname(__file__), "data", "eval")
TASKS = os.path.join(DATA, "tasks")
EVAL_TIMEOUT_S = 20.0


def read(*parts):
  with open(os.path.join(DATA, *parts), encoding="utf-8") as f:
    return f.read()


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
  cfg = EvaluatorConfig(kernel_timeout_s=3.0, eval_timeout_s=EVAL_TIMEOUT_S, compile_workers=8,
                        cache_dir=str(tmp_path_factory.mktemp("ev")))
  e = Evaluator(cfg, task_source=TASKS)
  yield e
  e.close()


# name -> (task, allowed statuses, a flag that must be present or None)
HARDENING = {
    "memo_rescale": ("row_sum", {"incorrect"}, "timing_validation_failed"),
    "oob_after_n": ("vec_add", {"runtime_error"}, "out_of_bounds_write"),
    "mutate_in_timing": ("vec_add", {"runtime_error"}, "input_mutation"),
    "guard_copy": ("vec_add", {"runtime_error"}, "out_of_bounds_write"),
    "local_memory_hog": ("vec_add", {"format_error"}, "local_memory"),
    "huge_device_array": ("vec_add", {"format_error"}, None),
    "signature_macro": ("vec_add", {"format_error"}, "signature_mismatch"),
    "host_include": ("vec_add", {"format_error"}, None),
    "huge_grid": ("vec_add", {"timeout"}, None),
    "slow_launches": ("vec_add", {"timeout"}, "eval_deadline"),
}


def test_hardening_attacks_are_caught_and_the_evaluator_keeps_serving(ev):
  names = list(HARDENING)
  items = [(HARDENING[n][0], read("adversarial", n + ".md")) for n in names]
  t = time.monotonic()
  rs = ev.evaluate(items)
  print(f"\n== hardening ({time.monotonic() - t:.1f} s)")
  for n, r in zip(names, rs):
    print(f"{n:18s} {r.status:14s} score={r.score:.3f} flags={','.join(r.flags) or '-'} "
          f"total={r.times.get('total', 0):.1f}s | {r.error[:120]}")
  for n, r in zip(names, rs):
    task, statuses, flag = HARDENING[n]
    assert r.status in statuses, (n, r.status, r.error)
    assert r.score == 0.0, n
    if flag:
      assert flag in r.flags, (n, r.flags, r.error)
  by = dict(zip(names, rs))
  assert "root:" not in by["host_include"].feedback and "/bin/" not in by["host_include"].feedback
  # The wall budget ends the slow plan (the per-launch deadline never fires): well before 5 trials x 2 runs x 12 s.
  slow = by["slow_launches"].times
  assert slow.get("gpu_total", slow["total"]) < EVAL_TIMEOUT_S + 15, slow
  (r,) = ev.evaluate([("vec_add", read("candidates", "vec_add.md") + "\n<!-- after the hardening suite -->\n")])
  assert r.status == "correct", r.error


GLOBALTIMER_DELAYS_MS = (50, 300, 600, 900, 1200)


def test_a_clock_switch_never_scores_a_faster_kernel(ev):
  """%globaltimer-triggered skipping, switched on after several delays: wherever the switch falls (correctness
  trials, timed runs, or after the evaluation), no result is correct with a speedup above the honest kernel's."""
  text = read("adversarial", "globaltimer_skip.md")
  assert "300000000ULL" in text
  honest = read("candidates", "relu_1ms.md")
  items = [("relu_1ms", honest)] + [("relu_1ms", text.replace("300000000ULL", f"{ms * 1_000_000}ULL"))
                                    for ms in GLOBALTIMER_DELAYS_MS]
  rs = ev.evaluate(items)
  print("\n== clock switch")
  for name, r in zip(["honest"] + [f"skip after {ms} ms" for ms in GLOBALTIMER_DELAYS_MS], rs):
    print(f"{name:20s} {r.status:10s} speedup={r.speedup or 0:.3f} flags={','.join(r.flags) or '-'} "
          f"timing={r.times.get('timing', 0):.2f}s | {r.error[:100]}")
  assert rs[0].status == "correct", rs[0].error
  for ms, r in zip(GLOBALTIMER_DELAYS_MS, rs[1:]):
    if r.status == "correct":
      assert r.speedup <= 1.1 * rs[0].speedup, (ms, r.speedup, rs[0].speedup)
    else:
      assert r.status == "incorrect" and r.score == 0.0, (ms, r.status, r.error)
  # The shortest delay switches inside the correctness trials or the first timed runs: the attack does fire.
  assert rs[1].status == "incorrect", rs[1].error


def test_timed_inputs_are_fresh_draws_and_the_first_timed_run_is_checked(tmp_path):
  """timed_inputs='fresh' (with 'auto' the choice depends on how fast this host draws a task's inputs: worker.py);
  row_sum's plain torch.randn input takes keyed draws, and the validated timed runs agree with the reference."""
  cfg = EvaluatorConfig(timed_inputs="fresh", compile_workers=2, spare_workers=False, cache_dir=str(tmp_path))
  with Evaluator(cfg, task_source=TASKS) as fresh_ev:
    (r,) = fresh_ev.evaluate([("row_sum", read("candidates", "row_sum.md") + "\n<!-- fresh inputs -->\n")])
  assert r.status == "correct", r.error
  t = r.details["timing"]
  shown = ("inputs", "fresh_draw", "input_sets", "validated", "method", "draw_ms")
  print("\ntiming details:", {k: t[k] for k in shown})
  assert t["inputs"] == "fresh" and t["validated"] >= 3 and t["draw_ms"] > 0
  assert t["redraw"] == ["randn"] and t["fresh_draw"] == "keyed"  # keyed_draw.py's kernel, both sides.
