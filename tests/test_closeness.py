"""closeness.py: the one-pass mismatch count follows torch.isclose(equal_nan=True) element for element.

The CUDA rule is compiled for the host with g++ (IEEE arithmetic, no contraction: what the kernel's explicitly
rounded intrinsics do) and checked against torch.isclose on NaN, infinities, signed zeros, subnormals and values
one ulp either side of the tolerance; NVRTC must accept the kernels; on a GPU the kernel's counts equal torch's.
"""

import ctypes

import pytest
import torch

from kevin_jax.kernels import buffers as B
from kevin_jax.kernels import closeness
from kevin_jax.kernels import compile as compile_mod
from tests.host_build import DEVICE_PRELUDE, host_library

ATOL, RTOL = 1e-4, 1e-4
_WRAP = r"""
extern "C" void rule_f32(const float* a, const float* r, long n, float atol, float rtol, unsigned char* bad) {
  for (long i = 0; i < n; ++i) bad[i] = bad_f32(a[i], r[i], atol, rtol);
}
extern "C" void rule_f64(const double* a, const double* r, long n, double atol, double rtol, unsigned char* bad) {
  for (long i = 0; i < n; ++i) bad[i] = bad_f64(a[i], r[i], atol, rtol);
}
"""


def _tricky(dtype) -> tuple[torch.Tensor, torch.Tensor]:
  """(out, ref) pairs: special values against each other, and values at the tolerance boundary +- 1 ulp."""
  info = torch.finfo(dtype)
  special = torch.tensor([0.0, -0.0, 1.0, -1.0, float("nan"), float("inf"), -float("inf"), info.tiny,
                          info.tiny / 4, info.max, -info.max, 1e-30, 3.0], dtype=dtype)
  a = special.repeat_interleave(len(special))
  r = special.repeat(len(special))
  gen = torch.Generator().manual_seed(0)
  ref = torch.cat([torch.randn(4000, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(-6, 6, (4000,),
                                                                                                   generator=gen),
                   torch.zeros(8, dtype=torch.float64)]).to(dtype)
  allowed = ATOL + (torch.tensor(RTOL, dtype=dtype) * ref).abs()
  edge = ref + allowed
  sides = [edge, torch.nextafter(edge, torch.full_like(edge, float("inf"))),
           torch.nextafter(edge, torch.full_like(edge, -float("inf"))), ref - allowed, ref + 3 * allowed]
  return torch.cat([a] + sides), torch.cat([r] + [ref] * len(sides))


@pytest.fixture(scope="module")
def host_rule(tmp_path_factory):
  return host_library(tmp_path_factory, "rule", DEVICE_PRELUDE + closeness.RULE + _WRAP, "-O1")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_rule_is_torch_isclose_element_for_element(host_rule, dtype):
  out, ref = _tricky(dtype)
  bad = torch.zeros(out.numel(), dtype=torch.uint8)
  fn, scalar = ((host_rule.rule_f32, ctypes.c_float) if dtype == torch.float32 else
                (host_rule.rule_f64, ctypes.c_double))
  fn(ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(ref.data_ptr()), ctypes.c_long(out.numel()), scalar(ATOL),
     scalar(RTOL), ctypes.c_void_p(bad.data_ptr()))
  want = ~torch.isclose(out, ref, rtol=RTOL, atol=ATOL, equal_nan=True)
  assert 500 < int(want.sum()) < out.numel() - 500  # Both verdicts are well represented.
  assert torch.equal(bad.bool(), want), torch.nonzero(bad.bool() != want)[:5]


def test_count_bad_on_the_cpu_and_by_dtype():
  out, ref = _tricky(torch.float32)
  want = int((~torch.isclose(out, ref, rtol=RTOL, atol=ATOL, equal_nan=True)).sum())
  assert int(closeness.count_bad(out, ref, ATOL, RTOL)) == want
  assert int(closeness.count_bad(out.half(), ref.half(), 1e-2, 1e-2)) == int(
      (~torch.isclose(out.half().float(), ref.half().float(), rtol=1e-2, atol=1e-2, equal_nan=True)).sum())
  ints = torch.arange(10)
  assert int(closeness.count_bad(ints, ints, ATOL, RTOL)) == 0
  assert int(closeness.count_bad(ints + (ints % 3 == 0), ints, ATOL, RTOL)) == 4
  assert B.compare(out, ref, ATOL, RTOL)["bad"] == want and B.compare(ref, ref, ATOL, RTOL) is None


def test_the_kernels_compile_with_nvrtc():
  res = compile_mod.compile_cuda(closeness.SOURCE, "sm_90", cache_dir="")
  assert res.ok, res.log


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_count_bad_on_the_gpu_equals_torch(dtype):
  if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU")
  out, ref = _tricky(torch.float64 if dtype == torch.float64 else torch.float32)
  out, ref = out.to(dtype).cuda(), ref.to(dtype).cuda()
  wide = torch.float64 if dtype == torch.float64 else torch.float32
  want = int((~torch.isclose(out.to(wide), ref.to(wide), rtol=RTOL, atol=ATOL, equal_nan=True)).sum())
  assert int(closeness.count_bad(out, ref, ATOL, RTOL)) == want
  big = torch.randn(3_000_001, device="cuda", dtype=wide)
  noisy = big + torch.where(torch.rand_like(big) < 0.01, 1.0, 0.0)
  assert int(closeness.count_bad(noisy, big, ATOL, RTOL)) == int((noisy != big).sum())
