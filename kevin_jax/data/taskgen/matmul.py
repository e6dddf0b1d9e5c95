"""Family `matmul`: matmul, nn.Linear, batched matmul and matrix-vector products with epilogue chains.

  matmul  a (M, K) @ b (K, N), uniform [0, 1) operands          linear  nn.Linear(K, N) on x (M, K), normal x
  bmm     a (Bt, M, K) @ b (Bt, K, N), uniform operands          matvec  a (M, K) @ v (K,), uniform operands
Epilogue: 0-3 elementwise ops (per-output-column bias or gain, a residual input `res` of the output's shape for
matmul and linear). K stays at most 1100 (4099 for matvec, accumulated in double) so that fp32 dot products in
any summation order agree within atol = 1e-4; Laplace operands are left out (INPUT_DISTRIBUTIONS), as in the
bundled suite's matmul tasks.

Candidates: one thread per output (`naive`), 16 x 16 shared-memory tiles (`tiled16`), 64 x 64 tiles with a
4 x 4 register block per thread (`optimized`); matvec: one thread per row (`naive`), a warp per row with
shuffles (`optimized`), a block per row (`block_per_row`). Wrong (all `incorrect`): the second operand read in
the transposed layout (`wrong_layout`), whole K-tiles only (`wrong_k_tail`), the epilogue or bias wrong
(`wrong_epilogue`, `wrong_no_bias`), matvec's butterfly stopping early (`wrong_shuffle`) or its block taking
warp 0's sum (`wrong_partial`).
"""

from __future__ import annotations

import math
import random

from kevin_jax.data.taskgen import cuda, elementwise, render, spec as spec_lib
from kevin_jax.data.taskgen import ops as ops_lib
from kevin_jax.data.taskgen.ops import Op
from kevin_jax.data.taskgen.render import Written
from kevin_jax.data.taskgen.spec import Spec

FAMILY = "matmul"
MAINS = ("matmul", "linear", "bmm", "matvec")
NO_HEAVY = ('# Laplace ("heavy") operands are left out: with them some K-term fp32 dot products differ by more than',
            "# 1e-4 between two valid summation orders, so even a correct kernel could fail.",
            'INPUT_DISTRIBUTIONS = ("task", "normal", "uniform", "shifted", "shrunk")')


def main_sample(main: str, K: int) -> list[float]:
  q = ops_lib.sample_inputs()
  if main == "linear":
    return [0.577 * v for v in q]
  return [K / 4 + math.sqrt(K * 0.0486) * v for v in q]  # Sums of K products of U[0, 1) pairs.


def sample(rng: random.Random) -> Spec | None:
  main = rng.choice(MAINS)
  post = elementwise.draw_chain(rng, rng.choice((0, 1, 1, 2, 3)), first_unary=False,
                                broadcast=() if main == "matvec" else ("add_column", "mul_column"),
                                residual=main in ("matmul", "linear"))
  if post is None:
    return None
  names = (main,) + tuple(o.name for o in post)
  held = any(spec_lib.heldout_pair(a, b) for a, b in zip(names, names[1:]))
  train_dim = None if held else False
  target = 10 ** rng.uniform(-0.6, 0.0) * 1e-3
  if main == "matvec":
    K = spec_lib.odd_dim(rng, 1025, 4099, heldout=held or False)
    M = round(target * spec_lib.BYTES_PER_S / (4 * K)) | 1
    dims, small = (("M", M), ("K", K)), (("M", rng.choice((37, 45, 69))), ("K", rng.choice((291, 389))))
    kernels, numel_in, out = [(4 * M * K, 2 * M * K)], M * K + K, M
  else:
    K = spec_lib.odd_dim(rng, 129, 1100, heldout=held or False)
    if main == "bmm":
      M, N = spec_lib.odd_dim(rng, 129, 1100, heldout=train_dim), spec_lib.odd_dim(rng, 129, 1100, heldout=train_dim)
      Bt = max(1, round(target * spec_lib.FLOPS_PER_S / (2 * M * N * K))) | 1
      dims = (("BT", Bt), ("M", M), ("K", K), ("N", N))
      small = (("BT", 2), ("M", rng.choice((37, 45))), ("K", rng.choice((29, 53))), ("N", rng.choice((39, 71))))
      out = Bt * M * N
      numel_in = Bt * (M * K + K * N)
    else:
      N = spec_lib.odd_dim(rng, 257, 4099, heldout=train_dim)
      M = round(target * spec_lib.FLOPS_PER_S / (2 * N * K)) | 1
      dims = (("M", M), ("K", K), ("N", N))
      small = (("M", rng.choice((37, 45, 69))), ("K", rng.choice((29, 53, 77))), ("N", rng.choice((39, 71, 83))))
      out = M * N
      numel_in = M * K + (0 if main == "linear" else K * N) + (out if any(o.name == "residual" for o in post) else 0)
    kernels = [(4 * (numel_in + out), 2 * out * K)]
  kernels += [(8 * out, 0)] * len(post)
  ms = spec_lib.eager_ms(kernels)
  if not spec_lib.in_band(ms) or 4 * numel_in > spec_lib.MAX_INPUT_BYTES:
    return None
  if min(v for _, v in dims) < 1 or (not held and any(spec_lib.heldout_dim(v) for _, v in dims)):
    return None
  ys = ops_lib.simulate(post, main_sample(main, K))
  if not ops_lib.healthy(ys):
    return None
  opts = (("bias", rng.random() < 0.8),) if main == "linear" else ()
  return Spec(FAMILY, main, (), post, dims, small, opts, dist="randn" if main == "linear" else "rand",
              model_ms=round(ms, 4))


