"""Task sources: the bundled suite, the generated task world, a KernelBench-style directory, or one task file.

A task is a KernelBench-format PyTorch program: `class Model(nn.Module)`, `get_inputs()`, `get_init_inputs()`.
Sources: 'bundled'; 'generated' or 'generated:SEED' (kevin_jax/data/taskgen, written once into a
content-addressed directory that every process resolves to the same files); a directory with a task-world
manifest (world.json: named splits, the bundled suite as split 'suite'); a directory with level<N>/ folders or
task files; one task file. Discovery and splitting only read file names and text, so the learner side can list
tasks and build prompts without importing torch; `load_module` executes a task file and belongs to the
evaluator side.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import random
import re
import sys
from typing import Iterable, Sequence

BUNDLED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "tasks")
WORLD_MANIFEST = "world.json"
_LEVEL_DIR = re.compile(r"^level(\d+)$")
_GENERATED = re.compile(r"^generated(:\d+)?$")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Where a task lives. `id` is stable across machines: 'level1/19_ReLU' (directory) or the file stem."""
  id: str
  path: str
  level: int

  @property
  def name(self) -> str:
    return self.id.rsplit("/", 1)[-1]

  @property
  def source(self) -> str:
    return _read(self.path)


@functools.lru_cache(maxsize=None)
def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def is_generated(source: str) -> bool:
  """'generated' or 'generated:SEED'."""
  return bool(_GENERATED.match(str(source).strip()))


def resolve(source: str) -> str:
  """The directory or file a source names; 'generated[:SEED]' is materialised first (default quotas)."""
  if source == "bundled":
    return BUNDLED_DIR
  if is_generated(source):
    from kevin_jax.data.taskgen import world  # pylint: disable=g-import-not-at-top  # Pure Python; imports us.
    return world.materialize(world.WorldConfig.parse(source))
  return os.path.abspath(os.path.expanduser(source))


def discover(source: str = "bundled", levels: Sequence[int] | None = None) -> list[TaskSpec]:
  """Lists the tasks of a source, sorted by id (a task world: in manifest order).

  Args:
    source: 'bundled', 'generated[:SEED]', a task-world directory, a directory holding level<N>/
      subdirectories (a KernelBench checkout's `KernelBench/` folder) or task files directly, or one task file.
    levels: keep only these levels; None = all.
  Raises:
    FileNotFoundError: the source does not exist or holds no task files.
  """
  root = resolve(source)
  if os.path.isfile(os.path.join(root, WORLD_MANIFEST)):
    specs = [s for split in world_splits(root).values() for s in split]
    return [s for s in specs if levels is None or s.level in levels]
  if os.path.isfile(root):
    if not root.endswith(".py"):
      raise FileNotFoundError(f"task file must be a .py file: {root}")
    return [TaskSpec(id=os.path.splitext(os.path.basename(root))[0], path=root, level=0)]
  if not os.path.isdir(root):
    raise FileNotFoundError(f"task source {source!r} not found (resolved to {root})")
  specs = []
  for entry in sorted(os.listdir(root)):
    full = os.path.join(root, entry)
    m = _LEVEL_DIR.match(entry)
    if m and os.path.isdir(full):
      level = int(m.group(1))
      if levels is not None and level not in levels:
        continue
      specs += [TaskSpec(id=f"{entry}/{os.path.splitext(f)[0]}", path=os.path.join(full, f), level=level)
                for f in sorted(os.listdir(full)) if _is_task_file(f)]
    elif _is_task_file(entry) and os.path.isfile(full):
      specs.append(TaskSpec(id=os.path.splitext(entry)[0], path=full, level=0))
  if not specs:
    raise FileNotFoundError(
        f"no task files in {root}" + (f" for levels {list(levels)}" if levels is not None else ""))
  return sorted(specs, key=lambda s: (s.level, _natural_key(s.id)))


def check_kernelbench_tree(source: str, levels: Sequence[int]) -> str:
  """The absolute path of `source` if it is a KernelBench checkout's `KernelBench/` folder: a directory holding a
  level<N>/ folder with task files for every level in `levels`. Raises FileNotFoundError naming what was looked
  for (and the inner folder when `source` is the checkout's root)."""
  if not source:
    raise FileNotFoundError("no KernelBench checkout given: set --config.tasks.source=DIR, DIR = a checkout's "
                            "KernelBench/ folder (holding level1/, level2/ ...)")
  root = os.path.abspath(os.path.expanduser(source))
  wanted = [f"level{n}" for n in levels]
  if not os.path.isdir(root):
    raise FileNotFoundError(f"KernelBench folder {root} does not exist (tasks.source={source!r}; expected a "
                            f"checkout's KernelBench/ folder holding {', '.join(w + '/' for w in wanted)})")
  missing = [w for w in wanted if not os.path.isdir(os.path.join(root, w))
             or not any(_is_task_file(f) for f in os.listdir(os.path.join(root, w)))]
  if missing:
    inner = os.path.join(root, "KernelBench")
    hint = (f"; the checkout's task folder is {inner}: pass --config.tasks.source={inner}"
            if all(os.path.isdir(os.path.join(inner, w)) for w in wanted) else "")
    raise FileNotFoundError(f"{root} is not a KernelBench tree: looked for task files (*.py) in "
                            f"{', '.join(os.path.join(root, w) + '/' for w in missing)}{hint}")
  return root


