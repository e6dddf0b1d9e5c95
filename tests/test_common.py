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