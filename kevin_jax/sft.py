"""mode=sft: the supervised warm start of the policy on the task suite's corpus.

  python -m kevin_jax.main --config=configs/sft.py --workdir=runs/sft
  python -m kevin_jax.main --config=configs/multiturn.py --workdir=runs/rl --config.init_from=runs/sft/hf

Trains config.policy (the embedded 'small' preset with the bundled tokenizer and random init by default, or
config.init_from / policy.checkpoint) with token-level cross-entropy on the response tokens of a JSONL corpus
(kevin_jax/rl/sft_data.py: format, tokenization, splits, batch order; '' = the corpus of the task source, or of
sft.corpus_sources, built by kevin_jax/data/export_corpus.py).
Token ids of the corpus's prompts and responses come from the tokenizer's token cache under the evaluator's cache
root when an earlier job encoded them (kevin_jax/policy/token_cache.py: the same ids, encoded once per machine).
The step (kevin_jax/rl/sft_step.py) reuses the GRPO learner's state layout, shardings, master weights and
chunked log-probs, jitted once per (batch, length bucket).

Writes workdir/metrics.jsonl (+ TensorBoard): per step train/loss, train/token_acc, train/grad_norm, train/lr,
perf/tokens_per_s; every sft.eval_every_steps eval/loss and eval/token_acc (held-out examples of training
tasks), heldout_tasks/loss (examples of the task split's test tasks, never trained on) and sample/parse_rate
(greedy responses to held-out prompts that parse as <think>, ```cuda/```plan blocks and a summary; their texts in
workdir/samples/). Orbax checkpoints in workdir/checkpoints (state, step, data position, corpus digest);
rerunning resumes exactly (batch k is a pure function of (seed, k)). At the end the policy is exported as a
Hugging Face directory with tokenizer files in workdir/hf (runtime.load_params reads it, as it reads the Orbax
run directory itself).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import jax
import numpy as np
from absl import logging

from kevin_jax import checkpoint as ckpt_lib
from kevin_jax import metrics as metrics_lib
from kevin_jax import runtime
from kevin_jax import task_hygiene
from kevin_jax.policy.token_cache import TokenCache
from kevin_jax.rl import grpo
from kevin_jax.rl import prompts
from kevin_jax.rl import sft_data
from kevin_jax.rl.learner import Learner
from kevin_jax.rl.sft_step import SFTConfig, SFTStep, check_finite


@dataclasses.dataclass
class Data:
  """The tokenized corpus, split."""
  train: list[sft_data.Example]
  evals: list[sft_data.Example]  # Held-out examples of training tasks.
  heldout_tasks: list[sft_data.Example]  # Examples of the test split's tasks (never trained on).
  digest: str
  summary: dict


def _test_task_ids(config) -> set[str]:
  try:
    return {s.id for s in runtime.load_tasks(config, "test")[0]}
  except SystemExit:  # A source with no test split (e.g. one task file): nothing to hold out.
    return set()


def token_cache_path(config, tokenizer) -> str | None:
  """The tokenizer's persistent token cache (policy/token_cache.py) under the evaluator's cache root; None for a
  tokenizer without a fingerprint."""
  if not tokenizer.fingerprint:
    return None
  return os.path.join(task_hygiene.cache_root(config), "tokens", f"{tokenizer.fingerprint[:32]}.npz")


def load_data(config, tokenizer) -> Data:
  """Reads (or builds) the corpus, tokenizes it within sft.max_seq_len and splits it; clear errors."""
  s = config.sft
  cache = TokenCache(tokenizer, token_cache_path(config, tokenizer))
  try:
    if s.corpus:
      records, source = sft_data.read_corpus(s.corpus), s.corpus
    else:
      fit = (sft_data.rollout_fit(tokenizer, int(config.rollout.max_context_tokens), cache) if s.fit_prompts
             else None)
      names = tuple(s.corpus_sources) or (config.tasks.source,)
      try:
        records = [r for src, ids in sft_data.corpus_tasks(config)
                   for r in sft_data.bundled_corpus(ids, kinds=tuple(s.corpus_kinds), reasoning=s.corpus_reasoning,
                                                    fit=fit, source=src)]
      except ValueError as e:  # Unknown kinds or reasoning style.
        raise SystemExit(f"error: sft.corpus_kinds / sft.corpus_reasoning: {e}") from e
      source = f"task sources {', '.join(map(repr, names))} (kevin_jax/data/export_corpus.py)"
      if not records:
        raise sft_data.CorpusError(
            f"task sources {', '.join(map(repr, names))} have no bundled solutions to build a corpus from; give "
            "sources that have (--config.sft.corpus_sources=\"('bundled','generated')\") or a corpus file "
            "(--config.sft.corpus=FILE.jsonl)")
  except sft_data.CorpusError as e:
    raise SystemExit(f"error: {e}") from e
  examples, st = sft_data.tokenize(records, tokenizer, max_seq_len=s.max_seq_len, truncate=s.truncate, cache=cache)
  logging.info("sft corpus: %d texts newly tokenized (token cache: %s)", cache.new, cache.path or "in memory")
  cache.save()
  if not examples:
    raise SystemExit(f"error: all {st.records} corpus examples are longer than sft.max_seq_len = {s.max_seq_len} "
                     f"tokens (prompt + response + end-of-turn; the longest has {st.longest}). Raise "
                     "sft.max_seq_len or set sft.truncate=True.")
  train, evals, heldout = sft_data.split(examples, test_task_ids=_test_task_ids(config),
                                         exclude_test_tasks=s.exclude_test_tasks, eval_fraction=s.eval_fraction,
                                         seed=config.seed)
  if not train:
    raise SystemExit(f"error: no training examples left after holding out test tasks and eval examples "
                     f"({len(examples)} examples, {len(heldout)} of test tasks, {len(evals)} for eval)")
  over_budget = sum(len(e.target_ids) - 1 > config.sampler.max_new_tokens for e in train)
  summary = dict(source=source, records=st.records,
                 prompts_fitted=sum(bool(r.get("attempts_dropped")) for r in records),
                 kept=st.kept, dropped_too_long=st.dropped_too_long,
                 truncated=st.truncated, longest=st.longest, train=len(train), eval=len(evals),
                 heldout_tasks=len(heldout), train_tokens=sum(e.length for e in train),
                 train_target_tokens=sum(len(e.target_ids) for e in train),
                 responses_over_rl_budget=over_budget)
  logging.info("sft corpus: %s", summary)
  if st.dropped_too_long or st.truncated:
    logging.warning("sft: %d examples longer than sft.max_seq_len=%d were %s", st.dropped_too_long + st.truncated,
                    s.max_seq_len, "truncated" if s.truncate else "dropped")
  rl_len = int(config.rollout.max_context_tokens) + int(config.sampler.max_new_tokens)
  if s.max_seq_len < rl_len:
    logging.warning("sft: sft.max_seq_len=%d is shorter than RL's longest sequence (rollout.max_context_tokens + "
                    "sampler.max_new_tokens = %d): the warm start never trains at the lengths RL reaches",
                    s.max_seq_len, rl_len)
  if over_budget:
    logging.warning("sft: %d training responses are longer than sampler.max_new_tokens=%d (RL cuts them there)",
                    over_budget, config.sampler.max_new_tokens)
  return Data(train, evals, heldout, sft_data.corpus_digest(examples), summary)


def total_steps(config, num_train: int) -> int:
  s = config.sft
  if s.steps > 0:
    return int(s.steps)
  if s.epochs <= 0:
    raise SystemExit("error: set sft.steps > 0 or sft.epochs > 0")
  return max(1, math.ceil(s.epochs * num_train / s.batch_size))


def build_sft(config, policy: runtime.Policy, steps: int) -> tuple[runtime.Policy, SFTStep]:
  """An SFT learner (the GRPO Learner's layout with the SFT optimizer) swapped into `policy`, and its step."""
  cfg = SFTConfig.from_config(config, steps)
  rl_cfg = grpo.GRPOConfig(micro_batch_size=cfg.micro_batch_size, updates_per_batch=1,
                           logits_chunk=cfg.logits_chunk, scan_layers=cfg.scan_layers)
  learner = Learner(policy.model_cfg, rl_cfg, cfg.learner_optimizer(), policy.mesh, temperature=1.0)
  try:
    step = SFTStep(learner, cfg)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from e
  return dataclasses.replace(policy, learner=learner), step


def buckets(config) -> list[int]:
  m = int(config.sft.max_seq_len)
  return sorted({int(b) for b in config.sft.seq_buckets if int(b) < m} | {m})


class Evaluator:
  """Held-out loss / token accuracy and the greedy-decoding format check."""

  def __init__(self, config, policy: runtime.Policy, step: SFTStep, data: Data, workdir: str):
    self.config, self.policy, self.step, self.workdir = config, policy, step, workdir
    cap = config.sft.eval_max_examples or None
    self.sets = {name: sorted(exs[:cap], key=lambda e: e.length)
                 for name, exs in (("eval", data.evals), ("heldout_tasks", data.heldout_tasks)) if exs}
    pool = data.heldout_tasks + data.evals or data.train
    seen, self.prompts = set(), []
    for e in pool:
      if e.prompt_ids not in seen and len(self.prompts) < config.sft.sample_prompts:
        seen.add(e.prompt_ids)
        self.prompts.append(list(e.prompt_ids))

  def __call__(self, state, step_num: int) -> dict:
    out = {}
    rows, pad = self.config.sft.batch_size, self.policy.tokenizer.pad_id
    for name, exs in self.sets.items():
      sums = []
      for i in range(0, len(exs), rows):
        batch = sft_data.make_batch(exs[i:i + rows], rows, buckets(self.config), pad)
        sums.append(self.step.evaluate(state.params, self.step.put_batch(batch)))
      tot = {k: float(sum(np.asarray(s[k]) for s in jax.device_get(sums))) for k in sums[0]}
      out[f"{name}/loss"] = tot["nll_sum"] / max(tot["tokens"], 1.0)
      out[f"{name}/token_acc"] = tot["hits_sum"] / max(tot["tokens"], 1.0)
    if self.prompts:
      out.update(self._sample(state, step_num))
    return out

  def _sample(self, state, step_num: int) -> dict:
    gen = self.policy.sampler.generate(state.params, self.prompts, seed=0, temperature=0.0,
                                       max_new_tokens=self.config.sft.sample_max_new_tokens)
    parsed = [prompts.parse_response(t) for t in gen.text]
    d = os.path.join(self.workdir, "samples")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"step_{step_num:06d}.jsonl"), "w", encoding="utf-8") as f:
      for text, p, reason in zip(gen.text, parsed, gen.finish_reason):
        f.write(json.dumps({"step": step_num, "finish": reason, "parse_error": p.error, "text": text}) + "\n")
    return {"sample/parse_rate": float(np.mean([not p.error for p in parsed])),
            "sample/eos_rate": float(np.mean([r == "eos" for r in gen.finish_reason])),
            "sample/len_mean": float(np.mean([len(t) for t in gen.tokens]))}


