"""Before/after table and curves of default-job runs recorded in phases (experiments/default_phases.sh).

  python experiments/phase_results.py RUN_DIR [RUN_DIR ...] [--out DIR]

Each RUN_DIR holds the phases' records as experiments/results/*/default_s*_fitted do: `warm/` and `after/` (each
with eval_metrics.jsonl and eval_rollouts_train.jsonl.gz: the starting and the trained policy's evaluations,
same sampling seeds) and `rl/metrics.jsonl` (the RL steps). Prints a Markdown table (training split): kernel
score mean before -> after and its relative change, correct kernels, correct best@4, perf avg@4, the per-task
change of the score (mean over the 30 tasks +- its standard error), tasks up / down by more than 0.01, and the
share of the "ceiling" reached (the mean over tasks of the best kernel score any given run's evaluations saw).
With --out, also writes curves.png: per RL step, the training reward (mean of the last 5 steps) and the correct
rate; and the mean score per turn, before and after. No GPU: reads the records only.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import turn_table  # pylint: disable=wrong-import-position
from kevin_jax.metrics import read_metrics  # pylint: disable=wrong-import-position

PHASES = ("warm", "after")
WINDOW = 5  # RL steps in the curves' running mean (each step draws 2 of the 30 tasks: single steps are noisy).


def per_task_scores(turns: list[dict]) -> dict[str, float]:
  """Task id -> mean kernel score over its turns (every trajectory and turn of the evaluation)."""
  by_task = collections.defaultdict(list)
  for t in turns:
    by_task[t["task_id"]].append(float(t["result"]["score"]))
  return {k: statistics.fmean(v) for k, v in by_task.items()}


def per_turn_scores(turns: list[dict]) -> list[float]:
  """Mean kernel score of turn 1, 2, ... over every task and trajectory."""
  by_turn = collections.defaultdict(list)
  for t in turns:
    by_turn[int(t["turn"])].append(float(t["result"]["score"]))
  return [statistics.fmean(by_turn[k]) for k in sorted(by_turn)]


def summarize(run_dir: str) -> dict:
  """One run's before/after figures on the training split (see the module docstring)."""
  evals, turns = {}, {}
  for phase in PHASES:
    evals[phase] = list(read_metrics(os.path.join(run_dir, phase, "eval_metrics.jsonl")).values())[-1]
    turns[phase] = turn_table.read_turns(os.path.join(run_dir, phase, "eval_rollouts_train.jsonl.gz"))
  before, after = (per_task_scores(turns[p]) for p in PHASES)
  if set(before) != set(after):
    raise ValueError(f"{run_dir}: the two evaluations cover different tasks")
  diffs = [after[t] - before[t] for t in sorted(before)]
  best = collections.defaultdict(float)
  for phase in PHASES:
    for t in turns[phase]:
      best[t["task_id"]] = max(best[t["task_id"]], float(t["result"]["score"]))
  out = {"run": os.path.basename(os.path.normpath(run_dir)), "tasks": len(diffs),
         "ceiling": statistics.fmean(best.values()),
         "task_change": statistics.fmean(diffs), "task_change_se": statistics.stdev(diffs) / math.sqrt(len(diffs)),
         "tasks_up": sum(d > 0.01 for d in diffs), "tasks_down": sum(d < -0.01 for d in diffs),
         "warm_tasks": before, "after_tasks": after}
  for phase in PHASES:
    e = evals[phase]
    out[phase] = {"score": e["train/kernel/score_mean"], "correct": e["train/kernel/correct_rate"],
                  "correct_best": e["train/correct_best"], "perf_avg": e["train/perf_avg"],
                  "turns": per_turn_scores(turns[phase])}
  out["gain"] = out["after"]["score"] / out["warm"]["score"] - 1.0
  steps = list(read_metrics(os.path.join(run_dir, "rl", "metrics.jsonl")).values())
  out["rl_steps"] = len(steps)
  out["curve"] = [(int(m["step"]), float(m["reward/mean"]), float(m["correct/rate"])) for m in steps]
  return out


