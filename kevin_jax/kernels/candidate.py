"""Candidate text -> CUDA source + plan text, and the `extern "C" __global__` kernel signatures.

A candidate (kernels/FORMAT.md) is one ```cuda block and one ```plan block. This module finds them (a small
CommonMark-style fence scanner: longer fences may wrap shorter ones, so an echoed example inside a ```` block is
ignored), enforces size limits, and parses each kernel's parameter list into typed parameters that the plan's
arguments are checked against. Nothing here imports torch or CuPy.
"""

from __future__ import annotations

import dataclasses
import re

MAX_SOURCE_CHARS = 100_000  # CUDA block size limit (characters).
MAX_PLAN_CHARS = 8_000  # Plan block size limit (characters).
MAX_KERNELS = 64  # `extern "C" __global__` functions per source.


class FormatError(ValueError):
  """A candidate that does not follow FORMAT.md; the message is short and shown to the policy."""


@dataclasses.dataclass(frozen=True)
class Param:
  """One kernel parameter. `pointee` is set for pointers ('float', '__half', 'void', ...), `scalar` otherwise."""
  name: str
  ctype: str  # Normalised C type as written, e.g. 'const float*' or 'long long'.
  pointee: str | None = None  # Base type of a pointer parameter ('float4', '__nv_bfloat16', ...).
  const: bool = False  # Pointer to const (the kernel promises not to write through it).
  scalar: str | None = None  # Canonical scalar kind: int32, uint32, int64, uint64, float32, float64, bool, ...

  @property
  def is_pointer(self) -> bool:
    return self.pointee is not None


@dataclasses.dataclass(frozen=True)
class KernelSig:
  name: str
  params: tuple[Param, ...]
  line: int  # 1-based line of the declaration in the CUDA block.


@dataclasses.dataclass(frozen=True)
class Candidate:
  cuda_source: str
  plan_text: str
  kernels: dict[str, KernelSig] = dataclasses.field(default_factory=dict)


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*$")


def _fenced_blocks(text: str) -> list[tuple[str, str, int, bool]]:
  """Top-level fenced blocks as (language, body, first line number, terminated)."""
  lines = text.split("\n")
  blocks, i = [], 0
  while i < len(lines):
    m = _FENCE.match(lines[i])
    if not m:
      i += 1
      continue
    fence, lang, start = m.group(1), m.group(2).lower(), i + 1
    body, j, closed = [], i + 1, False
    while j < len(lines):
      close = re.match(r"^ {0,3}(`{3,}|~{3,})[ \t]*$", lines[j])
      if close and close.group(1)[0] == fence[0] and len(close.group(1)) >= len(fence):
        closed = True
        break
      body.append(lines[j])
      j += 1
    blocks.append((lang, "\n".join(body), start, closed))
    i = j + 1
  return blocks


_LANGS = {"cuda": "cuda", "cu": "cuda", "cuda-c": "cuda", "plan": "plan"}


def parse_candidate(text: str) -> Candidate:
  """Extracts the ```cuda and ```plan blocks and parses the kernel signatures.

  Raises:
    FormatError: a block is missing, duplicated, unterminated or too large, or a kernel signature cannot be read.
  """
  if not isinstance(text, str):
    raise FormatError("the candidate must be text")
  found: dict[str, list[tuple[str, int, bool]]] = {"cuda": [], "plan": []}
  for lang, body, line, closed in _fenced_blocks(text):
    kind = _LANGS.get(lang)
    if kind:
      found[kind].append((body, line, closed))
  for kind in ("cuda", "plan"):
    blocks = found[kind]
    if not blocks:
      raise FormatError(f"missing ```{kind} block")
    if len(blocks) > 1:
      raise FormatError(f"{len(blocks)} ```{kind} blocks found (lines {', '.join(str(b[1]) for b in blocks)}); "
                        f"give exactly one")
    if not blocks[0][2]:
      raise FormatError(f"unterminated ```{kind} block (opened on line {blocks[0][1]}, no closing ```)")
  source, plan = found["cuda"][0][0], found["plan"][0][0]
  if len(source) > MAX_SOURCE_CHARS:
    raise FormatError(f"CUDA source too long: {len(source)} characters (limit {MAX_SOURCE_CHARS})")
  if len(plan) > MAX_PLAN_CHARS:
    raise FormatError(f"plan too long: {len(plan)} characters (limit {MAX_PLAN_CHARS})")
  if not source.strip():
    raise FormatError("the ```cuda block is empty")
  if not plan.strip():
    raise FormatError("the ```plan block is empty")
  return Candidate(cuda_source=source, plan_text=plan, kernels=parse_kernels(source))


# --- kernel signatures -------------------------------------------------------------------------------------


