"""configs/*.py: every field declared and commented, presets, locked overrides, CLI typo errors."""

import ast
import importlib
import importlib.util
import os
import subprocess
import sys

import pytest

from configs import multiturn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _leaves(cfg, prefix=""):
  for k, v in cfg.items():
    if hasattr(v, "items"):
      yield from _leaves(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


def test_paper_defaults():
  c = multiturn.get_config("paper")
  assert (c.rollout.tasks_per_step, c.rollout.trajectories, c.rollout.turns) == (8, 16, 4)
  assert c.total_steps == 40 and c.policy.preset == "qwq-32b" and c.rl.scan_layers and c.policy.remat == "full"
  assert c.rl.gamma == 0.4 and c.rl.return_mode == "sum"
  assert (c.rl.epsilon_low, c.rl.epsilon_high) == (0.2, 0.28)
  assert c.rl.kl_beta == 0.0 and c.rl.loss_agg == "constant" and c.rl.updates_per_batch == 2
  assert c.optimizer.learning_rate == 2e-6 and c.optimizer.warmup_ratio == 0.03
  assert c.optimizer.max_grad_norm == 0.05
  assert c.sampler.temperature == 0.9
  assert c.evaluator.correct_weight == 0.3


def test_embedded_default_sizes():
  """The default job: the paper's per-task group (16 x 4) on 2 tasks per step, sized for one GPU."""
  c = multiturn.get_config()
  assert (c.rollout.tasks_per_step, c.rollout.trajectories, c.rollout.turns, c.total_steps) == (2, 16, 4, 30)
  assert c.policy.preset == "small" and c.optimizer.learning_rate == 1e-5 and not c.rl.scan_layers
  assert c.sampler.temperature == 0.6  # The paper's 0.9 derails the memorising small policy (experiments/warm_start).
  # The mixture warm start: every corpus kind, plain later-turn reasoning.
  from kevin_jax.data import export_corpus  # pylint: disable=g-import-not-at-top
  assert tuple(c.sft.corpus_kinds) == export_corpus.ALL_KINDS and c.sft.corpus_reasoning == "plain"
  # The warm start trains on the sequences RL samples: prompts fitted within RL's prompt budget, and room for RL's
  # whole response budget.
  assert c.sft.fit_prompts and c.rollout.max_context_tokens == 3072
  assert c.sft.max_seq_len == c.rollout.max_context_tokens + c.sampler.max_new_tokens


def test_sections_present():
  c = multiturn.get_config()
  for section in ("policy", "sampler", "rollout", "rl", "optimizer", "evaluator", "tasks", "mesh",
                  "checkpoint", "logging"):
    assert section in c, section


CONFIG_FILES = sorted(f for f in os.listdir(os.path.join(ROOT, "configs"))
                      if f.endswith(".py") and not f.startswith("_"))


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_every_field_assignment_has_a_comment(name):
  """Each `c.x.y = v` in get_config's body carries a trailing comment (units / source).

  Preset branches (inside `if`) only restate declared fields with other values and are exempt.
  """
  src = open(os.path.join(ROOT, "configs", name)).read().splitlines()
  tree = ast.parse("\n".join(src))
  fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config")
  missing = []
  for node in fn.body:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
      if isinstance(node.value, ast.Call):  # Section constructors.
        continue
      if not any("#" in src[i - 1] for i in range(node.lineno, node.end_lineno + 1)):
        missing.append(src[node.lineno - 1].strip())
  assert not missing, missing


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_other_configs_only_change_values(name):
  """Every config declares exactly multiturn.py's fields, so one locked schema serves all jobs."""
  mod = importlib.import_module(f"configs.{name[:-3]}")
  base = sorted(k for k, _ in _leaves(multiturn.get_config()))
  for arg in ("", "runlocal"):
    assert sorted(k for k, _ in _leaves(mod.get_config(arg))) == base


def test_presets_change_what_they_promise():
  base, local, paper = (multiturn.get_config(a) for a in ("", "runlocal", "paper"))
  assert local.policy.preset == "tiny" and local.rollout.turns == 2
  assert paper.policy.preset == "qwq-32b" and paper.sampler.max_new_tokens == 16384
  # Presets only change values, never the set of fields.
  assert sorted(k for k, _ in _leaves(base)) == sorted(k for k, _ in _leaves(local))
  assert sorted(k for k, _ in _leaves(base)) == sorted(k for k, _ in _leaves(paper))
  with pytest.raises(ValueError, match="unknown preset 'nope'"):
    multiturn.get_config("nope")


def test_world_preset_and_its_smoke_mode():
  """world: the generated world's job within 900 s, evaluated on its four splits; with runlocal (in either order) a
  small world, one task per split, no time budget; the bundled default untouched."""
  splits = ("train", "heldout_compositions", "heldout_styles", "suite")
  base, world = multiturn.get_config(""), multiturn.get_config("world")
  assert world.tasks.source == "generated" and base.tasks.source == "bundled"
  assert world.evaluation.in_training_splits == splits and world.evaluation.in_training_max_tasks == 20
  assert world.time_budget_s == 900.0 and world.sft.steps == 1500 and base.time_budget_s == 0.0
  a, b = multiturn.get_config("world,runlocal"), multiturn.get_config("runlocal,world")
  assert a.to_dict() == b.to_dict()
  assert a.policy.preset == "tiny" and a.tasks.world_train == 4 and a.total_steps == 1 and a.time_budget_s == 0.0
  assert a.evaluation.in_training_splits == splits and a.evaluation.in_training_max_tasks == 1
  assert sorted(k for k, _ in _leaves(a)) == sorted(k for k, _ in _leaves(base))


def _main(*args):
  return subprocess.run([sys.executable, "-m", "kevin_jax.main", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)


def test_cli_typo_names_the_field(tmp_path):
  r = _main("--config=configs/multiturn.py", f"--workdir={tmp_path}/x", "--config.no_such_field=1")
  assert r.returncode != 0
  assert "no_such_field" in r.stderr
  r = _main("--config=configs/multiturn.py", f"--workdir={tmp_path}/x", "--config.rl.gama=0.5")
  assert r.returncode != 0
  assert "gama" in r.stderr and "gamma" in r.stderr
  assert not os.path.exists(tmp_path / "x")  # Nothing half-written.


def test_missing_tensorboard_fails_at_start(monkeypatch):
  """A job that logs to TensorBoard without tensorboardX installed stops before any work, naming the way out."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from kevin_jax import main  # pylint: disable=g-import-not-at-top
  config = multiturn.get_config()
  main.check_environment(config)  # Installed here (requirements.txt): passes.
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboardX" else real(name, *a))
  with pytest.raises(app.UsageError, match="logging.tensorboard=False"):
    main.check_environment(config)
  config.logging.tensorboard = False
  main.check_environment(config)
