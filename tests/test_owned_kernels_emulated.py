"""The evaluator's own CUDA kernels (keyed draws, keyed XOR, sealed and plain output comparison, integrity hash) run
through the CPU emulator of the device dialect, against their Python references, with the launches the modules
build for the GPU (their `*_call`: kernel, thread count, arguments in parameter order): indexing, grid-stride loops
past the block cap, vector stores and ragged tails, warp reductions. The GPU tests (tests/test_keyed_draw.py,
tests/test_closeness.py, tests/test_kernels_buffers.py) run the same sources through NVRTC and owned.py's launch;
the float16 conversion is PTX (cvt.rn / cvt.rz), which only they run: here it is a host conversion."""

import re
import shutil

import numpy as np
import pytest
import torch

from kevin_jax.kernels import closeness
from kevin_jax.kernels import integrity
from kevin_jax.kernels import keyed_draw as K
from kevin_jax.kernels import owned
from kevin_jax.kernels.emulate import emulator

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

CAP = 2  # Blocks at most: every size below 2 x 256 items needs the kernels' grid-stride loop.

_F16 = r"""
__device__ unsigned short emu_f16(float v, int toward_zero) {
  _Float16 h = (_Float16)v;  // Nearest even.
  unsigned short b; std::memcpy(&b, &h, 2);
  if (toward_zero && std::fabs((float)h) > std::fabs(v)) b -= 1;  // One step toward zero (finite, nonzero).
  return b;
}
"""


def _keyed_source() -> str:
  src, count = re.subn(r"if \(toward_zero\) asm\(.*?\);\s*else asm\(.*?\);", "h = emu_f16(v, toward_zero);",
                       K.SOURCE, flags=re.S)
  assert count == 1
  return _F16 + src


def _launch(source: str, call: owned.Call) -> None:
  """The launch the module builds for the GPU (its `*_call`), run in the emulator with at most CAP blocks."""
  emulator.launch_source(source, call.kernel, owned.blocks(call.items, CAP), owned.THREADS, call.args)


def _guarded(n: int, dtype: torch.dtype, fill: int = 0xA5):
  """A CPU tensor of n elements inside a byte buffer with 64 guard bytes on each side (16-byte aligned)."""
  size = torch.empty((), dtype=dtype).element_size()
  raw = torch.full((n * size + 128 + 16,), fill, dtype=torch.uint8)
  start = 64 + (-(raw.data_ptr() + 64) % 16)
  return raw, raw[start:start + n * size].view(dtype), start


def _guards_intact(raw, start, n, dtype, fill=0xA5):
  size = torch.empty((), dtype=dtype).element_size()
  return bool((raw[:start] == fill).all() and (raw[start + n * size:] == fill).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("factory", K.FACTORIES)
def test_keyed_draw_writes_the_numpy_reference_into_both_buffers(factory, dtype):
  src = _keyed_source()
  for n in (1, 3, 4, 6, 2 * CAP * 256 * 4 + 7):  # Ragged tails, whole quads, two and more grid strides.
    (rx, x, sx), (ry, y, sy) = _guarded(n, dtype), _guarded(n, dtype)
    key = 0xC0FFEE + n
    ka, kb = K.subkeys(key, 0)
    _launch(src, K.draw_call(x, y, factory, ka, kb))
    want = K.encode(K.values(factory, n, ka, kb), factory, dtype)
    for got in (x, y):
      assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (factory, dtype, n)
    assert _guards_intact(rx, sx, n, dtype) and _guards_intact(ry, sy, n, dtype)


@pytest.mark.parametrize("offset", [0, 3])  # 8-byte words, and bytes (views 3 bytes past an 8-byte boundary).
def test_keyed_xor_is_the_stream(offset):
  n = 2 * CAP * 256 * 8 + 13
  (_, src, _), (_, dst, _) = _guarded(n + offset, torch.uint8), _guarded(n + offset, torch.uint8)
  src, dst = src[offset:], dst[offset:]
  src.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)))
  ka, kb = K.subkeys(42, 1)
  call = K.xor_call(src, dst, ka, kb)
  assert call.items == (-(-n // 8) if offset == 0 else n)  # The word path only where both views are aligned.
  _launch(_keyed_source(), call)
  assert torch.equal(dst, torch.bitwise_xor(src, K.stream_bytes(n, ka, kb)))


def _sealed(t: torch.Tensor, ka: int, kb: int) -> torch.Tensor:
  b = t.contiguous().view(torch.uint8)
  return torch.bitwise_xor(b, K.stream_bytes(b.numel(), ka, kb)).view(torch.float32)


@pytest.mark.parametrize("out_sealed", [False, True])
def test_sealed_comparison_counts_what_isclose_counts(out_sealed):
  n = 2 * CAP * 256 * 2 + 5
  g = torch.Generator().manual_seed(0)
  ref = torch.randn(n, generator=g)
  out = ref + 1e-6 * torch.randn(n, generator=g)
  bad = torch.randperm(n, generator=g)[:37]
  out[bad[:30]] += 1.0
  out[bad[30:33]] = float("nan")
  out[bad[33:]] = float("inf")
  ref[bad[36]] = float("nan")  # NaN against NaN is a match (equal_nan), as in count_bad.
  out[bad[36]] = float("nan")
  want = int((~torch.isclose(out, ref, rtol=1e-4, atol=1e-5, equal_nan=True)).sum())
  ka_r, kb_r = K.subkeys(7, 2)
  out_keys = K.subkeys(8, 2) if out_sealed else None
  a = _sealed(out, *out_keys) if out_sealed else out.clone()
  r = _sealed(ref, ka_r, kb_r)
  count = torch.zeros((), dtype=torch.int64)
  _launch(closeness.SOURCE, closeness.sealed_call(a, out_keys, r, (ka_r, kb_r), 1e-5, 1e-4, count))
  assert want == 36 and int(count) == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_plain_comparison_counts_what_isclose_counts(dtype):
  n = 2 * CAP * 256 + 3
  g = torch.Generator().manual_seed(1)
  ref = torch.randn(n, generator=g, dtype=dtype)
  out = ref.clone()
  out[torch.randperm(n, generator=g)[:11]] += 0.5
  out[5] = float("-inf")
  want = int((~torch.isclose(out, ref, rtol=1e-3, atol=1e-3, equal_nan=True)).sum())
  count = torch.zeros((), dtype=torch.int64)
  _launch(closeness.SOURCE, closeness.plain_call(out, ref, 1e-3, 1e-3, count))
  assert want >= 11 and int(count) == want


def test_integrity_hash_is_the_torch_formula():
  n = 2 * CAP * 256 * 3 + 1
  t = torch.randint(-2**31, 2**31, (n,), dtype=torch.int32, generator=torch.Generator().manual_seed(2))
  key = 2**64 - 12345
  want = integrity.KeyedHash(torch.device("cpu"))([t], key)
  out = torch.zeros(1, dtype=torch.int64)
  _launch(integrity.SOURCE, integrity.hash_call(t, key, out, 0))
  assert torch.equal(out, want)
