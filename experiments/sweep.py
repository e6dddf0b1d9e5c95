"""The paper's ablation sweeps [P §2 "Aggregation across turns", §4] and the default job's runs: print, run, or
collect them.

  python experiments/sweep.py aggregation                  # print the 4 commands (gamma {0.4, 0.8} x {sum, max})
  python experiments/sweep.py aggregation --run            # run them one after another
  python experiments/sweep.py aggregation --collect        # table (Markdown + CSV) and learning-curve plot
  python experiments/sweep.py single_vs_multi --run -- --config.total_steps=10   # extra overrides for every run

Sweeps:
  aggregation      rl.gamma in {0.4, 0.8} x rl.return_mode in {sum, max}      (paper: sum with 0.4 scaled best)
  turns            rollout.turns in {1, 2, 4} at a fixed kernel budget (trajectories 64 / 32 / 16)
  single_vs_multi  configs/multiturn.py (16 x 4) vs configs/singleturn.py:same_budget (64 x 1)
  estimator        the paper's per-task group normalisation vs turn-level leave-one-out (rl.adv_baseline=trloo,
                   unscaled, Dr. Kernel arXiv 2602.05885)
  default          the default job on seeds 0 and 1, and the single-turn baseline at the same kernel budget on
                   seed 0 (experiments/default_job), each with its in-job evaluations before and after RL
The task world (configs/multiturn.py:world; experiments/world_job):
  world            the world job on seeds 0 and 1 (warm start, RL within time_budget_s, evaluations before and after
                   on train, heldout_compositions, heldout_styles, suite): the main result
  world_mode       multi-turn 16 x 4 vs single-turn 64 x 1 at the same kernel budget
  world_gamma      rl.gamma in {0.4, 0.8} x rl.return_mode in {sum, max}
  world_estimator  the paper's group normalisation vs turn-level leave-one-out (trloo, unscaled)
  table2           a trained policy (--checkpoint, required) on heldout_compositions and heldout_styles at a fixed
                   kernel budget as 16 x 8, 32 x 4 and 128 x 1 trajectories x turns [P Table 2], best so far per
                   turn [P Fig. 5] (configs/eval.py:world, 10 tasks per split)
The world_* ablations run WORLD_ABLATION steps each, no time budget, so their arms compare at equal steps;
`--init-from DIR` (e.g. <root>/world/s0/sft/hf) starts every run from one warm start instead of its own.
Each run writes to <root>/<sweep>/<name>; rerunning a command resumes it; `--only a,b` picks runs. `--collect`
reads every run's metrics.jsonl and reports the mean of the last `--last` steps of reward/mean, correct/rate and
speedup/mean_correct, plus reward/mean, correct/rate and learner/entropy per step in <root>/<sweep>/curves.png;
where a run has eval_metrics.jsonl (the RL job's own evaluations), a before/after table per split (step 0 vs the
last step). The world sweeps also write main_result.{md,csv,png} (experiments/world_tables.py: per split, before
and after, with per-task standard errors; `world`: the seeds' mean +- s.e. over seeds); table2 writes
table2.{md,csv,png} from each run's eval/report.json.
`--compact` deletes the runs' checkpoints and exported weights (keeps metrics, rollouts, configs).
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

# read_metrics keeps a resumed step's last record.
from kevin_jax.metrics import read_metrics  # pylint: disable=wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import world_tables  # pylint: disable=wrong-import-position

WORLD = "configs/multiturn.py:world"
WORLD_ABLATION = ["--config.total_steps=16", "--config.time_budget_s=0"]  # Equal RL steps in every arm.
# evaluation.budgets keeps its default, ((16, 8), (32, 4), (128, 1)) [P Table 2]: a tuple given twice on the command
# line is concatenated, so pinning it here would add to an override after `--` instead of yielding to it.
TABLE2 = ["--config.evaluation.trajectories=16", "--config.evaluation.turns=8",  # The main 16 x 8 run is a budget.
          "--config.evaluation.max_tasks=10"]  # 2 per family (a world split interleaves its families).

SWEEPS: dict[str, list[tuple[str, str, list[str]]]] = {  # name -> [(run name, config, overrides)]
    "aggregation": [(f"{mode}_g{gamma}", "configs/multiturn.py",
                     [f"--config.rl.gamma={gamma}", f"--config.rl.return_mode={mode}"])
                    for mode in ("sum", "max") for gamma in (0.4, 0.8)],
    "turns": [(f"turns{n}", "configs/multiturn.py",
               [f"--config.rollout.turns={n}", f"--config.rollout.trajectories={64 // n}"]) for n in (1, 2, 4)],
    "single_vs_multi": [("multi_16x4", "configs/multiturn.py", []),
                        ("single_64x1", "configs/singleturn.py:same_budget", [])],
    "estimator": [("grpo", "configs/multiturn.py", []),
                  ("trloo", "configs/multiturn.py", ["--config.rl.adv_baseline=trloo",
                                                     "--config.rl.adv_std_normalize=False"])],
    "default": [("multi_s0", "configs/multiturn.py", ["--config.seed=0"]),
                ("multi_s1", "configs/multiturn.py", ["--config.seed=1"]),
                ("single_s0", "configs/singleturn.py:same_budget", ["--config.seed=0"])],
    "world": [(f"s{seed}", WORLD, [f"--config.seed={seed}"]) for seed in (0, 1)],
    "world_mode": [("multi_16x4", WORLD, WORLD_ABLATION),
                   ("single_64x1", "configs/singleturn.py:world,same_budget", WORLD_ABLATION)],
    "world_gamma": [(f"{mode}_g{gamma}", WORLD, [f"--config.rl.gamma={gamma}", f"--config.rl.return_mode={mode}",
                                                 *WORLD_ABLATION]) for mode in ("sum", "max") for gamma in (0.4, 0.8)],
    "world_estimator": [("grpo", WORLD, WORLD_ABLATION),
                        ("trloo", WORLD, ["--config.rl.adv_baseline=trloo", "--config.rl.adv_std_normalize=False",
                                          *WORLD_ABLATION])],
    "table2": [(split, "configs/eval.py:world", [f"--config.evaluation.split={split}", *TABLE2])
               for split in ("heldout_compositions", "heldout_styles")],
}
NEEDS_CHECKPOINT = ("table2",)  # Sweeps of evaluations: --checkpoint names the policy.
SEED_SWEEPS = ("world",)  # Sweeps whose runs differ by seed only: their collected table has the seeds' mean.
METRICS = ("reward/mean", "correct/rate", "speedup/mean_correct")
CURVES = (("reward/mean", "reward/mean (kernel score per turn-sample)"),  # Per-step panels of curves.png.
          ("correct/rate", "correct/rate (share of correct kernels)"),
          ("learner/entropy", "learner/entropy (nats per response token)"))
# eval_metrics.jsonl keys (kevin_jax/evaluate.summarize) in the before/after table, with their labels.
EVAL_METRICS = (("kernel/score_mean", "kernel score mean"), ("kernel/correct_rate", "kernels correct"),
                ("kernel/speedup_mean_correct", "speedup of correct kernels"), ("correct_best", "correct best@k"),
                ("correct_avg", "correct avg@k"), ("perf_best", "perf best@k"), ("perf_avg", "perf avg@k"),
                ("fast_1_best", "fast_1 best@k"), ("novelty/novel_share", "novel share of correct"))


def commands(sweep: str, root: str, extra: list[str], only: str = "", checkpoint: str = "",
             init_from: str = "") -> list[tuple[str, list[str]]]:
  """(run name, argv) per configuration of the sweep (those named in `only`, comma-separated, if given).
  `checkpoint`: the policy a NEEDS_CHECKPOINT sweep evaluates (required there); `init_from`: the starting weights of
  every run (--config.init_from)."""
  if sweep not in SWEEPS:
    raise SystemExit(f"unknown sweep {sweep!r}; known: {', '.join(SWEEPS)}")
  if sweep in NEEDS_CHECKPOINT and not checkpoint:
    raise SystemExit(f"sweep {sweep!r} evaluates a trained policy: pass --checkpoint DIR (an RL workdir or its hf/)")
  if checkpoint and sweep not in NEEDS_CHECKPOINT:
    raise SystemExit(f"--checkpoint is for the sweeps {', '.join(NEEDS_CHECKPOINT)}; {sweep!r} trains: --init-from")
  given = ([f"--config.evaluation.checkpoint={checkpoint}"] if checkpoint else []) + (
      [f"--config.init_from={init_from}"] if init_from else [])
  names = [n for n, _, _ in SWEEPS[sweep]]
  picked = [n for n in only.split(",") if n]
  if any(n not in names for n in picked):
    raise SystemExit(f"--only {only!r}: sweep {sweep!r} has runs {', '.join(names)}")
  out = []
  for name, config, overrides in SWEEPS[sweep]:
    if picked and name not in picked:
      continue
    workdir = os.path.join(root, sweep, name)
    out.append((name, [sys.executable, "-m", "kevin_jax.main", f"--config={config}", f"--workdir={workdir}",
                       *overrides, *given, *extra]))
  return out


def collect(sweep: str, root: str, last: int) -> list[dict]:
  """One row per run: steps done and the mean of METRICS over the last `last` steps; writes table + plot (and the
  world sweeps' tables: module docstring)."""
  runs = {name: os.path.join(root, sweep, name) for name, _, _ in SWEEPS[sweep]}
  if sweep in NEEDS_CHECKPOINT:
    return world_tables.table2(runs, os.path.join(root, sweep))
  if sweep.startswith("world"):
    world_tables.main_result(runs, os.path.join(root, sweep), title=f"Sweep `{sweep}`",
                             mean_row=sweep in SEED_SWEEPS)
  rows, curves = [], {}
  for name, _, _ in SWEEPS[sweep]:
    path = os.path.join(root, sweep, name, "metrics.jsonl")
    if not os.path.isfile(path):  # A job in phases (world_tables' layouts): its RL phase's metrics.
      path = os.path.join(root, sweep, name, "rl", "metrics.jsonl")
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
    curves[name] = {m: [(s, float(r[m])) for s, r in recs.items() if m in r] for m, _ in CURVES}
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
  evals = before_after(sweep, root)
  if evals:
    lines += ["", "Before -> after RL (the job's own evaluations: step 0 = the starting policy, then the last step; "
              "k trajectories x n turns per task, the same sampling seed both times):", "",
              "| run | split | tasks | steps | " + " | ".join(label for _, label in EVAL_METRICS) + " |",
              "|" + "---|" * (4 + len(EVAL_METRICS))]
    for e in evals:
      cells = []
      for key, _ in EVAL_METRICS:
        b, a = e["before"].get(key), e["after"].get(key)
        cell = f"{_fmt_eval(key, b)} -> {_fmt_eval(key, a)}"
        if key == "kernel/score_mean" and b:
          cell += f" ({100 * (a - b) / b:+.0f}%)"
        cells.append(cell)
      lines.append(f"| {e['run']} | {e['split']} | {e['tasks']} | 0 -> {e['step']} | " + " | ".join(cells) + " |")
    with open(os.path.join(out_dir, "before_after.csv"), "w", newline="", encoding="utf-8") as f:
      w = csv.writer(f)
      w.writerow(["run", "split", "tasks", "step", "when"] + [k for k, _ in EVAL_METRICS])
      for e in evals:
        for when in ("before", "after"):
          w.writerow([e["run"], e["split"], e["tasks"], 0 if when == "before" else e["step"], when]
                     + [e[when].get(k, "") for k, _ in EVAL_METRICS])
  with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  if curves:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    fig, axes = plt.subplots(1, len(CURVES), figsize=(5.5 * len(CURVES), 4))
    for ax, (m, label) in zip(axes, CURVES):
      for name, by_metric in curves.items():
        pts = by_metric[m]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=name)
      ax.set_xlabel("RL step")
      ax.set_ylabel(label)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "curves.png"), dpi=100)
    plt.close(fig)
  print("\n".join(lines))
  return rows


