"""Loading a candidate's cubin and launching its bound plan (GPU worker only).

A fresh `cupy.cuda.function.Module` per evaluation (cuModuleLoadData; unloaded when dropped), so `__device__`
state never outlives one evaluation. Launches go straight to `cuLaunchKernel` (CuPy's driver binding) with a
parameter array built here from the plan's types, on the evaluator's stream; CuPy's own argument conversion and
stream handling are not involved. Waits poll a CUDA event against a host deadline, so a hung kernel is reported
as a timeout instead of blocking the worker forever.
"""

from __future__ import annotations

import ctypes
import time

import torch

from kevin_jax.kernels.plan import BoundLaunch, BoundPlan

_CTYPES = {"int8": ctypes.c_int8, "uint8": ctypes.c_uint8, "int16": ctypes.c_int16, "uint16": ctypes.c_uint16,
           "int32": ctypes.c_int32, "uint32": ctypes.c_uint32, "int64": ctypes.c_int64, "uint64": ctypes.c_uint64,
           "float32": ctypes.c_float, "float64": ctypes.c_double, "bool": ctypes.c_bool}
DEFAULT_DYNAMIC_SMEM = 48 * 1024


class CandidateError(Exception):
  """A failure attributable to the candidate. kind: launch | illegal_address | trap | misaligned | hang | ...

  `fatal` means the CUDA context is unusable (sticky error or a still-running kernel): the worker must exit.
  """

  def __init__(self, kind: str, message: str, fatal: bool, launch: int | None = None):
    super().__init__(message)
    self.kind, self.message, self.fatal, self.launch = kind, message, fatal, launch


_PATTERNS = (
    (("ILLEGAL_ADDRESS", "illegal memory access"), "illegal_address",
     "illegal memory access (an out-of-bounds or invalid pointer)"),
    (("MISALIGNED_ADDRESS", "misaligned address"), "misaligned",
     "misaligned address (vector loads/stores such as float4 need 16-byte aligned addresses)"),
    (("ILLEGAL_INSTRUCTION", "illegal instruction", "LAUNCH_FAILED", "unspecified launch failure",
      "device-side assert", "ASSERT", "TRAP", "HARDWARE_STACK_ERROR", "hardware stack error"), "trap",
     "the kernel aborted (__trap(), assert, stack overflow or an illegal instruction)"),
    (("LAUNCH_OUT_OF_RESOURCES", "too many resources requested"), "launch",
     "too many resources requested for launch (registers per thread x threads per block)"),
    (("INVALID_VALUE", "invalid argument", "INVALID_CONFIGURATION", "invalid configuration"), "launch",
     "invalid launch configuration (grid, block or shared memory)"),
    (("LAUNCH_TIMEOUT",), "hang", "the kernel timed out"),
    (("out of memory", "OUT_OF_MEMORY"), "oom", "out of GPU memory"),
)


def classify(exc: BaseException, at_launch: bool) -> tuple[str, str]:
  """(kind, short message) for a CUDA exception; the raw error text is appended for the record."""
  text = f"{type(exc).__name__}: {exc}"
  for keys, kind, msg in _PATTERNS:
    if any(k in text for k in keys):
      if kind == "launch" and not at_launch:
        continue
      return kind, msg
  return "cuda_error", "CUDA error"


class KernelModule:
  """The candidate's loaded cubin: functions by name, their attributes, and plan execution."""

  def __init__(self, cubin: bytes, names):
    from cupy.cuda import function  # pylint: disable=g-import-not-at-top
    from cupy_backends.cuda.api import driver  # pylint: disable=g-import-not-at-top
    self._driver = driver
    self.module = function.Module()
    self.module.load(cubin)
    self.funcs = {n: self.module.get_function(n) for n in names}
    self._smem_set: dict[str, int] = {}

  def attributes(self, name: str) -> dict:
    d, f = self._driver, self.funcs[name].ptr
    get = lambda a: int(d.funcGetAttribute(a, f))
    return {"num_regs": get(d.CU_FUNC_ATTRIBUTE_NUM_REGS),
            "static_smem": get(d.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
            "local_bytes": get(d.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
            "max_threads": get(d.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)}

  def allow_dynamic_smem(self, name: str, nbytes: int) -> None:
    """Opts a kernel in to more than 48 KiB of dynamic shared memory."""
    if nbytes > DEFAULT_DYNAMIC_SMEM and self._smem_set.get(name, 0) < nbytes:
      self._driver.funcSetAttribute(self.funcs[name].ptr, self._driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    int(nbytes))
      self._smem_set[name] = nbytes

  def launch(self, bl: BoundLaunch, ptrs: dict[str, int], stream_ptr: int) -> None:
    """One cuLaunchKernel; raises the driver's CUDADriverError on a bad configuration."""
    keep = []
    for a in bl.args:
      if a[0] == "tensor":
        keep.append(ctypes.c_void_p(ptrs[a[1]]))
      else:
        keep.append(_CTYPES[a[1]](a[2]))
    params = (ctypes.c_void_p * max(1, len(keep)))(*[ctypes.addressof(v) for v in keep])
    self._driver.launchKernel(self.funcs[bl.kernel].ptr, bl.grid[0], bl.grid[1], bl.grid[2], bl.block[0],
                              bl.block[1], bl.block[2], bl.smem, stream_ptr,
                              ctypes.addressof(params) if keep else 0, 0)

  def run(self, plan: BoundPlan, ptrs: dict[str, int], stream_ptr: int) -> None:
    """All launches of the plan, asynchronously (timing); errors are fatal here (no per-launch sync)."""
    for k, bl in enumerate(plan.launches):
      try:
        self.launch(bl, ptrs, stream_ptr)
      except Exception as e:  # pylint: disable=broad-except
        kind, msg = classify(e, at_launch=True)
        raise CandidateError(kind, f"launch {k + 1} ({bl.kernel}): {msg} [{e}]", fatal=True, launch=k) from e


def wait(stream: torch.cuda.Stream, deadline: float, what: str, event=None) -> None:
  """Waits for the stream's work (or for `event`, recorded on it), polling; raises CandidateError (fatal) on a fault
  or past the deadline."""
  spins = 0
  ev = event
  while True:
    try:  # A fault of an earlier launch can surface already at record().
      if ev is None:
        ev = torch.cuda.Event()
        ev.record(stream)
      if ev.query():
        return
    except Exception as e:  # pylint: disable=broad-except
      kind, msg = classify(e, at_launch=False)
      first = (str(e).splitlines() or [type(e).__name__])[0][:200]
      raise CandidateError(kind, f"{what}: {msg} [{first}]", fatal=True) from e
    if time.monotonic() > deadline:
      raise CandidateError("hang", f"{what} did not finish in time", fatal=True)
    spins += 1
    time.sleep(0 if spins < 200 else 0.0001)
