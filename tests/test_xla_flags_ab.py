"""experiments/xla_flags_ab.py: one profile_decode process per XLA_FLAGS setting, side by side."""

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import xla_flags_ab  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_table_gives_each_setting_its_ratio_to_the_first():
  rows = [{"flags": "", "batch": 64, "decode_tok_s": 40000.0, "ms_per_step": 1.6,
           "decode_ms_per_step_by_class": {"matmul": 0.7, "fusion": 0.45, "attention": 0.35}},
          {"flags": "--xla_a=true", "batch": 64, "decode_tok_s": 44000.0, "ms_per_step": 1.45,
           "decode_ms_per_step_by_class": {"matmul": 0.6}},
          {"flags": "--xla_b=1", "error": "rc=1: Unknown flag"},
          {"flags": "--xla_c=1", "error": "rc=-6: line one | line two"}]
  lines = xla_flags_ab.table(rows).splitlines()
  assert lines[2] == "| (defaults) | 64 | 40,000 | 1.000 | 1.600 | 0.700 | 0.450 | 0.350 |"
  assert lines[3] == "| `--xla_a=true` | 64 | 44,000 | 1.100 | 1.450 | 0.600 | 0.000 | 0.000 |"
  assert lines[4].startswith("| `--xla_b=1` |  | failed: rc=1: Unknown flag |")
  assert lines[5].startswith("| `--xla_c=1` |  | failed: rc=-6: line one \\| line two |")
  columns = [len(re.findall(r"(?<!\\)\|", line)) for line in lines]  # Markdown separators: unescaped pipes.
  assert columns == [columns[0]] * len(lines)


def test_each_setting_runs_in_its_own_process_and_a_rejected_flag_fails_alone(tmp_path):
  out = str(tmp_path / "ab")
  xla_flags_ab.main(["--out", out, "--setting=", "--setting=--xla_no_such_flag_for_the_test=true", "--",
                     "--model", "tiny", "--impls", "interpret", "--batches", "2", "--prompt-len", "64",
                     "--new-tokens", "8", "--no-attention"])
  with open(os.path.join(out, "flags_ab.json"), encoding="utf-8") as f:
    rows = json.load(f)
  assert [r["flags"] for r in rows] == ["", "--xla_no_such_flag_for_the_test=true"]
  assert rows[0]["batch"] == 2 and rows[0]["decode_tok_s"] > 0 and "error" not in rows[0]
  assert "Unknown flag" in rows[1]["error"] and "decode_tok_s" not in rows[1]
  assert os.path.exists(os.path.join(out, "setting0", "results.json"))
  with open(os.path.join(out, "flags_ab.md"), encoding="utf-8") as f:
    assert "(defaults) | 2 |" in f.read()
