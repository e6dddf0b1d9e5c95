"""kevin_jax/rl/learner.py + logprobs.py on a tiny fp32 Qwen2: sharding invariance, golden step, memory knobs.

Meshes are built on the 8 fake CPU devices of tests/conftest.py.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from kevin_jax import sharding
from kevin_jax.policy.config import get_preset
from kevin_jax.policy.model import Qwen2
from kevin_jax.rl import grpo, learner as L
from kevin_jax.rl.logprobs import token_logps
from kevin_jax.rl.optimizer import OptimizerConfig

TINY = get_preset("tiny", param_dtype="float32", compute_dtype="float32")
TEMP = 0.9
B, T = 16, 24


def make_batch(b=B, t=T, seed=0) -> L.TrainBatch:
  """Right-padded rows: prompt of 5-8 tokens, response up to the row's length, garbage where unmasked."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, TINY.vocab_size, (b, t)).astype(np.int32)
  lengths = rng.integers(t // 2, t + 1, b)
  prompts = rng.integers(5, 9, b)
  pos = np.arange(t)[None]
  attn = (pos < lengths[:, None]).astype(np.int32)
  loss = ((pos >= prompts[:, None]) & (pos < lengths[:, None])).astype(np.float32)
  old = np.where(loss > 0, -9.0 + 0.3 * rng.normal(size=(b, t)), 123.0).astype(np.float32)
  adv = rng.normal(size=b).astype(np.float32)
  return L.TrainBatch(tokens, attn, loss, old, adv)


def make_learner(mesh_shape=(1, 1), model_cfg=TINY, opt=None, **rl):
  n = mesh_shape[0] * mesh_shape[1]
  mesh = sharding.make_mesh((("fsdp", mesh_shape[0]), ("tensor", mesh_shape[1])), jax.devices("cpu")[:n])
  cfg = grpo.GRPOConfig(**{"loss_agg": "constant", "loss_constant": 16.0, "logits_chunk": 7,
                           "micro_batch_size": 4, **rl})
  # eps = 1: Adam's step is ~lr * g for these |g| << 1, so parameters after a step inherit the gradients'
  # accuracy. With eps = 1e-8 Adam maps float noise to full lr-sized steps where the true gradient is 0
  # (k_bias: softmax is invariant to adding q.b_k to every score) and sharded runs differ there by design.
  opt = opt or OptimizerConfig(learning_rate=0.05, warmup_steps=2, eps=1.0, max_grad_norm=1.0)
  return L.Learner(model_cfg, cfg, opt, mesh, temperature=TEMP)


@functools.lru_cache(maxsize=None)
def init_params_host():
  """Parameters of the tiny model (seed 0) as host NumPy, shared by every test."""
  model = Qwen2(TINY, rngs=nnx.Rngs(params=jax.random.key(0)))
  return jax.device_get(nnx.state(model, nnx.Param))


def state_for(lrn: L.Learner) -> L.TrainState:
  params = jax.device_put(init_params_host(), lrn.param_shardings)
  return lrn.state_from_params(params)


def rel_err(a, b) -> float:
  """Largest per-leaf ||a - b|| / ||b|| over two trees."""
  errs = jax.tree.map(lambda x, y: float(np.linalg.norm(np.asarray(x, np.float64) - np.asarray(y, np.float64))
                                         / max(np.linalg.norm(np.asarray(y, np.float64)), 1e-30)), a, b)
  return max(jax.tree.leaves(errs))


# ---------------------------------------------------------------- log-probs

def test_token_logps_match_full_log_softmax():
  model = nnx.merge(nnx.graphdef(Qwen2(TINY, rngs=nnx.Rngs(0))), init_params_host())
  batch = make_batch(4, 11)
  tokens, attn = jnp.asarray(batch.tokens_BxT), jnp.asarray(batch.attn_mask_BxT)
  pos = jnp.broadcast_to(jnp.arange(11), (4, 11))
  logits, _ = model(tokens, pos, attn)
  logp_all = jax.nn.log_softmax(logits / TEMP, axis=-1)
  want = np.zeros((4, 11), np.float32)
  want[:, 1:] = np.take_along_axis(np.asarray(logp_all[:, :-1]), np.asarray(tokens)[:, 1:, None], -1)[..., 0]
  p = np.exp(np.asarray(logp_all[:, :-1], np.float64))
  want_ent = np.zeros((4, 11))
  want_ent[:, 1:] = -(p * np.asarray(logp_all[:, :-1], np.float64)).sum(-1)
  for chunk in (1, 3, 10, 64):  # 10 = exactly the 10 predictions; 3 leaves a padded last chunk.
    got, ent = token_logps(model, tokens, attn, chunk=chunk, temperature=TEMP)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"chunk {chunk}")
    np.testing.assert_allclose(ent, want_ent, rtol=1e-5, atol=1e-5, err_msg=f"chunk {chunk}")


