"""Pure metric math for rollouts and evaluation runs (paper §4 "Metrics", §3 monitors).

Definitions [P §4]:
- a trajectory is correct if any of its kernels is correct;
- a trajectory's performance is the speedup of its fastest correct kernel, 0 if none is correct;
- over k parallel trajectories of a task, best@k is the maximum and avg@k the mean; reported numbers average
  the per-task values over tasks;
- fast_p: the trajectory has a correct kernel with speedup >= p (KernelBench's fast_p per trajectory);
- "at turn t" uses only the first t turns of each trajectory.

Arrays: correct_KxN (bool) and speedup_KxN (float, ignored where not correct) for K trajectories of N turns.

Novelty (is a correct kernel the policy's own, or a corpus answer repeated?): against the warm-start corpus's
responses, a kernel is a *copy* when its normalised text (comments removed, whitespace collapsed; `normalize`)
equals a corpus response's, and its *nearest similarity* is the largest token n-gram Jaccard index
|A & B| / |A | B| between its n-gram set and a corpus response's (`CorpusIndex.nearest`; 1.0 for a copy).
`novelty_summary` reports, over correct kernels: the share that are not copies and the mean nearest similarity.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Sequence

import numpy as np


def trajectory_performance(correct_KxN: np.ndarray, speedup_KxN: np.ndarray, turns: int | None = None):
  """(correct_K, perf_K) using the first `turns` turns (all if None)."""
  correct_KxN = np.asarray(correct_KxN, bool)
  speedup_KxN = np.asarray(speedup_KxN, float)
  if correct_KxN.shape != speedup_KxN.shape or correct_KxN.ndim != 2:
    raise ValueError(f"expected matching [K, N] arrays, got {correct_KxN.shape} and {speedup_KxN.shape}")
  n = correct_KxN.shape[1] if turns is None else turns
  c, s = correct_KxN[:, :n], speedup_KxN[:, :n]
  perf_K = np.where(c, s, 0.0).max(axis=1, initial=0.0)
  return c.any(axis=1), perf_K


def task_summary(correct_KxN, speedup_KxN, *, turns: int | None = None,
                 fast_ps: Sequence[float] = (1.0, 1.5)) -> dict[str, float]:
  """best@k / avg@k correctness, performance and fast_p for one task's K trajectories."""
  correct_K, perf_K = trajectory_performance(correct_KxN, speedup_KxN, turns)
  out = {"correct_best": float(correct_K.any()), "correct_avg": float(correct_K.mean()),
         "perf_best": float(perf_K.max(initial=0.0)), "perf_avg": float(perf_K.mean())}
  for p in fast_ps:
    fast_K = correct_K & (perf_K >= p)
    out[f"fast_{p:g}_best"] = float(fast_K.any())
    out[f"fast_{p:g}_avg"] = float(fast_K.mean())
  return out


def suite_summary(per_task: Iterable[dict[str, float]]) -> dict[str, float]:
  """Means of task_summary dicts over tasks."""
  rows = list(per_task)
  if not rows:
    return {}
  return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def not_okay_ratio(reasonings: Sequence[str], opening: str = "Okay,") -> float:
  """Share of chains of thought that do not open with `opening` (the paper's junk early warning, §3)."""
  if not reasonings:
    return 0.0
  return float(np.mean([not r.lstrip().startswith(opening) for r in reasonings]))


def repeated_ngram_ratio(tokens: Sequence[int], n: int = 4) -> float:
  """Share of a sequence's n-grams that repeat an earlier n-gram (0 = none, near 1 = degenerate loops)."""
  if len(tokens) < n + 1:
    return 0.0
  grams = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
  total = sum(grams.values())
  return 1.0 - len(grams) / total


def turn_score_table(scores_KxN: np.ndarray) -> dict[str, list[float]]:
  """Per-turn mean and max of kernel scores (columns = turns)."""
  scores_KxN = np.asarray(scores_KxN, float)
  return {"mean": scores_KxN.mean(axis=0).tolist(), "max": scores_KxN.max(axis=0).tolist()}


def kernel_summary(statuses: Sequence[str], scores: Sequence[float], speedups: Sequence[float]) -> dict[str, float]:
  """Per-kernel means over evaluated kernels (each turn's candidate is one kernel): the mean score (the reward,
  failures 0), the share that is correct, and the mean speedup of the correct ones (0 if none is)."""
  if not (len(statuses) == len(scores) == len(speedups)) or not statuses:
    raise ValueError(f"expected equal, non-empty sequences, got {len(statuses)}, {len(scores)}, {len(speedups)}")
  correct = np.array([s == "correct" for s in statuses])
  sp = np.asarray(speedups, float)[correct]
  return {"score_mean": float(np.mean(scores)), "correct_rate": float(correct.mean()),
          "speedup_mean_correct": float(sp.mean()) if sp.size else 0.0}


