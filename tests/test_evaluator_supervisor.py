"""The supervisor survives crashing, hanging and memory-hungry workers (CPU only: a fake GPU worker role).

The fake worker (kevin_jax/kernels/fake_worker.py) acts on a `FAKE:<action>` marker in the candidate's CUDA source;
everything else (compile pool, static checks, scheduling, deadlines, replacement, recycling) is the real code.
"""

import os
import re
import time
import uuid

import pytest

from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig

DATA = os.path.join(os.path.dirname(__file__), "data", "eval")
TASKS = os.path.join(DATA, "tasks")
with open(os.path.join(DATA, "candidates", "vec_add.md"), encoding="utf-8") as _f:
  GOOD = _f.read()


def marked(action: str, salt: str = "") -> str:
  return GOOD.replace('extern "C"', f"// FAKE:{action} {salt}\nextern \"C\"", 1)


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
  cfg = EvaluatorConfig(compile_workers=1, run_timeout_s=3.0, task_timeout_s=5.0, recycle_after=3,
                        worker_host_memory_gb=0.5, spare_workers=True, worker_start_timeout_s=120.0,
                        cache_dir=str(tmp_path_factory.mktemp("evaluator")))
  e = Evaluator(cfg, task_source=TASKS, _gpu_role="fake")
  yield e
  e.close()


def test_crashes_hangs_and_errors_become_results(ev):
  items = [("vec_add", GOOD), ("vec_add", marked("segv")), ("vec_add", marked("exit")), ("vec_add", marked("hang")),
           ("vec_add", marked("raise")), ("vec_add", marked("fatal")), ("vec_add", marked("ok", "after")),
           ("vec_add", marked("incorrect")), ("vec_add", "no blocks here"), ("no_such_task", GOOD)]
  rs = ev.evaluate(items)
  assert [r.status for r in rs] == ["correct", "runtime_error", "runtime_error", "timeout", "runtime_error",
                                    "runtime_error", "correct", "incorrect", "format_error", "runtime_error"]
  assert [r.score for r in rs] == pytest.approx([2.3, 0, 0, 0, 0, 0, 2.3, 0, 0, 0])
  assert rs[1].flags == ["worker_crash"] and "killed by SIGSEGV" in rs[1].error
  assert rs[2].flags == ["worker_crash"] and "exit code 7" in rs[2].error
  assert rs[3].flags == ["hang"] and "no progress within 3 s in phase 'candidate'" in rs[3].error
  assert rs[4].flags == ["evaluator_error"] and "fake failure inside the worker" in rs[4].error
  assert rs[5].flags == ["illegal_address"]
  assert rs[8].error == "missing ```cuda block"
  assert rs[9].flags == ["evaluator_error"] and "unknown task id 'no_such_task'" in rs[9].error
  assert rs[0].feedback.startswith("Correct. Your kernels took 0.5 ms vs 1 ms")
  for key in ("static_queue", "task_analysis", "validate", "compile", "gpu_queue", "correctness", "timing", "total"):
    assert key in rs[0].times
  assert [p for p, _ in rs[0].details["phases"]] == ["sent", "load", "candidate", "timing", "done"]
  # Still serving, with fresh workers.
  (r,) = ev.evaluate([("vec_add", marked("ok", "later"))])
  assert r.status == "correct"


def test_an_idle_worker_is_told_so(ev):
  """worker_main calls the handler's `idle` (the GPU worker: release cached memory) when no job follows a result
  within IDLE_AFTER_S; a worker that waited between two batches has been idle at least once."""
  (a,) = ev.evaluate([("vec_add", marked("ok", "idle-a"))])
  time.sleep(0.3)
  (b,) = ev.evaluate([("vec_add", marked("ok", "idle-b"))])
  if a.details["worker_pid"] == b.details["worker_pid"]:
    assert b.details["worker_idles"] > a.details["worker_idles"]
  else:  # Recycled in between: the fresh worker had not yet run a job.
    assert b.details["worker_idles"] == 0


def test_memory_watchdog_kills_the_worker(ev):
  (r,) = ev.evaluate([("vec_add", marked("alloc=1200"))])
  assert r.status == "runtime_error" and r.flags == ["worker_crash"]
  assert re.search(r"worker host memory \d+\.\d GiB exceeded the limit 0\.5 GiB", r.error)


def test_reference_failure_on_a_distribution_is_retried_without_it(ev):
  (r,) = ev.evaluate([("vec_add", marked("hang_reference"))])
  assert r.status == "correct"
  assert r.details["unsafe_dists"] == ["normal"]
  (r2,) = ev.evaluate([("vec_add", marked("ok", "next"))])
  assert r2.details["unsafe_dists"] == ["normal"]  # Remembered for the task.


def test_out_of_gpu_memory_is_retried_on_a_fresh_worker_then_an_evaluator_error(ev):
  """An allocator failure is the crowded GPU's, not the candidate's (its scratch is capped): the worker is replaced
  and the candidate evaluated again; a second failure is reported as an evaluator error, never as its fault."""
  salt = uuid.uuid4().hex
  once, always = ev.evaluate([("vec_add", marked("oom_once", salt)), ("vec_add", marked("oom", salt))])
  assert once.status == "correct", once.error
  assert always.status == "runtime_error" and always.score == 0.0
  assert always.flags == ["gpu_oom", "evaluator_error"]
  assert always.error.startswith("evaluator error: the GPU ran out of memory for this evaluation twice")
  (r,) = ev.evaluate([("vec_add", marked("ok", salt))])
  assert r.status == "correct"


