"""rl/batch.py: rollout turns -> discounted returns and per-task advantages, in the turns' own order."""

import math

import numpy as np

from kevin_jax.rl import grpo
from kevin_jax.rl.batch import trainable, turn_advantages
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


def test_trloo_baseline_is_the_same_turn_of_the_other_trajectories():
  # Task a, three trajectories x two turns, scores (1, 2), (0, 4), (3, 0); gamma 0.5, sum: returns
  # traj0 = [1 + 0.5*2, 2] = [2, 2], traj1 = [0 + 0.5*4, 4] = [2, 4], traj2 = [3, 0].
  # TRLOO (Dr. Kernel): A_{i,t} = R_{i,t} - mean_{j != i} R_{j,t}, per task and turn.
  #   turn 0: returns 2, 2, 3 -> 2 - 2.5, 2 - 2.5, 3 - 2 = -0.5, -0.5, 1
  #   turn 1: returns 2, 4, 0 -> 2 - 2, 4 - 1, 0 - 3 = 0, 3, -3
  # Task b (one trajectory) has no other trajectory: advantage 0.
  turns = [_turn("a", 0, 0, 1.0), _turn("a", 0, 1, 2.0), _turn("a", 1, 0, 0.0), _turn("a", 1, 1, 4.0),
           _turn("a", 2, 0, 3.0), _turn("a", 2, 1, 0.0), _turn("b", 3, 0, 5.0), _turn("b", 3, 1, 1.0)]
  order = [3, 6, 0, 5, 1, 7, 2, 4]
  cfg = grpo.GRPOConfig(gamma=0.5, adv_baseline="trloo", adv_std_normalize=False)
  returns, adv = turn_advantages([turns[i] for i in order], cfg)
  np.testing.assert_allclose(returns, np.array([2, 2, 2, 4, 3, 0, 5.5, 1])[order], rtol=1e-6)
  want = np.array([-0.5, 0.0, -0.5, 3.0, 1.0, -3.0, 0.0, 0.0])
  np.testing.assert_allclose(adv, want[order], rtol=1e-6, atol=1e-6)
  # With std normalisation, each (task, turn) group is divided by its own unbiased std:
  # turn 0 returns (2, 2, 3): std sqrt(1/3); turn 1 returns (2, 4, 0): std 2.
  _, adv_std = turn_advantages([turns[i] for i in order], grpo.GRPOConfig(gamma=0.5, adv_baseline="trloo",
                                                                           adv_eps=1e-12))
  want_std = want / np.array([math.sqrt(1 / 3), 2, math.sqrt(1 / 3), 2, math.sqrt(1 / 3), 2, 1, 1])
  np.testing.assert_allclose(adv_std, want_std[order], rtol=1e-5, atol=1e-6)
  # The paper's estimator on the same turns differs: one group per task over all six turn-samples.
  _, adv_mean = turn_advantages(turns, grpo.GRPOConfig(gamma=0.5, adv_std_normalize=False))
  np.testing.assert_allclose(adv_mean[:6], np.array([2, 2, 2, 4, 3, 0]) - 13 / 6, rtol=1e-5)


def test_absent_turns_stay_out_of_every_group():
  # Trajectory 1 of task a has only its first turn: its absent second cell must not pull task a's mean to 0.
  turns = [_turn("a", 0, 0, 1.0), _turn("a", 0, 1, 1.0), _turn("a", 1, 0, 3.0)]
  cfg = grpo.GRPOConfig(gamma=0.0, adv_std_normalize=False)
  returns, adv = turn_advantages(turns, cfg)
  np.testing.assert_allclose(returns, [1.0, 1.0, 3.0])
  np.testing.assert_allclose(adv, np.array([1.0, 1.0, 3.0]) - 5 / 3, rtol=1e-6)
  _, adv_t = turn_advantages(turns, grpo.GRPOConfig(gamma=0.0, adv_std_normalize=False, adv_baseline="trloo"))
  np.testing.assert_allclose(adv_t, [1.0 - 3.0, 0.0, 3.0 - 1.0], rtol=1e-6)


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


def _error_turn(task, traj, turn, flag="evaluator_error"):
  t = _turn(task, traj, turn, 0.0)
  flags = [flag] if flag == "evaluator_error" else [flag, "evaluator_error"]
  t.result = {"status": "runtime_error", "score": 0.0, "flags": flags}
  return t


def test_task_level_results_stay_out_of_returns_and_advantages():
  # Task a, one turn each: scores 1, 3, 2 -> mean 2, unbiased std 1 -> advantages -1, 1, 0. A fourth trajectory
  # whose result is an evaluator error must not change them (a 0 would make the mean 1.5 and the std 1.29).
  clean = [_turn("a", 0, 0, 1.0), _turn("a", 1, 0, 3.0), _turn("a", 2, 0, 2.0)]
  cfg = grpo.GRPOConfig(gamma=0.5, adv_eps=1e-12)
  _, adv_clean = turn_advantages(clean, cfg)
  np.testing.assert_allclose(adv_clean, [-1.0, 1.0, 0.0], atol=1e-6)
  for flag in ("evaluator_error", "task_too_large"):
    ret, adv = turn_advantages(clean + [_error_turn("a", 3, 0, flag)], cfg)
    np.testing.assert_allclose(adv, [-1.0, 1.0, 0.0, 0.0], atol=1e-6)
    assert ret[3] == 0.0
  # TRLOO, same numbers: leave-one-out baselines 2.5, 1.5, 2 -> -1.5, 1.5, 0 with or without the error.
  trloo = grpo.GRPOConfig(gamma=0.5, adv_baseline="trloo", adv_std_normalize=False)
  _, a1 = turn_advantages(clean, trloo)
  _, a2 = turn_advantages(clean + [_error_turn("a", 3, 0)], trloo)
  np.testing.assert_allclose(a1, [-1.5, 1.5, 0.0], atol=1e-6)
  np.testing.assert_allclose(a2, [-1.5, 1.5, 0.0, 0.0], atol=1e-6)


def test_a_task_level_turn_adds_nothing_to_earlier_returns_and_leaves_the_batch():
  # Trajectory 0: scores 1, (evaluator error), 4; gamma 0.5, sum: R_2 = 4, R_0 = 1 + 0.5 * 4 (the error is skipped).
  turns = [_turn("a", 0, 0, 1.0), _error_turn("a", 0, 1), _turn("a", 0, 2, 4.0),
           _turn("a", 1, 0, 0.0), _turn("a", 1, 1, 0.0), _turn("a", 1, 2, 0.0)]
  returns, adv = turn_advantages(turns, grpo.GRPOConfig(gamma=0.5, adv_std_normalize=False))
  np.testing.assert_allclose(returns, [3.0, 0.0, 4.0, 0.0, 0.0, 0.0], atol=1e-6)
  np.testing.assert_allclose(adv, np.array([3.0, 0.0, 4.0, 0.0, 0.0, 0.0]) - np.array([7 / 5] * 6) *
                             np.array([1, 0, 1, 1, 1, 1]), atol=1e-6)
  kept, kept_adv = trainable(turns, adv)
  assert [(t.traj, t.turn) for t in kept] == [(0, 0), (0, 2), (1, 0), (1, 1), (1, 2)]
  np.testing.assert_allclose(kept_adv, adv[[0, 2, 3, 4, 5]])
