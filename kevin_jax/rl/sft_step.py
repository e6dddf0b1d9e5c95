"""The supervised warm-start step: token-level cross-entropy on response tokens, jitted once per (B, T).

Batch contract (kevin_jax/rl/sft_data.py -> this step). One `SFTBatch` of B sequences, host NumPy, rows first:
  tokens_BxT     int32    prompt + response (+ end-of-turn) token ids, right-padded with any valid id.
  attn_mask_BxT  int32    1 for real tokens, 0 for padding; real tokens are a prefix of the row (padding rows
                          keep one real token so no row has zero length).
  loss_mask_BxT  float32  1 where tokens[t] is a response token (the target of the prediction at t - 1), 0 on
                          the prompt, on padding and at t = 0.
  inputs_BxT     int32    optional: the ids the model reads (None = tokens). sft.input_noise corrupts some response
                          tokens here while the targets stay `tokens` (sft_data.make_batch).
B must be a multiple of G = sft micro_batch_size * data-parallel size; the step sums the gradients of B / G
micro-batches (fp32), each normalised by the whole batch's response-token count, so accumulation is exact:
  loss = - sum_bt loss_mask * log p(tokens[t] | inputs[<t]) / sum_bt loss_mask         (token mean)
  token_acc = share of response tokens where tokens[t] is the argmax prediction.

State, shardings, master weights and the parameter layout are the GRPO learner's (kevin_jax/rl/learner.py):
`SFTStep` wraps a `Learner` built with the SFT optimizer settings, so an SFT run's Orbax checkpoint restores
into an RL learner (same TrainState tree) and its parameters feed the sampler without copies. Only the update
rule differs: AdamW with linear warmup and a cosine decay (`sft_schedule`), with the same state layout as
rl/optimizer.make_optimizer. NaN guard as in the learner: a non-finite loss or gradient norm leaves the state
unchanged and `check_finite` (host) raises.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from kevin_jax import sharding
from kevin_jax.rl import learner as learner_lib
from kevin_jax.rl.optimizer import _stored_as  # The learner's bf16-moment wrapper (same state layout).


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SFTBatch:
  """One batch of SFT sequences (module docstring: the contract)."""
  tokens_BxT: Any
  attn_mask_BxT: Any
  loss_mask_BxT: Any
  inputs_BxT: Any = None  # None = tokens_BxT (no input noise).


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """Optimisation settings of the warm start, built from config.sft (+ config.optimizer's storage dtypes)."""
  batch_size: int = 32  # Sequences per optimizer step (global).
  micro_batch_size: int = 8  # Sequences per device per accumulation micro-batch.
  learning_rate: float = 5e-4  # Peak LR.
  warmup_steps: int = 10  # Linear warmup, optimizer steps.
  total_steps: int = 100  # Steps of the whole run (the cosine reaches final_lr_ratio here).
  final_lr_ratio: float = 0.1  # LR at the last step / peak LR.
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0  # Must be > 0: keeps the optimizer-state layout of the RL learner.
  state_dtype: str = "float32"  # Adam moment storage (config.optimizer.state_dtype).
  master_weights: bool = True  # fp32 master copy of bf16 params (config.optimizer.master_weights).
  logits_chunk: int = 1024  # Positions per chunk of the fp32 [B, chunk, V] logits (config.rl.logits_chunk).
  scan_layers: bool = True  # Decoder layers in a lax.scan (config.rl.scan_layers).

  def __post_init__(self):
    if self.batch_size < 1 or self.micro_batch_size < 1:
      raise ValueError(f"sft.batch_size and sft.micro_batch_size must be >= 1, got {self.batch_size}, "
                       f"{self.micro_batch_size}")
    if not self.learning_rate > 0:
      raise ValueError(f"sft.learning_rate must be > 0, got {self.learning_rate}")
    if self.total_steps < 1 or not 0 <= self.warmup_steps <= self.total_steps:
      raise ValueError(f"need total_steps >= 1 and 0 <= warmup_steps <= total_steps, got {self.total_steps}, "
                       f"{self.warmup_steps}")
    if not 0 <= self.final_lr_ratio <= 1:
      raise ValueError(f"sft.final_lr_ratio must be in [0, 1], got {self.final_lr_ratio}")
    if not self.max_grad_norm > 0:
      raise ValueError("sft.max_grad_norm must be > 0 (the clip keeps the RL learner's optimizer-state layout, "
                       f"so an SFT checkpoint restores into it), got {self.max_grad_norm}")

  @classmethod
  def from_config(cls, config, total_steps: int) -> "SFTConfig":
    s = config.sft
    return cls(batch_size=int(s.batch_size), micro_batch_size=int(s.micro_batch_size),
               learning_rate=float(s.learning_rate),
               warmup_steps=int(math.ceil(float(s.warmup_ratio) * total_steps)), total_steps=int(total_steps),
               final_lr_ratio=float(s.final_lr_ratio), b1=float(config.optimizer.b1), b2=float(s.b2),
               eps=float(config.optimizer.eps), weight_decay=float(s.weight_decay),
               max_grad_norm=float(s.max_grad_norm), state_dtype=str(config.optimizer.state_dtype),
               master_weights=bool(config.optimizer.master_weights), logits_chunk=int(config.rl.logits_chunk),
               scan_layers=bool(config.rl.scan_layers))

  def learner_optimizer(self):
    """The rl/optimizer.OptimizerConfig with this run's settings (the Learner builds the state layout from it)."""
    from kevin_jax.rl.optimizer import OptimizerConfig  # pylint: disable=g-import-not-at-top
    return OptimizerConfig(learning_rate=self.learning_rate, warmup_steps=self.warmup_steps, b1=self.b1,
                           b2=self.b2, eps=self.eps, weight_decay=self.weight_decay,
                           max_grad_norm=self.max_grad_norm, state_dtype=self.state_dtype,
                           master_weights=self.master_weights)


def sft_schedule(cfg: SFTConfig) -> optax.Schedule:
  """LR of update `count` (0-based): linear warmup to the peak, then cosine to final_lr_ratio * peak."""
  peak, warm, total, final = cfg.learning_rate, cfg.warmup_steps, cfg.total_steps, cfg.final_lr_ratio

  def schedule(count):
    c = jnp.asarray(count, jnp.float32)
    warm_lr = peak * jnp.minimum(1.0, (c + 1.0) / max(warm, 1))
    progress = jnp.clip((c - warm) / max(total - warm - 1, 1), 0.0, 1.0)
    decay_lr = peak * (final + (1.0 - final) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress)))
    return jnp.where(c < warm, warm_lr, decay_lr)
  return schedule


