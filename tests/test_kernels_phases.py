"""kernels/phases.py: host time per phase (nested phases include their inner ones), counts, and the event path."""

import time

import pytest
import torch

from kevin_jax.kernels.phases import PhaseClock


def test_host_time_per_phase_nested_and_repeated():
  clock = PhaseClock()
  with clock("timing"):
    for _ in range(3):
      with clock("timing/wait"):
        time.sleep(0.01)
  with pytest.raises(ValueError):
    with clock("after"):
      raise ValueError("a phase that raises still counts its time")
  s = clock.summary()
  assert s["n"] == {"timing/wait": 3, "timing": 1, "after": 1} and "gpu_ms" not in s
  assert 30 <= s["host_ms"]["timing/wait"] <= s["host_ms"]["timing"] < 1000


class _Event:
  """A CUDA event stand-in: record() stamps the host clock; elapsed_time in ms."""
  pending = False

  def __init__(self, enable_timing=False):
    self.t = None

  def record(self, stream=None):
    self.t = time.perf_counter()

  def query(self):
    return not _Event.pending

  def elapsed_time(self, other):
    return (other.t - self.t) * 1e3


def test_event_time_per_phase_only_from_completed_events(monkeypatch):
  monkeypatch.setattr(torch.cuda, "Event", _Event)
  clock = PhaseClock(stream=None, gpu=True)
  with clock("correctness"):
    time.sleep(0.02)
  clock.extra["cuda_malloc"] = 2
  s = clock.summary()
  assert s["gpu_ms"]["correctness"] >= 20 and s["cuda_malloc"] == 2
  _Event.pending = True
  try:
    assert PhaseClock(gpu=True).summary()["gpu_ms"] == {}
    clock2 = PhaseClock(gpu=True)
    with clock2("timing"):
      pass
    assert clock2.summary()["gpu_ms"] == {} and clock2.summary()["n"] == {"timing": 1}
  finally:
    _Event.pending = False
