"""Suite verification: the GPU test (every labelled and degenerate candidate gets its label on a real GPU) and a
CPU test of the same pipeline (experiments/verify_suite.py) with the evaluator's fake GPU worker.

GPU host:  python -m pytest -q -m gpu tests/test_suite_gpu.py      (one H200: about 5 minutes)
"""

import importlib.util
import json
import os

import pytest

from kevin_jax.kernels import suite
from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _verify_module():
  spec = importlib.util.spec_from_file_location("verify_suite", os.path.join(ROOT, "experiments", "verify_suite.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.mark.gpu
def test_every_candidate_gets_its_label_on_the_gpu():
  vs = _verify_module()
  items = vs.build_items(suite.load_suite())
  cfg = EvaluatorConfig(correctness_trials=5, timing_runs=5, warmup_runs=1)
  with Evaluator(cfg, task_source="bundled") as ev:
    rows = vs.run(ev, items)
  bad = vs.mismatch_lines(rows)
  assert not bad, "\n".join(bad)
  for r in rows:
    if r["kind"] == "solution":
      assert r["result"]["speedup"] and r["result"]["ref_time_ms"], f"{r['task_id']}:{r['candidate']} not timed"


def test_verify_pipeline_with_the_fake_worker(tmp_path, monkeypatch):
  """The fake worker calls every candidate that compiles 'correct' at 2x: wrong variants that only fail on a GPU
  must show up as mismatches; static labels (format/compile errors) come from the real static stage."""
  vs = _verify_module()
  tasks_ = [t for t in suite.load_suite([1]) if t.id in ("level1/04_ELU", "level1/07_Argmax")]
  items = vs.build_items(tasks_)
  assert len(items) == 5 + 4 + 6
  with Evaluator(EvaluatorConfig(correctness_trials=1, timing_runs=2, compile_workers=2), task_source="bundled",
                 _gpu_role="fake", _gpu_slots=1) as ev:
    rows = vs.run(ev, items)
  by = {(r["task_id"], r["candidate"]): r for r in rows}
  assert by[("level1/04_ELU", "wrong_undeclared")]["status"] == "compile_error"
  assert by[("level1/04_ELU", "wrong_undeclared")]["match"]
  assert by[("level1/07_Argmax", "wrong_int32_out")]["status"] == "format_error"
  assert by[("level1/04_ELU", "naive")]["match"] and by[("level1/04_ELU", "optimized")]["match"]
  assert not by[("level1/04_ELU", "wrong_tail")]["match"]  # 'correct' from the fake worker: a mismatch.
  assert not by[("level1/07_Argmax", "degenerate_zeros")]["match"]
  info = vs.per_task(rows)
  assert info["level1/04_ELU"]["best_speedup"] == 2.0 and info["level1/04_ELU"]["ref_time_ms"] == 1.0
  table = vs.summary_table(rows, info)
  assert "| level1/04_ELU | 1.000 | 2.00x | 2.00x | 1/3 as labelled | 0/3 fail |" in table
  bad = vs.mismatch_lines(rows)
  assert any("level1/04_ELU:wrong_tail expected incorrect, got correct" in b for b in bad)
  # --update-meta: numbers into meta.json (captured here, not written) and the compact feedback file.
  results = tmp_path / "results.json"
  results.write_text(json.dumps({"run": {"date": "d", "commit": "c", "device": "fake", "config": {}},
                                 "tasks": info, "results": rows}))
  written = {}
  monkeypatch.setattr(suite, "write_meta", lambda path, meta: written.__setitem__(path, meta))
  compact = tmp_path / "suite_results.json"
  bench = vs.update_meta(str(results), str(compact))
  elu_meta = next(m for p, m in written.items() if "04_ELU" in p)
  assert elu_meta["ref_time_ms_h200"] == 1.0 and elu_meta["best_speedup_h200"] == 2.0
  assert "| level1/04_ELU | elu | 1.000 | 2.00x | naive |" in bench
  data = json.loads(compact.read_text())
  assert data["results"]["level1/04_ELU"]["wrong_undeclared"]["feedback"].startswith("Compilation failed (NVRTC)")
  # A later run over one task replaces that task's entries and keeps the others.
  res = json.loads(results.read_text())
  res["results"] = [r for r in res["results"] if r["task_id"] == "level1/07_Argmax"]
  res["results"][0]["result"]["feedback"] = "new text"
  res["tasks"] = {"level1/07_Argmax": res["tasks"]["level1/07_Argmax"]}
  results.write_text(json.dumps(res))
  vs.update_meta(str(results), str(compact))
  data = json.loads(compact.read_text())
  assert data["results"]["level1/07_Argmax"]["naive"]["feedback"] == "new text"
  assert "wrong_undeclared" in data["results"]["level1/04_ELU"]


def _fake_evaluator(monkeypatch):
  import functools  # pylint: disable=g-import-not-at-top
  from kevin_jax.kernels import evaluator  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(evaluator, "Evaluator", functools.partial(Evaluator, _gpu_role="fake", _gpu_slots=1))


def test_world_verify_pipeline_with_the_fake_worker(tmp_path, monkeypatch):
  """--source generated on the CPU: the stratified sample, the label and eager passes, the tables, and
  --update-world. The fake worker calls every candidate that compiles 'correct' at 2x (1 ms reference)."""
  vs = _verify_module()
  _fake_evaluator(monkeypatch)
  out = tmp_path / "out"
  rc = vs.main(["--source", "generated", "--per-cell", "1", "--out", str(out), "--chunk", "50", "--trials", "1",
                "--no-degenerate", "--workers-per-gpu", "1"])
  assert rc == 1  # Runtime-wrong variants are 'correct' on the fake worker: mismatches, as they must be.
  res = json.loads((out / "results.json").read_text())
  assert len(res["tasks"]) == 15 and {v["family"] for v in res["tasks"].values()} == {
      "elementwise", "reduce", "matmul", "pool", "scan"}
  assert {v["split"] for v in res["tasks"].values()} == {"train", "heldout_compositions", "heldout_styles"}
  for row in res["results"]:
    static_label = row["expect"] in ("format_error", "compile_error")
    assert row["match"] == (static_label or row["expect"] == "correct"), row["candidate"]
  assert all(r["ref_time_ms"] == 1.0 and r["speedup"] == 2.0 for r in res["eager"].values())
  summary = (out / "summary.md").read_text()
  assert "| optimized | 15/15 |" in summary and "degenerate_" not in summary  # --no-degenerate.
  assert "| elementwise | 3 | 1.000 | 1.000 | 1.000 | 1.000 | 1.000 | 3/3 | 2.00x |" in summary
  records = tmp_path / "world_results.json"
  assert "15 tasks" in vs.update_world(str(out / "results.json"), str(records))
  data = json.loads(records.read_text())
  some = next(iter(data["results"].values()))
  assert some["optimized"]["speedup"] == 2.0 and len(some["naive"]["text_sha"]) == 16
  res["run"]["world"]["seed"] = 99
  (out / "results.json").write_text(json.dumps(res))
  with pytest.raises(SystemExit, match="another world"):
    vs.update_world(str(out / "results.json"), str(records))


@pytest.mark.gpu
def test_world_sample_gets_its_labels_on_the_gpu(tmp_path):
  """Two tasks per family x split of the task world (30 tasks, every candidate and the degenerate ones) through
  the real evaluator (one H100/H200: about 2 minutes; the full 300-task check is experiments/verify_suite.py)."""
  vs = _verify_module()
  rc = vs.main(["--source", "generated", "--per-cell", "2", "--out", str(tmp_path), "--trials", "3"])
  bad = vs.mismatch_lines(json.loads((tmp_path / "results.json").read_text())["results"])
  assert rc == 0 and not bad, "\n".join(bad)
