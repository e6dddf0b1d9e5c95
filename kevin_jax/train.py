"""The multi-turn RL loop (Kevin): sample tasks -> rollouts -> rewards -> advantages -> update -> log -> save.

  python -m kevin_jax.main --config=configs/multiturn.py --workdir=runs/multiturn

Per step: `rollout.tasks_per_step` tasks from a seeded epoch sampler; m trajectories x n turns each through
the jitted sampler (the learner's parameters, no copy) and the reward (the sandboxed CUDA evaluator in its own
process, or a scripted reward for CPU dry runs); per-turn discounted returns and per-task advantages; one learner
step (`rl.updates_per_batch` optimizer updates). Writes workdir/metrics.jsonl (+ TensorBoard),
workdir/rollouts/step_NNNNNN.jsonl (every turn: prompt id, response, result), workdir/config.json, Orbax
checkpoints in workdir/checkpoints, and after the last step the trained policy as a Hugging Face directory in
workdir/hf (checkpoint.export_hf; written before the closing evaluation, so a job killed during that evaluation
still leaves the trained weights). Before step 1, every `evaluation.in_training_every` steps and after the last,
it evaluates the current policy on fixed task splits (InTrainingEval: workdir/eval_metrics.jsonl, step 0 = the
starting policy); with evaluation.standard_report the closing evaluation (step 0 with total_steps=0) also writes
the field's standard report (kevin_jax/report/standard.py) to workdir/report. With rollout.context_from_tasks the
prompt budget is first raised to the longest task prompt (runtime.fit_context_to_tasks). Rerunning with the same
workdir resumes from the latest checkpoint: step, parameters, optimizer, RNG and task-sampler state; every step's
randomness derives from (seed, step), so a resumed run reproduces an uninterrupted one.

`time_budget_s` > 0 bounds the job's wall time: after each step it checks that another step (as long as this
one) and the closing evaluation (as long as this run's longest evaluation), plus this step's own periodic
evaluation if one is due, still fit; if not, this step becomes the last one, which the loop evaluates and
checkpoints as it does total_steps, so a run cut by its allotted time never loses the after-RL numbers. Each
invocation runs at least one step; a resumed run, or one that skips the step-0 evaluation
(evaluation.in_training_first=False), has no evaluation time to go by until it has evaluated once, other than
`time_budget_eval_s` (an estimate; a longer measured evaluation replaces it). A rerun in the same workdir
continues towards total_steps.

total_steps=0 runs the start alone: the warm start if one is due, then the step-0 evaluation of the starting
policy (e.g. of `init_from`, an exported trained policy), with the same sampling seeds as any run of this seed,
so a job split into phases (warm start and its evaluation; RL from the export; the trained export's evaluation)
gives the same before and after numbers as one uninterrupted run.

On JAX's CPU backend a job whose estimated peak memory (warm start, learner step, sampler) exceeds the machine's
free memory stops before it starts, naming the fields to lower (kevin_jax/host_memory.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import jax
from absl import logging

from kevin_jax import checkpoint as ckpt_lib
from kevin_jax import evaluate
from kevin_jax import metrics as metrics_lib
from kevin_jax import runtime
from kevin_jax import task_hygiene
from kevin_jax.rl import batch as batch_lib
from kevin_jax.rl import grpo
from kevin_jax.rl import rollout as ro
from kevin_jax.rl.learner import check_finite
from kevin_jax.rl.step_metrics import rollout_metrics
from kevin_jax.rl.task_sampler import TaskSampler


def step_seed(seed: int, step: int) -> int:
  """The integer seed of RL step `step` (sampling, row shuffling): a pure function, so resume reproduces it."""
  return int(jax.random.randint(jax.random.fold_in(jax.random.key(seed), step), (), 0, 2**31 - 1))


def make_generate(policy: runtime.Policy, params, temperature: float | None = None):
  """The rollout's generate callable over the current parameters (jit arguments: no copy, no recompile), sampling
  at `temperature` (None = the sampler's default, sampler.temperature, which the learner's log-probs assume)."""
  def generate(prompt_ids, seed):
    out = policy.sampler.generate(params, prompt_ids, seed=seed, temperature=temperature)
    # The learner's convention for old log-probs is the sampled (tempered) distribution.
    return ro.Generation(out.tokens, out.text, out.sampling_logprobs, out.finish_reason)
  return generate


def rl_step(step: int, state, *, config, policy: runtime.Policy, reward, sources: dict[str, str],
            task_sampler: TaskSampler, grpo_cfg: grpo.GRPOConfig, workdir: str, ref_params=None,
            novelty_index=None):
  """One RL step; returns (new state, metrics dict of host scalars). `ref_params`: rl.kl_beta's reference;
  `novelty_index`: the warm-start corpus for the novelty metric (runtime.novelty_index)."""
  t_start = time.perf_counter()
  seed = step_seed(config.seed, step)
  task_ids = task_sampler.next(config.rollout.tasks_per_step)
  turns, times = ro.rollout(
      ro.fresh_starts(task_ids, config.rollout.trajectories), sources, turns=config.rollout.turns,
      generate=make_generate(policy, state.params), reward=reward, encode_chat=policy.encode_chat,
      max_context_tokens=config.rollout.max_context_tokens, seed=seed,
      feedback_max_chars=config.rollout.feedback_max_chars)
  if config.rollout.save_turns:
    _save_turns(workdir, step, turns)
  returns, advantages = batch_lib.turn_advantages(turns, grpo_cfg, seed=seed)
  train_turns, train_adv = batch_lib.trainable(turns, advantages)  # Task-level problems are not the policy's.
  t_learn = time.perf_counter()
  if train_turns:
    batch = batch_lib.build_batch(train_turns, train_adv, pad_id=policy.tokenizer.pad_id,
                                  rows_multiple=policy.learner.rows_multiple(), seed=seed)
    state, learner_metrics = policy.learner.step(state, batch, ref_params=ref_params)
    learner_metrics = jax.device_get(learner_metrics)
    check_finite(learner_metrics, step)
    rows, seq_len = int(batch.tokens_BxT.shape[0]), int(batch.tokens_BxT.shape[1])
  else:
    logging.warning("step %d: every turn's result is a task-level problem (evaluator error, task too large); "
                    "no update", step)
    learner_metrics, rows, seq_len = {"grad_norm": 0.0}, 0, 0
  learn_s = time.perf_counter() - t_learn
  m = rollout_metrics(turns, times, returns, advantages, novelty_index)
  m.update({f"learner/{k}": v for k, v in learner_metrics.items() if getattr(v, "ndim", 0) == 0})
  total = time.perf_counter() - t_start
  m.update({"time/learn_s": learn_s, "time/step_s": total, "time/share_generate": times.generate_s / total,
            "time/share_evaluate": times.reward_s / total, "time/share_learn": learn_s / total,
            "batch/rows": rows, "batch/seq_len": seq_len,
            "tasks": ",".join(task_ids)})
  return state, m


class InTrainingEval:
  """The RL job's evaluations of its current policy (config.evaluation.in_training_*) on fixed task splits.

  Each split keeps one sampling seed for the whole run, so the step-0 (starting policy) and later numbers are
  paired. Scalars go to workdir/eval_metrics.jsonl as '<split>/<metric>' (evaluate.summarize), every turn to
  workdir/eval_rollouts/step_NNNNNN_<split>.jsonl.
  """

  def __init__(self, config, train_specs, train_sources: dict[str, str], policy: runtime.Policy, workdir: str,
               novelty_index=None):
    e = config.evaluation
    self.config, self.policy, self.workdir = config, policy, workdir
    self.novelty_index = novelty_index
    self.settings = evaluate.EvalSettings.in_training(config)
    self.splits: dict[str, tuple[list[str], dict[str, str]]] = {}
    for split in e.in_training_splits:
      specs, sources = ((train_specs, train_sources) if split == "train" else runtime.load_tasks(config, split))
      ids = [sp.id for sp in specs][:e.in_training_max_tasks or None]
      if not ids:
        raise ValueError(f"evaluation.in_training_splits: split {split!r} has no tasks")
      self.splits[split] = (ids, {i: sources[i] for i in ids})
    self._writer = None
    self.records: list[dict] = []  # The latest evaluation's turns (rollout.Turn.record).

  def due(self, step: int, last: int | None = None) -> bool:
    """Before step 1 (unless in_training_first is False), every in_training_every steps, and after `last`
    (default: total_steps)."""
    e = self.config.evaluation
    last = self.config.total_steps if last is None else last
    if not self.splits:
      return False
    if step == 0:
      return e.in_training_first
    return step == last or (e.in_training_every > 0 and step % e.in_training_every == 0)

  def __call__(self, step: int, params, reward) -> dict[str, float]:
    """Evaluates every split; keeps the turns' records for `write_standard_report`."""
    if self._writer is None:
      self._writer = metrics_lib.MetricWriter(self.workdir, tensorboard=self.config.logging.tensorboard,
                                              filename="eval_metrics.jsonl", tensorboard_dir="tensorboard_eval")
    out, records = {}, []
    for i, (split, (ids, sources)) in enumerate(self.splits.items()):
      summary, turns = evaluate.evaluate_policy(
          ids, sources, self.settings, seed=1_000_003 * (self.config.seed + 1) + i,
          generate=make_generate(self.policy, params, self.settings.temperature), reward=reward,
          encode_chat=self.policy.encode_chat, novelty_index=self.novelty_index)
      _save_turns(self.workdir, step, turns, subdir="eval_rollouts", suffix=f"_{split}")
      records += [t.record(step) for t in turns]
      out.update({f"{split}/{k}": v for k, v in summary.items()})
      k = self.settings.trajectories
      logging.info("eval at step %d, %s split (%d tasks, %d x %d): kernel score mean %.3f, kernels correct %.1f%%, "
                   "correct best@%d %.0f%%, perf best@%d %.2fx, perf avg@%d %.2fx; generate %.0f s, evaluate %.0f s "
                   "(%d GPU runs, %.0f s; %d results cached)", step, split, len(ids), k,
                   self.settings.turns, summary["kernel/score_mean"], 100 * summary["kernel/correct_rate"], k,
                   100 * summary["correct_best"], k, summary["perf_best"], k, summary["perf_avg"],
                   summary["time/generate_s"], summary["time/evaluate_s"], summary["evaluator/gpu_runs"],
                   summary["evaluator/gpu_s"], summary["evaluator/cached"])
    self._writer.write(step, out)
    self.records = records
    return out

  def write_standard_report(self) -> None:
    """The field's standard report (kevin_jax/report/standard.py) of the latest evaluation's turns, all splits, into
    workdir/report."""
    evaluate.write_standard_report(self.config, self.records, os.path.join(self.workdir, "report"))

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()


