// CPU emulation of the CUDA device dialect (kevin_jax/kernels/emulate/emulator.py).
// One ucontext fiber per CUDA thread; a block's threads run until they reach a barrier (__syncthreads: all live
// threads of the block; warp shuffles / __syncwarp: the live lanes of the warp), blocks run one after another.
// Not modelled: concurrency (races never show, atomics are trivially atomic), fast-math intrinsics (plain libm),
// FMA contraction, memory spaces and their limits. Dynamic shared memory is followed by a canary band.
#include <ucontext.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <functional>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) double2 { double x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
struct alignas(8) uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
inline float2 make_float2(float a, float b) { return float2{a, b}; }

struct EmuThread {
  uint3 tid; ucontext_t ctx; int done = 0; int wait = 0;  // wait: 0 runnable, 1 block barrier, 2 warp barrier
  int lane, warp;
};
static EmuThread* g_cur;
static std::vector<EmuThread> g_thr;
static ucontext_t g_sched;
static uint3 g_blockIdx; static dim3 g_blockDim, g_gridDim;
static std::function<void()>* g_body;
static unsigned char* g_dyn_smem;
static uint64_t g_xchg[1024];
extern "C" int g_smem_overrun = 0;
#define threadIdx (g_cur->tid)
#define blockIdx g_blockIdx
#define blockDim g_blockDim
#define gridDim g_gridDim
static const int warpSize = 32;

static void emu_yield(int kind) { g_cur->wait = kind; swapcontext(&g_cur->ctx, &g_sched); }
inline void __syncthreads() { emu_yield(1); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_yield(2); }
inline void __threadfence() {}
inline void __threadfence_block() {}

