"""Where the RMSNorm inside a decode GEMM kernel costs its time: the MLP's SwiGLU front (policy/decode_mlp.py) with
the post-attention norm applied in several ways, alone, on the 0.5B shape.

  JAX_PLATFORMS=cuda,cpu python3 experiments/bench_decode_norm.py --out $OUT/decode_norm

The twenty-third session's decode profile (BENCHMARKS.md) timed the front with the norm inside (as the kernel
had it before commit b9ab122: x * scale rounded, then the dots, with the rows' sums of squares in the same loop)
at 19.1 us per layer against 8.9 us without it. The versions here separate the pieces of that loop:
  xla             XLA's norm, then XLA's gate/up einsums and SwiGLU (the model's path before any kernel);
  xla_norm+front  XLA's norm (one fusion, bf16 out), then the kernel without a norm (the current default);
  fused           the norm inside: x * scale before the dots, the sums of squares in the same loop (as the
                  committed kernel had it until the twenty-third session);
  prepass         the sums of squares in a loop of their own first, then x * scale in the dot loop;
  r_in            1/rms per row computed by XLA (a [B] reduction), x * scale in the dot loop;
  scaled_w+r_in   the norm scale folded into the weights (prepared once, outside the timing), 1/rms from XLA: the
                  dot loop is the plain kernel's, the accumulators are scaled by 1/rms after it;
  scaled_w+ss     the scale folded into the weights, the sums of squares in the dot loop from the unmodified x.
Timing as experiments/bench_decode_mlp.py (layers of separate weights, alternated versions, rounds).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
from jax.experimental import pallas as pl  # pylint: disable=wrong-import-position
from jax.experimental.pallas import triton as pl_triton  # pylint: disable=wrong-import-position

from experiments.bench_decode_mlp import (  # pylint: disable=wrong-import-position
    SHAPES, add_round_args, print_table, run_rounds, time_layers, xla_front)
from experiments.bench_decode_qkv import xla_norm  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode_mlp import swiglu_front  # pylint: disable=wrong-import-position

EPS = 1e-6  # xla_norm's default epsilon
F32 = jnp.float32


def xla_inv_rms(x):
  xf = x.astype(F32)
  return jax.lax.rsqrt(jnp.mean(xf * xf, axis=1) + EPS)


def _kernel(*refs, block_d: int, ss: str, scale_x: bool):
  """refs: x, [scale if scale_x], [1/rms if ss == 'input'], w_gate, w_up, out. ss: 'loop' (sums of squares in the
  dot loop), 'prepass' (in a loop of their own first) or 'input'."""
  refs = list(refs)
  x_ref = refs.pop(0)
  s_ref = refs.pop(0) if scale_x else None
  r_ref = refs.pop(0) if ss == "input" else None
  wg_ref, wu_ref, o_ref = refs
  m, d = x_ref.shape
  n = d // block_d
  sl = lambda t: pl.ds(pl.multiple_of(t * block_d, block_d), block_d)
  if ss == "prepass":
    sumsq = jax.lax.fori_loop(0, n, lambda t, a: a + jnp.sum(jnp.square(x_ref[:, sl(t)].astype(F32)), axis=1),
                              jnp.zeros((m,), F32))

  def body(t, carry):
    a1, a2, sq = carry
    ks = sl(t)
    x = x_ref[:, ks]
    if ss == "loop":
      sq = sq + jnp.sum(jnp.square(x.astype(F32)), axis=1)
    if scale_x:
      x = (x.astype(F32) * s_ref[ks].astype(F32)[None, :]).astype(wg_ref.dtype)
    a1 += jax.lax.dot(x, wg_ref[ks, :], preferred_element_type=F32)
    a2 += jax.lax.dot(x, wu_ref[ks, :], preferred_element_type=F32)
    return a1, a2, sq

  zeros = jnp.zeros((m, wg_ref.shape[1]), F32)
  g, u, sq = jax.lax.fori_loop(0, n, body, (zeros, zeros, jnp.zeros((m,), F32)))
  if ss == "prepass":
    sq = sumsq
  r = r_ref[...] if ss == "input" else jax.lax.rsqrt(sq / d + EPS)
  g, u = g * r[:, None], u * r[:, None]
  o_ref[...] = (g * jax.nn.sigmoid(g) * u).astype(o_ref.dtype)


def normed_front(x, wg, wu, scale, *, ss: str, scale_x: bool, block_n: int = 64, block_d: int = 128,
                 interpret: bool = False):
  """The SwiGLU front with the norm applied as `ss`/`scale_x` say (x: [B, D], B a multiple of 16, at most 64)."""
  b, d = x.shape
  f = wg.shape[1]
  extra, specs = [], []
  if scale_x:
    extra.append(scale)
    specs.append(pl.BlockSpec((d,), lambda i, j: (0,)))
  if ss == "input":
    extra.append(xla_inv_rms(x))
    specs.append(pl.BlockSpec((b,), lambda i, j: (0,)))
  return pl.pallas_call(
      functools.partial(_kernel, block_d=block_d, ss=ss, scale_x=scale_x),
      grid=(1, f // block_n),
      in_specs=[pl.BlockSpec((b, d), lambda i, j: (0, 0)), *specs,
                pl.BlockSpec((d, block_n), lambda i, j: (0, j)), pl.BlockSpec((d, block_n), lambda i, j: (0, j))],
      out_specs=pl.BlockSpec((b, block_n), lambda i, j: (0, j)),
      out_shape=jax.ShapeDtypeStruct((b, f), x.dtype),
      compiler_params=pl_triton.CompilerParams(num_warps=4, num_stages=3),
      interpret=interpret, name=f"norm_{ss}_{'x' if scale_x else 'w'}",
  )(x, *extra, wg, wu)


def versions(interpret: bool) -> dict:
  """name -> (fn(x, w_gate, w_up, scale), whether fn takes the weights pre-scaled by the norm scale)."""
  nf = functools.partial(normed_front, interpret=interpret)
  return {
      "xla": (lambda x, g, u, s: xla_front(xla_norm(x, s), g, u), False),
      "xla_norm+front": (lambda x, g, u, s: swiglu_front(xla_norm(x, s), g, u, interpret=interpret), False),
      "fused": (lambda x, g, u, s: nf(x, g, u, s, ss="loop", scale_x=True), False),
      "prepass": (lambda x, g, u, s: nf(x, g, u, s, ss="prepass", scale_x=True), False),
      "r_in": (lambda x, g, u, s: nf(x, g, u, s, ss="input", scale_x=True), False),
      "scaled_w+r_in": (lambda x, g, u, s: nf(x, g, u, s, ss="input", scale_x=False), True),
      "scaled_w+ss": (lambda x, g, u, s: nf(x, g, u, s, ss="loop", scale_x=False), True),
  }


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=os.environ.get("OUT", "runs") + "/decode_norm")
  ap.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--layers", type=int, default=16)
  ap.add_argument("--reps", type=int, default=50)
  add_round_args(ap)
  a = ap.parse_args(argv)
  os.makedirs(a.out, exist_ok=True)
  d, f = SHAPES[a.shape]
  rng = np.random.default_rng(0)
  weight = lambda: jnp.asarray(rng.standard_normal((d, f), np.float32) * d ** -0.5, jnp.bfloat16)
  wg, wu = [weight() for _ in range(a.layers)], [weight() for _ in range(a.layers)]
  sc = [jnp.asarray(1 + 0.1 * rng.standard_normal(d), jnp.bfloat16) for _ in range(a.layers)]
  pre = lambda ws: [(w.astype(F32) * s.astype(F32)[:, None]).astype(w.dtype) for w, s in zip(ws, sc)]
  wg_s, wu_s = pre(wg), pre(wu)
  x = jnp.asarray(rng.standard_normal((a.batch, d), np.float32) * 3, jnp.bfloat16)
  vs = versions(a.interpret)
  want = np.asarray(jax.jit(vs["xla"][0])(x, wg[0], wu[0], sc[0]), np.float32)
  fns = {name: fn for name, (fn, _) in vs.items()}
  weights = {fn: ((wg_s, wu_s, sc) if pre_scaled else (wg, wu, sc)) for fn, pre_scaled in vs.values()}

  def max_rel_diff(fn):
    got = np.asarray(jax.jit(fn)(x, *(w[0] for w in weights[fn])), np.float32)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))

  rows = []
  run_rounds(rows, {"shape": a.shape, "batch": a.batch}, fns, a.rounds, max_rel_diff,
             lambda fn: time_layers(fn, x, weights[fn], a.reps), 2 * d * f * 2)
  with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as fh:
    json.dump({"device": jax.devices()[0].device_kind, "jax": jax.__version__, "layers": a.layers,
               "reps": a.reps, "rows": rows}, fh, indent=1)
  print_table(rows, ("shape", "batch"))


if __name__ == "__main__":
  main()
