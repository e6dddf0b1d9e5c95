"""configs/kernelbench.py's job settings: the task-folder check, the prompt budget from the tasks, the warm-start
corpus from the bundled suite and the generated world."""

import pytest

from configs import eval as eval_config
from configs import kernelbench
from kevin_jax import runtime
from kevin_jax.kernels import tasks as tasks_lib
from kevin_jax.policy.tokenizer import load_tokenizer
from kevin_jax.rl import prompts
from kevin_jax.rl import sft_data
from tests.test_kernelbench_runlocal import TASKS, TEST, TRAIN, make_tree


def _config(kb: str, arg: str = "runlocal"):
  c = kernelbench.get_config(arg)
  c.tasks.source, c.tasks.train_ids, c.tasks.test_ids = kb, TRAIN, TEST
  return c


def test_defaults_need_a_source_and_keep_the_paper_split():
  c = kernelbench.get_config()
  assert c.tasks.source == "" and c.tasks.layout == "kernelbench"
  assert len(c.tasks.train_ids) == 180 and len(c.tasks.test_ids) == 20
  assert c.rollout.context_from_tasks and c.sft.corpus_sources == ("bundled", "generated")
  e = eval_config.get_config("kernelbench")
  assert e.mode == "evaluate" and e.evaluation.standard_report and e.evaluator.compile_baseline
  assert e.evaluation.split == "all" and e.tasks.test_ids == c.tasks.test_ids
  assert not eval_config.get_config().evaluator.compile_baseline  # Off by default.


def test_kernelbench_tree_check_names_what_it_looked_for(tmp_path):
  with pytest.raises(FileNotFoundError, match="--config.tasks.source=DIR"):
    tasks_lib.check_kernelbench_tree("", (1, 2))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    tasks_lib.check_kernelbench_tree(str(tmp_path / "nope"), (1, 2))
  kb = make_tree(tmp_path)
  assert tasks_lib.check_kernelbench_tree(kb, (1, 2)) == kb
  with pytest.raises(FileNotFoundError, match=r"level3/"):
    tasks_lib.check_kernelbench_tree(kb, (1, 3))
  with pytest.raises(SystemExit, match="not a KernelBench tree"):
    runtime.load_tasks(_config(str(tmp_path)), "train")
  specs, _ = runtime.load_tasks(_config(kb), "train")
  assert [s.id for s in specs] == list(TRAIN)


def _longest(sources):
  tok = load_tokenizer(None)
  return max(len(tok.encode_chat(prompts.build_messages(s), add_generation_prompt=True)) for s in sources.values())


def test_prompt_budget_follows_the_longest_task_prompt(tmp_path):
  c = _config(make_tree(tmp_path))
  _, sources = runtime.load_tasks(c, "all")
  longest = _longest(sources)
  fitted = runtime.fit_context_to_tasks(c, sources)
  assert fitted.rollout.max_context_tokens == -(-longest // 256) * 256 > longest - 256
  assert c.rollout.max_context_tokens == 0  # The given config is left as it was.
  c.rollout.max_context_tokens = 4096  # A larger configured budget is a floor ...
  assert runtime.fit_context_to_tasks(c, sources).rollout.max_context_tokens == 4096
  c.sampler.prompt_buckets = (1024, 4096)  # ... and with a bucket that holds it, nothing changes.
  assert runtime.fit_context_to_tasks(c, sources) is c
  c.rollout.max_context_tokens = 512
  c.sampler.prompt_buckets = (256, 512)
  fitted = runtime.fit_context_to_tasks(c, sources)
  assert fitted.sampler.prompt_buckets == (256, 512, fitted.rollout.max_context_tokens)
  c.rollout.context_from_tasks = False
  assert runtime.fit_context_to_tasks(c, sources) is c


def test_a_task_that_cannot_fit_the_model_context_is_named(tmp_path):
  c = _config(make_tree(tmp_path))
  _, sources = runtime.load_tasks(c, "all")
  context = runtime.model_config(c, load_tokenizer(None)).max_position_embeddings
  lengths = sorted(_longest({t: s}) for t, s in sources.items())
  c.sampler.max_new_tokens = context - lengths[-2]  # Room for all but the longest prompt.
  longest_id = max(sources, key=lambda t: _longest({t: sources[t]}))
  with pytest.raises(SystemExit, match=f"1 task prompts cannot fit.*{longest_id}"):
    runtime.fit_context_to_tasks(c, sources)


def test_warm_start_corpus_comes_from_the_bundled_suite_and_the_world(tmp_path):
  c = _config(make_tree(tmp_path))
  (bundled, bundled_ids), (world, world_ids) = sft_data.corpus_tasks(c)
  assert bundled == "bundled" and len(bundled_ids) == len(tasks_lib.discover("bundled"))
  splits = tasks_lib.world_splits(world)
  assert world_ids == [s.id for name in ("train", "heldout_styles") for s in splits[name]]
  assert not set(TASKS) & set(bundled_ids + world_ids)
  c.sft.corpus_sources = ()  # The job's own source: KernelBench's tasks, which have no solutions.
  [(source, ids)] = sft_data.corpus_tasks(c)
  assert source == c.tasks.source and sorted(ids) == sorted(TASKS)
  assert sft_data.bundled_corpus(ids, source=source) == []