def make_sft_optimizer(cfg: SFTConfig) -> optax.GradientTransformation:
  """clip_by_global_norm -> AdamW(sft_schedule): rl/optimizer.make_optimizer's chain with another schedule."""
  tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                   optax.adamw(sft_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay))
  if cfg.state_dtype != "float32":
    tx = _stored_as(tx, jnp.dtype(cfg.state_dtype))
  return tx


def token_nll_and_hits(model, tokens_BxT, attn_mask_BxT, *, chunk: int, mesh: Mesh | None = None,
                       scan_layers: bool = False, inputs_BxT=None) -> tuple[jax.Array, jax.Array]:
  """log p(tokens[t] | inputs[<t]) and argmax hits, [B, T] fp32, in logits chunks (rl/logprobs.py's layout).

  inputs_BxT (default: tokens_BxT) is what the model reads; the targets are always tokens_BxT. Same alignment
  and chunking as rl/logprobs.token_logps at temperature 1 (tests check they agree); also returns hits_BxT = 1
  where tokens[t] is the argmax of the prediction (no gradient). Position 0 gets 0.
  """
  b, t = tokens_BxT.shape
  positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
  h_BxTxD = model.hidden(tokens_BxT if inputs_BxT is None else inputs_BxT, positions_BxT, attn_mask_BxT,
                         scan=scan_layers)[0]
  if mesh is not None:
    h_BxTxD = sharding.constrain(h_BxTxD, mesh, "batch", "seq", "act_embed")
  n = t - 1
  c = max(1, min(chunk, n))
  num_chunks = -(-n // c)
  pad = num_chunks * c - n
  h_CxBxcxD = jnp.pad(h_BxTxD[:, :n], ((0, 0), (0, pad), (0, 0))).reshape(b, num_chunks, c, -1).swapaxes(0, 1)
  tgt_CxBxc = jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, pad))).reshape(b, num_chunks, c).swapaxes(0, 1)

  @jax.checkpoint
  def one_chunk(h_BxcxD, tgt_Bxc):
    logits_BxcxV = model.logits(h_BxcxD).astype(jnp.float32)
    if mesh is not None:
      logits_BxcxV = sharding.constrain(logits_BxcxV, mesh, "batch", "seq", "act_vocab")
    tgt_logit_Bxc = jnp.take_along_axis(logits_BxcxV, tgt_Bxc[..., None], axis=-1)[..., 0]
    logp_Bxc = tgt_logit_Bxc - jax.nn.logsumexp(logits_BxcxV, axis=-1)
    hit_Bxc = jax.lax.stop_gradient(tgt_logit_Bxc >= jnp.max(logits_BxcxV, axis=-1)).astype(jnp.float32)
    return logp_Bxc, hit_Bxc

  _, (logp_CxBxc, hit_CxBxc) = jax.lax.scan(lambda carry, xs: (carry, one_chunk(*xs)), None,
                                            (h_CxBxcxD, tgt_CxBxc))

  def unchunk(x_CxBxc):
    return jnp.pad(x_CxBxc.swapaxes(0, 1).reshape(b, num_chunks * c)[:, :n], ((0, 0), (1, 0)))
  return unchunk(logp_CxBxc), unchunk(hit_CxBxc)


