"""Export a task set as the warm-start corpus, in the policy's prompt and response format.

  python -m kevin_jax.data.export_corpus --out corpus.jsonl                      # the bundled suite
  python -m kevin_jax.data.export_corpus --out corpus.jsonl --kinds all --reasoning plain   # the RL job's mixture
  python -m kevin_jax.data.export_corpus --source generated --out corpus.jsonl   # the task world's warm start

One JSON object per line (the format kevin_jax/rl/sft_data.py reads): `messages` (system + user, from
rl/prompts.build_messages), `response` (rl/prompts.format_response: reasoning, candidate blocks, summary) and
metadata (task_id, kind, quality, target, attempts, attempts_dropped, turn, level).

Example kinds, per task (`kinds`: KINDS is this CLI's default; configs/multiturn.py sft.corpus_kinds, the RL
job's warm start, uses ALL_KINDS):
  single            turn 1: the task alone -> each correct solution (naive, optimized and, for generated tasks,
                    every other correct style the writer renders)
  fix_wrong         turn 2: a known-wrong variant + its evaluator feedback -> the optimized solution
  speed_up          turn 2: the naive solution + its feedback ("Correct ... speedup 0.4x") -> the optimized one,
                    when the records show the optimized one is faster
  fix_then_speed_up turn 3: a wrong variant, then the naive solution, each with feedback -> the optimized one
  retry_format      turn 2: a response that ended inside its reasoning -> the optimized solution
  keep_fast         turn 2: the optimized solution + its feedback (correct, its speedup) -> the optimized one again
  fast_then_format  turn 3: the optimized solution, then a response that ended inside its reasoning -> optimized
  format_twice      turn 3: two responses that ended inside their reasoning -> the optimized solution
  first_wrong       turn 1: the task alone -> a known-wrong variant whose recorded status is its label, with the
                    reasoning style of `single` (the first turn becomes a mixture of correct and wrong kernels)
  slow_again        turn 2: the naive solution + its feedback -> the naive solution again (pairs with speed_up)
  wrong_again       turn 2: a known-wrong variant + its feedback -> the task's next known-wrong variant (itself
                    when it is the only one; pairs with fix_wrong)
The format-error attempt is built by the rollout's own code (prompts.parse_response, rollout.format_error_result)
from a response cut inside its reasoning: its prompt is the one a rollout shows after any such response.

Feedback is never invented: it is the evaluator's text from a recorded verification run (the bundled suite:
kevin_jax/data/suite_results.json from experiments/verify_suite.py --update-meta; the task world:
kevin_jax/data/world_results.json from --update-world; a results.json of a run works too). Attempts whose
recorded status differs from their label, or whose recorded candidate text differs from today's, are left out.
A task without records gets only the kinds that need no evaluator feedback: single, retry_format, format_twice.

Task world (`--source generated`, configs/multiturn.py tasks.world_*): `train` tasks get every requested kind;
`heldout_styles` tasks only `single` with the naive solution (no faster kernel of theirs is in the corpus);
`heldout_compositions` and `suite` tasks are not part of the warm start (`--split all` adds them as `single` and
the bundled corpus, for held-out losses).

Reasoning is short and task-specific and opens with "Okay," (QwQ's habit, which the RL monitors check). Two
styles for the later-turn examples (`reasoning=`, config sft.corpus_reasoning):
  quote   quotes the previous feedback's first line and timings and names the wrong variant's bug;
  plain   says only what kind of outcome the previous attempt had (wrong, slower than it can be, fastest, no
          kernel), then the task and the plan: nothing a rollout would have to copy from its prompt.
Pure text: no torch, no JAX.
"""

from __future__ import annotations

import argparse
import collections
import functools
import hashlib
import json
import os
import sys
from typing import Any, Callable, Iterable, Sequence

from kevin_jax.kernels import suite, tasks
from kevin_jax.rl import prompts
from kevin_jax.rl import rollout

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT_RESULTS = os.path.join(DATA_DIR, "suite_results.json")
WORLD_RESULTS = os.path.join(DATA_DIR, "world_results.json")
KINDS = ("single", "fix_wrong", "speed_up", "fix_then_speed_up")  # This CLI's default.
LATER_TURN_KINDS = ("retry_format", "keep_fast", "fast_then_format", "format_twice")  # Opt-in (docstring).
WRONG_TARGET_KINDS = ("first_wrong",)  # Opt-in (docstring): a wrong kernel as the first turn's target.
FIRST_TURN_MIXTURE = KINDS + LATER_TURN_KINDS + WRONG_TARGET_KINDS  # All but the later-turn mixture.
LATER_MIXTURE_KINDS = ("slow_again", "wrong_again")  # Opt-in (docstring): feedback not acted on.
ALL_KINDS = FIRST_TURN_MIXTURE + LATER_MIXTURE_KINDS
NO_FEEDBACK_KINDS = ("single", "retry_format", "format_twice")  # Written for tasks without evaluator records.
REASONING_STYLES = ("quote", "plain")  # Module docstring.


