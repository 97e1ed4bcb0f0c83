// Voronoi codes' building blocks: E8's nearest point on float input (portable and SSE2, the
// same operations), root and facet helpers, the sign-flip enumeration. Included by
// codebook/voronoi.hpp, which describes the code.
#pragma once

#include <cmath>
#include <cstdint>

#include "e8kv/platform.hpp"
#include "e8kv/numeric/fp.hpp"

#if defined(__CUDACC__)
#define E8KV_VORONOI_NOINLINE __noinline__
#elif defined(__GNUC__) || defined(__clang__)
#define E8KV_VORONOI_NOINLINE __attribute__((noinline))
#else
#define E8KV_VORONOI_NOINLINE
#endif

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
inline constexpr int kVoronoiMaxFacets = 4;

E8KV_HD E8KV_FORCE_INLINE float max2(float a, float b) { return a > b ? a : b; }
E8KV_HD E8KV_FORCE_INLINE float min2(float a, float b) { return a < b ? a : b; }

/// fp::sanitize(x, kVoronoiInputLimit) written with selects (NaN → 0, clamp to ±limit).
E8KV_HD E8KV_FORCE_INLINE float clamp_voronoi_input(float x) {
  const float v = x == x ? x : 0.0f;
  return min2(max2(v, -kVoronoiInputLimit), kVoronoiInputLimit);
}

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

/// Nearest point of E8 as twice values, for finite |x| ≤ 2^20, in float/int32 without
/// data-dependent branches. Same tie rules as lattice::nearest_e8_twice<float> (round half to
/// even, first index wins, the integer coset wins a tie) and the same result whenever the coset
/// distances are exact (e.g. the decoder's dyadic input); see the top of the file. Used on the
/// device and as the reference of the SSE2 version.
E8KV_HD E8KV_FORCE_INLINE void nearest_e8_twice_portable(const float x[8], int32_t twice[8]) {
  float xh[8], ra[8], rb[8];
  for (int i = 0; i < 8; ++i) xh[i] = x[i] - 0.5f;
  nearest_d8_portable(x, ra);
  nearest_d8_portable(xh, rb);
  float sa[8], sb[8];
  for (int i = 0; i < 8; ++i) {
    const float ea = x[i] - ra[i];
    const float eb = x[i] - (rb[i] + 0.5f);
    sa[i] = fp::mul(ea, ea);
    sb[i] = fp::mul(eb, eb);
  }
  // Summed as ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)): the order of the SSE2 version.
  const float da = fp::add(fp::add(fp::add(sa[0], sa[4]), fp::add(sa[2], sa[6])),
                           fp::add(fp::add(sa[1], sa[5]), fp::add(sa[3], sa[7])));
  const float db = fp::add(fp::add(fp::add(sb[0], sb[4]), fp::add(sb[2], sb[6])),
                           fp::add(fp::add(sb[1], sb[5]), fp::add(sb[3], sb[7])));
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
  const float half_root = 0.5f * fp::add(sum, -fp::mul(2.0f * smallest, static_cast<float>(negative)));
  return max2(fp::add(largest, second), half_root);
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
  // The lane to move, or a lane number ≥ 8 (none) when the sum is even; no branch.
  const __m128i chosen = _mm_set1_epi32(lowest_set_bit(at_worst) | ((odd - 1) & 8));
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
  // Sums as ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)), both cosets at once (lanes 0/1 = a, 2/3 = b).
  const __m128 pa = _mm_add_ps(sal, sah), pb = _mm_add_ps(sbl, sbh);  // s_i + s_{i+4}
  const __m128 q = _mm_add_ps(_mm_movelh_ps(pa, pb), _mm_movehl_ps(pb, pa));  // (a02, a13, b02, b13)
  const float da = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 1, 1, 1))));
  const __m128 qb = _mm_movehl_ps(q, q);
  const float db = _mm_cvtss_f32(_mm_add_ss(qb, _mm_shuffle_ps(qb, qb, _MM_SHUFFLE(1, 1, 1, 1))));
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

E8KV_FORCE_INLINE float e8_root_gauge_sse2(__m128 pl, __m128 ph) {
  const __m128 sign = _mm_set1_ps(-0.0f), zero = _mm_setzero_ps();
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
  const float half_root = 0.5f * fp::add(sum, -fp::mul(2.0f * smallest, static_cast<float>(negative)));
  return max2(fp::add(largest, second), half_root);
}

