"""Sampler throughput on one GPU: our jitted KV-cache sampler vs transformers' generate, and the decode roofline;
variants side by side.

  python experiments/bench_sampler.py --out runs/bench_sampler                       # the whole table
  python experiments/bench_sampler.py --models 0.5b --batches 64 --no-hf --rounds 2 \
      --variant new: --variant 'xla_norms:--decode-norm xla' --variant 'base:--tree /tmp/base' --out runs/ab

For each model shape (random weights, bf16: Qwen2.5-0.5B and -1.5B) and batch size (64, 256), with prompts of
1,024 random tokens and 1,024 new tokens (temperature 0.9, no top-k/top-p, EOS disabled so every row decodes
the full budget), it reports: compile time, prefill time, decode tokens/s, peak GPU memory; transformers'
PyTorch `generate` on the same GPU and the same weights (exported with our save_pretrained and loaded by
Qwen2ForCausalLM, sdpa attention) with --hf-new-tokens new tokens (default 64: its tokens/s is per decode step and
does not depend much on the count); and the decode roofline:
  bytes per decode step = weight bytes + KV-cache bytes of the tokens attended at that step
  roofline tokens/s    = batch * steps / (sum over steps of bytes / measured device copy bandwidth).
Each framework runs in its own subprocess (experiments/bench_sampler_workers.py: clean peak-memory numbers, no
allocator contention). Writes results.json, results.md and the workers' logs to --out, and prints the table last.

Variants. Each `--variant NAME:FLAGS` is one setting of the decode options (bench_sampler_workers.add_decode_args:
--decode-*, --kernel-opts, --xla-flags), given on top of this command's own; `--variant NAME:--tree DIR [FLAGS]`
runs DIR's own experiments/bench_sampler.py (another checkout, e.g. `git worktree add /tmp/base COMMIT`) with the
shape flags and FLAGS as given, so two trees compare side by side even where their options differ. Every variant
runs --rounds times, the variants alternated within each round (A B A B), each run in processes of its own, into
--out/<NAME>_r<ROUND>/; transformers runs only with the first variant's first round. Then variants.md /
variants.json hold one row per variant and case: decode tokens/s per round, their mean, the ratio to the first
variant's mean, and % of the roofline.

--smoke runs the same code on tiny shapes (CPU is fine) to check the script itself in a minute; --profile adds
each batch's device time per decode step by kernel (traced after the timed call).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)
from experiments.bench_sampler_workers import (  # pylint: disable=g-import-not-at-top,wrong-import-position
    DECODE_DESTS, DECODE_PARTS, MODELS, add_decode_args)

_WORKERS = os.path.join(_REPO, "experiments", "bench_sampler_workers.py")


# ----------------------------------------------------------------------------------------------------------
# one run: every model shape, JAX worker then transformers
# ----------------------------------------------------------------------------------------------------------
def roofline_tok_s(cfg, batch: int, prompt_len: int, new_tokens: int, bandwidth: float) -> float:
  """Decode tokens/s if every step only read the weights once and the KV cache of the attended tokens."""
  weight_bytes = 2 * (cfg.num_params() - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size))
  kv_per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2  # k and v, bf16
  steps = range(1, new_tokens)  # decode step t attends to prompt_len + t tokens
  total_bytes = sum(weight_bytes + batch * kv_per_token * (prompt_len + t) for t in steps)
  return batch * len(steps) / (total_bytes / bandwidth)


def _run_worker(kind: str, args, model: str, weights_dir: str, out_dir: str, timeout: float | None) -> dict:
  """One worker process (bench_sampler_workers.py) for one model shape; its results, or {'error': ...}."""
  dump = os.path.join(tempfile.gettempdir(), f"bench_hlo_{model}_{os.getpid()}")
  path = os.path.join(out_dir, f"{kind}_{model}.json")
  cmd = [sys.executable, _WORKERS, kind, "--model", model, "--weights-dir", weights_dir,
         "--batches", ",".join(map(str, args.batches)), "--prompt-len", str(args.prompt_len),
         "--new-tokens", str(args.new_tokens), "--hf-new-tokens", str(args.hf_new_tokens), "--seed", str(args.seed),
         "--dump-dir", dump, "--json", path, *(["--profile"] if args.profile else [])]
  for dest in DECODE_DESTS:
    cmd += [f"--{dest.replace('_', '-')}={getattr(args, dest)}"]
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONPATH=_REPO + os.pathsep +
             os.environ.get("PYTHONPATH", ""))
  if kind == "jax":
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" {args.xla_flags} --xla_dump_to={dump} --xla_dump_hlo_as_text"
                        " --xla_dump_hlo_module_re=.*_decode.*").strip()
  log = os.path.join(out_dir, f"{kind}_{model}.log")
  t = time.perf_counter()
  with open(log, "w") as fh:
    try:
      proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False)
      rc = proc.returncode
    except subprocess.TimeoutExpired:
      rc = "timeout"
  shutil.rmtree(dump, ignore_errors=True)
  wall = time.perf_counter() - t
  if rc != 0 or not os.path.isfile(path):
    with open(log) as fh:
      tail = fh.read()[-1500:]
    print(f"[bench] {kind} worker for {model} failed (rc={rc}, {wall:.0f}s); log tail:\n{tail}", flush=True)
    return {"error": f"rc={rc}", "wall_s": wall}
  with open(path) as fh:
    res = json.load(fh)
  res["wall_s"] = wall
  return res


def _left(args, t0: float) -> float | None:
  """Seconds left of --budget-s (None: no budget)."""
  return None if not args.budget_s else args.budget_s - (time.perf_counter() - t0)


def run_once(args, out_dir: str, t0: float) -> dict:
  """Every model shape of args (JAX worker, then transformers unless args.no_hf) into out_dir: results.json and
  results.md after each model, so partial results survive an interruption."""
  os.makedirs(out_dir, exist_ok=True)
  results = {"args": {k: v for k, v in vars(args).items() if k not in ("variant", "out")} | {"out": out_dir},
             "date": time.strftime("%Y-%m-%d %H:%M:%S"), "models": {}}
  start = time.perf_counter()
  for model in args.models.split(","):
    wdir = tempfile.mkdtemp(prefix=f"bench_weights_{model}_")  # outside --out: GBs of safetensors
    entry = results["models"][model] = {}
    try:
      left = _left(args, t0)
      if left is not None and left < 30:
        entry["jax"] = {"error": f"skipped: time budget ({args.budget_s:.0f}s) spent"}
      else:
        entry["jax"] = _run_worker("jax", args, model, "" if args.no_hf else wdir, out_dir, left)
      results["wall_s"] = time.perf_counter() - start
      write_summary(results, args, out_dir, final=False)
      left = _left(args, t0)
      if args.no_hf or "error" in entry["jax"]:
        entry["hf"] = {"skipped": "--no-hf" if args.no_hf else "jax worker failed"}
      elif left is not None and left < 20:
        entry["hf"] = {"skipped": f"time budget ({args.budget_s:.0f}s) spent"}
      else:
        entry["hf"] = _run_worker("hf", args, model, wdir, out_dir, left)
    finally:
      shutil.rmtree(wdir, ignore_errors=True)
    results["wall_s"] = time.perf_counter() - start
    write_summary(results, args, out_dir, final=False)
  write_summary(results, args, out_dir, final=True)
  return results


def _gb(x):
  return "-" if x is None else f"{x / 1e9:.1f}"


def write_summary(results: dict, args, out_dir: str, final: bool) -> None:
  """Adds roofline numbers, writes results.json + results.md; prints the notes and table when final."""
  from kevin_jax.policy import get_preset  # pylint: disable=g-import-not-at-top
  header = ("| model | batch | ours decode tok/s | % of roofline | roofline tok/s | prefill s | compile s | "
            "peak GB | HF decode tok/s | HF prefill s | HF peak GB | speedup vs HF |")
  lines = [header, "|" + "---|" * 12]
  for model, entry in results["models"].items():
    cfg = get_preset(MODELS[model])
    jx, hf = entry.get("jax", {}), entry.get("hf", {})
    hf_runs = {r["batch"]: r for r in hf.get("runs", [])}
    for r in jx.get("runs", []):
      roof = roofline_tok_s(cfg, r["batch"], r["prompt_len"], r["new_tokens"], jx["copy_bandwidth_Bps"])
      r["roofline_tok_s"], r["roofline_frac"] = roof, r["decode_tok_s"] / roof
      h = hf_runs.get(r["batch"])
      ours = (f"| {MODELS[model]} | {r['batch']} | {r['decode_tok_s']:,.0f} | {100 * r['roofline_frac']:.0f}% | "
              f"{roof:,.0f} | {r['prefill_s']:.2f} | {r['compile_s']:.1f} | {_gb(r['peak_bytes'])} |")
      theirs = (f" {h['decode_tok_s']:,.0f} | {h['prefill_s']:.2f} | {_gb(h['peak_bytes'])} | "
                f"{r['decode_tok_s'] / h['decode_tok_s']:.1f}x |" if h else " - | - | - | - |")
      lines.append(ours + theirs)
    for side in ("jax", "hf"):
      e = entry.get(side, {})
      if "error" in e or "skipped" in e:
        lines.append(f"| {MODELS[model]} | - | {side}: {e.get('error') or e.get('skipped')} "
                     f"(see {side}_{model}.log) |" + " |" * 9)
  any_jax = next((e["jax"] for e in results["models"].values() if "copy_bandwidth_Bps" in e.get("jax", {})), {})
  notes = [
      f"Device: {any_jax.get('device', '?')}; measured copy bandwidth "
      f"{any_jax.get('copy_bandwidth_Bps', 0) / 1e9:,.0f} GB/s (10 copies streamed; the roofline's), single "
      f"copies timed alone {any_jax.get('copy_bandwidth_single_Bps', 0) / 1e9:,.0f} GB/s; jax "
      f"{any_jax.get('jax', '?')}.",
      f"Prompt {args.prompt_len} random tokens, ours {args.new_tokens} new tokens, transformers "
      f"{args.hf_new_tokens} new tokens (sdpa, bf16, same weights); temperature 0.9, EOS disabled.",
      "Roofline: (weights + KV of attended tokens) bytes per step / copy bandwidth. 'compile s' per batch "
      f"size, compiled concurrently. Whole run {results.get('wall_s', 0):.0f}s" + ("." if final else " (partial)."),
      "Decode kernels: " + ", ".join(f"{part}={getattr(args, 'decode_' + part)}" for part in DECODE_PARTS)
      + f"; kernel options: {args.kernel_opts or 'defaults'}; more XLA_FLAGS: {args.xla_flags or 'none'}.",
  ]
  for model, entry in results["models"].items():
    ops = entry.get("jax", {}).get("cache_ops_in_decode_hlo")
    if ops:
      notes.append(f"{model}: copy/convert/transpose ops on KV-cache-shaped arrays in the optimized decode HLO "
                   f"(batch {args.batches[0]}): {ops['copy']}/{ops['convert']}/{ops['transpose']} "
                   f"(0/0/0 = cache read and updated in place; {ops['files']} HLO files).")
    for r in entry.get("jax", {}).get("runs", []):
      if "profile" in r:
        pr = r["profile"]
        by = ", ".join(f"{k} {v:.3f}" for k, v in sorted(pr["ms_per_step_by_class"].items(), key=lambda kv: -kv[1]))
        top = "; ".join(f"{k['name'][:60]} {k['us_per_step']:.1f} us ({k['launches_per_step']:.0f} launches)"
                        for k in pr["top_kernels"])
        notes.append(f"{model} B={r['batch']} profile, device ms per decode step by class: {by}. Top kernels per "
                     f"step: {top}.")
  table = "\n".join(lines)
  with open(os.path.join(out_dir, "results.json"), "w") as fh:
    json.dump(results, fh, indent=2)
  with open(os.path.join(out_dir, "results.md"), "w") as fh:
    fh.write("# Sampler benchmark\n\n" + table + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
  if final:
    print("\n".join(notes))
    print(table)


# ----------------------------------------------------------------------------------------------------------
# variants side by side
# ----------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Variant:
  """A named setting: decode options over this command's (`options`), or another tree's bench (`tree`) run with
  `tree_args` as they are. `flags`: the FLAGS of --variant NAME:FLAGS as given."""
  name: str
  flags: str
  options: dict
  tree: str | None = None
  tree_args: tuple[str, ...] = ()


def parse_variant(spec: str) -> Variant:
  """'NAME:FLAGS' -> Variant. FLAGS are decode options (add_decode_args), or --tree DIR and that tree's flags."""
  name, sep, flags = spec.partition(":")
  if not sep or not name or not name.replace("-", "").replace("_", "").isalnum():
    raise ValueError(f"--variant: expected NAME:FLAGS with NAME of letters, digits, - and _, got {spec!r}")
  words = shlex.split(flags)
  if words and (words[0] == "--tree" or words[0].startswith("--tree=")):
    tree, rest = (words[0][len("--tree="):], words[1:]) if "=" in words[0] else (" ".join(words[1:2]), words[2:])
    if not os.path.isfile(os.path.join(tree, "experiments", "bench_sampler.py")):
      raise ValueError(f"--variant {name}: no experiments/bench_sampler.py under --tree {tree!r}")
    return Variant(name, flags, {}, os.path.abspath(tree), tuple(rest))
  p = argparse.ArgumentParser(prog=f"--variant {name}", add_help=False, exit_on_error=False)
  add_decode_args(p, suppress=True)
  try:
    options, unknown = p.parse_known_args(words)
  except argparse.ArgumentError as e:
    raise ValueError(f"--variant {name}: {e}") from None
  if unknown:
    raise ValueError(f"--variant {name}: unknown flags {unknown} (decode options; or --tree DIR first)")
  return Variant(name, flags, vars(options))


