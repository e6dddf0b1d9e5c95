"""The Flax NNX Qwen2 policy: model, HF weight loading/export, tokenizer and the KV-cache sampler.

Light imports: only the config is imported eagerly; the model (JAX/Flax) and weights modules load on first use.
"""

from kevin_jax.policy.config import ModelConfig, get_preset

__all__ = ["ModelConfig", "Qwen2", "get_preset", "load_pretrained", "save_pretrained"]


def __getattr__(name):
  if name == "Qwen2":
    from kevin_jax.policy.model import Qwen2  # pylint: disable=g-import-not-at-top
    return Qwen2
  if name in ("load_pretrained", "save_pretrained"):
    from kevin_jax.policy import weights  # pylint: disable=g-import-not-at-top
    return getattr(weights, name)
  raise AttributeError(f"module 'kevin_jax.policy' has no attribute {name!r}")
