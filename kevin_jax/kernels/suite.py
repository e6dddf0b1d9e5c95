"""The bundled task suite: tasks, their labelled candidates, metadata, and the degenerate candidates.

Layout (kevin_jax/data; conventions in kevin_jax/data/README.md):

    tasks/level<L>/<NN_Name>.py              KernelBench-format task
    solutions/level<L>/<NN_Name>/meta.json   level, ops, shapes, description, H200 numbers, labelled candidates
    solutions/level<L>/<NN_Name>/<name>.md   one candidate per entry of meta["solutions"] (naive, optimized,
                                             wrong_*), each labelled with the evaluator status it must get

Every task must also reject three *degenerate* candidates generated here (evaluator-anchors §6.6): one writes
zeros into every output, one a constant, one the first input tensor (cast, wrapped around when the output is
larger); on the CPU, `gate_module` checks a task module's outputs against them with real numbers. Candidates,
degenerate candidates and the gate serve the generated task world too (kevin_jax/data/taskgen). Shared by the CI
tests, the degenerate-task gate, check_tasks, experiments/verify_suite.py and the corpus export.
Evaluator side: imports no JAX; torch only lazily (taskinfo.analyze_task, the gate).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Sequence

from kevin_jax.kernels import tasks

DATA_DIR = os.path.dirname(tasks.BUNDLED_DIR)
SOLUTIONS_DIR = os.path.join(DATA_DIR, "solutions")
EXPECTS = ("correct", "incorrect", "runtime_error", "timeout", "compile_error", "format_error")
REQUIRED_SOLUTIONS = ("naive", "optimized")
MIN_WRONG_VARIANTS = 2
META_KEYS = ("level", "ops", "shapes", "description", "ref_time_ms_h200", "best_speedup_h200", "solutions")
DEGENERATE_KINDS = ("zeros", "constant", "identity")

_CTYPES = {"float32": "float", "float64": "double", "float16": "__half", "bfloat16": "__nv_bfloat16",
           "int32": "int", "int64": "long long", "int16": "short", "int8": "signed char", "uint8": "unsigned char",
           "bool": "bool"}
_SUMMARY = re.compile(r"^Summary:[ \t]*(.*)$", re.M)


@dataclasses.dataclass(frozen=True)
class SuiteCandidate:
  """One labelled candidate of a task."""
  task_id: str
  name: str  # 'naive', 'optimized', 'wrong_tail', 'degenerate_zeros', ...
  kind: str  # 'solution' (correct by design) | 'variant' (known wrong) | 'degenerate'
  expect: str  # The evaluator status it must get (one of EXPECTS); degenerate ones must not be 'correct'.
  text: str  # The ```cuda and ```plan blocks, exactly what a policy would answer after its reasoning.
  summary: str = ""
  bug: str = ""

  @property
  def key(self) -> str:
    return f"{self.task_id}:{self.name}"


@dataclasses.dataclass(frozen=True)
class SuiteTask:
  """A bundled task with its metadata and labelled candidates."""
  spec: tasks.TaskSpec
  meta_path: str

  @property
  def id(self) -> str:
    return self.spec.id

  @property
  def level(self) -> int:
    return self.spec.level

  @property
  def source(self) -> str:
    """The task module's text (what prompts show)."""
    return self.spec.source

  @property
  def solutions_dir(self) -> str:
    return os.path.dirname(self.meta_path)

  @property
  def meta(self) -> dict:
    return read_meta(self.meta_path)

  def candidates(self, kinds: Sequence[str] = ("solution", "variant")) -> list[SuiteCandidate]:
    """The labelled candidates in meta.json order (solutions first as listed, then the wrong variants)."""
    out = []
    for name, entry in self.meta["solutions"].items():
      kind = "solution" if entry["expect"] == "correct" else "variant"
      if kind not in kinds:
        continue
      with open(os.path.join(self.solutions_dir, name + ".md"), encoding="utf-8") as f:
        text, summary = split_candidate_file(f.read())
      out.append(SuiteCandidate(task_id=self.id, name=name, kind=kind, expect=entry["expect"], text=text,
                                summary=summary, bug=entry.get("bug", "")))
    return out


