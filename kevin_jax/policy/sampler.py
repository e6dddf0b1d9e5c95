"""Batched KV-cache generation for the Qwen2 policy: one jitted prefill + on-device decode loop per call.

  sampler = Sampler(model.cfg, tokenizer, SamplerConfig(batch_size=64))
  out = sampler.generate(model, prompts_token_ids, seed=0, max_new_tokens=1024, temperature=0.9,
                         stop_strings=("</kernel>",))
  out.tokens[i], out.text[i], out.logprobs[i], out.finish_reason[i]    # per prompt, in input order

How it runs. Prompts are split into chunks of `batch_size`, right-padded to the smallest prompt bucket that fits
(`prompt_buckets`), and each chunk makes two jitted calls: `_prefill` fills a [B, K, P + max_new_tokens, H] KV cache
per layer (`kv_cache_dtype`, bf16 by default; max_new_tokens rounded up to 64 slots) and samples the first token
from the last real prompt position; `_decode_loop` takes that state (donated, so the cache is updated in place and
never copied) and decodes in a `lax.while_loop` on device (no host round trip per token; attention by the model's
`decode_attention`: on a GPU the Pallas kernel that reads only each row's prompt and generated slots) until every
row has finished or `max_new_tokens` tokens exist; `decode_fusion` compiles it with XLA's multi-output fusions. Both
are compiled once per key (batch, prompt bucket, max_new_tokens, top_k, greedy / top-p on-off, number of stop
sequences, cache dtype): calls with the same key reuse them, whatever the prompts, seed, temperature, top_p value or
weights. The parameters are jit ARGUMENTS (never baked-in constants), so the RL loop can update them between calls
without recompiling, and they may be sharded on a mesh (jit follows their shardings; pass `mesh` + `batch_axes` to
also shard the batch). A chunk with fewer prompts than `batch_size` is padded with inactive rows (a call with fewer
prompts than `batch_size` in total uses the next power of two instead, to save compute). `Sampler.warmup` compiles a
key ahead of time.
`Sampler.last_stats` holds the last call's decode steps and prefill / decode wall times.

Sampling. temperature == 0 is greedy (argmax of the raw logits). Otherwise logits / temperature, then top-k
(k > 0 keeps the k largest), then top-p (smallest set of largest-probability tokens whose mass reaches top_p;
ties at the threshold are all kept), then a Gumbel-max draw. Token ids the tokenizer cannot produce (Qwen's
padded embedding rows) are never sampled. Randomness is per prompt: prompt i (global index in the call) uses
fold_in(PRNGKey(seed), i), then fold_in(step), so results do not depend on chunking or on the other prompts.
The draw and both log-probs need each vocabulary chunk's maximum and sums of exp (sample_logits); without top-k /
top-p, on a GPU, one Pallas pass over the logits computes them (policy/sample_stats.py; `STATS`), else XLA.

Log-probabilities. `logprobs[i][t]` = log_softmax(raw model logits)[token], i.e. log pi_theta(token | prefix) of
the unmodified policy at temperature 1 over the full model vocabulary, computed in fp32 from the same forward pass
that produced the token: what GRPO's importance ratio needs as the old-policy log-prob (the learner recomputes
the same quantity). `sampling_logprobs[i][t]` is the log-prob under the distribution actually sampled
(temperature, top-k, top-p and the tokenizer-vocabulary mask applied; 0 for greedy), for importance-sampling
corrections. With top_k = 0, top_p = 1 and a tokenizer covering the model's vocabulary (the bundled presets),
it equals log_softmax(logits / temperature)[token] exactly as a learner recomputes it; with Qwen's padded
vocabulary (151,936 rows, 151,665 tokens) it differs by the masked rows' probability mass (~0 once trained).

Stopping. A row finishes on any of `eos_ids` (default: the tokenizer's; the EOS token is included in `tokens`
and `logprobs` but not in `text`), on a stop string, or at max_new_tokens. Stop strings are matched exactly on
the decoded text on the host: the tokens are cut after the first token whose decoded prefix contains a stop
string (so `text`, which is always decode(tokens), ends with the stop string, plus the rest of that last token).
As an early exit, each stop string's own tokenization (up to 16 tokens) is also matched on device.
finish_reason is 'eos' | 'stop' | 'length'.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from kevin_jax.policy import decode_head as head_kernel
from kevin_jax.policy import sample_stats
from kevin_jax.policy.config import ModelConfig
from kevin_jax.policy.decode_attention import BLOCK_K, SlotRanges
from kevin_jax.policy.model import KVCache, Qwen2, decode_norm_impl

Array = jax.Array
STOP_SEQ_LEN = 16  # tokens of a stop string matched on device (longer ones are matched on the host only)
_FINISH = ("length", "eos", "stop")
_NEG = sample_stats.NEG  # masked logit (finite, so softmax of an all-masked row cannot make NaNs)
_DECODE_HEAD = ("xla", "auto", "pallas", "interpret")
_STATS = ("xla", "auto", "pallas", "interpret")
STATS = "auto"  # sample_logits' default `stats`: the one-pass kernel on a GPU (policy/sample_stats.py)
TRACE_COUNT = {"generate": 0}  # incremented when _prefill or _decode_loop is traced (tests assert no recompilation)


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """Sampler settings (configs/multiturn.py `config.sampler`).

  Attributes:
    batch_size: sequences decoded together per compiled call.
    prompt_buckets: padded prompt lengths, tokens (each compiled once per batch / max_new_tokens).
    kv_cache_dtype: 'bfloat16' | 'float32' | 'float16'.
    max_new_tokens, temperature, top_p, top_k: defaults for `generate` (top_p 1.0 / top_k 0 = off).
    reduce_chunks: column chunks of the sampling step's work over the vocabulary (argmax_rows, logsumexp_rows,
      gumbel_sample_rows); 1 = one-stage row reductions (one thread block per row) and V Gumbel draws per row.
    decode_fusion: compile the decode loop (only it) with XLA's multi-output Triton fusions
      (DECODE_FUSION_OPTIONS), which can merge a decode layer's residual add with the next RMSNorm; the prefill
      and every other compilation of the process keep XLA's defaults. Opt-in: with the decode kernels it gains
      +0.3 %, within the runs' spread (BENCHMARKS.md Sampler). tests/test_policy_gpu.py passes with it.
    decode_head: the LM head and the draw, in prefill and decode steps: 'xla' (the default: the head's GEMM writes
      the [B, V] logits, then sample_logits) | 'auto' (the one Pallas kernel of policy/decode_head.py on a GPU, for
      batches of at most decode_head.MAX_ROWS rows, where its shape rule holds, else 'xla') | 'pallas' |
      'interpret' (CPU tests). The kernel does temperature sampling and greedy decoding only: with top_k > 0 or
      top_p < 1 every setting takes the 'xla' path. It draws its Gumbel noise from a hash of the same per-row
      keys, so for one seed it samples other tokens than 'xla' does, from the same distribution. Opt-in: -1.1 to
      -1.5 % decode tokens/s at the 0.5B shape, B = 64 (BENCHMARKS.md Sampler).
  """
  batch_size: int = 64
  prompt_buckets: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
  kv_cache_dtype: str = "bfloat16"
  max_new_tokens: int = 1024
  temperature: float = 0.9
  top_p: float = 1.0
  top_k: int = 0
  reduce_chunks: int = 32
  decode_fusion: bool = False
  decode_head: str = "xla"

  def __post_init__(self):
    if self.decode_head not in _DECODE_HEAD:
      raise ValueError(f"decode_head must be one of {_DECODE_HEAD}, got {self.decode_head!r}")
    if self.reduce_chunks < 1:
      raise ValueError(f"reduce_chunks must be >= 1, got {self.reduce_chunks}")
    if self.batch_size <= 0:
      raise ValueError(f"batch_size must be positive, got {self.batch_size}")
    if not self.prompt_buckets or any(b <= 0 for b in self.prompt_buckets):
      raise ValueError(f"prompt_buckets must be positive lengths, got {self.prompt_buckets}")
    object.__setattr__(self, "prompt_buckets", tuple(sorted(int(b) for b in self.prompt_buckets)))

  @classmethod
  def from_config(cls, c: Any) -> "SamplerConfig":
    """From the `config.sampler` ConfigDict section."""
    return cls(batch_size=c.batch_size, prompt_buckets=tuple(c.prompt_buckets), kv_cache_dtype=c.kv_cache_dtype,
               max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
               decode_fusion=c.decode_fusion, decode_head=c.decode_head)


@dataclasses.dataclass
class SamplerOutput:
  """Per-prompt results, in the order of the prompts given to `generate`."""
  tokens: list[list[int]]  # generated ids (EOS included when finish_reason == 'eos')
  text: list[str]  # decode(tokens) without a trailing EOS token ('' without a tokenizer)
  logprobs: list[np.ndarray]  # float32 [len(tokens[i])]: log pi_theta(token) of the raw policy (T=1)
  sampling_logprobs: list[np.ndarray]  # float32 [len(tokens[i])]: under the sampled (modified) distribution
  finish_reason: list[str]  # 'eos' | 'stop' | 'length'
  prompt_tokens: list[list[int]]


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
                  stats: str = STATS) -> tuple[Array, Array, Array]:
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


def _fold_keys(keys_Bx2: Array, step: Array) -> Array:
  return jax.vmap(lambda k: jax.random.fold_in(k, step))(keys_Bx2)


_STATIC = ("graphdef", "max_new_tokens", "top_k", "greedy", "use_top_p", "valid_vocab", "reduce_chunks",
           "decode_head", "cache_dtype", "batch_sharding")


def _finish(tok_B, window_BxL, count_B, done_B, reason_B, eos_Q, stop_seqs_ExL):
  """Slides the last-L-token window and updates done flags / finish codes after emitting tok_B."""
  window_BxL = jnp.concatenate([window_BxL[:, 1:], tok_B[:, None]], axis=1)
  is_eos_B = jnp.any(tok_B[:, None] == eos_Q[None, :], axis=1)
  if stop_seqs_ExL.shape[0]:
    seq_len_E = jnp.sum(stop_seqs_ExL >= 0, axis=1)
    match_BxE = jnp.all((window_BxL[:, None, :] == stop_seqs_ExL[None]) | (stop_seqs_ExL[None] < 0), axis=2)
    match_BxE &= (count_B[:, None] >= seq_len_E[None, :]) & (seq_len_E[None, :] > 0)
    is_stop_B = jnp.any(match_BxE, axis=1)
  else:
    is_stop_B = jnp.zeros_like(is_eos_B)
  new_reason_B = jnp.where(is_eos_B, 1, jnp.where(is_stop_B, 2, 0))
  reason_B = jnp.where(done_B, reason_B, new_reason_B)
  return window_BxL, done_B | is_eos_B | is_stop_B, reason_B


def head_impl(decode_head: str, model_cfg: ModelConfig, rows: int, top_k: int, use_top_p: bool) -> str:
  """SamplerConfig.decode_head for `rows` rows, 'auto' resolved: 'xla' | 'pallas' | 'interpret'."""
  if top_k > 0 or use_top_p:
    return "xla"
  if decode_head == "auto":
    fits = head_kernel.supported(model_cfg.hidden_size, model_cfg.vocab_size) and rows <= head_kernel.MAX_ROWS
    return "pallas" if fits and jax.default_backend() == "gpu" else "xla"
  return decode_head


def _sampler_fn(model: Qwen2, decode_head, temperature, top_p, top_k, greedy, use_top_p, valid_vocab,
                reduce_chunks):
  """fn(h_BxD final-normed hidden states, keys_B) -> (token_B, raw logprob_B, sampling logprob_B): the LM head and
  sample_logits, or decode_head's kernel (SamplerConfig.decode_head)."""

  def fn(h_BxD, keys_B):
    impl = head_impl(decode_head, model.cfg, h_BxD.shape[0], top_k, use_top_p)
    if impl == "xla":
      return sample_logits(model.logits(h_BxD[:, None])[:, 0], keys_B, temperature, top_p, top_k=top_k,
                           greedy=greedy, use_top_p=use_top_p, valid_vocab=valid_vocab, reduce_chunks=reduce_chunks)
    w, head_vd = model.head_weight()
    return head_kernel.sample(h_BxD, w, keys_B, temperature, head_vd=head_vd, greedy=greedy,
                              valid_vocab=valid_vocab, logits_dtype=model.logits_dtype,
                              interpret=impl == "interpret")

  return fn


