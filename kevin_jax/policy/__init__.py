"""The Flax NNX Qwen2 policy: the reference model, HF weight loading/export, tokenizer and the KV-cache sampler
(whose decode fast path is policy/decode/).

Light imports: only the config is imported eagerly; the model, weights, sampler and tokenizer modules load on
first use.
"""

from kevin_jax.policy.config import ModelConfig, get_preset

__all__ = ["ModelConfig", "Qwen2", "Sampler", "SamplerConfig", "SamplerOutput", "get_preset", "load_pretrained",
           "load_tokenizer", "save_pretrained"]


def __getattr__(name):
  if name == "Qwen2":
    from kevin_jax.policy.model import Qwen2  # pylint: disable=g-import-not-at-top
    return Qwen2
  if name in ("load_pretrained", "save_pretrained"):
    from kevin_jax.policy import weights  # pylint: disable=g-import-not-at-top
    return getattr(weights, name)
  if name in ("Sampler", "SamplerConfig", "SamplerOutput"):
    from kevin_jax.policy import sampler  # pylint: disable=g-import-not-at-top
    return getattr(sampler, name)
  if name == "load_tokenizer":
    from kevin_jax.policy.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
    return load_tokenizer
  raise AttributeError(f"module 'kevin_jax.policy' has no attribute {name!r}")
