"""How much a policy explores on first-turn prompts, by sampling temperature (no evaluator, no GPU needed).

GRPO learns only from differences between a task's samples: a group of identical responses has zero advantage.
This samples k first-turn responses per training task at each temperature and reports, per temperature:
  distinct     distinct responses per sample (1/k = all identical, 1 = all different), mean over tasks;
  well_formed  share whose reasoning closes and whose ```cuda / ```plan blocks parse (kernels/candidate.py);
  designs      share whose ```cuda and ```plan blocks are one of the bundled suite's labelled candidates for the task
               (by name: naive, optimized, wrong_*) or none of them (novel);
  tokens       mean response tokens; nll mean negative log-likelihood per sampled token at temperature 1.

  python experiments/sample_diversity.py --checkpoint runs/warm/hf --tasks 8 --samples 16 \
      --temperatures 0.6,0.8,1.0 --out /tmp/diversity.json

Runs the default job's policy, tokenizer, prompt builder, task split and sampler (configs/multiturn.py); --dtype
overrides the policy's parameter and compute dtypes (e.g. float32 on a CPU without fast bf16).
"""
import argparse
import collections
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import multiturn  # pylint: disable=g-import-not-at-top
from kevin_jax import runtime
from kevin_jax.kernels import candidate as candidate_lib
from kevin_jax.kernels import suite
from kevin_jax.rl import prompts


_CUDA_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_PLAN_COMMENT = re.compile(r"#[^\n]*")


def candidate_key(text: str) -> str | None:
  """The ```cuda and ```plan blocks with comments dropped and whitespace normalised (several suite candidates share a
  kernel and differ only in the plan), or None if the candidate does not parse. Two candidates with the same key
  are the same program: a response that only rewords a comment is still a copy."""
  try:
    c = candidate_lib.parse_candidate(text)
  except candidate_lib.FormatError:
    return None
  cuda = _CUDA_COMMENT.sub(" ", c.cuda_source)
  plan = _PLAN_COMMENT.sub(" ", c.plan_text)
  return " ".join(cuda.split()) + " | " + " ".join(plan.split())


def suite_designs() -> dict[str, dict[str, str]]:
  """task id -> {candidate_key: candidate name} over the bundled suite: what `classify` matches against."""
  return {t.id: {candidate_key(c.text): c.name for c in t.candidates()} for t in suite.load_suite()}


def classify(response: str, designs: dict[str, str]) -> tuple[bool, str]:
  """(well formed, design name | 'novel' | 'malformed') of one response; designs: candidate_key -> name."""
  parsed = prompts.parse_response(response)
  if parsed.error:
    return False, "malformed"
  key = candidate_key(parsed.candidate_text)
  if key is None:
    return False, "malformed"
  return True, designs.get(key, "novel")


def summarize(per_task: dict[str, list[str]], designs: dict[str, dict[str, str]]) -> dict:
  """Per-temperature figures over tasks: per_task maps task id -> its k response texts."""
  distinct, formed, counts, n = [], 0, collections.Counter(), 0
  for task_id, texts in per_task.items():
    distinct.append(len(set(texts)) / len(texts))
    for text in texts:
      ok, design = classify(text, designs[task_id])
      formed += ok
      counts[design.split("_")[0] if design.startswith("wrong") else design] += 1
      n += 1
  return {"distinct": sum(distinct) / len(distinct), "well_formed": formed / n,
          "designs": {k: v / n for k, v in sorted(counts.items())}}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--checkpoint", required=True, help="HF directory of the policy (e.g. a warm start's sft/hf)")
  ap.add_argument("--tasks", type=int, default=8, help="N training tasks spread evenly over the split (0 = all)")
  ap.add_argument("--samples", type=int, default=16, help="responses per task and temperature, k")
  ap.add_argument("--temperatures", default="0.6,0.8,1.0")
  ap.add_argument("--max-new-tokens", type=int, default=2048)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--dtype", default="", help="override policy.param_dtype/compute_dtype (float32 on a CPU)")
  ap.add_argument("--out", default="", help="write the figures and responses as JSON here")
  args = ap.parse_args(argv)
  config = multiturn.get_config()
  if args.dtype:
    config.policy.param_dtype = config.policy.compute_dtype = args.dtype
  temps = [float(t) for t in args.temperatures.split(",") if t]
  if not temps or any(t < 0 for t in temps) or args.samples < 1 or args.tasks < 0:
    raise SystemExit("need temperatures >= 0, --samples >= 1 and --tasks >= 0")

  policy = runtime.build_policy(config)
  params = runtime.load_params(args.checkpoint, policy)
  specs, sources = runtime.load_tasks(config, "train")
  ids = [s.id for s in specs]
  task_ids = ids[::max(1, len(ids) // args.tasks)][:args.tasks] if args.tasks else ids  # Spread over the split.
  bundled = suite_designs()
  designs = {tid: bundled.get(tid, {}) for tid in task_ids}
  prompt_ids = [policy.encode_chat(prompts.build_messages(sources[tid])) for tid in task_ids]

  report = {"checkpoint": args.checkpoint, "tasks": task_ids, "samples": args.samples, "by_temperature": {}}
  for temp in temps:
    t0 = time.perf_counter()
    per_task, tokens, nll = {}, [], []
    for tid, prompt in zip(task_ids, prompt_ids):  # One task per call: a CPU's prefill of many prompts is large.
      out = policy.sampler.generate(params, [prompt] * args.samples, seed=args.seed, temperature=temp,
                                    max_new_tokens=args.max_new_tokens)
      per_task[tid] = list(out.text)
      tokens += [len(t) for t in out.tokens]
      nll += [-float(sum(lp)) / max(1, len(lp)) for lp in out.logprobs]
    row = {**summarize(per_task, designs), "tokens": sum(tokens) / len(tokens), "nll": sum(nll) / len(nll),
           "seconds": time.perf_counter() - t0}
    report["by_temperature"][str(temp)] = {**row, "responses": per_task}
    print(f"T={temp}: " + json.dumps({k: (round(v, 3) if isinstance(v, float) else
                                          {a: round(b, 3) for a, b in v.items()} if isinstance(v, dict) else v)
                                      for k, v in row.items()}), flush=True)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(report, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
