"""The launch plan: a whitelist parser, a safe expression evaluator, and validation against a task.

Grammar (kernels/FORMAT.md), one statement per line (a statement may continue while parentheses are open;
`#` starts a comment):

    scratch NAME: DTYPE[DIM, ...] [zero]
    launch KERNEL grid=(X[, Y[, Z]]) block=(X[, Y[, Z]]) [smem=BYTES] args=(ARG, ...)

Expressions: integers, `+ - * // %`, parentheses, `cdiv(a, b)`, `min(...)`, `max(...)`, names, `T.shape[i]`,
`T.numel`, `T.ndim`; in `args` also decimal numbers and `/`. Parsing builds a small tuple AST; evaluation walks
it with Python integers (exact) and floats — nothing is ever passed to `eval`.

`bind_plan` resolves every expression against a task's tensors and scalars, checks each launch against the
kernel signatures and device limits, and returns a `BoundPlan` of plain numbers the GPU worker executes.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping, Sequence

from kevin_jax.kernels.candidate import POINTEE_DTYPES, FormatError, KernelSig

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8, "uint8": 1,
               "bool": 1, "int8": 1, "int16": 2}
_INT_RANGE = {"int8": (-2**7, 2**7 - 1), "uint8": (0, 2**8 - 1), "int16": (-2**15, 2**15 - 1),
              "uint16": (0, 2**16 - 1), "int32": (-2**31, 2**31 - 1), "uint32": (0, 2**32 - 1),
              "int64": (-2**63, 2**63 - 1), "uint64": (0, 2**64 - 1)}
_MAX_ABS_INT = 2**63  # Any intermediate integer beyond int64 is an error (sizes never get there).
MAX_EXPR_DEPTH = 64  # Nesting of parentheses / calls, and signs in a row.
MAX_EXPR_NODES = 256  # Expression terms in one statement (bounds the evaluator's recursion).


@dataclasses.dataclass(frozen=True)
class Limits:
  """Launch limits; the defaults are an H200's (the GPU worker passes the real device's)."""
  max_threads: int = 1024
  max_block: tuple[int, int, int] = (1024, 1024, 64)
  max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
  max_smem: int = 232448  # Dynamic shared memory opt-in maximum, bytes (227 KiB on sm_90).
  max_launches: int = 16
  max_scratch: int = 8
  max_scratch_bytes: int = 8 * 2**30  # All scratch buffers together.
  max_statements_lines: int = 200
  max_resident_threads: int = 132 * 2048  # SMs x threads per SM: what per-thread local memory is reserved for.


class PlanError(FormatError):
  """A malformed plan or one that does not fit the task/kernels; message names the plan line."""


@dataclasses.dataclass(frozen=True)
class Scratch:
  name: str
  dtype: str
  dims: tuple
  zero: bool
  line: int


@dataclasses.dataclass(frozen=True)
class Launch:
  kernel: str
  grid: tuple
  block: tuple
  smem: Any  # Expression or None.
  args: tuple
  line: int


@dataclasses.dataclass(frozen=True)
class Plan:
  scratch: tuple[Scratch, ...]
  launches: tuple[Launch, ...]


# --- tokenizer -------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
  (?P<ws>\s+)
 |(?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[fF]?)
 |(?P<name>[A-Za-z_]\w*(?:\.(?:[A-Za-z_]\w*|\d+))*)
 |(?P<op>//|[-+*/%(),\[\]=:])
""", re.X)


def _tokenize(text: str, line: int) -> list[tuple[str, str]]:
  toks, pos = [], 0
  while pos < len(text):
    m = _TOKEN.match(text, pos)
    if not m:
      raise PlanError(f"plan line {line}: unexpected character {text[pos]!r}")
    pos = m.end()
    if m.lastgroup != "ws":
      toks.append((m.lastgroup, m.group(0)))
  return toks