def warm_start(config, sft_workdir: str) -> str:
  """Runs the warm start into sft_workdir (resumes it; a finished one only re-exports a missing HF directory)
  and returns the HF directory to start RL from (config.init_from). For the RL job's first start.

  `config` may be the RL config: its sft, policy, sampler and tasks sections are used. On a GPU with bf16
  compute the copy used here switches to cuDNN attention (XLA attention's [B, N, T, T] scores would dominate
  memory and time at SFT lengths).
  """
  c = config.copy_and_resolve_references()
  c.mode = "sft"
  if jax.default_backend() == "gpu" and c.policy.compute_dtype != "float32":
    c.policy.attention_impl = "cudnn"
  run(c, sft_workdir)
  return os.path.join(sft_workdir, "hf") if c.sft.export_hf else sft_workdir


def run(config, workdir: str) -> None:
  """mode=sft (module docstring)."""
  s = config.sft
  if config.policy.attention_impl == "cudnn" and jax.default_backend() != "gpu":
    raise SystemExit(f"error: policy.attention_impl=cudnn needs a GPU (JAX backend: {jax.default_backend()}); "
                     "use --config.policy.attention_impl=xla, or configs/sft.py:runlocal for a CPU smoke run")
  policy = runtime.build_policy(config)
  runtime.check_host_memory(config, policy, warm_start=True, rl=False)
  data = load_data(config, policy.tokenizer)
  steps = total_steps(config, len(data.train))
  policy, sft_step = build_sft(config, policy, steps)
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=config.checkpoint.keep)
  start = ckpt.latest_step() or 0
  if start:
    restored = ckpt.restore(policy.learner.abstract_state)
    if restored.sampler_state.get("corpus_sha256") != data.digest:
      ckpt.close()
      raise SystemExit(f"error: {workdir} was trained on another corpus (digest differs); use a new workdir")
    if restored.sampler_state.get("total_steps") != steps:
      logging.warning("sft: total steps changed from %s to %d: the LR schedule after step %d differs from the "
                      "original run's", restored.sampler_state.get("total_steps"), steps, start)
    state = restored.state
    logging.info("resuming %s from step %d of %d", workdir, start, steps)
  else:
    state = runtime.initial_state(config, policy, jax.random.key(config.seed))
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    f.write(config.to_json_best_effort(indent=1, sort_keys=True))
  with open(os.path.join(workdir, "sft_data.json"), "w", encoding="utf-8") as f:
    json.dump(dict(data.summary, digest=data.digest, total_steps=steps), f, indent=1)
  order = sft_data.BatchOrder([e.length for e in data.train], s.batch_size, seed=config.seed,
                              length_group=s.length_group)
  evaluator = Evaluator(config, policy, sft_step, data, workdir)
  writer = metrics_lib.MetricWriter(workdir, tensorboard=config.logging.tensorboard)
  progress = metrics_lib.Progress(steps, "sft step", start=start, every_s=config.logging.progress_every_s,
                                  unit="steps")
  try:
    state = _loop(config, state, start, steps, sft_step, order, data, evaluator, writer, progress, ckpt)
    hf_dir = os.path.join(workdir, "hf")
    if s.export_hf and (start < steps or not runtime.is_hf_checkpoint(hf_dir)):
      runtime.export_hf(policy, state.params, hf_dir)
  finally:
    writer.close()
    ckpt.close()


