"""experiments/decode_ab_table.py on two committed profile_decode records (tests/data/profile_decode)."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import decode_ab_table  # pylint: disable=g-import-not-at-top,wrong-import-position

_RECORDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "profile_decode")


def test_table_of_two_committed_runs():
  runs = [decode_ab_table.load(os.path.join(_RECORDS, f"profile_{n}.json")) for n in ("old1", "new1")]
  rows = decode_ab_table.rows(runs)
  # Older runs: qkv 'xla', no add + norm kernel, no kernel options.
  assert [(r["run"], r["decode_down"], r["decode_fusion"], r["decode_qkv"], r["decode_add_norm"], r["kernel_opts"])
          for r in rows] == [("profile_old1", "xla", False, "xla", "xla", ""),
                             ("profile_new1", "auto", True, "xla", "xla", "")]
  assert round(rows[0]["tok_s"]) == 44349 and round(rows[1]["tok_s"]) == 47458
  text = decode_ab_table.format_tables(rows, n_kernels=3)
  assert "| profile_new1 | 64 | auto | auto | xla | xla | xla | xla | True |  | 47,458 | 1.349 |" in text
  assert "- kevin_decode_down: 5.97 us x 6120" in text  # 36.509 ms over 6,120 launches


def test_failed_run_and_directory_input(tmp_path, capsys):
  run = tmp_path / "new_fusion"
  run.mkdir()
  (run / "results.json").write_text(json.dumps({"decode_qkv": "pallas", "decode_out": "pallas", "generate": [
      {"impl": "pallas", "batch": 64, "error": "ValueError: boom"}]}))
  decode_ab_table.main([str(run)])
  out = capsys.readouterr().out
  assert ("| new_fusion | 64 | None | None | pallas | pallas | xla | xla | None |  | failed: ValueError: boom |"
          in out)