def split_candidate_file(text: str) -> tuple[str, str]:
  """A candidate .md file -> (candidate text with the blocks, summary sentence after them)."""
  last_fence = text.rfind("```")
  tail = text[last_fence + 3:] if last_fence >= 0 else ""
  m = _SUMMARY.search(tail)
  if m is None:
    return text.strip(), ""
  return (text[:last_fence + 3] + tail[:m.start()]).strip(), m.group(1).strip()


def read_meta(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def format_meta(meta: dict) -> str:
  """meta.json text: one key per line, short values (lists, candidate entries) kept on one line."""

  def fmt(v, indent: int) -> str:
    flat = json.dumps(v)
    if not isinstance(v, dict) or indent + len(flat) <= 116:
      return flat
    pad = " " * (indent + 2)
    items = [f"{pad}{json.dumps(k)}: {fmt(x, indent + 2)}" for k, x in v.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"

  return fmt(meta, 0) + "\n"


def write_meta(path: str, meta: dict) -> None:
  with open(path, "w", encoding="utf-8") as f:
    f.write(format_meta(meta))


def meta_problems(task: SuiteTask) -> list[str]:
  """Schema problems of a task's meta.json and candidate files ([] when valid)."""
  try:
    meta = task.meta
  except (OSError, ValueError) as e:
    return [f"{task.id}: unreadable meta.json: {e}"]
  p = []
  missing = [k for k in META_KEYS if k not in meta]
  if missing:
    return [f"{task.id}: meta.json lacks {missing}"]
  if meta["level"] != task.level:
    p.append(f"{task.id}: meta level {meta['level']} != directory level {task.level}")
  if not meta["ops"] or not all(isinstance(o, str) and o for o in meta["ops"]):
    p.append(f"{task.id}: ops must be a non-empty list of names")
  if not isinstance(meta["shapes"], dict) or not meta["shapes"]:
    p.append(f"{task.id}: shapes must map tensor names to shapes")
  if not isinstance(meta["description"], str) or len(meta["description"]) < 20:
    p.append(f"{task.id}: description missing or too short")
  for k in ("ref_time_ms_h200", "best_speedup_h200"):
    if meta[k] is not None and not (isinstance(meta[k], (int, float)) and meta[k] > 0):
      p.append(f"{task.id}: {k} must be null or a positive number")
  sols = meta["solutions"]
  for name in REQUIRED_SOLUTIONS:
    if sols.get(name, {}).get("expect") != "correct":
      p.append(f"{task.id}: solutions.{name} must exist with expect=correct")
  wrong = [n for n, e in sols.items() if e.get("expect") != "correct"]
  if len(wrong) < MIN_WRONG_VARIANTS:
    p.append(f"{task.id}: needs >= {MIN_WRONG_VARIANTS} known-wrong variants, has {wrong}")
  for name, e in sols.items():
    if e.get("expect") not in EXPECTS:
      p.append(f"{task.id}: {name}: expect {e.get('expect')!r} not in {EXPECTS}")
    if e.get("expect") != "correct" and len(e.get("bug", "")) < 10:
      p.append(f"{task.id}: {name}: a wrong variant needs a 'bug' description")
    path = os.path.join(task.solutions_dir, name + ".md")
    if not os.path.isfile(path):
      p.append(f"{task.id}: {name}.md is missing")
      continue
    with open(path, encoding="utf-8") as f:
      text, summary = split_candidate_file(f.read())
    if "```cuda" not in text or "```plan" not in text:
      p.append(f"{task.id}: {name}.md lacks a ```cuda or ```plan block")
    if not summary:
      p.append(f"{task.id}: {name}.md lacks a 'Summary:' line after the blocks")
  listed = set(sols)
  extra = sorted(f[:-3] for f in os.listdir(task.solutions_dir) if f.endswith(".md") and f[:-3] not in listed)
  if extra:
    p.append(f"{task.id}: candidate files not listed in meta.json: {extra}")
  return p


def load_suite(levels: Sequence[int] | None = None) -> list[SuiteTask]:
  """Every bundled task that has a solutions directory, sorted by id (see `orphans` for the others)."""
  out = []
  for spec in tasks.discover("bundled", levels):
    meta_path = os.path.join(SOLUTIONS_DIR, spec.id, "meta.json")
    if os.path.isfile(meta_path):
      out.append(SuiteTask(spec=spec, meta_path=meta_path))
  return out


def orphans() -> tuple[list[str], list[str]]:
  """(task ids without solutions/meta.json, solution directories without a task file)."""
  ids = {s.id for s in tasks.discover("bundled")}
  with_meta = set()
  for level in sorted(os.listdir(SOLUTIONS_DIR)) if os.path.isdir(SOLUTIONS_DIR) else []:
    ldir = os.path.join(SOLUTIONS_DIR, level)
    if os.path.isdir(ldir):
      with_meta |= {f"{level}/{d}" for d in os.listdir(ldir) if os.path.isdir(os.path.join(ldir, d))}
  return sorted(ids - with_meta), sorted(with_meta - ids)


# --- degenerate candidates ----------------------------------------------------------------------------------

def _ctype(dtype: str) -> str:
  if dtype not in _CTYPES:
    raise ValueError(f"no C type for dtype {dtype}")
  return _CTYPES[dtype]


def _headers(dtypes) -> str:
  inc = []
  if "float16" in dtypes:
    inc.append("#include <cuda_fp16.h>")
  if "bfloat16" in dtypes:
    inc.append("#include <cuda_bf16.h>")
  return "\n".join(inc) + ("\n\n" if inc else "")


def degenerate_candidate(task_id: str, info, kind: str, constant: float = 1.0) -> SuiteCandidate:
  """A candidate that fills every output with zeros, `constant`, or the first input tensor (cast, wrapped).

  Args:
    task_id: the task id.
    info: the task's kevin_jax.kernels.taskinfo.TaskInfo (output shapes/dtypes, input names/dtypes).
    kind: 'zeros' | 'constant' | 'identity'.
    constant: the value the constant candidate writes (converted to each output's dtype).
  """
  if kind not in DEGENERATE_KINDS:
    raise ValueError(f"kind must be one of {DEGENERATE_KINDS}, got {kind!r}")
  src = None
  if kind == "identity":
    src = next(((n, i["dtype"]) for n, i in zip(info.input_names, info.inputs) if i["kind"] == "tensor"), None)
    if src is None:
      raise ValueError(f"task {task_id} has no tensor input to copy")
  dtypes = {o["dtype"] for o in info.outputs} | ({src[1]} if src else set())
  kernels, launches = [], []
  for k, out in enumerate(info.outputs):
    ct = _ctype(out["dtype"])
    if kind == "identity":
      sct = _ctype(src[1])
      body = f"y[i] = static_cast<{ct}>(static_cast<float>(x[i % m]));"
      params = f"const {sct}* __restrict__ x, long long m, {ct}* __restrict__ y, long long n"
      args = f"{src[0]}, {src[0]}.numel, out{k}, out{k}.numel"
    else:
      value = "0.0f" if kind == "zeros" else repr(float(constant)) + "f"
      body = f"y[i] = static_cast<{ct}>({value});"
      params = f"{ct}* __restrict__ y, long long n"
      args = f"out{k}, out{k}.numel"
    kernels.append(f'extern "C" __global__ void fill_out{k}({params}) {{\n'
                   f"  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                   f"  if (i < n) {body}\n}}\n")
    launches.append(f"launch fill_out{k} grid=(cdiv(out{k}.numel, 256),) block=(256,) args=({args})")
  what = {"zeros": "zeros", "constant": f"the constant {constant:g}",
          "identity": f"a copy of input '{src[0]}'" if src else ""}[kind]
  text = ("```cuda\n" + _headers(dtypes) + "\n".join(kernels) + "```\n```plan\n" + "\n".join(launches) + "\n```")
  return SuiteCandidate(task_id=task_id, name=f"degenerate_{kind}", kind="degenerate", expect="incorrect", text=text,
                        summary=f"Writes {what} into every output element.")


def degenerate_candidates(task_id: str, info, constant: float = 1.0) -> list[SuiteCandidate]:
  """The three degenerate candidates of a task (see degenerate_candidate)."""
  return [degenerate_candidate(task_id, info, k, constant) for k in DEGENERATE_KINDS]


# --- degenerate-task statistics (the CPU gate) ----------------------------------------------------------------

GATE_MAX_PASS = 0.99  # A degenerate candidate may match at most this fraction of an output's elements.
GATE_MIN_VARYING = 0.5  # At least this fraction of elements must change (beyond tolerance) between input draws.
GATE_MIN_WEIGHT_SENSITIVE = 0.01  # ... and at least this fraction between two weight draws (tasks with weights).
_CHUNK = 1 << 24


def close_fraction(a, b, atol: float, rtol: float) -> float:
  """Fraction of elements with |a - b| <= atol + rtol * |b| (allclose semantics, b = the reference), chunked."""
  import torch  # pylint: disable=g-import-not-at-top
  # On b's device: a one-element CPU tensor (a constant candidate) is not a CPU scalar once reshaped to 1-D.
  a, b = a.to(b.device).reshape(-1), b.reshape(-1)
  if not b.is_floating_point():
    return float((a == b).sum().item()) / max(1, b.numel())
  hits = 0
  for s in range(0, b.numel(), _CHUNK):
    bb = b[s:s + _CHUNK].double()
    aa = a[s:s + _CHUNK].double() if isinstance(a, torch.Tensor) and a.numel() > 1 else a
    hits += int(((aa - bb).abs() <= atol + rtol * bb.abs()).sum().item())
  return hits / max(1, b.numel())


def wrapped_copy(x, like):
  """What the identity candidate writes: x flattened, repeated to like.numel(), cast like static_cast."""
  flat = x.reshape(-1)
  reps = -(-like.numel() // flat.numel())
  y = (flat.repeat(reps) if reps > 1 else flat)[:like.numel()]
  if like.dtype.is_floating_point:
    return y.to(like.dtype)
  return y.float().to(like.dtype)  # float -> integer truncates toward zero, as static_cast does.


def degeneracy_stats(y, *, atol: float, rtol: float, y_other_inputs=None, y_other_weights=None, x=None,
                     gpu_constant: float = 1.0, sample: int = 1 << 20, fixed_constant: float | None = None) -> dict:
  """How well trivial candidates would match one reference output, and how much it varies.

  Args:
    y: the reference output on one input draw (CPU tensor, real task shape).
    atol, rtol: the evaluator's tolerances (allclose semantics).
    y_other_inputs: the same model's output on another input draw (None: not measured).
    y_other_weights: the output of a model with other weights on the same inputs (None: not measured).
    x: the first input tensor (what the identity candidate copies); None when the task has none.
    gpu_constant: the value the GPU gate's constant candidate writes.
    sample: elements sampled to choose the best constants (median, mean, mode).
    fixed_constant: when given, the constant candidate writes this value only (e.g. the best constant of another
      input draw: one kernel writes one constant on every trial).
  Returns:
    zeros / constant / identity: fraction of elements each trivial candidate matches (constant: the best of
    median, mean, mode and gpu_constant); constant_value: that constant; varying: fraction that changes between
    input draws; weight_sensitive: fraction that changes between weight draws; problems: the gate's complaints
    ([] = not degenerate).
  """
  import torch  # pylint: disable=g-import-not-at-top
  flat = y.reshape(-1)
  gen = torch.Generator().manual_seed(0)
  idx = torch.randint(0, flat.numel(), (min(sample, flat.numel()),), generator=gen).to(y.device)
  s = flat[idx]
  consts = [float(gpu_constant)]
  if fixed_constant is not None:
    consts = [float(fixed_constant)]
  elif y.is_floating_point():
    consts += [float(s.median()), float(s.double().mean())]
  else:
    consts += [float(torch.mode(s).values)]
  zero = torch.zeros((), dtype=y.dtype)
  matches = [close_fraction(torch.tensor(c, dtype=torch.float64).to(y.dtype), y, atol, rtol) for c in consts]
  best = max(range(len(consts)), key=matches.__getitem__)
  st = {"zeros": close_fraction(zero, y, atol, rtol),
        "constant": matches[best], "constant_value": consts[best],
        "identity": close_fraction(wrapped_copy(x, y), y, atol, rtol) if x is not None else None,
        "varying": None, "weight_sensitive": None}
  if y_other_inputs is not None:
    st["varying"] = 1.0 - close_fraction(y_other_inputs, y, atol, rtol)
  if y_other_weights is not None:
    st["weight_sensitive"] = 1.0 - close_fraction(y_other_weights, y, atol, rtol)
  problems = [f"an all-{k} candidate matches {st[k]:.2%} of the elements" for k in ("zeros", "constant", "identity")
              if st[k] is not None and st[k] > GATE_MAX_PASS]
  if st["varying"] is not None and st["varying"] < GATE_MIN_VARYING:
    problems.append(f"only {st['varying']:.2%} of the elements change between input draws (near-constant output)")
  if st["weight_sensitive"] is not None and st["weight_sensitive"] < GATE_MIN_WEIGHT_SENSITIVE:
    problems.append(f"only {st['weight_sensitive']:.2%} of the elements change with the weights")
  st["problems"] = problems
  return st


def gate_module(module, *, atol: float = 1e-4, rtol: float = 1e-4) -> list[dict]:
  """The degenerate gate on one task module at its own sizes (CPU, real numbers): degeneracy_stats per output.

  The reference runs in the reference mode (taskinfo.as_reference, as the evaluator runs it) on one input draw, on a second draw, and (when the
  model has floating parameters) with a second weight draw; the first tensor input is what the identity candidate
  copies. A task's ATOL / RTOL override the given tolerances. Returns one stats dict per output (`problems` lists
  the gate's complaints).
  """
  import torch  # pylint: disable=g-import-not-at-top
  from kevin_jax.kernels.taskinfo import as_reference  # pylint: disable=g-import-not-at-top
  atol = float(getattr(module, "ATOL", atol))
  rtol = float(getattr(module, "RTOL", rtol))
  as_list = lambda out: list(out) if isinstance(out, (tuple, list)) else [out]
  with torch.no_grad():
    torch.manual_seed(1234)
    model = as_reference(module.Model(*module.get_init_inputs()))
    torch.manual_seed(1)
    xs = module.get_inputs()
    ys = as_list(model(*xs))
    torch.manual_seed(2)
    ys_other = as_list(model(*module.get_inputs()))
    ys_w = [None] * len(ys)
    if any(p.is_floating_point() for p in model.parameters()):
      torch.manual_seed(4321)
      ys_w = as_list(as_reference(module.Model(*module.get_init_inputs()))(*xs))
  first = next((x for x in xs if isinstance(x, torch.Tensor)), None)
  return [degeneracy_stats(y, atol=atol, rtol=rtol, y_other_inputs=yo, y_other_weights=yw, x=first)
          for y, yo, yw in zip(ys, ys_other, ys_w)]


def task_info(task: SuiteTask):
  """The task's shapes/dtypes without a GPU (meta device): a kevin_jax.kernels.taskinfo.TaskInfo."""
  from kevin_jax.kernels import taskinfo  # pylint: disable=g-import-not-at-top  # Imports torch.
  return taskinfo.analyze_task(task.spec)


def shapes_of(info) -> dict[str, list[int]]:
  """{name: shape} for the task's inputs, outputs ('out' or 'out<k>') and parameters, as meta.json records them."""
  d: dict[str, Any] = {}
  for n, i in zip(info.input_names, info.inputs):
    if i["kind"] == "tensor":
      d[n] = list(i["shape"])
  outs = info.outputs
  for k, o in enumerate(outs):
    d["out" if len(outs) == 1 else f"out{k}"] = list(o["shape"])
  for n, p in info.params.items():
    d[n] = list(p["shape"])
  return d
