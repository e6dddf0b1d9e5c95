"""experiments/sample_diversity.py: which suite design a sampled response is, and the per-temperature figures."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))

import sample_diversity as sd  # pylint: disable=g-import-not-at-top,wrong-import-position
from kevin_jax.kernels import suite  # pylint: disable=wrong-import-position
from kevin_jax.rl import prompts  # pylint: disable=wrong-import-position

TASK = "level1/01_ReLU"


def _designs():
  task = {t.id: t for t in suite.load_suite()}[TASK]
  cands = {c.name: c for c in task.candidates()}
  return cands, {sd.candidate_key(c.text): c.name for c in cands.values()}


def _response(text: str) -> str:
  return prompts.format_response("Plan: one thread per element.", text, "a ReLU kernel")


def test_classify_names_the_suite_candidate_by_both_blocks():
  cands, designs = _designs()
  assert sd.classify(_response(cands["naive"].text), designs) == (True, "naive")
  assert sd.classify(_response(cands["optimized"].text), designs) == (True, "optimized")
  # wrong_boundary has the naive kernel and a grid that rounds down: only its plan tells them apart.
  wrong = cands["wrong_boundary"].text
  assert sd.candidate_key(wrong).split(" | ")[0] == sd.candidate_key(cands["naive"].text).split(" | ")[0]
  assert sd.classify(_response(wrong), designs) == (True, "wrong_boundary")


def test_classify_novel_and_malformed():
  cands, designs = _designs()
  edited = cands["naive"].text.replace("0.0f", "0.f", 1)
  assert edited != cands["naive"].text
  assert sd.classify(_response(edited), designs) == (True, "novel")
  assert sd.classify("<think>\nOkay, the task: ReLU over", designs) == (False, "malformed")  # No </think>.
  no_plan = cands["naive"].text.split("```plan")[0]
  assert sd.classify(_response(no_plan), designs) == (False, "malformed")


def test_summarize_counts_distinct_formed_and_designs():
  cands, designs = _designs()
  naive, fast = _response(cands["naive"].text), _response(cands["optimized"].text)
  per_task = {TASK: [naive, naive, fast, "<think>\nno end"]}
  out = sd.summarize(per_task, {TASK: designs})
  assert out["distinct"] == 3 / 4
  assert out["well_formed"] == 3 / 4
  assert out["designs"] == {"malformed": 0.25, "naive": 0.5, "optimized": 0.25}
  # wrong_* variants are pooled as "wrong"; over two tasks, distinct is the mean of their shares.
  out = sd.summarize({TASK: [naive, naive], "b": [_response(cands["wrong_boundary"].text)] * 2},
                     {TASK: designs, "b": designs})
  assert out["distinct"] == 0.5 and out["designs"] == {"naive": 0.5, "wrong": 0.5}


def test_candidate_key_ignores_comments_not_code():
  cands, _ = _designs()
  text = cands["naive"].text
  commented = text.replace("```cuda\n", "```cuda\n/* a block\n comment */ // and a line\n", 1).replace(
      "```plan\n", "```plan\n# the launch\n", 1)
  assert commented != text and sd.candidate_key(commented) == sd.candidate_key(text)
  assert sd.candidate_key(text.replace("0.0f", "1.0f", 1)) != sd.candidate_key(text)
