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
// Encode: λ = Q_E8(s·x) (s = kInputScale). λ is a codeword iff (λ − a)/q lies in V, i.e.
// ⟨(λ − a)/q, r⟩ < 1 for the 240 roots (the Voronoi-relevant vectors of E8); this test is
// equivalent to decode(index(λ)) == λ and exact in float (all values are dyadic). If it holds, λ
// is the nearest codeword. Otherwise (overload: 28 % / 10 % / 3.7 % of N(0,1) blocks at K = 2/3/4)
// the input lies beyond a facet z of the code region, where the codewords form layers
// ⟨λ, z⟩ = const (cosets of E7):
//   1. project onto the last layer inside, take the nearest E8 point and step back into that
//      layer with the best of the 56 roots adjacent to z (closed form);
//   2. if that crossed a second facet (a corner): the same along the second facet, and the joint
//      projection onto both last layers; the closer codeword wins. For K ≤ 2 a greedy descent
//      over root moves follows unless a cheap certificate shows that no move can improve;
//   3. (K ≥ 3) deeper corners: joint projection onto the last layers of up to 4 facets;
//   4. last resort: shrink toward the centre a until Q_E8 lands on a codeword, then descend.
// Share of the overloads per step (N(0,1)): K = 2: 69 / 22 / – / 9 %; K = 3: 80 / 16 / 3 / 0.7 %;
// K = 4: 87 / 11 / 2 / 0.3 %. The descent costs time (K = 2 encodes at ~1/4 the speed of K = 4)
// but without it the K = 2 MSE rises by 0.2 %; for K ≥ 3 it would gain < 0.05 %.
// The encoder is approximate under overload but close to exact: on 4,000 / 6,000 / 10,000 blocks
// at K = 2 / 3 / 4 an exhaustive search found a closer codeword for 7 / 6 / 1 overloaded blocks,
// and the MSE was 0.04 % above the exhaustive optimum; re-measured on other samples of the same
// sizes (the reliability review) it was 0.05-0.10 % above, so read it as "about 0.1 % at most". K = 1 (83 % overload) works but is
// slow and worse than 1-bit scalar quantization. The result is always a codeword, so
// encode(decode(i)) == i for every index i.
//
// Non-finite input: NaN coordinates count as 0, ±Inf and |x| > 2^16 are clamped to ±2^16.
//
// Floating point: operations are in a fixed order, every product that feeds a sum is unfused
// (fp::mul / fp::add), and the x86 SSE2 paths compute the same operations as the portable code, so
// codes are identical on CPU and GPU. The coset distances in the nearest-point step are summed as a tree (not in index
// order as lattice::nearest_e8_twice does), so on arbitrary float input the two can pick different
// cosets when the distances differ only by rounding; both are nearest points up to rounding.
#pragma once

#include <cstdint>

#include "e8kv/codebook/detail/voronoi_nearest.hpp"
#include "e8kv/platform.hpp"

namespace e8kv::codebook {

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
#if E8KV_VORONOI_SSE2
    // The same operations as below, in registers.
    const __m128 half = _mm_set1_ps(0.5f), inverse = _mm_set1_ps(kInverseModulus);
    const __m128 offset_lo = _mm_setr_ps(detail::voronoi_offset(0), detail::voronoi_offset(1),
                                         detail::voronoi_offset(2), detail::voronoi_offset(3));
    const __m128 offset_hi = _mm_setr_ps(detail::voronoi_offset(4), detail::voronoi_offset(5),
                                         detail::voronoi_offset(6), detail::voronoi_offset(7));
    const __m128 tl = _mm_cvtepi32_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(twice)));
    const __m128 th = _mm_cvtepi32_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(twice + 4)));
    const __m128 pl = _mm_mul_ps(_mm_sub_ps(_mm_mul_ps(tl, half), offset_lo), inverse);
    const __m128 ph = _mm_mul_ps(_mm_sub_ps(_mm_mul_ps(th, half), offset_hi), inverse);
    return detail::e8_root_gauge_sse2(pl, ph) < 1.0f;