def _constrain(x, batch_sharding):
  if batch_sharding is None:
    return x
  mesh, axes = batch_sharding
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(axes, *([None] * (x.ndim - 1)))))


def _gen_slots(max_new_tokens: int) -> int:
  """Cache slots for generated tokens: max_new_tokens rounded up to the decode kernel's block."""
  return -(-max_new_tokens // BLOCK_K) * BLOCK_K


@functools.partial(jax.jit, static_argnames=_STATIC)
def _prefill(graphdef, state, prompts_BxP, lengths_B, active_B, keys_Bx2, temperature, top_p, eos_Q,
             stop_seqs_ExL, *, max_new_tokens, top_k, greedy, use_top_p, valid_vocab, reduce_chunks, decode_head,
             cache_dtype, batch_sharding):
  """Fills slots [0, P) of a [B, K, P + _gen_slots(max_new_tokens), H] cache and samples token 0; returns the
  loop carry."""
  TRACE_COUNT["generate"] += 1
  model: Qwen2 = nnx.merge(graphdef, state)
  b, p = prompts_BxP.shape
  n = max_new_tokens
  sample = _sampler_fn(model, decode_head, temperature, top_p, top_k, greedy, use_top_p, valid_vocab, reduce_chunks)
  cache = KVCache.zeros(model.cfg, b, p + _gen_slots(n), jnp.dtype(cache_dtype))
  cache = jax.tree.map(lambda x: _constrain(x, batch_sharding), cache)
  positions_BxP = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32)[None, :], (b, p))
  mask_BxP = positions_BxP < lengths_B[:, None]
  h_BxPxD, cache = model.hidden_with_cache(prompts_BxP, positions_BxP, mask_BxP, cache, 0)
  last_Bx1xD = jnp.take_along_axis(h_BxPxD, (lengths_B - 1)[:, None, None], axis=1)
  tok_B, raw_B, samp_B = sample(last_Bx1xD[:, 0], _fold_keys(keys_Bx2, 0))
  count_B = jnp.ones((b,), jnp.int32)  # tokens emitted per row (including the one that finished it)
  window_BxL, done_B, reason_B = _finish(tok_B, jnp.full((b, stop_seqs_ExL.shape[1]), -1, jnp.int32), count_B,
                                         ~active_B, jnp.zeros((b,), jnp.int32), eos_Q, stop_seqs_ExL)
  return dict(i=jnp.int32(1), cache=cache, last=tok_B, count=count_B, done=done_B, reason=reason_B,
              window=window_BxL, tokens=jnp.zeros((b, n), jnp.int32).at[:, 0].set(tok_B),
              logprobs=jnp.zeros((b, n), jnp.float32).at[:, 0].set(raw_B),
              sampling_logprobs=jnp.zeros((b, n), jnp.float32).at[:, 0].set(samp_B))


