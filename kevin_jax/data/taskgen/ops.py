"""The elementwise op vocabulary of the task world: PyTorch text, CUDA text and a pure-Python model of each op.

An op chain is a tuple of `Op` (a name from OPS plus its constants). Every family renders chains the same way:
`torch_lines` writes the lines of `Model.forward`, `cuda_apply` the `__device__` function every candidate style
calls, and `simulate` runs the chain in pure Python on a fixed sample, which the generator uses to reject chains
a trivial kernel could pass (`healthy`) and mutations that would not change the output (`differs`). The
degenerate gate on real tensors (kernels/suite.py) is the check; the simulation only keeps the generator from
proposing tasks that would fail it.

Broadcast ops see the output as (..., C, L): `channel` ops use a parameter of shape (C, 1) indexed
(i / L) % C, `column` ops one of shape (L,) indexed i % L, where i is the flat output index (in CUDA the sizes
are the parameters `chans` and `cols`). `residual` adds the
task's residual tensor (the input itself for same-shape families, an extra input otherwise).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from typing import Callable, Sequence

F32_MAX = 3.0e38


@dataclasses.dataclass(frozen=True)
class OpDef:
  """One op: how PyTorch writes it, how CUDA computes it, and a Python model of it."""
  name: str
  kind: str  # unary | scalar | channel | column | residual
  torch: str  # Expression over {x} and self.<const>; broadcast ops use self.<param>.
  cuda: str  # Expression over {v} and the constants' names (kernel parameters); {p} is the broadcast value.
  py: Callable[..., float]  # (v, *consts[, p]) -> float.
  consts: tuple[tuple[str, float, float], ...] = ()  # (name, low, high) drawn uniformly, rounded to 3 digits.
  param: str = ""  # Parameter name of a broadcast op.
  init: str = ""  # PyTorch initialiser of the parameter, over {shape}.


def _softplus(v: float) -> float:
  return v if v > 20.0 else math.log1p(math.exp(v))


def _exp(v: float) -> float:
  return math.exp(v) if v < 88.0 else math.inf


UNARY = (
    OpDef("relu", "unary", "torch.relu({x})", "fmaxf({v}, 0.0f)", lambda v: max(v, 0.0)),
    OpDef("leaky_relu", "unary", "F.leaky_relu({x}, self.slope)", "({v} > 0.0f ? {v} : {v} * slope)",
          lambda v, a: v if v > 0 else v * a, consts=(("slope", 0.02, 0.3),)),
    OpDef("gelu", "unary", "F.gelu({x})", "0.5f * {v} * (1.0f + erff({v} * 0.70710678118654752f))",
          lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))),
    OpDef("silu", "unary", "F.silu({x})", "{v} / (1.0f + expf(-{v}))", lambda v: v / (1.0 + _exp(-v))),
    OpDef("sigmoid", "unary", "torch.sigmoid({x})", "1.0f / (1.0f + expf(-{v}))", lambda v: 1.0 / (1.0 + _exp(-v))),
    OpDef("tanh", "unary", "torch.tanh({x})", "tanhf({v})", math.tanh),
    OpDef("exp", "unary", "torch.exp({x})", "expf({v})", _exp),
    OpDef("abs", "unary", "torch.abs({x})", "fabsf({v})", abs),
    OpDef("square", "unary", "{x} * {x}", "{v} * {v}", lambda v: v * v),
    OpDef("hardtanh", "unary", "F.hardtanh({x}, self.lo, self.hi)", "fminf(fmaxf({v}, lo), hi)",
          lambda v, lo, hi: min(max(v, lo), hi), consts=(("lo", -1.5, -0.25), ("hi", 0.25, 1.5))),
    OpDef("softplus", "unary", "F.softplus({x})", "({v} > 20.0f ? {v} : log1pf(expf({v})))", _softplus),
    OpDef("mish", "unary", "F.mish({x})", "{v} * tanhf(log1pf(expf({v})))",
          lambda v: v * math.tanh(math.log1p(_exp(v))) if v < 88 else v),
    OpDef("elu", "unary", "F.elu({x}, self.alpha)", "({v} > 0.0f ? {v} : alpha * expm1f({v}))",
          lambda v, a: v if v > 0 else a * math.expm1(v), consts=(("alpha", 0.5, 1.5),)),
    OpDef("hardswish", "unary", "F.hardswish({x})", "{v} * fminf(fmaxf({v} + 3.0f, 0.0f), 6.0f) / 6.0f",
          lambda v: v * min(max(v + 3.0, 0.0), 6.0) / 6.0),
    OpDef("softsign", "unary", "F.softsign({x})", "{v} / (1.0f + fabsf({v}))", lambda v: v / (1.0 + abs(v))),
)
BINARY = (
    OpDef("mul_scalar", "scalar", "{x} * self.scale", "{v} * scale", lambda v, s: v * s,
          consts=(("scale", 0.5, 2.5),)),
    OpDef("add_scalar", "scalar", "{x} + self.shift", "{v} + shift", lambda v, s: v + s,
          consts=(("shift", -1.0, 1.0),)),
    OpDef("add_channel", "channel", "{x} + self.bias", "{v} + {p}", lambda v, p: v + p, param="bias",
          init="torch.randn({shape}) * 0.5"),
    OpDef("mul_channel", "channel", "{x} * self.gain", "{v} * {p}", lambda v, p: v * p, param="gain",
          init="1.0 + 0.5 * torch.randn({shape})"),
    OpDef("add_column", "column", "{x} + self.col_bias", "{v} + {p}", lambda v, p: v + p, param="col_bias",
          init="torch.randn({shape}) * 0.5"),
    OpDef("mul_column", "column", "{x} * self.col_gain", "{v} * {p}", lambda v, p: v * p, param="col_gain",
          init="1.0 + 0.5 * torch.randn({shape})"),
    OpDef("residual", "residual", "{x} + {res}", "{v} + {r}", lambda v, r: v + r),
)
OPS = {d.name: d for d in UNARY + BINARY}
UNARY_NAMES = tuple(d.name for d in UNARY)
SCALAR_NAMES = ("mul_scalar", "add_scalar")
BROADCAST_NAMES = ("add_channel", "mul_channel", "add_column", "mul_column")
# Ops whose output grows without bound: never applied to another growing op's output (keeps fp32 finite and the
# chain well conditioned at rtol 1e-4).
GROWING = ("exp", "square")


@dataclasses.dataclass(frozen=True)
class Op:
  """One step of a chain: an op name and its constants (in OpDef.consts order)."""
  name: str
  consts: tuple[float, ...] = ()

  @property
  def d(self) -> OpDef:
    return OPS[self.name]

  def const_items(self) -> list[tuple[str, float]]:
    return [(c[0], v) for c, v in zip(self.d.consts, self.consts)]


def draw_op(rng: random.Random, name: str) -> Op:
  d = OPS[name]
  vals = []
  for cname, lo, hi in d.consts:
    v = round(rng.uniform(lo, hi), 3)
    if name == "mul_scalar" and rng.random() < 0.3:
      v = -v  # Negative scales too.
    vals.append(v)
    del cname
  return Op(name, tuple(vals))


def chain_ok(names: Sequence[str]) -> bool:
  """Structural rules: no op twice, no growing op after another growing op or after a broadcast/scalar step that
  follows one, at most one residual."""
  if len(set(names)) != len(names):
    return False
  grown = False
  for n in names:
    if n in GROWING:
      if grown:
        return False
      grown = True
    elif OPS[n].kind == "unary" and n in ("tanh", "sigmoid", "hardtanh", "softsign"):
      grown = False
  return True


def consts_of(chain: Sequence[Op]) -> list[tuple[str, float]]:
  """(name, value) of every constant of the chain, in order (chains never repeat an op, so names are unique)."""
  return [item for op in chain for item in op.const_items()]


def params_of(chain: Sequence[Op]) -> list[OpDef]:
  return [op.d for op in chain if op.d.param]


def torch_lines(chain: Sequence[Op], first: str, res: str = "x", var: str = "y") -> list[str]:
  """Lines of forward() applying the chain to the expression `first` (e.g. 'x' or 'self.linear(x)'), ending in
  `var` holding the result."""
  lines, cur = [], first
  for op in chain:
    expr = op.d.torch.format(x=cur, res=res)
    lines.append(f"{var} = {expr}")
    cur = var
  if not lines:
    lines.append(f"{var} = {first}")
  return lines


def cuda_literal(v: float) -> str:
  s = repr(float(v))
  return s + "f" if ("e" in s or "." in s) else s + ".0f"


def cuda_apply(chain: Sequence[Op], name: str = "apply", *, body: Sequence[Op] | None = None,
               layout: bool = False) -> tuple[str, list[str], list[str]]:
  """The `__device__` function applying the chain to one value: `float name(float v, long long i[, float r], ...)`.

  Returns (source, extra parameter declarations, their plan arguments in the same order). The extra parameters
  are the broadcast params (`const float* __restrict__ <param>`; plan: the param name), `int chans` / `int cols` when
  broadcast ops need them (plan: '@C' / '@L', which the caller replaces by the output's sizes) and the constants
  (`float <name>`; plan: the init-arg name). `r` is the residual value when the chain has a residual op.
  Mutations: `body` computes another chain behind the same signature (a wrong op or order); `layout` indexes
  broadcast params the wrong way.
  """
  params = params_of(chain)
  need_c = any(p.kind == "channel" for p in params)
  need_l = any(p.kind in ("channel", "column") for p in params)
  has_res = any(op.name == "residual" for op in chain)
  decl, plan = [], []
  for p in params:
    decl.append(f"const float* __restrict__ {p.param}")
    plan.append(p.param)
  if need_c:
    decl.append("int chans")
    plan.append("@C")
  if need_l:
    decl.append("int cols")
    plan.append("@L")
  for cname, _ in consts_of(chain):
    decl.append(f"float {cname}")
    plan.append(cname)
  sig = ["float v", "long long i"] + (["float r"] if has_res else []) + decl
  lines = []
  for op in (chain if body is None else body):
    d = op.d
    if d.kind == "channel":
      p = f"{d.param}[i % chans]" if layout else f"{d.param}[(i / cols) % chans]"
    elif d.kind == "column":
      p = f"{d.param}[(i / cols) % cols]" if layout else f"{d.param}[i % cols]"
    else:
      p = ""
    lines.append(f"  v = {d.cuda.format(v='v', p=p, r='r')};  // {op.name}")
  src = (f"__device__ __forceinline__ float {name}({', '.join(sig)}) {{\n" + "\n".join(lines)
         + ("\n" if lines else "") + "  return v;\n}\n")
  return src, decl, plan


def call_args(decl: Sequence[str]) -> list[str]:
  """The parameter names of declarations from cuda_apply, to forward them in a call."""
  return [d.split()[-1] for d in decl]


# --- the pure-Python model ----------------------------------------------------------------------------------

_N = 512
_Q = [statistics.NormalDist().inv_cdf((k + 0.5) / _N) for k in range(_N)]
_PERM = list(range(_N))
random.Random(0).shuffle(_PERM)
_PARAM_SAMPLE = [_Q[_PERM[(k * 7 + 3) % _N]] for k in range(_N)]  # N(0,1) values paired with each sample.


def simulate(chain: Sequence[Op], xs: Sequence[float], res: Sequence[float] | None = None) -> list[float]:
  """The chain on each value of xs (broadcast params drawn from their init distribution, residual = res or xs)."""
  res = xs if res is None else res
  out = []
  for k, x in enumerate(xs):
    v = x
    for op in chain:
      d = op.d
      try:
        if d.kind == "residual":
          v = d.py(v, res[k])
        elif d.param:
          z = _PARAM_SAMPLE[k % _N]
          p = 0.5 * z if d.name.startswith("add") else 1.0 + 0.5 * z
          v = d.py(v, p)
        else:
          v = d.py(v, *op.consts)
      except (OverflowError, ValueError):
        v = math.inf
      if not math.isfinite(v) or abs(v) > F32_MAX:
        v = math.inf
    out.append(v)
  return out


def sample_inputs(loc: float = 0.0, scale: float = 1.0) -> list[float]:
  """The fixed sample the simulation uses: N(loc, scale^2) quantiles."""
  return [loc + scale * q for q in _Q]


def _close(a: float, b: float) -> bool:
  """Equal within 2x the evaluator's atol and 10x its rtol (a margin for the gate's thresholds)."""
  return abs(a - b) <= 2e-4 + 1e-3 * abs(b)


def healthy(ys: Sequence[float], xs: Sequence[float] | None = None) -> bool:
  """Would a trivial kernel pass this output? False when it is not finite, mostly one value, mostly unchanged
  between two input draws, or (xs given: same-shape tasks) mostly equal to the input. Margins are wider than the
  real gate's (kernels/suite.py GATE_*)."""
  if not all(math.isfinite(y) for y in ys):
    return False
  med = statistics.median(ys)
  for c in (0.0, med):
    if sum(_close(c, y) for y in ys) > 0.8 * len(ys):
      return False
  if xs is not None and sum(_close(x, y) for x, y in zip(xs, ys)) > 0.8 * len(ys):
    return False
  varying = sum(not _close(ys[_PERM[k]], ys[k]) for k in range(len(ys)))
  return varying >= 0.7 * len(ys)


