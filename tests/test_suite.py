"""The bundled task suite (kevin_jax/data, kevin_jax/kernels/suite.py) on the CPU.

Every task loads (module imported, Model built and run on the meta device) with the shapes meta.json records;
every labelled candidate parses, validates against its task and compiles with NVRTC (sm_90) — or fails exactly
in the format/compile category its label says; the degenerate candidates compile; the split is deterministic.
What the candidates do on a GPU is checked by tests/test_suite_gpu.py and experiments/verify_suite.py.
"""

import math
import os

import pytest

from configs import multiturn
from kevin_jax.kernels import static, suite, tasks
from kevin_jax.kernels.taskinfo import DISTRIBUTIONS

SUITE = suite.load_suite()
IDS = [t.id for t in SUITE]
GIB = 2**30
_BYTES = {"float32": 4, "float64": 8, "int64": 8, "int32": 4, "float16": 2, "bfloat16": 2, "bool": 1, "uint8": 1}


@pytest.fixture(scope="module")
def infos():
  return {t.id: suite.task_info(t) for t in SUITE}


def test_suite_size_and_layout():
  no_meta, no_task = suite.orphans()
  assert not no_meta, f"tasks without solutions/<id>/meta.json: {no_meta}"
  assert not no_task, f"solution directories without a task file: {no_task}"
  by_level = {lvl: sum(t.level == lvl for t in SUITE) for lvl in (1, 2)}
  assert by_level[1] >= 24, by_level
  assert by_level[2] >= 1, by_level
  assert len(SUITE) == len(tasks.discover("bundled"))


@pytest.mark.parametrize("task_id", IDS)
def test_meta_schema(task_id):
  task = next(t for t in SUITE if t.id == task_id)
  assert suite.meta_problems(task) == []


def test_meta_files_are_canonically_formatted():
  """verify_suite --update-meta rewrites meta.json with format_meta: one format keeps those diffs small."""
  for t in SUITE:
    with open(t.meta_path, encoding="utf-8") as f:
      assert f.read() == suite.format_meta(t.meta), f"{t.meta_path}: rewrite it with suite.write_meta"


def test_meta_format_round_trips():
  """verify_suite --update-meta rewrites meta.json with format_meta: it must keep every value."""
  import json  # pylint: disable=g-import-not-at-top
  for t in SUITE:
    text = suite.format_meta(t.meta)
    assert json.loads(text) == t.meta


def test_tasks_load_with_recorded_shapes(infos):
  for t in SUITE:
    info = infos[t.id]
    actual = suite.shapes_of(info)
    recorded = t.meta["shapes"]
    unknown = sorted(set(recorded) - set(actual))
    assert not unknown, f"{t.id}: meta shapes name unknown tensors {unknown} (known: {sorted(actual)})"
    for name, shape in recorded.items():
      assert actual[name] == shape, f"{t.id}: {name} is {actual[name]}, meta.json says {shape}"
    for k in ("out", "out0"):
      if k in actual:
        assert k in recorded, f"{t.id}: meta.json should record the output shape"


def test_task_sizes_follow_the_conventions(infos):
  """Inputs <= 2.75 GiB together, some dimension not a multiple of 32, fp32 math.

  Read-only reductions (sum, argmax, matrix-vector) stream their input once at ~4 TB/s on an H200: they need
  ~2 GB of input to reach the suite's 0.5 ms reference floor. Inputs are drawn on the GPU (kernels/inputs.py)
  and shapes are analysed on the meta device, so the budget is GPU memory per trial, not host memory.
  """
  for t in SUITE:
    info = infos[t.id]
    sizes = [math.prod(i["shape"]) * _BYTES[i["dtype"]] for i in info.inputs if i["kind"] == "tensor"]
    assert sum(sizes) <= 2.75 * GIB, f"{t.id}: inputs total {sum(sizes) / GIB:.2f} GiB"
    dims = [d for i in info.inputs if i["kind"] == "tensor" for d in i["shape"]]
    dims += [d for o in info.outputs for d in o["shape"]]
    assert any(d % 32 for d in dims if d > 1), f"{t.id}: every dimension is a multiple of 32"
    dists = info.options.get("input_distributions")
    assert dists is None or (dists[0] == "task" and set(dists) <= set(DISTRIBUTIONS)), f"{t.id}: {dists}"
    float_outs = [o["dtype"] for o in info.outputs if o["dtype"].startswith(("float", "bfloat"))]
    assert all(d == "float32" for d in float_outs), f"{t.id}: outputs {float_outs} (the suite is fp32)"


