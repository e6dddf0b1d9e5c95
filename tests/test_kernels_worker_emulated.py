"""The GPU worker's evaluation logic, run on the CPU: CUDA streams/events are stubbed and the "kernels" are Python
functions behind the same launch interface (pointer arguments resolved back to the guarded buffers).

What runs for real: plan re-validation, buffer allocation with guards, input draws, the reference on copies,
poisoning, sealing, guard/mutation checks, comparisons, the timing loop with rescaled inputs and validation, and
result construction. What does not: NVRTC cubins, CUDA faults, timing numbers (see test_evaluator_gpu.py).
"""

import collections
import contextlib
import os
import random
import time

import pytest
import torch

from kevin_jax.kernels import buffers as B
from kevin_jax.kernels import timing, worker
from kevin_jax.kernels.integrity import KeyedHash
from kevin_jax.kernels.plan import Limits

DATA = os.path.join(os.path.dirname(__file__), "data", "eval")
CUDA_ADD = 'extern "C" __global__ void add(const float* x, const float* y, float* out, long long n) {}'
CUDA_ADD_RW = 'extern "C" __global__ void add(float* x, float* y, float* out, long long n) {}'
PLAN_ADD = "launch add grid=(cdiv(x.numel, 256),) block=(256,) args=(x, y, out, x.numel)"
TASK = '''
import torch
class Model(torch.nn.Module):
  def forward(self, x, y):
    return x + y
def get_inputs():
  return [torch.randn(1000), torch.randn(1000)]
def get_init_inputs():
  return []
'''


class FakeEvent:
  def __init__(self, enable_timing=False):
    self.t = None

  def record(self, stream=None):
    self.t = time.perf_counter()

  def query(self):
    return True

  def synchronize(self):
    pass

  def elapsed_time(self, other):
    return (other.t - self.t) * 1e3


class FakeStream:
  cuda_stream = 0

  def synchronize(self):
    pass


class FakeModule:
  """Stands in for runner.KernelModule: kernel name -> Python implementation over the guarded buffers."""
  impls: dict = {}
  registry: dict = {}  # data pointer -> Guarded

  def __init__(self, cubin, names):
    self.names = names

  def attributes(self, name):
    return {"num_regs": 32, "static_smem": 0, "local_bytes": 0, "max_threads": 1024}

  def allow_dynamic_smem(self, name, nbytes):
    pass

  def launch(self, bl, ptrs, stream_ptr):
    args = [self.registry[ptrs[a[1]]] if a[0] == "tensor" else a[2] for a in bl.args]
    self.impls[bl.kernel](*args)

  def run(self, plan, ptrs, stream_ptr):
    for bl in plan.launches:
      self.launch(bl, ptrs, stream_ptr)


@pytest.fixture
def emu(monkeypatch, tmp_path):
  monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
  monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
  monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
  monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
  monkeypatch.setattr(worker, "KernelModule", FakeModule)
  monkeypatch.setattr(worker, "wait", lambda *a, **k: None)
  monkeypatch.setattr(worker, "read_cubin", lambda cubin: None)  # No cubin here: the ELF checks are test_kernels_cubin's.
  monkeypatch.setattr(worker.static, "check_cubin", lambda *a, **k: None)
  monkeypatch.setattr(worker, "_context_ok", lambda: True)
  real_alloc = B.BufferSet.alloc

  def alloc(self, name, shape, dtype):
    g = real_alloc(self, name, shape, dtype)
    FakeModule.registry[g.ptr] = g
    return g

  monkeypatch.setattr(B.BufferSet, "alloc", alloc)
  FakeModule.impls = {}
  (tmp_path / "add.py").write_text(TASK)
  w = worker.GpuWorker.__new__(worker.GpuWorker)
  w.s = dict(correctness_trials=5, timing_runs=20, timing_max_s=0.0, timing_min_runs=10, warmup_runs=3, atol=1e-4,
             rtol=1e-4, half_atol=1e-2, half_rtol=1e-2, excessive_speedup=1e9, kernel_timeout_s=5.0,
             timing_input_sets=2, timed_inputs="fresh",
             input_distributions=("task", "normal", "uniform", "heavy", "shifted"), validate_fraction=0.2,
             timing_graphs="never", graph_threshold_ms=0.05, flush_bytes=0, seed=0, profile_phases=False,
             max_local_memory_bytes=4 * 2**30, max_static_device_bytes=256 * 2**20)
  w.device = torch.device("cpu")
  w.limits = Limits()
  w.stream = FakeStream()
  w.flush = torch.empty(4096, dtype=torch.uint8)
  w.tasks = collections.OrderedDict()
  w.secret = random.Random(0)
  w.hasher = KeyedHash(w.device)
  w.budget_end = float("inf")
  w.last_task = None
  path = str(tmp_path / "add.py")

  def run(impl, cuda=CUDA_ADD, plan=PLAN_ADD, task=None, budget_s=60.0, source=None, **settings):
    FakeModule.impls = impl
    w.s.update(settings)
    phases = []
    task_id, task_path = ("add", path) if task is None else (task, os.path.join(DATA, "tasks", task + ".py"))
    if source is not None:
      task_id, task_path = "custom", str(tmp_path / "custom.py")
      with open(task_path, "w", encoding="utf-8") as f:
        f.write(source)
    job = {"task_id": task_id, "task_path": task_path, "text": f"```cuda\n{cuda}\n```\n```plan\n{plan}\n```\n",
           "cubin": b"", "unsafe_dists": [], "budget_s": budget_s}
    res = w.run(job, phases.append)
    res["phases"] = phases
    return res

  run.worker = w
  return run


