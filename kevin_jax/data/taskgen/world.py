"""The generated task world: seeded families of tasks, their splits, their candidates, and their files.

`build(WorldConfig(seed, train, heldout_compositions, heldout_styles))` draws, per family, a stream of specs
(draw k uses random.Random("kevin_jax-taskgen:<seed>:<family>:<k>"), so a world with larger quotas extends a
smaller one) and files each into a split:
  heldout_compositions  the spec contains a held-out op pair (spec.heldout_pair) and a held-out size;
  heldout_styles        otherwise, when sha256("kevin_jax-style:<spec.signature>") % STYLE_MODULUS == 0:
                        compositions without held-out pairs, none of whose kernels is in training (tasks of one
                        signature share their kernels), and whose warm-start corpus entries are naive only;
  train                 everything else;
until every split has its quota per family. The bundled 40-task suite is a fourth split, `suite`. Splits are
disjoint by construction (one split per spec, ids unique).

`materialize(config)` writes the world's task modules and a manifest (world.json) into a content-addressed
directory (the digest of every file written), atomically and idempotently, so every process (learner,
evaluator, compile workers) resolves a source such as 'generated:0' to the same files; `kernels.tasks.discover`
reads the manifest. Pure Python: no torch, no JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
from typing import Sequence

from kevin_jax.data.taskgen import elementwise, matmul, pool, reduce, scan
from kevin_jax.data.taskgen import spec as spec_lib
from kevin_jax.data.taskgen.render import Written
from kevin_jax.data.taskgen.spec import Spec
from kevin_jax.kernels import suite, tasks

FAMILIES = {m.FAMILY: m for m in (elementwise, reduce, matmul, pool, scan)}
GENERATED_SPLITS = ("train", "heldout_compositions", "heldout_styles")
SPLITS = GENERATED_SPLITS + ("suite",)
STYLE_MODULUS = 8
MAX_DRAWS = 20_000  # Per family: a quota the stream cannot fill is an error, not a hang.
MANIFEST = "world.json"
_SOURCE = re.compile(r"^generated(?::(\d+))?$")  # kernels/tasks.is_generated matches the same strings.


@dataclasses.dataclass(frozen=True)
class WorldConfig:
  """What determines a world: its seed and its per-family quotas (configs/multiturn.py tasks.world_*)."""
  seed: int = 0
  train: int = 160
  heldout_compositions: int = 24
  heldout_styles: int = 16

  def __post_init__(self):
    if min(self.train, self.heldout_compositions, self.heldout_styles) < 0 or self.seed < 0:
      raise ValueError(f"world seed and quotas must be >= 0, got {self}")

  @classmethod
  def parse(cls, source: str) -> "WorldConfig":
    """'generated' (seed 0) or 'generated:SEED', default quotas."""
    m = _SOURCE.match(source.strip())
    if m is None:
      raise ValueError(f"not a generated task source: {source!r} (expected 'generated' or 'generated:SEED')")
    return cls(seed=int(m.group(1) or 0))

  @classmethod
  def from_config(cls, tasks_cfg) -> "WorldConfig":
    return cls(seed=int(tasks_cfg.world_seed), train=int(tasks_cfg.world_train),
               heldout_compositions=int(tasks_cfg.world_heldout_compositions),
               heldout_styles=int(tasks_cfg.world_heldout_styles))

  def quota(self, split: str) -> int:
    return getattr(self, split)


@dataclasses.dataclass(frozen=True)
class GenTask:
  """One generated task: its spec, split and everything rendered from it."""
  spec: Spec
  split: str

  @property
  def id(self) -> str:
    return self.spec.id

  @property
  def family(self) -> str:
    return self.spec.family

  @property
  def level(self) -> int:
    return self.spec.level

  @property
  def source(self) -> str:
    return FAMILIES[self.family].module(self.spec)

  @property
  def reduced_source(self) -> str:
    """The same module at the reduced sizes (CPU emulator, CI degenerate gate)."""
    return FAMILIES[self.family].module(self.spec, reduced=True)

  def written(self) -> list[Written]:
    return list(_written(self.spec))

  def candidates(self, kinds: Sequence[str] = ("solution", "variant")) -> list[suite.SuiteCandidate]:
    """The labelled candidates (kernels.suite.SuiteCandidate, as the bundled suite's)."""
    out = []
    for w in self.written():
      kind = "solution" if w.expect == "correct" else "variant"
      if kind in kinds:
        out.append(suite.SuiteCandidate(task_id=self.id, name=w.name, kind=kind, expect=w.expect, text=w.text,
                                        summary=w.summary, bug=w.bug))
    return out

  @property
  def meta(self) -> dict:
    """The bundled suite's meta.json fields that the corpus export reads."""
    return {"level": self.level, "ops": list(self.spec.ops), "family": self.family, "split": self.split,
            "shapes": dict(self.spec.dims), "description": FAMILIES[self.family].describe(self.spec),
            "solutions": {w.name: {"expect": w.expect, **({"bug": w.bug} if w.bug else {})} for w in self.written()}}


@functools.lru_cache(maxsize=4096)
def _written(spec: Spec) -> tuple[Written, ...]:
  """The writer's candidates of a spec (seeded by its id: the same spec always gets the same candidates)."""
  return tuple(FAMILIES[spec.family].candidates(spec, random.Random(f"kevin_jax-writer:{spec.id}")))


@dataclasses.dataclass(frozen=True)
class World:
  config: WorldConfig
  tasks: tuple[GenTask, ...]
  draws: dict  # Family -> specs drawn to fill the quotas (the stream's length).

  def split(self, name: str) -> list[GenTask]:
    if name not in GENERATED_SPLITS:
      raise ValueError(f"unknown generated split {name!r} (known: {', '.join(GENERATED_SPLITS)})")
    return [t for t in self.tasks if t.split == name]

  def by_id(self) -> dict[str, GenTask]:
    return {t.id: t for t in self.tasks}


def classify(spec: Spec) -> str:
  """The split a spec belongs to (module docstring)."""
  if any(spec_lib.heldout_pair(a, b) for a, b in spec.pairs):
    return "heldout_compositions"
  h = int(hashlib.sha256(f"kevin_jax-style:{spec.signature}".encode()).hexdigest()[:12], 16)
  return "heldout_styles" if h % STYLE_MODULUS == 0 else "train"


def shapes_follow_split(spec: Spec, split: str) -> bool:
  """Training and held-out-style tasks use no held-out size; held-out compositions at least one."""
  held = [spec_lib.heldout_dim(v) for _, v in spec.dims]
  return any(held) if split == "heldout_compositions" else not any(held)


@functools.lru_cache(maxsize=8)
def build(config: WorldConfig) -> World:
  """The world of `config` (module docstring); deterministic."""
  out, draws = [], {}
  seen: set[str] = set()
  for family, fam in FAMILIES.items():
    counts = dict.fromkeys(GENERATED_SPLITS, 0)
    k = 0
    while any(counts[s] < config.quota(s) for s in GENERATED_SPLITS):
      if k >= MAX_DRAWS:
        raise RuntimeError(f"family {family}: {MAX_DRAWS} draws did not fill the quotas ({counts})")
      spec = fam.sample(random.Random(f"kevin_jax-taskgen:{config.seed}:{family}:{k}"))
      k += 1
      if spec is None or spec.id in seen:
        continue
      split = classify(spec)
      if counts[split] >= config.quota(split) or not shapes_follow_split(spec, split):
        continue
      seen.add(spec.id)
      counts[split] += 1
      out.append(GenTask(spec, split))
    draws[family] = k
  # Interleave the families (each split's task k of every family, then k + 1, ...): any prefix of a split is
  # stratified by family.
  pos: dict[tuple[str, str], int] = {}
  keyed = []
  for t in out:
    pos[t.family, t.split] = pos.get((t.family, t.split), -1) + 1
    keyed.append(((pos[t.family, t.split], list(FAMILIES).index(t.family)), t))
  return World(config, tuple(t for _, t in sorted(keyed, key=lambda kt: kt[0])), draws)


def manifest(world: World) -> dict:
  c = world.config
  return {"world": dataclasses.asdict(c),
          "tasks": [{"id": t.id, "path": f"{t.id}.py", "level": t.level, "split": t.split, "family": t.family,
                     "ops": list(t.spec.ops)} for t in world.tasks],
          "suite": [{"id": s.id, "level": s.level} for s in tasks.discover("bundled")]}


def from_source(source: str) -> World | None:
  """The world behind a source: 'generated[:SEED]' or a directory with a manifest (its recorded config); None
  for any other source."""
  if tasks.is_generated(source):
    return build(WorldConfig.parse(source))
  path = os.path.join(os.path.abspath(os.path.expanduser(str(source))), MANIFEST)
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    return build(WorldConfig(**json.load(f)["world"]))


def default_root() -> str:
  env = os.environ.get("KEVIN_JAX_TASKGEN_DIR")
  if env:
    return os.path.abspath(os.path.expanduser(env))
  return os.path.join(os.path.expanduser(os.environ.get("XDG_CACHE_HOME", "~/.cache")), "kevin_jax", "taskgen")


_MATERIALIZED: dict[tuple[WorldConfig, str], str] = {}  # (config, root) -> its directory, in this process.


def materialize(config: WorldConfig, root: str | None = None) -> str:
  """Writes the world's files once into <root>/<digest>/ and returns that directory (module docstring). A process
  renders and hashes the files once per (config, root), while the directory stays in place."""
  root = root or default_root()
  known = _MATERIALIZED.get((config, root))
  if known and os.path.isfile(os.path.join(known, MANIFEST)):
    return known
  _MATERIALIZED[config, root] = final = _materialize(config, root)
  return final


def _materialize(config: WorldConfig, root: str) -> str:
  world = build(config)
  files = {MANIFEST: json.dumps(manifest(world), indent=1, sort_keys=True) + "\n"}
  for t in world.tasks:
    files[f"{t.id}.py"] = t.source
  h = hashlib.sha256()
  for name in sorted(files):
    h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
  final = os.path.join(root, f"world-{h.hexdigest()[:16]}")
  if os.path.isfile(os.path.join(final, MANIFEST)):
    return final
  os.makedirs(root, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tmp-", dir=root)
  try:
    for name, text in files.items():
      path = os.path.join(tmp, name)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    try:
      os.rename(tmp, final)  # Atomic; fails when another process got there first (its copy is identical).
    except OSError:
      if not os.path.isfile(os.path.join(final, MANIFEST)):
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return final