def before_after(sweep: str, root: str) -> list[dict]:
  """Per run and split: the step-0 and last-step records of eval_metrics.jsonl ('<split>/<key>' scalars)."""
  out = []
  for name, _, _ in SWEEPS[sweep]:
    path = os.path.join(root, sweep, name, "eval_metrics.jsonl")
    if not os.path.isfile(path):
      continue
    recs = read_metrics(path)
    last = max(recs)
    if not recs.get(0) or last == 0:
      continue
    splits = sorted({k.split("/", 1)[0] for k in recs[0] if k != "step" and "/" in k})
    for split in splits:
      pick = lambda r, split=split: {k.split("/", 1)[1]: v for k, v in r.items() if k.startswith(split + "/")}
      before, after = pick(recs[0]), pick(recs[last])
      out.append({"run": name, "split": split, "step": last, "tasks": before.get("tasks", ""), "before": before,
                  "after": after})
  return out


def _fmt_eval(key: str, v) -> str:
  if not isinstance(v, (int, float)):
    return "?"
  if key.startswith("perf") or "speedup" in key:
    return f"{v:.2f}x"
  if "score" in key:
    return f"{v:.3f}"
  return f"{100 * v:.1f}%"


def compact(sweep: str, root: str) -> None:
  """Deletes every run's checkpoints and exported weights (large); metrics, rollouts and configs stay."""
  import shutil  # pylint: disable=g-import-not-at-top
  for name, _, _ in SWEEPS[sweep]:
    for sub in ("checkpoints", "hf", os.path.join("sft", "checkpoints"), os.path.join("sft", "hf")):
      d = os.path.join(root, sweep, name, sub)
      if os.path.isdir(d):
        shutil.rmtree(d)
        print(f"deleted {d}")


