"""Rewards for rollouts: the GPU evaluator behind a process boundary, or a scripted reward for CPU tests.

`EvaluatorReward` runs `kevin_jax.kernels.evaluator.Evaluator` in a separate spawned process (which in turn
supervises the sandboxed GPU workers), so the learner process never imports torch or CuPy: only task ids,
candidate text and result dicts cross the pipe (tests/test_boundaries.py). Malformed responses
are scored 0 with a format-error feedback here, before any evaluation.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import traceback
from typing import Any, Mapping

from kevin_jax.rl.rollout import RewardItem, gate_format


class EvaluatorReward:
  """Scores responses with the CUDA evaluator, in a child process that owns the evaluator pool."""

  def __init__(self, evaluator_config: Mapping[str, Any], task_source: str, *, start_timeout_s: float = 600):
    ctx = mp.get_context("spawn")
    self._conn, child = ctx.Pipe()
    self._proc = ctx.Process(target=_serve, args=(child, dict(evaluator_config), task_source),
                             name="kevin-evaluator", daemon=False)
    self._proc.start()
    child.close()
    if not self._conn.poll(start_timeout_s):
      self.close()
      raise RuntimeError(f"the evaluator process did not start within {start_timeout_s:.0f} s")
    kind, payload = self._conn.recv()
    if kind != "ready":
      self.close()
      raise RuntimeError(f"the evaluator process failed to start:\n{payload}")

  def __call__(self, items: list[RewardItem]) -> list[dict]:
    return gate_format(items, self._evaluate)

  def _evaluate(self, items: list[RewardItem]) -> list[dict]:
    self._conn.send(("evaluate", [(it.task_id, it.parsed.candidate_text) for it in items]))
    kind, payload = self._conn.recv()
    if kind != "results":
      raise RuntimeError(f"the evaluator process failed:\n{payload}")
    return payload

  def close(self) -> None:
    if self._proc.is_alive():
      try:
        self._conn.send(("close", None))
      except (BrokenPipeError, OSError):
        pass
      self._proc.join(timeout=60)
      if self._proc.is_alive():
        self._proc.kill()
    self._conn.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def _serve(conn, evaluator_config: dict, task_source: str) -> None:
  """Child process: owns one Evaluator and answers batches until told to close."""
  try:
    from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig  # pylint: disable=g-import-not-at-top
    evaluator = Evaluator(EvaluatorConfig.from_config(evaluator_config), task_source=task_source)
  except Exception:  # pylint: disable=broad-except
    conn.send(("error", traceback.format_exc()))
    return
  conn.send(("ready", None))
  try:
    while True:
      kind, payload = conn.recv()
      if kind == "close":
        break
      try:
        results = evaluator.evaluate(payload)
        conn.send(("results", [r.to_dict() for r in results]))
      except Exception:  # pylint: disable=broad-except
        conn.send(("error", traceback.format_exc()))
  except EOFError:
    pass
  finally:
    evaluator.close()


class ScriptedReward:
  """A deterministic stand-in for the GPU evaluator (CPU tests of the RL loop).

  Every response gets a score that depends only on (task id, text): 'correct' with score 0.3 + speedup for
  about two thirds of texts, 'incorrect' with 0 otherwise. No format gate, so even a random tiny policy's
  responses produce varied scores and non-zero advantages.
  """

  def __call__(self, items: list[RewardItem]) -> list[dict]:
    return [self.score(it.task_id, it.response) for it in items]

  @staticmethod
  def score(task_id: str, text: str) -> dict:
    h = int.from_bytes(hashlib.sha256(f"{task_id}\x00{text}".encode()).digest()[:8], "little")
    if h % 3 == 0:
      return {"status": "incorrect", "score": 0.0, "speedup": 0.0,
              "feedback": "Incorrect: output 0 differs (scripted test reward)."}
    speedup = 0.5 + (h >> 8) % 1000 / 1000.0
    return {"status": "correct", "score": 0.3 + speedup, "speedup": speedup,
            "feedback": f"Correct, speedup {speedup:.2f}x (scripted test reward)."}
