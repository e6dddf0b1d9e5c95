"""A second reference timing: the task's reference module under torch.compile (as KernelBench reports), in the GPU
worker, for correct candidates when `compile_baseline` is on (off by default; the default timing is unchanged).

Per task and worker process, once: torch.compile(model) (default mode), `warmup_runs` + 3 untimed calls (the
compile happens there), then `timing_runs` calls (at least timing_min_runs) on the worker's stream, each on a
fresh input draw with the L2 flushed before it, CUDA events around each; the median is the compile reference time.
The result gets details.compile_ref_ms and details.speedup_compile = compile reference time / the candidate's
median time. If compiling or running fails (an unsupported op, no compiler on the host), both are 'n/a' with the
reason in details.compile_error: never a failure of the evaluation.
"""

from __future__ import annotations

import statistics

import torch

from kevin_jax.kernels import inputs as I

NA = "n/a"
_EXTRA_WARMUP = 3  # Calls after warmup_runs: recompiles for a second input set settle there.
_cache: dict[str, float | str] = {}  # task_id -> compile reference median (ms) or 'n/a: reason', per process.


def reference_ms(w, state) -> float | str:
  """Median ms of torch.compile(state.model) on fresh task inputs (module docstring); 'n/a: <reason>' on failure."""
  if state.task_id in _cache:
    return _cache[state.task_id]
  s = w.s
  try:
    compiled = torch.compile(state.model)
    times = []
    runs = max(int(s["timing_runs"]), int(s["timing_min_runs"]))
    warmup = int(s["warmup_runs"]) + _EXTRA_WARMUP
    with torch.cuda.stream(w.stream), torch.no_grad():
      for i in range(warmup + runs):
        args = I.draw(state.module, "task", w.secret.getrandbits(62), w.device)
        w.flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(w.stream)
        out = compiled(*args)
        b.record(w.stream)
        b.synchronize()
        del out, args
        if i >= warmup:
          times.append(a.elapsed_time(b))
    value: float | str = statistics.median(times)
  except Exception as e:  # pylint: disable=broad-except  (any compiler or runtime failure: the task gets n/a)
    value = f"{NA}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    torch.cuda.synchronize()  # Raises (-> fatal, worker replaced) if the failure broke the CUDA context.
  _cache[state.task_id] = value
  return value


def attach(w, state, res: dict) -> None:
  """Adds details.compile_ref_ms and details.speedup_compile to a correct, timed result (module docstring)."""
  if res.get("status") != "correct" or not res.get("cand_time_ms"):
    return
  ref = reference_ms(w, state)
  if isinstance(ref, str):
    res["details"].update(compile_ref_ms=NA, speedup_compile=NA, compile_error=ref[len(NA) + 2:])
    return
  res["details"].update(compile_ref_ms=ref, speedup_compile=ref / float(res["cand_time_ms"]))
