"""Family `reduce`: row and column reductions, softmax, log-softmax, RMS norm and layer norm, with epilogues.

Row ops work on x (R, N) along the last dimension: sum, mean, max, min, logsumexp (output (R,) or (R, 1)),
softmax, log_softmax, rms_norm, layer_norm (output (R, N); the norms have weight (and bias) parameters).
Column ops reduce x (B, N, M) over dimension 1: sum, mean, max, min (output (B, M) or (B, 1, M)). An epilogue of
0-2 elementwise ops follows (per-column broadcasts where the output has columns; a residual add of x after the
same-shape ops). Sums accumulate in double, so every style agrees with PyTorch far inside atol = 1e-4.

Candidates. Rows: one thread per row (`naive`), one warp per row with shuffle reductions (`warp_per_row`), one
block per row with warp shuffles and shared memory (`optimized`). Columns: one thread per output (`naive`), a
32 x 8 block per 32 columns with a shared-memory combine (`optimized`), a two-launch split over 64-row chunks
through a scratch buffer (`split`). Wrong: reducing along the wrong axis (`wrong_axis`), the butterfly stopping
before offset 1 (`wrong_shuffle`), the block result taken from warp 0 only (`wrong_partial`), the loop bound
rounded down to whole blocks or chunks (`wrong_tail`), and a wrong op (`wrong_op`: max for min, sum for mean,
a missing max, normaliser, weight or bias), all `incorrect`.
"""

from __future__ import annotations

import math
import random

from kevin_jax.data.taskgen import cuda, elementwise, render, spec as spec_lib
from kevin_jax.data.taskgen import ops as ops_lib
from kevin_jax.data.taskgen.render import Written
from kevin_jax.data.taskgen.spec import Spec

FAMILY = "reduce"
ROW_REDUCE = ("sum", "mean", "max", "min", "logsumexp")
ROW_SAME = ("softmax", "log_softmax", "rms_norm", "layer_norm")
COL_REDUCE = ("sum", "mean", "max", "min")

# Row recipes: steps ('pass', accumulator, reducer, term over v) or ('let', statement); then `out` (reductions,
# one value per row) or `elem` (same-shape ops, per element v at column j).
RECIPES = {
    "sum": ([("pass", "s", "sum", "v")], "(float)s", None),
    "mean": ([("pass", "s", "sum", "v")], "(float)(s / N)", None),
    "max": ([("pass", "s", "max", "v")], "s", None),
    "min": ([("pass", "s", "min", "v")], "s", None),
    "logsumexp": ([("pass", "m", "max", "v"), ("pass", "s", "sum", "expf(v - m)")], "m + logf((float)s)", None),
    "softmax": ([("pass", "m", "max", "v"), ("pass", "s", "sum", "expf(v - m)")], None, "expf(v - m) / (float)s"),
    "log_softmax": ([("pass", "m", "max", "v"), ("pass", "s", "sum", "expf(v - m)")], None,
                    "v - m - logf((float)s)"),
    "rms_norm": ([("pass", "s", "sum", "v * v"), ("let", "const float inv = rsqrtf((float)(s / N) + eps);")], None,
                 "v * inv * weight[j]"),
    "layer_norm": ([("pass", "s", "sum", "v"), ("let", "const float mu = (float)(s / N);"),
                    ("pass", "q", "sum", "(v - mu) * (v - mu)"),
                    ("let", "const float rstd = rsqrtf((float)(q / N) + eps);")], None,
                   "(v - mu) * rstd * weight[j] + bias[j]"),
}
WRONG_OP = {  # main -> (recipe change, bug)
    "sum": ({"out": "(float)(s / N)"}, "divides the sum by N (computes the mean)"),
    "mean": ({"out": "(float)s"}, "never divides by N (computes the sum)"),
    "max": ({"kind": "min"}, "takes the minimum instead of the maximum"),
    "min": ({"kind": "max"}, "takes the maximum instead of the minimum"),
    "logsumexp": ({"out": "logf((float)s)"}, "forgets to add the row maximum back"),
    "softmax": ({"elem": "expf(v - m)"}, "never divides by the row sum"),
    "log_softmax": ({"elem": "v - logf((float)s)"}, "subtracts log(sum exp(x - max)) but forgets the max"),
    "rms_norm": ({"elem": "v * inv"}, "forgets to multiply by the weight"),
    "layer_norm": ({"elem": "(v - mu) * rstd * weight[j]"}, "forgets to add the bias"),
}
TORCH = {"sum": "torch.sum(x, dim={d}{k})", "mean": "torch.mean(x, dim={d}{k})", "max": "torch.amax(x, dim={d}{k})",
         "min": "torch.amin(x, dim={d}{k})", "logsumexp": "torch.logsumexp(x, dim=-1{k})",
         "softmax": "torch.softmax(x, dim=-1)", "log_softmax": "torch.log_softmax(x, dim=-1)",
         "rms_norm": "x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight",
         "layer_norm": "F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)"}