def micro_loss(params, mb: SFTBatch, num_tokens, *, graphdef, cfg: SFTConfig, mesh: Mesh | None):
  """Summed NLL of one micro-batch / the whole batch's token count; returns (loss, stats of sums)."""
  model = nnx.merge(graphdef, params)
  logps, hits = token_nll_and_hits(model, mb.tokens_BxT, mb.attn_mask_BxT, chunk=cfg.logits_chunk, mesh=mesh,
                                   scan_layers=cfg.scan_layers, inputs_BxT=mb.inputs_BxT)
  mask = mb.loss_mask_BxT > 0
  nll_sum = -jnp.sum(jnp.where(mask, logps, 0.0))
  stats = dict(nll_sum=jax.lax.stop_gradient(nll_sum), hits_sum=jnp.sum(jnp.where(mask, hits, 0.0)),
               tokens=jnp.sum(mask.astype(jnp.float32)))
  return nll_sum / num_tokens, stats


def _micro_batches(x, g: int, mesh: Mesh | None):
  """Device-order rows [B, ...] (learner.to_device_order with U = 1) -> [M, G, ...], G on the batch axes."""
  m = x.shape[0] // g
  x = jnp.moveaxis(x.reshape((g, m) + x.shape[1:]), 0, 1)
  if mesh is not None:
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, sharding.batch_axes(mesh) or None)))
  return x


def sft_train_step(state: learner_lib.TrainState, batch: SFTBatch, *, graphdef, cfg: SFTConfig,
                   tx: optax.GradientTransformation, g: int,
                   mesh: Mesh | None) -> tuple[learner_lib.TrainState, dict[str, jax.Array]]:
  """One optimizer update on one batch (rows in device order, G = g rows per micro-batch). Pure; jit it once."""
  micro = jax.tree.map(lambda x: _micro_batches(x, g, mesh), batch)
  num_tokens = jnp.maximum(jnp.sum(micro.loss_mask_BxT.astype(jnp.float32)), 1.0)
  grad_fn = jax.value_and_grad(functools.partial(micro_loss, graphdef=graphdef, cfg=cfg, mesh=mesh), has_aux=True)

  def body(carry, mb):  # params ride in the carry (see learner.minibatch_grads: nnx.remat + closures).
    acc, p = carry
    (_, stats), gr = grad_fn(p, mb, num_tokens)
    return (jax.tree.map(lambda a, x: a + x.astype(jnp.float32), acc, gr), p), stats

  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
  (grads, _), stats_M = jax.lax.scan(body, (zeros, state.params), micro)
  stats = jax.tree.map(lambda x: x.sum(0), stats_M)
  loss = stats["nll_sum"] / num_tokens
  grad_norm = optax.tree.norm(grads)
  ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  target = state.params if state.master is None else state.master
  grads = jax.tree.map(lambda gr, p: gr.astype(p.dtype), grads, target)
  updates, new_opt = tx.update(grads, state.opt_state, target)
  new_target = optax.apply_updates(target, updates)
  keep = lambda new, old: jax.tree.map(lambda a, c: jnp.where(ok, a, c), new, old)
  if state.master is None:
    params, master = keep(new_target, state.params), None
  else:
    master = keep(new_target, state.master)
    params = jax.tree.map(lambda mm, p: mm.astype(p.dtype), master, state.params)
  new_state = learner_lib.TrainState(step=state.step + ok.astype(jnp.int32), params=params, master=master,
                                     opt_state=keep(new_opt, state.opt_state))
  metrics = dict(loss=loss, token_acc=stats["hits_sum"] / num_tokens, grad_norm=grad_norm,
                 lr=sft_schedule(cfg)(state.step), tokens=stats["tokens"],
                 tokens_total=jnp.sum(batch.attn_mask_BxT.astype(jnp.float32)), applied=ok,
                 loss_finite=jnp.isfinite(loss), grad_finite=jnp.isfinite(grad_norm))
  return new_state, metrics


def sft_eval_step(params, batch: SFTBatch, *, graphdef, cfg: SFTConfig, g: int,
                  mesh: Mesh | None) -> dict[str, jax.Array]:
  """Forward only: summed NLL, summed hits and the response-token count of one batch (device row order)."""
  micro = jax.tree.map(lambda x: _micro_batches(x, g, mesh), batch)

  def body(p, mb):
    return p, micro_loss(p, mb, 1.0, graphdef=graphdef, cfg=cfg, mesh=mesh)[1]
  return jax.tree.map(lambda x: x.sum(0), jax.lax.scan(body, params, micro)[1])


