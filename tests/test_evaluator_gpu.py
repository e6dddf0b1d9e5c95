"""GPU tests of the evaluator (run on the H200: `python -m pytest -q -m gpu tests/test_evaluator_gpu.py`).

Correct kernels pass with plausible speedups; every adversarial candidate (evaluator-anchors.md §6 classes that
can be written as device code + plan) is caught and none scores; the evaluator keeps serving afterwards. Each test
prints a table so one run shows what happened. Budget: about 2 minutes on one H200.
"""

import os

import pytest

from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig

pytestmark = pytest.mark.gpu

DATA = os.path.join(os.path.dirname(__file__), "data", "eval")
TASKS = os.path.join(DATA, "tasks")


def read(*parts):
  with open(os.path.join(DATA, *parts), encoding="utf-8") as f:
    return f.read()


def show(title, items, results):
  print(f"\n== {title}")
  for (task, _), r in zip(items, results):
    sp = f"{r.speedup:.3g}x" if r.speedup else "-"
    ref = f"{r.ref_time_ms:.4g}" if r.ref_time_ms else "-"
    cand = f"{r.cand_time_ms:.4g}" if r.cand_time_ms else "-"
    print(f"{task:12s} {r.status:14s} score={r.score:6.3f} speedup={sp:8s} ref_ms={ref:8s} cand_ms={cand:8s} "
          f"flags={','.join(r.flags) or '-'} total={r.times.get('total', 0):.2f}s | {r.error[:110]}")


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
  cfg = EvaluatorConfig(kernel_timeout_s=3.0, compile_workers=8, cache_dir=str(tmp_path_factory.mktemp("ev")))
  e = Evaluator(cfg, task_source=TASKS)
  yield e
  e.close()


# (task, candidate file, lower, upper) bounds on the speedup: loose sanity ranges, not performance claims.
CORRECT = [
    ("relu_1ms", "relu_1ms", 0.5, 3.0),
    ("softmax_1ms", "softmax_1ms", 0.3, 5.0),
    ("matmul_1ms", "matmul_1ms", 0.02, 1.5),
    ("vec_add", "vec_add", 0.2, 5.0),
    ("row_sum", "row_sum", 0.2, 10.0),
    ("row_sum", "row_sum_scratch", 0.005, 10.0),
    ("linear_relu", "linear_relu", 0.05, 10.0),
    ("two_outputs", "two_outputs", 0.01, 10.0),
    ("embedding", "embedding", 0.1, 10.0),
]


def test_correct_kernels_pass_with_plausible_speedups(ev):
  info = ev.gpu_info
  items = [(task, read("candidates", name + ".md")) for task, name, _, _ in CORRECT]
  rs = ev.evaluate(items)
  print("\nGPU:", ev.gpu_info)
  show("correct kernels", items, rs)
  assert info is None or info["arch"].startswith("sm_")
  for (task, name, lo, hi), r in zip(CORRECT, rs):
    assert r.status == "correct", (name, r.status, r.error, r.details.get("mismatch"))
    assert lo <= r.speedup <= hi, (name, r.speedup)
    assert r.score == pytest.approx(0.3 + r.speedup)
    assert r.details["timing"]["cand_ms"]["n"] == 100 and r.details["timing"]["validated"] >= 2
    assert r.details["distributions"][:2] == ["task", "normal"] or "fallback" in r.details["distributions"][1]
  by_task = {name: r for (_, name, _, _), r in zip(CORRECT, rs)}
  for name in ("relu_1ms", "softmax_1ms", "matmul_1ms"):  # The ~1 ms tasks really take about a millisecond.
    assert 0.2 <= by_task[name].ref_time_ms <= 5.0, (name, by_task[name].ref_time_ms)
  assert by_task["softmax_1ms"].details["kernel_attributes"]["softmax_rows"]["static_smem"] < 49152
  assert len(by_task["two_outputs"].details["kernel_ms"]) == 2  # Per-launch breakdown in the feedback.


