"""Family `scan`: prefix sums along rows, and argmax / argmin along a dimension (int64 indices).

  cumsum          x (R, N) uniform [0, 1), an optional positive-valued op before it and a scale after it; checked
                  on positive-mean inputs only (INPUT_DISTRIBUTIONS, as the bundled suite's cumsum: prefix sums
                  of zero-mean inputs are ill-conditioned at atol = 1e-4); accumulated in double.
  argmax/argmin   over the last dimension of x (R, N) or dimension 1 of x (B, N, M), normal inputs, an optional op
                  before it whose fp32 result is bitwise the same in PyTorch and CUDA (abs, square, scale), so
                  near-ties cannot flip; ties go to the first index, as in PyTorch.

Candidates. cumsum: one thread per row (`naive`), a warp per row scanning 32-element tiles with shuffles and a
carry (`warp_scan`), a block per row scanning 1024-element tiles (`optimized`). argmax rows: `naive`,
`warp_per_row`, `optimized` (block per row); columns: `naive`, `grid_stride`, `optimized` (32 x 8 blocks).
Wrong: the exclusive prefix (`wrong_exclusive`), no carry between tiles (`wrong_no_carry`), whole tiles only
(`wrong_tail`), the op before the scan left out (`wrong_pre`), argmin for argmax (`wrong_op`), the wrong axis
(`wrong_axis`), the butterfly stopping early (`wrong_shuffle`), warp 0 only (`wrong_partial`), all `incorrect`;
an int* output for the int64 indices (`wrong_int32`, format_error).
"""

from __future__ import annotations

import random

from kevin_jax.data.taskgen import cuda, render, spec as spec_lib
from kevin_jax.data.taskgen import ops as ops_lib
from kevin_jax.data.taskgen.ops import Op
from kevin_jax.data.taskgen.render import Written
from kevin_jax.data.taskgen.spec import Spec

FAMILY = "scan"
CUMSUM_PRE = ("square", "exp", "sigmoid", "softplus", "mul_scalar")
ARG_PRE = ("abs", "square", "mul_scalar")
POSITIVE_ONLY = ('# Prefix sums of zero-mean inputs cross zero again and again; there PyTorch\'s own fp32 scan differs',
                 "# from the exact result by more than atol = 1e-4, so only positive-mean inputs are checked.",
                 'INPUT_DISTRIBUTIONS = ("task", "shifted", "shrunk")')


def sample(rng: random.Random) -> Spec | None:
  main = rng.choice(("cumsum", "cumsum", "argmax", "argmin"))
  axis = "col" if main != "cumsum" and rng.random() < 0.35 else "row"
  if main == "cumsum":
    pre = (ops_lib.draw_op(rng, rng.choice(CUMSUM_PRE)),) if rng.random() < 0.6 else ()
    if pre and pre[0].name == "mul_scalar":
      pre = (Op("mul_scalar", (abs(pre[0].consts[0]),)),)
    scaled = pre and pre[0].name == "mul_scalar"  # One scale constant per task.
    post = (ops_lib.draw_op(rng, "mul_scalar"),) if rng.random() < 0.3 and not scaled else ()
  else:
    pre = (ops_lib.draw_op(rng, rng.choice(ARG_PRE)),) if rng.random() < 0.5 else ()
    post = ()
  names = tuple(o.name for o in pre) + (main,) + tuple(o.name for o in post)
  held = any(spec_lib.heldout_pair(a, b) for a, b in zip(names, names[1:]))
  target = 10 ** rng.uniform(-0.6, 0.0) * 1e-3
  if axis == "row":
    N = spec_lib.odd_dim(rng, 1025 if main == "cumsum" else 257, 8191, heldout=held or False)
    passes = 8 if main == "cumsum" else 4  # Bytes per element of the eager scan (read + write) or argmax (read).
    R = round(target * spec_lib.BYTES_PER_S / ((passes + 8 * len(pre) + 8 * len(post)) * N)) | 1
    dims = (("R", R), ("N", N))
    small = (("R", rng.choice((3, 5))), ("N", rng.choice((1100, 1289)))) if main == "cumsum" else (
        ("R", rng.choice((13, 29, 37))), ("N", rng.choice((291, 389, 517))))
    numel = R * N
  else:
    N = spec_lib.odd_dim(rng, 257, 4099, heldout=held or False)
    M = spec_lib.odd_dim(rng, 257, 4099, heldout=None if held else False)
    B = max(3, round(target * spec_lib.BYTES_PER_S / ((4 + 8 * len(pre)) * N * M))) | 1
    dims = (("B", B), ("N", N), ("M", M))
    small = (("B", 3), ("N", rng.choice((77, 133))), ("M", rng.choice((37, 45, 69))))
    numel = B * N * M
  if not held and any(spec_lib.heldout_dim(v) for _, v in dims):
    return None
  ms = spec_lib.eager_ms([(8 * numel, 0)] * len(pre) + [(8 * numel if main == "cumsum" else 4 * numel, 0)]
                         + [(8 * numel, 0)] * len(post))
  if not spec_lib.in_band(ms) or 4 * numel > spec_lib.MAX_INPUT_BYTES:
    return None
  opts = (("axis", axis), ("keepdim", main != "cumsum" and rng.random() < 0.3))
  return Spec(FAMILY, main, pre, post, dims, small, opts, dist="rand" if main == "cumsum" else "randn",
              model_ms=round(ms, 4))