def _run_tree(args, v: Variant, out_dir: str, t0: float) -> dict:
  """DIR/experiments/bench_sampler.py (another tree's) with this command's shapes and v's flags, in a process
  whose imports come from DIR; its results."""
  os.makedirs(out_dir, exist_ok=True)
  cmd = [sys.executable, os.path.join(v.tree, "experiments", "bench_sampler.py"), "--models", args.models,
         "--batches", ",".join(map(str, args.batches)), "--prompt-len", str(args.prompt_len), "--new-tokens",
         str(args.new_tokens), "--seed", str(args.seed), "--no-hf", "--out", out_dir, *v.tree_args]
  env = dict(os.environ, PYTHONPATH=v.tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
  with open(os.path.join(out_dir, "tree.log"), "w") as fh:
    try:
      rc = subprocess.run(cmd, cwd=v.tree, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=_left(args, t0),
                          check=False).returncode
    except subprocess.TimeoutExpired:
      rc = "timeout"
  path = os.path.join(out_dir, "results.json")
  if rc != 0 or not os.path.isfile(path):
    return {"error": f"rc={rc} (see tree.log)"}
  with open(path) as fh:
    return json.load(fh)


def run_variants(args, variants: list[Variant]) -> dict:
  """Every variant args.rounds times, alternated within each round; writes variants.json and variants.md."""
  t0 = time.perf_counter()
  runs = []
  for rnd in range(1, args.rounds + 1):
    for i, v in enumerate(variants):
      out_dir = os.path.join(args.out, f"{v.name}_r{rnd}")
      left = _left(args, t0)
      if left is not None and left < 30:
        runs.append({"variant": v.name, "round": rnd, "error": f"skipped: time budget ({args.budget_s:.0f}s) spent"})
        continue
      print(f"[bench] round {rnd}, variant {v.name}: {v.flags or '(this command as given)'}", flush=True)
      if v.tree:
        res = _run_tree(args, v, out_dir, t0)
      else:
        vargs = copy.copy(args)
        for dest, value in v.options.items():
          setattr(vargs, dest, value)
        vargs.no_hf = args.no_hf or rnd > 1 or i > 0  # transformers once: with the first variant's first round
        res = run_once(vargs, out_dir, t0)
      errors = [res["error"]] if "error" in res else [
          f"{model} {side}: {e[side]['error']}" for model, e in res.get("models", {}).items()
          for side in ("jax", "hf") if "error" in e.get(side, {})]
      runs.append({"variant": v.name, "round": rnd, "dir": os.path.basename(out_dir), "results": res,
                   **({"errors": errors} if errors else {})})
  rows = variant_rows(variants, runs)
  summary = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "rounds": args.rounds,
             "variants": [{"name": v.name, "flags": v.flags, "tree": v.tree} for v in variants],
             "runs": [{k: r[k] for k in r if k != "results"} for r in runs], "rows": rows}
  md = variant_table(rows)
  with open(os.path.join(args.out, "variants.json"), "w") as fh:
    json.dump(summary, fh, indent=2)
  with open(os.path.join(args.out, "variants.md"), "w") as fh:
    fh.write("# Sampler benchmark: variants side by side\n\n" + md + "\n")
  print(md)
  return summary


