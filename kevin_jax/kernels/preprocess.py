"""The preprocessor rules of the candidate format: which headers a candidate may include, which macros it may define.

NVRTC opens whatever `#include` names: an absolute path, a path relative to the working directory or to an include
directory. So a candidate may only name headers of a fixed, public set (kernels/FORMAT.md): the std shims in
kernels/include, a list of CUDA runtime headers, and the `cuda/` (libcu++), `cub/`, `cooperative_groups/` and `nv/`
trees, each as a plain relative path (no `..`, no spaces). Computed includes (`#include MACRO`), `#include_next`,
`#import` and `#embed` are refused, and so is `__has_include` of anything outside the set. Macros may not use names
reserved for the implementation (`__x`, `_X`): the headers read such names, and a candidate that predefined one could
steer them. The kernel signature rules that concern macros are in candidate.py.
"""

from __future__ import annotations

import re

from kevin_jax.kernels.cuda_lex import Directive, Lexed, Token

STD_SHIMS = frozenset({"algorithm", "assert.h", "cassert", "cfloat", "climits", "cmath", "cstddef", "cstdint",
                       "float.h", "limits", "limits.h", "math.h", "stddef.h", "stdint.h", "type_traits", "utility"})
CUDA_HEADERS = frozenset({
    "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cuda_fp6.h", "cuda_fp4.h", "cuda_runtime.h", "cuda_runtime_api.h",
    "cuda_pipeline.h", "cuda_pipeline_primitives.h", "cuda_awbarrier.h", "cuda_awbarrier_primitives.h",
    "cooperative_groups.h", "mma.h", "math_constants.h", "vector_types.h", "vector_functions.h",
    "device_launch_parameters.h"})
HEADER_TREES = ("cuda/", "cub/", "cooperative_groups/", "nv/")
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_RESERVED = re.compile(r"__|_[A-Z]")
_REFUSED = {"include_next": "#include_next", "import": "#import", "embed": "#embed"}


class PreprocessorError(ValueError):
  """A directive the format does not allow; the message names the line."""


def header_allowed(name: str) -> bool:
  """True for a header of the fixed set, written as a plain relative path."""
  if name in STD_SHIMS or name in CUDA_HEADERS:
    return True
  if not name.startswith(HEADER_TREES):
    return False
  return all(_SEGMENT.fullmatch(s) and s not in (".", "..") for s in name.split("/"))


def _allowed_list() -> str:
  return ("cuda_fp16.h, cuda_bf16.h, cooperative_groups.h, cuda/std/..., cub/..., <cstdint>, <cmath>, <algorithm>, "
          "... (kernels/FORMAT.md)")


def header_name(tokens: tuple[Token, ...], text: str, line: int, what: str) -> str:
  """The header a `<...>` or `"..."` token sequence names; refuses computed names, spaces and comments."""
  if len(tokens) == 1 and tokens[0].kind == "string" and tokens[0].text.startswith('"'):
    body = tokens[0].text[1:-1] if tokens[0].text.endswith('"') and len(tokens[0].text) > 1 else None
    if body is None or "\\" in body:
      raise PreprocessorError(f"line {line}: {what}: unreadable header name")
    return body
  if len(tokens) >= 2 and tokens[0].text == "<" and tokens[-1].text == ">":
    first, last = tokens[0], tokens[-1]
    raw = text[first.pos + 1:last.pos]
    joined = "".join(t.text for t in tokens[1:-1])
    if raw != joined:
      raise PreprocessorError(f"line {line}: {what}: no spaces or comments inside a header name")
    return joined
  raise PreprocessorError(f"line {line}: {what} must name a header as <name> or \"name\" (no macros)")


def check(lexed: Lexed) -> set[str]:
  """Checks every directive and `__has_include`; returns the names of the macros the source defines.

  Raises:
    PreprocessorError: a header outside the fixed set, a computed include, a refused directive or a reserved
      macro name.
  """
  macros: set[str] = set()
  for d in lexed.directives:
    if d.name in _REFUSED:
      raise PreprocessorError(f"line {d.line}: {_REFUSED[d.name]} is not available; use #include with one of "
                              f"{_allowed_list()}")
    if d.name == "include":
      name = header_name(d.tokens, lexed.text, d.line, "#include")
      if not header_allowed(name):
        raise PreprocessorError(f"line {d.line}: #include of '{name}' is not available; the headers are "
                                f"{_allowed_list()}")
    elif d.name in ("define", "undef") and d.tokens and d.tokens[0].kind == "ident":
      macro = d.tokens[0].text
      if _RESERVED.match(macro):
        raise PreprocessorError(f"line {d.line}: #{d.name} {macro}: names that start with '__' or '_' and a "
                                f"capital letter are reserved for the compiler's headers")
      if d.name == "define":
        macros.add(macro)
    _check_has_include(d, lexed.text)
  return macros


def _check_has_include(d: Directive, text: str) -> None:
  toks = d.tokens
  for i, t in enumerate(toks):
    if t.text not in ("__has_include", "__has_include_next"):
      continue
    if t.text == "__has_include_next" or i + 1 >= len(toks) or toks[i + 1].text != "(":
      raise PreprocessorError(f"line {d.line}: {t.text} needs a header name in parentheses")
    close = next((j for j in range(i + 2, len(toks)) if toks[j].text == ")" and toks[j - 1].text != "<"), -1)
    if close < 0:
      raise PreprocessorError(f"line {d.line}: {t.text}( without a closing parenthesis")
    name = header_name(toks[i + 2:close], text, d.line, t.text)
    if not header_allowed(name):
      raise PreprocessorError(f"line {d.line}: {t.text}(<{name}>) names a header outside the available set")
