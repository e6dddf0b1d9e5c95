"""The spec grammar of the task world: one frozen `Spec` per task, from which its PyTorch module, its reduced
CPU-sized twin and every candidate are rendered.

A spec holds the family and its main op, the elementwise chains before and after it (taskgen/ops.py), named
sizes at the real shape (`dims`) and at a reduced shape for the CPU emulator (`small`, same structure: odd
sizes, partial tiles, numel % 4 != 0 kept), family options (`opts`: reduction dim, window, stride, ...) and the
input distribution. Sizes come from a cost model of PyTorch eager time on an H200 (`eager_ms`): each eager
kernel costs max(bytes / 3.5 TB/s, flops / 40 TFLOP/s) + 5 us; the generator keeps tasks whose model time is in
EAGER_BAND_MS. The measured distribution is in BENCHMARKS.md ("Task world").

Held-out rules (documented in kevin_jax/data/README.md) are pure functions of names and numbers:
  heldout_pair(a, b)  the ordered op pair a -> b is held out: sha256("kevin_jax-pair:a>b") % PAIR_MODULUS == 0;
  heldout_dim(d)      the size d is held out: sha256("kevin_jax-dim:d") % DIM_MODULUS == 0.
Training tasks contain no held-out pair and no held-out size; held-out-composition tasks contain at least one
held-out pair and at least one held-out size.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import random
from typing import Sequence

from kevin_jax.data.taskgen.ops import Op

EAGER_BAND_MS = (0.2, 1.5)  # Target PyTorch eager time per task on an H200 (cost model), ms.
BYTES_PER_S = 3.5e12  # H200 streaming bandwidth PyTorch's elementwise kernels reach (model), bytes/s.
FLOPS_PER_S = 40e12  # fp32 GEMM without TF32 (model), flop/s.
LAUNCH_S = 5e-6  # Per eager kernel (model), s.
MAX_INPUT_BYTES = int(2.75 * 2**30)  # All inputs of a task together (the suite's rule).
PAIR_MODULUS = 6
DIM_MODULUS = 5


def _h(text: str) -> int:
  return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def heldout_pair(a: str, b: str) -> bool:
  return _h(f"kevin_jax-pair:{a}>{b}") % PAIR_MODULUS == 0


def heldout_dim(d: int) -> bool:
  return _h(f"kevin_jax-dim:{d}") % DIM_MODULUS == 0


@dataclasses.dataclass(frozen=True)
class Spec:
  """One generated task."""
  family: str
  main: str  # The family's central op ('chain' for pure elementwise chains).
  pre: tuple[Op, ...]  # Elementwise chain applied to the input before the main op.
  post: tuple[Op, ...]  # Elementwise chain applied to the main op's output (the epilogue).
  dims: tuple[tuple[str, int], ...]  # Real sizes, module constants (upper-case names).
  small: tuple[tuple[str, int], ...]  # Reduced sizes for the CPU emulator, same names.
  opts: tuple[tuple[str, object], ...] = ()  # Family options (dim, keepdim, kernel, stride, padding, eps, bias).
  dist: str = "randn"  # get_inputs distribution: randn | rand.
  model_ms: float = 0.0  # PyTorch eager time on an H200 by the cost model (eager_ms), ms.

  def dim(self, name: str, reduced: bool = False) -> int:
    return dict(self.small if reduced else self.dims)[name]

  def opt(self, name: str, default=None):
    return dict(self.opts).get(name, default)

  @property
  def ops(self) -> tuple[str, ...]:
    """The composition, in application order: pre chain, main op, post chain."""
    main = () if self.main == "chain" else (self.main,)
    return tuple(o.name for o in self.pre) + main + tuple(o.name for o in self.post)

  @property
  def pairs(self) -> list[tuple[str, str]]:
    o = self.ops
    return list(zip(o, o[1:]))

  @property
  def signature(self) -> str:
    """What fixes the candidates' code (every size and constant is a kernel argument): the family, the main op,
    the op chain and the options that change code. Tasks with one signature share their kernels."""
    code_opts = {k: v for k, v in self.opts if k in ("axis", "bias")}
    return f"{self.family}|{self.main}|{'>'.join(self.ops)}|{sorted(code_opts.items())}"

  @property
  def level(self) -> int:
    """1 for a single op, 2 for a composition (as the bundled suite's levels)."""
    return 1 if len(self.ops) == 1 else 2

  def digest(self) -> str:
    blob = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]

  @functools.cached_property
  def name(self) -> str:
    """Stable file/task name: the ops and a digest of the whole spec (never the split). Cached: the corpus build
    asks for a task's id thousands of times, and the digest serialises the whole spec."""
    short = {"mul_scalar": "scale", "add_scalar": "shift", "add_channel": "chbias", "mul_channel": "chgain",
             "add_column": "colbias", "mul_column": "colgain", "residual": "res", "leaky_relu": "lrelu",
             "hardtanh": "htanh", "hardswish": "hswish", "log_softmax": "logsoftmax", "layer_norm": "layernorm",
             "rms_norm": "rmsnorm", "logsumexp": "lse"}
    parts = [short.get(o, o) for o in self.ops]
    return "_".join(parts) + "_" + self.digest()

  @property
  def id(self) -> str:
    return f"{self.family}/{self.name}"


def odd_dim(rng: random.Random, lo: int, hi: int, *, heldout: bool | None = None) -> int:
  """A size in [lo, hi] that is not a multiple of 32 (and of 2 when possible), held out or not as asked."""
  for _ in range(10_000):
    d = rng.randint(lo, hi)
    if d % 2 == 0 and hi - lo > 4:
      d += 1
      if d > hi:
        continue
    if d % 32 == 0:
      continue
    if heldout is not None and heldout_dim(d) != heldout:
      continue
    return d
  raise ValueError(f"no size in [{lo}, {hi}] with heldout={heldout}")


def eager_ms(kernels: Sequence[tuple[float, float]]) -> float:
  """Model PyTorch eager time (ms) of a sequence of kernels given as (bytes moved, flops)."""
  return 1e3 * sum(max(b / BYTES_PER_S, f / FLOPS_PER_S) + LAUNCH_S for b, f in kernels)


def in_band(ms: float) -> bool:
  return EAGER_BAND_MS[0] <= ms <= EAGER_BAND_MS[1]
