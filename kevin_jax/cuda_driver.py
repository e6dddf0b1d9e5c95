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


def describe() -> str:
  """'<GPU 0 name>, driver <version>, CUDA <driver API version>' (the NVIDIA driver's version from
  /proc/driver/nvidia/version), or 'no GPU'."""
  if device_count() == 0:
    return "no GPU"
  lib = ctypes.CDLL("libcuda.so.1")
  dev, name, version = ctypes.c_int(0), ctypes.create_string_buffer(256), ctypes.c_int(0)
  lib.cuDeviceGet(ctypes.byref(dev), 0)
  lib.cuDeviceGetName(name, 256, dev)
  lib.cuDriverGetVersion(ctypes.byref(version))
  driver = "unknown"
  try:
    with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
      words = f.readline().split()
    driver = next((w for w in words if w[:1].isdigit() and "." in w), driver)
  except OSError:
    pass
  v = version.value
  return f"{name.value.decode(errors='replace')}, driver {driver}, CUDA {v // 1000}.{v % 1000 // 10}"
