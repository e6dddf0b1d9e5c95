"""The paper's ablation sweeps [P §2 "Aggregation across turns", §4]: print, run, or collect them.

  python experiments/sweep.py aggregation                  # print the 4 commands (gamma {0.4, 0.8} x {sum, max})
  python experiments/sweep.py aggregation --run            # run them one after another
  python experiments/sweep.py aggregation --collect        # table (Markdown + CSV) and learning-curve plot
  python experiments/sweep.py single_vs_multi --run -- --config.total_steps=10   # extra overrides for every run

Sweeps:
  aggregation      rl.gamma in {0.4, 0.8} x rl.return_mode in {sum, max}      (paper: sum with 0.4 scaled best)
  turns            rollout.turns in {1, 2, 4} at a fixed kernel budget (trajectories 64 / 32 / 16)
  single_vs_multi  configs/multiturn.py (16 x 4) vs configs/singleturn.py:same_budget (64 x 1)
Each run writes to <root>/<sweep>/<name>; rerunning a command resumes it. `--collect` reads every run's
metrics.jsonl and reports the mean of the last `--last` steps of reward/mean, correct/rate and
speedup/mean_correct, plus reward/mean per step in <root>/<sweep>/curves.png.
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kevin_jax.metrics import read_metrics  # pylint: disable=wrong-import-position  (keeps a resumed step's last record)

SWEEPS: dict[str, list[tuple[str, str, list[str]]]] = {  # name -> [(run name, config, overrides)]
    "aggregation": [(f"{mode}_g{gamma}", "configs/multiturn.py",
                     [f"--config.rl.gamma={gamma}", f"--config.rl.return_mode={mode}"])
                    for mode in ("sum", "max") for gamma in (0.4, 0.8)],
    "turns": [(f"turns{n}", "configs/multiturn.py",
               [f"--config.rollout.turns={n}", f"--config.rollout.trajectories={64 // n}"]) for n in (1, 2, 4)],
    "single_vs_multi": [("multi_16x4", "configs/multiturn.py", []),
                        ("single_64x1", "configs/singleturn.py:same_budget", [])],
}
METRICS = ("reward/mean", "correct/rate", "speedup/mean_correct")


def commands(sweep: str, root: str, extra: list[str]) -> list[tuple[str, list[str]]]:
  """(run name, argv) per configuration of the sweep."""
  if sweep not in SWEEPS:
    raise SystemExit(f"unknown sweep {sweep!r}; known: {', '.join(SWEEPS)}")
  out = []
  for name, config, overrides in SWEEPS[sweep]:
    workdir = os.path.join(root, sweep, name)
    out.append((name, [sys.executable, "-m", "kevin_jax.main", f"--config={config}", f"--workdir={workdir}",
                       *overrides, *extra]))
  return out


def collect(sweep: str, root: str, last: int) -> list[dict]:
  """One row per run: steps done and the mean of METRICS over the last `last` steps; writes table + plot."""
  rows, curves = [], {}
  for name, _, _ in SWEEPS[sweep]:
    path = os.path.join(root, sweep, name, "metrics.jsonl")
    if not os.path.isfile(path):
      rows.append({"run": name, "steps": 0})
      continue
    recs = read_metrics(path)
    tail = list(recs.values())[-last:]
    row = {"run": name, "steps": max(recs)}
    for m in METRICS:
      vals = [float(r[m]) for r in tail if isinstance(r.get(m), (int, float))]
      row[m] = sum(vals) / len(vals) if vals else float("nan")
    rows.append(row)
    curves[name] = [(s, float(r["reward/mean"])) for s, r in recs.items() if "reward/mean" in r]
  out_dir = os.path.join(root, sweep)
  os.makedirs(out_dir, exist_ok=True)
  header = ["run", "steps", *METRICS]
  with open(os.path.join(out_dir, "summary.csv"), "w", newline="", encoding="utf-8") as f:
    w = csv.DictWriter(f, fieldnames=header, restval="")
    w.writeheader()
    w.writerows(rows)
  lines = [f"# Sweep `{sweep}` (mean of the last {last} steps)", "", "| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(_cell(r.get(h, "")) for h in header) + " |" for r in rows]
  with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  if curves:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in curves.items():
      ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward/mean (kernel score per turn-sample)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "curves.png"), dpi=100)
    plt.close(fig)
  print("\n".join(lines))
  return rows


def _cell(v) -> str:
  return f"{v:.4g}" if isinstance(v, float) else str(v)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("sweep", choices=sorted(SWEEPS))
  p.add_argument("--root", default="runs/sweeps", help="parent of the sweep's run directories")
  p.add_argument("--run", action="store_true", help="run every configuration (sequentially)")
  p.add_argument("--collect", action="store_true", help="summarise finished runs into a table and a plot")
  p.add_argument("--last", type=int, default=5, help="steps averaged per run in the table")
  p.add_argument("extra", nargs="*", help="overrides for every run, after --")
  args = p.parse_args(argv)
  if args.collect:
    collect(args.sweep, args.root, args.last)
    return 0
  failed = []
  for name, cmd in commands(args.sweep, args.root, args.extra):
    print(f"# {name}\n{shlex.join(cmd)}", flush=True)
    if args.run and subprocess.run(cmd, cwd=ROOT).returncode != 0:
      failed.append(name)
  if failed:
    print(f"failed runs: {', '.join(failed)}", file=sys.stderr)
    return 1
  if args.run:
    collect(args.sweep, args.root, args.last)
  return 0


if __name__ == "__main__":
  sys.exit(main())
