"""Runs candidates on the CPU, at reduced shapes, with an emulator of the CUDA device dialect.

  python -m kevin_jax.kernels.emulate                                  # every level-1 suite candidate vs its label
  python -m kevin_jax.kernels.emulate level1/14_Matmul --dists          # also the correct ones on 5 distributions
  python -m kevin_jax.kernels.emulate level2/03_Gemm_LayerNorm --set M=67 --set N=131 --set K=45
  python -m kevin_jax.kernels.emulate --source generated --per-family 2     # the task world's reduced twins

A development and CI aid, not evidence: labels are established on a GPU by experiments/verify_suite.py. Each
candidate is validated with the evaluator's own static stage (format errors come out exactly as on the GPU), its
CUDA source is compiled with g++ against prelude.h (one fiber per CUDA thread, barriers and warp shuffles
cooperative; see its header for what is not modelled: races never show), and its plan runs on buffers with
random guard bands, outputs and uninitialised scratch poisoned with NaN, zero scratch zeroed. Status:
format_error, compile_error (g++, not NVRTC), runtime_error (a guard band, the dynamic shared memory canary or an
input changed), incorrect (allclose at the task's tolerance, NaN where the reference is finite), correct.

Builds are batched: `prepare` compiles many candidates into one shared library (each in its own C++ namespace,
with its own launchers), cached by content under the system temp directory; a batch that fails to compile is
split in halves until each failing candidate stands alone with its own error. Evaluator side: imports torch, never JAX.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import importlib.util
import os
import re
import subprocess
import tempfile
import types
from typing import Sequence

import numpy as np
import torch

from kevin_jax.kernels import static, taskinfo
from kevin_jax.kernels.candidate import FormatError, parse_candidate

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.join(tempfile.gettempdir(), "kevin_jax_emulate_cache")
GUARD = 64  # Guard elements on each side of every buffer.
DISTS = {  # Mirrors kevin_jax/kernels/inputs.py.
    "normal": lambda t: torch.randn_like(t),
    "uniform": lambda t: torch.rand_like(t) * 2 - 1,
    "heavy": lambda t: torch.distributions.Laplace(0.0, 1.0).sample(t.shape),
    "shifted": lambda t: torch.randn_like(t) * 2 + 1,
}
_NP = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
       "bool": np.bool_}
_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w ]+?)\s+(\w+)\s*\[\s*\]\s*;")
_EXTERN_C = re.compile(r'extern\s+"C"\s+')
_INCLUDE = re.compile(r"^\s*#\s*include\b.*$", re.M)


class _Arg(ctypes.Structure):
  _fields_ = [("kind", ctypes.c_int), ("i", ctypes.c_longlong), ("d", ctypes.c_double), ("p", ctypes.c_ulonglong)]


class _Dim3(ctypes.Structure):
  _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


@dataclasses.dataclass(frozen=True)
class _Built:
  lib: ctypes.CDLL
  prefix: str  # Launcher names: emu_launch_<prefix>_<kernel>.


_built: dict[str, _Built | str] = {}  # Source digest -> build, or the compile error text.


def _digest(source: str) -> str:
  return hashlib.sha1(source.encode()).hexdigest()[:16]


def _unit(k: int, source: str, kernels: Sequence[str]) -> str:
  """One candidate as a namespaced block of the shared library, with its launchers."""
  src = _INCLUDE.sub("", _EXTERN_C.sub("", _SHARED.sub(r"\1* \2 = reinterpret_cast<\1*>(g_dyn_smem);", source)))
  wrappers = [f'extern "C" int emu_launch_c{k}_{name}(Dim3 g, Dim3 b, unsigned long long smem, const EmuArg* a, '
              f"int n) {{\n  if (emu_arity(&emu_c{k}::{name}) != n) return -1;\n"
              f"  dim3 gg; gg.x = g.x; gg.y = g.y; gg.z = g.z; dim3 bb; bb.x = b.x; bb.y = b.y; bb.z = b.z;\n"
              f"  emu_launch(gg, bb, smem, [=]() {{ emu_call(emu_c{k}::{name}, a, n); }});\n  return 0;\n}}\n"
              for name in kernels]
  return f"namespace emu_c{k} {{\n{src}\n}}  // namespace emu_c{k}\n" + "\n".join(wrappers)


def _compile(units: list[str]) -> ctypes.CDLL:
  with open(os.path.join(HERE, "prelude.h"), encoding="utf-8") as f:
    prelude = f.read()
  full = ('#include "prelude.h"\nstruct Dim3 { unsigned x, y, z; };\n'
          "template <typename... P> int emu_arity(void (*)(P...)) { return sizeof...(P); }\n" + "\n".join(units))
  os.makedirs(CACHE, exist_ok=True)
  key = hashlib.sha1((full + prelude).encode()).hexdigest()[:16]
  so = os.path.join(CACHE, key + ".so")
  if not os.path.exists(so):
    cpp = os.path.join(CACHE, f"{key}.{os.getpid()}.cpp")
    with open(cpp, "w", encoding="utf-8") as f:
      f.write(full)
    tmp = f"{so}.{os.getpid()}.tmp"
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-w", "-I", HERE, cpp,
                        "-o", tmp], capture_output=True, text=True, check=False)
    os.unlink(cpp)
    if r.returncode:
      raise RuntimeError(r.stderr[:2000])
    os.replace(tmp, so)
  return ctypes.CDLL(so)


def prepare(texts: Sequence[str]) -> None:
  """Compiles the CUDA blocks of many candidates in one g++ run (those that parse and are not built yet)."""
  todo: dict[str, tuple[str, list[str]]] = {}
  for text in texts:
    try:
      cand = parse_candidate(text)
    except FormatError:
      continue
    key = _digest(cand.cuda_source)
    if key not in _built and key not in todo:
      todo[key] = (cand.cuda_source, list(cand.kernels))
  if not todo:
    return
  _build_batch(list(todo.items()))


def _build_batch(items: list) -> None:
  """One library for the batch; when it does not compile, each half on its own (a failing candidate gets its own
  error after log2(batch) builds)."""
  try:
    lib = _compile([_unit(k, src, kernels) for k, (_, (src, kernels)) in enumerate(items)])
    for k, (key, _) in enumerate(items):
      _built[key] = _Built(lib, f"c{k}")
  except RuntimeError as e:
    if len(items) == 1:
      _built[items[0][0]] = str(e)
      return
    _build_batch(items[:len(items) // 2])
    _build_batch(items[len(items) // 2:])


def _library(source: str, kernels: Sequence[str]) -> _Built:
  key = _digest(source)
  if key not in _built:
    try:
      _built[key] = _Built(_compile([_unit(0, source, kernels)]), "c0")
    except RuntimeError as e:
      _built[key] = str(e)
  b = _built[key]
  if isinstance(b, str):
    raise RuntimeError(b)
  return b


def _alloc(shape, dtype, fill, rng: np.random.Generator):
  n = int(np.prod(shape)) if shape else 1
  buf = np.empty(n + 2 * GUARD, dtype=dtype)
  raw = buf.view(np.uint8)
  raw[:] = rng.integers(0, 256, raw.size, dtype=np.uint8)
  data = buf[GUARD:GUARD + n].reshape(shape)
  if fill is not None:
    data[...] = fill
  guards = (raw[:GUARD * buf.itemsize].copy(), raw[-GUARD * buf.itemsize:].copy())
  return buf, data, guards


def _guards_ok(entry) -> bool:
  buf, _, (lo, hi) = entry
  raw = buf.view(np.uint8)
  return bool(np.array_equal(raw[:lo.size], lo) and np.array_equal(raw[-hi.size:], hi))


def load_module(path: str | None = None, source: str | None = None, overrides: dict | None = None):
  """A task module from a file or from its text, with module constants overridden (reduced sizes)."""
  if source is not None:
    mod = types.ModuleType("emulated_task")
    exec(compile(source, "<emulated_task>", "exec"), mod.__dict__)  # pylint: disable=exec-used  # A task module.
  else:
    spec = importlib.util.spec_from_file_location("emulated_task", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
  for k, v in (overrides or {}).items():
    if not hasattr(mod, k):
      raise KeyError(f"task module has no constant {k}")
    setattr(mod, k, type(getattr(mod, k))(v))
  return mod


def launch_source(source: str, kernel: str, grid: int, block: int, args: Sequence) -> None:
  """One 1-D launch of `kernel` of a plain CUDA source on the CPU, on host memory: `args` are ctypes values in the
  kernel's parameter order (c_float / c_double for floating-point parameters; integer values, pointers as
  addresses, for the rest). For the evaluator's own kernels (owned.py), which the GPU runs on device memory."""
  built = _library(source, re.findall(r"__global__\s+void\s+(\w+)", source))  # Launchers for every kernel.
  packed = (_Arg * max(1, len(args)))()
  for j, a in enumerate(args):
    if isinstance(a, (ctypes.c_float, ctypes.c_double)):
      packed[j].kind, packed[j].d = 1, a.value
    else:
      v = int(a.value) & ((1 << 64) - 1)
      packed[j].kind, packed[j].p, packed[j].i = 0, v, v - (1 << 64) if v >> 63 else v
  fn = getattr(built.lib, f"emu_launch_{built.prefix}_{kernel}")
  if fn(_Dim3(grid, 1, 1), _Dim3(block, 1, 1), ctypes.c_ulonglong(0), packed, len(args)):
    raise ValueError(f"{kernel} takes a different number of parameters than the {len(args)} given")


