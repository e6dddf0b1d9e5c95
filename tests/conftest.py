"""Shared test setup.

- 8 fake CPU devices for sharding tests (set before JAX is imported anywhere).
- JAX runs on the CPU unless JAX_PLATFORMS is set (GPU JAX tests set it: JAX_PLATFORMS=cuda,cpu).
- On the CPU, LLVM optimisation level 1 (XLA's default is 2): the suite compiles hundreds of small programs, and
  level 1 compiles them ~20 % faster with no measurable change in how fast they run (a tiny policy's learner step).
- On the CPU, one persistent XLA compilation cache per test run (JAX_COMPILATION_CACHE_DIR, if set, wins): the
  many jobs that build the same learner and sampler (a new jit object each, so JAX's in-memory cache misses)
  compile them once. The directory is exported as JAX_COMPILATION_CACHE_DIR, so jobs that tests start as
  processes (`python -m kevin_jax.main`, whose config.compilation_cache_dir defaults to a user-level directory)
  use this run's cache, on any platform, instead of the user's.
- jax_numpy_rank_promotion="raise": implicit rank broadcasting is a bug in our code.
- `gpu` marker: skipped unless a CUDA GPU answers (checked through the driver, without torch/JAX/CuPy).
- `slow` marker: deselected by pytest.ini's `-m "not slow"`; `python -m pytest -q -m slow` runs them.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  _flags += " --xla_force_host_platform_device_count=8"
if os.environ["JAX_PLATFORMS"] == "cpu" and "xla_backend_optimization_level" not in _flags:
  _flags += " --xla_backend_optimization_level=1"
os.environ["XLA_FLAGS"] = _flags.strip()

import pytest  # pylint: disable=g-import-not-at-top

from kevin_jax import cuda_driver  # pylint: disable=g-import-not-at-top  (ctypes only)


HAS_GPU = cuda_driver.device_count() > 0


def pytest_configure(config):
  del config
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_numpy_rank_promotion", "raise")
  if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    cache = tempfile.mkdtemp(prefix="kevin_jax_xla_cache_")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = cache  # For the jobs tests start as processes.
    if os.environ["JAX_PLATFORMS"] == "cpu":
      jax.config.update("jax_compilation_cache_dir", cache)


def pytest_collection_modifyitems(config, items):
  del config
  if HAS_GPU:
    return
  skip = pytest.mark.skip(reason="needs a CUDA GPU (none found through libcuda)")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


@pytest.fixture
def cpu_devices8():
  """Eight fake CPU devices (XLA_FLAGS above)."""
  import jax  # pylint: disable=g-import-not-at-top
  devices = jax.devices("cpu")
  if len(devices) < 8:
    pytest.fail(f"expected 8 fake CPU devices, got {len(devices)}: XLA_FLAGS was set too late")
  return devices[:8]


@pytest.fixture
def fresh_jit_caches():
  """JAX's compilation caches cleared before and after the test. For tests that monkeypatch a decode kernel: the
  sampler's jitted decode loop is cached by its config, so a loop that an earlier test compiled with the same config
  (and the unpatched kernel) would be reused and the patched kernel never run, and a later test must not get this
  test's loop either."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.clear_caches()
  yield
  jax.clear_caches()
