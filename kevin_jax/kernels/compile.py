"""NVRTC compilation of candidate device code to a cubin, without a GPU.

Options are fixed by the evaluator (the candidate chooses none): an explicit `-arch=sm_XX` cubin (the device's exact
arch; sm_90 for compile-only), C++17, `--device-as-default-execution-space`, warnings off (the feedback shows errors
only), a pre-included prelude with the fixed-width integer types and C's INFINITY / NAN, and include paths for the
CUDA runtime headers, CCCL (cub / libcu++) and a small shim directory mapping <cstdint>, <cmath>, ... to `cuda/std`;
NVRTC's automatic precompiled headers (`--pch`, NVRTC >= 12.8) in long-lived compile workers. Which headers a
candidate may name is preprocess.py's rule; the log returned here keeps diagnostics of the candidate's own file and
the public headers only (`clean_log`), so no other file's text can reach the feedback.

NVRTC is reached through CuPy's low-level bindings (`cupy_backends.cuda.libs.nvrtc`, present in cupy-cuda12x and
cupy-cuda13x) or, failing that, `cuda.bindings.nvrtc`. Results are cached in memory and on disk, keyed by source,
options, NVRTC version and the shim headers. The cubin itself is read by cubin.py.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import os
import re
import sys
import tempfile
import time

SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")
PROGRAM_NAME = "kernel.cu"
DEFAULT_ARCH = "sm_90"
MAX_LOG_CHARS = 8000  # Cleaned log kept in the result record; feedback truncates further.
_MEMORY_CACHE_ENTRIES = 256
_CACHE_VERSION = 2  # Part of the cache key: entries written by an older log cleaner are not served.


@dataclasses.dataclass
class CompileResult:
  """Outcome of one NVRTC compile. Iterates as (ok, cubin, log, seconds)."""
  ok: bool
  cubin: bytes
  log: str
  seconds: float
  cached: bool = False
  options: tuple[str, ...] = ()
  nvrtc_version: tuple[int, int] = (0, 0)

  def __iter__(self):
    return iter((self.ok, self.cubin, self.log, self.seconds))


# --- NVRTC bindings --------------------------------------------------------------------------------------


class _Nvrtc:
  """The subset of NVRTC we need, over cupy_backends or cuda.bindings."""

  def __init__(self):
    try:
      from cupy_backends.cuda.libs import nvrtc  # pylint: disable=g-import-not-at-top
      self._cupy, self._cb = nvrtc, None
    except ImportError:
      try:
        from cuda.bindings import nvrtc  # pylint: disable=g-import-not-at-top
      except ImportError:
        from cuda import nvrtc  # pylint: disable=g-import-not-at-top  # cuda-python < 12.6 layout
      self._cupy, self._cb = None, nvrtc

  @functools.cached_property
  def version(self) -> tuple[int, int]:
    if self._cupy is not None:
      return tuple(self._cupy.getVersion())
    err, major, minor = self._cb.nvrtcVersion()
    self._check(err, "nvrtcVersion")
    return (major, minor)

  def _check(self, err, what):
    if int(err) != 0:
      raise RuntimeError(f"{what} failed: {err}")

  def compile(self, source: str, options: list[str]) -> tuple[bool, bytes, str]:
    if self._cupy is not None:
      n = self._cupy
      prog = n.createProgram(source, PROGRAM_NAME, [], [])
      try:
        try:
          n.compileProgram(prog, options)
          ok = True
        except n.NVRTCError as e:
          if "NVRTC_ERROR_COMPILATION" not in str(e):
            return False, b"", f"NVRTC failed: {e}\n" + _safe(lambda: n.getProgramLog(prog))
          ok = False
        log = n.getProgramLog(prog)
        return ok, (n.getCUBIN(prog) if ok else b""), log
      finally:
        n.destroyProgram(prog)
    n = self._cb
    err, prog = n.nvrtcCreateProgram(source.encode(), PROGRAM_NAME.encode(), 0, [], [])
    self._check(err, "nvrtcCreateProgram")
    try:
      opts = [o.encode() for o in options]
      (err,) = n.nvrtcCompileProgram(prog, len(opts), opts)
      ok = int(err) == 0
      err_l, size = n.nvrtcGetProgramLogSize(prog)
      log = b" " * size
      n.nvrtcGetProgramLog(prog, log)
      log = log.rstrip(b"\0 ").decode(errors="replace")
      if not ok and int(err) != 6:  # 6 = NVRTC_ERROR_COMPILATION: an ordinary compile error.
        return False, b"", f"NVRTC failed: {err}\n{log}"
      cubin = b""
      if ok:
        err, size = n.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        n.nvrtcGetCUBIN(prog, cubin)
      del err_l
      return ok, cubin, log
    finally:
      n.nvrtcDestroyProgram(prog)


def _safe(fn):
  try:
    return fn()
  except Exception:  # pylint: disable=broad-except
    return ""


@functools.lru_cache(maxsize=None)
def nvrtc() -> _Nvrtc:
  return _Nvrtc()


def nvrtc_version() -> tuple[int, int]:
  return nvrtc().version


# --- include directories ---------------------------------------------------------------------------------


def _site_dirs() -> list[str]:
  import site  # pylint: disable=g-import-not-at-top
  dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()]
  dirs += [p for p in sys.path if p.endswith("site-packages")]
  return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def _pathfinder(lib: str) -> str | None:
  try:
    from cuda import pathfinder  # pylint: disable=g-import-not-at-top
    return pathfinder.find_nvidia_header_directory(lib)
  except Exception:  # pylint: disable=broad-except
    return None


def _first_with(cands, rel: str) -> str | None:
  for d in cands:
    if d and os.path.isfile(os.path.join(d, rel)):
      return d
  return None


def _header_major(inc_dir: str) -> int | None:
  """CUDA major version of a header directory (CUDART_VERSION in cuda_runtime_api.h), if readable."""
  try:
    with open(os.path.join(inc_dir, "cuda_runtime_api.h"), encoding="utf-8", errors="replace") as f:
      m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
    return int(m.group(1)) // 1000 if m else None
  except OSError:
    return None


@functools.lru_cache(maxsize=None)
def include_dirs() -> tuple[str, ...]:
  """Shim, CUDA runtime headers, CCCL and (when it matches NVRTC's major version) the crt headers for mma.h.

  Raises:
    RuntimeError: the CUDA runtime headers (cuda_fp16.h) or CCCL (cuda/std) cannot be found.
  """
  major = nvrtc_version()[0]
  sites = _site_dirs()
  nv = [os.path.join(s, "nvidia") for s in sites]
  cudart = _first_with([_pathfinder("cudart")] + [os.path.join(n, "cuda_runtime", "include") for n in nv]
                       + [os.path.join(n, f"cu{major}", "include") for n in nv], "cuda_fp16.h")
  cccl = _first_with([_pathfinder("cccl")] + [os.path.join(n, "cuda_cccl", "include") for n in nv]
                     + [os.path.join(n, f"cu{major}", "include", "cccl") for n in nv]
                     + ([os.path.join(cudart, "cccl")] if cudart else []), "cuda/std/cstdint")
  dirs = [SHIM_DIR]
  if cudart is None:
    raise RuntimeError("CUDA runtime headers (cuda_fp16.h) not found: install nvidia-cuda-runtime-cu12 or "
                       "cuda-toolkit[cudart] (requirements-cuda*.txt)")
  dirs.append(cudart)
  if cccl is None:
    import cupy  # pylint: disable=g-import-not-at-top  # CuPy bundles CCCL as a last resort.
    bundled = os.path.join(os.path.dirname(cupy.__file__), "_core", "include", "cupy", "_cccl")
    parts = [os.path.join(bundled, p) for p in ("libcudacxx", "cub", "thrust")]
    if not os.path.isfile(os.path.join(parts[0], "cuda", "std", "cstdint")):
      raise RuntimeError("CCCL headers (cuda/std/cstdint) not found: install nvidia-cuda-cccl-cu12 or "
                         "cuda-toolkit[cccl]")
    dirs += parts
  else:
    dirs.append(cccl)
  crt = _first_with([cudart, _pathfinder("nvcc")] + [os.path.join(n, "cuda_nvcc", "include") for n in nv],
                    "crt/mma.h")
  if crt and crt != cudart and _header_major(crt) in (None, major):
    dirs.append(crt)
  return tuple(dict.fromkeys(dirs))


@functools.lru_cache(maxsize=None)
def _shim_digest() -> str:
  h = hashlib.sha256()
  for path in sorted(glob.glob(os.path.join(SHIM_DIR, "*"))):
    with open(path, "rb") as f:
      h.update(os.path.basename(path).encode() + b"\0" + f.read())
  return h.hexdigest()[:16]


def nvrtc_options(arch: str = DEFAULT_ARCH, use_pch: bool = True) -> list[str]:
  """The evaluator-fixed NVRTC options for `arch` ('sm_90', '90' or 'sm_90a')."""
  arch = arch if arch.startswith(("sm_", "compute_")) else f"sm_{arch}"
  if not re.fullmatch(r"sm_\d+[a-z]?", arch):
    raise ValueError(f"arch must look like sm_90 (a cubin target), got {arch!r}")
  opts = [f"-arch={arch}", "--std=c++17", "--device-as-default-execution-space", "--disable-warnings",
          "--pre-include=kevin_prelude.h"]
  opts += [f"-I{d}" for d in include_dirs()]
  if use_pch and nvrtc_version() >= (12, 8):
    opts.append("--pch")
  return opts


# --- log cleaning ----------------------------------------------------------------------------------------

_PCH_LINE = re.compile(r"precompiled header|^Remark: The warnings can be suppressed|^\s*$")
_DIAGNOSTIC = re.compile(r"(?P<file>[^\s(][^(]*)\((?P<line>\d+)\): (?:catastrophic error|error|warning|remark)")
OMITTED = "(diagnostics in a file outside the candidate's code and the public headers were omitted)"


def _own_text_only(log: str, dirs) -> str:
  """Keeps the diagnostics of PROGRAM_NAME and of headers under `dirs`; drops every other file's diagnostics and
  the source lines NVRTC quotes from headers, so the feedback never shows text that is not the candidate's own."""
  out, keep, own, omitted = [], True, True, False
  for line in log.splitlines():
    m = _DIAGNOSTIC.match(line)
    if m:
      path = m.group("file")
      own = path == PROGRAM_NAME
      keep = own or any(path.startswith(d.rstrip("/") + "/") for d in dirs)
      omitted |= not keep
      if keep:
        out.append(line)
    elif not line.startswith((" ", "\t")):
      keep, own = True, True  # A summary line ("N errors detected in the compilation of ...").
      out.append(line)
    elif keep and (own or PROGRAM_NAME in line):
      out.append(line)  # Context: the candidate's own quoted line, or "... at line N of kernel.cu".
  if omitted:
    out.append(OMITTED)
  return "\n".join(out)


def clean_log(log: str, max_chars: int = MAX_LOG_CHARS) -> str:
  """Keeps the candidate's own diagnostics (see `_own_text_only`), drops PCH chatter, strips directories from header
  paths, and truncates."""
  dirs = sorted(include_dirs(), key=len, reverse=True)
  out = []
  for line in _own_text_only(log, dirs).splitlines():
    if _PCH_LINE.search(line) and "error" not in line:
      continue
    for d in dirs:
      line = line.replace(d.rstrip("/") + "/", "")
    line = re.sub(r"(?:/[^\s:(\"']+)+/(?=[\w.]+\.(?:cuh?|hp?p?|h)\b)", "", line)  # Any other absolute path.
    out.append(line.rstrip())
  text = "\n".join(out).strip()
  if len(text) > max_chars:
    cut = text[:max_chars]
    text = cut[:cut.rfind("\n") if "\n" in cut else max_chars] + f"\n... ({len(text) - max_chars} more characters)"
  return text


# --- compile with cache ----------------------------------------------------------------------------------

_memory_cache: dict[str, CompileResult] = {}


def default_cache_dir() -> str:
  return os.path.join(os.path.expanduser(os.environ.get("XDG_CACHE_HOME", "~/.cache")), "kevin_jax", "evaluator")


def compile_cuda(source: str, arch: str = DEFAULT_ARCH, *, cache_dir: str | None = None, use_pch: bool = True,
                 nonce: str | None = None) -> CompileResult:
  """Compiles candidate device code to a cubin with the evaluator's fixed options.

  Args:
    source: the CUDA source (the ```cuda block).
    arch: cubin target, e.g. 'sm_90' (the device's exact arch when a GPU is known).
    cache_dir: directory for the on-disk cache ('' disables it; None = ~/.cache/kevin_jax/evaluator).
    use_pch: NVRTC automatic precompiled headers (NVRTC >= 12.8).
    nonce: appended as a comment so the source (and its cache entry) is unique; the evaluator does not need it
      because every evaluation loads its own module, but it is available for callers that share modules.
  Returns:
    CompileResult(ok, cubin, log, seconds, cached=...). `log` is cleaned (see `clean_log`); compile failures
    never raise.
  """
  t0 = time.perf_counter()
  if nonce:
    source = f"{source}\n// evaluation {nonce}\n"
  try:
    options = nvrtc_options(arch, use_pch)
    if "--pch" in options:
      options.append(f"--pch-dir={_pch_dir(cache_dir)}")  # NVRTC would write kernel.pch into the cwd.
    version = nvrtc_version()
  except Exception as e:  # pylint: disable=broad-except  # Missing NVRTC/headers: report, don't raise.
    return CompileResult(False, b"", f"evaluator setup error: {e}", time.perf_counter() - t0)
  key_opts = [o for o in options if not o.startswith(("-I", "--pch"))]
  key = hashlib.sha256(json.dumps([_CACHE_VERSION, source, key_opts, list(version), _shim_digest(),
                                   [_header_major(d) for d in include_dirs()]]).encode()).hexdigest()
  hit = _memory_cache.get(key) or _disk_get(cache_dir, key)
  if hit is not None:
    _remember(key, hit)
    return dataclasses.replace(hit, seconds=time.perf_counter() - t0, cached=True, options=tuple(options))
  try:
    ok, cubin, log = nvrtc().compile(source, options)
  except Exception as e:  # pylint: disable=broad-except
    ok, cubin, log = False, b"", f"NVRTC failed: {type(e).__name__}: {e}"
  res = CompileResult(ok=ok, cubin=cubin, log=clean_log(log), seconds=time.perf_counter() - t0,
                      options=tuple(options), nvrtc_version=version)
  _remember(key, res)
  _disk_put(cache_dir, key, res)
  return res


def _pch_dir(cache_dir: str | None) -> str:
  """Per-process directory for NVRTC's automatic precompiled headers (concurrent compilers never share one)."""
  base = cache_dir or default_cache_dir()
  if cache_dir == "":
    base = os.path.join(tempfile.gettempdir(), "kevin_jax_nvrtc")
  path = os.path.join(base, "pch", str(os.getpid()))
  os.makedirs(path, exist_ok=True)
  return path


def _remember(key: str, res: CompileResult) -> None:
  if len(_memory_cache) >= _MEMORY_CACHE_ENTRIES:
    _memory_cache.pop(next(iter(_memory_cache)))
  _memory_cache[key] = res


def _disk_path(cache_dir: str | None, key: str) -> str | None:
  if cache_dir == "":
    return None
  return os.path.join(cache_dir or default_cache_dir(), "nvrtc", key[:2], key)


def _disk_get(cache_dir, key) -> CompileResult | None:
  path = _disk_path(cache_dir, key)
  if not path:
    return None
  try:
    with open(path + ".json", encoding="utf-8") as f:
      meta = json.load(f)
    cubin = b""
    if meta["ok"]:
      with open(path + ".cubin", "rb") as f:
        cubin = f.read()
    return CompileResult(ok=meta["ok"], cubin=cubin, log=meta["log"], seconds=0.0,
                         nvrtc_version=tuple(meta["nvrtc_version"]))
  except (OSError, ValueError, KeyError):
    return None


def _disk_put(cache_dir, key, res: CompileResult) -> None:
  path = _disk_path(cache_dir, key)
  if not path:
    return
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    if res.ok:
      with open(tmp, "wb") as f:
        f.write(res.cubin)
      os.replace(tmp, path + ".cubin")
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump({"ok": res.ok, "log": res.log, "nvrtc_version": list(res.nvrtc_version)}, f)
    os.replace(tmp, path + ".json")
  except OSError:
    pass  # The cache is an optimisation; a read-only home must not fail evaluations.
