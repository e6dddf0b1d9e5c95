"""The same decode profile under several XLA_FLAGS settings, one process each, side by side.

  python3 experiments/xla_flags_ab.py --out $OUT/flags --setting= --setting=--xla_gpu_enable_pdl=true \
      --setting=--xla_gpu_unsupported_enable_triton_multi_output_fusion=true --setting= \
      -- --batches 64 --impls pallas --reps 20 --no-attention

Each `--setting=FLAGS` (note the `=`: the value itself starts with dashes; empty = XLA's defaults) runs
`experiments/profile_decode.py <args after -->` in its own process with XLA_FLAGS set to it, replacing the
caller's. XLA reads its flags once per process, and JAX reuses a traced step within one, so separate processes
are the fair comparison. List the defaults first and last to see the drift within the call. A setting that XLA
rejects (an unknown flag aborts the process) is reported as failed and the others still run. Writes flags_ab.json
and flags_ab.md (decode tokens/s, its ratio to the first setting's, ms per step, device ms per step by class) to
--out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = ("matmul", "fusion", "attention")


def run_setting(flags: str, profile_args: list[str], out_dir: str, timeout_s: float) -> list[dict]:
  """profile_decode.py under XLA_FLAGS=flags; its generate rows, or one row with the error."""
  os.makedirs(out_dir, exist_ok=True)
  env = dict(os.environ, XLA_FLAGS=flags)
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "profile_decode.py"), *profile_args, "--out", out_dir]
  t = time.perf_counter()
  try:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
  except subprocess.TimeoutExpired:
    return [{"flags": flags, "error": f"timed out after {timeout_s:.0f} s"}]
  wall = time.perf_counter() - t
  with open(os.path.join(out_dir, "profile.log"), "w", encoding="utf-8") as f:
    f.write(proc.stdout + proc.stderr)
  path = os.path.join(out_dir, "results.json")
  if proc.returncode != 0 or not os.path.exists(path):
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return [{"flags": flags, "error": f"rc={proc.returncode}: " + " | ".join(tail)[-400:]}]
  with open(path, encoding="utf-8") as f:
    rows = json.load(f)["generate"]
  return [{"flags": flags, "wall_s": wall, **r} for r in rows]


def table(rows: list[dict]) -> str:
  """Markdown: one line per setting and generate run; tok/s also as a ratio to the first successful row."""
  base = next((r["decode_tok_s"] for r in rows if "decode_tok_s" in r), None)
  lines = ["| XLA_FLAGS | batch | decode tok/s | vs first | ms / step | " +
           " | ".join(f"{c} ms / step" for c in CLASSES) + " |",
           "|---|---|---|---|---|" + "---|" * len(CLASSES)]
  for r in rows:
    flags = f"`{r['flags']}`" if r["flags"] else "(defaults)"
    if "decode_tok_s" not in r:
      error = r["error"].replace("|", "\\|")  # run_setting joins the log's last lines with " | ".
      lines.append(f"| {flags} | {r.get('batch', '')} | failed: {error} | | |" + " |" * len(CLASSES))
      continue
    by = r.get("decode_ms_per_step_by_class", {})
    lines.append(f"| {flags} | {r['batch']} | {r['decode_tok_s']:,.0f} | {r['decode_tok_s'] / base:.3f} | "
                 f"{r['ms_per_step']:.3f} | " + " | ".join(f"{by.get(c, 0.0):.3f}" for c in CLASSES) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  profile_args = argv[argv.index("--") + 1:] if "--" in argv else []
  own = argv[:argv.index("--")] if "--" in argv else argv
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=os.environ.get("OUT", "runs/xla_flags_ab"))
  ap.add_argument("--setting", action="append", required=True, metavar="FLAGS",
                  help="an XLA_FLAGS setting, in turn; repeat (--setting= for the defaults)")
  ap.add_argument("--timeout-s", type=float, default=300.0, help="per setting")
  a = ap.parse_args(own)
  if "--out" in profile_args:
    ap.error("give --out before --, not to profile_decode.py: each setting gets its own folder under it")
  rows = []
  for i, flags in enumerate(a.setting):
    got = run_setting(flags, profile_args, os.path.join(a.out, f"setting{i}"), a.timeout_s)
    for r in got:
      print(f"[{i}] XLA_FLAGS={flags!r}: " + (f"{r['decode_tok_s']:,.0f} tok/s" if "decode_tok_s" in r
                                             else f"FAILED {r['error']}"), flush=True)
    rows += got
  md = table(rows)
  with open(os.path.join(a.out, "flags_ab.json"), "w", encoding="utf-8") as f:
    json.dump(rows, f, indent=1)
  with open(os.path.join(a.out, "flags_ab.md"), "w", encoding="utf-8") as f:
    f.write(md)
  print(md)


if __name__ == "__main__":
  main()