# ---------------------------------------------------------------- sharding invariance

MESHES = {(8, 1): 1, (4, 2): 1, (2, 4): 2}  # mesh -> micro_batch_size per device (G = 8, 4, 4 rows).


@pytest.fixture(scope="module")
def reference_learner():
  return make_learner((1, 1), micro_batch_size=4)


@pytest.fixture(scope="module")
def reference_step(reference_learner):
  state, metrics = reference_learner.step(state_for(reference_learner), make_batch())
  return jax.device_get(state), jax.device_get(metrics)


def _first_minibatch_grads(lrn: L.Learner):
  """grads and stats of the first minibatch through learner.minibatch_grads, jitted with the mesh's shardings."""
  batch = make_batch()
  half = B // 2
  g = lrn.micro_batch
  mini = L.TrainBatch(*(None if x is None else np.asarray(x)[:half].reshape((half // g, g) + np.shape(x)[1:])
                        for x in dataclasses.astuple(batch)))
  mini_sh = NamedSharding(lrn.mesh, P(None, sharding.batch_axes(lrn.mesh) or None))
  fn = jax.jit(functools.partial(L.minibatch_grads, graphdef=lrn.graphdef, cfg=lrn.cfg, temperature=TEMP,
                                 mesh=lrn.mesh), in_shardings=(lrn.param_shardings, mini_sh))
  params = jax.device_put(init_params_host(), lrn.param_shardings)
  return jax.device_get(fn(params, jax.device_put(mini, mini_sh)))


@pytest.fixture(scope="module")
def reference_grads():
  return _first_minibatch_grads(make_learner((1, 1), micro_batch_size=4))


@pytest.mark.parametrize("mesh_shape", list(MESHES))
def test_meshes_give_same_loss_and_gradients(cpu_devices8, mesh_shape, reference_grads, reference_step):
  del cpu_devices8
  lrn = make_learner(mesh_shape, micro_batch_size=MESHES[mesh_shape])
  grads, stats = _first_minibatch_grads(lrn)
  ref_grads, ref_stats = reference_grads
  np.testing.assert_allclose(stats["loss_sum"], ref_stats["loss_sum"], rtol=1e-5)
  assert rel_err(grads, ref_grads) <= 1e-5, f"{mesh_shape}: gradients differ by {rel_err(grads, ref_grads)}"
  # The whole step (old-logp recompute, 2 updates, Adam) on this mesh.
  state, metrics = lrn.step(state_for(lrn), make_batch())
  ref_state, ref_metrics = reference_step
  for k in ("loss", "loss_first", "grad_norm_first", "grad_norm", "entropy", "logp_mismatch"):
    np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=1e-5, err_msg=k)
  # approx_kl ~ mean(x^2)/2 of log-ratios x ~ 3e-3 between log-probs of ~-9, which fp32 holds to ~1e-6:
  # its sharding noise is ~|x| * 1e-6 ~ 3e-9 (absolute), i.e. ~1e-3 of its 5e-6 value.
  np.testing.assert_allclose(metrics["approx_kl"], ref_metrics["approx_kl"], rtol=0, atol=1e-8)
  assert rel_err(jax.device_get(state.params), ref_state.params) <= 1e-5
  leaf = state.params["layers"][0]["mlp"]["gate_kernel"].get_value()
  assert leaf.sharding.spec == sharding.spec_table(state.params, lrn.mesh)["layers/0/mlp/gate_kernel"]


# ---------------------------------------------------------------- golden one-step regression

# Tiny fp32 model, seed-0 init, make_batch(), constant aggregation (C = 16), 2 updates, AdamW (lr 0.05, eps 1).
GOLDEN = {"loss_first": 0.25017518, "grad_norm_first": 1.0813853, "loss": 0.233428, "update_abs_sum": 8.9674718}


def test_golden_one_step(reference_step):
  state, metrics = reference_step
  init = jax.tree.leaves(init_params_host())
  got = {"loss_first": float(metrics["loss_first"]), "grad_norm_first": float(metrics["grad_norm_first"]),
         "loss": float(metrics["loss"]),
         "update_abs_sum": float(sum(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).sum()
                                     for a, b in zip(jax.tree.leaves(state.params), init)))}
  msg = ("Golden one-step numbers of the tiny fp32 learner changed. Updating GOLDEN is legitimate only when "
         "the change is intended: model math or init (policy/model.py), the loss/aggregation (rl/grpo.py), the "
         "log-prob alignment, the optimizer or this test's batch/config - say which in the commit message. A "
         "refactor, a new sharding or an accumulation change must reproduce these numbers (within rtol 1e-4). "
         f"Got: {got}")
  for k, v in GOLDEN.items():
    np.testing.assert_allclose(got[k], v, rtol=1e-4, err_msg=msg)
  assert int(state.step) == 2 and int(metrics["updates_applied"]) == 2


