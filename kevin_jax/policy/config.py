"""Model configuration of the Qwen2 policy: a frozen dataclass, HF config.json conversion and named presets.

`ModelConfig` holds the architecture (what a Hugging Face `config.json` describes) plus how we run it
(`param_dtype`, `compute_dtype`, `fp32_upcast`, `remat`, `attention_impl`). Only the architecture fields travel
to and from `config.json`; the runtime fields are ours.

  cfg = ModelConfig.from_hf_config("/ckpts/QwQ-32B")          # a directory, a config.json path or a dict
  cfg = get_preset("qwen2.5-0.5b", param_dtype="float32")    # presets take field overrides
  hf_dict = cfg.to_hf_config()                                # what save_pretrained writes as config.json
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

_REMAT = ("none", "full", "dots")
_ATTENTION_IMPLS = ("xla", "cudnn")
_DECODE_ATTENTION = ("auto", "xla", "pallas", "interpret")
_DECODE_MLP = ("auto", "xla", "pallas", "interpret")
_DECODE_DOWN = ("auto", "xla", "pallas", "interpret")
_DECODE_QKV = ("auto", "xla", "pallas", "interpret")
_DECODE_OUT = ("auto", "xla", "pallas", "interpret")
_DECODE_ADD_NORM = ("auto", "xla", "pallas", "interpret")
_DECODE_NORM = ("auto", "xla", "fold", "inside")
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
    decode_attention: one-token decode attention over the KV cache: 'auto' (the Pallas kernel of
      policy/decode_attention.py on a GPU when its shape rules hold, else 'xla') | 'xla' (masked einsum over
      every cache slot) | 'pallas' | 'interpret' (the Pallas kernel in interpret mode: CPU tests).
    decode_mlp: the MLP's silu(x W_gate) * (x W_up) in a one-token decode step: 'auto' (the fused Pallas kernel
      of policy/decode_mlp.py on a GPU when its shape rules hold and the batch is at most
      decode_mlp.AUTO_MAX_ROWS, else 'xla') | 'xla' (two einsums and an elementwise kernel) | 'pallas' |
      'interpret' (CPU tests). Multi-token calls (prefill, training) always use 'xla'.
    decode_down: the MLP's down projection in a one-token decode step: 'auto' (decode_mlp.down_proj, split along
      the intermediate size, on a GPU when the batch is at most decode_mlp.AUTO_MAX_ROWS and the hidden size at
      most decode_mlp.AUTO_DOWN_MAX_D, else 'xla': +5.1 % decode tokens/s at the 0.5B shape, batch 64,
      experiments/sampler_kernels) | 'xla' (one einsum) | 'pallas' | 'interpret' (CPU tests).
    decode_qkv: the front of attention in a one-token decode step (q/k/v projection, biases, RoPE, the k/v cache
      write; the input RMSNorm as decode_norm says): 'auto' (the default: the one Pallas kernel of
      policy/decode_qkv.py on a GPU when its shape rules hold and the batch is at most decode_qkv.MAX_ROWS, else
      'xla'; +3.6 % decode tokens/s at the 0.5B shape, batch 64, experiments/sampler_kernels) | 'xla' (einsums,
      XLA's fusions and dynamic_update_slice) | 'pallas' | 'interpret' (CPU tests).
    decode_out: the attention's output projection with the residual add in a one-token decode step: 'auto' (the
      default: the Pallas kernel of policy/decode_oproj.py on a GPU where its shape rules hold, the batch is at
      most decode_oproj.MAX_ROWS, the q/k/v kernel runs and decode_norm resolves to 'fold' or 'inside'; else
      'xla') | 'xla' (einsum and XLA's fusions) | 'pallas' | 'interpret' (CPU tests). The 'auto' rule: with XLA's
      norms the kernel made the decode step slower (BENCHMARKS.md Sampler), with the norms inside it pays.
    decode_add_norm: the residual add after the MLP and the next RMSNorm (the next layer's input norm, or the final
      norm) in a one-token decode step: 'xla' (the default: XLA's fusions) | 'auto' (the one Pallas kernel of
      policy/decode_add_norm.py, which also sums decode_down's partials, on a GPU when fp32_upcast is on and its
      shape rule holds, else 'xla') | 'pallas' | 'interpret' (CPU tests). Opt-in: -4.4 % decode tokens/s at the
      0.5B shape, batch 64 (BENCHMARKS.md Sampler).
    decode_norm: how a one-token decode step applies the RMSNorms before the q/k/v kernel (decode_qkv) and the
      SwiGLU kernel (decode_mlp), where those run as Pallas kernels: 'auto' (the default: 'inside' on a GPU where
      the hidden size is at most model.AUTO_NORM_MAX_D; else 'xla') |
      'xla' (XLA's norm fusion writes the normed rows, which the kernel reads) | 'fold' (the norm's scale folded
      into the kernel's weights, rounded once to the compute dtype; XLA computes only each row's fp32 1/rms, which
      the kernel multiplies its products by, and the kernel reads the raw residual) | 'inside' (as 'fold', but each
      kernel computes the rows' 1/rms itself, from the Gram matrix of the x slices it loads: no XLA op is left for
      the norm). Elsewhere (XLA paths, prefill, training) the norm is always XLA's. 'fold' and 'inside' keep a
      folded copy of the weights of the kernels that run at the decode batch (for the 0.5B shape 0.47 GB in bf16)
      while the decode loop runs (Qwen2.fold_decode_norms, once before it). With decode_out's kernel both norm
      fusions of a layer go: +1.9 % decode tokens/s at the 0.5B shape, batch 64 (experiments/sampler_kernels).
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
  decode_attention: str = "auto"
  decode_mlp: str = "auto"
  decode_down: str = "auto"
  decode_qkv: str = "auto"
  decode_out: str = "auto"
  decode_add_norm: str = "xla"
  decode_norm: str = "auto"

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
    if self.decode_attention not in _DECODE_ATTENTION:
      raise ValueError(f"ModelConfig.decode_attention must be one of {_DECODE_ATTENTION}, "
                       f"got {self.decode_attention!r}")
    if self.decode_mlp not in _DECODE_MLP:
      raise ValueError(f"ModelConfig.decode_mlp must be one of {_DECODE_MLP}, got {self.decode_mlp!r}")
    if self.decode_down not in _DECODE_DOWN:
      raise ValueError(f"ModelConfig.decode_down must be one of {_DECODE_DOWN}, got {self.decode_down!r}")
    if self.decode_qkv not in _DECODE_QKV:
      raise ValueError(f"ModelConfig.decode_qkv must be one of {_DECODE_QKV}, got {self.decode_qkv!r}")
    if self.decode_out not in _DECODE_OUT:
      raise ValueError(f"ModelConfig.decode_out must be one of {_DECODE_OUT}, got {self.decode_out!r}")
    if self.decode_add_norm not in _DECODE_ADD_NORM:
      raise ValueError(f"ModelConfig.decode_add_norm must be one of {_DECODE_ADD_NORM}, "
                       f"got {self.decode_add_norm!r}")
    if self.decode_norm not in _DECODE_NORM:
      raise ValueError(f"ModelConfig.decode_norm must be one of {_DECODE_NORM}, got {self.decode_norm!r}")
    if self.decode_add_norm in ("pallas", "interpret") and not self.fp32_upcast:
      raise ValueError(f"ModelConfig.decode_add_norm={self.decode_add_norm!r} computes the norm in fp32: it needs "
                       "fp32_upcast=True")
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
