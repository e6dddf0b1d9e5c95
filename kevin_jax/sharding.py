"""The device mesh and every partitioning rule, in one place.

Convention:
- Mesh axes (`config.mesh.axes`, e.g. (("fsdp", -1), ("tensor", 1))), any subset of MESH_AXES in any order;
  exactly one size may be -1 and is filled with the remaining devices:
    data    pure data parallelism: splits the batch; parameters are replicated along it.
    fsdp    fully-sharded data parallelism (ZeRO-3): splits the batch AND every parameter / optimizer moment
            along its model dimension D; XLA all-gathers a layer's weights when it runs.
    tensor  tensor (Megatron) parallelism: splits query/kv heads, the MLP width F and the vocabulary V.
- Parameters carry logical axis names (kevin_jax/policy/model.py: 'vocab', 'embed', 'q_heads', 'kv_heads',
  'head_dim', 'mlp'); PARAM_RULES maps each name to a mesh axis. A dimension stays unsplit when its size
  is not divisible by that axis's size (e.g. 2 kv heads on tensor=4) or when an earlier dimension of the same
  array already uses the axis. Names without a rule are an error, so a new parameter cannot go unsharded
  silently.
- Activations: ACTIVATION_RULES names the dims of [B, T, ...] activations: the batch over (data, fsdp), heads,
  MLP width and vocabulary over tensor, the sequence and residual width whole.
- The mesh is always passed explicitly (no ambient `with mesh:`); the same code runs on 1 and N devices.

Shape letters: B batch, T tokens, D hidden, F MLP width, V vocab, N query heads, K kv heads, H head_dim.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # Mesh axes that split the batch (in this order).

# Logical parameter axis -> mesh axis (None = never split). Shapes are those of policy/model.py.
PARAM_RULES: dict[str, str | None] = {
    # V: embed.embedding [V, D] -> P(tensor, fsdp); lm_head.kernel [D, V] -> P(fsdp, tensor).
    "vocab": "tensor",
    # D: every matrix's model side and the norm scales [D] -> P(fsdp): q/k/v_kernel [D, N|K, H],
    # o_kernel [N, H, D], gate/up_kernel [D, F], down_kernel [F, D], embedding and lm_head above.
    "embed": "fsdp",
    # N: q_kernel [D, N, H] -> P(fsdp, tensor, -); o_kernel [N, H, D] -> P(tensor, -, fsdp);
    # q_bias [N, H] -> P(tensor, -).
    "q_heads": "tensor",
    # K: k/v_kernel [D, K, H] -> P(fsdp, tensor, -); k/v_bias [K, H] -> P(tensor, -) (when tensor divides K).
    "kv_heads": "tensor",
    # H: whole (the rotary embedding pairs its two halves).
    "head_dim": None,
    # F: gate/up_kernel [D, F] -> P(fsdp, tensor); down_kernel [F, D] -> P(tensor, fsdp).
    "mlp": "tensor",
    # L: a stacked-layer axis [L, ...] (if the model scans its layers) stays whole: each device keeps its
    # shard of every layer.
    "layers": None,
}

# Logical activation axis -> mesh axes.
ACTIVATION_RULES: dict[str, tuple[str, ...] | str | None] = {
    "batch": BATCH_AXES,  # B of tokens/masks/log-probs [B, T], hidden [B, T, D], logits [B, T, V], advantages [B].
    "seq": None,  # T: every device holds whole sequences (no sequence parallelism).
    "act_embed": None,  # D of the residual stream [B, T, D]: whole (weights are gathered instead, FSDP).
    "act_heads": "tensor",  # N or K of q/k/v [B, T, N|K, H] and attention outputs.
    "act_mlp": "tensor",  # F of the MLP activations [B, T, F].
    "act_vocab": "tensor",  # V of logits [B, T, V].
}


def mesh_shape(axes: Sequence[tuple[str, int]], num_devices: int) -> dict[str, int]:
  """Resolves (name, size) pairs with at most one -1 into concrete sizes whose product is num_devices."""
  names = [n for n, _ in axes]
  if len(set(names)) != len(names):
    raise ValueError(f"mesh axis names repeat: {names}")
  sizes = [int(s) for _, s in axes]
  if sum(s == -1 for s in sizes) > 1:
    raise ValueError(f"at most one mesh axis may be -1, got {list(axes)}")
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh axis sizes must be positive or -1, got {list(axes)}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f"{num_devices} devices do not divide into mesh {list(axes)}")
    sizes = [num_devices // known if s == -1 else s for s in sizes]
  if math.prod(sizes) != num_devices:
    raise ValueError(f"mesh {dict(zip(names, sizes))} needs {math.prod(sizes)} devices, have {num_devices}")
  return dict(zip(names, sizes))


def make_mesh(axes: Sequence[tuple[str, int]], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A Mesh over `devices` (default: all) with Auto axis types (so sharding constraints apply)."""
  unknown = [n for n, _ in axes if n not in MESH_AXES]
  if unknown:
    raise ValueError(f"unknown mesh axes {unknown}; kevin_jax/sharding.py knows {MESH_AXES}")
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(axes, len(devices))
  grid = np.asarray(devices, dtype=object).reshape(tuple(shape.values()))
  return Mesh(grid, tuple(shape), axis_types=(AxisType.Auto,) * len(shape))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
  """The mesh axes that split the batch, in mesh order."""
  return tuple(a for a in mesh.axis_names if a in BATCH_AXES)