#else
    float p[8];
    for (int i = 0; i < 8; ++i)
      p[i] = fp::mul(fp::add(static_cast<float>(twice[i]) * 0.5f, -detail::voronoi_offset(i)), kInverseModulus);
    return detail::e8_root_gauge(p) < 1.0f;
#endif
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
    if (!is_codeword(twice)) overloaded_codeword(scaled, twice);
  }

  E8KV_HD static uint32_t encode(const float x[8]) {
    float s[8];
    detail::scale_block(x, kInputScale, s);
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

  /// The codeword for an overloaded input (its nearest E8 point is not a codeword). Kept out of
  /// line so the common path stays small.
  E8KV_HD E8KV_VORONOI_NOINLINE static void overloaded_codeword(const float scaled[8], int32_t twice[8]) {
    // 1: the last layer along the facet the input lies beyond.
    float p[8];
    for (int i = 0; i < 8; ++i) p[i] = fp::mul(fp::add(scaled[i], -detail::voronoi_offset(i)), kInverseModulus);
    int32_t facet1[8], facet2[8];
    facet_root(p, facet1);
    if (last_layer_candidate(scaled, facet1, twice)) return;
    // 2: near a corner that candidate crossed a second facet: the last layer along it, and the
    // last layers of both; the closer codeword of the two.
    next_facet(twice, facet2);
    int32_t along[8], corner[8];
    for (int i = 0; i < 8; ++i) corner[i] = twice[i];  // defined even if corner_candidate bails out
    const bool along_ok = last_layer_candidate(scaled, facet2, along);
    const bool corner_ok = corner_candidate(scaled, facet1, facet2, corner);
    if (along_ok || corner_ok) {
      const bool take_corner = corner_ok && (!along_ok || squared_error(scaled, corner) < squared_error(scaled, along));
      for (int i = 0; i < 8; ++i) twice[i] = take_corner ? corner[i] : along[i];
      // For K ≥ 3 a descent here would gain < 0.05 % MSE at a large cost; for K ≤ 2 it gains
      // 0.2 % (and with it the encoder is within 0.03 % of exhaustive search).
      if (K >= 3 || no_improving_move(scaled, twice, facet1, facet2)) return;
      descend(scaled, twice);
      return;
    }
    if (K >= 3) {
      // 3 (K ≥ 3): deeper corners. Add the facet the last corner candidate crossed and project
      // onto all the last layers at once, up to kVoronoiMaxFacets facets.
      int32_t facets[detail::kVoronoiMaxFacets][8];
      for (int i = 0; i < 8; ++i) {
        facets[0][i] = facet1[i];
        facets[1][i] = facet2[i];
      }
      for (int count = 3; count <= detail::kVoronoiMaxFacets; ++count) {
        next_facet(corner, facets[count - 1]);
        if (many_facet_candidate(scaled, facets, count, corner)) {
          for (int i = 0; i < 8; ++i) twice[i] = corner[i];
          return;
        }
      }
    }
    shrink_into_code(scaled, twice);  // last resort
    descend(scaled, twice);
  }

  /// The facet root that the E8 point `twice` lies farthest beyond.
  E8KV_HD static void next_facet(const int32_t twice[8], int32_t facet[8]) {
    float p[8];
    for (int i = 0; i < 8; ++i)
      p[i] = fp::mul(fp::add(static_cast<float>(twice[i]) * 0.5f, -detail::voronoi_offset(i)), kInverseModulus);
    facet_root(p, facet);
  }

  /// corner_candidate for `count` facet roots (≤ kVoronoiMaxFacets): project x onto all their
  /// last layers (Gram system, Gauss–Jordan with partial pivoting), take the nearest E8 point and
  /// step back along every facet it is beyond. Returns whether the candidate is a codeword.
  E8KV_HD static bool many_facet_candidate(const float x[8], const int32_t (*z)[8], int count, int32_t twice[8]) {
    float gram[detail::kVoronoiMaxFacets][detail::kVoronoiMaxFacets + 1];
    int32_t m[detail::kVoronoiMaxFacets];
    for (int a = 0; a < count; ++a) {
      m[a] = last_layer(z[a]);
      for (int b = 0; b < count; ++b) {
        int32_t d4 = 0;
        for (int i = 0; i < 8; ++i) d4 += z[a][i] * z[b][i];
        gram[a][b] = static_cast<float>(d4 / 4);  // ⟨z_a, z_b⟩ ∈ {−2, −1, 0, 1, 2}
      }
      gram[a][count] = fp::add(half_dot(x, z[a]), -static_cast<float>(m[a]));
    }
    for (int c = 0; c < count; ++c) {
      int pivot = c;
      for (int r = c + 1; r < count; ++r) pivot = fabsf(gram[r][c]) > fabsf(gram[pivot][c]) ? r : pivot;
      if (!(fabsf(gram[pivot][c]) > 1e-3f)) return false;  // dependent facets
      for (int k = 0; k <= count; ++k) {
        const float tmp = gram[c][k];
        gram[c][k] = gram[pivot][k];
        gram[pivot][k] = tmp;
      }
      for (int r = 0; r < count; ++r) {
        if (r == c) continue;
        const float f = gram[r][c] / gram[c][c];
        for (int k = c; k <= count; ++k) gram[r][k] = fp::add(gram[r][k], -fp::mul(f, gram[c][k]));
      }
    }
    float y[8];
    for (int i = 0; i < 8; ++i) y[i] = x[i];
    for (int a = 0; a < count; ++a) {
      const float coefficient = gram[a][count] / gram[a][a];
      for (int i = 0; i < 8; ++i) y[i] = fp::add(y[i], -fp::mul(coefficient, 0.5f * static_cast<float>(z[a][i])));
    }
    detail::nearest_e8_twice_fast(y, twice);
    for (int round = 0; round < 2 * detail::kVoronoiMaxFacets; ++round) {
      bool moved = false;
      for (int a = 0; a < count; ++a) {
        int32_t layer4 = 0;
        for (int i = 0; i < 8; ++i) layer4 += twice[i] * z[a][i];
        if (layer4 / 4 <= m[a]) continue;
        float u[8];
        for (int i = 0; i < 8; ++i) u[i] = fp::add(y[i], -0.5f * static_cast<float>(twice[i]));
        int32_t r[8];
        min_adjacent_root(z[a], u, r);
        for (int i = 0; i < 8; ++i) twice[i] -= r[i];
        moved = true;
      }
      if (!moved) break;
    }
    return is_codeword(twice);
  }

  /// A cheap proof that descend() would not move λ: every root r keeping λ a codeword has
  /// ⟨r, t⟩ ≤ 0 for the tight facet roots t (⟨λ − a, t⟩ > q − 1, see descend). If e = x − λ =
  /// Σ c_t t + e⊥ with c_t ≥ 0 and e⊥ orthogonal to those t, then ⟨e, r⟩ ≤ ⟨e⊥, r⟩ ≤ √2‖e⊥‖, so
  /// no such root improves (needs ⟨e, r⟩ > 1) when 2‖e⊥‖² < 1. Tries {z1, z2}, {z1}, {z2}, {}.
  E8KV_HD static bool no_improving_move(const float x[8], const int32_t twice[8], const int32_t z1[8],
                                        const int32_t z2[8]) {
    float e[8], w[8];
    for (int i = 0; i < 8; ++i) {
      e[i] = fp::add(x[i], -0.5f * static_cast<float>(twice[i]));
      w[i] = fp::add(0.5f * static_cast<float>(twice[i]), -detail::voronoi_offset(i));
    }
    const float limit = 0.5f - 1e-4f;  // ‖e⊥‖² bound, with room for rounding
    const bool tight1 = half_dot(w, z1) > static_cast<float>(kModulus - 1);
    const bool tight2 = half_dot(w, z2) > static_cast<float>(kModulus - 1);
    const float e1 = half_dot(e, z1), e2 = half_dot(e, z2), ee = dot(e, e);
    int32_t g4 = 0;
    for (int i = 0; i < 8; ++i) g4 += z1[i] * z2[i];
    const float g = static_cast<float>(g4) * 0.25f;
    if (tight1 && tight2 && g4 != 8 && g4 != -8) {
      // Least squares on span{z1, z2}: [2 g; g 2]·c = (e1, e2); ‖e⊥‖² = ‖e‖² − c·(e1, e2).
      const float det = fp::add(4.0f, -fp::mul(g, g));
      const float c1 = fp::add(2.0f * e1, -fp::mul(g, e2)) / det, c2 = fp::add(2.0f * e2, -fp::mul(g, e1)) / det;
      if (c1 >= 0.0f && c2 >= 0.0f && fp::add(ee, -fp::add(fp::mul(c1, e1), fp::mul(c2, e2))) < limit) return true;
    }
    if (tight1 && e1 >= 0.0f && fp::add(ee, -0.5f * fp::mul(e1, e1)) < limit) return true;
    if (tight2 && e2 >= 0.0f && fp::add(ee, -0.5f * fp::mul(e2, e2)) < limit) return true;
    return ee < limit;
  }

  /// The root z (twice values) maximizing ⟨p, z⟩: the facet of V that p is farthest beyond.
  /// Integer root: the two largest |p_i| (first index wins ties) with the signs of p; half root:
  /// the signs of p, flipping the smallest |p_i| when the number of minus signs is odd. The
  /// integer root wins a tie between the two. Selects instead of branches (random data).
  E8KV_HD static void facet_root(const float p[8], int32_t z[8]) {
    float a[8];
    for (int i = 0; i < 8; ++i) a[i] = fabsf(p[i]);
    int32_t first, second, smallest;
    top2(a, first, second);
    argmin(a, smallest);
    float sum = 0.0f;
    int32_t negative = 0;
    for (int i = 0; i < 8; ++i) {
      sum = fp::add(sum, a[i]);
      negative ^= p[i] < 0.0f ? 1 : 0;
    }
    const float integer_value = fp::add(a[first], a[second]);
    const float half_value = 0.5f * fp::add(sum, negative ? -2.0f * a[smallest] : 0.0f);
    const bool half = half_value > integer_value;
    for (int i = 0; i < 8; ++i) {
      const int32_t sign = p[i] < 0.0f ? -1 : 1;
      const int32_t integer_root = (i == first || i == second) ? 2 * sign : 0;
      const int32_t half_root = (negative && i == smallest) ? -sign : sign;
      z[i] = half ? half_root : integer_root;
    }
  }

  /// Indices of the largest and second largest of v (first index wins ties), with selects.
  E8KV_HD static void top2(const float v[8], int32_t& first, int32_t& second) {
    const bool swap = v[1] > v[0];
    first = swap ? 1 : 0;
    second = swap ? 0 : 1;
    float v1 = swap ? v[1] : v[0], v2 = swap ? v[0] : v[1];
    for (int i = 2; i < 8; ++i) {
      const bool over1 = v[i] > v1, over2 = v[i] > v2;
      second = over1 ? first : (over2 ? i : second);
      v2 = over1 ? v1 : (over2 ? v[i] : v2);
      first = over1 ? i : first;
      v1 = over1 ? v[i] : v1;
    }
  }

  /// Index of the smallest of v (first index wins ties), with selects.
  E8KV_HD static void argmin(const float v[8], int32_t& smallest) {
    smallest = 0;
    float best = v[0];
    for (int i = 1; i < 8; ++i) {
      const bool under = v[i] < best;
      smallest = under ? i : smallest;
      best = under ? v[i] : best;
    }
  }

  /// The root r (twice values) with ⟨r, z⟩ = 1 that minimizes ⟨u, r⟩, for a root z (twice values).
  /// These 56 roots move a point one layer along z; the minimum has a closed form per root type.
  E8KV_HD static void min_adjacent_root(const int32_t z[8], const float u[8], int32_t r[8]) {
    if (z[0] & 1) {
      // z = ½s: the integer roots s_i e_i + s_j e_j give w_i + w_j (w = s∘u), the half roots
      // ½s with s_i, s_j flipped give ½Σw − w_i − w_j: the two smallest or two largest w.
      float w[8], neg_w[8], total = 0.0f;
      for (int k = 0; k < 8; ++k) {
        w[k] = z[k] < 0 ? -u[k] : u[k];
        neg_w[k] = -w[k];
        total = fp::add(total, w[k]);
      }
      int32_t lo1, lo2, hi1, hi2;
      top2(neg_w, lo1, lo2);
      top2(w, hi1, hi2);
      const float integer_value = fp::add(w[lo1], w[lo2]);
      const float half_value = fp::add(0.5f * total, -fp::add(w[hi1], w[hi2]));
      const bool half = half_value < integer_value;
      for (int k = 0; k < 8; ++k) {
        const int32_t integer_root = (k == lo1 || k == lo2) ? 2 * z[k] : 0;
        const int32_t half_root = (k == hi1 || k == hi2) ? -z[k] : z[k];
        r[k] = half ? half_root : integer_root;
      }
      return;
    }
    // z = σ_i e_i + σ_j e_j: the integer roots σ_i e_i ± e_k and σ_j e_j ± e_k (k ≠ i, j) give
    // σ_i u_i − |u_k| at best (largest |u_k|); the half roots with t_i = σ_i, t_j = σ_j give
    // ½(σ_i u_i + σ_j u_j − Σ_k |u_k|), plus |u_m| (smallest) when the sign count is odd.
    int32_t i = -1, j = -1;  // the two nonzero positions, i < j
    for (int k = 0; k < 8; ++k) {
      const bool nonzero = z[k] != 0;
      j = (nonzero && i >= 0) ? k : j;
      i = (nonzero && i < 0) ? k : i;
    }
    const float ui = z[i] < 0 ? -u[i] : u[i], uj = z[j] < 0 ? -u[j] : u[j];
    float a[8], rest = 0.0f;
    int32_t minus = (z[i] < 0 ? 1 : 0) + (z[j] < 0 ? 1 : 0);
    for (int k = 0; k < 8; ++k) {
      const bool other = k != i && k != j;
      a[k] = fabsf(u[k]);
      rest = fp::add(rest, other ? a[k] : 0.0f);
      minus += (other && u[k] > 0.0f) ? 1 : 0;
    }
    float for_max[8], for_min[8];
    for (int k = 0; k < 8; ++k) {
      const bool other = k != i && k != j;
      for_max[k] = other ? a[k] : -1.0f;
      for_min[k] = other ? a[k] : INFINITY;
    }
    int32_t largest, unused, smallest;
    top2(for_max, largest, unused);
    argmin(for_min, smallest);
    const float via_i = fp::add(ui, -a[largest]), via_j = fp::add(uj, -a[largest]);
    const float half_value = fp::add(0.5f * fp::add(fp::add(ui, uj), -rest), (minus & 1) ? a[smallest] : 0.0f);
    const int choice = (!(via_j < via_i) && !(half_value < via_i)) ? 0 : (!(half_value < via_j) ? 1 : 2);
    for (int k = 0; k < 8; ++k) {
      const int32_t away = u[k] > 0.0f ? -1 : 1;  // the sign that lowers ⟨u, r⟩
      const int32_t pair_root = (k == (choice == 0 ? i : j)) ? z[k] : (k == largest ? 2 * away : 0);
      const int32_t half_root = (k == i || k == j) ? z[k] / 2 : ((minus & 1) && k == smallest ? -away : away);
      r[k] = choice == 2 ? half_root : pair_root;
    }
  }

  /// Candidate in the last layer of the code along the facet root z: E8 ∩ {⟨λ, z⟩ = m} with m the
  /// largest layer inside (q, or q − 1 when ⟨a, z⟩ < 0) is a coset of E7. Project x onto that
  /// hyperplane, take the nearest E8 point (at most one layer off), and step back into the layer
  /// by the best of the 56 roots r with ⟨r, z⟩ = 1. Returns whether the candidate is a codeword.
  E8KV_HD static bool last_layer_candidate(const float x[8], const int32_t z[8], int32_t twice[8]) {
    const int32_t m = last_layer(z);
    // y = x − ((⟨x, z⟩ − m)/‖z‖²)·z with ‖z‖² = 2 and z = twice/2.
    const float t = fp::mul(fp::add(half_dot(x, z), -static_cast<float>(m)), 0.25f);
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

  /// Last resort: shrink `scaled` toward the centre a of the code region along a + c·(x − a),
  /// from the boundary c = 1/gauge down by kVoronoiShrinkFactor until Q_E8 lands on a codeword
  /// (c → 0 reaches a, whose nearest point, the origin, is a codeword).
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
      c *= detail::kVoronoiShrinkFactor;
    }
    for (int i = 0; i < 8; ++i) twice[i] = 0;  // the origin is always a codeword
  }

  /// Two-facet version of last_layer_candidate: project x onto the last layers of both facet
  /// roots, take the nearest E8 point and step back along either facet it is beyond.
  E8KV_HD static bool corner_candidate(const float x[8], const int32_t z1[8], const int32_t z2[8],
                                       int32_t twice[8]) {
    int32_t g4 = 0;  // 4⟨z1, z2⟩
    for (int i = 0; i < 8; ++i) g4 += z1[i] * z2[i];
    if (g4 == 8 || g4 == -8) return false;  // the same facet (or opposite): nothing to add
    const float g = static_cast<float>(g4 / 4);
    const int32_t m1 = last_layer(z1), m2 = last_layer(z2);
    const float r1 = fp::add(half_dot(x, z1), -static_cast<float>(m1));
    const float r2 = fp::add(half_dot(x, z2), -static_cast<float>(m2));
    // y = x − α z1 − β z2 with ⟨y, z1⟩ = m1, ⟨y, z2⟩ = m2: [2 g; g 2]·(α, β) = (r1, r2).
    const float det = fp::add(4.0f, -fp::mul(g, g));
    const float alpha = fp::add(2.0f * r1, -fp::mul(g, r2)) / det;
    const float beta = fp::add(2.0f * r2, -fp::mul(g, r1)) / det;
    float y[8];
    for (int i = 0; i < 8; ++i)
      y[i] = fp::add(fp::add(x[i], -fp::mul(alpha, 0.5f * static_cast<float>(z1[i]))),
                     -fp::mul(beta, 0.5f * static_cast<float>(z2[i])));
    detail::nearest_e8_twice_fast(y, twice);
    for (int round = 0; round < 4; ++round) {
      bool moved = false;
      for (int f = 0; f < 2; ++f) {
        const int32_t* z = f ? z2 : z1;
        int32_t layer4 = 0;
        for (int i = 0; i < 8; ++i) layer4 += twice[i] * z[i];
        if (layer4 / 4 <= (f ? m2 : m1)) continue;
        float u[8];
        for (int i = 0; i < 8; ++i) u[i] = fp::add(y[i], -0.5f * static_cast<float>(twice[i]));
        int32_t r[8];
        min_adjacent_root(z, u, r);
        for (int i = 0; i < 8; ++i) twice[i] -= r[i];
        moved = true;
      }
      if (!moved) break;
    }
    return is_codeword(twice);
  }

  /// Greedy descent: moving by a root r changes ‖x − λ‖² by 2 − 2⟨x − λ, r⟩, so the improving
  /// roots are those with ⟨e, r⟩ > 1 (e = x − λ). Each step moves to the largest-gain improving
  /// root that keeps λ a codeword, until there is none (at most kVoronoiMaxDescentSteps).
  /// Validity without a full test per root: with w = λ − a and h(r) = ⟨w, r⟩ (never an integer,
  /// < q for all roots since λ is a codeword), λ + r is a codeword iff h(r) < q − 2 and
  /// ⟨r, t⟩ ≤ 0 for every "tight" root t with h(t) > q − 1 (⟨r, t⟩ is an integer in [−2, 2]).
  E8KV_HD static void descend(const float scaled[8], int32_t twice[8]) {
    constexpr int kMaxTight = 32;
    for (int step = 0; step < detail::kVoronoiMaxDescentSteps; ++step) {
      float e[8], w[8];
      for (int i = 0; i < 8; ++i) {
        e[i] = fp::add(scaled[i], -0.5f * static_cast<float>(twice[i]));
        w[i] = fp::add(0.5f * static_cast<float>(twice[i]), -detail::voronoi_offset(i));  // exact
      }
      int32_t tight[kMaxTight][8];
      int tight_count = 0;
      detail::for_each_root_above(w, static_cast<float>(kModulus - 1), [&](int32_t code, float) {
        if (tight_count < kMaxTight) detail::root_twice_from_code(code, tight[tight_count]);
        ++tight_count;
      });
      int32_t best_code = -1;
      float best_gain = 1.0f;
      detail::for_each_root_above(e, 1.0f, [&](int32_t code, float gain) {
        if (!(gain > best_gain)) return;
        int32_t r[8];
        detail::root_twice_from_code(code, r);
        bool valid;
        if (tight_count > kMaxTight) {  // deep in a vertex: test the moved point directly
          int32_t moved[8];
          for (int i = 0; i < 8; ++i) moved[i] = twice[i] + r[i];
          valid = is_codeword(moved);
        } else {
          valid = half_dot(w, r) < static_cast<float>(kModulus - 2);
          for (int t = 0; t < tight_count && valid; ++t) {
            int32_t d = 0;
            for (int i = 0; i < 8; ++i) d += r[i] * tight[t][i];
            valid = d <= 0;
          }
        }
        if (valid) {
          best_gain = gain;
          best_code = code;
        }
      });
      if (best_code < 0) return;
      int32_t r[8];
      detail::root_twice_from_code(best_code, r);
      for (int i = 0; i < 8; ++i) twice[i] += r[i];
    }
  }

 private:
  static constexpr float kInverseModulus = 1.0f / static_cast<float>(kModulus);
  static constexpr float kHalfOverScale = 0.5f / kInputScale;

  E8KV_HD static float dot(const float a[8], const float b[8]) {
    float s = 0.0f;
    for (int i = 0; i < 8; ++i) s = fp::add(s, fp::mul(a[i], b[i]));
    return s;
  }

  /// ⟨v, z⟩ for z given as twice values.
  E8KV_HD static float half_dot(const float v[8], const int32_t z[8]) {
    float s = 0.0f;
    for (int i = 0; i < 8; ++i) s = fp::add(s, fp::mul(v[i], static_cast<float>(z[i])));
    return 0.5f * s;
  }

  /// The largest m with ⟨λ − a, z⟩ < q for λ in the layer ⟨λ, z⟩ = m: q, or q − 1 when ⟨a, z⟩ < 0.
  E8KV_HD static int32_t last_layer(const int32_t z[8]) {
    float az = 0.0f;
    for (int i = 0; i < 8; ++i) az = fp::add(az, fp::mul(detail::voronoi_offset(i), static_cast<float>(z[i])));
    return az > 0.0f ? kModulus : kModulus - 1;
  }

  E8KV_HD static float squared_error(const float x[8], const int32_t twice[8]) {
    float s = 0.0f;
    for (int i = 0; i < 8; ++i) {
      const float d = fp::add(x[i], -0.5f * static_cast<float>(twice[i]));
      s = fp::add(s, fp::mul(d, d));
    }
    return s;
  }
};

using Voronoi1 = Voronoi<1>;
using Voronoi2 = Voronoi<2>;
using Voronoi3 = Voronoi<3>;
using Voronoi4 = Voronoi<4>;

}  // namespace e8kv::codebook
