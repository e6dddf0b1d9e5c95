"""A keyed counter-based generator: fresh timed inputs (one pass writes the candidate's and the reference's copy)
and the seal streams of buffers.py.

For a tensor drawn by torch.randn (N(0, 1)) or torch.rand (U[0, 1)) in float32, float16 or bfloat16, element i of
the draw with a 64-bit run key is a function of (key, tensor index j, i) alone:

  h(p)      = mix(mix(p * G + ka) ^ kb)           pair p = i // 2; (ka, kb) = `subkeys(key, j)`; mix = splitmix64's
                                                 finaliser; two rounds, the key in both, so no two keys give
                                                 shifted or permuted copies of one stream
  a, b      = bits 40..63 and 8..31 of h(p)       the top 24 bits of each 32-bit half
  rand      x[2p] = a 2^-24, x[2p+1] = b 2^-24    U[0, 1) on the 2^-24 grid
  randn     Box-Muller on (u1, u2) = ((a + 1) 2^-24, b 2^-24): r = sqrt(-2 ln u1),
            x[2p] = r cos(2 pi u2), x[2p+1] = r sin(2 pi u2)   (|x| <= 5.77: u1 >= 2^-24)

in float32 with every operation rounded on its own (no FMA contraction): ln by exponent and mantissa with an atanh
series, sin/cos by exact quadrant reduction of the 24-bit b and Taylor polynomials on [-pi/4, pi/4], IEEE division
and square root; constants are the float32 values below, shared by both implementations. No subnormal occurs in
between. float16 / bfloat16 round the float32 value to nearest even (randn) or toward zero (rand, which keeps it
below 1). The same distribution as the task's factory, not torch's bytes: each run's draw is independent of every
other (a fresh secret key), and nothing a launch saw before predicts it.

On CUDA it is one evaluator-owned NVRTC kernel writing both copies with vector stores (float32: 4 elements per
16-byte store; meant to be bandwidth-bound: two hashes and two Box-Mullers per 32 bytes stored); elsewhere (the
emulated worker) `values`, the numpy reference of the same formula, bit for bit (tests/test_keyed_draw.py pins
both).

The seal stream of a 64-bit seed is the byte stream h(0), h(1), ... (little-endian; (ka, kb) = subkeys(seed, 0)):
byte k of a tensor is XORed with byte k mod 8 of h(k div 8), so a kernel that knows the seed (closeness.py) can
unseal any element where it reads it, and no copy of the stream ever exists on the GPU (`xor_stream`). The hash is
not cryptographic (nor was torch's Philox stream before it): a candidate that found a sealed buffer and guessed some
of its plain bytes would still have to recover a secret 64-bit seed from them to unseal the rest.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from kevin_jax.kernels import owned

FACTORIES = ("randn", "rand")
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_M64 = (1 << 64) - 1
_G, _C2, _C3 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

_F = np.float32
_TWO_M24 = _F(2.0**-24)
_SQRT2 = _F(np.sqrt(2.0))
_LN2 = _F(np.log(2.0))
_PI_2_23 = _F(np.pi / 2**23)  # Quarter turn / 2^22: the angle of one step of the 22-bit remainder.
_LOG = [_F(1 / 9), _F(1 / 7), _F(1 / 5), _F(1 / 3)]  # atanh series, highest power first.
_SIN = [_F(1 / 362880), _F(-1 / 5040), _F(1 / 120), _F(-1 / 6)]
_COS = [_F(-1 / 3628800), _F(1 / 40320), _F(-1 / 720), _F(1 / 24), _F(-0.5)]


def _mix(z: int) -> int:
  z &= _M64
  z = ((z ^ (z >> 30)) * _C2) & _M64
  z = ((z ^ (z >> 27)) * _C3) & _M64
  return z ^ (z >> 31)


def subkeys(key: int, j: int) -> tuple[int, int]:
  """The (ka, kb) of tensor j under run key `key` (host only)."""
  return _mix(key + (2 * j + 1) * _G), _mix(key + (2 * j + 2) * _G)


# --- the numpy reference ----------------------------------------------------------------------------------------


def _mix_np(z: np.ndarray) -> np.ndarray:
  z = (z ^ (z >> np.uint64(30))) * np.uint64(_C2)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(_C3)
  return z ^ (z >> np.uint64(31))


def hashes(first: int, count: int, ka: int, kb: int) -> np.ndarray:
  """h(first) .. h(first + count - 1) (module docstring), uint64."""
  p = np.arange(first, first + count, dtype=np.uint64)
  with np.errstate(over="ignore"):
    return _mix_np(_mix_np(p * np.uint64(_G) + np.uint64(ka)) ^ np.uint64(kb))


def stream_bytes(nbytes: int, ka: int, kb: int) -> torch.Tensor:
  """The keyed byte stream (byte k = byte k mod 8 of h(k div 8), little-endian) as a CPU uint8 tensor."""
  h = hashes(0, -(-nbytes // 8), ka, kb).astype("<u8")
  return torch.from_numpy(h.view(np.uint8)[:nbytes])


def pair_words(first: int, count: int, ka: int, kb: int) -> tuple[np.ndarray, np.ndarray]:
  """(a, b) of pairs first .. first + count - 1, as uint32 arrays of 24-bit values."""
  h = hashes(first, count, ka, kb)
  return (h >> np.uint64(40)).astype(np.uint32), ((h >> np.uint64(8)) & np.uint64(0xFFFFFF)).astype(np.uint32)


def _horner(x2: np.ndarray, coeffs) -> np.ndarray:
  acc = np.full_like(x2, coeffs[0])
  for c in coeffs[1:]:
    acc = c + x2 * acc
  return acc


def box_muller(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(x[2p], x[2p+1]) of randn from the pair words (module docstring), float32."""
  u1 = (a + np.uint32(1)).astype(_F) * _TWO_M24
  bits = u1.view(np.uint32)
  e = (bits >> np.uint32(23)).astype(np.int32) - 127
  m = ((bits & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)).view(_F)
  big = m > _SQRT2
  m = np.where(big, m * _F(0.5), m)
  e = e + big
  s = (m - _F(1)) / (m + _F(1))
  ln_u1 = e.astype(_F) * _LN2 + (_F(2) * s) * (_F(1) + (s * s) * _horner(s * s, _LOG))
  r = np.sqrt(_F(-2) * ln_u1)
  q = b >> np.uint32(22)
  rem = (b & np.uint32(0x3FFFFF)).astype(np.int32)
  up = rem >= (1 << 21)
  rem = np.where(up, rem - (1 << 22), rem)
  q = (q + up) & np.uint32(3)
  x = rem.astype(_F) * _PI_2_23
  x2 = x * x
  sin_x = x + (x * x2) * _horner(x2, _SIN)
  cos_x = _F(1) + x2 * _horner(x2, _COS)
  cos_t = np.select([q == 0, q == 1, q == 2], [cos_x, -sin_x, -cos_x], sin_x)
  sin_t = np.select([q == 0, q == 1, q == 2], [sin_x, cos_x, -sin_x], -cos_x)
  return r * cos_t, r * sin_t


