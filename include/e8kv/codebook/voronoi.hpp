// Table-free block codes: Voronoi (nested-lattice) codes E8 / qE8 with q = 2^K, K = 1..4
// (Conway & Sloane, IEEE IT-29, 1983), an 8K-bit index per 8 elements (K bits per element).
//
// Codebook: the image of the decoder, C = {λ ∈ E8 : Q_E8((λ − a)/q) = 0} = E8 ∩ (qV + a), one
// point per class of E8/qE8, q^8 points. V is the Voronoi cell of E8 and a = (1,2,3,4,5,6,7,9)/64
// a tie-breaking offset: ⟨a, r⟩ ∉ Z for all 240 roots r, so no λ lies on the boundary of qV + a
// and the decoder is exactly translation-covariant on E8 (no doubly counted boundary points).
//
// Index: k = G⁻¹λ mod q, 8 digits of K bits (digit i in bits [K·i, K·i + K)), where G is the
// triangular generator with columns 2e₁, e₂ − e₁, …, e₇ − e₆, ½·1 (det 1; 0-based below).
// Decode: y = G·k, λ = y − q·Q_E8((y − a)/q): one nearest-point call, no tables. Index bits above
// 8K are ignored.
//
// Encode: λ = Q_E8(s·x). λ is a codeword iff (λ − a)/q lies in V, i.e. ⟨(λ − a)/q, r⟩ < 1 for the
// 240 roots (the Voronoi-relevant vectors of E8); this test is equivalent to decode(index(λ)) == λ
// and exact in float (all values are dyadic). Otherwise (overload) the encoder is approximate:
//   1. shrink s·x toward the centre a of the code region along the ray a + c·(s·x − a), starting
//      at the boundary c = 1/gauge and multiplying c by 0.95 until Q_E8 lands on a codeword
//      (c → 0 reaches a, whose nearest point, the origin, is a codeword);
//   2. greedy descent: move to the best neighbour λ + r (r a root) that is a codeword and closer
//      to s·x, until none is (at most kMaxDescentSteps moves).
// The result is always a codeword, so encode(decode(i)) == i for every index i.
//
// Non-finite input: NaN coordinates count as 0, ±Inf and |x| > 2^16 are clamped to ±2^16.
#pragma once

#include <cmath>
#include <cstdint>

#include "e8kv/config.hpp"
#include "e8kv/lattice/shells.hpp"
#include "e8kv/numeric/fp.hpp"

#if !E8KV_ON_DEVICE && defined(__SSE2__)
#include <emmintrin.h>
#define E8KV_VORONOI_SSE2 1
#else
#define E8KV_VORONOI_SSE2 0
#endif

