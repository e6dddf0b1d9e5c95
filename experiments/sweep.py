"""The paper's ablation sweeps [P §2 "Aggregation across turns", §4]: print, run, or collect them.

  python experiments/sweep.py aggregation                  # print the 4 commands (gamma {0.4, 0.8} x {sum, max})
  python experiments/sweep.py aggregation --run            # run them one after another
  python experiments/sweep.py aggregation --collect        # table (Markdown + CSV) and learning-curve plot
  python experiments/sweep.py single_vs_multi --run -- --config.total_steps=10   # extra overrides for every run

Sweeps:
  aggregation      rl.gamma in {0.4, 0.8} x rl.return_mode in {sum, max}      (paper: sum with 0.4 scaled best)
  turns            rollout.turns in {1, 2, 4} at a fixed kernel budget (trajectories 64 / 32 / 16)
  single_vs_multi  configs/multiturn.py (16 x 4) vs configs/singleturn.py:same_budget (64 x 1)
  evidence         the embedded default's evidence (issue 8): multi-turn with seeds 0 and 1, single-turn 64 x 1
                   with seed 0, multi-turn at 5x the RL learning rate, and the next candidate recipe (8 tasks x 4
                   trajectories per step, rl.negative_scale=0) with seeds 0 and 1; each with its in-job evaluations
                   of the train and test splits before and after RL
Each run writes to <root>/<sweep>/<name>; rerunning a command resumes it; `--only a,b` picks runs. `--collect`
reads every run's metrics.jsonl and reports the mean of the last `--last` steps of reward/mean, correct/rate and
speedup/mean_correct, plus reward/mean, correct/rate and learner/entropy per step in <root>/<sweep>/curves.png;
where a run has eval_metrics.jsonl (the RL job's own evaluations), a before/after table per split (step 0 vs the
last step).
`--compact` deletes the runs' checkpoints and exported weights (keeps metrics, rollouts, configs).
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# read_metrics keeps a resumed step's last record.
from kevin_jax.metrics import read_metrics  # pylint: disable=wrong-import-position
from kevin_jax.data import export_corpus  # pylint: disable=wrong-import-position

# The "every kind" corpus of the tenth session: every kind whose target is a correct kernel.
EVERY_CORRECT_KIND = export_corpus.KINDS + export_corpus.LATER_TURN_KINDS
MIX2_KINDS = export_corpus.FIRST_TURN_MIXTURE + export_corpus.LATER_MIXTURE_KINDS  # Twelfth session's warm start.
SWEEPS: dict[str, list[tuple[str, str, list[str]]]] = {  # name -> [(run name, config, overrides)]
    "aggregation": [(f"{mode}_g{gamma}", "configs/multiturn.py",
                     [f"--config.rl.gamma={gamma}", f"--config.rl.return_mode={mode}"])
                    for mode in ("sum", "max") for gamma in (0.4, 0.8)],
    "turns": [(f"turns{n}", "configs/multiturn.py",
               [f"--config.rollout.turns={n}", f"--config.rollout.trajectories={64 // n}"]) for n in (1, 2, 4)],
    "single_vs_multi": [("multi_16x4", "configs/multiturn.py", []),
                        ("single_64x1", "configs/singleturn.py:same_budget", [])],
    "evidence": [("multi_s0", "configs/multiturn.py", ["--config.seed=0"]),
                 ("multi_s1", "configs/multiturn.py", ["--config.seed=1"]),
                 ("single_s0", "configs/singleturn.py:same_budget", ["--config.seed=0"]),
                 # The learning-rate check of 2026-12-01: 5x the default RL learning rate (README "Results").
                 ("multi_s0_lr5e-5", "configs/multiturn.py",
                  ["--config.seed=0", "--config.optimizer.learning_rate=5e-5"])]
                + [  # The next candidate (issue 8, from the CPU toy): 8 tasks x 4 trajectories per step (the same
                    # 128 kernels, 4x the task coverage) and no push on below-baseline samples.
                    (f"multi_s{seed}_8x4_neg0", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.rollout.tasks_per_step=8", "--config.rollout.trajectories=4",
                      "--config.rl.negative_scale=0"]) for seed in (0, 1)]
                + [  # 2026-12-01, second try: 8 x 4 at 20 steps overran a 10-minute GPU call (evaluating 8 distinct
                    # tasks per step costs ~17 s) and showed no trend by step 14, so: 5x the learning rate (where
                    # GRPO collapsed) for 12 steps.
                    (f"multi_s{seed}_8x4_neg0_lr5e-5", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.rollout.tasks_per_step=8", "--config.rollout.trajectories=4",
                      "--config.rl.negative_scale=0", "--config.optimizer.learning_rate=5e-5",
                      "--config.total_steps=12"]) for seed in (0, 1)]
                + [  # The null control of the 5x-lr runs: GRPO's advantages permuted across the batch (same
                    # values, no signal). Collapsing as fast as they did means the drift, not the signal, dominates.
                    ("multi_s0_8x4_shuffled_lr5e-5", "configs/multiturn.py",
                     ["--config.seed=0", "--config.rollout.tasks_per_step=8", "--config.rollout.trajectories=4",
                      "--config.rl.shuffle_advantages=True", "--config.optimizer.learning_rate=5e-5",
                      "--config.total_steps=12"])]
                + [  # 2026-12-02: the collapsed positives-only 5x-lr run again, with rl.adv_prob_weight=1 (token
                    # advantages x pi_old: improbable sampled tokens, e.g. noise in unchecked reasoning, stop
                    # dominating the update). Run from a carried warm start: -- --config.init_from=runs/warm.
                    (f"multi_s{seed}_8x4_neg0_pw1_lr5e-5", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.rollout.tasks_per_step=8", "--config.rollout.trajectories=4",
                      "--config.rl.negative_scale=0", "--config.rl.adv_prob_weight=1",
                      "--config.optimizer.learning_rate=5e-5", "--config.total_steps=12"]) for seed in (0, 1)]
                + [  # 2026-12-02: the null control at the default's own rate and layout (2 x 16, lr 1e-5, 20 steps):
                    # is multi_s0's decline (-41 %) drift too, or GRPO's signal? Carried warm start as above.
                    ("multi_s0_shuffled", "configs/multiturn.py",
                     ["--config.seed=0", "--config.rl.shuffle_advantages=True"])]
                + [  # 2026-12-02 (sixth session): positives-only at the default rate (1e-5, where the null control
                    # was flat) with 8 tasks per step for as many steps as one 10-minute call allows: ~6 visits per
                    # training task, the toy's slow-learning regime. Cached reference timing and no test split (0.000
                    # throughout) to fit. Carried warm start as above.
                    (f"multi_s{seed}_8x4_neg0_24", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.rollout.tasks_per_step=8", "--config.rollout.trajectories=4",
                      "--config.rl.negative_scale=0", "--config.total_steps=24",
                      "--config.evaluator.ref_timing=cached", "--config.evaluation.in_training_splits=('train',)"])
                    for seed in (0, 1)]
                + [  # 2026-12-02 (sixth session): the warm start trained with sft.input_noise=0.1 (10 % of the response
                    # tokens it reads replaced by others of the same response), then the default RL. Rollouts of the
                    # plain warm start derail after one off-text sampled token (word salad, EOS inside the reasoning).
                    (f"multi_s{seed}_noise0.1", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.sft.input_noise=0.1",
                      "--config.evaluation.in_training_splits=('train',)"]) for seed in (0, 1)]
                + [  # 2026-12-02 (sixth session): the default RL (GRPO, 2 x 16 x 4, lr 1e-5) sampling at temperature
                    # 0.6 in training and evaluation: fewer off-text tokens for the memorising policy to derail on.
                    # 12 steps (what the session's last GPU minutes allowed), cached reference timing, train split
                    # only. Carried warm start.
                    (f"multi_s{seed}_t0.6", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.sampler.temperature=0.6", "--config.total_steps=12",
                      "--config.evaluator.ref_timing=cached", "--config.evaluation.in_training_splits=('train',)"])
                    for seed in (0, 1)]
                + [  # Next (prepared 2026-12-02, not yet run): the warm start also trained on the later-turn prompts
                    # rollouts produce (export_corpus.LATER_TURN_KINDS), then the default RL at temperature 0.6,
                    # stopping in time for the closing evaluation (time_budget_s; run it in a stage of >= 560 s).
                    (f"multi_s{seed}_kinds_t0.6", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.sft.corpus_kinds=" + repr(EVERY_CORRECT_KIND),
                      "--config.sampler.temperature=0.6", "--config.time_budget_s=520",
                      "--config.evaluator.ref_timing=cached", "--config.evaluation.in_training_splits=('train',)"])
                    for seed in (0, 1)]
                + [  # 2026-12-02 (seventh session): multi_s{0,1}_t0.6 for 20 steps instead of 12. Seed 0 does not
                    # re-evaluate the starting policy (its step-0 numbers are multi_s0_t0.6's: same seed, weights and
                    # sampling seed). Carried warm start: -- --config.init_from=runs/warm.
                    (f"multi_s{seed}_t0.6_20", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.sampler.temperature=0.6", "--config.total_steps=20",
                      f"--config.evaluation.in_training_first={seed != 0}", "--config.evaluator.run_timeout_s=20",
                      "--config.evaluator.ref_timing=cached", "--config.evaluation.in_training_splits=('train',)"])
                    for seed in (0, 1)]
                + [  # 2026-12-02 (eighth session): the t0.6_20 runs with 2x the learning rate (lr2e-5), and at the
                    # default rate (max), for as many steps as a 10-minute call allows (-- --config.time_budget_s=555
                    # training its own warm start, 565 from a carried one). The seventh session's carried warm start
                    # was lost with its machine; these start from one rebuilt by the same recipe (not known to be
                    # bitwise the same: GPU training need not be deterministic), so they evaluate it themselves,
                    # except multi_s0_t0.6_max: it starts from multi_s0_t0.6_lr2e-5's warm start (sft/hf, carried as
                    # runs/warm: -- --config.init_from=runs/warm), whose step 0 (same seed and weights) it takes.
                    (f"multi_s{seed}_t0.6_{tag}", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.sampler.temperature=0.6", *extra,
                      f"--config.evaluation.in_training_first={(tag, seed) != ('max', 0)}",
                      "--config.time_budget_eval_s=130",
                      "--config.evaluator.run_timeout_s=20", "--config.evaluator.ref_timing=cached",
                      "--config.evaluation.in_training_splits=('train',)"])
                    for tag, extra in (("lr2e-5", ["--config.optimizer.learning_rate=2e-5", "--config.total_steps=40"]),
                                       ("max", ["--config.total_steps=40"]))
                    for seed in (0, 1)]
                + [  # 2026-12-02 (ninth session): does the gain keep growing with more steps? multi_s0_t0.6_max's
                    # 30-step policy (its hf/ export, carried as runs/max_s0_hf: -- --config.init_from=runs/max_s0_hf)
                    # trained for as many more steps as one call allows, with a fresh optimizer; its step 0 is the
                    # warm start's (multi_s0_t0.6_lr2e-5: the same seed, so the same evaluation sampling seed).
                    # multi_s0_t0.6_max90 continues max60's 57-step policy (runs/max60_s0_hf) the same way.
                    (f"multi_s0_t0.6_{tag}", "configs/multiturn.py",
                     ["--config.seed=0", "--config.sampler.temperature=0.6", "--config.total_steps=40",
                      "--config.evaluation.in_training_first=False", "--config.time_budget_eval_s=130",
                      "--config.evaluator.run_timeout_s=20", "--config.evaluator.ref_timing=cached",
                      "--config.evaluation.in_training_splits=('train',)"])
                    for tag in ("max60", "max90")]
                + [  # Next (prepared 2026-12-02, ninth session, not yet run): warm starts whose later-turn reasoning
                    # copies nothing from the prompt (sft.corpus_reasoning=plain), with the default corpus kinds and
                    # with every kind, then the default RL at T = 0.6 for as many steps as one call allows
                    # (-- --config.time_budget_s=555; KEEP=sw/evidence/<run>/sft/hf returns the warm start).
                    (f"multi_s{seed}_plain{tag}_t0.6", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.sft.corpus_reasoning=plain", *extra,
                      "--config.sampler.temperature=0.6", "--config.total_steps=40",
                      "--config.time_budget_eval_s=130", "--config.evaluator.run_timeout_s=20",
                      "--config.evaluator.ref_timing=cached", "--config.evaluation.in_training_splits=('train',)"])
                    for tag, extra in (("", []),
                                       ("_kinds", ["--config.sft.corpus_kinds=" + repr(EVERY_CORRECT_KIND)]))
                    for seed in (0, 1)]
                + [  # 2026-12-03 (tenth session): multi_s0_plain_kinds_t0.6's warm start (its sft/hf, carried as
                    # runs/pk_s0_hf: -- --config.init_from=runs/pk_s0_hf) trained for as many RL steps as the
                    # session's last device minutes allow; its step 0 is multi_s0_plain_kinds_t0.6's (same seed,
                    # weights and sampling temperature).
                    ("multi_s0_plain_kinds_t0.6_max", "configs/multiturn.py",
                     ["--config.seed=0", "--config.sampler.temperature=0.6", "--config.total_steps=40",
                      "--config.evaluation.in_training_first=False", "--config.time_budget_eval_s=130",
                      "--config.evaluator.run_timeout_s=20", "--config.evaluator.ref_timing=cached",
                      "--config.evaluation.in_training_splits=('train',)"])]
                + [  # 2026-12-03 (eleventh session): the every-kind warm start plus wrong first turns (first_wrong:
                    # the corpus mixes correct-slow, correct-fast and wrong first attempts, as issue 8 asks), then
                    # the default RL at T = 0.6 for as many steps as one call allows (-- --config.time_budget_s=555;
                    # KEEP=sw/evidence/<run>/hf returns the trained policy for a continuation).
                    (f"multi_s{seed}_mix_t0.6", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.sft.corpus_reasoning=plain",
                      "--config.sft.corpus_kinds=" + repr(export_corpus.FIRST_TURN_MIXTURE),
                      "--config.sampler.temperature=0.6", "--config.total_steps=40",
                      "--config.time_budget_eval_s=130", "--config.evaluator.run_timeout_s=20",
                      "--config.evaluator.ref_timing=cached", "--config.evaluation.in_training_splits=('train',)"])
                    for seed in (0, 1)]
                + [  # Its continuations, each from the previous run's trained policy (hf/, carried: _more from
                    # multi_s0_mix_t0.6's as runs/mix_s0_hf, _more2 from _more's as runs/mix_more_s0_hf;
                    # --config.init_from=<it>) with a fresh optimizer; their step 0 is multi_s0_mix_t0.6's.
                    (f"multi_s0_mix_t0.6_{tag}", "configs/multiturn.py",
                     ["--config.seed=0", "--config.sampler.temperature=0.6", "--config.total_steps=60",
                      "--config.evaluation.in_training_first=False", "--config.time_budget_eval_s=130",
                      "--config.evaluator.run_timeout_s=20", "--config.evaluator.ref_timing=cached",
                      "--config.evaluation.in_training_splits=('train',)"]) for tag in ("more", "more2")]
                + [  # 2026-12-03 (twelfth session): the mixture warm start with later turns mixed as well
                    # (export_corpus.LATER_MIXTURE_KINDS: after a slow or wrong kernel, half the targets do not act on
                    # the feedback), then the same RL; _more, _more2 and _more3 continue from the previous call's
                    # hf/ (carried as runs/mix2_s<seed>_hf, runs/mix2_more_s<seed>_hf, then runs/mix2_more2_s<seed>_hf)
                    # with a fresh optimizer.
                    # The evaluation estimate is 200 s since the thirteenth session: a continuation measures none
                    # before its closing one, and on that session's machine evaluations took 153-198 s, so with 130
                    # the closing evaluation of multi_s1_mix2_t0.6_more overran its 10-minute call and was lost.
                    (f"multi_s{seed}_mix2_t0.6{tag}", "configs/multiturn.py",
                     [f"--config.seed={seed}", "--config.sft.corpus_reasoning=plain",
                      "--config.sft.corpus_kinds=" + repr(MIX2_KINDS),
                      "--config.sampler.temperature=0.6", f"--config.total_steps={60 if tag else 40}",
                      f"--config.evaluation.in_training_first={not tag}", "--config.time_budget_eval_s=200",
                      "--config.evaluator.run_timeout_s=20", "--config.evaluator.ref_timing=cached",
                      "--config.evaluation.in_training_splits=('train',)"])
                    for seed in (0, 1) for tag in ("", "_more", "_more2", "_more3")],
}
# Defaults that changed after some evidence runs were recorded, pinned in the runs that do not set them so that
# their commands still reproduce them: the sampling temperature was 0.9 before the seventh session (2026-12-02; now
# 0.6), the warm start's corpus export_corpus.KINDS with quote reasoning before the eleventh (2026-12-03), and the
# run's length 20 RL steps before the twelfth (2026-12-03; now 30), and the reference timed in every evaluation
# (evaluator.ref_timing interleaved) and every candidate given all its timed runs (evaluator.timing_max_s 0) before
# the fifteenth (2026-12-03; now cached and 0.5 s), and the prompt budget 4096 tokens with the warm start's
# prompts built from every earlier attempt before the nineteenth (2026-12-04; now 3072, fitted as rollouts are).
_PINNED = {"sampler.temperature": "0.9", "sft.corpus_kinds": repr(export_corpus.KINDS),
           "sft.corpus_reasoning": "quote", "total_steps": "20", "evaluator.ref_timing": "interleaved",
           "evaluator.timing_max_s": "0.0", "rollout.max_context_tokens": "4096", "sft.fit_prompts": "False",
           "evaluator.result_cache": "0"}
SWEEPS["evidence"] = [(name, config, [f"--config.{key}={value}" for key, value in _PINNED.items()
                                      if not any(o.startswith(f"--config.{key}=") for o in overrides)] + overrides)
                      for name, config, overrides in SWEEPS["evidence"]]
# Runs that skip their step-0 evaluation (evaluation.in_training_first=False) -> the run whose step 0 stands in for
# it: the same seed, starting weights and sampling temperature, so the same evaluation sampling seed and prompts.
STEP0_FROM = {"multi_s0_t0.6_20": "multi_s0_t0.6", "multi_s0_t0.6_max": "multi_s0_t0.6_lr2e-5",
              "multi_s0_t0.6_max60": "multi_s0_t0.6_lr2e-5", "multi_s0_t0.6_max90": "multi_s0_t0.6_lr2e-5",
              "multi_s0_plain_kinds_t0.6_max": "multi_s0_plain_kinds_t0.6",
              "multi_s0_mix_t0.6_more": "multi_s0_mix_t0.6", "multi_s0_mix_t0.6_more2": "multi_s0_mix_t0.6",
              **{f"multi_s{seed}_mix2_t0.6{tag}": f"multi_s{seed}_mix2_t0.6" for seed in (0, 1)
                 for tag in ("_more", "_more2", "_more3")}}
METRICS = ("reward/mean", "correct/rate", "speedup/mean_correct")
CURVES = (("reward/mean", "reward/mean (kernel score per turn-sample)"),  # Per-step panels of curves.png.
          ("correct/rate", "correct/rate (share of correct kernels)"),
          ("learner/entropy", "learner/entropy (nats per response token)"))
# eval_metrics.jsonl keys (kevin_jax/evaluate.summarize) in the before/after table, with their labels.
EVAL_METRICS = (("kernel/score_mean", "kernel score mean"), ("kernel/correct_rate", "kernels correct"),
                ("kernel/speedup_mean_correct", "speedup of correct kernels"), ("correct_best", "correct best@k"),
                ("correct_avg", "correct avg@k"), ("perf_best", "perf best@k"), ("perf_avg", "perf avg@k"))


def commands(sweep: str, root: str, extra: list[str], only: str = "") -> list[tuple[str, list[str]]]:
  """(run name, argv) per configuration of the sweep (those named in `only`, comma-separated, if given)."""
  if sweep not in SWEEPS:
    raise SystemExit(f"unknown sweep {sweep!r}; known: {', '.join(SWEEPS)}")
  names = [n for n, _, _ in SWEEPS[sweep]]
  picked = [n for n in only.split(",") if n]
  if any(n not in names for n in picked):
    raise SystemExit(f"--only {only!r}: sweep {sweep!r} has runs {', '.join(names)}")
  out = []
  for name, config, overrides in SWEEPS[sweep]:
    if picked and name not in picked:
      continue
    workdir = os.path.join(root, sweep, name)
    out.append((name, [sys.executable, "-m", "kevin_jax.main", f"--config={config}", f"--workdir={workdir}",
                       *overrides, *extra]))
  return out


def collect(sweep: str, root: str, last: int) -> list[dict]:
  """One row per run: steps done and the mean of METRICS over the last `last` steps; writes table + plot."""
  rows, curves = [], {}
  for name, _, _ in SWEEPS[sweep]:
    path = os.path.join(root, sweep, name, "metrics.jsonl")
    if not os.path.isfile(path):
      rows.append({"run": name, "steps": 0})
      continue
    recs = read_metrics(path)
    tail = list(recs.values())[-last:]
    row = {"run": name, "steps": max(recs)}
    for m in METRICS:
      vals = [float(r[m]) for r in tail if isinstance(r.get(m), (int, float))]
      row[m] = sum(vals) / len(vals) if vals else float("nan")
    rows.append(row)
    curves[name] = {m: [(s, float(r[m])) for s, r in recs.items() if m in r] for m, _ in CURVES}
  out_dir = os.path.join(root, sweep)
  os.makedirs(out_dir, exist_ok=True)
  header = ["run", "steps", *METRICS]
  with open(os.path.join(out_dir, "summary.csv"), "w", newline="", encoding="utf-8") as f:
    w = csv.DictWriter(f, fieldnames=header, restval="")
    w.writeheader()
    w.writerows(rows)
  lines = [f"# Sweep `{sweep}` (mean of the last {last} steps)", "", "| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(_cell(r.get(h, "")) for h in header) + " |" for r in rows]
  evals = before_after(sweep, root)
  if evals:
    lines += ["", "Before -> after RL (the job's own evaluations: step 0 = the starting policy, then the last step; "
              "k trajectories x n turns per task, the same sampling seed both times):", "",
              "| run | split | tasks | steps | " + " | ".join(label for _, label in EVAL_METRICS) + " |",
              "|" + "---|" * (4 + len(EVAL_METRICS))]
    for e in evals:
      cells = []
      for key, _ in EVAL_METRICS:
        b, a = e["before"].get(key), e["after"].get(key)
        cell = f"{_fmt_eval(key, b)} -> {_fmt_eval(key, a)}"
        if key == "kernel/score_mean" and b:
          cell += f" ({100 * (a - b) / b:+.0f}%)"
        cells.append(cell)
      step0 = "0" if e["step0_from"] == e["run"] else f"0 ({e['step0_from']})"
      lines.append(f"| {e['run']} | {e['split']} | {e['tasks']} | {step0} -> {e['step']} | " + " | ".join(cells) + " |")
    with open(os.path.join(out_dir, "before_after.csv"), "w", newline="", encoding="utf-8") as f:
      w = csv.writer(f)
      w.writerow(["run", "split", "tasks", "step", "when"] + [k for k, _ in EVAL_METRICS])
      for e in evals:
        for when in ("before", "after"):
          w.writerow([e["run"], e["split"], e["tasks"], 0 if when == "before" else e["step"], when]
                     + [e[when].get(k, "") for k, _ in EVAL_METRICS])
  with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  if curves:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    fig, axes = plt.subplots(1, len(CURVES), figsize=(5.5 * len(CURVES), 4))
    for ax, (m, label) in zip(axes, CURVES):
      for name, by_metric in curves.items():
        pts = by_metric[m]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=name)
      ax.set_xlabel("RL step")
      ax.set_ylabel(label)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "curves.png"), dpi=100)
    plt.close(fig)
  print("\n".join(lines))
  return rows


def before_after(sweep: str, root: str) -> list[dict]:
  """Per run and split: the step-0 and last-step records of eval_metrics.jsonl ('<split>/<key>' scalars)."""
  out = []
  for name, _, _ in SWEEPS[sweep]:
    path = os.path.join(root, sweep, name, "eval_metrics.jsonl")
    if not os.path.isfile(path):
      continue
    recs = read_metrics(path)
    last, step0_from = max(recs), name
    if 0 not in recs and name in STEP0_FROM:  # Its starting policy was evaluated by another run (STEP0_FROM).
      step0_from = STEP0_FROM[name]
      other = os.path.join(root, sweep, step0_from, "eval_metrics.jsonl")
      if os.path.isfile(other):
        recs[0] = read_metrics(other).get(0, {})
    if not recs.get(0) or last == 0:
      continue
    splits = sorted({k.split("/", 1)[0] for k in recs[0] if k != "step" and "/" in k})
    for split in splits:
      pick = lambda r, split=split: {k.split("/", 1)[1]: v for k, v in r.items() if k.startswith(split + "/")}
      before, after = pick(recs[0]), pick(recs[last])
      out.append({"run": name, "split": split, "step": last, "tasks": before.get("tasks", ""), "before": before,
                  "after": after, "step0_from": step0_from})
  return out


def _fmt_eval(key: str, v) -> str:
  if not isinstance(v, (int, float)):
    return "?"
  if key.startswith("perf") or "speedup" in key:
    return f"{v:.2f}x"
  if "score" in key:
    return f"{v:.3f}"
  return f"{100 * v:.1f}%"


def compact(sweep: str, root: str) -> None:
  """Deletes every run's checkpoints and exported weights (large); metrics, rollouts and configs stay."""
  import shutil  # pylint: disable=g-import-not-at-top
  for name, _, _ in SWEEPS[sweep]:
    for sub in ("checkpoints", "hf", os.path.join("sft", "checkpoints"), os.path.join("sft", "hf")):
      d = os.path.join(root, sweep, name, sub)
      if os.path.isdir(d):
        shutil.rmtree(d)
        print(f"deleted {d}")


