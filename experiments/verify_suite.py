"""Verify the bundled task suite on a GPU: every labelled candidate and every degenerate candidate, through the
real evaluator, against its label; record each task's reference time and best speedup.

  python experiments/verify_suite.py --out runs/verify_suite                 # one H200: about 5 minutes
  python experiments/verify_suite.py --update-meta runs/verify_suite/results.json   # no GPU: write the numbers back

The first form evaluates, per task, the naive and optimized solutions (must be `correct`), the known-wrong
variants (must get exactly their labelled status) and the three degenerate candidates of kernels/suite.py
(all-zeros, constant, identity: must not be `correct`), and writes to --out (default $OUT):
  results.json   every EvalResult.to_dict() (feedback text included) with its label and match, plus per-task
                 reference time (median over the task's timed results) and best correct speedup
  summary.md     per-task table and the list of mismatches
  benchmarks.md  the BENCHMARKS.md-ready table (task, ops, reference ms on this GPU, best speedup)
It prints the per-task table last and exits 1 if any label is not met.

--update-meta RESULTS.json copies ref_time_ms_h200 / best_speedup_h200 into each task's meta.json, merges the
run's candidates (status, timings, feedback) into kevin_jax/data/suite_results.json (a run over some tasks
replaces only those tasks; the warm-start corpus export reads the file) and prints the BENCHMARKS.md table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kevin_jax.kernels import suite  # pylint: disable=wrong-import-position

SUITE_RESULTS = os.path.join(suite.DATA_DIR, "suite_results.json")


def build_items(tasks_, degenerate: bool = True, constant: float = 1.0) -> list[suite.SuiteCandidate]:
  """Every labelled candidate (and the degenerate ones) of the given suite tasks, grouped by task."""
  items = []
  for t in tasks_:
    items += t.candidates()
    if degenerate:
      items += suite.degenerate_candidates(t.id, suite.task_info(t), constant=constant)
  return items


def matches(c: suite.SuiteCandidate, status: str) -> bool:
  """Labelled candidates must get exactly their status; degenerate ones must simply not be correct."""
  return status != "correct" if c.kind == "degenerate" else status == c.expect


def run(ev, items: list[suite.SuiteCandidate]) -> list[dict]:
  """Evaluates the items (in one batch: compilation overlaps GPU work) and pairs each result with its label."""
  t0 = time.monotonic()
  logging.info("evaluating %d candidates of %d tasks", len(items), len({c.task_id for c in items}))
  results = ev.evaluate([(c.task_id, c.text) for c in items])  # Logs progress every 30 s.
  rows = []
  for c, r in zip(items, results):
    rows.append({"task_id": c.task_id, "candidate": c.name, "kind": c.kind, "expect": c.expect, "bug": c.bug,
                 "summary": c.summary, "status": r.status, "match": matches(c, r.status), "result": r.to_dict()})
  logging.info("evaluated in %.1f s", time.monotonic() - t0)
  return rows


def per_task(rows: list[dict]) -> dict[str, dict]:
  """Reference time (median over timed results) and best correct solution speedup per task."""
  out: dict[str, dict] = {}
  for row in rows:
    d = out.setdefault(row["task_id"], {"ref_times": [], "best_speedup": None, "best": None, "mismatches": 0,
                                        "speedups": {}})
    r = row["result"]
    if r.get("ref_time_ms"):
      d["ref_times"].append(r["ref_time_ms"])
    if not row["match"]:
      d["mismatches"] += 1
    if row["kind"] == "solution" and r["status"] == "correct" and r.get("speedup"):
      d["speedups"][row["candidate"]] = r["speedup"]
      if d["best_speedup"] is None or r["speedup"] > d["best_speedup"]:
        d["best_speedup"], d["best"] = r["speedup"], row["candidate"]
  for d in out.values():
    d["ref_time_ms"] = statistics.median(d["ref_times"]) if d["ref_times"] else None
    del d["ref_times"]
  return out


def _fmt(x, spec=".3g", none="-"):
  return none if x is None else format(x, spec)


def summary_table(rows: list[dict], tasks_info: dict[str, dict]) -> str:
  lines = ["| task | ref ms | naive | optimized | wrong variants | degenerate | labels |",
           "|---|---:|---:|---:|---|---|---|"]
  for tid, d in tasks_info.items():
    mine = [r for r in rows if r["task_id"] == tid]
    wrong = [r for r in mine if r["kind"] == "variant"]
    deg = [r for r in mine if r["kind"] == "degenerate"]
    sol = {r["candidate"]: r for r in mine if r["kind"] == "solution"}

    def cell(name):
      r = sol.get(name)
      if r is None:
        return "-"
      return f"{r['result']['speedup']:.2f}x" if r["status"] == "correct" and r["result"].get("speedup") \
          else r["status"]
    lines.append(f"| {tid} | {_fmt(d['ref_time_ms'], '.3f')} | {cell('naive')} | {cell('optimized')} | "
                 f"{sum(r['match'] for r in wrong)}/{len(wrong)} as labelled | "
                 f"{sum(r['match'] for r in deg)}/{len(deg)} fail | "
                 f"{'ok' if d['mismatches'] == 0 else str(d['mismatches']) + ' MISMATCH'} |")
  return "\n".join(lines)


def mismatch_lines(rows: list[dict]) -> list[str]:
  return [f"- {r['task_id']}:{r['candidate']} expected {r['expect'] if r['kind'] != 'degenerate' else 'not correct'}"
          f", got {r['status']}: {r['result'].get('error', '')[:200]}" for r in rows if not r["match"]]


def benchmarks_table(tasks_info: dict[str, dict], device: str = "H200") -> str:
  metas = {t.id: t.meta for t in suite.load_suite()}
  lines = [f"| task | ops | PyTorch eager ({device}, ms) | best speedup | best solution |", "|---|---|---:|---:|---|"]
  for tid, d in tasks_info.items():
    ops = ", ".join(metas.get(tid, {}).get("ops", []))
    lines.append(f"| {tid} | {ops} | {_fmt(d['ref_time_ms'], '.3f')} | {_fmt(d['best_speedup'], '.2f')}"
                 f"{'x' if d['best_speedup'] else ''} | {d['best'] or '-'} |")
  return "\n".join(lines)


def _git_commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                          cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ""


def update_meta(results_path: str, suite_results_path: str = SUITE_RESULTS) -> str:
  """Writes the H200 numbers into meta.json and the compact feedback corpus; returns the BENCHMARKS table."""
  with open(results_path, encoding="utf-8") as f:
    res = json.load(f)
  info = res["tasks"]
  by_id = {t.id: t for t in suite.load_suite()}
  for tid, d in info.items():
    task = by_id.get(tid)
    if task is None:
      print(f"warning: {tid} is not a bundled task any more; skipped", file=sys.stderr)
      continue
    meta = task.meta
    meta["ref_time_ms_h200"] = round(d["ref_time_ms"], 4) if d["ref_time_ms"] else None
    meta["best_speedup_h200"] = round(d["best_speedup"], 3) if d["best_speedup"] else None
    suite.write_meta(task.meta_path, meta)
  # Merge: a run over some tasks (--tasks) replaces those tasks' entries and keeps the others'.
  compact = {"results": {}}
  if os.path.isfile(suite_results_path):
    with open(suite_results_path, encoding="utf-8") as f:
      compact = json.load(f)
  source = {k: res["run"].get(k) for k in ("date", "commit", "device", "config")}
  for tid in {row["task_id"] for row in res["results"]}:
    compact["results"][tid] = {}
    compact.setdefault("task_sources", {})[tid] = source
  compact["source"] = source
  for row in res["results"]:
    r = row["result"]
    compact["results"].setdefault(row["task_id"], {})[row["candidate"]] = {
        "kind": row["kind"], "expect": row["expect"], "status": r["status"], "speedup": r.get("speedup"),
        "ref_time_ms": r.get("ref_time_ms"), "cand_time_ms": r.get("cand_time_ms"), "feedback": r["feedback"]}
  with open(suite_results_path, "w", encoding="utf-8") as f:
    json.dump(compact, f, indent=1, sort_keys=True)
    f.write("\n")
  return benchmarks_table(info)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "runs/verify_suite"), help="output directory")
  ap.add_argument("--levels", default="", help="comma-separated levels (default: all)")
  ap.add_argument("--tasks", default="", help="comma-separated substrings of task ids to keep (default: all)")
  ap.add_argument("--trials", type=int, default=5, help="correctness trials per candidate (task, normal, uniform, "
                                                         "heavy, shifted inputs in turn)")
  ap.add_argument("--timing-runs", type=int, default=20, help="timed launches per side")
  ap.add_argument("--no-degenerate", action="store_true", help="skip the three degenerate candidates per task")
  ap.add_argument("--constant", type=float, default=1.0, help="value written by the constant candidate")
  ap.add_argument("--gpus", default="", help="GPU ids for the evaluator workers (default: all visible)")
  ap.add_argument("--update-meta", default="", metavar="RESULTS_JSON",
                  help="no GPU: write ref_time_ms_h200/best_speedup_h200 into meta.json and "
                       "kevin_jax/data/suite_results.json from an earlier run's results.json")
  a = ap.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
  if a.update_meta:
    print(update_meta(a.update_meta))
    return 0
  from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig  # pylint: disable=g-import-not-at-top
  levels = [int(x) for x in a.levels.split(",") if x.strip()] or None
  tasks_ = [t for t in suite.load_suite(levels) if not a.tasks or any(s in t.id for s in a.tasks.split(","))]
  if not tasks_:
    print("no tasks selected", file=sys.stderr)
    return 1
  os.makedirs(a.out, exist_ok=True)
  items = build_items(tasks_, degenerate=not a.no_degenerate, constant=a.constant)
  cfg = EvaluatorConfig(correctness_trials=a.trials, timing_runs=a.timing_runs, warmup_runs=2, gpus=a.gpus)
  t0 = time.monotonic()
  with Evaluator(cfg, task_source="bundled") as ev:
    rows = run(ev, items)
    device = (ev.gpu_info or {}).get("device_name") or "GPU"
    gpu_info = ev.gpu_info
  elapsed = time.monotonic() - t0
  info = per_task(rows)
  run_meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": _git_commit(),
              "device": device, "gpu_info": gpu_info, "elapsed_s": round(elapsed, 1),
              "config": {"trials": a.trials, "timing_runs": a.timing_runs, "constant": a.constant}}
  with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as f:
    json.dump({"run": run_meta, "tasks": info, "results": rows}, f, indent=1)
  table = summary_table(rows, info)
  bad = mismatch_lines(rows)
  with open(os.path.join(a.out, "summary.md"), "w", encoding="utf-8") as f:
    f.write(f"# Suite verification ({device}, {run_meta['date']}, commit {run_meta['commit']}, "
            f"{elapsed:.0f} s)\n\n{table}\n\n## Mismatches\n\n" + ("\n".join(bad) or "none") + "\n")
  with open(os.path.join(a.out, "benchmarks.md"), "w", encoding="utf-8") as f:
    f.write(benchmarks_table(info, device) + "\n")
  n_ok = sum(r["match"] for r in rows)
  print("\n".join(bad))
  print(table)
  print(f"{n_ok}/{len(rows)} candidates as labelled, {len(info)} tasks, {elapsed:.0f} s on {device}; "
        f"results in {a.out}/results.json")
  return 0 if n_ok == len(rows) else 1


if __name__ == "__main__":
  sys.exit(main())
