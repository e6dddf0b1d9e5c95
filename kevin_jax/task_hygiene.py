"""Task hygiene at load (config.tasks.hygiene), for the learner: excluded tasks leave the task list.

'auto' checks KernelBench and other external sources and skips the bundled suite and the generated task world
(their tests gate them); 'on' checks every source; 'off' none. The checks (kernels/hygiene.py) run the references,
so they run in a child process (`python -m kevin_jax.kernels.hygiene`, on a GPU when one is visible: the learner
has not taken GPU memory yet when tasks load) and only for tasks without a cached record: records are cached by
task source sha256 under `<evaluator.cache_dir>/hygiene`, so a restarted job does not check again. The learner
reads the records as plain JSON and never imports torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from absl import logging

from kevin_jax.kernels import compile as compile_lib, hygiene, tasks as tasks_lib

MODES = ("auto", "on", "off")
REPORT_NAME = "task_hygiene"  # workdir/task_hygiene.md and .csv


def enabled(config, source: str) -> bool:
  """Whether tasks.hygiene applies to this (resolved) source."""
  mode = config.tasks.hygiene
  if mode not in MODES:
    raise SystemExit(f"error: tasks.hygiene={mode!r}; expected one of {', '.join(MODES)}")
  if mode != "auto":
    return mode == "on"
  builtin = config.tasks.source == "bundled" or tasks_lib.is_generated(config.tasks.source)
  return not builtin and tasks_lib.world_splits(source) is None


def cache_root(config) -> str:
  """evaluator.cache_dir, or the evaluator's default (~/.cache/kevin_jax/evaluator under XDG_CACHE_HOME): where
  job-independent records live."""
  return os.path.abspath(config.evaluator.cache_dir or compile_lib.default_cache_dir())


def cache_dir(config) -> str:
  return os.path.join(cache_root(config), "hygiene")


def _settings(config) -> dict:
  e = config.evaluator
  return {"atol": float(e.atol), "rtol": float(e.rtol), "distributions": [str(d) for d in e.input_distributions]}


def records(config, source: str, specs) -> list[hygiene.TaskHygiene]:
  """Every task's record: from the cache, else checked in a child process (then cached)."""
  st = _settings(config)
  where = cache_dir(config)
  key = hygiene.settings_key(st["atol"], st["rtol"], st["distributions"])
  have = hygiene.cached(specs, where, key)
  missing = [s for s in specs if s.id not in have]
  if missing:
    logging.info("task hygiene: checking %d of %d tasks (records cached in %s)", len(missing), len(specs), where)
    with tempfile.TemporaryDirectory(prefix="kevin_jax_hygiene_") as tmp:
      out = os.path.join(tmp, "records.json")
      cmd = [sys.executable, "-m", "kevin_jax.kernels.hygiene", "--source", source, "--device", "auto",
             "--ids", ",".join(s.id for s in missing), "--atol", repr(st["atol"]), "--rtol", repr(st["rtol"]),
             "--distributions", ",".join(st["distributions"]), "--cache-dir", where, "--json", out]
      root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # Importable from any working directory.
      env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
      proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
      if proc.returncode != 0 or not os.path.isfile(out):
        raise SystemExit(f"error: the task hygiene checks failed (tasks.hygiene='off' skips them):\n"
                         f"{(proc.stderr or proc.stdout)[-3000:]}")
      with open(out, encoding="utf-8") as f:
        have.update({d["task_id"]: hygiene.TaskHygiene.from_dict(d) for d in json.load(f)})
  return [have[s.id] for s in specs]


def filter_tasks(config, source: str, specs) -> list:
  """specs without the tasks hygiene excludes (unchanged when tasks.hygiene does not apply to the source)."""
  if not specs or not enabled(config, source):
    return specs
  recs = {r.task_id: r for r in records(config, source, specs)}
  excluded = [s.id for s in specs if recs[s.id].verdict == "excluded"]
  flagged = sum(recs[s.id].verdict == "flagged" for s in specs)
  if excluded:
    logging.warning("task hygiene: %d of %d tasks excluded (%s); %d flagged; see %s.md in the workdir",
                    len(excluded), len(specs), ", ".join(excluded[:10]) + (" ..." if len(excluded) > 10 else ""),
                    flagged, REPORT_NAME)
  return [s for s in specs if recs[s.id].verdict != "excluded"]


def write_report(config, source: str, workdir: str) -> tuple[str, str] | None:
  """workdir/task_hygiene.md and .csv for every task of the source (None when hygiene does not apply)."""
  if not enabled(config, source):
    return None
  specs = tasks_lib.discover(source, levels=tuple(config.tasks.levels) if config.tasks.source != "bundled" else None)
  return hygiene.write_report(records(config, source, specs), workdir, REPORT_NAME)
