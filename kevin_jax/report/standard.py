"""The field's standard report of an evaluation (KernelBench's metrics, per level and split).

Input: one record per evaluated kernel, {"task_id", "traj", "turn" (0-based), "result"} (rollout.Turn.record),
where result carries "status", "speedup" (reference PyTorch eager time / kernel time) and, when the evaluator
timed the torch.compile reference (evaluator.compile_baseline), details["speedup_compile"] (a number or 'n/a').
A task's best kernel is its fastest correct kernel over all k trajectories and n turns. Task-level results
(rollout.task_level: the evaluator failed or the task does not fit the GPU) are never the policy's: a task whose every
kernel got one is "not evaluated" and left out of every share (counted per group); in other tasks such a kernel is
counted apart (`task_level_kernels`), not among the task's kernels (in the per-turn tables its cell holds no correct
kernel). Per (level, split), over the evaluated tasks:
  correct      share of tasks with a correct kernel (= fast_0);
  fast_p       share of tasks whose best kernel is correct with speedup > p (KernelBench's strict >), p in FAST_PS,
               against eager and against torch.compile (tasks without a compile timing count as not fast);
  geomean      geometric mean over the tasks with a correct kernel of their best speedup (against compile: over
               those with a compile timing);
  best@k/avg@k per turn t: correctness and performance (fastest correct kernel, 0 if none) using each
               trajectory's first t turns (rl/kernel_metrics.task_summary).
Writes standard_report.md, standard_summary.csv, standard_turns.csv, standard_tasks.csv and standard_report.png.
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
from typing import Iterable, Sequence

import numpy as np

from kevin_jax.rl import kernel_metrics as km
from kevin_jax.rl.rollout import task_level

FAST_PS = (0.0, 0.5, 1.0, 1.5, 2.0)
NA = "n/a"


def _compile_speedup(result: dict) -> float | None:
  v = (result.get("details") or {}).get("speedup_compile")
  return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else None


def task_rows(records: Iterable[dict], levels: dict[str, int], splits: dict[str, str]) -> list[dict]:
  """One row per task (in first-seen order): its kernels, correct kernels, best speedups and first correct turn.

  best_speedup: the fastest correct kernel's speedup against eager (0.0 if none); best_speedup_compile: the
  largest compile speedup among its correct kernels (None if none has one)."""
  by_task: dict[str, list[dict]] = {}
  for r in records:
    by_task.setdefault(r["task_id"], []).append(r)
  rows = []
  for tid, all_recs in by_task.items():
    recs = [r for r in all_recs if not task_level(r["result"])]
    correct = [r for r in recs if r["result"].get("status") == "correct"]
    compiled = [s for r in correct if (s := _compile_speedup(r["result"])) is not None]
    rows.append({
        "task_id": tid, "level": levels.get(tid, 0), "split": splits.get(tid, ""), "kernels": len(recs),
        "task_level_kernels": len(all_recs) - len(recs), "evaluated": bool(recs), "correct_kernels": len(correct),
        "best_speedup": max((float(r["result"].get("speedup") or 0.0) for r in correct), default=0.0),
        "best_speedup_compile": max(compiled) if compiled else None,
        "first_correct_turn": min((int(r["turn"]) + 1 for r in correct), default=None)})
  return rows


def geomean(values: Sequence[float]) -> float | None:
  """Geometric mean of positive values; None for none."""
  v = [x for x in values if x > 0]
  return float(np.exp(np.mean(np.log(v)))) if v else None


def group_summary(rows: Sequence[dict]) -> dict:
  """correct, fast_p (eager and compile), geomean speedups over one group's evaluated task rows (module docstring)."""
  not_evaluated = sum(not r["evaluated"] for r in rows)
  rows = [r for r in rows if r["evaluated"]]
  n = len(rows)
  correct = [r for r in rows if r["correct_kernels"] > 0]
  out = {"tasks": n, "not_evaluated": not_evaluated, "correct": len(correct) / n if n else 0.0}
  for p in FAST_PS:
    out[f"fast_{p:g}"] = sum(r["best_speedup"] > p for r in correct) / n if n else 0.0
    out[f"fast_{p:g}_compile"] = (sum((r["best_speedup_compile"] or 0.0) > p for r in correct) / n if n else 0.0)
  out["geomean_speedup"] = geomean([r["best_speedup"] for r in correct])
  out["geomean_speedup_compile"] = geomean([r["best_speedup_compile"] for r in correct
                                            if r["best_speedup_compile"] is not None])
  out["compile_na"] = sum(r["best_speedup_compile"] is None for r in correct)
  return out


