"""Qwen2.hidden with the decoder layers run by jax.lax.scan (a learner-side stopgap; see why below).

policy/model.py applies its per-layer remat inside an unrolled Python loop over layers. Under XLA the
recomputation of unrolled checkpointed layers gets scheduled early, so every layer's activations are live at
once and remat saves almost nothing (measured on the CPU backend: tiny model, 8 layers, 256 tokens: 141 MiB
of temporaries with remat 'full' vs 147 MiB without; the GPU latency-hiding scheduler shows the same,
jax-ml/jax#20763). With the layers in a scan over stacked parameters the loop body is checkpointed once and the
backward pass recomputes one layer at a time; compile time also stops growing with depth.

Until the model stores its layers stacked (then this module goes away), `scanned_hidden` stacks the per-layer
parameter states inside the step (one extra copy of the layer parameters, sharded like them) and scans the
model's own DecoderLayer over them; the result is identical to `model.hidden` (tests/test_learner_memory.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from kevin_jax import sharding

_POLICIES = {
    "full": None,  # Save only each layer's input.
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # Also keep projection outputs.
}


def scanned_hidden(model, tokens_BxT: jax.Array, positions_BxT: jax.Array, attn_mask_BxT: jax.Array | None,
                   mesh: Mesh | None = None) -> jax.Array:
  """Same contract as Qwen2.hidden: final-normed hidden states [B, T, D] in compute dtype.

  With a mesh, the residual stream between layers is constrained to the batch sharding (FSDP: weights are
  gathered to the activations, never the reverse).
  """
  cfg = model.cfg
  h_BxTxD = jnp.take(model.embed.embedding[...], tokens_BxT, axis=0).astype(cfg.compute_jnp_dtype)
  layer_def = nnx.graphdef(model.layers[0])
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(layer) for layer in model.layers])

  def body(h, layer_state):
    layer = nnx.merge(layer_def, layer_state)
    h = layer(h, positions_BxT, attn_mask_BxT, None)[0]
    if mesh is not None:
      h = sharding.constrain(h, mesh, "batch", "seq", "act_embed")
    return h, None

  if cfg.remat != "none":
    body = jax.checkpoint(body, policy=_POLICIES[cfg.remat])
  h_BxTxD, _ = jax.lax.scan(body, h_BxTxD, stacked)
  return model.final_norm(h_BxTxD)
