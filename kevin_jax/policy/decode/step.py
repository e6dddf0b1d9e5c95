"""The sampler's one-token decode step, built from a DecodePlan on a folded copy of the model's weights.

  step = make_step(model, plan)          # inside the jitted decode function, once before its loop
  h_Bx1xD, cache = step(tokens_Bx1, positions_Bx1, cache, slot, visible)   # visible: attention.SlotRanges

Each layer is the reference model's layer (policy/model.py) with the parts the plan names run as Pallas kernels:
q/k/v + RoPE + cache write (qkv.py), attention over the visible slots (attention.py), o projection + residual
(oproj.py), SwiGLU front and split down projection (mlp.py). Where the plan's norm is 'fold' or 'inside', the
q/k/v and SwiGLU kernels take the raw residual and multiply their products by 1/rms, the norm's scale folded into
a copy of their weights (`fold`: one rounding to the parameter dtype, as a model stored folded would be). The
copy is made once per decode call, before the loop (folding inside each step, XLA re-reads and re-writes the
weights every step: BENCHMARKS.md Sampler), for the kernels that run only; the model itself is never changed.
A plan with no kernel (`plan.reference`, e.g. every 'auto' on the CPU) runs the reference model's step itself.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from kevin_jax.policy.decode import attention as attention_lib
from kevin_jax.policy.decode import mlp as mlp_lib
from kevin_jax.policy.decode import oproj
from kevin_jax.policy.decode import qkv as qkv_lib
from kevin_jax.policy.decode.attention import SlotRanges
from kevin_jax.policy.decode.plan import DecodePlan
from kevin_jax.policy.model import KVCache, Qwen2, RMSNorm, decode_attend, rope_cos_sin, write_cache

Array = jax.Array


def inv_rms(norm: RMSNorm, x_BxD: Array) -> Array:
  """fp32 [B]: 1 / sqrt(mean(x^2) + eps) per row, the norm without its scale (norm 'fold')."""
  x = x_BxD.astype(jnp.float32)
  return jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1) + norm.eps)


def fold(norm: RMSNorm, w_DxN: Array) -> Array:
  """w [D, ...] with the norm's scale folded into its input dimension, rounded once to w's dtype:
  norm(x) @ w == inv_rms(x) * (x @ fold(w)) up to that rounding."""
  scale = norm.scale[...].astype(jnp.float32).reshape((-1,) + (1,) * (w_DxN.ndim - 1))
  return (scale * w_DxN.astype(jnp.float32)).astype(w_DxN.dtype)


def fold_weights(model: Qwen2, plan: DecodePlan) -> list[dict[str, Array]]:
  """Per layer, the folded copies of the weights whose kernel applies its norm (plan.folds): 'q', 'k', 'v' and
  'gate', 'up', in the parameter dtype."""
  out = []
  for layer in model.layers:
    w = {}
    if plan.folds("qkv"):
      attn = layer.attn
      w.update(q=fold(layer.input_norm, attn.q_kernel[...]), k=fold(layer.input_norm, attn.k_kernel[...]),
               v=fold(layer.input_norm, attn.v_kernel[...]))
    if plan.folds("mlp"):
      w.update(gate=fold(layer.post_attn_norm, layer.mlp.gate_kernel[...]),
               up=fold(layer.post_attn_norm, layer.mlp.up_kernel[...]))
    out.append(w)
  return out


def _norm_args(plan: DecodePlan, norm: RMSNorm, x_BxD: Array) -> tuple[Array | None, float | None]:
  """A kernel's (inv_rms_B, rms_eps) when it applies `norm`: 'fold' -> XLA's 1/rms; 'inside' -> the eps."""
  return (inv_rms(norm, x_BxD), None) if plan.norm == "fold" else (None, norm.eps)


def _attend(plan: DecodePlan, model: Qwen2, q: Array, ck: Array, cv: Array, visible: SlotRanges, groups: int = 0,
            padded: bool = False) -> Array:
  """Decode attention [B, K, G, H] (or, one split with `padded`, [B, K, G_pad, H]: callers check the shape).
  groups > 0: q in the q/k/v kernel's padded layout with that many real rows per KV head."""
  if plan.attention != "xla":
    return attention_lib.decode_attention(q, ck, cv, visible, num_splits=plan.attention_splits, groups=groups,
                                          padded=padded and groups > 0, interpret=plan.attention == "interpret")
  if groups:
    q = q[:, :, :groups]
  return decode_attend(q, ck, cv, visible.mask(ck.shape[2]), model.cfg.fp32_upcast)


