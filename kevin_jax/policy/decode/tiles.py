"""Pieces shared by the decode step's Pallas kernels (mlp, qkv, oproj, attention): block sizes, the loops over the
reduction dimension with fp32 accumulators, and the device's SM count.

Inside a kernel, a "loader" is a function of a reduction slice `ks` (a pl.ds) that loads the weight block
[ks, columns] of one output block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

EXACT = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)  # fp32 weights: IEEE fp32 dots, not TF32.
NOMINAL_SM_COUNT = 132  # an H100's / H200's SMs: the split counts of devices that report none (the CPU: interpret)


def sm_count(device: jax.Device | None = None) -> int:
  """The streaming multiprocessors of `device` (default: this process' first device); NOMINAL_SM_COUNT where the
  device reports none."""
  device = device or jax.devices()[0]
  return int(getattr(device, "core_count", 0) or NOMINAL_SM_COUNT)


def compute_capability(device: jax.Device | None = None) -> float:
  """The device's CUDA compute capability (e.g. 9.0), or 0.0 where it reports none."""
  cap = getattr(device or jax.devices()[0], "compute_capability", None)
  try:
    return float(cap) if cap is not None else 0.0
  except ValueError:
    return 0.0


def pick_block(size: int, block: int) -> int:
  """The largest power of two <= block dividing `size`, or 0 if that is under 16 (matmul tiles)."""
  b = min(block, size & -size)
  return b if b >= 16 else 0


def row_tiles(rows: int, block_m: int) -> tuple[int, int]:
  """(rows padded to a power of two >= 16, the row block): a kernel's grid covers the padded rows in blocks of
  min(padded, block_m)."""
  padded = max(16, 1 << (rows - 1).bit_length())
  return padded, min(padded, block_m)


def pad_rows(x: jax.Array, rows: int) -> jax.Array:
  """x [B, ...] with zero rows appended up to `rows` (row_tiles' padded count)."""
  return jnp.pad(x, ((0, rows - x.shape[0]),) + ((0, 0),) * (x.ndim - 1))


def dot_loop(a_ref, w_ref, block_k: int) -> jax.Array:
  """a @ w over the whole reduction dimension of the refs a [M, K] and w [K, N], block_k at a time: fp32 [M, N]."""
  m, k = a_ref.shape
  exact = EXACT if w_ref.dtype == jnp.float32 else None

  def body(t, acc):
    ks = pl.ds(pl.multiple_of(t * block_k, block_k), block_k)
    return acc + jax.lax.dot(a_ref[:, ks], w_ref[ks, :], precision=exact, preferred_element_type=jnp.float32)

  return jax.lax.fori_loop(0, k // block_k, body, jnp.zeros((m, w_ref.shape[1]), jnp.float32))


def check_norm_args(rows: int, inv_rms_B: jax.Array | None, rms_eps: float | None) -> bool:
  """A decode kernel's RMSNorm arguments (DecodeConfig.norm): each row's fp32 1/rms [rows], or the eps for
  the kernel to compute it, or neither (x comes normed). Returns whether inv_rms_B is given (a kernel input)."""
  if inv_rms_B is None:
    return False
  if inv_rms_B.shape != (rows,):
    raise ValueError(f"inv_rms_B must be [B={rows}], got {inv_rms_B.shape}")
  if rms_eps is not None:
    raise ValueError("give inv_rms_B or rms_eps, not both")
  return True


def dot_pair(x_ref, load_w1, load_w2, cols: int, block_d: int, inv_rms_ref=None, rms_eps: float | None = None):
  """(x @ W1, x @ W2) in fp32 [M, cols] for x [M, D] in a ref, one pass over D in block_d slices. With inv_rms_ref
  (fp32 [M]) or rms_eps, x is a raw residual whose RMSNorm scale the caller folded into W1 and W2 (step.fold):
  both products are multiplied by each row's 1/rms, read from the ref or computed here as rsqrt(mean(x^2) +
  rms_eps) from the rows' sums of squares.

  The x slice goes to the dots as it is loaded: multiplying it by an RMSNorm scale first (r * ((x * scale) @ W))
  doubles a kernel's time (BENCHMARKS.md Sampler). The sums of squares come from the Gram matrix x x^T, one more
  dot of the slice as loaded, whose diagonal they are, so the slice stays a dot operand only: squaring the loaded
  slice elementwise in the loop gave wrong sums on the GPU (relative error 0.12, cause unknown), the Gram version
  passes the GPU tests (tests/test_policy_decode_norm.py).
  """
  m, d = x_ref.shape
  sumsq = rms_eps is not None
  # Loaded before the loop: a load issued after it waits its whole latency once the loop is done.
  r = inv_rms_ref[...] if inv_rms_ref is not None else None

  def body(t, carry):
    a1, a2, g = carry
    ks = pl.ds(pl.multiple_of(t * block_d, block_d), block_d)
    x = x_ref[:, ks]
    w1 = load_w1(ks)
    exact = EXACT if w1.dtype == jnp.float32 else None
    a1 += jax.lax.dot(x, w1, precision=exact, preferred_element_type=jnp.float32)
    a2 += jax.lax.dot(x, load_w2(ks), precision=exact, preferred_element_type=jnp.float32)
    if sumsq:
      g += jax.lax.dot_general(x, x, (((1,), (1,)), ((), ())), precision=exact, preferred_element_type=jnp.float32)
    return a1, a2, g

  zeros = jnp.zeros((m, cols), jnp.float32)
  gram = jnp.zeros((m, m) if sumsq else (1, 1), jnp.float32)
  a1, a2, gram = jax.lax.fori_loop(0, d // block_d, body, (zeros, zeros, gram))
  if r is None:
    if not sumsq:
      return a1, a2
    eye = jnp.arange(m)[:, None] == jnp.arange(m)[None, :]
    r = jax.lax.rsqrt(jnp.sum(jnp.where(eye, gram, 0.0), axis=1) / d + rms_eps)
  return a1 * r[:, None], a2 * r[:, None]
