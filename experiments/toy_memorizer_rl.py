"""Toy check of GRPO on a memorised policy (CPU, minutes): does RL sharpen or blur what SFT memorised?

The embedded default's warm start is a small policy fitted to ~0 loss on a few hundred episodes. This toy has the
same shape at CPU size: a tiny Qwen2 memorises one target sequence per prompt through the real Learner
(advantage 1 = SFT), then the real GRPO learner trains it on its own samples with a verifier-like reward, and a
fixed-seed evaluation tracks the share of exact-enough samples and the mean sampled-token NLL (an entropy proxy)
after every few steps. Results: experiments/toy_memorizer/README.md.

  # one row of that study (~3-10 min on 2 CPU cores): GRPO vs positives-only, every prompt in every step
  python experiments/toy_memorizer_rl.py --sft-steps 120 --prompts 32 --target-len 80 --tolerance 1 \
      --lrs 1e-3 --negative-scales 0,1 --tasks-per-step 32 --group 8 --rl-steps 20 --out toy.jsonl

Reward per sample (one group = the samples of one prompt): correct = the response equals the target plus EOS
with at most --tolerance differing tokens; score = correct * (0.3 + speedup), speedup ~ 1 + 0.1 N(0, 1) (a
noisy timing, as the kernel reward). Everything else is the default RL config (std-normalised advantages,
Clip-Higher, loss_agg=constant, 2 updates per batch, AdamW with global-norm clip 0.05); --negative-scales sets
rl.negative_scale (0 = reinforce only the above-baseline samples).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position

from kevin_jax import sharding  # pylint: disable=wrong-import-position
from kevin_jax.policy.config import get_preset  # pylint: disable=wrong-import-position
from kevin_jax.policy.sampler import Sampler, SamplerConfig  # pylint: disable=wrong-import-position
from kevin_jax.rl import grpo  # pylint: disable=wrong-import-position
from kevin_jax.rl.learner import Learner, TrainBatch, pad_batch  # pylint: disable=wrong-import-position
from kevin_jax.rl.optimizer import OptimizerConfig  # pylint: disable=wrong-import-position

EOS = 1
TEMPERATURE = 0.9  # Sampling (and learner) temperature unless --temperature says otherwise.


def make_task(num_prompts: int, prompt_len: int, target_len: int, seed: int, free_len: int = 0):
  """Prompts and their targets: free_len unscored tokens (the 'reasoning'), target_len scored ones, EOS."""
  rng = np.random.default_rng(seed)
  prompts = rng.integers(10, 8000, (num_prompts, prompt_len)).tolist()
  targets = [t + [EOS] for t in rng.integers(10, 8000, (num_prompts, free_len + target_len)).tolist()]
  return prompts, targets


def pack(prompts, responses, advantages, old_logps, multiple: int) -> TrainBatch:
  """Right-padded rows: prompt (context) + response (trained with the row's advantage)."""
  length = max(len(p) + len(r) for p, r in zip(prompts, responses))
  length = -(-length // 16) * 16
  b = len(prompts)
  tokens = np.zeros((b, length), np.int32)
  attn = np.zeros((b, length), np.int32)
  loss = np.zeros((b, length), np.float32)
  old = np.zeros((b, length), np.float32)
  for i, (p, r) in enumerate(zip(prompts, responses)):
    tokens[i, :len(p) + len(r)] = p + r
    attn[i, :len(p) + len(r)] = 1
    loss[i, len(p):len(p) + len(r)] = 1.0
    old[i, len(p):len(p) + len(r)] = old_logps[i]
  return pad_batch(TrainBatch(tokens, attn, loss, old, np.asarray(advantages, np.float32)), multiple)


def response_budget(targets) -> int:
  """Max new tokens per sample: the longest target (its EOS included) plus 7 spare tokens."""
  return len(targets[0]) + 7


def is_correct(response, target, tolerance: int, free_len: int = 0) -> bool:
  """Same length as the target and at most `tolerance` differing tokens after the first free_len (unscored)."""
  return (len(response) == len(target)
          and sum(a != b for a, b in zip(response[free_len:], target[free_len:])) <= tolerance)


def evaluate(sampler, params, prompts, targets, samples: int, tolerance: int, free_len: int = 0,
             seed: int = 12345) -> dict:
  """Fixed-seed samples of every prompt: share correct, mean NLL of the sampled tokens at the sampler's
  temperature (all, and of the unscored first free_len tokens alone)."""
  rows = [p for p in prompts for _ in range(samples)]
  out = sampler.generate(params, rows, seed=seed, max_new_tokens=response_budget(targets), eos_ids=[EOS])
  ok = [is_correct(toks, targets[i // samples], tolerance, free_len) for i, toks in enumerate(out.tokens)]
  nll = np.concatenate([-lp for lp in out.sampling_logprobs])
  rec = {"correct": float(np.mean(ok)), "nll": float(nll.mean()),
         "len": float(np.mean([len(t) for t in out.tokens]))}
  if free_len:
    rec["nll_free"] = float(np.concatenate([-lp[:free_len] for lp in out.sampling_logprobs]).mean())
  return rec


MODEL = get_preset("tiny", param_dtype="float32", compute_dtype="float32")


def warm_start(args, sft_steps: int, prompts, targets, mesh):
  """SFT through the learner: advantage 1, token-mean loss, one update per batch (= cross-entropy descent)."""
  sft = Learner(MODEL, grpo.GRPOConfig(loss_agg="token_mean", updates_per_batch=1, micro_batch_size=16,
                                       scan_layers=False),
                OptimizerConfig(learning_rate=3e-3, warmup_steps=10, max_grad_norm=1.0), mesh, temperature=1.0)
  state = sft.init_state(jax.random.key(args.seed))
  batch = pack(prompts, targets, np.ones(len(prompts)), [np.zeros(len(t)) for t in targets], sft.rows_multiple())
  for _ in range(sft_steps):
    state, _ = sft.step(state, batch)
  return jax.device_get(state.params)


def moved(start, now) -> float:
  """||now - start|| / ||start|| over all parameters: how far RL has taken the policy from its warm start."""
  d = sum(float(jnp.sum(jnp.square(jnp.asarray(b, jnp.float32) - jnp.asarray(a, jnp.float32))))
          for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(now)))
  n = sum(float(jnp.sum(jnp.square(jnp.asarray(a, jnp.float32)))) for a in jax.tree.leaves(start))
  return (d / n) ** 0.5


def run(args, params, sft_steps: int, lr: float, mode: str, neg: float, alpha: float, tasks_per_step: int, prompts,
        targets, mesh, sampler, log) -> list[dict]:
  """GRPO from the warm-started `params` on the policy's own samples; evaluations every args.eval_every steps."""
  adv_kw = {"adv_std_normalize": mode != "unnormalized"}
  rl_cfg = grpo.GRPOConfig(loss_constant=float(response_budget(targets)), micro_batch_size=16,
                           scan_layers=False, kl_beta=args.kl_beta, negative_scale=neg, adv_prob_weight=alpha,
                           **adv_kw)
  learner = Learner(MODEL, rl_cfg, OptimizerConfig(learning_rate=lr, warmup_steps=args.warmup, eps=args.adam_eps,
                                                   name=args.optimizer),
                    mesh, temperature=args.temperature)
  state = learner.state_from_params(jax.tree.map(jnp.asarray, params))
  ref = learner.copy_params(state.params) if args.kl_beta > 0 else None  # KL to the warm start.
  rng = np.random.default_rng(args.seed + 1)
  history = []
  for step in range(args.rl_steps + 1):
    if step % args.eval_every == 0:
      rec = {"sft_steps": sft_steps, "lr": lr, "mode": mode, "negative_scale": neg, "adv_prob_weight": alpha,
             "free_len": args.free_len, "tasks_per_step": tasks_per_step,
             "kl_beta": args.kl_beta, "adam_eps": args.adam_eps, "optimizer": args.optimizer,
             "shuffled": args.shuffle_advantages, "temperature": args.temperature, "step": step,
             "moved": moved(params, state.params),
             **evaluate(sampler, state.params, prompts, targets, args.eval_samples, args.tolerance, args.free_len)}
      history.append(rec)
      log(rec)
    if step == args.rl_steps:
      break
    picked = rng.choice(len(prompts), tasks_per_step, replace=False)
    rows = [int(i) for i in picked for _ in range(args.group)]
    out = sampler.generate(state.params, [prompts[i] for i in rows], seed=1000 + step,
                           max_new_tokens=response_budget(targets), eos_ids=[EOS])
    ok = np.array([is_correct(t, targets[i], args.tolerance, args.free_len) for t, i in zip(out.tokens, rows)],
                  np.float32)
    scores = ok * (0.3 + 1.0 + 0.1 * rng.normal(size=len(rows)))
    groups = np.repeat(np.arange(tasks_per_step), args.group).astype(np.int32)
    adv = np.asarray(grpo.group_advantages(scores, groups, std_normalize=rl_cfg.adv_std_normalize,
                                           num_groups=tasks_per_step))
    adv = np.asarray(grpo.scale_negatives(adv, rl_cfg.negative_scale))
    if args.shuffle_advantages:  # The null control (rl.shuffle_advantages): same values, no signal.
      adv = rng.permutation(adv)
    batch = pack([prompts[i] for i in rows], out.tokens, adv, out.logprobs, learner.rows_multiple())
    state, _ = learner.step(state, batch, ref_params=ref)
  return history


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--sft-steps", default="300,60", help="comma-separated SFT lengths (memorised vs partly fitted)")
  p.add_argument("--lrs", default="1e-5,1e-4", help="comma-separated RL learning rates")
  p.add_argument("--modes", default="default", help="comma-separated: default | unnormalized (no std division)")
  p.add_argument("--negative-scales", default="1", help="comma-separated rl.negative_scale values (1 = GRPO)")
  p.add_argument("--prob-weights", default="0", help="comma-separated rl.adv_prob_weight values (0 = off)")
  p.add_argument("--free-len", type=int, default=0,
                 help="unscored target tokens before the scored ones (like reasoning the reward never checks)")
  p.add_argument("--kl-beta", type=float, default=0.0, help="rl.kl_beta: k3 KL to the warm start")
  p.add_argument("--shuffle-advantages", action="store_true", help="null control: permute each batch's advantages")
  p.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"), help="optimizer.name of the RL phase")
  p.add_argument("--adam-eps", type=float, default=1e-8, help="optimizer.eps (Adam's denominator floor)")
  p.add_argument("--rl-steps", type=int, default=40)
  p.add_argument("--eval-every", type=int, default=10)
  p.add_argument("--eval-samples", type=int, default=16)
  p.add_argument("--prompts", type=int, default=16)
  p.add_argument("--target-len", type=int, default=40)
  p.add_argument("--tolerance", type=int, default=2, help="differing tokens a correct sample may have")
  p.add_argument("--tasks-per-step", default="2", help="comma-separated prompts per RL step")
  p.add_argument("--warmup", type=int, default=1, help="RL optimizer updates of linear warmup")
  p.add_argument("--group", type=int, default=32, help="samples per prompt per RL step")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--temperature", type=float, default=TEMPERATURE, help="sampling temperature of RL and evaluation")
  p.add_argument("--out", default="", help="JSONL file for every evaluation record")
  args = p.parse_args(argv)
  out = open(args.out, "w", encoding="utf-8") if args.out else None

  def log(rec):
    print(json.dumps(rec), flush=True)
    if out:
      out.write(json.dumps(rec) + "\n")
      out.flush()

  t0 = time.time()
  mesh = sharding.make_mesh((("fsdp", 1), ("tensor", 1)), jax.devices()[:1])
  prompts, targets = make_task(args.prompts, 8, args.target_len, args.seed, args.free_len)
  sampler = Sampler(MODEL, None, SamplerConfig(batch_size=64, prompt_buckets=(16,), kv_cache_dtype="float32",
                                               max_new_tokens=response_budget(targets), temperature=args.temperature))
  for sft_steps in map(int, args.sft_steps.split(",")):
    params = warm_start(args, sft_steps, prompts, targets, mesh)
    for lr in map(float, args.lrs.split(",")):
      for mode in args.modes.split(","):
        for neg in map(float, args.negative_scales.split(",")):
          for alpha in map(float, args.prob_weights.split(",")):
            for tasks in map(int, args.tasks_per_step.split(",")):
              run(args, params, sft_steps, lr, mode, neg, alpha, tasks, prompts, targets, mesh, sampler, log)
  print(f"done in {time.time() - t0:.0f} s", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
