"""Family `pool`: 1-D and 2-D max / average pooling and depthwise convolutions (small stencils), with epilogues.

  maxpool1d / avgpool1d / dwconv1d   x (B, C, L), window k in 2-5, stride 1-3, padding 0-k//2
  maxpool2d / avgpool2d / dwconv2d   x (B, C, H, W), square window k in 2-4, same strides and paddings
The 1-D outputs (B, C, Lo) take per-channel or per-column epilogue ops, the 2-D ones unary and scalar ops only.
Average pooling counts the padding (PyTorch's default count_include_pad=True); convolutions are nn.Conv1d/2d with
groups = channels, with or without bias.

Candidates: one thread per output (`naive`), a grid-stride loop (`grid_stride`), a block per output-row segment
that stages the input span (k rows of it in 2-D) in dynamic shared memory, padding included (`optimized`).
Wrong (all `incorrect`): a window one tap short (`wrong_window`), stride 1 instead of s (`wrong_stride`), the
padding offset forgotten (`wrong_pad`), average over the valid elements only (`wrong_divisor`), the filter flipped
(`wrong_flip`), a grid rounded down (`wrong_tail`), the epilogue wrong (`wrong_epilogue`).
"""

from __future__ import annotations

import math
import random

from kevin_jax.data.taskgen import cuda, elementwise, render, spec as spec_lib
from kevin_jax.data.taskgen import ops as ops_lib
from kevin_jax.data.taskgen.render import Written
from kevin_jax.data.taskgen.spec import Spec

FAMILY = "pool"
MAINS = ("maxpool1d", "avgpool1d", "dwconv1d", "maxpool2d", "avgpool2d", "dwconv2d")
TILE1, TILE2 = 256, 128  # Outputs per block in the shared-memory style (1-D, 2-D).


def _is2d(main: str) -> bool:
  return main.endswith("2d")


def _out_len(n: int, k: int, s: int, p: int) -> int:
  return (n + 2 * p - k) // s + 1


def main_sample(main: str, k: int) -> list[float]:
  q = ops_lib.sample_inputs()
  taps = k * k if _is2d(main) else k
  if main.startswith("max"):
    loc = {2: 0.56, 3: 0.85, 4: 1.03, 5: 1.16}.get(k, 1.0) if not _is2d(main) else 1.3
    return [loc + 0.7 * v for v in q]
  if main.startswith("avg"):
    return [v / math.sqrt(taps) for v in q]
  return [0.577 * v for v in q]


