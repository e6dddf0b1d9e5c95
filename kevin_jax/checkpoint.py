"""Orbax checkpoints for a run directory: state pytree + step + RNG + task-sampler state + config.

Layout: workdir/checkpoints/<step>/{state, meta}. `state` is any pytree of arrays (parameters, optimizer state);
`meta` is JSON: the step, the RNG key data, a JSON-able sampler state and the config. Orbax writes each step into
a temporary directory and renames it only once complete, so an interrupted save leaves the previous step as the
latest good checkpoint; leftovers of interrupted saves are removed when the manager opens.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


class _QuietOrbax(logging.Filter):
  """Orbax logs a dozen INFO lines per save through absl; keep its warnings and errors only."""

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or "/orbax/" not in record.pathname.replace("\\", "/")


logging.getLogger("absl").addFilter(_QuietOrbax())


@dataclasses.dataclass
class Restored:
  """What `Checkpointer.restore` returns."""
  step: int
  state: Any  # The pytree, laid out like the abstract target (shardings included).
  rng: jax.Array | None  # A typed PRNG key, or None if none was saved.
  sampler_state: dict  # Whatever JSON the run saved (task-sampler position, epoch, ...).
  config: dict | None  # The config saved with the checkpoint, as a dict.


class Checkpointer:
  """Save/restore of training state in `directory`; keeps the last `keep` steps."""

  def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, cleanup_tmp_directories=True,
        enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, *, rng: jax.Array | None = None,
           sampler_state: dict | None = None, config: Any = None) -> None:
    """Starts saving `state` at `step` (asynchronously by default; call `wait()` before exiting)."""
    meta = {
        "step": int(step),
        "rng": None if rng is None else np.asarray(jax.random.key_data(rng)).tolist(),
        "rng_impl": None if rng is None else str(jax.random.key_impl(rng)),
        "sampler_state": sampler_state or {},
        "config": _config_to_dict(config),
    }
    self._manager.save(
        int(step), args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)

  def restore(self, abstract_state: Any, step: int | None = None) -> Restored:
    """Restores into `abstract_state` (arrays or jax.ShapeDtypeStruct, shardings honoured).

    Args:
      abstract_state: the target pytree; its leaves' shapes, dtypes and shardings decide the layout.
      step: which step; None = the latest.
    Raises:
      FileNotFoundError: no checkpoint (or not that step) in the directory.
    """
    step = self.latest_step() if step is None else step
    if step is None or step not in self.all_steps():
      raise FileNotFoundError(
          f"no checkpoint{'' if step is None else f' for step {step}'} in {self.directory} "
          f"(steps present: {self.all_steps()})")
    abstract = jax.tree.map(_as_abstract, abstract_state)
    out = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    meta = out["meta"]
    rng = None
    if meta.get("rng") is not None:
      data = np.asarray(meta["rng"], dtype=np.uint32)
      rng = jax.random.wrap_key_data(data, impl=meta.get("rng_impl") or None)
    return Restored(step=int(meta["step"]), state=out["state"], rng=rng,
                    sampler_state=meta.get("sampler_state") or {}, config=meta.get("config"))

  def wait(self) -> None:
    """Blocks until every started save is on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def _as_abstract(x: Any) -> Any:
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  if isinstance(x, jax.Array):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
  if isinstance(x, np.ndarray):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)
  return x


def _config_to_dict(config: Any) -> dict | None:
  if config is None:
    return None
  if hasattr(config, "to_dict"):
    config = config.to_dict()
  # Tuples and other non-JSON leaves become lists/strings; the file is for humans and resume checks.
  return jax.tree.map(lambda v: v if isinstance(v, (int, float, str, bool, type(None))) else str(v),
                      config, is_leaf=lambda v: isinstance(v, (tuple, list)))