class _Parser:
  """Recursive-descent parser over one statement's tokens."""

  def __init__(self, toks, line):
    self.toks, self.i, self.line, self.depth, self.nodes = toks, 0, line, 0, 0

  def err(self, msg):
    return PlanError(f"plan line {self.line}: {msg}")

  def peek(self, k=0):
    j = self.i + k
    return self.toks[j] if j < len(self.toks) else ("end", "")

  def take(self, value=None, kind=None):
    tok = self.peek()
    if (value is not None and tok[1] != value) or (kind is not None and tok[0] != kind):
      want = repr(value) if value is not None else kind
      got = repr(tok[1]) if tok[0] != "end" else "end of line"
      raise self.err(f"expected {want}, got {got}")
    self.i += 1
    return tok

  def at_end(self):
    return self.i >= len(self.toks)

  def expr(self):
    self.depth += 1
    if self.depth > MAX_EXPR_DEPTH:
      raise self.err("expression too deeply nested")
    node = self.term()
    while self.peek()[1] in ("+", "-"):
      op = self.take()[1]
      node = self.node("bin", op, node, self.term())
    self.depth -= 1
    return node

  def term(self):
    node = self.unary()
    while self.peek()[1] in ("*", "/", "//", "%"):
      op = self.take()[1]
      node = self.node("bin", op, node, self.unary())
    return node

  def unary(self):
    """Leading signs are folded in a loop (no recursion: `- - - ... x` of any length parses in linear time)."""
    negate, signs = False, 0
    while self.peek()[1] in ("-", "+"):
      negate ^= self.take()[1] == "-"
      signs += 1
      if signs > MAX_EXPR_DEPTH:
        raise self.err(f"more than {MAX_EXPR_DEPTH} signs in a row")
    node = self.atom()
    return self.node("neg", node) if negate else node

  def node(self, *parts):
    """Builds an AST node, counting them: a statement's size (and so evaluation depth) is bounded."""
    self.nodes += 1
    if self.nodes > MAX_EXPR_NODES:
      raise self.err(f"statement too complex (more than {MAX_EXPR_NODES} expression terms)")
    return parts

  def atom(self):
    kind, val = self.peek()
    if kind == "num":
      self.i += 1
      return self.node("num", _number(val, self))
    if val == "(":
      self.take("(")
      node = self.expr()
      self.take(")")
      return node
    if kind == "name":
      self.i += 1
      if val in ("cdiv", "min", "max", "ceil_div") and self.peek()[1] == "(":
        self.take("(")
        args = [self.expr()]
        while self.peek()[1] == ",":
          self.take(",")
          args.append(self.expr())
        self.take(")")
        fname = "cdiv" if val == "ceil_div" else val
        if fname == "cdiv" and len(args) != 2:
          raise self.err(f"cdiv takes 2 arguments, got {len(args)}")
        return self.node("call", fname, tuple(args))
      return self.reference(val)
    got = repr(val) if kind != "end" else "end of line"
    raise self.err(f"expected a number, name or '(', got {got}")

  def reference(self, path):
    parts = path.split(".")
    if len(parts) >= 2 and parts[-1] in ("shape", "size"):
      base = ".".join(parts[:-1])
      if parts[-1] == "shape":
        self.take("[")
        idx = self.expr()
        self.take("]")
      else:
        self.take("(")
        idx = self.expr()
        self.take(")")
      return self.node("shape", base, idx)
    if len(parts) >= 2 and parts[-1] in ("numel", "ndim", "dim"):
      if self.peek()[1] == "(" and self.peek(1)[1] == ")":
        self.i += 2
      return self.node("numel" if parts[-1] == "numel" else "ndim", ".".join(parts[:-1]))
    return self.node("name", path)

  def tuple_value(self):
    """`(e, e, ...)` (trailing comma allowed, may be empty) or one bare expression."""
    if self.peek()[1] != "(":
      return (self.expr(),)
    # A parenthesised single expression followed by an operator is an expression, not a tuple.
    save = self.i
    self.take("(")
    items = []
    if self.peek()[1] == ")":
      self.take(")")
      return ()
    while True:
      items.append(self.expr())
      if self.peek()[1] == ",":
        self.take(",")
        if self.peek()[1] == ")":
          break
        continue
      break
    self.take(")")
    if len(items) == 1 and not self.at_end() and self.peek()[0] == "op" and self.peek()[1] not in (",", ")"):
      self.i = save
      return (self.expr(),)
    return tuple(items)