def _operands(spec: Spec) -> tuple[list[str], list[str]]:
  """(forward args, get_inputs expressions)."""
  res = any(o.name == "residual" for o in spec.post)
  m = spec.main
  if m == "linear":
    return ["x"] + (["res"] if res else []), ["torch.randn(M, K)"] + (["torch.randn(M, N)"] if res else [])
  if m == "matvec":
    return ["a", "v"], ["torch.rand(M, K)", "torch.rand(K)"]
  if m == "bmm":
    return ["a", "b"], ["torch.rand(BT, M, K)", "torch.rand(BT, K, N)"]
  return ["a", "b"] + (["res"] if res else []), ["torch.rand(M, K)", "torch.rand(K, N)"] + (
      ["torch.randn(M, N)"] if res else [])


def module(spec: Spec, reduced: bool = False) -> str:
  d = dict(spec.small if reduced else spec.dims)
  main = spec.main
  consts, init, body = render.chain_init(spec.post, l_size="N")
  args, inputs = _operands(spec)
  expr = {"matmul": "torch.matmul(a, b)", "bmm": "torch.bmm(a, b)", "matvec": "torch.matmul(a, v)",
          "linear": "self.linear(x)"}[main]
  if main == "linear":
    init = [("in_features", "int", "K"), ("out_features", "int", "N")] + init
    body = [f"self.linear = nn.Linear(in_features, out_features, bias={spec.opt('bias')})"] + body
  what = {"matmul": "Matrix product a @ b", "bmm": "Batched matrix product a @ b",
          "matvec": "Matrix-vector product a @ v",
          "linear": "Linear layer (x @ W^T" + (" + b)" if spec.opt("bias") else ")")}[main]
  doc = what + (f", then {render.describe_chain(spec.post)}." if spec.post else ".")
  lines = [f"y = {expr}"] + (ops_lib.torch_lines(spec.post, "y", res="res") if spec.post else []) + ["return y"]
  m = render.Module(doc=doc, constants=list(d.items()) + consts, init=init, body=body, args=args, forward=lines,
                    inputs=inputs, notes=[] if main == "linear" else list(NO_HEAVY),
                    functional=any(o.d.torch.startswith("F.") for o in spec.post))
  return m.text()


def describe(spec: Spec) -> str:
  main = spec.main
  epi = f", then {render.describe_chain(spec.post)}" if spec.post else ""
  if main == "matvec":
    M, K = spec.dim("M"), spec.dim("K")
    return (f"Matrix-vector product of a {M} x {K} matrix{epi}: {4 * M * K / 2**30:.2f} GiB read once, "
            "memory-bound; dot products accumulated in double.")
  M, K, N = spec.dim("M"), spec.dim("K"), spec.dim("N")
  bt = spec.dim("BT") if main == "bmm" else 1
  gflop = 2 * bt * M * N * K / 1e9
  name = {"matmul": "fp32 GEMM", "bmm": f"batched fp32 GEMM ({bt} batches)", "linear": "nn.Linear"}[main]
  return (f"{name} {M} x {K} x {N} ({gflop:.1f} GFLOP, no TF32){epi}: compute-bound; the epilogue fuses into "
          "the GEMM's store.")


# --- GEMM-shaped kernels -----------------------------------------------------------------------------------

