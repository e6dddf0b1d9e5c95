"""The RL loop end to end on CPU: tiny policy, 8 fake devices, scripted reward; crash after step 1 + resume.

Checks rollouts -> returns -> advantages -> update -> metrics files -> checkpoints, and that a run killed during
step 2 and rerun in the same workdir reaches the same step-2 metrics as an uninterrupted run with the same seed.
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import pytest

from configs import multiturn
from kevin_jax import cuda_driver
from kevin_jax import evaluate
from kevin_jax import metrics as metrics_lib
from kevin_jax import runtime
from kevin_jax import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Deterministic quantities of a step (timings and throughput vary run to run).
COMPARED = ("reward/mean", "reward/mean_turn1", "reward/mean_turn2", "correct/rate", "rl/advantage_abs_mean",
            "learner/loss", "learner/loss_first", "learner/grad_norm", "learner/entropy", "learner/clip_frac",
            "response/len_mean", "tasks")


def _config(total_steps=2, kl_beta=0.0):
  c = multiturn.get_config("runlocal")
  c.rl.kl_beta = kl_beta
  c.evaluator.backend = "scripted"
  c.total_steps = total_steps
  c.rl.micro_batch_size = 1  # 2 updates x 1 row x 4 data-parallel devices = 8 rows per batch.
  c.sampler.max_new_tokens = 16
  c.logging.tensorboard = False
  c.mesh.axes = (("fsdp", -1), ("tensor", 2))  # 4 x 2 over the 8 fake devices: FSDP and tensor parallel.
  c.sft.before_rl = False  # The warm start has its own tests (tests/test_sft.py); see test_warm_start_first.
  c.evaluation.in_training_splits = ()  # In-loop evaluations: test_in_training_eval_before_after_and_resume.
  return c


def _with_eval(c, trajectories, turns, max_tasks, splits=("train",)):
  """c with small in-training evaluations: max_tasks tasks per split, trajectories x turns each."""
  c.evaluation.in_training_splits = splits
  c.evaluation.in_training_trajectories = trajectories
  c.evaluation.in_training_turns = turns
  c.evaluation.in_training_max_tasks = max_tasks
  return c


class _Crash(RuntimeError):
  pass


@pytest.mark.parametrize("kl_beta", [0.0, 0.5])
def test_loop_runs_and_resume_matches_uninterrupted(tmp_path, monkeypatch, kl_beta):
  # kl_beta > 0: KL to the starting policy, which the resumed run must rebuild (here: the seed's random init).
  assert len(jax.devices()) == 8  # tests/conftest.py: 8 fake CPU devices.
  full = tmp_path / "full"
  train.run(_config(kl_beta=kl_beta), str(full))
  recs = metrics_lib.read_metrics(str(full / "metrics.jsonl"))
  assert list(recs) == [1, 2]
  for m in recs.values():
    assert m["learner/updates_applied"] == 2 and m["learner/nonfinite_update"] == -1
    assert m["rl/advantage_abs_mean"] > 0  # The scripted reward varies, so the update has a signal.
    assert m["batch/rows"] == 8 and m["learner/seqs"] == 8  # 2 tasks x 2 trajectories x 2 turns.
    assert ("learner/kl" in m) == (kl_beta > 0)
  if kl_beta:  # Step 1's first update is at the reference (KL 0); by step 2 the policy has moved away from it.
    assert 0 < recs[1]["learner/kl"] < recs[2]["learner/kl"]
  assert sorted(os.listdir(full / "checkpoints")) == ["1", "2"]
  turns = [json.loads(l) for l in open(full / "rollouts" / "step_000002.jsonl")]
  assert len(turns) == 8 and {t["turn"] for t in turns} == {0, 1}
  assert all(t["result"]["status"] in ("correct", "incorrect") for t in turns)
  assert json.load(open(full / "config.json"))["rl"]["gamma"] == 0.4

  # Crash during step 2 (after step 1's checkpoint), then rerun the same command in the same workdir.
  crashed = tmp_path / "crashed"
  real_make_reward = runtime.make_reward
  calls = {"n": 0}

  def crashing_reward(config, source):
    inner = real_make_reward(config, source)
    def reward(items):
      calls["n"] += 1
      if calls["n"] == 3:  # 2 reward calls per step (2 turns): the third is step 2's first turn.
        raise _Crash("simulated kill during step 2")
      return inner(items)
    return reward

  monkeypatch.setattr(runtime, "make_reward", crashing_reward)
  with pytest.raises(_Crash):
    train.run(_config(kl_beta=kl_beta), str(crashed))
  monkeypatch.setattr(runtime, "make_reward", real_make_reward)
  assert sorted(os.listdir(crashed / "checkpoints")) == ["1"]
  assert list(metrics_lib.read_metrics(str(crashed / "metrics.jsonl"))) == [1]
  train.run(_config(kl_beta=kl_beta), str(crashed))
  resumed = metrics_lib.read_metrics(str(crashed / "metrics.jsonl"))
  assert list(resumed) == [1, 2]
  for key in COMPARED + (("learner/kl",) if kl_beta else ()):
    a, b = recs[2][key], resumed[2][key]
    if isinstance(a, float):
      assert b == pytest.approx(a, rel=1e-6, abs=1e-7), key
    else:
      assert a == b, key


def test_in_training_eval_before_after_and_resume(tmp_path, monkeypatch):
  """Evaluations of both splits before step 1 (step 0) and after the last step, with paired seeds: a run that
  crashes in step 2 and resumes writes the same step-0 and step-2 evaluations as an uninterrupted run, once each."""
  def config():
    return _with_eval(_config(total_steps=2), trajectories=2, turns=2, max_tasks=2, splits=("train", "test"))

  full = tmp_path / "full"
  train.run(config(), str(full))
  lines = [json.loads(l) for l in open(full / "eval_metrics.jsonl")]
  assert [r["step"] for r in lines] == [0, 2]
  for r in lines:
    for split in ("train", "test"):
      assert r[f"{split}/tasks"] == 2
      turns = [json.loads(l) for l in open(full / "eval_rollouts" / f"step_{r['step']:06d}_{split}.jsonl")]
      assert len(turns) == 2 * 2 * 2  # tasks x trajectories x turns
      scores = [t["result"]["score"] for t in turns]
      correct = [t["result"]["status"] == "correct" for t in turns]
      assert r[f"{split}/kernel/score_mean"] == pytest.approx(sum(scores) / 8)
      assert r[f"{split}/kernel/correct_rate"] == pytest.approx(sum(correct) / 8)
      assert 0 <= r[f"{split}/correct_avg"] <= r[f"{split}/correct_best"] <= 1
  assert lines[0]["train/kernel/score_mean"] > 0  # The scripted reward passes about 2/3 of the kernels.

  crashed = tmp_path / "crashed"
  real_step = train.rl_step

  def crash_in_step_2(step, state, **kw):
    if step == 2:
      raise _Crash("simulated kill during step 2")
    return real_step(step, state, **kw)

  monkeypatch.setattr(train, "rl_step", crash_in_step_2)
  with pytest.raises(_Crash):
    train.run(config(), str(crashed))
  monkeypatch.setattr(train, "rl_step", real_step)
  train.run(config(), str(crashed))
  again = [json.loads(l) for l in open(crashed / "eval_metrics.jsonl")]
  assert [r["step"] for r in again] == [0, 2]  # The starting policy is not re-evaluated on resume.
  for a, b in zip(lines, again):
    _assert_same_evaluation(a, b)


def _assert_same_evaluation(want: dict, got: dict) -> None:
  """Two eval_metrics.jsonl records hold the same numbers (timings aside): every one of want's > 20 metrics."""
  keys = [k for k in want if "time/" not in k and k != "step"]
  assert len(keys) > 20
  for key in keys:
    assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), key


