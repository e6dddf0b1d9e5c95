"""The sampling step's statistics over the vocabulary's column chunks in one Pallas pass (sample_logits(stats=)).

A decode step with temperature sampling needs, per row and per column chunk c of the [B, V] fp32 logits x (the
chunks of sampling._chunked: C = min(chunks, V // 256) of width W = ceil(V / C), the last one short):
- m_raw = max x and s_raw = sum exp(x - m_raw) (the raw log-sum-exp: log_softmax(x)[token], the GRPO log-prob);
- m_masked = max z, z = x with the columns >= valid_vocab set to NEG, and s_scaled = sum exp(z / T -
  m_masked / T) (the sampled distribution's log-sum-exp and the chunk masses of the two-stage Gumbel draw).
XLA computes them in three passes over the logits (the chunk maxima, then each distribution's sums of exp). Here
program (i, c) walks chunk c of rows [i*block_m, (i+1)*block_m) in tiles of block_n columns once,
keeping running maxima and sums rescaled to them (online softmax), and writes the four [block_m] results: one read
of the logits instead of three. By default a program takes one row's chunk in one tile (1 x 8,192 columns, 4,748
of them the chunk's). Alone the whole draw takes about two thirds of its time with XLA's passes; end to end +0.2 %
decode tokens/s at the 0.5B shape, B = 64 (experiments/sampler_kernels).

Numbers: fp32, with exp((z - m_masked) * (1 / T)) for XLA's exp(z / T - m_masked / T) (a multiply per element, not
a division and a second rounding), another order of summation, and each sum rescaled when its running maximum
grows: the sums differ from XLA's by a few fp32 roundings (tests/test_policy_sample_stats.py: relative 2e-6 against
the jnp reference, which divides as XLA does). A chunk of -inf only gives max -inf and sum 0, as
sampling._chunk_stats does.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

Array = jax.Array
NEG = -1e30  # a masked logit (finite), sampler's too
MIN_WIDTH = 256  # chunk_layout makes no chunks of fewer columns
BLOCK_N = 8192  # columns per tile at most: a chunk of V = 151,936 in 32 chunks (4,748 columns) in one tile
BLOCK_M = 1  # rows per program at most (the largest power of two dividing B up to this): B = 64 and 32 chunks
             # give 2,048 programs


def chunk_layout(vocab: int, chunks: int) -> tuple[int, int]:
  """(C, W): the sampling step's column chunks of a V = vocab row (sampling._chunked's view, this kernel's
  programs): C = min(chunks, V // MIN_WIDTH) chunks of W = ceil(V / C) columns; C < 2 means no chunks (sampler's
  one-stage path)."""
  c = min(chunks, vocab // MIN_WIDTH)
  return c, (-(-vocab // c) if c >= 1 else vocab)


def safe_max(m: Array) -> Array:
  """A running maximum to subtract: -inf (nothing finite seen yet) becomes 0, so exp(-inf - 0) = 0, not NaN."""
  return jnp.where(m == -jnp.inf, 0.0, m)


def _kernel(t_ref, x_ref, m_raw_ref, s_raw_ref, m_msk_ref, s_sc_ref, *, width: int, vocab: int, valid_vocab: int,
            block_n: int, aligned: int):
  c = pl.program_id(1)
  bm = x_ref.shape[0]
  inv_t = 1.0 / t_ref[0]
  start = c * width
  end = jnp.minimum(start + width, vocab)
  lanes = jnp.arange(block_n, dtype=jnp.int32)

  def body(k, carry):
    m_raw, s_raw, m_msk, s_sc = carry
    first = start + k * block_n  # this tile's first new column
    # The last tile of a chunk starts early enough to end at the chunk's end, or at column 0 (a tile wider than
    # the chunk): never past V. Its columns before `first` (the previous tile's) and from `end` on are masked.
    col0 = jnp.maximum(jnp.minimum(first, end - block_n), 0)
    if aligned > 1:
      col0 = pl.multiple_of(col0, aligned)
    cols = col0 + lanes
    new = ((cols >= first) & (cols < end))[None, :]
    x = pl_triton.load(x_ref.at[:, pl.ds(col0, block_n)], mask=jnp.broadcast_to(new, (bm, block_n)),
                       other=-jnp.inf).astype(jnp.float32)
    z = jnp.where(new & (cols >= valid_vocab)[None, :], NEG, x) if valid_vocab < vocab else x

    m_raw_new = jnp.maximum(m_raw, x.max(axis=1))
    safe = safe_max(m_raw_new)
    s_raw = s_raw * jnp.exp(m_raw - safe) + jnp.exp(x - safe[:, None]).sum(axis=1)
    m_msk_new = jnp.maximum(m_msk, z.max(axis=1))
    safe_msk = safe_max(m_msk_new)
    s_sc = s_sc * jnp.exp((m_msk - safe_msk) * inv_t) + jnp.exp((z - safe_msk[:, None]) * inv_t).sum(axis=1)
    return m_raw_new, s_raw, m_msk_new, s_sc

  neg = jnp.full((bm,), -jnp.inf, jnp.float32)
  zero = jnp.zeros((bm,), jnp.float32)
  tiles = (end - start + block_n - 1) // block_n
  m_raw, s_raw, m_msk, s_sc = jax.lax.fori_loop(0, tiles, body, (neg, zero, neg, zero))
  m_raw_ref[...] = m_raw
  s_raw_ref[...] = s_raw
  m_msk_ref[...] = m_msk
  s_sc_ref[...] = s_sc


@functools.partial(jax.jit, static_argnames=("chunks", "valid_vocab", "block_n", "block_m", "num_warps",
                                             "num_stages", "interpret"))
def chunk_stats(logits_BxV: Array, temperature: Array, *, chunks: int, valid_vocab: int, block_n: int = BLOCK_N,
                block_m: int = BLOCK_M, num_warps: int = 4, num_stages: int = 3,
                interpret: bool = False) -> tuple[Array, Array, Array, Array]:
  """(m_raw, s_raw, m_masked, s_scaled), each fp32 [B, C], of the logits [B, V] (any float dtype, read as fp32)
  over sampling._chunked's C column chunks (module docstring); temperature: a scalar > 0. Needs C >= 2; block_n (a
  power of two >= 16) shrinks by halves to the smallest power of two covering a chunk, and to at most V."""
  b, v = logits_BxV.shape
  c, width = chunk_layout(v, chunks)
  if c < 2:
    raise ValueError(f"chunk_stats needs >= 2 chunks of >= {MIN_WIDTH} columns, got V={v}, chunks={chunks}")
  if jnp.ndim(temperature) and jnp.size(temperature) != 1:
    raise ValueError(f"temperature must be a scalar, got shape {jnp.shape(temperature)}")
  if block_n < 16 or block_n & (block_n - 1):
    raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
  while block_n > v or block_n >= 2 * width:  # tiles inside the array, no wider than the chunk needs
    block_n //= 2
  bm = min(block_m, b & -b)
  # Tiles start at multiples of 4 columns (16 bytes of fp32) when W and V are such multiples.
  aligned = 4 if width % 4 == 0 and v % 4 == 0 else 1
  stat = jax.ShapeDtypeStruct((c, b), jnp.float32)
  out = pl.pallas_call(
      functools.partial(_kernel, width=width, vocab=v, valid_vocab=valid_vocab, block_n=block_n, aligned=aligned),
      grid=(b // bm, c),
      in_specs=[
          pl.BlockSpec((1,), lambda i, j: (0,)),
          pl.BlockSpec((bm, v), lambda i, j: (i, 0)),
      ],
      out_specs=[pl.BlockSpec((None, bm), lambda i, j: (j, i))] * 4,
      out_shape=[stat] * 4,
      compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="kevin_chunk_stats",
  )(jnp.reshape(temperature, (1,)).astype(jnp.float32), logits_BxV)
  return tuple(o.T for o in out)


def reference(logits_BxV: Array, temperature: Array, *, chunks: int, valid_vocab: int) -> tuple[Array, ...]:
  """chunk_stats in jnp over the padded [B, C, W] view (sampling._chunked's), for the tests."""
  b, v = logits_BxV.shape
  c, width = chunk_layout(v, chunks)
  x = jnp.pad(logits_BxV.astype(jnp.float32), ((0, 0), (0, c * width - v)), constant_values=-jnp.inf)
  cols = jnp.arange(c * width)
  z = jnp.where((cols >= valid_vocab) & (cols < v), NEG, x)
  x, z = x.reshape(b, c, width), z.reshape(b, c, width)
  m_raw, m_msk = x.max(axis=-1), z.max(axis=-1)
  s_raw = jnp.exp(x - safe_max(m_raw)[..., None]).sum(axis=-1)
  m_sc = m_msk / temperature
  s_sc = jnp.exp(z / temperature - safe_max(m_sc)[..., None]).sum(axis=-1)
  return m_raw, s_raw, m_msk, s_sc