def test_a_task_over_the_memory_budget_is_skipped_as_a_whole(ev):
  """vec_add: inputs 32 MiB, output 16 MiB -> one evaluation needs 6*32 + 2*16 + 32 = 256 MiB
  (kernels/footprint.py); with task_memory_fraction 0.8 it fits 400 MiB free (320) but not 300 MiB (240)."""
  salt = uuid.uuid4().hex
  small, large = ev.evaluate([("vec_add", marked("free=300", salt)), ("vec_add", marked("free=400", salt))])
  assert small.status == "runtime_error" and small.score == 0.0
  assert small.flags == ["task_too_large", "evaluator_error"]
  assert "too large for this GPU" in small.error and "not scored" in small.error
  assert small.details["evaluation_bytes"] == 256 * 2**20 and small.details["task_memory_fraction"] == 0.8
  assert large.status == "correct", large.error


def test_workers_are_recycled(ev):
  rs = ev.evaluate([("vec_add", marked("ok", f"r{i}")) for i in range(8)])
  assert all(r.status == "correct" for r in rs)
  counts = [r.details["worker_count"] for r in rs]
  assert max(counts) <= 3  # recycle_after=3: no worker process served more than 3 evaluations.
  assert len({r.details["worker_pid"] for r in rs}) >= 3


def test_duplicates_are_evaluated_once(ev):
  a, b = ev.evaluate([("vec_add", marked("ok", "dup")), ("vec_add", marked("ok", "dup"))])
  assert a.status == b.status == "correct"
  assert b.flags == ["deduplicated"] and a.eval_id == b.eval_id


def test_check_static_through_the_compile_pool(ev):
  assert ev.check_static("vec_add", GOOD).status == "compiled"
  r = ev.check_static("vec_add", GOOD.replace("x[i] + y[i]", "x[i] + z[i]"))
  assert r.status == "compile_error" and r.feedback.startswith("Compilation failed (NVRTC):\nkernel.cu(4): error")
  r = ev.check_static("vec_add", GOOD.replace("args=(x, y, out, x.numel)", "args=(x, y, out)"))
  assert r.status == "format_error" and "3 arguments given but kernel add takes 4" in r.error


def test_a_gpu_role_that_cannot_start_gives_evaluator_errors(tmp_path):
  cfg = EvaluatorConfig(compile_workers=1, spare_workers=False, cache_dir=str(tmp_path))
  with Evaluator(cfg, task_source=TASKS, _gpu_role="no_such_role") as e:
    rs = e.evaluate([("vec_add", GOOD), ("vec_add", marked("ok", "2"))])
  assert [r.status for r in rs] == ["runtime_error", "runtime_error"]
  assert all(r.flags == ["evaluator_error"] for r in rs)
  assert "failed to start 3 times" in rs[0].error and "unknown worker role" in rs[0].error


def test_result_cache_answers_repeats_in_later_batches(tmp_path):
  cfg = EvaluatorConfig(compile_workers=1, spare_workers=False, run_timeout_s=3.0, result_cache=2,
                        cache_dir=str(tmp_path))
  with Evaluator(cfg, task_source=TASKS, _gpu_role="fake") as e:
    a, h = e.evaluate([("vec_add", marked("ok", "a")), ("vec_add", marked("hang"))])
    assert a.status == "correct" and h.status == "timeout"
    # A repeat in a later batch, twice in the batch: one cached copy, its in-batch duplicate shares it.
    a2, a3, h2 = e.evaluate([("vec_add", marked("ok", "a")), ("vec_add", marked("ok", "a")),
                             ("vec_add", marked("hang"))])
    assert a2.flags == ["cached"] and a3.flags == ["cached", "deduplicated"]
    assert (a2.status, a2.score, a2.speedup, a2.feedback) == (a.status, a.score, a.speedup, a.feedback)
    assert a2.eval_id == a.eval_id and a2.times == {"total": 0.0} and a2.details["cached_times"] == a.times
    assert h2.status == "timeout" and "cached" not in h2.flags  # A hang may be the machine's: evaluated again.
    # LRU of 2 entries: b and c push a out, so a is evaluated afresh.
    e.evaluate([("vec_add", marked("ok", "b")), ("vec_add", marked("ok", "c"))])
    (a4,) = e.evaluate([("vec_add", marked("ok", "a"))])
    assert a4.flags == [] and a4.eval_id != a.eval_id
  with pytest.raises(ValueError, match="result_cache"):
    EvaluatorConfig(result_cache=-1)


def test_without_dedupe_every_copy_gets_its_own_result(tmp_path):
  cfg = EvaluatorConfig(compile_workers=1, spare_workers=False, dedupe=False, cache_dir=str(tmp_path))
  with Evaluator(cfg, task_source=TASKS, _gpu_role="fake") as e:
    a, b = e.evaluate([("vec_add", marked("ok", "x")), ("vec_add", marked("ok", "x"))])
  assert a.status == b.status == "correct" and a.eval_id != b.eval_id and not a.flags and not b.flags