EAGER_PASSES = {"logsumexp": 6, "softmax": 2, "log_softmax": 2, "rms_norm": 7, "layer_norm": 2}  # x-sized passes.


def main_sample(main: str, n: int) -> list[float]:
  """An approximate sample of the main op's output on N(0, 1) inputs (for the epilogue's health check)."""
  q = ops_lib.sample_inputs()
  big = math.sqrt(2 * math.log(n))
  z = ops_lib.sample_inputs()[::-1]
  gain, shift = [1.0 + 0.1 * v for v in z[::3] * 3], [0.1 * v for v in z[1::3] * 3]  # Norm weights, biases.
  return {"sum": [math.sqrt(n) * v for v in q], "mean": [v / math.sqrt(n) for v in q],
          "max": [big - 0.9 + 0.35 * v for v in q], "min": [-big + 0.9 + 0.35 * v for v in q],
          "logsumexp": [math.log(n) + 0.5 + 2.0 * v / math.sqrt(n) for v in q],
          "softmax": [math.exp(v - 0.5) / n for v in q], "log_softmax": [v - math.log(n) - 0.5 for v in q],
          "rms_norm": [v * g for v, g in zip(q, gain)],
          "layer_norm": [v * g + b for v, g, b in zip(q, gain, shift)]}[main]


def sample(rng: random.Random) -> Spec | None:
  axis = "col" if rng.random() < 0.3 else "row"
  main = rng.choice(COL_REDUCE if axis == "col" else ROW_REDUCE + ROW_SAME)
  same = main in ROW_SAME
  post = elementwise.draw_chain(rng, rng.choice((0, 1, 1, 2)), first_unary=False, residual=same,
                                broadcast=("add_column", "mul_column") if (same or axis == "col") else ())
  if post is None:
    return None
  names = (main,) + tuple(o.name for o in post)
  held = any(spec_lib.heldout_pair(a, b) for a, b in zip(names, names[1:]))
  hi = {"softmax": 1025}.get(main, 4099 if axis == "col" else 8191)  # Softmax: values well above atol.
  N = spec_lib.odd_dim(rng, 257, hi, heldout=held or False)
  ys = ops_lib.simulate(post, main_sample(main, N), res=ops_lib.sample_inputs())
  if not ops_lib.healthy(ys, ops_lib.sample_inputs() if same else None):
    return None
  target = 10 ** rng.uniform(-0.6, 0.0) * 1e-3
  passes = EAGER_PASSES.get(main, 1)
  if axis == "row":
    R = round(target * spec_lib.BYTES_PER_S / (4 * passes * N)) | 1
    R = min(R, 2**20)
    dims, small = (("R", R), ("N", N)), (("R", rng.choice((13, 29, 37))), ("N", rng.choice((291, 389, 517))))
    numel, out_numel = R * N, R * N if same else R
  else:
    M = spec_lib.odd_dim(rng, 257, 4099, heldout=None if held else False)
    B = max(3, round(target * spec_lib.BYTES_PER_S / (4 * N * M))) | 1
    dims, small = (("B", B), ("N", N), ("M", M)), (("B", 3), ("N", rng.choice((77, 133, 150))),
                                                   ("M", rng.choice((37, 45, 69))))
    numel, out_numel = B * N * M, B * M
  ms = spec_lib.eager_ms([(4 * passes * numel + 4 * out_numel, 0)] + [(8 * out_numel, 0)] * len(post))
  if not spec_lib.in_band(ms) or 4 * numel > spec_lib.MAX_INPUT_BYTES:
    return None
  if not held and any(spec_lib.heldout_dim(v) for _, v in dims):
    return None
  opts = (("axis", axis), ("keepdim", (not same) and rng.random() < 0.3))
  if main in ("rms_norm", "layer_norm"):
    opts += (("eps", rng.choice((1e-5, 1e-6))),)
  return Spec(FAMILY, main, (), post, dims, small, opts, model_ms=round(ms, 4))


