"""Evaluator benchmark on one GPU: throughput, speedup repeatability, NVRTC vs load_inline compile time.

  python experiments/bench_evaluator.py --out runs/bench_evaluator      (about 3-4 minutes on one H200)

1. Throughput: --n full evaluations (5 correctness trials + 100 timed runs each, the defaults) of correct kernels
   for three tasks whose PyTorch reference takes about 1 ms (ReLU over 256M floats, row softmax 16384 x 16384,
   fp32 matmul 5120x1024x5120), each candidate a distinct source (so every one is really compiled), submitted as one
   batch like an RL step. Reports evaluations per minute, the per-phase breakdown (compile, correctness,
   timing, queue waits) and, per task, the worker's own split (details.breakdown: host ms per phase and sub-phase;
   --profile-phases adds each phase's GPU time from CUDA events). --ref-timing cached gives the main job's setting
   (the reference timed in each task's warm-up evaluation, then only on validated runs).
2. Repeatability: the same candidate re-evaluated --repeats times per task; speedup spread (max-min)/2 around the
   median, in percent (goal: within +-3%).
3. Compile time: NVRTC (our path) for the ReLU kernel, cold, vs a KernelBench-style
   torch.utils.cpp_extension.load_inline build of the same kernel (once; --skip-load-inline to skip; needs nvcc
   and ninja).
Writes bench_evaluator.json and bench_evaluator.md to --out (default $OUT) and prints a short table last.

  python experiments/bench_evaluator.py --suite --out runs/suite_check    (about 3 minutes)
evaluates every solution of the bundled suite (kevin_jax/data/solutions/*/*/*.md) instead and compares each status
with the `expect` in its meta.json (writes suite_check.json / suite_check.md: mismatches, reference times, speedups).

  python experiments/bench_evaluator.py --compare-suite OLD/suite_check.json NEW/suite_check.json     (no GPU)
compares two suite checks (two trees, or two settings such as --flush-bytes): status changes, and per solution
correct in both the ratio new speedup / old speedup (median, worst, and how many lie outside +-1 %).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kevin_jax.kernels import compile as compile_mod  # pylint: disable=wrong-import-position
from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig  # pylint: disable=wrong-import-position

DATA = os.path.join(ROOT, "tests", "data", "eval")
TASKS = ["relu_1ms", "softmax_1ms", "matmul_1ms"]
PHASES = ["static_queue", "task_analysis", "compile", "gpu_queue", "load", "prepare", "correctness", "timing",
          "gpu_total", "total"]

LOAD_INLINE_SCRIPT = r'''
import os, sys, time, uuid
import torch
from torch.utils.cpp_extension import load_inline
cuda_src = """
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(x[i], 0.f);
}
torch::Tensor relu(torch::Tensor x) {
  auto y = torch::empty_like(x);
  long long n = x.numel();
  relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""
cpp_src = "torch::Tensor relu(torch::Tensor x);"
t = time.perf_counter()
load_inline(name="relu_" + uuid.uuid4().hex[:8], cpp_sources=cpp_src, cuda_sources=cuda_src, functions=["relu"],
            build_directory=sys.argv[1], verbose=False)
print("LOAD_INLINE_SECONDS", time.perf_counter() - t)
'''


def read(*parts):
  with open(os.path.join(DATA, *parts), encoding="utf-8") as f:
    return f.read()


def variant(text: str, i: int, where: str) -> str:
  """A distinct candidate: a comment in the CUDA source (forces a real compile) or in the plan (cache hit)."""
  if where == "cuda":
    return text.replace("```cuda\n", f"```cuda\n// variant {i}\n", 1)
  return text.replace("```plan\n", f"```plan\n# variant {i}\n", 1)


def phase_means(results) -> dict:
  out = {}
  for p in PHASES:
    vals = [r.times[p] for r in results if p in r.times]
    if vals:
      out[p] = statistics.fmean(vals)
  return out


def phase_breakdown(results) -> dict:
  """Mean milliseconds per worker phase (details.breakdown: host wall-clock, and GPU event time when profiled)."""
  out = {}
  for kind in ("host_ms", "gpu_ms"):
    rows = [r.details["breakdown"][kind] for r in results if kind in (r.details or {}).get("breakdown", {})]
    if rows:
      names = list(dict.fromkeys(k for row in rows for k in row))
      out[kind] = {k: round(statistics.fmean(row.get(k, 0.0) for row in rows), 2) for k in names}
  for key in ("cuda_malloc", "cuda_free"):
    vals = [r.details["breakdown"][key] for r in results if key in (r.details or {}).get("breakdown", {})]
    if vals:
      out[key] = statistics.fmean(vals)
  return out


def phase_lines(per_task: dict) -> list[str]:
  """Markdown: mean ms per worker phase, one row per phase, host (and GPU when profiled) columns per task."""
  phs = {task: d.get("phases") or {} for task, d in per_task.items() if (d.get("phases") or {}).get("host_ms")}
  if not phs:
    return []
  names = list(dict.fromkeys(k for ph in phs.values() for k in ph["host_ms"]))
  gpu = any("gpu_ms" in ph for ph in phs.values())
  head = [f"{t} {side}" for t in phs for side in (("host", "GPU") if gpu else ("host",))]
  lines = ["", "Worker phases, mean ms per evaluation (details.breakdown; a phase includes its '/' sub-phases):", "",
           "| phase | " + " | ".join(head) + " |", "| --- |" + " --- |" * len(head)]
  for k in names:
    cells = []
    for ph in phs.values():
      cells.append(f"{ph['host_ms'][k]:.2f}" if k in ph["host_ms"] else "-")
      if gpu:
        cells.append(f"{ph['gpu_ms'][k]:.2f}" if k in ph.get("gpu_ms", {}) else "-")
    lines.append(f"| {k} | " + " | ".join(cells) + " |")
  cells = []
  for ph in phs.values():
    cells += [f"{ph.get('cuda_malloc', 0):.1f} / {ph.get('cuda_free', 0):.1f}"] + (["-"] if gpu else [])
  lines.append("| cudaMalloc / cudaFree calls | " + " | ".join(cells) + " |")
  return lines


def run_load_inline(timeout_s: float) -> dict:
  build = tempfile.mkdtemp(prefix="bench_load_inline_")
  env = dict(os.environ, MAX_JOBS=str(os.cpu_count() or 8), TORCH_CUDA_ARCH_LIST="9.0")
  t = time.perf_counter()
  try:
    p = subprocess.run([sys.executable, "-c", LOAD_INLINE_SCRIPT, build], capture_output=True, text=True,
                       timeout=timeout_s, env=env, check=False)
  except subprocess.TimeoutExpired:
    return {"ok": False, "error": f"timed out after {timeout_s:.0f} s", "wall_s": time.perf_counter() - t}
  wall = time.perf_counter() - t
  for line in p.stdout.splitlines():
    if line.startswith("LOAD_INLINE_SECONDS"):
      return {"ok": True, "seconds": float(line.split()[1]), "wall_s": wall}
  return {"ok": False, "error": (p.stderr or p.stdout)[-1500:], "wall_s": wall}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "runs/bench_evaluator"))
  ap.add_argument("--n", type=int, default=60, help="evaluations in the throughput batch")
  ap.add_argument("--repeats", type=int, default=5, help="re-evaluations of one candidate per task")
  ap.add_argument("--skip-load-inline", action="store_true")
  ap.add_argument("--load-inline-timeout", type=float, default=180.0)
  ap.add_argument("--fake", action="store_true", help="CPU dry run of this script with a stand-in GPU worker")
  ap.add_argument("--suite", action="store_true", help="check the bundled suite's solutions against meta.json")
  ap.add_argument("--timing-max-s", type=float, default=0.0,
                  help="evaluator.timing_max_s (time budget of one candidate's timed runs; 0 = all 100 runs)")
  ap.add_argument("--compare-suite", nargs=2, metavar=("OLD_JSON", "NEW_JSON"),
                  help="compare two suite_check.json files and exit (no GPU)")
  ap.add_argument("--ref-timing", default="interleaved", choices=("interleaved", "cached"),
                  help="evaluator.ref_timing ('cached': the reference timed in a task's first evaluation only)")
  ap.add_argument("--profile-phases", action="store_true",
                  help="evaluator.profile_phases: GPU event time per worker phase beside the host time")
  ap.add_argument("--flush-bytes", type=int, default=0,
                  help="evaluator.flush_bytes: the L2 flush's write (0: max(2 x L2, 256 MiB))")
  args = ap.parse_args()
  if args.compare_suite:
    print(compare_suites(*args.compare_suite))
    return
  if args.suite:
    suite_check(args)
    return
  os.makedirs(args.out, exist_ok=True)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                      handlers=[logging.FileHandler(os.path.join(args.out, "bench_evaluator.log")),
                                logging.StreamHandler()])
  log = logging.getLogger("bench")
  report: dict = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "ref_timing": args.ref_timing}
  t_all = time.perf_counter()
  cands = {t: read("candidates", t + ".md") for t in TASKS}
  cache_dir = tempfile.mkdtemp(prefix="bench_evaluator_cache_")  # Cold NVRTC cache.
  cfg = EvaluatorConfig(cache_dir=cache_dir, timing_max_s=args.timing_max_s, ref_timing=args.ref_timing,
                        profile_phases=args.profile_phases, flush_bytes=args.flush_bytes)
  t = time.perf_counter()
  with Evaluator(cfg, task_source=os.path.join(DATA, "tasks"), _gpu_role="fake" if args.fake else "gpu") as ev:
    # Warm-up: one evaluation per task loads the reference models and cuBLAS in the worker.
    warm = ev.evaluate([(task, variant(cands[task], -1, "plan")) for task in TASKS])
    report["startup_and_warmup_s"] = time.perf_counter() - t
    report["gpu"] = ev.gpu_info
    report["warmup"] = [{"task": r.task_id, "status": r.status, "error": r.error, "speedup": r.speedup}
                        for r in warm]
    log.info("warm-up done in %.1f s: %s", report["startup_and_warmup_s"], [r.status for r in warm])
    for r in warm:
      if r.status != "correct":
        log.error("warm-up candidate for %s is %s: %s\n%s", r.task_id, r.status, r.error, r.feedback)

    # 1. Throughput: one RL-style batch of distinct candidates.
    items = [(TASKS[i % len(TASKS)], variant(cands[TASKS[i % len(TASKS)]], i, "cuda")) for i in range(args.n)]
    t = time.perf_counter()
    rs = ev.evaluate(items)
    wall = time.perf_counter() - t
    statuses = {s: sum(r.status == s for r in rs) for s in sorted({r.status for r in rs})}
    report["throughput"] = {
        "n": args.n, "wall_s": wall, "evals_per_min": args.n / wall * 60, "statuses": statuses,
        "ref_from_cache": sum(bool(((r.details or {}).get("timing") or {}).get("ref_ms", {}).get("cached"))
                              for r in rs),
        "phase_mean_s": phase_means(rs),
        "per_task": {task: {"phase_mean_s": phase_means([r for r in rs if r.task_id == task]),
                            "phases": phase_breakdown([r for r in rs if r.task_id == task]),
                            "speedup_median": statistics.median([r.speedup for r in rs
                                                                 if r.task_id == task and r.speedup] or [0]),
                            "ref_ms_median": statistics.median([r.ref_time_ms for r in rs
                                                                if r.task_id == task and r.ref_time_ms] or [0])}
                     for task in TASKS}}
    log.info("throughput: %d evaluations in %.1f s = %.1f / min; %s", args.n, wall, args.n / wall * 60, statuses)
    bad = [r for r in rs if r.status != "correct"]
    for r in bad[:3]:
      log.error("not correct: %s %s: %s", r.task_id, r.status, r.error)

    # 2. Repeatability of the speedup.
    items = [(task, variant(cands[task], 1000 + k, "plan")) for task in TASKS for k in range(args.repeats)]
    t = time.perf_counter()
    rs = ev.evaluate(items)
    rep = {}
    for task in TASKS:
      sp = [r.speedup for r in rs if r.task_id == task and r.speedup]
      if len(sp) == args.repeats:
        med = statistics.median(sp)
        rep[task] = {"speedups": sp, "median": med, "spread_pct": (max(sp) - min(sp)) / 2 / med * 100,
                     "ref_ms": [r.ref_time_ms for r in rs if r.task_id == task],
                     "cand_ms": [r.cand_time_ms for r in rs if r.task_id == task]}
      else:
        rep[task] = {"error": [f"{r.status}: {r.error}" for r in rs if r.task_id == task and not r.speedup]}
    report["repeatability"] = rep
    report["repeatability_wall_s"] = time.perf_counter() - t
    log.info("repeatability: %s", {k: round(v.get("spread_pct", -1), 2) for k, v in rep.items()})

  # 3. Compile time: NVRTC, cold (fresh source, no cache) vs load_inline.
  relu_src = read("candidates", "relu_1ms.md").split("```cuda\n", 1)[1].split("```", 1)[0]
  nv = [compile_mod.compile_cuda(relu_src + f"\n// cold {time.time_ns()}\n", cache_dir="") for _ in range(3)]
  report["compile"] = {"nvrtc_s": [r.seconds for r in nv], "nvrtc_ok": all(r.ok for r in nv),
                       "nvrtc_version": list(compile_mod.nvrtc_version())}
  if not args.skip_load_inline:
    log.info("load_inline build (KernelBench path), up to %.0f s ...", args.load_inline_timeout)
    li = run_load_inline(args.load_inline_timeout)
    report["compile"]["load_inline"] = li
    if li.get("ok"):
      report["compile"]["ratio"] = li["seconds"] / statistics.median(report["compile"]["nvrtc_s"])
  report["total_wall_s"] = time.perf_counter() - t_all

  with open(os.path.join(args.out, "bench_evaluator.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2, default=str)
  md = markdown(report)
  with open(os.path.join(args.out, "bench_evaluator.md"), "w", encoding="utf-8") as f:
    f.write(md)
  print(md)


def suite_check(args) -> None:
  """Evaluates every bundled solution; statuses vs meta.json expectations."""
  import glob  # pylint: disable=g-import-not-at-top
  os.makedirs(args.out, exist_ok=True)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
  sol_root = os.path.join(ROOT, "kevin_jax", "data", "solutions")
  items, labels = [], []
  for d in sorted(glob.glob(os.path.join(sol_root, "level*", "*"))):
    task_id = os.path.relpath(d, sol_root)
    meta_path = os.path.join(d, "meta.json")
    meta = json.load(open(meta_path, encoding="utf-8")) if os.path.exists(meta_path) else {}
    for f in sorted(glob.glob(os.path.join(d, "*.md"))):
      name = os.path.basename(f)[:-3]
      items.append((task_id, open(f, encoding="utf-8").read()))
      labels.append((task_id, name, meta.get("solutions", {}).get(name, {}).get("expect")))
  t = time.perf_counter()
  cfg = EvaluatorConfig(cache_dir=tempfile.mkdtemp(prefix="suite_cache_"), timing_max_s=args.timing_max_s,
                        ref_timing=args.ref_timing, flush_bytes=args.flush_bytes)
  with Evaluator(cfg, task_source="bundled", _gpu_role="fake" if args.fake else "gpu") as ev:
    rs = ev.evaluate(items)
    gpu = ev.gpu_info
  wall = time.perf_counter() - t
  rows = [{"task": tid, "solution": name, "expect": exp, "status": r.status, "speedup": r.speedup,
           "ref_ms": r.ref_time_ms, "cand_ms": r.cand_time_ms, "flags": r.flags, "error": r.error[:300],
           "timing_s": (r.times or {}).get("timing"),
           "ok": exp is None or exp == r.status} for (tid, name, exp), r in zip(labels, rs)]
  bad = [x for x in rows if not x["ok"]]
  with open(os.path.join(args.out, "suite_check.json"), "w", encoding="utf-8") as f:
    json.dump({"gpu": gpu, "wall_s": wall, "timing_max_s": args.timing_max_s, "ref_timing": args.ref_timing,
               "rows": rows}, f, indent=2, default=str)
  timing_total = sum(x["timing_s"] or 0.0 for x in rows)
  lines = [f"# Suite check: {len(rows) - len(bad)}/{len(rows)} solutions match their expected status "
           f"({wall:.0f} s, {timing_total:.0f} s of it timing, timing_max_s {args.timing_max_s:g}, "
           f"{(gpu or {}).get('device_name')})", "",
           "| task | solution | expect | status | speedup | ref ms | note |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  for x in rows:
    if not x["ok"] or x["solution"] in ("naive", "optimized"):
      sp = f"{x['speedup']:.3f}" if x["speedup"] else "-"
      ref = f"{x['ref_ms']:.3f}" if x["ref_ms"] else "-"
      note = "" if x["ok"] else "MISMATCH: " + x["error"][:150]
      lines.append(f"| {x['task']} | {x['solution']} | {x['expect']} | {x['status']} | {sp} | {ref} | {note} |")
  md = "\n".join(lines) + "\n"
  with open(os.path.join(args.out, "suite_check.md"), "w", encoding="utf-8") as f:
    f.write(md)
  print(md)


def compare_suites(old_path: str, new_path: str) -> str:
  """Markdown: status changes and the new / old speedup ratio of every solution correct in both checks."""
  def rows(path):
    with open(path, encoding="utf-8") as f:
      d = json.load(f)
    return d, {(x["task"], x["solution"]): x for x in d["rows"]}
  (old_d, old), (new_d, new) = rows(old_path), rows(new_path)
  changed = [(k, old[k]["status"], new[k]["status"]) for k in sorted(old.keys() & new.keys())
             if old[k]["status"] != new[k]["status"]]
  ratios = sorted((new[k]["speedup"] / old[k]["speedup"], k) for k in old.keys() & new.keys()
                  if old[k]["status"] == new[k]["status"] == "correct" and old[k]["speedup"] and new[k]["speedup"])
  lines = [f"# Suite checks compared: {old_path} (old) vs {new_path} (new)", "",
           f"old: {old_d.get('wall_s', 0):.0f} s on {(old_d.get('gpu') or {}).get('device_name')}; new: "
           f"{new_d.get('wall_s', 0):.0f} s on {(new_d.get('gpu') or {}).get('device_name')}", "",
           f"status changes: {len(changed)} of {len(old.keys() & new.keys())} solutions"]
  lines += [f"- {task} {name}: {a} -> {b}" for (task, name), a, b in changed]
  if ratios:
    vals = [r for r, _ in ratios]
    worst = max(ratios, key=lambda rk: abs(rk[0] - 1.0))
    outside = [(r, k) for r, k in ratios if abs(r - 1.0) > 0.01]
    lines += ["", f"speedup ratio new / old over {len(vals)} solutions correct in both: median "
              f"{statistics.median(vals):.4f}, min {vals[0]:.4f}, max {vals[-1]:.4f}; worst {worst[0]:.4f} "
              f"({worst[1][0]} {worst[1][1]}); {len(outside)} outside +-1 %"]
    lines += [f"- {task} {name}: {r:.4f}" for r, (task, name) in outside]
  return "\n".join(lines) + "\n"


def markdown(rep: dict) -> str:
  gpu = rep.get("gpu") or {}
  tp = rep.get("throughput", {})
  lines = [f"# Evaluator benchmark ({rep['date']})", "",
           f"GPU: {gpu.get('device_name')} ({gpu.get('arch')}), torch {gpu.get('torch')}, cupy {gpu.get('cupy')}; "
           f"command: `{rep['command']}`", "",
           f"Throughput: **{tp.get('evals_per_min', 0):.1f} full evaluations / min** ({tp.get('n')} in "
           f"{tp.get('wall_s', 0):.1f} s; statuses {tp.get('statuses')}; ref_timing {rep.get('ref_timing')}, "
           f"reference time from the cache in {tp.get('ref_from_cache', 0)}); startup + warm-up "
           f"{rep.get('startup_and_warmup_s', 0):.1f} s", "",
           "| task | ref ms | speedup | compile s | correctness s | timing s | gpu total s | queue->done s |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for task, d in tp.get("per_task", {}).items():
    p = d["phase_mean_s"]
    lines.append(f"| {task} | {d['ref_ms_median']:.3f} | {d['speedup_median']:.3f} | {p.get('compile', 0):.3f} | "
                 f"{p.get('correctness', 0):.3f} | {p.get('timing', 0):.3f} | {p.get('gpu_total', 0):.3f} | "
                 f"{p.get('total', 0):.1f} |")
  lines += phase_lines(tp.get("per_task", {}))
  lines += ["", "| task | speedups over repeats | spread (+-%) |", "| --- | --- | --- |"]
  for task, d in rep.get("repeatability", {}).items():
    if "speedups" in d:
      lines.append(f"| {task} | {', '.join(f'{s:.3f}' for s in d['speedups'])} | {d['spread_pct']:.2f} |")
    else:
      lines.append(f"| {task} | {d.get('error')} | - |")
  c = rep.get("compile", {})
  li = c.get("load_inline", {})
  lines += ["", f"Compile: NVRTC cold {', '.join(f'{s:.3f}' for s in c.get('nvrtc_s', []))} s; load_inline "
            + (f"{li['seconds']:.1f} s (ratio {c.get('ratio', 0):.0f}x)" if li.get("ok") else
               f"not run ({li.get('error', 'skipped')[:200]})"), "",
            f"Total wall time {rep.get('total_wall_s', 0):.0f} s", ""]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
