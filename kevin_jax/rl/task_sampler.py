"""Which tasks each RL step trains on: epochs of seeded permutations, with a JSON-able state for checkpoints."""

from __future__ import annotations

import random
from typing import Sequence


class TaskSampler:
  """Draws `k` task ids per step without replacement within an epoch; reshuffles each epoch.

  The order depends only on (seed, epoch), so a resumed run draws exactly what an uninterrupted run would.
  """

  def __init__(self, task_ids: Sequence[str], seed: int):
    if not task_ids:
      raise ValueError("no training tasks to sample from")
    self.task_ids = sorted(task_ids)
    self.seed = seed
    self.epoch = 0
    self.pos = 0

  def _order(self, epoch: int) -> list[str]:
    order = list(self.task_ids)
    random.Random(f"kevin_jax-tasks:{self.seed}:{epoch}").shuffle(order)
    return order

  def next(self, k: int) -> list[str]:
    """The next k ids (k may exceed the number of tasks: then ids repeat across epochs)."""
    out = []
    while len(out) < k:
      order = self._order(self.epoch)
      take = order[self.pos:self.pos + k - len(out)]
      out += take
      self.pos += len(take)
      if self.pos >= len(order):
        self.epoch, self.pos = self.epoch + 1, 0
    return out

  def state(self) -> dict:
    return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed, "num_tasks": len(self.task_ids)}

  def restore(self, state: dict) -> None:
    if state.get("num_tasks") not in (None, len(self.task_ids)) or state.get("seed", self.seed) != self.seed:
      raise ValueError(f"task-sampler state {state} does not match this run "
                       f"({len(self.task_ids)} tasks, seed {self.seed}): was the task split changed?")
    self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
