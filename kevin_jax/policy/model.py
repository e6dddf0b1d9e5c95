"""The Qwen2 decoder (Qwen2 / Qwen2.5 / QwQ) in Flax NNX.

Architecture (matches transformers' Qwen2ForCausalLM): token embedding; L decoder layers of
pre-RMSNorm -> grouped-query attention with q/k/v biases and half-split ("rotate_half") rotary embeddings ->
residual -> RMSNorm -> SwiGLU MLP -> residual; a final RMSNorm; an LM head tied to the embedding or separate.

Dimension letters (used as shape suffixes, e.g. `h_BxTxD`):
  B batch          T tokens of this call      S key/value slots (cache length or T)
  D hidden_size    F intermediate_size (MLP)  V vocab_size
  N query heads    K key/value heads          G = N // K query heads per kv head     H head_dim
  L layers

Entry points:
  logits_BxTxV, new_cache = model(tokens_BxT, positions_BxT, attn_mask_BxT=None, cache=None, cache_slot=0,
                                  cache_mask_BxS=None)                # new_cache is None without a cache
  h_BxTxD = model.hidden(tokens_BxT, positions_BxT, attn_mask_BxT)    # final-normed, no cache (training)
  logits_BxTxV = model.logits(h_BxTxD)                                 # fp32 (when cfg.fp32_upcast)
  h_BxTxD, new_cache = model.hidden_with_cache(tokens_BxT, positions_BxT, attn_mask_BxT, cache, cache_slot,
                                               cache_mask_BxS)         # the sampler's prefill / decode step
`hidden` + `logits` let the learner compute log-probs in sequence chunks without a [B, T, V] buffer.

Masks and padding: attn_mask_BxT is 1 for real tokens and 0 for padding, with padding on the right. A query
attends to key j iff position_j <= position_i and attn_mask_j == 1 (causal over positions, so positions must
increase along T for real tokens). Outputs at padded positions are finite but meaningless. With
cfg.attention_impl == 'cudnn' causality is by index and attn_mask_BxT only gives each row's length (sum), so
real tokens must be a prefix and positions must increase with the index (the learner's and sampler's layout).

KV cache (`KVCache`): per layer k and v of shape [B, K, S, H] in `cache.dtype` (bf16 by default; this layout
makes decode attention a plain batched matmul over (B, K) with no transposes of the cache). Slots are storage,
not positions: keys are rotated by their true positions before they are stored, so a row's tokens may sit
anywhere. A call with a cache writes its T tokens to slots [cache_slot, cache_slot + T) of every row (one
dynamic_update_slice: in place, no scatter). With T > 1 it is a prefill into an empty cache and attends within
the call (causal + attn_mask_BxT). With T == 1 it is a decode step and attends to the slots where
cache_mask_BxS is true (which must include the slot just written); cache_mask_BxS may also be a
decode_attention.SlotRanges (visible = [0, prompt_len[b]) and [gen_start, gen_start + gen_len)), which lets
cfg.decode_attention use the Pallas kernel that reads only those slots. The sampler prefills a right-padded prompt
bucket of P tokens into slots [0, P) and writes generated token i to slot P + i for all rows, masking each row's
padding slots [length, P).
In a decode step the MLP's silu(x W_gate) * (x W_up) may run as one Pallas kernel (cfg.decode_mlp,
policy/decode_mlp.py), and its down projection as another (cfg.decode_down); the attention's q/k/v projection, RoPE
and cache write may run as one (cfg.decode_qkv, policy/decode_qkv.py; with the Pallas attention it also loads the
cache blocks that kernel reads first into L2), and its o projection with the residual add as another
(cfg.decode_out, policy/decode_oproj.py), and the residual add after the MLP with the next layer's input norm as a
third (cfg.decode_add_norm, policy/decode_add_norm.py; the next layer then takes that normed input). So Attention
and MLP take the residual stream and their norm. With cfg.decode_norm 'fold' or 'inside' ('auto', the default, is
'inside' on a GPU up to AUTO_NORM_MAX_D) the q/k/v and SwiGLU kernels take the raw residual and apply their norm as
1/rms on their products, the norm's scale folded into their weights (Qwen2.fold_decode_norms, which the sampler runs
once before its decode loop). Multi-token calls, and so every gradient, use the einsums.

Sharding metadata: every `nnx.Param` carries its logical axis names as the Variable metadata `out_sharding`
(Flax 0.12's name for it; `sharding` and `sharding_names` are deprecated aliases), e.g.
  embed.embedding            ('vocab', 'embed')            [V, D]
  layers[i].attn.q_kernel    ('embed', 'q_heads', 'head_dim')  [D, N, H]   (k/v: 'kv_heads', [D, K, H])
  layers[i].attn.o_kernel    ('q_heads', 'head_dim', 'embed')  [N, H, D]
  layers[i].attn.q_bias      ('q_heads', 'head_dim')      [N, H]          (k/v: ('kv_heads', 'head_dim'))
  layers[i].mlp.gate_kernel / up_kernel ('embed', 'mlp')  [D, F];  down_kernel ('mlp', 'embed') [F, D]
  layers[i].input_norm.scale, post_attn_norm.scale, final_norm.scale ('embed',)  [D]
  lm_head.kernel             ('embed', 'vocab')            [D, V]   (absent when tie_word_embeddings)
Parameters are created with eager_sharding=False, so building the model needs no mesh and the names are only
metadata. To read them:
  state = nnx.state(model, nnx.Param)            # or the abstract state from nnx.eval_shape
  logical = nnx.get_partition_spec(state)        # same tree, each leaf PartitionSpec('embed', 'q_heads', ...)
  with flax.linen.logical_axis_rules(rules):     # rules: (('embed', 'fsdp'), ('q_heads', 'tensor'), ...)
    mesh_specs = nnx.get_partition_spec(state)   # names mapped to mesh axes
(caution: a name missing from the rules is passed through unchanged, not replaced by None, so list all six,
mapping the replicated ones to None), or read `variable.get_metadata()['out_sharding']` per leaf and map the
names yourself (kevin_jax/sharding.py). `nnx.get_named_sharding(state, mesh)` builds NamedShardings likewise.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from kevin_jax.policy import decode_add_norm
from kevin_jax.policy import decode_attention
from kevin_jax.policy import decode_mlp
from kevin_jax.policy import decode_oproj
from kevin_jax.policy import decode_qkv
from kevin_jax.policy.config import ModelConfig
from kevin_jax.policy.decode_attention import SlotRanges

Array = jax.Array
_INIT_STD = 0.02  # HF initializer_range for Qwen2.


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  """Per-layer key/value buffers: k[i], v[i] of shape [B, K, S, H]."""
  k: list[Array]
  v: list[Array]

  @classmethod
  def zeros(cls, cfg: ModelConfig, batch: int, length: int, dtype: Any = jnp.bfloat16) -> "KVCache":
    shape = (batch, cfg.num_kv_heads, length, cfg.head_dim)
    return cls(k=[jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)],
               v=[jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)])

  @property
  def length(self) -> int:
    return self.k[0].shape[2]


def _param(rngs: nnx.Rngs | None, shape: tuple[int, ...], names: tuple[str, ...], dtype, init: str) -> nnx.Param:
  if init == "normal":
    value = _INIT_STD * jax.random.normal(rngs.params(), shape, jnp.float32)
  elif init == "ones":
    value = jnp.ones(shape, jnp.float32)
  else:
    value = jnp.zeros(shape, jnp.float32)
  # eager_sharding=False: the names are logical (not mesh axes); kevin_jax/sharding.py maps them.
  return nnx.Param(value.astype(dtype), out_sharding=names, eager_sharding=False)


class RMSNorm(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    del rngs
    self.eps = cfg.rms_norm_eps
    self.upcast = cfg.fp32_upcast
    self.scale = _param(None, (cfg.hidden_size,), ("embed",), cfg.param_jnp_dtype, "ones")
    self.folded = False  # True after Qwen2.fold_decode_norms: the scale is one, its values are in the weights

  def __call__(self, x_BxTxD: Array) -> Array:
    dtype = jnp.float32 if self.upcast else x_BxTxD.dtype
    x = x_BxTxD.astype(dtype)
    var_BxTx1 = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    scale = self.scale[...].astype(dtype).reshape((1,) * (x.ndim - 1) + (-1,))
    y = x * jax.lax.rsqrt(var_BxTx1 + self.eps) * scale
    return y.astype(x_BxTxD.dtype)

  def inv_rms(self, x_BxD: Array) -> Array:
    """fp32 [B]: 1 / sqrt(mean(x^2) + eps) per row, the norm without its scale (ModelConfig.decode_norm='fold')."""
    x = x_BxD.astype(jnp.float32)
    return jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1) + self.eps)

  def fold(self, w_DxN: Array, dtype: Any) -> Array:
    """w [D, ...] with the norm's scale folded into its input dimension, rounded once to dtype:
    norm(x) @ w == inv_rms(x) * (x @ fold(w)) up to that rounding. After Qwen2.fold_decode_norms (the scale is
    already in the weights, and one) w as it is."""
    if self.folded:
      return w_DxN.astype(dtype)
    scale = self.scale[...].astype(jnp.float32).reshape((-1,) + (1,) * (w_DxN.ndim - 1))
    return (scale * w_DxN.astype(jnp.float32)).astype(dtype)


def rope_cos_sin(positions_BxT: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
  """fp32 cos/sin of shape [B, T, H/2] (bf16 positions would be catastrophic past a few hundred)."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles_BxTxH2 = positions_BxT.astype(jnp.float32)[..., None] * inv_freq[None, None, :]
  return jnp.cos(angles_BxTxH2), jnp.sin(angles_BxTxH2)


