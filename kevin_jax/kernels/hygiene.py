"""Task hygiene: per-task checks of a reference module, a verdict `ok | flagged | excluded` with reasons, a report.

  python -m kevin_jax.kernels.hygiene --source ~/KernelBench/KernelBench --levels 1,2,3 --device cuda --out DIR

Checks (the reference is built as the evaluator builds it: `Model(*get_init_inputs())` in the reference mode, taskinfo.as_reference: as built, dropout off):
  excluded  a trivial kernel is "correct": every output is all zeros, one constant, or a (wrapped or broadcast)
            copy of an input or parameter within the task's atol/rtol, on every input distribution the evaluator
            draws for the task (the suite's degenerate gate, kernels/suite.py, per distribution);
            non-deterministic: two calls on the same inputs differ beyond tolerance even with dropout off;
            the task does not import or its reference fails.
  flagged   outputs that barely change between input or weight draws (the suite gate's other complaints);
            Dropout modules (switched off: the reference runs them as the identity);
            a reference that is not finite on some distribution; a task too large to run here (not checked).
The memory footprint (kernels/footprint.py, from meta-device shapes) is reported for every task. A task too large
for the check's memory limit runs at a reduced `batch_size` when its module has one (KernelBench's convention;
degeneracy is per sample), else it is reported as not checked. Records are cached on disk, keyed by the task
source's sha256 and the check's settings, so a job does not re-run the checks on every start.
Evaluator side: imports torch lazily (this module's records and cache are read by the learner without it).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import os
import sys
import time
from typing import Sequence

from kevin_jax.kernels import footprint, tasks

VERDICTS = ("ok", "flagged", "excluded")
VERSION = 2  # Bump when a check changes: cached records of older versions are ignored.
DEFAULT_DISTRIBUTIONS = ("task", "normal", "uniform", "heavy", "shifted")  # configs/multiturn.py evaluator.
CPU_MAX_BYTES = 2**29  # 512 MiB: the checks' estimated peak on the CPU (hygiene_bytes).
MODEL_SEED, OTHER_WEIGHTS_SEED = 0, 4321  # MODEL_SEED as kernels/worker.py.
MAX_COPY_SOURCES = 64  # Inputs, then parameters and buffers, tried as the source of a copy.
MODE_DEPENDENT = ("Dropout",)  # Module class names the reference mode switches off (taskinfo.as_reference).


@dataclasses.dataclass
class TaskHygiene:
  """One task's hygiene record."""
  task_id: str
  verdict: str  # ok | flagged | excluded
  reasons: list[str] = dataclasses.field(default_factory=list)
  sha256: str = ""  # Of the task source.
  device: str = ""  # Where the reference ran ('' = it did not run).
  reduced: str = ""  # e.g. 'batch_size 4096 -> 16' when the checks ran at a reduced size.
  input_bytes: int = 0  # At the task's declared sizes (meta device); 0 when unknown.
  output_bytes: int = 0
  param_bytes: int = 0
  evaluation_bytes: int = 0  # footprint.evaluation_bytes: one evaluation's GPU peak.
  stats: list = dataclasses.field(default_factory=list)  # Per output: match fractions on the task distribution.
  seconds: float = 0.0

  @property
  def checked(self) -> bool:
    return bool(self.device)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "TaskHygiene":
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})


def source_sha256(spec: tasks.TaskSpec) -> str:
  return hashlib.sha256(spec.source.encode()).hexdigest()


def hygiene_bytes(b: footprint.TaskBytes) -> int:
  """Estimated peak of the checks: two models, three input lists, five outputs, one workspace tensor."""
  return 2 * b.params + 3 * b.inputs + 5 * b.outputs + max(b.inputs, b.outputs)


# --- the checks (torch) ---------------------------------------------------------------------------------------

def _outs(y) -> list:
  return list(y) if isinstance(y, (tuple, list)) else [y]


def _clone(xs) -> list:
  return [x.clone() if hasattr(x, "clone") else x for x in xs]


