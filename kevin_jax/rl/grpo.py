"""Kevin's GRPO math as pure functions: turn returns, per-task advantages, the clipped policy loss.

Shapes: N trajectories, T turns (returns); B sequences (turn-samples) of L token positions (loss).
Paper numbers cite the Kevin paper (arXiv 2507.11948) as [P §n]. Every function is jit-compatible and works on
NumPy or JAX arrays; the learner calls `policy_loss` inside its jitted step, the RL loop calls
`discounted_returns` and `group_advantages` on the host once per rollout batch.

Loss aggregation (which denominator turns per-token losses into one scalar), for per-token losses l and
loss mask m over a minibatch of sequences i with tokens t:
  token_mean  Σ_it l·m / Σ_it m                    (DAPO; longer samples weigh more)
  seq_mean    mean_i (Σ_t l·m / Σ_t m)             (original GRPO; each sample weighs the same)
  constant    Σ_it l·m / (C · n_seqs)              (Dr. GRPO; Kevin's stabilised recipe [P §3], C = loss_constant)
The denominators are passed in (`num_tokens`, `num_seqs`) so that micro-batches of one minibatch, each
aggregated with the minibatch's denominators, sum to exactly the minibatch loss.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

RETURN_MODES = ("sum", "max")
BASELINES = ("mean", "leave_one_out")
ADV_BASELINES = BASELINES + ("trloo",)  # GRPOConfig.adv_baseline: trloo = leave-one-out per (task, turn) group.
LOSS_AGGS = ("token_mean", "seq_mean", "constant")
KL_ESTIMATORS = ("k1", "k3")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
  """Kevin's GRPO hyper-parameters, built once from `config.rl` (see configs/multiturn.py for units)."""
  gamma: float = 0.4  # Turn discount; sum with 0.4 scaled best over 8 turns [P §2 "Aggregation"].
  return_mode: str = "sum"  # sum | max turn-return aggregation [P §2].
  adv_std_normalize: bool = True  # Divide by the per-task std [P eq. 1]; False = Dr. GRPO.
  adv_baseline: str = "mean"  # mean | leave_one_out over the task's m*n turn-samples [P §1]; trloo = turn-level
  #   leave-one-out: the mean return of the task's other trajectories at the same turn (Dr. Kernel, arXiv 2602.05885).
  adv_eps: float = 1e-6  # Added to the std before dividing.
  negative_scale: float = 1.0  # Multiplies negative advantages (1 = GRPO [P eq. 1]; 0 = reinforce only the
  #   above-baseline samples, filtered behaviour cloning). See `scale_negatives`.
  adv_prob_weight: float = 0.0  # alpha: each token's advantage times (alpha * pi_old(token) + 1 - alpha); 0 = off
  #   (the paper), 1 = ascend pi rather than log pi. See `policy_loss`.
  shuffle_advantages: bool = False  # Null control for ablations: permute the batch's advantages across its
  #   turn-samples (same values, no information about which sample did better). See batch.turn_advantages.
  epsilon_low: float = 0.2  # PPO clip below 1 [P §1, Clip-Higher].
  epsilon_high: float = 0.28  # PPO clip above 1 (DAPO Clip-Higher) [P §1].
  loss_agg: str = "constant"  # token_mean | seq_mean | constant (Dr. GRPO) [P §3].
  loss_constant: float = 1024.0  # C for loss_agg=constant, tokens (Dr. GRPO: the max response length).
  kl_beta: float = 0.0  # KL-to-reference weight; 0 in the paper [P §1].
  kl_estimator: str = "k3"  # k1 | k3 (Schulman's estimators of KL(pi || ref)).
  updates_per_batch: int = 2  # Optimizer steps per rollout batch: the on-/off-policy pair [P §1].
  micro_batch_size: int = 8  # Sequences per device per gradient-accumulation micro-batch.
  recompute_old_logps: bool = True  # Recompute log pi_old with the learner's forward before updating.
  logits_chunk: int = 1024  # Sequence positions per chunk of the fp32 [B, chunk, vocab] logits.
  scan_layers: bool = True  # Learner runs decoder layers in a lax.scan (Qwen2.hidden(scan=True)): remat then saves memory.

  def __post_init__(self):
    _check(0.0 <= self.gamma <= 1.0, f"gamma must be in [0, 1], got {self.gamma}")
    _check(self.return_mode in RETURN_MODES, f"return_mode must be one of {RETURN_MODES}, got {self.return_mode!r}")
    _check(self.adv_baseline in ADV_BASELINES,
           f"adv_baseline must be one of {ADV_BASELINES}, got {self.adv_baseline!r}")
    _check(self.adv_eps > 0, f"adv_eps must be > 0, got {self.adv_eps}")
    _check(0.0 <= self.adv_prob_weight <= 1.0, f"adv_prob_weight must be in [0, 1], got {self.adv_prob_weight}")
    _check(0.0 <= self.negative_scale <= 1.0, f"negative_scale must be in [0, 1], got {self.negative_scale}")
    _check(0.0 <= self.epsilon_low < 1.0, f"epsilon_low must be in [0, 1), got {self.epsilon_low}")
    _check(self.epsilon_high >= 0.0, f"epsilon_high must be >= 0, got {self.epsilon_high}")
    _check(self.loss_agg in LOSS_AGGS, f"loss_agg must be one of {LOSS_AGGS}, got {self.loss_agg!r}")
    _check(self.loss_constant > 0, f"loss_constant must be > 0, got {self.loss_constant}")
    _check(self.kl_beta >= 0, f"kl_beta must be >= 0, got {self.kl_beta}")
    _check(self.kl_estimator in KL_ESTIMATORS,
           f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
    _check(self.updates_per_batch >= 1, f"updates_per_batch must be >= 1, got {self.updates_per_batch}")
    _check(self.micro_batch_size >= 1, f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
    _check(self.logits_chunk >= 1, f"logits_chunk must be >= 1, got {self.logits_chunk}")

  @classmethod
  def from_config(cls, rl: Mapping[str, Any]) -> "GRPOConfig":
    """Builds from `config.rl`; every dataclass field must be present there (no silent defaults)."""
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in rl]
    if missing:
      raise KeyError(f"config.rl lacks {missing}: declare them in configs/multiturn.py")
    kwargs = {n: rl[n] for n in names}
    kwargs["recompute_old_logps"] = bool(kwargs["recompute_old_logps"])
    kwargs["adv_std_normalize"] = bool(kwargs["adv_std_normalize"])
    kwargs["scan_layers"] = bool(kwargs["scan_layers"])
    return cls(**kwargs)


def _check(ok: bool, msg: str) -> None:
  if not ok:
    raise ValueError(msg)


def discounted_returns(scores_NxT, gamma: float, mode: str = "sum", valid_NxT=None) -> jax.Array:
  """Per-turn returns of multi-turn trajectories [P §2 "Aggregation across turns"].

  sum: R_t = Σ_{i≥t} γ^{i−t} s_i;  max: R_t = max_{i≥t} γ^{i−t} s_i.

  Args:
    scores_NxT: per-turn kernel scores of N trajectories with T turns.
    gamma: discount in [0, 1].
    mode: 'sum' or 'max'.
    valid_NxT: optional bool mask of turns that happened (a trajectory that stopped early); invalid turns
      neither contribute to earlier returns nor get one (their return is 0).
  Returns:
    float32 [N, T] returns.
  """
  if mode not in RETURN_MODES:
    raise ValueError(f"mode must be one of {RETURN_MODES}, got {mode!r}")
  scores = jnp.asarray(scores_NxT, jnp.float32)
  if scores.ndim != 2:
    raise ValueError(f"scores must be [trajectories, turns], got shape {scores.shape}")
  valid = jnp.ones(scores.shape, bool) if valid_NxT is None else jnp.asarray(valid_NxT, bool)
  num_turns = scores.shape[1]
  out = [None] * num_turns
  # Backward recursion: sum R_t = s_t + γ R_{t+1}; max R_t = max(s_t, γ R_{t+1}) (γ ≥ 0 keeps this exact).
  later = None  # γ-discountable aggregate of turns > t, None before the last turn.
  for t in reversed(range(num_turns)):
    s, v = scores[:, t], valid[:, t]
    if later is None:
      r = s
    elif mode == "sum":
      r = s + gamma * later
    else:
      r = jnp.where(jnp.isneginf(later), s, jnp.maximum(s, gamma * later))
    empty = 0.0 if mode == "sum" else -jnp.inf
    later = jnp.where(v, r, empty if later is None else later)
    out[t] = jnp.where(v, r, 0.0)
  return jnp.stack(out, axis=1)


def group_advantages(returns, group_ids, *, std_normalize: bool = True, baseline: str = "mean",
                     eps: float = 1e-6, num_groups: int | None = None) -> jax.Array:
  """Advantages normalised within each group (task) over all of its turn-samples [P eq. 1, §1].

  A_i = (R_i − b_i) / (std_g + eps) with b_i the group mean (or, leave_one_out, the mean of the group's
  other samples) and std_g the group's unbiased (ddof=1, as torch/OpenRLHF) standard deviation; without
  std_normalize, A_i = R_i − b_i. A group of one sample gets advantage 0.

  Args:
    returns: per-sample returns, any shape (e.g. [N, T] turn returns).
    group_ids: int group (task) index per sample, same shape, values in [0, num_groups).
    std_normalize: divide by the group std (False: Dr. GRPO's unscaled advantage).
    baseline: 'mean' or 'leave_one_out'.
    eps: added to the std.
    num_groups: number of groups; None = max(group_ids) + 1 (needs concrete group_ids).
  Returns:
    float32 advantages shaped like `returns`.
  """
  if baseline not in BASELINES:
    raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
  r = jnp.asarray(returns, jnp.float32)
  g = jnp.asarray(group_ids, jnp.int32)
  if r.shape != g.shape:
    raise ValueError(f"returns {r.shape} and group_ids {g.shape} must have the same shape")
  shape = r.shape
  r, g = r.reshape(-1), g.reshape(-1)
  if num_groups is None:
    num_groups = int(jax.device_get(g.max())) + 1 if g.size else 0
  seg = lambda x: jax.ops.segment_sum(x, g, num_segments=num_groups)
  n = seg(jnp.ones_like(r))[g]
  total = seg(r)[g]
  mean = total / n
  var = seg(jnp.square(r - mean))[g] / jnp.maximum(n - 1, 1)
  if baseline == "mean":
    b = mean
  else:
    b = jnp.where(n > 1, (total - r) / jnp.maximum(n - 1, 1), r)
  adv = r - b
  if std_normalize:
    adv = adv / (jnp.sqrt(var) + eps)
  return jnp.where(n > 1, adv, 0.0).reshape(shape)


def advantage_groups(task_NxT, present_NxT, num_tasks: int, per_turn: bool) -> tuple[np.ndarray, int]:
  """Group ids for `group_advantages` over an [N, T] turn layout, and their count.

  per_turn=False: every turn-sample of a task is one group (the paper's m*n samples [P §1]); per_turn=True: one
  group per (task, turn), so a baseline compares a turn with the same turn of the task's other trajectories
  (TRLOO, Dr. Kernel arXiv 2602.05885). Absent cells (a trajectory without that turn) each get a group of their
  own, so they never enter another group's mean or std.
  """
  task_NxT = np.asarray(task_NxT, np.int64)
  present_NxT = np.asarray(present_NxT, bool)
  n, t = task_NxT.shape
  ids = task_NxT * t + np.arange(t)[None, :] if per_turn else task_NxT.copy()
  count = num_tasks * t if per_turn else num_tasks
  absent = ~present_NxT
  ids[absent] = count + np.arange(int(absent.sum()))
  return ids.astype(np.int32), count + int(absent.sum())


def scale_negatives(advantages, scale: float) -> jax.Array:
  """A_i for A_i >= 0, scale * A_i below: how hard below-baseline samples are pushed down.

  Sequence-level advantages penalise every token of a below-baseline sample. On a policy that has memorised its
  answers, a failed sample is mostly the memorised tokens plus a few off-path ones, and pushing the memorised
  tokens down in the off-path contexts (where they are less certain, so their gradient is larger) can outweigh
  the positive samples' nearly saturated push up: the policy's entropy grows and it collapses. A scale below 1
  keeps the ordering of the samples but leaves a net push towards the above-baseline ones
  (experiments/toy_memorizer measures both).
  """
  a = jnp.asarray(advantages, jnp.float32)
  return jnp.where(a < 0, scale * a, a)


def exp_minus_1_minus(x) -> jax.Array:
  """e^x − 1 − x without fp32 cancellation (log-ratios are ~1e-3; e^x − 1 − x in fp32 would be ~1% off)."""
  small = jnp.abs(x) < 0.05
  xs = jnp.where(small, x, 0.0)
  series = xs * xs * (0.5 + xs * (1.0 / 6 + xs * (1.0 / 24 + xs / 120)))  # Next term x^6/720: < 2e-8 relative.
  return jnp.where(small, series, jnp.expm1(x) - x)


def kl_estimate(logps, ref_logps, estimator: str) -> jax.Array:
  """Per-token KL(π ‖ π_ref) estimate from samples of π: k1 = log π − log π_ref; k3 = e^{−k1} + k1 − 1."""
  log_ratio = ref_logps - logps
  if estimator == "k1":
    return -log_ratio
  if estimator == "k3":
    return exp_minus_1_minus(log_ratio)
  raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def aggregate(per_token_BxL, mask_BxL, mode: str, *, constant: float = 1.0, num_tokens=None,
              num_seqs=None) -> jax.Array:
  """Reduces masked per-token values to a scalar (module docstring: the three modes).

  Args:
    per_token_BxL: per-token values.
    mask_BxL: 1 where the token counts.
    mode: token_mean | seq_mean | constant.
    constant: C of mode 'constant'.
    num_tokens: Σ mask of the whole minibatch (default: of these rows).
    num_seqs: rows with ≥1 counted token in the whole minibatch (default: of these rows).
  """
  m = mask_BxL.astype(jnp.float32)
  x = jnp.where(m > 0, per_token_BxL, 0.0)
  if num_tokens is None:
    num_tokens = m.sum()
  if num_seqs is None:
    num_seqs = (m.sum(axis=1) > 0).sum()
  num_tokens = jnp.maximum(jnp.asarray(num_tokens, jnp.float32), 1.0)
  num_seqs = jnp.maximum(jnp.asarray(num_seqs, jnp.float32), 1.0)
  if mode == "token_mean":
    return x.sum() / num_tokens
  if mode == "seq_mean":
    return (x.sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0)).sum() / num_seqs
  if mode == "constant":
    return x.sum() / (constant * num_seqs)
  raise ValueError(f"loss aggregation must be one of {LOSS_AGGS}, got {mode!r}")


