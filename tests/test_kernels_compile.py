"""NVRTC compilation without a GPU, cubin inspection, and the static pipeline (compile.py, static.py)."""

import os

import pytest

from kevin_jax.kernels import compile as C
from kevin_jax.kernels import cubin
from kevin_jax.kernels import static

DATA = os.path.join(os.path.dirname(__file__), "data", "eval")
ADD = ('extern "C" __global__ void add(const float* x, float* y, int64_t n) {'
       ' size_t i = threadIdx.x; if (i < n) y[i] = x[i]; }')


def test_compile_success_gives_a_cubin_with_the_kernel():
  r = C.compile_cuda(ADD, "sm_90", cache_dir="")
  ok, cubin_bytes, log, seconds = r
  assert ok and log == "" and seconds >= 0
  assert cubin_bytes[:4] == b"\x7fELF"
  info = cubin.read_cubin(cubin_bytes)
  assert info.kernels == ("add",) and info.undefined == () and info.global_bytes == 0
  assert info.kernel_info["add"].param_sizes == (8, 8, 8) and info.kernel_info["add"].param_bytes == 24
  assert "-arch=sm_90" in r.options and "--std=c++17" in r.options


def test_compile_other_arch_and_bad_arch():
  assert C.compile_cuda(ADD, "sm_80", cache_dir="").ok
  bad = C.compile_cuda(ADD, "gfx90a", cache_dir="")
  assert not bad.ok and "arch must look like sm_90" in bad.log


def test_compile_error_log_is_clean_and_points_at_the_line():
  src = "#include <cuda_fp16.h>\n\nextern \"C\" __global__ void k(float* y) {\n  y[0] = undefined_thing;\n}\n"
  r = C.compile_cuda(src, cache_dir="")
  assert not r.ok and r.cubin == b""
  assert r.log.startswith('kernel.cu(4): error: identifier "undefined_thing" is undefined')
  assert "1 error detected" in r.log
  assert "/" not in r.log.split("\n")[0] and "precompiled header" not in r.log
  for d in C.include_dirs():
    assert d not in r.log


def test_header_errors_show_relative_paths():
  r = C.compile_cuda('#include <mma.h>\nextern "C" __global__ void k() {}', cache_dir="")
  if r.ok:  # A full toolkit's crt/ headers are installed: nothing to check here.
    return
  assert r.log.startswith("mma.h(")
  assert "site-packages" not in r.log


def test_std_shim_headers_compile():
  src = r'''
#include <cstdint>
#include <cmath>
#include <math.h>
#include <cfloat>
#include <climits>
#include <algorithm>
#include <limits>
#include <type_traits>
#include <utility>
#include <cassert>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void k(float* y, std::int64_t n, uint8_t b) {
  y[0] = std::max(1.f, 2.f) + std::min(3, 4) + std::sqrt(2.f) + std::numeric_limits<float>::max() + INFINITY
         + M_PI + FLT_EPSILON + INT_MAX + __half2float(__float2half(1.f)) + __bfloat162float(__float2bfloat16(1.f));
  static_assert(std::is_same<int64_t, long long>::value, "int64_t is long long");
  assert(n > 0);
}
'''
  r = C.compile_cuda(src, cache_dir="")
  assert r.ok, r.log


def test_c_infinity_and_nan_need_no_header():
  """Kernels written for nvcc use math.h's INFINITY / NAN without an include (cuda_runtime.h brings it)."""
  src = ('extern "C" __global__ void k(float* y) {\n'
         '  float m = -INFINITY; y[0] = fmaxf(m, y[0]); y[1] = isnan(y[1]) ? NAN : y[1];\n}\n')
  r = C.compile_cuda(src, cache_dir="")
  assert r.ok, r.log
  assert cubin.read_cubin(r.cubin).undefined == ()
  both = C.compile_cuda("#include <cmath>\n#include <math.h>\n" + src, cache_dir="")  # Same guards: no redefinition.
  assert both.ok and "redefin" not in both.log, both.log


