"""The decode step's Pallas kernels alone, each against XLA's path for the same work, by kernel options.

  JAX_PLATFORMS=cuda,cpu python experiments/bench_decode_kernels.py --out runs/decode_kernels
  python experiments/bench_decode_kernels.py --kernels attention --config attention=64x0x4x3x1,64x0x4x2x1

Kernels (`--kernels`; a kernel's --config strings, the first being its current default):
  attention  decode_attention over one layer's cache: block_k x splits (0: its choice) x warps x stages x balance;
             one case per --gen-visible (generated slots visible after --prompt-len prompt slots)
  qkv        the layer's input norm, q/k/v projection, biases, RoPE, cache write (decode/qkv.py qkv_rope_cache):
             block_m x block_w x warps x stages [x block_d]; the caches carried, so a copy of one would show
  front      the MLP's norm and silu(x W_gate) * (x W_up) (decode/mlp.py swiglu_front): block_n x block_d x warps x
             stages [x block_m]
  down       the down projection split along F (decode/mlp.py down_proj): block_n x block_k x splits (0: pick_splits)
             x warps x stages
  oproj      the o projection + residual (decode/oproj.py out_proj_residual): block_n x block_k x warps x stages
             [x block_m]
  stats      the sampling step's draw over fp32 logits with the chunk statistics from sample_stats.chunk_stats
             (sample_logits, temperature 0.9): block_m x block_n x warps x stages
--norm: how qkv and front get their RMSNorm: 'xla' (XLA's norm, then the kernel), 'inside' (the kernel computes
1/rms) or 'auto' (the decode plan's choice on a GPU: inside up to plan.AUTO_NORM_MAX_D); XLA's path always norms first.

Method: each timed program runs --layers weight and cache sets in turn (more bytes than the L2 cache, as in a
decode step where every layer reads new ones), --reps times in a jitted fori_loop, each layer's input depending
on the previous layer's output; `stats` instead dispatches --reps programs that each draw from --buffers logits
arrays. Versions alternate within each round (A B A B), so drift shows; round 0 also checks each version against
XLA's result (max |diff| over max |XLA|). Reports microseconds per layer (per draw for `stats`) and the bytes a
layer must read over that time (weights; the visible K/V for attention; the logits for stats). Writes
results.json and prints one table per kernel. --interpret runs the kernels in interpret mode: checks the script
on a CPU, its times mean nothing.
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

from kevin_jax.policy import get_preset  # pylint: disable=wrong-import-position
from kevin_jax.policy import model as model_lib  # pylint: disable=wrong-import-position
from kevin_jax.policy import sampling as sampler  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode import plan as plan_lib  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode import sample_stats  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode.attention import (  # pylint: disable=wrong-import-position
    SlotRanges, decode_attention, padded_rows)
from kevin_jax.policy.decode.mlp import down_proj, swiglu_front  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode.oproj import out_proj_residual  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode.qkv import qkv_rope_cache  # pylint: disable=wrong-import-position

SHAPES = {"0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "small": "small"}
KERNELS = ("attention", "qkv", "front", "down", "oproj", "stats")
CONFIGS = {  # the first of each: the kernel's default options at the 0.5B shape, B = 64
    "attention": "64x0x4x3x1,64x0x4x2x1,64x4x4x2x1,64x0x4x3x0,128x0x4x3x1",
    "qkv": "64x16x4x5,64x16x4x3,64x16x4x7,32x16x4x5",
    "front": "64x128x4x4,64x128x4x3,32x128x4x4,64x64x4x6",
    "down": "64x64x4x4x5,64x64x0x4x3,64x64x2x4x5,64x128x4x4x5",
    "oproj": "16x128x4x3,16x128x4x5,32x128x4x3,16x128x4x3x32",
    "stats": "1x8192x4x3,1x8192x8x3,1x4096x4x3,2x4096x8x3",
}
LAYERS = {"attention": 24, "qkv": 24, "front": 16, "down": 16, "oproj": 16}  # as bench_sampler's 0.5B shape reads
REPS = {"attention": 20, "qkv": 50, "front": 50, "down": 50, "oproj": 50, "stats": 200}
EPS = 1e-6
F32 = jnp.float32


def _ints(config: str) -> list[int]:
  return [int(v) for v in config.split("x")]


def rms_norm(x, scale):
  """The model's RMSNorm of x [B, D] (fp32 inside), in x's dtype."""
  xf = x.astype(F32)
  return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=1, keepdims=True) + EPS) * scale.astype(F32)[None]
          ).astype(x.dtype)


def run_rounds(rows: list, base: dict, versions: dict, rounds: int, max_rel_diff, time_us, nbytes: int) -> None:
  """Each version `rounds` times, alternating (A B A B), into `rows`: base + version, round, us, TBps and, in round 0,
  max_rel_diff(fn) against XLA's result; a failing version gets an error row instead."""
  for rnd in range(rounds):
    for name, fn in versions.items():
      row = {**base, "version": name, "round": rnd}
      try:
        if rnd == 0:
          row["max_rel_diff_vs_xla"] = max_rel_diff(fn)
        us = time_us(fn)
        row.update(us=us, TBps=nbytes / us / 1e6)
      except Exception as e:  # pylint: disable=broad-except
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
      rows.append(row)
      print(json.dumps(row), flush=True)


