"""The evaluator's own CUDA kernels (output comparison, keyed draws and seals, integrity hashes): each source
compiled with NVRTC and loaded once per device, launched on the device's current stream with one thread per item
and a grid-stride loop past a block cap. Not the candidates' kernels (runner.py launches those by their plan)."""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import torch

THREADS = 256
_loaded: dict = {}  # (source, CUDA device index) -> (module, {name: function}).


class Call(NamedTuple):
  """One launch of an owned kernel: its name, the items (one thread each) and its arguments (ctypes values in the
  kernel's parameter order; pointers as c_uint64 addresses). The tests run the same calls in the CPU emulator."""
  kernel: str
  items: int
  args: list


def function(source: str, name: str, device: torch.device, what: str):
  """Kernel `name` of `source`, compiled for `device`'s architecture on first use (`what` names it in errors)."""
  index = device.index if device.index is not None else torch.cuda.current_device()
  key = (source, index)
  if key not in _loaded:
    from cupy.cuda import function as cupy_function  # pylint: disable=g-import-not-at-top
    from kevin_jax.kernels import compile as compile_mod  # pylint: disable=g-import-not-at-top
    major, minor = torch.cuda.get_device_capability(index)
    res = compile_mod.compile_cuda(source, f"sm_{major}{minor}", cache_dir="")
    if not res.ok:
      raise RuntimeError(f"{what} did not compile: {res.log}")
    module = cupy_function.Module()
    module.load(res.cubin)
    _loaded[key] = (module, {})
  module, funcs = _loaded[key]
  if name not in funcs:
    funcs[name] = module.get_function(name)
  return funcs[name]


def blocks(items: int, max_blocks: int) -> int:
  """Blocks of THREADS threads for one thread per item, at most `max_blocks` (the kernels loop past the cap)."""
  return max(1, min(max_blocks, -(-items // THREADS)))


def launch(source: str, call: Call, device: torch.device, max_blocks: int, what: str) -> None:
  """`call` of a kernel of `source` (compiled by `function` on first use) on `device`'s current stream: THREADS
  threads per block, enough blocks for `call.items` threads, at most `max_blocks`."""
  from cupy_backends.cuda.api import driver  # pylint: disable=g-import-not-at-top
  func = function(source, call.kernel, device, what)
  params = (ctypes.c_void_p * len(call.args))(*[ctypes.addressof(v) for v in call.args])
  driver.launchKernel(func.ptr, blocks(call.items, max_blocks), 1, 1, THREADS, 1, 1, 0,
                      torch.cuda.current_stream(device).cuda_stream, ctypes.addressof(params), 0)