def test_evaluation_temperature_is_separate_from_the_rollouts(tmp_path):
  """evaluation.temperature = 0: the in-training evaluations sample greedily (a task's trajectories give the same
  first response) while the RL rollouts still sample at sampler.temperature (they differ)."""
  def run(temperature, name):
    c = _with_eval(_config(total_steps=1), trajectories=3, turns=1, max_tasks=2)
    c.evaluation.temperature = temperature
    train.run(c, str(tmp_path / name))
    evals = [json.loads(l) for l in open(tmp_path / name / "eval_rollouts" / "step_000000_train.jsonl")]
    rollouts = [json.loads(l) for l in open(tmp_path / name / "rollouts" / "step_000001.jsonl")]
    first = lambda rows: {tid: {r["response"] for r in rows if r["task_id"] == tid and r["turn"] == 0}
                          for tid in {r["task_id"] for r in rows}}
    return first(evals), first(rollouts), c.sampler.temperature

  greedy, rl, t = run(0.0, "greedy")
  assert t > 0 and len(greedy) == 2 and all(len(v) == 1 for v in greedy.values())
  assert all(len(v) > 1 for v in rl.values())
  sampled, rl_again, _ = run(-1.0, "default")  # -1: the evaluations sample at sampler.temperature too.
  assert all(len(v) > 1 for v in sampled.values())
  assert rl_again == rl  # The same seed: the rollouts do not depend on the evaluation's temperature.