def _cell(v) -> str:
  return f"{v:.4g}" if isinstance(v, float) else str(v)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="Overrides for every run go after `--`, e.g. -- --config.total_steps=10")
  p.add_argument("sweep", choices=sorted(SWEEPS))
  p.add_argument("--root", default="runs/sweeps", help="parent of the sweep's run directories")
  p.add_argument("--run", action="store_true", help="run every configuration (sequentially)")
  p.add_argument("--collect", action="store_true", help="summarise finished runs into a table and a plot")
  p.add_argument("--last", type=int, default=5, help="steps averaged per run in the table")
  p.add_argument("--only", default="", help="comma-separated run names of the sweep to print/run")
  p.add_argument("--compact", action="store_true", help="delete the runs' checkpoints and exported weights")
  # Overrides for every run follow a `--`. They are split off by hand: argparse gives a trailing nargs="*"
  # positional its empty match at the sweep name already, and then rejects everything after `--`.
  argv = list(sys.argv[1:] if argv is None else argv)
  split = argv.index("--") if "--" in argv else len(argv)
  args = p.parse_args(argv[:split])
  args.extra = argv[split + 1:]
  if args.collect or args.compact:
    if args.collect:
      collect(args.sweep, args.root, args.last)
    if args.compact:
      compact(args.sweep, args.root)
    return 0
  failed = []
  for name, cmd in commands(args.sweep, args.root, args.extra, args.only):
    print(f"# {name}\n{shlex.join(cmd)}", flush=True)
    if args.run and subprocess.run(cmd, cwd=ROOT).returncode != 0:
      failed.append(name)
  if failed:
    print(f"failed runs: {', '.join(failed)}", file=sys.stderr)
    return 1
  if args.run:
    collect(args.sweep, args.root, args.last)
  return 0


if __name__ == "__main__":
  sys.exit(main())
