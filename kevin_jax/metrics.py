"""Per-step metrics (JSONL + TensorBoard) and a progress line with rate and ETA.

Shared by both worlds: it imports neither JAX nor torch, so the evaluator's benchmarks use it too.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, Mapping

_log = logging.getLogger("kevin_jax")


class MetricWriter:
  """Appends {"step": s, **metrics} lines to workdir/metrics.jsonl and scalars to TensorBoard.

  Appending (never truncating) keeps a resumed run's history; `read_metrics` returns the last record per step.
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True, filename: str = "metrics.jsonl",
               tensorboard_dir: str = "tensorboard"):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, filename)
    self._file = open(self.path, "a", encoding="utf-8")
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter  # Light writer, no TensorFlow.
      self._tb = SummaryWriter(os.path.join(workdir, tensorboard_dir))

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    record = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
    self._file.write(json.dumps(record, sort_keys=True) + "\n")
    self._file.flush()
    if self._tb is not None:
      for key, value in record.items():
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
          self._tb.add_scalar(key, value, int(step))
      self._tb.flush()

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
      self._tb.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def read_metrics(path: str) -> dict[int, dict]:
  """Reads a metrics.jsonl; a step written twice (a resumed run) keeps its last record."""
  out: dict[int, dict] = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.strip():
        rec = json.loads(line)
        out[int(rec["step"])] = rec
  return dict(sorted(out.items()))


def _jsonable(v: Any) -> Any:
  if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:  # NumPy / JAX scalars.
    v = v.item()
  if isinstance(v, float) and not math.isfinite(v):
    return str(v)  # JSON has no NaN/Inf; keep them visible as strings.
  if isinstance(v, (int, float, str, bool)) or v is None:
    return v
  if isinstance(v, (list, tuple)):
    return [_jsonable(x) for x in v]
  if isinstance(v, dict):
    return {str(k): _jsonable(x) for k, x in v.items()}
  return str(v)


class Progress:
  """Logs 'desc: done/total (pct) rate/s ETA h:mm:ss' at most every `every_s` seconds (and at the end)."""

  def __init__(self, total: int, desc: str, *, every_s: float = 10.0, unit: str = "it",
               start: int = 0, clock=time.monotonic, log=None):
    self.total, self.desc, self.every_s, self.unit = total, desc, every_s, unit
    self.done = start
    self._start_done = start
    self._clock = clock
    self._t0 = clock()
    self._last = -math.inf
    self._log = log or _log.info

  def update(self, n: int = 1, **extra: Any) -> str | None:
    self.done += n
    now = self._clock()
    if now - self._last < self.every_s and self.done < self.total:
      return None
    self._last = now
    line = self.line(now, **extra)
    self._log(line)
    return line

  def line(self, now: float | None = None, **extra: Any) -> str:
    now = self._clock() if now is None else now
    elapsed = max(now - self._t0, 1e-9)
    rate = (self.done - self._start_done) / elapsed
    remaining = (self.total - self.done) / rate if rate > 0 else math.inf
    pct = 100.0 * self.done / self.total if self.total else 100.0
    parts = [f"{self.desc}: {self.done}/{self.total} ({pct:.0f}%)", f"{rate:.3g} {self.unit}/s",
             f"ETA {_hms(remaining)}"]
    parts += [f"{k}={_fmt(v)}" for k, v in extra.items()]
    return " ".join(parts)


def _hms(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(round(seconds))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _fmt(v: Any) -> str:
  return f"{v:.4g}" if isinstance(v, float) else str(v)