def rel_diff(got, want) -> float:
  """max |got - want| over max |want|, over a tuple of arrays."""
  got, want = [np.asarray(g, np.float32) for g in got], [np.asarray(w, np.float32) for w in want]
  return float(max(np.max(np.abs(g - w)) for g, w in zip(got, want)) / max(np.max(np.abs(w)) for w in want))


def time_layers(fn, x, per_layer: list[tuple], reps: int, carry_out) -> float:
  """Microseconds per layer: `reps` passes over the layers, fn(x, *layer); x' = carry_out(x, fn's output). The
  layers' arrays are arguments of the jitted program (closed over, they would be baked in as constants)."""
  def one_pass(x0, layers):
    for layer in layers:
      x0 = carry_out(x0, fn(x0, *layer))
    return x0

  loop = jax.jit(lambda x0, layers: jax.lax.fori_loop(0, reps, lambda _, xi: one_pass(xi, layers), x0))
  jax.block_until_ready(loop(x, per_layer))
  t = time.perf_counter()
  jax.block_until_ready(loop(x, per_layer))
  return (time.perf_counter() - t) / (reps * len(per_layer)) * 1e6


def _add_out(x, out):
  """The next layer's input (attention): x + 1e-3 out, so that each layer depends on the previous one."""
  return (x + 1e-3 * out.astype(x.dtype)).astype(x.dtype)


def _add_first_col(x, out):
  """The next layer's input (the GEMM kernels): x + 1e-3 x the output's first column."""
  return x + (out[:, :1] * 1e-3).astype(x.dtype)


# ----------------------------------------------------------------------------------------------------------
# the kernels' cases: (case labels, versions, max_rel_diff, time_us, bytes read per layer)
# ----------------------------------------------------------------------------------------------------------
def attention_cases(a, cfg, b, rng):
  kh, g, h, p = cfg.num_kv_heads, cfg.num_groups, cfg.head_dim, a.prompt_len
  s = p + a.new
  layers = a.layers or LAYERS["attention"]
  caches = [tuple(jnp.asarray(rng.standard_normal((b, kh, s, h), np.float32), jnp.bfloat16) for _ in "kv")
            for _ in range(layers)]
  q = jnp.asarray(rng.standard_normal((b, kh, g, h), np.float32), jnp.bfloat16)
  xla_attend = model_lib.decode_attend  # the model's reference path
  versions = {"xla": lambda q_, kc, vc, r: xla_attend(q_, kc, vc, r.mask(s), True)}
  for c in a.configs["attention"]:
    bk, sp, nw, ns, bal = _ints(c)
    versions[f"pallas {c}"] = functools.partial(_attn, block_k=bk, num_splits=sp, num_warps=nw, num_stages=ns,
                                                balance=bool(bal), interpret=a.interpret)
  for gv in (int(v) for v in a.gen_visible.split(",")):
    ranges = SlotRanges(prompt_len_B=jnp.full((b,), p, jnp.int32), gen_len=jnp.int32(gv), gen_start=p)
    want = jax.jit(versions["xla"])(q, *caches[0], ranges)
    diff = lambda fn, r=ranges, w=want: rel_diff([jax.jit(fn)(q, *caches[0], r)], [w])
    time_us = lambda fn, r=ranges: time_layers(lambda x, kc, vc: fn(x, kc, vc, r), q, caches,
                                               a.reps or REPS["attention"], _add_out)
    yield {"visible": p + gv}, versions, diff, time_us, 2 * b * kh * (p + gv) * h * 2


