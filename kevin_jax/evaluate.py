"""Evaluation and test-time-scaling runs (mode=evaluate) [P §4, Tables 1-2; blog's beam search].

For a checkpoint and a task split: k trajectories x n turns per task, reported per turn as best@k / avg@k of
correctness and performance (a trajectory's performance = its fastest correct kernel, 0 if none) and fast_1 /
fast_1.5; with evaluation.standard_report, the field's standard report (kevin_jax/report/standard.py); the
fixed-budget comparison of (trajectories, turns) pairs, each with its best so far per turn [P Table 2, Fig. 5];
optionally the beam search (keep the best `width` trajectories of a task, clone each `clones` times, continue).
Writes workdir/eval/results.md, results.csv (budget rows: `budget`, the last turn; `budget_KxN_turn`, every
turn), report.json, scaling.png and trajectories.jsonl (and standard_report.md / *.csv / .png).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from typing import Callable, Sequence

import numpy as np

from kevin_jax.rl import kernel_metrics as km
from kevin_jax.rl import rollout as ro


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  trajectories: int
  turns: int
  budgets: tuple[tuple[int, int], ...]
  beam: bool
  beam_width: int
  beam_clones: int
  beam_rounds: int
  beam_turns_per_round: int
  max_context_tokens: int
  feedback_max_chars: int
  temperature: float | None = None  # Sampling temperature of the evaluation (None = the sampler's default).

  @classmethod
  def from_config(cls, config) -> "EvalSettings":
    e = config.evaluation
    return cls(trajectories=e.trajectories, turns=e.turns,
               budgets=tuple((int(k), int(n)) for k, n in e.budgets), beam=e.beam, beam_width=e.beam_width,
               beam_clones=e.beam_clones, beam_rounds=e.beam_rounds,
               beam_turns_per_round=e.beam_turns_per_round,
               max_context_tokens=config.rollout.max_context_tokens,
               feedback_max_chars=config.rollout.feedback_max_chars,
               temperature=None if e.temperature < 0 else float(e.temperature))

  @classmethod
  def in_training(cls, config) -> "EvalSettings":
    """The RL job's own evaluations (config.evaluation.in_training_*): one k x n run, no budgets, no beam."""
    e = config.evaluation
    return dataclasses.replace(cls.from_config(config), trajectories=e.in_training_trajectories,
                               turns=e.in_training_turns, budgets=(), beam=False)


def _correct_speedup(turns: Sequence[ro.Turn]):
  correct = ro.to_matrix(turns, lambda t: float(t.result.get("status") == "correct")).astype(bool)
  speedup = ro.to_matrix(turns, lambda t: float(t.result.get("speedup") or 0.0))
  return correct, speedup


def per_turn_table(turns: Sequence[ro.Turn], task_ids: Sequence[str], n_turns: int) -> list[dict]:
  """One row per turn t: suite means of best@k/avg@k metrics using each trajectory's first t turns. A task whose
  every turn got a task-level result (rollout.task_level: never the policy's) is left out."""
  by_task = {tid: [t for t in turns if t.task_id == tid] for tid in dict.fromkeys(task_ids)}
  by_task = {tid: ts for tid, ts in by_task.items() if not all(ro.task_level(t.result) for t in ts)}
  rows = []
  for t in range(1, n_turns + 1):
    per_task = [km.task_summary(*_correct_speedup(ts), turns=t) for ts in by_task.values()]
    rows.append({"turn": t, **km.suite_summary(per_task)})
  return rows


def summarize(turns: Sequence[ro.Turn], task_ids: Sequence[str], n_turns: int) -> dict[str, float]:
  """Flat scalars of one evaluation: best@k / avg@k metrics after all n turns, plus per-kernel means over
  every turn's kernel (kernel/score_mean, kernel/correct_rate, kernel/speedup_mean_correct). Task-level results
  are counted apart (kernel/task_level, tasks_not_evaluated), never as the policy's kernels."""
  out = {k: v for k, v in per_turn_table(turns, task_ids, n_turns)[-1].items() if k != "turn"}
  mine = [t for t in turns if not ro.task_level(t.result)]
  kernels = (km.kernel_summary([str(t.result.get("status")) for t in mine], [t.score for t in mine],
                               [float(t.result.get("speedup") or 0.0) for t in mine]) if mine else
             {"score_mean": 0.0, "correct_rate": 0.0, "speedup_mean_correct": 0.0})
  out.update({f"kernel/{k}": v for k, v in kernels.items()})
  out["kernel/task_level"] = float(len(turns) - len(mine))
  evaluated = {t.task_id for t in mine}
  out["tasks_not_evaluated"] = float(len({t.task_id for t in turns} - evaluated))
  return out