def _add(x, y, out, n):
  out.tensor.copy_(x.tensor + y.tensor)


def test_correct_kernel(emu):
  res = emu({"add": _add})
  assert res["status"] == "correct", res
  assert res["details"]["distributions"] == ["task", "normal", "uniform", "heavy", "shifted"]
  t = res["details"]["timing"]
  assert t["cand_ms"]["n"] == 20 and t["ref_ms"]["n"] == 20 and t["validated"] >= 2 and t["input_sets"] == 2
  assert res["speedup"] > 0 and not res["fatal"]
  assert res["phases"][:5] == ["load", "validate", "prepare", "correctness", "reference:task"]
  assert t["inputs"] == "fresh"
  assert res["phases"][-1] == "timing"


def test_timed_inputs_rule_and_forced_modes(emu):
  """'auto' draws afresh when a draw costs at most max(FRESH_DRAW_MS, FRESH_DRAW_REF_FACTOR x reference); 'fresh'
  and 'rescaled' decide for every task; the timing details carry the choice and the measured draw time."""
  lim = worker.FRESH_DRAW_MS
  assert worker.fresh_inputs("auto", lim, 0.1) and not worker.fresh_inputs("auto", lim + 0.01, 0.1)
  assert worker.fresh_inputs("auto", 9.0, 4.5) and not worker.fresh_inputs("auto", 9.1, 4.5)
  assert worker.fresh_inputs("fresh", 1e6, 0.0) and not worker.fresh_inputs("rescaled", 0.0, 1e6)
  for mode in ("rescaled", "fresh"):
    emu.worker.tasks.clear()
    res = emu({"add": _add}, timed_inputs=mode)
    assert res["status"] == "correct", res
    t = res["details"]["timing"]
    assert t["inputs"] == mode and t["draw_ms"] > 0, t


def test_task_over_the_memory_budget_is_skipped_before_any_run(emu, monkeypatch):
  """add: inputs 8,000 bytes, output 4,000 -> 6 x 8,000 + 2 x 4,000 + 8,000 = 64,000 bytes per evaluation
  (kernels/footprint.py); with task_memory_fraction 0.8, 75,000 free bytes (60,000) do not fit it, 80,000 do."""
  free = {"bytes": 10**12}
  monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (free["bytes"], 10**12))
  monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 0)
  monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 0)
  assert emu({"add": _add}, task_memory_fraction=0.8)["status"] == "correct"  # Loads the task: its live TaskInfo.
  free["bytes"] = 75_000
  res = emu({"add": _add}, task_memory_fraction=0.8)
  assert res["status"] == "runtime_error" and res["flags"] == ["task_too_large", "evaluator_error"], res
  assert res["details"]["evaluation_bytes"] == 64_000 and not res["fatal"]
  assert res["phases"] == ["load"]  # Nothing ran: no reference, no candidate.
  free["bytes"] = 80_000
  assert emu({"add": _add}, task_memory_fraction=0.8)["status"] == "correct"
  free["bytes"] = 75_000
  assert emu({"add": _add}, task_memory_fraction=0.0)["status"] == "correct"  # 0 = no budget.


def test_noop_and_partial_writes_are_unwritten(emu):
  res = emu({"add": lambda x, y, out, n: None})
  assert res["status"] == "incorrect" and res["flags"] == ["unwritten_output"]
  assert res["error"] == "1,000 of 1,000 elements of output 'out' were never written (they still hold the poison value)"

  def half(x, y, out, n):
    out.tensor[:500] = x.tensor[:500] + y.tensor[:500]

  res = emu({"add": half})
  assert res["status"] == "incorrect" and "500 of 1,000 elements" in res["error"]
  m = res["details"]["mismatch"]
  assert m["bad"] == 500 and m["first_index"] == [500] and m["trial"] == 1