def _decode_loop(graphdef, state, carry, lengths_B, keys_Bx2, temperature, top_p, eos_Q, stop_seqs_ExL, *,
                 max_new_tokens, top_k, greedy, use_top_p, valid_vocab, reduce_chunks, decode_head, cache_dtype,
                 batch_sharding):
  """The decode loop (lax.while_loop on device) until every row is done or max_new_tokens tokens exist.

  `carry` (cache and output buffers) is donated: the cache is updated in place, never copied.
  """
  del cache_dtype, batch_sharding
  TRACE_COUNT["generate"] += 1
  model: Qwen2 = nnx.merge(graphdef, state)
  if decode_norm_impl(model.cfg) != "xla":
    # Once, before the loop (XLA did not hoist the fold out of it), for the kernels that run at this batch.
    model.fold_decode_norms(carry["last"].shape[0])
  sample = _sampler_fn(model, decode_head, temperature, top_p, top_k, greedy, use_top_p, valid_vocab, reduce_chunks)

  def cond(c):
    return (c["i"] < max_new_tokens) & ~jnp.all(c["done"])

  p = carry["cache"].length - _gen_slots(max_new_tokens)  # the prompt bucket

  def body(c):
    i = c["i"]
    pos_Bx1 = (lengths_B + i - 1)[:, None]  # token i-1 has position len + i - 1 and goes to slot P + i - 1
    # Visible: the row's real prompt slots and the generated slots up to and including this one.
    visible = SlotRanges(prompt_len_B=lengths_B, gen_len=i, gen_start=p)
    h_Bx1xD, cache = model.hidden_with_cache(c["last"][:, None], pos_Bx1, None, c["cache"], p + i - 1, visible)
    tok_B, raw_B, samp_B = sample(h_Bx1xD[:, 0], _fold_keys(keys_Bx2, i))
    live_B = ~c["done"]
    tok_B = jnp.where(live_B, tok_B, 0)
    put = lambda buf, x_B: jax.lax.dynamic_update_slice(buf, x_B[:, None], (0, i))
    count_B = c["count"] + live_B.astype(jnp.int32)
    window_BxL, done_B, reason_B = _finish(tok_B, c["window"], count_B, c["done"], c["reason"], eos_Q,
                                           stop_seqs_ExL)
    return dict(i=i + 1, cache=cache, last=tok_B, count=count_B, done=done_B, reason=reason_B, window=window_BxL,
                tokens=put(c["tokens"], tok_B), logprobs=put(c["logprobs"], jnp.where(live_B, raw_B, 0.0)),
                sampling_logprobs=put(c["sampling_logprobs"], jnp.where(live_B, samp_B, 0.0)))

  # The whole final carry is returned so every donated input buffer aliases an output (no copy into the loop).
  return jax.lax.while_loop(cond, body, carry)


