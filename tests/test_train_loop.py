"""The RL loop end to end on CPU: tiny policy, 8 fake devices (FSDP 4 x tensor 2), scripted reward.

Few loops, many assertions: an uninterrupted 2-step run without evaluations (`base`) is the reference; a run with
evaluations of both splits that is killed during step 2, rerun, killed during its closing evaluation and rerun
(`resumed`) must reach base's metrics and parameters; the job split into phases must reproduce resumed's
evaluations; a KL run checks the reference policy's rebuild on resume and that evaluation settings never touch
the rollouts. The evaluation schedule and the time budget are checked with a stand-in RL step (the step's content
is checked by the runs above), so they cost no learner compiles or updates.
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
  # Steps large enough that 2 RL steps change what the policy samples (at the job's 1e-5 and clip 0.05 the tiny
  # policy's evaluated tokens can stay the same, and the phase test could not tell the start from the export).
  c.optimizer.learning_rate = 1e-3
  c.optimizer.max_grad_norm = 1.0
  c.sampler.max_new_tokens = 16
  c.logging.tensorboard = False
  c.mesh.axes = (("fsdp", -1), ("tensor", 2))  # 4 x 2 over the 8 fake devices: FSDP and tensor parallel.
  c.sft.before_rl = False  # The warm start has its own tests (tests/test_sft.py, tests/test_runlocal.py).
  c.sft.micro_batch_size = 1  # 4 rows x 2048 tokens in the host-memory check when a test turns before_rl on.
  c.evaluation.in_training_splits = ()
  return c


def _with_eval(c, trajectories, turns, max_tasks, splits=("train",)):
  """c with small in-training evaluations: max_tasks tasks per split, trajectories x turns each."""
  c.evaluation.in_training_splits = splits
  c.evaluation.in_training_trajectories = trajectories
  c.evaluation.in_training_turns = turns
  c.evaluation.in_training_max_tasks = max_tasks
  return c


def _eval_config(total_steps=2):
  """The evaluated run: both splits, 2 tasks x 2 trajectories x 2 turns each."""
  return _with_eval(_config(total_steps=total_steps), trajectories=2, turns=2, max_tasks=2, splits=("train", "test"))


class _Crash(RuntimeError):
  pass


def _lines(path):
  return [json.loads(l) for l in open(path)]


def _first_responses(rows):
  """task id -> the set of its turn-1 responses."""
  return {tid: {r["response"] for r in rows if r["task_id"] == tid and r["turn"] == 0}
          for tid in {r["task_id"] for r in rows}}


def _assert_same_steps(want: dict, got: dict, keys=COMPARED) -> None:
  for key in keys:
    a, b = want[key], got[key]
    if isinstance(a, float):
      assert b == pytest.approx(a, rel=1e-6, abs=1e-7), key
    else:
      assert a == b, key


def _assert_same_evaluation(want: dict, got: dict) -> None:
  """Two eval_metrics.jsonl records hold the same numbers (timings aside): every one of want's > 20 metrics."""
  keys = [k for k in want if "time/" not in k and k != "step"]
  assert len(keys) > 20
  for key in keys:
    assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), key


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


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  """2 uninterrupted steps, no in-training evaluations; exports workdir/hf."""
  assert len(jax.devices()) == 8  # tests/conftest.py: 8 fake CPU devices.
  wd = tmp_path_factory.mktemp("base")
  train.run(_config(), str(wd))
  return wd


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
  """_eval_config's run killed during step 2 (in its reward), rerun, killed during the closing evaluation (after
  the export, before the step-2 checkpoint), rerun to the end. Returns (workdir, what each interruption left)."""
  wd = tmp_path_factory.mktemp("resumed")
  seen = {}
  with pytest.MonkeyPatch.context() as mp:
    real_step, real_make_reward = train.rl_step, runtime.make_reward
    current = {"step": 0}

    def tracking_step(step, state, **kw):
      current["step"] = step
      return real_step(step, state, **kw)

    def crashing_reward(config, source):
      inner = real_make_reward(config, source)
      def reward(items):
        if current["step"] == 2:  # Step 2's first turn has been sampled; nothing of step 2 is written yet.
          raise _Crash("simulated kill during step 2")
        return inner(items)
      return reward

    mp.setattr(train, "rl_step", tracking_step)
    mp.setattr(runtime, "make_reward", crashing_reward)
    with pytest.raises(_Crash):
      train.run(_eval_config(), str(wd))
    seen["mid_step"] = dict(checkpoints=sorted(os.listdir(wd / "checkpoints")),
                            steps=list(metrics_lib.read_metrics(str(wd / "metrics.jsonl"))),
                            evals=[r["step"] for r in _lines(wd / "eval_metrics.jsonl")],
                            hf=(wd / "hf").exists())
    mp.setattr(runtime, "make_reward", real_make_reward)

    def crash_in_eval(self, step, *args, **kw):
      raise _Crash(f"simulated kill during the evaluation at step {step}")

    mp.setattr(train.InTrainingEval, "__call__", crash_in_eval)
    with pytest.raises(_Crash):
      train.run(_eval_config(), str(wd))
    policy = runtime.build_policy(_eval_config())
    seen["in_eval"] = dict(checkpoints=sorted(os.listdir(wd / "checkpoints")),
                           evals=[r["step"] for r in _lines(wd / "eval_metrics.jsonl")],
                           hf_params=runtime.load_hf_params(str(wd / "hf"), policy))
  train.run(_eval_config(), str(wd))
  return wd, seen


