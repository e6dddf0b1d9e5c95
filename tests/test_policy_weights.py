"""HF safetensors <-> Qwen2: exact round trips (ours and transformers'), sharded placement, clear errors."""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from safetensors.numpy import load_file, save_file

from kevin_jax.policy import Qwen2, get_preset, load_pretrained, save_pretrained
from kevin_jax import sharding as ksharding
from tests.test_common import make_hf_qwen2


def _params(model):
  return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.parametrize("tie,dtype", [(False, "float32"), (True, "bfloat16")])
def test_transformers_to_ours_to_transformers_exact(tmp_path, tie, dtype):
  from transformers import Qwen2ForCausalLM  # pylint: disable=g-import-not-at-top
  hf = make_hf_qwen2(tmp_path / "hf", tie=tie, dtype=dtype)
  model = load_pretrained(tmp_path / "hf", dtype=dtype)
  save_pretrained(model, tmp_path / "ours")
  back = Qwen2ForCausalLM.from_pretrained(tmp_path / "ours", dtype=getattr(torch, dtype)).eval()
  ref, got = hf.state_dict(), back.state_dict()
  assert set(ref) == set(got)
  for name, tensor in ref.items():
    assert got[name].dtype == tensor.dtype, name
    assert torch.equal(got[name], tensor), name
  assert back.config.tie_word_embeddings == tie
  # The files themselves: same names, bit-identical arrays.
  a, b = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "ours" / "model.safetensors")
  assert set(a) - {"lm_head.weight"} == set(b) - {"lm_head.weight"}
  for name in b:
    np.testing.assert_array_equal(a[name], b[name])


def test_ours_save_load_exact_and_sharded_files(tmp_path):
  cfg = get_preset("tiny", vocab_size=512, tie_word_embeddings=False, param_dtype="bfloat16")
  model = Qwen2(cfg, rngs=nnx.Rngs(7))
  save_pretrained(model, tmp_path, max_shard_bytes=100_000)
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  files = set(index["weight_map"].values())
  assert len(files) > 1 and all((tmp_path / f).is_file() for f in files)
  assert not (tmp_path / "model.safetensors").exists()
  loaded = load_pretrained(tmp_path, dtype="bfloat16")
  assert loaded.cfg == cfg
  a, b = _params(model), _params(loaded)
  assert a.keys() == b.keys()
  for k in a:
    assert b[k].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(a[k], b[k])
  save_pretrained(loaded, tmp_path)  # re-save as one file into the same directory: stale shards are removed
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
  from transformers import Qwen2ForCausalLM  # pylint: disable=g-import-not-at-top
  hf = Qwen2ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
  tokens = np.array([[1, 5, 9, 300]])
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(tokens)).logits.numpy()
  f32 = load_pretrained(tmp_path, dtype="float32", compute_dtype="float32")
  ours, _ = f32(jnp.asarray(tokens), jnp.arange(4)[None])
  assert np.max(np.abs(np.asarray(ours) - ref)) / np.max(np.abs(ref)) <= 1e-4


def test_load_places_each_tensor_in_its_sharding(tmp_path, cpu_devices8):
  make_hf_qwen2(tmp_path, tie=False, num_heads=4, num_kv_heads=2, hidden_size=64)
  mesh = ksharding.make_mesh((("fsdp", 4), ("tensor", 2)), cpu_devices8)
  rules = {"embed": "fsdp", "q_heads": "tensor", "kv_heads": "tensor", "mlp": "tensor", "vocab": "tensor",
           "head_dim": None}

  def shard_fn(path, names, shape):
    del path, shape
    return NamedSharding(mesh, P(*(rules[n] for n in names)))

  model = load_pretrained(tmp_path, dtype="float32", shardings=shard_fn)
  q = model.layers[0].attn.q_kernel.get_value()
  assert q.sharding == NamedSharding(mesh, P("fsdp", "tensor", None))
  assert q.addressable_shards[0].data.shape == (16, 2, 16)
  plain = load_pretrained(tmp_path, dtype="float32")
  for (p, a), (_, b) in zip(_params(model).items(), _params(plain).items()):
    np.testing.assert_array_equal(a, b, err_msg=str(p))
  # A whole tree of shardings (as kevin_jax/sharding.py would build from the abstract state) works too.
  abstract = nnx.eval_shape(lambda: Qwen2(plain.cfg, rngs=nnx.Rngs(0)))
  tree = jax.tree.map(lambda _: NamedSharding(mesh, P()), nnx.state(abstract, nnx.Param))
  rep = load_pretrained(tmp_path, dtype="float32", shardings=tree)
  assert rep.final_norm.scale.get_value().sharding == NamedSharding(mesh, P())


def test_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_pretrained(tmp_path / "nope")
  ck = tmp_path / "ck"
  make_hf_qwen2(ck, tie=False)
  weights = load_file(ck / "model.safetensors")
  cfg = json.loads((ck / "config.json").read_text())

  def variant(name, tensors=None, config=None):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config or cfg))
    if tensors is not None:
      save_file(tensors, d / "model.safetensors")
    return d

  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    load_pretrained(variant("empty"))
  with pytest.raises(ValueError, match="model_type"):
    load_pretrained(variant("llama", weights, {**cfg, "model_type": "llama"}))
  with pytest.raises(ValueError, match=r"unknown tensors \['model.extra'\]"):
    load_pretrained(variant("extra", {**weights, "model.extra": np.zeros(3, np.float32)}))
  dropped = dict(weights)
  del dropped["model.layers.1.mlp.up_proj.weight"]
  with pytest.raises(ValueError, match=r"missing tensors \['model.layers.1.mlp.up_proj.weight'\]"):
    load_pretrained(variant("missing", dropped))
  with pytest.raises(ValueError, match=r"shape \(64, 96\), expected \(64, 128\)"):
    load_pretrained(variant("shape", weights, {**cfg, "intermediate_size": 128}))
  ints = {**weights, "model.norm.weight": np.ones(64, np.int32)}
  with pytest.raises(ValueError, match="not a floating type"):
    load_pretrained(variant("dtype", ints))
  index_dir = variant("index")
  (index_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))
  with pytest.raises(FileNotFoundError, match="gone.safetensors"):
    load_pretrained(index_dir)
