"""Decode attention (one query token per row) over the sampler's [B, K, S, H] KV cache, as a Pallas kernel.

The sampler's cache holds, per row b, the right-padded prompt in slots [0, P) (real tokens in [0, prompt_len[b]))
and the generated tokens in slots [P, P + i) after i decode steps. The XLA path (model.decode_attend) reads all
S slots of every row at every step and masks the invisible ones; this kernel reads only the blocks that hold
visible slots - [0, prompt_len[b]) and [P, P + i) - so a step costs the bytes of the tokens actually attended
(the decode roofline's denominator), and it keeps the G query heads of a KV head together, so each K/V block is
read once for all of them.

Layout: grid (B, K, splits). Program (b, k, s) owns the slot range [s*S/splits, (s+1)*S/splits) of row b's head
k; it loops over the visible `block_k`-slot blocks of that range with an online softmax (fp32 running max, sum
and accumulator) and writes its partial (acc, max, sum); a small XLA epilogue merges the splits (flash-decoding).
Splitting S gives enough programs to fill the GPU at small batch; a split with nothing visible writes an empty
partial that the merge weighs by zero. With `balance=True` (BALANCE, the default) the splits share the row's
visible blocks instead, each an equal run of them, prompt blocks first: with fixed ranges, while the generated
part is short, the splits past the prompt read little or nothing (balanced: +2.1 % decode tokens/s at the 0.5B
shape, B = 64, experiments/sampler_kernels). PROGRAMS_PER_SM and NUM_STAGES give 2 splits with 3 pipeline stages
there (256 programs): +0.9 % over 4 splits with 2 stages (experiments/sampler_kernels).

With one split (`num_splits=1`) the kernel writes the normalized output in q's dtype itself: no fp32 partials and
no merge. With `padded=True` it returns decode_qkv's padded [B, K, G_pad, H] rows as written, which decode_oproj's
`groups` reads without a slice before it. Not the default: one program per row and KV head, each walking the row's
whole visible cache, does not hide the loads' latency, and the merge it saves costs less (BENCHMARKS.md Sampler).

The merge sums the splits with reductions over the split axis, which XLA runs as a fusion of its own (merging
inside a kernel, or as elementwise ops, lost: BENCHMARKS.md Sampler).

A split walks its prompt blocks and then its generated blocks in one loop (the loop index mapped to either), so
the loads' pipeline fills and drains once per program, not once per kind of block.

`decode_attention` is exact softmax attention (fp32 scores and softmax, bf16 or fp32 matmul inputs as stored):
tests/test_policy_decode_attention.py compares it with the masked einsum in interpret mode on the CPU, and
tests/test_policy_gpu.py on the GPU. Requirements (else callers use the XLA path; `supported` says which):
P and S multiples of `block_k`, head_dim a multiple of 16.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

# EXACT dots: IEEE fp32 for fp32 caches (Triton's default for fp32 inputs is TF32); bf16 caches: plain tensor cores.
from kevin_jax.policy.decode import tiles
from kevin_jax.policy.decode.tiles import EXACT

Array = jax.Array
_NEG = -1e30  # Masked score: exp(_NEG - m) == 0 for any finite running max m, never NaN.
BLOCK_K = 64  # Cache slots per K/V block; the sampler sizes its cache in multiples of it.
PROGRAMS_PER_SM = 2  # default_splits aims at about this many programs per SM: 2 splits at B = 64, K = 2 on 132 SMs.
NUM_STAGES = 3  # Pipeline stages of the K/V loads: with 2 splits, 3 beat 2 (module docstring).
BALANCE = True  # Splits share a row's visible blocks equally (True) or its slot range (False); see _kernel.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SlotRanges:
  """Which cache slots a decode step may attend: [0, prompt_len_B[b]) and [gen_start, gen_start + gen_len).

  gen_start (the prompt bucket P) is static; prompt_len_B and gen_len (decode steps so far, incl. this one)
  are traced.
  """
  prompt_len_B: Array
  gen_len: Array
  gen_start: int = dataclasses.field(metadata=dict(static=True))

  def mask(self, num_slots: int) -> Array:
    """The same visibility as a boolean [B, S] mask (the XLA path)."""
    s = jnp.arange(num_slots)[None, :]
    return (s < self.prompt_len_B[:, None]) | ((s >= self.gen_start) & (s < self.gen_start + self.gen_len))


def supported(num_slots: int, gen_start: int, head_dim: int, block_k: int = BLOCK_K) -> bool:
  return num_slots % block_k == 0 and gen_start % block_k == 0 and head_dim % 16 == 0


def default_splits(batch: int, kv_heads: int, num_slots: int, sm_count: int, block_k: int = BLOCK_K) -> int:
  """The splits per row and KV head for a GPU of `sm_count` SMs: the most powers of two that divide the cache's
  blocks while batch * kv_heads * splits stays within PROGRAMS_PER_SM * sm_count (at least 1)."""
  n, num_blocks = 1, num_slots // block_k
  while batch * kv_heads * n * 2 <= PROGRAMS_PER_SM * sm_count and num_blocks % (n * 2) == 0:
    n *= 2
  return n


def split_share(prompt_len, gen_len, s, splits: int, block_k: int):
  """Split s's share under balanced splits: a row's visible blocks, the prompt's [0, ceil(prompt_len / block_k))
  then the generated ones, are numbered 0..n-1 in that order and shared in runs of ceil(n / splits); split s reads
  numbers [v0, v1). Returns (n_prompt, n, v0, v1); scalars or arrays, in a kernel or not (decode_qkv's prefetch
  finds the same blocks with it)."""
  n_prompt = (prompt_len + block_k - 1) // block_k
  n = n_prompt + (gen_len + block_k - 1) // block_k
  per = (n + splits - 1) // splits
  v0 = jnp.minimum(s * per, n)
  return n_prompt, n, v0, jnp.minimum(v0 + per, n)


def _kernel(plen_ref, glen_ref, q_ref, k_ref, v_ref, o_ref, *stat_refs, gen_start: int, split_len: int,
            block_k: int, scale: float, balance: bool, splits: int):
  """stat_refs: the partial's running max and sum; none with one split, which writes the normalized output."""
  b, s = pl.program_id(0), pl.program_id(2)
  plen = plen_ref[b]
  glen = glen_ref[0]
  gend = gen_start + glen
  q = q_ref[...]  # [Gp, H]
  gp, h = q.shape
  offs = jnp.arange(block_k)
  # balance: k_ref/v_ref hold the row's whole cache, so slot blocks are addressed from 0; else only this split's
  # slot range [s * split_len, (s + 1) * split_len).
  base = 0 if balance else s * split_len

  def block(j, carry):
    acc, m_prev, l_prev = carry
    start = pl.multiple_of(j * block_k, block_k)
    k = k_ref[pl.ds(start - base, block_k), :]  # [block_k, H]
    v = v_ref[pl.ds(start - base, block_k), :]
    slot = start + offs
    visible = (slot < plen) | ((slot >= gen_start) & (slot < gend))
    sc = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=EXACT,
                             preferred_element_type=jnp.float32) * scale
    sc = jnp.where(visible[None, :], sc, _NEG)
    m_next = jnp.maximum(m_prev, sc.max(axis=1))
    corr = jnp.exp(m_prev - m_next)
    p = jnp.exp(sc - m_next[:, None])
    l_next = l_prev * corr + p.sum(axis=1)
    acc = acc * corr[:, None] + jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                                    precision=EXACT, preferred_element_type=jnp.float32)
    return acc, m_next, l_next

  carry = (jnp.zeros((gp, h), jnp.float32), jnp.full((gp,), _NEG, jnp.float32), jnp.zeros((gp,), jnp.float32))
  g0 = gen_start // block_k  # the first generated block
  if balance:
    n_prompt, _, v0, v1 = split_share(plen, glen, s, splits, block_k)
    a0, a1 = v0, jnp.minimum(v1, n_prompt)
    b0, b1 = g0 + jnp.maximum(v0, n_prompt) - n_prompt, g0 + v1 - n_prompt
  else:
    lo, hi = s * split_len, (s + 1) * split_len
    a0, a1 = lo // block_k, (jnp.minimum(hi, plen) + block_k - 1) // block_k
    b0 = jnp.maximum(lo, gen_start) // block_k
    b1 = (jnp.minimum(hi, gend) + block_k - 1) // block_k
  # Prompt blocks [a0, a1) in this split, then generated blocks [b0, b1) (disjoint: gen_start is a multiple of
  # block_k), in one loop: two loops would each fill and drain the loads' pipeline, exposing one more memory latency
  # in every program whose split holds both kinds (most of a decode, with balanced splits).
  n_a = jnp.maximum(a1 - a0, 0)
  carry = jax.lax.fori_loop(0, n_a + jnp.maximum(b1 - b0, 0),
                            lambda i, c: block(jnp.where(i < n_a, a0 + i, b0 + i - n_a), c), carry)
  acc, m, l = carry
  if not stat_refs:  # one split: the softmax is complete (every row sees at least one slot)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
    return
  m_ref, l_ref = stat_refs
  o_ref[...] = acc
  m_ref[...] = m
  l_ref[...] = l


