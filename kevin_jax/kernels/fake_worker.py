"""A stand-in for the GPU worker (role 'fake') so the supervisor can be tested on a CPU-only machine.

It behaves like a GPU worker that evaluates instantly, except when the candidate's CUDA source contains a
`FAKE:<action>` marker: exit (os._exit), segv (a real segmentation fault), hang (sleep forever in a phase),
hang_reference (hang while running the reference on a non-task distribution), sleep=<s>, phases=<n> (enter a new
phase every 0.5 s, n times: no phase stalls, the whole run is long), raise, alloc=<MiB> (grow host memory,
reporting progress), fatal (report a sticky error), incorrect, oom (the GPU's allocator fails), oom_once (fails in
the first worker that runs it: a flag file in the temporary directory remembers it), free=<MiB> (the GPU's free
memory for the task's memory budget, kernels/footprint.py: over it, the worker answers the task-level skip as the
GPU worker does).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import tempfile
import time

from kevin_jax.kernels import footprint
from kevin_jax.kernels.phases import PhaseClock


class FakeHandler:
  def __init__(self, settings: dict):
    self.settings = settings
    self.count = 0
    self.idles = 0  # Times worker_main found no job waiting after a result.
    self.describe = {"device_name": "fake", "arch": settings.get("fake_arch", "sm_90"), "limits": {},
                     "torch": "fake", "pid": os.getpid()}

  def idle(self) -> None:
    """Called by worker_main when no job follows a result soon (the GPU worker releases cached memory)."""
    self.idles += 1

  def run(self, payload: dict, report) -> dict:
    self.count += 1
    text = payload.get("text", "")
    m = re.search(r"FAKE:(\w+)(?:=([\d.]+))?", text)
    action, arg = (m.group(1), m.group(2)) if m else ("", None)
    report("load")
    if action == "free":
      skip = footprint.too_large_result(payload["task_id"], payload.get("task_info"), int(float(arg) * 2**20),
                                        float(self.settings.get("task_memory_fraction", 0.0)),
                                        self.settings.get("timing_input_sets", 2))
      if skip is not None:
        return skip
    if action == "hang_reference" and "normal" not in payload.get("unsafe_dists", []):
      report("reference:normal")
      time.sleep(3600)
    report("candidate")
    if action == "exit":
      os._exit(7)
    if action == "segv":
      ctypes.string_at(0)
    if action == "hang":
      time.sleep(3600)
    if action == "sleep":
      time.sleep(float(arg))
    if action == "phases":
      for k in range(int(float(arg))):
        report(f"candidate:{k}")
        time.sleep(0.5)
    if action == "raise":
      raise RuntimeError("fake failure inside the worker")
    if action == "alloc":  # In 64 MiB steps, each a reported phase: growing, not hanging, however slow the host.
      hog, left = [], int(float(arg) * 2**20)
      while left > 0:
        chunk = bytearray(min(left, 64 * 2**20))
        for i in range(0, len(chunk), 4096):
          chunk[i] = 1
        hog.append(chunk)
        left -= len(chunk)
        report(f"candidate:alloc{len(hog)}")
      time.sleep(30)
    report("timing")
    res = {"status": "correct", "error": "", "flags": [], "details": {"worker_pid": os.getpid(),
                                                                       "worker_count": self.count,
                                                                       "worker_idles": self.idles,
                                                                       "unsafe_dists": payload.get("unsafe_dists", [])},
           "times": {"correctness": 0.001, "timing": 0.001}, "speedup": 2.0, "ref_time_ms": 1.0,
           "cand_time_ms": 0.5, "fatal": False}
    if action == "incorrect":
      res.update(status="incorrect", error="output 'out' does not match the reference", speedup=None)
    if action == "oom_once":
      flag = os.path.join(tempfile.gettempdir(), "fake_oom_" + hashlib.sha256(text.encode()).hexdigest()[:16])
      action = "ok" if os.path.exists(flag) else "oom"
      open(flag, "w", encoding="utf-8").close()
    if action == "oom":
      res.update(status="runtime_error", speedup=None, fatal=True, flags=["gpu_oom"],
                 error="out of GPU memory [CUDA out of memory. Tried to allocate 1.87 GiB (fake)]")
    if action == "fatal":
      res.update(status="runtime_error", error="illegal memory access (fake)", fatal=True, speedup=None,
                 flags=["illegal_address"])
    if payload.get("ref_time_ms") is not None:  # ref_timing 'cached': the reference time as the GPU worker reports it.
      res["details"]["ref_time_ms_given"] = res["ref_time_ms"] = payload["ref_time_ms"]
      res["details"]["timing"] = {"ref_ms": {"median": payload["ref_time_ms"], "cached": True}}
    clock = PhaseClock()
    for phase in ("load", "correctness", "timing"):
      with clock(phase):
        pass
    res["details"]["breakdown"] = clock.summary()
    return res