def novelty(turns: Sequence[ro.Turn], index) -> dict[str, float]:
  """'novelty/<metric>' of the correct kernels among the turns (kernel_metrics.novelty_summary); {} without an
  index."""
  if index is None:
    return {}
  texts = [t.parsed.candidate_text for t in turns if t.result.get("status") == "correct"]
  return {f"novelty/{k}": v for k, v in km.novelty_summary(texts, index).items()}


def evaluate_policy(task_ids: Sequence[str], sources: dict[str, str], s: EvalSettings, *, seed: int,
                    generate: Callable, reward: Callable, encode_chat: Callable,
                    novelty_index=None) -> tuple[dict, list]:
  """k trajectories x n turns per task (s.trajectories, s.turns); returns (summarize(...) and, given a
  kernel_metrics.CorpusIndex, the novelty of the correct kernels; the turns)."""
  turns, times = _run(task_ids, sources, s.trajectories, s.turns, seed, generate, reward, encode_chat, s)
  out = summarize(turns, task_ids, s.turns)
  out.update({"tasks": len(task_ids), "time/generate_s": times.generate_s, "time/evaluate_s": times.reward_s})
  out.update({f"evaluator/{k}": v for k, v in km.gpu_work(t.result for t in turns).items()})
  out.update(novelty(turns, novelty_index))
  return out, turns


def _run(task_ids, sources, k, n, seed, generate, reward, encode_chat, s: EvalSettings, starts=None):
  starts = starts if starts is not None else ro.fresh_starts(task_ids, k)
  return ro.rollout(starts, sources, turns=n, generate=generate, reward=reward, encode_chat=encode_chat,
                    max_context_tokens=s.max_context_tokens, seed=seed,
                    feedback_max_chars=s.feedback_max_chars)


def beam_search(task_ids, sources, s: EvalSettings, seed, generate, reward, encode_chat):
  """Blog's beam search: per round run `turns_per_round` turns, keep each task's best `width` trajectories
  (by fastest correct kernel so far, then by best score), clone each `clones` times. Returns per-round rows."""
  n_start = s.beam_width * s.beam_clones
  starts = ro.fresh_starts(task_ids, n_start)
  best_so_far: dict[str, float] = {tid: 0.0 for tid in task_ids}
  rows, all_turns = [], []
  for r in range(s.beam_rounds):
    turns, _ = _run(task_ids, sources, None, s.beam_turns_per_round, seed + 7919 * (r + 1), generate,
                    reward, encode_chat, s, starts=starts)
    all_turns += turns
    new_starts = []
    for tid in dict.fromkeys(task_ids):
      idx = [i for i, st in enumerate(starts) if st.task_id == tid]
      ranked = []
      for i in idx:
        mine = [t for t in turns if t.traj == i]
        perf = max([float(t.result.get("speedup") or 0.0) for t in mine
                    if t.result.get("status") == "correct"] + [0.0])
        ranked.append((perf, max(t.score for t in mine), i))
        best_so_far[tid] = max(best_so_far[tid], perf)
      ranked.sort(reverse=True)
      for _, _, i in ranked[:s.beam_width]:
        hist = list(starts[i].history) + [
            _attempt(t, s.feedback_max_chars) for t in sorted((t for t in turns if t.traj == i),
                                                               key=lambda t: t.turn)]
        new_starts += [ro.Start(tid, hist) for _ in range(s.beam_clones)]
    starts = new_starts
    rows.append({"round": r + 1, "turns_so_far": (r + 1) * s.beam_turns_per_round,
                 "perf_best": float(np.mean(list(best_so_far.values()))),
                 "correct_best": float(np.mean([v > 0 for v in best_so_far.values()]))})
  return rows, all_turns


def _attempt(t: ro.Turn, max_chars: int):
  from kevin_jax.rl import prompts  # pylint: disable=g-import-not-at-top
  return prompts.Attempt(t.parsed.candidate_text, t.parsed.summary, str(t.result.get("feedback", ""))[:max_chars])