def _meta_bytes(module, task_id: str):
  """TaskBytes at the module's current sizes from a meta-device run, or None when the meta device fails."""
  import torch  # pylint: disable=g-import-not-at-top
  from kevin_jax.kernels import taskinfo  # pylint: disable=g-import-not-at-top
  try:
    with torch.device("meta"), torch.no_grad():
      model = taskinfo.as_reference(module.Model(*module.get_init_inputs()))
      xs = list(module.get_inputs())
      info = taskinfo.describe_live(task_id, module, model, xs, model(*xs))
    return footprint.task_bytes(info), footprint.evaluation_bytes(info)
  except Exception:  # pylint: disable=broad-except  # Ops without a meta kernel (e.g. Tensor.item()).
    return None


def _meta_input_bytes(module) -> int | None:
  """Bytes of one get_inputs() draw on the meta device (None when that fails too)."""
  import torch  # pylint: disable=g-import-not-at-top
  try:
    with torch.device("meta"):
      xs = list(module.get_inputs())
  except Exception:  # pylint: disable=broad-except
    return None
  return sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))


def _fit_batch(module, task_id: str, max_bytes: int) -> tuple[str | None, str]:
  """Lowers the module's `batch_size` until the checks fit max_bytes.

  Returns ('' (fits as it is) | 'batch_size A -> B', '') or (None, why not).
  """
  m = _meta_bytes(module, task_id)
  if m is not None and hygiene_bytes(m[0]) <= max_bytes:
    return "", ""
  bs = getattr(module, "batch_size", None)
  if m is None or not isinstance(bs, int) or isinstance(bs, bool) or bs <= 1:
    return None, "the task has no batch_size to lower"
  b = m[0]
  new = bs
  while new > 1:
    fixed = 2 * b.params
    new = max(1, min(new // 2, int(bs * (max_bytes - fixed) / max(1, hygiene_bytes(b) - fixed))))
    module.batch_size = new
    mm = _meta_bytes(module, task_id)
    if mm is not None and hygiene_bytes(mm[0]) <= max_bytes:
      return f"batch_size {bs} -> {new}", ""
  module.batch_size = bs
  return None, f"not even at batch_size 1 (parameters {b.params / 2**30:.2f} GiB)"


def _copy_fraction(y, tensors, atol: float, rtol: float) -> tuple[float, str]:
  """Best match of y by a wrapped copy (suite's identity candidate) or a broadcast copy of one of `tensors`."""
  from kevin_jax.kernels import suite  # pylint: disable=g-import-not-at-top
  best, what = 0.0, ""
  for name, t in tensors[:MAX_COPY_SOURCES]:
    if t.numel() == 0 or t.numel() > y.numel() or t.dtype.is_complex:
      continue
    tries = [("wrapped", lambda t=t: suite.wrapped_copy(t, y))]
    if t.dim() <= y.dim() and all(a in (1, b) for a, b in zip(t.shape[::-1], y.shape[::-1])):
      tries.append(("broadcast", lambda t=t: t.expand(y.shape).to(y.dtype)))
    for how, make in tries:
      f = suite.close_fraction(make(), y, atol, rtol)
      if f > best:
        best, what = f, f"{how} copy of {name}"
  return best, what


def _build(module, seed: int, device):
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  try:
    with torch.device(device):
      model = module.Model(*module.get_init_inputs())
  except RuntimeError:
    torch.manual_seed(seed)
    model = module.Model(*module.get_init_inputs())
  from kevin_jax.kernels import taskinfo  # pylint: disable=g-import-not-at-top
  return taskinfo.as_reference(model.to(device))


def _all_close(a, b, atol: float, rtol: float) -> bool:
  import torch  # pylint: disable=g-import-not-at-top
  if a.shape != b.shape:
    return False
  if not a.is_floating_point():
    return bool(torch.equal(a, b))
  return bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol, equal_nan=True))