def module(spec: Spec, reduced: bool = False) -> str:
  d = dict(spec.small if reduced else spec.dims)
  axis, main = spec.opt("axis"), spec.main
  consts, init, body = render.chain_init(spec.post, l_size="M" if axis == "col" else "N")
  if main in ("rms_norm", "layer_norm"):
    init = [("features", "int", "N"), ("eps", "float", "EPS")] + init
    norm = ["self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(features))"]
    if main == "layer_norm":
      norm.append("self.bias = nn.Parameter(0.1 * torch.randn(features))")
    body = norm + ["self.eps = eps"] + body
    consts = [("EPS", spec.opt("eps"))] + consts
  expr = TORCH[main].format(d=1 if axis == "col" else -1, k=", keepdim=True" if spec.opt("keepdim") else "")
  where = "dimension 1" if axis == "col" else "the last dimension"
  doc = f"{main.replace('_', ' ').capitalize()} over {where}" + (
      f", then {render.describe_chain(spec.post)}." if spec.post else ".")
  m = render.Module(doc=doc, constants=list(d.items()) + consts, init=init, body=body, args=["x"],
                    forward=[f"y = {expr}"] + _chain_lines(spec.post) + ["return y"],
                    inputs=["torch.randn(B, N, M)" if axis == "col" else "torch.randn(R, N)"],
                    functional=main == "layer_norm" or any(o.d.torch.startswith("F.") for o in spec.post))
  return m.text()


def _chain_lines(post) -> list[str]:
  return ops_lib.torch_lines(post, "y", res="x") if post else []


def describe(spec: Spec) -> str:
  axis, main = spec.opt("axis"), spec.main
  epi = f", then {render.describe_chain(spec.post)}" if spec.post else ""
  if axis == "col":
    B, N, M = (spec.dim(k) for k in "BNM")
    return (f"{main.capitalize()} over dimension 1 of a ({B}, {N}, {M}) tensor{epi}: {B * N * M * 4 / 2**30:.2f} GiB "
            "read once; adjacent threads take adjacent columns so the strided reduction stays coalesced.")
  R, N = spec.dim("R"), spec.dim("N")
  what = "one value per row" if main in ROW_REDUCE else "a row-wise normalisation"
  return (f"{main.replace('_', ' ').capitalize()} along rows of {N} elements, {R} rows{epi}: {what}, "
          f"{R * N * 4 / 2**30:.2f} GiB of input; one pass per reduction over each row.")


def candidates(spec: Spec, rng: random.Random) -> list[Written]:
  if spec.opt("axis") == "col":
    return _col_candidates(spec, rng)
  return _row_candidates(spec, rng)


# --- rows ------------------------------------------------------------------------------------------------------

def _epilogue(spec: Spec, l_size: str):
  """(apply source, extra kernel params, their plan args, call(value, index, residual) -> str)."""
  post = spec.post
  if not post:
    return "", [], [], lambda v, i, r="": v
  src, decl, plan = ops_lib.cuda_apply(post)
  names = ops_lib.call_args(decl)
  res = any(o.name == "residual" for o in post)
  plan = [{"@L": l_size}.get(a, a) for a in plan]
  return src, decl, plan, lambda v, i, r="": f"apply({', '.join([v, i] + ([r] if res else []) + names)})"


