"""CUDA text shared by the families' candidate styles: constants, warp and block reductions."""

from __future__ import annotations

NEG_INF = "__int_as_float(0xff800000)"
POS_INF = "__int_as_float(0x7f800000)"
FULL = "0xffffffffu"

# Reduction kinds: accumulator C type, identity, combine expression over (a, b).
REDUCERS = {
    "sum": ("double", "0.0", "{a} + {b}"),
    "max": ("float", NEG_INF, "fmaxf({a}, {b})"),
    "min": ("float", POS_INF, "fminf({a}, {b})"),
}


def warp_reduce(kind: str, last_offset: int = 1) -> str:
  """`__device__ T warp_<kind>(T v)`: xor butterfly, every lane ends with the warp's result. last_offset > 1
  stops the butterfly early (a mutation: each lane misses some lanes' values)."""
  ctype, _, comb = REDUCERS[kind]
  return (f"__device__ __forceinline__ {ctype} warp_{kind}({ctype} v) {{\n"
          f"  for (int off = 16; off >= {last_offset}; off >>= 1) v = "
          + comb.format(a="v", b=f"__shfl_xor_sync({FULL}, v, off)") + ";\n  return v;\n}\n")


def block_reduce(kind: str, partial: bool = False) -> str:
  """`__device__ T block_<kind>(T v, T* red)`: warp reduction, one value per warp in shared memory, every
  thread combines them in the same order (all threads get the identical result). `partial` returns warp 0's
  value only (a mutation)."""
  ctype, _, comb = REDUCERS[kind]
  tail = ("  return red[0];\n" if partial else
          f"  {ctype} t = red[0];\n  for (int k = 1; k < (int)(blockDim.x >> 5); ++k) t = "
          + comb.format(a="t", b="red[k]") + ";\n  return t;\n")
  return (f"__device__ __forceinline__ {ctype} block_{kind}({ctype} v, {ctype}* red) {{\n"
          f"  v = warp_{kind}(v);\n"
          "  __syncthreads();  // red may still be read by a previous reduction.\n"
          "  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;\n"
          "  __syncthreads();\n" + tail + "}\n")


def combine(kind: str, a: str, b: str) -> str:
  return REDUCERS[kind][2].format(a=a, b=b)