def test_in_training_first_false_skips_only_the_step0_evaluation(tmp_path):
  """evaluation.in_training_first=False: no step-0 evaluation; the periodic and closing ones still run."""
  c = _with_eval(_config(total_steps=3), trajectories=2, turns=1, max_tasks=1)
  c.evaluation.in_training_every = 2
  c.evaluation.in_training_first = False
  train.run(c, str(tmp_path))
  lines = [json.loads(l) for l in open(tmp_path / "eval_metrics.jsonl")]
  assert [r["step"] for r in lines] == [2, 3]
  assert sorted(os.listdir(tmp_path / "eval_rollouts")) == ["step_000002_train.jsonl", "step_000003_train.jsonl"]


def test_total_steps_zero_evaluates_the_start_and_an_export_in_phases(tmp_path):
  """total_steps=0 evaluates the starting policy only (no step, checkpoint or export). The default job split into
  phases (start evaluated alone; RL with no evaluations; the exported policy evaluated alone) gives the same before and after numbers as one uninterrupted run of the same seed."""
  def config(total_steps):
    return _with_eval(_config(total_steps=total_steps), trajectories=2, turns=2, max_tasks=2, splits=("train", "test"))

  whole = tmp_path / "whole"
  train.run(config(2), str(whole))
  before, after = [json.loads(l) for l in open(whole / "eval_metrics.jsonl")]

  train.run(config(0), str(tmp_path / "start"))
  start = [json.loads(l) for l in open(tmp_path / "start" / "eval_metrics.jsonl")]
  assert [r["step"] for r in start] == [0]
  assert not os.listdir(tmp_path / "start" / "checkpoints") and not (tmp_path / "start" / "hf").exists()
  assert not list(metrics_lib.read_metrics(str(tmp_path / "start" / "metrics.jsonl")))  # No RL step.

  c = config(2)
  c.evaluation.in_training_splits = ()
  train.run(c, str(tmp_path / "rl"))
  assert not (tmp_path / "rl" / "eval_metrics.jsonl").exists()
  c = config(0)
  c.init_from = str(tmp_path / "rl" / "hf")
  train.run(c, str(tmp_path / "after"))
  exported = [json.loads(l) for l in open(tmp_path / "after" / "eval_metrics.jsonl")]
  assert [r["step"] for r in exported] == [0]
  assert before["train/kernel/score_mean"] != after["train/kernel/score_mean"]  # The two steps changed something.
  _assert_same_evaluation(before, start[0])
  _assert_same_evaluation(after, exported[0])

  c = config(-1)
  with pytest.raises(ValueError, match="total_steps must be >= 0"):
    train.run(c, str(tmp_path / "negative"))


def _assert_same_params(a_tree, b_tree):
  """Two parameter trees hold the same leaves: as many, each of the same dtype and bit for bit equal."""
  a_leaves, b_leaves = jax.tree.leaves(a_tree), jax.tree.leaves(b_tree)
  assert len(a_leaves) == len(b_leaves) > 10
  for a, b in zip(a_leaves, b_leaves):
    assert a.dtype == b.dtype and bool((a == b).all())


def _assert_trained_away_from_init(c, policy, params):
  """Some leaf differs from the random initialisation RL started from (the step changed the policy)."""
  start = runtime.initial_params(c, policy, jax.random.key(c.seed))
  assert any(not bool((a == b).all()) for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(params)))


def test_exports_the_trained_policy_as_hf_after_the_last_step(tmp_path):
  """checkpoint.export_hf: workdir/hf holds the last step's parameters exactly; a rerun that finds the run done
  but the export missing (a crash during it) writes it again; export_hf=False writes none."""
  c = _config(total_steps=1)
  train.run(c, str(tmp_path / "run"))
  hf = tmp_path / "run" / "hf"
  assert runtime.is_hf_checkpoint(str(hf)) and (hf / "tokenizer.json").is_file()
  policy = runtime.build_policy(c)
  exported = runtime.load_hf_params(str(hf), policy)
  trained = runtime.restore_params(str(tmp_path / "run"), policy)
  _assert_same_params(exported, trained)
  _assert_trained_away_from_init(c, policy, trained)

  shutil.rmtree(hf)
  train.run(c, str(tmp_path / "run"))  # Nothing left to train: only the missing export is written.
  assert runtime.is_hf_checkpoint(str(hf))
  assert list(metrics_lib.read_metrics(str(tmp_path / "run" / "metrics.jsonl"))) == [1]

  c.checkpoint.export_hf = False
  train.run(c, str(tmp_path / "off"))
  assert not (tmp_path / "off" / "hf").exists()


