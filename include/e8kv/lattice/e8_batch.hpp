// Batched nearest point of E8 for many blocks of 8 contiguous floats, bit-identical to
// nearest_e8 / nearest_e8_twice (e8.hpp) for every input, NaN, ±Inf, huge values and exact
// ties included.
//
// Layout: a tile of L blocks (L = SIMD lanes: 4 with SSE2/NEON, 8 with AVX2) is transposed so
// that vector i holds coordinate i of every block of the tile, one block per lane. Every step
// of the scalar algorithm then runs lane-wise with masks instead of branches:
//   clamp to ±kMaxAbs (NaN -> 0); round half to even; argmax of |x - round(x)| with the first
//   index winning (strict >); parity repair ±1 (+1 on a zero error); both cosets; squared
//   distances summed in index order with separate multiply and add; integer coset wins a tie.
// Blocks past the last full tile are zero-padded into one more tile.
//
// The SIMD code uses GCC/Clang vector extensions (GCC >= 12 or Clang: __builtin_shufflevector).
// Plain loops were tried first: g++ 12 leaves the argmax/select chains scalar (it if-converts
// only one select per condition), at the speed of the scalar function. On x86-64 the kernel is
// also compiled for AVX2 (8 lanes, no FMA) and chosen once at run time; every variant computes
// the same bits. Other compilers get a loop over nearest_e8_twice.
//
// Like e8.hpp, this relies on IEEE float semantics: do not build with -ffast-math, and keep FMA
// contraction off (the e8kv target adds -ffp-contract=off for GCC/Clang).
// Host only: device code calls nearest_e8_twice per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "e8kv/platform.hpp"
#include "e8kv/lattice/e8.hpp"
#include "e8kv/numeric/cpu_features.hpp"

#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector) && __has_builtin(__builtin_convertvector) && \
    (defined(__GNUC__) || defined(__clang__)) && !E8KV_DEVICE_CODE
#define E8KV_E8_BATCH_SIMD 1
#endif
#endif
#ifndef E8KV_E8_BATCH_SIMD
#define E8KV_E8_BATCH_SIMD 0
#endif
#if E8KV_E8_BATCH_SIMD && defined(__x86_64__)
#define E8KV_E8_BATCH_AVX2 1
#else
#define E8KV_E8_BATCH_AVX2 0
#endif

