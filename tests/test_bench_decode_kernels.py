"""experiments/bench_decode_kernels.py on the CPU (interpret mode, the small preset, one layer, one rep): every
kernel's harness runs XLA's version and a Pallas config, each close to XLA's result; a failing config gets an error
row, not a crash; bad --kernels / --config values are refused."""

import json

import pytest

from experiments import bench_decode_kernels


def test_every_kernel_against_xla(tmp_path, capsys):
  configs = {"attention": "64x0x4x3x1", "qkv": "64x16x4x5", "front": "64x128x4x4", "down": "64x64x4x4x5",
             "oproj": "16x128x4x3", "stats": "1x8192x4x3,1x48x4x1"}  # 48: not a power of two
  bench_decode_kernels.main(
      ["--interpret", "--shapes", "small", "--batches", "16", "--layers", "1", "--reps", "1", "--rounds", "1",
       "--prompt-len", "64", "--new", "64", "--gen-visible", "32", "--slots", "128", "--chunks", "8",
       "--buffers", "1", "--out", str(tmp_path)] + [a for k, c in configs.items() for a in ("--config", f"{k}={c}")])
  rows = json.loads((tmp_path / "results.json").read_text())["rows"]
  got = {(r["kernel"], r["version"]): r for r in rows}
  assert len(rows) == len(got) == 13
  for kernel, c in configs.items():
    xla, pallas = got[(kernel, "xla")], got[(kernel, f"pallas {c.split(',')[0]}")]
    assert xla["max_rel_diff_vs_xla"] == 0 and xla["us"] > 0 and pallas["us"] > 0
    # bf16 kernels: within a few bf16 roundings of XLA's path; the fp32 statistics: fp32 rounding.
    assert pallas["max_rel_diff_vs_xla"] < (1e-5 if kernel == "stats" else 2e-2), kernel
  assert got[("attention", "xla")]["visible"] == 96 and got[("qkv", "xla")]["norm"] == "inside"
  assert "power of two" in got[("stats", "pallas 1x48x4x1")]["error"]
  assert "| small | 16 | 8192 | 8 | pallas 1x48x4x1 | failed: ValueError" in capsys.readouterr().out


@pytest.mark.parametrize("argv, match", [(["--kernels", "attn"], "unknown"), (["--config", "qkv"], "KERNEL=C1,C2"),
                                         (["--config", "mlp=64x64x4x4"], "KERNEL=C1,C2")])
def test_bad_arguments(tmp_path, argv, match, capsys):
  with pytest.raises(SystemExit):
    bench_decode_kernels.main(argv + ["--out", str(tmp_path)])
  assert match in capsys.readouterr().err