def _b_index(spec: Spec, k: str, c: str, layout: bool) -> str:
  """Where B[k][c] lives: b (K, N) row-major; nn.Linear's weight is (N, K)."""
  k, c = (f"({e})" if " " in e else e for e in (k, c))
  if spec.main == "linear":
    return f"w[(long long){k} * N + {c}]" if layout else f"w[(long long){c} * K + {k}]"
  return f"b[(long long){c} * K + {k}]" if layout else f"b[(long long){k} * N + {c}]"


def _gemm(spec: Spec, style: str, *, layout: bool = False, k_tail: bool = False, post=None,
          no_bias: bool = False) -> tuple[str, str]:
  main = spec.main
  post = spec.post if post is None else post
  lin, bmm = main == "linear", main == "bmm"
  res = any(o.name == "residual" for o in spec.post)
  apply_src, decl, plan_extra = ops_lib.cuda_apply(spec.post, body=post) if spec.post else ("", [], [])
  names = ops_lib.call_args(decl)
  plan_extra = [{"@L": "out.shape[-1]"}.get(a, a) for a in plan_extra]
  has_bias = lin and spec.opt("bias")
  params = (["const float* __restrict__ x", "const float* __restrict__ w"] if lin
            else ["const float* __restrict__ a", "const float* __restrict__ b"])
  params += (["const float* __restrict__ bias"] if has_bias else []) + (
      ["const float* __restrict__ res"] if res else []) + ["float* __restrict__ y", "int M", "int N", "int K"] + decl
  a_name = "x" if lin else "a"
  args = ([a_name, "linear.weight"] if lin else ["a", "b"]) + (["linear.bias"] if has_bias else []) + (
      ["res"] if res else []) + ["out", f"{a_name}.shape[-2]", "out.shape[-1]", f"{a_name}.shape[-1]"] + plan_extra

  def store(acc: str, r: str, c: str) -> str:
    v = acc + (f" + bias[{c}]" if has_bias and not no_bias else "")
    i = f"(long long){r} * N + {c}"
    if spec.post:
      v = f"apply({', '.join([v, 'o'] + (['res[o]'] if res else []) + names)})"
    return f"{{ const long long o = {i}; y[o] = {v}; }}"

  batch = ("  const long long z = blockIdx.z;\n  a += z * M * K; b += z * K * N; y += z * M * N;\n" if bmm else "")
  if style == "naive":
    body = (batch + "  const int c = blockIdx.x * 16 + threadIdx.x, r = blockIdx.y * 16 + threadIdx.y;\n"
            "  if (r >= M || c >= N) return;\n  float acc = 0.0f;\n"
            f"  for (int k = 0; k < K; ++k) acc += {a_name}[(long long)r * K + k] * "
            f"{_b_index(spec, 'k', 'c', layout)};\n"
            f"  {store('acc', 'r', 'c')}\n")
    geo = "grid=(cdiv(out.shape[-1], 16), cdiv(out.shape[-2], 16)" + (", out.shape[0])" if bmm else ")") + \
        " block=(16, 16)"
    name, note = "gemm_naive", "// One thread per output element: a K-long dot product.\n"
  elif style == "tiled16":
    kloop = "k0 + 16 <= K" if k_tail else "k0 < K"
    body = (batch + "  __shared__ float as[16][17], bs[16][17];\n"
            "  const int tx = threadIdx.x, ty = threadIdx.y;\n"
            "  const int c = blockIdx.x * 16 + tx, r = blockIdx.y * 16 + ty;\n  float acc = 0.0f;\n"
            f"  for (int k0 = 0; {kloop}; k0 += 16) {{\n"
            f"    as[ty][tx] = (r < M && k0 + tx < K) ? {a_name}[(long long)r * K + k0 + tx] : 0.0f;\n"
            f"    bs[ty][tx] = (k0 + ty < K && c < N) ? {_b_index(spec, 'k0 + ty', 'c', layout)} : 0.0f;\n"
            "    __syncthreads();\n    for (int k = 0; k < 16; ++k) acc += as[ty][k] * bs[k][tx];\n"
            "    __syncthreads();\n  }\n"
            f"  if (r < M && c < N) {store('acc', 'r', 'c')}\n")
    geo = "grid=(cdiv(out.shape[-1], 16), cdiv(out.shape[-2], 16)" + (", out.shape[0])" if bmm else ")") + \
        " block=(16, 16)"
    name, note = "gemm_tiled16", "// 16 x 16 output tiles; A and B tiles staged through shared memory.\n"
  else:
    if lin:  # Consecutive threads read consecutive k of one weight row (coalesced), stored transposed.
      load_b = ("    for (int e = tid; e < 1024; e += 256) {\n      const int nn = e / 16, kk = e % 16, k = k0 + kk, "
                "c = col0 + nn;\n"
                f"      bs[kk][nn] = (k < K && c < N) ? {_b_index(spec, 'k', 'c', layout)} : 0.0f;\n    }}\n")
    else:
      load_b = ("    for (int e = tid; e < 1024; e += 256) {\n      const int kk = e / 64, nn = e % 64, k = k0 + kk, "
                "c = col0 + nn;\n"
                f"      bs[kk][nn] = (k < K && c < N) ? {_b_index(spec, 'k', 'c', layout)} : 0.0f;\n    }}\n")
    body = (batch + "  __shared__ float as[16][65], bs[16][65];\n"
            "  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;\n"
            "  const int row0 = blockIdx.y * 64, col0 = blockIdx.x * 64;\n"
            "  float acc[4][4];\n"
            "  for (int i = 0; i < 4; ++i)\n    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;\n"
            "  for (int k0 = 0; k0 < K; k0 += 16) {\n"
            "    for (int e = tid; e < 1024; e += 256) {\n      const int mm = e / 16, kk = e % 16, r = row0 + mm, "
            "k = k0 + kk;\n"
            f"      as[kk][mm] = (r < M && k < K) ? {a_name}[(long long)r * K + k] : 0.0f;\n    }}\n"
            + load_b +
            "    __syncthreads();\n"
            "    for (int kk = 0; kk < 16; ++kk) {\n      float av[4], bv[4];\n"
            "      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];\n"
            "      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];\n"
            "      for (int i = 0; i < 4; ++i)\n        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];\n"
            "    }\n    __syncthreads();\n  }\n"
            "  for (int i = 0; i < 4; ++i)\n    for (int j = 0; j < 4; ++j) {\n"
            "      const int r = row0 + ty + 16 * i, c = col0 + tx + 16 * j;\n"
            f"      if (r < M && c < N) {store('acc[i][j]', 'r', 'c')}\n    }}\n")
    geo = "grid=(cdiv(out.shape[-1], 64), cdiv(out.shape[-2], 64)" + (", out.shape[0])" if bmm else ")") + \
        " block=(16, 16)"
    name, note = "gemm_tile64", ("// 64 x 64 output tiles, 16-deep K slices in shared memory; each thread keeps a "
                                 "4 x 4 block of\n// outputs (rows ty + 16 i, columns tx + 16 j) in registers.\n")
  sig = ", ".join(params)
  code = note + (apply_src + "\n" if apply_src else "") + f'extern "C" __global__ void {name}({sig}) {{\n{body}}}\n'
  return code, f"launch {name} {geo} args=({', '.join(args)})"


