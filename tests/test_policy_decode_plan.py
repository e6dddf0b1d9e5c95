"""policy/decode/plan.py: DecodeConfig -> DecodePlan. The 'auto' rules give the plans that the decode 'auto'
switches of ModelConfig / sampler chose before the decode fast path moved behind the sampler (recorded at commit
8875b8c with the backend set to 'gpu'), for experiments/bench_sampler.py's shapes: same kernels, same launch
parameters. Updating OLD_AUTO is legitimate only with a measured reason to change a default (BENCHMARKS.md)."""

import dataclasses
import logging

import pytest

from kevin_jax.policy import get_preset
from kevin_jax.policy.config import ModelConfig
from kevin_jax.policy.decode import mlp, qkv
from kevin_jax.policy.decode.plan import DecodeConfig, DeviceInfo, resolve

H200 = DeviceInfo("gpu", sm_count=132, kind="NVIDIA H200")
CPU = DeviceInfo("cpu", sm_count=132)
_SLOTS = lambda p, n: p + -(-n // 64) * 64  # the sampler's cache: the prompt bucket + max_new_tokens in 64s

# (preset, batch, prompt bucket, max_new_tokens): (norm, qkv, out, attention, mlp, down, attention splits)
OLD_AUTO = {
    ("qwen2.5-0.5b", 16, 1024, 1024): ("inside", "pallas", "pallas", "pallas", "pallas", "pallas", 8),
    ("qwen2.5-0.5b", 16, 512, 1024): ("inside", "pallas", "pallas", "pallas", "pallas", "pallas", 8),
    ("qwen2.5-0.5b", 64, 1024, 1024): ("inside", "pallas", "pallas", "pallas", "pallas", "pallas", 2),
    ("qwen2.5-0.5b", 64, 512, 1024): ("inside", "pallas", "pallas", "pallas", "pallas", "pallas", 2),
    ("qwen2.5-0.5b", 256, 1024, 1024): ("inside", "xla", "xla", "pallas", "xla", "xla", 1),
    ("qwen2.5-0.5b", 256, 512, 1024): ("inside", "xla", "xla", "pallas", "xla", "xla", 1),
    ("qwen2.5-1.5b", 16, 1024, 1024): ("xla", "pallas", "xla", "pallas", "pallas", "xla", 8),
    ("qwen2.5-1.5b", 16, 512, 1024): ("xla", "pallas", "xla", "pallas", "pallas", "xla", 8),
    ("qwen2.5-1.5b", 64, 1024, 1024): ("xla", "pallas", "xla", "pallas", "pallas", "xla", 2),
    ("qwen2.5-1.5b", 64, 512, 1024): ("xla", "pallas", "xla", "pallas", "pallas", "xla", 2),
    ("qwen2.5-1.5b", 256, 1024, 1024): ("xla", "xla", "xla", "pallas", "xla", "xla", 1),
    ("qwen2.5-1.5b", 256, 512, 1024): ("xla", "xla", "xla", "pallas", "xla", "xla", 1),
    ("small", 16, 1024, 1024): ("inside", "pallas", "pallas", "pallas", "pallas", "pallas", 8),
    ("small", 16, 512, 1024): ("inside", "pallas", "pallas", "pallas", "pallas", "pallas", 8),
    ("small", 64, 1024, 1024): ("inside", "pallas", "pallas", "pallas", "pallas", "pallas", 2),
    ("small", 64, 512, 1024): ("inside", "pallas", "pallas", "pallas", "pallas", "pallas", 2),
    ("small", 256, 1024, 1024): ("inside", "xla", "xla", "pallas", "xla", "xla", 1),
    ("small", 256, 512, 1024): ("inside", "xla", "xla", "pallas", "xla", "xla", 1),}


@pytest.mark.parametrize("key", sorted(OLD_AUTO))
def test_auto_plan_equals_the_old_rules_on_a_gpu(key):
  name, batch, p, n = key
  norm, qkv_impl, out, attn, front, down, splits = OLD_AUTO[key]
  plan = resolve(DecodeConfig(), get_preset(name), batch, _SLOTS(p, n), p, H200)
  assert (plan.norm, plan.qkv, plan.out, plan.attention, plan.mlp, plan.down) == (norm, qkv_impl, out, attn, front,
                                                                                  down)
  assert plan.attention_splits == (splits if attn != "xla" else 0)
  assert plan.prefetch_blocks == (qkv.PREFETCH_BLOCKS if attn != "xla" and qkv_impl != "xla" else 0)
  assert plan.down_splits == mlp.DOWN_SPLITS and plan.stats == "pallas"


def test_the_fast_path_of_the_sampler_benchmark():
  """The 0.5B shape at batch 64 (the 50.7k tok/s figure of BENCHMARKS.md Sampler): every kernel, norms inside."""
  plan = resolve(DecodeConfig(), get_preset("qwen2.5-0.5b"), 64, 2048, 1024, H200)
  assert dataclasses.astuple(plan) == ("pallas", 2, "pallas", 2, "pallas", "pallas", "pallas", 4, "inside", "pallas")
  assert not plan.reference and plan.folds("qkv") and plan.folds("mlp")


def test_cpu_auto_is_the_reference_step():
  plan = resolve(DecodeConfig(), get_preset("qwen2.5-0.5b"), 64, 2048, 1024, CPU)
  assert plan.reference and plan.norm == "xla" and plan.stats == "xla" and not plan.folds("qkv")


def test_sm_count_sets_the_splits():
  """Splits come from the device's SMs: about 2 programs per SM (batch 16, 2 KV heads: 8 splits on 132 SMs, 16
  on 264, 4 on 66)."""
  cfg = get_preset("qwen2.5-0.5b")
  got = [resolve(DecodeConfig(), cfg, 16, 2048, 1024, DeviceInfo("gpu", sms)).attention_splits
         for sms in (66, 132, 264)]
  assert got == [4, 8, 16]


def test_explicit_choices_and_the_out_rule():
  cfg = get_preset("qwen2.5-0.5b")
  plan = resolve(DecodeConfig(qkv="xla"), cfg, 64, 2048, 1024, H200)
  assert plan.qkv == "xla" and plan.out == "xla" and plan.prefetch_blocks == 0  # out needs the q/k/v kernel
  plan = resolve(DecodeConfig(norm="xla"), cfg, 64, 2048, 1024, H200)
  assert plan.out == "xla" and plan.qkv == "pallas" and not plan.folds("qkv")  # ... with the norm inside
  plan = resolve(DecodeConfig(attention="interpret", mlp="interpret", norm="fold"), get_preset("tiny"), 4, 128, 64,
                 CPU)
  assert (plan.attention, plan.mlp, plan.qkv, plan.norm) == ("interpret", "interpret", "xla", "fold")
  assert plan.folds("mlp") and not plan.folds("qkv") and not plan.reference
  # A batch the attention kernel cannot take (the cache not in 64-slot blocks) keeps XLA under 'auto'.
  assert resolve(DecodeConfig(), cfg, 64, 2000, 1000, H200).attention == "xla"


def test_resolved_once_and_logged(caplog):
  cfg = get_preset("tiny", num_layers=3)  # a key no other test resolves
  with caplog.at_level(logging.INFO):
    first = resolve(DecodeConfig(), cfg, 16, 256, 128, H200)
    again = resolve(DecodeConfig(), cfg, 16, 256, 128, H200)
  assert first is again
  assert sum("decode plan" in r.getMessage() for r in caplog.records) == 1


def test_bad_values():
  with pytest.raises(ValueError, match="DecodeConfig.attention"):
    DecodeConfig(attention="triton")
  with pytest.raises(ValueError, match="DecodeConfig.norm"):
    DecodeConfig(norm="pallas")


def test_old_model_configs_with_decode_fields_still_load(caplog):
  d = dataclasses.asdict(get_preset("tiny")) | {"decode_attention": "auto", "decode_add_norm": "xla"}
  with caplog.at_level(logging.WARNING):
    cfg = ModelConfig.from_dict(d)
  assert cfg == get_preset("tiny") and "decode_add_norm" in caplog.text
  with pytest.raises(TypeError):
    ModelConfig.from_dict(dataclasses.asdict(get_preset("tiny")) | {"hidden": 3})