def check_kinds(kinds) -> tuple[str, ...]:
  kinds = tuple(kinds)
  unknown = [k for k in kinds if k not in ALL_KINDS]
  if unknown or not kinds:
    raise ValueError(f"corpus kinds {list(kinds)}: unknown {unknown or 'none given'}; known: {', '.join(ALL_KINDS)}")
  return kinds


def text_sha(text: str) -> str:
  """The digest a record keeps of its candidate's text (a record of another text is not this one's)."""
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_results(path: str) -> dict[str, dict[str, dict]]:
  """{task_id: {candidate: {status, speedup, ref_time_ms, cand_time_ms, feedback[, text_sha]}}} from a compact
  results file (suite_results.json, world_results.json) or a verify_suite results.json (full rows)."""
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  if isinstance(data.get("results"), dict):
    return data["results"]
  out: dict[str, dict[str, dict]] = collections.defaultdict(dict)
  for row in data.get("results", []):
    r = row["result"]
    rec = {k: r.get(k) for k in ("status", "speedup", "ref_time_ms", "cand_time_ms", "feedback")}
    if row.get("text_sha"):
      rec["text_sha"] = row["text_sha"]
    out[row["task_id"]][row["candidate"]] = rec
  return dict(out)


def _sentence(text: str) -> str:
  """One sentence of quotable text: whitespace collapsed, a full stop added, think tags put in words (feedback
  on a format error names `</think>`; inside reasoning it would end the reasoning there)."""
  text = text.replace(prompts.THINK_CLOSE, "closing think tag").replace(prompts.THINK_OPEN, "opening think tag")
  text = " ".join(text.split())
  return text if text.endswith((".", "!", "?")) else text + "."


def _first_line(feedback: str) -> str:
  return feedback.strip().splitlines()[0] if feedback.strip() else ""


def reasoning_single(meta: dict, target: suite.SuiteCandidate) -> str:
  return f"Okay, the task: {_sentence(meta['description'])} Plan: {_sentence(target.summary)}"


def reasoning_fix(meta: dict, wrong: suite.SuiteCandidate, feedback: str, target: suite.SuiteCandidate) -> str:
  return (f"Okay, the last attempt failed: {_sentence(_first_line(feedback))} Looking at that kernel again, the "
          f"bug is that it {_lower_first(wrong.bug)}. The task: {_sentence(meta['description'])} "
          f"New version: {_sentence(target.summary)}")


def reasoning_speed(meta: dict, slow: dict, target: suite.SuiteCandidate, plan: str = "To go faster") -> str:
  return (f"Okay, the previous kernel was correct but took {slow['cand_time_ms']:.3g} ms against "
          f"{slow['ref_time_ms']:.3g} ms for PyTorch ({slow['speedup']:.2f}x). The task: "
          f"{_sentence(meta['description'])} {plan}: {_sentence(target.summary)}")


def reasoning_retry(meta: dict, feedback: str, target: suite.SuiteCandidate) -> str:
  return (f"Okay, the last attempt gave no kernel: {_sentence(_first_line(feedback))} The task: "
          f"{_sentence(meta['description'])} Plan: {_sentence(target.summary)}")


def reasoning_keep(meta: dict, fast: dict, target: suite.SuiteCandidate) -> str:
  return (f"Okay, the previous kernel was correct at {fast['speedup']:.2f}x against PyTorch, the fastest design I "
          f"have. The task: {_sentence(meta['description'])} I keep it: {_sentence(target.summary)}")


def reasoning_plain(meta: dict, outcome: str, target: suite.SuiteCandidate, plan: str = "") -> str:
  """The `plain` style's later-turn reasoning: the previous attempt's kind of outcome, the task, the plan (its
  label: the outcome's usual one unless given)."""
  opening, usual = {"wrong": ("the last kernel was wrong", "New version"),
                    "slow": ("the last kernel was correct but slower than it can be", "To go faster"),
                    "fast": ("the last kernel was correct and the fastest design I have", "I keep it"),
                    "no_kernel": ("the last attempt gave no kernel", "Plan")}[outcome]
  return f"Okay, {opening}. The task: {_sentence(meta['description'])} {plan or usual}: {_sentence(target.summary)}"