def table(rows: list[dict]) -> str:
  lines = ["| run | RL steps | kernel score mean (train) | kernels correct | correct best@4 | perf avg@4 | "
           "per-task change (± s.e.) | tasks up / down (> 0.01) | share of the ceiling |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    w, a = r["warm"], r["after"]
    lines.append(
        f"| {r['run']} | {r['rl_steps']} | {w['score']:.3f} → {a['score']:.3f} ({100 * r['gain']:+.1f} %) | "
        f"{100 * w['correct']:.1f} % → {100 * a['correct']:.1f} % | {100 * w['correct_best']:.0f} % → "
        f"{100 * a['correct_best']:.0f} % | {w['perf_avg']:.2f}× → {a['perf_avg']:.2f}× | "
        f"{r['task_change']:+.3f} ± {r['task_change_se']:.3f} | {r['tasks_up']} / {r['tasks_down']} | "
        f"{w['score'] / r['ceiling']:.0%} → {a['score'] / r['ceiling']:.0%} of {r['ceiling']:.3f} |")
  return "\n".join(lines)


def turns_table(rows: list[dict]) -> str:
  """Mean kernel score of each turn, warm start -> after RL, one row per run."""
  n = max(len(r[p]["turns"]) for r in rows for p in PHASES)
  lines = ["| run | " + " | ".join(f"turn {k + 1}" for k in range(n)) + " |", "|---" * (n + 1) + "|"]
  for r in rows:
    cells = [f"{w:.3f} → {a:.3f}" for w, a in zip(r["warm"]["turns"], r["after"]["turns"])]
    lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def paired_with_first(rows: list[dict]) -> list[dict]:
  """Per-task score difference after RL, each later run minus the first, for runs whose warm-start evaluation is
  the first's (the same tasks, kernels and scores): the mean over tasks, its standard error, tasks up / down."""
  first, out = rows[0], []
  for r in rows[1:]:
    if r["warm_tasks"] != first["warm_tasks"]:
      continue
    d = [r["after_tasks"][t] - first["after_tasks"][t] for t in sorted(first["after_tasks"])]
    out.append({"run": r["run"], "versus": first["run"], "mean": statistics.fmean(d),
                "se": statistics.stdev(d) / math.sqrt(len(d)), "up": sum(x > 0.01 for x in d),
                "down": sum(x < -0.01 for x in d)})
  return out


def running_mean(values: list[float], window: int = WINDOW) -> list[float]:
  """Mean of each value and the up to window - 1 before it."""
  return [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def plot(rows: list[dict], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 3, figsize=(16, 4))
  for r in rows:
    steps = [c[0] for c in r["curve"]]
    line, = axes[0].plot(steps, running_mean([c[1] for c in r["curve"]]), label=r["run"])
    axes[1].plot(steps, running_mean([c[2] for c in r["curve"]]), color=line.get_color())
    turns = range(1, len(r["warm"]["turns"]) + 1)
    axes[2].plot(turns, r["warm"]["turns"], linestyle="--", marker="o", color=line.get_color(),
                 label=f"{r['run']}, warm start")
    axes[2].plot(turns, r["after"]["turns"], marker="o", color=line.get_color(), label=f"{r['run']}, after RL")
  axes[0].set(xlabel="RL step", ylabel=f"training reward (kernel score), mean of {WINDOW} steps")
  axes[1].set(xlabel="RL step", ylabel=f"correct kernels (share), mean of {WINDOW} steps")
  axes[2].set(xlabel="turn", ylabel="mean kernel score (training split)", xticks=list(turns))
  axes[0].legend()
  axes[2].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", help="run directories holding warm/, rl/ and after/")
  parser.add_argument("--out", default="", help="directory for curves.png (none if empty)")
  args = parser.parse_args(argv)
  rows = [summarize(r) for r in args.runs]
  print(table(rows))
  print()
  print(turns_table(rows))
  for p in paired_with_first(rows):
    print(f"\n{p['run']} - {p['versus']} after RL, per task (same warm start): {p['mean']:+.3f} ± {p['se']:.3f}, "
          f"{p['up']} tasks up / {p['down']} down (> 0.01)")
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    plot(rows, os.path.join(args.out, "curves.png"))
  return rows


if __name__ == "__main__":
  main()
