"""Evaluation and test-time scaling runs [P §4]: best@k / avg@k / fast_p per turn, fixed-budget comparisons.

Run (from the repository root), on a trained workdir:
  python -m kevin_jax.main --config=configs/eval.py --workdir=runs/eval \\
      --config.evaluation.checkpoint=runs/multiturn
Presets: those of multiturn.py (e.g. `:runlocal`), plus
  beam       also run the beam search (best 4 of 16 trajectories, cloned 4x, repeated).
Writes workdir/eval/{results.md, results.csv, scaling.png, trajectories.jsonl}.
"""

import ml_collections

from configs import multiturn


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  names = [a for a in arg.split(",") if a]
  c = multiturn.get_config(",".join(n for n in names if n != "beam"))
  c.mode = "evaluate"  # Run kevin_jax/evaluate.py.
  if "beam" in names:
    c.evaluation.beam = True
  if "runlocal" in names:
    c.evaluation.trajectories = 2
    c.evaluation.turns = 2
    c.evaluation.max_tasks = 2
    c.evaluation.budgets = ((2, 2), (4, 1))
    c.evaluation.beam_width = 1
    c.evaluation.beam_clones = 2
    c.evaluation.beam_rounds = 2
    c.evaluation.beam_turns_per_round = 1
  return c
