"""Evaluation and test-time scaling runs [P §4]: best@k / avg@k / fast_p per turn, fixed-budget comparisons.

Run (from the repository root), on a trained workdir:
  python -m kevin_jax.main --config=configs/eval.py --workdir=runs/eval \\
      --config.evaluation.checkpoint=runs/multiturn
Presets: those of multiturn.py (e.g. `:runlocal`), plus
  beam         also run the beam search (best 4 of 16 trajectories, cloned 4x, repeated).
  kernelbench  the field's standard report on a KernelBench checkout (configs/kernelbench.py's tasks, both
               splits; kevin_jax/report/standard.py), torch.compile timed as a second reference:
    python -m kevin_jax.main --config=configs/eval.py:kernelbench --config.policy.checkpoint=HF_DIR \\
        --config.tasks.source=DIR --workdir=runs/kb_eval
On the task world (`:world`), the paper's Table 2 on both held-out splits: `python experiments/sweep.py table2
--checkpoint DIR --run` (experiments/world_job).
Writes workdir/eval/{results.md, results.csv, report.json, scaling.png, trajectories.jsonl} (kernelbench: also
standard_report.md, standard_summary.csv, standard_turns.csv, standard_tasks.csv, standard_report.png).
The policy: evaluation.checkpoint (an Orbax run or HF directory), else policy.checkpoint, else this workdir.
"""

import ml_collections

from configs import multiturn


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  names = [a for a in arg.split(",") if a]
  rest = ",".join(n for n in names if n not in ("beam", "kernelbench"))
  if "kernelbench" in names:
    from configs import kernelbench  # pylint: disable=g-import-not-at-top
    c = kernelbench.get_config(rest)
    c.evaluation.split = "all"  # Both splits, reported apart.
    c.evaluation.standard_report = True
    c.evaluation.budgets = ()  # The standard report only: no fixed-budget comparison.
    c.evaluator.compile_baseline = True  # The second reference timing, torch.compile.
  else:
    c = multiturn.get_config(rest)
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
