"""Tables and plots of the task-world experiments (experiments/sweep.py world, world_*, table2 --collect).

  main_result   per split, before -> after RL of each seed's job and the seeds' mean: mean kernel score (with the
                paired per-task change +- its standard error), kernels correct, fast_1 best@k, correct best@k, perf
                best@k / avg@k, novelty share of correct kernels; spread of the seeds' mean = s.e. over seeds.
  table2        per held-out split, a trained policy at a fixed kernel budget as trajectories x turns (16 x 8,
                32 x 4, 128 x 1) [P Table 2], and best so far per turn [P Fig. 5].
Each writes Markdown (ready for a README "Results" section), CSV and a PNG into the sweep's folder.

A run's before/after evaluations come from one RL job (run/eval_metrics.jsonl, step 0 and the last step;
run/eval_rollouts/step_NNNNNN_<split>.jsonl) or from a job split into phases: run/before (a total_steps=0 job: its
step-0 records) and either run/after (the same for the trained export) or the RL phase's own closing evaluation
(run/rl/eval_metrics.jsonl, its last step; an RL phase run with evaluation.in_training_first=False). No GPU, no
policy: reads the recorded metrics and results only.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kevin_jax.metrics import read_metrics  # pylint: disable=wrong-import-position
from kevin_jax.rl.rollout import task_level  # pylint: disable=wrong-import-position

# (eval_metrics key, label, kind) of the main table; kind picks the cell format.
MAIN_METRICS = (("kernel/score_mean", "kernel score mean", "score"), ("kernel/correct_rate", "kernels correct", "pct"),
                ("fast_1_best", "fast_1 best@k", "pct"), ("correct_best", "correct best@k", "pct"),
                ("perf_best", "perf best@k", "x"), ("perf_avg", "perf avg@k", "x"),
                ("novelty/novel_share", "novel share of correct", "pct"))
TABLE2_COLS = ("correct_best", "perf_best", "fast_1_best", "correct_avg", "perf_avg")


def _rollouts(path: str) -> list[dict]:
  for p in (path, path + ".gz"):
    if os.path.isfile(p):
      opener = gzip.open if p.endswith(".gz") else open
      with opener(p, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
  return []


def evaluations(run_dir: str) -> dict[str, dict] | None:
  """{split: {"step", "before", "after", "rows_before", "rows_after"}} of a run (module docstring: one job or
  before/after phases); metrics are '<key>' scalars of eval_metrics.jsonl, rows the evaluation's turns. None if the
  run has no finished before/after pair."""
  one = os.path.join(run_dir, "eval_metrics.jsonl")
  if os.path.isfile(one):
    recs = read_metrics(one)
    last = max(recs)
    if 0 not in recs or last == 0:
      return None
    pairs = [(recs[0], os.path.join(run_dir, "eval_rollouts", "step_000000")),
             (recs[last], os.path.join(run_dir, "eval_rollouts", f"step_{last:06d}"))]
  else:
    before = os.path.join(run_dir, "before", "eval_metrics.jsonl")
    after = os.path.join(run_dir, "after", "eval_metrics.jsonl")
    rl_evals = os.path.join(run_dir, "rl", "eval_metrics.jsonl")
    if not os.path.isfile(before):
      return None
    b = read_metrics(before)
    if 0 not in b:
      return None
    rl = os.path.join(run_dir, "rl", "metrics.jsonl")
    last = max(read_metrics(rl)) if os.path.isfile(rl) else -1
    if os.path.isfile(after):  # A total_steps=0 job of the trained export.
      a_dir, a = "after", read_metrics(after)
      a_step = 0
    elif os.path.isfile(rl_evals):  # The RL phase's own closing evaluation (evaluation.in_training_first=False).
      a_dir, a = "rl", read_metrics(rl_evals)
      a_step = max(a, default=0)
    else:
      return None
    if a_step not in a or (a_dir == "rl" and a_step == 0):  # No trained policy's evaluation yet.
      return None
    pairs = [(b[0], os.path.join(run_dir, "before", "eval_rollouts", "step_000000")),
             (a[a_step], os.path.join(run_dir, a_dir, "eval_rollouts", f"step_{a_step:06d}"))]
  splits = sorted({k.split("/", 1)[0] for k in pairs[0][0] if "/" in k})
  out = {}
  for split in splits:
    pick = lambda rec, split=split: {k.split("/", 1)[1]: v for k, v in rec.items() if k.startswith(split + "/")}
    out[split] = {"step": last, "before": pick(pairs[0][0]), "after": pick(pairs[1][0]),
                  "rows_before": _rollouts(f"{pairs[0][1]}_{split}.jsonl"),
                  "rows_after": _rollouts(f"{pairs[1][1]}_{split}.jsonl")}
  return out


def per_task(rows: list[dict]) -> dict[str, dict[str, float]]:
  """{task: {"score": mean kernel score, "correct": share of correct kernels}} over the turns that got a verdict
  (task-level results left out, as in kevin_jax/evaluate.summarize)."""
  by_task: dict[str, list[dict]] = {}
  for r in rows:
    if not task_level(r["result"]):
      by_task.setdefault(r["task_id"], []).append(r["result"])
  return {t: {"score": statistics.fmean(float(x.get("score") or 0.0) for x in rs),
              "correct": statistics.fmean(float(x.get("status") == "correct") for x in rs)}
          for t, rs in by_task.items()}


def paired_change(before: list[dict], after: list[dict], key: str) -> tuple[float, float, int]:
  """(mean, standard error, tasks) of the per-task change of `key` (per_task) over the tasks both evaluated;
  s.e. is nan with fewer than 2 tasks, (nan, nan, 0) without rows."""
  b, a = per_task(before), per_task(after)
  diffs = [a[t][key] - b[t][key] for t in sorted(set(a) & set(b))]
  if not diffs:
    return float("nan"), float("nan"), 0
  se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
  return statistics.fmean(diffs), se, len(diffs)


def _mean_se(values: list[float]) -> tuple[float, float]:
  vals = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
  if not vals:
    return float("nan"), float("nan")
  se = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else float("nan")
  return statistics.fmean(vals), se


def _fmt(kind: str, v, se=None) -> str:
  if not isinstance(v, (int, float)) or math.isnan(v):
    return "?"
  scale, unit, digits = {"score": (1, "", 3), "pct": (100, "%", 1), "x": (1, "x", 2)}[kind]
  s = f"{scale * v:.{digits}f}{unit}"
  if se is not None and not math.isnan(se):
    s = f"{scale * v:.{digits}f} ± {scale * se:.{digits}f}{unit}"
  return s


def main_result(runs: dict[str, str], out_dir: str, title: str = "Main result", mean_row: bool = True) -> list[dict]:
  """Per split and run (and, with `mean_row`, the runs' mean: runs that differ by seed only): before, after and
  change of MAIN_METRICS; writes main_result.md, main_result.csv and main_result.png in out_dir. Returns the CSV
  rows."""
  evals = {name: e for name, d in runs.items() if (e := evaluations(d))}
  rows: list[dict] = []
  splits = list(dict.fromkeys(s for e in evals.values() for s in e))
  for split in splits:
    mine = {n: e[split] for n, e in evals.items() if split in e}
    for name, e in mine.items():
      row = {"split": split, "run": name, "runs": 1, "step": e["step"], "tasks": e["before"].get("tasks", "")}
      for key, _, _ in MAIN_METRICS:
        row[f"{key}/before"], row[f"{key}/after"] = e["before"].get(key, float("nan")), e["after"].get(key,
                                                                                                  float("nan"))
      for key in ("score", "correct"):
        row[f"task_{key}_change"], row[f"task_{key}_change_se"], _ = paired_change(e["rows_before"], e["rows_after"],
                                                                                 key)
      rows.append(row)
    if mean_row and len(mine) > 1:
      group = [r for r in rows if r["split"] == split]
      mean = {"split": split, "run": "mean", "runs": len(group), "step": "", "tasks": group[0]["tasks"]}
      for col in [c for c in group[0] if ("/" in c or c.startswith("task_")) and not c.endswith("_se")]:
        mean[col], mean[col + "_se"] = _mean_se([r[col] for r in group])
      rows.append(mean)
  os.makedirs(out_dir, exist_ok=True)
  header = list(dict.fromkeys(k for r in rows for k in r))
  with open(os.path.join(out_dir, "main_result.csv"), "w", newline="", encoding="utf-8") as f:
    w = csv.DictWriter(f, fieldnames=header, restval="")
    w.writeheader()
    w.writerows(rows)
  lines = [f"## {title}", "",
           "Before -> after RL, the same sampling seeds both times; k trajectories x n turns per task. Change: the "
           "paired per-task change of the mean kernel score ± its standard error over tasks; a `mean` row is the "
           "runs' mean ± the standard error over runs.", ""]
  for split in splits:
    lines += [f"### {split}", "", "| run | tasks | steps | " + " | ".join(label for _, label, _ in MAIN_METRICS)
              + " | per-task score change |", "|" + "---|" * (4 + len(MAIN_METRICS))]
    for r in (r for r in rows if r["split"] == split):
      cells = [f"{_fmt(kind, r[f'{key}/before'], r.get(f'{key}/before_se'))} -> "
               f"{_fmt(kind, r[f'{key}/after'], r.get(f'{key}/after_se'))}" for key, _, kind in MAIN_METRICS]
      change = _fmt("score", r["task_score_change"], r["task_score_change_se"])
      lines.append(f"| {r['run']} | {r['tasks']} | {r['step']} | " + " | ".join(cells) + f" | {change} |")
    lines.append("")
  with open(os.path.join(out_dir, "main_result.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines).rstrip() + "\n")
  if rows:
    _plot_main(rows, splits, os.path.join(out_dir, "main_result.png"))
  print("\n".join(lines))
  return rows


def _plot_main(rows: list[dict], splits: list[str], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  panels = (("kernel/score_mean", "mean kernel score"), ("kernel/correct_rate", "share of kernels correct"),
            ("novelty/novel_share", "novel share of correct kernels"))
  means = any(r["run"] == "mean" for r in rows)
  runs = ["mean"] if means else list(dict.fromkeys(r["run"] for r in rows))  # Bars: each run before and after.
  bars = [(run, when) for run in runs for when in ("before", "after")]
  width = 0.8 / len(bars)
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4))
  for ax, (key, label) in zip(axes, panels):
    for j, (run, when) in enumerate(bars):
      vals, errs = [], []
      for split in splits:
        r = next((x for x in rows if x["split"] == split and x["run"] == run), None)
        vals.append(r[f"{key}/{when}"] if r else float("nan"))
        errs.append(r.get(f"{key}/{when}_se", float("nan")) if r else float("nan"))
      xs = [i + width * j for i in range(len(splits))]
      ax.bar(xs, vals, width=width, label=f"{when} RL" if means else f"{run}, {when}")
      spread = [(x, v, e) for x, v, e in zip(xs, vals, errs) if not math.isnan(e)]  # One run: no bars of spread.
      if spread:
        ax.errorbar(*zip(*spread), fmt="none", ecolor="black", capsize=3)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(splits))], splits, rotation=20, fontsize=8)
    ax.set_ylabel(label)
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def table2(runs: dict[str, str], out_dir: str) -> list[dict]:
  """Per run (one held-out split's evaluation, run/eval/report.json) and fixed-budget shape: the last turn's
  TABLE2_COLS and best so far per turn; writes table2.md, table2.csv (rows `final` and `turn`) and table2.png."""
  reports = {}
  for name, d in runs.items():
    path = os.path.join(d, "eval", "report.json")
    if os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        reports[name] = json.load(f)
  rows = []
  for name, rep in reports.items():
    for b in rep["budgets"]:
      shape = f"{b['trajectories']}x{b['turns']}"
      rows.append({"run": name, "tasks": rep["tasks"], "shape": shape, "kernels": b["kernels"], "row": "final",
                   "turn": b["turns"], **{c: b[c] for c in TABLE2_COLS}})
      rows += [{"run": name, "tasks": rep["tasks"], "shape": shape, "kernels": b["kernels"], "row": "turn",
                "turn": t["turn"], **{c: t[c] for c in TABLE2_COLS}} for t in b.get("per_turn", [])]
  os.makedirs(out_dir, exist_ok=True)
  header = ["run", "tasks", "shape", "kernels", "row", "turn", *TABLE2_COLS]
  with open(os.path.join(out_dir, "table2.csv"), "w", newline="", encoding="utf-8") as f:
    w = csv.DictWriter(f, fieldnames=header)
    w.writeheader()
    w.writerows(rows)
  lines = ["## Fixed kernel budget: trajectories x turns [P Table 2]", "",
           "The trained policy on each held-out split; best@k and avg@k over each task's k trajectories (a "
           "trajectory's performance = its fastest correct kernel, 0 if none), means over tasks.", "",
           "| split | tasks | trajectories x turns | kernels | correct best@k | perf best@k | fast_1 best@k | "
           "correct avg@k | perf avg@k |", "|---|---|---|---|---|---|---|---|---|"]
  for r in (r for r in rows if r["row"] == "final"):
    lines.append(f"| {r['run']} | {r['tasks']} | {r['shape']} | {r['kernels']} | {_fmt('pct', r['correct_best'])} | "
                 f"{_fmt('x', r['perf_best'])} | {_fmt('pct', r['fast_1_best'])} | {_fmt('pct', r['correct_avg'])} | "
                 f"{_fmt('x', r['perf_avg'])} |")
  turns = sorted({r["turn"] for r in rows if r["row"] == "turn"})
  if turns:
    lines += ["", "Best so far (perf best@k after each turn):", "",
              "| split | shape | " + " | ".join(f"turn {t}" for t in turns) + " |", "|" + "---|" * (2 + len(turns))]
  for name in reports:
    for shape in dict.fromkeys(r["shape"] for r in rows if r["run"] == name):
      by_turn = {r["turn"]: r["perf_best"] for r in rows if r["run"] == name and r["shape"] == shape
                 and r["row"] == "turn"}
      lines.append(f"| {name} | {shape} | " + " | ".join(_fmt("x", by_turn[t]) if t in by_turn else ""
                                                         for t in turns) + " |")
  with open(os.path.join(out_dir, "table2.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  if rows:
    _plot_table2(rows, list(reports), os.path.join(out_dir, "table2.png"))
  print("\n".join(lines))
  return rows


def _plot_table2(rows: list[dict], names: list[str], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4), squeeze=False)
  for ax, name in zip(axes[0], names):
    for shape in dict.fromkeys(r["shape"] for r in rows if r["run"] == name):
      pts = [(r["turn"], r["perf_best"]) for r in rows if r["run"] == name and r["shape"] == shape
             and r["row"] == "turn"]
      ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", markersize=4, label=shape)
    ax.set_title(name)
    ax.set_xlabel("turn")
    ax.set_ylabel("perf best@k so far (mean speedup, failures 0)")
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