def _loop(config, state, start, steps, sft_step, order, data, evaluator, writer, progress, ckpt):
  """Dispatch step k, then fetch and log step k - 1 (no host sync per step); flush before eval and saves."""
  s = config.sft
  pending = None  # (step, device metrics, batch seq len, epoch)
  mark = time.perf_counter()

  def fetch(p):
    nonlocal mark
    step, m, seq_len, epoch = p
    m = jax.device_get(m)
    check_finite(m, step)
    now = time.perf_counter()
    dt, mark = now - mark, now
    rec = {f"train/{k}": float(m[k]) for k in ("loss", "token_acc", "grad_norm", "lr", "tokens")}
    rec.update({"perf/step_s": dt, "perf/tokens_per_s": float(m["tokens_total"]) / dt,
                "batch/seq_len": seq_len, "epoch": epoch})
    return step, rec

  def emit(step, rec):
    writer.write(step, rec)
    progress.update(1, loss=rec["train/loss"], acc=rec["train/token_acc"], lr=rec["train/lr"],
                    tok_s=int(rec["perf/tokens_per_s"]))

  for step in range(start + 1, steps + 1):
    idx = order.indices(step)
    batch = sft_data.make_batch([data.train[i] for i in idx], s.batch_size, buckets(config),
                                evaluator.policy.tokenizer.pad_id, input_noise=s.input_noise,
                                rng=np.random.default_rng([config.seed, step, 13]))  # Per step: resumable.
    on_device = sft_step.put_batch(batch)
    with jax.transfer_guard("disallow"):  # The hot path moves nothing implicitly.
      state, m = sft_step.step(state, on_device)
    if pending is not None:
      emit(*fetch(pending))
    pending = (step, m, int(batch.tokens_BxT.shape[1]), (step - 1) // order.batches_per_epoch)
    eval_now = s.eval_every_steps > 0 and (step % s.eval_every_steps == 0 or step == steps)
    save_now = step % s.checkpoint_every_steps == 0 or step == steps
    if eval_now or save_now:
      step_, rec = fetch(pending)
      pending = None
      if eval_now:
        t0 = time.perf_counter()
        rec.update(evaluator(state, step))
        rec["perf/eval_s"] = time.perf_counter() - t0
      emit(step_, rec)
      if save_now:
        ckpt.save(step, state, sampler_state={"data": order.state(step), "corpus_sha256": data.digest,
                                              "total_steps": steps}, config=config)
      mark = time.perf_counter()
  if pending is not None:
    emit(*fetch(pending))
  return state