def _row_kernel(spec: Spec, style: str, *, kind_swap: str = "", out: str = "", elem: str = "", axis: bool = False,
                shuffle_last: int = 1, partial: bool = False, tail: bool = False) -> tuple[str, str]:
  main = spec.main
  steps, r_out, r_elem = RECIPES[main]
  r_out, r_elem = out or r_out, elem or r_elem
  same = r_elem is not None
  apply_src, decl, plan_extra, call = _epilogue(spec, "x.shape[1]")
  norm = main in ("rms_norm", "layer_norm")
  params = ["const float* __restrict__ x", "float* __restrict__ y", "int R", "int N"]
  args = ["x", "out", "x.shape[0]", "x.shape[1]"]
  if norm:
    params += ["const float* __restrict__ weight"] + (["const float* __restrict__ bias"] if main == "layer_norm"
                                                      else []) + ["float eps"]
    args += ["weight"] + (["bias"] if main == "layer_norm" else []) + ["eps"]
  kinds = sorted({kind_swap or st[2] for st in steps if st[0] == "pass"})
  helpers = []
  if style in ("warp", "block"):
    helpers += [cuda.warp_reduce(k, shuffle_last) for k in kinds]
  if style == "block":
    helpers += [cuda.block_reduce(k, partial) for k in kinds]
  loop = {"naive": "for (int j = 0; j < N; ++j)", "warp": "for (int j = lane; j < N; j += 32)",
          "block": "for (int j = threadIdx.x; j < N; j += blockDim.x)"}[style]
  load = "x[(long long)j * R + r]" if axis else "p[j]"
  lines = []
  if style == "naive":
    lines += ["  const int r = blockIdx.x * blockDim.x + threadIdx.x;", "  if (r >= R) return;"]
  elif style == "warp":
    lines += ["  const int r = blockIdx.x * 8 + (threadIdx.x >> 5);", "  const int lane = threadIdx.x & 31;",
              "  if (r >= R) return;  // Whole warps leave together."]
  else:
    lines += ["  const int r = blockIdx.x;"]
    for k in kinds:
      ct = cuda.REDUCERS[k][0]
      lines.append(f"  __shared__ {ct} red_{k}[32];")
  lines.append("  const float* p = x + (long long)r * N;")
  for st in steps:
    if st[0] == "let":
      lines.append("  " + st[1])
      continue
    _, acc, kind, term = st
    kind = kind_swap or kind
    ct, ident, _ = cuda.REDUCERS[kind]
    bound = loop.replace("j < N", "j < N - N % blockDim.x") if (tail and style == "block" and not same) else loop
    lines.append(f"  {ct} {acc} = {ident};")
    lines.append(f"  {bound} {{")
    lines.append(f"    const float v = {load};")
    cast = f"(double)({term})" if ct == "double" else term
    lines.append(f"    {acc} = {cuda.combine(kind, acc, cast)};")
    lines.append("  }")
    if style == "warp":
      lines.append(f"  {acc} = warp_{kind}({acc});")
    elif style == "block":
      lines.append(f"  {acc} = block_{kind}({acc}, red_{kind});")
  if not same:
    who = {"naive": "", "warp": "if (lane == 0) ", "block": "if (threadIdx.x == 0) "}[style]
    lines.append(f"  {who}y[r] = {call(r_out, 'r')};")
  else:
    wloop = loop.replace("j < N", "j < N - N % blockDim.x") if (tail and style == "block") else loop
    lines += ["  float* o = y + (long long)r * N;", f"  {wloop} {{", "    const float v = p[j];",
              f"    o[j] = {call(r_elem, '(long long)r * N + j', 'v')};", "  }"]
  name = {"naive": "rows_naive", "warp": "rows_warp", "block": "rows_block"}[style]
  sig = ", ".join(params + decl)
  code = ("\n".join(helpers) + ("\n" if helpers else "") + (apply_src + "\n" if apply_src else "")
          + f'extern "C" __global__ void {name}({sig}) {{\n' + "\n".join(lines) + "\n}\n")
  geo = {"naive": "grid=(cdiv(x.shape[0], 128),) block=(128,)", "warp": "grid=(cdiv(x.shape[0], 8),) block=(256,)",
         "block": "grid=(x.shape[0],) block=(256,)"}[style]
  return code, f"launch {name} {geo} args=({', '.join(args + plan_extra)})"


