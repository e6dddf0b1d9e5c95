"""The LM head and the sampling step's reductions over the vocabulary in one Pallas kernel (SamplerConfig.decode_head).

With XLA (the default), a decode step's LM head writes the [B, V] logits to memory as fp32 (V = 151,936: 39 MB at
B = 64) and sample_logits reads them back for the chunk maxima, the log-sum-exps and the Gumbel draw. Here program
(i, j) computes the logits of rows [i*block_m, (i+1)*block_m) and vocabulary columns [j*block_n, (j+1)*block_n)
in registers and writes only per-(row, column block) statistics (`HeadStats`: seven 4-byte values per row and
block, 8.5 MB at B = 64 with 32-column blocks):
- max and sum of exp(x - max) of the raw logits x (for log_softmax(x)[token], the GRPO log-prob);
- the same of the sampled distribution's logits z = x / T, padded vocabulary columns masked (the sampling log-prob);
- the column of the block's largest z + g, g a Gumbel draw per (row, column) (sampling), or of its largest masked x
  (greedy), that value, and the raw logit there.
A small XLA epilogue (`finish`) picks each row's block with the largest of those values, so the token is the
argmax of z + g over the whole vocabulary (the Gumbel-max draw, exact), and combines the blocks' sums into the
log-sum-exps. Only temperature sampling and greedy decoding are fused: top-k and top-p need the whole row and take
sample_logits' path.

The Gumbel noise is a counter-based hash of the row's per-step key (the two uint32 words of the threefry key that
sample_logits would use) and the column (`hash_gumbel`): V draws per row cost a few integer multiplies each in
registers, where jax.random's threefry over [64, V] would be the step's largest non-GEMM kernel. So for one seed
this path draws other tokens than sample_logits (the same distribution: tests/test_policy_decode_head.py checks it
by a chi-square test), and it is deterministic too.

Opt-in (SamplerConfig.decode_head 'xla' by default): alone 10 % faster than XLA's head + sample_logits, but
-1.1 to -1.5 % decode tokens/s at the 0.5B shape, B = 64 (BENCHMARKS.md Sampler); XLA's GEMM + logits_stats
(`fuse_gemm` off) lost too.

Numbers: fp32 accumulation, the logits rounded to the model's logits dtype (ModelConfig.fp32_upcast: fp32) before
anything else, as model.logits does; `reference` is the same computation in jnp over the whole [B, V], and the
tests compare the two in interpret mode on the CPU and on the GPU. The weight is the tied embedding [V, D] or the
untied head [D, V]; D a multiple of 16 and V of 16 (`supported`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from kevin_jax.policy import decode_tiles
from kevin_jax.policy.decode_tiles import EXACT, pick_block

Array = jax.Array
_NEG = -1e30  # a masked logit, as sample_logits' (finite: a fully masked block gives no NaN)
BLOCK_N = 32  # vocabulary columns per program at most: V = 151,936 gives 4,748 programs at 64 rows (alone faster
              # than 64 or 128 columns)
BLOCK_D = 128  # hidden dimension per loop iteration at most
BLOCK_M = 64  # rows per program at most
MAX_ROWS = 64  # SamplerConfig.decode_head='auto' uses the kernel up to this batch (each row block re-reads the
               # whole head: 272 MB at the 0.5B shape)
FUSE_GEMM = True  # sample(): the head's GEMM inside the kernel, else XLA's GEMM + logits_stats
_M1, _M2, _GOLDEN = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35), np.uint32(0x9E3779B9)


def supported(hidden: int, vocab: int) -> bool:
  """Whether the kernel takes D = hidden and V = vocab (both multiples of 16)."""
  return pick_block(hidden, BLOCK_D) > 0 and pick_block(vocab, BLOCK_N) > 0


def _fmix32(h: Array) -> Array:
  """MurmurHash3's 32-bit finalizer: a bijection of uint32 in which every input bit flips each output bit with
  probability ~1/2."""
  h = h ^ jax.lax.shift_right_logical(h, np.uint32(16))
  h = h * _M1
  h = h ^ jax.lax.shift_right_logical(h, np.uint32(13))
  h = h * _M2
  return h ^ jax.lax.shift_right_logical(h, np.uint32(16))


def hash_uniform(k0: Array, k1: Array, col: Array) -> Array:
  """Uniform draws in (0, 1) (fp32, 24 random bits, never 0 or 1) from uint32 key words k0, k1 and column
  indices col (broadcast together): for fixed keys, distinct columns give distinct hashes (each step is a
  bijection of uint32)."""
  h = _fmix32((col * _GOLDEN) ^ k0)
  h = _fmix32(h ^ k1)
  bits = jax.lax.shift_right_logical(h, np.uint32(8)).astype(jnp.int32)  # < 2^24: exact in fp32
  return (bits.astype(jnp.float32) + 0.5) * np.float32(2.0 ** -24)


def hash_gumbel(k0: Array, k1: Array, col: Array) -> Array:
  """Standard Gumbel draws -log(-log(u)) of hash_uniform(k0, k1, col)."""
  return -jnp.log(-jnp.log(hash_uniform(k0, k1, col)))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HeadStats:
  """Per (column block, row) statistics [C, R] of the kernel (C column blocks, R >= B rows): raw logits' max and
  sum of exp(x - max); the sampled logits' (z = masked x / T) max and sum; the pick's column, value and raw logit."""
  raw_max: Array
  raw_sum: Array
  samp_max: Array
  samp_sum: Array
  pick_col: Array  # int32
  pick_val: Array
  pick_logit: Array


def _block_stats(logits: Array, cols: Array, k0: Array, k1: Array, inv_t: Array | None, valid_vocab: int,
                 vocab: int) -> tuple[Array, ...]:
  """The HeadStats of one [M, N] block of fp32 logits (columns `cols` [N] int32; k0, k1 [M] uint32; inv_t None:
  greedy), each [M]: the body shared by the kernel and `reference` (which calls it with the whole row)."""
  raw_max = logits.max(axis=1)
  raw_sum = jnp.exp(logits - raw_max[:, None]).sum(axis=1)
  masked = logits if valid_vocab >= vocab else jnp.where(cols[None, :] < valid_vocab, logits, _NEG)
  if inv_t is None:
    samp_max, samp_sum, key = raw_max, raw_sum, masked
  else:
    scaled = masked * inv_t
    samp_max = scaled.max(axis=1)
    samp_sum = jnp.exp(scaled - samp_max[:, None]).sum(axis=1)
    key = scaled + hash_gumbel(k0[:, None], k1[:, None], cols.astype(jnp.uint32)[None, :])
  pick_val = key.max(axis=1)
  big = jnp.int32(np.iinfo(np.int32).max)
  pick_col = jnp.where(key == pick_val[:, None], cols[None, :], big).min(axis=1)  # the first maximum
  pick_logit = jnp.where(cols[None, :] == pick_col[:, None], logits, -jnp.inf).max(axis=1)
  return raw_max, raw_sum, samp_max, samp_sum, pick_col, pick_val, pick_logit


def _kernel(t_ref, k0_ref, k1_ref, x_ref, w_ref, *out_refs, block_d: int, block_n: int, head_vd: bool,
            greedy: bool, valid_vocab: int, vocab: int, logits_dtype):
  j = pl.program_id(1)
  m, d = x_ref.shape
  exact = EXACT if w_ref.dtype == jnp.float32 else None
  dims = (((1,), (1,)), ((), ())) if head_vd else (((1,), (0,)), ((), ()))

  def body(t, acc):
    ks = pl.ds(pl.multiple_of(t * block_d, block_d), block_d)
    w = w_ref[:, ks] if head_vd else w_ref[ks, :]
    return acc + jax.lax.dot_general(x_ref[:, ks], w, dims, precision=exact, preferred_element_type=jnp.float32)

  logits = jax.lax.fori_loop(0, d // block_d, body, jnp.zeros((m, block_n), jnp.float32))
  _write_stats(out_refs, logits.astype(logits_dtype).astype(jnp.float32), j, t_ref, k0_ref, k1_ref,
               block_n=block_n, greedy=greedy, valid_vocab=valid_vocab, vocab=vocab)


def _write_stats(out_refs, logits, j, t_ref, k0_ref, k1_ref, *, block_n: int, greedy: bool, valid_vocab: int,
                 vocab: int):
  """Stores the HeadStats of column block j's fp32 logits [M, block_n]."""
  cols = j * block_n + jnp.arange(block_n, dtype=jnp.int32)
  inv_t = None if greedy else 1.0 / t_ref[0]  # finish scales the picked logit the same way
  for ref, value in zip(out_refs, _block_stats(logits, cols, k0_ref[...], k1_ref[...], inv_t, valid_vocab, vocab)):
    ref[...] = value


