"""--kernel-opts for the decode benches: a decode kernel's keyword arguments (block shapes, stages, splits, merge)
for one process, without changing its defaults. profile_decode.py and bench_sampler.py take the flag; part 3 of
experiments/decode_kernels_ab.sh passes part 1's winners (experiments/decode_winners.py prints the value).

  --kernel-opts "decode_mlp.swiglu_front:num_stages=5,block_m=32;decode_attention.decode_attention:merge=unrolled"
"""

from __future__ import annotations

import functools
import importlib


def parse_kernel_opts(spec: str) -> list[tuple[str, str, dict]]:
  """'decode_mlp.swiglu_front:num_stages=5;decode_attention.decode_attention:num_splits=1,merge=unrolled' ->
  [(module, function, {keyword: value})]; integer values become ints. The modules are kevin_jax.policy's."""
  out = []
  for part in filter(None, (p.strip() for p in spec.split(";"))):
    target, _, kws = part.partition(":")
    module, _, fn = target.partition(".")
    if not (module and fn and kws):
      raise ValueError(f"--kernel-opts: expected module.function:key=value,..., got {part!r}")
    opts = {}
    for kv in kws.split(","):
      key, eq, value = kv.partition("=")
      if not eq:
        raise ValueError(f"--kernel-opts: expected key=value, got {kv!r} in {part!r}")
      opts[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    out.append((module, fn, opts))
  return out


def apply_kernel_opts(spec: str) -> list[tuple[str, str, dict]]:
  """Rebinds each named kernel function of kevin_jax.policy.<module> to a functools.partial with the keywords, for
  this process: the model looks its kernels up on their modules at call time, so a decode step traced afterwards
  uses them (a kernel's block shapes, stages or splits, end to end, without changing its defaults)."""
  opts = parse_kernel_opts(spec)
  for module, fn, kw in opts:
    mod = importlib.import_module(f"kevin_jax.policy.{module}")
    setattr(mod, fn, functools.partial(getattr(mod, fn), **kw))
  return opts
