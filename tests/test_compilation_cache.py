"""runtime.enable_compilation_cache: config.compilation_cache_dir turns JAX's persistent cache on (programs that
compiled for at least compilation_cache_min_compile_s are written there), '' leaves it off, and the environment's
JAX_COMPILATION_CACHE_DIR wins. Each case runs in its own process: the cache is process-wide JAX state."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_JOB = """
import sys
import jax, jax.numpy as jnp
from configs import multiturn
from kevin_jax import runtime
c = multiturn.get_config()
c.compilation_cache_dir, c.compilation_cache_min_compile_s = sys.argv[1], float(sys.argv[2])
print("CACHE=" + runtime.enable_compilation_cache(c))
jax.jit(lambda x: jnp.sin(x) @ x.T + 1)(jnp.ones((64, 64))).block_until_ready()
"""


def _run(cache_dir: str, min_s: float, env_dir: str | None = None) -> str:
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  if env_dir:
    env["JAX_COMPILATION_CACHE_DIR"] = env_dir
  r = subprocess.run([sys.executable, "-c", _JOB, cache_dir, str(min_s)], env=env, cwd=ROOT, capture_output=True,
                     text=True, timeout=300, check=True)
  return [line for line in r.stdout.splitlines() if line.startswith("CACHE=")][0][len("CACHE="):]


def _entries(d) -> list[str]:
  return [f for f in os.listdir(d) if not f.startswith(".")] if os.path.isdir(d) else []


def test_config_dir_is_written_and_threshold_skips_fast_programs(tmp_path):
  on, fast = tmp_path / "on", tmp_path / "fast"
  assert _run(str(on), 0.0) == str(on)
  assert _entries(on)  # The jitted program (and its eager ops) were written.
  assert _run(str(fast), 1e6) == str(fast)
  assert not _entries(fast)  # Nothing compiles for 10^6 s: nothing is written.


def test_off_and_environment_precedence(tmp_path):
  assert _run("", 0.0) == ""
  env_dir, cfg_dir = tmp_path / "env", tmp_path / "cfg"
  assert _run(str(cfg_dir), 0.0, env_dir=str(env_dir)) == str(env_dir)
  assert _entries(env_dir) and not _entries(cfg_dir)