def _attn(q, kc, vc, r, **kw):
  return decode_attention(q, kc, vc, r, **kw)


def _xla_qkv(x, wq, wk, wv, bq, bk, bv, norm, cos, sin, kc, vc, slot):
  """The model's XLA path of a decode step's attention front: (q [B, K, G_pad, H], k cache, v cache)."""
  b, x = x.shape[0], rms_norm(x, norm).astype(wq.dtype)
  kh, h = wk.shape[1], wk.shape[2]
  q = jnp.einsum("bd,dnh->bnh", x, wq) + bq[None]
  k = jnp.einsum("bd,dkh->bkh", x, wk) + bk[None]
  v = jnp.einsum("bd,dkh->bkh", x, wv) + bv[None]
  q = model_lib.apply_rope(q[:, None], cos[:, None], sin[:, None], True)[:, 0]
  k = model_lib.apply_rope(k[:, None], cos[:, None], sin[:, None], True)[:, 0]
  kc = jax.lax.dynamic_update_slice(kc, k[:, :, None].astype(kc.dtype), (0, 0, slot, 0))
  vc = jax.lax.dynamic_update_slice(vc, v[:, :, None].astype(vc.dtype), (0, 0, slot, 0))
  g = q.shape[1] // kh
  return jnp.pad(q.reshape(b, kh, g, h), ((0, 0), (0, 0), (0, padded_rows(g) - g), (0, 0))), kc, vc


def _pallas_qkv(x, wq, wk, wv, bq, bk, bv, norm, cos, sin, kc, vc, slot, inside: bool, **kw):
  """The kernel as the model calls it: on XLA's normed x, or on the raw x with the norm inside (the scale folded
  into the weights; here the scale is one)."""
  if inside:
    return qkv_rope_cache(x, wq, wk, wv, bq, bk, bv, cos, sin, kc, vc, slot, rms_eps=EPS, **kw)
  return qkv_rope_cache(rms_norm(x, norm), wq, wk, wv, bq, bk, bv, cos, sin, kc, vc, slot, **kw)


