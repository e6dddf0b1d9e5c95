"""CUDA devices as the driver sees them, through ctypes: no framework import, no CUDA context.

Importable from both worlds (learner and evaluator) and from tests/conftest.py before JAX starts.
"""

import ctypes


def device_count() -> int:
  """GPUs visible to the driver (cuInit + cuDeviceGetCount); 0 without a driver or a device."""
  try:
    lib = ctypes.CDLL("libcuda.so.1")
  except OSError:
    return 0
  if lib.cuInit(0) != 0:
    return 0
  count = ctypes.c_int(0)
  return count.value if lib.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0
