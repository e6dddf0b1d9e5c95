"""GPU time of the evaluator's keyed passes on one tensor, against the torch passes they replace.

  python experiments/bench_keyed_draw.py [--gib 1.0] [--repeats 20]

Per float32 tensor of --gib GiB: a keyed randn / rand draw written into two buffers (keyed_draw.write; the timed
runs' inputs), torch.randn twice (a get_inputs() draw plus the candidate's redraw), a seal in place
(buffers.seal), the sealed comparison (buffers.count_bad_sealed, both sides sealed) and the plain one
(closeness.count_bad). Prints milliseconds per call (median of --repeats, CUDA events) and the bytes moved per
second.
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kevin_jax.kernels import buffers as B  # pylint: disable=wrong-import-position
from kevin_jax.kernels import closeness  # pylint: disable=wrong-import-position
from kevin_jax.kernels import keyed_draw as KD  # pylint: disable=wrong-import-position


def _ms(fn, repeats: int) -> float:
  fn()
  torch.cuda.synchronize()
  times = []
  for _ in range(repeats):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    times.append(a.elapsed_time(b))
  return statistics.median(times)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--gib", type=float, default=1.0)
  ap.add_argument("--repeats", type=int, default=20)
  args = ap.parse_args()
  dev = torch.device("cuda")
  n = int(args.gib * 2**30) // 4
  x, y = torch.empty(n, device=dev), torch.empty(n, device=dev)
  KD.prepare(dev)
  closeness.prepare(dev)
  nbytes = 4 * n
  rows = [
      ("keyed randn, both copies", lambda: KD.write(("randn",), 1, [(x, y)]), 2 * nbytes),
      ("keyed rand, both copies", lambda: KD.write(("rand",), 1, [(x, y)]), 2 * nbytes),
      ("torch.randn twice", lambda: (torch.randn(n, out=x), torch.randn(n, out=y)), 2 * nbytes),
      ("seal in place", lambda: B.seal(x, 5), 2 * nbytes),
      ("count_bad_sealed, both sealed", lambda: B.count_bad_sealed(x, 5, y, 6, 1e-4, 1e-4), 2 * nbytes),
      ("count_bad, plain", lambda: closeness.count_bad(x, y, 1e-4, 1e-4), 2 * nbytes)]
  print(f"{torch.cuda.get_device_name(dev)}, {args.gib:g} GiB float32 per tensor, median of {args.repeats}")
  for name, fn, moved in rows:
    ms = _ms(fn, args.repeats)
    print(f"{name:32s} {ms:8.3f} ms  {moved / ms / 1e9:7.1f} TB/s moved")


if __name__ == "__main__":
  main()
