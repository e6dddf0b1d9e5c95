"""The task-world job's CPU smoke run, as a user types it:

  python -m kevin_jax.main --config=configs/multiturn.py:world,runlocal --config.evaluator.backend=scripted

a small generated world, the warm start on its corpus (1 step), 1 RL step on its train split, and the evaluations
before and after on all four splits (train, heldout_compositions, heldout_styles, suite), novelty included.
"""

import json
import os
import subprocess
import sys

from configs import multiturn
from kevin_jax import metrics as metrics_lib
from kevin_jax import runtime
from kevin_jax.kernels import tasks as tasks_lib
from tests.test_runlocal import ROOT, _user_env

SPLITS = ("train", "heldout_compositions", "heldout_styles", "suite")


def test_world_runlocal_warm_start_one_rl_step_and_four_split_evaluations(tmp_path):
  wd = tmp_path / "run"
  r = subprocess.run([sys.executable, "-m", "kevin_jax.main", "--config=configs/multiturn.py:world,runlocal",
                      "--config.evaluator.backend=scripted", "--config.logging.tensorboard=False",
                      f"--workdir={wd}"], cwd=ROOT, env=_user_env(), capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-4000:]
  assert list(metrics_lib.read_metrics(str(wd / "sft" / "metrics.jsonl"))) == [1]  # The 1-step warm start.
  config = json.load(open(wd / "config.json"))
  assert config["tasks"]["source"] == "generated" and config["tasks"]["world_train"] == 4
  # One RL step, on tasks of the world's train split only.
  recs = metrics_lib.read_metrics(str(wd / "metrics.jsonl"))
  assert list(recs) == [1] and recs[1]["learner/updates_applied"] == 2
  splits = tasks_lib.world_splits(runtime.task_source(multiturn.get_config("world,runlocal")))
  train_ids = {s.id for s in splits["train"]}
  assert set(recs[1]["tasks"].split(",")) <= train_ids
  # Before (step 0) and after (step 1): each split's first task, 4 trajectories x 1 turn, paired seeds.
  evals = [json.loads(l) for l in open(wd / "eval_metrics.jsonl")]
  assert [e["step"] for e in evals] == [0, 1]
  for e in evals:
    for split in SPLITS:
      assert e[f"{split}/tasks"] == 1, split
      assert 0.0 <= e[f"{split}/kernel/correct_rate"] <= 1.0
      assert f"{split}/novelty/novel_share" in e
  for split in SPLITS:
    rows = [json.loads(l) for l in open(wd / "eval_rollouts" / f"step_000000_{split}.jsonl")]
    assert len(rows) == 4 and {row["task_id"] for row in rows} == {splits[split][0].id}, split
  assert runtime.is_hf_checkpoint(str(wd / "hf"))

