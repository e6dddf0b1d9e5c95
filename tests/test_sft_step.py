"""kevin_jax/rl/sft_step.py on a tiny fp32 Qwen2: masked loss by hand, chunked log-probs, accumulation, schedule."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kevin_jax import sharding
from kevin_jax.policy.config import get_preset
from kevin_jax.policy.model import Qwen2
from kevin_jax.rl import grpo
from kevin_jax.rl import learner as L
from kevin_jax.rl import sft_step as S
from kevin_jax.rl.logprobs import token_logps

TINY = get_preset("tiny", param_dtype="float32", compute_dtype="float32")


def make_step(mesh_shape=(1, 1), micro=2, batch=2, **cfg):
  n = mesh_shape[0] * mesh_shape[1]
  mesh = sharding.make_mesh((("fsdp", mesh_shape[0]), ("tensor", mesh_shape[1])), jax.devices("cpu")[:n])
  c = S.SFTConfig(batch_size=batch, micro_batch_size=micro, learning_rate=0.01, warmup_steps=0, total_steps=10,
                  logits_chunk=5, **cfg)
  lrn = L.Learner(TINY, grpo.GRPOConfig(micro_batch_size=micro, updates_per_batch=1, logits_chunk=5),
                  c.learner_optimizer(), mesh, temperature=1.0)
  return S.SFTStep(lrn, c)


def params_host():
  return jax.device_get(nnx.state(Qwen2(TINY, rngs=nnx.Rngs(params=jax.random.key(0))), nnx.Param))


def two_examples():
  """Row 0: 4 prompt + 5 response tokens, 3 padding; row 1: 6 prompt + 6 response. T = 12."""
  rng = np.random.default_rng(1)
  tokens = rng.integers(3, TINY.vocab_size, (2, 12)).astype(np.int32)
  attn = np.zeros((2, 12), np.int32)
  loss = np.zeros((2, 12), np.float32)
  attn[0, :9], loss[0, 4:9] = 1, 1.0
  attn[1, :12], loss[1, 6:12] = 1, 1.0
  tokens[0, 9:] = 0
  return S.SFTBatch(tokens, attn, loss)


def hand_loss(params, batch):
  """-mean over response positions of log_softmax(full logits at t - 1)[token t], in float64 NumPy."""
  model = nnx.merge(nnx.graphdef(Qwen2(TINY, rngs=nnx.Rngs(0))), params)
  b, t = batch.tokens_BxT.shape
  reads = batch.tokens_BxT if batch.inputs_BxT is None else batch.inputs_BxT
  logits = np.asarray(model(jnp.asarray(reads), jnp.broadcast_to(jnp.arange(t), (b, t)),
                            jnp.asarray(batch.attn_mask_BxT))[0], np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
      -1, keepdims=True)
  nll, hits, count = 0.0, 0, 0
  for r in range(b):
    for pos in range(1, t):
      if batch.loss_mask_BxT[r, pos]:
        tok = batch.tokens_BxT[r, pos]
        nll -= logp[r, pos - 1, tok]
        hits += int(np.argmax(logits[r, pos - 1]) == tok)
        count += 1
  return nll / count, hits / count, count, logp


def test_masked_loss_equals_hand_computation():
  step = make_step()
  batch = two_examples()
  params = params_host()
  want_loss, want_acc, count, logp = hand_loss(params, batch)
  assert count == 11
  state = step.learner.state_from_params(jax.device_put(params, step.learner.param_shardings))
  _, m = jax.device_get(step.step(state, step.put_batch(batch)))
  assert float(m["loss"]) == pytest.approx(want_loss, rel=1e-5)
  assert float(m["token_acc"]) == pytest.approx(want_acc, abs=1e-7)
  assert float(m["tokens"]) == 11 and bool(m["applied"])
  # The prompt is really masked: the mean over every attended prediction differs from the response-only mean.
  all_pos = [-logp[r, p - 1, batch.tokens_BxT[r, p]] for r in range(2) for p in range(1, 12)
             if batch.attn_mask_BxT[r, p]]
  assert abs(np.mean(all_pos) - want_loss) > 1e-3
  ev = jax.device_get(step.evaluate(jax.device_put(params, step.learner.param_shardings), step.put_batch(batch)))
  assert float(ev["nll_sum"]) / float(ev["tokens"]) == pytest.approx(want_loss, rel=1e-5)


def test_noisy_inputs_are_read_and_targets_stay_true():
  """sft.input_noise: the model reads inputs_BxT, the loss scores the true tokens (by hand, as above)."""
  step = make_step()
  clean = two_examples()
  inputs = clean.tokens_BxT.copy()
  inputs[0, 5], inputs[1, 8] = inputs[0, 7], inputs[1, 10]  # Two response tokens read as others of the row.
  noisy = dataclasses.replace(clean, inputs_BxT=inputs)
  params = params_host()
  want_noisy, _, count, _ = hand_loss(params, noisy)
  want_clean = hand_loss(params, clean)[0]
  assert count == 11 and abs(want_noisy - want_clean) > 1e-4  # The corrupted reads change later predictions.
  for batch, want in ((noisy, want_noisy), (clean, want_clean)):
    state = step.learner.state_from_params(jax.device_put(params, step.learner.param_shardings))
    _, m = jax.device_get(step.step(state, step.put_batch(batch)))
    assert float(m["loss"]) == pytest.approx(want, rel=1e-5)


def test_chunked_nll_matches_learner_logps():
  model = nnx.merge(nnx.graphdef(Qwen2(TINY, rngs=nnx.Rngs(0))), params_host())
  batch = two_examples()
  toks, attn = jnp.asarray(batch.tokens_BxT), jnp.asarray(batch.attn_mask_BxT)
  want, _ = token_logps(model, toks, attn, chunk=4, temperature=1.0)
  for chunk, scan in ((1, False), (4, True), (64, False)):
    got, hits = S.token_nll_and_hits(model, toks, attn, chunk=chunk, scan_layers=scan)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"chunk {chunk}")
    assert set(np.unique(np.asarray(hits))) <= {0.0, 1.0} and float(hits[:, 0].sum()) == 0.0


def test_accumulation_and_sharding_give_the_same_update(cpu_devices8):
  del cpu_devices8
  rng = np.random.default_rng(3)
  b, t = 8, 16
  tokens = rng.integers(3, TINY.vocab_size, (b, t)).astype(np.int32)
  lengths, prompt = rng.integers(8, t + 1, b), rng.integers(2, 6, b)
  pos = np.arange(t)[None]
  batch = S.SFTBatch(tokens, (pos < lengths[:, None]).astype(np.int32),
                     ((pos >= prompt[:, None]) & (pos < lengths[:, None])).astype(np.float32))
  results = {}
  for mesh_shape, micro in (((1, 1), 8), ((1, 1), 2), ((4, 2), 1)):
    # eps = 1: Adam's first step is ~lr * g, so parameters inherit the gradients' accuracy (with eps = 1e-8
    # it is ~lr * g / |g| and float noise in near-zero gradients becomes visible; see tests/test_learner.py).
    step = make_step(mesh_shape, micro=micro, batch=b, eps=1.0)
    state = step.learner.state_from_params(jax.device_put(params_host(), step.learner.param_shardings))
    new, m = jax.device_get(step.step(state, step.put_batch(batch)))
    results[(mesh_shape, micro)] = (new.params, m)
  (p_ref, m_ref), *others = results.values()
  for p, m in others:
    assert float(m["loss"]) == pytest.approx(float(m_ref["loss"]), rel=1e-5)
    assert float(m["grad_norm"]) == pytest.approx(float(m_ref["grad_norm"]), rel=1e-4)
    for a, c in zip(jax.tree.leaves(p), jax.tree.leaves(p_ref)):
      np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6)


def test_schedule_warmup_cosine():
  cfg = S.SFTConfig(learning_rate=1.0, warmup_steps=2, total_steps=7, final_lr_ratio=0.1)
  lrs = [float(S.sft_schedule(cfg)(c)) for c in range(7)]
  # Warmup 1/2, 2/2; then cosine over updates 2..6 from 1.0 to 0.1.
  want = [0.5, 1.0] + [0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * k / 4)) for k in range(5)]
  np.testing.assert_allclose(lrs, want, rtol=1e-6)


def test_nonfinite_update_is_skipped_and_raises():
  step = make_step()
  state = step.learner.state_from_params(jax.device_put(params_host(), step.learner.param_shardings))
  bad = jax.tree.map(lambda p: p, jax.device_get(state.params))
  bad["embed"]["embedding"] = bad["embed"]["embedding"].replace(np.full_like(bad["embed"]["embedding"][...], np.nan))
  state = dataclasses.replace(state, params=jax.device_put(bad, step.learner.param_shardings))
  new, m = jax.device_get(step.step(state, step.put_batch(two_examples())))
  assert not bool(m["applied"]) and int(new.step) == 0
  with pytest.raises(S.NonFiniteError, match="SFT step 7: non-finite loss"):
    S.check_finite(m, 7)


def test_config_errors():
  with pytest.raises(ValueError, match="max_grad_norm must be > 0"):
    S.SFTConfig(max_grad_norm=0.0)
  with pytest.raises(ValueError, match="multiple of"):
    make_step(micro=2, batch=3)
