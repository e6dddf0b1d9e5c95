"""experiments/bench_ab_table.py: part 5's bench_sampler runs side by side."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import bench_ab_table  # pylint: disable=g-import-not-at-top,wrong-import-position


def _write(root, name, tok_s, frac, **args):
  os.makedirs(root / name)
  res = {"args": {"decode_add_norm": "xla", "decode_fusion": 0, "decode_out": "xla", "kernel_opts": "", **args},
         "models": {"0.5b": {"jax": {"runs": [{"decode_tok_s": tok_s, "roofline_frac": frac}]}}}}
  (root / name / "results.json").write_text(json.dumps(res))


def test_table_means_and_ratios(tmp_path):
  _write(tmp_path, "new1", 45000.0, 0.45)
  _write(tmp_path, "new2", 47000.0, 0.47)
  _write(tmp_path, "addnorm1", 48000.0, 0.48, decode_add_norm="pallas", kernel_opts="decode_mlp.down_proj:splits=4")
  _write(tmp_path, "addnorm2", 50000.0, 0.50, decode_add_norm="pallas", kernel_opts="decode_mlp.down_proj:splits=4")
  os.makedirs(tmp_path / "logs")  # not a run
  (tmp_path / "failed1").mkdir()  # a run that wrote nothing
  lines = bench_ab_table.table(bench_ab_table.load(str(tmp_path))).splitlines()
  assert lines[2] == "| new | 45,000 / 47,000 | 46,000 | 1.000 | 46.0 % | add_norm=xla fusion=0 out=xla |"
  assert lines[3] == ("| addnorm | 48,000 / 50,000 | 49,000 | 1.065 | 49.0 % | add_norm=pallas fusion=0 out=xla "
                      "decode_mlp.down_proj:splits=4 |")
  assert len(lines) == 4
  with pytest.raises(SystemExit, match="no bench_sampler results"):
    bench_ab_table.table(bench_ab_table.load(str(tmp_path / "logs")))


def test_settings_name_the_fused_head(tmp_path):
  """decode_head shows in the settings only when it is not the default 'xla' (older results have no such arg);
  bench_sampler's --xla-flags only when set."""
  _write(tmp_path, "new1", 46000.0, 0.46)
  _write(tmp_path, "head1", 48300.0, 0.48, decode_head="pallas")
  _write(tmp_path, "head2", 48500.0, 0.49, decode_head="pallas")
  _write(tmp_path, "pdl1", 46460.0, 0.465, xla_flags="--xla_gpu_enable_pdl=true")
  _write(tmp_path, "plain1", 46000.0, 0.46, xla_flags="")
  lines = bench_ab_table.table(bench_ab_table.load(str(tmp_path))).splitlines()
  assert lines[2].endswith("| add_norm=xla fusion=0 out=xla |")
  assert lines[3] == "| head | 48,300 / 48,500 | 48,400 | 1.052 | 48.5 % | add_norm=xla fusion=0 out=xla head=pallas |"
  assert lines[4] == ("| pdl | 46,460 | 46,460 | 1.010 | 46.5 % | add_norm=xla fusion=0 out=xla "
                      "xla_flags=--xla_gpu_enable_pdl=true |")
  assert lines[5] == "| plain | 46,000 | 46,000 | 1.000 | 46.0 % | add_norm=xla fusion=0 out=xla |"


def test_a_variant_name_may_end_in_digits(tmp_path):
  """The round is the folder's last digit only: 'bal2' rounds 1 and 2 ('bal21', 'bal22') stay 'bal2', apart from
  'bal' (whose rounds were read as 'bal' 21 and 22 before)."""
  _write(tmp_path, "bal1", 40000.0, 0.40)
  _write(tmp_path, "bal21", 42000.0, 0.42, kernel_opts="decode_attention.decode_attention:num_splits=2")
  _write(tmp_path, "bal22", 44000.0, 0.44, kernel_opts="decode_attention.decode_attention:num_splits=2")
  runs = bench_ab_table.load(str(tmp_path))
  assert sorted(runs) == ["bal", "bal2"]
  assert [r for r, _, _ in runs["bal2"]] == [1, 2] and len(runs["bal"]) == 1
