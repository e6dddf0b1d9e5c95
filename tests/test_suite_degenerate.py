"""Degenerate-task gate (evaluator-anchors §6.6): no bundled task may be passable by a trivial kernel.

For every task, at its real shapes and with real numbers (torch on the CPU): an all-zeros, a constant (the
output's median, mean, mode, or 1.0) and an identity-of-input candidate must each miss more than 1% of every
output's elements; the output must change beyond tolerance between two input draws for most elements, and
between two weight draws for tasks with weights. The GPU half (the three degenerate candidates FAIL through the
real evaluator) is in experiments/verify_suite.py and tests/test_suite_gpu.py.

The per-task gate runs every task's reference twice or three times at full size (about 7 minutes on 2 cores for
40 tasks): marked slow, so the default `python -m pytest -q` deselects it (pytest.ini); run it with
`python -m pytest -q -m slow tests/test_suite_degenerate.py` whenever a task changes.
"""

import pytest
import torch

from kevin_jax.kernels import suite, tasks

SUITE = suite.load_suite()
ATOL = RTOL = 1e-4  # configs/multiturn.py evaluator.atol / rtol (a task's ATOL/RTOL overrides).


def _stats(y, **kw):
  return suite.degeneracy_stats(y, atol=ATOL, rtol=RTOL, **kw)


def test_gate_flags_constant_outputs():
  """Softmax after a global mean (the KernelBench v0 flaw): every element is 1/N, here within atol of 0."""
  def task(x):
    return torch.softmax(x.mean(dim=1, keepdim=True).expand(64, 20000), dim=1)
  x = torch.randn(64, 20000)
  st = _stats(task(x), y_other_inputs=task(torch.randn(64, 20000)), x=x)
  assert st["constant"] == 1.0 and st["zeros"] == 1.0 and st["varying"] == 0.0
  assert st["identity"] < 0.01
  assert len(st["problems"]) == 3


def test_gate_flags_identity_and_weight_insensitivity():
  x = torch.rand(1000, 100)  # ReLU of non-negative inputs is the identity
  y = torch.relu(x)
  st = _stats(y, x=x, y_other_inputs=torch.relu(torch.rand(1000, 100)), y_other_weights=y.clone())
  assert st["identity"] == 1.0 and st["weight_sensitive"] == 0.0
  assert any("all-identity" in p for p in st["problems"]) and any("weights" in p for p in st["problems"])
  assert st["zeros"] < 0.01 and st["varying"] > 0.99


def test_gate_flags_near_zero_and_near_constant_reductions():
  """A mean over many elements: within tolerance of 0 and of its neighbours (KernelBench #165-style)."""
  x = torch.randn(256, 2**16)
  y = x.mean(dim=1) * 1e-3
  st = _stats(y, x=x, y_other_inputs=torch.randn(256, 2**16).mean(dim=1) * 1e-3)
  assert st["zeros"] == 1.0 and st["varying"] == 0.0


def test_gate_accepts_a_healthy_output_and_integer_outputs():
  x = torch.randn(512, 300)
  y = torch.argmax(x, dim=1)
  st = _stats(y, x=x, y_other_inputs=torch.argmax(torch.randn(512, 300), dim=1))
  assert st["problems"] == [], st
  assert st["zeros"] < 0.05 and st["constant"] < 0.05 and st["identity"] < 0.05 and st["varying"] > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("task_id", [t.id for t in SUITE])
def test_task_is_not_degenerate(task_id):
  task = next(t for t in SUITE if t.id == task_id)
  module = tasks.load_module(task.spec)
  torch.set_num_threads(max(1, torch.get_num_threads()))
  report = []
  for k, st in enumerate(suite.gate_module(module, atol=ATOL, rtol=RTOL)):
    print(f"{task_id} out{k}: " + ", ".join(f"{n}={st[n]:.4f}" for n in
                                             ("zeros", "constant", "identity", "varying", "weight_sensitive")
                                             if st[n] is not None))
    report += [f"out{k}: {p}" for p in st["problems"]]
  assert not report, f"{task_id} is degenerate: {report}"