def _row_candidates(spec: Spec, rng: random.Random) -> list[Written]:
  main = spec.main
  same = main in ROW_SAME
  N = spec.dim("N")
  what = "statistics" if same else "reduction"
  out = [Written("naive", "correct", *_row_kernel(spec, "naive"),
                 summary=f"One thread per row walks the row serially for the {what} (sums in double)."),
         Written("warp_per_row", "correct", *_row_kernel(spec, "warp"),
                 summary="One warp per row: lanes stride through the row and a shuffle butterfly combines the "
                         f"{what}."),
         Written("optimized", "correct", *_row_kernel(spec, "block"),
                 summary="One 256-thread block per row: strided loads, warp shuffles and shared memory for the "
                         f"{what}.")]
  change, bug = WRONG_OP[main]
  wrong = [("wrong_axis", "naive", {"axis": True}, 0,
            "reads the row's elements with stride R (a column of the transposed view), not along the row"),
           ("wrong_shuffle", "warp", {"shuffle_last": 2}, 1,
            "the shuffle butterfly stops before offset 1: each lane misses its neighbour lane's values"),
           ("wrong_partial", "block", {"partial": True}, 2,
            "the block reduction returns warp 0's partial result only"),
           ("wrong_op", "block", {("kind_swap" if "kind" in change else k): v for k, v in change.items()}, 2, bug)]
  if main not in ("max", "min"):
    lost = N % 256
    wrong.append(("wrong_tail", "block", {"tail": True}, 2,
                  f"the loops stop at a whole number of blocks: the last N % 256 = {lost} elements of every row are "
                  + ("never written" if same else "left out")))
  pick = rng.sample(wrong, 3)
  for name, style, kw, base, bug in sorted(pick, key=lambda w: w[0]):
    out.append(Written(name, "incorrect", *_row_kernel(spec, style, **kw), summary=out[base].summary, bug=bug))
  return out


# --- columns ---------------------------------------------------------------------------------------------------

def _col_out(main: str, kind_swap: str = "", out: str = "") -> tuple[str, str]:
  kind = kind_swap or {"sum": "sum", "mean": "sum", "max": "max", "min": "min"}[main]
  default = {"sum": "(float)s", "mean": "(float)(s / N)"}.get(main, "s")
  return kind, out or default


