"""Candidate text -> blocks and kernel signatures (kevin_jax/kernels/candidate.py)."""

import pytest

from kevin_jax.kernels.candidate import MAX_PLAN_CHARS, MAX_SOURCE_CHARS, FormatError, parse_candidate, parse_kernels

CUDA = 'extern "C" __global__ void k(const float* x, float* y, int n) { }'
PLAN = "launch k grid=(1,) block=(1,) args=(x, out, 1)"


def wrap(cuda=CUDA, plan=PLAN, before="Some reasoning.\n", between="\nand the plan:\n"):
  return f"{before}```cuda\n{cuda}\n```{between}```plan\n{plan}\n```\n"


def test_blocks_extracted_with_prose_around():
  c = parse_candidate(wrap())
  assert c.cuda_source == CUDA
  assert c.plan_text == PLAN
  assert list(c.kernels) == ["k"]


def test_echoed_example_inside_a_longer_fence_is_ignored():
  text = "````\n```cuda\nexample\n```\n```plan\nexample\n```\n````\n" + wrap()
  c = parse_candidate(text)
  assert c.cuda_source == CUDA and c.plan_text == PLAN


@pytest.mark.parametrize("text,message", [
    ("no code at all", "missing ```cuda block"),
    (f"```cuda\n{CUDA}\n```\n", "missing ```plan block"),
    (wrap() + f"```cuda\n{CUDA}\n```\n", "2 ```cuda blocks found"),
    (f"```cuda\n{CUDA}\n```\n```plan\n{PLAN}\n", "unterminated ```plan block (opened on line 4"),
    (f"```cuda\n{CUDA}\n", "unterminated ```cuda block"),
    (wrap(cuda="  \n"), "the ```cuda block is empty"),
    (wrap(cuda="x" * (MAX_SOURCE_CHARS + 1)), f"CUDA source too long: {MAX_SOURCE_CHARS + 1} characters"),
    (wrap(plan="#" * (MAX_PLAN_CHARS + 1)), f"plan too long: {MAX_PLAN_CHARS + 1} characters"),
])
def test_block_errors(text, message):
  with pytest.raises(FormatError) as e:
    parse_candidate(text)
  assert message in str(e.value)


def test_signatures_types_and_qualifiers():
  src = r'''
#include <cuda_fp16.h>
typedef float real;
using idx_t = long long;
// extern "C" __global__ void in_comment(int x) {}
__device__ float helper(float v) { return v; }
extern "C" __global__ void __launch_bounds__(256, 2) a(const real* __restrict__ x, float4 *v, idx_t n,
                                                      unsigned int m, size_t s, bool flag, double d, float y[]) {
  const char* str = "extern \"C\" __global__ void in_string(int)";
}
extern "C" {
__global__ void b(__half* h, const __nv_bfloat16* g, int64_t n, const void* any) {}
}
extern "C" __global__ void decl_only(int x);
__global__ void not_extern_c(int x) {}
extern "C" __global__ void c(float*, int) {}
'''
  ks = parse_kernels(src)
  assert sorted(ks) == ["a", "b", "c"]
  a = ks["a"].params
  assert [(p.name, p.pointee, p.const, p.scalar) for p in a] == [
      ("x", "float", True, None), ("v", "float4", False, None), ("n", None, False, "int64"),
      ("m", None, False, "uint32"), ("s", None, False, "uint64"), ("flag", None, False, "bool"),
      ("d", None, False, "float64"), ("y", "float", False, None)]
  assert ks["a"].line == 7
  b = ks["b"].params
  assert [(p.pointee, p.const, p.scalar) for p in b] == [("__half", False, None), ("__nv_bfloat16", True, None),
                                                         (None, False, "int64"), ("void", True, None)]
  assert [(p.name, p.ctype) for p in ks["c"].params] == [("arg0", "float*"), ("arg1", "int")]


@pytest.mark.parametrize("param,message", [
    ("float& x", "reference parameters are not supported"),
    ("float** x", "pointers to pointers are not supported"),
    ("Foo* x", "unsupported pointer type 'Foo*'"),
    ("Foo x", "unsupported parameter type 'Foo'"),
    ("int n = 3", "default arguments are not supported"),
])
def test_signature_errors(param, message):
  with pytest.raises(FormatError) as e:
    parse_kernels(f'extern "C" __global__ void k({param}) {{}}')
  assert message in str(e.value)
  assert "kernel k, parameter 1" in str(e.value)


def test_same_kernel_defined_twice_with_different_params():
  src = 'extern "C" __global__ void k(int a) {}\nextern "C" __global__ void k(float a) {}'
  with pytest.raises(FormatError, match="defined twice"):
    parse_kernels(src)