def _number(text: str, parser: _Parser):
  t = text.rstrip("fF") if not text.lower().startswith("0x") else text
  try:
    if t.lower().startswith("0x"):
      return int(t, 16)
    if re.fullmatch(r"\d+", t):
      return int(t)
    return float(t)
  except ValueError as e:
    raise parser.err(f"bad number {text!r}") from e


def _logical_lines(text: str, max_lines: int) -> list[tuple[int, str]]:
  """Comment-free statements with their first line numbers; joins lines while parentheses are open."""
  out, buf, start, depth = [], [], 0, 0
  lines = text.split("\n")
  if len(lines) > max_lines:
    raise PlanError(f"plan too long: {len(lines)} lines (limit {max_lines})")
  for no, raw in enumerate(lines, 1):
    line = raw.split("#", 1)[0].rstrip().rstrip(";")
    if not line.strip() and not buf:
      continue
    if not buf:
      start = no
    buf.append(line)
    depth += line.count("(") + line.count("[") - line.count(")") - line.count("]")
    if depth <= 0:
      out.append((start, " ".join(buf).strip()))
      buf, depth = [], 0
  if buf:
    raise PlanError(f"plan line {start}: unbalanced parentheses")
  return [(n, s) for n, s in out if s]


_KEY_ALIASES = {"grid": "grid", "block": "block", "smem": "smem", "shared_mem": "smem", "shmem": "smem",
                "shared": "smem", "args": "args"}


def parse_plan(text: str, limits: Limits = Limits()) -> Plan:
  """Parses plan text into a `Plan` (syntax only; `bind_plan` checks it against a task).

  Raises:
    PlanError: a syntax error, with the plan line number.
  """
  scratch, launches = [], []
  for line, stmt in _logical_lines(text, limits.max_statements_lines):
    toks = _tokenize(stmt, line)
    p = _Parser(toks, line)
    head = p.take(kind="name")[1]
    if head == "scratch":
      name = p.take(kind="name")[1]
      p.take(":")
      dtype = p.take(kind="name")[1]
      if dtype not in DTYPE_BYTES:
        raise p.err(f"unknown dtype {dtype!r} (use one of {', '.join(DTYPE_BYTES)})")
      p.take("[")
      dims = [p.expr()]
      while p.peek()[1] == ",":
        p.take(",")
        if p.peek()[1] == "]":
          break
        dims.append(p.expr())
      p.take("]")
      zero = False
      if not p.at_end():
        flag = p.take(kind="name")[1]
        if flag not in ("zero", "zeros", "zeroed"):
          raise p.err(f"unexpected {flag!r} after the scratch shape (only 'zero' may follow)")
        zero = True
      if not p.at_end():
        raise p.err(f"unexpected {p.peek()[1]!r} at the end of the statement")
      if "." in name:
        raise p.err(f"scratch name {name!r} may not contain '.'")
      scratch.append(Scratch(name=name, dtype=dtype, dims=tuple(dims), zero=zero, line=line))
    elif head == "launch":
      kernel = p.take(kind="name")[1]
      fields: dict[str, Any] = {}
      while not p.at_end():
        key = p.take(kind="name")[1]
        canon = _KEY_ALIASES.get(key)
        if canon is None:
          raise p.err(f"unknown launch field {key!r} (use grid=, block=, smem=, args=)")
        if canon in fields:
          raise p.err(f"{canon}= given twice")
        p.take("=")
        fields[canon] = p.expr() if canon == "smem" else p.tuple_value()
      for req in ("grid", "block", "args"):
        if req not in fields:
          raise p.err(f"launch {kernel}: missing {req}=")
      for key in ("grid", "block"):
        if not 1 <= len(fields[key]) <= 3:
          raise p.err(f"{key}= needs 1 to 3 dimensions, got {len(fields[key])}")
      launches.append(Launch(kernel=kernel, grid=fields["grid"], block=fields["block"], smem=fields.get("smem"),
                             args=fields["args"], line=line))
    else:
      raise p.err(f"a statement starts with 'launch' or 'scratch', not {head!r}")
  if not launches:
    raise PlanError("the plan has no launch statement")
  if len(launches) > limits.max_launches:
    raise PlanError(f"too many launches: {len(launches)} (limit {limits.max_launches})")
  if len(scratch) > limits.max_scratch:
    raise PlanError(f"too many scratch buffers: {len(scratch)} (limit {limits.max_scratch})")
  return Plan(scratch=tuple(scratch), launches=tuple(launches))


