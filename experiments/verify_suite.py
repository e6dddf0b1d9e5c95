"""Verify labelled candidates on a GPU through the real evaluator: the bundled suite, or a sample of the task world.

  python experiments/verify_suite.py --out runs/verify_suite                 # bundled suite, one H200: ~5 minutes
  python experiments/verify_suite.py --update-meta runs/verify_suite/results.json   # no GPU: write the numbers back
  python experiments/verify_suite.py --source generated --out runs/verify_world      # 300 generated tasks
  python experiments/verify_suite.py --update-world runs/verify_world/results.json   # no GPU: the world's records

Bundled suite: evaluates, per task, the naive and optimized solutions (must be `correct`), the known-wrong variants
(must get exactly their labelled status) and the three degenerate candidates of kernels/suite.py (all-zeros,
constant, identity: must not be `correct`), with timing, and writes to --out (default $OUT):
  results.json   every EvalResult.to_dict() (feedback text included) with its label and match, plus per-task
                 reference time (median over the task's timed results) and best correct speedup
  summary.md     per-task table and the list of mismatches
  benchmarks.md  the BENCHMARKS.md-ready table (task, ops, reference ms on this GPU, best speedup)
It prints the per-task table last and exits 1 if any label is not met.

--update-meta RESULTS.json copies ref_time_ms_h200 / best_speedup_h200 into each task's meta.json, merges the
run's candidates (status, timings, feedback) into kevin_jax/data/suite_results.json (a run over some tasks
replaces only those tasks; the warm-start corpus export reads the file) and prints the BENCHMARKS.md table.

Task world (`--source generated[:SEED]`, or the config's world with --config): a stratified sample
(experiments/verify_world.py: up to --per-cell tasks of every family x split, 300 by default: 22 train, 22
heldout_compositions and the 16 heldout_styles tasks of each family; --shard i/n for one part),
every labelled candidate and the three degenerate candidates of each, in a correctness-only label pass
(--workers-per-gpu slots per GPU, timing off), then an eager pass timing each task's `optimized` candidate once on
one slot per GPU (--no-eager skips it). Writes results.json, summary.md (labels per family and split, per
candidate, mismatches; the families' eager-time distribution) and prints progress and both tables.
--update-world RESULTS.json merges the run's records into kevin_jax/data/world_results.json (the world's corpus
export quotes their feedback).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

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


def run(ev, items: list[suite.SuiteCandidate], chunk: int = 0) -> list[dict]:
  """Evaluates the items and pairs each result with its label. One batch (compilation overlaps GPU work), or
  batches of `chunk` candidates with a progress line and an estimate of the time left after each."""
  from kevin_jax.data import export_corpus  # pylint: disable=g-import-not-at-top
  t0 = time.monotonic()
  logging.info("evaluating %d candidates of %d tasks", len(items), len({c.task_id for c in items}))
  step = chunk or len(items)
  results = []
  for start in range(0, len(items), step):
    part = items[start:start + step]
    results += ev.evaluate([(c.task_id, c.text) for c in part])  # Logs progress every 30 s.
    done, el = start + len(part), time.monotonic() - t0
    if chunk:
      print(f"{done}/{len(items)} candidates in {el:.0f} s, about {el / done * (len(items) - done):.0f} s left",
            flush=True)
  rows = []
  for c, r in zip(items, results):
    rows.append({"task_id": c.task_id, "candidate": c.name, "kind": c.kind, "expect": c.expect, "bug": c.bug,
                 "summary": c.summary, "status": r.status, "match": matches(c, r.status),
                 "text_sha": export_corpus.text_sha(c.text), "result": r.to_dict()})
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


def verify_world(a) -> int:
  """--source generated: the task world's stratified label check and eager pass (module docstring)."""
  import verify_world as vw  # pylint: disable=g-import-not-at-top  # experiments/verify_world.py
  from kevin_jax.data.taskgen import world as world_lib  # pylint: disable=g-import-not-at-top
  from kevin_jax.kernels import check_tasks  # pylint: disable=g-import-not-at-top
  from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig  # pylint: disable=g-import-not-at-top
  wc = check_tasks._world_config(a.source, a.config)  # pylint: disable=protected-access
  w, root = world_lib.build(wc), world_lib.materialize(wc)
  chosen = vw.sample(w, a.per_cell, a.shard)
  if a.tasks:  # Re-verify some sampled tasks only (substrings of their ids).
    chosen = [t for t in chosen if any(s in t.id for s in a.tasks.split(","))]
    if not chosen:
      print(f"no sampled task matches --tasks {a.tasks}", file=sys.stderr)
      return 1
  by = {t.id: (t.family, t.split) for t in chosen}
  items = vw.build_items(chosen, root, degenerate=not a.no_degenerate)
  print(f"task world seed {wc.seed}: {len(chosen)} tasks (at most {a.per_cell} per family x split"
        f"{', shard ' + a.shard if a.shard else ''}), {len(items)} candidates", flush=True)
  os.makedirs(a.out, exist_ok=True)
  t0 = time.monotonic()
  cfg = EvaluatorConfig(correctness_trials=a.trials, timing_runs=0, workers_per_gpu=a.workers_per_gpu, gpus=a.gpus)
  with Evaluator(cfg, task_source=root) as ev:
    rows = run(ev, items, chunk=a.chunk)
    device = (ev.gpu_info or {}).get("device_name") or "GPU"
    gpu_info = ev.gpu_info
  labels_s = time.monotonic() - t0
  eager = {}
  if not a.no_eager:
    ecfg = EvaluatorConfig(correctness_trials=1, timing_runs=a.timing_runs, warmup_runs=2, workers_per_gpu=1,
                           gpus=a.gpus)
    with Evaluator(ecfg, task_source=root) as ev:
      eager = vw.eager_pass(ev, chosen)
  elapsed = time.monotonic() - t0
  run_meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": _git_commit(),
              "device": device, "gpu_info": gpu_info, "elapsed_s": round(elapsed, 1), "labels_s": round(labels_s, 1),
              "world": dataclasses.asdict(wc), "config": {"trials": a.trials, "per_cell": a.per_cell,
                                                         "shard": a.shard, "workers_per_gpu": a.workers_per_gpu,
                                                         "timing_runs": a.timing_runs}}
  with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as f:
    json.dump({"run": run_meta, "results": rows, "eager": eager,
               "tasks": {t.id: {"family": t.family, "split": t.split, "ops": list(t.spec.ops),
                                "model_ms": t.spec.model_ms} for t in chosen}}, f, indent=1)
  labels, times = vw.label_table(rows, by), vw.eager_table(eager, by)
  bad = mismatch_lines(rows)
  n_ok = sum(r["match"] for r in rows)
  head = (f"# Task-world verification ({device}, {run_meta['date']}, commit {run_meta['commit']}, {elapsed:.0f} s: "
          f"labels {labels_s:.0f} s)\n\n{len(chosen)} tasks, {n_ok}/{len(rows)} candidates as labelled.\n\n")
  with open(os.path.join(a.out, "summary.md"), "w", encoding="utf-8") as f:
    f.write(head + "## Labels (as labelled / candidates)\n\n" + labels + "\n\n## PyTorch eager time on this GPU\n\n"
            + times + "\n\n## Mismatches\n\n" + ("\n".join(bad) or "none") + "\n")
  print("\n".join(bad))
  print(labels + "\n\n" + times)
  print(f"{n_ok}/{len(rows)} candidates as labelled, {len(chosen)} tasks, {elapsed:.0f} s on {device}; "
        f"results in {a.out}/results.json")
  return 0 if n_ok == len(rows) else 1


