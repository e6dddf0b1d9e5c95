"""Candidate text -> CUDA source + plan text, and the `extern "C" __global__` kernel signatures.

A candidate (kernels/FORMAT.md) is one ```cuda block and one ```plan block. `parse_candidate` normalises the text
(one rule for every entry point: CRLF and CR become LF; NUL and other control characters except tab and newline
are a format error), finds the blocks (a CommonMark-style fence scanner: longer fences may wrap shorter ones, so an
echoed example inside a ```` block is ignored), enforces size limits, applies the preprocessor rules
(preprocess.py), and parses each kernel's parameter list into typed parameters that the plan's arguments are
checked against. Every step is linear in the text (cuda_lex.py; no backtracking regular expressions), so no input
can stall the compile or the GPU worker here. Nothing here imports torch or CuPy.
"""

from __future__ import annotations

import dataclasses
import re

from kevin_jax.kernels import cuda_lex, preprocess

MAX_TEXT_CHARS = 400_000  # Whole answer (prose and both blocks), characters.
MAX_SOURCE_CHARS = 100_000  # CUDA block size limit (characters).
MAX_PLAN_CHARS = 8_000  # Plan block size limit (characters).
MAX_KERNELS = 64  # `extern "C" __global__` functions per source.
MAX_PARAM_TOKENS = 512  # Tokens in one kernel's parameter list.
_MAX_PREFIX_TOKENS = 16  # Tokens between `extern "C"` and `__global__` (e.g. `static`) for a kernel to count.


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

  @property
  def nbytes(self) -> int:
    """Size of the parameter in the kernel's parameter buffer (a pointer is 8 bytes)."""
    return 8 if self.is_pointer else SCALAR_BYTES[self.scalar]


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


# --- text --------------------------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_CONTROL_NAMES = {0x00: "NUL", 0x0B: "vertical tab", 0x0C: "form feed", 0x1B: "ESC", 0x7F: "DEL"}


def normalize_text(text) -> str:
  """The one text normalisation of every entry point: CRLF and CR -> LF; control characters are refused.

  Raises:
    FormatError: not a string, longer than MAX_TEXT_CHARS, or a control character other than tab and newline.
  """
  if not isinstance(text, str):
    raise FormatError("the candidate must be text")
  if len(text) > MAX_TEXT_CHARS:
    raise FormatError(f"the answer is too long: {len(text)} characters (limit {MAX_TEXT_CHARS})")
  text = text.replace("\r\n", "\n").replace("\r", "\n")
  m = _CONTROL.search(text)
  if m:
    code = ord(m.group())
    line = text.count("\n", 0, m.start()) + 1
    col = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
    name = _CONTROL_NAMES.get(code, "a control character")
    raise FormatError(f"the answer contains U+{code:04X} ({name}) at line {line}, column {col}; only printable "
                      f"text, tabs and newlines are allowed")
  return text


def _fence(line: str):
  """(fence char, length, info string) when `line` is a code fence, else None (CommonMark, linear)."""
  body = line.lstrip(" ")
  if len(line) - len(body) > 3 or body[:1] not in ("`", "~"):
    return None
  ch = body[0]
  info = body.lstrip(ch)
  length = len(body) - len(info)
  if length < 3 or (ch == "`" and "`" in info):
    return None
  return ch, length, info.strip(" \t")


def _fenced_blocks(text: str) -> list[tuple[str, str, int, bool]]:
  """Top-level fenced blocks as (language, body, first line number, terminated)."""
  lines = text.split("\n")
  blocks, i = [], 0
  while i < len(lines):
    f = _fence(lines[i])
    if not f:
      i += 1
      continue
    ch, length, info = f
    lang = info.split()[0].lower() if info else ""
    start, j, closed = i + 1, i + 1, False
    while j < len(lines):
      c = _fence(lines[j])
      if c and c[0] == ch and c[1] >= length and not c[2]:
        closed = True
        break
      j += 1
    blocks.append((lang, "\n".join(lines[i + 1:j]), start, closed))
    i = j + 1
  return blocks


_LANGS = {"cuda": "cuda", "cu": "cuda", "cuda-c": "cuda", "plan": "plan"}


def parse_candidate(text: str) -> Candidate:
  """Normalises the text, extracts the ```cuda and ```plan blocks and parses the kernel signatures.

  Raises:
    FormatError: bad text, a block missing, duplicated, unterminated or too large, a directive the format does not
      allow, or a kernel signature that cannot be read.
  """
  text = normalize_text(text)
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

SCALAR_BYTES = {"int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "float32": 4,
                "int64": 8, "uint64": 8, "float64": 8}

_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "__grid_constant__"}
_DECL_WORDS = {"void", "static", "inline", "__noinline__", "__forceinline__"}