def test_out_of_bounds_write_and_input_mutation(emu):
  def oob(x, y, out, n):
    _add(x, y, out, n)
    out.raw[B.GUARD_BYTES + out.nbytes:B.GUARD_BYTES + out.nbytes + 16].fill_(0)

  res = emu({"add": oob})
  assert res["status"] == "runtime_error" and res["flags"] == ["out_of_bounds_write"]
  assert res["error"].startswith("launch 1 (add) wrote outside buffer 'out' (")

  def mutate(x, y, out, n):
    _add(x, y, out, n)
    x.tensor.zero_()

  res = emu({"add": mutate}, cuda=CUDA_ADD_RW)
  assert res["status"] == "runtime_error" and res["flags"] == ["input_mutation"]
  assert "modified the input 'x'" in res["error"]


def test_wrong_values_report_the_first_bad_element(emu):
  def off(x, y, out, n):
    _add(x, y, out, n)
    out.tensor[7] += 0.5

  res = emu({"add": off})
  m = res["details"]["mismatch"]
  assert res["status"] == "incorrect" and res["error"] == "output 'out' does not match the reference"
  assert m["bad"] == 1 and m["first_index"] == [7] and m["max_abs_err"] == pytest.approx(0.5, rel=1e-5)
  assert m["got"] == pytest.approx(m["expected"] + 0.5, rel=1e-5, abs=1e-5)


def test_precision_downgrade_is_incorrect(emu):
  res = emu({"add": lambda x, y, out, n: out.tensor.copy_((x.tensor.half() + y.tensor.half()).float())})
  assert res["status"] == "incorrect" and res["details"]["mismatch"]["max_abs_err"] > 1e-4


def test_nondeterminism_between_the_two_runs(emu):
  calls = []

  def flaky(x, y, out, n):
    calls.append(1)
    _add(x, y, out, n)
    if len(calls) % 2 == 0:
      out.tensor[3] = 99.0

  res = emu({"add": flaky})
  assert res["status"] == "incorrect" and res["flags"] == ["nondeterministic"]


def test_call_counting_is_caught_in_timing(emu):
  calls = []

  def counting(x, y, out, n):
    calls.append(1)
    if len(calls) <= 12:  # 5 trials x 2 runs pass, then a no-op.
      _add(x, y, out, n)

  res = emu({"add": counting})
  assert res["status"] == "incorrect" and res["flags"] == ["timing_validation_failed"]
  assert "timed run" in res["error"] and res["speedup"] is None


def test_timing_budget_stops_slow_candidates_and_validates_the_last_run(emu):
  """timing_max_s: a 10 ms-per-launch candidate stops after the budget (at least timing_min_runs timed runs) and
  not after timing_runs; its last run is validated, so a kernel that stops computing after a few timed runs is
  caught although no random validation is drawn (validate_fraction 0). A fast one runs all its runs."""
  def slow(x, y, out, n):
    time.sleep(0.01)
    _add(x, y, out, n)

  res = emu({"add": slow}, timing_runs=100, timing_max_s=0.05, timing_min_runs=3)
  t = res["details"]["timing"]
  assert res["status"] == "correct" and t["budget_stop"] and 3 <= t["cand_ms"]["n"] <= 10, t
  assert t["ref_ms"]["n"] == t["cand_ms"]["n"] and t["validated"] >= 2

  calls = []

  def stops(x, y, out, n):
    calls.append(1)
    time.sleep(0.01)
    if len(calls) <= 15:  # 5 trials x 2 runs, 3 warm-ups and 2 timed runs pass, then a no-op.
      _add(x, y, out, n)

  res = emu({"add": stops}, timing_runs=100, timing_max_s=0.05, timing_min_runs=3, validate_fraction=0.0)
  assert res["status"] == "incorrect" and res["flags"] == ["timing_validation_failed"], res
  assert len(calls) < 30

  res = emu({"add": _add}, timing_runs=20, timing_max_s=10.0, timing_min_runs=3, validate_fraction=0.2)
  assert res["details"]["timing"]["cand_ms"]["n"] == 20 and not res["details"]["timing"]["budget_stop"]


def test_pointer_memoisation_is_caught(emu):
  cache = {}

  def memo(x, y, out, n):
    if x.ptr in cache:
      out.tensor.copy_(cache[x.ptr])
    else:
      _add(x, y, out, n)
      cache[x.ptr] = out.tensor.clone()

  res = emu({"add": memo})
  assert res["status"] == "incorrect" and res["details"]["mismatch"]["trial"] == 2