def sample(rng: random.Random) -> Spec | None:
  main = rng.choice(MAINS)
  two = _is2d(main)
  k = rng.choice((2, 3, 4) if two else (2, 3, 4, 5))
  s = rng.choice([v for v in (1, 2, 3) if v <= k])
  p = rng.randint(0, k // 2)
  bcast = () if two else ("add_channel", "mul_channel", "add_column", "mul_column")
  post = elementwise.draw_chain(rng, rng.choice((0, 1, 1, 2)), first_unary=False, broadcast=bcast, residual=False)
  if post is None:
    return None
  names = (main,) + tuple(o.name for o in post)
  held = any(spec_lib.heldout_pair(a, b) for a, b in zip(names, names[1:]))
  ys = ops_lib.simulate(post, main_sample(main, k))
  if not ops_lib.healthy(ys):
    return None
  target = 10 ** rng.uniform(-0.6, 0.0) * 1e-3
  if two:
    H = spec_lib.odd_dim(rng, 33, 515, heldout=held or False)
    W = spec_lib.odd_dim(rng, 33, 515, heldout=None if held else False)
    C = spec_lib.odd_dim(rng, 3, 255, heldout=None if held else False)
    Ho, Wo = _out_len(H, k, s, p), _out_len(W, k, s, p)
    per_plane = H * W + Ho * Wo
    B = max(1, round(target * spec_lib.BYTES_PER_S / (4 * per_plane * C))) | 1
    dims = (("B", B), ("C", C), ("H", H), ("W", W))
    small = (("B", 2), ("C", 3), ("H", rng.choice((13, 17))), ("W", rng.choice((19, 23))))
    n_in, n_out = B * C * H * W, B * C * Ho * Wo
    small_out = 2 * 3 * _out_len(dict(small)["H"], k, s, p) * _out_len(dict(small)["W"], k, s, p)
  else:
    L = spec_lib.odd_dim(rng, 257, 8191, heldout=held or False)
    C = spec_lib.odd_dim(rng, 3, 511, heldout=None if held else False)
    Lo = _out_len(L, k, s, p)
    B = max(1, round(target * spec_lib.BYTES_PER_S / (4 * (L + Lo) * C))) | 1
    dims = (("B", B), ("C", C), ("L", L))
    small = (("B", 2), ("C", 3), ("L", rng.choice((37, 53))))
    n_in, n_out = B * C * L, B * C * Lo
    small_out = 6 * _out_len(dict(small)["L"], k, s, p)
  if B * C > 65535 or not held and any(spec_lib.heldout_dim(v) for _, v in dims):
    return None
  ms = spec_lib.eager_ms([(4 * (n_in + n_out), 2 * n_out * k)] + [(8 * n_out, 0)] * len(post))
  if not spec_lib.in_band(ms) or 4 * n_in > spec_lib.MAX_INPUT_BYTES or small_out < 8:
    return None
  opts = (("k", k), ("s", s), ("p", p)) + ((("bias", rng.random() < 0.7),) if main.startswith("dwconv") else ())
  return Spec(FAMILY, main, (), post, dims, small, opts, model_ms=round(ms, 4))


def module(spec: Spec, reduced: bool = False) -> str:
  d = dict(spec.small if reduced else spec.dims)
  main, two = spec.main, _is2d(spec.main)
  k, s, p = spec.opt("k"), spec.opt("s"), spec.opt("p")
  consts, init, body = render.chain_init(spec.post, c_size="C", l_size="LO")
  init = [("kernel_size", "int", "KERNEL_SIZE"), ("stride", "int", "STRIDE"), ("padding", "int", "PADDING")] + init
  dims_lines = list(d.items()) + [("KERNEL_SIZE", k), ("STRIDE", s), ("PADDING", p)]
  notes = []
  if any(o.d.kind == "column" for o in spec.post):
    notes = ["LO = (L + 2 * PADDING - KERNEL_SIZE) // STRIDE + 1  # Output length."]
  layer = {"maxpool1d": "nn.MaxPool1d(kernel_size, stride, padding)",
           "avgpool1d": "nn.AvgPool1d(kernel_size, stride, padding)",
           "maxpool2d": "nn.MaxPool2d(kernel_size, stride, padding)",
           "avgpool2d": "nn.AvgPool2d(kernel_size, stride, padding)"}.get(main)
  if layer:
    body = [f"self.pool = {layer}"] + body
    expr = "self.pool(x)"
  else:
    conv = "nn.Conv2d" if two else "nn.Conv1d"
    init = [("channels", "int", "C")] + [i for i in init if i[0] != "channels"]
    body = [f"self.conv = {conv}(channels, channels, kernel_size, stride=stride, padding=padding, groups=channels, "
            f"bias={spec.opt('bias')})"] + body
    expr = "self.conv(x)"
  what = {"maxpool1d": "1-D max pooling", "avgpool1d": "1-D average pooling", "dwconv1d": "Depthwise 1-D convolution",
          "maxpool2d": "2-D max pooling", "avgpool2d": "2-D average pooling",
          "dwconv2d": "Depthwise 2-D convolution"}[main]
  doc = f"{what} (window {k}, stride {s}, padding {p})" + (
      f", then {render.describe_chain(spec.post)}." if spec.post else ".")
  m = render.Module(doc=doc, constants=dims_lines + consts, init=init, body=body, args=["x"],
                    forward=[f"y = {expr}"] + (ops_lib.torch_lines(spec.post, "y") if spec.post else []) + ["return y"],
                    inputs=["torch.randn(B, C, H, W)" if two else "torch.randn(B, C, L)"], notes=notes,
                    functional=any(o.d.torch.startswith("F.") for o in spec.post))
  return m.text()


def describe(spec: Spec) -> str:
  k, s, p = spec.opt("k"), spec.opt("s"), spec.opt("p")
  shape = tuple(v for _, v in spec.dims)
  epi = f", then {render.describe_chain(spec.post)}" if spec.post else ""
  n = math.prod(shape)
  return (f"{spec.main} with window {k}, stride {s}, padding {p} on a {shape} tensor ({4 * n / 2**30:.2f} GiB){epi}: "
          "memory-bound; each input element is read by up to "
          f"{math.ceil(k / s) ** (2 if _is2d(spec.main) else 1)} windows, so staging spans in shared memory saves "
          "reloads.")


# --- kernels ---------------------------------------------------------------------------------------------------

def _tap(main: str, v: str, w: str, *, flip: bool = False) -> str:
  """The accumulation of one window element."""
  if main.startswith("max"):
    return f"acc = fmaxf(acc, {v});"
  if main.startswith("avg"):
    return f"acc += {v};"
  return f"acc += {v} * {w};"


def _weight(two: bool, tap: str, flip: bool) -> str:
  if two:
    return "w[(c * k + (k - 1 - kh)) * k + (k - 1 - kw)]" if flip else "w[(c * k + kh) * k + kw]"
  return "w[c * k + (k - 1 - t)]" if flip else "w[c * k + t]"


def _kernels(spec: Spec, style: str, *, window_short: bool = False, stride_one: bool = False, no_pad: bool = False,
             valid_divisor: bool = False, flip: bool = False, tail: bool = False, post=None) -> tuple[str, str]:
  main, two = spec.main, _is2d(spec.main)
  conv, avg, mx = main.startswith("dwconv"), main.startswith("avg"), main.startswith("max")
  bias = conv and spec.opt("bias")
  apply_src, decl, plan_extra = ops_lib.cuda_apply(spec.post, body=post) if spec.post else ("", [], [])
  names = ops_lib.call_args(decl)
  plan_extra = [{"@C": "out.shape[1]", "@L": "out.shape[-1]"}.get(a, a) for a in plan_extra]
  kk = "k - 1" if window_short else "k"
  st = "1" if stride_one else "s"
  pad = "0" if no_pad else "p"
  init = cuda.NEG_INF if mx else "0.0f"
  final = "acc"
  if avg:
    final = "acc / (float)cnt" if valid_divisor else (f"acc / (float)(k * k)" if two else "acc / (float)k")
  if bias:
    final = "acc + bias[c]"
  ins = (["const float* __restrict__ x"] + (["const float* __restrict__ w"] if conv else [])
         + (["const float* __restrict__ bias"] if bias else []) + ["float* __restrict__ y"])
  in_args = ["x"] + (["conv.weight"] if conv else []) + (["conv.bias"] if bias else []) + ["out"]
  if two:
    sizes = ["int C", "int H", "int W", "int Ho", "int Wo", "int k", "int s", "int p"]
    size_args = ["x.shape[1]", "x.shape[2]", "x.shape[3]", "out.shape[2]", "out.shape[3]", "kernel_size", "stride",
                 "padding"]
  else:
    sizes = ["int C", "int L", "int Lo", "int k", "int s", "int p"]
    size_args = ["x.shape[1]", "x.shape[2]", "out.shape[2]", "kernel_size", "stride", "padding"]
  call = (lambda v, i: f"apply({', '.join([v, i] + names)})") if spec.post else (lambda v, i: v)
  pre = apply_src + "\n" if apply_src else ""
  cnt_decl = "  int cnt = 0;\n" if valid_divisor else ""
  cnt_inc = " ++cnt;" if valid_divisor else ""

  if style in ("naive", "grid_stride"):
    if two:
      index = ("    const int ow = (int)(i % Wo), oh = (int)((i / Wo) % Ho);\n"
               "    const long long plane = i / ((long long)Ho * Wo);\n"
               "    const int c = (int)(plane % C);\n    const float* img = x + plane * H * W;\n"
               f"    const int h0 = oh * {st} - {pad}, w0 = ow * {st} - {pad};\n")
      loop = (f"    for (int kh = 0; kh < {kk}; ++kh)\n      for (int kw = 0; kw < {kk}; ++kw) {{\n"
              "        const int ih = h0 + kh, iw = w0 + kw;\n"
              "        if (ih >= 0 && ih < H && iw >= 0 && iw < W) { "
              f"{_tap(main, 'img[ih * W + iw]', _weight(True, '', flip))}{cnt_inc} }}\n"
              "      }\n")
    else:
      index = ("    const int o = (int)(i % Lo);\n    const long long plane = i / Lo;\n"
               "    const int c = (int)(plane % C);\n"
               f"    const float* row = x + plane * L;\n    const int j0 = o * {st} - {pad};\n")
      loop = (f"    for (int t = 0; t < {kk}; ++t) {{\n      const int j = j0 + t;\n"
              f"      if (j >= 0 && j < L) {{ {_tap(main, 'row[j]', _weight(False, 't', flip))}{cnt_inc} }}\n    }}\n")
    body_core = (index + f"    float acc = {init};\n" + cnt_decl.replace("  ", "    ", 1) + loop
                 + f"    y[i] = {call(final, 'i')};\n")
    if style == "naive":
      body = ("  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n  if (i < n) {\n" + body_core
              + "  }\n")
      geo = "grid=(out.numel // 64,) block=(64,)" if tail else "grid=(cdiv(out.numel, 256),) block=(256,)"
    else:
      body = ("  const long long stride = (long long)gridDim.x * blockDim.x;\n"
              "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {\n"
              + body_core + "  }\n")
      geo = "grid=(min(cdiv(out.numel, 256), 4096),) block=(256,)"
    name = f"pool_{style}"
    sig = ", ".join(ins + ["long long n"] + sizes + decl)
    args = ", ".join(in_args + ["out.numel"] + size_args + plan_extra)
    note = ("// One thread per output element.\n" if style == "naive"
            else "// A fixed grid; each thread strides over output elements.\n")
    code = note + pre + f'extern "C" __global__ void {name}({sig}) {{\n{body}}}\n'
    return code, f"launch {name} {geo} args=({args})"

  # Shared-memory staging: a block computes TILE outputs of one output row; the input span they read (k rows of it
  # in 2-D) is loaded once, padding positions filled with the identity of the reduction.
  padv = cuda.NEG_INF if mx else "0.0f"
  if two:
    body = ("  extern __shared__ float tile[];\n"
            "  const int ow0 = blockIdx.x * 128, oh = blockIdx.y, plane = blockIdx.z, c = plane % C;\n"
            "  const int span = 127 * s + k;  // Input columns the 128 outputs read.\n"
            "  const float* img = x + (long long)plane * H * W;\n"
            "  const int h0 = oh * s - p, w0 = ow0 * s - p;\n"
            "  for (int e = threadIdx.x; e < k * span; e += blockDim.x) {\n"
            "    const int ih = h0 + e / span, iw = w0 + e % span;\n"
            f"    tile[e] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? img[ih * W + iw] : {padv};\n  }}\n"
            "  __syncthreads();\n"
            "  const int ow = ow0 + threadIdx.x;\n  if (ow >= Wo) return;\n"
            f"  float acc = {init};\n"
            "  for (int kh = 0; kh < k; ++kh)\n    for (int kw = 0; kw < k; ++kw) {\n"
            f"      {_tap(main, 'tile[kh * span + threadIdx.x * s + kw]', _weight(True, '', False))}\n    }}\n"
            "  const long long i = ((long long)plane * Ho + oh) * Wo + ow;\n"
            f"  y[i] = {call(final, 'i')};\n")
    geo = ("grid=(cdiv(out.shape[3], 128), out.shape[2], out.shape[0] * out.shape[1]) block=(128,) "
           "smem=kernel_size * (127 * stride + kernel_size) * 4")
  else:
    body = ("  extern __shared__ float tile[];\n"
            "  const int o0 = blockIdx.x * 256, plane = blockIdx.y, c = plane % C;\n"
            "  const int span = 255 * s + k;  // Inputs the 256 outputs read.\n"
            "  const float* row = x + (long long)plane * L;\n  const int j0 = o0 * s - p;\n"
            "  for (int e = threadIdx.x; e < span; e += blockDim.x) {\n    const int j = j0 + e;\n"
            f"    tile[e] = (j >= 0 && j < L) ? row[j] : {padv};\n  }}\n"
            "  __syncthreads();\n"
            "  const int o = o0 + threadIdx.x;\n  if (o >= Lo) return;\n"
            f"  float acc = {init};\n"
            "  for (int t = 0; t < k; ++t) { "
            f"{_tap(main, 'tile[threadIdx.x * s + t]', _weight(False, 't', False))} }}\n"
            "  const long long i = (long long)plane * Lo + o;\n"
            f"  y[i] = {call(final, 'i')};\n")
    geo = ("grid=(cdiv(out.shape[2], 256), out.shape[0] * out.shape[1]) block=(256,) "
           "smem=(255 * stride + kernel_size) * 4")
  sig = ", ".join(ins + sizes + decl)
  args = ", ".join(in_args + size_args + plan_extra)
  note = "// Each block stages the input span of its outputs in shared memory (padding included), then reduces.\n"
  code = note + pre + f'extern "C" __global__ void pool_smem({sig}) {{\n{body}}}\n'
  return code, f"launch pool_smem {geo} args=({args})"


def candidates(spec: Spec, rng: random.Random) -> list[Written]:
  main = spec.main
  s, p = spec.opt("s"), spec.opt("p")
  out = [Written("naive", "correct", *_kernels(spec, "naive"),
                 summary="One thread per output element loops over its window with bounds checks for the padding."),
         Written("grid_stride", "correct", *_kernels(spec, "grid_stride"),
                 summary="A fixed grid of 256-thread blocks strides over the outputs; the window loop is unchanged."),
         Written("optimized", "correct", *_kernels(spec, "smem"),
                 summary="Each block stages the input span its outputs read in shared memory (padding filled in), "
                         "so every input element is loaded once per block.")]
  wrong = [("wrong_window", {"window_short": True}, "the window loop stops one tap short (k - 1 taps)")]
  if s > 1:
    wrong.append(("wrong_stride", {"stride_one": True}, f"steps the window by 1 instead of the stride {s}"))
  if p > 0:
    wrong.append(("wrong_pad", {"no_pad": True}, f"forgets the padding offset: windows start {p} element(s) late"))
    if main.startswith("avg"):
      wrong.append(("wrong_divisor", {"valid_divisor": True},
                    "divides by the number of in-bounds elements; PyTorch counts the padding (count_include_pad)"))
  if main.startswith("dwconv"):
    wrong.append(("wrong_flip", {"flip": True}, "applies the filter flipped (convolution instead of correlation)"))
  n_out, n_small = _numel_out(spec, False), _numel_out(spec, True)
  if n_out % 64 and n_small % 64 and n_small > 64:
    wrong.append(("wrong_tail", {"tail": True},
                  f"the grid rounds down to whole 64-thread blocks: the last {n_out % 64} outputs are never written"))
  epi = _epilogue_mutation(spec, rng)
  if epi:
    wrong.append(("wrong_epilogue", {"post": epi[0]}, epi[1]))
  for name, kw, bug in sorted(rng.sample(wrong, min(3, len(wrong))), key=lambda w: w[0]):
    out.append(Written(name, "incorrect", *_kernels(spec, "naive", **kw), summary=out[0].summary, bug=bug))
  return out


def _numel_out(spec: Spec, reduced: bool) -> int:
  d = dict(spec.small if reduced else spec.dims)
  k, s, p = spec.opt("k"), spec.opt("s"), spec.opt("p")
  if _is2d(spec.main):
    return d["B"] * d["C"] * _out_len(d["H"], k, s, p) * _out_len(d["W"], k, s, p)
  return d["B"] * d["C"] * _out_len(d["L"], k, s, p)


def _epilogue_mutation(spec: Spec, rng: random.Random):
  return ops_lib.epilogue_mutation(spec.post, main_sample(spec.main, spec.opt("k")), rng, swaps=False)