def apply_rope(x_BxTxNxH: Array, cos_BxTxH2: Array, sin_BxTxH2: Array, upcast: bool) -> Array:
  """Half-split rotation (HF rotate_half): [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]."""
  dtype = jnp.float32 if upcast else x_BxTxNxH.dtype
  x = x_BxTxNxH.astype(dtype)
  cos, sin = cos_BxTxH2[:, :, None, :].astype(dtype), sin_BxTxH2[:, :, None, :].astype(dtype)
  x1, x2 = jnp.split(x, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxH.dtype)


def _attend(q_BxTxKxGxH: Array, k_BxSxKxH: Array, v_BxSxKxH: Array, allowed_BxTxS: Array, upcast: bool) -> Array:
  """Masked softmax attention (einsum); returns [B, T, K, G, H] in q's dtype."""
  scale = q_BxTxKxGxH.shape[-1] ** -0.5
  sdtype = jnp.float32 if upcast else q_BxTxKxGxH.dtype
  s_BxKxGxTxS = jnp.einsum("btkgh,bskh->bkgts", q_BxTxKxGxH, k_BxSxKxH.astype(q_BxTxKxGxH.dtype),
                           preferred_element_type=sdtype) * scale
  s_BxKxGxTxS = jnp.where(allowed_BxTxS[:, None, None], s_BxKxGxTxS, jnp.finfo(sdtype).min)
  p_BxKxGxTxS = jax.nn.softmax(s_BxKxGxTxS, axis=-1).astype(q_BxTxKxGxH.dtype)
  return jnp.einsum("bkgts,bskh->btkgh", p_BxKxGxTxS, v_BxSxKxH.astype(q_BxTxKxGxH.dtype))


