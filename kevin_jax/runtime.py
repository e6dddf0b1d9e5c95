"""Builds what every job needs from the config: tokenizer, model config, mesh, learner, sampler, tasks, reward.

Shared by train.py (RL), sft.py (warm start) and evaluate.py, so all three read the config the same way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import jax
from absl import logging
from flax import nnx

from kevin_jax import checkpoint as ckpt_lib
from kevin_jax import cuda_driver
from kevin_jax import sharding
from kevin_jax import task_hygiene
from kevin_jax.kernels import tasks as tasks_lib
from kevin_jax.policy.config import ModelConfig, get_preset, resolve_attention_impl
from kevin_jax.policy.sampler import Sampler, SamplerConfig
from kevin_jax.policy.tokenizer import Tokenizer, load_tokenizer
from kevin_jax.rl import prompts
from kevin_jax.rl.learner import Learner, TrainState

NO_GPU_HELP = (
    "Kernel evaluation needs a CUDA GPU and none answered (checked through libcuda). Without a GPU you can run: "
    "the tests (python -m pytest -q); compile-only checks of a candidate (python -m kevin_jax.kernels.evaluate "
    "--task TASK.py --candidate FILE --compile-only); the learner's memory check (python -m kevin_jax.rl.memcheck "
    "--help); or a CPU dry run of this loop with a scripted reward (--config.evaluator.backend=scripted).")


def require_gpu_for_evaluator(config) -> None:
  if config.evaluator.backend == "cuda" and cuda_driver.device_count() == 0:
    raise SystemExit(f"error: mode={config.mode} with evaluator.backend=cuda stopped before doing anything. "
                     + NO_GPU_HELP)
  if config.evaluator.backend not in ("cuda", "scripted"):
    raise SystemExit(f"error: evaluator.backend={config.evaluator.backend!r}; expected 'cuda' or 'scripted'")


def set_xla_gpu_flags(triton_gemm: bool) -> None:
  """XLA GPU flags from the config; call before JAX's backend starts (flags the user set in XLA_FLAGS win).

  triton_gemm=False routes XLA's matmuls to cuBLAS instead of its Triton GEMM fusions (an experiment knob; slower
  0.5B decode at batch 64, so off by default).
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if not triton_gemm and "xla_gpu_enable_triton_gemm" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_gpu_enable_triton_gemm=false").strip()


def enable_compilation_cache(config) -> str:
  """Turns on JAX's persistent compilation cache (config.compilation_cache_dir; the environment's
  JAX_COMPILATION_CACHE_DIR wins) with config.compilation_cache_min_compile_s as the smallest compile time written;
  call before the first jit. Returns the directory in use ('' = off)."""
  path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or config.compilation_cache_dir
  if not path:
    return ""
  path = os.path.abspath(os.path.expanduser(path))
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(config.compilation_cache_min_compile_s))
  return path


def place_jax_beside_evaluator(config) -> None:
  """Keeps JAX and the evaluator workers from fighting over GPU memory; call before JAX's backend starts.

  Shared GPUs (evaluator.gpus == ''): JAX's pool is capped at evaluator.jax_memory_fraction. Dedicated GPUs
  (evaluator.gpus = '6,7'): JAX is told not to use them.
  """
  if config.evaluator.backend != "cuda":
    return
  if not config.evaluator.gpus:
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", str(config.evaluator.jax_memory_fraction))
    return
  dedicated = {int(g) for g in str(config.evaluator.gpus).split(",") if g.strip()}
  rest = [i for i in range(cuda_driver.device_count()) if i not in dedicated]
  if not rest:
    raise SystemExit(f"error: evaluator.gpus={config.evaluator.gpus!r} leaves no GPU for JAX")
  jax.config.update("jax_cuda_visible_devices", ",".join(map(str, rest)))


@dataclasses.dataclass
class Policy:
  """The policy side of a job: tokenizer, model config, mesh, learner (owns shardings/step) and sampler."""
  tokenizer: Tokenizer
  model_cfg: ModelConfig
  mesh: Any
  learner: Learner
  sampler: Sampler

  def encode_chat(self, messages) -> list[int]:
    return self.tokenizer.encode_chat(messages, add_generation_prompt=True)


