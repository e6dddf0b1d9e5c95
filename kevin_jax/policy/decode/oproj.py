"""The attention's output projection and the residual add of a decode step as one Pallas kernel:
h + o @ W_o ([B, N*H] x [N*H, D]) in h's dtype (DecodeConfig.out).

In a decode step XLA runs the o projection as a GEMM split along N*H into fp32 partials, then one Triton fusion
that sums them, adds the residual and computes the post-attention RMSNorm without storing the sum; the residual
add after the MLP recomputes that sum. Here program (i, j) owns rows [i*block_m, ...) and columns [j*block_n, ...)
of the output: it loops over N*H in `block_k` slices with an fp32 accumulator, adds the residual (loaded before the
loop) and writes h + o @ W_o once. The post-attention RMSNorm is not here: XLA's fusion applies it, or, with
DecodeConfig.norm 'fold' or 'inside', the SwiGLU kernel that reads this output.

With `groups` the kernel takes decode_attention's padded output [B, K, G_pad, H] as it is (one attention split:
decode_attention's `padded`) and loops over the real heads one H-wide slice at a time, so no XLA slice of the
attention's output runs before it.

Numbers: fp32 accumulation and residual add, one rounding (XLA's path rounds o @ W_o to the compute dtype before
the add). tests/test_policy_decode_oproj.py compares with a float64 reference in interpret mode (fp32) and checks
the Triton lowering on the CPU; its GPU test compares on the GPU.

DecodeConfig.out 'auto' runs the kernel only where the q/k/v and SwiGLU kernels apply the norms inside: then
both norm fusions of a layer go (+1.9 % decode tokens/s at the 0.5B shape, B = 64, experiments/sampler_kernels);
with XLA's norms the kernel made the step slower (BENCHMARKS.md Sampler). Its time is mostly a fixed cost per
kernel (longer loops are slower; more programs, in 32- or 16-row blocks, were no faster), so BLOCK_M is 64.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from kevin_jax.policy.decode import tiles as decode_tiles
from kevin_jax.policy.decode.tiles import pick_block

Array = jax.Array
BLOCK_N = 16  # Output columns per program at most: D = 896 gives 56 programs (the GEMM reads 1.6 MB).
BLOCK_K = 128  # N*H per loop iteration at most.
BLOCK_M = 64  # Rows per program at most.
MAX_ROWS = 64  # 'auto' uses the kernel up to this batch (each row block re-reads the weights).


def supported(inner: int, hidden: int) -> bool:
  """Whether the kernel takes N*H = inner and D = hidden: both multiples of 16."""
  return pick_block(inner, BLOCK_K) > 0 and pick_block(hidden, BLOCK_N) > 0


def _kernel(o_ref, w_ref, h_ref, out_ref, *, block_k: int, groups: int, padded: int, head_dim: int):
  """groups > 0: o holds `padded` rows per KV head of head_dim each, the first `groups` real; the loop takes one
  real head per iteration, skipping the padding. The residual is loaded before the loop, so that its latency
  overlaps the loop's instead of following it."""
  h = h_ref[...].astype(jnp.float32)
  if not groups:
    acc = decode_tiles.dot_loop(o_ref, w_ref, block_k)
  else:
    exact = decode_tiles.EXACT if w_ref.dtype == jnp.float32 else None

    def body(t, acc):
      row = jax.lax.div(t, groups) * padded + jax.lax.rem(t, groups)  # head t's row in o's [K, padded] layout
      xs = o_ref[:, pl.ds(pl.multiple_of(row * head_dim, head_dim), head_dim)]
      ws = w_ref[pl.ds(pl.multiple_of(t * head_dim, head_dim), head_dim), :]
      return acc + jax.lax.dot(xs, ws, precision=exact, preferred_element_type=jnp.float32)

    heads = w_ref.shape[0] // head_dim
    acc = jax.lax.fori_loop(0, heads, body, jnp.zeros((o_ref.shape[0], w_ref.shape[1]), jnp.float32))
  out_ref[...] = (h + acc).astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("groups", "block_n", "block_k", "block_m", "num_warps", "num_stages",
                                             "interpret"))
def out_proj_residual(o_BxNxH: Array, w_o_NxHxD: Array, h_BxD: Array, *, groups: int = 0, block_n: int = BLOCK_N,
                      block_k: int = BLOCK_K, block_m: int = BLOCK_M, num_warps: int = 4, num_stages: int = 3,
                      interpret: bool = False) -> Array:
  """h + o @ w_o: o [B, N, H] (the attention's heads), w_o [N, H, D] as the model stores it, h [B, D]; returns
  [B, D] in h's dtype (fp32 accumulation and add, one rounding).

  groups > 0: o is decode_attention's padded layout [B, K, G_pad, H] with the groups = N / K real heads of each
  KV head first; the kernel reads only those (no slice of o before it).
  """
  if groups:
    b, kh, padded, hd = o_BxNxH.shape
    n = kh * groups
    if padded < groups:
      raise ValueError(f"o holds {padded} rows per KV head, fewer than groups={groups}")
  else:
    b, n, hd = o_BxNxH.shape
    padded = 0
  d = w_o_NxHxD.shape[2]
  if w_o_NxHxD.shape[:2] != (n, hd):
    raise ValueError(f"w_o must be [N={n}, H={hd}, D], got {w_o_NxHxD.shape}")
  if h_BxD.shape != (b, d):
    raise ValueError(f"the residual must be [B={b}, D={d}], got {h_BxD.shape}")
  inner = n * hd
  block_k, block_n = pick_block(inner, block_k), pick_block(d, block_n)
  if not (block_k and block_n) or (groups and hd % 16):
    raise ValueError(f"out_proj_residual needs N*H ({inner}), D ({d}) and with groups H ({hd}) multiples of 16")
  mp, bm = decode_tiles.row_tiles(b, block_m)
  width = o_BxNxH.size // b  # o's columns: N*H, or K*G_pad*H with groups
  o = decode_tiles.pad_rows(o_BxNxH.reshape(b, width).astype(w_o_NxHxD.dtype), mp)
  out = pl.pallas_call(
      functools.partial(_kernel, block_k=block_k, groups=groups, padded=padded, head_dim=hd),
      grid=(mp // bm, d // block_n),
      in_specs=[
          pl.BlockSpec((bm, width), lambda i, j: (i, 0)),
          pl.BlockSpec((inner, block_n), lambda i, j: (0, j)),
          pl.BlockSpec((bm, block_n), lambda i, j: (i, j)),
      ],
      out_specs=pl.BlockSpec((bm, block_n), lambda i, j: (i, j)),
      out_shape=jax.ShapeDtypeStruct((mp, d), h_BxD.dtype),
      compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="kevin_decode_oproj",
  )(o, w_o_NxHxD.reshape(inner, d), decode_tiles.pad_rows(h_BxD, mp))
  return out[:b]
