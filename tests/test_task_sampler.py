"""kevin_jax.rl.task_sampler: epochs without replacement, determinism, resume."""

import pytest

from kevin_jax.rl.task_sampler import TaskSampler

IDS = [f"level1/{i:02d}_t" for i in range(5)]


def test_epochs_cover_every_task_once():
  s = TaskSampler(IDS, seed=3)
  first, second = s.next(5), s.next(5)
  assert sorted(first) == sorted(IDS) and sorted(second) == sorted(IDS)
  assert first != second  # Reshuffled per epoch (for this seed).


def test_batches_span_epochs_and_repeat_when_k_exceeds_tasks():
  s = TaskSampler(IDS, seed=0)
  a = s.next(3)
  b = s.next(3)  # 2 from epoch 0, 1 from epoch 1.
  assert len(set(a + b[:2])) == 5
  assert s.state()["epoch"] == 1 and s.state()["pos"] == 1
  big = TaskSampler(IDS, seed=0).next(12)
  assert len(big) == 12 and set(big) == set(IDS)


def test_resume_draws_what_an_uninterrupted_run_draws():
  ref = TaskSampler(IDS, seed=7)
  draws = [ref.next(2) for _ in range(4)]
  s = TaskSampler(IDS, seed=7)
  s.next(2), s.next(2)
  resumed = TaskSampler(IDS, seed=7)
  resumed.restore(s.state())
  assert [resumed.next(2) for _ in range(2)] == draws[2:]


def test_bad_state_and_empty():
  s = TaskSampler(IDS, seed=1)
  with pytest.raises(ValueError, match="does not match"):
    s.restore({"epoch": 0, "pos": 0, "seed": 1, "num_tasks": 9})
  with pytest.raises(ValueError, match="no training tasks"):
    TaskSampler([], seed=0)
