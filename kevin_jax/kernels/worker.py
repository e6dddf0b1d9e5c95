"""The GPU worker: one process per GPU slot, driven by the supervisor (worker_main.py) through a pipe.

Per evaluation: skip the task when one evaluation would not fit the GPU (footprint.py, `task_memory_fraction`:
a task-level result), load the task (cached: the reference Model built once with a fixed seed, in the reference
mode (dropout off) as everywhere the evaluator builds a reference (kernels/README.md "The reference"), TF32 off
unless the task sets ALLOW_TF32; a keyed hash taken of its weights and of the buffers its forward leaves alone),
start the evaluation's wall budget, re-validate the plan against the live shapes and the real device limits and
the cubin against the signatures (static.check_cubin), load the cubin as a fresh module, then

  correctness  N trials on fresh inputs (distributions in inputs.py, secret seeds). Per trial the reference runs
               first on its own copies; its outputs are kept on the GPU sealed (XOR with a secret stream; in
               place where the evaluator owns them). The candidate then runs twice on guarded buffers (fresh
               canaries per run; poison 0xFF, then 0x5A), with a sync, a canary check after every launch, and an
               input/parameter byte check after every run; the first run's outputs are kept as a sealed copy while
               the second runs. Both runs are compared with the sealed reference (buffers.count_bad_sealed: each
               element unsealed where the comparison reads it; unsealed in memory only to describe a mismatch).
  timing       see timing.py.

Any fault that leaves the CUDA context unusable (illegal address, trap, hang, the budget overrun while a kernel
runs) marks the result fatal; the worker then exits and the supervisor starts a fresh one. After every evaluation
that keyed hash is checked. Exceptions never escape `GpuWorker.run`.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import time
import traceback
import warnings

import torch

from kevin_jax.kernels import buffers as B
from kevin_jax.kernels import inputs as I
from kevin_jax.kernels import closeness, footprint, keyed_draw, static, tasks, timing
from kevin_jax.kernels.candidate import FormatError
from kevin_jax.kernels.cubin import read_cubin
from kevin_jax.kernels.integrity import KeyedHash
from kevin_jax.kernels.phases import PhaseClock
from kevin_jax.kernels.plan import BoundPlan, Limits
from kevin_jax.kernels.runner import CandidateError, KernelModule, classify, wait
from kevin_jax.kernels.taskinfo import TaskError, TaskInfo, as_reference, describe_live, task_options

MODEL_SEED = 0
MAX_CACHED_TASKS = 8
# With timed_inputs 'auto', timed inputs are fresh draws when one draw of the task's inputs takes at most
# max(FRESH_DRAW_MS, FRESH_DRAW_REF_FACTOR x reference time); slower get_inputs (CPU-bound, or a busy host) fall back
# to rescaled input sets. 'fresh' and 'rescaled' choose one for every task.
FRESH_DRAW_MS = 2.0
FRESH_DRAW_REF_FACTOR = 2.0
KIND_FLAGS = {"illegal_address": "illegal_address", "trap": "trap", "hang": "hang", "misaligned": "misaligned_address",
              "launch": "launch_error", "oom": "gpu_oom", "cuda_error": "cuda_error", "deadline": "eval_deadline"}


def set_precision(allow_tf32: bool) -> None:
  """IEEE fp32 matmul/convolution for the reference unless the task allows TF32 (torch >= 2.9 API, else legacy)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mode = "tf32" if allow_tf32 else "ieee"
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
      torch.backends.cuda.matmul.fp32_precision = mode
      torch.backends.cudnn.conv.fp32_precision = mode
      torch.backends.cudnn.rnn.fp32_precision = mode
    else:
      torch.backends.cuda.matmul.allow_tf32 = allow_tf32
      torch.backends.cudnn.allow_tf32 = allow_tf32


def as_tuple(out) -> tuple:
  return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@dataclasses.dataclass
class TaskState:
  """A loaded task: module, reference model on the GPU, live TaskInfo, the keyed hash of its weights and buffers."""
  task_id: str
  module: object
  model: torch.nn.Module
  info: TaskInfo
  params: dict[str, torch.Tensor]
  param_key: int  # Secret key of the reference weights' keyed hash (host only).
  param_hash: torch.Tensor  # Keyed hash of `checked` at load time (on the GPU).
  ref_ms_rough: float
  fresh_inputs: bool  # Timed inputs drawn afresh every run (False: rescaled sets; timed_inputs and draw_ms decide).
  draw_ms: float  # The fastest of three draws of the task's inputs, host to GPU, ms.
  redraw: tuple | None = None  # inputs.redraw_plan of a task with fresh timed inputs (None: get_inputs() copies).
  checked: tuple = ()  # What param_hash covers: the parameters and the buffers the reference's forward leaves alone.