def _stats_kernel(t_ref, k0_ref, k1_ref, x_ref, *out_refs, block_n: int, greedy: bool, valid_vocab: int,
                  vocab: int):
  _write_stats(out_refs, x_ref[...].astype(jnp.float32), pl.program_id(1), t_ref, k0_ref, k1_ref, block_n=block_n,
               greedy=greedy, valid_vocab=valid_vocab, vocab=vocab)


def _key_words(keys_Bx2: Array, rows: int) -> tuple[Array, Array]:
  """The keys' two uint32 words [rows] each, padded with zeros past B."""
  keys = jax.random.key_data(keys_Bx2) if jnp.issubdtype(keys_Bx2.dtype, jax.dtypes.prng_key) else keys_Bx2
  keys = decode_tiles.pad_rows(keys, rows).astype(jnp.uint32)
  return keys[:, 0], keys[:, 1]


def _stat_outputs(c: int, rows: int, bm: int):
  """out_specs and out_shape of the seven [C, R] HeadStats arrays, R in blocks of bm."""
  stat = lambda dt: jax.ShapeDtypeStruct((c, rows), dt)
  return ([pl.BlockSpec((None, bm), lambda i, j: (j, i))] * 7,
          [stat(jnp.float32)] * 4 + [stat(jnp.int32)] + [stat(jnp.float32)] * 2)