def run(mod, text: str, seed: int = 0, dist=None) -> tuple[str, str]:
  """Emulates one candidate on a (reduced) task module; returns (status, message)."""
  torch.manual_seed(seed)
  model = taskinfo.as_reference(mod.Model(*mod.get_init_inputs()))
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
  rng = np.random.default_rng(seed + 77)
  bufs = {}
  for name, t in zip(info.input_names, inputs):
    if isinstance(t, torch.Tensor):
      bufs[name] = _alloc(tuple(t.shape), t.numpy().dtype, t.numpy(), rng)
  for n, p in list(model.named_parameters()) + list(model.named_buffers()):
    a = p.detach().contiguous().numpy()
    bufs[n] = _alloc(a.shape, a.dtype, a, rng)
  for k, r in enumerate(refs):
    dt = r.numpy().dtype
    bufs[f"out{k}"] = _alloc(tuple(r.shape), dt, np.nan if np.issubdtype(dt, np.floating) else -987654321, rng)
  for name, dtype, dims, zero in bound.scratch:
    npd = _NP[dtype]
    bufs[name] = _alloc(tuple(dims), npd, 0 if zero else (np.nan if np.issubdtype(npd, np.floating) else None), rng)
  try:
    built = _library(cand.cuda_source, list(cand.kernels))
  except RuntimeError as e:
    return "compile_error", str(e)[:400]
  overrun = ctypes.c_int.in_dll(built.lib, "g_smem_overrun")
  for launch in bound.launches:
    args = (_Arg * max(1, len(launch.args)))()
    for j, a in enumerate(launch.args):
      if a[0] == "tensor":
        args[j].kind, args[j].p = 2, bufs[a[1]][1].ctypes.data
      elif a[1] in ("float32", "float64"):
        args[j].kind, args[j].d = 1, a[2]
      else:
        args[j].kind, args[j].i = 0, int(a[2])
    fn = getattr(built.lib, f"emu_launch_{built.prefix}_{launch.kernel}")
    overrun.value = 0
    if fn(_Dim3(*launch.grid), _Dim3(*launch.block), ctypes.c_ulonglong(launch.smem), args, len(launch.args)):
      return "format_error", f"argument count mismatch for {launch.kernel}"
    if overrun.value:
      return "runtime_error", f"{launch.kernel}: dynamic shared memory overrun"
    for n, entry in bufs.items():
      if not _guards_ok(entry):
        return "runtime_error", f"{launch.kernel}: guard band of {n} overwritten"
  for name, t in zip(info.input_names, inputs):
    if isinstance(t, torch.Tensor) and not np.array_equal(bufs[name][1], t.numpy(), equal_nan=True):
      return "runtime_error", f"input {name} modified"
  atol, rtol = info.options.get("atol") or 1e-4, info.options.get("rtol") or 1e-4
  for k, r in enumerate(refs):
    got = torch.from_numpy(np.array(bufs[f"out{k}"][1]))
    if r.dtype.is_floating_point:
      bad = ~torch.isclose(got, r, rtol=rtol, atol=atol, equal_nan=True)
      if bad.any():
        return "incorrect", (f"out{k}: {int(bad.sum())}/{bad.numel()} mismatched ({int(got[bad].isnan().sum())} "
                             f"NaN), max abs error {float((got - r)[bad].abs().nan_to_num(float('inf')).max()):.3g}")
    elif (got != r).any():
      return "incorrect", f"out{k}: {int((got != r).sum())}/{r.numel()} mismatched"
  return "correct", ""
