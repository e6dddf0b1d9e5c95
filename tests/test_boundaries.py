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


def test_only_the_sampler_imports_decode_kernels():
  """The decode fast path sits behind one seam: outside kevin_jax/policy/decode/, only the sampler (sampler.py
  and its sampling math, sampling.py) imports it; the model never does (dependency: sampler -> decode -> model)."""
  import re  # pylint: disable=g-import-not-at-top
  allowed = {os.path.join("kevin_jax", "policy", name) for name in ("sampler.py", "sampling.py")}
  pattern = re.compile(r"^\s*(from\s+kevin_jax\.policy(\.decode\b|\s+import\s+.*\bdecode\b)|"
                       r"import\s+kevin_jax\.policy\.decode\b)", re.M)
  offenders = []
  for dirpath, _, files in os.walk(os.path.join(ROOT, "kevin_jax")):
    rel_dir = os.path.relpath(dirpath, ROOT)
    if rel_dir.startswith(os.path.join("kevin_jax", "policy", "decode")):
      continue
    for f in files:
      rel = os.path.join(rel_dir, f)
      if f.endswith(".py") and rel not in allowed and pattern.search(open(os.path.join(ROOT, rel)).read()):
        offenders.append(rel)
  assert offenders == []
  assert pattern.search(open(os.path.join(ROOT, "kevin_jax", "policy", "sampler.py")).read())  # the probe works