def _matrices(recs: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
  """One task's [K, N] correctness and speedup (0 where not correct); trajectory ids (rollouts number them across
  tasks) become rows in sorted order."""
  rows = {t: i for i, t in enumerate(sorted({int(r["traj"]) for r in recs}))}
  n = 1 + max(int(r["turn"]) for r in recs)
  correct, speedup = np.zeros((len(rows), n), bool), np.zeros((len(rows), n))
  for r in recs:  # A task-level result occupies its cell as not correct (the turn produced no verdict).
    ok = r["result"].get("status") == "correct"
    correct[rows[int(r["traj"])], int(r["turn"])] = ok
    speedup[rows[int(r["traj"])], int(r["turn"])] = float(r["result"].get("speedup") or 0.0) if ok else 0.0
  return correct, speedup


def turn_table(records: Sequence[dict], task_ids: Sequence[str]) -> list[dict]:
  """Per turn t: means over `task_ids` of best@k / avg@k correctness and performance using the first t turns."""
  by_task = {tid: [r for r in records if r["task_id"] == tid] for tid in task_ids}
  mats = {tid: _matrices(recs) for tid, recs in by_task.items() if recs}
  if not mats:
    return []
  n = max(c.shape[1] for c, _ in mats.values())
  return [{"turn": t, **km.suite_summary(km.task_summary(c, s, turns=t, fast_ps=()) for c, s in mats.values())}
          for t in range(1, n + 1)]


def build(records: Sequence[dict], levels: dict[str, int], splits: dict[str, str]) -> dict:
  """The report's content: per-task rows and, per (level, split) group plus 'all', the summary and turn table."""
  records = list(records)
  rows = task_rows(records, levels, splits)
  keys = sorted({(r["level"], r["split"]) for r in rows})
  groups = []
  for level, split in keys + [("all", "all")]:
    mine = [r for r in rows if (level, split) == ("all", "all") or (r["level"], r["split"]) == (level, split)]
    ids = [r["task_id"] for r in mine if r["evaluated"]]
    groups.append({"level": level, "split": split, **group_summary(mine),
                   "turns": turn_table([x for x in records if x["task_id"] in set(ids)], ids)})
  per_task: dict[str, set] = {}
  for r in records:
    per_task.setdefault(r["task_id"], set()).add(int(r["traj"]))
  return {"tasks": rows, "groups": groups, "trajectories": max(map(len, per_task.values()), default=0)}


def _pct(v) -> str:
  return NA if v is None else f"{100 * v:.1f}%"


def _x(v) -> str:
  return NA if v is None else f"{v:.2f}x"


def write(report: dict, out_dir: str, *, title: str, source_commit: str, device: str) -> list[str]:
  """Writes the markdown, the CSVs and the plot into out_dir; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  k = report["trajectories"]
  fast = [f"fast_{p:g}" for p in FAST_PS]
  lines = [f"# {title}", "", f"Task source commit: {source_commit}. GPU: {device}. "
           f"{k} trajectories per task; a task's best kernel is its fastest correct one over all trajectories and "
           "turns; fast_p = share of tasks whose best kernel is correct with speedup > p.", "",
           "| level | split | tasks | not evaluated | correct | " + " | ".join(fast) + " | geomean vs eager | "
           + " | ".join(f + " (compile)" for f in fast) + " | geomean vs compile | compile n/a |",
           "|" + "---|" * (7 + 2 * len(fast) + 1)]
  for g in report["groups"]:
    lines.append(f"| {g['level']} | {g['split']} | {g['tasks']} | {g['not_evaluated']} | {_pct(g['correct'])} | "
                 + " | ".join(_pct(g[f]) for f in fast) + f" | {_x(g['geomean_speedup'])} | "
                 + " | ".join(_pct(g[f + '_compile']) for f in fast)
                 + f" | {_x(g['geomean_speedup_compile'])} | {g['compile_na']} |")
  lines += ["", f"best@{k} / avg@{k} per turn (using each trajectory's first t turns; performance = fastest correct "
            "kernel, 0 if none):", "",
            f"| level | split | turn | correct best@{k} | correct avg@{k} | perf best@{k} | perf avg@{k} |",
            "|---|---|---|---|---|---|---|"]
  for g in report["groups"]:
    lines += [f"| {g['level']} | {g['split']} | {t['turn']} | {_pct(t['correct_best'])} | {_pct(t['correct_avg'])} "
              f"| {_x(t['perf_best'])} | {_x(t['perf_avg'])} |" for t in g["turns"]]
  lines += ["", "Per task:", "", "| task | level | split | kernels | correct | best speedup vs eager | "
            "best vs compile | first correct turn |", "|---|---|---|---|---|---|---|---|"]
  for r in report["tasks"]:
    lines.append(f"| {r['task_id']} | {r['level']} | {r['split']} | {r['kernels']} | {r['correct_kernels']} | "
                 f"{_x(r['best_speedup'] if r['correct_kernels'] else None)} | {_x(r['best_speedup_compile'])} | "
                 f"{r['first_correct_turn'] or '-'} |")
  paths = {n: os.path.join(out_dir, n) for n in ("standard_report.md", "standard_summary.csv",
                                                  "standard_turns.csv", "standard_tasks.csv", "standard_report.png")}
  with open(paths["standard_report.md"], "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  cols = ["tasks", "not_evaluated", "correct"] + fast + ["geomean_speedup"] + [f + "_compile" for f in fast] + [
      "geomean_speedup_compile", "compile_na"]
  _csv(paths["standard_summary.csv"], ["level", "split"] + cols,
       ([g["level"], g["split"]] + [NA if g[c] is None else g[c] for c in cols] for g in report["groups"]))
  tcols = ["correct_best", "correct_avg", "perf_best", "perf_avg"]
  _csv(paths["standard_turns.csv"], ["level", "split", "turn"] + tcols,
       ([g["level"], g["split"], t["turn"]] + [t[c] for c in tcols] for g in report["groups"] for t in g["turns"]))
  rcols = ["task_id", "level", "split", "kernels", "task_level_kernels", "correct_kernels", "best_speedup",
           "best_speedup_compile", "first_correct_turn"]
  _csv(paths["standard_tasks.csv"], rcols, ([NA if r[c] is None else r[c] for c in rcols] for r in report["tasks"]))
  _plot(report, paths["standard_report.png"])
  return list(paths.values())


def _csv(path: str, header: list[str], rows) -> None:
  with open(path, "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(rows)


def _plot(report: dict, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  k = report["trajectories"]
  for g in report["groups"]:
    label = f"level {g['level']} {g['split']}" if g["level"] != "all" else "all"
    axes[0].plot(FAST_PS, [g[f"fast_{p:g}"] for p in FAST_PS], "o-", label=label)
    axes[1].plot([t["turn"] for t in g["turns"]], [t["perf_best"] for t in g["turns"]], "o-", label=label)
  axes[0].set_xlabel("speedup threshold p (vs PyTorch eager)")
  axes[0].set_ylabel("fast_p")
  axes[0].legend(fontsize=7)
  axes[1].set_xlabel("turns")
  axes[1].set_ylabel(f"perf best@{k}")
  axes[1].xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  for ax in axes:  # Shares and speedups: never below zero (an all-zero report would centre its axis on 0).
    ax.set_ylim(bottom=0)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def source_commit(source: str, configured: str = "") -> str:
  """`configured` if given; else, where git runs, the commit checked out in the repository that tracks `source`
  ('unknown' for a copy that no repository tracks, e.g. an ignored folder inside another checkout); else (no git
  repository by git's account, or no git) the commit in a .git directory of the folder or its two parents (HEAD,
  loose or packed refs); else 'unknown'."""
  if configured:
    return configured
  here = os.path.abspath(os.path.expanduser(source)) if source else ""
  if not here:
    return "unknown"
  folder = here if os.path.isdir(here) else os.path.dirname(here)
  try:
    tracked = subprocess.run(["git", "-C", folder, "ls-files", "--", here], capture_output=True, text=True,
                             timeout=30, check=False)
    if tracked.returncode == 0:
      if not tracked.stdout.strip():
        return "unknown"
      head = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30,
                            check=False)
      return head.stdout.strip() if head.returncode == 0 and head.stdout.strip() else "unknown"
  except (OSError, subprocess.TimeoutExpired):
    pass
  return _commit_from_git_dir(here)


def _commit_from_git_dir(here: str) -> str:
  for d in (here, os.path.dirname(here), os.path.dirname(os.path.dirname(here))):
    git = os.path.join(d, ".git")
    head = os.path.join(git, "HEAD")
    if not os.path.isfile(head):
      continue
    with open(head, encoding="utf-8") as f:
      ref = f.read().strip()
    if not ref.startswith("ref: "):
      return ref
    ref = ref[5:]
    if os.path.isfile(os.path.join(git, ref)):
      with open(os.path.join(git, ref), encoding="utf-8") as f:
        return f.read().strip()
    packed = os.path.join(git, "packed-refs")
    if os.path.isfile(packed):
      with open(packed, encoding="utf-8") as f:
        for line in f:
          parts = line.split()
          if len(parts) == 2 and parts[1] == ref:
            return parts[0]
  return "unknown"