def format_error_attempt(target: suite.SuiteCandidate, reasoning: str) -> prompts.Attempt:
  """What a rollout's next prompt shows after a response that ended inside its reasoning (module docstring)."""
  cut = f"{prompts.THINK_OPEN}\n{' '.join(reasoning.split()[:6])}"
  parsed = prompts.parse_response(cut)
  if not parsed.error:
    raise AssertionError(f"{target.name}: a response cut inside its reasoning parsed without error")
  return prompts.Attempt(parsed.candidate_text, parsed.summary, rollout.format_error_result(parsed.error)["feedback"])


def _lower_first(s: str) -> str:
  s = s.strip().rstrip(".")
  return s[:1].lower() + s[1:] if s else "does not compute what the reference computes"


# Builds a turn's prompt from the task source and the earlier attempts: (messages, attempts dropped). The default
# keeps every attempt; the warm start passes the rollout's own prompts.fit_messages within its prompt budget.
Fit = Callable[[str, Sequence[prompts.Attempt]], tuple[list[dict[str, str]], int]]


def every_attempt(task_source: str, attempts: Sequence[prompts.Attempt]) -> tuple[list[dict[str, str]], int]:
  return prompts.build_messages(task_source, attempts), 0


def _record(task, kind: str, attempts: list[prompts.Attempt], names: list[str],
            reasoning: str, target: suite.SuiteCandidate, fit: Fit = every_attempt) -> dict[str, Any]:
  messages, dropped = fit(task.source, attempts)
  return {"messages": messages,
          "response": prompts.format_response(reasoning, target.text, target.summary),
          "task_id": task.id, "level": task.level, "kind": kind,
          "quality": "correct" if target.expect == "correct" else "wrong", "target": target.name,
          "attempts": names, "attempts_dropped": dropped, "turn": len(attempts) + 1}


def check_reasoning(reasoning: str) -> str:
  if reasoning not in REASONING_STYLES:
    raise ValueError(f"reasoning style {reasoning!r}: known: {', '.join(REASONING_STYLES)}")
  return reasoning


def examples_for_task(task, results: dict[str, dict] | None, kinds=KINDS, reasoning: str = "quote",
                      fit: Fit = every_attempt, naive_only: bool = False) -> tuple[list[dict], list[str]]:
  """The corpus records of one task (of the given kinds, later-turn reasoning in the given style, prompts built by
  `fit`) and the notes on what was left out (status != label, changed text, no records).

  Args:
    task: a kernels.suite.SuiteTask or a taskgen GenTask (`id`, `level`, `source`, `meta`, `candidates()`).
    results: the task's records {candidate: record}; None or {} = no records (NO_FEEDBACK_KINDS only).
    naive_only: only `single` with the naive solution (the task world's heldout_styles tasks).
  """
  kinds = check_kinds(kinds)
  out, notes = _all_examples(task, results, check_reasoning(reasoning) == "plain", fit)
  if naive_only:
    out = [r for r in out if r["kind"] == "single" and r["target"] == "naive"]
  return [r for r in out if r["kind"] in kinds], notes


