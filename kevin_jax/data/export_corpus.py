"""Export the bundled suite as a supervised warm-start corpus in the policy's prompt and response format.

  python -m kevin_jax.data.export_corpus --out corpus.jsonl [--results kevin_jax/data/suite_results.json]

One JSON object per line (the format kevin_jax/rl/sft_data.py reads): `messages` (system + user, from
rl/prompts.build_messages), `response` (rl/prompts.format_response: reasoning, candidate blocks, summary) and
metadata (task_id, kind, quality, target, attempts, level). Examples, per task (the default `kinds`; the RL job's
warm start uses every kind, ALL_KINDS, with plain reasoning: configs/multiturn.py sft.corpus_kinds):

  single            turn 1: the task alone -> a correct solution (naive and optimized)
  fix_wrong         turn 2: a known-wrong variant + its evaluator feedback -> the optimized solution
  speed_up          turn 2: the naive solution + its feedback ("Correct ... speedup 0.4x") -> the optimized one,
                    when the results show the optimized one is faster
  fix_then_speed_up turn 3: a wrong variant, then the naive solution, each with feedback -> the optimized one

Opt-in kinds (`kinds=ALL_KINDS`, config sft.corpus_kinds) for the later-turn prompts that rollouts produce and the
four above never show (README "Results", 2026-12-02: after a format error, 89-96 % of next turns were format
errors again):
  retry_format      turn 2: a response that ended inside its reasoning -> the optimized solution
  keep_fast         turn 2: the optimized solution + its feedback (correct, its speedup) -> the optimized one again
  fast_then_format  turn 3: the optimized solution, then a response that ended inside its reasoning -> optimized
  format_twice      turn 3: two responses that ended inside their reasoning -> the optimized solution
Opt-in kind for a first turn that is a genuine mixture (issue 8: "correct-slow, correct-fast and wrong attempts"):
  first_wrong       turn 1: the task alone -> a known-wrong variant, with the same style of reasoning as `single`
                    (the task, then the variant's plan), one example per variant whose recorded status is its
                    label; with `single` the first turn is then naive : optimized : wrong = 1 : 1 : (2 or 3)
                    per task. `fix_wrong` and `fix_then_speed_up` teach what follows it.
Opt-in kinds for later turns that are a genuine mixture as well (issue 8): without them every later-turn target
is the optimized solution, so the warm start already acts on feedback as well as it can, and RL has only the first
turn left to improve. Each pairs 1 : 1 with the kind that acts on the same feedback:
  slow_again        turn 2: the naive solution + its feedback -> the naive solution again (with `speed_up`)
  wrong_again       turn 2: a known-wrong variant + its feedback -> the next known-wrong variant of the task (itself
                    when it is the only one) (with `fix_wrong`)
The format-error attempt is built by the rollout's own code (prompts.parse_response, rollout.format_error_result)
from a response cut inside its reasoning: its prompt is the one a rollout shows after any such response, whatever
text preceded the cut.

Feedback is the evaluator's real text from a verification run (experiments/verify_suite.py --update-meta writes
kevin_jax/data/suite_results.json; a results.json of a run works too). Attempts whose recorded status differs
from their label are left out, and without a results file only `single` examples are written: feedback is
never invented. Reasoning is short and task-specific and opens with "Okay," (QwQ's habit, which the RL monitors
check). Two reasoning styles for the later-turn examples (`reasoning=`, config sft.corpus_reasoning):
  quote   (default) quotes the previous feedback's first line and timings and names the wrong variant's bug;
  plain   says only what kind of outcome the previous attempt had (wrong, slower than it can be, fastest, no
          kernel), then the task and the plan: nothing a rollout's reasoning would have to copy from its prompt
          or know about a kernel it wrote (README "Results", 2026-12-02: the warm start's later-turn responses
          derail into word salad where their reasoning starts quoting the feedback).
Pure text: no torch, no JAX.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import sys
from typing import Any, Callable, Iterable, Sequence

from kevin_jax.kernels import suite, tasks
from kevin_jax.rl import prompts
from kevin_jax.rl import rollout

DEFAULT_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite_results.json")
KINDS = ("single", "fix_wrong", "speed_up", "fix_then_speed_up")  # This CLI's default (the job's until 2026-12-03).
LATER_TURN_KINDS = ("retry_format", "keep_fast", "fast_then_format", "format_twice")  # Opt-in (docstring).
WRONG_TARGET_KINDS = ("first_wrong",)  # Opt-in (docstring): a wrong kernel as the first turn's target.
FIRST_TURN_MIXTURE = KINDS + LATER_TURN_KINDS + WRONG_TARGET_KINDS  # The job's warm start 2026-12-03 (11th session).
LATER_MIXTURE_KINDS = ("slow_again", "wrong_again")  # Opt-in (docstring): feedback not acted on.
ALL_KINDS = FIRST_TURN_MIXTURE + LATER_MIXTURE_KINDS
REASONING_STYLES = ("quote", "plain")  # Module docstring.


def check_kinds(kinds) -> tuple[str, ...]:
  kinds = tuple(kinds)
  unknown = [k for k in kinds if k not in ALL_KINDS]
  if unknown or not kinds:
    raise ValueError(f"corpus kinds {list(kinds)}: unknown {unknown or 'none given'}; known: {', '.join(ALL_KINDS)}")
  return kinds


def load_results(path: str) -> dict[str, dict[str, dict]]:
  """{task_id: {candidate: {status, speedup, ref_time_ms, cand_time_ms, feedback}}} from suite_results.json
  (compact) or a verify_suite results.json (full rows)."""
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  if isinstance(data.get("results"), dict):
    return data["results"]
  out: dict[str, dict[str, dict]] = collections.defaultdict(dict)
  for row in data.get("results", []):
    r = row["result"]
    out[row["task_id"]][row["candidate"]] = {k: r.get(k) for k in ("status", "speedup", "ref_time_ms",
                                                                    "cand_time_ms", "feedback")}
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


def _record(task: suite.SuiteTask, kind: str, attempts: list[prompts.Attempt], names: list[str],
            reasoning: str, target: suite.SuiteCandidate, fit: Fit = every_attempt) -> dict[str, Any]:
  messages, dropped = fit(task.spec.source, attempts)
  return {"messages": messages,
          "response": prompts.format_response(reasoning, target.text, target.summary),
          "task_id": task.id, "level": task.level, "kind": kind,
          "quality": "correct" if target.expect == "correct" else "wrong", "target": target.name,
          "attempts": names, "attempts_dropped": dropped, "turn": len(attempts) + 1}


def check_reasoning(reasoning: str) -> str:
  if reasoning not in REASONING_STYLES:
    raise ValueError(f"reasoning style {reasoning!r}: known: {', '.join(REASONING_STYLES)}")
  return reasoning


def examples_for_task(task: suite.SuiteTask, results: dict[str, dict] | None,
                      kinds=KINDS, reasoning: str = "quote", fit: Fit = every_attempt) -> tuple[list[dict], list[str]]:
  """The corpus records of one task (of the given kinds, later-turn reasoning in the given style, prompts built by
  `fit`) and the notes on what was left out (status != label, no results)."""
  kinds = check_kinds(kinds)
  out, notes = _all_examples(task, results, check_reasoning(reasoning) == "plain", fit)
  return [r for r in out if r["kind"] in kinds], notes


def _all_examples(task: suite.SuiteTask, results: dict[str, dict] | None,
                  plain: bool = False, fit: Fit = every_attempt) -> tuple[list[dict], list[str]]:
  record = functools.partial(_record, fit=fit)
  meta = task.meta
  cands = {c.name: c for c in task.candidates()}
  naive, opt = cands["naive"], cands["optimized"]
  out = [record(task, "single", [], [], reasoning_single(meta, c), c) for c in (naive, opt)]
  notes = []
  if results is None:
    return out, []
  if not results:
    return out, [f"{task.id}: no evaluator results, single-turn examples only"]
  broken = format_error_attempt(opt, reasoning_single(meta, opt))
  retry = reasoning_plain(meta, "no_kernel", opt) if plain else reasoning_retry(meta, broken.feedback, opt)
  out.append(record(task, "retry_format", [broken], ["format_error"], retry, opt))
  out.append(record(task, "format_twice", [broken, broken], ["format_error", "format_error"], retry, opt))

  def attempt(c: suite.SuiteCandidate):
    r = results.get(c.name)
    if r is None or not r.get("feedback"):
      notes.append(f"{task.id}:{c.name}: no recorded feedback")
      return None, None
    if r["status"] != c.expect:
      notes.append(f"{task.id}:{c.name}: recorded status {r['status']} != label {c.expect}; left out")
      return None, None
    return prompts.Attempt(candidate_text=c.text, summary=c.summary, feedback=r["feedback"]), r

  naive_att, naive_res = attempt(naive)
  opt_res = results.get("optimized") or {}
  if opt_res.get("feedback") and opt_res.get("status") == opt.expect == "correct" and opt_res.get("speedup"):
    opt_att = prompts.Attempt(candidate_text=opt.text, summary=opt.summary, feedback=opt_res["feedback"])
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


def export(out_path: str, results_path: str | None, levels=None, split: str = "all",
           test_fraction: float = 0.25, seed: int = 0, kinds=KINDS, reasoning: str = "quote") -> dict[str, int]:
  """Writes the corpus (examples of the given kinds and reasoning style); returns the number of examples per
  kind."""
  results = load_results(results_path) if results_path else None
  suite_tasks = suite.load_suite(levels)
  if split != "all":
    train, test = tasks.split([t.spec for t in suite_tasks], test_fraction=test_fraction, seed=seed)
    keep = {s.id for s in (train if split == "train" else test)}
    suite_tasks = [t for t in suite_tasks if t.id in keep]
  counts: dict[str, int] = collections.Counter()
  notes: list[str] = []
  with open(out_path, "w", encoding="utf-8") as f:
    for t in suite_tasks:
      recs, why = examples_for_task(t, None if results is None else results.get(t.id, {}), kinds, reasoning)
      notes += why
      for r in recs:
        f.write(json.dumps(r) + "\n")
        counts[r["kind"]] += 1
  for n in notes:
    print(f"note: {n}", file=sys.stderr)
  return dict(counts)


def main(argv: Iterable[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", required=True, help="output JSONL file")
  ap.add_argument("--results", default=DEFAULT_RESULTS if os.path.isfile(DEFAULT_RESULTS) else "",
                  help="evaluator results with feedback (suite_results.json or a verify_suite results.json); "
                       "'' = single-turn examples only")
  ap.add_argument("--levels", default="", help="comma-separated levels (default: all)")
  ap.add_argument("--split", choices=("all", "train", "test"), default="all",
                  help="only the tasks of this side of the bundled split (config.tasks defaults)")
  ap.add_argument("--kinds", default=",".join(KINDS),
                  help=f"comma-separated example kinds (default: {','.join(KINDS)}; 'all' = {','.join(ALL_KINDS)})")
  ap.add_argument("--reasoning", choices=REASONING_STYLES, default="quote",
                  help="later-turn reasoning style (module docstring)")
  a = ap.parse_args(list(argv) if argv is not None else None)
  levels = [int(x) for x in a.levels.split(",") if x.strip()] or None
  kinds = ALL_KINDS if a.kinds == "all" else check_kinds(k for k in a.kinds.split(",") if k.strip())
  counts = export(a.out, a.results or None, levels, a.split, kinds=kinds, reasoning=a.reasoning)
  total = sum(counts.values())
  print(f"{total} examples -> {a.out}: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in kinds)
        + ("" if a.results else " (no results file: single-turn only)"))
  return 0 if total else 1


if __name__ == "__main__":
  sys.exit(main())