def module(spec: Spec, reduced: bool = False) -> str:
  d = dict(spec.small if reduced else spec.dims)
  chain = spec.pre + spec.post
  consts, init, body = render.chain_init(chain)
  main, axis = spec.main, spec.opt("axis")
  dim = 1 if axis == "col" else -1
  lines = (ops_lib.torch_lines(spec.pre, "x", var="x") if spec.pre else [])
  if main == "cumsum":
    lines.append(f"y = torch.cumsum(x, dim={dim})")
  else:
    lines.append(f"y = torch.{main}(x, dim={dim}" + (", keepdim=True)" if spec.opt("keepdim") else ")"))
  lines += ops_lib.torch_lines(spec.post, "y") if spec.post else []
  where = "dimension 1" if axis == "col" else "the last dimension"
  words = {"cumsum": "Inclusive prefix sum", "argmax": "Index of the maximum", "argmin": "Index of the minimum"}[main]
  doc = (f"{render.describe_chain(spec.pre)}, then " if spec.pre else "") + f"{words} along {where}" + (
      f", then {render.describe_chain(spec.post)}." if spec.post else ".")
  doc = doc[0].upper() + doc[1:]
  m = render.Module(doc=doc, constants=list(d.items()) + consts, init=init, body=body, args=["x"],
                    forward=lines + ["return y"],
                    inputs=["torch.rand(R, N)" if main == "cumsum" else
                            ("torch.randn(B, N, M)" if axis == "col" else "torch.randn(R, N)")],
                    notes=list(POSITIVE_ONLY) if main == "cumsum" else [],
                    functional=any(o.d.torch.startswith("F.") for o in chain))
  return m.text()


def describe(spec: Spec) -> str:
  shape = tuple(v for _, v in spec.dims)
  pre = f"{render.describe_chain(spec.pre)} first, " if spec.pre else ""
  if spec.main == "cumsum":
    return (f"Inclusive prefix sum along rows of {spec.dim('N')} elements of a {shape} tensor ({pre}"
            f"{'scaled after' if spec.post else 'no epilogue'}): read once, written once; sums in double.")
  where = "dimension 1" if spec.opt("axis") == "col" else "the last dimension"
  return (f"{spec.main} along {where} of a {shape} tensor ({pre.rstrip(', ') or 'no op before it'}): int64 indices, "
          "ties resolved to the first index as PyTorch does.")


# --- cumsum ----------------------------------------------------------------------------------------------------

def _apply_parts(spec: Spec, chain, name: str, body=None):
  if not chain:
    return "", [], [], (lambda v, i: v)
  src, decl, plan = ops_lib.cuda_apply(chain, name=name, body=body)
  names = ops_lib.call_args(decl)
  return src, decl, plan, (lambda v, i: f"{name}({', '.join([v, i] + names)})")


