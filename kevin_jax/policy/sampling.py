"""Sampling math of the policy's sampler: one token per row from fp32 logits, and the row statistics it needs.

  token_B, raw_logp_B, sampling_logp_B = sample_logits(logits_BxV, keys_B, temperature, top_p, top_k=0,
                                                       greedy=False, use_top_p=False, valid_vocab=V)

temperature == 0 (greedy) is the argmax of the raw logits. Otherwise logits / temperature, then top-k (k > 0 keeps
the k largest), then top-p (smallest set of largest-probability tokens whose mass reaches top_p; ties at the
threshold are all kept), then a Gumbel-max draw. Ids >= valid_vocab (Qwen's padded embedding rows) are never
drawn. The row reductions (argmax_rows, logsumexp_rows, gumbel_sample_rows) run in two stages over column chunks:
a one-stage row reduction gives each row one thread block, which leaves most of a GPU's SMs idle at decode batch
sizes. The chunks' maxima and sums of exp come from XLA, or from one Pallas pass over the logits
(decode/sample_stats.py; `stats`, which the sampler's DecodePlan resolves).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kevin_jax.policy.decode import sample_stats

Array = jax.Array
NEG = sample_stats.NEG  # masked logit (finite, so softmax of an all-masked row cannot make NaNs)
_NEG = NEG
_STATS = ("xla", "auto", "pallas", "interpret")


def _chunked(x_BxV: Array, chunks: int) -> Array | None:
  """[B, C, W] view of x padded with -inf to C * W columns, (C, W) = sample_stats.chunk_layout (C = min(chunks,
  V // 256)); None if C < 2."""
  b, v = x_BxV.shape
  c, width = sample_stats.chunk_layout(v, chunks)
  if c < 2:
    return None
  return jnp.pad(x_BxV, ((0, 0), (0, c * width - v)), constant_values=-jnp.inf).reshape(b, c, width)


def argmax_rows(x_BxV: Array, chunks: int = 32) -> Array:
  """jnp.argmax(x_BxV, axis=-1) (int32), computed in two stages: the first index of each of `chunks` column
  chunks' maximum, then of the chunks' maxima. Same result, ties and NaNs included (first index of the first
  maximum). A one-stage row reduction gives each of the B rows one thread block, so a decode step's [64, 151936]
  argmax would keep only 64 of a GPU's 132 SMs busy."""
  x_BxCxW = _chunked(x_BxV, chunks)
  if x_BxCxW is None:
    return jnp.argmax(x_BxV, axis=-1).astype(jnp.int32)
  width = x_BxCxW.shape[-1]
  i_BxC = jnp.argmax(x_BxCxW, axis=-1)
  m_BxC = jnp.take_along_axis(x_BxCxW, i_BxC[..., None], axis=-1)[..., 0]
  c_B = jnp.argmax(m_BxC, axis=-1)
  return (c_B * width + jnp.take_along_axis(i_BxC, c_B[:, None], axis=-1)[:, 0]).astype(jnp.int32)


def logsumexp_rows(x_BxV: Array, chunks: int = 32, m_BxC: Array | None = None,
                   s_BxC: Array | None = None) -> Array:
  """jax.scipy.special.logsumexp(x_BxV, axis=-1) in two stages: each of `chunks` column chunks' maximum m_c and
  sum s_c of exp(x - m_c), then M = max_c m_c and M + log(sum_c s_c exp(m_c - M)). Equal to jax's for rows of
  finite values and -inf (all -inf -> -inf); a row with +inf or NaN gives NaN (jax: +inf for +inf), which
  logits never hold. Two stages for the reason argmax_rows gives: one block per row leaves SMs idle.
  m_BxC (and s_BxC): the chunk maxima (and sums), if the caller has them (chunk_max_rows(x_BxV, chunks);
  sample_stats.chunk_stats)."""
  if m_BxC is not None and s_BxC is not None:
    return _chunks_logsumexp(m_BxC, s_BxC)
  x_BxCxW = _chunked(x_BxV, chunks)
  if x_BxCxW is None:
    return jax.scipy.special.logsumexp(x_BxV, axis=-1)
  return _chunks_logsumexp(*_chunk_stats(x_BxCxW, m_BxC))


def _chunks_logsumexp(m_BxC: Array, s_BxC: Array) -> Array:
  """The rows' log-sum-exps from their chunks' maxima and sums of exp (logsumexp_rows' second stage)."""
  # The barrier keeps XLA from merging max_c(max_w x) into one reduction of its own over all of x: in the decode
  # step's HLO that was another full pass over the [B, V] logits (and a second stage) per logsumexp.
  m_B = jnp.max(jax.lax.optimization_barrier(m_BxC), axis=-1)
  m_B = sample_stats.safe_max(m_B)  # an all -inf row: log(0) = -inf below
  return m_B + jnp.log(jnp.sum(s_BxC * jnp.exp(m_BxC - m_B[:, None]), axis=-1))


def chunk_max_rows(x_BxV: Array, chunks: int = 32) -> Array | None:
  """The maxima [B, C] of the column chunks that logsumexp_rows and gumbel_sample_rows use (None: one stage)."""
  x_BxCxW = _chunked(x_BxV, chunks)
  return None if x_BxCxW is None else jnp.max(x_BxCxW, axis=-1)


def _chunk_stats(x_BxCxW: Array, m_BxC: Array | None = None) -> tuple[Array, Array]:
  """Per chunk: its maximum m (computed unless given) and sum(exp(x - m)) (-inf and 0 for an all -inf chunk)."""
  if m_BxC is None:
    m_BxC = jnp.max(x_BxCxW, axis=-1)
  safe_BxC = sample_stats.safe_max(m_BxC)  # exp(-inf - 0) = 0, where exp(-inf - -inf) is NaN
  return m_BxC, jnp.sum(jnp.exp(x_BxCxW - safe_BxC[..., None]), axis=-1)


def gumbel_sample_rows(x_BxV: Array, keys_B: Array, chunks: int = 32, m_BxC: Array | None = None,
                       s_BxC: Array | None = None) -> Array:
  """One draw per row from softmax(x_BxV) (int32), by Gumbel-argmax in two stages: a column chunk c with probability
  S_c / S (Gumbel-argmax over the chunks' log-masses log S_c), then a token j of it with probability exp(x_j) /
  S_c (Gumbel-argmax within the chunk), so P(j) = exp(x_j) / S exactly. That takes C + W Gumbel draws per row
  instead of V: generating [64, 151936] threefry Gumbels would be the decode step's largest non-GEMM kernel (two
  stages: +3.1 % decode tokens/s, experiments/sampler_kernels). chunks < 2 (or V < 512): the one-stage draw. Rows
  must have a finite maximum (logits do; masked entries are finite _NEG). m_BxC (and s_BxC): the chunk maxima (and
  sums of exp), if the caller has them."""
  x_BxCxW = _chunked(x_BxV, chunks)
  if x_BxCxW is None:
    v = x_BxV.shape[-1]
    return argmax_rows(x_BxV + jax.vmap(lambda k: jax.random.gumbel(k, (v,), jnp.float32))(keys_B), chunks)
  _, c, w = x_BxCxW.shape
  if m_BxC is None or s_BxC is None:
    m_BxC, s_BxC = _chunk_stats(x_BxCxW, m_BxC)
  log_mass_BxC = jnp.where(s_BxC > 0, m_BxC + jnp.log(s_BxC), -jnp.inf)
  keys_Bx2 = jax.vmap(jax.random.split)(keys_B)
  chunk_B = jnp.argmax(log_mass_BxC + jax.vmap(lambda k: jax.random.gumbel(k, (c,), jnp.float32))(keys_Bx2[:, 0]),
                       axis=-1)
  x_BxW = jnp.take_along_axis(x_BxCxW, chunk_B[:, None, None], axis=1)[:, 0]
  j_B = jnp.argmax(x_BxW + jax.vmap(lambda k: jax.random.gumbel(k, (w,), jnp.float32))(keys_Bx2[:, 1]), axis=-1)
  return (chunk_B * w + j_B).astype(jnp.int32)


def stats_impl(stats: str, vocab: int, reduce_chunks: int, top_k: int, greedy: bool, use_top_p: bool,
               scalar_temperature: bool = True) -> str:
  """sample_logits' `stats` for these settings, 'auto' resolved: 'xla' | 'pallas' | 'interpret'. The kernel serves
  temperature sampling over >= 2 chunks only (no top-k / top-p: they change the distribution first; greedy needs
  no sums of the scaled logits); 'auto' also leaves a per-row temperature to XLA (the kernel takes a scalar)."""
  if stats not in _STATS:
    raise ValueError(f"stats must be one of {_STATS}, got {stats!r}")
  if greedy or top_k > 0 or use_top_p or sample_stats.chunk_layout(vocab, reduce_chunks)[0] < 2:
    return "xla"
  if stats == "auto":
    return "pallas" if jax.default_backend() == "gpu" and scalar_temperature else "xla"
  return stats


def sample_logits(logits_BxV: Array, keys_B: Array, temperature: Array, top_p: Array, *, top_k: int,
                  greedy: bool, use_top_p: bool, valid_vocab: int, reduce_chunks: int = 32,
                  stats: str = "auto") -> tuple[Array, Array, Array]:
  """Draws one token per row. Returns (token_B int32, raw logprob_B, sampling logprob_B), all from fp32 logits.
  `reduce_chunks`: SamplerConfig.reduce_chunks. `stats`: where the chunks' maxima and sums of exp come from,
  'xla' (three XLA passes over the logits) | 'pallas' (sample_stats.chunk_stats: one pass) | 'interpret' (the
  kernel in interpret mode, CPU tests) | 'auto' (the kernel on a GPU); stats_impl says where the kernel serves.
  The kernel's sums differ from XLA's by fp32 rounding, so the token drawn for a seed can differ only where two
  chunks' Gumbel-perturbed masses tie to within that rounding."""
  logits_BxV = logits_BxV.astype(jnp.float32)
  v = logits_BxV.shape[-1]
  impl = stats_impl(stats, v, reduce_chunks, top_k, greedy, use_top_p, jnp.size(temperature) == 1)

  def logp_of(x_BxV, token_B, m_BxC, s_BxC=None):  # log_softmax(x)[token] without a [B, V] log-softmax
    return (jnp.take_along_axis(x_BxV, token_B[:, None], axis=-1)[:, 0]
            - logsumexp_rows(x_BxV, reduce_chunks, m_BxC, s_BxC))

  masked_BxV = logits_BxV
  if valid_vocab < v:
    masked_BxV = jnp.where(jnp.arange(v)[None, :] < valid_vocab, logits_BxV, _NEG)
  if impl != "xla":
    m_raw_BxC, s_raw_BxC, m_masked_BxC, s_scaled_BxC = sample_stats.chunk_stats(
        logits_BxV, temperature, chunks=reduce_chunks, valid_vocab=valid_vocab, interpret=impl == "interpret")
    scaled_BxV = masked_BxV / temperature
    m_scaled_BxC = m_masked_BxC / temperature  # as below: max(x / T) == max(x) / T
    token_B = gumbel_sample_rows(scaled_BxV, keys_B, reduce_chunks, m_scaled_BxC, s_scaled_BxC)
    return (token_B, logp_of(logits_BxV, token_B, m_raw_BxC, s_raw_BxC),
            logp_of(scaled_BxV, token_B, m_scaled_BxC, s_scaled_BxC))
  m_raw_BxC = chunk_max_rows(logits_BxV, reduce_chunks)
  if greedy:
    token_B = argmax_rows(masked_BxV, reduce_chunks)
    samp_logp_B = jnp.zeros(token_B.shape, jnp.float32)
  else:
    scaled_BxV = masked_BxV / temperature
    m_scaled_BxC = None
    if top_k == 0 and not use_top_p and m_raw_BxC is not None:
      # max(x / T) == max(x) / T exactly (T > 0, rounding is monotonic), so the scaled logits' chunk maxima come
      # from the logits': the step reads the [B, V] logits for chunk maxima once, not once per distribution.
      m_masked_BxC = m_raw_BxC if valid_vocab == v else chunk_max_rows(masked_BxV, reduce_chunks)
      m_scaled_BxC = m_masked_BxC / temperature
    if top_k > 0:
      kth_Bx1 = jax.lax.top_k(scaled_BxV, top_k)[0][:, -1:]
      scaled_BxV = jnp.where(scaled_BxV >= kth_Bx1, scaled_BxV, _NEG)
    if use_top_p:
      sorted_BxV = -jnp.sort(-scaled_BxV, axis=-1)
      probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
      mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV  # exclusive: the top token always stays
      keep_BxV = mass_before_BxV < top_p
      threshold_Bx1 = jnp.min(jnp.where(keep_BxV, sorted_BxV, jnp.inf), axis=-1, keepdims=True)
      scaled_BxV = jnp.where(scaled_BxV >= threshold_Bx1, scaled_BxV, _NEG)
    if m_scaled_BxC is None:
      m_scaled_BxC = chunk_max_rows(scaled_BxV, reduce_chunks)
    token_B = gumbel_sample_rows(scaled_BxV, keys_B, reduce_chunks, m_scaled_BxC)
    samp_logp_B = logp_of(scaled_BxV, token_B, m_scaled_BxC)
  return token_B, logp_of(logits_BxV, token_B, m_raw_BxC), samp_logp_B
