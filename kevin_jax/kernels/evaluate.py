"""Evaluate one candidate from the command line.

  python -m kevin_jax.kernels.evaluate --task TASK.py --candidate FILE [--json] [--compile-only]
  python -m kevin_jax.kernels.evaluate --source KernelBench/KernelBench --task-id level1/19_ReLU --candidate FILE

--compile-only parses, validates the plan against the task's shapes and compiles with NVRTC in a sandboxed compile
worker (no GPU needed; the same deadline, address-space cap and memory budget as the evaluator's); otherwise the full
evaluation runs in sandboxed GPU workers. The candidate file is read as UTF-8 bytes without newline translation, so
the CLI and the API see the same text (normalised by candidate.normalize_text). Prints one result (--json: the
EvalResult record) and exits 0 when the candidate is correct (or compiled, with --compile-only), 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys

from kevin_jax.kernels import tasks
from kevin_jax.kernels.result import STATIC_OK, EvalResult, finalize


def _parse(argv):
  ap = argparse.ArgumentParser(prog="python -m kevin_jax.kernels.evaluate", description=__doc__.split("\n\n")[0])
  ap.add_argument("--task", help="a KernelBench-format task file (Model, get_inputs, get_init_inputs)")
  ap.add_argument("--source", help="a task directory (KernelBench-style level<N>/ folders) or 'bundled'")
  ap.add_argument("--task-id", help="task id within --source, e.g. level1/19_ReLU")
  ap.add_argument("--candidate", required=True, help="file with the ```cuda and ```plan blocks ('-' = stdin)")
  ap.add_argument("--json", action="store_true", help="print the full result record as JSON")
  ap.add_argument("--compile-only", action="store_true", help="parse, validate and compile only (no GPU)")
  ap.add_argument("--arch", default="", help="cubin target for --compile-only (default: sm_90)")
  ap.add_argument("--trials", type=int, default=None, help="correctness trials (default 5)")
  ap.add_argument("--timing-runs", type=int, default=None, help="timed launches per side (default 100)")
  ap.add_argument("--gpus", default="", help="GPU ids for workers (default: all visible)")
  ap.add_argument("--cache-dir", default="", help="compile cache and worker logs (default ~/.cache/kevin_jax)")
  ap.add_argument("--compile-timeout-s", type=float, default=None, help="compile deadline (default 60)")
  ap.add_argument("--eval-timeout-s", type=float, default=None,
                  help="wall deadline of one evaluation: compile, correctness and timing (default 120)")
  ap.add_argument("-v", "--verbose", action="store_true")
  args = ap.parse_args(argv)
  if bool(args.task) == bool(args.source):
    ap.error("give exactly one of --task FILE or --source DIR --task-id ID")
  if args.source and not args.task_id:
    ap.error("--source needs --task-id")
  return args


def _read(path: str) -> str | EvalResult:
  raw = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    return EvalResult(task_id="", status="format_error", error=f"the candidate is not UTF-8 text (byte {e.start})")


def main(argv=None) -> int:
  args = _parse(argv)
  logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
  source = args.task or args.source
  specs = {s.id: s for s in tasks.discover(source)}
  task_id = args.task_id or next(iter(specs))
  if task_id not in specs:
    print(f"unknown task id {task_id!r} in {source}", file=sys.stderr)
    return 2
  text = _read(args.candidate)
  from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig  # pylint: disable=g-import-not-at-top
  kw = dict(gpus=args.gpus, cache_dir=args.cache_dir, compile_workers=1, spare_workers=False, arch=args.arch)
  for name in ("trials", "timing_runs", "compile_timeout_s", "eval_timeout_s"):
    if getattr(args, name) is not None:
      kw["correctness_trials" if name == "trials" else name] = getattr(args, name)
  if isinstance(text, EvalResult):
    r = finalize(dataclasses.replace(text, task_id=task_id))
  elif args.compile_only:
    with Evaluator(EvaluatorConfig(**kw), task_source=source, gpu=False) as ev:
      r = ev.check_static(task_id, text)
  else:
    with Evaluator(EvaluatorConfig(**kw), task_source=source) as ev:
      try:
        r = ev.evaluate([(task_id, text)])[0]
      except RuntimeError as e:  # No GPU: a setup problem, not a candidate result.
        print(f"error: {e}", file=sys.stderr)
        return 2
  if args.json:
    print(json.dumps(r.to_dict(), indent=2, default=str))
  else:
    print(format_result(r))
  return 0 if r.status in ("correct", STATIC_OK) else 1


def format_result(r: EvalResult) -> str:
  lines = [f"task:     {r.task_id}", f"status:   {r.status}", f"score:    {r.score:.4g}"]
  if r.speedup is not None:
    lines.append(f"speedup:  {r.speedup:.4g}x  (reference {r.ref_time_ms:.4g} ms, candidate {r.cand_time_ms:.4g} ms)")
  if r.flags:
    lines.append(f"flags:    {', '.join(r.flags)}")
  if r.times:
    lines.append("times:    " + ", ".join(f"{k} {v:.3f}s" for k, v in r.times.items() if isinstance(v, float)))
  lines.append("feedback:\n  " + r.feedback.replace("\n", "\n  "))
  return "\n".join(lines)


if __name__ == "__main__":
  sys.exit(main())
