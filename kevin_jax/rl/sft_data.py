"""The warm-start corpus: reading, tokenizing, splitting, and a deterministic length-grouped batch order.

Corpus: JSONL, one example per line:
  {"messages": [{"role": "system", "content": ...}, {"role": "user", "content": ...}],
   "response": "<think>...</think>```cuda...```\n```plan...```\nSummary: ...",
   ...optional fields: "task_id", "kind", "quality", ... (kept for splitting and logs)}
Prompt = tokenizer.encode_chat(messages, add_generation_prompt=True) (exactly what the sampler is given);
target = tokenizer.encode(response) + [end-of-turn id] (<|im_end|> in Qwen templates), so the policy learns to
stop. Only target tokens carry loss. Without a corpus file the task source's corpus (the bundled suite's, or the
task world's) is built in memory by kevin_jax/data/export_corpus.py (`bundled_corpus`), the same records
`python -m kevin_jax.data.export_corpus` writes, except that the warm start (sft.fit_prompts) builds the
later-turn prompts as rollouts build them (`rollout_fit`: the oldest attempts dropped to fit the prompt budget)
where the exporter keeps every attempt. `warm_start_texts` gives the corpus's kernels to the novelty metric.

Batch order: epoch e is a permutation drawn from (seed, e), topped up to a multiple of the batch size, sorted by
length within windows of `length_group` batches (less padding), cut into batches whose order is shuffled.
Batch k of the run is a pure function of (seed, k), so a resumed run sees exactly the batches it would have.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Iterable, Sequence

import numpy as np

from kevin_jax.policy.token_cache import TokenCache
from kevin_jax.rl import prompts
from kevin_jax.rl.sft_step import SFTBatch

class CorpusError(ValueError):
  """The corpus is missing, empty or malformed (message names the file and line)."""


@dataclasses.dataclass(frozen=True)
class Example:
  """One tokenized example."""
  prompt_ids: tuple[int, ...]
  target_ids: tuple[int, ...]  # Response tokens + end-of-turn (cut if truncated).
  task_id: str  # '' if the corpus line has none.
  kind: str  # Free-form label from the corpus ('' if none).

  @property
  def length(self) -> int:
    return len(self.prompt_ids) + len(self.target_ids)


def read_corpus(path: str) -> list[dict[str, Any]]:
  """Corpus records from a JSONL file, validated: each has `messages` (role/content dicts) and `response`."""
  if not os.path.isfile(path):
    raise CorpusError(f"SFT corpus {path!r} does not exist (config.sft.corpus; '' = the bundled suite's)")
  records = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise CorpusError(f"{path}:{n}: not JSON ({e})") from e
      _validate(rec, f"{path}:{n}")
      records.append(rec)
  if not records:
    raise CorpusError(f"SFT corpus {path!r} holds no examples")
  return records


def _validate(rec: Any, where: str) -> None:
  if not isinstance(rec, dict):
    raise CorpusError(f"{where}: expected a JSON object, got {type(rec).__name__}")
  msgs = rec.get("messages")
  if not isinstance(msgs, list) or not msgs or not all(
      isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs):
    raise CorpusError(f"{where}: 'messages' must be a non-empty list of {{'role': str, 'content': str}}")
  if not isinstance(rec.get("response"), str) or not rec["response"].strip():
    raise CorpusError(f"{where}: 'response' must be a non-empty string")


def bundled_corpus(task_ids: Iterable[str], kinds: Sequence[str] | None = None,
                   reasoning: str = "quote", fit=None, source: str = "bundled") -> list[dict[str, Any]]:
  """The corpus of the given task ids, built by kevin_jax/data/export_corpus.py in memory.

  The bundled suite (source 'bundled' or any source whose ids are the suite's): single-turn examples for every
  task, plus multi-turn fix / speed-up episodes with real evaluator feedback where kevin_jax/data/suite_results.json
  has records. A task world (source: a 'generated' source's directory, runtime.task_source): train tasks get
  every kind, heldout_styles tasks the naive solution only, heldout_compositions tasks single-turn examples, suite
  tasks the bundled corpus; feedback from kevin_jax/data/world_results.json where it has records
  (export_corpus.world_examples). Other ids contribute nothing. `kinds` and `reasoning`:
  export_corpus.examples_for_task; `fit` (an export_corpus.Fit, e.g. from `rollout_fit`) builds the later-turn
  prompts; None = every attempt.
  """
  from kevin_jax.data import export_corpus  # pylint: disable=g-import-not-at-top
  from kevin_jax.data.taskgen import world as world_lib  # pylint: disable=g-import-not-at-top
  from kevin_jax.kernels import suite  # pylint: disable=g-import-not-at-top
  kinds = export_corpus.KINDS if kinds is None else kinds
  fit = fit or export_corpus.every_attempt
  w = world_lib.from_source(source)
  if w is not None:
    path = export_corpus.WORLD_RESULTS
    results = export_corpus.load_results(path) if os.path.isfile(path) else None
    return export_corpus.world_examples(w, list(task_ids), results, kinds, reasoning, fit)[0]
  results_path = export_corpus.DEFAULT_RESULTS
  results = export_corpus.load_results(results_path) if os.path.isfile(results_path) else None
  wanted = set(task_ids)
  records = []
  for task in suite.load_suite():
    if task.id in wanted:
      records += export_corpus.examples_for_task(task, None if results is None else results.get(task.id, {}),
                                                 kinds, reasoning, fit)[0]
  return records


def corpus_tasks(config) -> list[tuple[str, list[str]]]:
  """(resolved task source, task ids) of each source the warm-start corpus comes from: sft.corpus_sources, else
  tasks.source itself with all its tasks. Another source than the job's own keeps none of its split settings; a
  task world there gives its warm-start splits (train, heldout_styles), any other source all its tasks."""
  from kevin_jax import runtime  # pylint: disable=g-import-not-at-top
  from kevin_jax.kernels import tasks as tasks_lib  # pylint: disable=g-import-not-at-top
  out = []
  for src in tuple(config.sft.corpus_sources) or (config.tasks.source,):
    c = config
    if src != config.tasks.source:
      c = config.copy_and_resolve_references()
      c.tasks.source, c.tasks.layout, c.tasks.train_ids, c.tasks.test_ids = src, "any", (), ()
    resolved = runtime.task_source(c)
    if c is not config and tasks_lib.world_splits(resolved) is not None:
      ids = [sp.id for split in ("train", "heldout_styles") for sp in runtime.load_tasks(c, split)[0]]
    else:
      ids = [sp.id for sp in runtime.load_tasks(c, "all")[0]]
    out.append((resolved, ids))
  return out


def warm_start_texts(config, test_task_ids: Iterable[str] = ()) -> list[str]:
  """The candidate texts of the warm-start corpus's responses, what the novelty metric compares kernels with:
  config.sft.corpus's, or the corpus of sft.corpus_sources / config.tasks (sft.corpus_kinds, sft.corpus_reasoning)
  without the examples of `test_task_ids` when sft.exclude_test_tasks (those are never trained on)."""
  s = config.sft
  if s.corpus:
    records = read_corpus(s.corpus)
  else:
    held = set(test_task_ids) if s.exclude_test_tasks else set()
    records = [r for source, ids in corpus_tasks(config)
               for r in bundled_corpus((i for i in ids if i not in held), kinds=tuple(s.corpus_kinds),
                                       reasoning=s.corpus_reasoning, source=source)]
  return [prompts.parse_response(r["response"]).candidate_text for r in records]


def rollout_fit(tokenizer, max_context_tokens: int, cache: TokenCache | None = None):
  """The rollout's prompt builder as an export_corpus.Fit: rl/prompts.fit_messages within `max_context_tokens`,
  counted as the sampler is given the prompt (oldest earlier attempts dropped first). Warm-start examples built
  with it show the policy the prompts RL will show it, rather than prompts longer than any rollout's. A prompt
  without earlier attempts has nothing to drop and is not counted; `cache` (shared with `tokenize`) keeps the
  counted prompts' ids."""
  if max_context_tokens <= 0:
    raise ValueError(f"max_context_tokens must be positive, got {max_context_tokens}")
  cache = TokenCache(tokenizer) if cache is None else cache

  def count(messages) -> int:
    return len(cache.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True)))

  def fit(task_source, attempts):
    if not attempts:  # fit_messages would return the bare task whatever its length.
      return prompts.build_messages(task_source), 0
    return prompts.fit_messages(task_source, attempts, count, max_context_tokens)
  return fit


