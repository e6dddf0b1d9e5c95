"""Kevin's per-turn prompts and the policy's response format (paper App. D, adapted to our candidate format).

A response is:

    <think>
    Okay, ...reasoning...
    </think>
    ```cuda
    ...device code...
    ```
    ```plan
    ...launch plan...
    ```
    Summary: one or a few sentences on what this kernel does and why.

Turn 1's prompt holds the task's PyTorch program, the candidate format with one worked example, and the
instructions. Turn t > 1 holds the same task (format rules without the example, as the paper drops its one-shot
example after turn 1) and, for every earlier turn, its kernel, its summary and its evaluator feedback; earlier
reasoning is never shown. When the prompt would exceed the context budget, the oldest attempts go first.

Pure text: no JAX, no torch; shared by the rollout, the corpus export and the evaluation runs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Callable, Sequence

_FORMAT_MD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels", "FORMAT.md")

SYSTEM = ("You are an expert CUDA performance engineer. You replace PyTorch programs with faster custom CUDA "
          "kernels that compute exactly the same result.")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
EXPECTED_OPENING = "Okay,"  # QwQ's chains of thought open this way; the "not okay" ratio monitors drift [P §3].


@dataclasses.dataclass(frozen=True)
class Attempt:
  """One earlier turn as later turns see it: never its reasoning."""
  candidate_text: str  # The ```cuda and ```plan blocks as the policy wrote them.
  summary: str
  feedback: str  # The evaluator's one feedback message for this attempt.


@dataclasses.dataclass(frozen=True)
class ParsedResponse:
  reasoning: str  # Text inside <think>...</think> ('' if none).
  candidate_text: str  # The answer after the reasoning, minus the summary: what the evaluator parses.
  summary: str
  error: str  # '' if well-formed; otherwise a short format-error message for the feedback.


@functools.lru_cache(maxsize=None)
def _format_sections() -> tuple[str, str]:
  """(rules with the worked example, rules without it) from kernels/FORMAT.md's prompt section."""
  with open(_FORMAT_MD, encoding="utf-8") as f:
    text = f.read()
  m = re.search(r"<!-- prompt:begin -->\n(.*?)<!-- prompt:end -->", text, re.S)
  if not m:
    raise RuntimeError(f"{_FORMAT_MD} lacks its <!-- prompt:begin/end --> section")
  section = m.group(1)
  with_example = re.sub(r"<!-- example:(begin|end) -->\n", "", section).strip()
  without_example = re.sub(r"<!-- example:begin -->.*?<!-- example:end -->\n", "", section, flags=re.S).strip()
  return with_example, without_example


def format_doc(with_example: bool = True) -> str:
  return _format_sections()[0 if with_example else 1]


_INSTRUCTIONS = (
    "Write CUDA kernels that replace the whole computation of `Model.forward` above and run faster than "
    "PyTorch eager on an NVIDIA H200 (sm_90), with identical results (fp32, atol = rtol = 1e-4).\n"
    "First think step by step inside <think> ... </think>. Then give the ```cuda block and the ```plan block, "
    "and end with one line `Summary: ...` of a few sentences describing your kernel and its optimisations.")


def render_attempt(index: int, attempt: Attempt) -> str:
  return (f"### Attempt {index}\n{attempt.candidate_text.strip()}\n"
          f"Summary: {attempt.summary.strip() or '(none)'}\n"
          f"Feedback: {attempt.feedback.strip()}")


def build_user_prompt(task_source: str, attempts: Sequence[Attempt] = (), *, first_index: int = 1) -> str:
  """The user message for a turn, given the earlier attempts (oldest first, numbered from `first_index`)."""
  parts = ["You are given this PyTorch program (KernelBench format):", f"```python\n{task_source.strip()}\n```",
           format_doc(with_example=not attempts), _INSTRUCTIONS]
  if attempts:
    parts.append("Your previous attempts, oldest first, each with the evaluator's feedback:")
    parts += [render_attempt(first_index + i, a) for i, a in enumerate(attempts)]
    parts.append("Restart your reasoning from scratch and write a new, complete answer: fix the problems the "
                 "feedback names, or make the kernel faster if it was correct.")
  return "\n\n".join(parts)


def build_messages(task_source: str, attempts: Sequence[Attempt] = (), *,
                   first_index: int = 1) -> list[dict[str, str]]:
  """Chat messages for a turn: system + user."""
  return [{"role": "system", "content": SYSTEM},
          {"role": "user", "content": build_user_prompt(task_source, attempts, first_index=first_index)}]


def fit_messages(task_source: str, attempts: Sequence[Attempt], count_tokens: Callable[[list], int],
                 max_tokens: int) -> tuple[list[dict[str, str]], int]:
  """The messages for a turn within `max_tokens`, dropping the oldest attempts first.

  Kept attempts keep their original numbers ("Attempt 3" stays 3). Returns (messages, attempts dropped);
  when even the bare task does not fit, the bare task is returned with every attempt dropped (the caller
  decides whether an over-long prompt is an error). The returned messages are always the last ones passed to
  `count_tokens`, so a caller may keep that call's tokenisation instead of encoding again.
  """
  for start in range(len(attempts) + 1):
    messages = build_messages(task_source, attempts[start:], first_index=start + 1)
    if count_tokens(messages) <= max_tokens:
      return messages, start
  return messages, len(attempts)


def format_response(reasoning: str, candidate_text: str, summary: str) -> str:
  """A well-formed response (used for the warm-start corpus and tests). Reasoning holding a think tag would close
  (or reopen) the reasoning early, so parse_response would not give it back: a ValueError."""
  if THINK_OPEN in reasoning or THINK_CLOSE in reasoning:
    raise ValueError(f"reasoning must not contain {THINK_OPEN} or {THINK_CLOSE}: {reasoning[:200]!r}")
  return (f"{THINK_OPEN}\n{reasoning.strip()}\n{THINK_CLOSE}\n{candidate_text.strip()}\n"
          f"Summary: {summary.strip()}")


_SUMMARY = re.compile(r"^\s*Summary:\s*(.*)\Z", re.S | re.M)


def parse_response(text: str) -> ParsedResponse:
  """Splits a response into reasoning, candidate text and summary; malformed ones carry an error message."""
  reasoning, answer = "", text
  close = text.find(THINK_CLOSE)
  if close >= 0:
    head = text[:close]
    open_at = head.find(THINK_OPEN)
    reasoning = head[open_at + len(THINK_OPEN):] if open_at >= 0 else head
    answer = text[close + len(THINK_CLOSE):]
  elif THINK_OPEN in text:
    return ParsedResponse(text.split(THINK_OPEN, 1)[1].strip(), "", "",
                          "the response ended inside the reasoning (no </think>), so no kernel was given")
  # The summary is everything after the last closing fence that starts with "Summary:".
  last_fence = answer.rfind("```")
  summary = ""
  if last_fence >= 0:
    tail = answer[last_fence + 3:]
    m = _SUMMARY.search(tail)
    if m:
      summary = m.group(1).strip()
      answer = answer[:last_fence + 3] + tail[:m.start()]
  candidate = answer.strip()
  if "```" not in candidate:
    return ParsedResponse(reasoning.strip(), candidate, summary,
                          "no ```cuda and ```plan code blocks after the reasoning")
  return ParsedResponse(reasoning.strip(), candidate, summary, "")


def opens_as_expected(reasoning: str) -> bool:
  """The paper's junk monitor: does the chain of thought open with 'Okay,'?"""
  return reasoning.lstrip().startswith(EXPECTED_OPENING)
