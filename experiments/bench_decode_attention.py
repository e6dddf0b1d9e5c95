"""The decode step's attention alone, over a real model's number of layer caches: XLA's masked einsum against
versions of the Pallas kernel (policy/decode_attention.py) by block size, splits, warps, stages and how the splits
share a row's slots.

  JAX_PLATFORMS=cuda,cpu python3 experiments/bench_decode_attention.py --out $OUT/decode_attention

The cache is that of the issue's benchmark: `--prompt-len` slots of prompt, all visible, then `--new` generated
slots of which `--gen-visible` are visible (each value a separate case). Each timed program runs `--layers` caches
in turn (more bytes than the L2 cache, as in a decode step), `--reps` times in a jitted fori_loop, each layer's q
depending on the previous layer's output; it reports microseconds per layer and the visible K/V bytes over that
time (the `weight_TBps` column: here the cache bytes a step must read). Versions alternate within each round, so
drift shows; round 0 also checks each version's output against XLA's on one layer. Writes results.json and prints
a table.

A Pallas config is block_k x splits x warps x stages x balance: splits 0 = the kernel's own choice; balance 1 =
splits share the row's visible blocks equally, 0 = each split owns a fixed slot range.
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
from experiments.bench_decode_qkv import PRESETS  # pylint: disable=wrong-import-position
from kevin_jax.policy import get_preset  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode_attention import SlotRanges, decode_attention  # pylint: disable=wrong-import-position
from kevin_jax.policy.model import _decode_attend  # pylint: disable=wrong-import-position


def _versions(configs: str, interpret: bool) -> dict:
  versions = {"xla": lambda q, kc, vc, r: _decode_attend(q, kc, vc, r.mask(kc.shape[2]), True)}
  for c in configs.split(","):
    bk, sp, nw, ns, bal = (int(v) for v in c.split("x"))
    versions[f"pallas {c}"] = (lambda q, kc, vc, r, bk=bk, sp=sp, nw=nw, ns=ns, bal=bal: decode_attention(
        q, kc, vc, r, block_k=bk, num_splits=sp, num_warps=nw, num_stages=ns, balance=bool(bal),
        interpret=interpret))
  return versions


def time_layers(fn, q, caches, ranges, reps: int) -> float:
  """Microseconds per layer: `reps` passes over all layers' caches, each layer's q from the previous output."""
  def one_pass(_, q0):
    for kc, vc in zip(*caches):
      q0 = (q0 + 1e-3 * fn(q0, kc, vc, ranges).astype(q0.dtype)).astype(q0.dtype)
    return q0

  loop = jax.jit(lambda q0: jax.lax.fori_loop(0, reps, one_pass, q0))
  jax.block_until_ready(loop(q))
  t = time.perf_counter()
  jax.block_until_ready(loop(q))
  return (time.perf_counter() - t) / (reps * len(caches[0])) * 1e6


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=os.environ.get("OUT", "runs") + "/decode_attention")
  ap.add_argument("--shape", default="0.5b", choices=sorted(PRESETS))
  ap.add_argument("--batches", default="64")
  ap.add_argument("--prompt-len", type=int, default=1024)
  ap.add_argument("--new", type=int, default=1024, help="generated slots in the cache")
  ap.add_argument("--gen-visible", default="128,512,960", help="visible generated slots, one case each")
  ap.add_argument("--layers", type=int, default=24, help="layer caches per pass (24: the 0.5B model)")
  ap.add_argument("--reps", type=int, default=20)
  ap.add_argument("--configs", default="64x0x4x2x0,64x0x4x2x1,128x0x4x2x1,64x0x4x3x1,64x8x4x2x1,64x0x8x2x1",
                  help="Pallas versions: block_k x splits x warps x stages x balance, comma-separated")
  add_round_args(ap)
  a = ap.parse_args(argv)
  os.makedirs(a.out, exist_ok=True)
  cfg = get_preset(PRESETS[a.shape])
  kh, g, h = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
  s = a.prompt_len + a.new
  rows = []
  rng = np.random.default_rng(0)
  for b in (int(v) for v in a.batches.split(",")):
    caches = [[jnp.asarray(rng.standard_normal((b, kh, s, h), np.float32), jnp.bfloat16) for _ in range(a.layers)]
              for _ in "kv"]
    q = jnp.asarray(rng.standard_normal((b, kh, g, h), np.float32), jnp.bfloat16)
    for gv in (int(v) for v in a.gen_visible.split(",")):
      ranges = SlotRanges(prompt_len_B=jnp.full((b,), a.prompt_len, jnp.int32), gen_len=jnp.int32(gv),
                          gen_start=a.prompt_len)
      want = np.asarray(jax.jit(_decode_attend, static_argnums=4)(
          q, caches[0][0], caches[1][0], ranges.mask(s), True), np.float32)

      def max_rel_diff(fn, q=q, ranges=ranges, want=want):
        got = np.asarray(jax.jit(fn)(q, caches[0][0], caches[1][0], ranges), np.float32)
        return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))

      def time_us(fn, q=q, ranges=ranges):
        return time_layers(fn, q, caches, ranges, a.reps)

      visible_bytes = 2 * b * kh * (a.prompt_len + gv) * h * 2
      run_rounds(rows, {"batch": b, "visible": a.prompt_len + gv}, _versions(a.configs, a.interpret), a.rounds,
                 max_rel_diff, time_us, visible_bytes)
  res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "shape": a.shape, "layers": a.layers,
         "reps": a.reps, "slots": s, "rows": rows}
  with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as fh:
    json.dump(res, fh, indent=1)
  print_table(rows, ("batch", "visible"))


if __name__ == "__main__":
  main()