def end_of_turn_id(tokenizer) -> int:
  """The token the chat template puts right after an assistant message (<|im_end|> for Qwen templates)."""
  marker = "\u2063SFT-END-MARKER\u2063"
  text = tokenizer.apply_chat_template([{"role": "user", "content": "u"}, {"role": "assistant", "content": marker}],
                                       add_generation_prompt=False)
  at = text.rfind(marker)
  ids = tokenizer.encode(text[at + len(marker):]) if at >= 0 else []
  if ids and ids[0] in tokenizer.eos_ids:
    return int(ids[0])
  eos = tokenizer.hf.eos_token_id
  if eos is None:
    raise ValueError("cannot find the tokenizer's end-of-turn token (chat template or eos_token)")
  return int(eos)


@dataclasses.dataclass
class TokenizeStats:
  records: int = 0
  kept: int = 0
  dropped_too_long: int = 0
  truncated: int = 0
  longest: int = 0


def tokenize(records: Iterable[dict[str, Any]], tokenizer, *, max_seq_len: int,
             truncate: bool, cache: TokenCache | None = None) -> tuple[list[Example], TokenizeStats]:
  """Examples of at most max_seq_len tokens; over-long ones are dropped (or their responses cut: truncate).
  Each distinct prompt and response is encoded once, through `cache` (default: an in-memory one)."""
  eot = end_of_turn_id(tokenizer)
  records = list(records)
  cache = TokenCache(tokenizer) if cache is None else cache
  prompt_texts = [tokenizer.apply_chat_template(rec["messages"], add_generation_prompt=True) for rec in records]
  ids = cache.encode_many(prompt_texts + [rec["response"] for rec in records])
  out, st = [], TokenizeStats()
  for i, rec in enumerate(records):
    st.records += 1
    p = ids[i]
    r = ids[len(records) + i] + (eot,)
    st.longest = max(st.longest, len(p) + len(r))
    if len(p) + len(r) > max_seq_len:
      if not truncate or len(p) >= max_seq_len:
        st.dropped_too_long += 1
        continue
      r = r[:max_seq_len - len(p)]
      st.truncated += 1
    out.append(Example(p, r, str(rec.get("task_id", "")), str(rec.get("kind", ""))))
  st.kept = len(out)
  return out, st