def _decode_attend(q_BxKxGxH: Array, k_BxKxSxH: Array, v_BxKxSxH: Array, allowed_BxS: Array, upcast: bool) -> Array:
  """One query token per row against the allowed cache slots; returns [B, K, G, H]."""
  scale = q_BxKxGxH.shape[-1] ** -0.5
  sdtype = jnp.float32 if upcast else q_BxKxGxH.dtype
  dt = k_BxKxSxH.dtype  # matmuls in the cache dtype: no conversion pass over the cache
  s_BxKxGxS = jnp.einsum("bkgh,bksh->bkgs", q_BxKxGxH.astype(dt), k_BxKxSxH, preferred_element_type=sdtype) * scale
  s_BxKxGxS = jnp.where(allowed_BxS[:, None, None, :], s_BxKxGxS, jnp.finfo(sdtype).min)
  p_BxKxGxS = jax.nn.softmax(s_BxKxGxS, axis=-1).astype(dt)
  o_BxKxGxH = jnp.einsum("bkgs,bksh->bkgh", p_BxKxGxS, v_BxKxSxH, preferred_element_type=sdtype)
  return o_BxKxGxH.astype(q_BxKxGxH.dtype)


def _resolve(impl: str, fits: bool) -> str:
  """A decode kernel's ModelConfig choice with 'auto' resolved: the kernel on a GPU where it fits, else 'xla'."""
  if impl == "auto":
    return "pallas" if fits and jax.default_backend() == "gpu" else "xla"
  return impl


def _ranges_attention_impl(cfg: ModelConfig, num_slots: int, head_dim: int, visible: SlotRanges) -> str:
  """cfg.decode_attention for a decode step over the sampler's SlotRanges, 'auto' resolved."""
  return _resolve(cfg.decode_attention, decode_attention.supported(num_slots, visible.gen_start, head_dim))


def _decode_step_attention(cfg: ModelConfig, q_BxKxGxH: Array, k_BxKxSxH: Array, v_BxKxSxH: Array,
                           visible: Array | SlotRanges, groups: int = 0, padded: bool = False) -> Array:
  """Decode attention by cfg.decode_attention; `visible` is a [B, S] mask or the sampler's SlotRanges.

  groups > 0: q holds that many real query rows per KV head, then zero rows up to decode_attention's padded
  count (decode_qkv's layout); returns [B, K, groups, H] either way, or with `padded` possibly [B, K, G_pad, H]
  (the Pallas kernel with one split; the padding rows meaningless): callers check the shape.
  """
  s, h = k_BxKxSxH.shape[2], k_BxKxSxH.shape[3]
  impl = cfg.decode_attention
  if isinstance(visible, SlotRanges):
    impl = _ranges_attention_impl(cfg, s, h, visible)
    if impl in ("pallas", "interpret"):
      return decode_attention.decode_attention(q_BxKxGxH, k_BxKxSxH, v_BxKxSxH, visible, groups=groups,
                                               padded=padded and groups > 0, interpret=impl == "interpret")
    visible = visible.mask(s)
  elif impl in ("pallas", "interpret"):
    raise ValueError(f"decode_attention={impl!r} needs the cache visibility as SlotRanges, not a mask")
  if groups:
    q_BxKxGxH = q_BxKxGxH[:, :, :groups]
  return _decode_attend(q_BxKxGxH, k_BxKxSxH, v_BxKxSxH, visible, cfg.fp32_upcast)


