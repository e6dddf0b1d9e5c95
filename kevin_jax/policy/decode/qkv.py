"""The front of attention in a decode step as one Pallas kernel: the q/k/v projection of the normed x, its
biases, the rotary embedding of q and k, the write of the new k and v into the KV cache, and q laid out for
decode_attention.

In a decode step XLA runs this as five kernels per layer: the RMSNorm, the q/k/v GEMM split along D into fp32
partials, then three fusions that each sum the partials and add the bias: q's with RoPE and the pad to 16 rows per
KV head, k's with RoPE and the cache write, v's with the cache write. Here every program owns `block_w` columns of
one head's first half and the same columns of its second half (the rotate-half pairs), so RoPE is done in registers
on the fp32 accumulators:
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

DecodeConfig.qkv='auto' uses the kernel (+3.6 % decode tokens/s at the 0.5B shape, B = 64;
experiments/sampler_kernels). The norm comes from XLA's fusion before it, or from the kernel itself
(DecodeConfig.norm): from the Gram matrix of the x slices, never by scaling x before the dots
(decode_tiles.dot_pair). The epilogue's loads (the slot, the biases, cos/sin) are issued before the dot loop, so
their latency overlaps the loop's.

The prefetch: the attention kernel that runs next is bound by its cache reads (~50 MB per layer at B = 64), while
this kernel's 36 programs leave most SMs and most of the memory bandwidth idle. Extra programs (one per row, KV head
and attention split) load the first PREFETCH_BLOCKS blocks of each split's share of the cache into L2, so that the
attention finds them there. 2 blocks: +0.6 % decode tokens/s at the 0.5B shape, B = 64
(experiments/sampler_kernels); more cost this kernel more than they save the attention (BENCHMARKS.md Sampler). The
outputs do not change (tests, in interpret mode and on the GPU).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from kevin_jax.policy.decode import attention as decode_attention
from kevin_jax.policy.decode import tiles as decode_tiles
from kevin_jax.policy.decode.tiles import pick_block

Array = jax.Array
BLOCK_W = 16  # Columns of each half-head per program (Triton's smallest matmul tile): 2 programs per 64-wide head.
BLOCK_D = 128  # D per loop iteration at most.
BLOCK_M = 64  # Rows per program at most.
MAX_ROWS = 64  # 'auto' uses the kernel up to this batch (each row block re-reads the weights).
PREFETCH_BLOCKS = 2  # qkv_rope_cache's prefetch: the attention's first cache blocks per split (0: off); 8.4 MB per
                     # layer at the 0.5B shape, B = 64 (module docstring)
PREFETCH_EVICT = None  # its loads' L2 eviction policy (None: the default; 'evict_last' was slower)
NUM_STAGES = 5  # Pipeline stages: 7 % faster alone than 3 at the 0.5B shape, B = 64; with decode_mlp's DOWN_SPLITS
                # +2.4 % decode tokens/s there (experiments/sampler_kernels).


@dataclasses.dataclass(frozen=True)
class Prefetch:
  """The prefetch of the cache blocks the attention kernel reads first (static): decode_attention's balanced
  splits per row and KV head, `blocks` of its `block_k` slots from the start of each split's share, the L2
  eviction policy of the loads (None: the default), and the prompt bucket (the generated slots' start)."""
  splits: int
  blocks: int
  block_k: int
  gen_start: int
  evict: str | None = None


def split_block(prompt_len, gen_len, s, u, splits: int, block_k: int, gen_start: int):
  """The cache block (of block_k slots) that split s of decode_attention's balanced splits reads u-th
  (decode_attention.split_share; the generated blocks start at block gen_start / block_k). Past the row's last
  visible block: that block (scalars or arrays, in a kernel or not)."""
  n_prompt, n, v0, _ = decode_attention.split_share(prompt_len, gen_len, s, splits, block_k)
  v = jnp.minimum(v0 + u, n - 1)
  return jnp.where(v < n_prompt, v, gen_start // block_k + v - n_prompt)


def _prefetch_blocks(kc_ref, vc_ref, lens_ref, sink_ref, row0, t, kv_heads: int, pf: Prefetch):
  """Prefetch program t of the row block starting at row0: row row0 + t // (K * splits), KV head and split from
  the rest. It loads the first pf.blocks visible blocks of that split's share of the row (decode_attention's
  balanced split: the row's visible blocks, prompt's then generated, in equal runs) from both caches, and stores
  a max of their column sums in the sink so that the loads are not dropped as dead code. lens_ref:
  [gen_len, prompt_len_0, ..., prompt_len_{B-1}] (int32)."""
  per_row = kv_heads * pf.splits
  row = row0 + t // per_row
  head, s = (t % per_row) // pf.splits, t % pf.splits
  plen, glen = lens_ref[1 + row], lens_ref[0]
  ones = jnp.ones((16, pf.block_k), kc_ref.dtype)

  def body(u, acc):
    # The loads feed dots, so that Triton pipelines them (num_stages) through shared memory, as the attention's
    # own: held in registers instead (all issued first, then their max), 4 blocks took this kernel 12.0 against
    # 10.9 us per layer at the 0.5B shape, B = 64.
    blk = split_block(plen, glen, s, u, pf.splits, pf.block_k, pf.gen_start)
    ks = pl.ds(pl.multiple_of(blk * pf.block_k, pf.block_k), pf.block_k)
    for ref in (kc_ref, vc_ref):
      acc += jax.lax.dot(ones, pl_triton.load(ref.at[row, head, ks, :], eviction_policy=pf.evict),
                         preferred_element_type=jnp.float32)
    return acc

  acc = jax.lax.fori_loop(0, pf.blocks, body, jnp.zeros((16, kc_ref.shape[3]), jnp.float32))
  sink_ref[pl.ds(row * per_row + head * pf.splits + s, 1)] = jnp.full((1,), acc.max(), jnp.float32)


def row_block(rows: int, block_m: int = BLOCK_M) -> int:
  """The largest power of two <= block_m dividing rows, or 0 if that is under 16."""
  return pick_block(rows, block_m)


def supported(rows: int, hidden: int, head_dim: int, block_w: int = BLOCK_W) -> bool:
  """Whether the kernel takes this batch, hidden size and head size (see the module docstring)."""
  half = head_dim // 2
  return (block_w >= 16 and half % block_w == 0 and pick_block(hidden, BLOCK_D) > 0
          and row_block(rows) > 0)


def _kernel(slot_ref, x_ref, *refs, num_heads: int, num_kv_heads: int, groups: int, head_dim: int, block_w: int,
            block_d: int, scaled: bool, rms_eps: float | None, prefetch: Prefetch | None):
  """refs: [1/rms if scaled], the weights and biases of q, k, v, cos, sin, the caches (inputs: aliased, read only
  by the prefetch), [the prefetch's lengths], then the outputs q and the caches, [the prefetch's sink]. rms_eps:
  the kernel computes 1/rms itself."""
  refs = list(refs)
  r_ref = refs.pop(0) if scaled else None
  pf_refs = (refs.pop(10), refs.pop()) if prefetch else None  # the lengths (after the caches), the sink (last)
  wq_ref, wk_ref, wv_ref, bq_ref, bk_ref, bv_ref, cos_ref, sin_ref, kc_in, vc_in, q_ref, kc_ref, vc_ref = refs
  i, j = pl.program_id(0), pl.program_id(1)
  bm = x_ref.shape[0]
  half = head_dim // 2
  per_head = half // block_w
  n_q = num_heads * per_head
  n_kv = num_kv_heads * per_head
  n_cols = n_q + 2 * n_kv  # the projection's programs per row block; prefetch programs follow them
  if prefetch:
    @pl.when(j >= n_cols)
    def _pf():
      _prefetch_blocks(kc_in, vc_in, *pf_refs, i * bm, j - n_cols, num_kv_heads, prefetch)
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

  @pl.when((j >= n_q + n_kv) & (j < n_cols))
  def _v():
    head, p = (j - n_q - n_kv) // per_head, (j - n_q - n_kv) % per_head
    r1, r2 = project(wv_ref, bv_ref, head, p, rope=False)
    store(vc_ref, head, slot, p, r1, r2)


@functools.partial(jax.jit, static_argnames=("rms_eps", "block_w", "block_d", "block_m", "num_warps",
                                             "num_stages", "prefetch_splits", "prefetch_blocks", "prefetch_evict",
                                             "interpret"))
def qkv_rope_cache(x_BxD: Array, w_q_DxNxH: Array, w_k_DxKxH: Array, w_v_DxKxH: Array, b_q_NxH: Array,
                   b_k_KxH: Array, b_v_KxH: Array, cos_BxH2: Array, sin_BxH2: Array, k_cache_BxKxSxH: Array,
                   v_cache_BxKxSxH: Array, slot: Array | int, inv_rms_B: Array | None = None, *,
                   rms_eps: float | None = None, block_w: int = BLOCK_W, block_d: int = BLOCK_D,
                   block_m: int = BLOCK_M, num_warps: int = 4, num_stages: int = NUM_STAGES,
                   prefetch_ranges: decode_attention.SlotRanges | None = None, prefetch_splits: int = 0,
                   prefetch_blocks: int = PREFETCH_BLOCKS, prefetch_evict: str | None = PREFETCH_EVICT,
                   interpret: bool = False) -> tuple[Array, Array, Array]:
  """One decode step's q, and the caches with this step's k and v written at `slot`.

  Returns (q [B, K, G_pad, H] in x's dtype, rows [G, G_pad) zero; k cache; v cache). q and k are rotated by the
  fp32 cos/sin [B, H/2] of each row's position. Weights as the model stores them ([D, N, H], [D, K, H]); biases
  [N, H], [K, H]; caches [B, K, S, H]. x is the layer's normed input, or with inv_rms_B (fp32 [B]) or rms_eps its
  raw input: the kernel then multiplies each row's projection by inv_rms_B, or by 1/rms = rsqrt(mean(x^2) +
  rms_eps) computed in the kernel, before the bias (the RMSNorm, its scale folded into the weights by the caller:
  step.fold).

  prefetch_ranges (the slots the decode step attends) with prefetch_splits > 0 and prefetch_blocks > 0: extra
  programs, one per row, KV head and split of decode_attention (balanced splits, prefetch_splits of them), load the
  first prefetch_blocks cache blocks of that split's share with the L2 eviction policy prefetch_evict, for the
  attention kernel that runs next to find in L2 (see PREFETCH_BLOCKS). The outputs do not change.
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
  pf = None
  if prefetch_ranges is not None and prefetch_splits > 0 and prefetch_blocks > 0:
    block_k = decode_attention.BLOCK_K
    if k_cache_BxKxSxH.shape[2] % block_k or prefetch_ranges.gen_start % block_k:
      raise ValueError(f"the prefetch needs S ({k_cache_BxKxSxH.shape[2]}) and gen_start "
                       f"({prefetch_ranges.gen_start}) multiples of {block_k}")
    pf = Prefetch(prefetch_splits, prefetch_blocks, block_k, prefetch_ranges.gen_start, prefetch_evict)
  kernel = functools.partial(_kernel, num_heads=n, num_kv_heads=kh, groups=groups, head_dim=h, block_w=block_w,
                             block_d=block_d, scaled=scaled, rms_eps=rms_eps, prefetch=pf)
  whole = pl.BlockSpec()  # The whole array: the kernel computes its own offsets.
  rows = pl.BlockSpec((bm, d), lambda i, j: (i, 0))
  rope = pl.BlockSpec((bm, h // 2), lambda i, j: (i, 0))
  n_pf = bm * kh * prefetch_splits if pf else 0  # prefetch programs per row block
  lens = ([jnp.concatenate([jnp.reshape(prefetch_ranges.gen_len, (1,)), prefetch_ranges.prompt_len_B]
                           ).astype(jnp.int32)] if pf else [])
  outs = pl.pallas_call(
      kernel,
      grid=(b // bm, (n + 2 * kh) * per_head + n_pf),
      in_specs=[pl.BlockSpec((1,), lambda i, j: (0,)), rows] + [pl.BlockSpec((bm,), lambda i, j: (i,))] * scaled
      + [whole, whole, whole, whole, whole, whole, rope, rope, whole, whole] + [whole] * bool(pf),
      out_specs=[whole, whole, whole] + [whole] * bool(pf),
      out_shape=[jax.ShapeDtypeStruct((b, kh, decode_attention.padded_rows(groups), h), x_BxD.dtype),
                 jax.ShapeDtypeStruct(k_cache_BxKxSxH.shape, k_cache_BxKxSxH.dtype),
                 jax.ShapeDtypeStruct(v_cache_BxKxSxH.shape, v_cache_BxKxSxH.dtype)]
      + [jax.ShapeDtypeStruct((b * kh * prefetch_splits,), jnp.float32)] * bool(pf),  # the prefetch's sink
      input_output_aliases={10 + scaled: 1, 11 + scaled: 2},  # the caches
      compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="kevin_decode_qkv",
  )(jnp.reshape(jnp.asarray(slot, jnp.int32), (1,)), x_BxD.astype(dt),
    *([inv_rms_B.astype(jnp.float32)] if scaled else []), w_q_DxNxH.reshape(d, n * h),
    w_k_DxKxH.reshape(d, kh * h), w_v_DxKxH.reshape(d, kh * h), b_q_NxH.reshape(n * h), b_k_KxH.reshape(kh * h),
    b_v_KxH.reshape(kh * h), cos_BxH2.astype(jnp.float32), sin_BxH2.astype(jnp.float32), k_cache_BxKxSxH,
    v_cache_BxKxSxH, *lens)
  return outs[0], outs[1], outs[2]