def test_cache_memory_and_disk(tmp_path):
  src = ADD + "\n// cache test\n"
  a = C.compile_cuda(src, cache_dir=str(tmp_path))
  b = C.compile_cuda(src, cache_dir=str(tmp_path))
  assert not a.cached and b.cached and a.cubin == b.cubin
  C._memory_cache.clear()  # pylint: disable=protected-access
  c = C.compile_cuda(src, cache_dir=str(tmp_path))
  assert c.cached and c.cubin == a.cubin
  d = C.compile_cuda(src, cache_dir=str(tmp_path), nonce="eval-1")
  assert not d.cached
  fail = "extern \"C\" __global__ void k() { nope; }\n// cache fail\n"
  e = C.compile_cuda(fail, cache_dir=str(tmp_path))
  C._memory_cache.clear()  # pylint: disable=protected-access
  f = C.compile_cuda(fail, cache_dir=str(tmp_path))
  assert not e.ok and not f.ok and f.cached and f.log == e.log


def _static(task, text):
  return static.static_check({"task_id": task, "task_path": os.path.join(DATA, "tasks", task + ".py"), "text": text,
                              "cache_dir": ""})


def _read(*parts):
  with open(os.path.join(DATA, *parts), encoding="utf-8") as f:
    return f.read()


def test_static_ok_for_a_good_candidate():
  out = _static("vec_add", _read("candidates", "vec_add.md"))
  assert out["status"] == "ok", out
  assert out["cubin"][:4] == b"\x7fELF" and out["details"]["kernels"] == ["add"]
  assert set(out["times"]) >= {"task_analysis", "validate", "compile"}


@pytest.mark.parametrize("body,status,message", [
    ('if (i < n) { printf("%f", x[i]); out[i] = x[i] + y[i]; }', "format_error", "printf is not available"),
    ("if (i < n) { float* p = (float*)malloc(4); out[i] = x[i] + y[i] + p[0]; free(p); }", "format_error",
     "free, malloc is not available"),
    ("if (i < n) out[i] = x[i] + y[i] + big[i % 3];", "format_error", "static __device__ memory is 1073741824"),
    ("if (i < n) out[i] = x[i] + y[i] + missing;", "compile_error", 'identifier "missing" is undefined'),
])
def test_static_rejections(body, status, message):
  text = ("```cuda\n__device__ float big[268435456];\n"
          "extern \"C\" __global__ void add(const float* x, const float* y, float* out, long long n) {\n"
          f"  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n  {body}\n}}\n```\n"
          "```plan\nlaunch add grid=(cdiv(x.numel, 256),) block=(256,) args=(x, y, out, x.numel)\n```\n")
  if "big[" not in body:
    text = text.replace("__device__ float big[268435456];\n", "")
  out = _static("vec_add", text)
  assert out["status"] == status
  assert message in out["error"]
  if status == "compile_error":
    assert out["details"]["compile_log"].startswith("kernel.cu(3): error")
  if "printf" in message:
    assert out["flags"] == ["banned_call"]


def test_static_kernel_hidden_by_preprocessor():
  text = ("```cuda\n#if 0\nextern \"C\" __global__ void add(const float* x, const float* y, float* out, long long n) {}"
          "\n#endif\n```\n```plan\nlaunch add grid=(1,) block=(1,) args=(x, y, out, 1)\n```\n")
  out = _static("vec_add", text)
  assert out["status"] == "format_error" and "kernel add is not in the compiled code" in out["error"]


def test_static_task_errors_are_evaluator_errors(tmp_path):
  bad = tmp_path / "broken.py"
  bad.write_text("import torch\nraise ValueError('boom')\n")
  out = static.static_check({"task_id": "broken", "task_path": str(bad), "text": "x"})
  assert out["status"] == "runtime_error" and out["flags"] == ["evaluator_error"]
  assert "ValueError: boom" in out["error"]
