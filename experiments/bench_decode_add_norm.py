"""The end of a decode layer alone: the residual add after the MLP (summing the down projection's fp32 partials) and
the next RMSNorm, XLA's fusions against the one Pallas kernel of policy/decode_add_norm.py.

  JAX_PLATFORMS=cuda,cpu python3 experiments/bench_decode_add_norm.py --out $OUT/decode_add_norm

Cases (`--splits`): the partials' count S, fp32 [S, B, D] as decode_mlp.down_partials writes them (19 at the 0.5B
shape, B = 64, with the default split; 4 with the fewer-split configs of experiments/decode_kernels_ab.sh part 1),
and S = 1 in bf16 (XLA's down einsum output). Each timed program runs `--layers` layers, each with its own partials
and norm scale (more bytes than the L2 cache, as in a decode step), `--reps` times in a jitted fori_loop; the new
residual h and the normed x of each layer are both kept (an optimization barrier: the model uses both), and h
carries to the next layer. Versions alternate within each round. Reports microseconds per layer, the bytes read
(partials, h) and written (h, x) over that time, and each Pallas version's max |diff| over max |XLA| for h and x.
Pallas configs: block_m x num_warps.
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
from experiments.bench_decode_qkv import xla_norm  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode_add_norm import add_norm  # pylint: disable=wrong-import-position

EPS = 1e-6
DIMS = {"0.5b": 896, "1.5b": 1536, "small": 512}


def xla_add_norm(h, y, scale):
  """The model's XLA path: down_proj's sum (rounded to h's dtype), the residual add, RMSNorm in fp32."""
  hn = h + y.astype(jnp.float32).sum(0)[:h.shape[0]].astype(h.dtype)
  return hn, xla_norm(hn, scale, EPS)


def time_layers(fn, h, ys: list, scales: list, reps: int) -> float:
  """Microseconds per layer over `reps` passes of all layers (h carried, x kept; see the module docstring)."""
  def one_pass(carry, ys_, scales_):
    h0, x0 = carry
    for y, s in zip(ys_, scales_):
      h0, x = jax.lax.optimization_barrier(fn(h0, y, s))
      x0 = x0 + x
    return h0, x0

  loop = jax.jit(lambda h0, ys_, ss_: jax.lax.fori_loop(0, reps, lambda _, c: one_pass(c, ys_, ss_),
                                                        (h0, jnp.zeros_like(h0))))
  jax.block_until_ready(loop(h, ys, scales))
  t = time.perf_counter()
  jax.block_until_ready(loop(h, ys, scales))
  return (time.perf_counter() - t) / (reps * len(ys)) * 1e6


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=os.environ.get("OUT", "runs") + "/decode_add_norm")
  ap.add_argument("--shape", default="0.5b", choices=sorted(DIMS))
  ap.add_argument("--batches", default="64")
  ap.add_argument("--splits", default="19,4,1", help="partials per case; 1 = one bf16 term (XLA's down einsum)")
  ap.add_argument("--layers", type=int, default=24)
  ap.add_argument("--reps", type=int, default=50)
  ap.add_argument("--configs", default="1x4,1x1,2x4,4x4", help="Pallas versions: block_m x num_warps")
  add_round_args(ap)
  a = ap.parse_args(argv)
  os.makedirs(a.out, exist_ok=True)
  d = DIMS[a.shape]
  rng = np.random.default_rng(0)
  rows = []
  for b in (int(v) for v in a.batches.split(",")):
    h = jnp.asarray(rng.standard_normal((b, d)) * 3, jnp.bfloat16)
    for splits in (int(v) for v in a.splits.split(",")):
      y_dtype = jnp.float32 if splits > 1 else jnp.bfloat16
      ys = [jnp.asarray(rng.standard_normal((splits, b, d)), y_dtype) for _ in range(a.layers)]
      scales = [jnp.asarray(rng.uniform(0.5, 2.0, d), jnp.bfloat16) for _ in range(a.layers)]
      versions = {"xla": xla_add_norm}
      for c in a.configs.split(","):
        bm, nw = (int(v) for v in c.split("x"))
        versions[f"pallas {c}"] = (lambda h_, y_, s_, bm=bm, nw=nw: add_norm(
            h_, y_, s_, EPS, block_m=bm, num_warps=nw, interpret=a.interpret))
      want = [np.asarray(v, np.float32) for v in jax.jit(xla_add_norm)(h, ys[0], scales[0])]

      def max_rel_diff(fn, ys=ys, scales=scales, want=want):
        got = [np.asarray(v, np.float32) for v in jax.jit(fn)(h, ys[0], scales[0])]
        return max(float(np.max(np.abs(g - w)) / np.max(np.abs(w))) for g, w in zip(got, want))

      moved = ys[0].size * ys[0].dtype.itemsize + 3 * h.size * 2  # partials and h read; h and x written
      run_rounds(rows, {"shape": a.shape, "batch": b, "splits": splits}, versions, a.rounds, max_rel_diff,
                 lambda fn, ys=ys, scales=scales: time_layers(fn, h, ys, scales, a.reps), moved)
  res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "layers": a.layers, "reps": a.reps,
         "rows": rows}
  with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as fh:
    json.dump(res, fh, indent=1)
  print("(the 'weights TB/s' column is the bytes moved: partials and h read, h and x written)")
  print_table(rows, ("shape", "batch", "splits"))


if __name__ == "__main__":
  main()