def parse_kernels(source: str) -> dict[str, KernelSig]:
  """Parses every `extern "C" __global__ void name(params)` definition into a KernelSig (by name).

  Kernels hidden behind macros are not found (the plan then reports an unknown kernel), and a macro the source
  defines may not appear in a kernel's declaration (it could change the signature the compiler sees; the compiled
  kernel's real parameter list is checked against the cubin as well, static.py).

  Raises:
    FormatError: a directive the format does not allow (preprocess.py), a kernel's parameter list that cannot be
      read or uses an unsupported type, a macro in a kernel declaration, too many kernels.
  """
  lexed = cuda_lex.lex(source)
  try:
    macros = preprocess.check(lexed)
  except preprocess.PreprocessorError as e:
    raise FormatError(str(e)) from e
  toks = lexed.tokens
  match = cuda_lex.matching_parens(toks)
  typedefs = _typedefs(toks)
  extern_c, in_block = _extern_c(toks)
  kernels: dict[str, KernelSig] = {}
  for i, t in enumerate(toks):
    if t.text != "__global__" or t.kind != "ident":
      continue
    decl_start = extern_c[i] if extern_c[i] >= t.stmt and i - extern_c[i] <= _MAX_PREFIX_TOKENS else -1
    if decl_start < 0 and not in_block[i]:
      continue
    j = i + 1
    skipped = []  # (start, end) token ranges that are not part of the signature (__launch_bounds__ arguments).
    while j < len(toks) and (toks[j].text in _DECL_WORDS or toks[j].text == "__launch_bounds__"):
      if toks[j].text == "__launch_bounds__" and j + 1 < len(toks) and toks[j + 1].text == "(":
        close = match[j + 1]
        if close < 0:
          raise FormatError(f"line {toks[j].line}: unbalanced parentheses after __launch_bounds__")
        skipped.append((j + 1, close + 1))
        j = close + 1
      else:
        j += 1
    if j + 1 >= len(toks) or toks[j].kind != "ident" or toks[j + 1].text != "(":
      continue
    name, paren = toks[j].text, j + 1
    close = match[paren]
    if close < 0:
      raise FormatError(f"kernel {name}: unbalanced parentheses in its parameter list")
    if close - paren > MAX_PARAM_TOKENS:
      raise FormatError(f"kernel {name}: parameter list too long (more than {MAX_PARAM_TOKENS} tokens)")
    if close + 1 < len(toks) and toks[close + 1].text == ";":
      continue  # A forward declaration; the definition carries the same signature.
    _refuse_macros(toks, decl_start if decl_start >= 0 else i, close, skipped, macros, name)
    params = tuple(_parse_param(p, k, name, typedefs) for k, p in enumerate(_split_params(toks[paren + 1:close])))
    if name in kernels and kernels[name].params != params:
      raise FormatError(f"kernel {name} is defined twice with different parameters")
    kernels[name] = KernelSig(name=name, params=params, line=t.line)
    if len(kernels) > MAX_KERNELS:
      raise FormatError(f"too many kernels: more than {MAX_KERNELS}")
  return kernels


def _extern_c(toks) -> tuple[list[int], list[bool]]:
  """Per token: the index of the latest `extern "C"` (-1 if none), and whether it is inside `extern "C" { }`."""
  last, latest, inside = -1, [], []
  stack: list[bool] = []  # One entry per open brace: True for an `extern "C" {`.
  open_c = 0
  for i, t in enumerate(toks):
    if t.text == "extern" and i + 1 < len(toks) and toks[i + 1].text == '"C"':
      last = i
    if t.text == "{":
      is_c = i >= 2 and toks[i - 1].text == '"C"' and toks[i - 2].text == "extern"
      stack.append(is_c)
      open_c += is_c
    elif t.text == "}" and stack:
      open_c -= stack.pop()
    latest.append(last)
    inside.append(open_c > 0)
  return latest, inside


def _refuse_macros(toks, start: int, close: int, skipped, macros: set, kernel: str) -> None:
  if not macros:
    return
  k = start
  while k <= close:
    span = next((s for s in skipped if s[0] == k), None)
    if span:
      k = span[1]
      continue
    if toks[k].kind == "ident" and toks[k].text in macros:
      raise FormatError(f"line {toks[k].line}: kernel {kernel}'s declaration uses the macro '{toks[k].text}'; write "
                        f"extern \"C\" kernel signatures without macros")
    k += 1


def _split_params(toks) -> list[list]:
  parts, depth, cur = [], 0, []
  for t in toks:
    if t.text in ("(", "<", "["):
      depth += 1
    elif t.text in (")", ">", "]"):
      depth -= 1
    if t.text == "," and depth == 0:
      parts.append(cur)
      cur = []
    else:
      cur.append(t)
  parts.append(cur)
  if len(parts) == 1 and (not parts[0] or [t.text for t in parts[0]] == ["void"]):
    return []
  return parts


def _typedefs(toks) -> dict[str, str]:
  """Simple `typedef T name;` and `using name = T;` aliases of builtin types (to resolve `real*`)."""
  out = {}
  for i, t in enumerate(toks):
    if t.text not in ("typedef", "using"):
      continue
    body = []
    for u in toks[i + 1:i + 18]:
      if u.text == ";":
        break
      body.append(u)
    else:
      continue
    words = [u.text for u in body if u.text not in ("::", ":")]
    if t.text == "typedef" and len(words) >= 2 and all(w == "*" or re.fullmatch(r"\w+", w) for w in words):
      out[words[-1]] = " ".join(words[:-1]).replace(" *", "*")
    elif t.text == "using" and len(words) >= 3 and words[1] == "=" and re.fullmatch(r"\w+", words[0]):
      if all(w == "*" or re.fullmatch(r"\w+", w) for w in words[2:]):
        out[words[0]] = " ".join(words[2:]).replace(" *", "*")
  return out


def _parse_param(toks, index: int, kernel: str, typedefs: dict[str, str]) -> Param:
  texts = [t.text for t in toks]
  where = f"kernel {kernel}, parameter {index + 1} ('{' '.join(texts)}')"
  if "&" in texts:
    raise FormatError(f"{where}: reference parameters are not supported; pass a pointer or a value")
  if "=" in texts:
    raise FormatError(f"{where}: default arguments are not supported")
  is_array = texts[-2:] == ["[", "]"]
  if is_array:
    texts = texts[:-2]
  stars = texts.count("*") + int(is_array)
  const_ptr = "const" in texts[:texts.index("*")] if "*" in texts else ("const" in texts if is_array else False)
  idents = [w for w in texts if re.fullmatch(r"[A-Za-z_]\w*", w) and w not in ("std", "cuda")]
  words = [w for w in idents if w not in _QUALIFIERS and not w.startswith("__align")]
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
