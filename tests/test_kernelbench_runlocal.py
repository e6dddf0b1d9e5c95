"""The KernelBench job's CPU smoke run on a KernelBench-format tree built here (no checkout, no network):

  python -m kevin_jax.main --config=configs/kernelbench.py:runlocal --config.tasks.source=DIR \\
      --config.evaluator.backend=scripted

through the warm start (the bundled suite's and a small generated world's corpora), 1 RL step, the closing
evaluation and the standard report, at a peak resident memory under 4 GiB; plus the start-up errors for a missing
or wrong task folder.
"""

import csv
import json
import os
import subprocess
import sys

from kevin_jax import metrics as metrics_lib
from kevin_jax import runtime
from kevin_jax.policy.tokenizer import load_tokenizer
from kevin_jax.rl import prompts
from tests.test_runlocal import _PEAK, ROOT, _user_env

_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """{doc}"""
    def __init__(self{init_args}):
        super(Model, self).__init__()
{init_body}
    def forward(self, {fwd_args}):
        return {expr}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return [{init_inputs}]
'''
TASKS = {  # id -> (doc, init args, init body, forward args, expression, inputs, init inputs)
    "level1/19_ReLU": ("ReLU.", "", "", "x", "torch.relu(x)", "torch.rand(16, 64)", ""),
    "level1/23_Softmax": ("Softmax over dim 1.", "", "", "x", "torch.softmax(x, dim=1)", "torch.rand(8, 32)", ""),
    "level1/47_Sum_reduction_over_a_dimension": (
        "Sum over a dimension.", ", dim", "        self.dim = dim\n", "x", "torch.sum(x, dim=self.dim, keepdim=True)",
        "torch.rand(4, 8, 16)", "1"),
    "level2/12_Gemm_Multiply_LeakyReLU": (
        "Gemm, multiply, LeakyReLU.", ", in_f, out_f", "        self.gemm = nn.Linear(in_f, out_f)\n", "x",
        "torch.nn.functional.leaky_relu(self.gemm(x) * 2.0, 0.1)", "torch.rand(8, 32)", "32, 16"),
    "level2/40_Matmul_Scaling_ResidualAdd": (
        "Matmul, scaling, residual add.", ", in_f, out_f", "        self.matmul = nn.Linear(in_f, out_f)\n", "x",
        "self.matmul(x) * 1.5 + self.matmul(x)", "torch.rand(8, 32)", "32, 16"),
}
TRAIN = ("level1/19_ReLU", "level1/47_Sum_reduction_over_a_dimension", "level2/12_Gemm_Multiply_LeakyReLU")
TEST = ("level1/23_Softmax", "level2/40_Matmul_Scaling_ResidualAdd")


def make_tree(root) -> str:
  """A KernelBench/ folder with level1/ and level2/ holding the TASKS; returns its path."""
  kb = root / "KernelBench"
  for tid, (doc, init_args, init_body, fwd_args, expr, inputs, init_inputs) in TASKS.items():
    path = kb / f"{tid}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_TASK.format(doc=doc, init_args=init_args, init_body=init_body, fwd_args=fwd_args, expr=expr,
                                 inputs=inputs, init_inputs=init_inputs))
  return str(kb)


def _main(*flags, timeout=900, peak_file=None):
  """The job as a user types it; with `peak_file`, through a wrapper that writes its peak resident memory there."""
  wrap = [sys.executable, "-c", _PEAK, str(peak_file)] if peak_file else []
  return subprocess.run([*wrap, sys.executable, "-m", "kevin_jax.main", *flags], cwd=ROOT, env=_user_env(),
                        capture_output=True, text=True, timeout=timeout)


def test_kernelbench_runlocal_warm_start_one_rl_step_and_standard_report(tmp_path):
  kb, wd = make_tree(tmp_path), tmp_path / "run"
  r = _main("--config=configs/kernelbench.py:runlocal", f"--config.tasks.source={kb}",
            "--config.evaluator.backend=scripted", f"--config.tasks.train_ids={TRAIN!r}",
            f"--config.tasks.test_ids={TEST!r}", "--config.logging.tensorboard=False", f"--workdir={wd}",
            peak_file=tmp_path / "peak")
  assert r.returncode == 0, r.stderr[-4000:]
  # The warm start trained on the bundled suite's and the generated world's corpora (KernelBench has none).
  sft_steps = metrics_lib.read_metrics(str(wd / "sft" / "metrics.jsonl"))
  assert list(sft_steps) == [1]
  assert "task sources 'bundled', 'generated'" in r.stderr
  assert runtime.is_hf_checkpoint(str(wd / "sft" / "hf"))
  # One RL step on 2 of the 3 training tasks.
  recs = metrics_lib.read_metrics(str(wd / "metrics.jsonl"))
  assert list(recs) == [1]
  assert set(recs[1]["tasks"].split(",")) <= set(TRAIN) and recs[1]["learner/updates_applied"] == 2
  # The prompt budget followed the tasks: the longest first-turn prompt, rounded up to 256 tokens.
  tokenizer = load_tokenizer(None)
  longest = max(len(tokenizer.encode_chat(prompts.build_messages(open(os.path.join(kb, f"{tid}.py")).read()),
                                          add_generation_prompt=True)) for tid in TASKS)
  config = json.load(open(wd / "config.json"))
  assert config["rollout"]["max_context_tokens"] == -(-longest // 256) * 256
  assert max(config["sampler"]["prompt_buckets"]) >= config["rollout"]["max_context_tokens"]
  # The closing evaluation's standard report: the 2 test tasks, one per level.
  rows = list(csv.DictReader(open(wd / "report" / "standard_tasks.csv")))
  assert sorted(r["task_id"] for r in rows) == sorted(TEST)
  assert {(r["level"], r["split"]) for r in rows} == {("1", "test"), ("2", "test")}
  assert all(int(r["kernels"]) == 4 for r in rows)  # 2 trajectories x 2 turns.
  summary = {(r["level"], r["split"]) for r in csv.DictReader(open(wd / "report" / "standard_summary.csv"))}
  assert summary == {("1", "test"), ("2", "test"), ("all", "all")}
  md = (wd / "report" / "standard_report.md").read_text()
  assert "Task source commit: unknown. GPU: none (scripted)." in md
  assert (wd / "report" / "standard_report.png").stat().st_size > 0
  peak_bytes = int((tmp_path / "peak").read_text()) * (1 if sys.platform == "darwin" else 1024)
  assert peak_bytes < 4 * 2**30, f"peak resident memory {peak_bytes / 2**30:.2f} GiB"


def test_missing_or_wrong_task_source_is_named(tmp_path):
  r = _main("--config=configs/kernelbench.py:runlocal", "--config.evaluator.backend=scripted",
            f"--workdir={tmp_path / 'a'}", timeout=120)
  assert r.returncode != 0 and "--config.tasks.source=DIR" in r.stderr
  make_tree(tmp_path)
  r = _main("--config=configs/kernelbench.py:runlocal", "--config.evaluator.backend=scripted",
            f"--config.tasks.source={tmp_path}", f"--workdir={tmp_path / 'b'}", timeout=120)
  assert r.returncode != 0
  assert f"{tmp_path} is not a KernelBench tree" in r.stderr
  assert f"pass --config.tasks.source={tmp_path / 'KernelBench'}" in r.stderr
