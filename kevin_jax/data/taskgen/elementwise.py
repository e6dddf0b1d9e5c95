"""Family `elementwise`: chains of 1-4 elementwise ops on a (B, C, L) tensor.

Ops: the unary ops, scalar multiply/add, per-channel (C, 1) and per-column (L,) bias or gain parameters, and a
residual add of the input (taskgen/ops.py). Candidates: one thread per element (`naive`), a grid-stride loop
(`grid_stride`), float4 loads and stores with a scalar tail (`optimized`); wrong: the float4 kernel without its
tail (`wrong_tail`, incorrect), with the vector count rounded up (`wrong_oob`, runtime_error: guard band), one
wrong op / swapped order / wrong broadcast index (`wrong_op`, `wrong_order`, `wrong_layout`, incorrect), and a
plan argument missing (`wrong_args`, format_error).
"""

from __future__ import annotations

import random

from kevin_jax.data.taskgen import ops as ops_lib
from kevin_jax.data.taskgen import render, spec as spec_lib
from kevin_jax.data.taskgen.ops import Op
from kevin_jax.data.taskgen.render import Written
from kevin_jax.data.taskgen.spec import Spec

FAMILY = "elementwise"


def draw_chain(rng: random.Random, n: int, *, broadcast=ops_lib.BROADCAST_NAMES, residual: bool = True,
               first_unary: bool = True) -> tuple[Op, ...] | None:
  """A random chain of n ops (unary ops most often), or None when the draw breaks ops.chain_ok."""
  names = []
  for k in range(n):
    r = rng.random()
    if (k == 0 and first_unary) or r < 0.6 or not (broadcast or residual):
      pool = ops_lib.UNARY_NAMES
    elif r < 0.75:
      pool = ops_lib.SCALAR_NAMES
    elif r < 0.93 and broadcast:
      pool = broadcast
    else:
      pool = ("residual",) if residual and k > 0 else ops_lib.UNARY_NAMES
    names.append(rng.choice(pool))
  if not ops_lib.chain_ok(names):
    return None
  return tuple(ops_lib.draw_op(rng, n) for n in names)


def sample(rng: random.Random) -> Spec | None:
  chain = draw_chain(rng, rng.choice((1, 2, 2, 3, 3, 4)))
  if chain is None:
    return None
  xs = ops_lib.sample_inputs()
  if not ops_lib.healthy(ops_lib.simulate(chain, xs), xs):
    return None
  names = tuple(o.name for o in chain)
  held = any(spec_lib.heldout_pair(a, b) for a, b in zip(names, names[1:]))
  L = spec_lib.odd_dim(rng, 257, 8191, heldout=True if held else False)
  C = spec_lib.odd_dim(rng, 17, 511, heldout=None if held else False)
  per_elem = sum(12 if o.name == "residual" else 8 for o in chain)  # Bytes each eager kernel moves per element.
  target = 10 ** rng.uniform(-0.6, 0.1) * 1e-3  # 0.25-1.26 ms.
  B = max(1, round(target * spec_lib.BYTES_PER_S / per_elem / (C * L))) | 1  # Odd: numel % 4 != 0.
  while B > 1 and not held and spec_lib.heldout_dim(B):
    B -= 2
  if not held and spec_lib.heldout_dim(B):
    return None
  n = B * C * L
  ms = spec_lib.eager_ms([(12 * n if o.name == "residual" else 8 * n, 0) for o in chain])
  if not spec_lib.in_band(ms) or 4 * n > spec_lib.MAX_INPUT_BYTES:
    return None
  small = (("B", 3), ("C", rng.choice((3, 5, 7))), ("L", rng.choice((37, 67, 99, 131))))
  return Spec(FAMILY, "chain", (), chain, (("B", B), ("C", C), ("L", L)), small, model_ms=round(ms, 4))


def module(spec: Spec, reduced: bool = False) -> str:
  d = dict(spec.small if reduced else spec.dims)
  consts, init, body = render.chain_init(spec.post)
  lines = ops_lib.torch_lines(spec.post, "x", res="x")
  m = render.Module(
      doc=f"Elementwise chain: {render.describe_chain(spec.post)}.",
      constants=[(k, v) for k, v in d.items()] + consts, init=init, body=body, args=["x"],
      forward=lines + ["return y"], inputs=["torch.randn(B, C, L)"], functional=True)
  return m.text()


def describe(spec: Spec) -> str:
  B, C, L = (spec.dim(k) for k in "BCL")
  n = B * C * L
  return (f"Elementwise chain {render.describe_chain(spec.post)} over a ({B}, {C}, {L}) tensor ({n / 1e6:.0f}M "
          f"floats): eager PyTorch runs {len(spec.post)} kernel{'s' if len(spec.post) > 1 else ''}, one fused "
          f"pass suffices.")


def _kernel(name: str, decl: list[str], body: str) -> str:
  params = ", ".join(["const float* __restrict__ x", "float* __restrict__ y", "long long n"] + decl)
  return f'extern "C" __global__ void {name}({params}) {{\n{body}}}\n'


def _call(v: str, i: str, has_res: bool, names: list[str]) -> str:
  return f"apply({', '.join([v, i] + ([v] if has_res else []) + names)})"


