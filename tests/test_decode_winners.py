"""experiments/decode_winners.py on hand-made part 1 results: per kernel the fastest config over all its cases against
the default (the first Pallas config), and the --kernel-opts value of the winners beyond the noise threshold."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import decode_winners  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import kernel_opts  # pylint: disable=g-import-not-at-top,wrong-import-position


def _write(root, bench, rows):
  os.makedirs(root / bench, exist_ok=True)
  (root / bench / "results.json").write_text(json.dumps({"rows": rows}))


def _rows(case: dict, times: dict, part=None):
  """Two rounds per version; `times` version -> (round 0 us, round 1 us) or 'error'."""
  out = []
  for rnd in (0, 1):
    for version, t in times.items():
      row = {**case, "version": version, "round": rnd, **({"part": part} if part else {})}
      row.update({"error": "boom"} if t == "error" else {"us": t[rnd]})
      out.append(row)
  return out


def test_winners_over_cases_threshold_and_opts(tmp_path, capsys):
  # Attention: two cases; 64x0x4x4x1 wins on the sum (10+12 vs 11+13 for the default) though it loses case 1.
  attn = (_rows({"batch": 64, "visible": 1152}, {"xla": (50, 50), "pallas 64x0x4x2x0": (11, 11),
                                                 "pallas 64x0x4x4x1": (10, 10), "pallas 64x1x4x4x1": "error"})
          + _rows({"batch": 64, "visible": 1984}, {"xla": (80, 80), "pallas 64x0x4x2x0": (13, 13),
                                                   "pallas 64x0x4x4x1": (12, 12), "pallas 64x1x4x4x1": (9, 9)}))
  _write(tmp_path, "attn", attn)
  # q/k/v: the best is only 1 % faster than the default -> not in the options.
  _write(tmp_path, "qkv", _rows({"shape": "0.5b", "batch": 64},
                                {"xla": (12, 12), "pallas 64x16x4x3": (10.0, 10.0), "pallas 16x16x4x7": (9.9, 9.9)}))
  # mlp: the front keeps its default; the down projection's winner also goes to down_partials.
  _write(tmp_path, "mlp",
         _rows({"shape": "0.5b", "batch": 64}, {"xla": (10, 10), "pallas 64x128x4x3": (9, 9),
                                                "pallas 64x128x4x5": (9.5, 9.1)}, part="front")
         + _rows({"shape": "0.5b", "batch": 64}, {"xla": (10, 10), "pallas 64x64x0x4x3": (6, 6.2),
                                                  "pallas 16x64x4x4x5": (4.8, 5.0)}, part="down"))
  lines, opts = decode_winners.winners(str(tmp_path))
  by = {ln["kernel"]: ln for ln in lines}
  assert by["decode_attention.decode_attention"]["best"] == "64x0x4x4x1"
  assert by["decode_attention.decode_attention"]["default_us"] == 24.0
  assert abs(by["decode_attention.decode_attention"]["gain"] - 2 / 24) < 1e-9
  assert by["decode_qkv.qkv_rope_cache"]["best"] == "16x16x4x7"  # best, but within the 2 % threshold
  assert by["decode_mlp.swiglu_front"]["best"] == "64x128x4x3" and by["decode_mlp.swiglu_front"]["gain"] == 0
  assert by["decode_mlp.down_proj"]["best"] == "16x64x4x4x5"
  assert opts == ("decode_attention.decode_attention:block_k=64,num_splits=0,num_warps=4,num_stages=4,balance=1;"
                  "decode_mlp.down_proj:block_n=16,block_k=64,splits=4,num_warps=4,num_stages=5;"
                  "decode_mlp.down_partials:block_n=16,block_k=64,splits=4,num_warps=4,num_stages=5")
  # The value is what --kernel-opts parses.
  assert [t[:2] for t in kernel_opts.parse_kernel_opts(opts)] == [
      ("decode_attention", "decode_attention"), ("decode_mlp", "down_proj"), ("decode_mlp", "down_partials")]
  decode_winners.main([str(tmp_path), "--write", str(tmp_path / "winners.txt")])
  out = capsys.readouterr().out
  assert "| decode_mlp.down_proj | 64x64x0x4x3 | 6.10 | 16x64x4x4x5 | 4.90 | +19.7 % | 10.00 |" in out
  assert (tmp_path / "winners.txt").read_text() == opts + "\n"
  assert "part 3: bash experiments/decode_kernels_ab.sh 3 'new:' 'best:--kernel-opts" in out


def test_no_results_and_no_gain(tmp_path, capsys):
  assert decode_winners.winners(str(tmp_path)) == ([], "")
  with pytest.raises(SystemExit, match="no results.json under"):
    decode_winners.main([str(tmp_path)])
  _write(tmp_path, "addnorm", _rows({"shape": "0.5b", "batch": 64, "splits": 19},
                                    {"xla": (4, 4), "pallas 1x4": (2.3, 2.3), "pallas 2x4": "error"}))
  lines, opts = decode_winners.winners(str(tmp_path))
  assert opts == "" and lines[0]["best"] == "1x4" and lines[0]["xla_us"] == 4.0
  decode_winners.main([str(tmp_path)])
  assert "(none: every default is within --min-gain of the best)" in capsys.readouterr().out


def test_rows_from_the_log_of_a_stage_stopped_before_results_json(tmp_path):
  """A bench killed at its stage limit leaves no results.json: its log's JSON lines (printed as rows finish) serve;
  a case whose rounds did not all finish counts as far as it got."""
  os.makedirs(tmp_path / "logs")
  rows = _rows({"shape": "0.5b", "batch": 64}, {"xla": (12, 12), "pallas 64x16x4x3": (10, 10),
                                                "pallas 16x16x4x7": (8, 8)})[:-1]  # the last row never finished
  (tmp_path / "logs" / "qkv.log").write_text("=== compiling\n" + "\n".join(json.dumps(r) for r in rows) + "\n")
  lines, opts = decode_winners.winners(str(tmp_path))
  assert lines[0]["best"] == "16x16x4x7" and lines[0]["best_us"] == 8.0 and lines[0]["default_us"] == 10.0
  assert opts == "decode_qkv.qkv_rope_cache:block_m=16,block_w=16,num_warps=4,num_stages=7"