def _static(task, info, text):
  return static.static_check({"task_id": task.id, "task_path": task.spec.path, "text": text,
                              "task_info": info.to_dict(), "arch": "sm_90"})


@pytest.mark.parametrize("task_id", IDS)
def test_labelled_candidates_validate_and_compile(task_id, infos):
  """Runtime labels must pass the static stage ('ok'); format/compile labels must fail there, as labelled."""
  task = next(t for t in SUITE if t.id == task_id)
  info = infos[task_id]
  for c in task.candidates():
    r = _static(task, info, c.text)
    want = c.expect if c.expect in ("format_error", "compile_error") else "ok"
    assert r["status"] == want, f"{c.key}: static check gave {r['status']} ({r['error']}), expected {want}"
    if want == "ok":
      assert r["cubin"][:4] == b"\x7fELF", c.key


def test_degenerate_candidates_validate_and_compile(infos):
  for t in SUITE:
    for c in suite.degenerate_candidates(t.id, infos[t.id]):
      r = _static(t, infos[t.id], c.text)
      assert r["status"] == "ok", f"{c.key}: {r['error']}"


def test_degenerate_candidates_write_what_they_say(infos):
  task = next(t for t in SUITE if t.id == "level1/07_Argmax")  # int64 output, float input
  zeros, const, ident = suite.degenerate_candidates(task.id, infos[task.id], constant=2.5)
  assert "long long* __restrict__ y" in zeros.text and "static_cast<long long>(0.0f)" in zeros.text
  assert "static_cast<long long>(2.5f)" in const.text
  assert "const float* __restrict__ x" in ident.text and "args=(x, x.numel, out0, out0.numel)" in ident.text
  with pytest.raises(ValueError, match="kind must be"):
    suite.degenerate_candidate(task.id, infos[task.id], "ones")


def test_split_is_deterministic_and_stratified():
  specs = tasks.discover("bundled")
  c = multiturn.get_config()
  a_train, a_test = tasks.split(specs, test_fraction=c.tasks.test_fraction, seed=c.tasks.split_seed,
                                train_ids=c.tasks.train_ids, test_ids=c.tasks.test_ids)
  b_train, b_test = tasks.split(list(reversed(specs)), test_fraction=c.tasks.test_fraction, seed=c.tasks.split_seed)
  assert [s.id for s in a_train] == [s.id for s in b_train] and [s.id for s in a_test] == [s.id for s in b_test]
  assert {s.id for s in a_train} | {s.id for s in a_test} == {s.id for s in specs}
  assert not {s.id for s in a_train} & {s.id for s in a_test}
  for level in (1, 2):
    n = sum(s.level == level for s in specs)
    n_test = sum(s.level == level for s in a_test)
    assert n_test == max(1, round(n * c.tasks.test_fraction)), (level, n, n_test)
  _, other_test = tasks.split(specs, test_fraction=c.tasks.test_fraction, seed=c.tasks.split_seed + 1)
  assert [s.id for s in other_test] != [s.id for s in a_test]


def test_split_with_explicit_ids():
  specs = tasks.discover("bundled")
  test_ids = ["level1/01_ReLU", "level1/14_Matmul"]
  train, test = tasks.split(specs, test_ids=test_ids)
  assert [s.id for s in test] == test_ids and len(train) == len(specs) - 2
  with pytest.raises(ValueError, match="unknown task ids"):
    tasks.split(specs, train_ids=["level1/99_Nope"])


def test_candidate_files_split_into_blocks_and_summary():
  task = next(t for t in SUITE if t.id == "level1/01_ReLU")
  with open(os.path.join(task.solutions_dir, "naive.md"), encoding="utf-8") as f:
    raw = f.read()
  text, summary = suite.split_candidate_file(raw)
  assert text.startswith("```cuda") and text.endswith("```") and "Summary" not in text
  assert summary.startswith("One thread per element")