def _all_examples(task, results: dict[str, dict] | None,
                  plain: bool = False, fit: Fit = every_attempt) -> tuple[list[dict], list[str]]:
  record = functools.partial(_record, fit=fit)
  meta = task.meta
  cands = {c.name: c for c in task.candidates()}
  naive, opt = cands["naive"], cands["optimized"]
  solutions = [naive, opt] + [c for c in cands.values() if c.kind == "solution" and c not in (naive, opt)]
  out = [record(task, "single", [], [], reasoning_single(meta, c), c) for c in solutions]
  notes = ([] if results is None or results
           else [f"{task.id}: no evaluator records, {', '.join(NO_FEEDBACK_KINDS)} only"])
  broken = format_error_attempt(opt, reasoning_single(meta, opt))
  retry = reasoning_plain(meta, "no_kernel", opt) if plain else reasoning_retry(meta, broken.feedback, opt)
  out.append(record(task, "retry_format", [broken], ["format_error"], retry, opt))
  out.append(record(task, "format_twice", [broken, broken], ["format_error", "format_error"], retry, opt))
  if not results:
    return out, notes

  def attempt(c: suite.SuiteCandidate):
    r = results.get(c.name)
    if r is None or not r.get("feedback"):
      notes.append(f"{task.id}:{c.name}: no recorded feedback")
      return None, None
    if r.get("text_sha") and r["text_sha"] != text_sha(c.text):
      notes.append(f"{task.id}:{c.name}: the record is of another text; left out")
      return None, None
    if r["status"] != c.expect:
      notes.append(f"{task.id}:{c.name}: recorded status {r['status']} != label {c.expect}; left out")
      return None, None
    return prompts.Attempt(candidate_text=c.text, summary=c.summary, feedback=r["feedback"]), r

  naive_att, naive_res = attempt(naive)
  opt_att, opt_res = attempt(opt)
  opt_res = opt_res or {}
  if opt_att is not None and opt_res.get("speedup"):
    keep = reasoning_plain(meta, "fast", opt) if plain else reasoning_keep(meta, opt_res, opt)
    out.append(record(task, "keep_fast", [opt_att], ["optimized"], keep, opt))
    out.append(record(task, "fast_then_format", [opt_att, broken], ["optimized", "format_error"], retry, opt))
  faster = (naive_res is not None and opt_res.get("status") == "correct" and naive_res.get("speedup")
            and opt_res.get("speedup") and opt_res["speedup"] > naive_res["speedup"])
  speed = (reasoning_plain(meta, "slow", opt) if plain else reasoning_speed(meta, naive_res, opt)) if faster else ""
  if faster:
    out.append(record(task, "speed_up", [naive_att], ["naive"], speed, opt))
    stay = (reasoning_plain(meta, "slow", naive, plan="I keep it") if plain
            else reasoning_speed(meta, naive_res, naive, plan="I keep it"))
    out.append(record(task, "slow_again", [naive_att], ["naive"], stay, naive))
  wrongs = []  # (variant, its attempt, its recorded result) for the variants whose recorded status is their label.
  for c in cands.values():
    if c.kind != "variant":
      continue
    wrong_att, wrong_res = attempt(c)
    if wrong_att is not None:
      wrongs.append((c, wrong_att, wrong_res))
  for i, (c, wrong_att, wrong_res) in enumerate(wrongs):
    out.append(record(task, "first_wrong", [], [], reasoning_single(meta, c), c))
    fix = reasoning_plain(meta, "wrong", opt) if plain else reasoning_fix(meta, c, wrong_res["feedback"], opt)
    out.append(record(task, "fix_wrong", [wrong_att], [c.name], fix, opt))
    again = wrongs[(i + 1) % len(wrongs)][0]  # The next known-wrong variant (itself when it is the only one).
    fix_again = (reasoning_plain(meta, "wrong", again) if plain
                 else reasoning_fix(meta, c, wrong_res["feedback"], again))
    out.append(record(task, "wrong_again", [wrong_att], [c.name], fix_again, again))
    if faster:
      out.append(record(task, "fix_then_speed_up", [wrong_att, naive_att], [c.name, "naive"], speed, opt))
  return out, notes


def world_examples(world, task_ids: Iterable[str] | None, results: dict[str, dict[str, dict]] | None,
                   kinds=KINDS, reasoning: str = "quote", fit: Fit = every_attempt) -> tuple[list[dict], list[str]]:
  """The task world's corpus records (module docstring): every kind for `train` tasks, naive `single` only for
  `heldout_styles`, `single` for `heldout_compositions`; task_ids None = train + heldout_styles (the warm start).
  Ids of the bundled suite get the bundled corpus (suite_results.json)."""
  by_id = world.by_id()
  wanted = (list(task_ids) if task_ids is not None
            else [t.id for t in world.tasks if t.split in ("train", "heldout_styles")])
  records, notes = [], []
  suite_by_id = None
  unrecorded = 0
  for tid in wanted:
    task = by_id.get(tid)
    if task is None:
      suite_by_id = suite_by_id if suite_by_id is not None else {t.id: t for t in suite.load_suite()}
      if tid in suite_by_id:
        bundled = load_results(DEFAULT_RESULTS) if os.path.isfile(DEFAULT_RESULTS) else None
        recs, why = examples_for_task(suite_by_id[tid], None if bundled is None else bundled.get(tid, {}), kinds,
                                      reasoning, fit)
        records, notes = records + recs, notes + why
      continue
    mine = (results or {}).get(tid) or None
    unrecorded += mine is None and task.split == "train"
    if task.split == "heldout_compositions":
      recs, why = examples_for_task(task, None, ("single",), reasoning, fit)
    else:
      recs, why = examples_for_task(task, mine, kinds, reasoning, fit, naive_only=task.split == "heldout_styles")
    records, notes = records + recs, notes + why
  if unrecorded:
    notes.append(f"{unrecorded} train tasks without evaluator records: {', '.join(NO_FEEDBACK_KINDS)} only")
  return records, notes


