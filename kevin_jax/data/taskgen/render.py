"""Text rendering shared by the families: the KernelBench-format task module and the candidate blocks."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from kevin_jax.data.taskgen import ops as ops_lib
from kevin_jax.data.taskgen.ops import Op


@dataclasses.dataclass
class Module:
  """The parts of a task module; `text()` writes it in the bundled suite's layout."""
  doc: str  # Model's docstring (one line).
  constants: list[tuple[str, object]]  # Module constants NAME = value (sizes first, then op constants).
  init: list[tuple[str, str, str]]  # __init__ parameters: (name, annotation, get_init_inputs expression).
  body: list[str]  # __init__ lines after super().__init__().
  args: list[str]  # forward() arguments.
  forward: list[str]  # forward() lines; the last one returns.
  inputs: list[str]  # get_inputs() expressions.
  notes: list[str] = dataclasses.field(default_factory=list)  # Module-level lines after the constants.
  functional: bool = False  # forward uses torch.nn.functional as F.

  def text(self) -> str:
    head = ["import torch", "import torch.nn as nn"] + (["import torch.nn.functional as F"] if self.functional else [])
    lines = head + [""] + [f"{k} = {v!r}" for k, v in self.constants]
    if self.notes:
      lines += [""] + self.notes
    sig = ", ".join(["self"] + [f"{n}: {a}" for n, a, _ in self.init])
    lines += ["", "", "class Model(nn.Module):", f'    """{self.doc}"""', "", f"    def __init__({sig}):",
              "        super().__init__()"]
    lines += [f"        {b}" for b in self.body]
    fargs = ", ".join(["self"] + [f"{a}: torch.Tensor" for a in self.args])
    lines += ["", f"    def forward({fargs}) -> torch.Tensor:"] + [f"        {f}" for f in self.forward]
    lines += ["", "", "def get_inputs():", f"    return [{', '.join(self.inputs)}]", "", "",
              "def get_init_inputs():", f"    return [{', '.join(e for _, _, e in self.init)}]", ""]
    return "\n".join(lines)


def chain_init(chain: Sequence[Op], c_size: str = "C", l_size: str = "L") -> tuple[list, list, list]:
  """(constants, init params, init body) for a chain's constants and broadcast parameters.

  Broadcast parameters take their size from an init parameter `channels` (C) or `length` (L), given by the
  module constants `c_size` / `l_size`.
  """
  consts, init, body = [], [], []
  kinds = {op.d.kind for op in chain}
  if "channel" in kinds:
    init.append(("channels", "int", c_size))
  if "column" in kinds:
    init.append(("length", "int", l_size))
  for op in chain:
    d = op.d
    if d.param:
      shape = "channels, 1" if d.kind == "channel" else "length"
      body.append(f"self.{d.param} = nn.Parameter({d.init.format(shape=shape)})")
  for name, value in ops_lib.consts_of(chain):
    consts.append((name.upper(), value))
    init.append((name, "float", name.upper()))
    body.append(f"self.{name} = {name}")
  return consts, init, body


def describe_chain(chain: Sequence[Op]) -> str:
  """Words for a chain: 'leaky_relu(0.05), + per-channel bias, tanh'."""
  words = []
  for op in chain:
    d = op.d
    if d.kind == "unary":
      words.append(op.name + (f"({', '.join(f'{v:g}' for v in op.consts)})" if op.consts else ""))
    elif op.name == "mul_scalar":
      words.append(f"* {op.consts[0]:g}")
    elif op.name == "add_scalar":
      words.append(f"+ {op.consts[0]:g}")
    elif d.kind == "residual":
      words.append("+ residual")
    else:
      what = "bias" if op.name.startswith("add") else "gain"
      words.append(f"{'+' if op.name.startswith('add') else '*'} per-{d.kind} {what}")
  return ", ".join(words)


def candidate_text(code: str, plan: str) -> str:
  """The ```cuda and ```plan blocks, exactly as a policy answers (summary not included)."""
  return f"```cuda\n{code.strip()}\n```\n```plan\n{plan.strip()}\n```"


@dataclasses.dataclass(frozen=True)
class Written:
  """A candidate as a family writes it (the world turns it into a kernels.suite.SuiteCandidate)."""
  name: str  # naive | optimized | <style> | wrong_<kind>
  expect: str  # The evaluator status it must get.
  code: str
  plan: str
  summary: str
  bug: str = ""

  @property
  def text(self) -> str:
    return candidate_text(self.code, self.plan)


def plan_args(args: Sequence[str], subst: dict[str, str]) -> str:
  """Joins plan arguments, replacing placeholders ('@C', '@L') from `subst`."""
  return ", ".join(subst.get(a, a) for a in args)