E8KV_FORCE_INLINE float e8_root_gauge_sse2(const float p[8]) {
  return e8_root_gauge_sse2(_mm_loadu_ps(p), _mm_loadu_ps(p + 4));
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

/// s = clamp_voronoi_input(x)·scale for one block. The SSE2 version (x86 hosts) writes s with
/// vector stores, so the nearest-point step's vector loads of s are forwarded instead of stalling.
E8KV_HD E8KV_FORCE_INLINE void scale_block(const float x[8], float scale, float s[8]) {
#if E8KV_VORONOI_SSE2
  const __m128 limit = _mm_set1_ps(kVoronoiInputLimit), minus_limit = _mm_set1_ps(-kVoronoiInputLimit);
  const __m128 factor = _mm_set1_ps(scale);
  for (int h = 0; h < 8; h += 4) {
    const __m128 v = _mm_loadu_ps(x + h);
    const __m128 finite = _mm_and_ps(_mm_cmpord_ps(v, v), v);  // NaN → 0
    _mm_storeu_ps(s + h, _mm_mul_ps(_mm_min_ps(_mm_max_ps(finite, minus_limit), limit), factor));
  }
#else
  for (int i = 0; i < 8; ++i) s[i] = fp::mul(clamp_voronoi_input(x[i]), scale);
#endif
}

/// Tie-breaking offset a = (1,2,3,4,5,6,7,9)/64 of the code region qV + a.
E8KV_HD E8KV_FORCE_INLINE constexpr float voronoi_offset(int i) {
  return static_cast<float>(i == 7 ? 9 : i + 1) * (1.0f / 64.0f);
}

/// Input scale minimizing the MSE on i.i.d. N(0,1) input (golden-section search, 2·10^5 blocks;
/// the optimum moves by < 0.2 % with the encoder details, and changing a scale changes what stored
/// indices decode to, so these stay fixed).
constexpr float voronoi_input_scale(int k) {
  return k == 1 ? 0.685f : k == 2 ? 0.992f : k == 3 ? 1.778f : 3.246f;
}

/// Roots of E8 by code: 0..255 are ±e_i ± e_j (i < j) as i | j<<3 | neg_i<<6 | neg_j<<7, and
/// 256 + m are (±½)^8 with minus signs where bit k of m is set (m has even popcount).
E8KV_HD E8KV_FORCE_INLINE void root_twice_from_code(int32_t code, int32_t r[8]) {
  if (code < 256) {
    for (int k = 0; k < 8; ++k) r[k] = 0;
    r[code & 7] = (code >> 6) & 1 ? -2 : 2;
    r[(code >> 3) & 7] = (code >> 7) & 1 ? -2 : 2;
    return;
  }
  for (int k = 0; k < 8; ++k) r[k] = ((code - 256) >> k) & 1 ? -1 : 1;
}

/// Calls visit(code, value) for every root r with value = ⟨v, r⟩ > threshold, where the value is
/// computed as s_i·v_i + s_j·v_j (integer roots) or ½·Σ_k s_k·v_k in index order (half roots).
/// Integer roots: 28 pairs, skipped unless |v_i| + |v_j| (the best of the pair) passes.
/// Half roots: the best sign pattern takes the signs of v (flipping the smallest |v_k| when the
/// number of minus signs is odd); any other flips an even-sized set F of it and loses Σ_F c_k
/// (c_k = |v_k|, or −|v_k| for the coordinate already flipped). A depth-first search over F in
/// increasing cost stops once the loss exceeds the slack, so only near-best patterns are visited.
template <class Visit>
E8KV_HD inline void for_each_root_above(const float v[8], float threshold, Visit&& visit) {
  for (int i = 0; i < 8; ++i) {
    for (int j = i + 1; j < 8; ++j) {
      if (!(fp::add(fabsf(v[i]), fabsf(v[j])) > threshold)) continue;
      for (int signs = 0; signs < 4; ++signs) {
        const float value = fp::add((signs & 1) ? -v[i] : v[i], (signs & 2) ? -v[j] : v[j]);
        if (value > threshold) visit(i | (j << 3) | ((signs & 1) << 6) | ((signs >> 1) << 7), value);
      }
    }
  }
  float cost[8], total = 0.0f;
  int32_t negative_mask = 0, smallest = 0;
  for (int k = 0; k < 8; ++k) {
    cost[k] = fabsf(v[k]);
    total = fp::add(total, cost[k]);
    negative_mask |= (v[k] < 0.0f ? 1 : 0) << k;
    smallest = cost[k] < cost[smallest] ? k : smallest;
  }
  int32_t odd = 0;
  for (int k = 0; k < 8; ++k) odd ^= (negative_mask >> k) & 1;
  float best = 0.5f * total;
  if (odd) {
    negative_mask ^= 1 << smallest;
    best = fp::add(best, -cost[smallest]);
    cost[smallest] = -cost[smallest];
  }
  const float slack = fp::add(fp::add(best, -threshold), 1e-5f * (1.0f + total));
  if (!(slack > 0.0f)) return;
  int32_t order[8];
  for (int k = 0; k < 8; ++k) order[k] = k;
  for (int k = 1; k < 8; ++k) {  // by increasing cost
    const int32_t o = order[k];
    int m = k - 1;
    while (m >= 0 && cost[order[m]] > cost[o]) {
      order[m + 1] = order[m];
      --m;
    }
    order[m + 1] = o;
  }
  auto emit = [&](int32_t mask) {
    float sum = 0.0f;
    for (int k = 0; k < 8; ++k) sum = fp::add(sum, (mask >> k) & 1 ? -v[k] : v[k]);
    const float value = 0.5f * sum;
    if (value > threshold) visit(256 + mask, value);
  };
  emit(negative_mask);
  // Iterative search: depth = |F|, next[d] = next sorted position to try at depth d.
  int32_t next[9], flips[9];
  float spent[9];
  int depth = 0;
  next[0] = 0;
  flips[0] = 0;
  spent[0] = 0.0f;
  while (depth >= 0) {
    const int k = next[depth];
    if (k >= 8) {
      --depth;
      continue;
    }
    const float s = fp::add(spent[depth], cost[order[k]]);
    if (!(s < slack)) {  // costs increase with k: no later sibling fits either
      --depth;
      continue;
    }
    next[depth] = k + 1;
    ++depth;
    spent[depth] = s;
    flips[depth] = flips[depth - 1] | (1 << order[k]);
    next[depth] = k + 1;
    if ((depth & 1) == 0) emit(negative_mask ^ flips[depth]);
  }
}

}  // namespace detail

}  // namespace e8kv::codebook