def test_loop_writes_metrics_rollouts_checkpoints_and_the_export(base):
  recs = metrics_lib.read_metrics(str(base / "metrics.jsonl"))
  assert list(recs) == [1, 2]
  for m in recs.values():
    assert m["learner/updates_applied"] == 2 and m["learner/nonfinite_update"] == -1
    assert m["rl/advantage_abs_mean"] > 0  # The scripted reward varies, so the update has a signal.
    assert m["batch/rows"] == 8 and m["learner/seqs"] == 8  # 2 tasks x 2 trajectories x 2 turns.
    assert "learner/kl" not in m
  assert sorted(os.listdir(base / "checkpoints")) == ["1", "2"]
  turns = _lines(base / "rollouts" / "step_000002.jsonl")
  assert len(turns) == 8 and {t["turn"] for t in turns} == {0, 1}
  assert all(t["result"]["status"] in ("correct", "incorrect") for t in turns)
  # The rollouts sample at sampler.temperature: a task's trajectories differ.
  assert all(len(v) > 1 for v in _first_responses(_lines(base / "rollouts" / "step_000001.jsonl")).values())
  assert json.load(open(base / "config.json"))["rl"]["gamma"] == 0.4
  assert not (base / "eval_metrics.jsonl").exists()  # in_training_splits=(): no evaluation.
  # checkpoint.export_hf: workdir/hf holds the last step's parameters exactly.
  c = _config()
  hf = base / "hf"
  assert runtime.is_hf_checkpoint(str(hf)) and (hf / "tokenizer.json").is_file()
  policy = runtime.build_policy(c)
  trained = runtime.restore_params(str(base), policy)
  _assert_same_params(runtime.load_hf_params(str(hf), policy), trained)
  _assert_trained_away_from_init(c, policy, trained)


def test_a_finished_run_whose_export_is_missing_writes_it_again(base, tmp_path):
  """A rerun that finds the run done but workdir/hf missing (a crash during the export) only writes the export."""
  wd = tmp_path / "run"
  shutil.copytree(base, wd)
  shutil.rmtree(wd / "hf")
  train.run(_config(), str(wd))  # Nothing left to train.
  assert runtime.is_hf_checkpoint(str(wd / "hf"))
  assert list(metrics_lib.read_metrics(str(wd / "metrics.jsonl"))) == [1, 2]
  policy = runtime.build_policy(_config())
  _assert_same_params(runtime.load_hf_params(str(wd / "hf"), policy), runtime.load_hf_params(str(base / "hf"), policy))


def test_killed_runs_resume_to_the_uninterrupted_result(base, resumed):
  """Killed during step 2: nothing of step 2 is written (checkpoint 1 only). Killed during the closing evaluation:
  the export of step 2 is already there (the parameters of the uninterrupted run), its checkpoint is not. Rerun:
  step 2 again, the same metrics as base (evaluations change nothing of RL), the step-0 evaluation not repeated,
  the same export again."""
  wd, seen = resumed
  assert seen["mid_step"] == dict(checkpoints=["1"], steps=[1], evals=[0], hf=False)
  assert seen["in_eval"]["checkpoints"] == ["1"] and seen["in_eval"]["evals"] == [0]
  policy = runtime.build_policy(_eval_config())
  first = seen["in_eval"]["hf_params"]
  _assert_same_params(runtime.load_hf_params(str(base / "hf"), policy), first)  # Resumed = uninterrupted, bit for bit.
  got = metrics_lib.read_metrics(str(wd / "metrics.jsonl"))
  assert list(got) == [1, 2]
  for step, rec in metrics_lib.read_metrics(str(base / "metrics.jsonl")).items():
    _assert_same_steps(rec, got[step])
  assert sorted(os.listdir(wd / "checkpoints")) == ["1", "2"]
  assert [r["step"] for r in _lines(wd / "eval_metrics.jsonl")] == [0, 2]  # Step 0 is not re-evaluated.
  again = runtime.load_hf_params(str(wd / "hf"), policy)
  _assert_same_params(first, again)  # Step 2 redone from the same checkpoint: the same export, bit for bit.
  _assert_same_params(again, runtime.restore_params(str(wd), policy))


