"""The residual add after a decode step's MLP and the next RMSNorm as one Pallas kernel (ModelConfig.decode_add_norm).

In a decode step XLA ends each layer with two small kernels: a fusion that sums the down projection's fp32 partials
(decode_mlp.down_partials) into the residual stream, h + mlp, and the next layer's input RMSNorm (115 KB at the 0.5B
shape, B = 64: launch and latency). Here one program per `block_m` rows does both: for each `block_d` slice of D it
sums the partials, adds the residual and stores the new h, keeping the slice and the rows' sums of squares in
registers; then it writes norm(h) = h / rms(h) * scale. The model passes norm(h) to the next layer (or as the final
norm's output after the last), whose attention front then skips its own norm.

Numbers: the same roundings as the model's XLA path - the partials' sum rounded to h's dtype (down_proj's
output), h + that sum rounded, then the norm in fp32 ((h * 1/rms) * scale, rounded once) - so in fp32 the two agree
to fp32 rounding, and in bf16 to one bf16 rounding where the fp32 sums' order differs.
tests/test_policy_decode_add_norm.py compares with the jnp expression in interpret mode and checks the Triton
lowering on the CPU; its GPU test runs the Triton kernel.

Requirements (`supported`): D a multiple of 16. The norm is computed in fp32, so the model uses the kernel only
with ModelConfig.fp32_upcast (as its RMSNorm then does). Opt-in (ModelConfig.decode_add_norm 'xla' by default):
-4.4 % decode tokens/s at the 0.5B shape, B = 64 (BENCHMARKS.md Sampler).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from kevin_jax.policy.decode_tiles import pick_block

Array = jax.Array
BLOCK_D = 128  # D per slice at most (halved down to a divisor of D, at least 16).
BLOCK_M = 1  # Rows per program at most: B = 64 gives 64 programs, each reading its rows' partials.


def supported(hidden: int) -> bool:
  """Whether the kernel takes D = hidden: a multiple of 16."""
  return pick_block(hidden, BLOCK_D) > 0


def _kernel(h_ref, y_ref, s_ref, h_out_ref, x_out_ref, *, block_d: int, eps: float):
  splits, _, d = y_ref.shape
  dt = h_out_ref.dtype
  f32 = jnp.float32
  h_slices, ss = [], None
  for t in range(d // block_d):  # unrolled: every load is independent of the sums before it
    ks = pl.ds(t * block_d, block_d)
    y = y_ref[0, :, ks].astype(f32)
    for s in range(1, splits):
      y = y + y_ref[s, :, ks].astype(f32)
    h = (h_ref[:, ks].astype(f32) + y.astype(dt).astype(f32)).astype(dt)
    h_out_ref[:, ks] = h
    hf = h.astype(f32)
    h_slices.append(hf)
    sq = jnp.sum(hf * hf, axis=1)
    ss = sq if ss is None else ss + sq
  r = jax.lax.rsqrt(ss / d + eps)[:, None]
  for t, hf in enumerate(h_slices):
    ks = pl.ds(t * block_d, block_d)
    x_out_ref[:, ks] = (hf * r * s_ref[ks].astype(f32)[None, :]).astype(x_out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("eps", "block_m", "block_d", "num_warps", "interpret"))
def add_norm(h_BxD: Array, y_SxRxD: Array, scale_D: Array, eps: float, *, block_m: int = BLOCK_M,
             block_d: int = BLOCK_D, num_warps: int = 4, interpret: bool = False) -> tuple[Array, Array]:
  """(h + y, RMSNorm(h + y) * scale), both [B, D] in h's dtype, where y = sum over S of y_SxRxD[:, :B]
  (fp32 partials of the MLP's output, rounded to h's dtype after the sum, as decode_mlp.down_proj returns it; or
  S = 1 and the MLP's output itself). Rows past B of y (a kernel's row padding) are not read."""
  b, d = h_BxD.shape
  splits, rows = y_SxRxD.shape[:2]
  if y_SxRxD.shape[2] != d or rows < b:
    raise ValueError(f"y must be [S, R >= B={b}, D={d}], got {y_SxRxD.shape}")
  if scale_D.shape != (d,):
    raise ValueError(f"the norm scale must be [D={d}], got {scale_D.shape}")
  block_d = pick_block(d, block_d)
  if not block_d:
    raise ValueError(f"add_norm needs D ({d}) a multiple of 16")
  bm = 1  # rows per program: the largest power of two <= block_m dividing B
  while bm * 2 <= block_m and b % (bm * 2) == 0:
    bm *= 2
  out = jax.ShapeDtypeStruct((b, d), h_BxD.dtype)
  return tuple(pl.pallas_call(
      functools.partial(_kernel, block_d=block_d, eps=float(eps)),
      grid=(b // bm,),
      in_specs=[
          pl.BlockSpec((bm, d), lambda i: (i, 0)),
          pl.BlockSpec((splits, bm, d), lambda i: (0, i, 0)),
          pl.BlockSpec((d,), lambda i: (0,)),
      ],
      out_specs=[pl.BlockSpec((bm, d), lambda i: (i, 0)), pl.BlockSpec((bm, d), lambda i: (i, 0))],
      out_shape=[out, out],
      compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret,
      name="kevin_decode_add_norm",
  )(h_BxD, y_SxRxD, scale_D))