namespace e8kv::codebook {

namespace detail {

inline constexpr float kVoronoiInputLimit = 65536.0f;
inline constexpr int kVoronoiMaxShrinkSteps = 64;
inline constexpr float kVoronoiShrinkFactor = 0.95f;
inline constexpr int kVoronoiMaxDescentSteps = 16;
inline constexpr int kVoronoiMaxCandidates = 64;

E8KV_HD E8KV_FORCE_INLINE float max2(float a, float b) { return a > b ? a : b; }
E8KV_HD E8KV_FORCE_INLINE float min2(float a, float b) { return a < b ? a : b; }

/// Round half to even for |x| < 2^23 (fp::round_half_even without its range check).
E8KV_HD E8KV_FORCE_INLINE float round_half_even_small(float x) {
#if E8KV_ON_DEVICE
  return rintf(x);
#else
  const float t = std::copysign(8388608.0f, x);  // 2^23 with the sign of x (bit ops, no branch)
  return (x + t) - t;
#endif
}

/// Nearest point of D8 to x, for one coset of E8: rounds, and when the coordinate sum is odd moves
/// the first coordinate with the largest rounding error the other way (+1 when that error is 0).
E8KV_HD E8KV_FORCE_INLINE void nearest_d8_portable(const float x[8], float r[8]) {
  float d[8], ad[8];
  int32_t parity = 0;
  float worst = 0.0f;
  for (int i = 0; i < 8; ++i) {
    r[i] = round_half_even_small(x[i]);
    d[i] = x[i] - r[i];
    ad[i] = fabsf(d[i]);
    parity += static_cast<int32_t>(r[i]);
    worst = max2(ad[i], worst);
  }
  int32_t first = 8;  // the first index with the largest error
  for (int i = 7; i >= 0; --i) first = ad[i] == worst ? i : first;
  const float odd = static_cast<float>(parity & 1);
  for (int i = 0; i < 8; ++i) {
    const float chosen = i == first ? odd : 0.0f;
    // Away from x: +1 for d ≥ 0 (d + 0 turns -0 into +0), -1 for d < 0.
    r[i] += copysignf(chosen, d[i] + 0.0f);
  }
}

/// Nearest point of E8 as twice values, for finite |x| ≤ 2^20. Same tie rules and the same float
/// operations on the results as lattice::nearest_e8_twice<float>, so the same point bit for bit,
/// in float/int32 without data-dependent branches. Used on the device and as the reference of the
/// SSE2 version.
E8KV_HD E8KV_FORCE_INLINE void nearest_e8_twice_portable(const float x[8], int32_t twice[8]) {
  float xh[8], ra[8], rb[8];
  for (int i = 0; i < 8; ++i) xh[i] = x[i] - 0.5f;
  nearest_d8_portable(x, ra);
  nearest_d8_portable(xh, rb);
  float da = 0.0f, db = 0.0f;  // summed in index order, unfused, like the reference
  for (int i = 0; i < 8; ++i) {
    const float ea = x[i] - ra[i];
    const float eb = x[i] - (rb[i] + 0.5f);
    da = fp::add(da, fp::mul(ea, ea));
    db = fp::add(db, fp::mul(eb, eb));
  }
  const int32_t half = (db < da) ? 1 : 0;  // a tie goes to the integer coset
  for (int i = 0; i < 8; ++i) {
    const int32_t a = 2 * static_cast<int32_t>(ra[i]);
    const int32_t b = 2 * static_cast<int32_t>(rb[i]) + 1;
    twice[i] = a + half * (b - a);
  }
}

/// max over the 240 roots r of ⟨p, r⟩: the gauge of the E8 Voronoi cell V = {p : gauge(p) ≤ 1}.
/// Roots ±e_i ± e_j give the sum of the two largest |p_i|; roots (±½)^8 with an even number of
/// minus signs give ½Σ|p_i|, less |p|_min when p has an odd number of negative coordinates.
/// The sum is taken as ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), the order of the SSE2 version.
E8KV_HD E8KV_FORCE_INLINE float e8_root_gauge_portable(const float p[8]) {
  float a[8];
  uint32_t negative = 0;
  for (int i = 0; i < 8; ++i) {
    a[i] = fabsf(p[i]);
    negative ^= p[i] < 0.0f ? 1u : 0u;
  }
  // Two largest by a tournament: pairs, then merges keeping (largest, second).
  float hi[4], lo[4];
  for (int i = 0; i < 4; ++i) {
    hi[i] = max2(a[2 * i], a[2 * i + 1]);
    lo[i] = min2(a[2 * i], a[2 * i + 1]);
  }
  const float hi01 = max2(hi[0], hi[1]), lo01 = max2(min2(hi[0], hi[1]), max2(lo[0], lo[1]));
  const float hi23 = max2(hi[2], hi[3]), lo23 = max2(min2(hi[2], hi[3]), max2(lo[2], lo[3]));
  const float largest = max2(hi01, hi23), second = max2(min2(hi01, hi23), max2(lo01, lo23));
  const float smallest = min2(min2(lo[0], lo[1]), min2(lo[2], lo[3]));
  const float sum = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
  const float half_root = 0.5f * (sum - 2.0f * smallest * static_cast<float>(negative));
  return max2(largest + second, half_root);
}

#if E8KV_VORONOI_SSE2
// Host versions with SSE2 intrinsics (x86-64 baseline): the same operations lane by lane, so the
// same results as the portable versions bit for bit (checked by tests/cpu/voronoi_test.cpp).

E8KV_FORCE_INLINE int lowest_set_bit(int mask) {
#if defined(__GNUC__) || defined(__clang__)
  return __builtin_ctz(static_cast<unsigned>(mask));
#else
  int i = 0;
  while (!((mask >> i) & 1)) ++i;
  return i;
#endif
}

E8KV_FORCE_INLINE void nearest_d8_sse2(__m128 xl, __m128 xh, __m128& rl, __m128& rh) {
  const __m128 sign = _mm_set1_ps(-0.0f), big = _mm_set1_ps(8388608.0f), one = _mm_set1_ps(1.0f);
  const __m128 tl = _mm_or_ps(_mm_and_ps(xl, sign), big), th = _mm_or_ps(_mm_and_ps(xh, sign), big);
  rl = _mm_sub_ps(_mm_add_ps(xl, tl), tl);
  rh = _mm_sub_ps(_mm_add_ps(xh, th), th);
  const __m128 dl = _mm_sub_ps(xl, rl), dh = _mm_sub_ps(xh, rh);
  const __m128 adl = _mm_andnot_ps(sign, dl), adh = _mm_andnot_ps(sign, dh);
  __m128i sum = _mm_add_epi32(_mm_cvttps_epi32(rl), _mm_cvttps_epi32(rh));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(1, 0, 3, 2)));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(2, 3, 0, 1)));
  const int odd = _mm_cvtsi128_si32(sum) & 1;
  __m128 worst = _mm_max_ps(adl, adh);
  worst = _mm_max_ps(worst, _mm_shuffle_ps(worst, worst, _MM_SHUFFLE(1, 0, 3, 2)));
  worst = _mm_max_ps(worst, _mm_shuffle_ps(worst, worst, _MM_SHUFFLE(2, 3, 0, 1)));
  const int at_worst = _mm_movemask_ps(_mm_cmpeq_ps(adl, worst)) | (_mm_movemask_ps(_mm_cmpeq_ps(adh, worst)) << 4);
  const __m128i chosen = _mm_set1_epi32(odd ? lowest_set_bit(at_worst) : 8);
  const __m128 cl = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_setr_epi32(0, 1, 2, 3), chosen));
  const __m128 ch = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_setr_epi32(4, 5, 6, 7), chosen));
  const __m128 zero = _mm_setzero_ps();
  rl = _mm_add_ps(rl, _mm_and_ps(cl, _mm_or_ps(_mm_and_ps(_mm_add_ps(dl, zero), sign), one)));
  rh = _mm_add_ps(rh, _mm_and_ps(ch, _mm_or_ps(_mm_and_ps(_mm_add_ps(dh, zero), sign), one)));
}

