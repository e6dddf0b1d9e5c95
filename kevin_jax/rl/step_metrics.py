"""Per-step rollout metrics [P §3 monitors]: reward and correctness per turn, feedback shares, junk, speed."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kevin_jax.rl import kernel_metrics as km
from kevin_jax.rl.rollout import RolloutTimes, Turn, task_level, to_matrix

STATUSES = ("format_error", "compile_error", "runtime_error", "timeout", "incorrect", "correct")


def rollout_metrics(turns: Sequence[Turn], times: RolloutTimes, returns: np.ndarray,
                    advantages: np.ndarray, novelty_index: km.CorpusIndex | None = None) -> dict[str, float]:
  """Scalars for metrics.jsonl / TensorBoard, '/'-grouped (novelty/* given the warm-start corpus's index)."""
  scores = to_matrix(turns, lambda t: t.score)
  correct = to_matrix(turns, lambda t: float(t.result.get("status") == "correct"))
  out: dict[str, float] = {}
  for j in range(scores.shape[1]):
    out[f"reward/mean_turn{j + 1}"] = float(scores[:, j].mean())
    out[f"reward/max_turn{j + 1}"] = float(scores[:, j].max())
    out[f"correct/rate_turn{j + 1}"] = float(correct[:, j].mean())
  out["reward/mean"] = float(scores.mean())
  out["correct/rate"] = float(correct.mean())
  speedups = [float(t.result.get("speedup") or 0.0) for t in turns if t.result.get("status") == "correct"]
  out["speedup/mean_correct"] = float(np.mean(speedups)) if speedups else 0.0
  statuses = [str(t.result.get("status")) for t in turns]
  for s in STATUSES:
    out[f"feedback/{s}"] = statuses.count(s) / len(turns)
  # Evaluator errors and tasks too large for the GPU: left out of returns, advantages and the batch (rl/batch.py).
  out["rl/task_level_turns"] = float(sum(task_level(t.result) for t in turns))
  lengths = [len(t.response_ids) for t in turns]
  out["response/len_mean"] = float(np.mean(lengths))
  out["response/len_max"] = float(np.max(lengths))
  out["response/truncated"] = float(np.mean([t.finish_reason == "length" for t in turns]))
  out["response/prompt_len_mean"] = float(np.mean([len(t.prompt_ids) for t in turns]))
  out["response/attempts_dropped"] = float(np.mean([t.attempts_dropped for t in turns]))
  out["junk/not_okay_ratio"] = km.not_okay_ratio([t.parsed.reasoning for t in turns])
  out["junk/repeated_4gram_ratio"] = float(np.mean([km.repeated_ngram_ratio(t.response_ids) for t in turns]))
  out["rl/return_mean"] = float(np.mean(returns))
  out["rl/advantage_abs_mean"] = float(np.mean(np.abs(advantages)))
  out["time/generate_s"] = times.generate_s
  out["time/evaluate_s"] = times.reward_s
  out["speed/generate_tokens_per_s"] = times.generated_tokens / max(times.generate_s, 1e-9)
  out["speed/evaluations_per_s"] = times.evaluations / max(times.reward_s, 1e-9)
  out.update({f"evaluator/{k}": v for k, v in km.gpu_work(t.result for t in turns).items()})
  if novelty_index is not None:
    texts = [t.parsed.candidate_text for t in turns if t.result.get("status") == "correct"]
    out.update({f"novelty/{k}": v for k, v in km.novelty_summary(texts, novelty_index).items()})
  return out