def export(out_path: str, results_path: str | None, levels=None, split: str = "all",
           test_fraction: float = 0.25, seed: int = 0, kinds=KINDS, reasoning: str = "quote",
           source: str = "bundled") -> dict[str, int]:
  """Writes the corpus of a source (examples of the given kinds and reasoning style); returns the number of
  examples per kind. A generated source's `split`: 'train' (default: train + heldout_styles, the warm start)
  or 'all' (every split)."""
  results = load_results(results_path) if results_path else None
  notes: list[str] = []
  if tasks.is_generated(source):
    from kevin_jax.data.taskgen import world as world_lib  # pylint: disable=g-import-not-at-top
    w = world_lib.build(world_lib.WorldConfig.parse(source))
    ids = None if split == "train" else [t.id for t in w.tasks] + [t.id for t in suite.load_suite()]
    recs, notes = world_examples(w, ids, results, kinds, reasoning)
  else:
    suite_tasks = suite.load_suite(levels)
    if split != "all":
      train, test = tasks.split([t.spec for t in suite_tasks], test_fraction=test_fraction, seed=seed)
      keep = {s.id for s in (train if split == "train" else test)}
      suite_tasks = [t for t in suite_tasks if t.id in keep]
    recs = []
    for t in suite_tasks:
      r, why = examples_for_task(t, None if results is None else results.get(t.id, {}), kinds, reasoning)
      recs, notes = recs + r, notes + why
  counts: dict[str, int] = collections.Counter()
  with open(out_path, "w", encoding="utf-8") as f:
    for r in recs:
      f.write(json.dumps(r) + "\n")
      counts[r["kind"]] += 1
  for n in notes:
    print(f"note: {n}", file=sys.stderr)
  return dict(counts)


def main(argv: Iterable[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", required=True, help="output JSONL file")
  ap.add_argument("--source", default="bundled", help="'bundled' or 'generated[:SEED]' (the task world)")
  ap.add_argument("--results", default=None,
                  help="evaluator records with feedback (suite_results.json, world_results.json or a verify_suite "
                       "results.json); default: the source's committed file if present; '' = none")
  ap.add_argument("--levels", default="", help="comma-separated levels of the bundled suite (default: all)")
  ap.add_argument("--split", choices=("all", "train", "test"), default=None,
                  help="bundled: only this side of the suite's split (default all); generated: train (default: "
                       "train + heldout_styles, the warm start) or all")
  ap.add_argument("--kinds", default=",".join(KINDS),
                  help=f"comma-separated example kinds (default: {','.join(KINDS)}; 'all' = {','.join(ALL_KINDS)})")
  ap.add_argument("--reasoning", choices=REASONING_STYLES, default="quote",
                  help="later-turn reasoning style (module docstring)")
  a = ap.parse_args(list(argv) if argv is not None else None)
  generated = tasks.is_generated(a.source)
  if a.source != "bundled" and not generated:
    ap.error(f"--source must be 'bundled' or 'generated[:SEED]', got {a.source!r}")
  if a.results is None:
    default = WORLD_RESULTS if generated else DEFAULT_RESULTS
    a.results = default if os.path.isfile(default) else ""
  split = a.split or ("train" if generated else "all")
  if generated and split == "test":
    ap.error("a generated source's corpus splits are train and all")
  levels = [int(x) for x in a.levels.split(",") if x.strip()] or None
  kinds = ALL_KINDS if a.kinds == "all" else check_kinds(k for k in a.kinds.split(",") if k.strip())
  counts = export(a.out, a.results or None, levels, split, kinds=kinds, reasoning=a.reasoning, source=a.source)
  total = sum(counts.values())
  print(f"{total} examples -> {a.out}: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in kinds)
        + ("" if a.results else " (no records: " + ", ".join(NO_FEEDBACK_KINDS) + " only)"))
  return 0 if total else 1


if __name__ == "__main__":
  sys.exit(main())