def _wide_out_matmul(spec: str, a: Array, b: Array, out_dtype) -> Array:
  """einsum(spec, a, b) with out_dtype results (fp32 accumulation); for bf16 inputs and fp32 out, the backward
  pass casts the fp32 cotangent to bf16 first, so both gradient matmuls run on bf16 tensor cores (JAX's
  default transpose would promote them to fp32 GEMMs: BENCHMARKS.md Learner step, tried and lost)."""
  if a.dtype == out_dtype or a.dtype != b.dtype:
    return jnp.einsum(spec, a, b, preferred_element_type=out_dtype)
  return _bf16_grad_matmul(spec, out_dtype, a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _bf16_grad_matmul(spec, out_dtype, a, b):
  return jnp.einsum(spec, a, b, preferred_element_type=out_dtype)


def _bf16_grad_matmul_fwd(spec, out_dtype, a, b):
  return _bf16_grad_matmul(spec, out_dtype, a, b), (a, b)


def _bf16_grad_matmul_bwd(spec, out_dtype, res, g):
  del out_dtype
  a, b = res
  # A bf16-output einsum: its transposes are bf16 x bf16 GEMMs (fp32 accumulation inside the GEMM).
  _, vjp = jax.vjp(lambda x, y: jnp.einsum(spec, x, y), a, b)
  return vjp(g.astype(a.dtype))


_bf16_grad_matmul.defvjp(_bf16_grad_matmul_fwd, _bf16_grad_matmul_bwd)


AUTO_NORM_MAX_D = 1024  # ModelConfig.decode_norm='auto' is 'inside' on a GPU up to this hidden size: it pays at
                        # the 0.5B shape (D = 896; its folded weights take 0.47 GB while decoding), not at the 1.5B
                        # shape (D = 1,536: 0.999x XLA's norms, BENCHMARKS.md Sampler), so larger ones keep 'xla'.


def decode_norm_impl(cfg: ModelConfig) -> str:
  """cfg.decode_norm with 'auto' resolved: 'inside' on a GPU where the hidden size is at most AUTO_NORM_MAX_D,
  else 'xla'."""
  if cfg.decode_norm == "auto":
    return "inside" if cfg.hidden_size <= AUTO_NORM_MAX_D and jax.default_backend() == "gpu" else "xla"
  return cfg.decode_norm


def _decode_qkv_impl(cfg: ModelConfig, rows: int) -> str:
  """cfg.decode_qkv for a one-token decode step of `rows` rows, 'auto' resolved."""
  return _resolve(cfg.decode_qkv, decode_qkv.supported(rows, cfg.hidden_size, cfg.head_dim)
                  and rows <= decode_qkv.MAX_ROWS)


def _decode_out_impl(cfg: ModelConfig, rows: int) -> str:
  """cfg.decode_out for a one-token decode step of `rows` rows, 'auto' resolved: the kernel only where the q/k/v
  kernel applies the norm inside (alone it made the step slower; ModelConfig's docstring)."""
  fits = decode_oproj.supported(cfg.num_heads * cfg.head_dim, cfg.hidden_size) and rows <= decode_oproj.MAX_ROWS
  return _resolve(cfg.decode_out, fits and decode_norm_impl(cfg) != "xla" and _decode_qkv_impl(cfg, rows) != "xla")


def _decode_add_norm_impl(cfg: ModelConfig) -> str:
  """cfg.decode_add_norm for a one-token decode step, 'auto' resolved."""
  return _resolve(cfg.decode_add_norm, decode_add_norm.supported(cfg.hidden_size) and cfg.fp32_upcast)


def _decode_norm_args(cfg: ModelConfig, norm: RMSNorm | None, x_BxD: Array) -> tuple[Array | None, float | None]:
  """A decode kernel's (inv_rms_B, rms_eps) for cfg.decode_norm: 'fold' -> XLA's 1/rms; 'inside' -> the kernel
  computes it with the norm's eps; no norm (x comes normed) -> neither."""
  if norm is None:
    return None, None
  return (norm.inv_rms(x_BxD), None) if decode_norm_impl(cfg) == "fold" else (None, norm.eps)


class Attention(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, n, k, h, pd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.param_jnp_dtype
    self.q_kernel = _param(rngs, (d, n, h), ("embed", "q_heads", "head_dim"), pd, "normal")
    self.k_kernel = _param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), pd, "normal")
    self.v_kernel = _param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), pd, "normal")
    self.o_kernel = _param(rngs, (n, h, d), ("q_heads", "head_dim", "embed"), pd, "normal")
    self.q_bias = _param(rngs, (n, h), ("q_heads", "head_dim"), pd, "zeros")
    self.k_bias = _param(rngs, (k, h), ("kv_heads", "head_dim"), pd, "zeros")
    self.v_bias = _param(rngs, (k, h), ("kv_heads", "head_dim"), pd, "zeros")

  def _fused_decode(self, x_BxD: Array, positions_BxT: Array, cache_kv, interpret: bool,
                    norm: RMSNorm | None = None, padded: bool = False) -> tuple[Array, tuple[Array, Array]]:
    """A decode step of the normed x through decode_qkv's one kernel (projection, RoPE, cache write), then decode
    attention. With `norm`, x is the raw residual: the norm's scale is folded into the q/k/v weights and the
    kernel multiplies by its 1/rms (ModelConfig.decode_norm 'fold' or 'inside'). padded: the output may keep
    decode_qkv's padding rows (_decode_step_attention), for the o projection kernel."""
    cfg = self.cfg
    dt = cfg.compute_jnp_dtype
    ck_BxKxSxH, cv_BxKxSxH, slot, cache_mask_BxS = cache_kv
    if cache_mask_BxS is None:
      raise ValueError("a decode step (T == 1 with a cache) needs cache_mask_BxS")
    cos, sin = rope_cos_sin(positions_BxT, cfg.head_dim, cfg.rope_theta)
    w = [p[...].astype(dt) if norm is None else norm.fold(p[...], dt)
         for p in (self.q_kernel, self.k_kernel, self.v_kernel)]
    b = [p[...].astype(dt) for p in (self.q_bias, self.k_bias, self.v_bias)]
    inv_rms, eps = _decode_norm_args(cfg, norm, x_BxD)
    pf = {}
    s = ck_BxKxSxH.shape[2]
    if (isinstance(cache_mask_BxS, SlotRanges) and decode_attention.BALANCE
        and _ranges_attention_impl(cfg, s, cfg.head_dim, cache_mask_BxS) in ("pallas", "interpret")):
      # The q/k/v kernel may prefetch the cache blocks the attention kernel reads first (decode_qkv.PREFETCH_BLOCKS).
      pf = dict(prefetch_ranges=cache_mask_BxS,
                prefetch_splits=decode_attention.default_splits(x_BxD.shape[0], cfg.num_kv_heads, s))
    q_BxKxGpxH, ck_BxKxSxH, cv_BxKxSxH = decode_qkv.qkv_rope_cache(
        x_BxD.astype(dt), *w, *b, cos[:, 0], sin[:, 0], ck_BxKxSxH, cv_BxKxSxH, slot, inv_rms, rms_eps=eps,
        interpret=interpret, **pf)
    o_BxKxGxH = _decode_step_attention(cfg, q_BxKxGpxH, ck_BxKxSxH, cv_BxKxSxH, cache_mask_BxS,
                                       groups=cfg.num_groups, padded=padded)
    return o_BxKxGxH, (ck_BxKxSxH, cv_BxKxSxH)

  def __call__(self, x_BxTxD: Array, positions_BxT: Array, attn_mask_BxT: Array | None,
               cache_kv: tuple[Array, Array, Array, Array | None] | None, norm: RMSNorm,
               normed_BxTxD: Array | None = None) -> tuple[Array, tuple[Array, Array] | None]:
    """x + attention(norm(x)), and the updated (k, v) cache or None. x is the residual stream: a decode step's
    output-projection kernel may apply the residual add itself (cfg.decode_out). normed_BxTxD: norm(x) when the
    caller has it already (cfg.decode_add_norm's kernel computes it with the previous layer's residual add)."""
    cfg = self.cfg
    b, t, _ = x_BxTxD.shape
    qkv = _decode_qkv_impl(cfg, b) if cache_kv is not None and t == 1 else "xla"
    out = _decode_out_impl(cfg, b) if cache_kv is not None and t == 1 else "xla"
    o_groups = 0  # > 0: o is [B, K, G_pad, H] with that many real heads per KV head (the o kernel's layout)
    if qkv == "xla":
      normed = norm(x_BxTxD) if normed_BxTxD is None else normed_BxTxD
      o_BxTxNxH, new_kv = self._attend_xla(normed, positions_BxT, attn_mask_BxT, cache_kv)
    else:
      if normed_BxTxD is None and decode_norm_impl(cfg) != "xla":
        # The kernel takes the raw x and applies the norm as 1/rms on its products, the scale in its weights.
        x_BxD, kernel_norm = x_BxTxD[:, 0], norm
      else:
        # With decode_norm='xla' the norm is XLA's fusion before the kernel: multiplying x by the scale inside the
        # kernel (before the dots) is slower than that (BENCHMARKS.md Sampler).
        x_BxD, kernel_norm = (norm(x_BxTxD) if normed_BxTxD is None else normed_BxTxD)[:, 0], None
      o_BxKxGxH, new_kv = self._fused_decode(x_BxD, positions_BxT, cache_kv, interpret=qkv == "interpret",
                                             norm=kernel_norm, padded=out != "xla")
      if o_BxKxGxH.shape[2] != cfg.num_groups:
        o_groups = cfg.num_groups
      else:
        o_BxTxNxH = o_BxKxGxH.reshape(b, t, cfg.num_heads, cfg.head_dim)
    w_o = self.o_kernel[...].astype(cfg.compute_jnp_dtype)
    if out != "xla":
      o = o_BxKxGxH if o_groups else o_BxTxNxH[:, 0]
      h_BxD = decode_oproj.out_proj_residual(o, w_o, x_BxTxD[:, 0], groups=o_groups, interpret=out == "interpret")
      return h_BxD[:, None], new_kv
    return x_BxTxD + jnp.einsum("btnh,nhd->btd", o_BxTxNxH, w_o), new_kv

  def _attend_xla(self, x_BxTxD: Array, positions_BxT: Array, attn_mask_BxT: Array | None, cache_kv
                  ) -> tuple[Array, tuple[Array, Array] | None]:
    """The heads' outputs [B, T, N, H] for normed x, and the updated cache: einsums, XLA's fusions."""
    cfg = self.cfg
    dt = cfg.compute_jnp_dtype
    b, t, _ = x_BxTxD.shape
    x = x_BxTxD.astype(dt)
    q_BxTxNxH = jnp.einsum("btd,dnh->btnh", x, self.q_kernel[...].astype(dt)) + self.q_bias[...].astype(dt)[None, None]
    k_BxTxKxH = jnp.einsum("btd,dkh->btkh", x, self.k_kernel[...].astype(dt)) + self.k_bias[...].astype(dt)[None, None]
    v_BxTxKxH = jnp.einsum("btd,dkh->btkh", x, self.v_kernel[...].astype(dt)) + self.v_bias[...].astype(dt)[None, None]
    cos, sin = rope_cos_sin(positions_BxT, cfg.head_dim, cfg.rope_theta)
    q_BxTxNxH = apply_rope(q_BxTxNxH, cos, sin, cfg.fp32_upcast)
    k_BxTxKxH = apply_rope(k_BxTxKxH, cos, sin, cfg.fp32_upcast)
    q_BxTxKxGxH = q_BxTxNxH.reshape(b, t, cfg.num_kv_heads, cfg.num_groups, cfg.head_dim)

    new_kv = None
    if cache_kv is not None:
      ck_BxKxSxH, cv_BxKxSxH, slot, cache_mask_BxS = cache_kv
      start = (0, 0, slot, 0)
      ck_BxKxSxH = jax.lax.dynamic_update_slice(
          ck_BxKxSxH, k_BxTxKxH.transpose(0, 2, 1, 3).astype(ck_BxKxSxH.dtype), start)
      cv_BxKxSxH = jax.lax.dynamic_update_slice(
          cv_BxKxSxH, v_BxTxKxH.transpose(0, 2, 1, 3).astype(cv_BxKxSxH.dtype), start)
      new_kv = (ck_BxKxSxH, cv_BxKxSxH)

    if cache_kv is not None and t == 1:
      if cache_mask_BxS is None:
        raise ValueError("a decode step (T == 1 with a cache) needs cache_mask_BxS")
      o_BxTxKxGxH = _decode_step_attention(cfg, q_BxTxKxGxH[:, 0], new_kv[0], new_kv[1], cache_mask_BxS)[:, None]
    else:
      o_BxTxKxGxH = self._self_attend(q_BxTxKxGxH, k_BxTxKxH, v_BxTxKxH, positions_BxT, attn_mask_BxT)
    return o_BxTxKxGxH.reshape(b, t, cfg.num_heads, cfg.head_dim), new_kv

  def _self_attend(self, q_BxTxKxGxH, k_BxTxKxH, v_BxTxKxH, positions_BxT, attn_mask_BxT):
    cfg = self.cfg
    if cfg.attention_impl == "cudnn":
      b, t = positions_BxT.shape
      # Right padding: causal order by index equals order by position; padding only shortens the keys.
      lengths_B = (jnp.sum(attn_mask_BxT.astype(jnp.int32), axis=1) if attn_mask_BxT is not None
                   else jnp.full((b,), t, jnp.int32))
      q_BxTxNxH = q_BxTxKxGxH.reshape(b, t, cfg.num_heads, cfg.head_dim)
      o_BxTxNxH = jax.nn.dot_product_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, is_causal=True,
                                               query_seq_lengths=lengths_B, key_value_seq_lengths=lengths_B,
                                               implementation="cudnn")
      return o_BxTxNxH.reshape(q_BxTxKxGxH.shape)
    allowed_BxTxS = positions_BxT[:, None, :] <= positions_BxT[:, :, None]
    if attn_mask_BxT is not None:
      allowed_BxTxS &= attn_mask_BxT.astype(bool)[:, None, :]
    return _attend(q_BxTxKxGxH, k_BxTxKxH, v_BxTxKxH, allowed_BxTxS, cfg.fp32_upcast)