def _cumsum(spec: Spec, style: str, *, exclusive: bool = False, no_carry: bool = False, tail: bool = False,
            drop_pre: bool = False) -> tuple[str, str]:
  pre_src, pre_decl, pre_plan, pre = _apply_parts(spec, spec.pre, "before", body=() if drop_pre else None)
  post_src, post_decl, post_plan, post = _apply_parts(spec, spec.post, "after")
  sig = ", ".join(["const float* __restrict__ x", "float* __restrict__ y", "int R", "int N"] + pre_decl + post_decl)
  args = ", ".join(["x", "out", "x.shape[0]", "x.shape[1]"] + pre_plan + post_plan)
  helpers = "".join(s + "\n" for s in (pre_src, post_src) if s)
  load = lambda j: f"(double){pre(f'p[{j}]', f'(long long)r * N + {j}')}"
  store = lambda j, v: f"q[{j}] = {post(f'(float)({v})', f'(long long)r * N + {j}')};"
  if style == "naive":
    upd = (f"    {store('j', 's')}\n    s += {load('j')};\n" if exclusive
           else f"    s += {load('j')};\n    {store('j', 's')}\n")
    code = (helpers + f'extern "C" __global__ void cumsum_naive({sig}) {{\n'
            "  const int r = blockIdx.x * blockDim.x + threadIdx.x;\n  if (r >= R) return;\n"
            "  const float* p = x + (long long)r * N;\n  float* q = y + (long long)r * N;\n  double s = 0.0;\n"
            f"  for (int j = 0; j < N; ++j) {{\n{upd}  }}\n}}\n")
    return ("// One thread per row keeps a running sum in double.\n" + code,
            f"launch cumsum_naive grid=(cdiv(x.shape[0], 128),) block=(128,) args=({args})")
  if style == "warp":
    bound = "base + 32 <= N" if tail else "base < N"
    code = (helpers + f'extern "C" __global__ void cumsum_warp({sig}) {{\n'
            "  const int r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;\n"
            "  if (r >= R) return;  // Whole warps leave together.\n"
            "  const float* p = x + (long long)r * N;\n  float* q = y + (long long)r * N;\n  double carry = 0.0;\n"
            f"  for (int base = 0; {bound}; base += 32) {{\n"
            "    const int j = base + lane;\n"
            f"    double v = j < N ? {load('j')} : 0.0;\n"
            "    for (int off = 1; off < 32; off <<= 1) {\n"
            f"      const double u = __shfl_up_sync({cuda.FULL}, v, off);\n      if (lane >= off) v += u;\n    }}\n"
            f"    if (j < N) {store('j', 'carry + v')}\n"
            f"    carry += __shfl_sync({cuda.FULL}, v, 31);\n  }}\n}}\n")
    return ("// One warp per row: 32-element tiles, an inclusive shuffle scan per tile, a carry between tiles.\n"
            + code, f"launch cumsum_warp grid=(cdiv(x.shape[0], 8),) block=(256,) args=({args})")
  carry_add = "" if no_carry else "    carry += total;\n"
  code = (helpers + f'extern "C" __global__ void cumsum_block({sig}) {{\n'
          "  __shared__ double wsum[8];\n"
          "  const int r = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;\n"
          "  const float* p = x + (long long)r * N;\n  float* q = y + (long long)r * N;\n  double carry = 0.0;\n"
          "  for (int base = 0; base < N; base += 1024) {\n"
          "    const int j0 = base + 4 * t;\n    double s[4];\n    double run = 0.0;\n"
          f"    for (int e = 0; e < 4; ++e) {{\n      run += j0 + e < N ? {load('j0 + e')} : 0.0;\n"
          "      s[e] = run;\n    }\n"
          "    double inc = run;  // Inclusive scan of the thread totals within the warp.\n"
          "    for (int off = 1; off < 32; off <<= 1) {\n"
          f"      const double u = __shfl_up_sync({cuda.FULL}, inc, off);\n      if (lane >= off) inc += u;\n    }}\n"
          "    if (lane == 31) wsum[warp] = inc;\n    __syncthreads();\n"
          "    double before = 0.0, total = 0.0;\n"
          "    for (int w = 0; w < 8; ++w) {\n      if (w < warp) before += wsum[w];\n      total += wsum[w];\n    }\n"
          "    const double offset = carry + before + inc - run;\n"
          f"    for (int e = 0; e < 4; ++e)\n      if (j0 + e < N) {store('j0 + e', 'offset + s[e]')}\n"
          + carry_add + "    __syncthreads();  // wsum is rewritten by the next tile.\n  }\n}\n")
  return ("// One 256-thread block per row, 1024-element tiles: 4 elements per thread, a warp-shuffle scan of the\n"
          "// thread totals, warp totals through shared memory, a carry between tiles; all in double.\n" + code,
          f"launch cumsum_block grid=(x.shape[0],) block=(256,) args=({args})")


