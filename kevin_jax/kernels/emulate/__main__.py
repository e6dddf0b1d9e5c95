"""python -m kevin_jax.kernels.emulate: run labelled candidates in the CPU emulator and compare with their labels.

  python -m kevin_jax.kernels.emulate                                   # every level-1 suite candidate
  python -m kevin_jax.kernels.emulate level1/14_Matmul --dists           # also the correct ones on 4 more distributions
  python -m kevin_jax.kernels.emulate level2/03_Gemm_LayerNorm --set M=67 --set N=131 --set K=45
  python -m kevin_jax.kernels.emulate --source generated --per-family 3  # task-world candidates at reduced sizes
  python -m kevin_jax.kernels.emulate --source generated elementwise/gelu_tanh_1a2b3c4d

Bundled tasks run at the reduced sizes of SMALL (level 1) or --set; generated tasks at their specs' reduced sizes.
Exit status 1 when any candidate's emulated status differs from its label.
"""

from __future__ import annotations

import argparse
import sys
import time

from kevin_jax.kernels import suite
from kevin_jax.kernels.emulate import emulator

SMALL = {  # Reduced sizes per level-1 task (module constants); every boundary case of the real shapes remains.
    "01_ReLU": dict(BATCH=7, DIM=131), "02_GELU": dict(BATCH=7, DIM=131), "03_Swish": dict(BATCH=5, DIM=263),
    "04_ELU": dict(BATCH=7, DIM=131), "05_SumDim": dict(BATCH=3, DIM1=133, DIM2=45),
    "06_LogSumExp": dict(BATCH=37, DIM=203), "07_Argmax": dict(BATCH=3, DIM1=71, DIM2=45),
    "08_Argmin": dict(BATCH=13, DIM=1031), "09_Softmax": dict(BATCH=11, DIM=1037),
    "10_LogSoftmax": dict(BATCH=5, DIM=3011), "11_LayerNorm": dict(BATCH=2, SEQ=5, FEATURES=1031),
    "12_RMSNorm": dict(BATCH=2, SEQ=7, FEATURES=1029),
    "13_GroupNorm": dict(BATCH=2, FEATURES=12, GROUPS=4, HEIGHT=13, WIDTH=11),
    "14_Matmul": dict(M=133, K=77, N=141), "15_MatmulTransposedB": dict(M=133, K=77, N=141),
    "16_BatchedMatmul": dict(BATCH=2, M=131, K=45, N=139), "17_MatVec": dict(M=37, K=1029),
    "18_MaxPool2d": dict(BATCH=2, CHANNELS=3, HEIGHT=17, WIDTH=19),
    "19_AvgPool2d": dict(BATCH=2, CHANNELS=3, HEIGHT=37, WIDTH=71), "20_Cumsum": dict(BATCH=5, DIM=2311),
    "21_DepthwiseConv2d": dict(BATCH=2, CHANNELS=3, HEIGHT=37, WIDTH=71),
    "22_Conv2d": dict(BATCH=2, HEIGHT=19, WIDTH=21),
    "23_CrossEntropyLoss": dict(BATCH=37, CLASSES=211), "24_HuberLoss": dict(BATCH=37, DIM=211),
}


def _jobs(a) -> list[tuple[str, object, list]]:
  """(task id, reduced module, labelled candidates) per selected task."""
  extra = {k: (float(v) if "." in v else int(v)) for k, v in (s.split("=", 1) for s in a.set)}
  if a.source == "bundled":
    by_id = {t.id: t for t in suite.load_suite()}
    ids = a.tasks or [t for t in by_id if t.startswith("level1/")]
    out = []
    for tid in ids:
      task = by_id[tid]
      overrides = dict(SMALL.get(task.spec.name, {}) if task.level == 1 else {}, **extra)
      out.append((tid, emulator.load_module(path=task.spec.path, overrides=overrides), task.candidates()))
    return out
  from kevin_jax.data.taskgen import world  # pylint: disable=g-import-not-at-top
  w = world.build(world.WorldConfig.parse(a.source))
  if a.tasks:
    by_id = w.by_id()
    chosen = [by_id[t] for t in a.tasks]
  else:
    chosen = []
    for family in world.FAMILIES:
      chosen += [t for t in w.tasks if t.family == family][:a.per_family]
  return [(t.id, emulator.load_module(source=t.reduced_source, overrides=extra), t.candidates()) for t in chosen]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("tasks", nargs="*", help="task ids (default: every level-1 suite task, or --per-family)")
  ap.add_argument("--source", default="bundled", help="'bundled' or 'generated[:SEED]'")
  ap.add_argument("--per-family", type=int, default=2, help="generated source: the first N tasks of each family")
  ap.add_argument("--set", action="append", default=[], help="module constant override NAME=VALUE (repeatable)")
  ap.add_argument("--dists", action="store_true", help="also run the correct candidates on other distributions")
  a = ap.parse_args(argv)
  jobs = _jobs(a)
  emulator.prepare([c.text for _, _, cands in jobs for c in cands])
  mismatches = 0
  for tid, mod, cands in jobs:
    for c in cands:
      t0 = time.time()
      status, msg = emulator.run(mod, c.text)
      ok = status == c.expect
      mismatches += not ok
      print(f"{'ok ' if ok else 'BAD'} {tid:44s} {c.name:16s} expect={c.expect:14s} got={status:14s} "
            f"{time.time() - t0:4.1f}s {msg.splitlines()[0][:100] if msg else ''}", flush=True)
      if a.dists and c.expect == "correct":
        allowed = getattr(mod, "INPUT_DISTRIBUTIONS", None) or tuple(emulator.DISTS)
        for dn, d in emulator.DISTS.items():
          if dn not in allowed:
            continue
          status, msg = emulator.run(mod, c.text, seed=3, dist=d)
          if status != "correct":
            mismatches += 1
            print(f"BAD {tid:44s} {c.name:16s} on {dn} inputs: {status} {msg[:100]}", flush=True)
  print(f"{mismatches} mismatches")
  return 1 if mismatches else 0


if __name__ == "__main__":
  sys.exit(main())
