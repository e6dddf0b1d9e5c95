"""Adversarial CPU tests of the evaluator's static stage and supervision (kernels/README.md "Exploit classes").

Each test is an attack the evaluator must answer: host files in the feedback, parser and compiler stalls, text
that means different things to different entry points, kernel signatures hidden by macros, resource caps that
wrap, a compile pool without a memory budget, an evaluation without a wall deadline. Timed-run attacks are in
test_kernels_worker_emulated.py (CPU) and test_evaluator_gpu_hardening.py (GPU).
"""

import os
import re
import subprocess
import sys
import time

import pytest

from kevin_jax.kernels import compile as C
from kevin_jax.kernels import cubin, static
from kevin_jax.kernels.candidate import FormatError, parse_candidate
from kevin_jax.kernels.evaluator import Evaluator, EvaluatorConfig
from kevin_jax.kernels.plan import parse_plan
from kevin_jax.kernels.supervisor import Job, Pool, pump, worker_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "eval")
TASKS = os.path.join(DATA, "tasks")
SIG = "const float* x, const float* y, float* out, long long n"
BODY = "long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) out[i] = x[i] + y[i];"
PLAN = "launch add grid=(cdiv(x.numel, 256),) block=(256,) args=(x, y, out, x.numel)"
SECRET = "HOST_SECRET_7f3a"


def candidate(pre="", sig=SIG, body=BODY, plan=PLAN, kernel=True):
  k = f'extern "C" __global__ void add({sig}) {{ {body} }}\n' if kernel else ""
  return f"```cuda\n{pre}\n{k}```\n```plan\n{plan}\n```\n"


def check(text):
  return static.static_check({"task_id": "vec_add", "task_path": os.path.join(TASKS, "vec_add.py"), "text": text,
                              "cache_dir": ""})


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("host") / "secret.h"
  path.write_text(f"{SECRET} first line\nroot:x:0:0:{SECRET}:/root:/bin/bash\n")
  return str(path)


# --- 1. host files never reach the feedback -------------------------------------------------------------------


@pytest.mark.parametrize("pre", [
    '#include "{abs}"', "#include <{abs}>", '%:include "{abs}"', '#inc\\\nlude "{abs}"',
    '/* a */ # /* b\n */ include "{abs}"', "int a = 1'2'/*';\n#include \"{abs}\"",
    'const char* s = R"x( /* )x";\n#include "{abs}"', '#define H "{abs}"\n#include H', '#include_next "{abs}"',
    '#if __has_include("{abs}")\n#endif', '#include "README.md"', "#include <cuda/std/../../../../../../{rel}>",
    "#define __CUDACC_RTC__ 1",
])
def test_host_files_never_reach_the_feedback(pre, secret_file):
  out = check(candidate(pre.format(abs=secret_file, rel=secret_file.lstrip("/"))))
  assert out["status"] == "format_error", out
  text = out["error"] + out["details"].get("compile_log", "")
  assert SECRET not in text and "kevin_jax" not in text and "\n" not in out["error"]


def test_the_log_keeps_only_the_candidates_own_text():
  inc = C.include_dirs()[1]
  log = "\n".join([
      "/etc/host.conf(1): error: identifier \"multi\" is undefined", "  multi on", "  ^",
      f"{inc}/cuda_fp16.hpp(12): error: something in a header", "  secret header line quoted", "  ^",
      "            detected during instantiation at line 3 of kernel.cu",
      "kernel.cu(3): error: identifier \"nope\" is undefined", "  y[0] = nope;", "         ^",
      "3 errors detected in the compilation of \"kernel.cu\"."])
  cleaned = C.clean_log(log)
  assert "multi" not in cleaned and "host.conf" not in cleaned and "secret header line" not in cleaned
  assert "cuda_fp16.hpp(12): error: something in a header" in cleaned and "at line 3 of kernel.cu" in cleaned
  assert "kernel.cu(3): error" in cleaned and "  y[0] = nope;" in cleaned and C.OMITTED in cleaned


def test_the_format_headers_still_compile():
  pre = ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuda/std/cstdint>\n#include <cmath>\n"
         "#include <algorithm>\n#include \"cstdint\"\n#include <cooperative_groups.h>\n#include <cub/warp/warp_reduce.cuh>")
  assert check(candidate(pre))["status"] == "ok"


# --- 2. linear-time parsing, bounded recursion, compile deadline ------------------------------------------------