class NonFiniteError(learner_lib.NonFiniteError):
  """An SFT update produced a NaN/Inf loss or gradient norm; that update was skipped."""


def check_finite(metrics: dict[str, Any], step: int) -> None:
  """Host-side guard on fetched step metrics; raises NonFiniteError before the state is checkpointed."""
  if bool(np.asarray(metrics["applied"])):
    return
  what = [f"loss = {float(metrics['loss'])}"] if not bool(metrics["loss_finite"]) else []
  if not bool(metrics["grad_finite"]):
    what.append(f"pre-clip gradient global norm = {float(metrics['grad_norm'])}")
  raise NonFiniteError(f"SFT step {step}: non-finite {' and '.join(what) or 'value'}; the update was skipped "
                       "and the run stops before checkpointing. Check the LR (sft.learning_rate, warmup) and the "
                       "grad_norm history in metrics.jsonl.")


class SFTStep:
  """The jitted SFT train and eval steps over a Learner's state layout, shardings and mesh."""

  def __init__(self, learner: learner_lib.Learner, cfg: SFTConfig):
    self.learner, self.cfg = learner, cfg
    if cfg.batch_size % learner.micro_batch:
      raise ValueError(f"sft.batch_size = {cfg.batch_size} must be a multiple of sft.micro_batch_size x "
                       f"data-parallel size = {learner.micro_batch}")
    self.tx = make_sft_optimizer(cfg)
    abstract_params = learner.abstract_state.master if learner.use_master else learner.abstract_state.params
    mine = jax.tree.structure(jax.eval_shape(self.tx.init, abstract_params))
    if mine != jax.tree.structure(learner.abstract_state.opt_state):
      raise AssertionError(f"SFT optimizer state {mine} differs from the learner's layout")
    mesh, rep = learner.mesh, sharding.replicated(learner.mesh)
    common = dict(graphdef=learner.graphdef, cfg=cfg, g=learner.micro_batch, mesh=mesh)
    batch_sh = learner.batch_sharding
    # The one jit signature of each step (STYLE practice 8); the state is donated.
    self._step = jax.jit(functools.partial(sft_train_step, tx=self.tx, **common),
                         in_shardings=(learner.state_shardings, batch_sh), out_shardings=(learner.state_shardings, rep),
                         donate_argnums=0)
    self._eval = jax.jit(functools.partial(sft_eval_step, **common),
                         in_shardings=(learner.param_shardings, batch_sh), out_shardings=rep)

  def put_batch(self, batch: SFTBatch) -> SFTBatch:
    """Explicit host -> device transfer in device row order; checks the contract's shapes."""
    b, t = np.shape(batch.tokens_BxT)
    if b % self.learner.micro_batch:
      raise ValueError(f"batch has {b} rows; need a multiple of {self.learner.micro_batch}")
    inputs = batch.tokens_BxT if batch.inputs_BxT is None else batch.inputs_BxT  # Always 4 arrays: one signature.
    dtypes = (np.int32, np.int32, np.float32, np.int32)
    arrays = []
    for x, dt in zip((batch.tokens_BxT, batch.attn_mask_BxT, batch.loss_mask_BxT, inputs), dtypes):
      if tuple(np.shape(x)) != (b, t):
        raise ValueError(f"SFTBatch arrays must all be [{b}, {t}], got {np.shape(x)}")
      x = learner_lib.to_device_order(np.asarray(x, dt), 1, self.learner.micro_batch)
      arrays.append(jax.device_put(x, self.learner.batch_sharding))
    return SFTBatch(*arrays)

  def step(self, state, batch_on_device: SFTBatch):
    """Dispatches one update (non-blocking; `state` donated). Check the fetched metrics with check_finite."""
    return self._step(state, batch_on_device)

  def evaluate(self, params, batch_on_device: SFTBatch) -> dict[str, jax.Array]:
    return self._eval(params, batch_on_device)

  def compile(self, batch_size: int, seq_len: int):
    """Lowers and compiles the train step for abstract inputs: `.memory_analysis()`, `.cost_analysis()`."""
    sds = jax.ShapeDtypeStruct
    sh = self.learner.batch_sharding
    abstract = SFTBatch(sds((batch_size, seq_len), jnp.int32, sharding=sh),
                        sds((batch_size, seq_len), jnp.int32, sharding=sh),
                        sds((batch_size, seq_len), jnp.float32, sharding=sh),
                        sds((batch_size, seq_len), jnp.int32, sharding=sh))
    return self._step.lower(self.learner.abstract_state, abstract).compile()
