"""Entry point: python -m kevin_jax.main --config=configs/multiturn.py [--workdir=DIR] [--config.x.y=v].

Only flags and dispatch live here; every job is a library function `run(config, workdir)`.
"""

import importlib
import importlib.util
import os

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from kevin_jax import runtime

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A configs/*.py file, optionally with ':preset,...'.", lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (checkpoints, metrics, rollouts). Default: runs/<config file name>.")

# config.mode -> module whose run(config, workdir) does the job.
_JOBS = {"train": "kevin_jax.train", "evaluate": "kevin_jax.evaluate", "sft": "kevin_jax.sft"}


def _parse_flags(argv):
  """absl's parser, but a misspelt --config.x override exits with one line naming the field."""
  try:
    return flags.FLAGS(argv)
  except AttributeError as e:  # ml_collections raises this for an undeclared field of a locked config.
    overrides = [a for a in argv[1:] if a.startswith("--config.")]
    # The message arrives as a repr of a KeyError message; unescape it into one readable line.
    detail = str(e).encode("utf-8").decode("unicode_escape").replace("\n", " ").replace("'", "")
    raise SystemExit(f"error: unknown config field in {' '.join(overrides)}: {detail}") from None


def check_environment(config) -> None:
  """Fails at start-up, not minutes into a job (after a warm start, say), on what the config needs but this
  Python environment lacks."""
  if config.logging.tensorboard and importlib.util.find_spec("tensorboardX") is None:
    raise app.UsageError("config.logging.tensorboard=True needs tensorboardX (pip install -r requirements.txt), "
                         "or run with --config.logging.tensorboard=False (metrics.jsonl only)")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  jax.config.config_with_absl()
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/multiturn.py")
  workdir = _WORKDIR.value or os.path.join(
      "runs", os.path.splitext(os.path.basename(flags.FLAGS["config"].config_filename))[0])
  if config.mode not in _JOBS:
    raise app.UsageError(f"config.mode={config.mode!r}; expected one of {sorted(_JOBS)}")
  check_environment(config)
  runtime.set_xla_gpu_flags(config.policy.triton_gemm)  # Before JAX's backend starts.
  runtime.place_jax_beside_evaluator(config)
  cache = runtime.enable_compilation_cache(config)  # Before the first jit.
  logging.info("process %d/%d, devices: %s", jax.process_index(), jax.process_count(), jax.devices())
  logging.info("mode=%s workdir=%s compilation cache=%s", config.mode, workdir, cache or "off")
  importlib.import_module(_JOBS[config.mode]).run(config, workdir)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