E8KV_FORCE_INLINE void nearest_e8_twice_sse2(const float x[8], int32_t twice[8]) {
  const __m128 xl = _mm_loadu_ps(x), xh = _mm_loadu_ps(x + 4), half = _mm_set1_ps(0.5f);
  __m128 ral, rah, rbl, rbh;
  nearest_d8_sse2(xl, xh, ral, rah);
  nearest_d8_sse2(_mm_sub_ps(xl, half), _mm_sub_ps(xh, half), rbl, rbh);
  const __m128 eal = _mm_sub_ps(xl, ral), eah = _mm_sub_ps(xh, rah);
  const __m128 ebl = _mm_sub_ps(xl, _mm_add_ps(rbl, half)), ebh = _mm_sub_ps(xh, _mm_add_ps(rbh, half));
  const __m128 sal = _mm_mul_ps(eal, eal), sah = _mm_mul_ps(eah, eah);
  const __m128 sbl = _mm_mul_ps(ebl, ebl), sbh = _mm_mul_ps(ebh, ebh);
  // Both cosets' sums in index order at once: lane 0 = integer coset, lane 1 = half coset.
  const __m128 u0 = _mm_unpacklo_ps(sal, sbl), u1 = _mm_unpackhi_ps(sal, sbl);
  const __m128 u2 = _mm_unpacklo_ps(sah, sbh), u3 = _mm_unpackhi_ps(sah, sbh);
  __m128 acc = u0;
  acc = _mm_add_ps(acc, _mm_movehl_ps(u0, u0));
  acc = _mm_add_ps(acc, u1);
  acc = _mm_add_ps(acc, _mm_movehl_ps(u1, u1));
  acc = _mm_add_ps(acc, u2);
  acc = _mm_add_ps(acc, _mm_movehl_ps(u2, u2));
  acc = _mm_add_ps(acc, u3);
  acc = _mm_add_ps(acc, _mm_movehl_ps(u3, u3));
  const float da = _mm_cvtss_f32(acc);
  const float db = _mm_cvtss_f32(_mm_shuffle_ps(acc, acc, _MM_SHUFFLE(1, 1, 1, 1)));
  const __m128i half_wins = _mm_set1_epi32(db < da ? -1 : 0);  // a tie goes to the integer coset
  const __m128i one = _mm_set1_epi32(1);
  const __m128i al = _mm_slli_epi32(_mm_cvttps_epi32(ral), 1), ah = _mm_slli_epi32(_mm_cvttps_epi32(rah), 1);
  const __m128i bl = _mm_add_epi32(_mm_slli_epi32(_mm_cvttps_epi32(rbl), 1), one);
  const __m128i bh = _mm_add_epi32(_mm_slli_epi32(_mm_cvttps_epi32(rbh), 1), one);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(twice),
                   _mm_or_si128(_mm_and_si128(half_wins, bl), _mm_andnot_si128(half_wins, al)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(twice + 4),
                   _mm_or_si128(_mm_and_si128(half_wins, bh), _mm_andnot_si128(half_wins, ah)));
}