def corpus_digest(examples: Sequence[Example]) -> str:
  """sha256 over the token ids: a resumed run checks it trains on the same data."""
  h = hashlib.sha256()
  for e in examples:
    h.update(np.asarray(e.prompt_ids, np.int32).tobytes() + b"|" + np.asarray(e.target_ids, np.int32).tobytes())
  return h.hexdigest()


def split(examples: Sequence[Example], *, test_task_ids: Iterable[str], exclude_test_tasks: bool,
          eval_fraction: float, seed: int) -> tuple[list[Example], list[Example], list[Example]]:
  """(train, eval: held-out examples of training tasks, held-out tasks' examples).

  With exclude_test_tasks, examples of the task split's test tasks never reach training (the RL held-out
  evaluation stays clean) and form the third set. eval_fraction of the remaining examples is held out by a
  seeded draw (at least one when eval_fraction > 0 and two or more examples remain).
  """
  if not 0 <= eval_fraction < 1:
    raise ValueError(f"sft.eval_fraction must be in [0, 1), got {eval_fraction}")
  test = set(test_task_ids) if exclude_test_tasks else set()
  heldout_tasks = [e for e in examples if e.task_id in test]
  rest = [e for e in examples if e.task_id not in test]
  n_eval = int(round(eval_fraction * len(rest)))
  if eval_fraction > 0 and len(rest) >= 2:
    n_eval = max(n_eval, 1)
  order = np.random.default_rng([seed, 7]).permutation(len(rest))
  eval_idx = set(order[:n_eval].tolist())
  train = [e for i, e in enumerate(rest) if i not in eval_idx]
  evals = [e for i, e in enumerate(rest) if i in eval_idx]
  return train, evals, heldout_tasks


