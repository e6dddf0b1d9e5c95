"""The Qwen2 decoder (Qwen2 / Qwen2.5 / QwQ) in Flax NNX: the reference forward pass.

Architecture (matches transformers' Qwen2ForCausalLM): token embedding; L decoder layers of
pre-RMSNorm -> grouped-query attention with q/k/v biases and half-split ("rotate_half") rotary embeddings ->
residual -> RMSNorm -> SwiGLU MLP -> residual; a final RMSNorm; an LM head tied to the embedding or separate.

Dimension letters (used as shape suffixes, e.g. `h_BxTxD`):
  B batch          T tokens of this call      S key/value slots (cache length or T)
  D hidden_size    F intermediate_size (MLP)  V vocab_size
  N query heads    K key/value heads          G = N // K query heads per kv head     H head_dim
  L layers

Entry points (one forward path; the decode fast path lives in policy/decode/, which only the sampler calls):
  logits_BxTxV, new_cache = model(tokens_BxT, positions_BxT, attn_mask_BxT=None, cache=None, cache_slot=0,
                                  cache_mask_BxS=None)                # new_cache is None without a cache
  h_BxTxD, new_cache = model.hidden(tokens_BxT, positions_BxT, attn_mask_BxT=None, cache=None, ...,
                                    scan=False, between_layers=None)  # final-normed
  logits_BxTxV = model.logits(h_BxTxD)                                 # fp32 (when cfg.fp32_upcast)
`hidden` + `logits` let the learner compute log-probs in sequence chunks without a [B, T, V] buffer. With
scan=True (no cache) the decoder layers run in a jax.lax.scan over their stacked parameters: remat then
recomputes one layer at a time in the backward pass (an unrolled loop of checkpointed layers lets XLA schedule
every recomputation early, so remat saves almost nothing, jax-ml/jax#20763), and compile time stops growing
with depth; the values equal the unrolled loop's. between_layers(h) (e.g. a sharding constraint) runs after
every layer in the scan.

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
the call (causal + attn_mask_BxT). With T == 1 it is a decode step and attends to the slots where the boolean
cache_mask_BxS is true (which must include the slot just written). Multi-token calls, and so every gradient,
use the einsums.

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
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from kevin_jax.policy.config import ModelConfig

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

  def __call__(self, x_BxTxD: Array) -> Array:
    dtype = jnp.float32 if self.upcast else x_BxTxD.dtype
    x = x_BxTxD.astype(dtype)
    var_BxTx1 = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    scale = self.scale[...].astype(dtype).reshape((1,) * (x.ndim - 1) + (-1,))
    y = x * jax.lax.rsqrt(var_BxTx1 + self.eps) * scale
    return y.astype(x_BxTxD.dtype)


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


def decode_attend(q_BxKxGxH: Array, k_BxKxSxH: Array, v_BxKxSxH: Array, allowed_BxS: Array, upcast: bool) -> Array:
  """One query token per row against the allowed cache slots; returns [B, K, G, H]."""
  scale = q_BxKxGxH.shape[-1] ** -0.5
  sdtype = jnp.float32 if upcast else q_BxKxGxH.dtype
  dt = k_BxKxSxH.dtype  # matmuls in the cache dtype: no conversion pass over the cache
  s_BxKxGxS = jnp.einsum("bkgh,bksh->bkgs", q_BxKxGxH.astype(dt), k_BxKxSxH, preferred_element_type=sdtype) * scale
  s_BxKxGxS = jnp.where(allowed_BxS[:, None, None, :], s_BxKxGxS, jnp.finfo(sdtype).min)
  p_BxKxGxS = jax.nn.softmax(s_BxKxGxS, axis=-1).astype(dt)
  o_BxKxGxH = jnp.einsum("bkgs,bksh->bkgh", p_BxKxGxS, v_BxKxSxH, preferred_element_type=sdtype)
  return o_BxKxGxH.astype(q_BxKxGxH.dtype)


def write_cache(ck_BxKxSxH: Array, cv_BxKxSxH: Array, k_BxTxKxH: Array, v_BxTxKxH: Array,
                slot: Array | int) -> tuple[Array, Array]:
  """The caches with this call's T keys and values in slots [slot, slot + T) of every row (in place)."""
  start = (0, 0, slot, 0)
  ck_BxKxSxH = jax.lax.dynamic_update_slice(ck_BxKxSxH, k_BxTxKxH.transpose(0, 2, 1, 3).astype(ck_BxKxSxH.dtype),
                                            start)
  cv_BxKxSxH = jax.lax.dynamic_update_slice(cv_BxKxSxH, v_BxTxKxH.transpose(0, 2, 1, 3).astype(cv_BxKxSxH.dtype),
                                            start)
  return ck_BxKxSxH, cv_BxKxSxH


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

  def qkv(self, x_BxTxD: Array, positions_BxT: Array) -> tuple[Array, Array, Array]:
    """q [B, T, K, G, H], k and v [B, T, K, H] of the normed x, q and k rotated by their positions."""
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
    return q_BxTxNxH.reshape(b, t, cfg.num_kv_heads, cfg.num_groups, cfg.head_dim), k_BxTxKxH, v_BxTxKxH

  def out(self, o_BxTxNxH: Array) -> Array:
    """The output projection [B, T, D] of the heads' outputs."""
    return jnp.einsum("btnh,nhd->btd", o_BxTxNxH, self.o_kernel[...].astype(self.cfg.compute_jnp_dtype))

  def __call__(self, x_BxTxD: Array, positions_BxT: Array, attn_mask_BxT: Array | None,
               cache_kv: tuple[Array, Array, Array, Array | None] | None = None
               ) -> tuple[Array, tuple[Array, Array] | None]:
    """attention(x) [B, T, D] for the normed x, and the updated (k, v) cache or None. cache_kv: (k cache,
    v cache, slot, cache_mask_BxS) (see the module docstring)."""
    cfg = self.cfg
    b, t, _ = x_BxTxD.shape
    q_BxTxKxGxH, k_BxTxKxH, v_BxTxKxH = self.qkv(x_BxTxD, positions_BxT)
    new_kv = None
    if cache_kv is not None:
      ck_BxKxSxH, cv_BxKxSxH, slot, cache_mask_BxS = cache_kv
      new_kv = write_cache(ck_BxKxSxH, cv_BxKxSxH, k_BxTxKxH, v_BxTxKxH, slot)
    if cache_kv is not None and t == 1:
      if cache_mask_BxS is None:
        raise ValueError("a decode step (T == 1 with a cache) needs cache_mask_BxS")
      o_BxTxKxGxH = decode_attend(q_BxTxKxGxH[:, 0], new_kv[0], new_kv[1], cache_mask_BxS, cfg.fp32_upcast)[:, None]
    else:
      o_BxTxKxGxH = self._self_attend(q_BxTxKxGxH, k_BxTxKxH, v_BxTxKxH, positions_BxT, attn_mask_BxT)
    return self.out(o_BxTxKxGxH.reshape(b, t, cfg.num_heads, cfg.head_dim)), new_kv

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

  def front(self, x_BxTxD: Array) -> Array:
    """silu(x W_gate) * (x W_up) [B, T, F] of the normed x, in the compute dtype."""
    dt = self.cfg.compute_jnp_dtype
    wg, wu = (k[...].astype(dt) for k in (self.gate_kernel, self.up_kernel))
    x = x_BxTxD.astype(dt)
    return jax.nn.silu(jnp.einsum("btd,df->btf", x, wg)) * jnp.einsum("btd,df->btf", x, wu)

  def down(self, h_BxTxF: Array) -> Array:
    return jnp.einsum("btf,fd->btd", h_BxTxF, self.down_kernel[...].astype(self.cfg.compute_jnp_dtype))

  def __call__(self, x_BxTxD: Array) -> Array:
    """The MLP of the normed x."""
    return self.down(self.front(x_BxTxD))


