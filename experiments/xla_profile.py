"""Where GPU time goes in a jitted JAX call: trace it with jax.profiler and sum device kernel time by name.

  from experiments.xla_profile import profile_kernels
  table = profile_kernels(lambda: step(*args), out_dir)   # runs the callable once under the profiler
  print(format_table(table))

Reads the trace's xplane.pb with jax.profiler.ProfileData (no TensorBoard needed): events on the GPU planes'
stream lines are kernels (and memcpys); each is grouped by kernel name and by the HLO op that launched it
(the event's `hlo_op` stat), and classed as matmul / attention / fusion / copy / other by name.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import shutil

_CLASSES = (
    ("attention", re.compile(r"flash|fmha|cudnn|sdpa|attention|mha", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|cublas|cutlass|matmul|dot|xmma|sm90_", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy", re.I)),
    ("fusion", re.compile(r"fusion|loop_|input_|reduce|scatter|gather|transpose|convert|slice", re.I)),
)


def classify(name: str) -> str:
  for cls, rx in _CLASSES:
    if rx.search(name):
      return cls
  return "other"


def kernel_table(trace_dir: str) -> dict:
  """Device time by kernel, by HLO op and by class from the newest trace under trace_dir (times in ms)."""
  from jax.profiler import ProfileData  # pylint: disable=g-import-not-at-top
  files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
  if not files:
    raise FileNotFoundError(f"no *.xplane.pb under {trace_dir}")
  data = ProfileData.from_file(files[-1])
  by_kernel = collections.defaultdict(lambda: [0.0, 0])
  by_op = collections.defaultdict(lambda: [0.0, 0])
  by_class = collections.defaultdict(float)
  busy = 0.0
  for plane in data.planes:
    if not plane.name.startswith("/device:GPU"):
      continue
    for line in plane.lines:
      if not line.name.lower().startswith("stream"):
        continue
      for ev in line.events:
        ms = ev.duration_ns / 1e6
        stats = dict(ev.stats)
        op = str(stats.get("hlo_op", ""))
        by_kernel[ev.name][0] += ms
        by_kernel[ev.name][1] += 1
        by_op[op or ev.name][0] += ms
        by_op[op or ev.name][1] += 1
        by_class[classify(ev.name)] += ms
        busy += ms
  def top(d, n=40):
    return [(k, round(v[0], 3), v[1]) for k, v in sorted(d.items(), key=lambda kv: -kv[1][0])[:n]]
  return {"trace": files[-1], "busy_ms": busy, "by_class_ms": dict(by_class), "top_kernels": top(by_kernel),
          "top_hlo_ops": top(by_op)}


def profile_kernels(fn, out_dir: str, keep_trace: bool = False) -> dict:
  """Runs fn() once under jax.profiler.trace(out_dir) (blocking on its result) and returns kernel_table.

  The trace (tens to hundreds of MB) is deleted afterwards unless keep_trace.
  """
  import jax  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  with jax.profiler.trace(out_dir):
    jax.block_until_ready(fn())
  table = kernel_table(out_dir)
  if not keep_trace:
    shutil.rmtree(out_dir, ignore_errors=True)
  return table


def format_table(t: dict, n: int = 25) -> str:
  lines = [f"device busy {t['busy_ms']:.2f} ms; by class: " +
           ", ".join(f"{k} {v:.2f}" for k, v in sorted(t["by_class_ms"].items(), key=lambda kv: -kv[1]))]
  lines.append("top kernels (ms, count):")
  lines += [f"  {ms:9.3f} {cnt:7d}  {name[:110]}" for name, ms, cnt in t["top_kernels"][:n]]
  lines.append("top HLO ops (ms, count):")
  lines += [f"  {ms:9.3f} {cnt:7d}  {name[:110]}" for name, ms, cnt in t["top_hlo_ops"][:n]]
  return "\n".join(lines)