def model_config(config, tokenizer: Tokenizer) -> ModelConfig:
  """The policy's ModelConfig: from the HF checkpoint's config.json, else the named preset."""
  p = config.policy
  runtime = dict(param_dtype=p.param_dtype, compute_dtype=p.compute_dtype, remat=p.remat,
                 attention_impl=resolve_attention_impl(p.attention_impl, p.compute_dtype))
  if p.checkpoint:
    return ModelConfig.from_hf_config(p.checkpoint, **runtime)
  cfg = get_preset(p.preset, **runtime)
  if p.preset in ("tiny", "small") and cfg.vocab_size != tokenizer.vocab_size:
    cfg = cfg.replace(vocab_size=tokenizer.vocab_size)  # The embedded presets follow the bundled tokenizer.
  if cfg.vocab_size < tokenizer.vocab_size:
    raise ValueError(f"model preset {p.preset!r} has vocab {cfg.vocab_size} < tokenizer's {tokenizer.vocab_size}")
  return cfg


def build_policy(config) -> Policy:
  tokenizer = load_tokenizer(config.policy.tokenizer or config.policy.checkpoint or None)
  cfg = model_config(config, tokenizer)
  mesh = sharding.make_mesh(config.mesh.axes)
  learner = Learner.from_config(config, mesh, cfg)
  sampler = Sampler(cfg, tokenizer, SamplerConfig.from_config(config.sampler), mesh=mesh,
                    batch_axes=sharding.batch_axes(mesh))
  logging.info("policy: %s, %.1fM parameters, mesh %s", config.policy.checkpoint or config.policy.preset,
               cfg.num_params() / 1e6, dict(mesh.shape))
  return Policy(tokenizer, cfg, mesh, learner, sampler)


def is_hf_checkpoint(path: str) -> bool:
  return os.path.isfile(os.path.join(path, "config.json")) and any(
      os.path.isfile(os.path.join(path, f)) for f in ("model.safetensors", "model.safetensors.index.json"))


def is_orbax_run(path: str) -> bool:
  """A run directory (with checkpoints/) or a checkpoints directory itself (with <step>/ entries)."""
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return True
  return os.path.isdir(path) and any(n.isdigit() for n in os.listdir(path))


def load_params(src: str, policy: Policy):
  """Parameters from an HF checkpoint directory or an Orbax run directory, placed in the learner's shardings."""
  if not os.path.isdir(src):
    raise SystemExit(f"error: checkpoint directory {src!r} does not exist")
  if is_hf_checkpoint(src):
    return load_hf_params(src, policy)
  if is_orbax_run(src):
    return restore_params(src, policy)
  raise SystemExit(f"error: {src!r} is neither a Hugging Face checkpoint (config.json + safetensors) nor an "
                   "Orbax run directory (checkpoints/<step>/)")


def initial_state(config, policy: Policy, key: jax.Array, src: str | None = None) -> TrainState:
  """Fresh training state from `src` (default config.init_from / policy.checkpoint; an Orbax run or an HF
  directory) or random init. The optimizer state is always fresh; only parameters come from the source.
  """
  src = start_source(config, src)
  if not src:
    return policy.learner.init_state(key)
  return policy.learner.state_from_params(load_params(src, policy))


def initial_params(config, policy: Policy, key: jax.Array, src: str | None = None):
  """The parameters `initial_state` starts from (the same source and key); from a source, no optimizer state."""
  src = start_source(config, src)
  return load_params(src, policy) if src else policy.learner.init_state(key).params


def start_source(config, src: str | None = None) -> str:
  """`src`, else config.init_from, else config.policy.checkpoint ('' = random init)."""
  return src or config.init_from or config.policy.checkpoint


def export_hf(policy: Policy, params, directory: str) -> None:
  """The policy as a Hugging Face directory (config.json, safetensors, tokenizer files), written atomically."""
  from kevin_jax.policy.weights import save_pretrained  # pylint: disable=g-import-not-at-top
  from kevin_jax.rl import sft_data  # pylint: disable=g-import-not-at-top
  tmp = directory + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  tok = policy.tokenizer
  eot = sft_data.end_of_turn_id(tok)
  save_pretrained(nnx.merge(policy.learner.graphdef, params), tmp,
                  config_extra={"eos_token_id": eot, "pad_token_id": tok.pad_id})
  tok.hf.save_pretrained(tmp)
  with open(os.path.join(tmp, "generation_config.json"), "w", encoding="utf-8") as f:
    json.dump({"eos_token_id": list(tok.eos_ids), "pad_token_id": tok.pad_id}, f, indent=1)
  shutil.rmtree(directory, ignore_errors=True)
  os.replace(tmp, directory)
  logging.info("exported the policy to %s", directory)