def qkv_cases(a, cfg, b, rng):
  d, n, kh, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  layers, reps = a.layers or LAYERS["qkv"], a.reps or REPS["qkv"]
  arr = lambda *s, scale=1.0: jnp.asarray(rng.standard_normal(s, np.float32) * scale, jnp.bfloat16)
  shapes = ((d, n, h), (d, kh, h), (d, kh, h), (n, h), (kh, h), (kh, h))
  weights = [tuple(arr(*s, scale=d ** -0.5 if len(s) == 3 else 1.0) for s in shapes) + (jnp.ones((d,), jnp.bfloat16),)
             for _ in range(layers)]
  x = arr(b, d)
  cos, sin = (t[:, 0] for t in model_lib.rope_cos_sin(jnp.asarray(rng.integers(0, 3000, (b, 1))), h, cfg.rope_theta))
  versions = {"xla": _xla_qkv}
  for c in a.configs["qkv"]:
    bm, bw, nw, ns, *bd = _ints(c)
    versions[f"pallas {c}"] = functools.partial(_pallas_qkv, inside=_norm_inside(a, cfg), block_m=bm, block_w=bw,
                                                num_warps=nw, num_stages=ns, interpret=a.interpret,
                                                **({"block_d": bd[0]} if bd else {}))
  cache0 = arr(b, kh, a.slots, h)
  want = jax.jit(_xla_qkv)(x, *weights[0], cos, sin, cache0, cache0, 5)
  diff = lambda fn: rel_diff(jax.jit(fn)(x, *weights[0], cos, sin, cache0, cache0, 5), want)

  def time_us(fn):
    """The caches are donated (updated in place, as in the sampler) and carried; slot (rep mod S) is written."""
    def one_pass(i, carry):
      x0, kcs, vcs = carry
      kcs, vcs = list(kcs), list(vcs)
      for layer, w in enumerate(weights):
        q, kcs[layer], vcs[layer] = fn(x0, *w, cos, sin, kcs[layer], vcs[layer], i % a.slots)
        x0 = x0 + (q[:, 0, 0, :1] * 1e-3).astype(x0.dtype)
      return x0, tuple(kcs), tuple(vcs)

    loop = jax.jit(lambda x0, kcs, vcs: jax.lax.fori_loop(0, reps, one_pass, (x0, kcs, vcs)), donate_argnums=(1, 2))
    caches = [tuple(jnp.zeros((b, kh, a.slots, h), jnp.bfloat16) for _ in range(layers)) for _ in "kv"]
    _, *caches = loop(x, *caches)
    jax.block_until_ready(caches)
    t = time.perf_counter()
    jax.block_until_ready(loop(x, *caches))
    return (time.perf_counter() - t) / (reps * layers) * 1e6

  yield {"norm": "inside" if _norm_inside(a, cfg) else "xla"}, versions, diff, time_us, 2 * d * (n + 2 * kh) * h


def _norm_inside(a, cfg) -> bool:
  return a.norm == "inside" or (a.norm == "auto" and cfg.hidden_size <= plan_lib.AUTO_NORM_MAX_D)


def _xla_front(x, wg, wu, norm):
  x = rms_norm(x, norm)
  return jax.nn.silu(jnp.einsum("bd,df->bf", x, wg)) * jnp.einsum("bd,df->bf", x, wu)


def _pallas_front(x, wg, wu, norm, inside: bool, **kw):
  return swiglu_front(x, wg, wu, rms_eps=EPS, **kw) if inside else swiglu_front(rms_norm(x, norm), wg, wu, **kw)


