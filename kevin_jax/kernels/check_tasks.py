"""Lists and validates a task source: which tasks load, which fail and why.

  python -m kevin_jax.kernels.check_tasks --source bundled
  python -m kevin_jax.kernels.check_tasks --source ~/KernelBench/KernelBench --levels 1,2 \
      --config configs/kernelbench.py          # also check the config's train/test ids against the source
  python -m kevin_jax.kernels.check_tasks --source generated --config configs/multiturn.py
      # the task world of the config's tasks.world_* fields: families, split sizes, the degenerate gate

A generated source (or a task-world directory) is summarised per family: split sizes, main ops, how many tasks
load, the model's eager-time range, and the degenerate gate (kernels/suite.py) run on every task's reduced twin
on the CPU (`--gate full` at the real sizes: minutes per family); per-task lines only for failures (`-v`: all).

Each task goes through the stages a training run needs, and the first failing stage is reported:
  import       the file executes and defines Model, get_inputs, get_init_inputs (KernelBench format)
  init         get_init_inputs() and Model(*init) in the reference mode (dropout off) on the meta device (no memory, no compute)
  inputs       get_inputs() on the meta device
  forward      Model.forward on the meta device
  outputs      the outputs are tensors (what the evaluator compares)
When init or forward fails on the meta device (an op without a meta kernel, e.g. Tensor.item()), the task is built
and run on the CPU as the evaluator's shape analysis does (kernels/taskinfo.py) when its inputs are small
(--cpu-limit-mb), else it is reported as unchecked. `--hygiene` also prints each loading task's hygiene verdict
(kernels/hygiene.py: degenerate, non-deterministic, mode-dependent, footprint) on the CPU at reduced sizes.
Exit status: 0 when every task loads (and the config's ids all exist), 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
import traceback

from kevin_jax.kernels import tasks
from kevin_jax.kernels.taskinfo import as_reference


@dataclasses.dataclass
class Check:
  id: str
  ok: bool
  stage: str = ""  # The failing stage ('' when ok).
  reason: str = ""
  inputs: list = dataclasses.field(default_factory=list)  # [(shape, dtype)] of tensor inputs.
  outputs: list = dataclasses.field(default_factory=list)
  device: str = "meta"  # Where forward ran: meta | cpu | unchecked.
  seconds: float = 0.0


def _short(e: BaseException) -> str:
  msg = str(e).strip().splitlines()
  return f"{type(e).__name__}: {msg[0][:200] if msg else ''}"


def _where(e: BaseException, path: str) -> str:
  """The line of the task file where the exception arose, if any."""
  frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
  return f" (line {frames[-1].lineno})" if frames else ""


def _tensors(xs):
  import torch  # pylint: disable=g-import-not-at-top
  return [(list(x.shape), str(x.dtype).replace("torch.", "")) for x in xs if isinstance(x, torch.Tensor)]


def check_task(spec: tasks.TaskSpec, cpu_limit_mb: float = 256.0) -> Check:
  """Runs the stages of the module docstring on one task."""
  import torch  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  c = Check(id=spec.id, ok=False)

  def fail(stage, e):
    c.stage, c.reason = stage, _short(e) + _where(e, spec.path)
    c.seconds = time.perf_counter() - t0
    return c

  try:
    module = tasks.load_module(spec)
  except BaseException as e:  # pylint: disable=broad-except  # SyntaxError, SystemExit from task code ...
    return fail("import", e)
  with torch.no_grad():
    meta_failed = None  # (stage, exception) of a meta-device failure: the CPU decides.
    model = None
    try:
      with torch.device("meta"):
        torch.manual_seed(0)
        model = as_reference(module.Model(*module.get_init_inputs()))
    except Exception as e:  # pylint: disable=broad-except  # An op without a meta kernel, or a broken init.
      meta_failed = ("init", e)
    try:
      with torch.device("meta"):
        inputs = list(module.get_inputs())
    except Exception as e:  # pylint: disable=broad-except
      return fail("inputs", e)
    c.inputs = _tensors(inputs)
    if model is not None:
      try:
        with torch.device("meta"):
          out = model(*inputs)
      except Exception as e:  # pylint: disable=broad-except  # An op without a meta kernel.
        meta_failed = ("forward", e)
    if meta_failed is not None:
      stage, meta_error = meta_failed
      nbytes = sum(math.prod(s) * torch.empty((), dtype=getattr(torch, d)).element_size() for s, d in c.inputs)
      if nbytes > cpu_limit_mb * 2**20:
        c.device, c.ok = "unchecked", True
        c.reason = f"{stage} has no meta implementation ({_short(meta_error)}); inputs too large for a CPU check"
        c.seconds = time.perf_counter() - t0
        return c
      try:
        torch.manual_seed(0)
        model = as_reference(module.Model(*module.get_init_inputs()))
      except Exception as e:  # pylint: disable=broad-except
        return fail("init", e)
      try:
        out = model(*module.get_inputs())
        c.device = "cpu"
      except Exception as e:  # pylint: disable=broad-except
        return fail("forward", e)
  outs = list(out) if isinstance(out, (tuple, list)) else [out]
  if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
    return fail("outputs", TypeError(f"forward returned {type(out).__name__}, not tensors"))
  c.outputs = _tensors(outs)
  c.ok = True
  c.seconds = time.perf_counter() - t0
  return c


def _load_config(arg: str):
  """'path/to/config.py[:presets]' -> ConfigDict (the config's get_config(presets))."""
  path, _, presets = arg.partition(":")
  spec = importlib.util.spec_from_file_location("_check_tasks_config", path)
  if spec is None or spec.loader is None:
    raise SystemExit(f"error: cannot load config {path}")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(presets)


def split_report(specs, cfg) -> tuple[dict, list[str]]:
  """The config's split on these tasks: counts per level, and its ids missing from the source."""
  t = cfg.tasks
  known = {s.id for s in specs}
  missing = sorted((set(t.train_ids) | set(t.test_ids)) - known)
  if missing:
    return {}, missing
  train, test = tasks.split(specs, test_fraction=t.test_fraction, seed=t.split_seed, train_ids=t.train_ids,
                            test_ids=t.test_ids)
  count = lambda xs: {f"level{l}": sum(s.level == l for s in xs) for l in sorted({s.level for s in specs})}
  return {"train": count(train), "test": count(test)}, []


def _world_config(source: str, config_arg: str):
  from kevin_jax.data.taskgen import world  # pylint: disable=g-import-not-at-top
  if config_arg:
    wc = world.WorldConfig.from_config(_load_config(config_arg).tasks)
    if ":" in source:
      wc = dataclasses.replace(wc, seed=world.WorldConfig.parse(source).seed)
    return wc
  if tasks.is_generated(source):
    return world.WorldConfig.parse(source)
  return world.from_source(source).config


def gate_task(task, full: bool = False) -> list[str]:
  """The degenerate gate's complaints about a generated task, at its reduced (or real) sizes."""
  import types  # pylint: disable=g-import-not-at-top
  from kevin_jax.kernels import suite  # pylint: disable=g-import-not-at-top
  module = types.ModuleType("gated_task")
  text = task.source if full else task.reduced_source
  exec(compile(text, task.id, "exec"), module.__dict__)  # pylint: disable=exec-used  # A generated task module.
  return [f"out{k}: {p}" for k, st in enumerate(suite.gate_module(module)) for p in st["problems"]]


def check_world(source: str, config_arg: str = "", gate: str = "reduced", verbose: bool = False,
                cpu_limit_mb: float = 256.0, out=print) -> tuple[int, list[dict]]:
  """The task-world report (module docstring); returns (exit status, per-task rows)."""
  import statistics  # pylint: disable=g-import-not-at-top
  from kevin_jax.data.taskgen import world  # pylint: disable=g-import-not-at-top
  wc = _world_config(source, config_arg)
  w = world.build(wc)
  root = world.materialize(wc)
  specs = {s.id: s for s in tasks.discover(root)}
  out(f"task world: seed {wc.seed}; per family {wc.train} train, {wc.heldout_compositions} heldout_compositions, "
      f"{wc.heldout_styles} heldout_styles -> {root}")
  rows = []
  t0 = time.perf_counter()
  for t in w.tasks:
    c = check_task(specs[t.id], cpu_limit_mb)
    problems = gate_task(t, full=gate == "full") if gate != "none" and c.ok else []
    rows.append({"id": t.id, "family": t.family, "split": t.split, "main": t.spec.main, "ok": c.ok,
                 "stage": c.stage, "reason": c.reason, "gate": problems, "model_ms": t.spec.model_ms})
    if not c.ok or problems or verbose:
      what = f"{c.stage}: {c.reason}" if not c.ok else ("; ".join(problems) if problems else "ok")
      out(f"{'ok   ' if c.ok and not problems else 'FAIL '} {t.id} [{t.split}]: {what}")
  out(f"{'family':12s} {'train':>5s} {'h_comp':>6s} {'h_style':>7s} {'load':>8s} {'gate':>8s}  "
      f"{'model eager ms min/med/max':>26s}  main ops")
  for family in world.FAMILIES:
    mine = [r for r in rows if r["family"] == family]
    n = {sp: sum(r["split"] == sp for r in mine) for sp in world.GENERATED_SPLITS}
    ms = [r["model_ms"] for r in mine]
    mains: dict[str, int] = {}
    for r in mine:
      mains[r["main"]] = mains.get(r["main"], 0) + 1
    gate_cell = f"{sum(not r['gate'] for r in mine if r['ok'])}/{len(mine)}" if gate != "none" else "-"
    out(f"{family:12s} {n['train']:5d} {n['heldout_compositions']:6d} {n['heldout_styles']:7d} "
        f"{sum(r['ok'] for r in mine):4d}/{len(mine):<3d} {gate_cell:>8s}  "
        f"{min(ms):8.2f} {statistics.median(ms):8.2f} {max(ms):8.2f}  "
        + ", ".join(f"{k} {v}" for k, v in sorted(mains.items(), key=lambda kv: -kv[1])))
  generated = {r["id"] for r in rows}
  n_suite = sum(s.id not in generated for s in specs.values())
  bad = [r for r in rows if not r["ok"] or r["gate"]]
  out(f"suite: {n_suite} bundled tasks (split 'suite')")
  out(f"{len(rows)} generated tasks: {sum(r['ok'] for r in rows)} load, {sum(not r['ok'] for r in rows)} fail; "
      + (f"degenerate gate at {gate} sizes: {sum(not r['gate'] for r in rows if r['ok'])} pass, "
         f"{sum(bool(r['gate']) for r in rows)} fail" if gate != "none" else "degenerate gate not run")
      + f" ({time.perf_counter() - t0:.0f} s)")
  return (1 if bad else 0), rows


def hygiene_summary(specs, device: str = "cpu", max_gb: float = 0.0, out=print) -> list:
  """Prints a hygiene verdict per task and a summary line; returns the kernels/hygiene.py records."""
  from kevin_jax.kernels import hygiene  # pylint: disable=g-import-not-at-top
  recs = hygiene.hygiene_report(specs, device, max_bytes=int(max_gb * 2**30) or None,
                                log=lambda line: out("hygiene " + line))
  n = {v: sum(r.verdict == v for r in recs) for v in hygiene.VERDICTS}
  out(f"hygiene on {device}: {n['ok']} ok, {n['flagged']} flagged, {n['excluded']} excluded, "
      f"{sum(not r.checked for r in recs)} not run")
  return recs


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--source", default="bundled", help="'bundled', a KernelBench-style directory, or one task file")
  p.add_argument("--levels", default="", help="comma-separated levels of a directory source (default: all)")
  p.add_argument("--config", default="", help="also check this config's tasks.train_ids/test_ids: FILE[:presets]")
  p.add_argument("--cpu-limit-mb", type=float, default=256.0,
                 help="largest input size (MB) run on the CPU when forward has no meta implementation")
  p.add_argument("--json", default="", help="also write the per-task results to this JSON file")
  p.add_argument("-q", "--quiet", action="store_true", help="print only failures and the summary")
  p.add_argument("-v", "--verbose", action="store_true", help="task world: a line per task")
  p.add_argument("--hygiene", action="store_true",
                 help="also print each loading task's hygiene verdict (kernels/hygiene.py, on --hygiene-device)")
  p.add_argument("--hygiene-device", default="cpu", help="cpu | cuda: where --hygiene runs the references")
  p.add_argument("--hygiene-max-gb", type=float, default=0.0,
                 help="memory the hygiene checks may use per task, GiB (0 = 0.5 on the CPU, half the free GPU memory)")
  p.add_argument("--gate", choices=("reduced", "full", "none"), default="reduced",
                 help="task world: the degenerate gate at the reduced sizes (default), the real sizes, or not at all")
  a = p.parse_args(argv)
  if tasks.is_generated(a.source) or os.path.isfile(os.path.join(os.path.expanduser(a.source), tasks.WORLD_MANIFEST)):
    status, rows = check_world(a.source, a.config, a.gate, a.verbose, a.cpu_limit_mb)
    if a.json:
      with open(a.json, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    return status
  levels = [int(x) for x in a.levels.split(",") if x.strip()] or None
  try:
    specs = tasks.discover(a.source, levels)
  except FileNotFoundError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  checks = []
  for spec in specs:
    c = check_task(spec, a.cpu_limit_mb)
    checks.append(c)
    if not c.ok:
      print(f"FAIL  {c.id}: {c.stage}: {c.reason}")
    elif not a.quiet:
      shapes = " ".join(f"{d}{s}" for s, d in c.inputs) + " -> " + " ".join(f"{d}{s}" for s, d in c.outputs)
      note = f"  [{c.device}: {c.reason}]" if c.reason else ("" if c.device == "meta" else f"  [{c.device}]")
      print(f"ok    {c.id}: {shapes}{note}")
  bad = [c for c in checks if not c.ok]
  by_stage = {}
  for c in bad:
    by_stage[c.stage] = by_stage.get(c.stage, 0) + 1
  unchecked = sum(c.device == "unchecked" for c in checks)
  print(f"{len(checks)} tasks in {a.source}: {len(checks) - len(bad)} load, {len(bad)} fail"
        + (f" ({', '.join(f'{n} at {s}' for s, n in by_stage.items())})" if bad else "")
        + (f"; {unchecked} forward unchecked (no meta kernel, large inputs)" if unchecked else ""))
  status = 1 if bad else 0
  if a.hygiene:
    hygiene_summary([s for s, c in zip(specs, checks) if c.ok], a.hygiene_device, a.hygiene_max_gb)
  if a.config:
    counts, missing = split_report(specs, _load_config(a.config))
    if missing:
      print(f"config {a.config}: {len(missing)} train/test ids are not in the source, e.g. {missing[:5]}")
      status = 1
    else:
      print(f"config {a.config}: train {counts['train']}, test {counts['test']}")
  if a.json:
    with open(a.json, "w", encoding="utf-8") as f:
      json.dump([dataclasses.asdict(c) for c in checks], f, indent=1)
  return status


if __name__ == "__main__":
  sys.exit(main())
