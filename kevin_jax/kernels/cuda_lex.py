"""A linear-time lexer for candidate CUDA C++: the tokens and the preprocessor directives the evaluator checks.

It follows the C++ translation phases that decide what a directive is, so a line the lexer reads as a directive
is one for NVRTC and the other way round: line splices (backslash-newline) are removed first; comments become
whitespace (a block comment that spans lines keeps a directive going); string, character and raw string literals
(`R"d(...)d"`) and pp-numbers (with `'` digit separators) are single tokens; `#` or its digraph `%:` starts a
directive when it is the first token of a logical line. One pass with one deterministic regular expression.
"""

from __future__ import annotations

import bisect
import dataclasses
import re

_RAW_PREFIXES = frozenset({"R", "u8R", "uR", "UR", "LR"})
_MAX_RAW_DELIMITER = 16  # [lex.string]: a raw string delimiter has at most 16 characters.
_TOKEN = re.compile(r"""
  (?P<ws>[ \t\f\v\r]+)
 |(?P<nl>\n)
 |(?P<lc>//[^\n]*)
 |(?P<bc>/\*.*?\*/|/\*.*)
 |(?P<number>\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*)
 |(?P<ident>[A-Za-z_][0-9A-Za-z_]*)
 |(?P<string>"(?:[^"\\\n]|\\.)*"?)
 |(?P<char>'(?:[^'\\\n]|\\.)*'?)
 |(?P<hash>\#|%:)
 |(?P<punct>.)
""", re.X | re.S)


@dataclasses.dataclass(frozen=True)
class Token:
  kind: str  # ident | number | string | char | punct
  text: str
  pos: int  # Offset in the spliced text.
  line: int  # 1-based line in the text as written.
  stmt: int = 0  # Index (in Lexed.tokens) of this token's statement start: just after `;`, `{`, `}` or a directive.


@dataclasses.dataclass(frozen=True)
class Directive:
  name: str  # 'include', 'define', ... ('' for a null directive or one that does not start with a name).
  tokens: tuple[Token, ...]  # The tokens after the name, to the end of the logical line.
  line: int


@dataclasses.dataclass(frozen=True)
class Lexed:
  text: str  # The source with line splices removed (token positions index it).
  tokens: tuple[Token, ...]  # Every token outside directives, in order.
  directives: tuple[Directive, ...]


def _splice(source: str) -> tuple[str, list[int]]:
  """Removes backslash-newlines; returns the text and the (spliced) offsets where each splice was."""
  parts, where, start, total = [], [], 0, 0
  while True:
    j = source.find("\\\n", start)
    if j < 0:
      parts.append(source[start:])
      return "".join(parts), where
    parts.append(source[start:j])
    total += j - start
    where.append(total)
    start = j + 2


def _raw_string_end(text: str, quote: int) -> int | None:
  """End offset of a raw string whose `"` is at `quote`, or None when no valid delimiter follows."""
  paren = text.find("(", quote + 1, quote + 2 + _MAX_RAW_DELIMITER)
  if paren < 0:
    return None
  delim = text[quote + 1:paren]
  if any(c in delim for c in ' ()\\\t\v\f\n"'):
    return None
  end = text.find(")" + delim + '"', paren + 1)
  return len(text) if end < 0 else end + len(delim) + 2


def lex(source: str) -> Lexed:
  """Tokens and directives of CUDA C++ source (see the module docstring)."""
  text, splices = _splice(source)
  tokens: list[Token] = []
  directives: list[Directive] = []
  newlines = 0  # Newlines of the spliced text before the current position.
  line_start = True
  directive: list | None = None  # [name token or None, tokens, line] while inside a directive.
  stmt = 0
  pos, n = 0, len(text)
  while pos < n:
    m = _TOKEN.match(text, pos)
    kind, end = m.lastgroup, m.end()
    line = 1 + newlines + bisect.bisect_right(splices, pos)
    if kind == "ident" and m.group() in _RAW_PREFIXES and end < n and text[end] == '"':
      raw_end = _raw_string_end(text, end)
      if raw_end is not None:
        kind, end = "string", raw_end
    if kind == "nl":
      newlines += 1
      line_start = True
      if directive is not None:
        directives.append(Directive(directive[0], tuple(directive[1]), directive[2]))
        directive = None
        stmt = len(tokens)
    elif kind in ("bc", "string"):
      newlines += text.count("\n", pos, end)
    if kind in ("ws", "nl", "lc", "bc"):
      pos = end
      continue
    if kind == "hash" and line_start and directive is None:
      directive = [None, [], line]
      line_start = False
      pos = end
      continue
    line_start = False
    tok = Token(kind="punct" if kind == "hash" else kind, text=text[pos:end], pos=pos, line=line, stmt=stmt)
    if directive is not None:
      if directive[0] is None and not directive[1] and kind == "ident":
        directive[0] = tok.text
      else:
        directive[1].append(tok)
    else:
      tokens.append(tok)
      if tok.text in (";", "{", "}"):
        stmt = len(tokens)
    pos = end
  if directive is not None:
    directives.append(Directive(directive[0] or "", tuple(directive[1]), directive[2]))
  named = [Directive(d.name or "", d.tokens, d.line) for d in directives]
  return Lexed(text=text, tokens=tuple(tokens), directives=tuple(named))


def matching_parens(tokens) -> list[int]:
  """For each token index, the index of the matching `(` / `)` (-1 where none or not a parenthesis)."""
  match, stack = [-1] * len(tokens), []
  for i, t in enumerate(tokens):
    if t.text == "(":
      stack.append(i)
    elif t.text == ")" and stack:
      j = stack.pop()
      match[i], match[j] = j, i
  return match
