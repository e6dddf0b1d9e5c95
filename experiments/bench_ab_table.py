"""Part 5 of experiments/decode_kernels_ab.sh side by side: bench_sampler runs of one case (0.5B, B = 64), one
output folder per variant and round (<name><round>/results.json), as a table of decode tokens/s per run, their
mean, the ratio to the baseline variant's mean, and % of the roofline.

  python3 experiments/bench_ab_table.py <folder holding the runs> [--base new]
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import defaultdict


def load(root: str) -> dict:
  """variant -> [(round, run dict, settings)] from <root>/<variant><round>/results.json (bench_sampler's); a run
  whose JAX worker failed is left out."""
  out = defaultdict(list)
  for entry in sorted(os.listdir(root)):
    m = re.fullmatch(r"(.+)(\d)", entry)  # the round is one digit (1 or 2): a name may end in digits ('bal2')
    path = os.path.join(root, entry, "results.json")
    if not m or not os.path.isfile(path):
      continue
    with open(path, encoding="utf-8") as fh:
      res = json.load(fh)
    if "args" not in res:  # another bench's results in the same call (e.g. part l2's qkv_l2/)
      continue
    a = res["args"]
    head = f"head={a['decode_head']} " if a.get("decode_head", "xla") != "xla" else ""
    head += f"norm={a['decode_norm']} " if a.get("decode_norm", "xla") != "xla" else ""
    head += f"xla_flags={a['xla_flags']} " if a.get("xla_flags") else ""
    settings = (f"add_norm={a.get('decode_add_norm')} fusion={a.get('decode_fusion')} out={a.get('decode_out')} "
                f"{head}{a.get('kernel_opts') or ''}").strip()
    for model in res["models"].values():
      for run in model.get("jax", {}).get("runs", []):
        out[m.group(1)].append((int(m.group(2)), run, settings))
  return out


def table(runs: dict, base: str = "new") -> str:
  """Markdown rows: variant, tok/s per round, mean, vs the base variant's mean, mean % of roofline, settings."""
  if not runs:
    raise SystemExit("no bench_sampler results (<variant><round>/results.json) found")
  means = {v: sum(r["decode_tok_s"] for _, r, _ in rs) / len(rs) for v, rs in runs.items()}
  ref = means.get(base)
  lines = ["| variant | runs (decode tok/s) | mean | vs " + base + " | % of roofline | settings |",
           "|---|---|---|---|---|---|"]
  for v in sorted(runs, key=lambda name: (name != base, name)):
    rs = sorted(runs[v], key=lambda t: t[0])
    frac = sum(r["roofline_frac"] for _, r, _ in rs) / len(rs)
    vs = f"{means[v] / ref:.3f}" if ref else "-"
    per_run = " / ".join(f"{r['decode_tok_s']:,.0f}" for _, r, _ in rs)
    lines.append(f"| {v} | {per_run} | {means[v]:,.0f} | {vs} | "
                 f"{100 * frac:.1f} % | {rs[0][2]} |")
  return "\n".join(lines)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("root")
  ap.add_argument("--base", default="new", help="the variant the others are compared with")
  a = ap.parse_args(argv)
  print(table(load(a.root), a.base))


if __name__ == "__main__":
  main()