def padded_rows(groups: int) -> int:
  """Query rows per KV head inside the kernel: G rounded up to a multiple of 16 (Triton's matmul tiles)."""
  return max(16, -(-groups // 16) * 16)


def merge_splits(o_BxKxSxGxH: Array, m_BxKxSxG: Array, l_BxKxSxG: Array) -> Array:
  """The exact softmax output [B, K, G, H] (fp32) from the splits' partials: acc, running max and sum per split.

  A split with nothing visible has m = _NEG and l = 0 and weighs exp(_NEG - max) = 0 (if any split saw a slot).
  """
  m_max = m_BxKxSxG.max(axis=2, keepdims=True)
  w = jnp.exp(m_BxKxSxG - m_max)  # [B, K, splits, G]; 0 for empty splits
  return (o_BxKxSxGxH * w[..., None]).sum(axis=2) / (l_BxKxSxG * w).sum(axis=2)[..., None]


@functools.partial(jax.jit, static_argnames=("block_k", "num_splits", "groups", "padded", "balance", "num_warps",
                                             "num_stages", "interpret"))
def decode_attention(q_BxKxGxH: Array, k_BxKxSxH: Array, v_BxKxSxH: Array, ranges: SlotRanges, *,
                     block_k: int = BLOCK_K, num_splits: int = 0, groups: int = 0, padded: bool = False,
                     balance: bool = BALANCE, num_warps: int = 4, num_stages: int = NUM_STAGES,
                     interpret: bool = False) -> Array:
  """Softmax(q k^T / sqrt(H)) v over the visible slots; returns [B, K, G, H] in q's dtype.

  groups > 0: q is already padded, [B, K, padded_rows(groups), H] with the real rows first (decode_qkv writes it
  so); G = groups. padded (with groups): the caller takes [B, K, padded_rows(groups), H] too, the padding rows'
  values meaningless (decode_oproj's `groups` reads only the real rows). One split then returns its output as
  written (slicing the real rows would be a copy); several splits return [B, K, G, H] anyway (the merge fusion
  drops the padding rows as it reads, and more rows would only cost it). num_splits: the splits per row and KV
  head (0: default_splits for this process' first device), merged by merge_splits.
  """
  b, kh, g, h = q_BxKxGxH.shape
  if groups:
    if g != padded_rows(groups):
      raise ValueError(f"with groups={groups}, q must hold {padded_rows(groups)} rows per KV head, got {g}")
    g = groups
  elif padded:
    raise ValueError("padded=True needs groups (q in decode_qkv's padded layout)")
  s = k_BxKxSxH.shape[2]
  if not supported(s, ranges.gen_start, h, block_k):
    raise ValueError(f"decode_attention needs S ({s}) and gen_start ({ranges.gen_start}) multiples of "
                     f"block_k ({block_k}) and head_dim ({h}) a multiple of 16")
  splits = num_splits or default_splits(b, kh, s, tiles.sm_count(), block_k)
  if not balance and (s // block_k) % splits:
    raise ValueError(f"{splits} splits do not divide {s // block_k} blocks")
  split_len = s // splits
  gp = padded_rows(g)  # Matmul tiles need >= 16 rows: pad the query group with zero rows.
  q = jnp.pad(q_BxKxGxH.astype(k_BxKxSxH.dtype), ((0, 0), (0, 0), (0, gp - q_BxKxGxH.shape[2]), (0, 0)))
  kernel = functools.partial(_kernel, gen_start=ranges.gen_start, split_len=split_len, block_k=block_k,
                             scale=h ** -0.5, balance=balance, splits=splits)
  kv_len = s if balance else split_len
  kv_map = (lambda i, j, t: (i, j, 0, 0)) if balance else (lambda i, j, t: (i, j, t, 0))
  stats = splits > 1  # one split writes the output itself: no partials, no merge
  part_spec = pl.BlockSpec((None, None, None, gp, h), lambda i, j, t: (i, j, t, 0, 0))
  stat_spec = pl.BlockSpec((None, None, None, gp), lambda i, j, t: (i, j, t, 0))
  outs = pl.pallas_call(
      kernel,
      grid=(b, kh, splits),
      in_specs=[
          pl.BlockSpec((b,), lambda i, j, t: (0,)),  # prompt lengths
          pl.BlockSpec((1,), lambda i, j, t: (0,)),  # generated length
          pl.BlockSpec((None, None, gp, h), lambda i, j, t: (i, j, 0, 0)),
          pl.BlockSpec((None, None, kv_len, h), kv_map),
          pl.BlockSpec((None, None, kv_len, h), kv_map),
      ],
      out_specs=[part_spec, stat_spec, stat_spec] if stats else
      [pl.BlockSpec((None, None, gp, h), lambda i, j, t: (i, j, 0, 0))],
      out_shape=[
          jax.ShapeDtypeStruct((b, kh, splits, gp, h), jnp.float32),
          jax.ShapeDtypeStruct((b, kh, splits, gp), jnp.float32),
          jax.ShapeDtypeStruct((b, kh, splits, gp), jnp.float32),
      ] if stats else [jax.ShapeDtypeStruct((b, kh, gp, h), q_BxKxGxH.dtype)],
      compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="kevin_decode_attention",
  )(ranges.prompt_len_B.astype(jnp.int32), jnp.reshape(ranges.gen_len, (1,)).astype(jnp.int32), q,
    k_BxKxSxH, v_BxKxSxH)
  if not stats:  # one split: the output as written, or its real rows
    return outs[0] if padded else outs[0][:, :, :g]
  o, m, l = outs
  # Merge the splits' partial softmaxes of the G real query rows (dropping the padding rows first lets XLA fuse
  # the slice into the merge instead of launching a separate slice kernel per layer).
  return merge_splits(o[..., :g, :], m[..., :g], l[..., :g]).astype(q_BxKxGxH.dtype)
