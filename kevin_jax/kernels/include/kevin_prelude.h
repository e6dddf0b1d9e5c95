// Pre-included into every candidate (NVRTC --pre-include): fixed-width integer types and C's INFINITY / NAN
// without a header, as nvcc's implicit cuda_runtime.h (math.h) provides them; math.h / cmath keep the same guards.
#pragma once
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#ifndef INFINITY
#define INFINITY (__builtin_bit_cast(float, 0x7f800000u))  // +inf: a constant expression, device-safe
#endif
#ifndef NAN
#define NAN (__builtin_bit_cast(float, 0x7fc00000u))  // quiet NaN
#endif