def variant_rows(variants: list[Variant], runs: list[dict]) -> list[dict]:
  """One row per (variant, model, batch): the rounds' decode tok/s (None where a run failed), their mean, the
  mean % of the roofline, and the ratio to the first variant's mean for the same model and batch."""
  cases: dict = {}
  for r in runs:
    models = r.get("results", {}).get("models", {})
    for model, entry in models.items():
      for run in entry.get("jax", {}).get("runs", []):
        cases.setdefault((model, run["batch"]), {}).setdefault(r["variant"], {})[r["round"]] = run
  rounds = sorted({r["round"] for r in runs})
  rows = []
  for (model, batch), by_variant in cases.items():
    anchor = None
    for v in variants:
      got = by_variant.get(v.name, {})
      tok_s = [got[n]["decode_tok_s"] if n in got else None for n in rounds]
      ok = [got[n] for n in rounds if n in got]
      mean = sum(x["decode_tok_s"] for x in ok) / len(ok) if ok else None
      anchor = mean if v is variants[0] else anchor
      rows.append({"variant": v.name, "model": model, "batch": batch, "decode_tok_s": tok_s, "mean": mean,
                   "vs_first": mean / anchor if mean and anchor else None,
                   "roofline_frac": sum(x.get("roofline_frac", 0.0) for x in ok) / len(ok) if ok else None,
                   "flags": v.flags})
  return rows


