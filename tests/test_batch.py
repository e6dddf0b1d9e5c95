"""rl/batch.py: rollout turns -> discounted returns and per-task advantages, in the turns' own order."""

import math

import numpy as np

from kevin_jax.rl import grpo
from kevin_jax.rl.batch import turn_advantages
from kevin_jax.rl.rollout import Turn


def _turn(task, traj, turn, score):
  return Turn(task_id=task, traj=traj, turn=turn, prompt_ids=[1], response_ids=[2], logprobs=np.zeros(1, np.float32),
              response="", parsed=None, finish_reason="eos", result={"score": score})


def test_turn_returns_and_task_groups_with_negative_scale():
  # Task a: trajectories 0, 1 with scores (0, 1) and (0, 0); task b: trajectory 2 with (2, 0) and 3 with (0, 0).
  # gamma 0.5, sum: returns a = [0.5, 1], [0, 0]; b = [2, 0], [0, 0]. Each task's 4 turn-samples are one group.
  turns = [_turn("a", 0, 0, 0.0), _turn("a", 0, 1, 1.0), _turn("a", 1, 0, 0.0), _turn("a", 1, 1, 0.0),
           _turn("b", 2, 0, 2.0), _turn("b", 2, 1, 0.0), _turn("b", 3, 0, 0.0), _turn("b", 3, 1, 0.0)]
  order = [5, 0, 7, 2, 4, 1, 6, 3]  # Results must follow the given order, whatever it is.
  shuffled = [turns[i] for i in order]
  cfg = grpo.GRPOConfig(gamma=0.5, adv_eps=1e-12)
  returns, adv = turn_advantages(shuffled, cfg)
  want_r = np.array([0.5, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0])
  np.testing.assert_allclose(returns, want_r[order], rtol=1e-6)
  # Group a: mean 0.375, deviations 0.125, 0.625, -0.375, -0.375, unbiased std sqrt(0.6875/3).
  # Group b: mean 0.5, deviations 1.5, -0.5 x 3, unbiased std 1.
  want_a = np.array([0.125, 0.625, -0.375, -0.375, 1.5, -0.5, -0.5, -0.5])
  want_a[:4] /= math.sqrt(0.6875 / 3)
  np.testing.assert_allclose(adv, want_a[order], rtol=1e-5)
  _, adv_scaled = turn_advantages(shuffled, grpo.GRPOConfig(gamma=0.5, adv_eps=1e-12, negative_scale=0.2))
  np.testing.assert_allclose(adv_scaled, np.where(want_a < 0, 0.2 * want_a, want_a)[order], rtol=1e-5)


def test_shuffle_advantages_is_a_seeded_permutation():
  turns = [_turn(t, i, k, float(s)) for i, (t, s) in enumerate([("a", 0), ("a", 1), ("b", 3), ("b", 0), ("c", 2),
                                                                 ("c", 0)]) for k in range(2)]
  cfg = grpo.GRPOConfig(gamma=0.5, adv_eps=1e-12)
  returns, adv = turn_advantages(turns, cfg)
  null = grpo.GRPOConfig(gamma=0.5, adv_eps=1e-12, shuffle_advantages=True)
  r1, s1 = turn_advantages(turns, null, seed=1)
  _, s1_again = turn_advantages(turns, null, seed=1)
  _, s2 = turn_advantages(turns, null, seed=2)
  np.testing.assert_array_equal(r1, returns)  # Returns stay with their turns; only advantages move.
  np.testing.assert_array_equal(np.sort(s1), np.sort(adv))  # The same values ...
  assert not np.array_equal(s1, adv)  # ... in another order,
  np.testing.assert_array_equal(s1, s1_again)  # fixed by the seed,
  assert not np.array_equal(s1, s2)  # and different for another seed.