def load_hf_params(path: str, policy: Policy):
  from kevin_jax.policy.weights import load_pretrained  # pylint: disable=g-import-not-at-top
  cfg = policy.model_cfg
  theirs = ModelConfig.from_hf_config(path, param_dtype=cfg.param_dtype, compute_dtype=cfg.compute_dtype,
                                      remat=cfg.remat, attention_impl=cfg.attention_impl)
  if theirs != cfg:
    diff = {f.name: (getattr(theirs, f.name), getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
            if getattr(theirs, f.name) != getattr(cfg, f.name)}
    raise SystemExit(f"error: checkpoint {path} does not match the policy's model (checkpoint vs policy): {diff}")
  model = load_pretrained(path, dtype=cfg.param_dtype, shardings=policy.learner.param_shardings,
                          compute_dtype=cfg.compute_dtype, remat=cfg.remat, attention_impl=cfg.attention_impl)
  return nnx.state(model, nnx.Param)


def restore_params(run_dir: str, policy: Policy):
  """Parameters of the latest checkpoint of another run (its whole state must match this learner's layout)."""
  directory = os.path.join(run_dir, "checkpoints") if os.path.isdir(os.path.join(run_dir, "checkpoints")) else run_dir
  ckpt = ckpt_lib.Checkpointer(directory)
  try:
    restored = ckpt.restore(policy.learner.abstract_state)
  except ValueError as e:
    raise SystemExit(f"error: the checkpoint in {directory} does not match this model/optimizer: {e}") from e
  finally:
    ckpt.close()
  logging.info("initialised parameters from %s step %d", directory, restored.step)
  return restored.state.params


WORLD_SPLITS = ("train", "heldout_compositions", "heldout_styles", "suite", "test", "all")


def task_source(config) -> str:
  """config.tasks.source, with 'generated' (or 'generated:SEED') materialised from tasks.world_* into its
  content-addressed directory: the path every process (learner, evaluator workers) reads the same files from."""
  t = config.tasks
  if not tasks_lib.is_generated(t.source):
    return t.source
  from kevin_jax.data.taskgen import world  # pylint: disable=g-import-not-at-top  (pure Python)
  wc = world.WorldConfig.from_config(t)
  if ":" in t.source:
    wc = dataclasses.replace(wc, seed=world.WorldConfig.parse(t.source).seed)
  return world.materialize(wc)


def load_tasks(config, split: str = "train") -> tuple[list[tasks_lib.TaskSpec], dict[str, str]]:
  """The tasks of a split and their source texts; clear errors on a bad source or split.

  Splits: 'train' | 'test' | 'all' for every source; a task world (tasks.source='generated') also has
  'heldout_compositions', 'heldout_styles' and 'suite' (the bundled tasks), and its 'test' is
  heldout_compositions + suite, the tasks that have no warm-start corpus entries.
  """
  t = config.tasks
  if t.layout not in ("any", "kernelbench"):
    raise SystemExit(f"error: tasks.layout={t.layout!r}; expected 'any' or 'kernelbench'")
  try:
    if t.layout == "kernelbench":
      tasks_lib.check_kernelbench_tree(t.source, tuple(t.levels))
    source = task_source(config)
    worlds = tasks_lib.world_splits(source)
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(f"error: task source: {e}") from e
  if worlds is not None:
    if split not in WORLD_SPLITS:
      raise SystemExit(f"error: split {split!r} of a task world; known: {', '.join(WORLD_SPLITS)}")
    named = dict(worlds, test=worlds["heldout_compositions"] + worlds["suite"],
                 all=[s for v in worlds.values() for s in v])
    chosen = named[split]
  else:
    if split not in ("train", "test", "all"):
      raise SystemExit(f"error: split {split!r}; known: train, test, all (named splits need a task world)")
    try:
      specs = tasks_lib.discover(source, levels=tuple(t.levels) if source != "bundled" else None)
    except FileNotFoundError as e:
      raise SystemExit(f"error: task source: {e}") from e
    try:
      train, test = tasks_lib.split(specs, test_fraction=t.test_fraction, seed=t.split_seed,
                                    train_ids=t.train_ids, test_ids=t.test_ids)
    except ValueError as e:
      raise SystemExit(f"error: task split: {e}") from e
    chosen = {"train": train, "test": test, "all": specs}[split]
  chosen = task_hygiene.filter_tasks(config, source, chosen)  # tasks.hygiene: excluded tasks leave the split.
  if not chosen:
    raise SystemExit(f"error: the {split} split of task source {t.source!r} is empty")
  sources = {s.id: s.source for s in chosen}
  return chosen, sources


def novelty_index(config):
  """The warm-start corpus's kernels indexed for the novelty metric (rl/kernel_metrics.CorpusIndex), or None when
  evaluation.novelty_ngram is 0. The corpus is the one the warm start trains on (sft_data.warm_start_texts)."""
  n = config.evaluation.novelty_ngram
  if n <= 0:
    return None
  from kevin_jax.rl import kernel_metrics as km  # pylint: disable=g-import-not-at-top
  from kevin_jax.rl import sft_data  # pylint: disable=g-import-not-at-top
  try:
    test_ids = {s.id for s in load_tasks(config, "test")[0]}
  except SystemExit:  # A source without a test split: nothing is held out of the corpus.
    test_ids = set()
  try:
    texts = sft_data.warm_start_texts(config, test_ids)
  except sft_data.CorpusError as e:  # E.g. an sft.corpus file that is not there: the job runs, without novelty.
    logging.warning("novelty metric off: %s", e)
    return None
  index = km.CorpusIndex(texts, n=n)
  logging.info("novelty metric: %d distinct warm-start corpus kernels, token %d-grams", len(index), n)
  return index


def check_host_memory(config, policy: Policy, *, warm_start: bool, rl: bool) -> None:
  """On the CPU backend: stops a job whose estimated peak exceeds the free host memory (kevin_jax/host_memory.py)."""
  from kevin_jax import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.check(config, policy.model_cfg, sharding.data_parallel_size(policy.mesh), warm_start=warm_start, rl=rl)


def check_prompt_budget(policy: Policy, sources: dict[str, str], max_tokens: int) -> None:
  """Every task's bare first-turn prompt must fit the context budget and the sampler's largest bucket."""
  limit = min(max_tokens, max(policy.sampler.cfg.prompt_buckets))
  too_long = {tid: n for tid, src in sources.items()
              if (n := len(policy.encode_chat(prompts.build_messages(src)))) > limit}
  if too_long:
    raise SystemExit(f"error: {len(too_long)} task prompts exceed the context budget of {limit} tokens "
                     f"(rollout.max_context_tokens / sampler.prompt_buckets): {dict(list(too_long.items())[:5])}")


CONTEXT_ROUND = 256  # rollout.context_from_tasks rounds the longest prompt up to a multiple of this, tokens.


def fit_context_to_tasks(config, sources: dict[str, str]):
  """rollout.context_from_tasks: a copy of `config` whose rollout.max_context_tokens is at least the longest
  first-turn prompt of `sources` (the policy's tokenizer), rounded up to CONTEXT_ROUND, with a sampler prompt
  bucket that holds it; `config` itself when the flag is off or the budget already fits. Stops, naming the tasks,
  when a prompt plus sampler.max_new_tokens exceeds the model's context (max_position_embeddings)."""
  if not config.rollout.context_from_tasks or not sources:
    return config
  tokenizer = load_tokenizer(config.policy.tokenizer or config.policy.checkpoint or None)
  lengths = {tid: len(tokenizer.encode_chat(prompts.build_messages(src), add_generation_prompt=True))
             for tid, src in sources.items()}
  context = model_config(config, tokenizer).max_position_embeddings
  room = context - int(config.sampler.max_new_tokens)
  too_long = {tid: n for tid, n in lengths.items() if n > room}
  if too_long:
    raise SystemExit(f"error: {len(too_long)} task prompts cannot fit the model's context of {context} tokens "
                     f"with sampler.max_new_tokens={config.sampler.max_new_tokens} (at most {room} prompt tokens): "
                     + ", ".join(f"{tid} ({n} tokens)" for tid, n in sorted(too_long.items(), key=lambda x: -x[1])))
  longest_id = max(lengths, key=lengths.get)
  budget = min(max(int(config.rollout.max_context_tokens), -(-lengths[longest_id] // CONTEXT_ROUND) * CONTEXT_ROUND),
               room)
  buckets = tuple(int(b) for b in config.sampler.prompt_buckets)
  if budget == config.rollout.max_context_tokens and max(buckets) >= budget:
    return config
  c = config.copy_and_resolve_references()
  c.rollout.max_context_tokens = budget
  if max(buckets) < budget:
    c.sampler.prompt_buckets = buckets + (budget,)
  logging.info("prompt budget from the tasks: the longest of %d first-turn prompts is %s with %d tokens; "
               "rollout.max_context_tokens %d -> %d, sampler.prompt_buckets %s", len(lengths), longest_id,
               lengths[longest_id], config.rollout.max_context_tokens, budget, tuple(c.sampler.prompt_buckets))
  return c


def make_reward(config, source: str):
  """The reward callable: the sandboxed CUDA evaluator (separate process) or the scripted test reward. A
  'generated' source is handed to the evaluator as its materialised directory (task_source)."""
  from kevin_jax.rl import reward  # pylint: disable=g-import-not-at-top
  if config.evaluator.backend == "scripted":
    return reward.ScriptedReward()
  if tasks_lib.is_generated(source):
    source = task_source(config)
  return reward.EvaluatorReward(config.evaluator.to_dict(), source)
