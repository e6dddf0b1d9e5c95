"""Kevin's multi-turn rollouts: m trajectories x n refinement turns per task [P §1 "Multi-turn procedure"].

Each turn, every live (task, trajectory) pair gets a prompt built from the task and its earlier attempts
(kernel, summary, feedback; never earlier reasoning; oldest attempts dropped first to fit the context budget),
all prompts are sampled in one call, and all responses are scored in one reward call, so the evaluator pool sees
whole batches. Every turn becomes one training sample.

The policy and the reward are passed in as callables, so the same code runs with the JAX sampler and the GPU
evaluator in training, and with a tiny model and a scripted reward in CPU tests:

  generate(prompt_ids: list[list[int]], seed: int) -> Generation (tokens, text, logprobs, finish_reason per prompt)
  reward(items: list[RewardItem]) -> list[dict] with at least 'status', 'score', 'feedback' (and 'speedup')
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Protocol, Sequence

import numpy as np

from kevin_jax.rl import prompts


@dataclasses.dataclass
class Generation:
  """What a generate callable returns, one entry per prompt."""
  tokens: list[list[int]]
  text: list[str]
  logprobs: list[np.ndarray]  # log pi(token) per generated token, float32.
  finish_reason: list[str]  # 'eos' | 'stop' | 'length'.


@dataclasses.dataclass(frozen=True)
class RewardItem:
  task_id: str
  response: str  # The whole generated text.
  parsed: prompts.ParsedResponse


class RewardFn(Protocol):

  def __call__(self, items: list[RewardItem]) -> list[dict]:
    ...


@dataclasses.dataclass
class Turn:
  """One turn of one trajectory: a training sample and an inspection record."""
  task_id: str
  traj: int
  turn: int  # 0-based.
  prompt_ids: list[int]
  response_ids: list[int]
  logprobs: np.ndarray
  response: str
  parsed: prompts.ParsedResponse
  finish_reason: str
  result: dict
  attempts_dropped: int = 0  # Oldest earlier attempts left out of this turn's prompt to fit the budget.

  @property
  def score(self) -> float:
    return float(self.result.get("score", 0.0))

  def record(self, step: int) -> dict:
    """A JSON-able line for workdir/rollouts/*.jsonl."""
    return {"step": step, "task_id": self.task_id, "traj": self.traj, "turn": self.turn,
            "prompt_tokens": len(self.prompt_ids), "response_tokens": len(self.response_ids),
            "finish_reason": self.finish_reason, "attempts_dropped": self.attempts_dropped,
            "response": self.response, "result": self.result}


@dataclasses.dataclass
class RolloutTimes:
  generate_s: float = 0.0
  reward_s: float = 0.0
  generated_tokens: int = 0
  evaluations: int = 0


# Result flags (kernels/result.py) that mark a task-level problem, not the policy's: the evaluator or the task failed,
# or the task does not fit the GPU. Such turns never enter a return or an advantage (rl/batch.py).
TASK_LEVEL_FLAGS = ("evaluator_error", "task_too_large")


def task_level(result: dict) -> bool:
  """True when a turn's result is a task-level problem (TASK_LEVEL_FLAGS), not a verdict on the kernel."""
  return any(f in TASK_LEVEL_FLAGS for f in result.get("flags", ()))


def format_error_result(message: str) -> dict:
  return {"status": "format_error", "score": 0.0, "speedup": 0.0, "feedback": f"Format error: {message}"}


@dataclasses.dataclass
class Start:
  """Where a trajectory starts: a task and the attempts it has already made (empty for a fresh one)."""
  task_id: str
  history: list[prompts.Attempt] = dataclasses.field(default_factory=list)


def fresh_starts(task_ids: Sequence[str], trajectories: int) -> list[Start]:
  """m fresh trajectories per task, ordered task-major (trajectory index = task index * m + j)."""
  return [Start(task_id) for task_id in task_ids for _ in range(trajectories)]


def rollout(starts: Sequence[Start], task_sources: dict[str, str], *, turns: int,
            generate: Callable[[list[list[int]], int], Generation], reward: RewardFn,
            encode_chat: Callable[[list[dict]], list[int]], max_context_tokens: int, seed: int,
            feedback_max_chars: int = 2000) -> tuple[list[Turn], RolloutTimes]:
  """Runs every trajectory in `starts` for `turns` more turns.

  Args:
    starts: one entry per trajectory; its index is the trajectory's `traj` in the returned turns.
    task_sources: task id -> its PyTorch program text.
    turns: refinement turns to run.
    generate: samples responses for token-id prompts; the seed makes it deterministic.
    reward: scores a batch of responses (the evaluator, or a scripted reward in tests).
    encode_chat: chat messages -> prompt token ids (ending with the assistant generation prompt).
    max_context_tokens: prompt budget per turn.
    seed: this call's seed; each turn samples with a seed derived from (seed, turn).
    feedback_max_chars: feedback kept per earlier attempt in later prompts.
  Returns:
    All turns ordered by (trajectory, turn) — `Turn.turn` counts from the start's history length — and timings.
  """
  history = [list(s.history) for s in starts]
  out: list[Turn] = []
  times = RolloutTimes()
  last: dict[str, list[int]] = {}  # The most recent encoding: fit_messages' accepted try is the prompt itself.

  def count(messages):
    last["ids"] = encode_chat(messages)
    return len(last["ids"])

  for t in range(turns):
    prompt_ids, dropped = [], []
    for s, h in zip(starts, history):
      _, n_dropped = prompts.fit_messages(task_sources[s.task_id], h, count, max_context_tokens)
      prompt_ids.append(last["ids"])
      dropped.append(n_dropped)
    t0 = time.perf_counter()
    gen = generate(prompt_ids, _turn_seed(seed, t))
    times.generate_s += time.perf_counter() - t0
    times.generated_tokens += sum(len(x) for x in gen.tokens)
    parsed = [prompts.parse_response(text) for text in gen.text]
    t0 = time.perf_counter()
    results = reward([RewardItem(s.task_id, text, p) for s, text, p in zip(starts, gen.text, parsed)])
    times.reward_s += time.perf_counter() - t0
    times.evaluations += len(results)
    if len(results) != len(starts):
      raise RuntimeError(f"reward returned {len(results)} results for {len(starts)} responses")
    for k, s in enumerate(starts):
      result = results[k]
      out.append(Turn(task_id=s.task_id, traj=k, turn=len(history[k]), prompt_ids=prompt_ids[k],
                      response_ids=list(gen.tokens[k]), logprobs=np.asarray(gen.logprobs[k], np.float32),
                      response=gen.text[k], parsed=parsed[k], finish_reason=gen.finish_reason[k],
                      result=result, attempts_dropped=dropped[k]))
      history[k].append(prompts.Attempt(parsed[k].candidate_text, parsed[k].summary,
                                        str(result.get("feedback", ""))[:feedback_max_chars]))
  out.sort(key=lambda x: (x.traj, x.turn))
  return out, times


def _turn_seed(seed: int, turn: int) -> int:
  return (seed * 1009 + turn * 7919 + 1) % (2**31 - 1)


def gate_format(items: list[RewardItem], score_fn: Callable[[list[RewardItem]], list[dict]]) -> list[dict]:
  """Scores only well-formed responses; malformed ones get a format_error result without evaluation."""
  results: list[dict | None] = [None] * len(items)
  ok = [k for k, it in enumerate(items) if not it.parsed.error]
  for k, it in enumerate(items):
    if it.parsed.error:
      results[k] = format_error_result(it.parsed.error)
  if ok:
    for k, r in zip(ok, score_fn([items[k] for k in ok])):
      results[k] = r
  return results  # type: ignore[return-value]


def matrix_index(turns_list: Sequence[Turn]) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
  """(row, column) of every turn in the [trajectories, turns] layout, and that layout's shape.

  Rows follow sorted Turn.traj; columns count turns from each trajectory's first turn in `turns_list`.
  """
  trajs = sorted({x.traj for x in turns_list})
  row = {tr: r for r, tr in enumerate(trajs)}
  first: dict[int, int] = {}
  for x in turns_list:
    first[x.traj] = min(first.get(x.traj, x.turn), x.turn)
  rows = np.array([row[x.traj] for x in turns_list], np.int64)
  cols = np.array([x.turn - first[x.traj] for x in turns_list], np.int64)
  return rows, cols, (len(trajs), int(cols.max()) + 1)


def to_matrix(turns_list: Sequence[Turn], value: Callable[[Turn], float]) -> np.ndarray:
  """value(turn) laid out as [trajectories, turns] (see matrix_index)."""
  rows, cols, shape = matrix_index(turns_list)
  m = np.zeros(shape, np.float32)
  m[rows, cols] = [value(x) for x in turns_list]
  return m