class DecoderLayer(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.input_norm = RMSNorm(cfg, rngs=rngs)
    self.attn = Attention(cfg, rngs=rngs)
    self.post_attn_norm = RMSNorm(cfg, rngs=rngs)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, h_BxTxD, positions_BxT, attn_mask_BxT, cache_kv=None):
    a_BxTxD, new_kv = self.attn(self.input_norm(h_BxTxD), positions_BxT, attn_mask_BxT, cache_kv)
    h_BxTxD = h_BxTxD + a_BxTxD
    h_BxTxD = h_BxTxD + self.mlp(self.post_attn_norm(h_BxTxD))
    return h_BxTxD, new_kv


class Embed(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.embedding = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), cfg.param_jnp_dtype,
                            "normal")


class LMHead(nnx.Module):
  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.kernel = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), cfg.param_jnp_dtype,
                         "normal")


def _layer_apply(layer: DecoderLayer, h_BxTxD, positions_BxT, attn_mask_BxT):
  return layer(h_BxTxD, positions_BxT, attn_mask_BxT)[0]


_REMAT_POLICIES = {
    "full": None,  # save nothing inside the layer; recompute it all in the backward pass
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # also keep projection outputs
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

  def embed_tokens(self, tokens_BxT: Array) -> Array:
    return jnp.take(self.embed.embedding[...], tokens_BxT, axis=0).astype(self.cfg.compute_jnp_dtype)

  def hidden(self, tokens_BxT: Array, positions_BxT: Array, attn_mask_BxT: Array | None = None,
             cache: KVCache | None = None, cache_slot: Array | int = 0, cache_mask_BxS: Array | None = None, *,
             scan: bool = False, between_layers: Callable[[Array], Array] | None = None
             ) -> tuple[Array, KVCache | None]:
    """Final-normed hidden states [B, T, D] in compute dtype and the updated cache (None without a cache).

    Without a cache: causal + padding mask, each layer rematerialised per cfg.remat, in a scan with `scan`.
    With a cache: a prefill (T > 1) or one decode step (T == 1); see the module docstring.
    """
    h_BxTxD = self.embed_tokens(tokens_BxT)
    if cache is not None:
      if scan:
        raise ValueError("scan=True runs without a cache")
      slot = jnp.asarray(cache_slot, jnp.int32)
      new_k, new_v = [], []
      for i, layer in enumerate(self.layers):
        h_BxTxD, (k, v) = layer(h_BxTxD, positions_BxT, attn_mask_BxT, (cache.k[i], cache.v[i], slot,
                                                                         cache_mask_BxS))
        new_k.append(k)
        new_v.append(v)
      return self.final_norm(h_BxTxD), KVCache(k=new_k, v=new_v)
    if scan:
      return self.final_norm(self._scanned_layers(h_BxTxD, positions_BxT, attn_mask_BxT, between_layers)), None
    apply = _layer_apply
    if self.cfg.remat != "none":
      apply = nnx.remat(_layer_apply, policy=_REMAT_POLICIES[self.cfg.remat])
    for layer in self.layers:
      h_BxTxD = apply(layer, h_BxTxD, positions_BxT, attn_mask_BxT)
    return self.final_norm(h_BxTxD), None

  def _scanned_layers(self, h_BxTxD, positions_BxT, attn_mask_BxT, between_layers):
    """The decoder layers in a lax.scan over their parameters stacked inside the step (one extra copy of the
    layer parameters, sharded like them), each layer's body checkpointed per cfg.remat."""
    layer_def = nnx.graphdef(self.layers[0])
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(layer) for layer in self.layers])

    def body(h, layer_state):
      h = nnx.merge(layer_def, layer_state)(h, positions_BxT, attn_mask_BxT)[0]
      return (h if between_layers is None else between_layers(h)), None

    if self.cfg.remat != "none":
      body = jax.checkpoint(body, policy=_REMAT_POLICIES[self.cfg.remat])
    return jax.lax.scan(body, h_BxTxD, stacked)[0]

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
    h_BxTxD, cache = self.hidden(tokens_BxT, positions_BxT, attn_mask_BxT, cache, cache_slot, cache_mask_BxS)
    return self.logits(h_BxTxD), cache