E8KV_FORCE_INLINE float e8_root_gauge_sse2(const float p[8]) {
  const __m128 sign = _mm_set1_ps(-0.0f), zero = _mm_setzero_ps();
  const __m128 pl = _mm_loadu_ps(p), ph = _mm_loadu_ps(p + 4);
  const __m128 al = _mm_andnot_ps(sign, pl), ah = _mm_andnot_ps(sign, ph);
  const int negative_mask = _mm_movemask_ps(_mm_cmplt_ps(pl, zero)) | (_mm_movemask_ps(_mm_cmplt_ps(ph, zero)) << 4);
  int negative = negative_mask ^ (negative_mask >> 4);
  negative ^= negative >> 2;
  negative = (negative ^ (negative >> 1)) & 1;
  // Tournament for the two largest (exact whatever the order): lanes (i, i+4), (i, i+2), (i, i+1).
  __m128 hi = _mm_max_ps(al, ah), lo = _mm_min_ps(al, ah);
  __m128 hs = _mm_shuffle_ps(hi, hi, _MM_SHUFFLE(1, 0, 3, 2)), ls = _mm_shuffle_ps(lo, lo, _MM_SHUFFLE(1, 0, 3, 2));
  lo = _mm_max_ps(_mm_min_ps(hi, hs), _mm_max_ps(lo, ls));
  hi = _mm_max_ps(hi, hs);
  hs = _mm_shuffle_ps(hi, hi, _MM_SHUFFLE(2, 3, 0, 1));
  ls = _mm_shuffle_ps(lo, lo, _MM_SHUFFLE(2, 3, 0, 1));
  lo = _mm_max_ps(_mm_min_ps(hi, hs), _mm_max_ps(lo, ls));
  hi = _mm_max_ps(hi, hs);
  const float largest = _mm_cvtss_f32(hi), second = _mm_cvtss_f32(lo);
  __m128 sm = _mm_min_ps(al, ah);
  sm = _mm_min_ps(sm, _mm_shuffle_ps(sm, sm, _MM_SHUFFLE(1, 0, 3, 2)));
  sm = _mm_min_ps(sm, _mm_shuffle_ps(sm, sm, _MM_SHUFFLE(2, 3, 0, 1)));
  const float smallest = _mm_cvtss_f32(sm);
  const __m128 s4 = _mm_add_ps(al, ah);                     // a_i + a_{i+4}
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));  // (a0+a4)+(a2+a6), (a1+a5)+(a3+a7)
  const float sum = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, _MM_SHUFFLE(1, 1, 1, 1))));
  const float half_root = 0.5f * (sum - 2.0f * smallest * static_cast<float>(negative));
  return max2(largest + second, half_root);
}
#endif  // E8KV_VORONOI_SSE2

/// Nearest point of E8 (twice values) for finite |x| ≤ 2^20: SSE2 on x86 hosts, portable elsewhere.
E8KV_HD E8KV_FORCE_INLINE void nearest_e8_twice_fast(const float x[8], int32_t twice[8]) {
#if E8KV_VORONOI_SSE2
  nearest_e8_twice_sse2(x, twice);
#else
  nearest_e8_twice_portable(x, twice);
#endif
}

E8KV_HD E8KV_FORCE_INLINE float e8_root_gauge(const float p[8]) {
#if E8KV_VORONOI_SSE2
  return e8_root_gauge_sse2(p);
#else
  return e8_root_gauge_portable(p);
#endif
}

/// Tie-breaking offset a = (1,2,3,4,5,6,7,9)/64 of the code region qV + a.
E8KV_HD E8KV_FORCE_INLINE constexpr float voronoi_offset(int i) {
  return static_cast<float>(i == 7 ? 9 : i + 1) * (1.0f / 64.0f);
}

/// Input scale minimizing the MSE on i.i.d. N(0,1) input (golden-section search, 2·10^5 blocks).
constexpr float voronoi_input_scale(int k) {
  return k == 1 ? 0.685f : k == 2 ? 0.992f : k == 3 ? 1.778f : 3.246f;
}

}  // namespace detail

/// Voronoi code E8 / 2^K·E8: K bits per element, 8K-bit index, no tables.
template <int K>
struct Voronoi {
  static_assert(K >= 1 && K <= 4, "Voronoi<K>: K (bits per element) must be 1..4");
  static constexpr const char* kName = "voronoi";
  static constexpr int kBitsPerElement = K;
  static constexpr int kIndexBits = 8 * K;
  static constexpr int32_t kModulus = 1 << K;  // q
  static constexpr float kInputScale = detail::voronoi_input_scale(K);

  /// True when the E8 point `twice` (twice values) is a codeword: (λ − a)/q inside V.
  E8KV_HD static bool is_codeword(const int32_t twice[8]) {
    float p[8];
    for (int i = 0; i < 8; ++i)
      p[i] = fp::mul(fp::add(static_cast<float>(twice[i]) * 0.5f, -detail::voronoi_offset(i)), kInverseModulus);
    return detail::e8_root_gauge(p) < 1.0f;
  }

  /// Index of the class of the E8 point `twice` in E8/qE8 (G⁻¹λ mod q); for a codeword this is
  /// its index. The point must be in E8.
  E8KV_HD static uint32_t index_of(const int32_t twice[8]) {
    // G⁻¹λ: k7 = 2λ7; k_j = Σ_{l=j..6} (λ_l − λ7) for j = 1..6; k0 = ½·Σ_{l=0..6} (λ_l − λ7).
    int32_t k[8];
    k[7] = twice[7];
    int32_t suffix = 0;
    for (int j = 6; j >= 1; --j) {
      suffix += (twice[j] - twice[7]) / 2;  // exact: both twice values have the coset's parity
      k[j] = suffix;
    }
    k[0] = (suffix + (twice[0] - twice[7]) / 2) / 2;  // exact for E8 points (Σλ even)
    uint32_t index = 0;
    for (int j = 0; j < 8; ++j) index |= (static_cast<uint32_t>(k[j]) & static_cast<uint32_t>(kModulus - 1)) << (K * j);
    return index;
  }

