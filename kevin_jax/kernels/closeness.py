"""Counting the elements of an output that miss the reference: the rule of torch.isclose(equal_nan=True) in one pass.

    close(a, r) = a == r  or  (a, r both NaN)  or  (|a - r| finite and |a - r| <= atol + |rtol * r|)

evaluated in float32 (float64 for float64 outputs; fp16/bf16 are widened to float32 first, exactly), the way
torch evaluates it: every operation rounded on its own, the tolerances rounded to the working precision. On CUDA
it is one bandwidth-bound pass over both tensors (an evaluator-owned NVRTC kernel with explicitly rounded
arithmetic, NaN/Inf tested on the bits, a warp reduction and one atomic per warp) instead of torch.isclose's dozen
elementwise passes; elsewhere (the emulated worker) torch.isclose itself. Integer and bool outputs are compared
exactly. The count stays on the device, so the timing loop can check outputs without a synchronisation.
`count_bad_keyed` counts the same for float32 tensors sealed with keyed_draw.py's stream, unsealing each element
where it reads it (the unsealed values never reach memory).
"""

from __future__ import annotations

import ctypes

import torch

from kevin_jax.kernels import keyed_draw
from kevin_jax.kernels import owned

# The rule per element (also compiled for the host by tests/test_closeness.py, against torch.isclose).
RULE = r"""
__device__ __forceinline__ bool bad_f32(float a, float r, float atol, float rtol) {
  unsigned int ua = __float_as_uint(a) & 0x7fffffffu, ur = __float_as_uint(r) & 0x7fffffffu;
  if (a == r || (ua > 0x7f800000u && ur > 0x7f800000u)) return false;
  float actual = fabsf(__fsub_rn(a, r));
  float allowed = __fadd_rn(atol, fabsf(__fmul_rn(rtol, r)));
  bool finite = (__float_as_uint(actual) & 0x7f800000u) != 0x7f800000u;
  return !(finite && actual <= allowed);
}

__device__ __forceinline__ bool bad_f64(double a, double r, double atol, double rtol) {
  unsigned long long ua = __double_as_longlong(a) & 0x7fffffffffffffffULL;
  unsigned long long ur = __double_as_longlong(r) & 0x7fffffffffffffffULL;
  if (a == r || (ua > 0x7ff0000000000000ULL && ur > 0x7ff0000000000000ULL)) return false;
  double actual = fabs(__dsub_rn(a, r));
  double allowed = __dadd_rn(atol, fabs(__dmul_rn(rtol, r)));
  bool finite = (__double_as_longlong(actual) & 0x7ff0000000000000ULL) != 0x7ff0000000000000ULL;
  return !(finite && actual <= allowed);
}
"""
_SOURCE = RULE + r"""
__device__ __forceinline__ void add_count(unsigned long long bad, unsigned long long* count) {
  for (int o = 16; o > 0; o >>= 1) bad += __shfl_down_sync(0xffffffffu, bad, o);
  if ((threadIdx.x & 31) == 0 && bad) atomicAdd(count, bad);
}

extern "C" __global__ void count_bad_f32(const float* __restrict__ a, const float* __restrict__ r,
                                         unsigned long long n, float atol, float rtol, unsigned long long* count) {
  unsigned long long bad = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    bad += bad_f32(a[i], r[i], atol, rtol);
  add_count(bad, count);
}

extern "C" __global__ void count_bad_f64(const double* __restrict__ a, const double* __restrict__ r,
                                         unsigned long long n, double atol, double rtol, unsigned long long* count) {
  unsigned long long bad = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    bad += bad_f64(a[i], r[i], atol, rtol);
  add_count(bad, count);
}
"""
_SEALED = keyed_draw.HASH + r"""
// Elements 2w and 2w + 1 per step: their bytes are XORed with the low and the high half of the stream word h(w).
extern "C" __global__ void count_bad_sealed_f32(const unsigned int* __restrict__ a, const unsigned int* __restrict__ r,
                                                unsigned long long n, float atol, float rtol, int a_sealed,
                                                unsigned long long ka_a, unsigned long long kb_a,
                                                unsigned long long ka_r, unsigned long long kb_r,
                                                unsigned long long* count) {
  unsigned long long bad = 0;
  for (unsigned long long w = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; 2 * w < n;
       w += (unsigned long long)gridDim.x * blockDim.x) {
    unsigned long long ha = a_sealed ? kd_hash(w, ka_a, kb_a) : 0ULL, hr = kd_hash(w, ka_r, kb_r);
    for (int k = 0; k < 2 && 2 * w + k < n; ++k) {
      unsigned long long i = 2 * w + k;
      bad += bad_f32(__uint_as_float(a[i] ^ (unsigned int)(ha >> (32 * k))),
                     __uint_as_float(r[i] ^ (unsigned int)(hr >> (32 * k))), atol, rtol);
    }
  }
  add_count(bad, count);
}
"""
_MAX_BLOCKS = 4096
_FUNCTIONS = {torch.float32: "count_bad_f32", torch.float64: "count_bad_f64"}
SOURCE = _SOURCE + _SEALED
_WHAT = "the output comparison kernel"


