"""The decode step's attention front alone, XLA against the fused Pallas kernel (policy/decode_qkv.py): the layer's
input RMSNorm (XLA's fusion in every version), the q/k/v projection with biases, RoPE of q and k, the k/v cache
write at one slot, and q padded to decode_attention's 16 rows per KV head.

  JAX_PLATFORMS=cuda,cpu python3 experiments/bench_decode_qkv.py --out $OUT/decode_qkv

XLA's version is the model's own path (policy/model.py RMSNorm and Attention: einsums, bias, apply_rope, two
dynamic_update_slices) plus the pad that decode_attention adds. Each timed program runs `--layers` weight and cache
sets in turn (more weight bytes than the L2 cache, as in a real decode step), `--reps` times in a jitted
fori_loop that carries the caches (so an extra copy of a cache would show as a large time), and reports
microseconds per layer and the weights' bytes over that time. Versions alternate within each round, so drift
shows. Also checks q and the written cache slots of each Pallas version against XLA's. Writes results.json and
prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from experiments.bench_decode_mlp import (  # pylint: disable=wrong-import-position
    add_round_args, print_table, run_rounds)
from kevin_jax.policy import get_preset  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode_attention import padded_rows  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode_qkv import qkv_rope_cache  # pylint: disable=wrong-import-position
from kevin_jax.policy.model import apply_rope, rope_cos_sin  # pylint: disable=wrong-import-position

PRESETS = {"0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "small": "small"}


def xla_norm(x, norm, eps=1e-6):
  """The model's RMSNorm of x [B, D] (fp32 inside), in x's dtype."""
  xf = x.astype(jnp.float32)
  return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=1, keepdims=True) + eps) * norm.astype(jnp.float32)[None]
          ).astype(x.dtype)


def xla_front(x, wq, wk, wv, bq, bk, bv, cos, sin, kc, vc, slot, norm):
  """The model's XLA path for one decode step: returns (q [B, K, G_pad, H], k cache, v cache)."""
  b = x.shape[0]
  x = xla_norm(x, norm).astype(wq.dtype)
  kh, h = wk.shape[1], wk.shape[2]
  q = jnp.einsum("bd,dnh->bnh", x, wq) + bq[None]
  k = jnp.einsum("bd,dkh->bkh", x, wk) + bk[None]
  v = jnp.einsum("bd,dkh->bkh", x, wv) + bv[None]
  q = apply_rope(q[:, None], cos[:, None], sin[:, None], True)[:, 0]
  k = apply_rope(k[:, None], cos[:, None], sin[:, None], True)[:, 0]
  kc = jax.lax.dynamic_update_slice(kc, k[:, :, None].astype(kc.dtype), (0, 0, slot, 0))
  vc = jax.lax.dynamic_update_slice(vc, v[:, :, None].astype(vc.dtype), (0, 0, slot, 0))
  g = q.shape[1] // kh
  q = jnp.pad(q.reshape(b, kh, g, h), ((0, 0), (0, 0), (0, padded_rows(g) - g), (0, 0)))
  return q, kc, vc


def _versions(configs: str, interpret: bool) -> dict:
  versions = {"xla": xla_front}
  for c in configs.split(","):
    bm, bw, nw, ns, *bd = (int(v) for v in c.split("x"))  # an optional fifth field: block_d
    # XLA's norm (one fusion), then the kernel, as the model calls it.
    versions[f"pallas {c}"] = (lambda x, *args, bm=bm, bw=bw, nw=nw, ns=ns, bd=bd: qkv_rope_cache(
        xla_norm(x, args[-1]), *args[:-1], block_m=bm, block_w=bw, num_warps=nw, num_stages=ns,
        interpret=interpret, **({"block_d": bd[0]} if bd else {})))
  return versions