template <typename T> inline T emu_exchange(T v, int src, bool valid) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  int me = g_cur->warp * 32 + g_cur->lane;
  uint64_t b = 0; std::memcpy(&b, &v, sizeof(T)); g_xchg[me] = b;
  emu_yield(2);
  T r = v;
  if (valid) { uint64_t o = g_xchg[g_cur->warp * 32 + src]; std::memcpy(&r, &o, sizeof(T)); }
  emu_yield(2);
  return r;
}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int m, int w = 32) {
  int l = g_cur->lane; int s = l ^ m; return emu_exchange(v, s, (s / w) == (l / w) || true);
}
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned d, int w = 32) {
  int l = g_cur->lane; int s = l + (int)d; return emu_exchange(v, s, (s % 32) / w == (l % 32) / w && s < 32 && (s / w) == (l / w));
}
template <typename T> inline T __shfl_up_sync(unsigned, T v, unsigned d, int w = 32) {
  int l = g_cur->lane; int s = l - (int)d; return emu_exchange(v, s, s >= 0 && (s / w) == (l / w));
}
template <typename T> inline T __shfl_sync(unsigned, T v, int src, int w = 32) {
  int l = g_cur->lane; int s = (l / w) * w + (src % w); return emu_exchange(v, s, true);
}
inline unsigned __ballot_sync(unsigned, int p) {
  unsigned bits = 0;
  for (int i = 0; i < 32; ++i) { int v = emu_exchange(p ? 1 : 0, i, true); if (v) bits |= 1u << i; }
  return bits;
}
inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0; }
inline int __all_sync(unsigned m, int p) { return __ballot_sync(m, p) == 0xffffffffu; }

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __saturatef(float a) { return a < 0 ? 0 : (a > 1 ? 1 : a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
// Single IEEE operations, rounded to nearest (the build contracts no FMA).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
template <typename T> inline T __ldg(const T* p) { return *p; }
// By value: decltype(a < b ? a : b) would be a reference to a parameter.
template <typename A, typename B> inline std::common_type_t<A, B> min(A a, B b) { return a < b ? a : b; }
template <typename A, typename B> inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }
template <typename T> inline T atomicAdd(T* p, T v) { T o = *p; *p = o + v; return o; }
template <typename T> inline T atomicMax(T* p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <typename T> inline T atomicMin(T* p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <typename T> inline T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
inline int atomicCAS(int* p, int c, int v) { int o = *p; if (o == c) *p = v; return o; }
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long c, unsigned long long v) {
  unsigned long long o = *p; if (o == c) *p = v; return o; }

static void emu_fiber_entry() {
  (*g_body)();
  g_cur->done = 1;
  swapcontext(&g_cur->ctx, &g_sched);
}

static const size_t kStack = 128 * 1024;
static char* g_stacks = nullptr; static size_t g_stack_n = 0;

static void emu_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> body) {
  size_t nt = (size_t)block.x * block.y * block.z;
  if (g_stack_n < nt) { std::free(g_stacks); g_stacks = (char*)std::malloc(nt * kStack); g_stack_n = nt; }
  std::vector<unsigned char> dyn(smem + 245760, 0xA5);
  g_dyn_smem = dyn.data();
  g_body = &body; g_gridDim = grid; g_blockDim = block;
  g_thr.assign(nt, EmuThread());
  for (unsigned bz = 0; bz < grid.z; ++bz) for (unsigned by = 0; by < grid.y; ++by) for (unsigned bx = 0; bx < grid.x; ++bx) {
    g_blockIdx = uint3{bx, by, bz};
    for (size_t t = 0; t < nt; ++t) {
      EmuThread& th = g_thr[t];
      th.done = 0; th.wait = 0;
      th.tid = uint3{(unsigned)(t % block.x), (unsigned)((t / block.x) % block.y), (unsigned)(t / ((size_t)block.x * block.y))};
      th.lane = (int)(t % 32); th.warp = (int)(t / 32);
      getcontext(&th.ctx);
      th.ctx.uc_stack.ss_sp = g_stacks + t * kStack;
      th.ctx.uc_stack.ss_size = kStack;
      th.ctx.uc_link = nullptr;
      makecontext(&th.ctx, emu_fiber_entry, 0);
    }
    for (;;) {
      bool ran = false;
      for (size_t t = 0; t < nt; ++t) {
        EmuThread& th = g_thr[t];
        if (!th.done && th.wait == 0) { g_cur = &th; swapcontext(&g_sched, &th.ctx); ran = true; }
      }
      size_t alive = 0, at_block = 0;
      for (auto& th : g_thr) if (!th.done) { ++alive; if (th.wait == 1) ++at_block; }
      if (alive == 0) break;
      bool released = false;
      for (size_t w = 0; w * 32 < nt; ++w) {
        size_t lo = w * 32, hi = std::min(nt, lo + 32), live = 0, waiting = 0;
        for (size_t t = lo; t < hi; ++t) if (!g_thr[t].done) { ++live; if (g_thr[t].wait == 2) ++waiting; }
        if (live && waiting == live) { for (size_t t = lo; t < hi; ++t) g_thr[t].wait = 0; released = true; }
      }
      if (!released && at_block == alive) { for (auto& th : g_thr) th.wait = 0; released = true; }
      if (!released && !ran) { std::fprintf(stderr, "EMU DEADLOCK in block (%u,%u,%u)\n", bx, by, bz); std::abort(); }
    }
    for (size_t q = smem; q < smem + 245760; ++q) if (dyn[q] != 0xA5) { g_smem_overrun = 1; break; }
  }
}

struct EmuArg { int kind; long long i; double d; unsigned long long p; };  // kind 0 int, 1 float, 2 pointer
template <typename T> T emu_arg(const EmuArg& a) {
  if constexpr (std::is_pointer_v<T>) return (T)(uintptr_t)a.p;
  else if constexpr (std::is_integral_v<T>) return (T)(a.kind == 1 ? (long long)a.d : a.i);
  else return (T)(a.kind == 1 ? a.d : (double)a.i);
}
template <typename... P, size_t... I>
void emu_call_impl(void (*k)(P...), const EmuArg* a, std::index_sequence<I...>) { k(emu_arg<P>(a[I])...); }
template <typename... P> int emu_call(void (*k)(P...), const EmuArg* a, int n) {
  if (n != (int)sizeof...(P)) return -1;
  emu_call_impl(k, a, std::index_sequence_for<P...>{});
  return 0;
}
