"""kevin_jax/host_memory.py: the estimate tracks XLA's CPU buffer assignment, and a CPU job too big for the machine
stops before it starts (nothing written), naming the fields to lower."""

import os

import jax
import pytest

from configs import eval as eval_config
from configs import multiturn
from configs import sft as sft_config
from kevin_jax import evaluate
from kevin_jax import host_memory
from kevin_jax import runtime
from kevin_jax import sft
from kevin_jax import sharding
from kevin_jax import train
from kevin_jax.policy import sampler as sampler_lib

GIB = 2**30


def _runlocal(name="multiturn"):
  c = {"multiturn": multiturn, "sft": sft_config, "eval": eval_config}[name].get_config("runlocal")
  c.evaluator.backend = "scripted"
  c.logging.tensorboard = False
  c.mesh.axes = (("fsdp", -1), ("tensor", 1))
  return c


@pytest.fixture
def one_device_policy(monkeypatch):
  """runtime.build_policy on one CPU device (the user's machine), whatever tests/conftest.py's fake devices."""
  real = sharding.make_mesh
  monkeypatch.setattr(sharding, "make_mesh", lambda axes, devices=None: real(axes, jax.devices()[:1]))
  return runtime.build_policy


def test_estimate_is_at_or_just_above_xla_buffer_assignment(one_device_policy, monkeypatch):
  """The tiny fp32 policy's learner step on 2 rows x 2048 tokens and its sampler's prefill of 4 x 1024 tokens:
  the estimate is 1-1.3x XLA's own figure (arguments + temporaries), so it refuses nothing that fits."""
  c = _runlocal()
  policy = one_device_policy(c)
  step = host_memory.train_step_bytes(policy.model_cfg, 2, 2048, logits_chunk=c.rl.logits_chunk, master=False,
                                      state_dtype="float32", scan_layers=False)
  ma = policy.learner.compile(4, 2048).memory_analysis()  # 2 updates x 1 micro-batch of 2 rows.
  xla = ma.temp_size_in_bytes + ma.argument_size_in_bytes
  assert 1.0 <= step / xla <= 1.3, (step / GIB, xla / GIB)

  seen = []
  real = sampler_lib._prefill  # pylint: disable=protected-access

  class Compiled(Exception):
    pass

  def compile_only(*args, **kw):  # The prefill generate would run, compiled for its real arguments; not run.
    m = real.lower(*args, **kw).compile().memory_analysis()
    seen.append(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes)
    raise Compiled

  monkeypatch.setattr(sampler_lib, "_prefill", compile_only)
  params = policy.learner.abstract_state.params
  with pytest.raises(Compiled):
    policy.sampler.generate(params, [[5] * 1000] * 4, seed=0, max_new_tokens=1)
  prefill = host_memory.prefill_bytes(policy.model_cfg, 4, 1024, 1, c.sampler.kv_cache_dtype)
  assert len(seen) == 1 and 1.0 <= prefill / seen[0] <= 1.3, (prefill / GIB, seen[0] / GIB)


def test_runlocal_presets_fit_in_4_gib():
  """multiturn/sft/eval ':runlocal' on one CPU device: every phase plus the runtime under 4 GiB (the smoke run's
  promise; tests/test_runlocal.py measures the real peak)."""
  from kevin_jax.policy.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  tok = load_tokenizer()
  for name, kw in (("multiturn", dict(warm_start=True, rl=True)), ("sft", dict(warm_start=True, rl=False)),
                   ("eval", dict(warm_start=False, rl=False))):
    c = _runlocal(name)
    ps = host_memory.phases(c, runtime.model_config(c, tok), 1, **kw)
    assert len(ps) == sum(kw.values()) + 1
    assert max(p.bytes for p in ps) + host_memory.RUNTIME_BYTES < 4 * GIB, (name, ps)


# (job, config, overrides, the phase that does not fit, the fields the error names)
TOO_BIG = [
    ("train", "multiturn", dict(sft=dict(max_seq_len=5120, micro_batch_size=8, batch_size=16)),
     "the warm start's train step (micro-batches of 8 rows x 5120 tokens)", "sft.max_seq_len or sft.micro_batch_size"),
    ("train", "multiturn", dict(rl=dict(micro_batch_size=8), rollout=dict(max_context_tokens=4096),
                                sampler=dict(max_new_tokens=2048)),
     "the RL learner's step (micro-batches of 8 rows x 6144 tokens)",
     "rollout.max_context_tokens + sampler.max_new_tokens or rl.micro_batch_size"),
    ("sft", "sft", dict(sft=dict(max_seq_len=4096, micro_batch_size=16, batch_size=16)),
     "the warm start's train step (micro-batches of 16 rows x 4096 tokens)", "sft.max_seq_len or sft.micro_batch_size"),
    ("evaluate", "eval", dict(sampler=dict(batch_size=64, prompt_buckets=(2048, 4096)),
                              rollout=dict(max_context_tokens=3072)),
     "the sampler's prefill (64 prompts x 4096 tokens)", "sampler.batch_size or rollout.max_context_tokens"),
]


@pytest.mark.parametrize("job,name,overrides,phase,fields", TOO_BIG, ids=["warm_start", "rl", "sft", "evaluate"])
def test_a_job_too_big_for_the_machine_stops_before_it_starts(job, name, overrides, phase, fields,
                                                              one_device_policy, monkeypatch, tmp_path):
  """On a machine with 20 GiB free, each job refuses a config whose largest phase needs more, before it writes
  anything, naming that phase and the fields to lower."""
  del one_device_policy  # One CPU device, as on the user's machine.
  monkeypatch.setattr(host_memory, "available_bytes", lambda: 20 * GIB)
  c = _runlocal(name)
  for section, values in overrides.items():
    for k, v in values.items():
      setattr(c[section], k, v)
  run = {"train": train.run, "sft": sft.run, "evaluate": evaluate.run}[job]
  with pytest.raises(SystemExit) as e:
    run(c, str(tmp_path / "w"))
  msg = str(e.value)
  assert "of host memory at its peak and 20.0 GiB are available" in msg, msg
  assert f"The largest phase is {phase}" in msg and f"Lower {fields}, use" in msg, msg
  assert not os.path.exists(tmp_path / "w")


def test_available_memory_is_positive_and_at_most_the_machine():
  have = host_memory.available_bytes()
  assert 0 < have <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