  /// The codeword (twice values) of an index: y = G·k, λ = y − q·Q_E8((y − a)/q).
  E8KV_HD static void point_of(uint32_t index, int32_t twice[8]) {
    int32_t k[8];
    for (int j = 0; j < 8; ++j) k[j] = static_cast<int32_t>((index >> (K * j)) & static_cast<uint32_t>(kModulus - 1));
    int32_t y[8];
    y[0] = 2 * (2 * k[0] - k[1]) + k[7];
    for (int j = 1; j <= 5; ++j) y[j] = 2 * (k[j] - k[j + 1]) + k[7];
    y[6] = 2 * k[6] + k[7];
    y[7] = k[7];
    float p[8];
    for (int i = 0; i < 8; ++i)
      p[i] = fp::mul(fp::add(static_cast<float>(y[i]) * 0.5f, -detail::voronoi_offset(i)), kInverseModulus);
    int32_t z[8];
    detail::nearest_e8_twice_fast(p, z);
    for (int i = 0; i < 8; ++i) twice[i] = y[i] - kModulus * z[i];
  }

  /// A codeword near `scaled` (finite, in lattice units): the nearest one unless overloaded.
  E8KV_HD static void nearest_codeword(const float scaled[8], int32_t twice[8]) {
    detail::nearest_e8_twice_fast(scaled, twice);
    if (is_codeword(twice)) return;
    // Overload: the facet the input lies beyond, then (corners) the facet that candidate crossed.
    float p[8];
    for (int i = 0; i < 8; ++i) p[i] = fp::mul(fp::add(scaled[i], -detail::voronoi_offset(i)), kInverseModulus);
    int32_t facet[8];
    facet_root(p, facet);
    if (last_layer_candidate(scaled, facet, twice)) return;
    for (int i = 0; i < 8; ++i)
      p[i] = fp::mul(fp::add(static_cast<float>(twice[i]) * 0.5f, -detail::voronoi_offset(i)), kInverseModulus);
    facet_root(p, facet);
    if (last_layer_candidate(scaled, facet, twice)) return;
    shrink_into_code(scaled, twice);
    descend(scaled, twice);
  }

  E8KV_HD static uint32_t encode(const float x[8]) {
    float s[8];
    for (int i = 0; i < 8; ++i) s[i] = fp::mul(fp::sanitize(x[i], detail::kVoronoiInputLimit), kInputScale);
    int32_t t[8];
    nearest_codeword(s, t);
    return index_of(t);
  }

  E8KV_HD static void decode(uint32_t index, float y[8]) {
    int32_t t[8];
    point_of(index, t);
    for (int i = 0; i < 8; ++i) y[i] = fp::mul(static_cast<float>(t[i]), kHalfOverScale);
  }

  // ---- overload handling (see the top of the file) ------------------------------------------

  /// The root z (twice values) maximizing ⟨p, z⟩: the facet of V that p is farthest beyond.
  /// Integer root: the two largest |p_i| (first index wins ties) with the signs of p; half root:
  /// the signs of p, flipping the smallest |p_i| when the number of minus signs is odd. The
  /// integer root wins a tie between the two.
  E8KV_HD static void facet_root(const float p[8], int32_t z[8]) {
    int32_t first = 0, second = -1, smallest = 0;
    float sum = 0.0f;
    int32_t negative = 0;
    for (int i = 0; i < 8; ++i) {
      const float a = fabsf(p[i]);
      sum = fp::add(sum, a);
      negative ^= p[i] < 0.0f ? 1 : 0;
      if (a < fabsf(p[smallest])) smallest = i;
      if (i == 0) continue;
      if (a > fabsf(p[first])) {
        second = first;
        first = i;
      } else if (second < 0 || a > fabsf(p[second])) {
        second = i;
      }
    }
    const float integer_value = fp::add(fabsf(p[first]), fabsf(p[second]));
    const float half_value = 0.5f * fp::add(sum, negative ? -2.0f * fabsf(p[smallest]) : 0.0f);
    if (!(half_value > integer_value)) {
      for (int i = 0; i < 8; ++i) z[i] = 0;
      z[first] = p[first] < 0.0f ? -2 : 2;
      z[second] = p[second] < 0.0f ? -2 : 2;
      return;
    }
    for (int i = 0; i < 8; ++i) z[i] = p[i] < 0.0f ? -1 : 1;
    if (negative) z[smallest] = -z[smallest];
  }

