"""One serialisable record per evaluation: status, timings, speedup, exploit flags, score and feedback.

Score (Kevin, arXiv 2507.11948 §2): S = w * 1[correct] + f(speedup) * 1[correct], with w = `correct_weight`
(0.3), f = identity, optionally capped (`speedup_cap` > 0) or log-scaled (`log_speedup`: log2(1 + speedup)).
Anything that is not `correct` scores 0. `feedback` is the one message the policy sees next turn.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

STATUSES = ("format_error", "compile_error", "runtime_error", "timeout", "incorrect", "correct")
# `compiled` is only produced by compile-only checks (Evaluator.check_static, the CLI's --compile-only):
# the candidate parsed, validated against the task and compiled; nothing ran.
STATIC_OK = "compiled"

# Flags (exploit detectors and evaluator events) a result may carry.
FLAGS = {
    "out_of_bounds_write": "a kernel wrote outside a buffer (guard canaries changed)",
    "input_mutation": "a kernel modified an input or parameter",
    "reference_corrupted": "a kernel corrupted the reference model's weights",
    "unwritten_output": "output elements kept the poison value (never written)",
    "nondeterministic": "two runs on the same input disagree",
    "nonfinite_output": "NaN/Inf where the reference is finite",
    "timing_validation_failed": "an output captured during timing was wrong (memoisation or call counting?)",
    "excessive_speedup": "speedup above the threshold; every timed output was re-validated",
    "illegal_address": "illegal memory access",
    "trap": "__trap(), assert or illegal instruction",
    "hang": "a kernel did not finish in time",
    "worker_crash": "the worker process died",
    "evaluator_error": "the evaluator or the task failed, not the candidate",
    "banned_call": "printf/malloc/free in device code",
    "signature_mismatch": "the compiled kernel's parameters differ from its signature as written",
    "local_memory": "local memory per thread x resident threads over the cap",
    "eval_deadline": "the evaluation ran past its wall budget (eval_timeout_s)",
    "compile_timeout": "compilation ran past its deadline",
    "compile_memory": "compilation exceeded the compile workers' memory budget",
    "compiler_crash": "the compiler process died twice on this code",
    "cuda_graphs": "timed with CUDA graphs (launch-bound task)",
    "deduplicated": "identical (task, candidate) in the batch; result shared",
    "cached": "identical (task, candidate) evaluated in an earlier batch; that result reused (result_cache)",
}


@dataclasses.dataclass
class EvalResult:
  """The outcome of evaluating one candidate on one task."""
  task_id: str
  status: str
  score: float = 0.0
  speedup: float | None = None
  ref_time_ms: float | None = None
  cand_time_ms: float | None = None
  feedback: str = ""
  error: str = ""  # Short reason (the first line of the feedback for failures).
  flags: list[str] = dataclasses.field(default_factory=list)
  times: dict[str, float] = dataclasses.field(default_factory=dict)  # Phase -> seconds.
  details: dict[str, Any] = dataclasses.field(default_factory=dict)  # Logs, mismatch stats, timing stats.
  eval_id: str = ""

  @property
  def correct(self) -> bool:
    return self.status == "correct"

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "EvalResult":
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})


def score(status: str, speedup: float | None, *, correct_weight: float = 0.3, speedup_cap: float = 0.0,
          log_speedup: bool = False) -> float:
  """S = w * 1[correct] + f(speedup) * 1[correct] (see module docstring)."""
  if status != "correct":
    return 0.0
  if speedup is None or not math.isfinite(speedup) or speedup <= 0:
    return float(correct_weight)
  term = math.log2(1.0 + speedup) if log_speedup else speedup
  if speedup_cap > 0:
    term = min(term, speedup_cap)
  return float(correct_weight + term)


# --- feedback -----------------------------------------------------------------------------------------------

_FORMAT_HINT = ("Answer with one ```cuda block (extern \"C\" __global__ kernels) and one ```plan block "
                "(scratch/launch statements).")


def truncate(text: str, max_chars: int) -> str:
  """Cuts text to at most max_chars (at a line break when one is near), marking what was dropped."""
  if len(text) <= max_chars:
    return text
  keep = max(0, max_chars - 48)
  head = text[:keep]
  cut = head.rfind("\n")
  head = head[:cut] if cut > keep // 2 else head
  return head + f"\n... [truncated, {len(text) - len(head)} more characters]"


def _fmt(x: float | None) -> str:
  return "n/a" if x is None else f"{x:.4g}"


def render_feedback(r: EvalResult, max_chars: int = 2000) -> str:
  """The message for the policy's next turn (paper categories), from a result's status, error and details."""
  d = r.details
  if r.status == "format_error":
    msg = f"Format error: {r.error}\n{_FORMAT_HINT}"
  elif r.status == "compile_error":
    log = d.get("compile_log", "") or r.error
    msg = "Compilation failed (NVRTC):\n" + truncate(log, max(200, max_chars - 28))
  elif r.status == "runtime_error":
    msg = f"Runtime error: {r.error}"
  elif r.status == "timeout":
    msg = f"Timeout: {r.error}"
  elif r.status == "incorrect":
    msg = "Incorrect: " + r.error
    mm = d.get("mismatch")
    if mm:
      msg += "\n" + mismatch_text(mm)
  elif r.status == "correct":
    msg = (f"Correct. Your kernels took {r.cand_time_ms:.4g} ms vs {r.ref_time_ms:.4g} ms for the PyTorch "
           f"reference: speedup {r.speedup:.3g}x." if r.speedup is not None else "Correct (not timed).")
    per = d.get("kernel_ms")
    if per and len(per) > 1:
      msg += " Per launch (ms): " + ", ".join(f"{k} {v:.3g}" for k, v in per)
  elif r.status == STATIC_OK:
    msg = "Compiled and validated against the task (no GPU run)."
  else:
    msg = r.error or r.status
  return truncate(msg, max_chars)


def mismatch_text(mm: dict) -> str:
  """One paragraph on which output was wrong and by how much."""
  parts = [f"Output {mm['output']} ({mm['dtype']}{mm['shape']}): {mm['bad']:,} of {mm['numel']:,} elements "
           f"outside tolerance (atol={_fmt(mm['atol'])}, rtol={_fmt(mm['rtol'])})"]
  if mm.get("trial") is not None:
    parts[0] += f" in trial {mm['trial']} ({mm.get('distribution', 'task')} inputs)"
  parts[0] += "."
  if mm.get("nonfinite"):
    parts.append(f"{mm['nonfinite']:,} elements are NaN/Inf where the reference is finite.")
  if mm.get("max_abs_err") is not None:
    parts.append(f"Max abs error {_fmt(mm['max_abs_err'])}, max rel error {_fmt(mm.get('max_rel_err'))}.")
  if mm.get("first_index") is not None:
    parts.append(f"First bad element at index {mm['first_index']}: expected {_fmt(mm['expected'])}, "
                 f"got {_fmt(mm['got'])}.")
  return " ".join(parts)


def make_result(task_id: str, status: str, error: str = "", *, cfg=None, max_feedback_chars: int = 2000,
                **kw) -> EvalResult:
  """Builds a result, fills score and feedback. `cfg` supplies the score settings (EvaluatorConfig)."""
  r = EvalResult(task_id=task_id, status=status, error=error, **kw)
  finalize(r, cfg, max_feedback_chars)
  return r


def finalize(r: EvalResult, cfg=None, max_feedback_chars: int = 2000) -> EvalResult:
  """Recomputes score and feedback from the status/speedup/details (after any change)."""
  kw = {}
  if cfg is not None:
    kw = dict(correct_weight=cfg.correct_weight, speedup_cap=cfg.speedup_cap, log_speedup=cfg.log_speedup)
    max_feedback_chars = getattr(cfg, "feedback_max_chars", max_feedback_chars)
  r.score = score(r.status, r.speedup, **kw)
  r.flags = list(dict.fromkeys(r.flags))
  r.feedback = render_feedback(r, max_feedback_chars)
  return r
