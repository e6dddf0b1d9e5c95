"""What the decode fast path runs: the sampler's `DecodeConfig` (every choice 'auto' by default) and `resolve`,
which turns it into a frozen `DecodePlan` once per (model shape, batch, cache layout, backend, device) and logs it.

  plan = resolve(DecodeConfig(), model_cfg, batch=64, num_slots=2048, gen_start=1024)   # DeviceInfo.current()
  plan = resolve(DecodeConfig(), model_cfg, 64, 2048, 1024, DeviceInfo("gpu", sm_count=132))  # injected (tests)

The 'auto' rules (each kernel entered as a default on what it gained end to end; BENCHMARKS.md Sampler and
experiments/sampler_kernels hold the figures):
- attention: the Pallas kernel on a GPU where the cache layout fits it (attention.supported); its splits per row
  and KV head from the device's SM count (attention.default_splits).
- qkv: the fused q/k/v + RoPE + cache-write kernel on a GPU up to qkv.MAX_ROWS rows where its shape rule holds;
  with the attention kernel it also prefetches qkv.PREFETCH_BLOCKS of the attention's cache blocks into L2.
- mlp: the SwiGLU front kernel on a GPU up to mlp.AUTO_MAX_ROWS rows where its shape rule holds; down: the split
  down projection where the front's rule holds and D <= mlp.AUTO_DOWN_MAX_D.
- norm: 'inside' (the q/k/v and SwiGLU kernels apply their RMSNorm as 1/rms on their products, the scale folded
  into a copy of their weights) on a GPU up to AUTO_NORM_MAX_D, else 'xla' (XLA's norm fusion first).
- out: the o projection + residual kernel on a GPU up to oproj.MAX_ROWS rows, only where the q/k/v kernel runs
  with the norm inside (with XLA's norms it made the step slower).
- stats: the one-pass chunk statistics kernel of the draw on a GPU (sample_logits uses it for temperature
  sampling without top-k / top-p only).
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax

from kevin_jax.policy.config import ModelConfig
from kevin_jax.policy.decode import attention
from kevin_jax.policy.decode import mlp
from kevin_jax.policy.decode import oproj
from kevin_jax.policy.decode import qkv
from kevin_jax.policy.decode import tiles

IMPLS = ("auto", "xla", "pallas", "interpret")  # 'interpret': the Pallas kernel in interpret mode (CPU tests)
NORMS = ("auto", "xla", "fold", "inside")
AUTO_NORM_MAX_D = 1024  # norm='auto' is 'inside' up to this hidden size: it pays at D = 896 (0.5B), not at 1,536.


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """The sampler's decode choices (configs/multiturn.py `config.sampler.decode_*`).

  Attributes:
    attention: one-token attention over the visible cache slots: 'auto' | 'xla' (masked einsum over every slot) |
      'pallas' (attention.py) | 'interpret'.
    qkv: the input norm's q/k/v projection, biases, RoPE and cache write: 'auto' | 'xla' | 'pallas' (qkv.py) |
      'interpret'.
    out: the o projection with the residual add: 'auto' | 'xla' | 'pallas' (oproj.py) | 'interpret'.
    mlp: the SwiGLU front silu(x W_gate) * (x W_up): 'auto' | 'xla' | 'pallas' (mlp.swiglu_front) | 'interpret'.
    down: the down projection: 'auto' | 'xla' | 'pallas' (mlp.down_proj, split along F) | 'interpret'.
    norm: where the q/k/v and SwiGLU kernels (when they run) get their RMSNorm: 'auto' | 'xla' (XLA's norm
      fusion writes the normed rows) | 'fold' (the scale folded into a copy of the kernel's weights, XLA computes
      each row's 1/rms) | 'inside' (as 'fold', the kernel computes 1/rms itself).
    stats: the draw's chunk maxima and sums of exp: 'auto' | 'xla' | 'pallas' (sample_stats.py) | 'interpret'.
  """
  attention: str = "auto"
  qkv: str = "auto"
  out: str = "auto"
  mlp: str = "auto"
  down: str = "auto"
  norm: str = "auto"
  stats: str = "auto"

  def __post_init__(self):
    for f in dataclasses.fields(self):
      allowed = NORMS if f.name == "norm" else IMPLS
      if getattr(self, f.name) not in allowed:
        raise ValueError(f"DecodeConfig.{f.name} must be one of {allowed}, got {getattr(self, f.name)!r}")

  @classmethod
  def from_config(cls, c) -> "DecodeConfig":
    """From the `config.sampler` section's decode_* fields."""
    return cls(**{f.name: getattr(c, "decode_" + f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
  """The properties of the device that the plan depends on (read from it: `current`)."""
  backend: str  # jax.default_backend(): 'gpu' | 'cpu' | ...
  sm_count: int  # streaming multiprocessors (tiles.NOMINAL_SM_COUNT where the device reports none)
  kind: str = ""  # the device's name, for the log

  @classmethod
  def current(cls) -> "DeviceInfo":
    device = jax.devices()[0]
    return cls(jax.default_backend(), tiles.sm_count(device), getattr(device, "device_kind", ""))


@dataclasses.dataclass(frozen=True)
class DecodePlan:
  """Every decode choice resolved: 'xla' | 'pallas' | 'interpret' per part (norm: 'xla' | 'fold' | 'inside',
  applied only by the q/k/v and SwiGLU kernels that run), and the kernels' launch parameters."""
  attention: str
  attention_splits: int  # the attention kernel's splits per row and KV head
  qkv: str
  prefetch_blocks: int  # cache blocks per attention split that the q/k/v kernel loads into L2 (0: none)
  out: str
  mlp: str
  down: str
  down_splits: int  # the down projection's F splits
  norm: str
  stats: str

  @property
  def reference(self) -> bool:
    """True when no decode kernel runs: the step is the reference model's."""
    return all(v == "xla" for v in (self.attention, self.qkv, self.out, self.mlp, self.down))

  def folds(self, part: str) -> bool:
    """Whether the kernel of `part` ('qkv' | 'mlp') runs with its norm's scale folded into its weights."""
    return getattr(self, part) != "xla" and self.norm != "xla"


def _choose(impl: str, fits: bool, gpu: bool) -> str:
  if impl == "auto":
    return "pallas" if fits and gpu else "xla"
  return impl


@functools.lru_cache(maxsize=None)
def resolve(cfg: DecodeConfig, model_cfg: ModelConfig, batch: int, num_slots: int, gen_start: int,
            device: DeviceInfo | None = None) -> DecodePlan:
  """The plan for decode steps of `batch` rows over a [B, K, num_slots, H] cache whose generated tokens start at
  slot gen_start (the prompt bucket), on `device` (default: DeviceInfo.current()). Cached and logged once per key."""
  device = device or DeviceInfo.current()
  gpu = device.backend == "gpu"
  d, f, h = model_cfg.hidden_size, model_cfg.intermediate_size, model_cfg.head_dim
  norm = cfg.norm
  if norm == "auto":
    norm = "inside" if d <= AUTO_NORM_MAX_D and gpu else "xla"
  attn = _choose(cfg.attention, attention.supported(num_slots, gen_start, h), gpu)
  qkv_impl = _choose(cfg.qkv, qkv.supported(batch, d, h) and batch <= qkv.MAX_ROWS, gpu)
  out_fits = (oproj.supported(model_cfg.num_heads * h, d) and batch <= oproj.MAX_ROWS and norm != "xla"
              and qkv_impl != "xla")
  front_fits = mlp.supported(d, f) and batch <= mlp.AUTO_MAX_ROWS
  splits = 0
  if attn != "xla":
    splits = attention.default_splits(batch, model_cfg.num_kv_heads, num_slots, device.sm_count)
  block_k = tiles.pick_block(f, 64)
  plan = DecodePlan(
      attention=attn, attention_splits=splits, qkv=qkv_impl,
      prefetch_blocks=qkv.PREFETCH_BLOCKS if attn != "xla" and qkv_impl != "xla" and attention.BALANCE else 0,
      out=_choose(cfg.out, out_fits, gpu), mlp=_choose(cfg.mlp, front_fits, gpu),
      down=_choose(cfg.down, front_fits and d <= mlp.AUTO_DOWN_MAX_D, gpu),
      down_splits=mlp.resolve_splits(None, f, d // max(tiles.pick_block(d, 64), 1), block_k, device.sm_count)
      if block_k else 0,
      norm=norm, stats=_choose(cfg.stats, True, gpu))
  logging.info("decode plan for D=%d F=%d heads %d/%d x %d, batch %d, cache %d slots (generated from %d), %s %s "
               "(%d SMs): %s", d, f, model_cfg.num_heads, model_cfg.num_kv_heads, h, batch, num_slots, gen_start,
               device.backend, device.kind, device.sm_count, plan)
  return plan