# --- argmax / argmin -------------------------------------------------------------------------------------------

def _better(main: str) -> str:
  return ">" if main == "argmax" else "<"


def _arg_helpers(main: str, last_offset: int = 1, block: bool = False, partial: bool = False) -> str:
  cmp = _better(main)
  warp = ("// (v, i) pairs: the better value wins, ties go to the lower index (PyTorch returns the first).\n"
          "__device__ __forceinline__ void better(float& v, int& i, float v2, int i2) {\n"
          f"  if (v2 {cmp} v || (v2 == v && i2 < i)) {{ v = v2; i = i2; }}\n}}\n\n"
          "__device__ __forceinline__ void warp_best(float& v, int& i) {\n"
          f"  for (int off = 16; off >= {last_offset}; off >>= 1) {{\n"
          f"    const float v2 = __shfl_xor_sync({cuda.FULL}, v, off);\n"
          f"    const int i2 = __shfl_xor_sync({cuda.FULL}, i, off);\n    better(v, i, v2, i2);\n  }}\n}}\n")
  if not block:
    return warp
  tail = "" if partial else "  for (int k = 1; k < (int)(blockDim.x >> 5); ++k) better(v, i, rv[k], ri[k]);\n"
  return warp + ("\n__device__ __forceinline__ void block_best(float& v, int& i, float* rv, int* ri) {\n"
                 "  warp_best(v, i);\n"
                 "  if ((threadIdx.x & 31) == 0) { rv[threadIdx.x >> 5] = v; ri[threadIdx.x >> 5] = i; }\n"
                 "  __syncthreads();\n  v = rv[0]; i = ri[0];\n" + tail + "}\n")