def _bulk(unit, n):
  return (unit * (n // len(unit) + 1))[:n]


CRAFTED = {  # name -> builder of a CUDA source (or plan) of n characters that once took super-linear time.
    "typedef whitespace": lambda n: "typedef a" + " " * (n - 11) + "b",
    "using whitespace": lambda n: "using a = b" + " " * (n - 13) + "c",
    "many __global__": lambda n: "#x\n" + _bulk("__global__ void k(int a);\n", n - 3),
    "extern C blocks": lambda n: _bulk('extern "C" {', n),
    "brackets in a parameter": lambda n: 'extern "C" __global__ void k(float x' + _bulk("[ ", n - 40) + ") {}",
    "nested kernels": lambda n: _bulk('extern "C" __global__ void k(', n),
    "unterminated comment": lambda n: "/*" + _bulk("/* #include x\n", n - 2),
}


@pytest.mark.parametrize("n", [4_000, 100_000])
@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_sources_parse_in_linear_time(name, n):
  text = candidate(CRAFTED[name](n - 200), kernel=False)
  t = time.perf_counter()
  try:
    parse_candidate(text)
  except FormatError as e:
    assert "\n" not in str(e)
  assert time.perf_counter() - t < 1.0, f"{name}: {time.perf_counter() - t:.2f} s for {n} characters"


@pytest.mark.parametrize("text", [
    "```" + "a" * 100_000 + "`\n", "````\n" + "```cuda\n" * 20_000, "x\n" * 150_000 + "```cuda\n",
])
def test_crafted_answers_scan_in_linear_time(text):
  t = time.perf_counter()
  with pytest.raises(FormatError):
    parse_candidate(text)
  assert time.perf_counter() - t < 1.0


@pytest.mark.parametrize("expr,message", [
    ("-" * 7_000 + "1", "signs in a row"), ("(" * 3_000 + "1" + ")" * 3_000, "too deeply nested"),
    ("+".join(["1"] * 3_000), "statement too complex"), ("cdiv(" * 2_000 + "1" + ", 2)" * 2_000, "too deeply nested"),
])
def test_crafted_plans_are_one_line_format_errors(expr, message):
  t = time.perf_counter()
  with pytest.raises(FormatError) as e:
    parse_plan(f"launch k grid=({expr},) block=(1,) args=()")
  assert message in str(e.value) and "\n" not in str(e.value) and time.perf_counter() - t < 1.0


BOMB = ("#define A0(x) x x\n" + "".join(f"#define A{i}(x) A{i - 1}(A{i - 1}(x))\n" for i in range(1, 17))
        + 'extern "C" __device__ float bomb() { return 0 A16(+1); }')


def test_a_macro_bomb_is_killed_at_the_compile_deadline(tmp_path):
  """API and CLI: the compile worker is killed (SIGKILL to its process group) at compile_timeout_s."""
  t = time.monotonic()
  cfg = EvaluatorConfig(compile_workers=1, compile_timeout_s=3.0, cache_dir=str(tmp_path))
  with Evaluator(cfg, task_source=TASKS, gpu=False) as ev:
    r = ev.check_static("vec_add", candidate(BOMB))
  assert r.status == "compile_error" and "did not finish within 3 s" in r.error and "compile_timeout" in r.flags
  assert time.monotonic() - t < 60
  path = tmp_path / "bomb.md"
  path.write_text(candidate(BOMB))
  t = time.monotonic()
  p = subprocess.run([sys.executable, "-m", "kevin_jax.kernels.evaluate", "--task", os.path.join(TASKS, "vec_add.py"),
                      "--candidate", str(path), "--compile-only", "--compile-timeout-s", "3", "--cache-dir",
                      str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
  assert p.returncode == 1 and "compile_error" in p.stdout and "did not finish within 3 s" in p.stdout, p.stdout
  assert time.monotonic() - t < 60


# --- 3. one text normalisation ---------------------------------------------------------------------------------


def test_crlf_is_the_same_answer_and_control_characters_are_refused(tmp_path):
  lf = candidate()
  crlf = lf.replace("\n", "\r\n")
  a, b = parse_candidate(lf), parse_candidate(crlf)
  assert (a.cuda_source, a.plan_text, a.kernels) == (b.cuda_source, b.plan_text, b.kernels)
  assert check(crlf)["status"] == "ok"
  for char, name in (("\x00", "U+0000 (NUL)"), ("\x1b", "U+001B (ESC)"), ("\x0c", "U+000C (form feed)")):
    bad = lf.replace("out[i] = x[i]", f"out[i] = x[i]{char}")
    with pytest.raises(FormatError, match=re.escape(f"contains {name} at line 3")):
      parse_candidate(bad)
    assert check(bad)["status"] == "format_error"
  # The CLI reads bytes: the same two answers, the same two verdicts.
  results = []
  for name, text in (("crlf.md", crlf), ("nul.md", lf.replace("x[i] + y[i]", "x[i] +\x00 y[i]"))):
    path = tmp_path / name
    path.write_bytes(text.encode())
    p = subprocess.run([sys.executable, "-m", "kevin_jax.kernels.evaluate", "--task",
                        os.path.join(TASKS, "vec_add.py"), "--candidate", str(path), "--compile-only", "--cache-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    results.append(p.stdout)
  assert "status:   compiled" in results[0], results[0]
  assert "status:   format_error" in results[1] and "U+0000 (NUL)" in results[1], results[1]


# --- 4. launch arguments checked against the compiled kernel ---------------------------------------------------


def test_a_macro_in_a_kernel_signature_is_refused():
  out = check(candidate("#define float double"))
  assert out["status"] == "format_error" and "uses the macro 'float'" in out["error"]


def test_a_signature_hidden_from_the_parser_fails_the_cubin_check():
  """The parser sees the `#if 0` text; the compiled kernel (from a macro) takes an int: caught from the cubin."""
  pre = ("#define KERNEL(T) extern \"C\" __global__ void add(const float* x, const float* y, float* out, T n) "
         "{ long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) out[i] = x[i] + y[i]; }\n"
         f"#if 0\nextern \"C\" __global__ void add({SIG}) {{}}\n#endif\nKERNEL(int)")
  out = check(candidate(pre, kernel=False))
  assert out["status"] == "format_error" and out["flags"] == ["signature_mismatch"], out
  assert "sizes [8, 8, 8, 4]" in out["error"] and "sizes [8, 8, 8, 8]" in out["error"]


def test_the_cubin_reader():
  src = ('__device__ char big[(1ULL << 32) + 64];\n'
         'extern "C" __global__ void k(const float* x, float* y, int n, long long m, double d, bool b, char c, '
         'short s, float f) { if (n) y[0] = x[0] + m + d + b + c + s + f + big[n]; }\n'
         'extern "C" __global__ void e() {}\n'
         'extern "C" __global__ void g(float* y) { float a[4096]; for (int i = 0; i < 4096; i++) '
         'a[i] = y[i * 7 % 4096]; y[threadIdx.x] = a[(int)y[0]]; }\n')
  r = C.compile_cuda(src, cache_dir="")
  info = cubin.read_cubin(r.cubin)
  assert info.global_bytes == 2**32 + 64  # The section header says 64 (a 32-bit wrap).
  assert info.kernel_info["k"].param_sizes == (8, 8, 4, 8, 8, 1, 1, 2, 4)
  assert info.kernel_info["k"].param_bytes == 48 == cubin.abi_param_bytes((8, 8, 4, 8, 8, 1, 1, 2, 4))
  assert info.kernel_info["e"].param_sizes == () and info.kernel_info["e"].param_bytes == 0
  assert info.kernel_info["g"].local_bytes == 4096 * 4 and info.kernel_info["k"].local_bytes == 0


# --- 5. caps in 64 bits, local memory, a compile-memory budget ---------------------------------------------------


def test_static_memory_cap_sees_a_4_gib_array():
  out = check(candidate("__device__ char big[(1ULL << 32) + 64];", body=BODY + " if (n < 0) out[0] = big[n];"))
  assert out["status"] == "format_error" and "4294967360 bytes" in out["error"]


def test_local_memory_times_resident_threads_is_capped():
  body = ("float a[8192]; long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; "
          "for (int k = 0; k < 8192; k++) a[k] = x[(i + k) % n]; if (i < n) out[i] = a[(int)y[i] & 8191];")
  out = check(candidate(body=body))
  assert out["status"] == "format_error" and out["flags"] == ["local_memory"], out
  assert "32768 bytes of local memory per thread" in out["error"]


def test_the_pool_memory_budget_kills_the_worker_that_grew(tmp_path):
  pool = Pool("fake", [worker_env(None, 1), worker_env(None, 1)], {}, str(tmp_path),
              memory_budget_bytes=300 * 2**20)
  pool.start()
  try:
    for k in range(2):
      pool.submit(Job(key=k, payload={"text": "FAKE:alloc=200" if k == 0 else "FAKE:alloc=400"}, timeouts={"": 60}))
    events, t = [], time.monotonic()
    while not any(e.job.key == 1 for e in events) and time.monotonic() - t < 60:
      events += pump([pool], 0.25)
  finally:
    pool.close()
  assert [(e.job.key, e.kind) for e in events] == [(1, "memory")], [(e.kind, e.info) for e in events]
  assert "budget 0.3 GiB" in events[0].info


# --- 8. a wall deadline per evaluation --------------------------------------------------------------------------


def test_an_evaluation_that_never_stalls_still_ends_at_its_budget(tmp_path):
  """Every phase makes progress (so no per-phase deadline fires), but the whole run is longer than eval_timeout_s."""
  cfg = EvaluatorConfig(compile_workers=1, run_timeout_s=30.0, eval_timeout_s=3.0, spare_workers=False,
                        cache_dir=str(tmp_path))
  with Evaluator(cfg, task_source=TASKS, _gpu_role="fake") as ev:
    t = time.monotonic()
    slow = candidate("// FAKE:phases=60")
    (r,) = ev.evaluate([("vec_add", slow)])
    took = time.monotonic() - t
    (ok,) = ev.evaluate([("vec_add", candidate("// FAKE:ok"))])
  assert r.status == "timeout" and r.flags == ["eval_deadline"] and "budget" in r.error, (r.status, r.error)
  assert took < 25 and ok.status == "correct"
