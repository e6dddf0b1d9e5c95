"""tasks.hygiene at load (kevin_jax/task_hygiene.py): excluded tasks leave the task list, with a report; cached."""

import os
import subprocess

import pytest

from configs import multiturn
from kevin_jax import runtime, task_hygiene

TASK = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return {body}

batch_size = 32

def get_inputs():
    return [torch.rand(batch_size, 16)]

def get_init_inputs():
    return []
"""


@pytest.fixture()
def config(tmp_path):
  root = tmp_path / "KernelBench" / "level1"
  root.mkdir(parents=True)
  (root / "1_Linear.py").write_text(TASK.format(body="self.fc(x)"))
  (root / "2_Zeros.py").write_text(TASK.format(body="self.fc(x) * 0"))
  (root / "3_Tanh.py").write_text(TASK.format(body="torch.tanh(self.fc(x))"))
  c = multiturn.get_config("")
  c.tasks.source = str(tmp_path / "KernelBench")
  c.tasks.levels = (1,)
  c.evaluator.cache_dir = str(tmp_path / "cache")
  return c


def test_auto_excludes_degenerate_external_tasks_and_caches_the_records(config, tmp_path, monkeypatch):
  specs, sources = runtime.load_tasks(config, "all")
  assert [s.id for s in specs] == ["level1/1_Linear", "level1/3_Tanh"] and set(sources) == {s.id for s in specs}
  cached = os.listdir(task_hygiene.cache_dir(config))
  assert len(cached) == 3
  # A second load (another split, a restarted job) reads the cache: no child process.
  monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("hygiene checked again"))
  train, _ = runtime.load_tasks(config, "train")
  assert "level1/2_Zeros" not in {s.id for s in train}
  md, csv_path = task_hygiene.write_report(config, runtime.task_source(config), str(tmp_path / "work"))
  assert os.path.basename(md) == "task_hygiene.md"
  text = open(md, encoding="utf-8").read()
  assert "| level1/2_Zeros | excluded | degenerate" in text and "2 ok, 0 flagged, 1 excluded" in text
  assert len(open(csv_path, encoding="utf-8").read().splitlines()) == 4


def test_off_keeps_every_task_and_auto_skips_the_builtin_sources(config):
  config.tasks.hygiene = "off"
  assert len(runtime.load_tasks(config, "all")[0]) == 3
  assert not os.path.exists(task_hygiene.cache_dir(config))
  bundled = multiturn.get_config("")
  assert bundled.tasks.hygiene == "auto"
  assert not task_hygiene.enabled(bundled, runtime.task_source(bundled))
  config.tasks.hygiene = "sometimes"
  with pytest.raises(SystemExit, match="tasks.hygiene"):
    runtime.load_tasks(config, "all")
