"""Qwen2 model: logit parity with transformers (fp32), masks, cache, remat, config conversion, sharding names."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from kevin_jax.policy import ModelConfig, Qwen2, get_preset, load_pretrained
from kevin_jax.policy.model import KVCache
from tests.test_common import make_hf_qwen2


def _rel_err(ours, ref):
  return float(np.max(np.abs(np.asarray(ours) - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize("tie,heads,kv_heads", [(True, 4, 4), (False, 4, 2), (True, 6, 1), (False, 8, 2)])
def test_logits_match_transformers_fp32(tmp_path, tie, heads, kv_heads):
  hf = make_hf_qwen2(tmp_path, tie=tie, num_heads=heads, num_kv_heads=kv_heads, hidden_size=16 * heads,
                     rope_theta=1e6 if tie else 1e4)
  model = load_pretrained(tmp_path, dtype="float32", compute_dtype="float32")
  assert model.cfg.tie_word_embeddings == tie and hasattr(model, "lm_head") == (not tie)
  rng = np.random.RandomState(1)
  b, t = 3, 10
  tokens = rng.randint(0, 256, (b, t))
  # Row 2 starts past position 1,000 (rotary phases there must still match).
  positions = np.arange(t)[None].repeat(b, 0) + np.array([[0], [7], [1500]])
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(tokens), position_ids=torch.tensor(positions)).logits.numpy()
  ours, cache = model(jnp.asarray(tokens), jnp.asarray(positions))
  assert cache is None and ours.dtype == jnp.float32 and ours.shape == (b, t, 256)
  assert _rel_err(ours, ref) <= 1e-4


def test_right_padding_and_hidden_logits_split(tmp_path):
  hf = make_hf_qwen2(tmp_path, tie=False, num_heads=4, num_kv_heads=2)
  model = load_pretrained(tmp_path, dtype="float32", compute_dtype="float32")
  lengths = [9, 4, 6]
  t = max(lengths)
  rng = np.random.RandomState(2)
  tokens = rng.randint(0, 256, (3, t))
  mask = (np.arange(t)[None] < np.array(lengths)[:, None]).astype(np.int32)
  positions = np.broadcast_to(np.arange(t), (3, t))
  h = model.hidden(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))[0]
  logits = model.logits(h)
  full, _ = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(full))
  assert h.shape == (3, t, 64) and np.all(np.isfinite(np.asarray(logits)))
  for i, n in enumerate(lengths):  # each row alone, unpadded, through transformers
    with torch.no_grad():
      ref = hf(input_ids=torch.tensor(tokens[i:i + 1, :n])).logits.numpy()[0]
    assert _rel_err(logits[i, :n], ref) <= 1e-4


def test_prefill_then_decode_equals_full_forward():
  cfg = get_preset("tiny", param_dtype="float32", compute_dtype="float32", vocab_size=128)
  model = Qwen2(cfg, rngs=nnx.Rngs(3))
  rng = np.random.RandomState(3)
  b, t, extra = 2, 7, 4
  tokens = rng.randint(0, 128, (b, t + extra))
  positions = np.broadcast_to(np.arange(t + extra), (b, t + extra))
  # Jitted as the sampler runs it (the slot a traced int): one program per call shape, not one per op.
  call = nnx.jit(lambda m, tok, pos, cache, slot, visible: m(tok, pos, None, cache, slot, visible))
  full, _ = call(model, jnp.asarray(tokens), jnp.asarray(positions), None, 0, None)
  # Slots are storage: prefill into slots [3, 3 + t), leave a gap, decode into the last slots.
  length = t + extra + 6
  cache = KVCache.zeros(cfg, b, length, jnp.float32)
  pre, cache = call(model, jnp.asarray(tokens[:, :t]), jnp.asarray(positions[:, :t]), cache, 3, None)
  np.testing.assert_allclose(np.asarray(pre), np.asarray(full[:, :t]), rtol=1e-5, atol=1e-5)
  visible = np.zeros((b, length), bool)
  visible[:, 3:3 + t] = True
  for j, s in enumerate(range(t, t + extra)):
    slot = length - extra + j
    visible[:, slot] = True
    step, cache = call(model, jnp.asarray(tokens[:, s:s + 1]), jnp.asarray(positions[:, s:s + 1]), cache,
                       jnp.asarray(slot, jnp.int32), jnp.asarray(visible))
    np.testing.assert_allclose(np.asarray(step[:, 0]), np.asarray(full[:, s]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_same_values_and_grads(remat):
  base = get_preset("tiny", param_dtype="float32", compute_dtype="float32", vocab_size=128)
  tokens = jnp.asarray(np.random.RandomState(4).randint(0, 128, (2, 6)))
  positions = jnp.broadcast_to(jnp.arange(6), (2, 6))

  def loss(model):
    return jnp.mean(jax.nn.log_softmax(model(tokens, positions)[0])[..., 0])

  grads = []
  for cfg in (base, base.replace(remat=remat)):
    model = Qwen2(cfg, rngs=nnx.Rngs(5))
    grads.append(nnx.jit(nnx.grad(loss))(model))  # One compiled program per config, as training runs it.
  for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_causality_via_gradients():
  cfg = get_preset("tiny", param_dtype="float32", compute_dtype="float32", vocab_size=128)
  model = Qwen2(cfg, rngs=nnx.Rngs(6))
  positions = jnp.broadcast_to(jnp.arange(6), (1, 6))
  emb = model.embed.embedding[...][jnp.asarray([[1, 2, 3, 4, 5, 6]])]

  def out_at(e, i):  # run the layers on the embeddings directly, to differentiate w.r.t. each input slot
    h = e
    for layer in model.layers:
      h = layer(h, positions, None, None)[0]
    return jnp.sum(model.final_norm(h)[0, i])

  g = jax.jit(jax.grad(out_at), static_argnums=1)(emb, 3)
  assert np.all(np.asarray(g[0, 4:]) == 0) and np.all(np.abs(np.asarray(g[0, :4])).sum(-1) > 0)


def test_sharding_names():
  model = nnx.eval_shape(lambda: Qwen2(get_preset("tiny", tie_word_embeddings=False), rngs=nnx.Rngs(0)))
  specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
  names = {tuple(str(k) for k in p): tuple(v.get_value()) for p, v in nnx.to_flat_state(specs)}
  assert names[("embed", "embedding")] == ("vocab", "embed")
  assert names[("lm_head", "kernel")] == ("embed", "vocab")
  assert names[("layers", "0", "attn", "q_kernel")] == ("embed", "q_heads", "head_dim")
  assert names[("layers", "1", "attn", "k_kernel")] == ("embed", "kv_heads", "head_dim")
  assert names[("layers", "0", "attn", "o_kernel")] == ("q_heads", "head_dim", "embed")
  assert names[("layers", "0", "attn", "q_bias")] == ("q_heads", "head_dim")
  assert names[("layers", "0", "mlp", "gate_kernel")] == ("embed", "mlp")
  assert names[("layers", "0", "mlp", "down_kernel")] == ("mlp", "embed")
  assert names[("final_norm", "scale")] == ("embed",)
  used = {n for v in names.values() for n in v}
  assert used == {"vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp"}


def test_config_hf_round_trip_and_rejections(tmp_path):
  for name in ("tiny", "small", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwq-32b"):
    cfg = get_preset(name)
    assert ModelConfig.from_hf_config(cfg.to_hf_config()) == cfg
  assert get_preset("qwen2.5-0.5b").num_params() == 494_032_768  # Qwen2.5-0.5B's published count
  assert 20e6 < get_preset("small").num_params() < 40e6
  qwq = get_preset("qwq-32b")
  assert (qwq.hidden_size, qwq.num_layers, qwq.num_heads, qwq.num_kv_heads, qwq.vocab_size) == (
      5120, 64, 40, 8, 152064)
  with pytest.raises(ValueError, match="model_type"):
    ModelConfig.from_hf_config({**get_preset("tiny").to_hf_config(), "model_type": "llama"})
  with pytest.raises(ValueError, match="architectures"):
    ModelConfig.from_hf_config({**get_preset("tiny").to_hf_config(), "architectures": ["LlamaForCausalLM"]})
  with pytest.raises(ValueError, match="sliding"):
    ModelConfig.from_hf_config({**get_preset("tiny").to_hf_config(), "use_sliding_window": True})
  with pytest.raises(FileNotFoundError):
    ModelConfig.from_hf_config(tmp_path)
  with pytest.raises(ValueError, match="num_heads"):
    get_preset("tiny", num_kv_heads=3)
  with pytest.raises(ValueError, match="unknown model preset"):
    get_preset("gpt2")
  (tmp_path / "config.json").write_text(json.dumps(get_preset("tiny").to_hf_config()))
  assert ModelConfig.from_hf_config(tmp_path).hidden_size == 64
