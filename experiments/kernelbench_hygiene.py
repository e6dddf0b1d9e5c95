"""The task-hygiene report of a KernelBench checkout's levels (kernels/hygiene.py), as markdown + CSV.

  python experiments/kernelbench_hygiene.py --source ~/KernelBench/KernelBench --levels 1,2,3 --out runs/kb_hygiene
  python experiments/kernelbench_hygiene.py --source ... --device cpu --out ...   # reduced batch sizes, some unchecked

Writes to --out: hygiene.md (summary, every task that is not ok with its reasons and footprint), hygiene.csv (every
task), records.json, and environment.json (the checkout's commit, device, torch version). On a GPU (the default
when one is visible) the checks may use half of its usable memory per task (free plus what torch's allocator caches;
the cache is emptied after each task), so nearly every task runs at its own sizes;
on the CPU they use at most --max-gb (0.5 GiB) and larger tasks run at a lowered batch_size or are reported as not
checked. The evaluator's memory budget (evaluator.task_memory_fraction) is a separate, per-GPU decision: the
`evaluation_bytes` column is what it compares.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kevin_jax.kernels import hygiene, tasks  # pylint: disable=g-import-not-at-top,wrong-import-position
from kevin_jax.report.standard import source_commit  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--source", required=True, help="the checkout's KernelBench/ folder (level1/, level2/ ...)")
  p.add_argument("--levels", default="1,2,3")
  p.add_argument("--device", default="auto", help="cuda | cpu | auto")
  p.add_argument("--max-gb", type=float, default=0.0, help="memory per task for the checks, GiB (0 = the default)")
  p.add_argument("--atol", type=float, default=1e-4)
  p.add_argument("--rtol", type=float, default=1e-4)
  p.add_argument("--cache-dir", default="", help="reuse records of unchanged tasks ('' = check every task)")
  p.add_argument("--source-commit", default="", help="the checkout's commit, when its git history is not at hand")
  p.add_argument("--out", default=os.environ.get("OUT", "runs/kb_hygiene"))
  a = p.parse_args(argv)
  import torch  # pylint: disable=g-import-not-at-top
  device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
  specs = tasks.discover(a.source, [int(x) for x in a.levels.split(",") if x.strip()])
  t0 = time.time()
  recs = hygiene.hygiene_report(specs, device, atol=a.atol, rtol=a.rtol, max_bytes=int(a.max_gb * 2**30) or None,
                                cache_dir=a.cache_dir or None, log=lambda line: print(line, flush=True))
  os.makedirs(a.out, exist_ok=True)
  md, csv_path = hygiene.write_report(recs, a.out)
  with open(os.path.join(a.out, "records.json"), "w", encoding="utf-8") as f:
    json.dump([r.to_dict() for r in recs], f, indent=1)
  env = {"source": os.path.abspath(a.source), "commit": source_commit(a.source, a.source_commit), "levels": a.levels,
         "device": device, "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "", "torch": torch.__version__,
         "date": time.strftime("%Y-%m-%d", time.gmtime()), "seconds": round(time.time() - t0, 1)}
  with open(os.path.join(a.out, "environment.json"), "w", encoding="utf-8") as f:
    json.dump(env, f, indent=1)
  n = {v: sum(r.verdict == v for r in recs) for v in hygiene.VERDICTS}
  print(f"{len(recs)} tasks: {n['ok']} ok, {n['flagged']} flagged, {n['excluded']} excluded "
        f"({sum(not r.checked for r in recs)} not run) in {env['seconds']:.0f} s on {device}; wrote {md}, {csv_path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
