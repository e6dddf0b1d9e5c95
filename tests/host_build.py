"""Builds C++ source into a shared library for tests that pin a CUDA formula to its Python reference on the host."""

import ctypes
import shutil
import subprocess

import pytest


def host_library(tmp_path_factory, name: str, source: str, *flags: str) -> ctypes.CDLL:
  """`source` compiled by g++ with -ffp-contract=off (no FMA contraction) and `flags`; skips without g++."""
  if shutil.which("g++") is None:
    pytest.skip("g++ is not installed")
  d = tmp_path_factory.mktemp(name)
  (d / f"{name}.cpp").write_text(source)
  subprocess.run(["g++", *flags, "-ffp-contract=off", "-shared", "-fPIC", str(d / f"{name}.cpp"), "-o",
                  str(d / f"{name}.so")], check=True, capture_output=True)
  return ctypes.CDLL(str(d / f"{name}.so"))