def test_recompute_makes_first_update_on_policy(reference_step):
  # With recomputed old log-probs the first update has ratio 1 everywhere, so its loss is -Σ A_i n_i / (C n_seqs)
  # over the first minibatch (rows 0-7; n_i = counted tokens of row i; C = 16).
  _, metrics = reference_step
  b = make_batch()
  m, a = b.loss_mask_BxT[:8], b.advantages_B[:8]
  want = -(a * m.sum(1)).sum() / (16.0 * (m.sum(1) > 0).sum())
  np.testing.assert_allclose(metrics["loss_first"], want, rtol=1e-6)
  # The sampler's old log-probs were -9 +- 0.3 noise; the learner's own are ~ -log(8192) at T = 0.9.
  assert 0.1 < float(metrics["logp_mismatch"]) < 1.0
  assert float(metrics["tokens"]) == b.loss_mask_BxT.sum()


# ---------------------------------------------------------------- NaN/Inf guard

@pytest.mark.parametrize("bad_row,bad_update", [(3, 0), (12, 1)])
def test_nonfinite_update_is_skipped_and_reported(reference_learner, bad_row, bad_update):
  lrn = reference_learner
  batch = make_batch()
  batch.advantages_B[bad_row] = np.nan  # Row 3 is in minibatch 0, row 12 in minibatch 1.
  state = state_for(lrn)
  before = jax.device_get(state.params)
  state, metrics = lrn.step(state, batch)
  metrics = jax.device_get(metrics)
  assert int(metrics["nonfinite_update"]) == bad_update and int(metrics["nonfinite_loss"]) == 1
  assert int(state.step) == bad_update == int(metrics["updates_applied"])
  if bad_update == 0:  # Nothing applied: the parameters are exactly the old ones.
    assert rel_err(jax.device_get(state.params), before) == 0.0
  else:  # The first update went through and the state holds it, finite.
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(state.params)))
  with pytest.raises(L.NonFiniteError, match=rf"RL step 7: non-finite loss = nan and pre-clip gradient global "
                                             rf"norm = nan in optimizer update {bad_update + 1} of 2"):
    L.check_finite(metrics, step=7)


def test_check_finite_names_the_gradient():
  metrics = {"nonfinite_update": np.int32(1), "bad_loss_values": np.array([0.0, 0.0], np.float32),
             "bad_grad_norms": np.array([0.0, np.inf], np.float32)}
  with pytest.raises(L.NonFiniteError, match="RL step 3: non-finite pre-clip gradient global norm = inf in "
                                             "optimizer update 2 of 2"):
    L.check_finite(metrics, step=3)
  L.check_finite({"nonfinite_update": np.int32(-1)}, step=4)  # Finite: no error.
