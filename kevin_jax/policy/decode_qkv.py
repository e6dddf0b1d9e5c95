"""The front of attention in a decode step as one Pallas kernel: the q/k/v projection of the normed x, its
biases, the rotary embedding of q and k, the write of the new k and v into the KV cache, and q laid out for
decode_attention.

In a decode step XLA runs this as five kernels per layer (BENCHMARKS.md, thirteenth session, 0.5B shape at
B = 64): the RMSNorm (1.7 us), the q/k/v GEMM split along D into fp32 partials (5.4 us), then three fusions that
each sum the partials and add the bias: q's with RoPE and the pad to 16 rows per KV head (1.9 us), k's with RoPE
and the cache write (1.7 us), v's with the cache write (1.3 us). 11.9 us for 2 MB of weights. Here every program
owns `block_w` columns of one head's first half and the same columns of its second half (the rotate-half pairs),
so RoPE is done in registers on the fp32 accumulators:
- programs [0, N * per_head) are q's heads, the next K * per_head k's, the last K * per_head v's
  (per_head = head_dim / 2 / block_w);
- each loops over D in `block_d` slices with two fp32 accumulators [block_m, block_w] (decode_tiles.dot_pair);
- then it adds the bias, rotates (q, k), and stores in the output dtype: q into [B, K, G_pad, H] (the layout
  decode_attention reads, its padding rows zeroed), k and v into cache slot `slot` of every row, in place (the
  caches are aliased to the outputs: no copy of the cache).
With block_w = 16 the 0.5B shape has 36 programs per row block; `block_m` < B gives more programs, each reading
the same weight columns (L2 hits).

Numbers: fp32 accumulation, bias and rotation, one rounding to the output dtype (XLA's path rounds the
projection and the rotation to the compute dtype in turn), so bf16 results differ from the XLA path by bf16
rounding. tests/test_policy_decode_qkv.py compares with a float64 reference in interpret mode on the CPU (fp32,
exact dots), checks that the kernel lowers to Triton, and (marker gpu) compares on the GPU.

Requirements (`supported`): head_dim / 2 a multiple of block_w, D a multiple of 16, and the batch a multiple of
16 (row blocks are powers of two >= 16 that divide it: no masked rows).

Measured on an H200 (0.5B shape, B = 64; BENCHMARKS.md "Sampler", twenty-third session): alone, XLA's norm + this
kernel took 10.5-10.8 us per layer against 12.2-13.8 us for XLA's whole path, and the decode step ran 48.7k
against 47.0k tokens/s, so ModelConfig.decode_qkv='auto' uses it. A version with the norm inside took 19-21 us:
multiplying the x slice by the norm scale before the dots is what costs (experiments/bench_decode_norm.py).

The epilogue's loads (the slot, the biases, cos/sin) are issued before the dot loop, so their latency overlaps the
loop's: with the o projection kernel's residual loaded early too, the kernel took 7.2 against 7.8 us per layer in
the decode step and bench_sampler ran 44,371 against 43,973 decode tok/s (+0.9 %, H100, thirty-third session).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from kevin_jax.policy import decode_attention
from kevin_jax.policy import decode_tiles
from kevin_jax.policy.decode_tiles import pick_block

Array = jax.Array
BLOCK_W = 16  # Columns of each half-head per program (Triton's smallest matmul tile): 2 programs per 64-wide head.
BLOCK_D = 128  # D per loop iteration at most.
BLOCK_M = 64  # Rows per program at most.
MAX_ROWS = 64  # 'auto' uses the kernel up to this batch (each row block re-reads the weights).
NUM_STAGES = 5  # Pipeline stages: alone at the 0.5B shape, B = 64, 10.00 us per layer against 10.74 with 3 (7 took
                # 10.21); end to end with decode_mlp's DOWN_SPLITS (BENCHMARKS.md "Sampler", twenty-sixth session).


def row_block(rows: int, block_m: int = BLOCK_M) -> int:
  """The largest power of two <= block_m dividing rows, or 0 if that is under 16."""
  return pick_block(rows, block_m)


def supported(rows: int, hidden: int, head_dim: int, block_w: int = BLOCK_W) -> bool:
  """Whether the kernel takes this batch, hidden size and head size (see the module docstring)."""
  half = head_dim // 2
  return (block_w >= 16 and half % block_w == 0 and pick_block(hidden, BLOCK_D) > 0
          and row_block(rows) > 0)


def _kernel(slot_ref, x_ref, *refs, num_heads: int, num_kv_heads: int, groups: int, head_dim: int, block_w: int,
            block_d: int, scaled: bool, rms_eps: float | None):
  """refs: [1/rms if scaled], the weights and biases of q, k, v, cos, sin, the caches (inputs: aliased, unread),
  then the outputs q and the caches. rms_eps: the kernel computes 1/rms itself."""
  refs = list(refs)
  r_ref = refs.pop(0) if scaled else None
  wq_ref, wk_ref, wv_ref, bq_ref, bk_ref, bv_ref, cos_ref, sin_ref, _, __, q_ref, kc_ref, vc_ref = refs
  i, j = pl.program_id(0), pl.program_id(1)
  bm = x_ref.shape[0]
  half = head_dim // 2
  per_head = half // block_w
  n_q = num_heads * per_head
  n_kv = num_kv_heads * per_head
  rows = pl.ds(pl.multiple_of(i * bm, bm), bm)
  # Every load the epilogue needs (the slot, biases, cos/sin) is issued before the dot loop, so that its latency
  # overlaps the loop's instead of following it.
  slot = slot_ref[0]

  def project(w_ref, b_ref, head, p, rope: bool):
    """fp32 (x @ W + b) on the two half-head column blocks [p*w, (p+1)*w) and [half + p*w, ...) of `head`, rotated
    if `rope`."""
    c1 = pl.multiple_of(head * head_dim + p * block_w, block_w)
    c2 = pl.multiple_of(c1 + half, block_w)
    b1 = b_ref[pl.ds(c1, block_w)].astype(jnp.float32)[None, :]
    b2 = b_ref[pl.ds(c2, block_w)].astype(jnp.float32)[None, :]
    if rope:
      cols = pl.ds(pl.multiple_of(p * block_w, block_w), block_w)
      cos, sin = cos_ref[:, cols], sin_ref[:, cols]
    a1, a2 = decode_tiles.dot_pair(x_ref, lambda ks: w_ref[ks, pl.ds(c1, block_w)],
                                   lambda ks: w_ref[ks, pl.ds(c2, block_w)], block_w, block_d, r_ref, rms_eps)
    a1, a2 = a1 + b1, a2 + b2
    if rope:
      return a1 * cos - a2 * sin, a2 * cos + a1 * sin
    return a1, a2

  def store(ref, idx_head, idx_slot, p, r1, r2):
    c1 = pl.ds(pl.multiple_of(p * block_w, block_w), block_w)
    c2 = pl.ds(pl.multiple_of(half + p * block_w, block_w), block_w)
    ref[rows, idx_head, idx_slot, c1] = r1.astype(ref.dtype)
    ref[rows, idx_head, idx_slot, c2] = r2.astype(ref.dtype)

  @pl.when(j < n_q)
  def _q():
    head, p = j // per_head, j % per_head
    r1, r2 = project(wq_ref, bq_ref, head, p, rope=True)
    kv, g = head // groups, head % groups
    store(q_ref, kv, g, p, r1, r2)
    gp = q_ref.shape[2]
    if gp > groups:  # The last head of each KV group zeroes the group's padding rows (read, then dropped).
      @pl.when((g == groups - 1) & (p == 0))
      def _pad():
        zeros = jnp.zeros((bm, head_dim), q_ref.dtype)
        for r in range(groups, gp):
          q_ref[rows, kv, r, :] = zeros

  @pl.when((j >= n_q) & (j < n_q + n_kv))
  def _k():
    head, p = (j - n_q) // per_head, (j - n_q) % per_head
    r1, r2 = project(wk_ref, bk_ref, head, p, rope=True)
    store(kc_ref, head, slot, p, r1, r2)

  @pl.when(j >= n_q + n_kv)
  def _v():
    head, p = (j - n_q - n_kv) // per_head, (j - n_q - n_kv) % per_head
    r1, r2 = project(wv_ref, bv_ref, head, p, rope=False)
    store(vc_ref, head, slot, p, r1, r2)


@functools.partial(jax.jit, static_argnames=("rms_eps", "block_w", "block_d", "block_m", "num_warps",
                                             "num_stages", "interpret"))
def qkv_rope_cache(x_BxD: Array, w_q_DxNxH: Array, w_k_DxKxH: Array, w_v_DxKxH: Array, b_q_NxH: Array,
                   b_k_KxH: Array, b_v_KxH: Array, cos_BxH2: Array, sin_BxH2: Array, k_cache_BxKxSxH: Array,
                   v_cache_BxKxSxH: Array, slot: Array | int, inv_rms_B: Array | None = None, *,
                   rms_eps: float | None = None, block_w: int = BLOCK_W, block_d: int = BLOCK_D,
                   block_m: int = BLOCK_M, num_warps: int = 4, num_stages: int = NUM_STAGES, interpret: bool = False
                   ) -> tuple[Array, Array, Array]:
  """One decode step's q, and the caches with this step's k and v written at `slot`.

  Returns (q [B, K, G_pad, H] in x's dtype, rows [G, G_pad) zero; k cache; v cache). q and k are rotated by the
  fp32 cos/sin [B, H/2] of each row's position. Weights as the model stores them ([D, N, H], [D, K, H]); biases
  [N, H], [K, H]; caches [B, K, S, H]. x is the layer's normed input, or with inv_rms_B (fp32 [B]) or rms_eps its
  raw input: the kernel then multiplies each row's projection by inv_rms_B, or by 1/rms = rsqrt(mean(x^2) +
  rms_eps) computed in the kernel, before the bias (the RMSNorm, its scale folded into the weights by the caller:
  RMSNorm.fold).
  """
  b, d = x_BxD.shape
  _, n, h = w_q_DxNxH.shape
  kh = w_k_DxKxH.shape[1]
  if w_q_DxNxH.shape[0] != d or w_k_DxKxH.shape != (d, kh, h) or w_v_DxKxH.shape != (d, kh, h):
    raise ValueError(f"q/k/v weights must be [D={d}, N, H] and [D, K, H] x 2, got {w_q_DxNxH.shape}, "
                     f"{w_k_DxKxH.shape}, {w_v_DxKxH.shape}")
  if n % kh:
    raise ValueError(f"query heads ({n}) must be a multiple of KV heads ({kh})")
  if k_cache_BxKxSxH.shape[:2] != (b, kh) or k_cache_BxKxSxH.shape[3] != h:
    raise ValueError(f"the cache must be [B={b}, K={kh}, S, H={h}], got {k_cache_BxKxSxH.shape}")
  if v_cache_BxKxSxH.shape != k_cache_BxKxSxH.shape:
    raise ValueError(f"k and v caches differ: {k_cache_BxKxSxH.shape} vs {v_cache_BxKxSxH.shape}")
  if cos_BxH2.shape != (b, h // 2) or sin_BxH2.shape != (b, h // 2):
    raise ValueError(f"cos/sin must be [B={b}, H/2={h // 2}], got {cos_BxH2.shape} and {sin_BxH2.shape}")
  if not supported(b, d, h, block_w):
    raise ValueError(f"qkv_rope_cache needs head_dim/2 ({h // 2}) a multiple of block_w ({block_w} >= 16), D ({d})"
                     f" a multiple of 16 and the batch ({b}) a multiple of 16")
  bm, block_d = row_block(b, block_m), pick_block(d, block_d)
  groups = n // kh
  per_head = h // 2 // block_w
  dt = w_q_DxNxH.dtype
  scaled = decode_tiles.check_norm_args(b, inv_rms_B, rms_eps)
  kernel = functools.partial(_kernel, num_heads=n, num_kv_heads=kh, groups=groups, head_dim=h, block_w=block_w,
                             block_d=block_d, scaled=scaled, rms_eps=rms_eps)
  whole = pl.BlockSpec()  # The whole array: the kernel computes its own offsets.
  rows = pl.BlockSpec((bm, d), lambda i, j: (i, 0))
  rope = pl.BlockSpec((bm, h // 2), lambda i, j: (i, 0))
  q, kc, vc = pl.pallas_call(
      kernel,
      grid=(b // bm, (n + 2 * kh) * per_head),
      in_specs=[pl.BlockSpec((1,), lambda i, j: (0,)), rows] + [pl.BlockSpec((bm,), lambda i, j: (i,))] * scaled
      + [whole, whole, whole, whole, whole, whole, rope, rope, whole, whole],
      out_specs=[whole, whole, whole],
      out_shape=[jax.ShapeDtypeStruct((b, kh, decode_attention.padded_rows(groups), h), x_BxD.dtype),
                 jax.ShapeDtypeStruct(k_cache_BxKxSxH.shape, k_cache_BxKxSxH.dtype),
                 jax.ShapeDtypeStruct(v_cache_BxKxSxH.shape, v_cache_BxKxSxH.dtype)],
      input_output_aliases={10 + scaled: 1, 11 + scaled: 2},  # the caches
      compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="kevin_decode_qkv",
  )(jnp.reshape(jnp.asarray(slot, jnp.int32), (1,)), x_BxD.astype(dt),
    *([inv_rms_B.astype(jnp.float32)] if scaled else []), w_q_DxNxH.reshape(d, n * h),
    w_k_DxKxH.reshape(d, kh * h), w_v_DxKxH.reshape(d, kh * h), b_q_NxH.reshape(n * h), b_k_KxH.reshape(kh * h),
    b_v_KxH.reshape(kh * h), cos_BxH2.astype(jnp.float32), sin_BxH2.astype(jnp.float32), k_cache_BxKxSxH,
    v_cache_BxKxSxH)
  return q, kc, vc
