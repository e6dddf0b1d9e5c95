"""kevin_jax.checkpoint: round trips (plain and sharded), resume, keep-last-K, interrupted saves."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from kevin_jax import checkpoint, sharding


def _state(seed=0):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return {"params": {"w": jax.random.normal(k1, (16, 8)), "b": jnp.arange(8, dtype=jnp.bfloat16)},
          "opt": {"count": jnp.asarray(7, jnp.int32), "mu": jax.random.normal(k2, (16, 8))}}


def _assert_tree_equal(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
  assert jax.tree.structure(a) == jax.tree.structure(b)


def test_round_trip_plain(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"))
  state, rng = _state(), jax.random.key(42)
  ckpt.save(3, state, rng=rng, sampler_state={"epoch": 1, "order": [3, 1, 2], "pos": 2},
            config={"rl": {"gamma": 0.4, "return_mode": "sum"}, "mesh": {"axes": (("fsdp", -1),)}})
  ckpt.close()
  ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"))
  assert ckpt.latest_step() == 3
  out = ckpt.restore(jax.tree.map(jnp.zeros_like, state))
  _assert_tree_equal(out.state, state)
  assert out.state["params"]["b"].dtype == jnp.bfloat16
  assert out.step == 3
  np.testing.assert_array_equal(jax.random.key_data(out.rng), jax.random.key_data(rng))
  # The restored key draws the same numbers as the saved one.
  np.testing.assert_array_equal(jax.random.uniform(out.rng, (4,)), jax.random.uniform(rng, (4,)))
  assert out.sampler_state == {"epoch": 1, "order": [3, 1, 2], "pos": 2}
  assert out.config["rl"] == {"gamma": 0.4, "return_mode": "sum"}
  ckpt.close()


def test_round_trip_sharded(tmp_path, cpu_devices8):
  mesh = sharding.make_mesh((("fsdp", 4), ("tensor", 2)), cpu_devices8)
  spec = {"params": {"w": P("fsdp", "tensor"), "b": P("tensor")},
          "opt": {"count": P(), "mu": P(None, "fsdp")}}
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), spec)
  state = jax.device_put(jax.device_get(_state()), shardings)
  ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"))
  ckpt.save(1, state)
  ckpt.wait()
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)
  out = ckpt.restore(abstract)
  _assert_tree_equal(out.state, state)
  assert out.state["params"]["w"].sharding == shardings["params"]["w"]
  assert out.state["opt"]["mu"].sharding == shardings["opt"]["mu"]
  assert len(out.state["params"]["w"].addressable_shards) == 8
  # Restoring into a different layout (1-D FSDP over 8) reshards on load.
  mesh8 = sharding.make_mesh((("fsdp", -1),), cpu_devices8)
  other = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh8, P())), state)
  other["params"]["w"] = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh8, P("fsdp")))
  out2 = ckpt.restore(other)
  _assert_tree_equal(out2.state, state)
  assert out2.state["params"]["w"].sharding.spec == P("fsdp")
  ckpt.close()


def test_keep_last_k_and_resume_latest(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path / "c"), keep=2)
  for step in (1, 2, 3, 4):
    ckpt.save(step, _state(step))
  ckpt.close()
  ckpt = checkpoint.Checkpointer(str(tmp_path / "c"), keep=2)
  assert ckpt.all_steps() == [3, 4]
  out = ckpt.restore(_state())
  assert out.step == 4
  _assert_tree_equal(out.state, _state(4))
  out3 = ckpt.restore(_state(), step=3)
  _assert_tree_equal(out3.state, _state(3))
  with pytest.raises(FileNotFoundError, match="step 1"):
    ckpt.restore(_state(), step=1)
  ckpt.close()


def test_empty_directory_is_a_clear_error(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path / "none"))
  assert ckpt.latest_step() is None
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    ckpt.restore(_state())
  ckpt.close()


def test_interrupted_save_keeps_latest_good(tmp_path):
  d = tmp_path / "c"
  ckpt = checkpoint.Checkpointer(str(d))
  ckpt.save(5, _state(5))
  ckpt.close()
  # A save of step 6 that died midway: Orbax's temporary directory, never renamed into place.
  tmp = d / "6.orbax-checkpoint-tmp-1234567"
  os.makedirs(tmp / "state")
  (tmp / "state" / "garbage").write_bytes(b"\x00" * 100)
  # A directory named like a step but without Orbax's commit marker is not a checkpoint either.
  ckpt = checkpoint.Checkpointer(str(d))
  assert ckpt.latest_step() == 5
  out = ckpt.restore(_state())
  _assert_tree_equal(out.state, _state(5))
  assert not tmp.exists()  # Cleaned when the manager opened.
  ckpt.close()
