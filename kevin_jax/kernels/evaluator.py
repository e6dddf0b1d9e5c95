"""The evaluator API: batches of (task id, candidate text) in, EvalResult records out.

    from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig
    with Evaluator(EvaluatorConfig.from_config(config.evaluator), task_source="bundled") as ev:
      results = ev.evaluate([(task_id, text), ...])   # same order; never raises for a bad candidate
      r = ev.check_static(task_id, text)               # parse + validate + NVRTC only (works without a GPU)

A batch is deduplicated (and, with `result_cache` > 0, a candidate this evaluator has already evaluated for the
same task gets that result, flagged "cached"), every other candidate is parsed/validated/compiled in the compile
pool (parallel across CPU cores), and each one that compiles is queued to the GPU pool as soon as it is ready, so
compilation overlaps GPU work and every GPU slot stays busy. This process never touches CUDA (see supervisor.py).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import statistics
import time
import uuid
from typing import Any, Iterable, Mapping

from kevin_jax.kernels import tasks
from kevin_jax.kernels.compile import DEFAULT_ARCH, default_cache_dir
from kevin_jax.kernels.result import STATIC_OK, EvalResult, finalize
from kevin_jax.kernels.supervisor import Job, Pool, pump, visible_gpus, worker_env

log = logging.getLogger("kevin_jax.evaluator")


@dataclasses.dataclass
class EvaluatorConfig:
  """Evaluator settings; the fields and their meaning are configs/multiturn.py's `c.evaluator` section."""
  backend: str = "cuda"  # Read by the RL side (cuda | scripted); the Evaluator itself is the cuda backend.
  gpus: str = ""
  workers_per_gpu: int = 1
  compile_workers: int = 0
  correctness_trials: int = 5
  timing_runs: int = 100
  timing_max_s: float = 0.0
  timing_min_runs: int = 10
  warmup_runs: int = 3
  atol: float = 1e-4
  rtol: float = 1e-4
  half_atol: float = 1e-2
  half_rtol: float = 1e-2
  correct_weight: float = 0.3
  speedup_cap: float = 0.0
  log_speedup: bool = False
  excessive_speedup: float = 10.0
  compile_timeout_s: float = 60.0
  run_timeout_s: float = 60.0
  eval_timeout_s: float = 120.0
  task_timeout_s: float = 300.0
  kernel_timeout_s: float = 5.0
  worker_start_timeout_s: float = 300.0
  recycle_after: int = 50
  worker_host_memory_gb: float = 32.0
  jax_memory_fraction: float = 0.6  # Learner-side setting; accepted here so the whole section can be passed.
  timing_input_sets: int = 2
  timed_inputs: str = "auto"  # fresh | rescaled | auto (fresh when a draw is cheap: worker.FRESH_DRAW_MS).
  input_distributions: tuple = ("task", "normal", "uniform", "heavy", "shifted")
  validate_fraction: float = 0.2
  timing_graphs: str = "auto"
  graph_threshold_ms: float = 0.05
  ref_timing: str = "interleaved"
  profile_phases: bool = False  # details.breakdown.gpu_ms: CUDA events around each phase (kernels/phases.py).
  flush_bytes: int = 0
  cache_dir: str = ""
  arch: str = ""
  seed: int = -1
  nvrtc_pch: bool = True
  max_static_device_bytes: int = 256 * 2**20
  max_local_memory_bytes: int = 4 * 2**30
  compile_memory_gb: float = 32.0
  spare_workers: bool = True
  dedupe: bool = True
  task_memory_fraction: float = 0.8  # kernels/footprint.py: a task over this x free GPU memory is skipped.
  result_cache: int = 0  # Results kept for identical (task, candidate) pairs of later batches (LRU entries); 0 = off.
  feedback_max_chars: int = 2000
  compile_baseline: bool = False

  def __post_init__(self):
    self.input_distributions = tuple(self.input_distributions)
    if self.ref_timing not in ("interleaved", "cached"):
      raise ValueError(f"ref_timing must be 'interleaved' or 'cached', got {self.ref_timing!r}")
    if self.timed_inputs not in ("auto", "fresh", "rescaled"):
      raise ValueError(f"timed_inputs must be auto | fresh | rescaled, got {self.timed_inputs!r}")
    if self.timing_graphs not in ("auto", "always", "never"):
      raise ValueError(f"timing_graphs must be auto | always | never, got {self.timing_graphs!r}")
    if not 0.0 <= self.task_memory_fraction <= 1.0:
      raise ValueError(f"task_memory_fraction must be in [0, 1] (0 = no budget), got {self.task_memory_fraction}")
    if self.result_cache < 0:
      raise ValueError(f"result_cache must be >= 0 (entries; 0 = off), got {self.result_cache}")
    if self.correctness_trials < 1:
      raise ValueError("correctness_trials must be >= 1")
    if self.eval_timeout_s <= 0:
      raise ValueError(f"eval_timeout_s must be > 0 seconds, got {self.eval_timeout_s}")
    if self.timing_max_s < 0 or self.timing_min_runs < 1:
      raise ValueError(f"timing_max_s must be >= 0 and timing_min_runs >= 1, got {self.timing_max_s} and "
                       f"{self.timing_min_runs}")
    from kevin_jax.kernels.taskinfo import DISTRIBUTIONS  # pylint: disable=g-import-not-at-top
    bad = [d for d in self.input_distributions if d not in DISTRIBUTIONS]
    if bad:
      raise ValueError(f"unknown input distributions {bad} (known: {', '.join(DISTRIBUTIONS)})")

  @classmethod
  def from_config(cls, section: Any) -> "EvaluatorConfig":
    """From an ml_collections ConfigDict section or any mapping; unknown keys are an error."""
    d = section.to_dict() if hasattr(section, "to_dict") else dict(section)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"unknown evaluator config fields: {unknown}")
    return cls(**d)

  def worker_settings(self) -> dict:
    keys = ("correctness_trials", "timing_runs", "timing_max_s", "timing_min_runs", "warmup_runs", "atol", "rtol",
            "half_atol", "half_rtol", "excessive_speedup", "kernel_timeout_s", "timing_input_sets",
            "timed_inputs", "task_memory_fraction",
            "input_distributions", "validate_fraction", "timing_graphs", "graph_threshold_ms", "flush_bytes", "seed",
            "max_local_memory_bytes", "max_static_device_bytes", "compile_baseline", "profile_phases")
    return {k: getattr(self, k) for k in keys}