def _col_kernels(spec: Spec, style: str, *, kind_swap: str = "", out: str = "", axis: bool = False,
                 partial: bool = False, tail: bool = False) -> tuple[str, str]:
  kind, r_out = _col_out(spec.main, kind_swap, out)
  ct, ident, _ = cuda.REDUCERS[kind]
  apply_src, decl, plan_extra, call = _epilogue(spec, "x.shape[2]")
  acc = (lambda a, b: cuda.combine(kind, a, f"(double){b}" if ct == "double" else b))
  pre = apply_src + "\n" if apply_src else ""
  if style == "naive":
    base = "x + ((long long)b * M + m) * N" if axis else "x + (long long)b * N * M + m"
    step = "p[n]" if axis else "p[(long long)n * M]"
    sig = ", ".join(["const float* __restrict__ x", "float* __restrict__ y", "int B", "int N", "int M"] + decl)
    code = (pre + f'extern "C" __global__ void cols_naive({sig}) {{\n'
            "  const long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
            "  if (idx >= (long long)B * M) return;\n"
            "  const int b = (int)(idx / M), m = (int)(idx % M);\n"
            f"  const float* p = {base};\n  {ct} s = {ident};\n"
            f"  for (int n = 0; n < N; ++n) s = {acc('s', step)};\n"
            f"  y[idx] = {call(r_out, 'idx')};\n}}\n")
    plan = (f"launch cols_naive grid=(cdiv(x.shape[0] * x.shape[2], 256),) block=(256,) "
            f"args=({', '.join(['x', 'out', 'x.shape[0]', 'x.shape[1]', 'x.shape[2]'] + plan_extra)})")
    return code, plan
  if style == "tiled":
    sig = ", ".join(["const float* __restrict__ x", "float* __restrict__ y", "int B", "int N", "int M"] + decl)
    combine = ("" if partial else
               f"    for (int k = 1; k < 8; ++k) s = {cuda.combine(kind, 's', 'part[k][threadIdx.x]')};\n")
    code = (pre + f'extern "C" __global__ void cols_tiled({sig}) {{\n'
            f"  __shared__ {ct} part[8][33];\n"
            "  const int m = blockIdx.x * 32 + threadIdx.x, b = blockIdx.y;\n"
            f"  {ct} s = {ident};\n"
            "  if (m < M) {\n    const float* p = x + (long long)b * N * M + m;\n"
            f"    for (int n = threadIdx.y; n < N; n += 8) s = {acc('s', 'p[(long long)n * M]')};\n  }}\n"
            "  part[threadIdx.y][threadIdx.x] = s;\n  __syncthreads();\n"
            "  if (threadIdx.y == 0 && m < M) {\n" + combine +
            "    const long long i = (long long)b * M + m;\n"
            f"    y[i] = {call(r_out, 'i')};\n  }}\n}}\n")
    plan = (f"launch cols_tiled grid=(cdiv(x.shape[2], 32), x.shape[0]) block=(32, 8) "
            f"args=({', '.join(['x', 'out', 'x.shape[0]', 'x.shape[1]', 'x.shape[2]'] + plan_extra)})")
    return code, plan
  # Two launches: 64-row chunk partials into scratch, then one thread per output combines them.
  S = "x.shape[1] // 64" if tail else "cdiv(x.shape[1], 64)"
  dt = "float64" if ct == "double" else "float32"
  sig1 = f"const float* __restrict__ x, {ct}* __restrict__ part, int N, int M, int S"
  sig2 = ", ".join([f"const {ct}* __restrict__ part", "float* __restrict__ y", "int B", "int N", "int M", "int S"]
                   + decl)
  code = (f'extern "C" __global__ void cols_partial({sig1}) {{\n'
          "  const int m = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y, b = blockIdx.z;\n"
          "  if (m >= M) return;\n  const int n0 = c * 64, n1 = min(N, n0 + 64);\n"
          "  const float* p = x + (long long)b * N * M + m;\n"
          f"  {ct} s = {ident};\n  for (int n = n0; n < n1; ++n) s = {acc('s', 'p[(long long)n * M]')};\n"
          "  part[((long long)b * S + c) * M + m] = s;\n}\n\n" + pre +
          f'extern "C" __global__ void cols_finish({sig2}) {{\n'
          "  const long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
          "  if (idx >= (long long)B * M) return;\n"
          "  const int b = (int)(idx / M), m = (int)(idx % M);\n"
          f"  {ct} s = {ident};\n"
          f"  for (int c = 0; c < S; ++c) s = {cuda.combine(kind, 's', 'part[((long long)b * S + c) * M + m]')};\n"
          f"  y[idx] = {call(r_out, 'idx')};\n}}\n")
  plan = (f"scratch part: {dt}[x.shape[0], {S}, x.shape[2]]\n"
          f"launch cols_partial grid=(cdiv(x.shape[2], 256), {S}, x.shape[0]) block=(256,) "
          f"args=(x, part, x.shape[1], x.shape[2], {S})\n"
          f"launch cols_finish grid=(cdiv(x.shape[0] * x.shape[2], 256),) block=(256,) "
          f"args=({', '.join(['part', 'out', 'x.shape[0]', 'x.shape[1]', 'x.shape[2]', S] + plan_extra)})")
  return code, plan


def _col_candidates(spec: Spec, rng: random.Random) -> list[Written]:
  out = [Written("naive", "correct", *_col_kernels(spec, "naive"),
                 summary="One thread per output column walks dimension 1; adjacent threads read adjacent columns."),
         Written("optimized", "correct", *_col_kernels(spec, "tiled"),
                 summary="32 x 8 blocks: eight row slices per 32 columns, combined through shared memory."),
         Written("split", "correct", *_col_kernels(spec, "split"),
                 summary="Two launches: partial results over 64-row chunks into a scratch buffer, then one "
                         "thread per output combines them.")]
  change, bug = WRONG_OP[spec.main]
  N = spec.dim("N")
  wrong = [("wrong_axis", "naive", {"axis": True}, 0,
            "indexes the input as if it were stored (B, M, N): reduces over the wrong axis"),
           ("wrong_partial", "tiled", {"partial": True}, 1,
            "never combines the eight row slices: each output covers every eighth row only"),
           ("wrong_tail", "split", {"tail": True}, 2,
            f"rounds the chunk count down: the last N % 64 = {N % 64} rows are left out"),
           ("wrong_op", "naive", {("kind_swap" if "kind" in change else k): v for k, v in change.items()}, 0, bug)]
  for name, style, kw, base, bug_text in sorted(rng.sample(wrong, 3), key=lambda w: w[0]):
    out.append(Written(name, "incorrect", *_col_kernels(spec, style, **kw), summary=out[base].summary,
                       bug=bug_text))
  return out