# --- matrix-vector -----------------------------------------------------------------------------------------

def _matvec(spec: Spec, style: str, *, layout: bool = False, shuffle_last: int = 1, partial: bool = False,
            post=None) -> tuple[str, str]:
  apply_src, decl, plan_extra = ops_lib.cuda_apply(spec.post, body=post) if spec.post else ("", [], [])
  names = ops_lib.call_args(decl)
  val = (lambda s: f"apply({', '.join([s, 'r'] + names)})") if spec.post else (lambda s: s)
  elem = "a[(long long)k * M + r]" if layout else "a[(long long)r * K + k]"
  sig = ", ".join(["const float* __restrict__ a", "const float* __restrict__ v", "float* __restrict__ y", "int M",
                   "int K"] + decl)
  args = ", ".join(["a", "v", "out", "a.shape[0]", "a.shape[1]"] + plan_extra)
  pre = apply_src + "\n" if apply_src else ""
  if style == "naive":
    code = (pre + f'extern "C" __global__ void mv_naive({sig}) {{\n'
            "  const int r = blockIdx.x * blockDim.x + threadIdx.x;\n  if (r >= M) return;\n  double s = 0.0;\n"
            f"  for (int k = 0; k < K; ++k) s += (double){elem} * v[k];\n  y[r] = {val('(float)s')};\n}}\n")
    return code, f"launch mv_naive grid=(cdiv(a.shape[0], 128),) block=(128,) args=({args})"
  if style == "warp":
    code = (cuda.warp_reduce("sum", shuffle_last) + "\n" + pre + f'extern "C" __global__ void mv_warp({sig}) {{\n'
            "  const int r = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;\n"
            "  if (r >= M) return;  // Whole warps leave together.\n  double s = 0.0;\n"
            f"  for (int k = lane; k < K; k += 32) s += (double){elem} * v[k];\n"
            f"  s = warp_sum(s);\n  if (lane == 0) y[r] = {val('(float)s')};\n}}\n")
    return code, f"launch mv_warp grid=(cdiv(a.shape[0], 8),) block=(256,) args=({args})"
  code = (cuda.warp_reduce("sum") + "\n" + cuda.block_reduce("sum", partial) + "\n" + pre
          + f'extern "C" __global__ void mv_block({sig}) {{\n'
          "  __shared__ double red[32];\n  const int r = blockIdx.x;\n  double s = 0.0;\n"
          f"  for (int k = threadIdx.x; k < K; k += blockDim.x) s += (double){elem} * v[k];\n"
          f"  s = block_sum(s, red);\n  if (threadIdx.x == 0) y[r] = {val('(float)s')};\n}}\n")
  return code, f"launch mv_block grid=(a.shape[0],) block=(128,) args=({args})"