def _save_turns(workdir: str, step: int, turns, subdir: str = "rollouts", suffix: str = "") -> None:
  d = os.path.join(workdir, subdir)
  os.makedirs(d, exist_ok=True)
  path = os.path.join(d, f"step_{step:06d}{suffix}.jsonl")
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    for t in turns:
      f.write(json.dumps(t.record(step)) + "\n")
  os.replace(path + ".tmp", path)  # A crash never leaves a half-written step file.


def _write_config(workdir: str, config) -> None:
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    f.write(config.to_json_best_effort(indent=1, sort_keys=True))


_now = time.monotonic  # The wall clock of the time budget (tests substitute a fake one).


class TimeBudget:
  """config.time_budget_s: does another step plus the closing evaluation still fit? (module docstring)."""

  def __init__(self, budget_s: float, eval_s: float = 0.0):
    if budget_s < 0:
      raise ValueError(f"time_budget_s must be >= 0 (0 = no budget), got {budget_s}")
    if eval_s < 0:
      raise ValueError(f"time_budget_eval_s must be >= 0 (0 = unknown), got {eval_s}")
    self.budget_s, self.start = float(budget_s), _now()
    self.step_s, self.eval_s = 0.0, float(eval_s)  # eval_s: the given estimate until a longer one is measured.

  @contextlib.contextmanager
  def timing(self, kind: str):
    """Times a step (kind 'step': the last one counts) or an evaluation ('eval': the longest counts)."""
    t = _now()
    yield
    dt = _now() - t
    if kind == "eval":
      self.eval_s = max(self.eval_s, dt)
    else:
      self.step_s = dt

  def room_for_step(self, evaluating_now: bool) -> tuple[bool, float, float]:
    """(fits, seconds left, seconds needed): another step and the closing evaluation, after this step's own
    evaluation if `evaluating_now`."""
    left = self.budget_s - (_now() - self.start)
    need = self.step_s + self.eval_s * (2 if evaluating_now else 1)
    return self.budget_s <= 0 or left >= need, left, need


