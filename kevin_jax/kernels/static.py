"""The static half of an evaluation (no GPU): parse, validate the plan against the task, compile, inspect.

Runs in the compile worker processes (the CLI's --compile-only uses one too). The outcome is a plain dict: status
'ok' with the cubin when the candidate is ready for the GPU, otherwise a final format_error / compile_error (or
runtime_error + evaluator_error when the task itself cannot be analysed). The cubin checks (`check_cubin`, run
again by the GPU worker on the same bytes): no banned calls, every launched kernel present, each launched kernel's
compiled parameter list equal in arity and sizes to the signature the plan was bound to, static `__device__`
memory (64-bit) and local memory x resident threads under their caps.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any

from kevin_jax.kernels import compile as compile_mod
from kevin_jax.kernels import cubin as cubin_mod
from kevin_jax.kernels import tasks
from kevin_jax.kernels.candidate import FormatError, parse_candidate
from kevin_jax.kernels.plan import Limits, bind_plan, parse_plan
from kevin_jax.kernels.taskinfo import TaskError, TaskInfo, analyze_task

BANNED_CALLS = {"vprintf": "printf", "malloc": "malloc", "free": "free", "__nv_aligned_device_malloc": "malloc",
                "cudaMalloc": "cudaMalloc", "cudaLaunchDevice": "device-side kernel launches",
                "cudaGetParameterBufferV2": "device-side kernel launches"}
DEFAULT_MAX_STATIC_DEVICE_BYTES = 256 * 2**20
DEFAULT_MAX_LOCAL_MEMORY_BYTES = 4 * 2**30

_task_cache: "collections.OrderedDict[tuple, TaskInfo]" = collections.OrderedDict()


def task_info(task_id: str, task_path: str) -> TaskInfo:
  """Cached analyze_task per (path, mtime) in this process."""
  key = (task_id, task_path, os.path.getmtime(task_path))
  info = _task_cache.get(key)
  if info is None:
    info = analyze_task(tasks.TaskSpec(id=task_id, path=task_path, level=0))
    _task_cache[key] = info
    while len(_task_cache) > 256:
      _task_cache.popitem(last=False)
  _task_cache.move_to_end(key)
  return info


def limits_from(d: dict | None) -> Limits:
  if not d:
    return Limits()
  fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in Limits.__dataclass_fields__}
  return Limits(**fields)


def validate(text: str, info: TaskInfo, limits: Limits):
  """parse_candidate + parse_plan + bind_plan. Returns (candidate, bound plan). Raises FormatError."""
  cand = parse_candidate(text)
  plan = parse_plan(cand.plan_text, limits)
  bound = bind_plan(plan, info.plan_env(), cand.kernels, limits, info.output_names)
  return cand, bound


def static_check(job: dict[str, Any]) -> dict[str, Any]:
  """Parses, validates and compiles one candidate.

  Args:
    job: task_id, task_path, text; optional arch ('sm_90'), limits (Limits fields), cache_dir, use_pch,
      max_static_device_bytes, task_info (a TaskInfo dict, skips the analysis).
  Returns:
    dict(status, error, flags, details, times, cubin=bytes when status == 'ok').
  """
  times: dict[str, float] = {}
  t0 = time.perf_counter()
  out: dict[str, Any] = {"status": "ok", "error": "", "flags": [], "details": {}, "times": times}
  try:
    if job.get("task_info"):
      info = TaskInfo.from_dict(job["task_info"])
    else:
      info = task_info(job["task_id"], job["task_path"])
  except (TaskError, OSError) as e:
    out.update(status="runtime_error", error=f"evaluator error: {e}", flags=["evaluator_error"])
    return out
  times["task_analysis"] = time.perf_counter() - t0
  t1 = time.perf_counter()
  limits = limits_from(job.get("limits"))
  try:
    cand, bound = validate(job["text"], info, limits)
  except FormatError as e:
    out.update(status="format_error", error=str(e))
    times["validate"] = time.perf_counter() - t1
    return out
  times["validate"] = time.perf_counter() - t1
  res = compile_mod.compile_cuda(cand.cuda_source, job.get("arch") or compile_mod.DEFAULT_ARCH,
                                 cache_dir=job.get("cache_dir"), use_pch=job.get("use_pch", True))
  times["compile"] = res.seconds
  out["details"]["compile_cached"] = res.cached
  if not res.ok:
    out.update(status="compile_error", error=_first_error(res.log))
    out["details"]["compile_log"] = res.log
    return out
  try:
    ci = cubin_mod.read_cubin(res.cubin)
  except ValueError as e:
    out.update(status="compile_error", error=f"unreadable cubin: {e}")
    return out
  problem = check_cubin(ci, cand.kernels, bound, limits, job.get("max_static_device_bytes",
                                                                  DEFAULT_MAX_STATIC_DEVICE_BYTES),
                        job.get("max_local_memory_bytes", DEFAULT_MAX_LOCAL_MEMORY_BYTES))
  if problem:
    status, error, flags = problem
    out.update(status=status, error=error, flags=flags)
    return out
  used = {l.kernel for l in bound.launches}
  out["cubin"] = res.cubin
  out["details"].update(kernels=list(ci.kernels), static_device_bytes=ci.global_bytes,
                        local_bytes={k: ci.kernel_info[k].local_bytes for k in sorted(used)},
                        nvrtc_version=list(res.nvrtc_version))
  out["task_info"] = info.to_dict()
  return out


def check_cubin(ci: cubin_mod.CubinInfo, kernels, bound, limits: Limits, max_static_bytes: int,
                max_local_bytes: int) -> tuple[str, str, list] | None:
  """(status, error, flags) for a compiled candidate the evaluator must not run, else None (module docstring)."""
  banned = sorted({BANNED_CALLS[s] for s in ci.undefined if s in BANNED_CALLS})
  if banned:
    return "format_error", f"{', '.join(banned)} is not available in device code (remove it)", ["banned_call"]
  used = sorted({l.kernel for l in bound.launches})
  missing = [k for k in used if k not in ci.kernels]
  if missing:
    return ("format_error", f"kernel {missing[0]} is not in the compiled code (compiled kernels: "
            f"{', '.join(ci.kernels) or 'none'})", [])
  for name in used:
    ki, sig = ci.kernel_info[name], kernels[name]
    want = tuple(p.nbytes for p in sig.params)
    same = (ki.param_sizes == want if ki.param_sizes or not ki.param_bytes
            else cubin_mod.abi_param_bytes(want) == ki.param_bytes)
    if not same:
      got = list(ki.param_sizes) if ki.param_sizes else f"{ki.param_bytes} bytes"
      return ("format_error", f"kernel {name}: the compiled kernel's parameters ({len(ki.param_sizes)}, sizes {got}) "
              f"differ from its signature as written ({len(want)}, sizes {list(want)}); a macro or #if may not "
              f"change a kernel's signature", ["signature_mismatch"])
  if ci.global_bytes > max_static_bytes:
    return ("format_error", f"static __device__ memory is {ci.global_bytes} bytes (limit {max_static_bytes} "
            f"bytes); use scratch buffers", [])
  for name in used:
    per_thread = ci.kernel_info[name].local_bytes
    reserved = per_thread * limits.max_resident_threads
    if reserved > max_local_bytes:
      return ("format_error", f"kernel {name} uses {per_thread} bytes of local memory per thread; for "
              f"{limits.max_resident_threads} resident threads the GPU would reserve {reserved / 2**30:.2f} GiB (limit "
              f"{max_local_bytes / 2**30:.2f} GiB): keep per-thread arrays small or use shared memory",
              ["local_memory"])
  return None


def _first_error(log: str) -> str:
  for line in log.splitlines():
    if "error" in line:
      return line.strip()[:300]
  return (log.strip().splitlines() or ["compilation failed"])[0][:300]
