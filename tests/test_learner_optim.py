"""rl/optimizer.py against hand-computed AdamW steps; learner dtypes (bf16 + fp32 master), batch contract, KL."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import multiturn
from kevin_jax import sharding
from kevin_jax.policy.config import get_preset
from kevin_jax.rl import learner as L
from kevin_jax.rl.logprobs import token_logps
from kevin_jax.rl.optimizer import OptimizerConfig, lr_schedule, make_optimizer
from tests.test_learner import TEMP, init_params_host, make_batch, make_learner, rel_err, state_for


def test_schedule_warmup_then_constant():
  sched = lr_schedule(OptimizerConfig(learning_rate=2e-6, warmup_steps=3))
  np.testing.assert_allclose([sched(jnp.int32(c)) for c in range(5)],
                             [2e-6 / 3, 4e-6 / 3, 2e-6, 2e-6, 2e-6], rtol=1e-6)
  # Paper run: 40 steps x 2 updates, 3% warmup -> ceil(2.4) = 3 warmup updates [P §1].
  assert OptimizerConfig.from_config(multiturn.get_config().optimizer, 80).warmup_steps == 3


def test_clip_then_adamw_by_hand():
  cfg = OptimizerConfig(learning_rate=0.1, warmup_steps=0, max_grad_norm=0.05, weight_decay=0.5)
  tx = make_optimizer(cfg)
  p = {"w": jnp.array([1.0, -2.0])}
  g = {"w": jnp.array([3.0, -4.0])}  # Norm 5 -> clipped to 0.05: [.03, -.04].
  state = tx.init(p)
  for _ in range(2):  # Bias-corrected Adam with a constant gradient: m^ = g, v^ = g^2 at every step.
    upd, state = tx.update(g, state, p)
    want = -0.1 * np.array([0.03, -0.04]) / (np.abs([0.03, -0.04]) + 1e-8) - 0.1 * 0.5 * np.asarray(p["w"])
    np.testing.assert_allclose(upd["w"], want, rtol=1e-5)
    p = optax.apply_updates(p, upd)


def test_clip_then_sgd_momentum_by_hand():
  # name=sgd: clip to norm .05 -> [.03, -.04]; heavy-ball momentum .9: t_1 = g, t_2 = g + .9 t_1 = 1.9 g;
  # update = -lr * t (every parameter in proportion to its gradient, unlike Adam's per-parameter sign-like step).
  cfg = OptimizerConfig(learning_rate=0.1, warmup_steps=0, max_grad_norm=0.05, name="sgd", b1=0.9)
  tx = make_optimizer(cfg)
  p = {"w": jnp.array([1.0, -2.0])}
  g = {"w": jnp.array([3.0, -4.0])}
  state = tx.init(p)
  for mult in (1.0, 1.9):
    upd, state = tx.update(g, state, p)
    np.testing.assert_allclose(upd["w"], -0.1 * mult * np.array([0.03, -0.04]), rtol=1e-5)
  with pytest.raises(ValueError, match="optimizer name"):
    OptimizerConfig(name="lion")
  config = multiturn.get_config()
  config.optimizer.name = "sgd"
  assert OptimizerConfig.from_config(config.optimizer, 40).name == "sgd"


def test_bf16_state_dtype_keeps_moments_in_bf16():
  tx = make_optimizer(OptimizerConfig(state_dtype="bfloat16", warmup_steps=0))
  p = {"w": jnp.ones((4,), jnp.float32)}
  state = tx.init(p)
  _, state = tx.update({"w": jnp.full((4,), 0.01)}, state, p)
  dtypes = {x.dtype for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)}
  assert dtypes == {jnp.dtype(jnp.bfloat16)}


def test_from_config_runlocal_builds_abstractly(cpu_devices8):
  config = multiturn.get_config("runlocal")
  mesh = sharding.make_mesh(config.mesh.axes, cpu_devices8)
  lrn = L.Learner.from_config(config, mesh)
  assert lrn.micro_batch == config.rl.micro_batch_size * 8 and lrn.rows_multiple() == 2 * lrn.micro_batch
  assert lrn.opt_cfg.warmup_steps == 1  # ceil(0.03 * 2 steps * 2 updates).
  assert not lrn.use_master  # runlocal trains in float32.


def test_bf16_params_with_fp32_master():
  model_cfg = get_preset("tiny", param_dtype="bfloat16", compute_dtype="bfloat16")
  lrn = make_learner((1, 1), model_cfg=model_cfg, opt=OptimizerConfig(learning_rate=1e-5, warmup_steps=0))
  st = lrn.abstract_state
  assert {x.dtype for x in jax.tree.leaves(st.params)} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(st.master)} == {jnp.dtype(jnp.float32)}
  moments = [x for x in jax.tree.leaves(st.opt_state) if x.ndim > 0]
  assert moments and {x.dtype for x in moments} == {jnp.dtype(jnp.float32)}
  init32 = jax.tree.map(lambda x: np.asarray(x, np.float32), init_params_host())
  params = jax.tree.map(lambda x: np.asarray(x.astype(jnp.bfloat16)), init32)  # Host copy (donation).
  state, metrics = lrn.step(lrn.state_from_params(jax.device_put(params, lrn.param_shardings)), make_batch())
  state = jax.device_get(state)
  assert int(metrics["updates_applied"]) == 2
  master_moved = bf16_moved = total = 0
  for m, p, p0 in zip(jax.tree.leaves(state.master), jax.tree.leaves(state.params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(p), np.asarray(m).astype(jnp.bfloat16))  # params = bf16(master)
    master_moved += int((np.asarray(m) != np.asarray(p0, np.float32)).sum())
    bf16_moved += int((np.asarray(p) != np.asarray(p0)).sum())
    total += m.size
  # Adam moves nearly every weight by ~2e-5 (2 updates x lr); in bf16 most of those steps round away.
  assert master_moved > 0.9 * total
  assert bf16_moved < 0.5 * master_moved


def test_batch_contract_errors():
  lrn = make_learner((1, 1), micro_batch_size=4)  # Rows must be a multiple of 2 updates x 4 = 8.
  b = make_batch(12)
  with pytest.raises(ValueError, match="multiple of .* = 8"):
    lrn.put_batch(b)
  padded = L.pad_batch(b, lrn.rows_multiple())
  assert padded.tokens_BxT.shape == (16, 24) and padded.loss_mask_BxT[12:].sum() == 0
  bad = L.TrainBatch(*(x for x in (b.tokens_BxT[:8], b.attn_mask_BxT[:8], b.loss_mask_BxT[:8],
                                   b.old_logps_BxT[:8, :5], b.advantages_B[:8])))
  with pytest.raises(ValueError, match="old_logps_BxT has shape"):
    lrn.put_batch(bad)
  with pytest.raises(ValueError, match="must be given iff rl.kl_beta > 0"):
    lrn.put_batch(L.TrainBatch(*(x[:8] for x in (b.tokens_BxT, b.attn_mask_BxT, b.loss_mask_BxT,
                                                 b.old_logps_BxT, b.advantages_B)), ref_logps_BxT=b.old_logps_BxT[:8]))


def test_device_order_roundtrip():
  x = np.arange(24)  # U = 2 minibatches x M = 3 micro-batches x G = 4 rows.
  d = L.to_device_order(x, 2, 4)
  # Device order: row-in-micro-batch i major; a device holding d[0:6] has row 0 of all 6 micro-batches.
  np.testing.assert_array_equal(d[:6], [0, 4, 8, 12, 16, 20])
  back = np.asarray(jnp.moveaxis(jnp.asarray(d).reshape(4, 2, 3), 0, 2)).reshape(-1)  # What the step does.
  np.testing.assert_array_equal(back, x)


def test_kl_to_reference_reaches_the_loss():
  # ref = learner log-probs + 0.5 on counted tokens: k3 = e^.5 - .5 - 1 per token; the first update is on-policy
  # (ratio 1), so with token_mean its loss is -Σ A_i n_i / N + β k3 (first minibatch = rows 0-7).
  lrn = make_learner((1, 1), micro_batch_size=4, loss_agg="token_mean", kl_beta=0.1)
  b = make_batch()
  model = nnx.merge(lrn.graphdef, init_params_host())
  logps, _ = token_logps(model, jnp.asarray(b.tokens_BxT), jnp.asarray(b.attn_mask_BxT), chunk=7,
                         temperature=TEMP)
  ref = np.where(b.loss_mask_BxT > 0, np.asarray(logps) + 0.5, 0.0).astype(np.float32)
  _, metrics = lrn.step(state_for(lrn), L.TrainBatch(b.tokens_BxT, b.attn_mask_BxT, b.loss_mask_BxT,
                                                    b.old_logps_BxT, b.advantages_B, ref))
  m, a = b.loss_mask_BxT[:8], b.advantages_B[:8]
  k3 = np.exp(0.5) - 1.5
  np.testing.assert_allclose(metrics["loss_first"], -(a * m.sum(1)).sum() / m.sum() + 0.1 * k3, rtol=1e-4)
  assert np.isfinite(float(metrics["kl"])) and float(metrics["kl"]) > 0


def _ref_params_host(scale=0.02, seed=5):
  """The tiny model's parameters with every weight moved by scale * N(0, 1): a reference that differs."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: (np.asarray(x) + scale * rng.normal(size=np.shape(x))).astype(np.asarray(x).dtype),
                      init_params_host())


