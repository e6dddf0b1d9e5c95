"""The task world (kevin_jax/data/taskgen): determinism per seed, disjoint splits by the documented rules,
content-addressed files that every process resolves to, task-module conventions, prompts within budget, and the
config's named splits (runtime.load_tasks). No torch, no GPU: pure text.
"""

import dataclasses
import multiprocessing
import os
import re

import pytest

from configs import multiturn
from kevin_jax import runtime
from kevin_jax.data.taskgen import spec as spec_lib
from kevin_jax.data.taskgen import world
from kevin_jax.kernels import tasks
from kevin_jax.rl import prompts

SMALL = world.WorldConfig(seed=3, train=6, heldout_compositions=3, heldout_styles=2)


@pytest.fixture(scope="module")
def default_world():
  return world.build(world.WorldConfig())


def _fresh(config):
  world.build.cache_clear()
  return world.build(config)


def test_same_seed_same_bytes_other_seed_other_world(tmp_path):
  a = _fresh(SMALL)
  b = _fresh(SMALL)
  assert a is not b and [t.id for t in a.tasks] == [t.id for t in b.tasks]
  assert [t.source for t in a.tasks] == [t.source for t in b.tasks]
  assert [[c.text for c in t.candidates()] for t in a.tasks] == [[c.text for c in t.candidates()] for t in b.tasks]
  d1 = world.materialize(SMALL, root=str(tmp_path / "r1"))
  d2 = world.materialize(SMALL, root=str(tmp_path / "r2"))
  assert os.path.basename(d1) == os.path.basename(d2)
  files = sorted(os.path.relpath(os.path.join(r, f), d1) for r, _, fs in os.walk(d1) for f in fs)
  assert len(files) == len(a.tasks) + 1  # The modules and world.json.
  for f in files:
    with open(os.path.join(d1, f), "rb") as x, open(os.path.join(d2, f), "rb") as y:
      assert x.read() == y.read(), f
  other = _fresh(dataclasses.replace(SMALL, seed=4))
  assert not {t.id for t in other.tasks} & {t.id for t in a.tasks}
  assert world.materialize(dataclasses.replace(SMALL, seed=4), root=str(tmp_path / "r1")) != d1


def test_larger_quotas_extend_the_stream():
  """Draw k of a family depends on (seed, family, k) only: a bigger world holds the smaller one's tasks."""
  small = _fresh(SMALL)
  big = _fresh(dataclasses.replace(SMALL, train=9, heldout_compositions=4, heldout_styles=3))
  big_ids = {t.id: t.split for t in big.tasks}
  assert all(big_ids.get(t.id) == t.split for t in small.tasks)


def _materialize_in_child(args):
  config, root = args
  return world.materialize(config, root=root)


def test_concurrent_materialisation_writes_one_directory(tmp_path):
  root = str(tmp_path / "shared")
  with multiprocessing.get_context("spawn").Pool(2) as pool:
    dirs = pool.map(_materialize_in_child, [(SMALL, root)] * 2)
  assert dirs[0] == dirs[1]
  assert [d for d in os.listdir(root)] == [os.path.basename(dirs[0])]  # No temporary directory left behind.
  specs = tasks.discover(dirs[0])
  assert {s.id for s in specs} == {t.id for t in _fresh(SMALL).tasks} | {s.id for s in tasks.discover("bundled")}


