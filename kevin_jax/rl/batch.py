"""Rollout turns -> returns, per-task advantages, and the learner's TrainBatch [P §1 steps 4-5, §2].

Every turn is one training sample: its prompt (task, earlier kernels, summaries, feedback) is context only, its
response tokens are trained with the turn's advantage. Returns are discounted over a trajectory's later turns
and advantages normalised over all m*n turn-samples of the same task. Turns whose result is a task-level problem
(rollout.task_level: an evaluator error, a task too large for the GPU) are left out: they add nothing to earlier
turns' returns, enter no group's mean or std, get advantage 0, and `trainable` drops them from the batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kevin_jax.rl import grpo
from kevin_jax.rl.learner import TrainBatch, pad_batch
from kevin_jax.rl.rollout import Turn, matrix_index, task_level, to_matrix


def turn_advantages(turns: Sequence[Turn], cfg: grpo.GRPOConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(returns, advantages), one value per turn in `turns` order.

  Trajectories are grouped by task id; returns use `cfg.gamma`/`cfg.return_mode`, advantages
  `cfg.adv_std_normalize`/`cfg.adv_baseline` over every turn-sample of the task (per task and turn with
  `adv_baseline='trloo'`: grpo.advantage_groups), then `cfg.negative_scale`.
  With `cfg.shuffle_advantages` (a null control) the advantages are then permuted across all turns (`seed`).
  Task-level turns (module docstring) get return 0 and advantage 0 and change no other turn's values.
  """
  rows, cols, shape = matrix_index(turns)
  scores_NxT = to_matrix(turns, lambda t: t.score)
  valid_NxT = np.zeros(shape, bool)
  valid_NxT[rows, cols] = [not task_level(t.result) for t in turns]
  returns_NxT = np.asarray(grpo.discounted_returns(scores_NxT, cfg.gamma, cfg.return_mode, valid_NxT=valid_NxT))
  task_index = {tid: i for i, tid in enumerate(dict.fromkeys(t.task_id for t in turns))}
  groups_NxT, num_groups = grpo.advantage_groups(to_matrix(turns, lambda t: task_index[t.task_id]), valid_NxT,
                                                 len(task_index), per_turn=cfg.adv_baseline == "trloo")
  baseline = "leave_one_out" if cfg.adv_baseline == "trloo" else cfg.adv_baseline
  adv_NxT = np.asarray(grpo.group_advantages(returns_NxT, groups_NxT, std_normalize=cfg.adv_std_normalize,
                                             baseline=baseline, eps=cfg.adv_eps, num_groups=num_groups))
  adv_NxT = np.asarray(grpo.scale_negatives(adv_NxT, cfg.negative_scale))
  advantages = adv_NxT[rows, cols].astype(np.float32)
  if cfg.shuffle_advantages:
    trained = valid_NxT[rows, cols]
    advantages[trained] = np.random.default_rng(seed).permutation(advantages[trained])
  return returns_NxT[rows, cols].astype(np.float32), advantages


def trainable(turns: Sequence[Turn], advantages: np.ndarray) -> tuple[list[Turn], np.ndarray]:
  """The turns (and their advantages) that go into the learner's batch: every turn that is not task-level."""
  keep = [k for k, t in enumerate(turns) if not task_level(t.result)]
  return [turns[k] for k in keep], np.asarray(advantages, np.float32)[keep]


def seq_bucket(length: int, minimum: int = 256) -> int:
  """Padded batch length: the smallest of minimum * {1, 1.5, 2, 3, 4, 6, 8, ...} that holds `length`.

  Every new length compiles the learner step again (~15 s for the small policy on an H200, more for big ones);
  with this ladder an RL run meets a handful of lengths, at most 50% (on average ~17%) padding.
  """
  b = minimum
  while b < length:
    b = b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3  # 2^k -> 1.5 * 2^k -> 2^(k+1)
  return b


def build_batch(turns: Sequence[Turn], advantages: np.ndarray, *, pad_id: int, rows_multiple: int,
                seed: int, bucket: int = 256) -> TrainBatch:
  """Packs turns into a right-padded TrainBatch; rows shuffled (seeded) so each minibatch mixes tasks/turns."""
  lengths = [len(t.prompt_ids) + len(t.response_ids) for t in turns]
  b, length = len(turns), seq_bucket(max(lengths), bucket)
  tokens = np.full((b, length), pad_id, np.int32)
  attn = np.zeros((b, length), np.int32)
  loss = np.zeros((b, length), np.float32)
  old = np.zeros((b, length), np.float32)
  for r, t in enumerate(turns):
    p, n = len(t.prompt_ids), len(t.response_ids)
    if len(t.logprobs) != n:
      raise ValueError(f"turn ({t.task_id}, traj {t.traj}, turn {t.turn}): {n} response tokens but "
                       f"{len(t.logprobs)} log-probs")
    tokens[r, :p + n] = t.prompt_ids + t.response_ids
    attn[r, :p + n] = 1
    loss[r, p:p + n] = 1.0
    old[r, p:p + n] = t.logprobs
  order = np.random.default_rng(seed).permutation(b)
  batch = TrainBatch(tokens_BxT=tokens[order], attn_mask_BxT=attn[order], loss_mask_BxT=loss[order],
                     old_logps_BxT=old[order], advantages_B=np.asarray(advantages, np.float32)[order])
  return pad_batch(batch, rows_multiple)
