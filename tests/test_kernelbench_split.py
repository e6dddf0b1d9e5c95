"""configs/kernelbench.py (the paper's 90+90 / 10+10 KernelBench split) and kevin_jax.kernels.check_tasks."""

import hashlib
import os

import pytest

from configs import kernelbench, multiturn
from kevin_jax.kernels import check_tasks, tasks

GOOD = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.randn(4, 7)]


def get_init_inputs():
    return [2.0]
"""

BROKEN = {
    "2_SyntaxError.py": "import torch\ndef get_inputs(:\n",
    "3_NoGetInputs.py": GOOD.replace("def get_inputs():", "def make_inputs():"),
    "4_InitFails.py": GOOD.replace("self.scale = scale", "self.scale = scale\n        raise ValueError('bad init')"),
    "5_ForwardFails.py": GOOD.replace("return torch.relu(x) * self.scale", "return x @ x"),
    "6_ReturnsFloat.py": GOOD.replace("return torch.relu(x) * self.scale", "return 1.0"),
    # Boolean masking has no meta kernel (data-dependent shape): checked by a small CPU run instead.
    "7_NeedsCpu.py": GOOD.replace("return torch.relu(x) * self.scale", "return x[x > 0] * self.scale"),
}


def _write(root, level, name, text):
  d = os.path.join(root, f"level{level}")
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, name), "w", encoding="utf-8") as f:
    f.write(text)


def test_split_sizes_and_disjointness():
  assert len(kernelbench.LEVEL1) == len(kernelbench.LEVEL2) == 100
  for names in (kernelbench.LEVEL1, kernelbench.LEVEL2):
    assert sorted(int(n.split("_")[0]) for n in names) == list(range(1, 101))
  train, test = set(kernelbench.TRAIN_IDS), set(kernelbench.TEST_IDS)
  assert len(train) == 180 and len(test) == 20 and not train & test
  for level in (1, 2):
    assert sum(i.startswith(f"level{level}/") for i in train) == 90
    assert sum(i.startswith(f"level{level}/") for i in test) == 10


def test_heldout_rule_is_the_documented_sha256_ranking():
  ids = kernelbench.level_ids(1)
  ranked = sorted(ids, key=lambda i: hashlib.sha256(("kevin_jax-heldout:" + i).encode()).hexdigest())
  assert set(kernelbench.heldout(ids)) == set(ranked[:10])
  # Golden values: changing the names or the rule changes the held-out set (and every result on it).
  assert kernelbench.TEST_IDS[0] == "level1/23_Softmax"
  assert kernelbench.TEST_IDS[10] == "level2/34_ConvTranspose3d_LayerNorm_GELU_Scaling"


def test_configs_carry_the_split():
  kb = kernelbench.get_config()
  assert tuple(kb.tasks.train_ids) == kernelbench.TRAIN_IDS and tuple(kb.tasks.test_ids) == kernelbench.TEST_IDS
  assert tuple(kb.tasks.levels) == (1, 2)
  paper = multiturn.get_config("paper")
  assert tuple(paper.tasks.train_ids) == kernelbench.TRAIN_IDS
  assert tuple(paper.tasks.test_ids) == kernelbench.TEST_IDS
  v0 = kernelbench.get_config("v0")
  assert "level1/97_CosineSimilarityLoss" in set(v0.tasks.train_ids) | set(v0.tasks.test_ids)
  assert multiturn.get_config().tasks.train_ids == ()  # The bundled default keeps the automatic split.


def test_split_on_a_kernelbench_checkout(tmp_path, capsys):
  root = str(tmp_path / "KernelBench")
  for level, names in ((1, kernelbench.LEVEL1), (2, kernelbench.LEVEL2)):
    for n in names:
      _write(root, level, n + ".py", GOOD)
  _write(root, 2, "23_Conv3d_GroupNorm_Mean_OLD.py", GOOD)  # Extra files are loaded but never selected.
  _write(root, 3, "1_Net.py", GOOD)
  specs = tasks.discover(root, levels=(1, 2))
  c = kernelbench.get_config()
  train, test = tasks.split(specs, train_ids=c.tasks.train_ids, test_ids=c.tasks.test_ids)
  assert len(train) == 180 and len(test) == 20
  cfg = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "kernelbench.py")
  assert check_tasks.main(["--source", root, "--levels", "1,2", "-q", "--config", cfg]) == 0
  out = capsys.readouterr().out
  assert "201 tasks" in out and "201 load, 0 fail" in out
  assert "train {'level1': 90, 'level2': 90}, test {'level1': 10, 'level2': 10}" in out
  assert check_tasks.main(["--source", root, "--levels", "1,2", "-q", "--config", cfg + ":v0"]) == 1
  assert "level1/97_CosineSimilarityLoss" in capsys.readouterr().out


def test_check_tasks_reports_each_failure_stage(tmp_path, capsys):
  root = str(tmp_path / "kb")
  _write(root, 1, "1_Good.py", GOOD)
  for name, text in BROKEN.items():
    _write(root, 1, name, text)
  _write(root, 2, "1_Good.py", GOOD)
  json_path = str(tmp_path / "checks.json")
  assert check_tasks.main(["--source", root, "--json", json_path]) == 1
  out = capsys.readouterr().out
  assert "FAIL  level1/2_SyntaxError: import: SyntaxError" in out
  assert "FAIL  level1/3_NoGetInputs: import: ImportError: task level1/3_NoGetInputs lacks get_inputs" in out
  assert "FAIL  level1/4_InitFails: init: ValueError: bad init (line 9)" in out
  assert "FAIL  level1/5_ForwardFails: forward: RuntimeError" in out
  assert "FAIL  level1/6_ReturnsFloat: outputs: TypeError: forward returned float" in out
  assert "ok    level1/7_NeedsCpu: float32[4, 7] -> float32" in out and "[cpu]" in out
  assert "ok    level1/1_Good: float32[4, 7] -> float32[4, 7]" in out
  assert "8 tasks in" in out and "3 load, 5 fail (2 at import, 1 at init, 1 at forward, 1 at outputs)" in out
  assert check_tasks.main(["--source", root, "--levels", "2"]) == 0
  assert check_tasks.main(["--source", str(tmp_path / "nope")]) == 1


def test_check_tasks_on_one_file_and_on_the_bundled_suite(tmp_path, capsys):
  path = tmp_path / "mytask.py"
  path.write_text(GOOD)
  assert check_tasks.main(["--source", str(path)]) == 0
  assert "ok    mytask: float32[4, 7] -> float32[4, 7]" in capsys.readouterr().out
  assert check_tasks.main(["--source", "bundled", "-q"]) == 0
  out = capsys.readouterr().out
  n = len(tasks.discover("bundled"))
  assert f"{n} tasks in bundled: {n} load, 0 fail" in out


@pytest.mark.parametrize("bad", ["level1/97_CosineSimilarityLoss"])
def test_unknown_ids_are_an_error(tmp_path, bad):
  root = str(tmp_path / "KernelBench")
  for n in kernelbench.LEVEL1[:3]:
    _write(root, 1, n + ".py", GOOD)
  with pytest.raises(ValueError, match="unknown task ids"):
    tasks.split(tasks.discover(root), test_ids=[bad])