def test_splits_are_disjoint_and_follow_the_rules(default_world):
  w = default_world
  ids = [t.id for t in w.tasks]
  assert len(ids) == len(set(ids))
  bundled = {s.id for s in tasks.discover("bundled")}
  assert not bundled & set(ids)
  for family in world.FAMILIES:
    for split in world.GENERATED_SPLITS:
      assert sum(t.family == family and t.split == split for t in w.tasks) == w.config.quota(split)
  seen_ops, seen_pairs, seen_dims = set(), set(), set()
  for t in w.split("train") + w.split("heldout_styles"):
    assert not any(spec_lib.heldout_pair(a, b) for a, b in t.spec.pairs), t.id
    assert not any(spec_lib.heldout_dim(v) for _, v in t.spec.dims), t.id
    if t.split == "train":
      seen_ops |= set(t.spec.ops)
      seen_pairs |= set(t.spec.pairs)
      seen_dims |= {v for _, v in t.spec.dims}
  for t in w.split("heldout_compositions"):
    held = [p for p in t.spec.pairs if spec_lib.heldout_pair(*p)]
    assert held and not set(held) & seen_pairs, t.id  # Never seen together in training ...
    assert set(t.spec.ops) <= seen_ops, t.id  # ... though every op is seen.
    assert any(spec_lib.heldout_dim(v) for _, v in t.spec.dims) and not {v for _, v in t.spec.dims} <= seen_dims
  train_signatures = {t.spec.signature for t in w.split("train")}
  for t in w.split("heldout_styles"):
    assert world.classify(t.spec) == "heldout_styles" and t.id.split("/")[0] == t.family
    assert t.spec.signature not in train_signatures and set(t.spec.ops) <= seen_ops, t.id
  assert not any(s in t.id for t in w.tasks for s in ("train", "heldout", "style"))  # Ids do not name the split.


def test_task_modules_follow_the_conventions(default_world):
  """Short fp32 KernelBench modules; sizes not all multiples of 32; inputs within 2.75 GiB; the reduced twin is
  the same module with other size constants."""
  for t in default_world.tasks:
    src = t.source
    for name in ("class Model(nn.Module):", "def get_inputs():", "def get_init_inputs():"):
      assert name in src, t.id
    assert len(src) < 2000 and "float16" not in src and "cuda" not in src, t.id
    dims = dict(t.spec.dims)
    assert any(v % 32 for v in dims.values() if v > 1), t.id
    assert spec_lib.EAGER_BAND_MS[0] <= t.spec.model_ms <= spec_lib.EAGER_BAND_MS[1], t.id
    twin = src
    for k, v in t.spec.small:
      twin = re.sub(rf"^{k} = {dims[k]}$", f"{k} = {v}", twin, flags=re.M)
    assert twin == t.reduced_source, t.id


def test_input_sizes_stay_within_the_suite_budget(default_world):
  sizes = {"elementwise": lambda d: d["B"] * d["C"] * d["L"], "pool": lambda d: d["B"] * d["C"] * (
      d["H"] * d["W"] if "H" in d else d["L"])}
  for t in default_world.tasks:
    d = dict(t.spec.dims)
    if t.family == "matmul":
      n = d.get("BT", 1) * (d["M"] * d["K"] + d["K"] * d.get("N", 1)) + (
          d["M"] * d["N"] if "residual" in t.spec.ops else 0)
    elif t.family in sizes:
      n = sizes[t.family](d)
    else:
      n = d.get("B", 1) * d["N"] * d.get("M", 1) * d.get("R", 1)
    assert 4 * n <= spec_lib.MAX_INPUT_BYTES, (t.id, 4 * n)


def test_every_first_turn_prompt_fits_the_context_budget(default_world):
  from kevin_jax.policy.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  tok = load_tokenizer(None)
  budget = multiturn.get_config().rollout.max_context_tokens
  longest = max(len(tok.encode_chat(prompts.build_messages(t.source), add_generation_prompt=True))
                for t in default_world.tasks)
  assert longest <= budget, longest


def _small_world_config(split_preset: str = "world"):
  c = multiturn.get_config(split_preset)
  c.tasks.world_seed, c.tasks.world_train = SMALL.seed, SMALL.train
  c.tasks.world_heldout_compositions, c.tasks.world_heldout_styles = SMALL.heldout_compositions, SMALL.heldout_styles
  return c


