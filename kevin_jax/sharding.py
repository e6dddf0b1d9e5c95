"""The device mesh and every partitioning rule, in one place.

Convention: the mesh has named axes from `config.mesh.axes`, e.g. (("fsdp", -1), ("tensor", 1)); exactly one
size may be -1 and is filled with the remaining devices. Rules map logical axis names (carried by the
policy's parameters) to mesh axes.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P


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
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(axes, len(devices))
  grid = np.asarray(devices, dtype=object).reshape(tuple(shape.values()))
  return Mesh(grid, tuple(shape), axis_types=(AxisType.Auto,) * len(shape))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