class MLP(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.param_jnp_dtype
    self.gate_kernel = _param(rngs, (d, f), ("embed", "mlp"), pd, "normal")
    self.up_kernel = _param(rngs, (d, f), ("embed", "mlp"), pd, "normal")
    self.down_kernel = _param(rngs, (f, d), ("mlp", "embed"), pd, "normal")

  def _decode_impls(self, rows: int) -> tuple[str, str]:
    """(front, down) implementations of a one-token decode step of `rows` rows ('auto' resolved)."""
    cfg = self.cfg
    fits = decode_mlp.supported(cfg.hidden_size, cfg.intermediate_size) and rows <= decode_mlp.AUTO_MAX_ROWS
    return (_resolve(cfg.decode_mlp, fits),
            _resolve(cfg.decode_down, fits and cfg.hidden_size <= decode_mlp.AUTO_DOWN_MAX_D))

  def _front(self, x_BxTxD: Array, norm: RMSNorm, front: str) -> Array:
    """silu(norm(x) W_gate) * (norm(x) W_up): [B, T, F] in the compute dtype."""
    dt = self.cfg.compute_jnp_dtype
    if front != "xla" and decode_norm_impl(self.cfg) != "xla":
      # The kernel takes the raw x and applies the norm as 1/rms on its products, the scale in its weights.
      wg, wu = (norm.fold(k[...], dt) for k in (self.gate_kernel, self.up_kernel))
      x_BxD = x_BxTxD[:, 0]
      inv_rms, eps = _decode_norm_args(self.cfg, norm, x_BxD)
      return decode_mlp.swiglu_front(x_BxD.astype(dt), wg, wu, inv_rms, rms_eps=eps,
                                     interpret=front == "interpret")[:, None]
    wg, wu = (k[...].astype(dt) for k in (self.gate_kernel, self.up_kernel))
    if front == "xla":
      x = norm(x_BxTxD).astype(dt)
      return jax.nn.silu(jnp.einsum("btd,df->btf", x, wg)) * jnp.einsum("btd,df->btf", x, wu)
    return decode_mlp.swiglu_front(norm(x_BxTxD)[:, 0].astype(dt), wg, wu, interpret=front == "interpret")[:, None]

  def __call__(self, x_BxTxD: Array, norm: RMSNorm) -> Array:
    """The MLP of norm(x), x the residual stream."""
    b, t, _ = x_BxTxD.shape
    # Multi-token calls (prefill, training) always use the einsums; a decode step may use Pallas kernels.
    front, down = self._decode_impls(b) if t == 1 else ("xla", "xla")
    h_BxTxF = self._front(x_BxTxD, norm, front)
    wd = self.down_kernel[...].astype(self.cfg.compute_jnp_dtype)
    if down == "xla":
      return jnp.einsum("btf,fd->btd", h_BxTxF, wd)
    return decode_mlp.down_proj(h_BxTxF[:, 0], wd, interpret=down == "interpret")[:, None]

  def decode_partials(self, x_BxD: Array, norm: RMSNorm) -> Array:
    """A decode step's MLP of norm(x) ([B, D] rows) as terms to sum: decode_mlp.down_partials' fp32 [S, R >= B, D]
    with the Pallas down projection, else [1, B, D], the einsum's output (decode_add_norm.add_norm's y)."""
    front, down = self._decode_impls(x_BxD.shape[0])
    h_BxF = self._front(x_BxD[:, None], norm, front)[:, 0]
    wd = self.down_kernel[...].astype(self.cfg.compute_jnp_dtype)
    if down == "xla":
      return jnp.einsum("bf,fd->bd", h_BxF, wd)[None]
    return decode_mlp.down_partials(h_BxF, wd, interpret=down == "interpret")


class DecoderLayer(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.input_norm = RMSNorm(cfg, rngs=rngs)
    self.attn = Attention(cfg, rngs=rngs)
    self.post_attn_norm = RMSNorm(cfg, rngs=rngs)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, h_BxTxD, positions_BxT, attn_mask_BxT, cache_kv):
    h_BxTxD, new_kv = self.attn(h_BxTxD, positions_BxT, attn_mask_BxT, cache_kv, self.input_norm)
    h_BxTxD = h_BxTxD + self.mlp(h_BxTxD, self.post_attn_norm)
    return h_BxTxD, new_kv

  def decode_step_add_norm(self, h_BxTxD, positions_BxT, attn_mask_BxT, cache_kv, normed_BxTxD,
                           next_norm: RMSNorm, interpret: bool):
    """A decode step (T == 1) whose residual add after the MLP and `next_norm` run as decode_add_norm's one kernel:
    (h, the updated (k, v) cache, next_norm(h)). normed_BxTxD: this layer's input norm of h if the previous layer
    computed it, else None."""
    h_BxTxD, new_kv = self.attn(h_BxTxD, positions_BxT, attn_mask_BxT, cache_kv, self.input_norm, normed_BxTxD)
    y_SxRxD = self.mlp.decode_partials(h_BxTxD[:, 0], self.post_attn_norm)
    h_BxD, x_BxD = decode_add_norm.add_norm(h_BxTxD[:, 0], y_SxRxD, next_norm.scale[...], next_norm.eps,
                                            interpret=interpret)
    return h_BxD[:, None], new_kv, x_BxD[:, None]


class Embed(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.embedding = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), cfg.param_jnp_dtype,
                            "normal")


