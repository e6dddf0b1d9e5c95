"""Part 1's winners (experiments/decode_kernels_ab.sh): for each decode kernel timed alone, the config that took
the least time summed over its cases, against the current default (the first Pallas config of each bench: the
script lists it first), and the `--kernel-opts` value that runs the winners end to end in part 3.

  python3 experiments/decode_winners.py <part 1's $OUT: a folder holding attn/ qkv/ mlp/ addnorm/ logs/>
                                         [--min-gain 0.02]

A winner enters the `--kernel-opts` value only if it is at least --min-gain faster than the default (smaller gains
are within the rounds' spread). The add + norm kernel is opt-in (ModelConfig.decode_add_norm), so its best config is
compared with XLA's too, and enters the value like the others (it applies only where that kernel runs).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

# bench folder (and part, where one bench times several kernels) -> (module.function, the config's fields in order;
# a config may leave out trailing ones, which keep their defaults)
KERNELS = {
    ("attn", None): ("decode_attention.decode_attention", ("block_k", "num_splits", "num_warps", "num_stages",
                                                           "balance")),
    ("qkv", None): ("decode_qkv.qkv_rope_cache", ("block_m", "block_w", "num_warps", "num_stages")),
    ("mlp", "front"): ("decode_mlp.swiglu_front", ("block_n", "block_d", "num_warps", "num_stages", "block_m")),
    ("mlp", "down"): ("decode_mlp.down_proj", ("block_n", "block_k", "splits", "num_warps", "num_stages")),
    ("mlp", "oproj"): ("decode_oproj.out_proj_residual", ("block_n", "block_k", "num_warps", "num_stages")),
    ("addnorm", None): ("decode_add_norm.add_norm", ("block_m", "num_warps")),
}
# What else must take the same options: with decode_add_norm the down projection runs as down_partials.
ALSO = {"decode_mlp.down_proj": ("decode_mlp.down_partials",)}
_NOT_CASE = {"version", "round", "us", "weight_TBps", "max_rel_diff_vs_xla", "error", "part"}


def load_rows(root: str) -> dict:
  """(bench, part) -> the rows of its results.json; for a bench stopped at its time limit before writing one, the
  rows its log printed as it went (gpu_session.sh's logs/<bench>.log: one JSON object per line)."""
  out = defaultdict(list)
  for bench in ("attn", "qkv", "mlp", "addnorm"):
    path, log = os.path.join(root, bench, "results.json"), os.path.join(root, "logs", f"{bench}.log")
    if os.path.exists(path):
      with open(path, encoding="utf-8") as fh:
        rows = json.load(fh)["rows"]
    elif os.path.exists(log):
      with open(log, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.startswith("{") and '"version"' in line]
    else:
      continue
    for row in rows:
      out[(bench, row.get("part"))].append(row)
  return out


def summarize(rows: list[dict]) -> dict:
  """version -> total over cases of its mean us over rounds (None for a version that failed in any case, or lacks a
  case another version has)."""
  per = defaultdict(lambda: defaultdict(list))
  cases = set()
  failed = set()
  for r in rows:
    case = tuple(sorted((k, v) for k, v in r.items() if k not in _NOT_CASE))
    cases.add(case)
    if "error" in r or "us" not in r:
      failed.add(r["version"])
      continue
    per[r["version"]][case].append(r["us"])
  versions = list(dict.fromkeys(r["version"] for r in rows))
  return {v: None if v in failed or set(per[v]) != cases else
          sum(sum(us) / len(us) for us in per[v].values()) for v in versions}


def winners(root: str, min_gain: float = 0.02) -> tuple[list[dict], str]:
  """(one line per kernel: default, best, their totals, the gain; the --kernel-opts value)."""
  lines, opts = [], []
  for key, rows in load_rows(root).items():
    if key not in KERNELS:
      continue
    target, fields = KERNELS[key]
    totals = summarize(rows)
    pallas = [v for v in totals if v.startswith("pallas ")]
    ok = [v for v in pallas if totals[v] is not None]
    if not ok:
      lines.append({"kernel": target, "error": "no Pallas config finished every case"})
      continue
    default, best = pallas[0], min(ok, key=lambda v: totals[v])
    line = {"kernel": target, "default": default[len("pallas "):], "default_us": totals[default],
            "best": best[len("pallas "):], "best_us": totals[best], "xla_us": totals.get("xla")}
    line["gain"] = None if totals[default] is None else 1 - totals[best] / totals[default]
    lines.append(line)
    if best != default and (line["gain"] is None or line["gain"] >= min_gain):
      values = [int(x) for x in line["best"].split("x")]
      kw = ",".join(f"{f}={v}" for f, v in zip(fields, values))
      opts += [f"{t}:{kw}" for t in (target, *ALSO.get(target, ()))]
  return lines, ";".join(opts)


def format_lines(lines: list[dict]) -> str:
  out = ["| kernel | default | default us | best | best us | gain | XLA us |", "|---|---|---|---|---|---|---|"]
  fmt = lambda x: "—" if x is None else f"{x:.2f}"
  for ln in lines:
    if "error" in ln:
      out.append(f"| {ln['kernel']} | {ln['error']} | | | | | |")
      continue
    gain = "—" if ln["gain"] is None else f"{100 * ln['gain']:+.1f} %"
    out.append(f"| {ln['kernel']} | {ln['default']} | {fmt(ln['default_us'])} | {ln['best']} | "
               f"{fmt(ln['best_us'])} | {gain} | {fmt(ln['xla_us'])} |")
  return "\n".join(out)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("root", help="part 1's output folder (attn/, qkv/, mlp/, addnorm/ with results.json)")
  ap.add_argument("--min-gain", type=float, default=0.02)
  ap.add_argument("--write", default="", help="also write the --kernel-opts value (maybe empty) to this file, for "
                  "later stages of the same GPU call (decode_kernels_ab.sh part 1q)")
  a = ap.parse_args(argv)
  if not load_rows(a.root):
    raise SystemExit(f"no results.json under {a.root}/{{attn,qkv,mlp,addnorm}} (part 1's stage folders) and no "
                     f"rows in {a.root}/logs/")
  lines, opts = winners(a.root, a.min_gain)
  if a.write:
    with open(a.write, "w", encoding="utf-8") as fh:
      fh.write(opts + "\n")
  print("us: the sum over the bench's cases of each config's mean over rounds\n")
  print(format_lines(lines))
  print(f"\n--kernel-opts value: {opts or '(none: every default is within --min-gain of the best)'}")
  if opts:
    print(f"part 3: bash experiments/decode_kernels_ab.sh 3 'new:' 'best:--kernel-opts \"{opts}\"' "
          f"'best_addnorm:--decode-add-norm pallas --kernel-opts \"{opts}\"'")


if __name__ == "__main__":
  main()
