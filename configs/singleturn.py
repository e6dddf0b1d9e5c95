"""Single-turn GRPO baseline [P §1 "Single-turn RL baseline"]: one turn, reward = the kernel's score.

Run (from the repository root):
  python -m kevin_jax.main --config=configs/singleturn.py --workdir=runs/singleturn
Presets (after a colon, comma-separated; multiturn.py's presets apply too):
  same_budget   64 samples per task: the kernel budget of the multi-turn default (16 trajectories x 4 turns).
"""

import ml_collections

from configs import multiturn


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  names = [a for a in arg.split(",") if a]
  c = multiturn.get_config(",".join(n for n in names if n != "same_budget"))
  c.rollout.turns = 1  # One attempt per trajectory; gamma and return_mode then have no effect.
  c.rollout.trajectories = 16  # 16 responses per task [P §1].
  if "same_budget" in names:
    c.rollout.trajectories = 64  # 64 x 1 kernels = 16 x 4 of the multi-turn default.
  if "runlocal" in names:
    c.rollout.trajectories = 4
  return c
