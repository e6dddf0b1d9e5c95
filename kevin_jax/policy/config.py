"""Model configuration of the Qwen2 policy: a frozen dataclass, HF config.json conversion and named presets.

`ModelConfig` holds the architecture (what a Hugging Face `config.json` describes) plus how we run it
(`param_dtype`, `compute_dtype`, `fp32_upcast`, `remat`, the training `attention_impl`); how the sampler decodes
is its own DecodeConfig (policy/decode/plan.py). Only the architecture fields travel
to and from `config.json`; the runtime fields are ours.

  cfg = ModelConfig.from_hf_config("/ckpts/QwQ-32B")          # a directory, a config.json path or a dict
  cfg = get_preset("qwen2.5-0.5b", param_dtype="float32")    # presets take field overrides
  hf_dict = cfg.to_hf_config()                                # what save_pretrained writes as config.json
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Mapping

_REMAT = ("none", "full", "dots")
_ATTENTION_IMPLS = ("xla", "cudnn")
_DTYPES = ("float32", "bfloat16", "float16")
_HF_ARCHITECTURE = "Qwen2ForCausalLM"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A Qwen2-architecture decoder (Qwen2, Qwen2.5, QwQ).

  Attributes:
    vocab_size: V, rows of the embedding table (may exceed the tokenizer's vocabulary, as in Qwen).
    hidden_size: D, the residual width.
    intermediate_size: F, the SwiGLU MLP width.
    num_layers: L, decoder layers.
    num_heads: N, query heads.
    num_kv_heads: K, key/value heads (grouped-query attention; N % K == 0).
    head_dim: H, width of one head (hidden_size // num_heads for every released Qwen2).
    rope_theta: rotary base frequency (1e6 for Qwen2.5 and QwQ).
    rms_norm_eps: RMSNorm epsilon.
    tie_word_embeddings: True: logits = h @ embedding^T (no separate lm_head).
    max_position_embeddings: longest context the checkpoint was trained for (informational; not enforced).
    param_dtype: storage dtype of parameters: 'float32' | 'bfloat16'.
    compute_dtype: dtype of matmuls and activations: 'float32' | 'bfloat16'.
    fp32_upcast: compute RMSNorm, the attention softmax, rotary embeddings and the logits in fp32.
    remat: per-decoder-layer rematerialisation in the backward pass: 'none' | 'full' (save only layer inputs) |
      'dots' (save the outputs of matmuls without batch dims: projections, not attention scores).
    attention_impl: multi-token (prefill / training) attention: 'xla' (einsum; any backend, exact fp32) |
      'cudnn' (jax.nn.dot_product_attention flash kernel; GPU, bf16/fp16 only).
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 1e6
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  max_position_embeddings: int = 32768
  param_dtype: str = "bfloat16"
  compute_dtype: str = "bfloat16"
  fp32_upcast: bool = True
  remat: str = "none"
  attention_impl: str = "xla"

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "max_position_embeddings"):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
    for name in ("param_dtype", "compute_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"ModelConfig.{name} must be one of {_DTYPES}, got {getattr(self, name)!r}")
    if self.remat not in _REMAT:
      raise ValueError(f"ModelConfig.remat must be one of {_REMAT}, got {self.remat!r}")
    if self.attention_impl not in _ATTENTION_IMPLS:
      raise ValueError(f"ModelConfig.attention_impl must be one of {_ATTENTION_IMPLS}, got {self.attention_impl!r}")
    if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
      raise ValueError("rope_theta and rms_norm_eps must be positive")

  @property
  def param_jnp_dtype(self) -> Any:
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top  (keeps `import kevin_jax.policy` light)
    return jnp.dtype(self.param_dtype)

  @property
  def compute_jnp_dtype(self) -> Any:
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    return jnp.dtype(self.compute_dtype)

  @property
  def num_groups(self) -> int:
    """G = N // K, query heads per key/value head."""
    return self.num_heads // self.num_kv_heads

  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    d, f, n, k, h = self.hidden_size, self.intermediate_size, self.num_heads, self.num_kv_heads, self.head_dim
    attn = d * n * h + 2 * d * k * h + n * h * d + (n + 2 * k) * h
    layer = attn + 3 * d * f + 2 * d
    head = 0 if self.tie_word_embeddings else d * self.vocab_size
    return self.vocab_size * d + self.num_layers * layer + d + head

  def replace(self, **changes: Any) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
    """From a saved dict of its fields (dataclasses.asdict). The decode_* fields that older configs held (the decode
    fast path's switches, now the sampler's DecodeConfig) are dropped with a warning; other unknown keys raise."""
    fields = {f.name for f in dataclasses.fields(cls)}
    stale = sorted(k for k in d if k not in fields and k.startswith("decode_"))
    if stale:
      logging.warning("ModelConfig: ignoring %s (decode settings are the sampler's DecodeConfig now)", stale)
    return cls(**{k: v for k, v in d.items() if k not in stale})

  @classmethod
  def from_hf_config(cls, config: Mapping[str, Any] | str | os.PathLike, **overrides: Any) -> "ModelConfig":
    """Builds a config from a Hugging Face Qwen2 `config.json`.

    Args:
      config: the parsed dict, a path to config.json, or a checkpoint directory containing it.
      **overrides: runtime fields (param_dtype, compute_dtype, remat, ...) or architecture overrides.

    Returns:
      The ModelConfig.

    Raises:
      FileNotFoundError: no config.json at the given path.
      ValueError: not a Qwen2-architecture model, or a feature we do not implement (sliding window, rope scaling).
    """
    if not isinstance(config, Mapping):
      path = os.fspath(config)
      if os.path.isdir(path):
        path = os.path.join(path, "config.json")
      if not os.path.isfile(path):
        raise FileNotFoundError(f"no HF config.json at {path}")
      with open(path) as f:
        config = json.load(f)
    c = dict(config)
    model_type = c.get("model_type")
    archs = c.get("architectures") or []
    if model_type != "qwen2":
      raise ValueError(f"unsupported model_type {model_type!r}: only Qwen2-architecture checkpoints "
                       "(Qwen2, Qwen2.5, QwQ; model_type 'qwen2') are supported")
    if archs and any(a != _HF_ARCHITECTURE for a in archs):
      raise ValueError(f"unsupported architectures {archs}: only {_HF_ARCHITECTURE} is supported")
    if c.get("use_sliding_window"):
      raise ValueError("use_sliding_window=true is not supported (no released Qwen2.5/QwQ model enables it)")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
      raise ValueError(f"rope scaling {rope_type!r} is not supported (only plain RoPE)")
    rope_theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    if c.get("hidden_act", "silu") != "silu":
      raise ValueError(f"hidden_act {c.get('hidden_act')!r} is not supported (Qwen2 uses silu)")
    hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    fields = dict(
        vocab_size=int(c["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(c["intermediate_size"]),
        num_layers=int(c["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or hidden // heads),
        rope_theta=float(rope_theta),
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_position_embeddings=int(c.get("max_position_embeddings", 32768)),
    )
    fields.update(overrides)
    return cls(**fields)

  def to_hf_config(self, **extra: Any) -> dict[str, Any]:
    """The Hugging Face `config.json` dict of this architecture (loads as transformers' Qwen2ForCausalLM).

    Both the transformers-5 `rope_parameters` and the older top-level `rope_theta` are written so any
    transformers version reads the same base frequency. `extra` entries (e.g. eos_token_id) are merged in.
    """
    d = {
        "architectures": [_HF_ARCHITECTURE],
        "model_type": "qwen2",
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": self.max_position_embeddings,
        "rms_norm_eps": self.rms_norm_eps,
        "rope_theta": self.rope_theta,
        "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
        "tie_word_embeddings": self.tie_word_embeddings,
        "use_sliding_window": False,
        "sliding_window": None,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": self.param_dtype,
    }
    if self.head_dim != self.hidden_size // self.num_heads:
      d["head_dim"] = self.head_dim
    d.update(extra)
    return d


# Public Qwen2.5 configs; QwQ-32B from rl-anchors.md §7.2. 'tiny'/'small' use the bundled 8,192-token tokenizer.
_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=8192, hidden_size=64, intermediate_size=192, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=16, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # ~28M parameters: 8 layers, GQA 8:2 with 64-wide heads, tied 8k embedding.
    "small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
                  num_kv_heads=2, head_dim=64, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                         num_kv_heads=2, head_dim=64, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                         num_kv_heads=2, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
                       num_kv_heads=4, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "qwq-32b": dict(vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_layers=64, num_heads=40,
                    num_kv_heads=8, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    max_position_embeddings=40960),
}
PRESETS = tuple(_PRESETS)


def resolve_attention_impl(impl: str, compute_dtype: str) -> str:
  """'auto' -> 'cudnn' (flash attention) when JAX runs on a GPU in bf16/fp16, else 'xla'; other values pass.

  XLA's attention materialises [B, N, T, T] fp32 scores: at RL/SFT lengths (4-6k tokens) that is tens of GiB
  per micro-batch, more than one GPU holds beside the learner's state.
  """
  if impl != "auto":
    return impl
  import jax  # pylint: disable=g-import-not-at-top
  return "cudnn" if jax.default_backend() == "gpu" and compute_dtype in ("bfloat16", "float16") else "xla"


def get_preset(name: str, **overrides: Any) -> ModelConfig:
  """A named shape preset: tiny | small | qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-7b | qwq-32b.

  `overrides` replace fields (e.g. param_dtype='float32', remat='full').
  """
  if name not in _PRESETS:
    raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
  return ModelConfig(**{**_PRESETS[name], **overrides})
