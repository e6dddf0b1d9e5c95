"""The kernel-evaluation budget of RL steps on the generated task world: evaluations per minute, without and with
the evaluator's result cache.

  python experiments/bench_world_step.py --out runs/world_step        # about 3-5 minutes on one H100 / H200

An RL step of the main job (configs/multiturn.py) evaluates tasks_per_step x trajectories candidates per turn, in
one batch per turn, for `turns` turns (2 x 16 x 4 = 128). Here the policy is replaced by the kernel writer: each
(trajectory, turn) draws one of its task's labelled candidates (a correct style with probability 0.6, else a
known-wrong variant), and a share `--novel` of them gets a unique comment, so its text is new to the evaluator
(as a policy's novel kernels are). The same steps run twice with the job's evaluator settings, once with
result_cache = 0 (every batch evaluated afresh; identical candidates within a batch still run once) and once with
the job's result_cache. A warm-up batch first times each task's reference (ref_timing = 'cached'), so neither
configuration pays for it. Writes world_step.json and world_step.md to --out and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configs import multiturn  # pylint: disable=wrong-import-position
from kevin_jax.data.taskgen import world as world_lib  # pylint: disable=wrong-import-position
from kevin_jax.rl import kernel_metrics as km  # pylint: disable=wrong-import-position


def step_batches(w: world_lib.World, step: int, tasks_per_step: int, trajectories: int, turns: int, novel: float,
                 seed: int) -> list[list[tuple[str, str]]]:
  """One RL step's evaluator batches (one per turn) of writer candidates (module docstring)."""
  rng = random.Random(f"bench_world_step:{seed}:{step}")
  chosen = rng.sample(w.split("train"), tasks_per_step)
  batches = []
  for turn in range(turns):
    batch = []
    for t in chosen:
      cands = t.candidates()
      right = [c for c in cands if c.expect == "correct"]
      wrong = [c for c in cands if c.expect != "correct"]
      for traj in range(trajectories):
        c = rng.choice(right if rng.random() < 0.6 else wrong)
        text = c.text
        if rng.random() < novel:
          text = text.replace("\n```\n```plan", f"\n// variant {seed}-{step}-{traj}-{turn}\n```\n```plan", 1)
        batch.append((t.id, text))
    batches.append(batch)
  return batches


def measure(ev, steps: list[list[list[tuple[str, str]]]]) -> dict:
  """Runs the steps' batches in order; wall time, evaluations per minute, GPU work and phase medians."""
  t0 = time.monotonic()
  results, per_step = [], []
  for batches in steps:
    s0 = time.monotonic()
    for batch in batches:
      results += [r.to_dict() for r in ev.evaluate(batch)]
    per_step.append(time.monotonic() - s0)
  wall = time.monotonic() - t0
  work = km.gpu_work(results)
  phases = {}
  for k in ("compile", "correctness", "timing", "gpu_total"):
    v = [r["times"][k] for r in results if k in (r.get("times") or {})]
    phases[k] = statistics.median(v) if v else None
  return {"candidates": len(results), "wall_s": wall, "evaluations_per_min": 60 * len(results) / wall,
          "step_s": per_step, "gpu_runs": work["gpu_runs"], "gpu_s": work["gpu_s"], "cached": work["cached"],
          "statuses": {s: sum(r["status"] == s for r in results) for s in sorted({r["status"] for r in results})},
          "phase_median_s": phases}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "runs/world_step"))
  ap.add_argument("--steps", type=int, default=2, help="RL steps (distinct task draws)")
  ap.add_argument("--novel", type=float, default=0.25, help="share of candidates given a unique text")
  ap.add_argument("--config", default="", help="config presets of configs/multiturn.py for the evaluator settings")
  ap.add_argument("--seed", type=int, default=0)
  a = ap.parse_args(argv)
  from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig  # pylint: disable=g-import-not-at-top
  cfg = multiturn.get_config(a.config)
  wc = world_lib.WorldConfig.from_config(cfg.tasks)
  w, root = world_lib.build(wc), world_lib.materialize(wc)
  r = cfg.rollout
  steps = [step_batches(w, s, r.tasks_per_step, r.trajectories, r.turns, a.novel, a.seed) for s in range(a.steps)]
  base = EvaluatorConfig.from_config(cfg.evaluator)
  warm = sorted({tid for batches in steps for batch in batches for tid, _ in batch})
  by_id = w.by_id()
  out = {}
  for name, cache in (("no result cache", 0), ("result cache", base.result_cache)):
    ev_cfg = dataclasses.replace(base, result_cache=cache)
    with Evaluator(ev_cfg, task_source=root) as ev:
      naive = [next(c for c in by_id[tid].candidates() if c.name == "naive").text for tid in warm]
      ev.evaluate([(tid, text.replace("\n```\n```plan", "\n// warm-up\n```\n```plan", 1))  # Not in the steps.
                   for tid, text in zip(warm, naive)])
      out[name] = measure(ev, steps)
      device = (ev.gpu_info or {}).get("device_name") or "GPU"
    print(f"{name}: {out[name]['evaluations_per_min']:.0f} evaluations/min", flush=True)
  meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": device,
          "steps": a.steps, "candidates_per_step": r.tasks_per_step * r.trajectories * r.turns, "novel": a.novel,
          "evaluator": dataclasses.asdict(base), "world": dataclasses.asdict(wc)}
  os.makedirs(a.out, exist_ok=True)
  with open(os.path.join(a.out, "world_step.json"), "w", encoding="utf-8") as f:
    json.dump({"run": meta, "results": out}, f, indent=1)
  lines = [f"RL steps on the task world ({device}, {meta['date']}): {a.steps} steps x "
           f"{meta['candidates_per_step']} writer candidates, {100 * a.novel:.0f}% with unique text", "",
           "| evaluator | evaluations/min | wall s | s per step | GPU runs | GPU s | cached |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  for name, m in out.items():
    lines.append(f"| {name} | {m['evaluations_per_min']:.0f} | {m['wall_s']:.1f} | "
                 f"{statistics.mean(m['step_s']):.1f} | {m['gpu_runs']:.0f} | {m['gpu_s']:.1f} | {m['cached']:.0f} |")
  with open(os.path.join(a.out, "world_step.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