def _oproj(o, w, heads: int, **kw):
  """out_proj_residual with o [B, N*H] viewed as [B, N, H], w [N*H, D] as [N, H, D], and o as the residual."""
  b, nh = o.shape
  return out_proj_residual(o.reshape(b, heads, nh // heads), w.reshape(heads, nh // heads, w.shape[1]), o, **kw)


def mlp_cases(kernel: str):
  """front, down and oproj: fn(x, *weights) -> [B, *]."""
  def cases(a, cfg, b, rng):
    d, f, nh = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim
    layers = a.layers or LAYERS[kernel]
    act = lambda r, c: jnp.asarray(rng.standard_normal((r, c), np.float32), jnp.bfloat16)
    weight = lambda r, c: (act(r, c).astype(F32) * r ** -0.5).astype(jnp.bfloat16)
    inside = _norm_inside(a, cfg)
    if kernel == "front":
      per_layer = [(weight(d, f), weight(d, f), jnp.ones((d,), jnp.bfloat16)) for _ in range(layers)]
      x, versions, label = act(b, d), {"xla": _xla_front}, {"norm": "inside" if inside else "xla"}
    elif kernel == "down":
      per_layer = [(weight(f, d),) for _ in range(layers)]
      x, versions, label = act(b, f), {"xla": lambda h, w: jnp.einsum("bf,fd->bd", h, w)}, {}
    else:  # o [B, N*H] is its own residual (N * H = D in every Qwen2)
      per_layer = [(weight(nh, d),) for _ in range(layers)]
      x, versions, label = act(b, nh), {"xla": lambda o, w: o + jnp.einsum("bk,kd->bd", o, w)}, {}
    for c in a.configs[kernel]:
      v = _ints(c)
      if kernel == "front":
        kw = dict(block_n=v[0], block_d=v[1], num_warps=v[2], num_stages=v[3], **dict(zip(("block_m",), v[4:])))
        fn = functools.partial(_pallas_front, inside=inside, interpret=a.interpret, **kw)
      elif kernel == "down":
        fn = functools.partial(down_proj, block_n=v[0], block_k=v[1], splits=v[2], num_warps=v[3], num_stages=v[4],
                               interpret=a.interpret)
      else:
        kw = dict(block_n=v[0], block_k=v[1], num_warps=v[2], num_stages=v[3], **dict(zip(("block_m",), v[4:])))
        fn = functools.partial(_oproj, heads=cfg.num_heads, interpret=a.interpret, **kw)
      versions[f"pallas {c}"] = fn
    want = jax.jit(versions["xla"])(x, *per_layer[0])
    diff = lambda fn: rel_diff([jax.jit(fn)(x, *per_layer[0])], [want])
    time_us = lambda fn: time_layers(fn, x, per_layer, a.reps or REPS[kernel], _add_first_col)
    yield label, versions, diff, time_us, sum(w.size for w in per_layer[0] if w.ndim == 2) * 2

  return cases


def stats_cases(a, cfg, b, rng):
  """sample_logits over fp32 logits, the chunk statistics from XLA or from chunk_stats with each config."""
  del rng
  v = cfg.vocab_size
  xs = [jax.random.normal(jax.random.key(i), (b, v), F32) * 4.0 for i in range(a.buffers)]
  keys = jax.random.split(jax.random.key(99), b)

  def draw(x, k, stats="xla", **kernel_kw):
    orig = sample_stats.chunk_stats
    sample_stats.chunk_stats = functools.partial(orig, **kernel_kw)  # bound while tracing
    try:
      return sampler.sample_logits(x, k, jnp.float32(0.9), jnp.float32(1.0), top_k=0, greedy=False,
                                   use_top_p=False, valid_vocab=v, reduce_chunks=a.chunks, stats=stats)
    finally:
      sample_stats.chunk_stats = orig

  versions = {"xla": jax.jit(draw)}
  for c in a.configs["stats"]:
    bm, bn, nw, ns = _ints(c)
    versions[f"pallas {c}"] = jax.jit(functools.partial(draw, stats="interpret" if a.interpret else "pallas",
                                                        block_m=bm, block_n=bn, num_warps=nw, num_stages=ns))
  want = versions["xla"](xs[0], keys)

  def diff(fn):
    got = fn(xs[0], keys)
    if not np.array_equal(np.asarray(got[0]), np.asarray(want[0])):
      raise AssertionError("tokens differ from XLA's")
    return rel_diff(got[1:], want[1:])

  def time_us(fn):
    # One program draws from every buffer; --reps programs are dispatched back to back (the host stays ahead of
    # the GPU). No fori_loop: XLA could hoist the loop-invariant work out of it.
    every = jax.jit(lambda xs_, k: [fn(x, k) for x in xs_])
    jax.block_until_ready(every(xs, keys))
    reps = a.reps or REPS["stats"]
    t = time.perf_counter()
    jax.block_until_ready([every(xs, keys) for _ in range(reps)])
    return (time.perf_counter() - t) / (reps * len(xs)) * 1e6

  yield {"vocab": v, "chunks": a.chunks}, versions, diff, time_us, b * v * 4


CASES = {"attention": attention_cases, "qkv": qkv_cases, "front": mlp_cases("front"), "down": mlp_cases("down"),
         "oproj": mlp_cases("oproj"), "stats": stats_cases}


_NOT_LABELS = {"kernel", "shape", "batch", "version", "round", "us", "TBps", "max_rel_diff_vs_xla", "error"}


def print_table(rows: list, keys: tuple) -> None:
  """One markdown line per (keys..., version): the rounds' us, the best TB/s, round 0's relative diff."""
  print("\n| " + " | ".join(keys) + " | version | us per layer (rounds) | TB/s read | max rel diff vs XLA |")
  print("|" + "---|" * (len(keys) + 4))
  for k in dict.fromkeys(tuple(r.get(f) for f in (*keys, "version")) for r in rows):
    rs = [r for r in rows if tuple(r.get(f) for f in (*keys, "version")) == k]
    cells = " | ".join(str(v) for v in k)
    if any("error" in r for r in rs):
      print(f"| {cells} | failed: {next(r['error'] for r in rs if 'error' in r)[:80]} | | |")
      continue
    us = " / ".join(f"{r['us']:.2f}" for r in rs)
    diff = rs[0].get("max_rel_diff_vs_xla", float("nan"))
    print(f"| {cells} | {us} | {max(r['TBps'] for r in rs):.2f} | {diff:.1e} |")


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="runs/decode_kernels")
  ap.add_argument("--kernels", default=",".join(KERNELS), help=f"comma list of {KERNELS}")
  ap.add_argument("--config", action="append", default=[], metavar="KERNEL=C1,C2",
                  help="a kernel's Pallas versions, replacing its defaults (the module docstring's formats)")
  ap.add_argument("--shapes", default="0.5b", help=f"comma list of {sorted(SHAPES)}")
  ap.add_argument("--batches", default="64")
  ap.add_argument("--norm", default="auto", choices=("auto", "xla", "inside"), help="qkv and front: the RMSNorm")
  ap.add_argument("--layers", type=int, default=0, help="weight and cache sets per pass (0: the kernel's default)")
  ap.add_argument("--reps", type=int, default=0, help="passes (stats: programs) per timing (0: the kernel's default)")
  ap.add_argument("--prompt-len", type=int, default=1024, help="attention: prompt slots, all visible")
  ap.add_argument("--new", type=int, default=1024, help="attention: generated slots in the cache")
  ap.add_argument("--gen-visible", default="128,512,960", help="attention: visible generated slots, one case each")
  ap.add_argument("--slots", type=int, default=2048, help="qkv: cache slots per row")
  ap.add_argument("--chunks", type=int, default=32, help="stats: SamplerConfig.reduce_chunks")
  ap.add_argument("--buffers", type=int, default=8, help="stats: logits arrays drawn from in turn (8 x 39 MB > L2)")
  ap.add_argument("--rounds", type=int, default=2, help="times the whole sequence of versions runs")
  ap.add_argument("--interpret", action="store_true", help="Pallas in interpret mode (a CPU check; no timing)")
  a = ap.parse_args(argv)
  kernels = a.kernels.split(",")
  if any(k not in KERNELS for k in kernels):
    ap.error(f"--kernels: unknown {sorted(set(kernels) - set(KERNELS))}; known: {KERNELS}")
  a.configs = {k: v.split(",") for k, v in CONFIGS.items()}
  for spec in a.config:
    kernel, _, configs = spec.partition("=")
    if kernel not in KERNELS or not configs:
      ap.error(f"--config: expected KERNEL=C1,C2 with KERNEL one of {KERNELS}, got {spec!r}")
    a.configs[kernel] = configs.split(",")
  os.makedirs(a.out, exist_ok=True)
  rows = []
  for shape in a.shapes.split(","):
    cfg = get_preset(SHAPES[shape])
    for kernel in kernels:
      for b in (int(s) for s in a.batches.split(",")):
        rng = np.random.default_rng(0)
        for label, versions, diff, time_us, nbytes in CASES[kernel](a, cfg, b, rng):
          run_rounds(rows, {"kernel": kernel, "shape": shape, "batch": b, **label}, versions, a.rounds, diff,
                     time_us, nbytes)
  res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "args": {
      k: v for k, v in vars(a).items() if k != "config"}, "rows": rows}
  with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as fh:
    json.dump(res, fh, indent=1)
  for kernel in kernels:
    mine = [r for r in rows if r["kernel"] == kernel]
    labels = dict.fromkeys(k for r in mine for k in r if k not in _NOT_LABELS)  # the cases' labels, in order
    print(f"\n{kernel}:")
    print_table(mine, ("shape", "batch", *labels))


if __name__ == "__main__":
  main()
