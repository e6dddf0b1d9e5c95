"""Shared test helpers: tiny random Hugging Face Qwen2 checkpoints built with CPU torch, the environment of
GPU subprocesses, and a decode kernel's greedy sampler run against the XLA path.

Only tests import torch; library code in kevin_jax/policy never does.
"""

from __future__ import annotations

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gpu_subprocess_env() -> dict[str, str]:
  """This environment minus tests/conftest.py's CPU pinning (JAX_PLATFORMS, fake-device XLA_FLAGS), with the
  repository first on PYTHONPATH (entries already there, e.g. a --target site of carried wheels, are kept)."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)
  return env


def make_hf_qwen2(path: str | os.PathLike, *, vocab_size: int = 256, hidden_size: int = 64, num_layers: int = 2,
                  num_heads: int = 4, num_kv_heads: int = 2, head_dim: int | None = None,
                  intermediate_size: int = 96, tie: bool = False, rope_theta: float = 10000.0, seed: int = 0,
                  dtype: str = "float32"):
  """Builds a random transformers Qwen2ForCausalLM, saves it to `path` (safetensors) and returns it (eval mode).

  Biases and norm scales are re-drawn away from their zero/one init so that a wrong mapping of them shows.
  """
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import Qwen2Config, Qwen2ForCausalLM  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  kwargs = dict(head_dim=head_dim) if head_dim else {}
  cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                    num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                    tie_word_embeddings=tie, rope_theta=rope_theta, max_position_embeddings=4096, **kwargs)
  model = Qwen2ForCausalLM(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias"):
        p.normal_(0.0, 0.5)
      elif "norm" in name:
        p.normal_(1.0, 0.2)
  model = model.to(getattr(torch, dtype))
  model.save_pretrained(os.fspath(path))
  return model


def assert_sampler_same_with_kernel(fields: str | tuple[str, ...], max_new_tokens: int = 70, batch_size: int = 2,
                                    **preset_kw) -> None:
  """Greedy decoding of a random tiny fp32 model with ModelConfig.<field> = 'xla' and = 'interpret' (a Pallas
  decode kernel in interpret mode) for each of `fields`: the same tokens, and log-probs within 1e-4.
  `batch_size` prompts of different lengths decode together."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy import Qwen2, get_preset  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.sampler import Sampler, SamplerConfig  # pylint: disable=g-import-not-at-top
  fields = (fields,) if isinstance(fields, str) else fields
  outs = {}
  for impl in ("xla", "interpret"):
    cfg = get_preset("tiny", param_dtype="float32", compute_dtype="float32", **preset_kw,
                     **{field: impl for field in fields})
    model = Qwen2(cfg, rngs=nnx.Rngs(3))
    sampler = Sampler(cfg, None, SamplerConfig(batch_size=batch_size, prompt_buckets=(64,),
                                               kv_cache_dtype="float32"))
    prompts = [[5, 9, 11], list(range(20, 60))] + [list(range(7 + i, 7 + 3 * i)) for i in range(1, batch_size - 1)]
    outs[impl] = sampler.generate(model, prompts, seed=0, max_new_tokens=max_new_tokens, temperature=0.0,
                                  eos_ids=[])
  assert outs["xla"].tokens == outs["interpret"].tokens
  for a, b in zip(outs["xla"].logprobs, outs["interpret"].logprobs):
    np.testing.assert_allclose(a, b, atol=1e-4)
