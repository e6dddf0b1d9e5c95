"""A second device on the CPU, for placement tests: tensors on it compute on the CPU but report device `emu:0`.

Inside `on_emulated_device()`, factories given `device="emu"` (or run under `torch.device("emu")`) and `.to("emu")`
make such tensors; results of ops on them stay there. An op that mixes them with a CPU tensor of one or more
dimensions raises what CUDA raises ("Expected all tensors to be on the same device ..."); CPU scalars (0-dim),
CPU index tensors and cross-device copies are allowed, as on CUDA. Generators asked for on the device draw on
the CPU. So code that runs a reference on a GPU can be checked for CPU/GPU mixing without one.
"""

import contextlib

import torch
from torch.utils import backend_registration
from torch.utils._python_dispatch import TorchDispatchMode  # pylint: disable=protected-access
from torch.utils._pytree import tree_map  # pylint: disable=protected-access

NAME = "emu"
MIXED = f"Expected all tensors to be on the same device, but found at least two devices, {NAME}:0 and cpu!"
CROSS_DEVICE_OK = {"aten::_to_copy", "aten::copy_", "aten::index", "aten::index_put_", "aten::index_put",
                   "aten::_index_put_impl_", "aten::_local_scalar_dense"}


def _register() -> torch.device:
  if torch._C._get_privateuse1_backend_name() != NAME:  # pylint: disable=protected-access  # Once per process.
    backend_registration._setup_privateuseone_for_python_backend(NAME)  # pylint: disable=protected-access
  return torch.device(NAME, 0)


DEVICE = _register()


class OnDevice(torch.Tensor):
  """A CPU tensor (`elem`) that reports device emu:0."""

  @staticmethod
  def __new__(cls, elem):
    return torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(),  # pylint: disable=protected-access
                                               storage_offset=elem.storage_offset(), dtype=elem.dtype,
                                               device=DEVICE, requires_grad=elem.requires_grad)

  def __init__(self, elem):
    super().__init__()
    self.elem = elem

  def __repr__(self):
    return f"OnDevice({self.elem!r})"

  @classmethod
  def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
    return _dispatch(func, args, kwargs or {})


def _on_device(d) -> bool:
  return d is not None and torch.device(d).type == NAME


def _dispatch(func, args, kwargs):
  on, off = [], []

  def unwrap(t):
    if isinstance(t, OnDevice):
      on.append(t)
      return t.elem
    if isinstance(t, torch.Tensor):
      off.append(t)
    return t

  uargs, ukwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
  name = func._schema.name  # pylint: disable=protected-access
  if on and any(t.dim() > 0 for t in off) and name not in CROSS_DEVICE_OK:
    raise RuntimeError(f"{MIXED} ({name}: CPU tensors of shapes {[tuple(t.shape) for t in off]})")
  out_on = bool(on)
  if "device" in ukwargs:
    out_on = _on_device(ukwargs["device"])
    if out_on:
      ukwargs["device"] = torch.device("cpu")
  out = func(*uargs, **ukwargs)
  rets = func._schema.returns  # pylint: disable=protected-access
  if rets and rets[0].alias_info is not None and rets[0].alias_info.is_write:
    return args[0]  # In place (copy_, add_, out=...): the same object.
  return tree_map(lambda t: OnDevice(t) if out_on and isinstance(t, torch.Tensor) else t, out)


class _Factories(TorchDispatchMode):
  """Routes factories asked for on the device (no tensor argument reaches OnDevice's dispatch)."""

  def __torch_dispatch__(self, func, types, args=(), kwargs=None):
    kwargs = kwargs or {}
    if _on_device(kwargs.get("device")):
      return _dispatch(func, args, kwargs)
    return func(*args, **kwargs)


_Generator = torch.Generator


class _CpuGenerator(_Generator):
  """torch.Generator(device=...) that draws on the CPU for the emulated device."""

  def __new__(cls, device="cpu"):
    del device
    return _Generator.__new__(cls)

  def __init__(self, device="cpu"):
    del device
    super().__init__()


@contextlib.contextmanager
def on_emulated_device():
  """The emulated device is usable inside (module docstring); returns its torch.device."""
  torch.Generator = _CpuGenerator
  try:
    with _Factories():
      yield DEVICE
  finally:
    torch.Generator = _Generator