# name -> (task, allowed statuses, a flag that must be present or None)
ADVERSARIAL = {
    "noop": ("vec_add", {"incorrect"}, "unwritten_output"),
    "partial_write": ("vec_add", {"incorrect"}, "unwritten_output"),
    "oob_write": ("vec_add", {"runtime_error"}, "out_of_bounds_write"),
    "input_mutation": ("vec_add", {"runtime_error"}, "input_mutation"),
    "read_neighbour": ("vec_add", {"incorrect"}, None),
    "memo_pointer": ("row_sum", {"incorrect"}, None),
    "call_count": ("row_sum", {"incorrect"}, "timing_validation_failed"),
    "hang": ("vec_add", {"timeout"}, "hang"),
    "illegal_address": ("vec_add", {"runtime_error"}, "illegal_address"),
    "trap": ("vec_add", {"runtime_error"}, "trap"),
    "half_precision": ("vec_add", {"incorrect"}, None),
    "tf32_matmul": ("linear_relu", {"incorrect"}, None),
    "race": ("row_sum", {"incorrect"}, None),
    "subsample": ("row_sum", {"incorrect"}, None),
    "uninit_scratch": ("row_sum", {"incorrect"}, None),
}


def test_adversarial_suite_is_caught_and_the_evaluator_keeps_serving(ev):
  names = list(ADVERSARIAL)
  items = [(ADVERSARIAL[n][0], read("adversarial", n + ".md")) for n in names]
  # The same call-counting kernel again (a comment keeps it from being deduplicated): it must fail the same way,
  # which shows its __device__ counter started from zero again (a fresh module per evaluation).
  items.append(("row_sum", read("adversarial", "call_count.md") + "\n<!-- second copy -->\n"))
  names.append("call_count#2")
  rs = ev.evaluate(items)
  show("adversarial", items, rs)
  for n, r in zip(names, rs):
    task, statuses, flag = ADVERSARIAL[n.split("#")[0]]
    assert r.status in statuses, (n, r.status, r.error)
    assert r.score == 0.0, n
    if flag:
      assert flag in r.flags, (n, r.flags, r.error)
  assert rs[-1].flags == rs[names.index("call_count")].flags
  # Still serving: a correct kernel right after the hangs, traps and illegal addresses.
  (r,) = ev.evaluate([("vec_add", read("candidates", "vec_add.md") + "\n<!-- after the suite -->\n")])
  assert r.status == "correct", r.error


def test_launch_limits_and_registers_are_checked_on_the_device(ev):
  base = read("candidates", "vec_add.md")
  items = [("vec_add", base.replace("block=(256,)", "block=(2048,)")),
           ("vec_add", base.replace("block=(256,)", "block=(256,) smem=300000")),
           ("vec_add", base.replace("block=(256,)", "block=(256,) smem=100000"))]
  rs = ev.evaluate(items)
  show("launch limits", items, rs)
  assert rs[0].status == "format_error" and "block x = 2048 exceeds the device limit 1024" in rs[0].error
  assert rs[1].status == "format_error" and "exceeds the device limit" in rs[1].error
  assert rs[2].status == "correct"  # 100 KB of dynamic shared memory is opted in for the kernel.


def test_cuda_graph_timing_and_excessive_speedup_recheck(tmp_path):
  cfg = EvaluatorConfig(timing_graphs="always", excessive_speedup=0.0, compile_workers=2, spare_workers=False,
                        timing_runs=30, cache_dir=str(tmp_path))
  with Evaluator(cfg, task_source=TASKS) as e:
    items = [("vec_add", read("candidates", "vec_add.md")), ("row_sum", read("adversarial", "call_count.md"))]
    rs = e.evaluate(items)
  show("cuda graphs + excessive-speedup re-check", items, rs)
  assert rs[0].status == "correct" and "cuda_graphs" in rs[0].flags and "excessive_speedup" in rs[0].flags
  assert rs[0].details["timing"]["validated"] == 33  # Every run of the re-check pass (30 timed + 3 warm-up).
  assert rs[1].status == "incorrect" and "timing_validation_failed" in rs[1].flags