# --- evaluation ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorMeta:
  shape: tuple[int, ...]
  dtype: str
  role: str  # input | output | param | scratch

  @property
  def numel(self) -> int:
    return math.prod(self.shape)

  @property
  def nbytes(self) -> int:
    return self.numel * DTYPE_BYTES[self.dtype]


@dataclasses.dataclass
class PlanEnv:
  """Names a plan may use: tensors (inputs, outputs, params, scratch) and scalars (init args)."""
  tensors: dict[str, TensorMeta]
  scalars: dict[str, Any]
  aliases: dict[str, str] = dataclasses.field(default_factory=dict)  # e.g. in0 -> x, out -> out0.

  def tensor(self, name: str) -> TensorMeta | None:
    return self.tensors.get(self.aliases.get(name, name))

  def canonical(self, name: str) -> str:
    return self.aliases.get(name, name)


def evaluate(node, env: PlanEnv, where: str, allow_float: bool = False):
  """Evaluates an expression AST to a Python int (or float when allowed)."""

  def err(msg):
    return PlanError(f"{where}: {msg}")

  def ev(n):
    kind = n[0]
    if kind == "num":
      v = n[1]
    elif kind == "name":
      name = n[1]
      if env.tensor(name) is not None:
        raise err(f"'{name}' is a tensor; use {name}.numel or {name}.shape[i] in expressions")
      if name not in env.scalars:
        raise err(f"unknown name '{name}'{_known(env)}")
      v = env.scalars[name]
      if isinstance(v, bool):
        v = int(v)
    elif kind in ("shape", "numel", "ndim"):
      t = env.tensor(n[1])
      if t is None:
        raise err(f"unknown tensor '{n[1]}'{_known(env)}")
      if kind == "numel":
        v = t.numel
      elif kind == "ndim":
        v = len(t.shape)
      else:
        i = ev(n[2])
        if not isinstance(i, int):
          raise err(f"{n[1]}.shape index must be an integer")
        if not -len(t.shape) <= i < len(t.shape):
          raise err(f"{n[1]}.shape[{i}] is out of range: {n[1]} has {len(t.shape)} dimensions "
                    f"(shape {list(t.shape)})")
        v = t.shape[i]
    elif kind == "neg":
      v = -ev(n[1])
    elif kind == "bin":
      a, b = ev(n[2]), ev(n[3])
      op = n[1]
      if op in ("//", "%") and (isinstance(a, float) or isinstance(b, float)):
        raise err(f"'{op}' needs integers")
      if op in ("/", "//", "%") and b == 0:
        raise err("division by zero")
      if op == "/" and not allow_float:
        raise err("'/' (true division) is only allowed in args; use // or cdiv(a, b) for integers")
      v = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
           "//": lambda: a // b, "%": lambda: a % b}[op]()
    elif kind == "call":
      vals = [ev(a) for a in n[2]]
      if n[1] == "cdiv":
        a, b = vals
        if not (isinstance(a, int) and isinstance(b, int)):
          raise err("cdiv needs integers")
        if b <= 0:
          raise err(f"cdiv divisor must be positive, got {b}")
        v = -(-a // b)
      else:
        v = (min if n[1] == "min" else max)(vals)
    else:  # pragma: no cover - parser never builds other nodes
      raise err(f"bad expression node {kind}")
    if isinstance(v, float):
      if not allow_float:
        raise err(f"expected an integer, got {v!r}")
      if not math.isfinite(v):
        raise err(f"non-finite value {v!r}")
    elif abs(v) >= _MAX_ABS_INT:
      raise err("integer overflow (value beyond 64 bits)")
    return v

  return ev(node)


def _known(env: PlanEnv) -> str:
  names = sorted(set(env.tensors) | set(env.scalars))
  shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
  return f" (known names: {shown})" if names else ""


# --- binding ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BoundLaunch:
  kernel: str
  grid: tuple[int, int, int]
  block: tuple[int, int, int]
  smem: int
  args: tuple  # ('tensor', canonical name) | ('scalar', kind, value)
  line: int


@dataclasses.dataclass(frozen=True)
class BoundPlan:
  scratch: tuple[tuple[str, str, tuple[int, ...], bool], ...]  # (name, dtype, shape, zero)
  launches: tuple[BoundLaunch, ...]

  def to_dict(self) -> dict:
    return {"scratch": [list(s) for s in self.scratch],
            "launches": [dataclasses.asdict(l) for l in self.launches]}


def bind_plan(plan: Plan, env: PlanEnv, kernels: Mapping[str, KernelSig], limits: Limits = Limits(),
              output_names: Sequence[str] = ()) -> BoundPlan:
  """Resolves and validates a plan against a task's names, the kernel signatures and the device limits.

  Args:
    plan: the parsed plan.
    env: tensors (inputs, outputs, params) and scalars of the task; scratch buffers are added here.
    kernels: the parsed `extern "C" __global__` signatures.
    limits: launch limits.
    output_names: canonical output tensor names; each must be passed to a writable pointer parameter.
  Raises:
    PlanError: with the plan line and a short reason.
  """
  env = PlanEnv(tensors=dict(env.tensors), scalars=dict(env.scalars), aliases=dict(env.aliases))
  scratch, total = [], 0
  for s in plan.scratch:
    where = f"plan line {s.line}"
    if env.tensor(s.name) is not None or s.name in env.scalars or s.name in ("cdiv", "min", "max"):
      raise PlanError(f"{where}: scratch name '{s.name}' is already used by the task")
    dims = tuple(evaluate(d, env, where) for d in s.dims)
    if any(d < 1 for d in dims):
      raise PlanError(f"{where}: scratch {s.name} has a non-positive dimension {list(dims)}")
    meta = TensorMeta(shape=dims, dtype=s.dtype, role="scratch")
    total += meta.nbytes
    if total > limits.max_scratch_bytes:
      raise PlanError(f"{where}: scratch buffers total {total} bytes (limit {limits.max_scratch_bytes})")
    env.tensors[s.name] = meta
    scratch.append((s.name, s.dtype, dims, s.zero))

  written: set[str] = set()
  passed: set[str] = set()
  launches = []
  for n, l in enumerate(plan.launches, 1):
    where = f"plan line {l.line} (launch {n}, {l.kernel})"
    sig = kernels.get(l.kernel)
    if sig is None:
      known = ", ".join(sorted(kernels)) or "none"
      raise PlanError(f"plan line {l.line}: unknown kernel '{l.kernel}' (extern \"C\" __global__ kernels "
                      f"in the source: {known})")
    grid = tuple(evaluate(e, env, where) for e in l.grid) + (1,) * (3 - len(l.grid))
    block = tuple(evaluate(e, env, where) for e in l.block) + (1,) * (3 - len(l.block))
    smem = evaluate(l.smem, env, where) if l.smem is not None else 0
    _check_launch(grid, block, smem, limits, where)
    if len(l.args) != len(sig.params):
      raise PlanError(f"{where}: {len(l.args)} arguments given but kernel {l.kernel} takes "
                      f"{len(sig.params)} ({', '.join(p.ctype + ' ' + p.name for p in sig.params) or 'none'})")
    args = []
    for i, (a, p) in enumerate(zip(l.args, sig.params), 1):
      args.append(_bind_arg(a, p, i, env, where, written, passed))
    launches.append(BoundLaunch(kernel=l.kernel, grid=grid, block=block, smem=smem, args=tuple(args),
                                line=l.line))
  for name in output_names:
    if name not in written:
      shown = "out" if name == "out0" and env.aliases.get("out") == "out0" else name
      if name in passed:
        raise PlanError(f"output '{shown}' is only passed to const pointer parameters, so no kernel writes it")
      raise PlanError(f"output '{shown}' is never passed to a kernel: every output must be written")
  return BoundPlan(scratch=tuple(scratch), launches=tuple(launches))


def _check_launch(grid, block, smem, limits: Limits, where: str) -> None:
  for axis, (g, lim) in enumerate(zip(grid, limits.max_grid)):
    if g < 1:
      raise PlanError(f"{where}: grid dimension {'xyz'[axis]} is {g}; it must be at least 1")
    if g > lim:
      raise PlanError(f"{where}: grid {'xyz'[axis]} = {g} exceeds the device limit {lim}")
  for axis, (b, lim) in enumerate(zip(block, limits.max_block)):
    if b < 1:
      raise PlanError(f"{where}: block dimension {'xyz'[axis]} is {b}; it must be at least 1")
    if b > lim:
      raise PlanError(f"{where}: block {'xyz'[axis]} = {b} exceeds the device limit {lim}")
  threads = block[0] * block[1] * block[2]
  if threads > limits.max_threads:
    raise PlanError(f"{where}: block has {threads} threads (limit {limits.max_threads})")
  if smem < 0:
    raise PlanError(f"{where}: smem is negative ({smem})")
  if smem > limits.max_smem:
    raise PlanError(f"{where}: smem = {smem} bytes exceeds the device limit {limits.max_smem} bytes")


def _bind_arg(node, p, i: int, env: PlanEnv, where: str, written: set, passed: set):
  label = f"{where}: argument {i} (parameter '{p.ctype} {p.name}')"
  tensor_name = node[1] if node[0] == "name" else None
  t = env.tensor(tensor_name) if tensor_name else None
  if p.is_pointer:
    if t is None:
      if tensor_name and tensor_name not in env.scalars:
        raise PlanError(f"{label}: unknown tensor '{tensor_name}'{_known(env)}")
      raise PlanError(f"{label}: a pointer parameter needs a tensor name")
    ok = POINTEE_DTYPES[p.pointee]
    if ok is not None and t.dtype not in ok:
      raise PlanError(f"{label}: '{tensor_name}' is {t.dtype}, which does not match {p.pointee}*")
    canon = env.canonical(tensor_name)
    passed.add(canon)
    if not p.const:
      written.add(canon)
    return ("tensor", canon)
  if t is not None:
    raise PlanError(f"{label}: '{tensor_name}' is a tensor but the parameter is a {p.ctype} value")
  v = evaluate(node, env, label, allow_float=True)
  kind = p.scalar
  if kind in ("float32", "float64"):
    return ("scalar", kind, float(v))
  if isinstance(v, float):
    if kind == "bool" or not v.is_integer():
      raise PlanError(f"{label}: {v!r} is not an integer")
    v = int(v)
  if kind == "bool":
    if v not in (0, 1):
      raise PlanError(f"{label}: {v} is not a bool (0 or 1)")
    return ("scalar", kind, v)
  lo, hi = _INT_RANGE[kind]
  if not lo <= v <= hi:
    raise PlanError(f"{label}: {v} does not fit in {p.ctype}")
  return ("scalar", kind, v)