class ReferenceFailed(Exception):
  """The reference raised on one input distribution (the task's problem, not the candidate's)."""

  def __init__(self, dist: str, exc: BaseException):
    super().__init__(f"the reference failed on '{dist}' inputs: {type(exc).__name__}: {str(exc)[:300]}")
    self.dist = dist


def fresh_inputs(mode: str, draw_ms: float, ref_ms: float) -> bool:
  """Whether timed runs get fresh draws (timing.py): `mode` 'fresh' | 'rescaled' | 'auto' (the rule above)."""
  if mode in ("fresh", "rescaled"):
    return mode == "fresh"
  return draw_ms <= max(FRESH_DRAW_MS, FRESH_DRAW_REF_FACTOR * ref_ms)


class GpuWorker:
  """Evaluates candidates on GPU 0 of this process (CUDA_VISIBLE_DEVICES is set by the supervisor)."""

  def __init__(self, settings: dict):
    self.s = settings
    torch.cuda.init()
    self.device = torch.device("cuda", 0)
    torch.cuda.set_device(self.device)
    from cupy_backends.cuda.api import runtime as rt  # pylint: disable=g-import-not-at-top
    attr = lambda a: int(rt.deviceGetAttribute(a, 0))
    props = torch.cuda.get_device_properties(0)
    self.limits = Limits(
        max_threads=attr(rt.cudaDevAttrMaxThreadsPerBlock),
        max_block=(attr(rt.cudaDevAttrMaxBlockDimX), attr(rt.cudaDevAttrMaxBlockDimY),
                   attr(rt.cudaDevAttrMaxBlockDimZ)),
        max_grid=(attr(rt.cudaDevAttrMaxGridDimX), attr(rt.cudaDevAttrMaxGridDimY), attr(rt.cudaDevAttrMaxGridDimZ)),
        max_smem=attr(rt.cudaDevAttrMaxSharedMemoryPerBlockOptin),
        max_resident_threads=attr(rt.cudaDevAttrMultiProcessorCount) * attr(rt.cudaDevAttrMaxThreadsPerMultiProcessor))
    self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or attr(rt.cudaDevAttrL2CacheSize))
    self.stream = torch.cuda.Stream(device=self.device)
    flush = int(settings.get("flush_bytes") or max(2 * self.l2_bytes, 256 * 2**20))
    self.flush = torch.empty(flush, dtype=torch.uint8, device=self.device)
    self.tasks: "collections.OrderedDict[tuple, TaskState]" = collections.OrderedDict()
    seed = settings.get("seed", -1)
    self.secret = random.Random(seed) if seed is not None and seed >= 0 else random.SystemRandom()
    self.hasher = KeyedHash(self.device)
    closeness.prepare(self.device)
    keyed_draw.prepare(self.device)
    self.budget_end = float("inf")  # Wall deadline of the evaluation in progress (time.monotonic()).
    self.last_task = None  # (task id, path) of the evaluation before: the allocator cache holds its sizes.
    self.clock = PhaseClock()  # The evaluation in progress's phase times (details.breakdown); new per run.
    import cupy  # pylint: disable=g-import-not-at-top
    self.describe = {
        "device_name": props.name, "arch": f"sm_{props.major}{props.minor}", "sm_count": props.multi_processor_count,
        "l2_bytes": self.l2_bytes, "total_memory": int(props.total_memory), "limits": dataclasses.asdict(self.limits),
        "torch": torch.__version__, "cupy": cupy.__version__, "cuda_runtime": torch.version.cuda,
        "flush_bytes": flush}

  # --- tasks ---------------------------------------------------------------------------------------------

  def task(self, task_id: str, path: str) -> TaskState:
    key = (task_id, path)
    st = self.tasks.get(key)
    if st is None:
      st = self._load_task(task_id, path)
      self.tasks[key] = st
      while len(self.tasks) > MAX_CACHED_TASKS:
        self.tasks.popitem(last=False)
    self.tasks.move_to_end(key)
    return st

  def _load_task(self, task_id: str, path: str) -> TaskState:
    try:
      module = tasks.load_module(tasks.TaskSpec(id=task_id, path=path, level=0))
    except Exception as e:  # pylint: disable=broad-except
      raise TaskError(f"task {task_id} failed to import: {type(e).__name__}: {e}") from e
    set_precision(task_options(module)["allow_tf32"])
    with torch.cuda.stream(self.stream), torch.no_grad():
      torch.manual_seed(MODEL_SEED)
      init = module.get_init_inputs()
      try:
        with torch.device(self.device):
          model = module.Model(*init)
      except RuntimeError:
        torch.manual_seed(MODEL_SEED)
        model = module.Model(*init)
      model = as_reference(model.to(self.device))
      loaded = {n: b.detach().clone() for n, b in model.named_buffers()}
      x = I.draw(module, "task", MODEL_SEED, self.device)
      draw_ms = float("inf")
      for k in range(1, 4):  # The fastest of three: one draw preempted by a busy host does not decide it.
        t_draw = time.perf_counter()
        I.draw(module, "task", MODEL_SEED + k, self.device)
        torch.cuda.synchronize()
        draw_ms = min(draw_ms, (time.perf_counter() - t_draw) * 1e3)
      out = model(*[t.clone() if isinstance(t, torch.Tensor) else t for t in x])
      info = describe_live(task_id, module, model, x, out)
      start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
      start.record(self.stream)
      model(*x)
      end.record(self.stream)
      end.synchronize()
      ref_ms = start.elapsed_time(end)
      params = {n: p.detach() for n, p in list(model.named_parameters()) + list(model.named_buffers())}
      key = self.secret.getrandbits(64)
      # Buffers the reference's own forward leaves alone (masks, constants; not BatchNorm's running statistics).
      named = [(n, b) for n, b in model.named_buffers() if n in loaded]
      moved = B.changed((b, loaded[n]) for n, b in named) if named else []
      checked = tuple([p for _, p in model.named_parameters()] + [b for (_, b), m in zip(named, moved) if not m])
      del loaded
      param_hash = self.hasher(checked, key)
      fresh = fresh_inputs(self.s.get("timed_inputs", "auto"), draw_ms, ref_ms)
      del x, out
      try:
        redraw = I.redraw_plan(module, self.device) if fresh else None
      except torch.cuda.OutOfMemoryError:  # Its checks hold two draws at once; without it, timed inputs are copied.
        redraw = None
    return TaskState(task_id=task_id, module=module, model=model, info=info, params=params, param_key=key,
                     param_hash=param_hash, ref_ms_rough=ref_ms, fresh_inputs=fresh, draw_ms=draw_ms, redraw=redraw,
                     checked=checked)

  # --- one evaluation ------------------------------------------------------------------------------------

  def run(self, job: dict, report) -> dict:
    """Evaluates one compiled candidate. Returns a result dict (never raises)."""
    res = {"status": "", "error": "", "flags": [], "details": {}, "times": {}, "fatal": False}
    times = res["times"]
    t0 = time.perf_counter()
    state = None
    self.clock = clock = PhaseClock(self.stream, self.s.get("profile_phases", False))
    allocs = _allocator_counts(self.device)
    try:
      report("load")
      if self.last_task not in (None, (job["task_id"], job["task_path"])):
        with clock("release_cache"):  # Another task's sizes: its cached blocks would only fragment the pool.
          torch.cuda.empty_cache()
      self.last_task = (job["task_id"], job["task_path"])
      too_large = self._over_budget(job)
      if too_large is not None:
        res.update(too_large)
        return res
      with clock("load"):
        state = self.task(job["task_id"], job["task_path"])
      times["load"] = time.perf_counter() - t0
      self.budget_end = time.monotonic() + float(job["budget_s"])  # The task load is not the candidate's time.
      report("validate")
      set_precision(state.info.options["allow_tf32"])
      try:
        with clock("validate"):
          cand, bound = static.validate(job["text"], state.info, self.limits)
      except FormatError as e:
        return _final(res, "format_error", str(e))
      with clock("validate"):
        problem = static.check_cubin(read_cubin(job["cubin"]), cand.kernels, bound, self.limits,
                                     self.s["max_static_device_bytes"], self.s["max_local_memory_bytes"])
      if problem:
        res["flags"] += problem[2]
        return _final(res, problem[0], problem[1])
      with torch.cuda.stream(self.stream):
        self._evaluate(job, state, bound, res, report)
    except CandidateError as e:
      status = "timeout" if e.kind in ("hang", "deadline") else "runtime_error"
      res["flags"].append(KIND_FLAGS.get(e.kind, e.kind))
      res["fatal"] = res["fatal"] or e.fatal
      _final(res, status, e.message)
    except (TaskError, ReferenceFailed) as e:
      oom = e.__cause__ is not None and classify(e.__cause__, at_launch=False)[0] == "oom"
      res["flags"] += ["gpu_oom", "evaluator_error"] if oom else ["evaluator_error"]
      _final(res, "runtime_error", f"evaluator error: {e}")
      if isinstance(e, ReferenceFailed):
        res["details"]["reference_failed_dist"] = e.dist
      res["fatal"] = oom or not _context_ok()  # A fresh worker starts with an empty allocator cache.
    except Exception as e:  # pylint: disable=broad-except
      kind, msg = classify(e, at_launch=False)
      res["details"]["traceback"] = traceback.format_exc()[-4000:]
      healthy = _context_ok()
      if kind != "cuda_error" or not healthy:
        _final(res, "runtime_error", f"{msg} [{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}]")
        res["flags"].append(KIND_FLAGS.get(kind, kind))
      else:
        _final(res, "runtime_error", f"evaluator error: {type(e).__name__}: {e}")
        res["flags"].append("evaluator_error")
      res["fatal"] = True  # Unknown state: start a fresh worker.
    finally:
      if not res["fatal"]:
        with clock("after"):
          self._after(state, res)
    times["gpu_total"] = time.perf_counter() - t0
    if state is not None:  # The breakdown of an evaluation whose task loaded.
      clock.extra.update(_allocator_delta(allocs, self.device))
      res["details"]["breakdown"] = clock.summary()
    return res

  def idle(self) -> None:
    """No job is waiting (worker_main): the allocator's cached memory goes back to the GPU."""
    torch.cuda.empty_cache()
    self.last_task = None

  def _over_budget(self, job: dict) -> dict | None:
    """The task-level skip when one evaluation would not fit task_memory_fraction x the free GPU memory.

    Free memory counts what this process's allocator caches but does not use, and a loaded task's own
    parameters (already resident, and part of the footprint); shapes come from the static stage's TaskInfo.
    """
    fraction = float(self.s.get("task_memory_fraction", 0.0))
    key = (job["task_id"], job["task_path"])
    loaded = self.tasks.get(key)
    info = loaded.info if loaded is not None else job.get("task_info")
    if fraction <= 0 or info is None:
      return None
    free = torch.cuda.mem_get_info(self.device)[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    if loaded is not None:
      free += sum(p.numel() * p.element_size() for p in loaded.params.values())
    return footprint.too_large_result(job["task_id"], info, free, fraction, self.s["timing_input_sets"])

  def wait_for(self, what: str, deadline_s: float, event=None) -> None:
    """Waits for the stream (or for `event` on it); running past deadline_s is a hang, past the budget a deadline."""
    now = time.monotonic()
    if now > self.budget_end:
      raise CandidateError("deadline", f"{what}: the evaluation ran past its time budget", fatal=True)
    if now + deadline_s <= self.budget_end:
      wait(self.stream, now + deadline_s, what, event)
      return
    try:
      wait(self.stream, self.budget_end, what, event)
    except CandidateError as e:
      if e.kind == "hang":
        raise CandidateError("deadline", f"{what}: the evaluation ran past its time budget", fatal=True) from e
      raise

  def _after(self, state: TaskState | None, res: dict) -> None:
    """Checks the reference weights; a failure here makes the worker restart.

    The allocator's cache is kept for the next evaluation of the same task (its buffers and draws have the same
    sizes; cudaMalloc and cudaFree are slow, and cudaFree synchronises); `idle` and a change of task release it.
    """
    try:
      torch.cuda.synchronize()
      now = self.hasher(state.checked, state.param_key) if state else None
      if state is not None and not torch.equal(now, state.param_hash):
        res["flags"].append("reference_corrupted")
        _final(res, "runtime_error", "a kernel wrote into memory it does not own (the reference model's weights)")
        res["fatal"] = True  # The worker restarts; its cached reference models go with it.
    except Exception as e:  # pylint: disable=broad-except
      res["fatal"] = True
      res["details"]["cleanup_error"] = f"{type(e).__name__}: {e}"

  def _evaluate(self, job, state: TaskState, bound: BoundPlan, res: dict, report) -> None:
    s, times, clock = self.s, res["times"], self.clock
    t = time.perf_counter()
    report("prepare")
    names = sorted({l.kernel for l in bound.launches})
    try:
      with clock("prepare/module"):
        mod = KernelModule(job["cubin"], names)
    except Exception as e:  # pylint: disable=broad-except
      res["flags"].append("evaluator_error")
      _final(res, "runtime_error", f"evaluator error: could not load the cubin: {e}")
      return
    attrs = {n: mod.attributes(n) for n in names}
    res["details"]["kernel_attributes"] = attrs
    for k, bl in enumerate(bound.launches, 1):
      a = attrs[bl.kernel]
      threads = bl.block[0] * bl.block[1] * bl.block[2]
      if threads > a["max_threads"]:
        _final(res, "format_error", f"launch {k} ({bl.kernel}): {threads} threads per block, but the kernel uses "
                                    f"{a['num_regs']} registers per thread, which allows at most "
                                    f"{a['max_threads']} threads per block")
        return
      if a["local_bytes"] * self.limits.max_resident_threads > s["max_local_memory_bytes"]:
        res["flags"].append("local_memory")
        _final(res, "format_error", f"launch {k} ({bl.kernel}): {a['local_bytes']} bytes of local memory per thread "
                                    f"x {self.limits.max_resident_threads} resident threads exceed the cap of "
                                    f"{s['max_local_memory_bytes']} bytes")
        return
      if a["static_smem"] + bl.smem > self.limits.max_smem:
        _final(res, "format_error", f"launch {k} ({bl.kernel}): {a['static_smem']} bytes of static + {bl.smem} "
                                    f"bytes of dynamic shared memory exceed the device limit "
                                    f"{self.limits.max_smem} bytes")
        return
      mod.allow_dynamic_smem(bl.kernel, bl.smem)
    gen = torch.Generator(device=self.device)
    gen.manual_seed(self.secret.getrandbits(62))
    with clock("prepare/buffers"):
      bufs = self._buffers(state, bound, gen)
    ref_ms = state.ref_ms_rough
    deadline_s = max(float(s["kernel_timeout_s"]), 100 * ref_ms / 1e3)
    times["prepare"] = time.perf_counter() - t

    t = time.perf_counter()
    report("correctness")
    with clock("correctness"):
      ok = self._correctness(state, bound, mod, bufs, deadline_s, job, res, report)
    times["correctness"] = time.perf_counter() - t
    if not ok:
      return
    if s["timing_runs"] <= 0:
      _final(res, "correct")
      return
    t = time.perf_counter()
    report("timing")
    with clock("timing"):
      timing.measure(self, state, bound, mod, bufs, deadline_s, job, res)
    times["timing"] = time.perf_counter() - t
    if s.get("compile_baseline") and res.get("status") == "correct":  # compile_baseline.py, after the verdict;
      from kevin_jax.kernels import compile_baseline  # pylint: disable=g-import-not-at-top
      report("load:compile_baseline")  # the evaluator's own work: the task-load limit, outside the budget.
      with clock("compile_baseline"):
        compile_baseline.attach(self, state, res)

  def _buffers(self, state: TaskState, bound: BoundPlan, gen) -> B.BufferSet:
    bufs = B.BufferSet(self.device, gen)
    info = state.info
    for name, inp in zip(info.input_names, info.inputs):
      if inp["kind"] == "tensor":
        bufs.alloc(name, inp["shape"], B.DTYPES[inp["dtype"]])
    for name, p in state.params.items():
      bufs.alloc(name, p.shape, p.dtype).tensor.copy_(p)
      bufs.param_snapshot[name] = bufs[name].tensor.clone()
    for j, out in enumerate(info.outputs):
      bufs.alloc(f"out{j}", out["shape"], B.DTYPES[out["dtype"]])
    for name, dtype, shape, _ in bound.scratch:
      bufs.alloc(name, shape, B.DTYPES[dtype])
    return bufs

  # --- correctness -----------------------------------------------------------------------------------------

  def reference(self, state: TaskState, inputs: list) -> tuple[list[torch.Tensor], bool, int]:
    """Runs the reference on copies; returns (its outputs sealed on the GPU, all finite, seal seed).

    The kept outputs are sealed (buffers.seal_all: XOR with a secret stream per output): wherever a kernel can
    address a copy (GPU memory, or pinned host memory under UVA), the seal is what protects it. An output the
    evaluator owns outright (contiguous, not a parameter or buffer of the model) is sealed in place, so no unsealed
    copy exists; any other is sealed as a copy (stream order: before any candidate launch).
    """
    ref_in = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    with torch.no_grad():
      outs = as_tuple(state.model(*ref_in))
    expect = state.info.outputs
    if len(outs) != len(expect) or any(list(o.shape) != e["shape"] for o, e in zip(outs, expect)):
      raise TaskError(f"the reference returned shapes {[list(o.shape) for o in outs]}, expected "
                      f"{[e['shape'] for e in expect]} (shapes must not change between calls)")
    checks = [torch.isfinite(o).all() for o in outs if o.is_floating_point()]
    finite = bool(torch.stack(checks).all().item()) if checks else True
    seal_seed = self.secret.getrandbits(62)
    param_ptrs = {p.untyped_storage().data_ptr() for p in state.params.values()}
    sealed = [o if o.is_contiguous() and o.untyped_storage().data_ptr() not in param_ptrs
              else o.clone(memory_format=torch.contiguous_format) for o in outs]
    B.seal_all(sealed, seal_seed)
    del outs, ref_in
    return sealed, finite, seal_seed

  def _correctness(self, state, bound, mod, bufs, deadline_s, job, res, report) -> bool:
    s = self.s
    info = state.info
    dists = I.trial_distributions(s["correctness_trials"], s["input_distributions"],
                                  info.options.get("input_distributions"), job.get("unsafe_dists", ()))
    ptrs = bufs.pointers()
    outs = [f"out{j}" for j in range(len(info.outputs))]
    fill = outs + [name for name, _, _, zero in bound.scratch if not zero]
    zeros = [name for name, _, _, zero in bound.scratch if zero]
    tensor_inputs = [n for n, i in zip(info.input_names, info.inputs) if i["kind"] == "tensor"]
    used_dists = []
    clock = self.clock
    for trial, dist in enumerate(dists, 1):
      seed = self.secret.getrandbits(62)
      report(f"reference:{dist}")
      try:
        with clock("correctness/draw"):
          inputs = I.draw(state.module, dist, seed, self.device)
        with clock("correctness/reference"):
          ref, finite, ref_seed = self.reference(state, inputs)
      except TaskError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        raise ReferenceFailed(dist, e) from e
      if not finite and dist != "task":
        dist = f"task (fallback from {dist})"
        with clock("correctness/reference"):
          inputs = I.draw(state.module, "task", seed, self.device)
          ref, finite, ref_seed = self.reference(state, inputs)
      used_dists.append(dist)
      report("candidate")
      pristine = {}
      with clock("correctness/copy_inputs"):
        for name, x in zip(info.input_names, inputs):
          if isinstance(x, torch.Tensor):
            bufs[name].tensor.copy_(x)
            pristine[name] = x
      seal_seed = self.secret.getrandbits(62)
      kept = None
      for run, poison in ((1, B.POISON_NAN), (2, B.POISON_FINITE)):
        with clock("correctness/fill"):
          bufs.rearm()
          bufs.fill(fill, poison)
          bufs.fill(zeros, 0)
        for k, bl in enumerate(bound.launches, 1):
          where = f"launch {k} ({bl.kernel})"
          try:
            with clock("correctness/launch"):
              mod.launch(bl, ptrs, self.stream.cuda_stream)
          except Exception as e:  # pylint: disable=broad-except
            kind, msg = classify(e, at_launch=True)
            raise CandidateError(kind, f"{where}: {msg} [{str(e)[:160]}]", fatal=not _context_ok()) from e
          with clock("correctness/guards"):
            counted = bufs.guard_counts()  # Queued behind the launch: the wait below covers it.
          with clock("correctness/wait"):
            self.wait_for(where, deadline_s)
          with clock("correctness/guards"):
            bad = bufs.guard_violations(counted)
          if bad:
            name, side, nbytes = bad[0]
            shown = "out" if name == "out0" and len(outs) == 1 else name
            res["flags"].append("out_of_bounds_write")
            _final(res, "runtime_error", f"{where} wrote outside buffer '{shown}' ({nbytes} guard bytes "
                                         f"{'before its start' if side == 'before' else 'after its end'} changed)")
            return False
        with clock("correctness/input_check"):
          names = tensor_inputs + list(bufs.param_snapshot)
          originals = [pristine[n] for n in tensor_inputs] + list(bufs.param_snapshot.values())
          flags = B.changed((bufs[n].tensor, p) for n, p in zip(names, originals))
          changed = [n for n, f in zip(names, flags) if f]
        if changed:
          res["flags"].append("input_mutation")
          _final(res, "runtime_error", f"the kernels modified the input '{changed[0]}'; inputs and parameters "
                                       f"are read-only (use a scratch buffer)")
          return False
        if run == 1:
          with clock("correctness/keep"):
            kept = [B.sealed_copy(bufs[o].tensor, seal_seed + j) for j, o in enumerate(outs)]
      tols = [B.tolerance_for(r.dtype, s["atol"], s["rtol"], s["half_atol"], s["half_rtol"],
                              info.options.get("atol"), info.options.get("rtol")) for r in ref]
      with clock("correctness/compare"):  # Both runs of every output against the sealed reference, one sync.
        counts = torch.stack([B.count_bad_sealed(x, x_seed, ref[j], ref_seed + j, *tols[j])
                              for j, o in enumerate(outs)
                              for x, x_seed in ((kept[j], seal_seed + j), (bufs[o].tensor, None))]).cpu().tolist()
      if any(counts):
        with clock("correctness/unseal"):  # The statistics of a mismatch read the values themselves.
          B.seal_all(kept, seal_seed)
          B.seal_all(ref, ref_seed)
      for j, o in enumerate(outs):
        atol, rtol = tols[j]
        m1 = m2 = None
        if counts[2 * j] or counts[2 * j + 1]:  # The statistics of a mismatch (buffers.compare).
          m1 = B.compare(kept[j], ref[j], atol, rtol)
          m2 = B.compare(bufs[o].tensor, ref[j], atol, rtol)
        if m1 or m2:
          m = dict(m2 or m1)
          shown = "out" if len(outs) == 1 else o
          m.update(output=shown, dtype=str(ref[j].dtype).replace("torch.", ""), shape=list(ref[j].shape),
                   atol=atol, rtol=rtol, trial=trial, distribution=dist)
          unwritten = B.poison_value_count(bufs[o].tensor, B.POISON_FINITE)
          if unwritten:
            res["flags"].append("unwritten_output")
            err = (f"{unwritten:,} of {m['numel']:,} elements of output '{shown}' were never written "
                   f"(they still hold the poison value)")
          elif (m1 is None) != (m2 is None):
            res["flags"].append("nondeterministic")
            err = (f"output '{shown}' differs between two runs on the same inputs (a race, or reading "
                   f"uninitialised memory)")
          else:
            if m.get("nonfinite"):
              res["flags"].append("nonfinite_output")
            err = f"output '{shown}' does not match the reference"
          res["details"]["mismatch"] = m
          _final(res, "incorrect", err)
          return False
      del kept, ref, pristine, inputs
    res["details"]["distributions"] = used_dists
    return True


def _final(res: dict, status: str, error: str = "") -> dict:
  res["status"], res["error"] = status, error
  return res


def _allocator_counts(device: torch.device) -> tuple[int, int] | None:
  """(cudaMalloc, cudaFree) calls of this process's caching allocator so far; None off CUDA."""
  if device.type != "cuda":
    return None
  stats = torch.cuda.memory_stats(device)
  return int(stats.get("segment.all.allocated", 0)), int(stats.get("segment.all.freed", 0))


def _allocator_delta(before: tuple[int, int] | None, device: torch.device) -> dict:
  """The evaluation's cudaMalloc / cudaFree calls (details.breakdown: allocator traffic is host time too)."""
  now = _allocator_counts(device) if before is not None else None
  if now is None:
    return {}
  return {"cuda_malloc": now[0] - before[0], "cuda_free": now[1] - before[1]}


def _context_ok() -> bool:
  """True when the CUDA context still works (no sticky error)."""
  try:
    torch.cuda.synchronize()
    torch.zeros(1, device="cuda").add_(1).item()
    return True
  except Exception:  # pylint: disable=broad-except
    return False
