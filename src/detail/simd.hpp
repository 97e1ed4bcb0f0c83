// Eight-float lane arithmetic for the host hot loops, written once and compiled twice: for the
// portable x86-64 baseline and for AVX2 + FMA + F16C, chosen at run time. Internal (not installed).
//
// The two builds give bit-identical results because every operation is defined lane by lane with
// one rounding: + − × are IEEE in both, fused multiply-add is exactly fma() in both (the AVX2
// instruction or the correctly rounded library call), fp16 → float is exact in both, and every
// reduction runs in one fixed tree. Only the speed differs (the portable fma is a library call:
// that build exists for old CPUs and for tests that pin the two together).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "e8kv/numeric/half.hpp"
#include "e8kv/platform.hpp"

#if E8KV_HOST_AVX2_DISPATCH
#include <immintrin.h>
#endif

namespace e8kv::simd {

#if defined(__GNUC__) || defined(__clang__)
// The vector types never cross a non-inlined call, so the ABI note GCC emits for them is moot.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float f32x8 __attribute__((vector_size(32)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
#else
#error "src/detail/simd.hpp needs GCC or Clang vector extensions"
#endif

// The lane helpers (load8, splat8, tree_sum8, ...) are in src/detail/simd_lanes.inc, included
// inside each kernel struct so that they carry that struct's target: Clang refuses a call that
// passes a 256-bit vector between functions built for different targets, even when inlined.

/// The portable build: fused multiply-adds through the correctly rounded fma().
struct IsaPortable {
  static E8KV_FORCE_INLINE f32x8 fma(f32x8 a, f32x8 b, f32x8 c) {
    f32x8 r;
    for (int i = 0; i < 8; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
    return r;
  }
  static E8KV_FORCE_INLINE float fma1(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
  static E8KV_FORCE_INLINE f32x8 splat(float x) { return f32x8{x, x, x, x, x, x, x, x}; }
  /// Eight fp16 values (bits) to floats, exactly.
  static E8KV_FORCE_INLINE f32x8 half8(const uint16_t* p) {
    f32x8 r;
    for (int i = 0; i < 8; ++i) r[i] = fp16_bits_to_float(p[i]);
    return r;
  }
};

#if E8KV_HOST_AVX2_DISPATCH
/// The AVX2 + FMA + F16C build. Its methods carry the target, so only functions compiled for that
/// target may call them (the kernels of src/attention/attend_kernels.inc do).
struct IsaAvx2Fma {
  __attribute__((target("avx2,fma,f16c"), always_inline)) static inline f32x8 fma(f32x8 a, f32x8 b, f32x8 c) {
    return (f32x8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
  }
  __attribute__((target("avx2,fma,f16c"), always_inline)) static inline float fma1(float a, float b, float c) {
    return __builtin_fmaf(a, b, c);
  }
  __attribute__((target("avx2,fma,f16c"), always_inline)) static inline f32x8 splat(float x) {
    return (f32x8)_mm256_set1_ps(x);
  }
  __attribute__((target("avx2,fma,f16c"), always_inline)) static inline f32x8 half8(const uint16_t* p) {
    return (f32x8)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
#endif

// No pop: -Wpsabi stays off for the internal files that include this header (their vector
// helpers are always inlined into the twins, so no call ever passes a vector by value).

}  // namespace e8kv::simd
