"""kevin_jax/sharding.py: mesh construction, the golden partition spec of every Qwen2 parameter, activations.

The golden tables below are the partitioning contract. If a rule in sharding.py changes on purpose (a new
parallelism layout), update the tables here in the same commit and say why in the message; if a parameter
name or logical axis changes in policy/model.py, the table must follow that change too.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from kevin_jax import sharding
from kevin_jax.policy.config import get_preset
from kevin_jax.policy.model import Qwen2


def _abstract_params(preset: str):
  model = nnx.eval_shape(lambda: Qwen2(get_preset(preset), rngs=nnx.Rngs(0)))
  return nnx.state(model, nnx.Param)


def test_mesh_shapes_and_errors(cpu_devices8):
  assert sharding.mesh_shape((("fsdp", -1), ("tensor", 2)), 8) == {"fsdp": 4, "tensor": 2}
  mesh = sharding.make_mesh((("data", 2), ("fsdp", -1), ("tensor", 2)), cpu_devices8)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert sharding.batch_axes(mesh) == ("data", "fsdp") and sharding.data_parallel_size(mesh) == 4
  with pytest.raises(ValueError, match="unknown mesh axes"):
    sharding.make_mesh((("model", -1),), cpu_devices8)
  with pytest.raises(ValueError, match="at most one"):
    sharding.mesh_shape((("fsdp", -1), ("tensor", -1)), 8)
  with pytest.raises(ValueError, match="needs 6 devices"):
    sharding.mesh_shape((("fsdp", 3), ("tensor", 2)), 8)


# Tiny preset: V=8192, D=64, N=4 query heads, K=2 kv heads, H=16, F=192, tied embedding.
TINY_GOLDEN = {
    (8, 1): {  # Pure FSDP: every D dim over fsdp, nothing over tensor.
        "embed/embedding": P(None, "fsdp"),
        "final_norm/scale": P("fsdp"),
        "attn/q_kernel": P("fsdp"), "attn/k_kernel": P("fsdp"), "attn/v_kernel": P("fsdp"),
        "attn/o_kernel": P(None, None, "fsdp"),
        "attn/q_bias": P(), "attn/k_bias": P(), "attn/v_bias": P(),
        "mlp/gate_kernel": P("fsdp"), "mlp/up_kernel": P("fsdp"), "mlp/down_kernel": P(None, "fsdp"),
        "input_norm/scale": P("fsdp"), "post_attn_norm/scale": P("fsdp"),
    },
    (4, 2): {  # Heads, MLP width and vocab over tensor=2 (K=2 divides).
        "embed/embedding": P("tensor", "fsdp"),
        "final_norm/scale": P("fsdp"),
        "attn/q_kernel": P("fsdp", "tensor"), "attn/k_kernel": P("fsdp", "tensor"),
        "attn/v_kernel": P("fsdp", "tensor"),
        "attn/o_kernel": P("tensor", None, "fsdp"),
        "attn/q_bias": P("tensor"), "attn/k_bias": P("tensor"), "attn/v_bias": P("tensor"),
        "mlp/gate_kernel": P("fsdp", "tensor"), "mlp/up_kernel": P("fsdp", "tensor"),
        "mlp/down_kernel": P("tensor", "fsdp"),
        "input_norm/scale": P("fsdp"), "post_attn_norm/scale": P("fsdp"),
    },
    (2, 4): {  # tensor=4 does not divide K=2: k/v stay whole along tensor (replicated), q/o/mlp/vocab split.
        "embed/embedding": P("tensor", "fsdp"),
        "final_norm/scale": P("fsdp"),
        "attn/q_kernel": P("fsdp", "tensor"), "attn/k_kernel": P("fsdp"), "attn/v_kernel": P("fsdp"),
        "attn/o_kernel": P("tensor", None, "fsdp"),
        "attn/q_bias": P("tensor"), "attn/k_bias": P(), "attn/v_bias": P(),
        "mlp/gate_kernel": P("fsdp", "tensor"), "mlp/up_kernel": P("fsdp", "tensor"),
        "mlp/down_kernel": P("tensor", "fsdp"),
        "input_norm/scale": P("fsdp"), "post_attn_norm/scale": P("fsdp"),
    },
}


def _by_role(table):
  """Collapses 'layers/<i>/attn/q_kernel' to 'attn/q_kernel' after checking every layer agrees."""
  roles = {}
  for path, spec in table.items():
    parts = path.split("/")
    role = "/".join(parts[2:]) if parts[0] == "layers" else path
    if role in roles:
      assert roles[role] == spec, f"layers disagree on {role}: {roles[role]} vs {spec} ({path})"
    roles[role] = spec
  return roles


@pytest.mark.parametrize("shape", [(8, 1), (4, 2), (2, 4)])
def test_golden_param_specs_tiny(cpu_devices8, shape):
  mesh = sharding.make_mesh((("fsdp", shape[0]), ("tensor", shape[1])), cpu_devices8)
  table = sharding.spec_table(_abstract_params("tiny"), mesh)
  assert len(table) == 2 + 2 * 12  # Embedding, final norm, 12 parameters per layer x 2 layers.
  assert _by_role(table) == TINY_GOLDEN[shape]


def test_golden_param_specs_qwq32b_paper_mesh(cpu_devices8):
  # The paper configuration: pure FSDP over 8 GPUs [STYLE practice 7]; every D = 5120 dim splits 8 ways.
  mesh = sharding.make_mesh((("fsdp", 8), ("tensor", 1)), cpu_devices8)
  roles = _by_role(sharding.spec_table(_abstract_params("qwq-32b"), mesh))
  assert roles == {**TINY_GOLDEN[(8, 1)], "lm_head/kernel": P("fsdp")}  # Untied head [D, V] -> (fsdp, -).


def test_param_shardings_tree_matches_state(cpu_devices8):
  mesh = sharding.make_mesh((("fsdp", 4), ("tensor", 2)), cpu_devices8)
  params = _abstract_params("tiny")
  shardings = sharding.param_shardings(params, mesh)
  assert jax.tree.structure(shardings) == jax.tree.structure(params)
  assert shardings["layers"][1]["mlp"]["down_kernel"].get_value().spec == P("tensor", "fsdp")


def test_logical_to_spec_rules():
  mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:8]).reshape(4, 2), ("fsdp", "tensor"))
  rules = sharding.PARAM_RULES
  assert sharding.logical_to_spec(("embed", "mlp"), (64, 6), mesh, rules) == P("fsdp", "tensor")
  assert sharding.logical_to_spec(("embed", "mlp"), (6, 7), mesh, rules) == P()  # Neither divides.
  assert sharding.logical_to_spec(("embed", "embed"), (8, 8), mesh, rules) == P("fsdp")  # An axis is used once.
  with pytest.raises(KeyError, match="no rule"):
    sharding.logical_to_spec(("experts",), (8,), mesh, rules)
  with pytest.raises(ValueError, match="logical names"):
    sharding.logical_to_spec(("embed",), (8, 8), mesh, rules)


def test_unnamed_parameter_is_an_error(cpu_devices8):
  mesh = sharding.make_mesh((("fsdp", 8),), cpu_devices8)
  state = nnx.State({"w": nnx.Param(jnp.zeros((8, 8)), eager_sharding=False)})
  with pytest.raises(ValueError, match="no logical axis names"):
    sharding.param_specs(state, mesh)


def test_activation_and_batch_specs(cpu_devices8):
  mesh = sharding.make_mesh((("data", 2), ("fsdp", 2), ("tensor", 2)), cpu_devices8)
  assert sharding.activation_spec(mesh, "batch", "seq", "act_vocab") == P(("data", "fsdp"), None, "tensor")
  assert sharding.batch_sharding(mesh).spec == P(("data", "fsdp"))
  x = jax.device_put(jnp.ones((8, 4, 6)), sharding.replicated(mesh))
  y = jax.jit(lambda a: sharding.constrain(a * 2, mesh, "batch", None, "act_mlp"))(x)
  assert y.sharding.spec == P(("data", "fsdp"), None, "tensor")
  np.testing.assert_array_equal(y, 2 * np.ones((8, 4, 6)))