# XLA options of the decode loop's compilation with SamplerConfig.decode_fusion (per compilation, not XLA_FLAGS).
DECODE_FUSION_OPTIONS = {"xla_gpu_unsupported_enable_triton_multi_output_fusion": True}
_DECODE = {fusion: jax.jit(_decode_loop, static_argnames=_STATIC, donate_argnames=("carry",),
                           compiler_options=DECODE_FUSION_OPTIONS if fusion else None)
           for fusion in (False, True)}


class Sampler:
  """Generates from a Qwen2 policy. See the module docstring for the contract.

  Args:
    model_cfg: the policy's ModelConfig.
    tokenizer: a kevin_jax.policy.tokenizer.Tokenizer (None: token ids only; no text, no stop strings).
    cfg: SamplerConfig.
    mesh, batch_axes: optional; shard the batch dimension of prompts and KV cache over these mesh axes.
  """

  def __init__(self, model_cfg: ModelConfig, tokenizer: Any = None, cfg: SamplerConfig = SamplerConfig(), *,
               mesh: Mesh | None = None, batch_axes: str | tuple[str, ...] | None = None):
    self.model_cfg = model_cfg
    self.tokenizer = tokenizer
    self.cfg = cfg
    self.mesh = mesh
    self.batch_axes = batch_axes
    if (mesh is None) != (batch_axes is None):
      raise ValueError("pass both mesh and batch_axes, or neither")
    self._graphdef = None
    self.last_stats: dict[str, Any] = {}

  # -- parameters --------------------------------------------------------------------------------------------
  def _split(self, params: Qwen2 | nnx.State) -> tuple[nnx.GraphDef, nnx.State]:
    if isinstance(params, Qwen2):
      if params.cfg != self.model_cfg:
        raise ValueError("the model's config differs from the sampler's model_cfg")
      return nnx.split(params, nnx.Param)
    if self._graphdef is None:
      abstract = nnx.eval_shape(lambda: Qwen2(self.model_cfg, rngs=nnx.Rngs(0)))
      self._graphdef = nnx.split(abstract, nnx.Param)[0]
    return self._graphdef, params

  def _bucket(self, length: int) -> int:
    for b in self.cfg.prompt_buckets:
      if length <= b:
        return b
    raise ValueError(f"prompt of {length} tokens exceeds the largest prompt bucket "
                     f"{self.cfg.prompt_buckets[-1]}; raise sampler.prompt_buckets or shorten the prompt")

  def _round_to_shards(self, batch: int) -> int:
    """Rounds a chunk's row count up to a multiple of the batch axes' size (a sharded batch must divide)."""
    if self.mesh is None:
      return batch
    axes = self.batch_axes if isinstance(self.batch_axes, tuple) else (self.batch_axes,)
    shards = math.prod(self.mesh.shape[a] for a in axes)
    return -(-batch // shards) * shards

  def _stop_seqs(self, stop_strings: Sequence[str]) -> np.ndarray:
    seqs = []
    for s in stop_strings:
      ids = self.tokenizer.encode(s)
      if 0 < len(ids) <= STOP_SEQ_LEN:
        seqs.append(ids)
    e = 0 if not seqs else 4 * math.ceil(len(seqs) / 4)  # few shapes -> few compiles
    out = np.full((e, STOP_SEQ_LEN), -1, np.int32)
    for j, ids in enumerate(seqs):
      out[j, STOP_SEQ_LEN - len(ids):] = ids
    return out

  def warmup(self, params: Qwen2 | nnx.State, prompt_len: int, *, max_new_tokens: int | None = None,
             temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
             num_stop_strings: int = 0, batch: int | None = None) -> float:
    """Compiles (prefill + decode) for one key without decoding: all rows inactive, so the loop exits at once.

    Returns the seconds taken (mostly compilation; ~0 when the key is already compiled).
    """
    c = self.cfg
    max_new = int(c.max_new_tokens if max_new_tokens is None else max_new_tokens)
    temperature = float(c.temperature if temperature is None else temperature)
    top_p = float(c.top_p if top_p is None else top_p)
    top_k = int(c.top_k if top_k is None else top_k)
    batch = self._round_to_shards(batch or c.batch_size)
    bucket = self._bucket(prompt_len)
    graphdef, state = self._split(params)
    e = 0 if not num_stop_strings else 4 * math.ceil(num_stop_strings / 4)
    stop_seqs = np.full((e, STOP_SEQ_LEN), -1, np.int32)
    args = [np.zeros((batch, bucket), np.int32), np.ones((batch,), np.int32), np.zeros((batch,), bool),
            np.zeros((batch, 2), np.uint32)]
    if self.mesh is not None:
      args = [jax.device_put(a, NamedSharding(self.mesh, P(self.batch_axes, *([None] * (a.ndim - 1)))))
              for a in args]
    valid_vocab = min(self.model_cfg.vocab_size, self.tokenizer.vocab_size) if self.tokenizer is not None else (
        self.model_cfg.vocab_size)
    statics = dict(max_new_tokens=max_new, top_k=top_k, greedy=temperature == 0.0, use_top_p=top_p < 1.0,
                   valid_vocab=valid_vocab, reduce_chunks=c.reduce_chunks, decode_head=c.decode_head,
                   cache_dtype=c.kv_cache_dtype,
                   batch_sharding=None if self.mesh is None else (self.mesh, self.batch_axes))
    t0 = time.perf_counter()
    temp, tp, eos_q = jnp.float32(1.0), jnp.float32(top_p), np.asarray([-1], np.int32)
    carry = _prefill(graphdef, state, *args, temp, tp, eos_q, stop_seqs, **statics)
    jax.block_until_ready(_DECODE[c.decode_fusion](graphdef, state, carry, args[1], args[3], temp, tp, eos_q,
                                                   stop_seqs, **statics))
    return time.perf_counter() - t0

  # -- the call ----------------------------------------------------------------------------------------------
  def generate(self, params: Qwen2 | nnx.State, prompts: Sequence[Sequence[int]], *, seed: int,
               max_new_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
               top_k: int | None = None, stop_strings: Sequence[str] = (),
               eos_ids: Sequence[int] | None = None) -> SamplerOutput:
    """Generates a completion for every prompt (token ids). See the module docstring.

    Args:
      params: the Qwen2 module, or its nnx.Param state (e.g. the learner's current, possibly sharded, weights).
      prompts: token ids per prompt (non-empty; at most the largest prompt bucket).
      seed: sampling seed (same seed, prompts and weights -> same outputs).
      max_new_tokens, temperature, top_p, top_k: override the SamplerConfig defaults (temperature 0 = greedy).
      stop_strings: strings that end a completion (matched on decoded text; needs a tokenizer).
      eos_ids: ids that end a completion; default the tokenizer's eos_ids (none without a tokenizer).

    Returns:
      SamplerOutput with one entry per prompt.
    """
    c = self.cfg
    max_new = int(c.max_new_tokens if max_new_tokens is None else max_new_tokens)
    temperature = float(c.temperature if temperature is None else temperature)
    top_p = float(c.top_p if top_p is None else top_p)
    top_k = int(c.top_k if top_k is None else top_k)
    if max_new <= 0:
      raise ValueError(f"max_new_tokens must be positive, got {max_new}")
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
      raise ValueError(f"bad sampling settings: temperature={temperature}, top_p={top_p}, top_k={top_k}")
    if stop_strings and self.tokenizer is None:
      raise ValueError("stop_strings need a tokenizer")
    prompts = [list(map(int, p)) for p in prompts]
    if not prompts:
      return SamplerOutput([], [], [], [], [], [])
    v = self.model_cfg.vocab_size
    for i, p in enumerate(prompts):
      if not p:
        raise ValueError(f"prompt {i} is empty")
      if min(p) < 0 or max(p) >= v:
        raise ValueError(f"prompt {i} has token ids outside [0, {v})")
    if eos_ids is None:
      eos_ids = self.tokenizer.eos_ids if self.tokenizer is not None else ()
    eos_q = np.asarray(list(eos_ids) or [-1], np.int32)
    stop_seqs = self._stop_seqs(stop_strings) if stop_strings else np.zeros((0, STOP_SEQ_LEN), np.int32)
    valid_vocab = min(v, self.tokenizer.vocab_size) if self.tokenizer is not None else v
    graphdef, state = self._split(params)
    batch = c.batch_size if len(prompts) >= c.batch_size else 1 << (len(prompts) - 1).bit_length()
    batch = self._round_to_shards(batch)
    base_key = jax.random.PRNGKey(seed)
    batch_sharding = None if self.mesh is None else (self.mesh, self.batch_axes)

    outs = []
    steps, prefill_s, decode_s = 0, 0.0, 0.0
    for start in range(0, len(prompts), batch):
      chunk = prompts[start:start + batch]
      bucket = self._bucket(max(len(p) for p in chunk))
      toks = np.zeros((batch, bucket), np.int32)
      lengths = np.ones((batch,), np.int32)
      active = np.zeros((batch,), bool)
      for r, p in enumerate(chunk):
        toks[r, :len(p)] = p
        lengths[r] = len(p)
        active[r] = True
      keys = np.asarray(jax.vmap(lambda i: jax.random.fold_in(base_key, i))(jnp.arange(start, start + batch)))
      args = [toks, lengths, active, keys]
      if self.mesh is not None:
        sh = lambda x: NamedSharding(self.mesh, P(self.batch_axes, *([None] * (x.ndim - 1))))
        args = [jax.device_put(a, sh(a)) for a in args]
      statics = dict(max_new_tokens=max_new, top_k=top_k, greedy=temperature == 0.0, use_top_p=top_p < 1.0,
                     valid_vocab=valid_vocab, reduce_chunks=c.reduce_chunks, decode_head=c.decode_head,
                     cache_dtype=c.kv_cache_dtype, batch_sharding=batch_sharding)
      temp, tp = jnp.float32(max(temperature, 1e-6)), jnp.float32(top_p)
      toks, lengths, active, keys = args
      t0 = time.perf_counter()
      carry = _prefill(graphdef, state, toks, lengths, active, keys, temp, tp, eos_q, stop_seqs, **statics)
      jax.block_until_ready(carry)
      t1 = time.perf_counter()
      final = _DECODE[c.decode_fusion](graphdef, state, carry, lengths, keys, temp, tp, eos_q, stop_seqs, **statics)
      res = jax.device_get({k: final[k] for k in ("tokens", "logprobs", "sampling_logprobs", "count", "reason",
                                                  "i")})
      del final, carry
      t2 = time.perf_counter()
      prefill_s += t1 - t0
      decode_s += t2 - t1
      steps += int(res["i"]) - 1
      for r in range(len(chunk)):
        n = int(res["count"][r])
        outs.append((res["tokens"][r, :n].tolist(), res["logprobs"][r, :n], res["sampling_logprobs"][r, :n],
                     _FINISH[int(res["reason"][r])]))
    # decode_steps: loop iterations (each one forward of `batch` rows); times include compilation on a first call.
    self.last_stats = {"decode_steps": steps, "batch": batch, "prefill_s": prefill_s, "decode_s": decode_s}
    return self._finalize(prompts, outs, stop_strings, set(int(i) for i in eos_ids))

  def _finalize(self, prompts, outs, stop_strings, eos_set) -> SamplerOutput:
    result = SamplerOutput([], [], [], [], [], prompts)
    for tokens, raw, samp, reason in outs:
      if self.tokenizer is not None:
        if stop_strings:
          cut = self._stop_cut(tokens, reason, eos_set, stop_strings)
          if cut is not None:
            tokens, raw, samp, reason = tokens[:cut], raw[:cut], samp[:cut], "stop"
        body = tokens[:-1] if reason == "eos" and tokens and tokens[-1] in eos_set else tokens
        text = self.tokenizer.decode(body)
      else:
        text = ""
      result.tokens.append(tokens)
      result.text.append(text)
      result.logprobs.append(np.asarray(raw, np.float32))
      result.sampling_logprobs.append(np.asarray(samp, np.float32))
      result.finish_reason.append(reason)
    return result

  def _stop_cut(self, tokens, reason, eos_set, stop_strings) -> int | None:
    """Smallest k such that decode(tokens[:k]) contains a stop string, or None."""
    body = tokens[:-1] if reason == "eos" and tokens and tokens[-1] in eos_set else tokens
    has_stop = lambda k: any(s in self.tokenizer.decode(body[:k]) for s in stop_strings)
    if not body or not has_stop(len(body)):
      return None
    lo, hi = 1, len(body)  # has_stop(hi) is true; containment only grows with the prefix
    while lo < hi:
      mid = (lo + hi) // 2
      if has_stop(mid):
        hi = mid
      else:
        lo = mid + 1
    return lo