def _arg(spec: Spec, style: str, *, swap: bool = False, axis: bool = False, shuffle_last: int = 1,
         partial: bool = False, int32: bool = False) -> tuple[str, str]:
  main = spec.main
  if swap:
    main = "argmin" if main == "argmax" else "argmax"
  cmp, ident = _better(main), (cuda.NEG_INF if main == "argmax" else cuda.POS_INF)
  pre_src, pre_decl, pre_plan, pre = _apply_parts(spec, spec.pre, "before")
  oty = "int" if int32 else "long long"
  col = spec.opt("axis") == "col"
  helpers = pre_src + ("\n" if pre_src else "")
  if col:
    sig = ", ".join(["const float* __restrict__ x", f"{oty}* __restrict__ y", "int B", "int N", "int M"] + pre_decl)
    args = ", ".join(["x", "out", "x.shape[0]", "x.shape[1]", "x.shape[2]"] + pre_plan)
    base = "x + ((long long)b * M + m) * N" if axis else "x + (long long)b * N * M + m"
    step = "n" if axis else "(long long)n * M"
    scan = (f"    float best = {ident};\n    int bi = 0;\n"
            f"    for (int n = 0; n < N; ++n) {{\n      const float v = {pre(f'p[{step}]', '0')};\n"
            f"      if (v {cmp} best) {{ best = v; bi = n; }}\n    }}\n")
    if style in ("naive", "grid_stride"):
      head = ("  const long long stride = (long long)gridDim.x * blockDim.x;\n"
              "  for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < (long long)B * M; "
              "idx += stride) {\n") if style == "grid_stride" else (
          "  const long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
          "  if (idx < (long long)B * M) {\n")
      code = (helpers + f'extern "C" __global__ void arg_{style}({sig}) {{\n' + head
              + "    const int b = (int)(idx / M), m = (int)(idx % M);\n"
              f"    const float* p = {base};\n" + scan + "    y[idx] = bi;\n  }\n}\n")
      geo = ("grid=(min(cdiv(x.shape[0] * x.shape[2], 256), 2048),) block=(256,)" if style == "grid_stride"
             else "grid=(cdiv(x.shape[0] * x.shape[2], 256),) block=(256,)")
      note = ("// One thread per output column scans dimension 1; strict comparison keeps the first index.\n"
              if style == "naive" else "// A fixed grid; each thread strides over output columns.\n")
      return note + code, f"launch arg_{style} {geo} args=({args})"
    # 32 x 8 blocks: eight row slices per 32 columns, combined through shared memory in index order.
    combine = "" if partial else ("    for (int s = 1; s < 8; ++s) {\n      const float v2 = bv[s][threadIdx.x];\n"
                                  "      const int i2 = bn[s][threadIdx.x];\n"
                                  f"      if (v2 {cmp} best || (v2 == best && i2 < bi)) "
                                  "{ best = v2; bi = i2; }\n    }\n")
    code = (helpers + f'extern "C" __global__ void arg_tiled({sig}) {{\n'
            "  __shared__ float bv[8][33];\n  __shared__ int bn[8][33];\n"
            "  const int m = blockIdx.x * 32 + threadIdx.x, b = blockIdx.y;\n"
            f"  float best = {ident};\n  int bi = 0;\n"
            "  if (m < M) {\n    const float* p = x + (long long)b * N * M + m;\n"
            "    for (int n = threadIdx.y; n < N; n += 8) {\n"
            f"      const float v = {pre('p[(long long)n * M]', '0')};\n"
            f"      if (v {cmp} best) {{ best = v; bi = n; }}\n    }}\n  }}\n"
            "  bv[threadIdx.y][threadIdx.x] = best;\n  bn[threadIdx.y][threadIdx.x] = bi;\n  __syncthreads();\n"
            "  if (threadIdx.y == 0 && m < M) {\n" + combine + "    y[(long long)b * M + m] = bi;\n  }\n}\n")
    return ("// 32 x 8 blocks: each of 8 row slices scans every 8th row, shared memory combines them.\n" + code,
            f"launch arg_tiled grid=(cdiv(x.shape[2], 32), x.shape[0]) block=(32, 8) args=({args})")
  sig = ", ".join(["const float* __restrict__ x", f"{oty}* __restrict__ y", "int R", "int N"] + pre_decl)
  args = ", ".join(["x", "out", "x.shape[0]", "x.shape[1]"] + pre_plan)
  load = lambda j: pre("x[(long long)" + j + " * R + r]" if axis else f"p[{j}]", "0")
  if style == "naive":
    code = (helpers + f'extern "C" __global__ void arg_naive({sig}) {{\n'
            "  const int r = blockIdx.x * blockDim.x + threadIdx.x;\n  if (r >= R) return;\n"
            "  const float* p = x + (long long)r * N;\n"
            f"  float best = {ident};\n  int bi = 0;\n"
            f"  for (int j = 0; j < N; ++j) {{\n    const float v = {load('j')};\n"
            f"    if (v {cmp} best) {{ best = v; bi = j; }}\n  }}\n  y[r] = bi;\n}}\n")
    return ("// One thread per row; strict comparison keeps the first index of the best value.\n" + code,
            f"launch arg_naive grid=(cdiv(x.shape[0], 128),) block=(128,) args=({args})")
  def lane_scan(start: str, step: str) -> str:
    return (f"  float best = {ident};\n  int bi = 0;\n"
            f"  for (int j = {start}; j < N; j += {step}) {{\n"
            f"    const float v = {load('j')};\n"
            f"    if (v {cmp} best) {{ best = v; bi = j; }}\n  }}\n")
  if style == "warp":
    code = (_arg_helpers(main, shuffle_last) + "\n" + helpers + f'extern "C" __global__ void arg_warp({sig}) {{\n'
            "  const int r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;\n"
            "  if (r >= R) return;  // Whole warps leave together.\n  const float* p = x + (long long)r * N;\n"
            + lane_scan("lane", "32") + "  warp_best(best, bi);\n  if (lane == 0) y[r] = bi;\n}\n")
    return ("// One warp per row: each lane scans a strided slice, a shuffle butterfly combines (value, index).\n"
            + code, f"launch arg_warp grid=(cdiv(x.shape[0], 8),) block=(256,) args=({args})")
  code = (_arg_helpers(main, 1, block=True, partial=partial) + "\n" + helpers
          + f'extern "C" __global__ void arg_block({sig}) {{\n'
          "  __shared__ float rv[32];\n  __shared__ int ri[32];\n  const int r = blockIdx.x;\n"
          "  const float* p = x + (long long)r * N;\n"
          + lane_scan("threadIdx.x", "blockDim.x")
          + "  block_best(best, bi, rv, ri);\n  if (threadIdx.x == 0) y[r] = bi;\n}\n")
  return ("// One block per row: strided scans, warp shuffles, then one (value, index) per warp in shared memory.\n"
          + code, f"launch arg_block grid=(x.shape[0],) block=(256,) args=({args})")