def variant_table(rows: list[dict]) -> str:
  """Markdown: variant, model, batch, tok/s per round, mean, ratio to the first variant, % of roofline, flags."""
  first = rows[0]["variant"] if rows else "-"
  lines = [f"| variant | model | batch | decode tok/s (rounds) | mean | vs {first} | % of roofline | flags |",
           "|---|---|---|---|---|---|---|---|"]
  fmt = lambda x, f: "-" if x is None else format(x, f)
  for r in rows:
    per = " / ".join("failed" if x is None else f"{x:,.0f}" for x in r["decode_tok_s"])
    frac = "-" if r["roofline_frac"] is None else f"{100 * r['roofline_frac']:.1f} %"
    lines.append(f"| {r['variant']} | {r['model']} | {r['batch']} | {per} | {fmt(r['mean'], ',.0f')} | "
                 f"{fmt(r['vs_first'], '.3f')} | {frac} | {r['flags'].replace('|', '/') or '-'} |")
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default=os.path.join(_REPO, "runs", "bench_sampler"))
  p.add_argument("--models", default="0.5b,1.5b", help=f"comma list of {sorted(MODELS)}")
  p.add_argument("--batches", default=None, help="comma list (default 64,256; with --smoke 2,4)")
  p.add_argument("--prompt-len", type=int, default=1024)
  p.add_argument("--new-tokens", type=int, default=1024)
  p.add_argument("--hf-new-tokens", type=int, default=64)
  p.add_argument("--no-hf", action="store_true", help="skip transformers")
  add_decode_args(p)
  p.add_argument("--variant", action="append", default=[], metavar="NAME:FLAGS",
                 help="a setting to compare, repeated (the first is the others' anchor); see the description")
  p.add_argument("--rounds", type=int, default=1, help="runs of every variant, alternated (2 shows the drift)")
  p.add_argument("--profile", action="store_true", help="also trace each batch's decode step by kernel (a GPU's "
                 "device time: empty on a CPU)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--budget-s", type=float, default=0.0, help="start no more workers past this wall time (0: none)")
  p.add_argument("--smoke", action="store_true", help="tiny shapes (checks the script; CPU ok)")
  args = p.parse_args(argv)
  args.out = os.path.abspath(args.out)  # a --tree variant's bench runs in its own directory
  if args.smoke:
    args.models, args.prompt_len, args.new_tokens, args.hf_new_tokens = "tiny", 32, 16, 8
  args.batches = [int(b) for b in (args.batches or ("2,4" if args.smoke else "64,256")).split(",")]
  for model in args.models.split(","):
    if model not in MODELS:
      raise SystemExit(f"unknown model {model!r}; known: {sorted(MODELS)}")
  if args.rounds < 1:
    raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
  try:
    variants = [parse_variant(s) for s in args.variant]
  except ValueError as e:
    raise SystemExit(str(e)) from None
  if len({v.name for v in variants}) != len(variants):
    raise SystemExit(f"--variant names must differ, got {[v.name for v in variants]}")
  os.makedirs(args.out, exist_ok=True)
  if not variants and args.rounds == 1:
    run_once(args, args.out, time.perf_counter())
  else:
    run_variants(args, variants or [parse_variant("default:")])
  return 0


if __name__ == "__main__":
  sys.exit(main())
