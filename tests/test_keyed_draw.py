"""keyed_draw.py: the timed runs' generator has the task's distribution, and its CUDA formula is its numpy one.

CPU: the numpy reference's N(0, 1) and U[0, 1) on 2^21 samples (mean, variance, Kolmogorov-Smirnov statistic at the
0.1 % critical value), keys and tensors give uncorrelated streams with no repeated values across runs, float16 /
bfloat16 rounding (nearest for randn, toward zero for rand: never 1.0), and the CUDA value formula compiled for the
host with g++ (IEEE arithmetic, no contraction: what the kernel's explicitly rounded intrinsics do) equals `values`
bit for bit (and its hash, all 64 bits, is `hashes`). GPU: the kernel's bytes equal the CPU path's in every dtype,
both copies, into guarded buffers.
"""

import ctypes
import math

import numpy as np
import pytest
import torch

from kevin_jax.kernels import buffers as B
from kevin_jax.kernels import compile as compile_mod
from kevin_jax.kernels import keyed_draw as K
from tests.host_build import DEVICE_PRELUDE, host_library

N = 2**21
KS_CRITICAL = 1.949  # sqrt(n) x the Kolmogorov-Smirnov statistic's 0.1 % critical value (large n).


def _ks(x: np.ndarray, cdf) -> float:
  """The Kolmogorov-Smirnov statistic of the sample x against a continuous cdf (numpy in, float out)."""
  s = np.sort(x.astype(np.float64))
  f = cdf(s)
  n = s.size
  return float(max((np.arange(1, n + 1) / n - f).max(), (f - np.arange(n) / n).max()))


def _normal_cdf(s):
  return 0.5 * (1.0 + torch.erf(torch.from_numpy(s) / math.sqrt(2.0)).numpy())


def test_randn_is_standard_normal():
  x = K.values("randn", N, *K.subkeys(0x1234, 0))
  assert x.dtype == np.float32 and np.isfinite(x).all()
  assert abs(x.mean()) < 4 / math.sqrt(N) and abs(x.var() - 1) < 6 * math.sqrt(2 / N)
  assert abs((x**4).mean() - 3) < 0.05  # Kurtosis of N(0, 1).
  assert _ks(x, _normal_cdf) < KS_CRITICAL / math.sqrt(N)
  assert np.abs(x).max() <= 5.77  # u1 >= 2^-24.
  # The two halves of a pair (cos and sin of one angle) are uncorrelated, and so are their squares.
  assert abs(np.corrcoef(x[0::2], x[1::2])[0, 1]) < 4 / math.sqrt(N / 2)
  assert abs(np.corrcoef(x[0::2]**2, x[1::2]**2)[0, 1]) < 4 / math.sqrt(N / 2)


def test_rand_is_uniform_on_the_unit_interval():
  u = K.values("rand", N, *K.subkeys(0x1234, 1))
  assert u.min() >= 0 and u.max() < 1
  assert abs(u.mean() - 0.5) < 4 * math.sqrt(1 / 12 / N) and abs(u.var() - 1 / 12) < 0.002
  assert _ks(u, lambda s: s) < KS_CRITICAL / math.sqrt(N)
  assert np.array_equal(u * 2**24, np.floor(u * 2**24))  # The 2^-24 grid.
  counts = np.bincount((u * 16).astype(np.int64), minlength=16)  # Chi-square over 16 bins, 15 degrees of freedom.
  chi2 = ((counts - N / 16)**2 / (N / 16)).sum()
  assert chi2 < 37.7  # The 0.1 % critical value.


def test_keys_and_tensors_give_independent_streams_and_runs_never_repeat():
  n = 2**18
  runs = [K.values("randn", n, *K.subkeys(key, 0)) for key in (1, 2, 2**63 + 1)]
  runs.append(K.values("randn", n, *K.subkeys(1, 1)))  # Same key, the next tensor.
  for i in range(len(runs)):
    for j in range(i + 1, len(runs)):
      assert abs(np.corrcoef(runs[i], runs[j])[0, 1]) < 4 / math.sqrt(n)
      assert np.intersect1d(runs[i], runs[j]).size < 0.01 * n  # Equal values only by chance (a 2^-24 grid).
  # A key differing in one bit shares nothing either: no shifted or permuted copy of the stream.
  a, b = K.values("rand", n, *K.subkeys(5, 0)), K.values("rand", n, *K.subkeys(5 ^ (1 << 40), 0))
  assert np.intersect1d(a, b).size < 0.02 * n and abs(np.corrcoef(a, b)[0, 1]) < 4 / math.sqrt(n)
  assert np.array_equal(K.values("randn", 1001, *K.subkeys(7, 0)), K.values("randn", 1001, *K.subkeys(7, 0)))
  assert np.array_equal(K.values("randn", 1001, *K.subkeys(7, 0))[:1000], K.values("randn", 1000, *K.subkeys(7, 0)))


def test_half_precision_rounding():
  ka, kb = K.subkeys(11, 0)
  v = K.values("randn", 4097, ka, kb)
  assert torch.equal(K.encode(v, "randn", torch.float16), torch.from_numpy(v).to(torch.float16))  # Nearest even.
  assert torch.equal(K.encode(v, "randn", torch.bfloat16), torch.from_numpy(v).to(torch.bfloat16))
  u = np.concatenate([K.values("rand", 4096, ka, kb), np.float32([1 - 2**-24, 1 - 2**-12, 0.5, 0.0])])
  for dtype in (torch.float16, torch.bfloat16):
    h = K.encode(u, "rand", dtype)
    up = h.float().numpy()
    nxt = torch.nextafter(h, torch.tensor(2.0, dtype=dtype)).float().numpy()
    assert (up <= u).all() and (u < nxt).all() and up.max() < 1  # Toward zero: the largest value <= u.