def test_export_precedes_the_closing_evaluation(tmp_path, monkeypatch):
  """A job killed during its closing evaluation still leaves the last step's policy in workdir/hf; the rerun redoes
  the step (no checkpoint was saved), evaluates and exports the same parameters again."""
  c = _with_eval(_config(total_steps=1), trajectories=2, turns=1, max_tasks=1)
  c.evaluation.in_training_first = False
  real_call = train.InTrainingEval.__call__

  def crash_in_closing_eval(self, step, *args, **kw):
    raise _Crash(f"simulated kill during the evaluation at step {step}")

  monkeypatch.setattr(train.InTrainingEval, "__call__", crash_in_closing_eval)
  with pytest.raises(_Crash):
    train.run(c, str(tmp_path))
  hf = tmp_path / "hf"
  assert runtime.is_hf_checkpoint(str(hf))
  assert not os.path.exists(tmp_path / "eval_metrics.jsonl")
  policy = runtime.build_policy(c)
  first = runtime.load_hf_params(str(hf), policy)
  _assert_trained_away_from_init(c, policy, first)

  monkeypatch.setattr(train.InTrainingEval, "__call__", real_call)
  train.run(c, str(tmp_path))
  assert [json.loads(l)["step"] for l in open(tmp_path / "eval_metrics.jsonl")] == [1]
  again = runtime.load_hf_params(str(hf), policy)
  _assert_same_params(first, again)
  _assert_same_params(again, runtime.restore_params(str(tmp_path), policy))


