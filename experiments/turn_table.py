"""Per-turn view of an evaluation's rollouts: what each turn wrote, and what it did with the previous turn's feedback.

  python experiments/turn_table.py <run>/eval_rollouts_step0_train.jsonl.gz [<run2>/eval_rollouts_step21_train...]

For each file (an in-training evaluation's turns, kevin_jax/train.py; or a training step's rollouts/*.jsonl):
  per turn     turns, mean score, correct, format errors, and the designs written: the bundled suite candidate whose
               ```cuda and ```plan blocks the response's match (optimized, naive, wrong = any known-wrong variant),
               novel (parses, matches none) or malformed (experiments/sample_diversity.classify);
  after        for turns 2+, by the previous turn's outcome (naive: it wrote the naive design and it was correct;
               wrong: its kernel was not correct; optimized: it wrote the optimized design and it was correct), how
               many of the next turns wrote the optimized design, repeated the previous design (any known-wrong
               variant counts as the design "wrong"), or wrote a correct kernel: whether the policy acts on the
               feedback.
  copies       correct kernels that are a suite candidate (comments and whitespace aside), against all correct
               ones: a correct kernel that is not a copy was written by the policy, not recalled.
With --paired BEFORE AFTER (two evaluations of the same tasks with the same sampling seeds, e.g. step 0 and the
last step): the per-task change of the mean kernel score (mean over tasks +- its standard error) and the tasks
that went up / down by more than 0.01. --csv FILE writes the per-turn rows of every file as CSV.
No GPU, no policy: reads the recorded responses and results only.
"""
import argparse
import collections
import csv
import gzip
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sample_diversity  # pylint: disable=g-import-not-at-top

DESIGNS = ("optimized", "naive", "wrong", "novel", "malformed")
OUTCOMES = ("naive", "wrong", "optimized")


def read_turns(path: str) -> list[dict]:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def design_of(row: dict, designs: dict[str, dict[str, str]]) -> str:
  _, name = sample_diversity.classify(row["response"], designs.get(row["task_id"], {}))
  return "wrong" if name.startswith("wrong") else name


def outcome_of(row: dict, design: str) -> str | None:
  """The previous turn's outcome as the next turn's choice depends on it (module docstring); None = other."""
  status = row["result"]["status"]
  if status != "correct":
    return "wrong" if design != "malformed" and status != "format_error" else None
  return design if design in ("naive", "optimized") else None


def table(rows: list[dict], designs: dict[str, dict[str, str]]) -> dict:
  """{"turns": {turn: {n, score, correct, copies, format_errors, designs}}, "after": {outcome: {n, optimized, same,
  correct}}} of one evaluation's (or step's) rows."""
  per_turn: dict[int, dict] = {}
  after = {o: collections.Counter() for o in OUTCOMES}
  trajectories = collections.defaultdict(list)
  for r in rows:
    trajectories[(r["task_id"], int(r["traj"]))].append(r)
  for turns in trajectories.values():
    turns.sort(key=lambda r: int(r["turn"]))
    prev = None
    for r in turns:
      d = design_of(r, designs)
      t = per_turn.setdefault(int(r["turn"]) + 1, {"n": 0, "score": 0.0, "correct": 0, "copies": 0,
                                                   "format_errors": 0, "designs": collections.Counter()})
      status = r["result"]["status"]
      t["n"] += 1
      t["score"] += float(r["result"].get("score") or 0.0)
      t["correct"] += status == "correct"
      t["copies"] += status == "correct" and d not in ("novel", "malformed")
      t["format_errors"] += status == "format_error"
      t["designs"][d] += 1
      if prev is not None and (o := outcome_of(*prev)) is not None:
        after[o]["n"] += 1
        after[o]["optimized"] += d == "optimized"
        after[o]["same"] += d == prev[1] and d not in ("novel", "malformed")
        after[o]["correct"] += status == "correct"
      prev = (r, d)
  for t in per_turn.values():
    t["score"] /= t["n"]
    t["designs"] = {k: t["designs"].get(k, 0) for k in DESIGNS}
  return {"turns": dict(sorted(per_turn.items())), "after": {o: dict(c) for o, c in after.items()}}


def paired(before: list[dict], after: list[dict]) -> dict:
  """Per-task change of the mean kernel score between two evaluations of the same tasks: {tasks, mean, se, up,
  down, before, after} (up / down: tasks whose mean moved by more than 0.01)."""
  means = []
  for rows in (before, after):
    by_task = collections.defaultdict(list)
    for r in rows:
      by_task[r["task_id"]].append(float(r["result"].get("score") or 0.0))
    means.append({k: statistics.fmean(v) for k, v in by_task.items()})
  if set(means[0]) != set(means[1]):
    raise SystemExit("--paired: the two evaluations cover different tasks")
  diffs = [means[1][k] - means[0][k] for k in sorted(means[0])]
  se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
  return {"tasks": len(diffs), "mean": statistics.fmean(diffs), "se": se, "up": sum(d > 0.01 for d in diffs),
          "down": sum(d < -0.01 for d in diffs), "before": statistics.fmean(means[0].values()),
          "after": statistics.fmean(means[1].values())}


def render(name: str, tab: dict) -> str:
  lines = [f"## {name}", "", "| turn | n | score mean | correct | of them copies | format errors | "
           + " / ".join(DESIGNS) + " |", "|---|---|---|---|---|---|---|"]
  for turn, t in tab["turns"].items():
    lines.append(f"| {turn} | {t['n']} | {t['score']:.3f} | {t['correct']} | {t['copies']} | {t['format_errors']} | "
                 + " / ".join(str(t["designs"][k]) for k in DESIGNS) + " |")
  lines += ["", "| previous turn | next turns | wrote optimized | repeated the design | correct |",
            "|---|---|---|---|---|"]
  for o, c in tab["after"].items():
    lines.append(f"| {o} | {c.get('n', 0)} | {c.get('optimized', 0)} | {c.get('same', 0)} | {c.get('correct', 0)} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("paths", nargs="*", help="eval_rollouts_*.jsonl(.gz) or rollouts/step_*.jsonl files")
  ap.add_argument("--paired", nargs=2, metavar=("BEFORE", "AFTER"), help="per-task change between two evaluations")
  ap.add_argument("--csv", default="", help="write every file's per-turn rows here")
  a = ap.parse_args(argv)
  if not a.paths and not a.paired:
    ap.error("give rollout files, or --paired BEFORE AFTER")
  designs = sample_diversity.suite_designs()
  rows = []
  for p in a.paths:
    tab = table(read_turns(p), designs)
    print(render(p, tab) + "\n")
    rows += [{"file": p, "turn": turn, **{k: v for k, v in t.items() if k != "designs"}, **t["designs"]}
             for turn, t in tab["turns"].items()]
  if a.csv and rows:
    with open(a.csv, "w", newline="", encoding="utf-8") as f:
      w = csv.DictWriter(f, fieldnames=list(rows[0]))
      w.writeheader()
      w.writerows(rows)
  if a.paired:
    c = paired(*(read_turns(p) for p in a.paired))
    print(f"paired over {c['tasks']} tasks: {c['before']:.3f} -> {c['after']:.3f}, per-task change "
          f"{c['mean']:+.3f} +- {c['se']:.3f} (s.e.), up / down (> 0.01): {c['up']} / {c['down']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