def _attention(plan, model, layer, w, h_Bx1xD, positions_Bx1, ck, cv, slot, visible):
  """h + attention(input_norm(h)) and the updated caches."""
  cfg, attn = model.cfg, layer.attn
  dt = cfg.compute_jnp_dtype
  b = h_Bx1xD.shape[0]
  if plan.qkv == "xla":
    q_Bx1xKxGxH, k_Bx1xKxH, v_Bx1xKxH = attn.qkv(layer.input_norm(h_Bx1xD), positions_Bx1)
    ck, cv = write_cache(ck, cv, k_Bx1xKxH, v_Bx1xKxH, slot)
    o = _attend(plan, model, q_Bx1xKxGxH[:, 0], ck, cv, visible)
  else:
    if plan.norm != "xla":  # the kernel applies the norm: the raw residual, the folded weights
      x_BxD, weights = h_Bx1xD[:, 0], [w[n].astype(dt) for n in ("q", "k", "v")]
      norm_args = _norm_args(plan, layer.input_norm, x_BxD)
    else:
      x_BxD = layer.input_norm(h_Bx1xD)[:, 0]
      weights, norm_args = [p[...].astype(dt) for p in (attn.q_kernel, attn.k_kernel, attn.v_kernel)], (None, None)
    biases = [p[...].astype(dt) for p in (attn.q_bias, attn.k_bias, attn.v_bias)]
    cos, sin = rope_cos_sin(positions_Bx1, cfg.head_dim, cfg.rope_theta)
    pf = {}
    if plan.prefetch_blocks:
      pf = dict(prefetch_ranges=visible, prefetch_splits=plan.attention_splits, prefetch_blocks=plan.prefetch_blocks)
    q, ck, cv = qkv_lib.qkv_rope_cache(x_BxD.astype(dt), *weights, *biases, cos[:, 0], sin[:, 0], ck, cv, slot,
                                       norm_args[0], rms_eps=norm_args[1], interpret=plan.qkv == "interpret", **pf)
    o = _attend(plan, model, q, ck, cv, visible, groups=cfg.num_groups, padded=plan.out != "xla")
  w_o = attn.o_kernel[...].astype(dt)
  if plan.out != "xla":
    groups = cfg.num_groups if o.shape[2] != cfg.num_groups else 0  # the one-split attention's padded rows
    o = o if groups else o.reshape(b, cfg.num_heads, cfg.head_dim)
    h_BxD = oproj.out_proj_residual(o, w_o, h_Bx1xD[:, 0], groups=groups, interpret=plan.out == "interpret")
    return h_BxD[:, None], ck, cv
  return h_Bx1xD + jnp.einsum("btnh,nhd->btd", o.reshape(b, 1, cfg.num_heads, cfg.head_dim), w_o), ck, cv


def _mlp(plan, model, layer, w, h_Bx1xD):
  """mlp(post_attn_norm(h)) [B, 1, D]."""
  dt = model.cfg.compute_jnp_dtype
  mlp, norm = layer.mlp, layer.post_attn_norm
  if plan.mlp == "xla":
    f_Bx1xF = mlp.front(norm(h_Bx1xD))
  elif plan.norm != "xla":  # the kernel applies the norm: the raw residual, the folded weights
    x_BxD = h_Bx1xD[:, 0]
    r, eps = _norm_args(plan, norm, x_BxD)
    f_Bx1xF = mlp_lib.swiglu_front(x_BxD.astype(dt), w["gate"].astype(dt), w["up"].astype(dt), r, rms_eps=eps,
                                   interpret=plan.mlp == "interpret")[:, None]
  else:
    wg, wu = (k[...].astype(dt) for k in (mlp.gate_kernel, mlp.up_kernel))
    f_Bx1xF = mlp_lib.swiglu_front(norm(h_Bx1xD)[:, 0].astype(dt), wg, wu,
                                   interpret=plan.mlp == "interpret")[:, None]
  if plan.down == "xla":
    return mlp.down(f_Bx1xF)
  return mlp_lib.down_proj(f_Bx1xF[:, 0], mlp.down_kernel[...].astype(dt), splits=plan.down_splits or None,
                           interpret=plan.down == "interpret")[:, None]


def make_step(model: Qwen2, plan: DecodePlan) -> Callable[..., tuple[Array, KVCache]]:
  """step(tokens_Bx1, positions_Bx1, cache, slot, visible) -> (final-normed h [B, 1, D], the updated cache): one
  decode step by `plan`, with the weights folded now (call it once, outside the decode loop)."""
  if plan.reference:
    def reference_step(tokens_Bx1, positions_Bx1, cache, slot, visible: SlotRanges):
      return model.hidden(tokens_Bx1, positions_Bx1, None, cache, slot, visible.mask(cache.length))

    return reference_step
  folded = fold_weights(model, plan)

  def step(tokens_Bx1: Array, positions_Bx1: Array, cache: KVCache, slot: Any, visible: SlotRanges):
    h_Bx1xD = model.embed_tokens(tokens_Bx1)
    slot = jnp.asarray(slot, jnp.int32)
    new_k, new_v = [], []
    for i, layer in enumerate(model.layers):
      h_Bx1xD, k, v = _attention(plan, model, layer, folded[i], h_Bx1xD, positions_Bx1, cache.k[i], cache.v[i],
                                 slot, visible)
      h_Bx1xD = h_Bx1xD + _mlp(plan, model, layer, folded[i], h_Bx1xD)
      new_k.append(k)
      new_v.append(v)
    return model.final_norm(h_Bx1xD), KVCache(k=new_k, v=new_v)

  return step
