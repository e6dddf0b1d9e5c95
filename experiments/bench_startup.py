"""Job start-up: the warm-start corpus build and whole jobs, each in a fresh process, against empty then filled caches.

  python experiments/bench_startup.py corpus --config configs/kernelbench.py --source DIR --out runs/startup
  python experiments/bench_startup.py corpus --config configs/multiturn.py:world --out runs/startup
  python experiments/bench_startup.py job --out runs/startup -- --config=configs/multiturn.py:runlocal \\
      --config.evaluator.backend=scripted

`corpus`: sft.load_data (world materialisation, task hygiene records, corpus records, tokenization) in a fresh
process, --repeats times against one evaluator cache directory (OUT/cache, emptied first; task-hygiene records
are copied in from --hygiene-from if given, so the first run measures the token cache alone): seconds, CPU seconds
and the corpus digest of each run (equal digests: the cache changes no token id). --reference-tree DIR runs the
same build in another checkout first (e.g. the tree before a change; `git worktree add`), against the same
hygiene records.
`job`: `python -m kevin_jax.main FLAGS --workdir=OUT/job_<i>` --repeats times with one fresh compilation cache
directory (OUT/jax) and once with it off: wall seconds of each. Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CORPUS = """
import hashlib, importlib, json, sys, time
t0 = time.time()
from kevin_jax import sft
from kevin_jax.policy.tokenizer import load_tokenizer
path, _, arg = sys.argv[1].partition(":")
c = importlib.import_module(path.replace("/", ".").removesuffix(".py")).get_config(arg)
if sys.argv[2]:
  c.tasks.source = sys.argv[2]
c.evaluator.cache_dir = sys.argv[3]
d = sft.load_data(c, load_tokenizer(c.policy.tokenizer or c.policy.checkpoint or None))
print("RESULT=" + json.dumps({"s": round(time.time() - t0, 2), "digest": d.digest, "records": d.summary["records"],
                              "train": d.summary["train"]}))
"""


def _child(cmd: list[str], cwd: str) -> tuple[float, float, str]:
  """(wall s, CPU s of the child, its stdout)."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  r = subprocess.run(cmd, cwd=cwd, env=dict(os.environ, PYTHONPATH=cwd), capture_output=True, text=True, check=False)
  wall = time.perf_counter() - t0
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if r.returncode:
    raise SystemExit(f"{' '.join(cmd[:4])} ... failed:\n{r.stderr[-3000:]}")
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return wall, cpu, r.stdout


def corpus(args) -> None:
  cache = os.path.join(args.out, "cache")
  shutil.rmtree(cache, ignore_errors=True)
  os.makedirs(cache)
  if args.hygiene_from:
    shutil.copytree(os.path.join(args.hygiene_from, "hygiene"), os.path.join(cache, "hygiene"))
  runs = [("reference", args.reference_tree)] if args.reference_tree else []
  runs += [(f"run{i + 1}", ROOT) for i in range(args.repeats)]
  for name, tree in runs:
    wall, cpu, out = _child([sys.executable, "-c", _CORPUS, args.config, args.source, cache], tree)
    res = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT=")][0][len("RESULT="):])
    print(json.dumps({"run": name, "tree": tree, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), **res}))


def job(args) -> None:
  jax_dir = os.path.join(args.out, "jax")
  shutil.rmtree(jax_dir, ignore_errors=True)
  os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # The config field decides here.
  runs = [("off", "")] + [(f"run{i + 1}", jax_dir) for i in range(args.repeats)]
  for name, cache in runs:
    workdir = os.path.join(args.out, f"job_{name}")
    shutil.rmtree(workdir, ignore_errors=True)
    wall, cpu, _ = _child([sys.executable, "-m", "kevin_jax.main", *args.flags, f"--workdir={workdir}",
                           f"--config.compilation_cache_dir={cache}"], ROOT)
    print(json.dumps({"run": name, "compilation_cache": cache or "off", "wall_s": round(wall, 1),
                      "cpu_s": round(cpu, 1)}))


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest="what", required=True)
  c = sub.add_parser("corpus")
  c.add_argument("--config", required=True, help="configs/FILE.py[:presets]")
  c.add_argument("--source", default="", help="tasks.source override (e.g. a KernelBench/ folder)")
  c.add_argument("--hygiene-from", default="", help="an evaluator cache directory whose hygiene/ records to reuse")
  c.add_argument("--reference-tree", default="", help="another checkout to run the same build in first")
  c.add_argument("--repeats", type=int, default=2)
  c.add_argument("--out", required=True)
  j = sub.add_parser("job")
  j.add_argument("--repeats", type=int, default=2)
  j.add_argument("--out", required=True)
  j.add_argument("flags", nargs="+", help="kevin_jax.main flags (after --), without --workdir")
  args = p.parse_args()
  os.makedirs(args.out, exist_ok=True)
  args.out = os.path.abspath(args.out)
  {"corpus": corpus, "job": job}[args.what](args)


if __name__ == "__main__":
  main()
