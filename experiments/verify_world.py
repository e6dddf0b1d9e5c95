"""The task world's part of experiments/verify_suite.py (`--source generated`): the stratified sample, the eager-time
pass, the tables and the committed records.

Sample: for every (family, split) cell of the world, the first `per_cell` tasks in world order (22: 22 train,
22 heldout_compositions and all 16 heldout_styles tasks of each of the 5 families of the default world, 300
tasks), optionally one shard of it (`shard` = 'i/n': every n-th task from the i-th).
Every sampled task contributes all its labelled candidates and the three degenerate candidates of kernels/suite.py.

Label pass: correctness only (timing_runs = 0: labels need no timing), several worker slots per GPU.
Eager pass: one correct candidate per task (`optimized`) with a short timing (interleaved reference timing, one
worker slot per GPU so timings are clean): the task's PyTorch eager time on this GPU, and that candidate's speedup.
"""

from __future__ import annotations

import collections
import statistics
import time
from typing import Sequence

from kevin_jax.data import export_corpus
from kevin_jax.data.taskgen import world as world_lib
from kevin_jax.kernels import suite, taskinfo, tasks

EAGER_BAND_MS = (0.2, 3.0)  # The band kernel timing is meaningful in (kevin_jax/data/README.md).


def sample(w: world_lib.World, per_cell: int, shard: str = "") -> list[world_lib.GenTask]:
  """The stratified sample (module docstring), in world order."""
  cells: dict[tuple[str, str], list] = collections.defaultdict(list)
  for t in w.tasks:
    if len(cells[t.family, t.split]) < per_cell:
      cells[t.family, t.split].append(t)
  picked = {t.id for v in cells.values() for t in v}
  chosen = [t for t in w.tasks if t.id in picked]
  if shard:
    i, n = (int(x) for x in shard.split("/"))
    if not 0 <= i < n:
      raise ValueError(f"shard {shard!r}: expected i/n with 0 <= i < n")
    chosen = chosen[i::n]
  return chosen


def build_items(chosen: Sequence[world_lib.GenTask], root: str, degenerate: bool = True) -> list[suite.SuiteCandidate]:
  """Every labelled candidate of the chosen tasks, plus their degenerate candidates (shapes on the meta device)."""
  specs = {s.id: s for s in tasks.discover(root)}
  items = []
  for t in chosen:
    items += t.candidates()
    if degenerate:
      items += suite.degenerate_candidates(t.id, taskinfo.analyze_task(specs[t.id]))
  return items


def label_table(rows: list[dict], by: dict[str, tuple[str, str]]) -> str:
  """Labels confirmed per family and split, and per candidate name."""
  cell: dict = collections.defaultdict(lambda: [0, 0])
  name: dict = collections.defaultdict(lambda: [0, 0])
  for r in rows:
    fam, split = by[r["task_id"]]
    for d, k in ((cell, (fam, split)), (name, r["candidate"] if r["kind"] != "degenerate" else "degenerate_*")):
      d[k][0] += r["match"]
      d[k][1] += 1
  splits = world_lib.GENERATED_SPLITS
  lines = ["| family | " + " | ".join(splits) + " |", "|---|" + "---:|" * len(splits)]
  for fam in world_lib.FAMILIES:
    lines.append(f"| {fam} | " + " | ".join(f"{cell[fam, s][0]}/{cell[fam, s][1]}" for s in splits) + " |")
  lines += ["", "| candidate | as labelled |", "|---|---:|"]
  lines += [f"| {k} | {v[0]}/{v[1]} |" for k, v in sorted(name.items())]
  return "\n".join(lines)


def eager_table(eager: dict[str, dict], by: dict[str, tuple[str, str]]) -> str:
  """The families' PyTorch eager-time distribution on this GPU (and the optimized candidate's speedups)."""
  lines = ["| family | tasks | eager ms min | p10 | median | p90 | max | in 0.2-3 ms | optimized speedup median |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for fam in world_lib.FAMILIES:
    ms = sorted(v["ref_time_ms"] for k, v in eager.items() if by[k][0] == fam and v.get("ref_time_ms"))
    sp = [v["speedup"] for k, v in eager.items() if by[k][0] == fam and v.get("speedup")]
    if not ms:
      lines.append(f"| {fam} | 0 | - | - | - | - | - | - | - |")
      continue
    q = lambda p: ms[min(len(ms) - 1, int(p * len(ms)))]
    inside = sum(EAGER_BAND_MS[0] <= m <= EAGER_BAND_MS[1] for m in ms)
    lines.append(f"| {fam} | {len(ms)} | {ms[0]:.3f} | {q(0.1):.3f} | {statistics.median(ms):.3f} | {q(0.9):.3f} | "
                 f"{ms[-1]:.3f} | {inside}/{len(ms)} | {statistics.median(sp) if sp else 0:.2f}x |")
  return "\n".join(lines)


def eager_pass(ev, chosen) -> dict[str, dict]:
  """{task id: result dict} of each task's `optimized` candidate, timed."""
  items = [(t.id, next(c for c in t.candidates() if c.name == "optimized").text) for t in chosen]
  t0 = time.monotonic()
  results = ev.evaluate(items)
  print(f"eager pass: {len(items)} tasks in {time.monotonic() - t0:.0f} s", flush=True)
  return {tid: r.to_dict() for (tid, _), r in zip(items, results)}


def compact(res: dict, old: dict | None = None) -> dict:
  """world_results.json: the run's records by task and candidate (feedback, status, timings, text digest), merged
  into `old` (a run over some tasks replaces those tasks' records and keeps the others')."""
  out = old or {"results": {}}
  source = {k: res["run"].get(k) for k in ("date", "commit", "device", "config")}
  out["source"], out["world"] = source, res["run"].get("world")
  for tid in {row["task_id"] for row in res["results"]}:
    out["results"][tid] = {}
    out.setdefault("task_sources", {})[tid] = source
  for row in res["results"]:
    r = row["result"]
    out["results"][row["task_id"]][row["candidate"]] = {
        "kind": row["kind"], "expect": row["expect"], "status": r["status"], "speedup": r.get("speedup"),
        "ref_time_ms": r.get("ref_time_ms"), "cand_time_ms": r.get("cand_time_ms"), "feedback": r["feedback"],
        "text_sha": row["text_sha"]}
  for tid, r in (res.get("eager") or {}).items():
    rec = out["results"].setdefault(tid, {}).setdefault("optimized", {})
    if r.get("status") == "correct":  # The timed run's feedback carries the speedup the corpus quotes.
      rec.update(status=r["status"], speedup=r.get("speedup"), ref_time_ms=r.get("ref_time_ms"),
                 cand_time_ms=r.get("cand_time_ms"), feedback=r["feedback"])
  return out


WORLD_RESULTS = export_corpus.WORLD_RESULTS
