"""The two worlds: the learner never imports torch/CuPy, the evaluator never imports JAX."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _imported(modules, probe):
  code = (f"import sys; import {', '.join(modules)}; "
          f"print(sorted(m for m in {probe!r} if m in sys.modules))")
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  return eval(r.stdout.strip())  # pylint: disable=eval-used  (our own probe's list literal)


def test_learner_side_imports_no_torch_or_cupy():
  learner = ["kevin_jax.main", "kevin_jax.train", "kevin_jax.evaluate", "kevin_jax.runtime",
             "kevin_jax.rl.reward", "kevin_jax.policy.sampler", "kevin_jax.policy.weights"]
  assert _imported(learner, ["torch", "cupy", "cupy_backends"]) == []


@pytest.mark.parametrize("module", ["kevin_jax.kernels.evaluator", "kevin_jax.kernels.evaluate"])
def test_evaluator_side_imports_no_jax(module):
  assert _imported([module], ["jax", "jaxlib", "flax"]) == []