def test_write_fills_both_tensors_with_the_values_on_the_cpu():
  plan = ("randn", "rand", "randn")
  xs = [torch.empty(5, 7), torch.empty(33, dtype=torch.float16), torch.empty(3, 3, dtype=torch.bfloat16)]
  ys = [torch.full_like(x, float("nan")) for x in xs]
  K.write(plan, 99, list(zip(xs, ys)))
  for j, (f, x, y) in enumerate(zip(plan, xs, ys)):
    want = K.encode(K.values(f, x.numel(), *K.subkeys(99, j)), f, x.dtype).view(x.shape)
    assert torch.equal(B.bytes_of(x), B.bytes_of(want)) and torch.equal(B.bytes_of(y), B.bytes_of(want))
  with pytest.raises(ValueError):
    K.write(("randn",), 1, [(torch.empty(4, dtype=torch.float64), torch.empty(4, dtype=torch.float64))])
  with pytest.raises(ValueError):
    K.write(("randn",), 1, [(torch.empty(4, 4).t(), torch.empty(4, 4))])


_WRAP = r"""
extern "C" void hash_words(unsigned long long first, long count, unsigned long long ka, unsigned long long kb,
                           unsigned long long* out) {
  for (long k = 0; k < count; ++k) out[k] = kd_hash(first + k, ka, kb);
}
extern "C" void pairs(unsigned long long first, long count, unsigned long long ka, unsigned long long kb, int normal,
                      float* out) {
  for (long k = 0; k < count; ++k) kd_pair(first + k, ka, kb, normal, &out[2 * k], &out[2 * k + 1]);
}
"""


@pytest.fixture(scope="module")
def host_formula(tmp_path_factory):
  return host_library(tmp_path_factory, "formula", DEVICE_PRELUDE + K.FORMULA + _WRAP, "-O2", "-fno-fast-math")


@pytest.mark.parametrize("factory", K.FACTORIES)
def test_the_cuda_formula_is_the_numpy_reference_bit_for_bit(host_formula, factory):
  count = 2**18
  for key, first in ((3, 0), (2**64 - 5, 2**40)):  # The second: high pair indices (elements past 2^41).
    ka, kb = K.subkeys(key, 0)
    out = np.empty(2 * count, dtype=np.float32)
    host_formula.pairs(ctypes.c_uint64(first), ctypes.c_long(count), ctypes.c_uint64(ka), ctypes.c_uint64(kb),
                       ctypes.c_int(factory == "randn"), out.ctypes.data_as(ctypes.c_void_p))
    a, b = K.pair_words(first, count, ka, kb)
    if factory == "rand":
      want = np.stack([a.astype(np.float32) * np.float32(2**-24), b.astype(np.float32) * np.float32(2**-24)], 1)
    else:
      want = np.stack(K.box_muller(a, b), 1)
    assert np.array_equal(out.view(np.uint32), want.reshape(-1).view(np.uint32))
  assert np.array_equal(K.values(factory, 2 * count, *K.subkeys(3, 0)).view(np.uint32),
                        _host_values(host_formula, factory, 2 * count, 3).view(np.uint32))


def test_the_cuda_hash_is_the_numpy_hash(host_formula):
  """All 64 bits of h (the seal streams use every byte of it)."""
  for key, first in ((9, 0), (2**64 - 1, 2**50)):
    ka, kb = K.subkeys(key, 3)
    out = np.empty(4096, dtype=np.uint64)
    host_formula.hash_words(ctypes.c_uint64(first), ctypes.c_long(out.size), ctypes.c_uint64(ka), ctypes.c_uint64(kb),
                            out.ctypes.data_as(ctypes.c_void_p))
    assert np.array_equal(out, K.hashes(first, out.size, ka, kb))
  assert K.stream_bytes(20, ka, kb).tolist() == list(K.hashes(0, 3, ka, kb).astype("<u8").tobytes()[:20])


def _host_values(lib, factory, n, key):
  out = np.empty(n, dtype=np.float32)
  ka, kb = K.subkeys(key, 0)
  lib.pairs(ctypes.c_uint64(0), ctypes.c_long(n // 2), ctypes.c_uint64(ka), ctypes.c_uint64(kb),
            ctypes.c_int(factory == "randn"), out.ctypes.data_as(ctypes.c_void_p))
  return out


def test_nvrtc_accepts_the_kernel():
  res = compile_mod.compile_cuda(K.SOURCE, "sm_90", cache_dir="")
  assert res.ok, res.log


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("factory", K.FACTORIES)
def test_the_kernel_writes_the_numpy_reference_into_both_buffers(factory, dtype):
  """Bit for bit: whole quads, ragged tails (n mod 4 = 1..3) and a size over two grid strides (the kernel's loop),
  with every guard band intact (nothing written outside either buffer)."""
  if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU")
  dev = torch.device("cuda")
  K.prepare(dev)
  g = torch.Generator(device=dev)
  g.manual_seed(0)
  bufs = B.BufferSet(dev, g)
  for n in (1, 2, 3, 4, 5, 4097, 2**24 + 3):
    x = bufs.alloc(f"x{n}", (n,), dtype).tensor
    y = bufs.alloc(f"y{n}", (n,), dtype).tensor
    K.write((factory,), 0xC0FFEE + n, [(x, y)])
    torch.cuda.synchronize()
    want = K.encode(K.values(factory, n, *K.subkeys(0xC0FFEE + n, 0)), factory, dtype)
    assert torch.equal(B.bytes_of(x.cpu()), B.bytes_of(want)), (n, dtype)
    assert torch.equal(B.bytes_of(y.cpu()), B.bytes_of(want)), (n, dtype)
  assert not bufs.guard_violations()