  /// The root r (twice values) with ⟨r, z⟩ = 1 that minimizes ⟨u, r⟩, for a root z (twice values).
  /// These 56 roots move a point one layer along z; the minimum has a closed form per root type.
  E8KV_HD static void min_adjacent_root(const int32_t z[8], const float u[8], int32_t r[8]) {
    for (int k = 0; k < 8; ++k) r[k] = 0;
    if (z[0] & 1) {
      // z = ½s: the integer roots s_i e_i + s_j e_j give w_i + w_j (w = s∘u), the half roots
      // ½s with s_i, s_j flipped give ½Σw − w_i − w_j: the two smallest or two largest w.
      float w[8], total = 0.0f;
      int32_t lo1 = -1, lo2 = -1, hi1 = -1, hi2 = -1;
      for (int k = 0; k < 8; ++k) {
        w[k] = z[k] < 0 ? -u[k] : u[k];
        total = fp::add(total, w[k]);
      }
      for (int k = 0; k < 8; ++k) {
        if (lo1 < 0 || w[k] < w[lo1]) {
          lo2 = lo1;
          lo1 = k;
        } else if (lo2 < 0 || w[k] < w[lo2]) {
          lo2 = k;
        }
        if (hi1 < 0 || w[k] > w[hi1]) {
          hi2 = hi1;
          hi1 = k;
        } else if (hi2 < 0 || w[k] > w[hi2]) {
          hi2 = k;
        }
      }
      const float integer_value = fp::add(w[lo1], w[lo2]);
      const float half_value = fp::add(0.5f * total, -fp::add(w[hi1], w[hi2]));
      if (!(half_value < integer_value)) {
        r[lo1] = 2 * (z[lo1] < 0 ? -1 : 1);
        r[lo2] = 2 * (z[lo2] < 0 ? -1 : 1);
      } else {
        for (int k = 0; k < 8; ++k) r[k] = z[k];
        r[hi1] = -r[hi1];
        r[hi2] = -r[hi2];
      }
      return;
    }
    // z = σ_i e_i + σ_j e_j: the integer roots σ_i e_i ± e_k and σ_j e_j ± e_k (k ≠ i, j) give
    // σ_i u_i − |u_k| at best (largest |u_k|); the half roots with t_i = σ_i, t_j = σ_j give
    // ½(σ_i u_i + σ_j u_j − Σ_k |u_k|), plus |u_m| (smallest) when the sign count is odd.
    int32_t i = -1, j = -1;
    for (int k = 0; k < 8; ++k) {
      if (z[k] != 0) {
        if (i < 0)
          i = k;
        else
          j = k;
      }
    }
    const float ui = z[i] < 0 ? -u[i] : u[i], uj = z[j] < 0 ? -u[j] : u[j];
    int32_t largest = -1, smallest = -1, minus = (z[i] < 0) + (z[j] < 0);
    float rest = 0.0f;
    for (int k = 0; k < 8; ++k) {
      if (k == i || k == j) continue;
      const float a = fabsf(u[k]);
      rest = fp::add(rest, a);
      minus += u[k] > 0.0f ? 1 : 0;
      if (largest < 0 || a > fabsf(u[largest])) largest = k;
      if (smallest < 0 || a < fabsf(u[smallest])) smallest = k;
    }
    const float via_i = fp::add(ui, -fabsf(u[largest])), via_j = fp::add(uj, -fabsf(u[largest]));
    const float half_value =
        fp::add(0.5f * fp::add(fp::add(ui, uj), -rest), (minus & 1) ? fabsf(u[smallest]) : 0.0f);
    if (!(via_j < via_i) && !(half_value < via_i)) {
      r[i] = z[i];
      r[largest] = u[largest] > 0.0f ? -2 : 2;
    } else if (!(half_value < via_j)) {
      r[j] = z[j];
      r[largest] = u[largest] > 0.0f ? -2 : 2;
    } else {
      for (int k = 0; k < 8; ++k) r[k] = u[k] > 0.0f ? -1 : 1;
      r[i] = z[i] / 2;
      r[j] = z[j] / 2;
      if (minus & 1) r[smallest] = -r[smallest];
    }
  }