def test_in_training_evaluations_of_both_splits(resumed):
  """Before step 1 (step 0) and after the last step: per split, the summary matches its eval_rollouts."""
  wd, _ = resumed
  lines = _lines(wd / "eval_metrics.jsonl")
  for r in lines:
    for split in ("train", "test"):
      assert r[f"{split}/tasks"] == 2
      turns = _lines(wd / "eval_rollouts" / f"step_{r['step']:06d}_{split}.jsonl")
      assert len(turns) == 2 * 2 * 2  # tasks x trajectories x turns
      scores = [t["result"]["score"] for t in turns]
      correct = [t["result"]["status"] == "correct" for t in turns]
      assert r[f"{split}/kernel/score_mean"] == pytest.approx(sum(scores) / 8)
      assert r[f"{split}/kernel/correct_rate"] == pytest.approx(sum(correct) / 8)
      assert 0 <= r[f"{split}/correct_avg"] <= r[f"{split}/correct_best"] <= 1
  assert lines[0]["train/kernel/score_mean"] > 0  # The scripted reward passes about 2/3 of the kernels.
  # evaluation.temperature = -1: the evaluations sample at sampler.temperature (a task's trajectories differ).
  first = _first_responses(_lines(wd / "eval_rollouts" / "step_000000_train.jsonl"))
  assert len(first) == 2 and all(len(v) > 1 for v in first.values())


def test_total_steps_zero_evaluates_the_start_and_an_export_in_phases(base, resumed, tmp_path):
  """total_steps=0 evaluates the starting policy only (no step, checkpoint or export). The job split into phases
  (the start evaluated alone; RL without evaluations: base; base's export evaluated alone) gives the before and
  after numbers of the evaluated run."""
  wd, _ = resumed
  before, after = _lines(wd / "eval_metrics.jsonl")
  train.run(_eval_config(0), str(tmp_path / "start"))
  start = _lines(tmp_path / "start" / "eval_metrics.jsonl")
  assert [r["step"] for r in start] == [0]
  assert not os.listdir(tmp_path / "start" / "checkpoints") and not (tmp_path / "start" / "hf").exists()
  assert not list(metrics_lib.read_metrics(str(tmp_path / "start" / "metrics.jsonl")))  # No RL step.
  c = _eval_config(0)
  c.init_from = str(base / "hf")
  train.run(c, str(tmp_path / "after"))
  exported = _lines(tmp_path / "after" / "eval_metrics.jsonl")
  assert [r["step"] for r in exported] == [0]
  def responses(d, step):
    return [r["response"] for r in _lines(d / "eval_rollouts" / f"step_{step:06d}_train.jsonl")]
  # The two steps changed what the policy writes (a score mean of 8 hashed scripted rewards can coincide; texts not).
  assert responses(wd, before["step"]) != responses(wd, after["step"])
  assert responses(tmp_path / "start", 0) == responses(wd, before["step"])
  assert responses(tmp_path / "after", 0) == responses(wd, after["step"])
  _assert_same_evaluation(before, start[0])
  _assert_same_evaluation(after, exported[0])
  with pytest.raises(ValueError, match="total_steps must be >= 0"):
    train.run(_eval_config(-1), str(tmp_path / "negative"))


def test_kl_reference_is_rebuilt_on_resume_and_evaluations_leave_rollouts_alone(base, tmp_path):
  """rl.kl_beta > 0: the KL to the starting policy (here the seed's random init) is 0 at step 1's first update and
  grows; a run resumed from step 1's checkpoint rebuilds the reference and reaches the same step 2. The same run
  evaluates greedily (evaluation.temperature = 0: a task's trajectories give one first response) while its
  rollouts match base's, whose config differs in kl_beta and evaluations only; export_hf=False writes no export."""
  def config():
    c = _with_eval(_config(kl_beta=0.5), trajectories=2, turns=1, max_tasks=2)
    c.evaluation.temperature = 0.0
    c.checkpoint.export_hf = False
    return c

  full = tmp_path / "full"
  train.run(config(), str(full))
  recs = metrics_lib.read_metrics(str(full / "metrics.jsonl"))
  assert list(recs) == [1, 2]
  for m in recs.values():
    assert m["learner/updates_applied"] == 2 and m["learner/nonfinite_update"] == -1
    assert m["rl/advantage_abs_mean"] > 0 and m["batch/rows"] == 8 and m["learner/seqs"] == 8
  assert 0 < recs[1]["learner/kl"] < recs[2]["learner/kl"]
  assert sorted(os.listdir(full / "checkpoints")) == ["1", "2"] and not (full / "hf").exists()
  assert config().sampler.temperature > 0
  greedy = _first_responses(_lines(full / "eval_rollouts" / "step_000000_train.jsonl"))
  assert len(greedy) == 2 and all(len(v) == 1 for v in greedy.values())
  key = lambda rows: [(r["task_id"], r["traj"], r["turn"], r["response"]) for r in rows]
  assert key(_lines(full / "rollouts" / "step_000001.jsonl")) == key(_lines(base / "rollouts" / "step_000001.jsonl"))

  again = tmp_path / "again"  # What a run killed during step 2 leaves: step 1's checkpoint.
  shutil.copytree(full / "checkpoints" / "1", again / "checkpoints" / "1")
  train.run(config(), str(again))
  resumed = metrics_lib.read_metrics(str(again / "metrics.jsonl"))
  assert list(resumed) == [2]
  _assert_same_steps(recs[2], resumed[2], COMPARED + ("learner/kl",))