def run_evaluation(task_ids: Sequence[str], sources: dict[str, str], s: EvalSettings, *, seed: int,
                   generate: Callable, reward: Callable, encode_chat: Callable, out_dir: str,
                   novelty_index=None) -> dict:
  """Runs the main table, the budget comparison and (optionally) the beam search; writes the reports."""
  os.makedirs(out_dir, exist_ok=True)
  main_turns, times = _run(task_ids, sources, s.trajectories, s.turns, seed, generate, reward, encode_chat, s)
  report = {"per_turn": per_turn_table(main_turns, task_ids, s.turns), "budgets": [], "beam": [],
            "tasks": len(task_ids), "trajectories": s.trajectories, "turns": s.turns,
            "generate_s": times.generate_s, "reward_s": times.reward_s,
            "novelty": novelty(main_turns, novelty_index)}
  traj_log = [("main", main_turns)]
  for b, (k, n) in enumerate(s.budgets):
    if (k, n) == (s.trajectories, s.turns):
      turns = main_turns
    else:
      turns, _ = _run(task_ids, sources, k, n, seed + 101 * (b + 1), generate, reward, encode_chat, s)
      traj_log.append((f"budget_{k}x{n}", turns))
    rows = per_turn_table(turns, task_ids, n)
    report["budgets"].append({"trajectories": k, "turns": n, "kernels": k * n, **rows[-1],
                              "per_turn": [{c: r[c] for c in ("turn", *_COLS)} for r in rows]})
  if s.beam:
    report["beam"], beam_turns = beam_search(task_ids, sources, s, seed + 31337, generate, reward, encode_chat)
    traj_log.append(("beam", beam_turns))
  write_reports(report, traj_log, out_dir)
  return report


_COLS = ["correct_best", "correct_avg", "perf_best", "perf_avg", "fast_1_best", "fast_1_avg",
         "fast_1.5_best", "fast_1.5_avg"]


