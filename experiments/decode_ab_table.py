"""Side-by-side table of profile_decode.py runs (one results.json per setting, e.g. decode_kernels_ab.sh part 2).

  python3 experiments/decode_ab_table.py RUN_DIR_OR_JSON ... [--kernels 12]

Prints, per run: the settings (decode_qkv, decode_out, decode_fusion, ...), decode tokens/s, ms per step and
device ms per decode step by class; then the top kernels of each run in microseconds per launch (the traced call's
kernel time over its launches) and their launch counts. Runs are named by their directory (or file) name.
"""

from __future__ import annotations

import argparse
import json
import os

SETTINGS = ("decode_mlp", "decode_down", "decode_qkv", "decode_out", "decode_add_norm", "decode_norm",
            "decode_fusion", "kernel_opts")
# What runs recorded before a setting existed used (the settings they could not have changed).
_OLD_DEFAULTS = {"decode_qkv": "xla", "decode_out": "xla", "decode_add_norm": "xla", "decode_norm": "xla",
                 "kernel_opts": ""}


def load(path: str) -> tuple[str, dict]:
  """(name, results) of one run: a results.json, or a directory holding one."""
  if os.path.isdir(path):
    name, path = os.path.basename(os.path.normpath(path)), os.path.join(path, "results.json")
  else:
    name = os.path.splitext(os.path.basename(path))[0]
  with open(path, encoding="utf-8") as fh:
    return name, json.load(fh)


def rows(runs: list[tuple[str, dict]]) -> list[dict]:
  """One row per (run, traced generate call): settings, speed, classes and kernels (errors kept as rows)."""
  out = []
  for name, res in runs:
    settings = {k: res.get(k, _OLD_DEFAULTS.get(k)) for k in SETTINGS}
    for g in res.get("generate", []):
      row = {"run": name, "batch": g.get("batch"), **settings}
      if "error" in g:
        row["error"] = g["error"]
      else:
        row.update(tok_s=g["decode_tok_s"], ms_per_step=g["ms_per_step"],
                   by_class=g["decode_ms_per_step_by_class"], kernels=g.get("top_kernels", []))
      out.append(row)
  return out


def format_tables(table_rows: list[dict], n_kernels: int) -> str:
  classes = sorted({c for r in table_rows for c in r.get("by_class", {})})
  head = ["run", "B", *SETTINGS, "decode tok/s", "ms/step", *(f"{c} ms" for c in classes)]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in table_rows:
    cells = [r["run"], str(r["batch"]), *(str(r[k]) for k in SETTINGS)]
    if "error" in r:
      cells += [f"failed: {r['error'][:60]}"] + [""] * (1 + len(classes))
    else:
      cells += [f"{r['tok_s']:,.0f}", f"{r['ms_per_step']:.3f}",
                *(f"{r['by_class'].get(c, 0.0):.3f}" for c in classes)]
    lines.append("| " + " | ".join(cells) + " |")
  for r in table_rows:
    if "error" in r:
      continue
    lines += ["", f"{r['run']} (B={r['batch']}): top kernels, us per call (launches in the traced call)", ""]
    for name, ms, count in r["kernels"][:n_kernels]:
      lines.append(f"- {name}: {ms / count * 1e3:.2f} us x {count}")
  return "\n".join(lines)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("runs", nargs="+", help="profile_decode.py output directories or results.json files")
  ap.add_argument("--kernels", type=int, default=12, help="top kernels listed per run")
  a = ap.parse_args(argv)
  print(format_tables(rows([load(p) for p in a.runs]), a.kernels))


if __name__ == "__main__":
  main()
