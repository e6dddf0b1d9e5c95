"""kevin_jax.rl.prompts: turn prompts, history truncation, response parsing."""

import pytest

from kevin_jax.rl import prompts

TASK = "import torch\nclass Model(torch.nn.Module):\n  def forward(self, x):\n    return torch.relu(x)\n"
CAND = "```cuda\nextern \"C\" __global__ void k(const float* x, float* y) {}\n```\n```plan\nlaunch k grid=(1,) block=(1,) args=(x, out)\n```"


def test_first_turn_has_task_format_example_and_instructions():
  msgs = prompts.build_messages(TASK)
  assert [m["role"] for m in msgs] == ["system", "user"]
  user = msgs[1]["content"]
  assert TASK.strip() in user
  assert "launch scale_add" in user  # The worked example (turn 1 only).
  assert "Launch plan, one statement per line" in user
  assert "<think>" in user and "Summary:" in user
  assert "previous attempts" not in user


def test_later_turns_show_history_without_reasoning_or_example():
  attempts = [prompts.Attempt(CAND, "naive relu", "compile_error: expected a ';'"),
              prompts.Attempt(CAND, "fixed", "correct, speedup 0.80x: can be made faster")]
  user = prompts.build_user_prompt(TASK, attempts)
  assert "launch scale_add" not in user  # Example dropped after turn 1 (paper App. D).
  assert "Launch plan, one statement per line" in user  # Rules kept.
  assert user.index("### Attempt 1") < user.index("### Attempt 2")
  assert "Feedback: compile_error: expected a ';'" in user
  assert "Summary: fixed" in user
  assert user.rstrip().endswith("or make the kernel faster if it was correct.")


def test_fit_messages_drops_oldest_first_and_keeps_numbers():
  attempts = [prompts.Attempt(CAND, f"s{i}", "x" * 400) for i in range(4)]
  count = lambda msgs: sum(len(m["content"]) for m in msgs)
  full = count(prompts.build_messages(TASK, attempts))
  one_less = count(prompts.build_messages(TASK, attempts[1:], first_index=2))
  msgs, dropped = prompts.fit_messages(TASK, attempts, count, one_less)
  assert dropped == 1 and one_less < full
  user = msgs[1]["content"]
  assert "### Attempt 1" not in user and "### Attempt 2" in user and "### Attempt 4" in user
  msgs, dropped = prompts.fit_messages(TASK, attempts, count, 10)  # Nothing fits: bare task.
  assert dropped == 4 and "### Attempt" not in msgs[1]["content"]


def test_parse_round_trip():
  text = prompts.format_response("Okay, relu is elementwise.", CAND, "One thread per element.")
  r = prompts.parse_response(text)
  assert r.error == ""
  assert r.reasoning == "Okay, relu is elementwise."
  assert r.candidate_text == CAND
  assert r.summary == "One thread per element."
  assert prompts.opens_as_expected(r.reasoning)
  with pytest.raises(ValueError, match="must not contain"):
    prompts.format_response("Okay, it ended inside the reasoning (no </think>).", CAND, "s")


def test_parse_malformed():
  r = prompts.parse_response("<think>\nOkay, let me think forever")
  assert r.error.startswith("the response ended inside the reasoning")
  assert r.candidate_text == ""
  r = prompts.parse_response("<think>Hmm.</think>\nI give up.")
  assert "no ```cuda" in r.error and r.reasoning == "Hmm."
  assert not prompts.opens_as_expected(r.reasoning)
  r = prompts.parse_response(CAND + "\nSummary: no think block")
  assert r.error == "" and r.reasoning == "" and r.summary == "no think block"