def values(factory: str, n: int, ka: int, kb: int) -> np.ndarray:
  """The n float32 values of a draw (before any narrowing to float16 / bfloat16)."""
  a, b = pair_words(0, (n + 1) // 2, ka, kb)
  if factory == "rand":
    lo, hi = a.astype(_F) * _TWO_M24, b.astype(_F) * _TWO_M24
  elif factory == "randn":
    lo, hi = box_muller(a, b)
  else:
    raise ValueError(f"unknown factory {factory!r} (known: {', '.join(FACTORIES)})")
  out = np.empty(2 * a.size, dtype=_F)
  out[0::2], out[1::2] = lo, hi
  return out[:n]


def encode(v: np.ndarray, factory: str, dtype: torch.dtype) -> torch.Tensor:
  """float32 values as a CPU tensor of `dtype`: nearest even for randn, toward zero for rand (module docstring)."""
  if dtype == torch.float32:
    return torch.from_numpy(v)
  if dtype == torch.float16:
    h = v.astype(np.float16)
    if factory == "rand":  # Non-negative: round toward zero is one step down wherever nearest rounded up.
      up = h.astype(_F) > v
      h[up] = np.nextafter(h[up], np.float16(0))
    return torch.from_numpy(h)
  if dtype == torch.bfloat16:
    bits = v.view(np.uint32)
    if factory == "randn":
      bits = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return torch.from_numpy((bits >> np.uint32(16)).astype(np.uint16).view(np.int16)).view(torch.bfloat16)
  raise ValueError(f"keyed draws cover {', '.join(str(d) for d in DTYPES)}, not {dtype}")


# --- the CUDA kernel --------------------------------------------------------------------------------------------


def _f(x) -> str:
  return f"__uint_as_float({int(np.asarray(x, dtype=_F).view(np.uint32))}u)"


def _horner_cuda(x2: str, coeffs) -> str:
  acc = _f(coeffs[0])
  for c in coeffs[1:]:
    acc = f"__fadd_rn({_f(c)}, __fmul_rn({x2}, {acc}))"
  return acc


# The keyed hash h (also in closeness.py's comparison of sealed tensors).
HASH = f"""
__device__ __forceinline__ unsigned long long kd_mix(unsigned long long z) {{
  z = (z ^ (z >> 30)) * {_C2}ULL;
  z = (z ^ (z >> 27)) * {_C3}ULL;
  return z ^ (z >> 31);
}}

__device__ __forceinline__ unsigned long long kd_hash(unsigned long long p, unsigned long long ka,
                                                      unsigned long long kb) {{
  return kd_mix(kd_mix(p * {_G}ULL + ka) ^ kb);
}}
"""
# The value formula (also compiled for the host by tests/test_keyed_draw.py, against `values`).
FORMULA = HASH + f"""
__device__ __forceinline__ void kd_pair(unsigned long long p, unsigned long long ka, unsigned long long kb,
                                        int normal, float* lo, float* hi) {{
  unsigned long long h = kd_hash(p, ka, kb);
  unsigned int a = (unsigned int)(h >> 40), b = (unsigned int)(h >> 8) & 0xFFFFFFu;
  if (!normal) {{
    *lo = __fmul_rn((float)a, {_f(_TWO_M24)});
    *hi = __fmul_rn((float)b, {_f(_TWO_M24)});
    return;
  }}
  float u1 = __fmul_rn((float)(a + 1u), {_f(_TWO_M24)});
  unsigned int bits = __float_as_uint(u1);
  int e = (int)(bits >> 23) - 127;
  float m = __uint_as_float((bits & 0x7FFFFFu) | 0x3F800000u);
  if (m > {_f(_SQRT2)}) {{ m = __fmul_rn(m, 0.5f); e += 1; }}
  float s = __fdiv_rn(__fsub_rn(m, 1.0f), __fadd_rn(m, 1.0f));
  float s2 = __fmul_rn(s, s);
  float ln_m = __fmul_rn(__fmul_rn(2.0f, s), __fadd_rn(1.0f, __fmul_rn(s2, {_horner_cuda("s2", _LOG)})));
  float ln_u1 = __fadd_rn(__fmul_rn((float)e, {_f(_LN2)}), ln_m);
  float r = __fsqrt_rn(__fmul_rn(-2.0f, ln_u1));
  unsigned int q = b >> 22;
  int rem = (int)(b & 0x3FFFFFu);
  if (rem >= (1 << 21)) {{ rem -= 1 << 22; q += 1u; }}
  q &= 3u;
  float x = __fmul_rn((float)rem, {_f(_PI_2_23)});
  float x2 = __fmul_rn(x, x);
  float sin_x = __fadd_rn(x, __fmul_rn(__fmul_rn(x, x2), {_horner_cuda("x2", _SIN)}));
  float cos_x = __fadd_rn(1.0f, __fmul_rn(x2, {_horner_cuda("x2", _COS)}));
  float cos_t = q == 0u ? cos_x : q == 1u ? -sin_x : q == 2u ? -cos_x : sin_x;
  float sin_t = q == 0u ? sin_x : q == 1u ? cos_x : q == 2u ? -sin_x : -cos_x;
  *lo = __fmul_rn(r, cos_t);
  *hi = __fmul_rn(r, sin_t);
}}
"""
SOURCE = FORMULA + r"""
__device__ __forceinline__ unsigned int kd_narrow(float v, int dtype, int toward_zero) {
  unsigned short h;
  if (dtype == 1) {
    if (toward_zero) asm("cvt.rz.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    else asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
  }
  unsigned int b = __float_as_uint(v);
  return (toward_zero ? b : b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}

// Element quad q (pairs 2q, 2q + 1) per thread; x and y 16-byte aligned (float32) or 8-byte (16-bit types).
extern "C" __global__ void keyed_draw(void* x, void* y, unsigned long long n, unsigned long long ka,
                                      unsigned long long kb, int normal, int dtype) {
  unsigned long long quads = (n + 3) / 4;
  for (unsigned long long q = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; q < quads;
       q += (unsigned long long)gridDim.x * blockDim.x) {
    float v[4];
    kd_pair(2 * q, ka, kb, normal, &v[0], &v[1]);
    kd_pair(2 * q + 1, ka, kb, normal, &v[2], &v[3]);
    unsigned long long i = 4 * q;
    if (dtype == 0) {
      if (i + 4 <= n) {
        float4 f = make_float4(v[0], v[1], v[2], v[3]);
        ((float4*)x)[q] = f;
        ((float4*)y)[q] = f;
      } else {
        for (int k = 0; i + k < n; ++k) { ((float*)x)[i + k] = v[k]; ((float*)y)[i + k] = v[k]; }
      }
    } else {
      unsigned int h[4];
      for (int k = 0; k < 4; ++k) h[k] = kd_narrow(v[k], dtype, !normal);
      if (i + 4 <= n) {
        uint2 w = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
        ((uint2*)x)[q] = w;
        ((uint2*)y)[q] = w;
      } else {
        for (int k = 0; i + k < n; ++k) {
          ((unsigned short*)x)[i + k] = (unsigned short)h[k];
          ((unsigned short*)y)[i + k] = (unsigned short)h[k];
        }
      }
    }
  }
}
// dst = src XOR the keyed byte stream (`stream_bytes`): 8-byte words where both are 8-byte aligned (`words`), else
// bytes. dst may be src.
extern "C" __global__ void keyed_xor(const unsigned char* src, unsigned char* dst, unsigned long long nbytes,
                                     unsigned long long ka, unsigned long long kb, int words) {
  unsigned long long nw = words ? nbytes / 8 : 0, start = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long w = start; w < nw; w += stride)
    ((unsigned long long*)dst)[w] = ((const unsigned long long*)src)[w] ^ kd_hash(w, ka, kb);
  for (unsigned long long k = 8 * nw + start; k < nbytes; k += stride)
    dst[k] = src[k] ^ (unsigned char)(kd_hash(k >> 3, ka, kb) >> (8 * (k & 7)));
}
"""
_MAX_BLOCKS = 8192
_WHAT = "the keyed draw kernels"


def prepare(device: torch.device) -> None:
  """Compiles and loads the kernels for a CUDA device now (a GPU worker does it at start-up, not in a budget)."""
  owned.function(SOURCE, "keyed_draw", device, _WHAT)


def draw_call(x: torch.Tensor, y: torch.Tensor, factory: str, ka: int, kb: int) -> owned.Call:
  """The keyed_draw launch writing the draw of (ka, kb) into x and y (one thread per element quad)."""
  n = x.numel()
  return owned.Call("keyed_draw", (n + 3) // 4,
                    [ctypes.c_uint64(x.data_ptr()), ctypes.c_uint64(y.data_ptr()), ctypes.c_uint64(n),
                     ctypes.c_uint64(ka), ctypes.c_uint64(kb), ctypes.c_int32(factory == "randn"),
                     ctypes.c_int32(DTYPES[x.dtype])])


def xor_call(src: torch.Tensor, dst: torch.Tensor, ka: int, kb: int) -> owned.Call:
  """The keyed_xor launch: 8-byte words where both views are 8-byte aligned (one thread per word), else bytes."""
  n = dst.numel()
  words = src.data_ptr() % 8 == 0 and dst.data_ptr() % 8 == 0
  return owned.Call("keyed_xor", -(-n // 8) if words else n,
                    [ctypes.c_uint64(src.data_ptr()), ctypes.c_uint64(dst.data_ptr()), ctypes.c_uint64(n),
                     ctypes.c_uint64(ka), ctypes.c_uint64(kb), ctypes.c_int32(int(words))])


def supported(factory: str, dtype: torch.dtype) -> bool:
  return factory in FACTORIES and dtype in DTYPES


def write(plan, key: int, pairs) -> None:
  """Tensor j's draw under `key` (factory plan[j]) into both tensors of pairs[j] (contiguous, same shape and dtype).

  On CUDA queued on the current stream (no synchronisation); on the CPU computed by `values`.
  """
  for j, (factory, (x, y)) in enumerate(zip(plan, pairs)):
    if not supported(factory, x.dtype) or x.shape != y.shape or x.dtype != y.dtype:
      raise ValueError(f"tensor {j}: no keyed draw of {factory} into {x.dtype} {tuple(x.shape)} / {y.dtype} "
                       f"{tuple(y.shape)}")
    if not (x.is_contiguous() and y.is_contiguous()):
      raise ValueError(f"tensor {j}: keyed draws write contiguous tensors")
    n = x.numel()
    if n == 0:
      continue
    ka, kb = subkeys(key, j)
    if x.device.type != "cuda":
      t = encode(values(factory, n, ka, kb), factory, x.dtype).view(x.shape)
      x.copy_(t)
      y.copy_(t)
      continue
    align = 16 if x.dtype == torch.float32 else 8
    if x.data_ptr() % align or y.data_ptr() % align:
      raise ValueError(f"tensor {j}: keyed draws need {align}-byte aligned tensors")
    owned.launch(SOURCE, draw_call(x, y, factory, ka, kb), x.device, _MAX_BLOCKS, _WHAT)


def xor_stream(src: torch.Tensor, dst: torch.Tensor, ka: int, kb: int) -> None:
  """dst = src XOR the keyed byte stream of (ka, kb) (uint8 views of equal length on one device; dst may be src).

  On CUDA one pass with no copy of the stream anywhere; on the CPU the stream is zero-filled once used.
  """
  n = dst.numel()
  if n == 0:
    return
  if dst.device.type != "cuda":
    stream = stream_bytes(n, ka, kb)
    torch.bitwise_xor(src, stream, out=dst)
    stream.zero_()
    return
  owned.launch(SOURCE, xor_call(src, dst, ka, kb), dst.device, _MAX_BLOCKS, _WHAT)