def strip_comments(source: str) -> str:
  """Removes // and /* */ comments and blanks string/char literals, keeping line breaks (line numbers hold)."""
  out, i, n = [], 0, len(source)
  while i < n:
    c = source[i]
    if source.startswith("//", i):
      j = source.find("\n", i)
      i = n if j < 0 else j
    elif source.startswith("/*", i):
      j = source.find("*/", i + 2)
      j = n if j < 0 else j + 2
      out.append("\n" * source.count("\n", i, j) or " ")
      i = j
    elif c in "\"'":
      j = i + 1
      while j < n and source[j] != c and source[j] != "\n":
        j += 2 if source[j] == "\\" else 1
      out.append(c + " " * max(0, min(j, n) - i - 1) + c)
      i = j + 1
    else:
      out.append(c)
      i += 1
  return "".join(out)


# Pointee types accepted for each tensor dtype (FORMAT.md "args").
POINTEE_DTYPES = {
    "float": ("float32",), "float2": ("float32",), "float4": ("float32",),
    "__half": ("float16",), "half": ("float16",), "__half2": ("float16",), "half2": ("float16",),
    "__nv_bfloat16": ("bfloat16",), "nv_bfloat16": ("bfloat16",), "__nv_bfloat162": ("bfloat16",),
    "nv_bfloat162": ("bfloat16",),
    "double": ("float64",), "double2": ("float64",),
    "int": ("int32",), "int32_t": ("int32",), "unsigned int": ("int32",), "unsigned": ("int32",),
    "uint32_t": ("int32",), "int2": ("int32",), "int4": ("int32",),
    "long long": ("int64",), "long long int": ("int64",), "int64_t": ("int64",), "unsigned long long": ("int64",),
    "uint64_t": ("int64",), "long": ("int64",), "long int": ("int64",), "longlong2": ("int64",),
    "bool": ("bool", "uint8"), "unsigned char": ("uint8", "bool"), "uint8_t": ("uint8", "bool"),
    "char": ("uint8", "bool", "int8"), "signed char": ("int8",), "int8_t": ("int8",), "uchar4": ("uint8",),
    "short": ("int16",), "int16_t": ("int16",),
    "void": None,  # any dtype
}

# Scalar parameter types -> canonical kind (the plan's values are converted to these).
SCALAR_KINDS = {
    "int": "int32", "int32_t": "int32", "signed": "int32", "signed int": "int32",
    "unsigned int": "uint32", "unsigned": "uint32", "uint32_t": "uint32",
    "long long": "int64", "long long int": "int64", "int64_t": "int64", "long": "int64", "long int": "int64",
    "ptrdiff_t": "int64", "intptr_t": "int64",
    "unsigned long long": "uint64", "unsigned long long int": "uint64", "uint64_t": "uint64", "size_t": "uint64",
    "unsigned long": "uint64", "uintptr_t": "uint64",
    "short": "int16", "int16_t": "int16", "unsigned short": "uint16", "uint16_t": "uint16",
    "char": "int8", "signed char": "int8", "int8_t": "int8", "unsigned char": "uint8", "uint8_t": "uint8",
    "float": "float32", "double": "float64", "bool": "bool",
}

_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "__grid_constant__"}
_IDENT = re.compile(r"[A-Za-z_]\w*")
_EXTERN_C = re.compile(r'\bextern\s*" "')  # `extern "C"` after strip_comments blanked the literal.
_DECL_WORDS = re.compile(r"\s*(?:void\b|static\b|inline\b|__noinline__|__forceinline__|"
                         r"__launch_bounds__\s*\([^()]*\))\s*")


def _extern_c_blocks(code: str) -> list[tuple[int, int]]:
  """Spans of `extern "C" { ... }` blocks."""
  spans = []
  for m in re.finditer(r'\bextern\s*" "\s*\{', code):
    depth, j = 1, m.end()
    while j < len(code) and depth:
      depth += {"{": 1, "}": -1}.get(code[j], 0)
      j += 1
    spans.append((m.start(), j))
  return spans


def parse_kernels(source: str) -> dict[str, KernelSig]:
  """Parses every `extern "C" __global__ void name(params)` definition into a KernelSig (by name).

  Kernels hidden behind macros are not found; the plan then reports an unknown kernel.

  Raises:
    FormatError: a kernel's parameter list cannot be read or uses an unsupported type.
  """
  code = strip_comments(source)
  typedefs = _typedefs(code)
  blocks = _extern_c_blocks(code)
  kernels: dict[str, KernelSig] = {}
  for m in re.finditer(r"\b__global__\b", code):
    pos = m.end()
    while True:
      w = _DECL_WORDS.match(code, pos)
      if not w or w.end() == pos:
        break
      pos = w.end()
    nm = _IDENT.match(code, pos)
    if not nm:
      continue
    name = nm.group(0)
    paren = nm.end() + len(code[nm.end():]) - len(code[nm.end():].lstrip())
    if paren >= len(code) or code[paren] != "(":
      continue
    stmt = code[_statement_start(code, m.start()):m.start()]
    if not (_EXTERN_C.search(stmt) or any(a <= m.start() < b for a, b in blocks)):
      continue
    close = _matching_paren(code, paren)
    if close < 0:
      raise FormatError(f"kernel {name}: unbalanced parentheses in its parameter list")
    if code[close + 1:].lstrip().startswith(";"):
      continue  # A forward declaration; the definition carries the same signature.
    line = code.count("\n", 0, m.start()) + 1
    params = tuple(_parse_param(p, i, name, typedefs) for i, p in enumerate(_split_params(code[paren + 1:close])))
    if name in kernels and kernels[name].params != params:
      raise FormatError(f"kernel {name} is defined twice with different parameters")
    kernels[name] = KernelSig(name=name, params=params, line=line)
  if len(kernels) > MAX_KERNELS:
    raise FormatError(f"too many kernels: {len(kernels)} (limit {MAX_KERNELS})")
  return kernels


