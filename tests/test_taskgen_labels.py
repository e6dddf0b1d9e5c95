"""The kernel writer's labels, checked on the CPU for every family (the GPU check: experiments/verify_suite.py
--source generated, tests/test_suite_gpu.py).

For a fixed sample of the default world (per family, the first tasks in world order that bring a candidate name
not seen yet, or a split: every style and mutation the writer renders in the world, every split): every
candidate's plan validates against the task and its code
compiles with NVRTC (sm_90) exactly when its label says it should (format_error / compile_error candidates fail
there, in that category); every candidate gets its label in the CPU emulator (kernels/emulate) at the task's
reduced sizes, seeds fixed; the degenerate gate passes on the reduced twins of a sample of every family and split
(at the real sizes: `-m slow`).
"""

import collections
import re
import types

import pytest

from kevin_jax.data.taskgen import world
from kevin_jax.kernels import static, suite, taskinfo, tasks
from kevin_jax.kernels.emulate import emulator

GATE_PER_CELL = 6  # Reduced twins per family and split in the CPU degenerate gate.


def covering_sample(w: world.World) -> list:
  """Per family, the first tasks (world order) that add a candidate name or a split not yet in the sample."""
  chosen = []
  for family in world.FAMILIES:
    mine = [t for t in w.tasks if t.family == family]
    names, splits = set(), set()
    for t in mine:
      new = {c.name for c in t.candidates()} - names
      if new or t.split not in splits:
        chosen.append(t)
        names |= new
        splits.add(t.split)
  return chosen


@pytest.fixture(scope="module")
def sample():
  w = world.build(world.WorldConfig())
  root = world.materialize(world.WorldConfig())
  specs = {s.id: s for s in tasks.discover(root)}
  return [(t, specs[t.id], t.candidates()) for t in covering_sample(w)]


def test_sample_covers_every_family_style_and_mutation(sample):
  w = world.build(world.WorldConfig())
  every = {(t.family, c.name) for t in w.tasks for c in t.candidates()}
  assert {(t.family, c.name) for t, _, cands in sample for c in cands} == every
  assert {(t.family, t.split) for t, _, _ in sample} == {(f, s) for f in world.FAMILIES
                                                          for s in world.GENERATED_SPLITS}
  expects = collections.Counter(c.expect for _, _, cands in sample for c in cands)
  assert {"correct", "incorrect", "runtime_error", "format_error"} <= set(expects) and len(sample) < 40


def test_plans_validate_and_compile_with_nvrtc_as_labelled(sample, tmp_path):
  for t, spec, cands in sample:
    info = taskinfo.analyze_task(spec)
    for c in cands:
      r = static.static_check({"task_id": t.id, "task_path": spec.path, "text": c.text, "task_info": info.to_dict(),
                               "arch": "sm_90", "cache_dir": str(tmp_path)})
      want = c.expect if c.expect in ("format_error", "compile_error") else "ok"
      assert r["status"] == want, f"{c.key}: static check gave {r['status']} ({r['error']}), expected {want}"
      if want == "ok":
        assert r["cubin"][:4] == b"\x7fELF", c.key
    for c in suite.degenerate_candidates(t.id, info):
      assert static.validate(c.text, info, static.Limits())


def test_every_candidate_gets_its_label_in_the_emulator(sample):
  emulator.prepare([c.text for _, _, cands in sample for c in cands])  # One g++ build for the whole sample.
  bad = []
  for t, _, cands in sample:
    module = emulator.load_module(source=t.reduced_source)
    for c in cands:
      status, msg = emulator.run(module, c.text, seed=0)
      if status != c.expect:
        bad.append(f"{c.key}: expected {c.expect}, got {status} ({msg[:160]})")
  assert not bad, "\n".join(bad)


def _gate(source: str) -> list[str]:
  module = types.ModuleType("gated")
  exec(compile(source, "gated", "exec"), module.__dict__)  # pylint: disable=exec-used  # A generated task module.
  return [p for st in suite.gate_module(module) for p in st["problems"]]


def test_degenerate_gate_passes_on_reduced_twins():
  w = world.build(world.WorldConfig())
  cells = collections.defaultdict(list)
  for t in w.tasks:
    if len(cells[t.family, t.split]) < GATE_PER_CELL:
      cells[t.family, t.split].append(t)
  assert len(cells) == len(world.FAMILIES) * len(world.GENERATED_SPLITS)
  bad = {t.id: p for ts in cells.values() for t in ts if (p := _gate(t.reduced_source))}
  assert not bad, bad


def _input_numel(t) -> int:
  d = dict(t.spec.dims)
  return d.get("B", 1) * d.get("BT", 1) * d.get("C", 1) * d.get("R", 1) * d.get("M", 1) * d.get("N", 1) * d.get(
      "K", 1) * d.get("L", 1) * d.get("H", 1) * d.get("W", 1)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(world.FAMILIES))
def test_degenerate_gate_passes_at_real_sizes(family):
  """At the real sizes, per family the held-out-composition task with the smallest inputs (CPU torch, seconds each
  on 2 cores); `python -m kevin_jax.kernels.check_tasks --source generated --gate full` runs the whole world."""
  w = world.build(world.WorldConfig())
  t = min([t for t in w.split("heldout_compositions") if t.family == family], key=_input_numel)
  assert not _gate(t.source), t.id


def test_check_tasks_summarises_a_world(tmp_path, monkeypatch, capsys):
  """`check_tasks --source generated --config FILE`: the config's world, per family its split sizes, loads, the
  degenerate gate on the reduced twins; a failing task is named and fails the command."""
  from kevin_jax.kernels import check_tasks  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("KEVIN_JAX_TASKGEN_DIR", str(tmp_path / "worlds"))
  cfg = tmp_path / "small.py"
  cfg.write_text("from configs import multiturn\n\n\ndef get_config(arg=''):\n  c = multiturn.get_config(arg)\n"
                 "  c.tasks.world_seed, c.tasks.world_train = 5, 2\n"
                 "  c.tasks.world_heldout_compositions, c.tasks.world_heldout_styles = 1, 1\n  return c\n")
  assert check_tasks.main(["--source", "generated", "--config", str(cfg)]) == 0
  out = capsys.readouterr().out
  assert "task world: seed 5; per family 2 train, 1 heldout_compositions, 1 heldout_styles" in out
  for family in world.FAMILIES:
    assert re.search(rf"^{family} +2 +1 +1 +4/4 +4/4 ", out, re.M), out
  assert "suite: 40 bundled tasks" in out and "20 generated tasks: 20 load, 0 fail; degenerate gate at reduced" in out
  victim = world.build(world.WorldConfig(5, 2, 1, 1)).tasks[0].id
  real = check_tasks.gate_task
  monkeypatch.setattr(check_tasks, "gate_task", lambda t, full=False: ["out0: constant"] if t.id == victim
                      else real(t, full))
  assert check_tasks.main(["--source", "generated", "--config", str(cfg), "--gate", "reduced"]) == 1
  assert f"FAIL  {victim} [" in capsys.readouterr().out