  /// Candidate in the last layer of the code along the facet root z: E8 ∩ {⟨λ, z⟩ = m} with m the
  /// largest layer inside (q, or q − 1 when ⟨a, z⟩ < 0) is a coset of E7. Project x onto that
  /// hyperplane, take the nearest E8 point (at most one layer off), and step back into the layer
  /// by the best of the 56 roots r with ⟨r, z⟩ = 1. Returns whether the candidate is a codeword.
  E8KV_HD static bool last_layer_candidate(const float x[8], const int32_t z[8], int32_t twice[8]) {
    float xz = 0.0f, az = 0.0f;  // 2⟨x, z⟩ and 2⟨a, z⟩ (z in twice values)
    for (int i = 0; i < 8; ++i) {
      xz = fp::add(xz, fp::mul(x[i], static_cast<float>(z[i])));
      az = fp::add(az, fp::mul(detail::voronoi_offset(i), static_cast<float>(z[i])));
    }
    const int32_t m = az > 0.0f ? kModulus : kModulus - 1;
    // y = x − ((⟨x, z⟩ − m)/‖z‖²)·z with ‖z‖² = 2 and z = twice/2.
    const float t = fp::mul(fp::add(0.5f * xz, -static_cast<float>(m)), 0.25f);
    float y[8];
    for (int i = 0; i < 8; ++i) y[i] = fp::add(x[i], -fp::mul(t, static_cast<float>(z[i])));
    detail::nearest_e8_twice_fast(y, twice);
    int32_t layer4 = 0;  // 4⟨λ, z⟩
    for (int i = 0; i < 8; ++i) layer4 += twice[i] * z[i];
    const int32_t layer = layer4 / 4;
    if (layer != m) {
      const float sense = layer > m ? 1.0f : -1.0f;  // down: minimize ⟨y − λ, r⟩; up: maximize
      float u[8];
      for (int i = 0; i < 8; ++i) u[i] = sense * fp::add(y[i], -0.5f * static_cast<float>(twice[i]));
      int32_t r[8];
      min_adjacent_root(z, u, r);
      for (int i = 0; i < 8; ++i) twice[i] -= layer > m ? r[i] : -r[i];
    }
    return is_codeword(twice);
  }

  /// Step 1: the first codeword met shrinking `scaled` toward a.
  E8KV_HD static void shrink_into_code(const float scaled[8], int32_t twice[8]) {
    float dir[8], p[8];
    for (int i = 0; i < 8; ++i) {
      dir[i] = scaled[i] - detail::voronoi_offset(i);
      p[i] = dir[i] * kInverseModulus;
    }
    const float gauge = detail::e8_root_gauge(p);
    float c = gauge > 1.0f ? 1.0f / gauge : 1.0f;
    for (int step = 0; step < detail::kVoronoiMaxShrinkSteps; ++step) {
      float y[8];
      for (int i = 0; i < 8; ++i) y[i] = fp::add(detail::voronoi_offset(i), fp::mul(c, dir[i]));
      detail::nearest_e8_twice_fast(y, twice);
      if (is_codeword(twice)) return;
      c *= 0.95f;
    }
    for (int i = 0; i < 8; ++i) twice[i] = 0;  // the origin is always a codeword
  }

  /// Step 2: greedy descent. Moving by a root r changes ‖x − λ‖² by 2 − 2⟨x − λ, r⟩, so with
  /// e2 = 2(x − λ) and r2 = 2r (twice values) the improving roots are those with gain
  /// ⟨e2, r2⟩ > 4. Each step takes the largest-gain improving root whose move stays a codeword.
  /// The improving roots are enumerated directly (pairs ±e_i ± e_j, and sign patterns of
  /// (±½)^8 found by a pruned search), not by scanning all 240.
  E8KV_HD static void descend(const float scaled[8], int32_t twice[8]) {
    for (int step = 0; step < detail::kVoronoiMaxDescentSteps; ++step) {
      float e2[8];
      for (int i = 0; i < 8; ++i) e2[i] = fp::add(2.0f * scaled[i], -static_cast<float>(twice[i]));
      RootCandidates c;
      collect_improving_integer_roots(e2, c);
      collect_improving_half_roots(e2, c);
      while (true) {
        int best = -1;
        float best_gain = 4.0f;
        for (int k = 0; k < c.count; ++k) {
          if (c.gain[k] > best_gain) {
            best_gain = c.gain[k];
            best = k;
          }
        }
        if (best < 0) return;  // no improving move stays in the code
        int32_t root[8], moved[8];
        root_from_code(c.code[best], root);
        for (int i = 0; i < 8; ++i) moved[i] = twice[i] + root[i];
        if (is_codeword(moved)) {
          for (int i = 0; i < 8; ++i) twice[i] = moved[i];
          break;
        }
        c.gain[best] = 0.0f;  // leaves the code: never again this step
      }
    }
  }

 private:
  static constexpr float kInverseModulus = 1.0f / static_cast<float>(kModulus);
  static constexpr float kHalfOverScale = 0.5f / kInputScale;

  /// Improving roots of one descent step: code < 256 is ±2e_i ± 2e_j (i | j<<3 | neg_i<<6 |
  /// neg_j<<7), code ≥ 256 is (±1)^8 with minus signs where bit k of (code − 256) is set.
  struct RootCandidates {
    int32_t code[detail::kVoronoiMaxCandidates];
    float gain[detail::kVoronoiMaxCandidates];
    int count = 0;
    E8KV_HD void add(int32_t root_code, float root_gain) {
      if (count < detail::kVoronoiMaxCandidates) {
        code[count] = root_code;
        gain[count++] = root_gain;
        return;
      }
      int worst = 0;  // full: replace the smallest gain (never happens at the tuned scales)
      for (int k = 1; k < count; ++k) worst = gain[k] < gain[worst] ? k : worst;
      if (root_gain > gain[worst]) {
        code[worst] = root_code;
        gain[worst] = root_gain;
      }
    }
  };