def _statement_start(code: str, pos: int) -> int:
  """Just after the previous ';', '{', '}' or preprocessor line before pos."""
  k = max(code.rfind(";", 0, pos), code.rfind("}", 0, pos), code.rfind("{", 0, pos))
  for d in re.finditer(r"^[ \t]*#.*$", code[:pos], flags=re.M):
    k = max(k, d.end())
  return k + 1


def _matching_paren(code: str, open_pos: int) -> int:
  depth = 0
  for j in range(open_pos, len(code)):
    if code[j] == "(":
      depth += 1
    elif code[j] == ")":
      depth -= 1
      if depth == 0:
        return j
  return -1


def _split_params(text: str) -> list[str]:
  parts, depth, cur = [], 0, []
  for ch in text:
    if ch in "(<[":
      depth += 1
    elif ch in ")>]":
      depth -= 1
    if ch == "," and depth == 0:
      parts.append("".join(cur))
      cur = []
    else:
      cur.append(ch)
  parts.append("".join(cur))
  parts = [p.strip() for p in parts]
  if parts == [""] or parts == ["void"]:
    return []
  return parts


def _typedefs(code: str) -> dict[str, str]:
  """Simple `typedef T name;` and `using name = T;` aliases of builtin types (to resolve `real*`)."""
  out = {}
  for m in re.finditer(r"\btypedef\s+([\w\s]+?)\s+(\w+)\s*;", code):
    out[m.group(2)] = " ".join(m.group(1).split())
  for m in re.finditer(r"\busing\s+(\w+)\s*=\s*([\w\s]+?)\s*;", code):
    out[m.group(1)] = " ".join(m.group(2).split())
  return out


def _parse_param(text: str, index: int, kernel: str, typedefs: dict[str, str]) -> Param:
  where = f"kernel {kernel}, parameter {index + 1} ('{' '.join(text.split())}')"
  if "&" in text:
    raise FormatError(f"{where}: reference parameters are not supported; pass a pointer or a value")
  if "=" in text:
    raise FormatError(f"{where}: default arguments are not supported")
  is_array = bool(re.search(r"\[\s*\]\s*$", text))
  text = re.sub(r"\[\s*\]\s*$", "", text)
  stars = text.count("*") + int(is_array)
  tokens = re.findall(r"[A-Za-z_]\w*|::", text.replace("*", " "))
  tokens = [t for t in tokens if t not in ("::", "std", "cuda")]
  const_ptr = "const" in text.split("*")[0] if stars else False
  words = [t for t in tokens if t not in _QUALIFIERS and not t.startswith("__align")]
  # The last word is the parameter name unless the declaration is unnamed (`float*`).
  name = f"arg{index}"
  type_words = words
  if len(words) >= 2 and " ".join(words) not in SCALAR_KINDS and " ".join(words) not in POINTEE_DTYPES:
    name, type_words = words[-1], words[:-1]
  base = " ".join(type_words)
  for _ in range(4):  # Resolve chained typedefs.
    if base in typedefs:
      resolved = typedefs[base]
      stars += resolved.count("*")
      base = " ".join(w for w in resolved.replace("*", " ").split() if w not in _QUALIFIERS)
  if stars > 1:
    raise FormatError(f"{where}: pointers to pointers are not supported")
  if stars == 1:
    if base not in POINTEE_DTYPES:
      raise FormatError(f"{where}: unsupported pointer type '{base}*' (use float*, __half*, __nv_bfloat16*, "
                        f"double*, int*, long long*, bool*, unsigned char* or void*)")
    ctype = ("const " if const_ptr else "") + base + "*"
    return Param(name=name, ctype=ctype, pointee=base, const=const_ptr)
  if base not in SCALAR_KINDS:
    raise FormatError(f"{where}: unsupported parameter type '{base}' (use int, unsigned int, long long, "
                      f"int64_t, size_t, float, double, bool, or a pointer)")
  return Param(name=name, ctype=base, scalar=SCALAR_KINDS[base])
