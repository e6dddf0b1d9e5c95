"""The decode step's MLP kernels alone, XLA against Pallas (policy/decode_mlp.py) for several block shapes:
`front`, silu(x W_gate) * (x W_up) (XLA: two einsums + the elementwise kernel, as policy/model.py's MLP), and
`down`, h W_down (XLA: one einsum; Pallas: split along F into fp32 partials that XLA sums); and the attention's
`oproj`, x + o W_o (XLA: the einsum and the add; Pallas: policy/decode_oproj.py, ModelConfig.decode_out), timed on
a [B, D] x [D, D] shape (N * H = D in every Qwen2) with o itself as the residual.

  JAX_PLATFORMS=cuda,cpu python3 experiments/bench_decode_mlp.py --out $OUT/decode_mlp

Each timed program runs `--layers` weight sets in turn (more bytes than the L2 cache, as in a real decode step,
where every layer reads new weights), `--reps` times in a jitted fori_loop, and reports microseconds per layer
and the weights' bytes over that time. The versions alternate (A B A B) so drift within the call shows. Also
checks each Pallas result against XLA's (max |diff| over max |XLA|). Writes results.json and prints a table.
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

from kevin_jax.policy.decode_mlp import down_proj, swiglu_front  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode_oproj import out_proj_residual  # pylint: disable=wrong-import-position

SHAPES = {"0.5b": (896, 4864), "1.5b": (1536, 8960), "small": (512, 1536)}


def xla_front(x, wg, wu):
  g = jnp.einsum("bd,df->bf", x, wg)
  u = jnp.einsum("bd,df->bf", x, wu)
  return jax.nn.silu(g) * u


def time_layers(fn, x, weights: tuple, reps: int) -> float:
  """Microseconds per layer: `reps` passes over all layers, fn(x, *layer's weights); each layer's input depends on
  the previous output (x + 1e-3 x the output's first column).

  The layers' weights are separate arrays (weights[k][layer]), unrolled in Python. The sixteenth session's first
  harness indexed one stacked array inside a loop over layers (dynamic slices, likely materialised as copies for
  the Pallas call's operands) and timed 21 us per layer for XLA's version, against 12.6 us for the same kernels in
  the decode step.
  """
  def one_pass(x0, ws):
    for layer in zip(*ws):
      out = fn(x0, *layer)
      x0 = x0 + (out[:, :1] * 1e-3).astype(x0.dtype)
    return x0

  # The weights are arguments of the jitted program (closed over, they would be baked in as constants).
  loop = jax.jit(lambda x0, ws: jax.lax.fori_loop(0, reps, lambda _, xi: one_pass(xi, ws), x0))
  loop(x, weights).block_until_ready()
  t = time.perf_counter()
  loop(x, weights).block_until_ready()
  return (time.perf_counter() - t) / (reps * len(weights[0])) * 1e6


def run_rounds(rows: list, base: dict, versions: dict, rounds: int, max_rel_diff, time_us, weight_bytes: int):
  """Each version `rounds` times, alternating (A B A B), into `rows`: base + version, round, us, weight_TBps and,
  in round 0, max_rel_diff(fn) against XLA's result; a failing version gets an error row instead."""
  for rnd in range(rounds):
    for name, fn in versions.items():
      row = {**base, "version": name, "round": rnd}
      try:
        if rnd == 0:
          row["max_rel_diff_vs_xla"] = max_rel_diff(fn)
        us = time_us(fn)
        row.update(us=us, weight_TBps=weight_bytes / us / 1e6)
      except Exception as e:  # pylint: disable=broad-except
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
      rows.append(row)
      print(json.dumps(row), flush=True)


def add_round_args(ap: argparse.ArgumentParser) -> None:
  """--rounds and --interpret, for run_rounds."""
  ap.add_argument("--rounds", type=int, default=2, help="times the whole XLA + configs sequence runs")
  ap.add_argument("--interpret", action="store_true", help="Pallas in interpret mode (checks the harness on a CPU; "
                  "its timings mean nothing)")


def print_table(rows: list, keys: tuple) -> None:
  """One markdown line per (keys..., version): the rounds' us / layer, the best weights TB/s, round 0's diff."""
  names = {"batch": "B"}
  print("\n| " + " | ".join(names.get(k, k) for k in keys) + " | version | us / layer (rounds) | weights TB/s | "
        "max rel diff vs XLA |")
  print("|" + "---|" * (len(keys) + 4))
  for k in dict.fromkeys(tuple(r[f] for f in (*keys, "version")) for r in rows):
    rs = [r for r in rows if tuple(r[f] for f in (*keys, "version")) == k]
    cells = " | ".join(str(v) for v in k)
    if any("error" in r for r in rs):
      print(f"| {cells} | failed: {next(r['error'] for r in rs if 'error' in r)[:80]} | | |")
      continue
    us = " / ".join(f"{r['us']:.2f}" for r in rs)
    diff = rs[0].get("max_rel_diff_vs_xla", float("nan"))
    print(f"| {cells} | {us} | {max(r['weight_TBps'] for r in rs):.2f} | {diff:.1e} |")


def xla_down(h, wd):
  return jnp.einsum("bf,fd->bd", h, wd)


def xla_oproj(o, w):
  return o + jnp.einsum("bk,kd->bd", o, w)


def _oproj(o, w, **kw):
  """out_proj_residual on [B, D] o (viewed as D / 64 heads of 64) and [D, D] w, o as the residual."""
  b, d = o.shape
  return out_proj_residual(o.reshape(b, d // 64, 64), w.reshape(d // 64, 64, d), o, **kw)


def _rms_normed(x, eps=1e-6):
  xf = x.astype(jnp.float32)
  return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def _versions(part: str, configs: str, interpret: bool = False, norm: bool = False) -> dict:
  """name -> fn(x, *weights) for one part: XLA's, then one Pallas version per config string. norm (front only):
  x is the raw residual, XLA normalises it first (RMSNorm without a scale), the kernel inside (rms_eps)."""
  if part == "oproj":
    versions = {"xla": xla_oproj}
    for c in configs.split(","):
      bn, bk, nw, ns, *bm = (int(v) for v in c.split("x"))  # an optional fifth field: block_m
      versions[f"pallas {c}"] = (lambda o_, w_, bn=bn, bk=bk, nw=nw, ns=ns, bm=bm: _oproj(
          o_, w_, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, interpret=interpret,
          **({"block_m": bm[0]} if bm else {})))
    return versions
  if part == "front":
    versions = {"xla": (lambda x_, g_, u_: xla_front(_rms_normed(x_), g_, u_)) if norm else xla_front}
    for c in configs.split(","):
      bn, bd, nw, ns, *bm = (int(v) for v in c.split("x"))  # an optional fifth field: block_m
      kw = dict(zip(("block_m",), bm), rms_eps=1e-6 if norm else None)
      versions[f"pallas {c}"] = (lambda x_, g_, u_, bn=bn, bd=bd, nw=nw, ns=ns, kw=kw: swiglu_front(
          x_, g_, u_, block_n=bn, block_d=bd, num_warps=nw, num_stages=ns, interpret=interpret, **kw))
    return versions
  versions = {"xla": xla_down}
  for c in configs.split(","):
    bn, bk, sp, nw, ns = (int(v) for v in c.split("x"))
    versions[f"pallas {c}"] = (lambda h_, w_, bn=bn, bk=bk, sp=sp, nw=nw, ns=ns: down_proj(
        h_, w_, splits=sp, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, interpret=interpret))
  return versions


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=os.environ.get("OUT", "runs") + "/decode_mlp")
  ap.add_argument("--shapes", default="0.5b,1.5b")
  ap.add_argument("--batches", default="64,256")
  ap.add_argument("--layers", type=int, default=16, help="weight sets per pass (16 x 17 MB > the 50 MB L2)")
  ap.add_argument("--same-weights", action="store_true", help="every layer reads the first layer's weights, which "
                  "stay in the L2 cache: the time a kernel would take if its weights were prefetched into L2")
  ap.add_argument("--reps", type=int, default=50)
  ap.add_argument("--parts", default="front,down", help="front (gate/up + SwiGLU), down (down projection), oproj "
                  "(the attention's o projection + residual)")
  ap.add_argument("--configs", default="32x128x4x3,16x128x4x3,64x128x4x3,32x64x4x3,32x128x8x3,32x128x4x4",
                  help="front's Pallas versions: block_n x block_d x num_warps x num_stages [x block_m], "
                  "comma-separated")
  ap.add_argument("--front-norm", action="store_true", help="the front with the norm inside the kernel (rms_eps; "
                  "ModelConfig.decode_norm='inside'), against XLA's norm + front")
  ap.add_argument("--down-configs", default="64x64x4x4x5,64x64x0x4x3,128x64x0x4x3,64x128x0x4x3,64x64x1x4x3,"
                  "32x64x0x4x3,64x64x0x8x3", help="down's Pallas versions: block_n x block_k x splits (0 = "
                  "pick_splits) x num_warps x num_stages (the first: the default)")
  ap.add_argument("--oproj-configs", default="16x128x4x3,16x128x4x5,16x128x4x7,32x128x4x5,16x64x4x7",
                  help="oproj's Pallas versions: block_n x block_k x num_warps x num_stages [x block_m] (the "
                  "first: the default)")
  add_round_args(ap)
  a = ap.parse_args(argv)
  os.makedirs(a.out, exist_ok=True)
  rows = []
  for shape in a.shapes.split(","):
    d, f = SHAPES[shape]
    rng = np.random.default_rng(0)
    weight = lambda rows_, cols_: jnp.asarray(rng.standard_normal((rows_, cols_), np.float32) * rows_ ** -0.5,
                                              jnp.bfloat16)
    for part in a.parts.split(","):
      if part == "front":
        weights = tuple([weight(d, f) for _ in range(a.layers)] for _ in range(2))
        width, configs = d, a.configs
      elif part == "down":
        weights = ([weight(f, d) for _ in range(a.layers)],)
        width, configs = f, a.down_configs
      elif part == "oproj":
        weights = ([weight(d, d) for _ in range(a.layers)],)
        width, configs = d, a.oproj_configs
      else:
        raise SystemExit(f"--parts: unknown part {part!r} (front, down, oproj)")
      if a.same_weights:
        weights = tuple([w[0]] * a.layers for w in weights)
      weight_bytes = sum(w[0].size for w in weights) * 2
      for b in (int(s) for s in a.batches.split(",")):
        x = jnp.asarray(rng.standard_normal((b, width), np.float32), jnp.bfloat16)
        first = [w[0] for w in weights]
        versions = _versions(part, configs, a.interpret, norm=a.front_norm and part == "front")
        want = np.asarray(jax.jit(versions["xla"])(x, *first), np.float32)

        def max_rel_diff(fn, x=x, first=first, want=want):
          got = np.asarray(jax.jit(fn)(x, *first), np.float32)
          return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))

        run_rounds(rows, {"shape": shape, "part": part, "batch": b}, versions, a.rounds, max_rel_diff,
                   lambda fn, x=x, weights=weights: time_layers(fn, x, weights, a.reps), weight_bytes)
  res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "layers": a.layers, "reps": a.reps,
         "same_weights": a.same_weights, "rows": rows}
  with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as fh:
    json.dump(res, fh, indent=1)
  print_table(rows, ("shape", "part", "batch"))


if __name__ == "__main__":
  main()