def data_parallel_size(mesh: Mesh) -> int:
  """How many ways the batch is split (product of the batch axes' sizes)."""
  return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dim over the batch axes, other dims whole: for every leaf of a TrainBatch."""
  return NamedSharding(mesh, P(batch_axes(mesh) or None))


def _resolve(axis: tuple[str, ...] | str | None, mesh: Mesh) -> tuple[str, ...]:
  if axis is None:
    return ()
  names = (axis,) if isinstance(axis, str) else tuple(axis)
  return tuple(n for n in names if n in mesh.axis_names)


def logical_to_spec(names: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Mapping[str, Any]) -> P:
  """PartitionSpec for an array whose dims carry logical `names` (see the module docstring)."""
  if len(names) != len(shape):
    raise ValueError(f"{len(names)} logical names {tuple(names)} for a rank-{len(shape)} array {tuple(shape)}")
  used: set[str] = set()
  spec = []
  for name, size in zip(names, shape):
    if name is None:
      spec.append(None)
      continue
    if name not in rules:
      raise KeyError(f"logical axis {name!r} has no rule in kevin_jax/sharding.py (known: {sorted(rules)})")
    axes = tuple(a for a in _resolve(rules[name], mesh) if a not in used and mesh.shape[a] > 1)
    if axes and size % math.prod(mesh.shape[a] for a in axes) == 0:
      used.update(axes)
      spec.append(axes[0] if len(axes) == 1 else axes)
    else:
      spec.append(None)
  while spec and spec[-1] is None:
    spec.pop()
  return P(*spec)


def _is_var(x) -> bool:
  return isinstance(x, nnx.Variable)


def _names_of(path, var: nnx.Variable) -> tuple[str | None, ...]:
  names = var.get_metadata().get("out_sharding")
  if names is None and len(var.shape) > 0:
    raise ValueError(f"parameter {jax.tree_util.keystr(path)} {var.shape} has no logical axis names "
                     "(nnx.Param(..., out_sharding=(...))): every parameter needs them")
  return tuple(names or ())


def param_specs(params: Any, mesh: Mesh) -> Any:
  """Tree of PartitionSpecs (same structure as `params`, an nnx.State, abstract or concrete)."""
  def one(path, var):
    return var.replace(logical_to_spec(_names_of(path, var), var.shape, mesh, PARAM_RULES))
  return jax.tree_util.tree_map_with_path(one, params, is_leaf=_is_var)


def param_shardings(params: Any, mesh: Mesh) -> Any:
  """Tree of NamedShardings for an nnx.State of parameters (or anything shaped like it)."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(params, mesh),
                      is_leaf=lambda x: isinstance(x, P))


def spec_table(params: Any, mesh: Mesh) -> dict[str, P]:
  """{'layers/0/attn/q_kernel': P('fsdp', 'tensor'), ...}: for golden tests and the memory report."""
  out = {}
  for path, var in jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_var):
    key = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
    out[key] = logical_to_spec(_names_of(path, var), var.shape, mesh, PARAM_RULES)
  return out


def activation_spec(mesh: Mesh, *names: str | None) -> P:
  """PartitionSpec of an activation whose dims are named by ACTIVATION_RULES keys (None = whole)."""
  spec = []
  for n in names:
    if n is None:
      spec.append(None)
      continue
    if n not in ACTIVATION_RULES:
      raise KeyError(f"activation axis {n!r} has no rule (known: {sorted(ACTIVATION_RULES)})")
    axes = _resolve(ACTIVATION_RULES[n], mesh)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return P(*spec)


def constrain(x: jax.Array, mesh: Mesh, *names: str | None) -> jax.Array:
  """with_sharding_constraint by activation names, e.g. constrain(h, mesh, 'batch', 'seq', 'act_embed')."""
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activation_spec(mesh, *names)))