def prepare(device: torch.device) -> None:
  """Compiles and loads the kernels for a CUDA device now (a GPU worker does it at start-up, not in a budget)."""
  owned.function(SOURCE, "count_bad_f32", device, _WHAT)


def plain_call(o: torch.Tensor, r: torch.Tensor, atol: float, rtol: float, count: torch.Tensor) -> owned.Call:
  """The count_bad_f32 / _f64 launch (by o's dtype) adding o's elements outside the tolerance of r to count."""
  scalar = ctypes.c_double if o.dtype == torch.float64 else ctypes.c_float
  return owned.Call(_FUNCTIONS[o.dtype], o.numel(),
                    [ctypes.c_uint64(o.data_ptr()), ctypes.c_uint64(r.data_ptr()), ctypes.c_uint64(o.numel()),
                     scalar(atol), scalar(rtol), ctypes.c_uint64(count.data_ptr())])


def sealed_call(out: torch.Tensor, out_keys: tuple[int, int] | None, ref: torch.Tensor, ref_keys: tuple[int, int],
                atol: float, rtol: float, count: torch.Tensor) -> owned.Call:
  """The count_bad_sealed_f32 launch (one thread per pair of elements, the stream word they share)."""
  n = out.numel()
  ka_a, kb_a = out_keys or (0, 0)
  return owned.Call("count_bad_sealed_f32", (n + 1) // 2,
                    [ctypes.c_uint64(out.data_ptr()), ctypes.c_uint64(ref.data_ptr()), ctypes.c_uint64(n),
                     ctypes.c_float(atol), ctypes.c_float(rtol), ctypes.c_int32(out_keys is not None),
                     ctypes.c_uint64(ka_a), ctypes.c_uint64(kb_a), ctypes.c_uint64(ref_keys[0]),
                     ctypes.c_uint64(ref_keys[1]), ctypes.c_uint64(count.data_ptr())])


def count_bad(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
  """Elements of `out` outside the tolerance of `ref` (same shape), as a 0-d int64 tensor on their device."""
  if not ref.is_floating_point():
    return (out != ref).sum()
  wide = torch.float64 if ref.dtype == torch.float64 else torch.float32
  o, r = out.to(wide).contiguous(), ref.to(wide).contiguous()
  if o.device.type != "cuda":
    return (~torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)).sum()
  count = torch.zeros((), dtype=torch.int64, device=o.device)
  if o.numel() == 0:
    return count
  owned.launch(SOURCE, plain_call(o, r, atol, rtol, count), o.device, _MAX_BLOCKS, _WHAT)
  return count


def count_bad_keyed(out: torch.Tensor, out_keys: tuple[int, int] | None, ref: torch.Tensor,
                    ref_keys: tuple[int, int], atol: float, rtol: float) -> torch.Tensor:
  """`count_bad` of contiguous CUDA float32 tensors sealed with keyed_draw's stream of the given (ka, kb) keys
  (out_keys None: out is not sealed), as a 0-d int64 tensor on their device."""
  count = torch.zeros((), dtype=torch.int64, device=out.device)
  n = out.numel()
  if n == 0:
    return count
  owned.launch(SOURCE, sealed_call(out, out_keys, ref, ref_keys, atol, rtol, count), out.device, _MAX_BLOCKS, _WHAT)
  return count
