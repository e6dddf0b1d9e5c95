"""Launch parameter packing, CUDA error classification and polled waits (runner.py), without a GPU."""

import ctypes
import time

import pytest
import torch

from kevin_jax.kernels import runner
from kevin_jax.kernels.plan import BoundLaunch


class FakeDriver:
  """Records cuLaunchKernel calls and decodes the kernel parameter array while it is alive."""

  def __init__(self, sizes):
    self.sizes, self.calls = sizes, []

  def launchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):  # pylint: disable=invalid-name
    ptrs = (ctypes.c_void_p * len(self.sizes)).from_address(params) if params else []
    values = [ctypes.string_at(p, n) for p, n in zip(ptrs, self.sizes)]
    self.calls.append(((f, gx, gy, gz, bx, by, bz, smem, stream, extra), values))


def test_launch_packs_every_argument_with_its_c_type():
  mod = runner.KernelModule.__new__(runner.KernelModule)
  mod._driver = FakeDriver([8, 4, 8, 4, 8, 1, 4])  # pylint: disable=protected-access
  mod.funcs = {"k": type("F", (), {"ptr": 1234})()}
  bl = BoundLaunch(kernel="k", grid=(7, 2, 1), block=(256, 1, 1), smem=1024, line=1,
                   args=(("tensor", "x"), ("scalar", "int32", -5), ("scalar", "int64", 2**40),
                         ("scalar", "float32", 2.5), ("scalar", "float64", 1e-300), ("scalar", "bool", 1),
                         ("scalar", "uint32", 2**32 - 1)))
  mod.launch(bl, {"x": 0xDEADBEEF000}, stream_ptr=77)
  (head, values), = mod._driver.calls  # pylint: disable=protected-access
  assert head == (1234, 7, 2, 1, 256, 1, 1, 1024, 77, 0)
  assert values == [(0xDEADBEEF000).to_bytes(8, "little"), (-5).to_bytes(4, "little", signed=True),
                    (2**40).to_bytes(8, "little"), bytes(ctypes.c_float(2.5)), bytes(ctypes.c_double(1e-300)),
                    b"\x01", (2**32 - 1).to_bytes(4, "little")]


def test_launch_without_arguments_passes_a_null_parameter_array():
  mod = runner.KernelModule.__new__(runner.KernelModule)
  mod._driver = FakeDriver([])  # pylint: disable=protected-access
  mod.funcs = {"k": type("F", (), {"ptr": 1})()}
  mod.launch(BoundLaunch(kernel="k", grid=(1, 1, 1), block=(1, 1, 1), smem=0, args=(), line=1), {}, 0)
  assert mod._driver.calls[0][1] == []  # pylint: disable=protected-access


@pytest.mark.parametrize("text,at_launch,kind", [
    ("CUDA error: an illegal memory access was encountered", False, "illegal_address"),
    ("cudaErrorIllegalAddress: an illegal memory access was encountered", False, "illegal_address"),
    ("CUDA error: unspecified launch failure", False, "trap"),
    ("CUDA error: an illegal instruction was encountered", False, "trap"),
    ("CUDA error: misaligned address", False, "misaligned"),
    ("CUDA_ERROR_INVALID_VALUE: invalid argument", True, "launch"),
    ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch", True, "launch"),
    ("CUDA_ERROR_INVALID_VALUE: invalid argument", False, "cuda_error"),
    ("CUDA out of memory. Tried to allocate 2.00 GiB", False, "oom"),
    ("something else", False, "cuda_error"),
])
def test_classify(text, at_launch, kind):
  assert runner.classify(RuntimeError(text), at_launch)[0] == kind


class SlowEvent:
  def __init__(self, *a, **k):
    pass

  def record(self, stream=None):
    pass

  def query(self):
    return False


class FaultEvent(SlowEvent):
  def query(self):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_wait_turns_a_hang_into_a_fatal_timeout(monkeypatch):
  monkeypatch.setattr(torch.cuda, "Event", SlowEvent)
  t = time.monotonic()
  with pytest.raises(runner.CandidateError) as e:
    runner.wait(None, time.monotonic() + 0.2, "launch 1 (k)")
  assert e.value.kind == "hang" and e.value.fatal and 0.2 <= time.monotonic() - t < 2
  assert str(e.value) == "launch 1 (k) did not finish in time"


def test_wait_classifies_a_device_fault(monkeypatch):
  monkeypatch.setattr(torch.cuda, "Event", FaultEvent)
  with pytest.raises(runner.CandidateError) as e:
    runner.wait(None, time.monotonic() + 5, "launch 2 (k)")
  assert e.value.kind == "illegal_address" and e.value.fatal
  assert str(e.value).startswith("launch 2 (k): illegal memory access")
