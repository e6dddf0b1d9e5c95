"""The multi-turn RL loop (Kevin): sample tasks -> rollouts -> rewards -> advantages -> update -> log -> save.

  python -m kevin_jax.main --config=configs/multiturn.py --workdir=runs/multiturn

Per step: `rollout.tasks_per_step` tasks from a seeded epoch sampler; m trajectories x n turns each through
the jitted sampler (the learner's parameters, no copy) and the reward (the sandboxed CUDA evaluator in its own
process, or a scripted reward for CPU dry runs); per-turn discounted returns and per-task advantages; one learner
step (`rl.updates_per_batch` optimizer updates). Writes workdir/metrics.jsonl (+ TensorBoard),
workdir/rollouts/step_NNNNNN.jsonl (every turn: prompt id, response, result), workdir/config.json, and Orbax
checkpoints in workdir/checkpoints. Rerunning with the same workdir resumes from the latest checkpoint: step,
parameters, optimizer, RNG and task-sampler state; every step's randomness derives from (seed, step), so a
resumed run reproduces an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import time

import jax
from absl import logging

from kevin_jax import checkpoint as ckpt_lib
from kevin_jax import metrics as metrics_lib
from kevin_jax import runtime
from kevin_jax.rl import batch as batch_lib
from kevin_jax.rl import grpo
from kevin_jax.rl import rollout as ro
from kevin_jax.rl.learner import check_finite
from kevin_jax.rl.step_metrics import rollout_metrics
from kevin_jax.rl.task_sampler import TaskSampler


def step_seed(seed: int, step: int) -> int:
  """The integer seed of RL step `step` (sampling, row shuffling): a pure function, so resume reproduces it."""
  return int(jax.random.randint(jax.random.fold_in(jax.random.key(seed), step), (), 0, 2**31 - 1))


def make_generate(policy: runtime.Policy, params):
  """The rollout's generate callable over the current parameters (jit arguments: no copy, no recompile)."""
  def generate(prompt_ids, seed):
    out = policy.sampler.generate(params, prompt_ids, seed=seed)
    # The learner's convention for old log-probs is the sampled (tempered) distribution.
    return ro.Generation(out.tokens, out.text, out.sampling_logprobs, out.finish_reason)
  return generate


def rl_step(step: int, state, *, config, policy: runtime.Policy, reward, sources: dict[str, str],
            task_sampler: TaskSampler, grpo_cfg: grpo.GRPOConfig, workdir: str):
  """One RL step; returns (new state, metrics dict of host scalars)."""
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
  returns, advantages = batch_lib.turn_advantages(turns, grpo_cfg)
  batch = batch_lib.build_batch(turns, advantages, pad_id=policy.tokenizer.pad_id,
                                rows_multiple=policy.learner.rows_multiple(), seed=seed)
  t_learn = time.perf_counter()
  state, learner_metrics = policy.learner.step(state, batch)
  learner_metrics = jax.device_get(learner_metrics)
  check_finite(learner_metrics, step)
  learn_s = time.perf_counter() - t_learn
  m = rollout_metrics(turns, times, returns, advantages)
  m.update({f"learner/{k}": v for k, v in learner_metrics.items() if getattr(v, "ndim", 0) == 0})
  total = time.perf_counter() - t_start
  m.update({"time/learn_s": learn_s, "time/step_s": total, "time/share_generate": times.generate_s / total,
            "time/share_evaluate": times.reward_s / total, "time/share_learn": learn_s / total,
            "batch/rows": int(batch.tokens_BxT.shape[0]), "batch/seq_len": int(batch.tokens_BxT.shape[1]),
            "tasks": ",".join(task_ids)})
  return state, m


def _save_turns(workdir: str, step: int, turns) -> None:
  d = os.path.join(workdir, "rollouts")
  os.makedirs(d, exist_ok=True)
  path = os.path.join(d, f"step_{step:06d}.jsonl")
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    for t in turns:
      f.write(json.dumps(t.record(step)) + "\n")
  os.replace(path + ".tmp", path)  # A crash never leaves a half-written step file.


def _write_config(workdir: str, config) -> None:
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    f.write(config.to_json_best_effort(indent=1, sort_keys=True))


def run(config, workdir: str) -> None:
  """mode=train."""
  runtime.require_gpu_for_evaluator(config)
  specs, sources = runtime.load_tasks(config, "train")
  policy = runtime.build_policy(config)
  runtime.check_prompt_budget(policy, sources, config.rollout.max_context_tokens)
  grpo_cfg = grpo.GRPOConfig.from_config(config.rl)
  os.makedirs(workdir, exist_ok=True)
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=config.checkpoint.keep)
  task_sampler = TaskSampler([s.id for s in specs], seed=config.seed)
  rng = jax.random.key(config.seed)
  start = ckpt.latest_step()
  if start is not None:
    restored = ckpt.restore(policy.learner.abstract_state)
    state, rng = restored.state, restored.rng if restored.rng is not None else rng
    task_sampler.restore(restored.sampler_state["tasks"])
    logging.info("resuming %s from step %d", workdir, start)
  else:
    start = 0
    src = None
    if config.sft.before_rl and not (config.init_from or config.policy.checkpoint):
      # The embedded default: warm-start the random policy on the suite's corpus first (issue 8), before any
      # evaluator worker takes GPU memory. Resumable; a finished warm start is reused.
      from kevin_jax import sft  # pylint: disable=g-import-not-at-top
      src = sft.warm_start(config, os.path.join(workdir, "sft"))
    state = runtime.initial_state(config, policy, rng, src=src)
  _write_config(workdir, config)
  if start >= config.total_steps:
    logging.info("nothing to do: checkpoint step %d >= total_steps %d", start, config.total_steps)
    ckpt.close()
    return
  reward = runtime.make_reward(config, config.tasks.source)
  writer = metrics_lib.MetricWriter(workdir, tensorboard=config.logging.tensorboard)
  progress = metrics_lib.Progress(config.total_steps, "rl step", start=start, every_s=0.0, unit="steps")
  try:
    for step in range(start + 1, config.total_steps + 1):
      state, m = rl_step(step, state, config=config, policy=policy, reward=reward, sources=sources,
                         task_sampler=task_sampler, grpo_cfg=grpo_cfg, workdir=workdir)
      writer.write(step, m)
      progress.update(1, reward=m["reward/mean"], correct=m["correct/rate"],
                      grad_norm=float(m["learner/grad_norm"]), gen_s=m["time/generate_s"],
                      eval_s=m["time/evaluate_s"], learn_s=m["time/learn_s"])
      if step % config.checkpoint.every_steps == 0 or step == config.total_steps:
        ckpt.save(step, state, rng=rng, sampler_state={"tasks": task_sampler.state()}, config=config)
  finally:
    writer.close()
    ckpt.close()
    if hasattr(reward, "close"):
      reward.close()
