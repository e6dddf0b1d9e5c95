"""Per-token log-probs (and entropies) of a token sequence under the policy, in sequence chunks.

Alignment: logps_BxT[:, t] = log softmax(logits[:, t-1] / temperature)[tokens[:, t]], i.e. the log-prob of
tokens[t] given tokens[<t]; position 0 has no prediction and gets 0. Log-probs are of the *sampling*
distribution softmax(logits / temperature), the same quantity the sampler reports for the tokens it drew.

Memory: the full fp32 [B, T, V] logits (V = 152k: 0.6 MB per token) never exist. The final hidden states
[B, T, D] are cut into chunks of `chunk` positions; each chunk's logits [B, chunk, V] are built, reduced to
log-probs and dropped, and rebuilt in the backward pass (jax.checkpoint), so peak logits memory is one chunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from kevin_jax import sharding


def token_logps(model, tokens_BxT: jax.Array, attn_mask_BxT: jax.Array, *, chunk: int,
                temperature: float = 1.0, mesh: Mesh | None = None, with_entropy: bool = True,
                scan_layers: bool = False) -> tuple[jax.Array, jax.Array | None]:
  """Log-probs of tokens[t] given tokens[<t] (and the policy's entropy at that prediction).

  Args:
    model: a Qwen2 (policy/model.py): `hidden(tokens, positions, attn_mask)` and `logits(h)`.
    tokens_BxT: int token ids, right-padded.
    attn_mask_BxT: 1 for real tokens, 0 for padding.
    chunk: sequence positions per logits chunk.
    temperature: the sampling temperature (logits are divided by it).
    mesh: when given, activations are constrained to the batch sharding of kevin_jax/sharding.py.
    with_entropy: also return the entropy H(softmax(logits[t-1] / temperature)) (a metric; no gradient).
    scan_layers: run the decoder layers in a lax.scan (Qwen2.hidden's scan) instead of an unrolled loop.
  Returns:
    (logps_BxT, entropy_BxT or None), float32, 0 at position 0.
  """
  b, t = tokens_BxT.shape
  positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
  # With a mesh, the residual stream between scanned layers keeps the batch sharding (FSDP: weights are gathered
  # to the activations, never the reverse).
  between = None if mesh is None else (lambda h: sharding.constrain(h, mesh, "batch", "seq", "act_embed"))
  h_BxTxD = model.hidden(tokens_BxT, positions_BxT, attn_mask_BxT, scan=scan_layers, between_layers=between)[0]
  if mesh is not None:
    h_BxTxD = sharding.constrain(h_BxTxD, mesh, "batch", "seq", "act_embed")
  n = t - 1  # Predictions: h[:, i] predicts tokens[:, i + 1].
  if n <= 0:
    zeros = jnp.zeros((b, t), jnp.float32)
    return zeros, (zeros if with_entropy else None)
  c = min(chunk, n)
  num_chunks = -(-n // c)
  pad = num_chunks * c - n
  h_BxNxD = jnp.pad(h_BxTxD[:, :n], ((0, 0), (0, pad), (0, 0)))
  tgt_BxN = jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, pad)))
  # Chunk-major so the scan slices (and, backward, stacks) chunks without dynamic-update-slices.
  h_CxBxcxD = h_BxNxD.reshape(b, num_chunks, c, -1).swapaxes(0, 1)
  tgt_CxBxc = tgt_BxN.reshape(b, num_chunks, c).swapaxes(0, 1)
  inv_temp = 1.0 / temperature

  @jax.checkpoint
  def one_chunk(h_BxcxD, tgt_Bxc):
    logits_BxcxV = model.logits(h_BxcxD).astype(jnp.float32) * inv_temp
    if mesh is not None:
      logits_BxcxV = sharding.constrain(logits_BxcxV, mesh, "batch", "seq", "act_vocab")
    lse_Bxc = jax.nn.logsumexp(logits_BxcxV, axis=-1)
    tgt_logit_Bxc = jnp.take_along_axis(logits_BxcxV, tgt_Bxc[..., None], axis=-1)[..., 0]
    logp_Bxc = tgt_logit_Bxc - lse_Bxc
    if not with_entropy:
      return logp_Bxc, None
    sg = jax.lax.stop_gradient(logits_BxcxV)
    p_BxcxV = jnp.exp(sg - jax.lax.stop_gradient(lse_Bxc)[..., None])
    ent_Bxc = jax.lax.stop_gradient(lse_Bxc) - jnp.sum(p_BxcxV * sg, axis=-1)
    return logp_Bxc, ent_Bxc

  def body(carry, xs):
    return carry, one_chunk(*xs)

  _, (logp_CxBxc, ent_CxBxc) = jax.lax.scan(body, None, (h_CxBxcxD, tgt_CxBxc))

  def unchunk(x_CxBxc):
    x_BxN = x_CxBxc.swapaxes(0, 1).reshape(b, num_chunks * c)[:, :n]
    return jnp.pad(x_BxN, ((0, 0), (1, 0)))  # Position 0 predicts nothing.

  return unchunk(logp_CxBxc), (unchunk(ent_CxBxc) if with_entropy else None)
