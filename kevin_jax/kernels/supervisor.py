"""Supervised worker processes: pools of GPU and compile workers, per-phase deadlines, kill and replace.

The supervisor (this module, inside the Evaluator's process) never touches CUDA. Each worker is
`python -m kevin_jax.kernels.worker_main` started with `subprocess` as the leader of a new process group (setsid,
so the whole group can be killed with SIGKILL), with CUDA_VISIBLE_DEVICES chosen per slot, core dumps off, and for
CPU-only roles an address-space limit. GPU workers get a host-memory watchdog instead (CUDA needs huge virtual
ranges); a pool can also have a memory budget for all its workers together. A worker that crashes (segfault, sticky
CUDA error, os._exit), overruns its phase deadline, its job's wall budget or a memory limit is killed and replaced
(by a pre-started spare when available); the job in flight becomes an event the caller turns into a result.
Workers are recycled after `recycle_after` jobs.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as mp_wait
from typing import Any

from kevin_jax import cuda_driver

log = logging.getLogger("kevin_jax.evaluator")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_FAILURES_BEFORE_BROKEN = 3


@dataclasses.dataclass
class Job:
  """A unit of work for one worker.

  `timeouts` maps a phase name (before ':') to seconds ('' is the default): a phase that makes no progress for that
  long is killed. `budget` bounds the job's whole run (seconds, wall clock) except the time spent in the `excluded`
  phases (the evaluator's own work, e.g. loading a task): past it the job is killed whatever its phase.
  """
  key: Any
  payload: dict
  timeouts: dict
  affinity: Any = None
  budget: float = math.inf
  excluded: tuple = ()
  phase: str = "queued"
  phases: list = dataclasses.field(default_factory=list)  # (phase, seconds since the job started)
  submitted: float = dataclasses.field(default_factory=time.monotonic)
  started: float = 0.0
  deadline: float = math.inf
  deadline_kind: str = "phase"  # Which limit `deadline` is: 'phase' or 'budget'.
  paused: float = 0.0  # Seconds spent in excluded phases.
  _paused_since: float | None = None

  def enter(self, phase: str, now: float) -> None:
    if self._paused_since is not None:
      self.paused += now - self._paused_since
      self._paused_since = None
    self.phase = phase
    self.phases.append((phase, round(now - self.started, 4)))
    limit = self.timeouts.get(phase.split(":")[0], self.timeouts.get("", math.inf))
    self.deadline, self.deadline_kind = now + limit, "phase"
    if phase.split(":")[0] in self.excluded:
      self._paused_since = now
    elif self.started + self.paused + self.budget < self.deadline:
      self.deadline, self.deadline_kind = self.started + self.paused + self.budget, "budget"

  def timeout_info(self) -> str:
    if self.deadline_kind == "budget":
      return f"the evaluation did not finish within its {self.budget:.0f} s budget (in phase '{self.phase}')"
    limit = self.timeouts.get(self.phase.split(":")[0], self.timeouts.get(""))
    return f"no progress within {limit:.0f} s in phase '{self.phase}'"


@dataclasses.dataclass
class Event:
  """What happened to a job: 'result' (result dict), 'crash', 'timeout', 'memory' (killed for the pool's memory
  budget) or 'start_failed' (info text)."""
  kind: str
  job: Job
  result: dict | None = None
  info: str = ""


class WorkerProc:
  """One worker subprocess and its pipe."""

  def __init__(self, role: str, name: str, settings: dict, env: dict, log_dir: str, as_bytes: int = 0):
    self.role, self.name, self.settings, self.env = role, name, settings, env
    self.log_path = os.path.join(log_dir, f"{name}.log")
    self.as_bytes = as_bytes
    self.state = "new"  # new | starting | ready | busy | retiring | dead
    self.job: Job | None = None
    self.describe: dict = {}
    self.jobs_done = 0
    self.proc: subprocess.Popen | None = None
    self.conn: Connection | None = None
    self.start_deadline = math.inf
    self.kill_deadline = math.inf
    self.baseline_rss = 0  # Resident memory when the worker reported ready.

  def start(self, start_timeout_s: float) -> None:
    parent, child = socket.socketpair()
    with open(self.log_path, "ab") as logf:
      self.proc = subprocess.Popen(
          [sys.executable, "-m", "kevin_jax.kernels.worker_main", "--fd", str(child.fileno()), "--role", self.role,
           "--as-bytes", str(self.as_bytes)],
          env=self.env, cwd=REPO_ROOT, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=logf,
          stderr=subprocess.STDOUT, start_new_session=True)
    child.close()
    self.conn = Connection(parent.detach())
    self.conn.send(("init", self.settings))
    self.state = "starting"
    self.start_deadline = time.monotonic() + start_timeout_s
    log.info("started %s worker %s (pid %d, log %s)", self.role, self.name, self.proc.pid, self.log_path)

  @property
  def pid(self) -> int:
    return self.proc.pid if self.proc else -1

  def kill(self) -> None:
    if self.proc is not None and self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        self.proc.kill()
      try:
        self.proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        log.error("worker %s (pid %d) did not die after SIGKILL", self.name, self.proc.pid)
    self._close()
    self.state = "dead"

  def _close(self) -> None:
    if self.conn is not None:
      try:
        self.conn.close()
      except OSError:
        pass
      self.conn = None

  def retire(self) -> None:
    """Asks the worker to exit; it is killed if still alive after 10 s."""
    try:
      self.conn.send(("exit",))
    except (OSError, AttributeError):
      pass
    self.state = "retiring"
    self.kill_deadline = time.monotonic() + 10

  def exit_text(self) -> str:
    if self.proc is None:
      return "not started"
    rc = self.proc.poll()
    if rc is None:
      return "still running"
    if rc < 0:
      try:
        return f"killed by {signal.Signals(-rc).name}"
      except ValueError:
        return f"killed by signal {-rc}"
    return f"exit code {rc}"

  def rss_bytes(self) -> int:
    try:
      with open(f"/proc/{self.pid}/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
      return 0

  def log_tail(self, n: int = 3000) -> str:
    try:
      with open(self.log_path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - n))
        return f.read().decode(errors="replace")
    except OSError:
      return ""


@dataclasses.dataclass
class Slot:
  index: int
  env: dict
  worker: WorkerProc | None = None
  spare: WorkerProc | None = None
  start_failures: int = 0
  broken: str = ""
  last_affinity: Any = None
  spawned: int = 0


class Pool:
  """Workers of one role, one per slot, fed from a FIFO queue (with task affinity)."""

  def __init__(self, role: str, slot_envs: list[dict], settings: dict, log_dir: str, *, as_bytes: int = 0,
               recycle_after: int = 0, start_timeout_s: float = 300.0, memory_limit_bytes: int = 0,
               spares: bool = False, memory_budget_bytes: int = 0):
    """`memory_limit_bytes` caps one busy worker's resident memory; `memory_budget_bytes` caps what all workers of
    the pool together hold beyond their size when they became ready (the busy worker that grew most is killed)."""
    self.role, self.settings, self.log_dir = role, settings, log_dir
    self.as_bytes, self.recycle_after, self.start_timeout_s = as_bytes, recycle_after, start_timeout_s
    self.memory_limit_bytes, self.spares = memory_limit_bytes, spares
    self.memory_budget_bytes = memory_budget_bytes
    self.slots = [Slot(index=i, env=env) for i, env in enumerate(slot_envs)]
    self.queue: collections.deque[Job] = collections.deque()
    self.retiring: list[WorkerProc] = []
    self.started = False
    self._last_watch = 0.0

  # --- lifecycle ---------------------------------------------------------------------------------------------

  def start(self) -> None:
    if not self.started:
      self.started = True
      for slot in self.slots:
        self._spawn(slot)

  def _spawn(self, slot: Slot, spare: bool = False) -> WorkerProc:
    slot.spawned += 1
    w = WorkerProc(self.role, f"{self.role}{slot.index}-{slot.spawned}", self.settings, slot.env, self.log_dir,
                   self.as_bytes)
    try:
      w.start(self.start_timeout_s)
    except OSError as e:
      log.error("could not start %s worker: %s", self.role, e)
      w.state = "dead"
    if spare:
      slot.spare = w
    else:
      slot.worker = w
    return w

  def close(self) -> None:
    for w in self._all_workers():
      if w.state in ("ready", "busy", "starting"):
        w.retire()
    deadline = time.monotonic() + 5
    for w in self._all_workers() + self.retiring:
      while w.proc is not None and w.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
      w.kill()
    self.started = False

  def _all_workers(self) -> list[WorkerProc]:
    return [w for s in self.slots for w in (s.worker, s.spare) if w is not None]

  def describe(self) -> dict | None:
    for w in self._all_workers():
      if w.describe:
        return w.describe
    return None

  @property
  def broken(self) -> bool:
    return self.started and all(s.broken for s in self.slots)

  # --- scheduling --------------------------------------------------------------------------------------------

  def submit(self, job: Job) -> None:
    self.queue.append(job)

  def busy(self) -> bool:
    return bool(self.queue) or any(s.worker is not None and s.worker.state == "busy" for s in self.slots)

  def connections(self) -> dict:
    return {w.conn: w for w in self._all_workers() + self.retiring if w.conn is not None}

  def dispatch(self) -> list[Event]:
    """Sends queued jobs to ready workers (preferring a worker that last ran the same affinity)."""
    events = []
    if self.broken and self.queue:
      reason = "; ".join(sorted({s.broken for s in self.slots}))
      while self.queue:
        events.append(Event("start_failed", self.queue.popleft(), info=reason))
      return events
    for slot in self.slots:
      w = slot.worker
      if w is None or w.state != "ready" or not self.queue:
        continue
      pick = next((j for j in self.queue if j.affinity is not None and j.affinity == slot.last_affinity),
                  self.queue[0])
      self.queue.remove(pick)
      now = time.monotonic()
      pick.started = now
      pick.enter("sent", now)
      try:
        w.conn.send(("job", id(pick), pick.payload))
      except OSError:
        self.queue.appendleft(pick)
        events += self._on_death(slot, w)
        continue
      w.state, w.job = "busy", pick
      slot.last_affinity = pick.affinity
    return events

  def handle(self, w: WorkerProc) -> list[Event]:
    """Reads every available message from a worker (called when its connection is readable)."""
    slot = next((s for s in self.slots if w in (s.worker, s.spare)), None)
    events = []
    while w.conn is not None:
      try:
        if not w.conn.poll():
          break
        msg = w.conn.recv()
      except (EOFError, OSError):
        if w in self.retiring:
          w.kill()
          self.retiring.remove(w)
          return events
        return events + (self._on_death(slot, w) if slot else [])
      kind = msg[0]
      if kind == "ready":
        w.describe, w.state = msg[1], "ready"
        w.baseline_rss = w.rss_bytes()
        if slot is not None:
          slot.start_failures = 0
      elif kind == "failed":
        log.error("%s worker %s failed to start:\n%s", self.role, w.name, msg[1])
      elif kind == "phase" and w.job is not None and msg[1] == id(w.job):
        w.job.enter(msg[2], time.monotonic())
      elif kind == "result" and w.job is not None and msg[1] == id(w.job):
        job, w.job = w.job, None
        job.enter("done", time.monotonic())
        w.jobs_done += 1
        w.state = "ready"
        events.append(Event("result", job, result=msg[2]))
        if msg[2].get("fatal"):
          # Sticky CUDA error or a kernel still running: the worker exits by itself; make sure of it now.
          w.state = "dying"
          if slot is not None:
            return events + self._on_death(slot, w)
          w.kill()
          return events
        if slot is not None and self.recycle_after and w.jobs_done >= self.recycle_after:
          self._replace(slot, retire=True)
    return events

  def _on_death(self, slot: Slot, w: WorkerProc) -> list[Event]:
    """A worker's pipe closed: report its job, replace it."""
    events = []
    job = w.job
    prev_state = w.state
    was_starting = prev_state == "starting"
    w.kill()
    tail = w.log_tail()
    if job is not None:
      info = f"worker {w.name} died ({w.exit_text()}) in phase '{job.phase}'"
      log.warning("%s\n--- worker log tail ---\n%s", info, tail)
      events.append(Event("crash", job, info=info + "\n" + tail[-1500:]))
    elif prev_state not in ("dying", "killed", "retiring") and not was_starting:
      log.warning("idle worker %s died (%s)", w.name, w.exit_text())
    if was_starting:
      slot.start_failures += 1
      log.error("%s worker %s died while starting (%s):\n%s", self.role, w.name, w.exit_text(), tail)
      if slot.start_failures >= START_FAILURES_BEFORE_BROKEN:
        slot.broken = f"{self.role} worker failed to start {slot.start_failures} times: {tail.strip()[-600:]}"
    if w is slot.spare:
      slot.spare = None
      return events
    self._replace(slot, retire=False)
    return events

  def _replace(self, slot: Slot, retire: bool) -> None:
    old = slot.worker
    if retire and old is not None:
      old.retire()
      self.retiring.append(old)
    if slot.broken:
      slot.worker = None
      return
    if slot.spare is not None and slot.spare.state in ("ready", "starting"):
      slot.worker, slot.spare = slot.spare, None
    else:
      self._spawn(slot)

  def check(self, now: float) -> list[Event]:
    """Deadlines (jobs, starts, retirements), the memory watchdog, and spare workers."""
    events = []
    watch = (self.memory_limit_bytes or self.memory_budget_bytes) and now - self._last_watch > 0.5
    if watch:
      self._last_watch = now
      if self.memory_budget_bytes:
        events += self._enforce_budget()
    for slot in self.slots:
      for w in (slot.worker, slot.spare):
        if w is None:
          continue
        if w.state == "busy" and now > w.job.deadline:
          job = w.job
          info = job.timeout_info()
          log.warning("killing %s worker %s: %s (task %s; phases so far: %s)", self.role, w.name, info,
                      job.affinity, job.phases[-6:])
          w.job = None
          w.state = "killed"
          events.append(Event("timeout", job, info=info))
          self._on_death(slot, w)
        elif w.state == "busy" and watch and self.memory_limit_bytes and w.rss_bytes() > self.memory_limit_bytes:
          job = w.job
          info = (f"worker host memory {w.rss_bytes() / 2**30:.1f} GiB exceeded the limit "
                  f"{self.memory_limit_bytes / 2**30:.1f} GiB in phase '{job.phase}'")
          log.warning("killing %s worker %s: %s", self.role, w.name, info)
          w.job = None
          w.state = "killed"
          events.append(Event("crash", job, info=info))
          self._on_death(slot, w)
        elif w.state == "starting" and now > w.start_deadline:
          log.error("%s worker %s did not start within %.0f s:\n%s", self.role, w.name, self.start_timeout_s,
                    w.log_tail())
          events += self._on_death(slot, w)
      if (self.spares and slot.spare is None and not slot.broken and slot.worker is not None
          and slot.worker.state in ("ready", "busy")):
        self._spawn(slot, spare=True)
    for w in list(self.retiring):
      if w.proc is None or w.proc.poll() is not None or now > w.kill_deadline:
        w.kill()
        self.retiring.remove(w)
    return events

  def _enforce_budget(self) -> list[Event]:
    """Kills the busy worker that grew most while the pool's workers together exceed memory_budget_bytes."""
    events = []
    while True:
      growth = {w: max(0, w.rss_bytes() - w.baseline_rss) for w in self._all_workers()
                if w.state in ("ready", "busy")}
      busy = [w for w in growth if w.state == "busy"]
      if sum(growth.values()) <= self.memory_budget_bytes or not busy:
        return events
      w = max(busy, key=growth.get)
      slot = next(s for s in self.slots if w in (s.worker, s.spare))
      job = w.job
      info = (f"the {self.role} workers together used {sum(growth.values()) / 2**30:.1f} GiB beyond their start-up "
              f"size (budget {self.memory_budget_bytes / 2**30:.1f} GiB), this job's worker "
              f"{growth[w] / 2**30:.1f} GiB")
      log.warning("killing %s worker %s: %s", self.role, w.name, info)
      w.job, w.state = None, "killed"
      events.append(Event("memory", job, info=info))
      self._on_death(slot, w)



def pump(pools: list[Pool], timeout: float) -> list[Event]:
  """One supervisor step: dispatch, wait for messages (at most `timeout` s), handle them, check deadlines."""
  events = []
  for p in pools:
    events += p.dispatch()
  conns = {}
  for p in pools:
    for c, w in p.connections().items():
      conns[c] = (p, w)
  now = time.monotonic()
  deadlines = [w.job.deadline for p in pools for s in p.slots for w in (s.worker,) if w and w.job]
  wait_s = max(0.0, min([timeout] + [d - now for d in deadlines]))
  if conns:
    for c in mp_wait(list(conns), timeout=wait_s):
      p, w = conns[c]
      events += p.handle(w)
  elif wait_s:
    time.sleep(min(wait_s, 0.05))
  now = time.monotonic()
  for p in pools:
    events += p.check(now)
  return events


def visible_gpus(spec: str) -> list[str]:
  """GPU ids for worker slots: the explicit list, else CUDA_VISIBLE_DEVICES, else every device."""
  if spec:
    return [g.strip() for g in str(spec).split(",") if g.strip()]
  cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
  if cvd is not None:
    ids = [g.strip() for g in cvd.split(",") if g.strip()]
    return ids if cuda_driver.device_count() > 0 else []
  return [str(i) for i in range(cuda_driver.device_count())]


def worker_env(cuda_visible: str | None, threads: int) -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  env["CUDA_VISIBLE_DEVICES"] = "" if cuda_visible is None else cuda_visible
  env["OMP_NUM_THREADS"] = str(threads)
  env["PYTHONUNBUFFERED"] = "1"
  env.pop("CUPY_CACHE_IN_MEMORY", None)
  return env