@pytest.fixture
def stand_in_step(base, monkeypatch):
  """train.rl_step replaced by one that leaves the state as it is and returns base's step-1 metrics (and advances
  a fake clock by `step_s` if given). Returns the clock dict {t, step_s}."""
  template = {k: v for k, v in metrics_lib.read_metrics(str(base / "metrics.jsonl"))[1].items() if k != "step"}
  clock = {"t": 0.0, "step_s": 0.0}

  def step(step, state, **kw):
    del step, kw
    clock["t"] += clock["step_s"]
    return state, dict(template)

  monkeypatch.setattr(train, "rl_step", step)
  return clock


def test_in_training_first_false_skips_only_the_step0_evaluation(tmp_path, stand_in_step):
  """evaluation.in_training_first=False: no step-0 evaluation; the periodic and closing ones still run."""
  c = _with_eval(_config(total_steps=3), trajectories=2, turns=1, max_tasks=1)
  c.evaluation.in_training_every = 2
  c.evaluation.in_training_first = False
  train.run(c, str(tmp_path))
  assert [r["step"] for r in _lines(tmp_path / "eval_metrics.jsonl")] == [2, 3]
  assert sorted(os.listdir(tmp_path / "eval_rollouts")) == ["step_000002_train.jsonl", "step_000003_train.jsonl"]


def test_time_budget_stops_early_then_evaluates_and_checkpoints(tmp_path, monkeypatch, stand_in_step):
  """time_budget_s: with a fake clock (a step takes 100 s, an evaluation 50 s) and 330 s, steps 1-2 run, step 3
  would not leave room for the closing evaluation, so the job evaluates and checkpoints step 2 and stops; a rerun
  without a budget continues to total_steps."""
  clock = stand_in_step
  clock["step_s"] = 100.0
  monkeypatch.setattr(train, "_now", lambda: clock["t"])
  real_eval = train.InTrainingEval.__call__

  def slow_eval(self, step, params, reward):
    clock["t"] += 50.0
    return real_eval(self, step, params, reward)

  monkeypatch.setattr(train.InTrainingEval, "__call__", slow_eval)

  def config(budget):
    c = _with_eval(_config(total_steps=5), trajectories=2, turns=1, max_tasks=1)
    c.time_budget_s = budget
    c.checkpoint.every_steps = 4  # Step 2 is saved only because the budget stops the run there.
    return c

  wd = tmp_path / "run"
  train.run(config(330.0), str(wd))
  assert list(metrics_lib.read_metrics(str(wd / "metrics.jsonl"))) == [1, 2]
  assert [r["step"] for r in _lines(wd / "eval_metrics.jsonl")] == [0, 2]
  assert clock["t"] == 50 + 100 + 100 + 50  # Evaluation, two steps, the closing evaluation.
  assert sorted(os.listdir(wd / "checkpoints")) == ["2"]

  train.run(config(0.0), str(wd))  # No budget: resumes at step 3 and finishes the run.
  assert list(metrics_lib.read_metrics(str(wd / "metrics.jsonl"))) == [1, 2, 3, 4, 5]
  assert [r["step"] for r in _lines(wd / "eval_metrics.jsonl")] == [0, 2, 5]
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
  assert [r["step"] for r in _lines(wd / "eval_metrics.jsonl")] == [2]
  assert clock["t"] == 100 + 100 + 50
  skip.time_budget_eval_s = -1.0
  with pytest.raises(ValueError, match="time_budget_eval_s"):
    train.run(skip, str(tmp_path / "bad2"))


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


def test_evaluation_mode_on_an_exported_policy(base, tmp_path):
  """mode=evaluate end to end on CPU: the RL run's HF export, scripted reward, reports written."""
  from configs import eval as eval_config  # pylint: disable=g-import-not-at-top
  c = eval_config.get_config("runlocal,beam")
  c.evaluator.backend = "scripted"
  c.sampler.max_new_tokens = 8
  c.mesh.axes = (("fsdp", -1), ("tensor", 2))
  c.evaluation.checkpoint = str(base / "hf")
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
