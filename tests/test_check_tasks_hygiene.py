"""check_tasks: the CPU fallback when the meta device fails at init (as taskinfo.analyze_task), and --hygiene."""

import os

from kevin_jax.kernels import check_tasks

ITEM_AT_INIT = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        # A data-dependent value at init (Swin's relative position tables do this): no meta implementation.
        self.k = int(torch.arange(n).sum().item()) % 7 + 1
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return self.fc(x) * self.k

def get_inputs():
    return [torch.randn(8, 16)]

def get_init_inputs():
    return [16]
"""


def _write(root, name, text):
  d = os.path.join(root, "level3")
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, name), "w", encoding="utf-8") as f:
    f.write(text)


def test_init_without_a_meta_kernel_is_checked_on_the_cpu(tmp_path, capsys):
  root = str(tmp_path / "kb")
  _write(root, "1_ItemAtInit.py", ITEM_AT_INIT)
  _write(root, "2_BrokenInit.py", ITEM_AT_INIT.replace("self.fc = nn.Linear(n, n)", "raise ValueError('bad init')"))
  assert check_tasks.main(["--source", root]) == 1
  out = capsys.readouterr().out
  assert "ok    level3/1_ItemAtInit: float32[8, 16] -> float32[8, 16]  [cpu]" in out
  assert "FAIL  level3/2_BrokenInit: init: ValueError: bad init" in out
  big = ITEM_AT_INIT.replace("torch.randn(8, 16)", "torch.randn(1 << 20, 16)")
  _write(root, "3_Big.py", big)
  check_tasks.main(["--source", root, "--cpu-limit-mb", "1"])
  line = next(x for x in capsys.readouterr().out.splitlines() if "3_Big" in x)
  assert line.startswith("ok    level3/3_Big: float32[1048576, 16] -> ")
  assert "[unchecked: init has no meta implementation (RuntimeError" in line and "inputs too large" in line


def test_hygiene_option_prints_a_verdict_per_task(tmp_path, capsys):
  root = str(tmp_path / "kb")
  _write(root, "1_ItemAtInit.py", ITEM_AT_INIT)
  _write(root, "2_Zeros.py", ITEM_AT_INIT.replace("return self.fc(x) * self.k", "return self.fc(x) * 0"))
  assert check_tasks.main(["--source", root, "--hygiene"]) == 0
  out = capsys.readouterr().out
  assert "hygiene ok        level3/1_ItemAtInit" in out
  assert "hygiene excluded  level3/2_Zeros" in out and "all zeros" in out
  assert "hygiene on cpu: 1 ok, 0 flagged, 1 excluded" in out
