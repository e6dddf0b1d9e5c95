"""kevin_jax/rl/grpo.py against hand-computed numbers (each expected value is worked out in a comment)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import multiturn
from kevin_jax.rl import grpo

G = 0.4  # The paper's turn discount [P §2].


# ---------------------------------------------------------------- config

def test_config_from_multiturn_rl_section():
  cfg = grpo.GRPOConfig.from_config(multiturn.get_config().rl)
  assert (cfg.gamma, cfg.return_mode, cfg.epsilon_low, cfg.epsilon_high) == (0.4, "sum", 0.2, 0.28)
  assert (cfg.loss_agg, cfg.kl_beta, cfg.updates_per_batch) == ("constant", 0.0, 2)
  assert cfg.recompute_old_logps is True


def test_config_validation_names_the_field():
  with pytest.raises(ValueError, match="epsilon_low"):
    grpo.GRPOConfig(epsilon_low=1.5)
  with pytest.raises(ValueError, match="loss_agg"):
    grpo.GRPOConfig(loss_agg="sum")
  with pytest.raises(ValueError, match="gamma"):
    grpo.GRPOConfig(gamma=-0.1)
  rl = dict(multiturn.get_config().rl)
  del rl["gamma"]
  with pytest.raises(KeyError, match="gamma"):
    grpo.GRPOConfig.from_config(rl)


# ---------------------------------------------------------------- returns

SCORES = [[0.0, 0.0, 1.3, 0.0],
          [1.0, 0.3, 0.0, 2.0]]


def test_returns_sum_gamma_0_4():
  # Row 0: R3 = 0, R2 = 1.3, R1 = .4*1.3 = .52, R0 = .4*.52 = .208.
  # Row 1: R3 = 2, R2 = 0 + .4*2 = .8, R1 = .3 + .4*.8 = .62, R0 = 1 + .4*.62 = 1.248.
  r = grpo.discounted_returns(np.array(SCORES), G, "sum")
  np.testing.assert_allclose(r, [[0.208, 0.52, 1.3, 0.0], [1.248, 0.62, 0.8, 2.0]], rtol=1e-6)


def test_returns_max_gamma_0_4():
  # Row 1: R3 = 2, R2 = max(0, .4*2) = .8, R1 = max(.3, .4*.8=.32) = .32, R0 = max(1, .4^3*2=.128) = 1.
  r = grpo.discounted_returns(np.array(SCORES), G, "max")
  np.testing.assert_allclose(r, [[0.208, 0.52, 1.3, 0.0], [1.0, 0.32, 0.8, 2.0]], rtol=1e-6)


def test_returns_with_trajectory_stopped_early():
  # Row 1 has only 3 turns: its 2.0 never happened. Sum: R2 = 0, R1 = .3, R0 = 1 + .4*.3 = 1.12.
  valid = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
  r = grpo.discounted_returns(np.array(SCORES), G, "sum", valid)
  np.testing.assert_allclose(r[1], [1.12, 0.3, 0.0, 0.0], rtol=1e-6)
  r = grpo.discounted_returns(np.array(SCORES), G, "max", valid)  # R1 = max(.3, .4*0) = .3, R0 = 1.
  np.testing.assert_allclose(r[1], [1.0, 0.3, 0.0, 0.0], rtol=1e-6)


def test_returns_paper_shapes_match_definition():
  # 8 tasks x 16 trajectories x 4 turns [P §1]; compare with the definitions written as double loops.
  rng = np.random.default_rng(0)
  s = rng.choice([0.0, 0.0, 0.3, 1.1, 2.4], size=(8 * 16, 4))
  for mode, agg in (("sum", sum), ("max", max)):
    want = np.array([[agg(G ** (i - t) * row[i] for i in range(t, 4)) for t in range(4)] for row in s])
    np.testing.assert_allclose(grpo.discounted_returns(s, G, mode), want, rtol=1e-6, err_msg=mode)


# ---------------------------------------------------------------- advantages

def test_advantages_mean_std():
  # Returns 1,2,3,6: mean 3, deviations -2,-1,0,3, Σd² = 14, unbiased var 14/3, std 2.1602469.
  a = grpo.group_advantages(np.array([1.0, 2, 3, 6]), np.zeros(4, int), eps=0.0)
  np.testing.assert_allclose(a, np.array([-2, -1, 0, 3]) / math.sqrt(14 / 3), rtol=1e-6)


def test_advantages_leave_one_out_and_no_std():
  # Baseline for sample i = (12 - r_i)/3 = 11/3, 10/3, 3, 2 -> r - b = -8/3, -4/3, 0, 4.
  r, g = np.array([1.0, 2, 3, 6]), np.zeros(4, int)
  a = grpo.group_advantages(r, g, baseline="leave_one_out", std_normalize=False)
  np.testing.assert_allclose(a, [-8 / 3, -4 / 3, 0, 4], rtol=1e-6)
  a = grpo.group_advantages(r, g, baseline="leave_one_out", eps=0.0)
  np.testing.assert_allclose(a, np.array([-8 / 3, -4 / 3, 0, 4]) / math.sqrt(14 / 3), rtol=1e-6)
  a = grpo.group_advantages(r, g, std_normalize=False)  # Dr. GRPO: just r - mean.
  np.testing.assert_allclose(a, [-2, -1, 0, 3], rtol=1e-6)


def test_advantages_groups_are_independent():
  # Interleaved groups; group 1 is constant (advantage 0, eps keeps 0/0 away); group 2 has one sample.
  r = np.array([1.0, 5.0, 2.0, 5.0, 3.0, 6.0, 9.0])
  g = np.array([0, 1, 0, 1, 0, 0, 2])
  a = np.asarray(grpo.group_advantages(r, g, eps=1e-6))
  np.testing.assert_allclose(a[[0, 2, 4, 5]], np.array([-2, -1, 0, 3]) / (math.sqrt(14 / 3) + 1e-6), rtol=1e-6)
  np.testing.assert_array_equal(a[[1, 3, 6]], [0.0, 0.0, 0.0])


def test_scale_negatives():
  # Advantages -2, -1, 0, 3 (std-normalised above); scale 0.25 -> -0.5, -0.25, 0, 3; scale 1 is GRPO itself.
  a = np.array([-2.0, -1.0, 0.0, 3.0])
  np.testing.assert_array_equal(grpo.scale_negatives(a, 0.25), [-0.5, -0.25, 0.0, 3.0])
  np.testing.assert_array_equal(grpo.scale_negatives(a, 1.0), a)
  np.testing.assert_array_equal(grpo.scale_negatives(a, 0.0), [0.0, 0.0, 0.0, 3.0])
  with pytest.raises(ValueError, match="negative_scale"):
    grpo.GRPOConfig(negative_scale=1.5)


def test_advantages_paper_shapes():
  # Kevin normalises over all m*n = 16*4 turn-samples of each task [P §1]: per task mean 0, std 1.
  rng = np.random.default_rng(1)
  scores = rng.choice([0.0, 0.3, 1.1, 2.4], size=(8 * 16, 4))
  returns = grpo.discounted_returns(scores, G, "sum")
  task = np.repeat(np.arange(8), 16)[:, None].repeat(4, axis=1)  # [128, 4]
  a = np.asarray(grpo.group_advantages(returns, task, eps=1e-8))
  assert a.shape == (128, 4)
  for t in range(8):
    at = a[task == t]
    assert at.size == 64
    np.testing.assert_allclose(at.mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(at.std(ddof=1), 1.0, rtol=1e-5)


# ---------------------------------------------------------------- policy loss

CFG = grpo.GRPOConfig(loss_agg="token_mean", loss_constant=4.0)
# Two sequences, 4 positions. Row 0 (A = 2): ratios 1, e^.2 = 1.2214 (inside 1.28), e^.4 = 1.4918 (clipped
# at 1.28), position 3 masked. Row 1 (A = -1): position 0 masked, e^-.5 = .6065 (clipped at .8), ratio 1.
LOGPS = np.array([[-0.3, -1.0, -0.5, -7.0], [-9.0, -2.0, -0.1, -9.0]], np.float32)
OLD = np.array([[-0.3, -1.2, -0.9, -np.inf], [np.nan, -1.5, -0.1, 0.0]], np.float32)  # Garbage where masked.
MASK = np.array([[1, 1, 1, 0], [0, 1, 1, 0]], np.float32)
ADV = np.array([2.0, -1.0], np.float32)
# Per-token losses -min(ρA, clip(ρ)A): row 0: -2, -2e^.2, -2*1.28; row 1: -min(-.6065, -.8) = .8, -(-1) = 1.
ROW0 = [-2.0, -2 * math.exp(0.2), -2.56]
ROW1 = [0.8, 1.0]
TOTAL = sum(ROW0) + sum(ROW1)


@pytest.mark.parametrize("agg,want", [
    ("token_mean", TOTAL / 5),
    ("seq_mean", (sum(ROW0) / 3 + sum(ROW1) / 2) / 2),
    ("constant", TOTAL / (4.0 * 2)),  # Σ / (C · n_seqs), C = 4.
])
def test_policy_loss_aggregations(agg, want):
  cfg = grpo.GRPOConfig(loss_agg=agg, loss_constant=4.0)
  loss, stats = grpo.policy_loss(jnp.array(LOGPS), jnp.array(OLD), jnp.array(ADV), jnp.array(MASK), cfg)
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  m = grpo.summarize(stats)
  assert float(m["tokens"]) == 5 and float(m["seqs"]) == 2
  np.testing.assert_allclose([m["clip_frac_high"], m["clip_frac_low"], m["clip_frac"]], [0.2, 0.2, 0.4])
  np.testing.assert_allclose(m["ratio"], (1 + math.exp(0.2) + math.exp(0.4) + math.exp(-0.5) + 1) / 5, rtol=1e-6)


def test_policy_loss_gradient_zero_where_clipped():
  def f(lp):
    return grpo.policy_loss(lp, jnp.array(OLD), jnp.array(ADV), jnp.array(MASK), CFG)[0]
  g = np.asarray(jax.grad(f)(jnp.array(LOGPS)))
  # d(-ρA)/dlog π = -ρA, divided by the 5 counted tokens; clipped and masked tokens get exactly 0.
  want = np.array([[-2.0, -2 * math.exp(0.2), 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]) / 5
  np.testing.assert_allclose(g, want, rtol=1e-6)
  assert np.isfinite(g).all()


def test_policy_loss_prob_weight_turns_log_prob_ascent_into_prob_ascent():
  # On-policy (log π = log π_old, ρ = 1), token_mean over the counted tokens n:
  #   α = 0: d loss / d log π_t = −A / n (every token alike, however improbable);
  #   α = 1: −A·π_old,t / n, the gradient of −A·π_t itself (d π / d log π = π);
  #   α = .5: −A·(.5 π_old,t + .5) / n.
  old = np.log(np.array([[0.9, 0.01, 0.5, 0.3]], np.float32))
  adv, mask = np.array([2.0], np.float32), np.array([[1.0, 1.0, 1.0, 0.0]], np.float32)
  p = np.exp(old)
  grads = {}
  for alpha, w in ((0.0, np.ones_like(p)), (1.0, p), (0.5, 0.5 * p + 0.5)):
    cfg = grpo.GRPOConfig(loss_agg="token_mean", adv_prob_weight=alpha)
    f = lambda lp, cfg=cfg: grpo.policy_loss(lp, jnp.array(old), jnp.array(adv), jnp.array(mask), cfg)[0]
    grads[alpha] = g = np.asarray(jax.grad(f)(jnp.array(old)))
    np.testing.assert_allclose(g, -2.0 * w * mask / 3, rtol=1e-6, err_msg=f"alpha={alpha}")
  # α = 1: the improbable token (π = .01) gets 1/90 of the near-certain one's (π = .9) push; α = 0: the same.
  assert grads[1.0][0, 1] / grads[1.0][0, 0] == pytest.approx(0.01 / 0.9, rel=1e-5)
  assert grads[0.0][0, 1] == grads[0.0][0, 0]
  with pytest.raises(ValueError, match="adv_prob_weight"):
    grpo.GRPOConfig(adv_prob_weight=1.5)


def test_policy_loss_kl_and_entropy():
  ref = LOGPS + 0.5  # log π_ref − log π = .5 everywhere: k1 = −.5, k3 = e^.5 − .5 − 1 = .1487213.
  cfg = grpo.GRPOConfig(loss_agg="token_mean", kl_beta=0.1, kl_estimator="k3")
  ent = np.full_like(LOGPS, 2.0)
  ent[0, 0] = 7.0  # Token entropy metric: mean over counted tokens = (7 + 2*4) / 5 = 3.
  loss, stats = grpo.policy_loss(jnp.array(LOGPS), jnp.array(OLD), jnp.array(ADV), jnp.array(MASK), cfg,
                                 ref_logps_BxL=jnp.array(ref), entropy_BxL=jnp.array(ent))
  k3 = math.exp(0.5) - 0.5 - 1
  np.testing.assert_allclose(loss, TOTAL / 5 + 0.1 * k3, rtol=1e-6)
  m = grpo.summarize(stats)
  np.testing.assert_allclose([m["kl"], m["entropy"]], [k3, 3.0], rtol=1e-6)
  np.testing.assert_allclose(grpo.kl_estimate(jnp.float32(-1.0), jnp.float32(-0.5), "k1"), -0.5)
  with pytest.raises(ValueError, match="ref_logps"):
    grpo.policy_loss(jnp.array(LOGPS), jnp.array(OLD), jnp.array(ADV), jnp.array(MASK), cfg)


@pytest.mark.parametrize("agg", grpo.LOSS_AGGS)
def test_micro_batches_with_global_denominators_add_up(agg):
  cfg = grpo.GRPOConfig(loss_agg=agg, loss_constant=4.0)
  args = [jnp.array(x) for x in (LOGPS, OLD, ADV, MASK)]
  full, _ = grpo.policy_loss(*args, cfg)
  parts = [grpo.policy_loss(*[x[i:i + 1] for x in args], cfg, num_tokens=5.0, num_seqs=2.0)[0] for i in (0, 1)]
  np.testing.assert_allclose(parts[0] + parts[1], full, rtol=1e-6)


def test_aggregate_ignores_rows_without_counted_tokens():
  # A padding row (mask all 0) changes neither the sequence count nor the loss.
  x = jnp.array([[1.0, 3.0], [5.0, 5.0]])
  m = jnp.array([[1.0, 1.0], [0.0, 0.0]])
  for mode, want in (("token_mean", 2.0), ("seq_mean", 2.0), ("constant", 4.0 / 2.0)):
    np.testing.assert_allclose(grpo.aggregate(x, m, mode, constant=2.0), want, err_msg=mode)


def test_exp_minus_1_minus_is_accurate_for_small_log_ratios():
  x = np.array([-0.5, -0.05, -1e-2, -3e-3, 1e-5, 2e-3, 0.0499, 0.3], np.float32)
  want = np.expm1(x.astype(np.float64)) - x.astype(np.float64)
  np.testing.assert_allclose(grpo.exp_minus_1_minus(jnp.asarray(x)), want, rtol=2e-5)
