"""Builds C++ source into a shared library for tests that pin a CUDA formula to its Python reference on the host."""

import ctypes
import os
import shutil
import subprocess

import pytest

from kevin_jax.kernels.emulate import emulator

# The CUDA device dialect on the host (the emulator's prelude: __device__, __fadd_rn, __float_as_uint, ...).
DEVICE_PRELUDE = '#include "prelude.h"\n'


def host_library(tmp_path_factory, name: str, source: str, *flags: str) -> ctypes.CDLL:
  """`source` compiled by g++ (C++17, the prelude's directory on the include path) with -ffp-contract=off (no FMA
  contraction) and `flags`; skips without g++."""
  if shutil.which("g++") is None:
    pytest.skip("g++ is not installed")
  d = tmp_path_factory.mktemp(name)
  (d / f"{name}.cpp").write_text(source)
  subprocess.run(["g++", "-std=c++17", *flags, "-ffp-contract=off", "-I", os.path.dirname(emulator.__file__),
                  "-shared", "-fPIC", str(d / f"{name}.cpp"), "-o", str(d / f"{name}.so")], check=True,
                 capture_output=True)
  return ctypes.CDLL(str(d / f"{name}.so"))