def _cell(v) -> str:
  return f"{v:.4g}" if isinstance(v, float) else str(v)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="Overrides for every run go after `--`, e.g. -- --config.total_steps=10")
  p.add_argument("sweep", choices=sorted(SWEEPS))
  p.add_argument("--root", default="runs/sweeps", help="parent of the sweep's run directories")
  p.add_argument("--run", action="store_true", help="run every configuration (sequentially)")
  p.add_argument("--collect", action="store_true", help="summarise finished runs into a table and a plot")
  p.add_argument("--last", type=int, default=5, help="steps averaged per run in the table")
  p.add_argument("--only", default="", help="comma-separated run names of the sweep to print/run")
  p.add_argument("--compact", action="store_true", help="delete the runs' checkpoints and exported weights")
  p.add_argument("--checkpoint", default="", help="the trained policy a sweep of evaluations (table2) evaluates")
  p.add_argument("--init-from", default="", help="starting weights of every run (--config.init_from), e.g. "
                 "<root>/world/s0/sft/hf: one warm start for all arms")
  # Overrides for every run follow a `--`. They are split off by hand: argparse gives a trailing nargs="*"
  # positional its empty match at the sweep name already, and then rejects everything after `--`.
  argv = list(sys.argv[1:] if argv is None else argv)
  split = argv.index("--") if "--" in argv else len(argv)
  args = p.parse_args(argv[:split])
  args.extra = argv[split + 1:]
  if args.collect or args.compact:
    if args.collect:
      collect(args.sweep, args.root, args.last)
    if args.compact:
      compact(args.sweep, args.root)
    return 0
  failed = []
  for name, cmd in commands(args.sweep, args.root, args.extra, args.only, args.checkpoint, args.init_from):
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