def check_module(module, task_id: str, *, device: str = "cpu", atol: float = 1e-4, rtol: float = 1e-4,
                 distributions: Sequence[str] = DEFAULT_DISTRIBUTIONS, max_bytes: int | None = None,
                 sha256: str = "") -> TaskHygiene:
  """The checks of the module docstring on one loaded task module (its ATOL/RTOL override atol/rtol)."""
  import torch  # pylint: disable=g-import-not-at-top
  from kevin_jax.kernels import inputs as I  # pylint: disable=g-import-not-at-top
  from kevin_jax.kernels import suite  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  rec = TaskHygiene(task_id=task_id, verdict="ok", sha256=sha256)
  atol = float(getattr(module, "ATOL", atol))
  rtol = float(getattr(module, "RTOL", rtol))
  dists = list(getattr(module, "INPUT_DISTRIBUTIONS", None) or distributions)
  dists = ["task"] + [d for d in dists if d != "task"]
  m = _meta_bytes(module, task_id)
  if m is not None:
    rec.input_bytes, rec.output_bytes, rec.param_bytes = m[0].inputs, m[0].outputs, m[0].params
    rec.evaluation_bytes = m[1]
  if max_bytes is None:
    max_bytes = default_max_bytes(device)
  reduced, why = _fit_batch(module, task_id, max_bytes) if m is not None else ("", "")
  if m is None:  # Shapes unknown without running it: run it only when its inputs alone are small.
    in_bytes = _meta_input_bytes(module)
    if in_bytes is None or 4 * in_bytes > max_bytes:
      reduced, why = None, "its shapes are unknown without a run"
  if reduced is None:
    need = (f"about {hygiene_bytes(m[0]) / 2**30:.1f} GiB" if m is not None else
            "an unknown amount (no meta-device run)" if in_bytes is None else
            f"more than {4 * in_bytes / 2**30:.1f} GiB (no meta-device run)")
    rec.verdict = "flagged"
    rec.reasons = [f"not checked on {device}: the checks need {need}, over the limit of {max_bytes / 2**30:.1f} "
                   f"GiB, and {why}"]
    rec.seconds = time.perf_counter() - t0
    return rec
  rec.reduced = reduced
  excluded, flagged = [], []
  with torch.no_grad():
    model = _build(module, MODEL_SEED, device)
    mode_dep = sorted({type(sub).__name__ for sub in model.modules()
                       if any(k in type(sub).__name__ for k in MODE_DEPENDENT)})
    if mode_dep:
      flagged.append(f"{', '.join(mode_dep)}: random in training mode; the reference runs it as the identity (dropout off), "
                     f"so a kernel must not apply dropout")
    xs = I.draw(module, "task", 1, torch.device(device))
    ys = _outs(model(*_clone(xs)))
    if m is None:  # The footprint from the live run (at the task's own sizes: nothing was reduced).
      from kevin_jax.kernels import taskinfo  # pylint: disable=g-import-not-at-top
      info = taskinfo.describe_live(task_id, module, model, xs, ys)
      b = footprint.task_bytes(info)
      rec.input_bytes, rec.output_bytes, rec.param_bytes = b.inputs, b.outputs, b.params
      rec.evaluation_bytes = footprint.evaluation_bytes(info)
    ys_again = _outs(model(*_clone(xs)))
    for k, (a, b) in enumerate(zip(ys, ys_again)):
      if not _all_close(a, b, atol, rtol):
        excluded.append(f"out{k}: non-deterministic with dropout off (two calls on the same inputs differ beyond "
                        f"atol={atol:g}, rtol={rtol:g})")
    del ys_again
    ys_other = _outs(model(*I.draw(module, "task", 2, torch.device(device))))
    ys_w = [None] * len(ys)
    if any(p.is_floating_point() for p in model.parameters()):
      ys_w = _outs(_build(module, OTHER_WEIGHTS_SEED, device)(*_clone(xs)))
    params = [(f"parameter '{n}'", p) for n, p in list(model.named_parameters()) + list(model.named_buffers())]
    tensor_inputs = lambda xl: [(f"input {i}", x) for i, x in enumerate(xl) if isinstance(x, torch.Tensor)]
    first = next((x for x in xs if isinstance(x, torch.Tensor)), None)
    # Per output, the trivial candidates that still match on every distribution so far: kind -> what it writes.
    alive = []
    for k, y in enumerate(ys):
      st = suite.degeneracy_stats(y, atol=atol, rtol=rtol, y_other_inputs=ys_other[k], y_other_weights=ys_w[k],
                                  x=first)
      st["copy"], copy_what = _copy_fraction(y, tensor_inputs(xs) + params, atol, rtol)
      rec.stats.append({n: (round(st[n], 6) if isinstance(st[n], float) and n != "constant_value" else st[n])
                        for n in ("zeros", "constant", "constant_value", "copy", "varying", "weight_sensitive")})
      kinds = {}
      if st["zeros"] > suite.GATE_MAX_PASS:
        kinds["zeros"] = "all zeros"
      if st["constant"] > suite.GATE_MAX_PASS:
        kinds["constant"] = f"the constant {st['constant_value']:.6g}"
      if st["copy"] > suite.GATE_MAX_PASS:
        kinds["copy"] = f"a {copy_what}"
      alive.append(kinds)
      if st["weight_sensitive"] is not None and st["weight_sensitive"] < suite.GATE_MIN_WEIGHT_SENSITIVE:
        flagged.append(f"out{k}: only {st['weight_sensitive']:.2%} of the elements change with the weights")
    del ys_other, ys_w
    used = ["task"]
    for dist in dists[1:]:
      if not any(alive):
        break
      xd = I.draw(module, dist, 3, torch.device(device))
      yd = _outs(model(*_clone(xd)))
      if not all(torch.isfinite(y).all() for y in yd if y.is_floating_point()):
        flagged.append(f"the reference is not finite on '{dist}' inputs (the evaluator falls back to the task's)")
        continue
      used.append(dist)
      named = dict(tensor_inputs(xd) + params)
      for k, y in enumerate(yd):
        kinds = alive[k]
        if "zeros" in kinds and suite.close_fraction(torch.zeros((), dtype=y.dtype), y, atol, rtol) <= \
            suite.GATE_MAX_PASS:
          del kinds["zeros"]
        if "constant" in kinds:
          c = rec.stats[k]["constant_value"]
          if suite.degeneracy_stats(y, atol=atol, rtol=rtol, fixed_constant=c)["constant"] <= suite.GATE_MAX_PASS:
            del kinds["constant"]
        if "copy" in kinds:
          name = kinds["copy"].split(" copy of ", 1)[1]
          f, _ = _copy_fraction(y, [(name, named[name])] if name in named else [], atol, rtol)
          if f <= suite.GATE_MAX_PASS:
            del kinds["copy"]
  for k, st in enumerate(rec.stats):  # Near-constant outputs that no single trivial kernel matches everywhere.
    if st["varying"] is not None and st["varying"] < suite.GATE_MIN_VARYING and not alive[k]:
      flagged.append(f"out{k}: only {st['varying']:.2%} of the elements change between input draws")
  if ys and all(alive):
    what = "; ".join(f"out{k}: {' / '.join(kinds.values())}" for k, kinds in enumerate(alive))
    excluded.append(f"degenerate: a trivial kernel passes on every input distribution ({', '.join(used)}) within "
                    f"atol={atol:g}, rtol={rtol:g}: {what}")
  elif any(alive):
    flagged += [f"out{k}: matches {' / '.join(kinds.values())} on every input distribution"
                for k, kinds in enumerate(alive) if kinds]
  rec.device = device
  rec.reasons = excluded + flagged
  rec.verdict = "excluded" if excluded else ("flagged" if flagged else "ok")
  rec.seconds = time.perf_counter() - t0
  return rec