def candidates(spec: Spec, rng: random.Random) -> list[Written]:
  chain = spec.post
  apply_src, decl, plan_extra = ops_lib.cuda_apply(chain)
  names = ops_lib.call_args(decl)
  res = any(o.name == "residual" for o in chain)
  args = render.plan_args(["x", "out", "x.numel"] + plan_extra, {"@C": "x.shape[1]", "@L": "x.shape[2]"})
  B, C, L = (spec.dim(k) for k in "BCL")
  n = B * C * L

  def naive(apply=apply_src, plan_args=args, grid="cdiv(x.numel, 256)"):
    body = ("  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
            f"  if (i < n) y[i] = {_call('x[i]', 'i', res, names)};\n")
    return (f"// One thread per element.\n{apply}\n" + _kernel("chain_naive", decl, body),
            f"launch chain_naive grid=({grid},) block=(256,) args=({plan_args})")

  def grid_stride(apply=apply_src):
    body = ("  const long long stride = (long long)gridDim.x * blockDim.x;\n"
            "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)\n"
            f"    y[i] = {_call('x[i]', 'i', res, names)};\n")
    return (f"// A fixed grid of 512-thread blocks; each thread strides through the tensor.\n{apply}\n"
            + _kernel("chain_grid_stride", decl, body),
            f"launch chain_grid_stride grid=(min(cdiv(x.numel, 512), 2048),) block=(512,) args=({args})")

  def vec4(tail: bool = True, round_up: bool = False):
    n4 = "(n + 3) >> 2" if round_up else "n >> 2"
    lanes = "".join(f"    b.{c} = {_call(f'a.{c}', f'i + {k}' if k else 'i', res, names)};\n"
                    for k, c in enumerate("xyzw"))
    body = ("  const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
            f"  const long long n4 = {n4};\n"
            "  if (t < n4) {\n"
            "    const float4 a = reinterpret_cast<const float4*>(x)[t];\n"
            "    const long long i = t << 2;\n"
            "    float4 b;\n" + lanes +
            "    reinterpret_cast<float4*>(y)[t] = b;\n  }\n")
    if tail:
      body += ("  if (t < (n & 3)) {  // The last n % 4 elements.\n"
               "    const long long i = (n4 << 2) + t;\n"
               f"    y[i] = {_call('x[i]', 'i', res, names)};\n  }}\n")
    return (f"// One float4 (16-byte load and store) per thread, then the last n % 4 elements.\n{apply_src}\n"
            + _kernel("chain_vec4", decl, body),
            f"launch chain_vec4 grid=(cdiv(x.numel, 1024),) block=(256,) args=({args})")

  out = [Written("naive", "correct", *naive(), summary="One thread per element applies the whole chain."),
         Written("grid_stride", "correct", *grid_stride(),
                 summary="A grid-stride loop over the tensor with a fixed grid; the chain is fused in one pass."),
         Written("optimized", "correct", *vec4(),
                 summary="One fused pass with 128-bit float4 loads and stores, the last n % 4 elements scalar.")]
  out.append(Written("wrong_tail", "incorrect", *vec4(tail=False), summary=out[2].summary,
                     bug=f"no scalar tail: the last n % 4 = {n % 4} elements are never written"))
  out.append(Written("wrong_oob", "runtime_error", *vec4(tail=False, round_up=True), summary=out[2].summary,
                     bug="rounds the float4 count up: the last vector writes past the end of the output"))
  semantic = _semantic_mutations(spec)
  if semantic:
    kind, body, layout, bug = semantic[rng.randrange(len(semantic))]
    src = ops_lib.cuda_apply(chain, body=body, layout=layout)[0]
    code, plan = (grid_stride(src) if layout else naive(src))
    out.append(Written(kind, "incorrect", code, plan, summary=out[1 if layout else 0].summary, bug=bug))
  if rng.random() < 0.35:
    code, plan = naive(plan_args=render.plan_args(["x", "out"] + plan_extra,
                                                  {"@C": "x.shape[1]", "@L": "x.shape[2]"}))
    out.append(Written("wrong_args", "format_error", code, plan, summary=out[0].summary,
                       bug="the plan leaves out the element count n, so the arguments do not match the kernel"))
  return out


def _semantic_mutations(spec: Spec) -> list[tuple[str, tuple[Op, ...] | None, bool, str]]:
  """(name, mutated body, layout, bug) for every wrong op / order / layout that changes the output."""
  chain = spec.post
  xs = ops_lib.sample_inputs()
  ref = ops_lib.simulate(chain, xs)
  out = []
  for k, op in enumerate(chain):
    if op.d.kind != "unary":
      continue
    for other in ops_lib.UNARY_NAMES:
      if other == op.name or ops_lib.OPS[other].consts:
        continue
      body = chain[:k] + (Op(other),) + chain[k + 1:]
      if ops_lib.differs(ref, ops_lib.simulate(body, xs)):
        out.append(("wrong_op", body, False, f"computes {other} where the model applies {op.name}"))
        break
  for k in range(len(chain) - 1):
    body = chain[:k] + (chain[k + 1], chain[k]) + chain[k + 2:]
    if ops_lib.differs(ref, ops_lib.simulate(body, xs)):
      out.append(("wrong_order", body, False, f"applies {chain[k + 1].name} before {chain[k].name}"))
  if any(o.d.param for o in chain):
    out.append(("wrong_layout", None, True, "indexes the broadcast parameter along the wrong dimension"))
  return out