def test_content_memoisation_is_caught_in_timing(emu):
  """A cache keyed by the input values passes the trials (distinct draws) but timing rescales inputs each run."""
  cache = {}

  def memo(x, y, out, n):
    key = (x.tensor[:4].sum().item(), y.tensor[:4].sum().item())
    if key in cache and len(cache) >= 6:
      out.tensor.copy_(cache[key])
      return
    _add(x, y, out, n)
    cache[key] = out.tensor.clone()

  res = emu({"add": memo})
  assert res["status"] == "correct"  # It never hits: every timed run sees new contents, so it computes.
  assert len(cache) >= 20


def test_excessive_speedup_recheck_validates_every_run(emu):
  res = emu({"add": _add}, excessive_speedup=0.0)
  assert res["status"] == "correct" and "excessive_speedup" in res["flags"]
  assert res["details"]["timing"]["validated"] == 23 and "first_pass" in res["details"]["timing"]


def test_reference_failure_is_reported_with_its_distribution(emu, tmp_path):
  res = emu({"add": _add}, input_distributions=("task", "uniform"))
  assert res["status"] == "correct"

  def boom(*a):
    raise RuntimeError("device-side assert triggered")

  real = worker.GpuWorker.reference
  calls = []

  def reference(self, state, inputs):
    calls.append(1)
    if len(calls) == 2:
      boom()
    return real(self, state, inputs)

  worker.GpuWorker.reference = reference
  try:
    res = emu({"add": _add}, input_distributions=("task", "normal"))
  finally:
    worker.GpuWorker.reference = real
  assert res["status"] == "runtime_error" and res["flags"] == ["evaluator_error"]
  assert res["details"]["reference_failed_dist"] == "normal"


