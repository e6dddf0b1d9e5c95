"""The decode step's LM head and draw alone: XLA (the head's GEMM writing fp32 logits, then sampler.sample_logits)
against the one Pallas kernel of policy/decode_head.py (SamplerConfig.decode_head) for several block shapes.

  JAX_PLATFORMS=cuda,cpu python3 experiments/bench_decode_head.py --out $OUT/decode_head

The sampler's case: temperature 0.9, no top-k / top-p, fp32 logits, the tied [V, D] embedding as the head (the
0.5B shape's 272 MB, more than the L2 cache, so every call reads it from memory). Each timed program runs `--reps`
calls in a jitted fori_loop, each call's hidden states depending on the previous call's log-probs; it reports
microseconds per call and the head's bytes over that time. Versions alternate within each round, so drift shows;
round 0 also compares each version's greedy raw log-probs with XLA's (max |diff| over max |XLA|). Writes
results.json and prints a table.

A Pallas config is block_n x block_d x num_warps x num_stages (the first: the kernel's defaults); `pallas greedy`
and `xla greedy` time the first config and XLA drawing greedily (the draw's arithmetic left out). A `stats` config
(block_m x block_n x num_warps) times XLA's GEMM writing the logits + logits_stats reading them once
(decode_head.sample with fuse_gemm off).
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

from experiments.bench_decode_mlp import add_round_args, print_table, run_rounds  # pylint: disable=wrong-import-position
from kevin_jax.policy import decode_head  # pylint: disable=wrong-import-position
from kevin_jax.policy.sampler import sample_logits  # pylint: disable=wrong-import-position

SHAPES = {"0.5b": (896, 151936), "1.5b": (1536, 151936), "small": (256, 4096)}


def _versions(configs: str, stats_configs: str, interpret: bool) -> dict:
  """name -> fn(h, w, keys, temperature, greedy) -> (token, raw logprob, sampling logprob)."""

  def xla(h, w, keys, t, greedy):
    return sample_logits(decode_head.head_logits(h, w, True), keys, t, jnp.float32(1.0), top_k=0, greedy=greedy, use_top_p=False,
                         valid_vocab=w.shape[0])

  versions = {"xla": xla}
  for c in configs.split(","):
    bn, bd, nw, ns = (int(v) for v in c.split("x"))

    def pallas(h, w, keys, t, greedy, bn=bn, bd=bd, nw=nw, ns=ns):
      stats = decode_head.head_stats(h, w, keys, t, head_vd=True, greedy=greedy, valid_vocab=w.shape[0],
                                     block_n=bn, block_d=bd, num_warps=nw, num_stages=ns, interpret=interpret)
      return decode_head.finish(stats, h.shape[0], t, greedy)

    versions[f"pallas {c}"] = pallas
  for c in filter(None, stats_configs.split(",")):
    bm, bn, nw = (int(v) for v in c.split("x"))

    def stats(h, w, keys, t, greedy, bm=bm, bn=bn, nw=nw):
      st = decode_head.logits_stats(decode_head.head_logits(h, w, True), keys, t, greedy=greedy, valid_vocab=w.shape[0], block_m=bm, block_n=bn,
                                    num_warps=nw, interpret=interpret)
      return decode_head.finish(st, h.shape[0], t, greedy)

    versions[f"stats {c}"] = stats
  first = versions[f"pallas {configs.split(',')[0]}"]
  # The first config drawing greedily (no Gumbel noise, no second exp): what the draw's arithmetic costs.
  versions["pallas greedy"] = lambda h, w, keys, t, greedy: first(h, w, keys, t, True)
  xla_greedy = versions["xla"]
  versions["xla greedy"] = lambda h, w, keys, t, greedy: xla_greedy(h, w, keys, t, True)
  return versions


def time_calls(fn, h, w, keys, reps: int) -> float:
  """Microseconds per call over `reps` sampling calls in one jitted loop (h += 1e-3 x the raw log-probs)."""
  t = jnp.float32(0.9)

  def body(_, hi):
    _, raw, _ = fn(hi, w, keys, t, False)
    return hi + (raw[:, None] * 1e-3).astype(hi.dtype)

  loop = jax.jit(lambda h0, w_: jax.lax.fori_loop(0, reps, body, h0))
  loop(h, w).block_until_ready()
  start = time.perf_counter()
  loop(h, w).block_until_ready()
  return (time.perf_counter() - start) / reps * 1e6


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=os.environ.get("OUT", "runs") + "/decode_head")
  ap.add_argument("--shapes", default="0.5b")
  ap.add_argument("--batches", default="64")
  ap.add_argument("--reps", type=int, default=50)
  ap.add_argument("--configs", default="32x128x4x3,32x128x8x3,32x128x4x4,64x128x8x3,16x128x4x3",
                  help="Pallas versions: block_n x block_d x num_warps x num_stages, comma-separated")
  ap.add_argument("--stats-configs", default="32x128x4,16x128x4,64x128x8,32x128x8",
                  help="XLA's GEMM + logits_stats versions: block_m x block_n x num_warps, comma-separated")
  add_round_args(ap)
  a = ap.parse_args(argv)
  os.makedirs(a.out, exist_ok=True)
  rows = []
  for shape in a.shapes.split(","):
    d, v = SHAPES[shape]
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((v, d), np.float32) * 2.0 * d ** -0.5, jnp.bfloat16)
    for b in (int(s) for s in a.batches.split(",")):
      h = jnp.asarray(rng.standard_normal((b, d), np.float32), jnp.bfloat16)
      keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(0), i))(jnp.arange(b))
      versions = _versions(a.configs, a.stats_configs, a.interpret)
      want = np.asarray(jax.jit(lambda *x: versions["xla"](*x, True)[1])(h, w, keys, jnp.float32(1.0)))

      def max_rel_diff(fn, h=h, keys=keys, want=want):
        got = np.asarray(jax.jit(lambda *x: fn(*x, True)[1])(h, w, keys, jnp.float32(1.0)))
        return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))

      run_rounds(rows, {"shape": shape, "batch": b}, versions, a.rounds, max_rel_diff,
                 lambda fn, h=h, keys=keys: time_calls(fn, h, w, keys, a.reps), w.size * 2)
  res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "reps": a.reps, "rows": rows}
  with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as fh:
    json.dump(res, fh, indent=1)
  print_table(rows, ("shape", "batch"))


if __name__ == "__main__":
  main()