@functools.lru_cache(maxsize=16)
def _manifest(root: str) -> dict:
  with open(os.path.join(root, WORLD_MANIFEST), encoding="utf-8") as f:
    return json.load(f)


def world_splits(source: str) -> dict[str, list[TaskSpec]] | None:
  """{split: tasks} of a task world (a 'generated' source or a directory with world.json); None otherwise.

  Splits: train, heldout_compositions, heldout_styles (kevin_jax/data/taskgen/world.py) and suite (the bundled
  tasks, from this package's copy).
  """
  root = resolve(source)
  if not os.path.isfile(os.path.join(root, WORLD_MANIFEST)):
    return None
  m = _manifest(root)
  out: dict[str, list[TaskSpec]] = {}
  for t in m["tasks"]:
    out.setdefault(t["split"], []).append(TaskSpec(id=t["id"], path=os.path.join(root, t["path"]), level=t["level"]))
  out["suite"] = [TaskSpec(id=t["id"], path=os.path.join(BUNDLED_DIR, t["id"] + ".py"), level=t["level"])
                  for t in m["suite"]]
  return out


def _is_task_file(name: str) -> bool:
  return name.endswith(".py") and not name.startswith(("_", "."))


def _natural_key(task_id: str):
  return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", task_id)]


def split(specs: Sequence[TaskSpec], *, test_fraction: float = 0.25, seed: int = 0,
          train_ids: Iterable[str] = (), test_ids: Iterable[str] = ()) -> tuple[list[TaskSpec], list[TaskSpec]]:
  """Deterministic train/test split, stratified by level.

  With explicit `train_ids` the test set is `test_ids` (or every other task when empty); unknown ids are an
  error. Otherwise each level's tasks are shuffled with a seed derived from (seed, level) and the first
  round(n * test_fraction) go to test (at least one when the level has two or more tasks and fraction > 0).
  """
  by_id = {s.id: s for s in specs}
  train_ids, test_ids = list(train_ids), list(test_ids)
  if train_ids or test_ids:
    unknown = sorted(set(train_ids + test_ids) - set(by_id))
    if unknown:
      raise ValueError(f"unknown task ids in the split: {unknown[:10]}{' ...' if len(unknown) > 10 else ''}")
    overlap = sorted(set(train_ids) & set(test_ids))
    if overlap:
      raise ValueError(f"task ids in both train and test: {overlap[:10]}")
    if not train_ids:
      train_ids = [i for i in by_id if i not in set(test_ids)]
    if not test_ids:
      test_ids = [i for i in by_id if i not in set(train_ids)]
    return [by_id[i] for i in train_ids], [by_id[i] for i in test_ids]
  if not 0.0 <= test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
  train, test = [], []
  for level in sorted({s.level for s in specs}):
    group = sorted((s for s in specs if s.level == level), key=lambda s: s.id)
    random.Random(f"kevin_jax-split:{seed}:{level}").shuffle(group)
    n_test = round(len(group) * test_fraction)
    if test_fraction > 0 and len(group) >= 2:
      n_test = max(n_test, 1)
    test += group[:n_test]
    train += group[n_test:]
  key = lambda s: (s.level, _natural_key(s.id))
  return sorted(train, key=key), sorted(test, key=key)


def load_module(spec: TaskSpec):
  """Executes a task file (evaluator side: imports torch) and checks it has the KernelBench entry points."""
  mod_name = "kevin_task_" + re.sub(r"\W", "_", spec.id)
  module_spec = importlib.util.spec_from_file_location(mod_name, spec.path)
  if module_spec is None or module_spec.loader is None:
    raise ImportError(f"cannot load task {spec.id} from {spec.path}")
  module = importlib.util.module_from_spec(module_spec)
  sys.modules[mod_name] = module
  try:
    module_spec.loader.exec_module(module)
  except Exception:
    sys.modules.pop(mod_name, None)
    raise
  missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
  if missing:
    raise ImportError(f"task {spec.id} lacks {', '.join(missing)} (KernelBench format)")
  return module