def test_out_of_memory_in_the_reference_is_the_gpus_not_the_candidates(emu):
  real = worker.GpuWorker.reference

  def reference(self, state, inputs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.87 GiB (emulated)")

  worker.GpuWorker.reference = reference
  try:
    res = emu({"add": _add}, input_distributions=("task", "normal"))
  finally:
    worker.GpuWorker.reference = real
  assert res["status"] == "runtime_error" and res["flags"] == ["gpu_oom", "evaluator_error"]
  assert res["fatal"] and res["details"]["reference_failed_dist"] == "task"


def test_format_error_from_device_limits(emu):
  res = emu({"add": _add}, plan=PLAN_ADD.replace("block=(256,)", "block=(256,) smem=300000"))
  assert res["status"] == "format_error" and "exceeds the device limit 232448" in res["error"]


def _read_candidate(name):
  with open(os.path.join(DATA, "candidates", name + ".md"), encoding="utf-8") as f:
    text = f.read()
  return text.split("```cuda\n")[1].split("```")[0], text.split("```plan\n")[1].split("```")[0]


def test_two_outputs_and_per_launch_times(emu):
  cuda, plan = _read_candidate("two_outputs")
  impl = {"twice": lambda x, y, n: y.tensor.copy_(2 * x.tensor),
          "rowsum": lambda x, s, rows, cols: s.tensor.copy_(x.tensor.sum(1))}
  res = emu(impl, cuda=cuda, plan=plan, task="two_outputs", timing_runs=5, correctness_trials=2)
  assert res["status"] == "correct", res
  assert [k for k, _ in res["details"]["kernel_ms"]] == ["twice", "rowsum"]
  impl["rowsum"] = lambda x, s, rows, cols: None
  res = emu(impl, cuda=cuda, plan=plan, task="two_outputs")
  assert res["status"] == "incorrect" and "elements of output 'out1' were never written" in res["error"]


def test_parameters_scalars_and_parameter_mutation(emu):
  cuda, plan = _read_candidate("linear_relu")

  def lin(x, w, b, out, rows, in_f, out_f, scale):
    assert (rows, in_f, out_f, scale) == (512, 256, 384, 2.0)
    out.tensor.copy_(torch.relu(x.tensor @ w.tensor.T + b.tensor) * scale)

  res = emu({"linear_relu": lin}, cuda=cuda, plan=plan, task="linear_relu", timing_runs=5, correctness_trials=2)
  assert res["status"] == "correct", res

  def lin_mut(x, w, b, out, *rest):
    lin(x, w, b, out, *rest)
    b.tensor.zero_()

  res = emu({"linear_relu": lin_mut}, cuda=cuda.replace("const float* __restrict__ b", "float* b"), plan=plan,
            task="linear_relu")
  assert res["status"] == "runtime_error" and "modified the input 'linear.bias'" in res["error"]


def test_scratch_is_poisoned_unless_zero(emu):
  cuda, plan = _read_candidate("row_sum_scratch")

  def acc(x, tmp, rows, cols):
    tmp.tensor.add_(x.tensor.sum(1))

  impl = {"acc": acc, "copy": lambda tmp, out, rows: out.tensor.copy_(tmp.tensor)}
  assert emu(impl, cuda=cuda, plan=plan, task="row_sum", timing_runs=5, correctness_trials=2)["status"] == "correct"
  res = emu(impl, cuda=cuda, plan=plan.replace(" zero", ""), task="row_sum")
  assert res["status"] == "incorrect"


# --- timed runs: attacks that behave once timing starts (kernels/README.md "Exploit classes") ------------------

ROW_SUM = '''
import torch
class Model(torch.nn.Module):
  def forward(self, x):
    return x.sum(1)
def get_inputs():
  return [torch.randn(64, 128)]
def get_init_inputs():
  return []
'''
CUDA_ROWS = 'extern "C" __global__ void rows(const float* x, float* out, int cols) {}'
PLAN_ROWS = "launch rows grid=(x.shape[0],) block=(128,) args=(x, out, x.shape[1])"
TRIAL_CALLS = 10  # 5 correctness trials x 2 runs: the timed runs start after these.


def test_memoised_linear_operator_rescaled_per_pointer_is_caught(emu):
  """Correct in every trial; in the timed runs, a row sum cached per input pointer (filled by timed runs only),
  rescaled by the ratio of one input element to the cached one. Timed inputs used to be base sets times one factor
  per tensor, which this reproduces exactly (the tree before fresh draws scored it correct); independent draws per
  run make it wrong on the first validated run that reuses a pointer."""
  calls, cache = [], {}

  def memo(x, out, cols):
    calls.append(1)
    timed = len(calls) > TRIAL_CALLS
    hit = cache.get(x.ptr)
    if timed and hit is not None and float(hit[1]) != 0.0:
      out.tensor.copy_(hit[0] * (x.tensor[0, 0] / hit[1]))
      return
    out.tensor.copy_(x.tensor.sum(1))
    if timed:
      cache[x.ptr] = (out.tensor.clone(), x.tensor[0, 0].clone())

  res = emu({"rows": memo}, cuda=CUDA_ROWS, plan=PLAN_ROWS, source=ROW_SUM)
  assert res["status"] == "incorrect" and res["flags"] == ["timing_validation_failed"], res["error"]
  assert res["details"]["timing"]["inputs"] == "fresh"


def test_out_of_bounds_write_in_one_timed_run_is_caught(emu):
  calls = []

  def late_oob(x, y, out, n):
    calls.append(1)
    _add(x, y, out, n)
    if len(calls) == TRIAL_CALLS + 5:  # One warm-up/timed run that no output check would notice.
      out.raw[B.GUARD_BYTES + out.nbytes + 100] ^= 0xFF

  res = emu({"add": late_oob}, validate_fraction=0.0)
  assert res["status"] == "runtime_error" and res["flags"] == ["out_of_bounds_write"], res["error"]
  assert res["error"].startswith("a timed run wrote outside buffer 'out'")


@pytest.mark.parametrize("restore", [False, True])
def test_input_mutation_in_timed_runs_is_caught(emu, restore):
  """Zeroing an input after computing (restore=False), or computing on a zeroed input and restoring it before the
  next launch (restore=True): either way the candidate's inputs changed within a validated timed run."""
  calls, saved = [], {}

  def mutate(x, y, out, n):
    calls.append(1)
    if restore and "x" in saved:
      x.tensor.copy_(saved.pop("x"))
    _add(x, y, out, n)
    if len(calls) > TRIAL_CALLS:
      if restore:
        saved["x"] = x.tensor.clone()
      x.tensor.zero_()

  res = emu({"add": mutate}, cuda=CUDA_ADD_RW)
  assert res["status"] == "runtime_error" and res["flags"] == ["input_mutation"], res["error"]
  assert "during timed run" in res["error"] or "during a timed run" in res["error"]


def test_first_timed_run_is_validated(emu):
  calls = []

  def wrong_once(x, y, out, n):
    calls.append(1)
    _add(x, y, out, n)
    if len(calls) == TRIAL_CALLS + 3 + 1:  # The first timed run after 3 warm-up runs.
      out.tensor[0] += 1.0

  res = emu({"add": wrong_once}, validate_fraction=0.0)
  assert res["status"] == "incorrect" and "timed run 4" in res["error"], res["error"]


def test_guard_canaries_are_per_buffer_and_per_run(emu):
  """A kernel that knows one guard (it can read the bytes before its own buffer) writes them past its end: with
  one canary pattern for every guard that write changed nothing; with a canary per buffer and side it is caught.
  Likewise bytes read from a guard in one run and written back in the next."""
  def copy_head(x, y, out, n):
    _add(x, y, out, n)
    out.tail[:1024].copy_(out.head[:1024])

  res = emu({"add": copy_head})
  assert res["status"] == "runtime_error" and res["flags"] == ["out_of_bounds_write"], res["error"]
  seen = []

  def replay(x, y, out, n):
    _add(x, y, out, n)
    if seen:
      out.tail[:1024].copy_(seen[0])
    else:
      seen.append(out.tail[:1024].clone())

  res = emu({"add": replay})
  assert res["status"] == "runtime_error" and res["flags"] == ["out_of_bounds_write"], res["error"]


def test_a_permutation_of_the_reference_weights_is_caught(emu):
  """Swapping two rows of the reference model's weight keeps every plain and squared sum; the keyed hash sees it."""
  cuda, plan = _read_candidate("linear_relu")
  calls = []

  def lin(x, w, b, out, rows, in_f, out_f, scale):
    calls.append(1)
    out.tensor.copy_(torch.relu(x.tensor @ w.tensor.T + b.tensor) * scale)
    if len(calls) == 1:
      state = next(iter(emu.worker.tasks.values()))
      weight = dict(state.model.named_parameters())["linear.weight"]
      weight.data[[0, 1]] = weight.data[[1, 0]]

  res = emu({"linear_relu": lin}, cuda=cuda, plan=plan, task="linear_relu", timing_runs=5, correctness_trials=2)
  assert "reference_corrupted" in res["flags"] and res["fatal"], (res["status"], res["flags"], res["error"])


def test_the_evaluation_budget_ends_a_slow_candidate(emu):
  """Each run is short (no per-launch deadline fires), but the evaluation as a whole is past its budget."""
  def slow(x, y, out, n):
    time.sleep(0.05)
    _add(x, y, out, n)

  t = time.monotonic()
  res = emu({"add": slow}, budget_s=0.6)
  assert res["status"] == "timeout" and res["flags"] == ["eval_deadline"] and res["fatal"], res["error"]
  assert time.monotonic() - t < 5


# --- what the GPU holds while the candidate runs, and how far the timing loop runs ahead ----------------------

def test_the_kept_reference_outputs_are_sealed_while_the_candidate_runs(emu, monkeypatch):
  """The reference's outputs of a trial stay on the device until the comparison, sealed: a kernel that finds them
  and copies them into its output (reading the answer instead of computing it) is incorrect."""
  kept = []
  real = worker.GpuWorker.reference

  def reference(self, state, inputs):
    out = real(self, state, inputs)
    kept.append(out[0])
    return out

  monkeypatch.setattr(worker.GpuWorker, "reference", reference)

  def peek(x, y, out, n):
    truth = x.tensor + y.tensor
    assert (B.bytes_of(kept[-1][0]) != B.bytes_of(truth)).float().mean() > 0.9  # Sealed, not the answer.
    out.tensor.copy_(kept[-1][0])

  res = emu({"add": peek})
  assert res["status"] == "incorrect" and res["details"]["mismatch"]["trial"] == 1, res["error"]
  assert emu({"add": _add})["status"] == "correct"


def test_timing_waits_for_every_run_with_one_run_queued_ahead(emu, monkeypatch):
  """Each timed run is waited for (a hang or the budget is caught run by run), in order, while the next run is
  already queued: the host prepares run i + 1 as the GPU runs run i, never more than one run ahead."""
  calls, waits = [], []
  monkeypatch.setattr(worker, "wait", lambda stream, deadline, what, event=None: waits.append((what, len(calls))))

  def counting_add(x, y, out, n):
    calls.append(1)
    _add(x, y, out, n)

  res = emu({"add": counting_add}, timing_runs=20, warmup_runs=3, validate_fraction=0.0)
  assert res["status"] == "correct"
  timed = [(what, n) for what, n in waits if what.startswith("timed run")]
  assert [what for what, _ in timed] == [f"timed run {i}" for i in range(1, 24)]
  # Launches done when run i is waited for: the trials', runs 1..i and run i + 1 (the last run: nothing after it).
  assert [n for _, n in timed] == [TRIAL_CALLS + min(i + 1, 23) for i in range(1, 24)]


def test_phase_breakdown_of_one_evaluation(emu):
  """details.breakdown: host milliseconds per phase (correctness and timing split into their parts) with how often each
  ran; with profile_phases the same phases get event times (stubbed events here: the plumbing, not GPU numbers)."""
  res = emu({"add": _add}, timing_runs=20, warmup_runs=3, correctness_trials=5)
  ph = res["details"]["breakdown"]
  host, n = ph["host_ms"], ph["n"]
  assert "gpu_ms" not in ph
  assert n["correctness/launch"] == 10 and n["correctness/draw"] == 5 and n["correctness/compare"] == 5
  assert n["timing/candidate"] == 23 and n["timing/draw"] == 23 and n["timing/wait"] == 23 and n["timing/pass"] == 1
  assert n["timing/integrity"] == 2 * res["details"]["timing"]["validated"]  # Before and after each checked run.
  parts = sum(v for k, v in host.items() if k.startswith("correctness/"))
  assert 0 < parts <= host["correctness"] * 1.01 + 0.05
  inner = sum(v for k, v in host.items() if k.startswith("timing/") and k not in ("timing/pass", "timing/setup"))
  assert 0 < inner <= host["timing/pass"] * 1.01 + 0.05 and host["timing/pass"] <= host["timing"] + 0.05
  res = emu({"add": _add}, timing_runs=20, warmup_runs=3, profile_phases=True)
  gpu = res["details"]["breakdown"]["gpu_ms"]
  assert set(gpu) == set(res["details"]["breakdown"]["host_ms"]) and gpu["timing"] > 0


def test_the_allocator_cache_is_kept_for_the_same_task_and_released_otherwise(emu, monkeypatch):
  """Evaluations of one task reuse the allocator's cached blocks; another task, or an idle worker, releases them."""
  released = []
  monkeypatch.setattr(torch.cuda, "empty_cache", lambda: released.append(1))
  for _ in range(2):
    assert emu({"add": _add}, timing_runs=3, correctness_trials=1)["status"] == "correct"
  assert released == []
  cuda, plan = _read_candidate("two_outputs")
  impl = {"twice": lambda x, y, n: y.tensor.copy_(2 * x.tensor),
          "rowsum": lambda x, s, rows, cols: s.tensor.copy_(x.tensor.sum(1))}
  res = emu(impl, cuda=cuda, plan=plan, task="two_outputs", timing_runs=3, correctness_trials=1)
  assert res["status"] == "correct" and len(released) == 1 and res["details"]["breakdown"]["n"]["release_cache"] == 1
  emu.worker.idle()
  assert len(released) == 2
  assert emu({"add": _add}, timing_runs=3, correctness_trials=1)["status"] == "correct" and len(released) == 2


ALIASED_OUTPUTS = '''
import torch
class Model(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.register_buffer("b", torch.arange(64, dtype=torch.float32).reshape(8, 8))
  def forward(self, x):
    y = x * 2.0
    return y, y, x.t(), self.b
def get_inputs():
  return [torch.randn(8, 8)]
def get_init_inputs():
  return []
'''
CUDA_ALIASED = ('extern "C" __global__ void four(const float* x, const float* b, float* o0, float* o1, float* o2, '
                'float* o3, int n) {}')
PLAN_ALIASED = "launch four grid=(1,) block=(64,) args=(x, b, out0, out1, out2, out3, x.numel)"


def test_reference_outputs_that_alias_each_other_a_buffer_or_a_transpose(emu, monkeypatch):
  """Reference outputs sealed in place only where the evaluator owns them: the same tensor twice, a transposed view
  (sealing a view in place would seal a reshaped copy) and the model's own buffer are all sealed while the candidate
  runs, compare right in every trial, and the buffer is intact afterwards."""
  kept = []
  real = worker.GpuWorker.reference

  def reference(self, state, inputs):
    out = real(self, state, inputs)
    kept.append((out[0], inputs[0].clone()))
    return out

  monkeypatch.setattr(worker.GpuWorker, "reference", reference)

  calls = []

  def four(x, b, o0, o1, o2, o3, n):
    calls.append(1)
    if len(calls) <= TRIAL_CALLS:  # Correctness runs: the trial's reference outputs are still sealed.
      sealed, x0 = kept[-1]
      truth = [x0 * 2.0, x0 * 2.0, x0.t(), b.tensor]
      for s, t in zip(sealed, truth):
        assert s.is_contiguous() and (B.bytes_of(s) != B.bytes_of(t.contiguous())).float().mean() > 0.9
    o0.tensor.copy_(x.tensor * 2.0)
    o1.tensor.copy_(x.tensor * 2.0)
    o2.tensor.copy_(x.tensor.t())
    o3.tensor.copy_(b.tensor)

  res = emu({"four": four}, cuda=CUDA_ALIASED, plan=PLAN_ALIASED, source=ALIASED_OUTPUTS, timing_runs=3)
  assert res["status"] == "correct", res["error"]
  state = next(s for s in emu.worker.tasks.values() if s.task_id == "custom")
  assert torch.equal(state.params["b"], torch.arange(64, dtype=torch.float32).reshape(8, 8))

  def stale(x, b, o0, o1, o2, o3, n):
    four(x, b, o0, o1, o2, o3, n)
    o2.tensor.copy_(x.tensor)  # Not the transpose.

  res = emu({"four": stale}, cuda=CUDA_ALIASED, plan=PLAN_ALIASED, source=ALIASED_OUTPUTS, timing_runs=3)
  assert res["status"] == "incorrect" and res["details"]["mismatch"]["output"] == "out2", res["error"]


@pytest.mark.parametrize("mode", ["fresh", "rescaled"])
def test_a_timed_run_that_rewrites_the_references_inputs_is_caught(emu, monkeypatch, mode):
  """A kernel that finds the reference's copy of its inputs in GPU memory (a timed run computes the reference after
  the candidate) and zeroes it, then writes the output of zero inputs without reading its own: the validated
  comparison alone would pass, so the reference's inputs are hashed after the candidate like the candidate's."""
  seen = []
  real = timing._Setup.set_inputs

  def set_inputs(self, k):
    args = real(self, k)
    seen.append(args)
    return args

  monkeypatch.setattr(timing._Setup, "set_inputs", set_inputs)
  calls = []

  def cheat(x, y, out, n):
    calls.append(1)
    if len(calls) <= TRIAL_CALLS:
      _add(x, y, out, n)
      return
    for t in seen[-1]:
      t.zero_()
    out.tensor.zero_()

  res = emu({"add": cheat}, timed_inputs=mode)
  assert res["status"] == "runtime_error" and res["flags"] == ["input_mutation"], res
  assert "timed run" in res["error"]
  assert emu({"add": _add}, timed_inputs=mode)["status"] == "correct"


def test_timed_runs_write_keyed_draws_into_both_sides(emu, monkeypatch):
  """A task of plain torch.randn inputs gets its fresh timed inputs from the keyed generator, one write per run into
  the candidate's set and the reference's one reusable set: in every timed run the candidate's buffers hold exactly
  the reference's arguments, under a new key, sharing no values with the run before."""
  seen, keys = [], []
  real_set, real_write = timing._Setup.set_inputs, timing.KD.write

  def set_inputs(self, k):
    args = real_set(self, k)
    seen.append(args)
    return args

  monkeypatch.setattr(timing._Setup, "set_inputs", set_inputs)
  monkeypatch.setattr(timing.KD, "write", lambda plan, key, pairs: (keys.append(key), real_write(plan, key, pairs)))
  calls, differ, drawn = [], [], []

  def checking(x, y, out, n):
    calls.append(1)
    if len(calls) > TRIAL_CALLS:
      differ.append(not (torch.equal(x.tensor, seen[-1][0]) and torch.equal(y.tensor, seen[-1][1])))
      drawn.append(torch.cat([x.tensor, y.tensor]))
    _add(x, y, out, n)

  res = emu({"add": checking}, timed_inputs="fresh")
  t = res["details"]["timing"]
  assert res["status"] == "correct" and t["redraw"] == ["randn", "randn"] and t["fresh_draw"] == "keyed", res
  assert len(differ) == 23 and not any(differ)
  assert len(keys) == 23 and len(set(keys)) == 23 and all(a is seen[0] for a in seen)
  for a, b in zip(drawn, drawn[1:]):
    assert torch.isin(a, b).sum() < 5 and abs(float(a.mean())) < 0.2 and abs(float(a.std()) - 1) < 0.1
  res = emu({"add": _add}, timed_inputs="fresh", source=TASK.replace("torch.randn(1000)]", "torch.randn(1000) * 2]"))
  t = res["details"]["timing"]
  assert res["status"] == "correct" and t["redraw"] is None and t["fresh_draw"] == "get_inputs", res


MASKED_TASK = '''
import torch
class Model(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.register_buffer("mask", torch.ones(1000))
    self.bn = torch.nn.BatchNorm1d(1)
  def forward(self, x, y):
    self.bn(x.reshape(-1, 1))  # Moves BatchNorm's running statistics on every call.
    return (x + y) * self.mask
def get_inputs():
  return [torch.randn(1000), torch.randn(1000)]
def get_init_inputs():
  return []
'''


def test_a_reference_buffer_rewritten_to_make_the_task_trivial_is_caught(emu):
  """A kernel that zeroes a buffer the reference's forward reads (a mask) after the first trial, then writes zeros:
  the later references compute zeros too, so only the reference's keyed hash, which covers the buffers its own
  forward leaves alone, sees it; BatchNorm's running statistics, which every forward moves, raise no false alarm."""
  calls = []

  def zeroing(x, y, out, n):
    calls.append(1)
    if len(calls) <= 2:
      _add(x, y, out, n)
      if len(calls) == 2:
        state = next(iter(emu.worker.tasks.values()))
        dict(state.model.named_buffers())["mask"].zero_()
      return
    out.tensor.zero_()

  res = emu({"add": zeroing}, source=MASKED_TASK, timing_runs=5)
  assert "reference_corrupted" in res["flags"] and res["fatal"], (res["status"], res["flags"], res["error"])
  emu.worker.tasks.clear()
  res = emu({"add": _add}, source=MASKED_TASK, timing_runs=5)
  assert res["status"] == "correct" and not res["fatal"], (res["status"], res["flags"], res["error"])