def test_runtime_names_the_splits(tmp_path, monkeypatch):
  monkeypatch.setenv("KEVIN_JAX_TASKGEN_DIR", str(tmp_path))
  c = _small_world_config()
  got = {s: [sp.id for sp in runtime.load_tasks(c, s)[0]] for s in runtime.WORLD_SPLITS}
  w = _fresh(SMALL)
  for s in world.GENERATED_SPLITS:
    assert got[s] == [t.id for t in w.split(s)]
  assert got["suite"] == [s.id for s in tasks.discover("bundled")]
  assert got["test"] == got["heldout_compositions"] + got["suite"]
  assert sorted(got["all"]) == sorted(got["train"] + got["heldout_compositions"] + got["heldout_styles"] + got["suite"])
  assert runtime.task_source(c).startswith(str(tmp_path))
  specs, sources = runtime.load_tasks(c, "train")
  assert sources[specs[0].id] == w.split("train")[0].source
  with pytest.raises(SystemExit, match="known: train, heldout_compositions"):
    runtime.load_tasks(c, "validation")
  bundled = multiturn.get_config()
  with pytest.raises(SystemExit, match="named splits need a task world"):
    runtime.load_tasks(bundled, "suite")
  assert len(runtime.load_tasks(bundled, "all")[0]) == 40  # Other sources keep train / test / all.


def test_generated_sources_resolve(tmp_path, monkeypatch):
  monkeypatch.setenv("KEVIN_JAX_TASKGEN_DIR", str(tmp_path))
  assert tasks.is_generated("generated") and tasks.is_generated("generated:7") and not tasks.is_generated("gen")
  assert world.WorldConfig.parse("generated:7").seed == 7
  with pytest.raises(ValueError, match="not a generated task source"):
    world.WorldConfig.parse("generated:x")
  d = world.materialize(SMALL)
  assert world.from_source(d).config == SMALL and world.from_source(tasks.BUNDLED_DIR) is None
  splits = tasks.world_splits(d)
  assert set(splits) == set(world.SPLITS) and tasks.world_splits("bundled") is None
  assert [s.id for s in tasks.discover(d, levels=[1])] == [s.id for v in splits.values() for s in v if s.level == 1]


def test_the_generator_is_pure_python():
  """Both worlds list tasks and build prompts from it: it imports neither torch nor JAX."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = ("import sys; import kevin_jax.data.taskgen.world, kevin_jax.data.export_corpus; "
          "print(sorted(m for m in ('torch', 'jax', 'cupy') if m in sys.modules))")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_the_evaluator_gets_the_materialised_world(tmp_path, monkeypatch):
  """train.py / evaluate.py hand config.tasks.source to make_reward: a generated source reaches the evaluator as
  the world's directory (the same files every process reads)."""
  from kevin_jax.rl import reward  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("KEVIN_JAX_TASKGEN_DIR", str(tmp_path))
  seen = {}
  monkeypatch.setattr(reward, "EvaluatorReward", lambda cfg, source: seen.setdefault("source", source))
  c = _small_world_config()
  runtime.make_reward(c, c.tasks.source)
  assert seen["source"] == runtime.task_source(c) and os.path.isfile(os.path.join(seen["source"], "world.json"))
  seen.clear()
  runtime.make_reward(multiturn.get_config(), "bundled")
  assert seen["source"] == "bundled"


def test_the_novelty_corpus_is_what_the_warm_start_trains_on(tmp_path, monkeypatch):
  monkeypatch.setenv("KEVIN_JAX_TASKGEN_DIR", str(tmp_path))
  c = _small_world_config()
  index = runtime.novelty_index(c)
  w = _fresh(SMALL)
  text = lambda t, name: next(x.text for x in t.candidates() if x.name == name)
  assert all(index.is_copy(text(t, "optimized")) for t in w.split("train"))
  assert all(index.is_copy(text(t, "naive")) and not index.is_copy(text(t, "optimized"))
             for t in w.split("heldout_styles"))
  assert not any(index.is_copy(text(t, "naive")) for t in w.split("heldout_compositions"))  # Never trained on.
  c.evaluation.novelty_ngram = 0
  assert runtime.novelty_index(c) is None
  c.evaluation.novelty_ngram, c.sft.corpus = 4, str(tmp_path / "missing.jsonl")
  assert runtime.novelty_index(c) is None  # The job runs on, without the metric.