class BatchOrder:
  """Which examples form batch k (1-based optimizer step): see the module docstring."""

  def __init__(self, lengths: Sequence[int], batch_size: int, *, seed: int, length_group: int):
    if len(lengths) == 0:
      raise ValueError("no training examples")
    self.lengths = np.asarray(lengths)
    self.batch_size, self.seed, self.length_group = batch_size, seed, max(1, length_group)
    self.batches_per_epoch = -(-len(lengths) // batch_size)
    self._cache: tuple[int, np.ndarray] | None = None

  def _epoch(self, epoch: int) -> np.ndarray:
    if self._cache is None or self._cache[0] != epoch:
      n, b = len(self.lengths), self.batch_size
      rng = np.random.default_rng([self.seed, epoch])
      perm = rng.permutation(n)
      extra = self.batches_per_epoch * b - n
      perm = np.concatenate([perm, rng.choice(n, extra, replace=extra > n)])
      window = b * self.length_group
      for s in range(0, len(perm), window):
        w = perm[s:s + window]
        perm[s:s + window] = w[np.argsort(-self.lengths[w], kind="stable")]
      batches = perm.reshape(self.batches_per_epoch, b)
      self._cache = (epoch, batches[rng.permutation(self.batches_per_epoch)])
    return self._cache[1]

  def indices(self, step: int) -> np.ndarray:
    epoch, k = divmod(step - 1, self.batches_per_epoch)
    return self._epoch(epoch)[k]

  def state(self, step: int) -> dict[str, int]:
    """The data position after `step` batches (saved with the checkpoint; informational)."""
    epoch, k = divmod(step, self.batches_per_epoch)
    return {"epoch": epoch, "batch_in_epoch": k, "batches_per_epoch": self.batches_per_epoch}


def bucket_for(length: int, buckets: Sequence[int]) -> int:
  for b in sorted(buckets):
    if length <= b:
      return b
  raise ValueError(f"sequence of {length} tokens exceeds the largest bucket {max(buckets)}")


def make_batch(examples: Sequence[Example], rows: int, buckets: Sequence[int], pad_id: int, *,
               input_noise: float = 0.0, rng: np.random.Generator | None = None) -> SFTBatch:
  """Right-padded host arrays [rows, T] (T = the smallest bucket that fits); rows beyond the examples are
  padding rows (one attended token, no loss).

  input_noise > 0: each response token the model reads (all but the last) is, with this probability, replaced in
  `inputs_BxT` by a token drawn uniformly from the same row's response; targets stay the true tokens. The policy
  then learns to continue correctly after a token that is off its memorised text: the sampler's own deviations at
  temperature 0.9 otherwise derail a memorising policy for the rest of the response (README "Results").
  """
  if len(examples) > rows:
    raise ValueError(f"{len(examples)} examples for {rows} rows")
  if not 0 <= input_noise < 1:
    raise ValueError(f"sft.input_noise must be in [0, 1), got {input_noise}")
  if input_noise > 0 and rng is None:
    raise ValueError("input_noise needs an rng (a seeded numpy Generator: resumed runs redraw the same noise)")
  t = bucket_for(max(e.length for e in examples), buckets)
  tokens = np.full((rows, t), pad_id, np.int32)
  attn = np.zeros((rows, t), np.int32)
  loss = np.zeros((rows, t), np.float32)
  attn[:, 0] = 1
  for r, e in enumerate(examples):
    p, n = len(e.prompt_ids), e.length
    tokens[r, :n] = e.prompt_ids + e.target_ids
    attn[r, :n] = 1
    loss[r, p:n] = 1.0
  if input_noise <= 0:
    return SFTBatch(tokens, attn, loss)
  inputs = tokens.copy()
  for r, e in enumerate(examples):
    p, n = len(e.prompt_ids), e.length
    hit = np.flatnonzero(rng.random(n - 1 - p) < input_noise) + p  # Read positions p .. n - 2.
    inputs[r, hit] = rng.choice(np.asarray(e.target_ids, np.int32), size=hit.size)
  return SFTBatch(tokens, attn, loss, inputs)