namespace e8kv::lattice {

namespace detail {

/// Reference path: the scalar function block by block.
inline void nearest_e8_twice_blocks_scalar(const float* x, int32_t* twice_y, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b) {
    int64_t t[8];
    nearest_e8_twice(x + 8 * b, t);
    for (int i = 0; i < 8; ++i) twice_y[8 * b + i] = static_cast<int32_t>(t[i]);
  }
}

inline void nearest_e8_blocks_scalar(const float* x, float* y, size_t n_blocks) {
  for (size_t b = 0; b < n_blocks; ++b) {
    float in[8];
    std::memcpy(in, x + 8 * b, sizeof in);  // y may equal x
    nearest_e8(in, y + 8 * b);
  }
}

#if E8KV_E8_BATCH_SIMD

typedef float e8_f32x4 __attribute__((vector_size(16)));
typedef int32_t e8_i32x4 __attribute__((vector_size(16)));
typedef float e8_f32x8 __attribute__((vector_size(32)));
typedef int32_t e8_i32x8 __attribute__((vector_size(32)));

template <class VF>
struct E8Simd;
template <>
struct E8Simd<e8_f32x4> {
  using VI = e8_i32x4;
  static constexpr int kLanes = 4;
};
template <>
struct E8Simd<e8_f32x8> {
  using VI = e8_i32x8;
  static constexpr int kLanes = 8;
};

/// Lane-wise m ? a : b for a mask m of all-ones / all-zeros lanes. GCC maps the vector
/// conditional to blend instructions; Clang gets the bitwise form. (A macro-free function
/// returning a 32-byte vector would trip -Wpsabi in the baseline-ISA parts of the TU.)
#if defined(__clang__)
#define E8KV_E8_SELECT(V, VI, m, a, b) ((V)(((m) & (VI)(a)) | (~(m) & (VI)(b))))
#else
#define E8KV_E8_SELECT(V, VI, m, a, b) ((m) ? (a) : (b))
#endif

/// 4x4 transpose: out[i][k] = in[k][i].
E8KV_FORCE_INLINE void e8_transpose4(const e8_f32x4& a, const e8_f32x4& b, const e8_f32x4& c, const e8_f32x4& d,
                                     e8_f32x4& o0, e8_f32x4& o1, e8_f32x4& o2, e8_f32x4& o3) {
  const e8_f32x4 t0 = __builtin_shufflevector(a, b, 0, 4, 1, 5);
  const e8_f32x4 t1 = __builtin_shufflevector(a, b, 2, 6, 3, 7);
  const e8_f32x4 t2 = __builtin_shufflevector(c, d, 0, 4, 1, 5);
  const e8_f32x4 t3 = __builtin_shufflevector(c, d, 2, 6, 3, 7);
  o0 = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
  o1 = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
  o2 = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
  o3 = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
}

/// 8x8 transpose in three shuffle stages: out[i][k] = in[k][i].
E8KV_FORCE_INLINE void e8_transpose8(const e8_f32x8 (&in)[8], e8_f32x8 (&out)[8]) {
  e8_f32x8 t[8], u[8];
  for (int j = 0; j < 4; ++j) {
    t[2 * j] = __builtin_shufflevector(in[2 * j], in[2 * j + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[2 * j + 1] = __builtin_shufflevector(in[2 * j], in[2 * j + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int j = 0; j < 2; ++j) {
    u[4 * j + 0] = __builtin_shufflevector(t[4 * j], t[4 * j + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[4 * j + 1] = __builtin_shufflevector(t[4 * j], t[4 * j + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[4 * j + 2] = __builtin_shufflevector(t[4 * j + 1], t[4 * j + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[4 * j + 3] = __builtin_shufflevector(t[4 * j + 1], t[4 * j + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int j = 0; j < 4; ++j) {
    out[j] = __builtin_shufflevector(u[j], u[j + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    out[j + 4] = __builtin_shufflevector(u[j], u[j + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

/// rows[i] lane k = x[8k + i] for the L blocks at x.
E8KV_FORCE_INLINE void e8_load_tile(const float* x, e8_f32x4 (&rows)[8]) {
  e8_f32x4 lo[4], hi[4];
  for (int k = 0; k < 4; ++k) {
    std::memcpy(&lo[k], x + 8 * k, sizeof lo[k]);
    std::memcpy(&hi[k], x + 8 * k + 4, sizeof hi[k]);
  }
  e8_transpose4(lo[0], lo[1], lo[2], lo[3], rows[0], rows[1], rows[2], rows[3]);
  e8_transpose4(hi[0], hi[1], hi[2], hi[3], rows[4], rows[5], rows[6], rows[7]);
}
E8KV_FORCE_INLINE void e8_load_tile(const float* x, e8_f32x8 (&rows)[8]) {
  e8_f32x8 blocks[8];
  for (int k = 0; k < 8; ++k) std::memcpy(&blocks[k], x + 8 * k, sizeof blocks[k]);
  e8_transpose8(blocks, rows);
}

/// out[8k + i] = rows[i] lane k (out: 4-byte elements, float or int32 bits).
E8KV_FORCE_INLINE void e8_store_tile(const e8_f32x4 (&rows)[8], void* out) {
  e8_f32x4 lo[4], hi[4];
  e8_transpose4(rows[0], rows[1], rows[2], rows[3], lo[0], lo[1], lo[2], lo[3]);
  e8_transpose4(rows[4], rows[5], rows[6], rows[7], hi[0], hi[1], hi[2], hi[3]);
  char* o = static_cast<char*>(out);
  for (int k = 0; k < 4; ++k) {
    std::memcpy(o + 32 * k, &lo[k], 16);
    std::memcpy(o + 32 * k + 16, &hi[k], 16);
  }
}
E8KV_FORCE_INLINE void e8_store_tile(const e8_f32x8 (&rows)[8], void* out) {
  e8_f32x8 blocks[8];
  e8_transpose8(rows, blocks);
  std::memcpy(out, blocks, sizeof blocks);
}

/// Nearest D8 point of every lane: r[i] receives the rounded, parity-repaired coordinates.
template <class VF>
E8KV_FORCE_INLINE void e8_nearest_d8_lanes(const VF (&x)[8], VF (&r)[8]) {
  using VI = typename E8Simd<VF>::VI;
  // x + 1.5·2^23 lies in [2^23, 2^24) for |x| <= 2^20 + 1: the FPU rounds it to an integer,
  // half to even (1.5·2^23 is even), and that integer's parity is the lowest mantissa bit.
  const VF magic = VF{} + 12582912.0f;
  const VI abs_mask = VI{} + 0x7fffffff;
  VF best_abs = VF{} - 1.0f, best_delta = VF{};
  VI best_index = VI{}, parity = VI{};
  for (int i = 0; i < 8; ++i) {
    const VF t = x[i] + magic;
    const VF ri = t - magic;
    const VF d = x[i] - ri;
    const VF a = (VF)((VI)d & abs_mask);
    r[i] = ri;
    parity ^= (VI)t;
    const VI further = a > best_abs;  // strict: the first index wins a tie
    best_abs = E8KV_E8_SELECT(VF, VI, further, a, best_abs);
    best_delta = E8KV_E8_SELECT(VF, VI, further, d, best_delta);
    best_index = E8KV_E8_SELECT(VI, VI, further, VI{} + i, best_index);
  }
  // ±1 (+1 on a zero error) where the parity is odd, +0 elsewhere; added at best_index.
  const VF step = (VF)((VI)E8KV_E8_SELECT(VF, VI, best_delta >= 0.0f, VF{} + 1.0f, VF{} - 1.0f) &
                       ((parity & 1) != 0));
  for (int i = 0; i < 8; ++i) r[i] = r[i] + (VF)((VI)step & (best_index == i));
}

/// One tile: nearest E8 point of L blocks; writes twice the point (int32) or the point.
template <class VF, bool kTwice>
E8KV_FORCE_INLINE void e8_tile(const float* x, void* out) {
  using VI = typename E8Simd<VF>::VI;
  constexpr float kMax = LatticeLimits<float>::kMaxAbs;
  VF xs[8], xh[8], ra[8], rb[8];
  e8_load_tile(x, xs);
  for (int i = 0; i < 8; ++i) {  // fp::sanitize: NaN -> 0 first, then clamp to ±kMax
    // (Once NaN is gone, min-then-max gives the scalar clamp's result, -0 and ±Inf included.)
    VF c = (VF)((VI)xs[i] & (xs[i] == xs[i]));
    c = E8KV_E8_SELECT(VF, VI, c < kMax, c, VF{} + kMax);
    c = E8KV_E8_SELECT(VF, VI, c > -kMax, c, VF{} - kMax);
    xs[i] = c;
    xh[i] = c - 0.5f;
  }
  e8_nearest_d8_lanes(xs, ra);
  e8_nearest_d8_lanes(xh, rb);
  // Half-coset points are rb + ½ (exact). Distances in index order, multiply then add.
  VF da = VF{}, db = VF{};
  for (int i = 0; i < 8; ++i) {
    rb[i] = rb[i] + 0.5f;
    const VF ea = xs[i] - ra[i];
    const VF eb = xs[i] - rb[i];
    const VF sa = ea * ea;
    const VF sb = eb * eb;
    da = da + sa;
    db = db + sb;
  }
  const VI integer_wins = ~(db < da);  // tie -> integer coset
  VF y[8];
  for (int i = 0; i < 8; ++i) {
    const VF p = E8KV_E8_SELECT(VF, VI, integer_wins, ra[i], rb[i]);
    // A zero coordinate is +0 here, as from the scalar int -> float conversion: t - magic
    // gives +0, adding ±1 to a nonzero integer never gives -0, and rb + ½ is never 0.
    y[i] = kTwice ? (VF)__builtin_convertvector(p + p, VI) : p;
  }
  e8_store_tile(y, out);
}

/// Full tiles, then one zero-padded tile for the remainder.
template <class VF, bool kTwice>
E8KV_FORCE_INLINE void e8_batch_body(const float* x, void* out, size_t n_blocks) {
  constexpr size_t L = static_cast<size_t>(E8Simd<VF>::kLanes);
  char* o = static_cast<char*>(out);
  size_t b = 0;
  for (; b + L <= n_blocks; b += L) e8_tile<VF, kTwice>(x + 8 * b, o + 32 * b);
  const size_t rest = n_blocks - b;
  if (rest == 0) return;
  float in[8 * L] = {};
  float result[8 * L];
  std::memcpy(in, x + 8 * b, rest * 32);
  e8_tile<VF, kTwice>(in, result);
  std::memcpy(o + 32 * b, result, rest * 32);
}

#if E8KV_E8_BATCH_AVX2
__attribute__((target("avx2"))) inline void e8_batch_avx2(const float* x, void* out, size_t n, bool twice) {
  if (twice)
    e8_batch_body<e8_f32x8, true>(x, out, n);
  else
    e8_batch_body<e8_f32x8, false>(x, out, n);
}
inline bool e8_cpu_has_avx2() { return e8kv::cpu_has_avx2(); }
#endif

inline void e8_batch_dispatch(const float* x, void* out, size_t n, bool twice) {
#if E8KV_E8_BATCH_AVX2
  if (e8_cpu_has_avx2()) return e8_batch_avx2(x, out, n, twice);
#endif
  if (twice)
    e8_batch_body<e8_f32x4, true>(x, out, n);
  else
    e8_batch_body<e8_f32x4, false>(x, out, n);
}

#endif  // E8KV_E8_BATCH_SIMD

}  // namespace detail

/// Nearest E8 point of each of n_blocks blocks of 8 contiguous floats, as twice its
/// coordinates (all even: integer coset; all odd: half-integer coset). Bit-identical to
/// nearest_e8_twice<float> block by block. twice_y must not overlap x.
inline void nearest_e8_twice_batch(const float* x, int32_t* twice_y, size_t n_blocks) {
  if (n_blocks == 0) return;
#if E8KV_E8_BATCH_SIMD
  detail::e8_batch_dispatch(x, twice_y, n_blocks, true);
#else
  detail::nearest_e8_twice_blocks_scalar(x, twice_y, n_blocks);
#endif
}

/// Nearest E8 point of each of n_blocks blocks of 8 contiguous floats. Bit-identical to
/// nearest_e8<float> block by block. y may equal x (in place); otherwise they must not overlap.
inline void nearest_e8_batch(const float* x, float* y, size_t n_blocks) {
  if (n_blocks == 0) return;
#if E8KV_E8_BATCH_SIMD
  detail::e8_batch_dispatch(x, y, n_blocks, false);
#else
  detail::nearest_e8_blocks_scalar(x, y, n_blocks);
#endif
}

}  // namespace e8kv::lattice

#undef E8KV_E8_SELECT