class LMHead(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.kernel = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), cfg.param_jnp_dtype,
                         "normal")


def _layer_apply(layer: DecoderLayer, h_BxTxD, positions_BxT, attn_mask_BxT):
  return layer(h_BxTxD, positions_BxT, attn_mask_BxT, None)[0]


_REMAT_POLICIES = {
    "full": None,  # save nothing inside the layer; recompute it all in the backward pass
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class Qwen2(nnx.Module):
  """Qwen2ForCausalLM in Flax NNX. See the module docstring for shapes, masks, the cache and sharding names."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = Embed(cfg, rngs=rngs)
    self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg, rngs=rngs)
    if not cfg.tie_word_embeddings:
      self.lm_head = LMHead(cfg, rngs=rngs)

  def _embed(self, tokens_BxT: Array) -> Array:
    return jnp.take(self.embed.embedding[...], tokens_BxT, axis=0).astype(self.cfg.compute_jnp_dtype)

  def hidden(self, tokens_BxT: Array, positions_BxT: Array, attn_mask_BxT: Array | None = None) -> Array:
    """Final-normed hidden states [B, T, D] in compute dtype (no cache; causal + padding mask)."""
    h_BxTxD = self._embed(tokens_BxT)
    if self.cfg.remat == "none":
      apply = _layer_apply
    else:
      apply = nnx.remat(_layer_apply, policy=_REMAT_POLICIES[self.cfg.remat])
    for layer in self.layers:
      h_BxTxD = apply(layer, h_BxTxD, positions_BxT, attn_mask_BxT)
    return self.final_norm(h_BxTxD)

  def fold_decode_norms(self, rows: int | None = None) -> None:
    """In place (on a model merged inside a jitted function): every layer's input norm scale folded into its
    q/k/v weights and its post-attention norm scale into its gate/up weights (RMSNorm.fold: one rounding to the
    parameter dtype), and those scales set to one. The model computes the same function up to that rounding, and
    a decode step with cfg.decode_norm 'fold' or 'inside' then multiplies by 1/rms only. The sampler calls it once
    before its decode loop: folded inside each step, the weights would be re-read and re-written every step (XLA
    does not hoist the fold out of the loop; BENCHMARKS.md Sampler). rows: fold only the norms whose Pallas kernel
    runs in a decode step of that many rows (XLA's paths apply the norm themselves), so no weights are copied for
    nothing; None: all."""
    for layer in self.layers:
      attn, mlp = layer.attn, layer.mlp
      qkv_runs = rows is None or _decode_qkv_impl(self.cfg, rows) != "xla"
      front_runs = rows is None or mlp._decode_impls(rows)[0] != "xla"  # pylint: disable=protected-access
      for norm, params, runs in ((layer.input_norm, (attn.q_kernel, attn.k_kernel, attn.v_kernel), qkv_runs),
                                 (layer.post_attn_norm, (mlp.gate_kernel, mlp.up_kernel), front_runs)):
        if norm.folded or not runs:
          continue
        for p in params:
          p[...] = norm.fold(p[...], p[...].dtype)
        norm.scale[...] = jnp.ones_like(norm.scale[...])
        norm.folded = True

  @property
  def logits_dtype(self):
    """The logits' dtype: fp32 when cfg.fp32_upcast, else the compute dtype."""
    return jnp.float32 if self.cfg.fp32_upcast else self.cfg.compute_jnp_dtype

  def head_weight(self) -> tuple[Array, bool]:
    """(the LM head's weight in the compute dtype, whether it is [V, D]: the tied embedding; else [D, V])."""
    dt = self.cfg.compute_jnp_dtype
    if self.cfg.tie_word_embeddings:
      return self.embed.embedding[...].astype(dt), True
    return self.lm_head.kernel[...].astype(dt), False

  def logits(self, h_BxTxD: Array) -> Array:
    """LM-head logits [B, T, V] in logits_dtype (fp32 accumulation)."""
    w, head_vd = self.head_weight()
    h = h_BxTxD.astype(self.cfg.compute_jnp_dtype)
    return _wide_out_matmul("btd,vd->btv" if head_vd else "btd,dv->btv", h, w, self.logits_dtype)

  def __call__(self, tokens_BxT: Array, positions_BxT: Array, attn_mask_BxT: Array | None = None,
               cache: KVCache | None = None, cache_slot: Array | int = 0,
               cache_mask_BxS: Array | None = None) -> tuple[Array, KVCache | None]:
    """Logits [B, T, V] and the updated cache (None without a cache). See the module docstring."""
    if cache is None:
      return self.logits(self.hidden(tokens_BxT, positions_BxT, attn_mask_BxT)), None
    h_BxTxD, cache = self.hidden_with_cache(tokens_BxT, positions_BxT, attn_mask_BxT, cache, cache_slot,
                                            cache_mask_BxS)
    return self.logits(h_BxTxD), cache

  def hidden_with_cache(self, tokens_BxT: Array, positions_BxT: Array, attn_mask_BxT: Array | None,
                        cache: KVCache, cache_slot: Array | int = 0,
                        cache_mask_BxS: Array | None = None) -> tuple[Array, KVCache]:
    """Final-normed hidden states [B, T, D] and the updated cache (prefill if T > 1, else one decode step)."""
    h_BxTxD = self._embed(tokens_BxT)
    new_k, new_v = [], []
    slot = jnp.asarray(cache_slot, jnp.int32)
    add_norm = _decode_add_norm_impl(self.cfg) if tokens_BxT.shape[1] == 1 else "xla"
    if add_norm != "xla":
      # Each layer ends with the residual add and the next norm in one kernel: the next layer's input norm, and
      # after the last layer the final norm, whose output this returns.
      normed = None
      for i, layer in enumerate(self.layers):
        next_norm = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.final_norm
        h_BxTxD, (k, v), normed = layer.decode_step_add_norm(
            h_BxTxD, positions_BxT, attn_mask_BxT, (cache.k[i], cache.v[i], slot, cache_mask_BxS), normed,
            next_norm, interpret=add_norm == "interpret")
        new_k.append(k)
        new_v.append(v)
      return normed, KVCache(k=new_k, v=new_v)
    for i, layer in enumerate(self.layers):
      h_BxTxD, (k, v) = layer(h_BxTxD, positions_BxT, attn_mask_BxT, (cache.k[i], cache.v[i], slot,
                                                                       cache_mask_BxS))
      new_k.append(k)
      new_v.append(v)
    return self.final_norm(h_BxTxD), KVCache(k=new_k, v=new_v)
