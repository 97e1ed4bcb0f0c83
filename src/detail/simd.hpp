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

E8KV_FORCE_INLINE f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
E8KV_FORCE_INLINE u32x8 load8u(const uint32_t* p) {
  u32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
E8KV_FORCE_INLINE void store8(float* p, f32x8 v) { std::memcpy(p, &v, sizeof v); }
E8KV_FORCE_INLINE f32x8 splat8(float x) { return f32x8{x, x, x, x, x, x, x, x}; }
E8KV_FORCE_INLINE f32x8 as_f32(u32x8 v) {
  f32x8 r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}
E8KV_FORCE_INLINE u32x8 as_u32(f32x8 v) {
  u32x8 r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}
E8KV_FORCE_INLINE f32x8 max8(f32x8 a, f32x8 b) { return a > b ? a : b; }
E8KV_FORCE_INLINE float hmax8(f32x8 v) {
  float m = v[0];
  for (int i = 1; i < 8; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

/// The fixed summation tree of one vector: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)).
E8KV_FORCE_INLINE float tree_sum8(f32x8 v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }

/// r[i] = tree_sum8(a[i]) for eight vectors at once (the same additions, in transposed order).
E8KV_FORCE_INLINE f32x8 tree_sum8x8(const f32x8 a[8]) {
  // Stage 1: pairs (a_i, a_{i+1}) -> lanes 0-3 of a_i, lanes 0-3 of a_{i+1} summed with their upper halves.
  f32x8 u[4];
  for (int k = 0; k < 4; ++k) {
    const f32x8 x = a[2 * k], y = a[2 * k + 1];
    u[k] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15);
  }
  // u[k] = [x0+x4, x1+x5, x2+x6, x3+x7, y0+y4, y1+y5, y2+y6, y3+y7] with x = a_2k, y = a_2k+1.
  // Stage 2: (x0+x4)+(x2+x6) and (x1+x5)+(x3+x7), for two u's at once.
  f32x8 w[2];
  for (int k = 0; k < 2; ++k) {
    const f32x8 p = u[2 * k], q = u[2 * k + 1];
    w[k] = __builtin_shufflevector(p, q, 0, 1, 8, 9, 4, 5, 12, 13) + __builtin_shufflevector(p, q, 2, 3, 10, 11, 6, 7, 14, 15);
  }
  // w[k] = [A02, A13, C02, C13, B02, B13, D02, D13] for A = a_4k, B = a_4k+1, C = a_4k+2, D = a_4k+3,
  // where A02 = (A0+A4)+(A2+A6) and A13 = (A1+A5)+(A3+A7).
  // Stage 3: A02 + A13 for every vector, reordered to a_0 .. a_7.
  const f32x8 lo = __builtin_shufflevector(w[0], w[1], 0, 4, 2, 6, 8, 12, 10, 14);
  const f32x8 hi = __builtin_shufflevector(w[0], w[1], 1, 5, 3, 7, 9, 13, 11, 15);
  return lo + hi;
}

/// The portable build: fused multiply-adds through the correctly rounded fma().
struct IsaPortable {
  static E8KV_FORCE_INLINE f32x8 fma(f32x8 a, f32x8 b, f32x8 c) {
    f32x8 r;
    for (int i = 0; i < 8; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
    return r;
  }
  static E8KV_FORCE_INLINE float fma1(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
  static E8KV_FORCE_INLINE f32x8 splat(float x) { return splat8(x); }
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