def policy_loss(logps_BxL, old_logps_BxL, advantages_B, loss_mask_BxL, cfg: GRPOConfig, *,
                ref_logps_BxL=None, entropy_BxL=None, num_tokens=None,
                num_seqs=None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """PPO-clip GRPO loss with asymmetric clipping, optional KL to a reference, masked aggregation.

  Per token: ρ = exp(log π − log π_old); l = −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) + β·KL. Only tokens
  with loss_mask = 1 (generated by the policy) count; prompt, feedback and padding tokens are excluded.

  With cfg.adv_prob_weight = α > 0 the sequence advantage becomes per token A·(α·π_old(token) + 1 − α). The
  gradient of log π(token) with respect to the logits has norm ~(1 − π), so in a sample that is mostly
  near-certain tokens the update is made almost entirely by its few improbable ones; in a rewarded sample those
  are often sampling noise in text the reward never checks (reasoning, summary). α = 1 turns the token's term
  into the gradient of π itself, which vanishes for improbable tokens (the low-probability-token reweighting
  of Yang et al. 2025, arXiv 2505.12929).

  Args:
    logps_BxL: log π(token) under the current parameters (differentiated).
    old_logps_BxL: log π_old(token) of the policy that sampled (not differentiated).
    advantages_B: one advantage per sequence, broadcast over its tokens [P §2].
    loss_mask_BxL: 1 where the token was generated by the policy.
    cfg: the GRPOConfig.
    ref_logps_BxL: log π_ref(token), needed iff cfg.kl_beta > 0.
    entropy_BxL: optional per-token entropy of π (a metric only).
    num_tokens, num_seqs: minibatch denominators (see `aggregate`).
  Returns:
    (loss, stats): the scalar loss and a dict of *sums* over counted tokens (plus 'tokens', 'seqs'),
    which add across micro-batches; `summarize` turns them into means.
  """
  if cfg.kl_beta > 0 and ref_logps_BxL is None:
    raise ValueError("kl_beta > 0 needs ref_logps (log-probs of the frozen reference policy)")
  m = loss_mask_BxL.astype(jnp.float32)
  on = m > 0
  # Masked positions may hold anything (sampler padding): zero them before exp so 0·inf never appears.
  log_ratio = jnp.where(on, logps_BxL - jax.lax.stop_gradient(old_logps_BxL), 0.0)
  ratio = jnp.exp(log_ratio)
  adv = advantages_B.astype(jnp.float32)[:, None]
  if cfg.adv_prob_weight > 0:
    p_old = jnp.exp(jnp.where(on, jax.lax.stop_gradient(old_logps_BxL), 0.0))
    adv = adv * (cfg.adv_prob_weight * p_old + (1.0 - cfg.adv_prob_weight))
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high) * adv
  per_token = -jnp.minimum(unclipped, clipped)
  stats = {}
  if ref_logps_BxL is not None:
    kl = jnp.where(on, kl_estimate(logps_BxL, jax.lax.stop_gradient(ref_logps_BxL), cfg.kl_estimator), 0.0)
    stats["kl_sum"] = jax.lax.stop_gradient((kl * m).sum())
    if cfg.kl_beta > 0:
      per_token = per_token + cfg.kl_beta * kl
  loss = aggregate(per_token, m, cfg.loss_agg, constant=cfg.loss_constant, num_tokens=num_tokens,
                   num_seqs=num_seqs)
  sg = jax.lax.stop_gradient
  lr = sg(log_ratio)
  stats.update(
      tokens=m.sum(),
      seqs=(m.sum(axis=1) > 0).sum().astype(jnp.float32),
      loss_sum=sg(loss),
      # Clipping active (the gradient of that token is zero): ratio beyond the bound on the side A pushes.
      clip_high_sum=((sg(ratio) > 1.0 + cfg.epsilon_high) & (adv > 0) & on).sum().astype(jnp.float32),
      clip_low_sum=((sg(ratio) < 1.0 - cfg.epsilon_low) & (adv < 0) & on).sum().astype(jnp.float32),
      ratio_sum=(sg(ratio) * m).sum(),
      # k3 estimate of KL(π_old ‖ π) from tokens sampled by π_old: how far the update moved.
      approx_kl_sum=(exp_minus_1_minus(lr) * m).sum(),
  )
  if entropy_BxL is not None:
    stats["entropy_sum"] = (sg(entropy_BxL).astype(jnp.float32) * m).sum()
  return loss, stats


def summarize(stats: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Turns summed stats (possibly added over micro-batches) into per-token means."""
  n = jnp.maximum(stats["tokens"], 1.0)
  out = {"tokens": stats["tokens"], "seqs": stats["seqs"]}
  for k, v in stats.items():
    if k.endswith("_sum") and k != "loss_sum":
      name = {"clip_high_sum": "clip_frac_high", "clip_low_sum": "clip_frac_low"}.get(k, k[:-4])
      out[name] = v / n
  if "clip_high_sum" in stats:
    out["clip_frac"] = (stats["clip_high_sum"] + stats["clip_low_sum"]) / n
  return out
