"""The learner's Optax optimizer: global-norm clipping, then AdamW (or SGD) with linear warmup to a constant LR.

Kevin's recipe [P §1, §3]: AdamW (OpenRLHF's default), constant LR 2e-6 after a 3% linear warmup, gradient
global-norm clip 0.05. Moments are stored in `state_dtype` and computed in fp32. With bf16 parameters the
learner keeps an fp32 master copy (TrainState.master) and this optimizer updates that copy; without one,
an Adam step of ~lr = 2e-6 relative to weights of ~1e-2 is below bf16's resolution and would round away.

name='sgd' (momentum b1) is for ablations: Adam divides each parameter's update by its own gradient scale, so on a
noise-dominated RL gradient it moves nearly every parameter by ~lr; SGD moves each in proportion to its gradient.
On the CPU toy of a memorising policy (experiments/toy_memorizer) SGD did no better than Adam at a similar
distance moved from the warm start.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import optax

_STATE_DTYPES = ("float32", "bfloat16")
NAMES = ("adamw", "sgd")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """Optimizer settings, built from `config.optimizer` (units in configs/multiturn.py)."""
  learning_rate: float = 2e-6  # Peak (and constant) LR [P §1].
  name: str = "adamw"  # adamw (the paper) | sgd (heavy-ball momentum b1; b2 and eps unused).
  warmup_steps: int = 3  # Optimizer updates of linear warmup.
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.0
  max_grad_norm: float = 0.05  # Global-norm clip [P §3]; 0 = no clipping.
  state_dtype: str = "float32"  # Storage dtype of the Adam moments.
  master_weights: bool = True  # fp32 master copy of bf16 parameters (used by the learner).

  def __post_init__(self):
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
    if self.warmup_steps < 0:
      raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
    if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1 and self.eps > 0):
      raise ValueError(f"need 0 <= b1, b2 < 1 and eps > 0, got {self.b1}, {self.b2}, {self.eps}")
    if self.weight_decay < 0 or self.max_grad_norm < 0:
      raise ValueError("weight_decay and max_grad_norm must be >= 0")
    if self.name not in NAMES:
      raise ValueError(f"optimizer name must be one of {NAMES}, got {self.name!r}")
    if self.state_dtype not in _STATE_DTYPES:
      raise ValueError(f"state_dtype must be one of {_STATE_DTYPES}, got {self.state_dtype!r}")

  @classmethod
  def from_config(cls, opt: Mapping[str, Any], total_updates: int) -> "OptimizerConfig":
    """From `config.optimizer`; warmup = ceil(warmup_ratio * total_updates) optimizer updates.

    Args:
      opt: config.optimizer.
      total_updates: optimizer updates of the whole run (total_steps * rl.updates_per_batch).
    """
    if not 0 <= opt["warmup_ratio"] <= 1:
      raise ValueError(f"optimizer.warmup_ratio must be in [0, 1], got {opt['warmup_ratio']}")
    return cls(learning_rate=float(opt["learning_rate"]), name=str(opt["name"]),
               warmup_steps=int(math.ceil(opt["warmup_ratio"] * total_updates)),
               b1=float(opt["b1"]), b2=float(opt["b2"]), eps=float(opt["eps"]),
               weight_decay=float(opt["weight_decay"]), max_grad_norm=float(opt["max_grad_norm"]),
               state_dtype=str(opt["state_dtype"]), master_weights=bool(opt["master_weights"]))


def lr_schedule(cfg: OptimizerConfig) -> optax.Schedule:
  """lr * min(1, (count + 1) / warmup_steps): the first update already moves (count starts at 0)."""
  def schedule(count):
    if cfg.warmup_steps == 0:
      return jnp.asarray(cfg.learning_rate, jnp.float32)
    frac = jnp.minimum(1.0, (count + 1).astype(jnp.float32) / cfg.warmup_steps)
    return cfg.learning_rate * frac
  return schedule


def _stored_as(tx: optax.GradientTransformation, dtype) -> optax.GradientTransformation:
  """Keeps `tx`'s floating state in `dtype` between updates while computing in fp32."""
  def cast(tree, to):
    return jax.tree.map(lambda x: x.astype(to) if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)
                        else x, tree)

  def init(params):
    return cast(tx.init(params), dtype)

  def update(updates, state, params=None):
    new_updates, new_state = tx.update(updates, cast(state, jnp.float32), params)
    return new_updates, cast(new_state, dtype)

  return optax.GradientTransformation(init, update)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  """clip_by_global_norm(max_grad_norm) -> AdamW or SGD (schedule); the learner measures the pre-clip norm itself."""
  parts = []
  if cfg.max_grad_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.max_grad_norm))
  if cfg.name == "sgd":
    if cfg.weight_decay > 0:  # wd * w joins the gradient (and so the momentum): L2 decay, not AdamW's decoupled.
      parts.append(optax.add_decayed_weights(cfg.weight_decay))
    parts.append(optax.sgd(lr_schedule(cfg), momentum=cfg.b1 or None))
  else:
    parts.append(optax.adamw(lr_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay))
  tx = optax.chain(*parts)
  if cfg.state_dtype != "float32":
    tx = _stored_as(tx, jnp.dtype(cfg.state_dtype))
  return tx


def current_lr(cfg: OptimizerConfig, updates_done) -> jax.Array:
  """The LR the next update will use, given how many updates were applied."""
  return lr_schedule(cfg)(jnp.asarray(updates_done, jnp.int32))