def _epilogue_mutation(spec: Spec, rng: random.Random) -> tuple[tuple[Op, ...], str] | None:
  return ops_lib.epilogue_mutation(spec.post, main_sample(spec.main, spec.dim("K")), rng)


def candidates(spec: Spec, rng: random.Random) -> list[Written]:
  if spec.main == "matvec":
    out = [Written("naive", "correct", *_matvec(spec, "naive"),
                   summary="One thread per row accumulates its dot product in double."),
           Written("optimized", "correct", *_matvec(spec, "warp"),
                   summary="One warp per row: lanes read consecutive elements (coalesced), a shuffle butterfly sums."),
           Written("block_per_row", "correct", *_matvec(spec, "block"),
                   summary="One 128-thread block per row; warp shuffles and shared memory combine the partial sums.")]
    wrong = [("wrong_layout", "incorrect", _matvec(spec, "naive", layout=True), 0,
              "reads the matrix as if it were stored column-major (a[k * M + r])"),
             ("wrong_shuffle", "incorrect", _matvec(spec, "warp", shuffle_last=2), 1,
              "the shuffle butterfly stops before offset 1: lane 0 misses lane 1's partial sum"),
             ("wrong_partial", "incorrect", _matvec(spec, "block", partial=True), 2,
              "the block reduction returns warp 0's partial sum only")]
    epi = _epilogue_mutation(spec, rng)
    if epi:
      wrong.append(("wrong_epilogue", "incorrect", _matvec(spec, "warp", post=epi[0]), 1, epi[1]))
    picked = sorted(rng.sample(wrong, 3), key=lambda w: w[0])
  else:
    out = [Written("naive", "correct", *_gemm(spec, "naive"),
                   summary="One thread per output element computes its K-long dot product; 16 x 16 blocks."),
           Written("tiled16", "correct", *_gemm(spec, "tiled16"),
                   summary="16 x 16 tiles of both operands staged through shared memory, epilogue fused in the store."),
           Written("optimized", "correct", *_gemm(spec, "tile64"),
                   summary="64 x 64 output tiles with 16-deep K slices in shared memory and a 4 x 4 register block per "
                           "thread; the epilogue is fused into the store.")]
    K = spec.dim("K")
    wrong = [("wrong_layout", "incorrect", _gemm(spec, "naive", layout=True), 0,
              "reads the second operand in the transposed layout"),
             ("wrong_k_tail", "incorrect", _gemm(spec, "tiled16", k_tail=True), 1,
              f"loops over whole 16-deep K-tiles only: the last K % 16 = {K % 16} terms of every dot product are "
              "dropped")]
    if spec.main == "linear" and spec.opt("bias"):
      wrong.append(("wrong_no_bias", "incorrect", _gemm(spec, "tile64", no_bias=True), 2, "never adds linear.bias"))
    epi = _epilogue_mutation(spec, rng)
    if epi:
      wrong.append(("wrong_epilogue", "incorrect", _gemm(spec, "tile64", post=epi[0]), 2, epi[1]))
    picked = sorted(rng.sample(wrong, min(3, len(wrong))), key=lambda w: w[0])
  for name, expect, (code, plan), base, bug in picked:
    out.append(Written(name, expect, code, plan, summary=out[base].summary, bug=bug))
  return out
