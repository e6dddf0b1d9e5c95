"""kevin_jax.rl.rollout with a fake policy and scripted rewards: prompts, history, truncation, ordering."""

import numpy as np

from kevin_jax.rl import prompts
from kevin_jax.rl import rollout as ro
from kevin_jax.rl.reward import ScriptedReward

SOURCES = {"a": "class Model: pass  # task a", "b": "class Model: pass  # task b"}
CAND = "```cuda\nextern \"C\" __global__ void k(float* y) {}\n```\n```plan\nlaunch k grid=(1,) block=(1,) args=(out,)\n```"


def encode_chat(messages):
  # One "token" per character of the user message: enough to exercise the budget logic.
  return [ord(c) % 256 for c in messages[-1]["content"]]


class FakePolicy:
  """Answers well-formed responses whose summary names the call; records the prompts it saw."""

  def __init__(self):
    self.prompts = []

  def __call__(self, prompt_ids, seed):
    self.prompts.append(["".join(map(chr, p)) for p in prompt_ids])
    texts = [prompts.format_response(f"Okay, try {seed}-{k}", CAND, f"attempt s{seed} k{k}")
             for k in range(len(prompt_ids))]
    return ro.Generation(tokens=[[1, 2, 3]] * len(texts), text=texts,
                         logprobs=[np.array([-0.5, -0.25, -0.125])] * len(texts),
                         finish_reason=["eos"] * len(texts))


def test_multi_turn_history_and_order():
  policy = FakePolicy()
  feedback = iter(range(1000))

  def reward(items):
    return [{"status": "correct", "score": 1.0, "speedup": 0.7, "feedback": f"fb{next(feedback)}"}
            for _ in items]

  starts = ro.fresh_starts(["a", "b"], trajectories=2)
  turns, times = ro.rollout(starts, SOURCES, turns=3, generate=policy, reward=reward,
                            encode_chat=encode_chat, max_context_tokens=10**6, seed=5)
  assert len(turns) == 2 * 2 * 3
  assert [(t.traj, t.turn) for t in turns] == [(i, j) for i in range(4) for j in range(3)]
  assert [t.task_id for t in turns[::3]] == ["a", "a", "b", "b"]
  # Turn 3 of trajectory 0 shows attempts 1 and 2 with their feedback, and no earlier reasoning.
  p = policy.prompts[2][0]
  assert "### Attempt 1" in p and "### Attempt 2" in p and "### Attempt 3" not in p
  assert "Feedback: fb0" in p and "Feedback: fb4" in p
  assert "Okay, try" not in p and "task a" in p
  assert times.evaluations == 12 and times.generated_tokens == 36
  np.testing.assert_allclose(ro.to_matrix(turns, lambda t: t.score), np.ones((4, 3)))


def test_context_budget_drops_oldest_attempts():
  policy = FakePolicy()
  reward = lambda items: [{"status": "incorrect", "score": 0.0, "feedback": "x" * 300} for _ in items]
  bare = len(encode_chat(prompts.build_messages(SOURCES["a"], [prompts.Attempt(CAND, "s", "x" * 300)])))
  turns, _ = ro.rollout(ro.fresh_starts(["a"], 1), SOURCES, turns=4, generate=policy, reward=reward,
                        encode_chat=encode_chat, max_context_tokens=bare + 50, seed=0)
  # Only one earlier attempt fits: turn 3 drops attempt 1, turn 4 drops attempts 1-2.
  assert [t.attempts_dropped for t in turns] == [0, 0, 1, 2]
  assert "### Attempt 3" in policy.prompts[3][0] and "### Attempt 2" not in policy.prompts[3][0]


def test_format_gate_and_scripted_reward():
  bad = prompts.parse_response("<think>never closed")
  good = prompts.parse_response(prompts.format_response("Okay,", CAND, "s"))
  items = [ro.RewardItem("a", "<think>never closed", bad), ro.RewardItem("a", "ok", good)]
  seen = []
  results = ro.gate_format(items, lambda its: seen.extend(its) or [{"status": "correct", "score": 1.3}])
  assert results[0]["status"] == "format_error" and results[0]["score"] == 0.0
  assert "no </think>" in results[0]["feedback"]
  assert results[1] == {"status": "correct", "score": 1.3} and len(seen) == 1
  s1 = ScriptedReward.score("a", "text one")
  assert s1 == ScriptedReward.score("a", "text one")  # Deterministic.
  scores = {ScriptedReward.score("a", f"t{i}")["status"] for i in range(30)}
  assert scores == {"correct", "incorrect"}


def test_continuing_from_history_numbers_turns():
  policy = FakePolicy()
  reward = lambda items: [{"status": "correct", "score": 0.5, "feedback": "ok"} for _ in items]
  hist = [prompts.Attempt(CAND, "earlier", "old feedback")] * 2
  turns, _ = ro.rollout([ro.Start("b", hist)], SOURCES, turns=1, generate=policy, reward=reward,
                        encode_chat=encode_chat, max_context_tokens=10**6, seed=1)
  assert turns[0].turn == 2 and "### Attempt 2" in policy.prompts[0][0]


def test_seq_bucket_ladder_bounds_padding_and_compiles():
  from kevin_jax.rl.batch import seq_bucket  # pylint: disable=g-import-not-at-top
  assert [seq_bucket(n) for n in (1, 256, 257, 385, 513, 1025, 4097, 6145)] == [
      256, 256, 384, 512, 768, 1536, 6144, 8192]
  sizes = {seq_bucket(n) for n in range(1, 16385)}
  assert len(sizes) == 13  # 256 ... 16384: a handful of learner compiles for any RL run.
  assert all(seq_bucket(n) < 1.5 * n + 1 for n in range(256, 16385))  # At most 50% padding.
