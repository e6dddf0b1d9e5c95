"""Entry point of an evaluator worker process (started by supervisor.py, never by hand).

  python -m kevin_jax.kernels.worker_main --fd FD --role {gpu,compile,fake} [--as-bytes N]

Protocol over the inherited socket FD (multiprocessing.connection framing, pickled tuples):
  supervisor -> worker   ("init", settings)  ("job", job_id, payload)  ("exit",)
  worker -> supervisor   ("ready", description)  ("phase", job_id, name)  ("result", job_id, result_dict)
A result with fatal=True (a sticky CUDA error, a hung kernel) is followed by the worker exiting at once.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import traceback
import warnings
from multiprocessing.connection import Connection

IDLE_AFTER_S = 0.05  # No next job within this long after a result: the handler's `idle` (GPU: release cached memory).


def _limit_resources(as_bytes: int) -> None:
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # No core dumps from crashing kernels.
  if as_bytes > 0:  # Address-space cap (not for GPU workers: CUDA reserves huge virtual ranges).
    resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))


class _CompileHandler:
  """Static checks (parse, validate, NVRTC) in a long-lived process (keeps NVRTC's PCH and task shapes warm).

  The process works in an empty private directory: NVRTC searches the working directory for `#include "..."`, so
  nothing there can be read even if a name got past the header rules.
  """

  def __init__(self, settings: dict):
    del settings
    from kevin_jax.kernels import compile as compile_mod  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top,unused-import  # Task analysis needs it; import once.
    compile_mod.include_dirs()  # Resolved (and cached) before leaving the start-up directory.
    self.workdir = tempfile.mkdtemp(prefix="kevin_jax_compile_")
    os.chdir(self.workdir)
    self.describe = {"nvrtc": list(compile_mod.nvrtc_version()), "pid": os.getpid()}

  def close(self) -> None:
    try:
      os.chdir("/")
      os.rmdir(self.workdir)
    except OSError:
      pass

  def run(self, payload: dict, report) -> dict:
    from kevin_jax.kernels import static  # pylint: disable=g-import-not-at-top
    report("static")
    return static.static_check(payload)


def _make_handler(role: str, settings: dict):
  if role == "gpu":
    from kevin_jax.kernels.worker import GpuWorker  # pylint: disable=g-import-not-at-top
    w = GpuWorker(settings)
    # From here on CuPy warnings (e.g. a silently shrunk grid) are errors; import-time notices are not.
    warnings.filterwarnings("error", module=r"cupy.*")

    class _Gpu:
      describe = dict(w.describe, pid=os.getpid())

      @staticmethod
      def run(payload, report):
        return w.run(payload, report)

      @staticmethod
      def idle():
        w.idle()

    return _Gpu()
  if role == "compile":
    return _CompileHandler(settings)
  if role == "fake":
    from kevin_jax.kernels.fake_worker import FakeHandler  # pylint: disable=g-import-not-at-top
    return FakeHandler(settings)
  raise ValueError(f"unknown worker role {role!r}")


def main(argv=None) -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--fd", type=int, required=True)
  ap.add_argument("--role", required=True)
  ap.add_argument("--as-bytes", type=int, default=0)
  args = ap.parse_args(argv)
  _limit_resources(args.as_bytes)
  conn = Connection(args.fd)
  try:
    kind, settings = conn.recv()
    assert kind == "init", kind
    handler = _make_handler(args.role, settings)
  except BaseException:  # pylint: disable=broad-except
    tb = traceback.format_exc()
    print(tb, file=sys.stderr, flush=True)
    try:
      conn.send(("failed", tb[-4000:]))
    finally:
      os._exit(2)
  conn.send(("ready", handler.describe))
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      break
    if msg[0] == "exit":
      break
    _, job_id, payload = msg
    report = lambda phase, _id=job_id: conn.send(("phase", _id, phase))
    try:
      result = handler.run(payload, report)
    except BaseException as e:  # pylint: disable=broad-except
      tb = traceback.format_exc()
      print(tb, file=sys.stderr, flush=True)
      result = {"status": "runtime_error", "error": f"evaluator error: {type(e).__name__}: {e}",
                "flags": ["evaluator_error"], "details": {"traceback": tb[-4000:]}, "times": {}, "fatal": True}
    if result.get("fatal"):
      print(f"worker {os.getpid()}: fatal result ({result.get('status')}: {result.get('error')}); exiting",
            file=sys.stderr, flush=True)
    conn.send(("result", job_id, result))
    if result.get("fatal"):
      sys.stderr.flush()
      os._exit(3)  # Sticky CUDA error or a running kernel: skip interpreter teardown.
    if hasattr(handler, "idle") and not conn.poll(IDLE_AFTER_S):
      handler.idle()
  if hasattr(handler, "close"):
    handler.close()
  sys.stderr.flush()
  os._exit(0)


if __name__ == "__main__":
  main()