def _warm_start_dir(config, workdir: str) -> str | None:
  """For the embedded default (sft.before_rl and no other start point): the warm start's HF export, trained first
  if missing (resumable; a finished one is reused). None otherwise: RL starts from runtime.start_source."""
  if config.sft.before_rl and not runtime.start_source(config):
    # Before any evaluator worker takes GPU memory.
    from kevin_jax import sft  # pylint: disable=g-import-not-at-top
    return sft.warm_start(config, os.path.join(workdir, "sft"))
  return None


def run(config, workdir: str) -> None:
  """mode=train."""
  if config.total_steps < 0:
    raise ValueError(f"total_steps must be >= 0 (0 = evaluate the starting policy only), got {config.total_steps}")
  budget = TimeBudget(config.time_budget_s, config.time_budget_eval_s)  # From the job's start (warm start too).
  runtime.require_gpu_for_evaluator(config)
  specs, sources = runtime.load_tasks(config, "train")
  if config.rollout.context_from_tasks:  # Every task the job prompts: the training and evaluation splits.
    config = runtime.fit_context_to_tasks(config, runtime.load_tasks(config, "all")[1])
  policy = runtime.build_policy(config)
  runtime.check_prompt_budget(policy, sources, config.rollout.max_context_tokens)
  runtime.check_host_memory(config, policy, warm_start=bool(config.sft.before_rl and not runtime.start_source(config)),
                            rl=config.total_steps > 0)
  grpo_cfg = grpo.GRPOConfig.from_config(config.rl)
  os.makedirs(workdir, exist_ok=True)
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=config.checkpoint.keep)
  task_sampler = TaskSampler([s.id for s in specs], seed=config.seed)
  rng = init_rng = jax.random.key(config.seed)
  start = ckpt.latest_step()
  ref_params = None  # rl.kl_beta > 0: the starting policy, frozen (rebuilt from its source on resume).
  if start is not None:
    restored = ckpt.restore(policy.learner.abstract_state)
    state, rng = restored.state, restored.rng if restored.rng is not None else rng
    task_sampler.restore(restored.sampler_state["tasks"])
    logging.info("resuming %s from step %d", workdir, start)
  else:
    start = 0
    state = runtime.initial_state(config, policy, rng, src=_warm_start_dir(config, workdir))
    if grpo_cfg.kl_beta > 0:
      ref_params = policy.learner.copy_params(state.params)
  _write_config(workdir, config)
  task_hygiene.write_report(config, runtime.task_source(config), workdir)  # tasks.hygiene: what left the task list.
  hf_dir = os.path.join(workdir, "hf")
  if start > 0 and start >= config.total_steps:
    logging.info("nothing to do: checkpoint step %d >= total_steps %d", start, config.total_steps)
    # A finished run whose export is missing (a crash during it).
    if config.checkpoint.export_hf and not runtime.is_hf_checkpoint(hf_dir):
      runtime.export_hf(policy, state.params, hf_dir)
    ckpt.close()
    return
  if grpo_cfg.kl_beta > 0 and ref_params is None:  # Resumed: rebuild the starting policy from its source.
    ref_params = runtime.initial_params(config, policy, init_rng, src=_warm_start_dir(config, workdir))
  novelty = runtime.novelty_index(config)
  in_eval = InTrainingEval(config, specs, sources, policy, workdir, novelty)
  reward = runtime.make_reward(config, config.tasks.source)
  writer = metrics_lib.MetricWriter(workdir, tensorboard=config.logging.tensorboard)
  progress = metrics_lib.Progress(config.total_steps, "rl step", start=start, every_s=0.0, unit="steps")
  last = config.total_steps  # The time budget may make an earlier step the last one.
  if last == 0:
    logging.info("total_steps=0: evaluating the starting policy only (no RL step, no checkpoint, no export)")
  try:
    if start == 0 and in_eval.due(0):
      with budget.timing("eval"):
        in_eval(0, state.params, reward)  # The starting policy (after any warm start), before any RL update.
        if last == 0 and config.evaluation.standard_report:
          in_eval.write_standard_report()
    for step in range(start + 1, config.total_steps + 1):
      with budget.timing("step"):
        state, m = rl_step(step, state, config=config, policy=policy, reward=reward, sources=sources,
                           task_sampler=task_sampler, grpo_cfg=grpo_cfg, workdir=workdir, ref_params=ref_params,
                           novelty_index=novelty)
      writer.write(step, m)
      progress.update(1, reward=m["reward/mean"], correct=m["correct/rate"],
                      grad_norm=float(m["learner/grad_norm"]), gen_s=m["time/generate_s"],
                      eval_s=m["time/evaluate_s"], learn_s=m["time/learn_s"],
                      gen_tok_s=m["speed/generate_tokens_per_s"], evals_s=m["speed/evaluations_per_s"],
                      gpu_runs=m["evaluator/gpu_runs"], cached=m["evaluator/cached"])
      fits, left, need = budget.room_for_step(evaluating_now=in_eval.due(step))
      if step < last and not fits:
        last = step
        logging.warning("time budget (%.0f s): step %d of %d is the last; %.0f s left, another step and the "
                        "closing evaluation need ~%.0f s. Rerun in the same workdir to continue.",
                        config.time_budget_s, step, config.total_steps, left, need)
      if step == last and config.checkpoint.export_hf:
        # Before the closing evaluation, which can take minutes: a job killed during it (e.g. at a host's time
        # limit) keeps the trained policy. A resumed run redoes the step and writes the export again.
        runtime.export_hf(policy, state.params, hf_dir)
      if in_eval.due(step, last):  # Before the checkpoint: a crash during it redoes the step and the evaluation.
        with budget.timing("eval"):
          in_eval(step, state.params, reward)
          if step == last and config.evaluation.standard_report:
            in_eval.write_standard_report()
      if step % config.checkpoint.every_steps == 0 or step == last:
        ckpt.save(step, state, rng=rng, sampler_state={"tasks": task_sampler.state()}, config=config)
      if step == last:
        break
  finally:
    writer.close()
    in_eval.close()
    ckpt.close()
    if hasattr(reward, "close"):
      reward.close()
