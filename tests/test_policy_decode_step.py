"""policy/decode/step.py: for each plan the sampler can choose on this backend (the kernels in interpret mode on
the CPU; real kernels on a GPU, marker gpu), one decode step equals the reference model's step within fp32
tolerance, and greedy decoding gives the reference model's tokens. The model is never changed by a step."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kevin_jax.policy import Qwen2, get_preset
from kevin_jax.policy.decode import plan as plan_lib
from kevin_jax.policy.decode import step as step_lib
from kevin_jax.policy.decode.attention import SlotRanges
from kevin_jax.policy.decode.plan import DecodeConfig
from kevin_jax.policy.model import KVCache
from kevin_jax.policy.sampler import Sampler, SamplerConfig

# head_dim 32: the q/k/v kernel's shape rule; batch 16: its smallest row block.
CFG = get_preset("tiny", param_dtype="float32", compute_dtype="float32", head_dim=32)
B, P, NEW = 16, 64, 10

# Each plan the sampler can choose, as DecodeConfig fields; K = the backend's kernel ('interpret' / 'pallas').
PLANS = {
    "reference": dict(),
    "attention": dict(attention="K"),
    "qkv": dict(qkv="K", attention="K", norm="xla"),
    "qkv_xla_attention": dict(qkv="K", norm="inside"),
    "mlp_down": dict(mlp="K", down="K", norm="xla"),
    "mlp_fold": dict(mlp="K", norm="fold"),
    "every_kernel_fold": dict(attention="K", qkv="K", out="K", mlp="K", down="K", norm="fold"),
    "every_kernel_inside": dict(attention="K", qkv="K", out="K", mlp="K", down="K", norm="inside"),  # the GPU's
    "every_kernel_one_split": dict(attention="K", qkv="K", out="K", mlp="K", down="K", norm="inside", sms=8),
}


def _decode_config(name, kernel):
  kw = {k: (kernel if v == "K" else v) for k, v in PLANS[name].items() if k != "sms"}
  return DecodeConfig(**{f: "xla" for f in ("attention", "qkv", "out", "mlp", "down", "norm", "stats")} | kw)


def _device(name, kernel):
  return plan_lib.DeviceInfo("gpu" if kernel == "pallas" else "cpu", PLANS[name].get("sms", 132))


@functools.lru_cache(maxsize=None)
def _model():
  model = Qwen2(CFG, rngs=nnx.Rngs(3))
  # Norm scales around 1 (the init is all ones, where a wrong fold would not show).
  for i, layer in enumerate(model.layers):
    for j, norm in enumerate((layer.input_norm, layer.post_attn_norm)):
      norm.scale[...] = 1 + 0.3 * jax.random.normal(jax.random.key(10 * i + j), norm.scale[...].shape)
  return model


def _prompts():
  rng = np.random.RandomState(0)
  return [rng.randint(0, CFG.vocab_size, n).tolist() for n in rng.randint(3, P, B)]


@functools.partial(jax.jit, static_argnames=("plan",))
def _one_step(state, tokens_BxP, lengths_B, plan):
  """Prefill, then one decode step by `plan`: (h_BxD, k cache, v cache, the model's state after the step)."""
  graphdef = nnx.graphdef(_model())
  model = nnx.merge(graphdef, state)
  positions = jnp.broadcast_to(jnp.arange(P), (B, P))
  cache = KVCache.zeros(CFG, B, P + 64, jnp.float32)
  h, cache = model.hidden(tokens_BxP, positions, positions < lengths_B[:, None], cache, 0)
  last = tokens_BxP[jnp.arange(B), lengths_B - 1][:, None] * 0 + 7
  visible = SlotRanges(prompt_len_B=lengths_B, gen_len=jnp.int32(1), gen_start=P)
  h, cache = step_lib.make_step(model, plan)(last, lengths_B[:, None], cache, P, visible)
  return h[:, 0], cache.k[-1], cache.v[-1], nnx.state(model, nnx.Param)


def _check(name, kernel):
  model = _model()
  prompts = _prompts()
  tokens = np.zeros((B, P), np.int32)
  lengths = np.asarray([len(p) for p in prompts], np.int32)
  for r, p in enumerate(prompts):
    tokens[r, :len(p)] = p
  state = nnx.state(model, nnx.Param)
  plan = plan_lib.resolve(_decode_config(name, kernel), CFG, B, P + 64, P, _device(name, kernel))
  ref_plan = plan_lib.resolve(_decode_config("reference", kernel), CFG, B, P + 64, P, _device("reference", kernel))
  assert plan.reference == (name == "reference")
  if name == "every_kernel_one_split":
    assert plan.attention_splits == 1  # the attention's padded output straight into the o projection kernel
  want = _one_step(state, tokens, lengths, ref_plan)
  got = _one_step(state, tokens, lengths, plan)
  for g, w in zip(got[:3], want[:3]):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=2e-5)
  for a, b in zip(jax.tree.leaves(got[3]), jax.tree.leaves(state)):  # the weights were folded into a copy
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  outs = {}
  for label, decode in (("ref", _decode_config("reference", kernel)), ("plan", _decode_config(name, kernel))):
    sampler = Sampler(CFG, None, SamplerConfig(batch_size=B, prompt_buckets=(P,), kv_cache_dtype="float32",
                                               decode=decode))
    outs[label] = sampler.generate(model, prompts, seed=0, max_new_tokens=NEW, temperature=0.0, eos_ids=[])
    assert sampler.last_stats["decode_plan"] == (plan if label == "plan" else ref_plan)  # the plan it ran
  assert outs["plan"].tokens == outs["ref"].tokens
  for a, b in zip(outs["plan"].logprobs, outs["ref"].logprobs):
    np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_plan_step_equals_reference_interpret(name, monkeypatch):
  monkeypatch.setattr(plan_lib.DeviceInfo, "current", classmethod(lambda cls: _device(name, "interpret")))
  _check(name, "interpret")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(PLANS))
def test_plan_step_equals_reference_on_gpu(name, monkeypatch):
  monkeypatch.setattr(plan_lib.DeviceInfo, "current", classmethod(lambda cls: _device(name, "pallas")))
  with jax.default_matmul_precision("highest"):  # XLA's fp32 matmuls in IEEE fp32, as the kernels' (not TF32)
    _check(name, "pallas")
