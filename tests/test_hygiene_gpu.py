"""GPU checks of task hygiene and the per-task memory budget (`python -m pytest -q -m gpu tests/test_hygiene_gpu.py`).

The memory budget through the real GPU worker: vec_add (256 MiB per evaluation, kernels/footprint.py) is skipped as a
task-level result under a budget it cannot meet and evaluated normally under the default one; the hygiene checks on
the GPU give the same verdicts as on the CPU. Budget: about 1 minute on one H100.
"""

import os

import pytest

from kevin_jax.kernels import hygiene, tasks
from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig

pytestmark = pytest.mark.gpu

DATA = os.path.join(os.path.dirname(__file__), "data", "eval")


def test_task_over_the_memory_budget_is_skipped_then_evaluated_under_the_default(tmp_path):
  with open(os.path.join(DATA, "candidates", "vec_add.md"), encoding="utf-8") as f:
    text = f.read()
  for fraction, expect in ((1e-6, "runtime_error"), (0.8, "correct")):
    cfg = EvaluatorConfig(compile_workers=2, task_memory_fraction=fraction, timing_runs=5,
                          cache_dir=str(tmp_path / f"ev{fraction}"))
    with Evaluator(cfg, task_source=os.path.join(DATA, "tasks")) as ev:
      (r,) = ev.evaluate([("vec_add", text)])
    print(fraction, r.status, r.flags, r.error[:160])
    assert r.status == expect, r.error
    if expect == "runtime_error":
      assert r.flags == ["task_too_large", "evaluator_error"] and r.score == 0.0
      assert r.details["evaluation_bytes"] == 256 * 2**20 and r.details["free_bytes"] > 0


def test_hygiene_on_the_gpu(tmp_path):
  body = {"zeros": "self.fc(x) * 0", "linear": "self.fc(x)", "random": "self.fc(x) + torch.rand_like(x)"}
  for name, expr in body.items():
    (tmp_path / f"{name}.py").write_text(
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.fc = nn.Linear(256, 256)\n\n    def forward(self, x):\n"
        f"        return {expr}\n\nbatch_size = 4096\n\ndef get_inputs():\n    return [torch.rand(batch_size, 256)]\n\n"
        "def get_init_inputs():\n    return []\n")
  recs = {r.task_id: r for r in hygiene.hygiene_report(tasks.discover(str(tmp_path)), "cuda")}
  assert recs["zeros"].verdict == "excluded" and recs["zeros"].device == "cuda"
  assert recs["random"].verdict == "excluded" and "non-deterministic" in recs["random"].reasons[0]
  assert recs["linear"].verdict == "ok" and recs["linear"].reduced == ""