def test_no_gpu_stops_before_writing(tmp_path):
  if cuda_driver.device_count():
    pytest.skip("a GPU is present")
  r = subprocess.run([sys.executable, "-m", "kevin_jax.main", "--config=configs/multiturn.py:runlocal",
                      f"--workdir={tmp_path}/w"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode != 0
  assert "needs a CUDA GPU" in r.stderr and "--config.evaluator.backend=scripted" in r.stderr
  assert not os.path.exists(tmp_path / "w")


def test_bad_task_source_and_checkpoint_are_clear_errors(tmp_path):
  c = _config()
  c.tasks.source = str(tmp_path / "nope")
  with pytest.raises(SystemExit, match="task source"):
    train.run(c, str(tmp_path / "w1"))
  c = _config()
  c.init_from = str(tmp_path / "missing_ckpt")
  with pytest.raises(SystemExit, match="does not exist"):
    train.run(c, str(tmp_path / "w2"))


def test_warm_start_runs_first_from_scratch_only(tmp_path, monkeypatch):
  """From random init, mode=train runs the SFT warm start into workdir/sft and starts RL from its export."""
  from kevin_jax import sft  # pylint: disable=g-import-not-at-top
  calls, srcs = [], []
  monkeypatch.setattr(sft, "warm_start", lambda config, d: calls.append(d) or "/exported/hf")
  monkeypatch.setattr(runtime, "initial_state", lambda config, policy, key, src=None: srcs.append(src))
  c = _config(total_steps=0)
  c.sft.before_rl = True
  train.run(c, str(tmp_path / "w"))
  assert calls == [str(tmp_path / "w" / "sft")] and srcs == ["/exported/hf"]
  c.init_from = "/some/other/weights"  # An explicit start point skips the warm start.
  train.run(c, str(tmp_path / "w2"))
  assert len(calls) == 1 and srcs[-1] is None


def test_checkpoint_that_does_not_match_the_model(tmp_path):
  """An HF checkpoint of another shape is refused with the differing fields named, before any training."""
  from tests.test_common import make_hf_qwen2  # pylint: disable=g-import-not-at-top
  make_hf_qwen2(tmp_path / "hf", vocab_size=256, hidden_size=64, num_layers=1)
  c = _config()
  c.init_from = str(tmp_path / "hf")
  with pytest.raises(SystemExit, match="does not match the policy's model.*num_layers"):
    train.run(c, str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w" / "checkpoints" / "1")


def test_evaluation_mode_on_an_exported_policy(tmp_path):
  """mode=evaluate end to end on CPU: an HF-format tiny policy, scripted reward, reports written."""
  from configs import eval as eval_config  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.model import Qwen2  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.weights import save_pretrained  # pylint: disable=g-import-not-at-top
  c = eval_config.get_config("runlocal,beam")
  c.evaluator.backend = "scripted"
  c.sampler.max_new_tokens = 8
  c.mesh.axes = (("fsdp", -1), ("tensor", 2))
  policy = runtime.build_policy(c)
  save_pretrained(Qwen2(policy.model_cfg, rngs=nnx.Rngs(0)), str(tmp_path / "hf"))
  c.evaluation.checkpoint = str(tmp_path / "hf")
  evaluate.run(c, str(tmp_path / "w"))
  out = tmp_path / "w" / "eval"
  report = json.load(open(out / "report.json"))
  assert report["tasks"] == 2 and [r["turn"] for r in report["per_turn"]] == [1, 2]
  assert [(b["trajectories"], b["turns"]) for b in report["budgets"]] == [(2, 2), (4, 1)]
  assert len(report["beam"]) == 2
  # The scripted reward marks about 2/3 of responses correct: some trajectory of some task succeeds.
  assert 0 < report["per_turn"][-1]["correct_best"] <= 1
  for name in ("results.md", "results.csv", "scaling.png", "trajectories.jsonl"):
    assert os.path.getsize(out / name) > 0


def test_time_budget_stops_early_then_evaluates_and_checkpoints(tmp_path, monkeypatch):
  """time_budget_s: with a fake clock (a step takes 100 s, an evaluation 50 s) and 330 s, steps 1-2 run, step 3
  would not leave room for the closing evaluation, so the job evaluates and checkpoints step 2 and stops; a rerun
  without a budget continues to total_steps."""
  clock = {"t": 0.0}
  monkeypatch.setattr(train, "_now", lambda: clock["t"])
  real_step, real_eval = train.rl_step, train.InTrainingEval.__call__

  def slow_step(step, state, **kw):
    clock["t"] += 100.0
    return real_step(step, state, **kw)

  def slow_eval(self, step, params, reward):
    clock["t"] += 50.0
    return real_eval(self, step, params, reward)

  monkeypatch.setattr(train, "rl_step", slow_step)
  monkeypatch.setattr(train.InTrainingEval, "__call__", slow_eval)

  def config(budget):
    c = _with_eval(_config(total_steps=5), trajectories=2, turns=2, max_tasks=2)
    c.time_budget_s = budget
    c.checkpoint.every_steps = 4  # Step 2 is saved only because the budget stops the run there.
    return c

  wd = tmp_path / "run"
  train.run(config(330.0), str(wd))
  assert list(metrics_lib.read_metrics(str(wd / "metrics.jsonl"))) == [1, 2]
  assert [json.loads(l)["step"] for l in open(wd / "eval_metrics.jsonl")] == [0, 2]
  assert clock["t"] == 50 + 100 + 100 + 50  # Evaluation, two steps, the closing evaluation.
  assert sorted(os.listdir(wd / "checkpoints")) == ["2"]

  train.run(config(0.0), str(wd))  # No budget: resumes at step 3 and finishes the run.
  assert list(metrics_lib.read_metrics(str(wd / "metrics.jsonl"))) == [1, 2, 3, 4, 5]
  assert [json.loads(l)["step"] for l in open(wd / "eval_metrics.jsonl")] == [0, 2, 5]
  assert sorted(os.listdir(wd / "checkpoints")) == ["2", "4", "5"]
  with pytest.raises(ValueError, match="time_budget_s"):
    train.run(config(-1.0), str(tmp_path / "bad"))

  # No step-0 evaluation: only time_budget_eval_s tells the budget how long the closing one will take. After step 2,
  # 110 s of 310 are left: enough for step 3 alone (100 s), which without the estimate would run and push the
  # closing evaluation to 350 s; with it, step 2 is the last and the job ends at 250 s.
  skip = config(310.0)
  skip.evaluation.in_training_first = False
  skip.time_budget_eval_s = 50.0
  clock["t"] = 0.0
  wd = tmp_path / "skip"
  train.run(skip, str(wd))
  assert list(metrics_lib.read_metrics(str(wd / "metrics.jsonl"))) == [1, 2]
  assert [json.loads(l)["step"] for l in open(wd / "eval_metrics.jsonl")] == [2]
  assert clock["t"] == 100 + 100 + 50
  skip.time_budget_eval_s = -1.0
  with pytest.raises(ValueError, match="time_budget_eval_s"):
    train.run(skip, str(tmp_path / "bad2"))
