"""experiments/bench_sample_stats.py on the CPU (interpret mode, a tiny vocabulary): every version runs each round,
draws XLA's tokens, and lands in results.json; a failing version gets an error row, not a crash."""

import json

from experiments import bench_sample_stats


def test_rounds_rows_and_checks(tmp_path):
  bench_sample_stats.main(["--interpret", "--vocab", "4096", "--batch", "4", "--chunks", "8", "--buffers", "2",
                           "--reps", "1", "--rounds", "2", "--configs", "1x8192x4x1,2x64x4x2,1x48x4x1",
                           "--out", str(tmp_path)])
  rows = json.loads((tmp_path / "results.json").read_text())
  assert [r["version"] for r in rows] == ["xla", "pallas 1x8192x4x1", "pallas 2x64x4x2", "pallas 1x48x4x1"] * 2
  ok = [r for r in rows if r["version"] != "pallas 1x48x4x1"]
  assert all(r["us"] > 0 and "error" not in r for r in ok)
  assert all(r["max_rel_diff_vs_xla"] < 1e-5 for r in ok if r["round"] == 0)
  bad = [r for r in rows if r["version"] == "pallas 1x48x4x1"]  # block_n not a power of two
  assert all("power of two" in r["error"] for r in bad)
