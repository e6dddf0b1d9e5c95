"""Where one evaluation's time goes: host wall-clock per phase, and GPU time per phase on request.

`with clock("draw"):` adds the host seconds spent inside the block to the phase "draw" (phases nest: an outer
phase includes its inner ones; names with a "/" are sub-phases by convention, e.g. "timing/draw"). With `gpu` on
(the worker setting `profile_phases`), the block is also bracketed by two CUDA events on the worker's stream and
the GPU time between them is summed per phase: what the GPU spent on the work queued in the block (plus any idle
gap inside it). The events never synchronise; they are read once, after the evaluation. `summary()` is small
(milliseconds rounded to 0.01, and the number of times each phase ran) and goes into a result's
`details.breakdown`.
"""

from __future__ import annotations

import time


class _Span:
  __slots__ = ("clock", "name", "t", "ev")

  def __init__(self, clock: "PhaseClock", name: str):
    self.clock, self.name, self.t, self.ev = clock, name, 0.0, None

  def __enter__(self):
    if self.clock.gpu:
      import torch  # pylint: disable=g-import-not-at-top  # Only with events (the fake worker has no torch).
      self.ev = torch.cuda.Event(enable_timing=True)
      self.ev.record(self.clock.stream)
    self.t = time.perf_counter()
    return self

  def __exit__(self, *exc):
    c = self.clock
    c.host[self.name] = c.host.get(self.name, 0.0) + time.perf_counter() - self.t
    c.count[self.name] = c.count.get(self.name, 0) + 1
    if self.ev is not None and exc[0] is None:
      import torch  # pylint: disable=g-import-not-at-top
      end = torch.cuda.Event(enable_timing=True)
      end.record(c.stream)
      c.events.append((self.name, self.ev, end))
    return False


class PhaseClock:
  """Per-phase host seconds (always) and GPU milliseconds from CUDA events (when `gpu`) of one evaluation."""

  def __init__(self, stream=None, gpu: bool = False):
    self.stream, self.gpu = stream, bool(gpu)
    self.host: dict[str, float] = {}
    self.count: dict[str, int] = {}
    self.events: list = []
    self.extra: dict = {}

  def __call__(self, name: str) -> _Span:
    return _Span(self, name)

  def summary(self) -> dict:
    """{"host_ms": {phase: ms}, "n": {phase: count}, "gpu_ms": {phase: ms} (with `gpu`), plus `extra`}.

    GPU times are read from completed events only (call after the stream is synchronised); an event that never
    completed (an evaluation cut short by a fault) leaves its phase out.
    """
    out = {"host_ms": {k: round(v * 1e3, 2) for k, v in self.host.items()}, "n": dict(self.count)}
    if self.gpu:
      gpu: dict[str, float] = {}
      for name, a, b in self.events:
        try:
          if b.query():
            gpu[name] = gpu.get(name, 0.0) + a.elapsed_time(b)
        except Exception:  # pylint: disable=broad-except  # A faulted context: the host times still stand.
          break
      out["gpu_ms"] = {k: round(v, 2) for k, v in gpu.items()}
    out.update(self.extra)
    return out
