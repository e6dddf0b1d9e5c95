"""A keyed hash of tensor contents, for integrity checks the candidate cannot satisfy by keeping sums intact.

    h(t, key) = sum_i w_i * mix(i + key)  (mod 2^64)

over the tensor's little-endian 32-bit words w_i (a last partial word is zero-padded), with `mix` the splitmix64
finaliser. Every position has its own secret weight, so a permutation, a swap or any change whose effect cancels
in a plain or squared sum still changes the hash unless the change was chosen knowing the key (a host-only secret;
it reaches the GPU only as a kernel argument). On CUDA it is one bandwidth-bound pass (an evaluator-owned NVRTC
kernel, a warp reduction and one atomic per warp); on the CPU (the emulated worker) the same formula in torch ops.
Results stay on the device, so checks inside the timing loop need no synchronisation.
"""

from __future__ import annotations

import ctypes

import torch

from kevin_jax.kernels import owned

_C1, _C2, _C3 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
SOURCE = r"""
extern "C" __global__ void keyed_hash(const unsigned int* __restrict__ w, unsigned long long n,
                                      unsigned long long key, unsigned long long* out) {
  unsigned long long acc = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    unsigned long long z = (i + key) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    acc += z * (unsigned long long)w[i];
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}
"""
_MAX_BLOCKS = 4096
_WHAT = "the integrity hash kernel"


def _signed(v: int) -> int:
  v &= (1 << 64) - 1
  return v - (1 << 64) if v >= 1 << 63 else v


def _lsr(z: torch.Tensor, s: int) -> torch.Tensor:
  return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(i: torch.Tensor) -> torch.Tensor:
  z = i * _signed(_C1)
  z = (z ^ _lsr(z, 30)) * _signed(_C2)
  z = (z ^ _lsr(z, 27)) * _signed(_C3)
  return z ^ _lsr(z, 31)


def _words(t: torch.Tensor) -> torch.Tensor:
  """The tensor's bytes as 32-bit words (a copy only when the byte count is not a multiple of 4)."""
  b = t.detach().contiguous().reshape(-1).view(torch.uint8)
  if b.storage_offset() % 4:
    b = b.clone()
  if b.numel() % 4:
    b = torch.cat([b, torch.zeros(4 - b.numel() % 4, dtype=torch.uint8, device=b.device)])
  return b.view(torch.int32)


class KeyedHash:
  """`hasher(tensors, key)` -> int64 tensor of one hash per tensor, on the tensors' device (module docstring)."""

  def __init__(self, device: torch.device):
    self.device = device
    self._cuda = device.type == "cuda"
    if self._cuda:
      owned.function(SOURCE, "keyed_hash", device, _WHAT)  # Compiled and loaded now, not inside a budget.

  def __call__(self, tensors, key: int) -> torch.Tensor:
    tensors = list(tensors)
    out = torch.zeros(len(tensors), dtype=torch.int64, device=self.device)
    for j, t in enumerate(tensors):
      w = _words(t)
      if w.numel() == 0:
        continue
      if not self._cuda:
        idx = torch.arange(w.numel(), dtype=torch.int64, device=w.device) + _signed(key)
        out[j] = (_mix(idx) * (w.to(torch.int64) & 0xFFFFFFFF)).sum()
      else:
        owned.launch(SOURCE, hash_call(w, key, out, j), self.device, _MAX_BLOCKS, _WHAT)
    return out


def hash_call(w: torch.Tensor, key: int, out: torch.Tensor, j: int) -> owned.Call:
  """The keyed_hash launch adding the hash of the int32 words w under `key` into out[j] (int64)."""
  n = w.numel()
  return owned.Call("keyed_hash", n, [ctypes.c_uint64(w.data_ptr()), ctypes.c_uint64(n),
                                      ctypes.c_uint64(key & ((1 << 64) - 1)), ctypes.c_uint64(out.data_ptr() + 8 * j)])