def differs(ys: Sequence[float], zs: Sequence[float], share: float = 0.1) -> bool:
  """Do two outputs differ beyond tolerance on at least `share` of the sample (a mutation that shows)?"""
  bad = sum(not (math.isfinite(y) and math.isfinite(z) and _close(z, y)) for y, z in zip(ys, zs))
  return bad >= share * len(ys)


def epilogue_mutation(post: Sequence[Op], xs: Sequence[float], rng, swaps: bool = True):
  """A wrong epilogue for a 'wrong_epilogue' candidate: (op chain, bug sentence), drawn with `rng` among the chains
  that leave out one op (or, with `swaps`, exchange two neighbours) and differ from `post` on the sample `xs`;
  None when no such chain exists."""
  if not post:
    return None
  ref = simulate(post, xs)
  options = []
  for k in range(len(post)):
    body = tuple(post[:k]) + tuple(post[k + 1:])
    if differs(ref, simulate(body, xs)):
      options.append((body, f"leaves out the epilogue's {post[k].name}"))
  for k in range(len(post) - 1 if swaps else 0):
    body = tuple(post[:k]) + (post[k + 1], post[k]) + tuple(post[k + 2:])
    if differs(ref, simulate(body, xs)):
      options.append((body, f"applies {post[k + 1].name} before {post[k].name} in the epilogue"))
  return options[rng.randrange(len(options))] if options else None