def default_max_bytes(device: str) -> int:
  """The checks' memory limit per task: on a CUDA device half of what this process can use there (free memory plus
  what its allocator caches unused: earlier tasks' freed tensors), elsewhere CPU_MAX_BYTES."""
  import torch  # pylint: disable=g-import-not-at-top
  dev = torch.device(device)
  if dev.type != "cuda":
    return CPU_MAX_BYTES
  usable = torch.cuda.mem_get_info(dev)[0] + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
  return int(0.5 * usable)


def _release(device: str) -> None:
  """Returns a task's cached GPU memory to the driver, so the next task (and other processes) can use it."""
  import torch  # pylint: disable=g-import-not-at-top
  if torch.device(device).type == "cuda":
    torch.cuda.empty_cache()


def _short(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def check_task(spec: tasks.TaskSpec, **kw) -> TaskHygiene:
  """check_module on a task file; a task that fails to import or run is excluded with the error."""
  t0 = time.perf_counter()
  sha = source_sha256(spec)
  try:
    module = tasks.load_module(spec)
  except BaseException as e:  # pylint: disable=broad-except  # SyntaxError, a missing package, SystemExit ...
    return TaskHygiene(task_id=spec.id, verdict="excluded", sha256=sha, seconds=time.perf_counter() - t0,
                       reasons=[f"fails to import: {_short(e)}"])
  try:
    return check_module(module, spec.id, sha256=sha, **kw)
  except Exception as e:  # pylint: disable=broad-except
    return TaskHygiene(task_id=spec.id, verdict="excluded", sha256=sha, seconds=time.perf_counter() - t0,
                       reasons=[f"the reference fails: {_short(e)}"])
  finally:
    _release(kw.get("device", "cpu"))


# --- cache and report (no torch) ---------------------------------------------------------------------------------

def settings_key(atol: float, rtol: float, distributions: Sequence[str]) -> str:
  text = json.dumps({"v": VERSION, "atol": atol, "rtol": rtol, "dists": list(distributions)}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def _cache_path(cache_dir: str, sha: str, key: str) -> str:
  return os.path.join(cache_dir, f"{sha}-{key}.json")


def cached(specs: Sequence[tasks.TaskSpec], cache_dir: str, key: str) -> dict[str, TaskHygiene]:
  """The cached records of these tasks (by task id); tasks without one are absent."""
  out = {}
  for s in specs:
    try:
      with open(_cache_path(cache_dir, source_sha256(s), key), encoding="utf-8") as f:
        rec = TaskHygiene.from_dict(json.load(f))
    except (OSError, ValueError, TypeError):
      continue
    out[s.id] = dataclasses.replace(rec, task_id=s.id)
  return out


def _store(rec: TaskHygiene, cache_dir: str, key: str) -> None:
  if not rec.checked and rec.verdict != "excluded":
    return  # Not checked (too large here): another device may check it.
  os.makedirs(cache_dir, exist_ok=True)
  path = _cache_path(cache_dir, rec.sha256, key)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(rec.to_dict(), f, indent=1)
  os.replace(tmp, path)


def hygiene_report(specs: Sequence[tasks.TaskSpec], device: str = "cpu", *, atol: float = 1e-4, rtol: float = 1e-4,
                   distributions: Sequence[str] = DEFAULT_DISTRIBUTIONS, max_bytes: int | None = None,
                   cache_dir: str | None = None, log=None) -> list[TaskHygiene]:
  """check_task on every task (answered from `cache_dir` when a record of the same source and settings is there)."""
  key = settings_key(atol, rtol, distributions)
  have = cached(specs, cache_dir, key) if cache_dir else {}
  out = []
  for s in specs:
    rec = have.get(s.id)
    if rec is None:
      rec = check_task(s, device=device, atol=atol, rtol=rtol, distributions=distributions, max_bytes=max_bytes)
      if cache_dir:
        _store(rec, cache_dir, key)
    if log:
      log(f"{rec.verdict:9s} {rec.task_id} ({rec.seconds:.1f} s{', ' + rec.reduced if rec.reduced else ''})"
          + (": " + " | ".join(rec.reasons) if rec.reasons else ""))
    out.append(rec)
  return out


COLUMNS = ("task_id", "verdict", "reasons", "device", "reduced", "input_bytes", "output_bytes", "param_bytes",
           "evaluation_bytes", "seconds", "sha256")


def write_report(records: Sequence[TaskHygiene], out_dir: str, name: str = "hygiene") -> tuple[str, str]:
  """<out_dir>/<name>.md (a summary and every task that is not ok) and <name>.csv (every task); returns the paths."""
  os.makedirs(out_dir, exist_ok=True)
  csv_path, md_path = os.path.join(out_dir, name + ".csv"), os.path.join(out_dir, name + ".md")
  with open(csv_path, "w", encoding="utf-8", newline="") as f:
    w = csv.writer(f)
    w.writerow(COLUMNS)
    for r in records:
      d = r.to_dict()
      d["reasons"] = " | ".join(r.reasons)
      d["seconds"] = f"{r.seconds:.2f}"
      w.writerow([d[c] for c in COLUMNS])
  n = {v: sum(r.verdict == v for r in records) for v in VERDICTS}
  gib = lambda b: f"{b / 2**30:.2f}" if b else "?"
  devices = ", ".join(sorted({r.device for r in records if r.device})) or "-"
  lines = [f"# Task hygiene: {len(records)} tasks", "",
           f"{n['ok']} ok, {n['flagged']} flagged, {n['excluded']} excluded; "
           f"{sum(not r.checked for r in records)} not run ({devices} otherwise); "
           f"{sum(bool(r.reduced) for r in records)} at a reduced batch_size.", "",
           "| task | verdict | reasons | inputs+outputs GiB | evaluation GiB | reduced |", "|---|---|---|---|---|---|"]
  for r in records:
    if r.verdict != "ok":
      lines.append(f"| {r.task_id} | {r.verdict} | {'<br>'.join(r.reasons).replace('|', '/')} | "
                   f"{gib(r.input_bytes + r.output_bytes)} | {gib(r.evaluation_bytes)} | {r.reduced} |")
  with open(md_path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return md_path, csv_path


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--source", required=True, help="a task source (tasks.discover): a directory, a file, 'bundled'")
  p.add_argument("--levels", default="", help="comma-separated levels (default: all)")
  p.add_argument("--ids", default="", help="comma-separated task ids to check (default: all of the source)")
  p.add_argument("--device", default="cpu", help="cpu | cuda | auto (cuda when a GPU is visible)")
  p.add_argument("--atol", type=float, default=1e-4)
  p.add_argument("--rtol", type=float, default=1e-4)
  p.add_argument("--distributions", default=",".join(DEFAULT_DISTRIBUTIONS))
  p.add_argument("--max-gb", type=float, default=0.0,
                 help="memory the checks may use per task, GiB (0 = 0.5 on the CPU, half the usable GPU memory)")
  p.add_argument("--cache-dir", default="", help="record cache ('' = none)")
  p.add_argument("--out", default="", help="write hygiene.md and hygiene.csv here")
  p.add_argument("--json", default="", help="write the records to this JSON file")
  a = p.parse_args(argv)
  if a.device == "auto":
    import torch  # pylint: disable=g-import-not-at-top
    a.device = "cuda" if torch.cuda.is_available() else "cpu"
  levels = [int(x) for x in a.levels.split(",") if x.strip()] or None
  specs = tasks.discover(a.source, levels)
  if a.ids:
    want = {x.strip() for x in a.ids.split(",") if x.strip()}
    specs = [s for s in specs if s.id in want]
  recs = hygiene_report(specs, a.device, atol=a.atol, rtol=a.rtol,
                        distributions=[d for d in a.distributions.split(",") if d],
                        max_bytes=int(a.max_gb * 2**30) or None, cache_dir=a.cache_dir or None,
                        log=lambda line: print(line, flush=True))
  if a.out:
    print("wrote", *write_report(recs, a.out))
  if a.json:
    with open(a.json, "w", encoding="utf-8") as f:
      json.dump([r.to_dict() for r in recs], f, indent=1)
  n = {v: sum(r.verdict == v for r in recs) for v in VERDICTS}
  print(f"{len(recs)} tasks: {n['ok']} ok, {n['flagged']} flagged, {n['excluded']} excluded")
  return 0


memory_budget_ok = footprint.memory_budget_ok  # The evaluator's per-task budget (kernels/footprint.py).


if __name__ == "__main__":
  sys.exit(main())