@functools.partial(jax.jit, static_argnames=("greedy", "valid_vocab", "block_n", "block_m", "num_warps",
                                             "interpret"))
def logits_stats(logits_BxV: Array, keys_Bx2: Array, temperature: Array, *, greedy: bool, valid_vocab: int,
                 block_n: int = 128, block_m: int = 32, num_warps: int = 4, interpret: bool = False) -> HeadStats:
  """head_stats of logits computed elsewhere (XLA's GEMM): one pass over the [B, V] logits (any float dtype)."""
  b, v = logits_BxV.shape
  if keys_Bx2.shape != (b, 2):
    raise ValueError(f"keys must be [B={b}, 2], got {keys_Bx2.shape}")
  block_n = pick_block(v, block_n)
  if not block_n:
    raise ValueError(f"logits_stats needs V ({v}) a multiple of 16")
  mp, bm = decode_tiles.row_tiles(b, block_m)
  k0, k1 = _key_words(keys_Bx2, mp)
  out_specs, out_shape = _stat_outputs(v // block_n, mp, bm)
  out = pl.pallas_call(
      functools.partial(_stats_kernel, block_n=block_n, greedy=greedy, valid_vocab=valid_vocab, vocab=v),
      grid=(mp // bm, v // block_n),
      in_specs=[
          pl.BlockSpec((1,), lambda i, j: (0,)),  # temperature
          pl.BlockSpec((bm,), lambda i, j: (i,)),  # key words 0
          pl.BlockSpec((bm,), lambda i, j: (i,)),  # key words 1
          pl.BlockSpec((bm, block_n), lambda i, j: (i, j)),
      ],
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret,
      name="kevin_decode_sample_stats",
  )(jnp.reshape(temperature, (1,)).astype(jnp.float32), k0, k1, decode_tiles.pad_rows(logits_BxV, mp))
  return HeadStats(*out)


@functools.partial(jax.jit, static_argnames=("head_vd", "greedy", "valid_vocab", "logits_dtype", "block_n",
                                             "block_d", "block_m", "num_warps", "num_stages", "interpret"))
def head_stats(h_BxD: Array, w: Array, keys_Bx2: Array, temperature: Array, *, head_vd: bool, greedy: bool,
               valid_vocab: int, logits_dtype=jnp.float32, block_n: int = BLOCK_N, block_d: int = BLOCK_D,
               block_m: int = BLOCK_M, num_warps: int = 4, num_stages: int = 3,
               interpret: bool = False) -> HeadStats:
  """The kernel: HeadStats [V / block_n, R] of logits = h @ head (head_vd: w is [V, D], logits = h w^T; else w is
  [D, V]), rounded to logits_dtype. keys_Bx2: uint32 per-row keys (the Gumbel noise's); temperature: a scalar
  (unused when greedy). Columns >= valid_vocab are never picked and left out of the sampled distribution."""
  b, d = h_BxD.shape
  v = w.shape[0] if head_vd else w.shape[1]
  if w.shape != ((v, d) if head_vd else (d, v)):
    raise ValueError(f"head must be [V, D] (head_vd) or [D, V] with D={d}, got {w.shape}")
  if keys_Bx2.shape != (b, 2):
    raise ValueError(f"keys must be [B={b}, 2], got {keys_Bx2.shape}")
  block_d, block_n = pick_block(d, block_d), pick_block(v, block_n)
  if not (block_d and block_n):
    raise ValueError(f"head_stats needs D ({d}) and V ({v}) multiples of 16")
  mp, bm = decode_tiles.row_tiles(b, block_m)
  x = decode_tiles.pad_rows(h_BxD.astype(w.dtype), mp)
  k0, k1 = _key_words(keys_Bx2, mp)
  c = v // block_n
  w_spec = (pl.BlockSpec((block_n, d), lambda i, j: (j, 0)) if head_vd
            else pl.BlockSpec((d, block_n), lambda i, j: (0, j)))
  out_specs, out_shape = _stat_outputs(c, mp, bm)
  out = pl.pallas_call(
      functools.partial(_kernel, block_d=block_d, block_n=block_n, head_vd=head_vd, greedy=greedy,
                        valid_vocab=valid_vocab, vocab=v, logits_dtype=logits_dtype),
      grid=(mp // bm, c),
      in_specs=[
          pl.BlockSpec((1,), lambda i, j: (0,)),  # temperature
          pl.BlockSpec((bm,), lambda i, j: (i,)),  # key words 0
          pl.BlockSpec((bm,), lambda i, j: (i,)),  # key words 1
          pl.BlockSpec((bm, d), lambda i, j: (i, 0)),
          w_spec,
      ],
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="kevin_decode_head",
  )(jnp.reshape(temperature, (1,)).astype(jnp.float32), k0, k1, x, w)
  return HeadStats(*out)


def _logsumexp(m_BxC: Array, s_BxC: Array) -> Array:
  """log(sum_c s_c exp(m_c)) from blocks' maxima and sums of exp(x - m_c)."""
  top_B = m_BxC.max(axis=1)
  return top_B + jnp.log(jnp.sum(s_BxC * jnp.exp(m_BxC - top_B[:, None]), axis=1))


def finish(stats: HeadStats, rows: int, temperature: Array, greedy: bool) -> tuple[Array, Array, Array]:
  """(token_B int32, raw logprob_B, sampling logprob_B) from the blocks' statistics: sample_logits' outputs."""
  s = jax.tree.map(lambda a: a[:, :rows].T, stats)  # [B, C]
  best_B = jnp.argmax(s.pick_val, axis=1)[:, None]  # the first block with the largest value: the first maximum
  token_B = jnp.take_along_axis(s.pick_col, best_B, axis=1)[:, 0]
  logit_B = jnp.take_along_axis(s.pick_logit, best_B, axis=1)[:, 0]
  raw_B = logit_B - _logsumexp(s.raw_max, s.raw_sum)
  if greedy:
    return token_B, raw_B, jnp.zeros_like(raw_B)
  inv_t = 1.0 / jnp.asarray(temperature, jnp.float32)  # as the kernel scales: masked x * (1 / T)
  return token_B, raw_B, logit_B * inv_t - _logsumexp(s.samp_max, s.samp_sum)


def head_logits(h_BxD: Array, w: Array, head_vd: bool, logits_dtype=jnp.float32) -> Array:
  """h @ head [B, V] with XLA's GEMM (fp32 accumulation, IEEE for fp32 weights) in logits_dtype, as model.logits."""
  logits = jnp.einsum("bd,vd->bv" if head_vd else "bd,dv->bv", h_BxD.astype(w.dtype), w,
                      preferred_element_type=jnp.float32, precision=EXACT if w.dtype == jnp.float32 else None)
  return logits.astype(logits_dtype)


def sample(h_BxD: Array, w: Array, keys_Bx2: Array, temperature: Array, *, head_vd: bool, greedy: bool,
           valid_vocab: int, logits_dtype=jnp.float32, fuse_gemm: bool | int = FUSE_GEMM,
           interpret: bool = False) -> tuple[Array, Array, Array]:
  """The LM head and a draw per row: (token_B, raw logprob_B, sampling logprob_B) as sample_logits returns them
  for top_k = 0 and top_p = 1 (greedy: the argmax and 0), with hash_gumbel's noise. fuse_gemm: the head's GEMM
  inside the kernel (head_stats), else XLA's GEMM writes the logits and logits_stats reads them once."""
  if fuse_gemm:
    stats = head_stats(h_BxD, w, keys_Bx2, temperature, head_vd=head_vd, greedy=greedy, valid_vocab=valid_vocab,
                       logits_dtype=logits_dtype, interpret=interpret)
  else:
    stats = logits_stats(head_logits(h_BxD, w, head_vd, logits_dtype), keys_Bx2, temperature, greedy=greedy,
                         valid_vocab=valid_vocab, interpret=interpret)
  return finish(stats, h_BxD.shape[0], temperature, greedy)


def reference(h_BxD: Array, w: Array, keys_Bx2: Array, temperature: Array, *, head_vd: bool, greedy: bool,
              valid_vocab: int, logits_dtype=jnp.float32) -> tuple[Array, Array, Array]:
  """`sample` in jnp over whole rows (one block of V columns): what the kernel must return."""
  logits = head_logits(h_BxD, w, head_vd, logits_dtype).astype(jnp.float32)
  b, v = logits.shape
  k0, k1 = _key_words(keys_Bx2, b)
  inv_t = None if greedy else 1.0 / jnp.asarray(temperature, jnp.float32)
  stats = _block_stats(logits, jnp.arange(v, dtype=jnp.int32), k0, k1, inv_t, valid_vocab, v)
  return finish(HeadStats(*(a[None, :] for a in stats)), b, temperature, greedy)
