"""Probe: does a latency-bound kernel's event time depend on how its timed runs are driven, or on where its input lies?

  python experiments/evaluator/timing_probe.py [--runs 100] [--rounds 3] [--out DIR]     (about 1 minute on one GPU)

The evaluator's timed runs changed in two ways that a kernel's own time could notice: the host queues run i+1 while
the GPU runs run i (before, it waited for each run), and buffers keep their addresses across evaluations of a task
(before, the allocator cache was emptied after each). The bundled `level1/12_RMSNorm` 'naive' kernel (one thread per
row, rows 16 KiB apart) is the suite's most sensitive timing. This script times that kernel and the PyTorch
reference outside the evaluator, per run: an L2 flush, then CUDA events around the launch, in these modes:

  queued         runs queued back to back, one synchronisation at the end (the new driver)
  synced         a host wait after every run (the old driver)
  synced_gap     a host wait and 1 ms of idle GPU after every run
  queued_redraw  as queued, with a fresh torch.randn draw into the input before each run (the protocol's fresh inputs)
  synced_redraw  as synced, with the fresh draw
  synced_realloc as synced_redraw, the input reallocated each run (a new address whenever the allocator gives one)
  queued_moved   as queued_redraw, the input moved each run to a random 2 MiB-aligned place in a pool 64 MiB
                 larger than it (other physical pages: does the kernel's time depend on where its input lies?)

Rounds interleave the modes; the table gives each mode's median over runs, per round, and its ratio to `queued`.
Writes timing_probe.json / timing_probe.md to --out. The kernel source is the bundled solution's (read, not copied).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time

import cupy as cp
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOLUTION = os.path.join(ROOT, "kevin_jax", "data", "solutions", "level1", "12_RMSNorm", "naive.md")
BATCH, SEQ, FEATURES, EPS = 16, 2047, 4097, 1e-6  # kevin_jax/data/tasks/level1/12_RMSNorm.py
MODES = ("queued", "synced", "synced_gap", "queued_redraw", "synced_redraw", "synced_realloc", "queued_moved")
_PAGE = 2**21 // 4  # float32 elements in 2 MiB.


def naive_kernel() -> cp.RawKernel:
  text = open(SOLUTION, encoding="utf-8").read()
  src = re.search(r"```cuda\n(.*?)```", text, re.S).group(1)
  return cp.RawKernel(src, "rms_norm_rows")


def time_mode(mode: str, launch, x: torch.Tensor, flush: torch.Tensor, runs: int,
              pool: torch.Tensor | None = None) -> list[float]:
  """Event times (ms) of `launch()` over `runs` runs driven as `mode` (module docstring); `pool` (float32, at least
  32 pages of 2 MiB larger than x) holds x in mode queued_moved."""
  events = []
  for _ in range(runs):
    if mode == "synced_realloc":
      x.data = torch.empty_like(x)
    if mode == "queued_moved":
      at = _PAGE * int(torch.randint(0, 33, ()))
      x.data = pool[at:at + x.numel()].view(x.shape)
    if mode.endswith(("redraw", "moved")) or mode == "synced_realloc":
      torch.randn(x.shape, out=x)
    flush.zero_()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    launch()
    e1.record()
    events.append((e0, e1))
    if mode.startswith("synced"):
      torch.cuda.synchronize()
      if mode == "synced_gap":
        time.sleep(0.001)
  torch.cuda.synchronize()
  return [a.elapsed_time(b) for a, b in events]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  ap.add_argument("--runs", type=int, default=100)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--out", default=os.environ.get("OUT", "runs/timing_probe"))
  args = ap.parse_args()
  os.makedirs(args.out, exist_ok=True)
  torch.manual_seed(0)
  dev = torch.device("cuda")
  x = torch.randn(BATCH, SEQ, FEATURES, device=dev)
  pool = torch.empty(x.numel() + 32 * _PAGE, device=dev)
  w = torch.rand(FEATURES, device=dev) + 0.5
  y = torch.empty_like(x)
  props = torch.cuda.get_device_properties(dev)
  flush = torch.empty(max(2 * getattr(props, "L2_cache_size", 50 * 2**20), 256 * 2**20) // 4, device=dev)
  kern, rows = naive_kernel(), BATCH * SEQ

  def candidate():
    kern(((rows + 127) // 128,), (128,), (cp.uint64(x.data_ptr()), cp.uint64(w.data_ptr()), cp.uint64(y.data_ptr()),
                                            cp.int32(rows), cp.int32(FEATURES), cp.float32(EPS)),
         stream=cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream))

  def reference():
    torch.mul(x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS), w, out=y)

  for f in (candidate, reference):  # Warm-up (compile, allocator).
    time_mode("queued", f, x, flush, 5)
  res: dict = {"gpu": torch.cuda.get_device_name(dev), "runs": args.runs, "rounds": []}
  for r in range(args.rounds):
    row = {}
    for name, f in (("candidate", candidate), ("reference", reference)):
      for mode in MODES:
        row[f"{name}/{mode}"] = statistics.median(time_mode(mode, f, x, flush, args.runs, pool))
    res["rounds"].append(row)
    print(f"round {r + 1}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items()), flush=True)
  lines = [f"# Timing probe: level1/12_RMSNorm naive and its reference ({res['gpu']}, {args.runs} runs per mode, "
           f"{args.rounds} rounds)", "", "| kernel | mode | median ms per round | ratio to queued |",
           "|---|---|---|---|"]
  for name in ("candidate", "reference"):
    for mode in MODES:
      ms = [row[f"{name}/{mode}"] for row in res["rounds"]]
      q = [row[f"{name}/queued"] for row in res["rounds"]]
      lines.append(f"| {name} | {mode} | {', '.join(f'{m:.4f}' for m in ms)} | "
                   f"{statistics.median(m / b for m, b in zip(ms, q)):.4f} |")
  md = "\n".join(lines) + "\n"
  with open(os.path.join(args.out, "timing_probe.json"), "w", encoding="utf-8") as f:
    json.dump(res, f, indent=2)
  with open(os.path.join(args.out, "timing_probe.md"), "w", encoding="utf-8") as f:
    f.write(md)
  print(md)


if __name__ == "__main__":
  main()