def candidates(spec: Spec, rng: random.Random) -> list[Written]:
  if spec.main == "cumsum":
    out = [Written("naive", "correct", *_cumsum(spec, "naive"),
                   summary="One thread per row keeps a running sum in double."),
           Written("warp_scan", "correct", *_cumsum(spec, "warp"),
                   summary="One warp per row scans 32-element tiles with shuffles and carries the total across tiles."),
           Written("optimized", "correct", *_cumsum(spec, "block"),
                   summary="One block per row scans 1024-element tiles: serial scans of 4 elements per thread, a "
                           "warp-shuffle scan of thread totals, warp offsets through shared memory, a running carry.")]
    N = spec.dim("N")
    wrong = [("wrong_exclusive", "naive", {"exclusive": True}, 0,
              "writes the exclusive prefix (the sum before the element)"),
             ("wrong_no_carry", "block", {"no_carry": True}, 2,
              "no carry between 1024-element tiles: every tile restarts from zero"),
             ("wrong_tail", "warp", {"tail": True}, 1,
              f"scans whole 32-element tiles only: the last N % 32 = {N % 32} elements of every row are never written")]
    us = [(k + 0.5) / 512 for k in range(512)]  # U[0, 1) quantiles: the task's inputs.
    if spec.pre and ops_lib.differs(us, ops_lib.simulate(spec.pre, us)):
      wrong.append(("wrong_pre", "naive", {"drop_pre": True}, 0, f"leaves out the {spec.pre[0].name} before the sum"))
    picks = [(n, "incorrect", _cumsum(spec, style, **kw), base, bug) for n, style, kw, base, bug in wrong]
    picks = rng.sample(picks, 3)
  else:
    col = spec.opt("axis") == "col"
    styles = ("naive", "grid_stride", "tiled") if col else ("naive", "warp", "block")
    names = ("naive", "grid_stride", "optimized") if col else ("naive", "warp_per_row", "optimized")
    sums = (["One thread per output column scans dimension 1, keeping the first best index.",
             "A grid-stride loop over output columns, each scanning dimension 1.",
             "32 x 8 blocks: eight row slices per 32 columns, combined in shared memory by (value, index)."] if col else
            ["One thread per row scans it, keeping the first best index.",
             "One warp per row: strided lane scans and a shuffle butterfly over (value, index) pairs.",
             "One block per row: strided scans, warp shuffles and shared memory over (value, index) pairs."])
    out = [Written(n, "correct", *_arg(spec, st), summary=sm) for n, st, sm in zip(names, styles, sums)]
    other = "argmin" if spec.main == "argmax" else "argmax"
    picks = [("wrong_op", "incorrect", _arg(spec, "naive", swap=True), 0, f"computes {other} instead of {spec.main}"),
             ("wrong_axis", "incorrect", _arg(spec, "naive", axis=True), 0,
              "scans the wrong axis (indexes the input as if the reduced dimension were stored last)" if col else
              "reads the row with stride R (a column of the transposed view)"),
             ("wrong_int32", "format_error", _arg(spec, "naive", int32=True), 0,
              "writes the indices through an int* although the output is int64")]
    if col:
      picks.append(("wrong_partial", "incorrect", _arg(spec, "tiled", partial=True), 2,
                    "never combines the eight row slices: each column's index comes from every eighth row only"))
    else:
      picks.append(("wrong_shuffle", "incorrect", _arg(spec, "warp", shuffle_last=2), 1,
                    "the butterfly stops before offset 1: lane 0 never sees the odd lanes' candidates"))
      picks.append(("wrong_partial", "incorrect", _arg(spec, "block", partial=True), 2,
                    "the block result is warp 0's candidate only"))
    picks = rng.sample(picks, 3)
  for name, expect, (code, plan), base, bug in sorted(picks, key=lambda p: p[0]):
    out.append(Written(name, expect, code, plan, summary=out[base].summary, bug=bug))
  return out