  E8KV_HD static void root_from_code(int32_t code, int32_t root[8]) {
    if (code < 256) {
      for (int k = 0; k < 8; ++k) root[k] = 0;
      root[code & 7] = (code >> 6) & 1 ? -2 : 2;
      root[(code >> 3) & 7] = (code >> 7) & 1 ? -2 : 2;
      return;
    }
    for (int k = 0; k < 8; ++k) root[k] = ((code - 256) >> k) & 1 ? -1 : 1;
  }

  /// Roots ±2e_i ± 2e_j with gain ±2e2_i ± 2e2_j > 4. RN(|a| + |b|) > 2 is exactly the test that
  /// the best sign pattern of the pair improves, so pairs failing it are skipped.
  E8KV_HD static void collect_improving_integer_roots(const float e2[8], RootCandidates& c) {
    for (int i = 0; i < 8; ++i) {
      for (int j = i + 1; j < 8; ++j) {
        if (!(fabsf(e2[i]) + fabsf(e2[j]) > 2.0f)) continue;
        for (int signs = 0; signs < 4; ++signs) {
          const float ri = (signs & 1) ? -2.0f : 2.0f, rj = (signs & 2) ? -2.0f : 2.0f;
          const float g = fp::add(fp::mul(e2[i], ri), fp::mul(e2[j], rj));
          if (g > 4.0f) c.add(i | (j << 3) | ((signs & 1) << 6) | ((signs >> 1) << 7), g);
        }
      }
    }
  }

  /// Roots (±1)^8 (twice values) with an even number of minus signs and gain Σ ±e2_k > 4. The
  /// best pattern takes the signs of e2 (flipping the smallest |e2_k| if that makes an odd number
  /// of minus signs); every other pattern flips an even-sized set F of it at a cost Σ_F c_k, and
  /// a depth-first search over F in increasing cost stops as soon as the cost exceeds the slack.
  E8KV_HD static void collect_improving_half_roots(const float e2[8], RootCandidates& c) {
    float cost[8], total = 0.0f;
    int32_t negative_mask = 0, smallest = 0;
    for (int k = 0; k < 8; ++k) {
      const float a = fabsf(e2[k]);
      cost[k] = 2.0f * a;
      total += a;
      negative_mask |= (e2[k] < 0.0f ? 1 : 0) << k;
      smallest = a < fabsf(e2[smallest]) ? k : smallest;
    }
    float best = total;
    int odd = 0;
    for (int k = 0; k < 8; ++k) odd ^= (negative_mask >> k) & 1;
    if (odd) {  // flip the smallest coordinate: its flip now gains instead of costing
      negative_mask ^= 1 << smallest;
      best -= cost[smallest];
      cost[smallest] = -cost[smallest];
    }
    const float margin = 1e-5f * (1.0f + total);
    const float slack = best - 4.0f + margin;  // flips costing less than this may still improve
    if (!(slack > 0.0f)) return;
    int32_t order[8];
    for (int k = 0; k < 8; ++k) order[k] = k;
    for (int k = 1; k < 8; ++k) {  // by increasing cost
      const int32_t v = order[k];
      int m = k - 1;
      while (m >= 0 && cost[order[m]] > cost[v]) {
        order[m + 1] = order[m];
        --m;
      }
      order[m + 1] = v;
    }
    // Iterative depth-first search over flip sets; depth = |F|, next[d] = next position to try.
    int32_t next[9], flips[9];
    float spent[9];
    int depth = 0;
    next[0] = 0;
    flips[0] = 0;
    spent[0] = 0.0f;
    add_half_root_if_improving(e2, negative_mask, c);
    while (depth >= 0) {
      const int k = next[depth];
      if (k >= 8) {
        --depth;
        continue;
      }
      const float s = spent[depth] + cost[order[k]];
      if (!(s < slack)) {  // costs increase with k: no later sibling fits either
        --depth;
        continue;
      }
      next[depth] = k + 1;
      ++depth;
      spent[depth] = s;
      flips[depth] = flips[depth - 1] | (1 << order[k]);
      next[depth] = k + 1;
      if ((depth & 1) == 0) add_half_root_if_improving(e2, negative_mask ^ flips[depth], c);
    }
  }

  E8KV_HD static void add_half_root_if_improving(const float e2[8], int32_t negative_mask, RootCandidates& c) {
    float g = 0.0f;  // in index order, like a plain dot product with the root
    for (int k = 0; k < 8; ++k) g = fp::add(g, fp::mul(e2[k], (negative_mask >> k) & 1 ? -1.0f : 1.0f));
    if (g > 4.0f) c.add(256 + negative_mask, g);
  }
};

using Voronoi1 = Voronoi<1>;
using Voronoi2 = Voronoi<2>;
using Voronoi3 = Voronoi<3>;
using Voronoi4 = Voronoi<4>;

}  // namespace e8kv::codebook
