"""Run suite candidates on the CPU, at reduced shapes, with an emulator of the CUDA device dialect.

  python experiments/emulate_suite/emulate.py                       # every level-1 candidate vs its label
  python experiments/emulate_suite/emulate.py level1/14_Matmul --dists   # also the correct ones on 5 distributions
  python experiments/emulate_suite/emulate.py level2/03_Gemm_LayerNorm --set M=67 --set N=131 --set K=45

A development aid for writing tasks without a GPU, not evidence: the labels are established on a GPU by
experiments/verify_suite.py. Each candidate is validated with the evaluator's own static stage (format errors
come out exactly as on the GPU), its CUDA source is compiled with g++ against prelude.h (one fiber per CUDA
thread, barriers and warp shuffles cooperative; see its header for what is not modelled), and its plan runs on
guard-banded buffers whose outputs are NaN-poisoned. Status: format_error, compile_error (g++, not NVRTC),
runtime_error (a guard band, dynamic shared memory canary or input changed), incorrect (allclose at the task's
tolerance, unwritten elements), correct. Reduced shapes override the task module's size constants (SMALL below
for level 1; --set NAME=VALUE for anything else); pick them so boundary cases (partial tiles, odd sizes, numel
% 4 != 0) still occur.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from kevin_jax.kernels import static, suite, taskinfo  # pylint: disable=wrong-import-position
from kevin_jax.kernels.candidate import FormatError  # pylint: disable=wrong-import-position

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.join(tempfile.gettempdir(), "kevin_jax_emulate_cache")
GUARD = 64  # Guard elements on each side of every buffer.
CANARY = 0xA5
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
    "21_DepthwiseConv2d": dict(BATCH=2, CHANNELS=3, HEIGHT=37, WIDTH=71), "22_Conv2d": dict(BATCH=2, HEIGHT=19, WIDTH=21),
    "23_CrossEntropyLoss": dict(BATCH=37, CLASSES=211), "24_HuberLoss": dict(BATCH=37, DIM=211),
}
DISTS = {  # Mirrors kevin_jax/kernels/inputs.py.
    "normal": lambda t: torch.randn_like(t),
    "uniform": lambda t: torch.rand_like(t) * 2 - 1,
    "heavy": lambda t: torch.distributions.Laplace(0.0, 1.0).sample(t.shape),
    "shifted": lambda t: torch.randn_like(t) * 2 + 1,
}
_NP = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
       "bool": np.bool_}


class _Arg(ctypes.Structure):
  _fields_ = [("kind", ctypes.c_int), ("i", ctypes.c_longlong), ("d", ctypes.c_double), ("p", ctypes.c_ulonglong)]


class _Dim3(ctypes.Structure):
  _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def build(source: str, kernels) -> ctypes.CDLL:
  """Compiles the candidate's source with the prelude and one launcher per kernel (cached by content)."""
  src = re.sub(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w ]+?)\s+(\w+)\s*\[\s*\]\s*;",
               r"\1* \2 = reinterpret_cast<\1*>(g_dyn_smem);", source)
  wrappers = [f'extern "C" int emu_launch_{k}(Dim3 g, Dim3 b, unsigned long long smem, const EmuArg* a, int n) {{\n'
              f"  if (emu_arity(&{k}) != n) return -1;\n"
              f"  dim3 gg; gg.x = g.x; gg.y = g.y; gg.z = g.z; dim3 bb; bb.x = b.x; bb.y = b.y; bb.z = b.z;\n"
              f"  emu_launch(gg, bb, smem, [=]() {{ emu_call({k}, a, n); }});\n  return 0;\n}}\n" for k in kernels]
  with open(os.path.join(HERE, "prelude.h"), encoding="utf-8") as f:
    prelude = f.read()
  full = ('#include "prelude.h"\nstruct Dim3 { unsigned x, y, z; };\n'
          "template <typename... P> int emu_arity(void (*)(P...)) { return sizeof...(P); }\n" + src + "\n"
          + "\n".join(wrappers))
  os.makedirs(CACHE, exist_ok=True)
  key = hashlib.sha1((full + prelude).encode()).hexdigest()[:16]
  so = os.path.join(CACHE, key + ".so")
  if not os.path.exists(so):
    cpp = os.path.join(CACHE, key + ".cpp")
    with open(cpp, "w", encoding="utf-8") as f:
      f.write(full)
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-I", HERE, cpp, "-o", so + ".tmp"],
                       capture_output=True, text=True, check=False)
    if r.returncode:
      raise RuntimeError(r.stderr[:2000])
    os.replace(so + ".tmp", so)
  return ctypes.CDLL(so)


def _alloc(shape, dtype, fill):
  n = int(np.prod(shape)) if shape else 1
  buf = np.empty(n + 2 * GUARD, dtype=dtype)
  buf.view(np.uint8)[:] = CANARY
  data = buf[GUARD:GUARD + n].reshape(shape)
  if fill is not None:
    data[...] = fill
  return buf, data


def _guards_ok(buf) -> bool:
  b, g = buf.view(np.uint8), GUARD * buf.itemsize
  return bool((b[:g] == CANARY).all() and (b[-g:] == CANARY).all())