def time_layers(fn, x, weights, cos, sin, caches, reps: int) -> float:
  """Microseconds per layer: `reps` passes over all layers, each writing slot (rep mod S) of its caches; each
  layer's input depends on the previous layer's q."""
  def one_pass(i, carry):
    x0, kcs, vcs = carry
    kcs, vcs = list(kcs), list(vcs)
    slot = i % kcs[0].shape[2]
    for layer, w in enumerate(zip(*weights)):
      q, kcs[layer], vcs[layer] = fn(x0, *w[:6], cos, sin, kcs[layer], vcs[layer], slot, w[6])
      x0 = x0 + (q[:, 0, 0, :1] * 1e-3).astype(x0.dtype)
    return x0, tuple(kcs), tuple(vcs)

  # The caches are donated (updated in place, as in the sampler); x is not (every version starts from it).
  loop = jax.jit(lambda x0, kcs, vcs: jax.lax.fori_loop(0, reps, one_pass, (x0, kcs, vcs)), donate_argnums=(1, 2))
  _, *caches = loop(x, *caches)
  jax.block_until_ready(caches)
  t = time.perf_counter()
  jax.block_until_ready(loop(x, *caches))
  return (time.perf_counter() - t) / (reps * len(weights[0])) * 1e6


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=os.environ.get("OUT", "runs") + "/decode_qkv")
  ap.add_argument("--shapes", default="0.5b,1.5b")
  ap.add_argument("--batches", default="64")
  ap.add_argument("--slots", type=int, default=2048, help="cache slots per row")
  ap.add_argument("--layers", type=int, default=24, help="weight and cache sets per pass (24: the 0.5B model)")
  ap.add_argument("--reps", type=int, default=50)
  ap.add_argument("--same-weights", action="store_true", help="every layer reads the first layer's weights (not its "
                  "cache), which stay in the L2 cache: the time with the weights prefetched into L2")
  ap.add_argument("--configs", default="64x16x4x5,64x16x4x3,32x16x4x3,16x16x4x3,64x32x4x3,64x16x2x3",
                  help="Pallas versions: block_m x block_w x num_warps x num_stages [x block_d], comma-separated (the "
                  "first: the default)")
  add_round_args(ap)
  a = ap.parse_args(argv)
  os.makedirs(a.out, exist_ok=True)
  rows = []
  for shape in a.shapes.split(","):
    cfg = get_preset(PRESETS[shape])
    d, n, kh, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    rng = np.random.default_rng(0)
    arr = lambda *s, scale=1.0: jnp.asarray(rng.standard_normal(s, np.float32) * scale, jnp.bfloat16)
    weights = tuple([arr(*s, scale=sc) for _ in range(a.layers)]
                    for s, sc in (((d, n, h), d ** -0.5), ((d, kh, h), d ** -0.5), ((d, kh, h), d ** -0.5),
                                  ((n, h), 1.0), ((kh, h), 1.0), ((kh, h), 1.0), ((d,), 0.1)))
    if a.same_weights:
      weights = tuple([w[0]] * a.layers for w in weights)
    weight_bytes = sum(w[0].size for w in weights[:3]) * 2
    for b in (int(s) for s in a.batches.split(",")):
      x = arr(b, d)
      cos, sin = (t[:, 0] for t in rope_cos_sin(jnp.asarray(rng.integers(0, 3000, (b, 1))), h, cfg.rope_theta))
      versions = _versions(a.configs, a.interpret)
      first = [w[0] for w in weights]
      cache0 = arr(b, kh, a.slots, h)
      w6, norm = first[:6], first[6] + 1  # norm scales around 1
      want = [np.asarray(t, np.float32) for t in jax.jit(xla_front)(x, *w6, cos, sin, cache0, cache0, 5, norm)]

      def max_rel_diff(fn, x=x, w6=w6, cos=cos, sin=sin, cache0=cache0, norm=norm, want=want):
        got = [np.asarray(t, np.float32) for t in jax.jit(fn)(x, *w6, cos, sin, cache0, cache0, 5, norm)]
        scale = max(np.max(np.abs(w)) for w in want)
        return float(max(np.max(np.abs(g - w)) for g, w in zip(got, want)) / scale)

      def time_us(fn, b=b, x=x, cos=cos, sin=sin):
        caches = [tuple(jnp.zeros((b, kh, a.slots, h), jnp.bfloat16) for _ in range(a.layers)) for _ in "kv"]
        return time_layers(fn, x, weights, cos, sin, caches, a.reps)

      run_rounds(rows, {"shape": shape, "batch": b}, versions, a.rounds, max_rel_diff, time_us, weight_bytes)
  res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "layers": a.layers, "reps": a.reps,
         "slots": a.slots, "same_weights": a.same_weights, "rows": rows}
  with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as fh:
    json.dump(res, fh, indent=1)
  print_table(rows, ("shape", "batch"))


if __name__ == "__main__":
  main()