def update_world(results_path: str, world_results_path: str = "") -> str:
  """Merges a task-world run's records into kevin_jax/data/world_results.json; returns a one-line report."""
  import verify_world as vw  # pylint: disable=g-import-not-at-top
  path = world_results_path or vw.WORLD_RESULTS
  with open(results_path, encoding="utf-8") as f:
    res = json.load(f)
  old = None
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
  if old is not None and old.get("world") not in (None, res["run"].get("world")):
    raise SystemExit(f"error: {path} holds records of another world ({old['world']}); move it away first")
  out = vw.compact(res, old)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1, sort_keys=True)
    f.write("\n")
  return f"{len(out['results'])} tasks' records in {path}"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default="", help="output directory (default: $OUT, else runs/verify_suite or "
                                           "runs/verify_world)")
  ap.add_argument("--levels", default="", help="comma-separated levels (default: all)")
  ap.add_argument("--tasks", default="", help="comma-separated substrings of task ids to keep (default: all)")
  ap.add_argument("--trials", type=int, default=5, help="correctness trials per candidate (task, normal, uniform, "
                                                         "heavy, shifted inputs in turn)")
  ap.add_argument("--timing-runs", type=int, default=0,
                  help="timed launches per side (default 20; task world: 10, in its eager pass)")
  ap.add_argument("--no-degenerate", action="store_true", help="skip the three degenerate candidates per task")
  ap.add_argument("--constant", type=float, default=1.0, help="value written by the constant candidate")
  ap.add_argument("--gpus", default="", help="GPU ids for the evaluator workers (default: all visible)")
  ap.add_argument("--update-meta", default="", metavar="RESULTS_JSON",
                  help="no GPU: write ref_time_ms_h200/best_speedup_h200 into meta.json and "
                       "kevin_jax/data/suite_results.json from an earlier run's results.json")
  ap.add_argument("--source", default="bundled", help="'bundled' or 'generated[:SEED]' (the task world)")
  ap.add_argument("--config", default="", help="task world: take its seed and quotas from FILE[:presets]")
  ap.add_argument("--per-cell", type=int, default=22,
                  help="task world: at most this many tasks per family x split (22: 300 tasks of the default world)")
  ap.add_argument("--shard", default="", help="task world: 'i/n' evaluates every n-th sampled task from the i-th")
  ap.add_argument("--workers-per-gpu", type=int, default=4, help="task world: label-pass worker slots per GPU")
  ap.add_argument("--chunk", type=int, default=400, help="task world: candidates per batch between progress lines")
  ap.add_argument("--no-eager", action="store_true", help="task world: skip the eager-time pass")
  ap.add_argument("--update-world", default="", metavar="RESULTS_JSON",
                  help="no GPU: merge a task-world run's records into kevin_jax/data/world_results.json")
  a = ap.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
  if a.update_meta:
    print(update_meta(a.update_meta))
    return 0
  if a.update_world:
    print(update_world(a.update_world))
    return 0
  world = a.source != "bundled"
  a.out = a.out or os.environ.get("OUT") or ("runs/verify_world" if world else "runs/verify_suite")
  a.timing_runs = a.timing_runs or (10 if world else 20)
  if world:
    return verify_world(a)
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