def load_task(path: str, overrides: dict):
  spec = importlib.util.spec_from_file_location("emulated_task", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  for k, v in overrides.items():
    if not hasattr(mod, k):
      raise KeyError(f"{path} has no module constant {k}")
    setattr(mod, k, type(getattr(mod, k))(v))
  return mod


def run(task_path: str, text: str, overrides: dict, seed: int = 0, dist=None) -> tuple[str, str]:
  """Emulates one candidate on the reduced task; returns (status, message)."""
  mod = load_task(task_path, overrides)
  torch.manual_seed(seed)
  model = mod.Model(*mod.get_init_inputs())
  torch.manual_seed(seed + 1000)
  inputs = list(mod.get_inputs())
  if dist is not None:
    inputs = [dist(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
  with torch.no_grad():
    ref = model(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
  refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
  info = taskinfo.describe_live("emulated", mod, model, inputs, ref)
  try:
    cand, bound = static.validate(text, info, static.Limits())
  except FormatError as e:
    return "format_error", str(e)
  bufs = {}
  for name, t in zip(info.input_names, inputs):
    if isinstance(t, torch.Tensor):
      bufs[name] = _alloc(tuple(t.shape), t.numpy().dtype, t.numpy())
  for n, p in list(model.named_parameters()) + list(model.named_buffers()):
    a = p.detach().contiguous().numpy()
    bufs[n] = _alloc(a.shape, a.dtype, a)
  for k, r in enumerate(refs):
    dt = r.numpy().dtype
    bufs[f"out{k}"] = _alloc(tuple(r.shape), dt, np.nan if np.issubdtype(dt, np.floating) else -987654321)
  for name, dtype, dims, zero in bound.scratch:
    bufs[name] = _alloc(tuple(dims), _NP[dtype], 0 if zero else None)
  try:
    lib = build(cand.cuda_source, sorted({l.kernel for l in bound.launches}))
  except RuntimeError as e:
    return "compile_error", str(e)[:400]
  for launch in bound.launches:
    args = (_Arg * max(1, len(launch.args)))()
    for j, a in enumerate(launch.args):
      if a[0] == "tensor":
        args[j].kind, args[j].p = 2, bufs[a[1]][1].ctypes.data
      elif a[1] in ("float32", "float64"):
        args[j].kind, args[j].d = 1, a[2]
      else:
        args[j].kind, args[j].i = 0, int(a[2])
    fn = getattr(lib, "emu_launch_" + launch.kernel)
    if fn(_Dim3(*launch.grid), _Dim3(*launch.block), ctypes.c_ulonglong(launch.smem), args, len(launch.args)):
      return "format_error", f"argument count mismatch for {launch.kernel}"
    if ctypes.c_int.in_dll(lib, "g_smem_overrun").value:
      return "runtime_error", f"{launch.kernel}: dynamic shared memory overrun"
    for n, (buf, _) in bufs.items():
      if not _guards_ok(buf):
        return "runtime_error", f"{launch.kernel}: guard band of {n} overwritten"
  for name, t in zip(info.input_names, inputs):
    if isinstance(t, torch.Tensor) and not np.array_equal(bufs[name][1], t.numpy(), equal_nan=True):
      return "runtime_error", f"input {name} modified"
  atol, rtol = info.options.get("atol") or 1e-4, info.options.get("rtol") or 1e-4
  for k, r in enumerate(refs):
    got = torch.from_numpy(np.array(bufs[f"out{k}"][1]))
    if r.dtype.is_floating_point:
      if not torch.isfinite(got).all():
        return "incorrect", f"out{k}: {int((~torch.isfinite(got)).sum())} elements not finite (unwritten?)"
      bad = ~torch.isclose(got, r, rtol=rtol, atol=atol)
      if bad.any():
        return "incorrect", (f"out{k}: {int(bad.sum())}/{bad.numel()} mismatched, max abs error "
                             f"{float((got - r).abs().max()):.3g}")
    elif (got != r).any():
      return "incorrect", f"out{k}: {int((got != r).sum())}/{r.numel()} mismatched"
  return "correct", ""


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("tasks", nargs="*", help="task ids (default: every level-1 task)")
  ap.add_argument("--set", action="append", default=[], help="module constant override NAME=VALUE (repeatable)")
  ap.add_argument("--dists", action="store_true", help="also run the correct solutions on other distributions")
  a = ap.parse_args(argv)
  by_id = {t.id: t for t in suite.load_suite()}
  ids = a.tasks or [t for t in by_id if t.startswith("level1/")]
  extra = {k: (float(v) if "." in v else int(v)) for k, v in (s.split("=", 1) for s in a.set)}
  mismatches = 0
  for tid in ids:
    task = by_id[tid]
    overrides = dict(SMALL.get(task.spec.name, {}) if task.level == 1 else {}, **extra)
    for c in task.candidates():
      t0 = time.time()
      status, msg = run(task.spec.path, c.text, overrides)
      ok = status == c.expect
      mismatches += not ok
      print(f"{'ok ' if ok else 'BAD'} {tid:28s} {c.name:24s} expect={c.expect:14s} got={status:14s} "
            f"{time.time() - t0:4.1f}s {msg.splitlines()[0][:100] if msg else ''}", flush=True)
      if a.dists and c.expect == "correct":
        allowed = getattr(load_task(task.spec.path, {}), "INPUT_DISTRIBUTIONS", None) or tuple(DISTS)
        for dn, d in DISTS.items():
          if dn not in allowed:
            continue
          status, msg = run(task.spec.path, c.text, overrides, seed=3, dist=d)
          if status != "correct":
            mismatches += 1
            print(f"BAD {tid:28s} {c.name:24s} on {dn} inputs: {status} {msg[:100]}", flush=True)
  print(f"{mismatches} mismatches")
  return 1 if mismatches else 0


if __name__ == "__main__":
  sys.exit(main())