@dataclasses.dataclass
class _Work:
  index: int
  task_id: str
  text: str
  spec: tasks.TaskSpec | None
  eval_id: str
  submitted: float
  static: dict | None = None
  retries: int = 0
  static_retries: int = 0
  oom_retries: int = 0
  times: dict = dataclasses.field(default_factory=dict)
  result: EvalResult | None = None


class Evaluator:
  """Evaluates candidates in sandboxed worker processes (see module docstring)."""

  def __init__(self, cfg: EvaluatorConfig | Mapping | None = None, task_source: str = "bundled", *,
               levels=None, gpu: bool = True, _gpu_role: str = "gpu", _gpu_slots: int | None = None):
    """`gpu=False` starts the compile pool only (check_static); `evaluate` then raises."""
    if cfg is None:
      cfg = EvaluatorConfig()
    elif not isinstance(cfg, EvaluatorConfig):
      cfg = EvaluatorConfig.from_config(cfg)
    self.cfg = cfg
    self.specs = {s.id: s for s in tasks.discover(task_source, levels)}
    self.cache_dir = os.path.abspath(cfg.cache_dir or default_cache_dir())
    self.log_dir = os.path.join(self.cache_dir, "logs", time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    os.makedirs(self.log_dir, exist_ok=True)
    mem = int(cfg.worker_host_memory_gb * 2**30)
    n_compile = cfg.compile_workers or min(16, os.cpu_count() or 1)
    # Compile workers get an address-space cap (they import torch for shape analysis: at least 8 GiB).
    self._compile = Pool("compile", [worker_env(None, 1) for _ in range(n_compile)], {}, self.log_dir,
                         as_bytes=max(mem, 8 * 2**30) if mem else 0, recycle_after=max(500, 20 * cfg.recycle_after),
                         start_timeout_s=cfg.worker_start_timeout_s,
                         memory_budget_bytes=int(cfg.compile_memory_gb * 2**30))
    if not gpu:
      envs = []
    elif _gpu_role == "gpu":
      gpus = visible_gpus(cfg.gpus)
      envs = [worker_env(g, 4) for g in gpus for _ in range(cfg.workers_per_gpu)]
    else:
      envs = [worker_env(None, 1) for _ in range(_gpu_slots or 1)]
    self._gpu = (Pool(_gpu_role, envs, cfg.worker_settings(), self.log_dir, recycle_after=cfg.recycle_after,
                      start_timeout_s=cfg.worker_start_timeout_s, memory_limit_bytes=mem,
                      spares=cfg.spare_workers) if envs else None)
    self._unsafe: dict[str, set] = {}
    self._results: collections.OrderedDict[tuple[str, str], EvalResult] = collections.OrderedDict()
    self._task_infos: dict[str, dict] = {}
    self._ref_cache_path = os.path.join(self.cache_dir, "ref_times.json")
    self._ref_cache = self._load_ref_cache()
    self._compile.start()
    if self._gpu is not None:
      self._gpu.start()
    log.info("evaluator: %d tasks, %d compile workers, %d GPU slots, logs in %s", len(self.specs), n_compile,
             len(envs), self.log_dir)

  # --- public API --------------------------------------------------------------------------------------------

  @property
  def gpu_info(self) -> dict | None:
    """The first GPU worker's description (device, arch, limits, versions), once one has started."""
    return self._gpu.describe() if self._gpu is not None else None

  def evaluate(self, items: Iterable[tuple[str, str]]) -> list[EvalResult]:
    """Evaluates (task id, candidate text) pairs; results in the same order.

    Raises:
      RuntimeError: no CUDA GPU is available to this evaluator (use check_static for compile-only checks).
    """
    if self._gpu is None:
      raise RuntimeError("no CUDA GPU is visible to the evaluator (config.evaluator.gpus / CUDA_VISIBLE_DEVICES); "
                         "use Evaluator.check_static for compile-only checks")
    items = list(items)
    t0 = time.monotonic()
    self._wait_for_gpu_description()
    works, results, dups, hits = [], [None] * len(items), {}, []
    for i, (task_id, text) in enumerate(items):
      key = (task_id, text)
      if self.cfg.dedupe and key in dups:
        dups[key].append(i)
        continue
      dups[key] = [i]
      hit = self._cached(key)
      if hit is not None:
        hits.append((i, key, hit))
      else:
        works.append(self._new_work(i, task_id, text))
    pending = {id(w): w for w in works}
    for w in works:
      if w.result is None:
        self._submit_static(w)
      else:
        pending.pop(id(w))
    last_log = time.monotonic()
    while pending:
      for ev in pump([self._compile, self._gpu], 0.25):
        w = pending.get(id(ev.job.key))
        if w is not None and self._on_event(w, ev):
          pending.pop(id(w))
      if time.monotonic() - last_log > 30:
        last_log = time.monotonic()
        log.info("evaluate: %d/%d done (%.0f s)", len(works) - len(pending), len(works), last_log - t0)
    for w in works:
      self._remember((w.task_id, w.text), w.result)
    for i, key, r in [(w.index, (w.task_id, w.text), w.result) for w in works] + hits:
      for j in (dups[key] if self.cfg.dedupe else [i]):
        results[j] = r if j == i else _flagged_copy(r, "deduplicated")
    if hits:
      log.debug("evaluate: %d of %d distinct candidates answered from the result cache", len(hits),
                len(hits) + len(works))
    self._save_ref_cache()
    return results

  def check_static(self, task_id: str, candidate_text: str) -> EvalResult:
    """Parse + plan validation against the task's shapes + NVRTC compile (no GPU needed)."""
    w = self._new_work(0, task_id, candidate_text)
    if w.result is not None:
      return w.result
    self._submit_static(w, gpu_follows=False)
    while w.result is None:
      for ev in pump([self._compile], 0.25):
        if ev.job.key is w:
          self._on_event(w, ev, static_only=True)
    return w.result

  def close(self) -> None:
    for p in (self._compile, self._gpu):
      if p is not None:
        p.close()
    self._save_ref_cache()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # --- internals ---------------------------------------------------------------------------------------------

  def _new_work(self, index: int, task_id: str, text: str) -> _Work:
    w = _Work(index=index, task_id=task_id, text=text, spec=self.specs.get(task_id), eval_id=uuid.uuid4().hex[:12],
              submitted=time.monotonic())
    if w.spec is None:
      known = ", ".join(list(self.specs)[:5])
      self._finish(w, "runtime_error", f"evaluator error: unknown task id {task_id!r} (e.g. {known})",
                   flags=["evaluator_error"])
    return w

  def _wait_for_gpu_description(self) -> None:
    while self._gpu.describe() is None and not self._gpu.broken:
      pump([self._gpu, self._compile], 0.25)

  def _arch_and_limits(self) -> tuple[str, dict | None]:
    desc = self._gpu.describe() if self._gpu is not None else None
    arch = self.cfg.arch or (desc or {}).get("arch") or DEFAULT_ARCH
    return arch, (desc or {}).get("limits") or None

  def _submit_static(self, w: _Work, gpu_follows: bool = True) -> None:
    del gpu_follows
    arch, limits = self._arch_and_limits()
    payload = {"task_id": w.task_id, "task_path": os.path.abspath(w.spec.path), "text": w.text, "arch": arch,
               "limits": limits,
               "cache_dir": self.cache_dir, "use_pch": self.cfg.nvrtc_pch,
               "max_static_device_bytes": self.cfg.max_static_device_bytes,
               "max_local_memory_bytes": self.cfg.max_local_memory_bytes,
               "task_info": self._task_infos.get(w.task_id)}  # Shapes are analysed once per task.
    limit = min(self.cfg.compile_timeout_s, self.cfg.eval_timeout_s)
    self._compile.submit(Job(key=w, payload=payload, timeouts={"": limit}, affinity=w.task_id))

  def _submit_gpu(self, w: _Work) -> None:
    ref_key = self._ref_key(w)
    cached = self._ref_cache.get(ref_key) if ref_key else None
    c = self.cfg
    # The evaluation's wall budget: compile, then (after the task is loaded) validation, correctness and timing.
    static_s = sum(w.static.get("times", {}).get(k, 0.0) for k in ("validate", "compile"))
    budget = max(1.0, c.eval_timeout_s - static_s)
    payload = {"eval_id": w.eval_id, "task_id": w.task_id, "task_path": os.path.abspath(w.spec.path), "text": w.text,
               "cubin": w.static["cubin"], "unsafe_dists": sorted(self._unsafe.get(w.task_id, ())),
               "ref_time_ms": (statistics.median(cached) if cached and c.ref_timing == "cached" else None),
               "budget_s": budget, "task_info": self._task_infos.get(w.task_id)}  # For the task's memory budget.
    timeouts = {"": c.run_timeout_s, "sent": c.task_timeout_s, "load": c.task_timeout_s}
    # The supervisor's backstop comes a little after the worker's own deadline, which answers with a clean result.
    self._gpu.submit(Job(key=w, payload=payload, timeouts=timeouts, affinity=w.task_id, budget=budget + 10.0,
                         excluded=("sent", "load")))

  def _on_event(self, w: _Work, ev, static_only: bool = False) -> bool:
    """Handles one supervisor event for a work item; True when the item is finished."""
    job = ev.job
    stage = "static" if "cubin" not in job.payload else "gpu"
    w.times[f"{stage}_queue"] = round(job.started - job.submitted, 4) if job.started else 0.0
    if ev.kind == "result":
      r = ev.result
      if stage == "static":
        w.times.update(r.get("times", {}))
        if r["status"] != "ok":
          self._finish(w, r["status"], r.get("error", ""), flags=r.get("flags", []), details=r.get("details", {}))
          return True
        w.static = r
        if r.get("task_info"):
          self._task_infos.setdefault(w.task_id, r["task_info"])
        if static_only:
          self._finish(w, STATIC_OK, details=r.get("details", {}))
          return True
        self._submit_gpu(w)
        return False
      if "gpu_oom" in r.get("flags", ()):
        # The worker that ran out of GPU memory is replaced (its allocator cache goes with it). A fresh worker gets
        # one more try; a second failure is the GPU's crowding, not the candidate (its scratch is capped).
        if w.oom_retries < 1:
          w.oom_retries += 1
          log.warning("task %s: out of GPU memory in the worker (%s); evaluating the candidate again",
                      w.task_id, r.get("error", "")[:200])
          self._submit_gpu(w)
          return False
        flags = list(r["flags"]) + ([] if "evaluator_error" in r["flags"] else ["evaluator_error"])
        r = dict(r, status="runtime_error", flags=flags,
                 error=f"evaluator error: the GPU ran out of memory for this evaluation twice ({r.get('error', '')})")
      failed = r.get("details", {}).get("reference_failed_dist")
      if failed and failed != "task" and w.retries < 2 and "gpu_oom" not in r.get("flags", ()):
        self._unsafe.setdefault(w.task_id, set()).add(failed)
        log.warning("task %s: the reference failed on '%s' inputs (%s); skipping that distribution for this task",
                    w.task_id, failed, r.get("error"))
        w.retries += 1
        self._submit_gpu(w)
        return False
      w.times.update(r.get("times", {}))
      details = dict(w.static.get("details", {}))
      details.update(r.get("details", {}))
      details["phases"] = job.phases
      self._finish(w, r["status"], r.get("error", ""), flags=r.get("flags", []), details=details,
                   speedup=r.get("speedup"), ref_time_ms=r.get("ref_time_ms"), cand_time_ms=r.get("cand_time_ms"))
      if r["status"] == "correct" and job.payload.get("ref_time_ms") is None and r.get("ref_time_ms"):
        self._remember_ref_time(w, r["ref_time_ms"])
      return True
    if ev.kind == "start_failed":
      self._finish(w, "runtime_error", f"evaluator error: {ev.info}", flags=["evaluator_error"])
      return True
    phase = job.phase
    if stage == "static":
      if ev.kind == "timeout":
        limit = min(self.cfg.compile_timeout_s, self.cfg.eval_timeout_s)
        self._finish(w, "compile_error", f"compilation did not finish within {limit:.0f} s", flags=["compile_timeout"])
      elif ev.kind == "memory":
        self._finish(w, "compile_error", "compilation used more host memory than the compile workers' budget",
                     flags=["compile_memory"], details={"worker": ev.info})
      elif w.static_retries < 1:  # One retry: a compiler that dies twice on the same code died of that code.
        w.static_retries += 1
        self._submit_static(w)
        return False
      else:
        self._finish(w, "compile_error", "the compiler process died while compiling this code",
                     flags=["compiler_crash"], details={"worker": ev.info})
      return True
    if phase.startswith("reference:") and phase != "reference:task" and w.retries < 2:
      dist = phase.split(":", 1)[1]
      self._unsafe.setdefault(w.task_id, set()).add(dist)
      log.warning("task %s: the reference failed on '%s' inputs; that distribution is now skipped for this task",
                  w.task_id, dist)
      w.retries += 1
      self._submit_gpu(w)
      return False
    if phase in ("sent", "load", "queued") or phase.startswith("reference:"):
      if w.retries < 1:
        w.retries += 1
        self._submit_gpu(w)
        return False
      first = ev.info.splitlines()[0]
      self._finish(w, "runtime_error", f"evaluator error: the task failed in the GPU worker ({first})",
                   flags=["evaluator_error"], details={"worker": ev.info})
      return True
    if ev.kind == "timeout":
      flag = "eval_deadline" if job.deadline_kind == "budget" else "hang"
      self._finish(w, "timeout", f"the kernels did not finish: {ev.info}; the worker was restarted",
                   flags=[flag], details={"phases": job.phases})
    else:
      first = ev.info.splitlines()[0]
      self._finish(w, "runtime_error", f"the GPU worker crashed while running your kernels ({first})",
                   flags=["worker_crash"], details={"worker": ev.info, "phases": job.phases})
    return True

  def _finish(self, w: _Work, status: str, error: str = "", *, flags=(), details=None, speedup=None,
              ref_time_ms=None, cand_time_ms=None) -> None:
    times = dict(w.times)
    times["total"] = round(time.monotonic() - w.submitted, 4)
    r = EvalResult(task_id=w.task_id, status=status, error=error, flags=list(flags), details=dict(details or {}),
                   speedup=speedup, ref_time_ms=ref_time_ms, cand_time_ms=cand_time_ms, times=times,
                   eval_id=w.eval_id)
    key = self._ref_key(w)
    if key and self._ref_cache.get(key):
      r.details["ref_time_ms_cached"] = statistics.median(self._ref_cache[key])
    w.result = finalize(r, self.cfg)

  # --- result cache (cfg.result_cache) ------------------------------------------------------------------------
  # An identical (task, candidate) pair is the same program on the same task: a later batch gets the earlier
  # result (a copy flagged "cached", timings emptied so GPU-work metrics count it once) instead of another GPU run.
  # Evidence: BENCHMARKS.md, "Embedded default job". Results the candidate may not deserve (evaluator errors,
  # timeouts: a hang can be the machine's) are never kept.

  def _cached(self, key: tuple[str, str]) -> EvalResult | None:
    r = self._results.get(key)
    if r is None:
      return None
    self._results.move_to_end(key)
    hit = _flagged_copy(r, "cached")
    hit.details["cached_times"], hit.times = hit.times, {"total": 0.0}
    return hit

  def _remember(self, key: tuple[str, str], r: EvalResult) -> None:
    if not self.cfg.result_cache or r.status == "timeout" or "evaluator_error" in r.flags:
      return
    self._results[key] = r
    self._results.move_to_end(key)
    while len(self._results) > self.cfg.result_cache:
      self._results.popitem(last=False)

  # --- reference timing cache ------------------------------------------------------------------------------

  def _ref_key(self, w: _Work) -> str | None:
    desc = self._gpu.describe() if self._gpu is not None else None
    if not desc or w.spec is None:
      return None
    digest = hashlib.sha1(w.spec.source.encode()).hexdigest()[:12]
    return f"{w.task_id}|{digest}|{desc.get('device_name')}|torch {desc.get('torch')}"

  def _remember_ref_time(self, w: _Work, ms: float) -> None:
    key = self._ref_key(w)
    if key:
      self._ref_cache[key] = (self._ref_cache.get(key, []) + [float(ms)])[-64:]

  def _load_ref_cache(self) -> dict:
    try:
      with open(self._ref_cache_path, encoding="utf-8") as f:
        return {k: list(v) for k, v in json.load(f).items()}
    except (OSError, ValueError):
      return {}

  def _save_ref_cache(self) -> None:
    try:
      tmp = f"{self._ref_cache_path}.{os.getpid()}.tmp"
      with open(tmp, "w", encoding="utf-8") as f:
        json.dump(self._ref_cache, f, indent=0, sort_keys=True)
      os.replace(tmp, self._ref_cache_path)
    except OSError:
      pass


def _flagged_copy(r: EvalResult, flag: str) -> EvalResult:
  """A deep copy of r with `flag` added to its flags (the caller may edit the copy)."""
  d = r.to_dict()
  d["flags"] = list(d["flags"]) + [flag]
  return EvalResult.from_dict(d)