def write_reports(report: dict, traj_log, out_dir: str) -> None:
  k = report["trajectories"]
  lines = [f"# Evaluation: {report['tasks']} tasks, {k} trajectories x {report['turns']} turns", "",
           "Per turn (using each trajectory's first t turns; suite means over tasks):", "",
           "| turn | " + " | ".join(c.replace("_best", f" best@{k}").replace("_avg", f" avg@{k}") for c in _COLS)
           + " |", "|" + "---|" * (len(_COLS) + 1)]
  lines += [f"| {r['turn']} | " + " | ".join(_fmt(c, r[c]) for c in _COLS) + " |" for r in report["per_turn"]]
  nov = report.get("novelty") or {}
  if nov:
    lines += ["", f"Novelty of the {nov['novelty/correct_kernels']:.0f} correct kernels against the warm-start corpus: "
              f"{100 * nov['novelty/novel_share']:.0f}% are not copies ({nov['novelty/novel_distinct']:.0f} distinct), "
              f"mean nearest n-gram Jaccard {nov['novelty/nearest_jaccard_mean']:.2f}."]
  lines += ["", "Fixed kernel budgets (trajectories x turns):", "",
            "| trajectories | turns | kernels | perf best | correct best | perf avg | correct avg |",
            "|---|---|---|---|---|---|---|"]
  lines += [f"| {b['trajectories']} | {b['turns']} | {b['kernels']} | {b['perf_best']:.2f}x | "
            f"{100 * b['correct_best']:.0f}% | {b['perf_avg']:.2f}x | {100 * b['correct_avg']:.0f}% |"
            for b in report["budgets"]]
  if report["beam"]:
    lines += ["", "Beam search:", "", "| round | turns | perf best | correct best |", "|---|---|---|---|"]
    lines += [f"| {r['round']} | {r['turns_so_far']} | {r['perf_best']:.2f}x | {100 * r['correct_best']:.0f}% |"
              for r in report["beam"]]
  with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(out_dir, "results.csv"), "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(["table", "trajectories", "turns"] + _COLS)
    w.writerows(["per_turn", k, r["turn"]] + [r[c] for c in _COLS] for r in report["per_turn"])
    w.writerows(["budget", b["trajectories"], b["turns"]] + [b[c] for c in _COLS] for b in report["budgets"])
    w.writerows([f"budget_{b['trajectories']}x{b['turns']}_turn", b["trajectories"], r["turn"]] + [r[c] for c in _COLS]
                for b in report["budgets"] for r in b["per_turn"])
  with open(os.path.join(out_dir, "report.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(out_dir, "trajectories.jsonl"), "w", encoding="utf-8") as f:
    for name, turns in traj_log:
      for t in turns:
        f.write(json.dumps({"run": name, **t.record(step=0)}) + "\n")
  _plot(report, os.path.join(out_dir, "scaling.png"))


def _fmt(col: str, v: float) -> str:
  return f"{v:.2f}x" if col.startswith("perf") else f"{100 * v:.0f}%"


def _plot(report: dict, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  t = [r["turn"] for r in report["per_turn"]]
  k = report["trajectories"]
  axes[0].plot(t, [r["perf_best"] for r in report["per_turn"]], "o-", label=f"perf best@{k}")
  axes[0].plot(t, [r["perf_avg"] for r in report["per_turn"]], "s--", label=f"perf avg@{k}")
  for b in report["budgets"]:  # Best so far after each turn, per fixed-budget shape [P Fig. 5].
    if b["turns"] > 1 and (b["trajectories"], b["turns"]) != (k, report["turns"]):
      axes[0].plot([r["turn"] for r in b["per_turn"]], [r["perf_best"] for r in b["per_turn"]], ".:",
                   label=f"perf best@{b['trajectories']} ({b['trajectories']}x{b['turns']})")
  axes[0].set_xlabel("turns")
  axes[0].set_ylabel("mean speedup (failures count 0)")
  axes[0].legend()
  labels = [f"{b['trajectories']}x{b['turns']}" for b in report["budgets"]]
  axes[1].bar(labels, [b["perf_best"] for b in report["budgets"]])
  axes[1].set_ylabel("perf best@k")
  axes[1].set_title("fixed kernel budget")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write_standard_report(config, records: Sequence[dict], out_dir: str) -> list[str]:
  """The field's standard report (kevin_jax/report/standard.py) of evaluation records (rollout.Turn.record), with
  each task's level and split (train / test of config.tasks) and the task source's commit and GPU."""
  from kevin_jax import cuda_driver  # pylint: disable=g-import-not-at-top
  from kevin_jax import runtime  # pylint: disable=g-import-not-at-top
  from kevin_jax.report import standard  # pylint: disable=g-import-not-at-top
  levels, splits = {}, {}
  for split in ("train", "test"):
    try:
      specs = runtime.load_tasks(config, split)[0]
    except SystemExit:  # A source without this split.
      continue
    levels.update({s.id: s.level for s in specs})
    splits.update({s.id: split for s in specs})
  paths = standard.write(standard.build(records, levels, splits), out_dir,
                         title=f"Standard report: {config.tasks.source or 'tasks'}",
                         source_commit=standard.source_commit(config.tasks.source, config.tasks.source_commit),
                         device=cuda_driver.describe() if config.evaluator.backend == "cuda" else "none (scripted)")
  return paths


def run(config, workdir: str) -> None:
  """mode=evaluate: the policy from config.evaluation.checkpoint (Orbax run / HF dir; else policy.checkpoint, else
  this workdir) on a task split."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  from kevin_jax import runtime  # pylint: disable=g-import-not-at-top  (JAX: only when a job runs)
  from kevin_jax.train import make_generate  # pylint: disable=g-import-not-at-top
  runtime.require_gpu_for_evaluator(config)
  specs, sources = runtime.load_tasks(config, config.evaluation.split)
  if config.evaluation.max_tasks:
    specs = specs[:config.evaluation.max_tasks]
    sources = {s.id: sources[s.id] for s in specs}
  config = runtime.fit_context_to_tasks(config, sources)
  policy = runtime.build_policy(config)
  runtime.check_prompt_budget(policy, sources, config.rollout.max_context_tokens)
  runtime.check_host_memory(config, policy, warm_start=False, rl=False)
  src = config.evaluation.checkpoint or config.policy.checkpoint or workdir
  params = runtime.load_params(src, policy)
  reward = runtime.make_reward(config, config.tasks.source)
  settings = EvalSettings.from_config(config)
  try:
    report = run_evaluation(
        [s.id for s in specs], sources, settings, seed=config.seed,
        generate=make_generate(policy, params, settings.temperature), reward=reward, encode_chat=policy.encode_chat,
        out_dir=os.path.join(workdir, "eval"), novelty_index=runtime.novelty_index(config))
  finally:
    if hasattr(reward, "close"):
      reward.close()
  if config.evaluation.standard_report:
    with open(os.path.join(workdir, "eval", "trajectories.jsonl"), encoding="utf-8") as f:
      records = [r for r in map(json.loads, f) if r["run"] == "main"]
    write_standard_report(config, records, os.path.join(workdir, "eval"))
  last = report["per_turn"][-1]
  logging.info("evaluation of %s on %d tasks: correct best@k %.0f%%, perf best@k %.2fx (reports in %s)", src,
               len(specs), 100 * last["correct_best"], last["perf_best"], os.path.join(workdir, "eval"))
