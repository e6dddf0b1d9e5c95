"""Input draws for correctness trials and timing: the task's own distribution and several others.

Every draw uses a seed the candidate cannot see (the worker's secret RNG). Distributions, applied to the
floating-point tensors of a fresh `get_inputs()` draw (integer/bool tensors and scalars always come from
`get_inputs()` itself, so indices stay valid):

  task     get_inputs() as written, reseeded
  normal   N(0, 1)
  uniform  U(-1, 1)
  heavy    Laplace(0, 1) (heavy tails; defeats closed-form shortcuts and strided subsampling)
  shifted  N(1, 2^2)
  shrunk   the task's own draw times U(0, 1] elementwise (keeps signs, zeros and any interval containing 0)

A redraw plan (`redraw_plan`) names, per tensor, the factory of a task whose get_inputs() returns float32, float16 or
bfloat16 tensors made by torch.randn / torch.rand alone, in order: established by the same factories on the same
seed giving the same bytes (`redraw`, checked bit for bit per task on two seeds). The timed runs then draw that
distribution with keyed_draw.py's generator (N(0, 1) / U[0, 1) in the tensor's dtype, written into the candidate's
and the reference's buffers in one pass): the task's distribution, not torch's bytes; each run independent and
unpredictable (a fresh secret key), nothing a launch saw before.

A tensor whose task draw has >= 1% exact zeros is treated as structured (e.g. triangular): it gets `shrunk`
instead of a replacement, so its zero pattern survives. When the reference output on a non-task draw is not
finite, the worker falls back to the task distribution for that trial.
"""

from __future__ import annotations

import torch

from kevin_jax.kernels import buffers as B
from kevin_jax.kernels import keyed_draw as KD
from kevin_jax.kernels.taskinfo import DISTRIBUTIONS  # pylint: disable=unused-import  # Re-exported.

STRUCTURED_ZERO_FRACTION = 0.01


def draw(module, dist: str, seed: int, device: torch.device) -> list:
  """One input list on `device` (contiguous tensors; scalars unchanged)."""
  if dist not in DISTRIBUTIONS:
    raise ValueError(f"unknown input distribution {dist!r} (known: {', '.join(DISTRIBUTIONS)})")
  torch.manual_seed(seed)
  try:
    with torch.device(device):
      xs = list(module.get_inputs())
  except RuntimeError:
    xs = list(module.get_inputs())  # get_inputs that insists on CPU tensors.
  xs = [x.to(device).contiguous() if isinstance(x, torch.Tensor) else x for x in xs]
  if dist == "task":
    return xs
  gen = torch.Generator(device=device)
  gen.manual_seed(seed ^ 0x5DEECE66D)
  return [_transform(x, dist, gen) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]


REDRAW_FACTORIES = KD.FACTORIES
REDRAW_CHECK_SEEDS = (0x5EED0, 0x5EED1)


def redraw(plan, seed: int, outs) -> None:
  """The task draw of `seed` written into `outs` (contiguous tensors of the draw's shapes and dtypes) by `plan`."""
  torch.manual_seed(seed)
  for factory, t in zip(plan, outs):
    getattr(torch, factory)(t.shape, out=t)


def redraw_plan(module, device: torch.device) -> tuple | None:
  """Factories that redraw the task's float32/16/bf16 tensor inputs bit for bit (module docstring), or None."""
  plan = []
  for seed in REDRAW_CHECK_SEEDS:
    xs = [x for x in draw(module, "task", seed, device) if isinstance(x, torch.Tensor)]
    if not xs or any(x.dtype not in KD.DTYPES for x in xs):
      return None
    while len(plan) < len(xs):  # The factory of the next tensor, given those before it (first seed only).
      j = len(plan)
      found = next((f for f in REDRAW_FACTORIES if _redraws(plan + [f], seed, xs[:j + 1])), None)
      if found is None:
        return None
      plan.append(found)
    if not _redraws(plan, seed, xs):
      return None
    del xs
  return tuple(plan)


def _redraws(plan, seed: int, xs) -> bool:
  outs = [torch.empty_like(x) for x in xs]
  redraw(plan, seed, outs)
  return not any(B.changed(zip(outs, xs)))


def _transform(x: torch.Tensor, dist: str, gen: torch.Generator) -> torch.Tensor:
  if x.numel() == 0:
    return x
  structured = (x == 0).sum().item() >= STRUCTURED_ZERO_FRACTION * x.numel()
  if dist == "shrunk" or structured:
    u = 1.0 - torch.rand(x.shape, generator=gen, device=x.device, dtype=torch.float32)  # (0, 1]
    return (x.float() * u).to(x.dtype)
  # Each draw's affine map inside the generating kernel (one pass; the separate passes gave the same values).
  y = torch.empty(x.shape, device=x.device, dtype=torch.float32)
  if dist == "normal":
    y.normal_(generator=gen)
  elif dist == "uniform":
    y.uniform_(-1.0, 1.0, generator=gen)
  elif dist == "heavy":
    u = y.uniform_(-0.5, 0.5, generator=gen)
    y = torch.copysign(u.abs().mul_(-2).log1p_().clamp_min_(-80.0).neg_(), u)
  elif dist == "shifted":
    y.normal_(1.0, 2.0, generator=gen)
  else:
    raise ValueError(dist)
  return y.to(x.dtype).contiguous()


def trial_distributions(n_trials: int, configured, task_override, unsafe=()) -> list[str]:
  """Distribution per correctness trial: the task's override or the configured list, cycled; 'task' first."""
  names = list(task_override) if task_override else list(configured or ("task",))
  names = [n for n in names if n not in set(unsafe)] or ["task"]
  if names[0] != "task":
    names = ["task"] + names
  return [names[i % len(names)] for i in range(n_trials)]
