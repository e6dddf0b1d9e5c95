"""Batched KV-cache generation for the Qwen2 policy: one jitted prefill + on-device decode loop per call.

  sampler = Sampler(model.cfg, tokenizer, SamplerConfig(batch_size=64))
  out = sampler.generate(model, prompts_token_ids, seed=0, max_new_tokens=1024, temperature=0.9,
                         stop_strings=("</kernel>",))
  out.tokens[i], out.text[i], out.logprobs[i], out.finish_reason[i]    # per prompt, in input order

How it runs. Prompts are split into chunks of `batch_size`, right-padded to the smallest prompt bucket that fits
(`prompt_buckets`), and each chunk makes two jitted calls: `_prefill` fills a [B, K, P + max_new_tokens, H] KV cache
per layer (`kv_cache_dtype`, bf16 by default; max_new_tokens rounded up to 64 slots) and samples the first token
from the last real prompt position; `_decode_loop` takes that state (donated, so the cache is updated in place and
never copied) and decodes in a `lax.while_loop` on device (no host round trip per token) until every row has
finished or `max_new_tokens` tokens exist. The prefill is the reference model's forward pass; each decode step is
policy/decode's fused step, built from the DecodePlan that `SamplerConfig.decode` resolves to for the key (on a
GPU, Pallas kernels: attention that reads only each row's prompt and generated slots, the projections with their
norms; logged once per key). Both are compiled once per key (batch, prompt bucket, max_new_tokens, top_k, greedy / top-p on-off, number of stop
sequences, cache dtype, DecodeConfig): calls with the same key reuse them, whatever the prompts, seed, temperature, top_p value or
weights. The parameters are jit ARGUMENTS (never baked-in constants), so the RL loop can update them between calls
without recompiling, and they may be sharded on a mesh (jit follows their shardings; pass `mesh` + `batch_axes` to
also shard the batch). A chunk with fewer prompts than `batch_size` is padded with inactive rows (a call with fewer
prompts than `batch_size` in total uses the next power of two instead, to save compute). `Sampler.warmup` compiles a
key ahead of time.
`Sampler.last_stats` holds the last call's decode steps, prefill / decode wall times and (last chunk's) DecodePlan.

Sampling. temperature == 0 is greedy (argmax of the raw logits). Otherwise logits / temperature, then top-k
(k > 0 keeps the k largest), then top-p (smallest set of largest-probability tokens whose mass reaches top_p;
ties at the threshold are all kept), then a Gumbel-max draw. Token ids the tokenizer cannot produce (Qwen's
padded embedding rows) are never sampled. Randomness is per prompt: prompt i (global index in the call) uses
fold_in(PRNGKey(seed), i), then fold_in(step), so results do not depend on chunking or on the other prompts.
The draw and both log-probs need each vocabulary chunk's maximum and sums of exp (policy/sampling.py); without
top-k / top-p, on a GPU, one Pallas pass over the logits computes them (decode/sample_stats.py; the plan's
`stats`), else XLA.

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

from kevin_jax.policy import sampling
from kevin_jax.policy.config import ModelConfig
from kevin_jax.policy.decode import plan as plan_lib
from kevin_jax.policy.decode import step as step_lib
from kevin_jax.policy.decode.attention import BLOCK_K, SlotRanges
from kevin_jax.policy.decode.plan import DecodeConfig, DecodePlan
from kevin_jax.policy.model import KVCache, Qwen2

Array = jax.Array
STOP_SEQ_LEN = 16  # tokens of a stop string matched on device (longer ones are matched on the host only)
_FINISH = ("length", "eos", "stop")
TRACE_COUNT = {"generate": 0}  # incremented when _prefill or _decode_loop is traced (tests assert no recompilation)


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """Sampler settings (configs/multiturn.py `config.sampler`).

  Attributes:
    batch_size: sequences decoded together per compiled call.
    prompt_buckets: padded prompt lengths, tokens (each compiled once per batch / max_new_tokens).
    kv_cache_dtype: 'bfloat16' | 'float32' | 'float16'.
    max_new_tokens, temperature, top_p, top_k: defaults for `generate` (top_p 1.0 / top_k 0 = off).
    reduce_chunks: column chunks of the sampling step's work over the vocabulary (sampling.argmax_rows,
      logsumexp_rows, gumbel_sample_rows); 1 = one-stage row reductions (one thread block per row) and V Gumbel
      draws per row.
    decode: the decode fast path's choices (policy/decode/plan.py), resolved per compiled key into a DecodePlan.
  """
  batch_size: int = 64
  prompt_buckets: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
  kv_cache_dtype: str = "bfloat16"
  max_new_tokens: int = 1024
  temperature: float = 0.9
  top_p: float = 1.0
  top_k: int = 0
  reduce_chunks: int = 32
  decode: DecodeConfig = DecodeConfig()

  def __post_init__(self):
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
               decode=DecodeConfig.from_config(c))


@dataclasses.dataclass
class SamplerOutput:
  """Per-prompt results, in the order of the prompts given to `generate`."""
  tokens: list[list[int]]  # generated ids (EOS included when finish_reason == 'eos')
  text: list[str]  # decode(tokens) without a trailing EOS token ('' without a tokenizer)
  logprobs: list[np.ndarray]  # float32 [len(tokens[i])]: log pi_theta(token) of the raw policy (T=1)
  sampling_logprobs: list[np.ndarray]  # float32 [len(tokens[i])]: under the sampled (modified) distribution
  finish_reason: list[str]  # 'eos' | 'stop' | 'length'
  prompt_tokens: list[list[int]]


def _fold_keys(keys_Bx2: Array, step: Array) -> Array:
  return jax.vmap(lambda k: jax.random.fold_in(k, step))(keys_Bx2)


_STATIC = ("graphdef", "max_new_tokens", "top_k", "greedy", "use_top_p", "valid_vocab", "reduce_chunks", "decode",
           "cache_dtype", "batch_sharding")


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


def _sampler_fn(model: Qwen2, stats, temperature, top_p, top_k, greedy, use_top_p, valid_vocab, reduce_chunks):
  """fn(h_BxD final-normed hidden states, keys_B) -> (token_B, raw logprob_B, sampling logprob_B): the LM head and
  sampling.sample_logits."""

  def fn(h_BxD, keys_B):
    return sampling.sample_logits(model.logits(h_BxD[:, None])[:, 0], keys_B, temperature, top_p, top_k=top_k,
                                  greedy=greedy, use_top_p=use_top_p, valid_vocab=valid_vocab,
                                  reduce_chunks=reduce_chunks, stats=stats)

  return fn


def decode_plan(decode: DecodeConfig, model_cfg: ModelConfig, batch: int, cache_slots: int,
                prompt_bucket: int) -> DecodePlan:
  """The DecodePlan of the sampler's decode steps for this key (plan_lib.resolve on this process' device)."""
  return plan_lib.resolve(decode, model_cfg, batch, cache_slots, prompt_bucket, plan_lib.DeviceInfo.current())


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
             stop_seqs_ExL, *, max_new_tokens, top_k, greedy, use_top_p, valid_vocab, reduce_chunks, decode,
             cache_dtype, batch_sharding):
  """Fills slots [0, P) of a [B, K, P + _gen_slots(max_new_tokens), H] cache and samples token 0; returns the
  loop carry."""
  TRACE_COUNT["generate"] += 1
  model: Qwen2 = nnx.merge(graphdef, state)
  b, p = prompts_BxP.shape
  n = max_new_tokens
  plan = decode_plan(decode, model.cfg, b, p + _gen_slots(n), p)
  sample = _sampler_fn(model, plan.stats, temperature, top_p, top_k, greedy, use_top_p, valid_vocab, reduce_chunks)
  cache = KVCache.zeros(model.cfg, b, p + _gen_slots(n), jnp.dtype(cache_dtype))
  cache = jax.tree.map(lambda x: _constrain(x, batch_sharding), cache)
  positions_BxP = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32)[None, :], (b, p))
  mask_BxP = positions_BxP < lengths_B[:, None]
  h_BxPxD, cache = model.hidden(prompts_BxP, positions_BxP, mask_BxP, cache, 0)
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
                 max_new_tokens, top_k, greedy, use_top_p, valid_vocab, reduce_chunks, decode, cache_dtype,
                 batch_sharding):
  """The decode loop (lax.while_loop on device) until every row is done or max_new_tokens tokens exist.

  `carry` (cache and output buffers) is donated: the cache is updated in place, never copied.
  """
  del cache_dtype, batch_sharding
  TRACE_COUNT["generate"] += 1
  model: Qwen2 = nnx.merge(graphdef, state)
  s = carry["cache"].length
  p = s - _gen_slots(max_new_tokens)  # the prompt bucket
  plan = decode_plan(decode, model.cfg, carry["last"].shape[0], s, p)
  step = step_lib.make_step(model, plan)  # folds the weights its kernels need once, before the loop
  sample = _sampler_fn(model, plan.stats, temperature, top_p, top_k, greedy, use_top_p, valid_vocab, reduce_chunks)

  def cond(c):
    return (c["i"] < max_new_tokens) & ~jnp.all(c["done"])

  def body(c):
    i = c["i"]
    pos_Bx1 = (lengths_B + i - 1)[:, None]  # token i-1 has position len + i - 1 and goes to slot P + i - 1
    # Visible: the row's real prompt slots and the generated slots up to and including this one.
    visible = SlotRanges(prompt_len_B=lengths_B, gen_len=i, gen_start=p)
    h_Bx1xD, cache = step(c["last"][:, None], pos_Bx1, c["cache"], p + i - 1, visible)
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


_DECODE = jax.jit(_decode_loop, static_argnames=_STATIC, donate_argnames=("carry",))


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
                   valid_vocab=valid_vocab, reduce_chunks=c.reduce_chunks, decode=c.decode,
                   cache_dtype=c.kv_cache_dtype,
                   batch_sharding=None if self.mesh is None else (self.mesh, self.batch_axes))
    t0 = time.perf_counter()
    temp, tp, eos_q = jnp.float32(1.0), jnp.float32(top_p), np.asarray([-1], np.int32)
    carry = _prefill(graphdef, state, *args, temp, tp, eos_q, stop_seqs, **statics)
    jax.block_until_ready(_DECODE(graphdef, state, carry, args[1], args[3], temp, tp, eos_q,
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
                     valid_vocab=valid_vocab, reduce_chunks=c.reduce_chunks, decode=c.decode,
                     cache_dtype=c.kv_cache_dtype, batch_sharding=batch_sharding)
      temp, tp = jnp.float32(max(temperature, 1e-6)), jnp.float32(top_p)
      toks, lengths, active, keys = args
      t0 = time.perf_counter()
      carry = _prefill(graphdef, state, toks, lengths, active, keys, temp, tp, eos_q, stop_seqs, **statics)
      jax.block_until_ready(carry)
      t1 = time.perf_counter()
      final = _DECODE(graphdef, state, carry, lengths, keys, temp, tp, eos_q, stop_seqs, **statics)
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
    self.last_stats = {"decode_steps": steps, "batch": batch, "prefill_s": prefill_s, "decode_s": decode_s,
                       "decode_plan": decode_plan(c.decode, self.model_cfg, batch, bucket + _gen_slots(max_new),
                                                  bucket)}
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