def test_kl_reference_params_equal_precomputed_ref_logps():
  # step(ref_params=) computes log pi_ref inside the step; it must equal passing those log-probs in the batch.
  lrn = make_learner((1, 1), micro_batch_size=4, loss_agg="token_mean", kl_beta=0.1)
  b = make_batch()
  ref_host = _ref_params_host()
  ref_model = nnx.merge(lrn.graphdef, ref_host)
  ref_logps, _ = token_logps(ref_model, jnp.asarray(b.tokens_BxT), jnp.asarray(b.attn_mask_BxT), chunk=7,
                             temperature=TEMP)
  ref_logps = np.where(b.loss_mask_BxT > 0, np.asarray(ref_logps), 0.0).astype(np.float32)
  with_logps = L.TrainBatch(b.tokens_BxT, b.attn_mask_BxT, b.loss_mask_BxT, b.old_logps_BxT, b.advantages_B,
                            ref_logps)
  state_a, m_a = jax.device_get(lrn.step(state_for(lrn), with_logps))
  ref = lrn.copy_params(jax.device_put(ref_host, lrn.param_shardings))
  state_b, m_b = jax.device_get(lrn.step(state_for(lrn), b, ref_params=ref))
  assert float(m_a["kl"]) > 1e-3  # The reference really differs.
  for k in ("loss_first", "loss", "kl", "grad_norm"):
    np.testing.assert_allclose(m_b[k], m_a[k], rtol=1e-4, err_msg=k)
  assert rel_err(state_b.params, state_a.params) < 1e-5
  # The reference survives the step (the state is donated, the reference is not) and is unchanged.
  assert rel_err(jax.device_get(ref), ref_host) == 0.0
  with pytest.raises(ValueError, match="not both"):
    lrn.step(state_for(lrn), with_logps, ref_params=ref)
  with pytest.raises(ValueError, match="must be given iff"):
    lrn.step(state_for(lrn), b)  # kl_beta > 0 and no reference at all.


def test_kl_reference_equal_to_start_leaves_first_update_unchanged():
  # With the reference = the starting parameters, the first update is on-policy and at the reference: KL = 0
  # and its k3 gradient (1 - pi_ref / pi) grad log pi = 0, so the first loss matches kl_beta = 0.
  plain = make_learner((1, 1), micro_batch_size=4, loss_agg="token_mean")
  klr = make_learner((1, 1), micro_batch_size=4, loss_agg="token_mean", kl_beta=0.5)
  state = state_for(klr)
  ref = klr.copy_params(state.params)
  _, m_kl = jax.device_get(klr.step(state, make_batch(), ref_params=ref))
  _, m_plain = jax.device_get(plain.step(state_for(plain), make_batch()))
  np.testing.assert_allclose(m_kl["loss_first"], m_plain["loss_first"], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(m_kl["grad_norm_first"], m_plain["grad_norm_first"], rtol=1e-4)
  assert 0 < float(m_kl["kl"]) < 1e-3  # Only the second update, after one step away from the reference, adds KL.
