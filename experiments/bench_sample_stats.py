"""The decode step's sampling work over the logits alone: sample_logits with the chunks' statistics from XLA (three
passes over the [B, V] fp32 logits) against the Pallas pass of policy/sample_stats.py, by block shape.

  JAX_PLATFORMS=cuda,cpu python3 experiments/bench_sample_stats.py --out $OUT/sample_stats

0.5B shape (V = 151,936), B = 64, temperature 0.9, no top-k / top-p, 32 chunks: the bench_sampler case. Each timed
program draws from `--buffers` logits arrays in turn (more bytes than the 50 MB L2 cache; in a decode step the
logits come fresh from the LM head's GEMM); `--reps` such programs run back to back, and the script reports
microseconds per draw. Versions alternate (A B A B). Also checks each version's tokens and log-probs against
XLA's. Writes results.json and prints a table.
"""

from __future__ import annotations

import argparse
import functools
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
from kevin_jax.policy import sample_stats, sampler  # pylint: disable=wrong-import-position


def _draw(stats: str, kernel_kw: dict, x, keys, valid_vocab: int, chunks: int):
  """sample_logits at temperature 0.9 with the stats from `stats`, the kernel's keywords bound while tracing."""
  orig = sample_stats.chunk_stats
  sample_stats.chunk_stats = functools.partial(orig, **kernel_kw)
  try:
    return sampler.sample_logits(x, keys, jnp.float32(0.9), jnp.float32(1.0), top_k=0, greedy=False,
                                 use_top_p=False, valid_vocab=valid_vocab, reduce_chunks=chunks, stats=stats)
  finally:
    sample_stats.chunk_stats = orig


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=os.environ.get("OUT", "runs") + "/sample_stats")
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--vocab", type=int, default=151936)
  ap.add_argument("--valid-vocab", type=int, default=151936, help="columns >= this are masked in the sampled "
                  "distribution (a tokenizer smaller than the embedding)")
  ap.add_argument("--chunks", type=int, default=32)
  ap.add_argument("--buffers", type=int, default=8, help="logits arrays drawn from in turn (8 x 39 MB > L2)")
  ap.add_argument("--reps", type=int, default=200, help="programs timed per version (20, ~8 ms of GPU work, gave "
                  "times 30 %% apart between two calls on one H100)")
  ap.add_argument("--configs", default="1x8192x4x1,1x8192x8x1,1x4096x4x2,1x2048x4x3,1x2048x2x3,2x4096x8x1",
                  help="Pallas versions: block_m x block_n x num_warps x num_stages, comma-separated")
  add_round_args(ap)
  a = ap.parse_args(argv)
  os.makedirs(a.out, exist_ok=True)
  b, v = a.batch, a.vocab
  xs = [jax.random.normal(jax.random.key(i), (b, v), jnp.float32) * 4.0 for i in range(a.buffers)]
  keys = jax.random.split(jax.random.key(99), b)
  stats = "interpret" if a.interpret else "pallas"
  versions = {"xla": ("xla", {})}
  for c in a.configs.split(","):
    bm, bn, nw, ns = (int(f) for f in c.split("x"))
    versions[f"pallas {c}"] = (stats, dict(block_m=bm, block_n=bn, num_warps=nw, num_stages=ns))
  fns = {name: jax.jit(functools.partial(_draw, s, kw, valid_vocab=a.valid_vocab, chunks=a.chunks))
         for name, (s, kw) in versions.items()}
  want = fns["xla"](xs[0], keys)

  def max_diff(fn):
    got = fn(xs[0], keys)
    if not np.array_equal(np.asarray(got[0]), np.asarray(want[0])):
      raise AssertionError("tokens differ from XLA's")
    return float(max(np.max(np.abs(np.asarray(g) - np.asarray(w))) for g, w in zip(got[1:], want[1:])))

  def time_us(fn):
    # One jitted program draws from every buffer; `reps` programs are dispatched back to back (asynchronously, so
    # the host stays ahead of the GPU). No fori_loop: XLA could hoist the loop-invariant work out of it.
    every = jax.jit(lambda xs_, k: [fn(x, k) for x in xs_])
    jax.block_until_ready(every(xs, keys))
    t = time.perf_counter()
    outs = [every(xs, keys) for _ in range(a.reps)]
    jax.block_until_ready(outs)
    return (time.perf_counter() - t) / (a.reps * len(xs)) * 1e6

  rows = []
  base = {"batch": b, "vocab": v, "chunks": a.chunks, "device": jax.devices()[0].device_kind}
  # "weight_TBps" here: the logits' bytes (one read) over the time.
  run_rounds(rows, base, {n: (lambda x, k, f=f: f(x, k)) for n, f in fns.items()}, a.rounds,
             lambda fn: max_diff(fn), time_us, b * v * 4)
  with open(os.path.join(a.out, "results.json"), "w") as f:
    json.dump(rows, f, indent=1)
  print_table(rows, ("batch", "vocab"))


if __name__ == "__main__":
  main()