def gpu_work(results: Iterable[dict]) -> dict[str, float]:
  """The evaluator's GPU work behind a batch of results: `gpu_runs`, the distinct candidates that reached the GPU
  worker (the evaluator runs duplicates once and hands every copy the same result, same `eval_id`; results reused
  from an earlier batch, flagged "cached", carry no GPU times), `gpu_s`, the sum of their `times['gpu_total']`
  (one worker per GPU runs them back to back), and `cached`, the results answered from the evaluator's result
  cache (copies included)."""
  ran, cached = {}, 0
  for r in results:
    if "gpu_total" in (r.get("times") or {}):
      ran[r.get("eval_id") or id(r)] = r["times"]["gpu_total"]
    cached += "cached" in (r.get("flags") or ())
  return {"gpu_runs": float(len(ran)), "gpu_s": float(sum(ran.values())), "cached": float(cached)}


_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/|#[^\n]*", re.S)  # CUDA comments and plan comments.
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?[fF]?|\S")


def kernel_tokens(text: str) -> list[str]:
  """The tokens of a candidate (its ```cuda and ```plan blocks), comments left out. `#include` and `#define`
  lines go with the comments: they are boilerplate for this comparison."""
  return _TOKEN.findall(_COMMENTS.sub(" ", text))


def normalize(text: str) -> str:
  """A candidate's text with comments removed and all whitespace between tokens collapsed to one space."""
  return " ".join(kernel_tokens(text))


class CorpusIndex:
  """The warm-start corpus's candidate texts, indexed for exact-copy lookups and nearest n-gram Jaccard."""

  def __init__(self, texts: Iterable[str], n: int = 4):
    if n < 1:
      raise ValueError(f"n-gram length must be >= 1, got {n}")
    self.n = n
    self.copies: set[str] = set()
    self._vocab: dict[tuple, int] = {}
    sizes, postings = [], {}
    for text in dict.fromkeys(texts):
      norm = normalize(text)
      if not norm or norm in self.copies:
        continue
      self.copies.add(norm)
      grams = self._grams(norm.split(" "), grow=True)
      doc = len(sizes)
      sizes.append(len(grams))
      for g in grams:
        postings.setdefault(g, []).append(doc)
    self._sizes = np.asarray(sizes, np.int64)
    self._postings = {g: np.asarray(d, np.int64) for g, d in postings.items()}

  def __len__(self) -> int:
    return len(self._sizes)

  def _grams(self, tokens: Sequence[str], grow: bool = False) -> set[int]:
    """Ids of the distinct n-grams (a text shorter than n is one gram); grams unseen in the corpus get negative
    ids: in no posting list, still counted in the union."""
    grams = {tuple(tokens[i:i + self.n]) for i in range(max(1, len(tokens) - self.n + 1))}
    if grow:
      return {self._vocab.setdefault(g, len(self._vocab)) for g in grams}
    return {self._vocab.get(g, -1 - k) for k, g in enumerate(grams)}

  def is_copy(self, text: str) -> bool:
    return normalize(text) in self.copies

  def nearest(self, text: str) -> float:
    """The largest n-gram Jaccard index between the text and any corpus response (0.0 for an empty corpus)."""
    norm = normalize(text)
    if norm in self.copies:
      return 1.0
    if not len(self._sizes) or not norm:
      return 0.0
    grams = self._grams(norm.split(" "))
    hits = [self._postings[g] for g in grams if g >= 0 and g in self._postings]
    if not hits:
      return 0.0
    inter = np.bincount(np.concatenate(hits), minlength=len(self._sizes))
    union = self._sizes + len(grams) - inter
    return float((inter / union).max())


def novelty_summary(correct_texts: Sequence[str], index: CorpusIndex) -> dict[str, float]:
  """Over correct kernels: how many (`correct_kernels`), the share that are not normalised copies of any corpus
  response (`novel_share`, 0 when there is none), their distinct novel texts (`novel_distinct`), and the mean
  nearest-corpus n-gram Jaccard (`nearest_jaccard_mean`, 0 when there is none)."""
  if not correct_texts:
    return {"correct_kernels": 0.0, "novel_share": 0.0, "novel_distinct": 0.0, "nearest_jaccard_mean": 0.0}
  memo: dict[str, tuple[bool, float]] = {}
  for t in correct_texts:
    if t not in memo:
      memo[t] = (not index.is_copy(t), index.nearest(t))
  novel = [memo[t][0] for t in correct_texts]
  return {"correct_kernels": float(len(correct_texts)), "novel_share": float(np.mean(novel)),
          "novel_distinct": float(len({normalize(t) for t in correct_texts if memo[t][0]})),
          "nearest_jaccard_mean": float(np.mean([memo[t][1] for t in correct_texts]))}
