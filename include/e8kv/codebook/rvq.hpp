// Fast-tier 3- and 4-bit/element block codes: two-stage residual quantization of table codes
// (QuIP#'s RVQ scheme), decoded with two table lookups.
//
//   Rvq3 (24-bit index): stage 1 E8P on s1·x, stage 2 E81B (8 bits) on s2·(s1·x − c1).
//   Rvq4 (32-bit index): stage 1 E8P on s1·x, stage 2 E8P on s2·(s1·x − c1).
//   index = stage-1 index | stage-2 index << 16;  reconstruction x̂ = (c1 + c2/s2) / s1.
// Encoding is greedy stage-wise: each stage takes its exact nearest codeword (E8P's exact encoder,
// E81B's exact nearest point of its 256). Non-finite input: s1·x is sanitized like E8P's lattice input
// (NaN → 0, clamp to ±E8P::kMaxLatticeAbs) before both stages, so every input gives a valid index.
//
// Rvq4's index space is not canonical: decode(i) is defined for every 32-bit i, but the
// re-encoding of the decoded point is another index for 23 % of random indices and for 15 % of the
// encoder's own outputs (stage 1's nearest codeword to c1 + c2/s2 need not be c1; 200,000 each,
// std::mt19937_64 seed 2026; rvq_test pins the range). Nothing in e8kv compares, hashes or
// deduplicates block indices: codes are decoded, never matched.
// Scales, re-checked by grid searches (i.i.d. N(0,1) blocks, std::mt19937_64, per-element MSE):
//   Rvq3, 100,000 blocks, seed 77, s1 = 0.94..1.02 step 0.01 × s2 = 1.90..2.20 step 0.02:
//     optimum (0.98, 2.04) 0.02966, the research's values; (0.97, 2.04) 0.02969, (0.99, 2.04)
//     0.02968, (0.98, 2.00) 0.02970, (0.98, 2.08) 0.02968; grid corners 0.0300–0.0306.
//   Rvq4, 100,000 blocks, seed 77, s1 = 0.84..0.98 step 0.02 × s2 = 3.40..4.20 step 0.10, then
//     200,000 blocks, seed 78, s1 = 0.87..0.91 step 0.01 × s2 = 3.75..3.95 step 0.05: a flat
//     optimum, (0.89, 3.85) 0.00835 vs the research's (0.90, 3.80) 0.00836, kept; (1.03, 3.45)
//     gives 0.00964, (0.84, 3.80) 0.00865, (0.90, 3.40) 0.00891.
// E81B's dropped point: every ±2e_i is nearest for ≈ 0.11 % of Rvq3 residuals, and dropping any
// one of the 16 gives 0.029502–0.029507 (400,000 blocks, seed 91), so the choice is immaterial;
// −2e_7, the last in the enumeration order, is left out.
// Tables: E81B 1 KB (one host constexpr copy, one __constant__ copy per nvcc translation unit,
// and one in global memory for the warp-shared search).
// E81B's encoder is defined by its exhaustive search; a certified class search (sorting |r|, see
// e81b_detail) returns the same index without it for ≈ 99 % of residuals, the search decides the
// near-ties. The host runs the search column-wise (same float operations, same answer as the
// per-point loop); the paged GPU encoders share it across the warp, 8 points per lane
// (encode_with, detail/search_fallback.hpp). encode_batch runs both stages on 4 or 8 blocks at once on the host
// (vector instructions, AVX2 chosen at run time), with the same indices as encode.
// One core of the development machine (shared 2.3 GHz Xeon VM), elements/s: Rvq3 single blocks
// ≈ 30 M, batches ≈ 100 M; Rvq4 ≈ 20 M and ≈ 85 M (before: ≈ 11 M and ≈ 10 M).
#pragma once

#include <cstddef>
#include <cstdint>

#include "e8kv/codebook/e8p.hpp"
#include "e8kv/platform.hpp"
#include "e8kv/numeric/fp.hpp"

namespace e8kv::codebook {

namespace e81b_detail {

constexpr int kPointCount = 256;
constexpr float kMaxLatticeAbs = e8p_detail::kMaxLatticeAbs;

/// One table entry per point: coordinate i is the nibble (2·v_i + 4) at bits 4i..4i+3.
struct Tables {
  uint32_t point[kPointCount];
};

constexpr uint32_t pack_twice(const int twice[8]) {
  uint32_t word = 0;
  for (int i = 0; i < 8; ++i) word |= static_cast<uint32_t>(twice[i] + 4) << (4 * i);
  return word;
}

constexpr Tables build_tables() {
  Tables t{};
  int n = 0;
  int twice[8] = {};
  t.point[n++] = pack_twice(twice);  // the origin
  for (int i = 0; i < 8; ++i)        // the 112 roots ±e_i ± e_j
    for (int j = i + 1; j < 8; ++j)
      for (int signs = 0; signs < 4; ++signs) {
        for (int k = 0; k < 8; ++k) twice[k] = 0;
        twice[i] = (signs & 2) ? -2 : 2;
        twice[j] = (signs & 1) ? -2 : 2;
        t.point[n++] = pack_twice(twice);
      }
  for (int mask = 0; mask < 256; ++mask) {  // the 128 roots (±½)^8 with an even number of minus
    int minus = 0;
    for (int k = 0; k < 8; ++k) minus += (mask >> k) & 1;
    if (minus & 1) continue;
    for (int k = 0; k < 8; ++k) twice[k] = ((mask >> k) & 1) ? -1 : 1;
    t.point[n++] = pack_twice(twice);
  }
  for (int i = 0; i < 8; ++i)  // 15 of the 16 points ±2e_i: all but −2e_7
    for (int sign = 0; sign < 2; ++sign) {
      if (i == 7 && sign == 1) continue;
      for (int k = 0; k < 8; ++k) twice[k] = 0;
      twice[i] = sign ? -4 : 4;
      t.point[n++] = pack_twice(twice);
    }
  return t;
}

inline constexpr Tables kHostTables = build_tables();

#if defined(__CUDACC__)
static __constant__ Tables kDeviceTables = build_tables();
#endif

E8KV_HD E8KV_FORCE_INLINE const Tables& tables() {
#if E8KV_ON_DEVICE
  return kDeviceTables;
#else
  return kHostTables;
#endif
}


E8KV_HD E8KV_FORCE_INLINE float coordinate(uint32_t word, int i) {
  return static_cast<float>((word >> (4 * i)) & 15u) * 0.5f - 2.0f;
}

/// Exhaustive search, one point at a time (the device path; also runs on the host). Squared
/// distances are summed in index order, unfused; the first minimum wins.
E8KV_HD inline uint32_t search_generic(const float z[8]) {
  float best = 0.0f;
  uint32_t best_index = 0;
  for (uint32_t p = 0; p < static_cast<uint32_t>(kPointCount); ++p) {
    const uint32_t word = tables().point[p];
    float d2 = 0.0f;
    for (int i = 0; i < 8; ++i) {
      const float d = z[i] - coordinate(word, i);
      d2 = fp::add(d2, fp::mul(d, d));
    }
    if (p == 0 || d2 < best) {
      best = d2;
      best_index = p;
    }
  }
  return best_index;
}

#if defined(__CUDACC__)
/// The points once more, in global memory, for the warp-shared search's coalesced reads (as
/// e8p_detail::kDevicePatternRows).
static __device__ const Tables kDevicePointRows = build_tables();
#endif

/// Slice `slice` of `slices` of search_generic (search_fallback.hpp): the points ≡ slice (mod
/// slices), key −d² (exact), order = point.
E8KV_HD inline SearchCandidate search_slice(const float z[8], uint32_t slice, uint32_t slices) {
  SearchCandidate best{0.0f, kNoSearchCandidate};
#if E8KV_ON_DEVICE
#pragma unroll 1
#endif
  for (uint32_t p = slice; p < static_cast<uint32_t>(kPointCount); p += slices) {
#if E8KV_ON_DEVICE
    const uint32_t word = __ldg(&kDevicePointRows.point[p]);
#else
    const uint32_t word = kHostTables.point[p];
#endif
    float d2 = 0.0f;
    for (int i = 0; i < 8; ++i) {
      const float d = z[i] - coordinate(word, i);
      d2 = fp::add(d2, fp::mul(d, d));
    }
    // cost-report: search slice trip, 8 per lane (one point; the warp passes 32 slices)
    best = better_candidate(best, SearchCandidate{-d2, p});
  }
  return best;
}

/// Host copy of the points as float columns, so the distance loop vectorizes across points.
struct HostColumns {
  float coordinate[8][kPointCount];
};

constexpr HostColumns build_host_columns() {
  HostColumns c{};
  for (int p = 0; p < kPointCount; ++p)
    for (int i = 0; i < 8; ++i)
      c.coordinate[i][p] = static_cast<float>((kHostTables.point[p] >> (4 * i)) & 15u) * 0.5f - 2.0f;
  return c;
}

inline constexpr HostColumns kHostColumns = build_host_columns();

/// The same search as search_generic with the same float operations per point (same answer).
inline uint32_t search_host(const float z[8]) {
  float d2[kPointCount];
  for (int p = 0; p < kPointCount; ++p) {
    float acc = 0.0f;
    for (int i = 0; i < 8; ++i) {
      const float d = z[i] - kHostColumns.coordinate[i][p];
      acc = fp::add(acc, fp::mul(d, d));
    }
    d2[p] = acc;
  }
  // First minimum: a vectorizable tree reduction for the value, then a scan for its index.
  float tree[kPointCount / 2];
  for (int p = 0; p < kPointCount / 2; ++p) {
    const float a = d2[p], b = d2[p + kPointCount / 2];
    tree[p] = b < a ? b : a;
  }
  for (int n = kPointCount / 4; n >= 1; n /= 2)
    for (int p = 0; p < n; ++p) tree[p] = tree[p + n] < tree[p] ? tree[p + n] : tree[p];
  uint32_t p = 0;
  while (p + 1 < static_cast<uint32_t>(kPointCount) && d2[p] != tree[0]) ++p;
  return p;
}


// ---- the certified search ----------------------------------------------------------------------
//
// With a = |r| sorted descending (v1 ≥ ... ≥ v8) and p the parity of the number of negative r_i,
// the best point of each class and its key 2⟨r, c⟩ − ‖c‖² (= ‖r‖² − ‖r − c‖²) are, exactly:
//   origin                     0
//   roots ±e_i ± e_j           2(v1 + v2) − 2            (signs of r; others ≥ min(2(v2 − v3), 4·v2) worse)
//   roots (±½)^8, even minus   Σa − 2 − [p]·2·v8         (others ≥ 2(v7 − v8) resp. 2(v7 + v8) worse)
//   ±2e_i (not −2e_7)          4·v1 − 4, or 4·v2 − 4 when v1 is coordinate 7 with r_7 < 0
//                              (others at most 4·v2 − 4 resp. 4·v3 − 4).
// (The signs follow r: a zero counts as positive; the parity repair flips the smallest |r_i|.)
// As for E8P, the best class is accepted when it beats every other point by more than
// margin = 2^-13·(‖r‖² + Σ|r| + 4): a reference distance Σ(r_i − c_i)² ≤ ‖r‖² + 4Σ|r| + 4 is off
// by less than 11·2^-24 of that, the estimates by less than 20·2^-24·(Σ|r| + 1), so twice both
// errors stay below 2^-17·(‖r‖² + Σ|r| + 1). Then it is the unique nearest point, which the
// exhaustive search returns as well. Otherwise (near-ties, ≈ 0.5 % of Rvq3 residuals) the
// exhaustive search decides. Same answer on every route, host and device.

/// E81B's exhaustive search as the fallback policies take it (search_fallback.hpp).
struct Exhaustive {
  E8KV_HD static E8KV_FORCE_INLINE uint32_t search(const float z[8]) {
#if E8KV_ON_DEVICE
    return search_generic(z);
#else
    return search_host(z);
#endif
  }
  E8KV_HD static E8KV_FORCE_INLINE SearchCandidate slice(const float z[8], uint32_t slice, uint32_t slices) {
    return search_slice(z, slice, slices);
  }
  E8KV_HD static E8KV_FORCE_INLINE uint32_t index_of(const float*, const SearchCandidate& winner) { return winner.order; }
};

/// Index of the root ±e_i ± e_j (i < j) with the given signs.
E8KV_HD E8KV_FORCE_INLINE uint32_t pair_root_index(int i, int j, bool negative_i, bool negative_j) {
  const int pair = i * (15 - i) / 2 + (j - i - 1);  // rank of (i, j) among pairs in loop order
  return static_cast<uint32_t>(1 + 4 * pair + (negative_i ? 2 : 0) + (negative_j ? 1 : 0));
}

/// The certified search on the lanes of `O` (lanes.hpp: one block per lane), on sanitized r.
/// Returns the mask of the lanes whose nearest point is unique by more than the margin, and sets
/// index[k] for exactly those; the caller decides the other lanes.
template <class O>
E8KV_HD E8KV_FORCE_INLINE typename O::I certified_lanes(const typename O::F r[8], uint32_t index[O::kWidth]) {
  typedef typename O::F F;
  typedef typename O::I I;
  F a[8], v[8];
  const F zero = O::splat(0.0f), two = O::splat(2.0f), four = O::splat(4.0f);
  F norm = zero, magnitude_sum = zero;
  I odd = O::splat_int(0), negative = O::splat_int(0);
  for (int i = 0; i < 8; ++i) {
    a[i] = O::abs_value(r[i]);
    v[i] = a[i];
    norm = norm + r[i] * r[i];
    magnitude_sum = magnitude_sum + a[i];
    const I neg = O::lt(r[i], zero);
    odd = odd ^ neg;
    negative = negative | (neg & O::splat_int(1 << i));
  }
  lanes::sort_descending<O>(v);
  // Float error of every key (reference or estimate) stays below ~200·2^-24·(‖r‖² + Σ|r| + 4).
  const F margin = ((norm + magnitude_sum) + four) * O::splat(0x1.0p-13f);
  const I excluded = O::lt(r[7], zero) & O::ge(a[7], v[0]);  // the top point would be −2e_7
  // Classes: 0 origin, 1 integer roots, 2 half roots, 3 ±2e_i.
  F value[4], runner_up[4];
  value[0] = zero;
  runner_up[0] = O::splat(-3.0e38f);
  value[1] = two * (v[0] + v[1]) - two;
  runner_up[1] = value[1] - O::min_of(two * (v[1] - v[2]), four * v[1]);
  value[2] = (magnitude_sum - two) - O::select(odd, two * v[7], zero);
  runner_up[2] = value[2] - O::select(odd, two * (v[6] - v[7]), two * (v[6] + v[7]));
  value[3] = four * O::select(excluded, v[1], v[0]) - four;
  runner_up[3] = four * O::select(excluded, v[2], v[1]) - four;
  F best = value[0], best_runner_up = runner_up[0], others = O::splat(-3.0e38f);
  I cls = O::splat_int(0);
  for (int k = 1; k < 4; ++k) {
    const I better = O::gt(value[k], best);
    others = O::max_of(others, O::select(better, best, value[k]));
    best = O::max_of(best, value[k]);
    best_runner_up = O::select(better, runner_up[k], best_runner_up);
    cls = O::select(better, O::splat_int(k), cls);
  }
  const I certified = O::gt(best - O::max_of(others, best_runner_up), margin);
  if (O::kWidth == 1 && !O::any(certified)) return certified;  // W lanes: branch-free to the end
  // Every class's index; the winner's is picked per lane. Signs follow r (a zero counts as
  // positive): class 1 takes the two coordinates with a_i ≥ v2 (exactly two: v2 > v3); class 2
  // flips the smallest |r_i| (unique: v7 > v8) when the parity is odd; class 3 takes the largest
  // |r_j| (j ≠ 7 when excluded; unique by the certificate).
  const I none = O::splat_int(-1);
  I first = none, second = none, first_negative = O::splat_int(0), second_negative = O::splat_int(0);
  I smallest = O::splat_int(0), found_smallest = O::splat_int(0), top = O::splat_int(0), found_top = O::splat_int(0);
  for (int i = 0; i < 8; ++i) {
    const I lane_i = O::splat_int(i);
    const I neg = O::lt(r[i], zero);
    const I in_pair = O::ge(a[i], v[1]);
    const I is_first = in_pair & O::eq(first, none);
    const I is_second = in_pair & ~is_first & O::eq(second, none);
    first = O::select(is_first, lane_i, first);
    first_negative = O::select(is_first, neg, first_negative);
    second = O::select(is_second, lane_i, second);
    second_negative = O::select(is_second, neg, second_negative);
    const I is_smallest = O::le(a[i], v[7]) & ~found_smallest;
    smallest = O::select(is_smallest, lane_i, smallest);
    found_smallest = found_smallest | is_smallest;
    const I is_top = O::select(excluded, O::ge(a[i], v[1]) & O::splat_int(i == 7 ? 0 : -1), O::ge(a[i], v[0])) & ~found_top;
    top = O::select(is_top, lane_i, top);
    found_top = found_top | is_top;
  }
  I top_negative = O::splat_int(0);
  for (int i = 0; i < 8; ++i) top_negative = top_negative | (O::eq(top, O::splat_int(i)) & O::lt(r[i], zero));
  for (int k = 0; k < O::kWidth; ++k) {
    if (!O::lane(certified, k)) continue;
    switch (O::lane(cls, k)) {
      case 0: index[k] = 0; break;
      case 1:
        index[k] = pair_root_index(O::lane(first, k), O::lane(second, k), O::lane(first_negative, k) != 0,
                                   O::lane(second_negative, k) != 0);
        break;
      case 2: {
        uint32_t mask = static_cast<uint32_t>(O::lane(negative, k));
        if (O::lane(odd, k)) mask ^= 1u << O::lane(smallest, k);
        index[k] = 113u + (mask >> 1);
        break;
      }
      default:
        index[k] = static_cast<uint32_t>(241 + 2 * O::lane(top, k)) + (O::lane(top_negative, k) ? 1u : 0u);
        break;
    }
  }
  return certified;
}

/// The certified search on one sanitized r: true (and *index set) when the nearest point is
/// unique by more than the margin.
E8KV_HD inline bool certified_search(const float r[8], uint32_t* index) {
  return certified_lanes<lanes::Scalar>(r, index) != 0;
}

#if E8KV_HOST_VECTORS
namespace vec {

/// The certified search on W lanes (one block per lane), as e8p_detail::vec::Kernel.
template <int W>
struct Kernel {
  typedef lanes::Vector<W> O;

  static E8KV_FORCE_INLINE void encode(const float* x, float scale, uint32_t* index, int count = W) {
    typename O::F r[8];
    O::load_sanitized(x, scale, kMaxLatticeAbs, r);
    uint32_t certified_index[W];
    const typename O::I certified = certified_lanes<O>(r, certified_index);
    for (int k = 0; k < count; ++k) {
      if (O::lane(certified, k)) {
        index[k] = certified_index[k];
        continue;
      }
      float rk[8];
      for (int i = 0; i < 8; ++i) rk[i] = O::lane(r[i], k);
      index[k] = search_host(rk);
    }
  }
};

}  // namespace vec

/// E81B host batches: Batch::portable, Batch::avx2 (x86), Batch::host (run-time choice).
using Batch = e8p_detail::vec::BatchEncoder<vec::Kernel>;
#endif  // E8KV_HOST_VECTORS

/// index[b] = E81B index of sanitize(fl(scale·x[8b + i])) for b < count.
E8KV_HD inline void encode_batch(const float* x, float scale, size_t count, uint32_t* index) {
#if E8KV_HOST_VECTORS && !E8KV_ON_DEVICE
  Batch::host(x, scale, count, index);
#else
  for (size_t b = 0; b < count; ++b) {
    float r[8];
    for (int i = 0; i < 8; ++i) r[i] = fp::sanitize(fp::mul(x[8 * b + i], scale), kMaxLatticeAbs);
    uint32_t result = 0;
    if (!certified_search(r, &result)) result = Exhaustive::search(r);
    index[b] = result;
  }
#endif
}

}  // namespace e81b_detail

/// E81B: the 256 points of E8 with ‖v‖² ≤ 2 (origin + 240 roots) plus 15 of the 16 points ±2e_i
/// (‖v‖² = 4): −2e_7 is left out. The rate-8 second stage of Rvq3; usable alone.
/// Index order: 0 the origin; 1..112 ±e_i±e_j (i < j ascending, signs ++, +−, −+, −−);
/// 113..240 (±½)^8 with an even number of minus signs, ascending in the minus-sign mask (bit k:
/// coordinate k); 241..255 +2e_0, −2e_0, +2e_1, ..., +2e_7.
/// encode returns what the exhaustive search over the 256 points returns (squared distances
/// summed in index order, unfused; ties: smallest index), usually through the certified class
/// search. Input is sanitized like E8P (NaN → 0, clamp to ±kMaxLatticeAbs).
/// decode ignores bits above 7.
struct E81B {
  static constexpr const char* kName = "e81b";
  static constexpr int kIndexBits = 8;
  /// A stage code: it is used on residuals already in its own units, so no internal scale.
  static constexpr float kInputScale = 1.0f;
  static constexpr float kMaxLatticeAbs = E8P::kMaxLatticeAbs;

  E8KV_HD static uint32_t encode(const float x[8]) { return encode_lattice(x); }
  E8KV_HD static void decode(uint32_t index, float y[8]) { decode_lattice(index, y); }

  E8KV_HD static uint32_t encode_lattice(const float z[8]) { return encode_lattice_with(z, SerialFallback{}); }

  /// encode_lattice() with the exhaustive step done by `fallback` (search_fallback.hpp).
  template <class Fallback>
  E8KV_HD static uint32_t encode_lattice_with(const float z[8], const Fallback& fallback) {
    float zs[8];
    for (int i = 0; i < 8; ++i) zs[i] = fp::sanitize(z[i], kMaxLatticeAbs);
    uint32_t index = 0;
    const bool decided = e81b_detail::certified_search(zs, &index);
    return fallback.template resolve<e81b_detail::Exhaustive>(zs, decided, index);
  }

  /// encode() of `count` consecutive blocks (vectorized on the host; the same indices).
  E8KV_HD static void encode_batch(const float* x, size_t count, uint32_t* index) {
    e81b_detail::encode_batch(x, 1.0f, count, index);
  }
  E8KV_HD static void encode_lattice_batch(const float* z, size_t count, uint32_t* index) {
    e81b_detail::encode_batch(z, 1.0f, count, index);
  }

  /// The point of `index` (exact multiples of ½). Bits above 7 are ignored.
  E8KV_HD static void decode_lattice(uint32_t index, float z[8]) {
    const uint32_t word = e81b_detail::tables().point[index & 0xFFu];
    for (int i = 0; i < 8; ++i) z[i] = e81b_detail::coordinate(word, i);
  }
};

namespace rvq_detail {

/// Greedy two-stage encode: E8P on s1·x, then Second on s2·residual (each stage's near-ties
/// finished by `fallback`).
template <class Second, class Fallback = SerialFallback>
E8KV_HD inline uint32_t encode_two_stage(const float x[8], float s1, float s2, const Fallback& fallback = Fallback{}) {
  float z[8];
  for (int i = 0; i < 8; ++i) z[i] = fp::sanitize(fp::mul(x[i], s1), E8P::kMaxLatticeAbs);
  const uint32_t first = E8P::encode_lattice_with(z, fallback);
  float c[8], r[8];
  E8P::decode_lattice(first, c);
  for (int i = 0; i < 8; ++i) r[i] = fp::mul(fp::add(z[i], -c[i]), s2);
  return first | Second::encode_lattice_with(r, fallback) << 16;
}

/// encode_two_stage of `count` consecutive blocks, both stages batched (vectorized on the host).
template <class Second>
E8KV_HD inline void encode_two_stage_batch(const float* x, size_t count, float s1, float s2, uint32_t* index) {
  constexpr size_t kChunk = 64;
  float residual[8 * kChunk];
  uint32_t second[kChunk];
  for (size_t b = 0; b < count; b += kChunk) {
    const size_t n = count - b < kChunk ? count - b : kChunk;
    const float* xb = x + 8 * b;
    uint32_t* first = index + b;
    e8p_detail::encode_batch(xb, s1, n, first);  // = E8P::encode_lattice(sanitize(s1·x))
    for (size_t k = 0; k < n; ++k) {
      float c[8];
      E8P::decode_lattice(first[k], c);
      for (int i = 0; i < 8; ++i) {
        const float z = fp::sanitize(fp::mul(xb[8 * k + i], s1), E8P::kMaxLatticeAbs);
        residual[8 * k + i] = fp::mul(fp::add(z, -c[i]), s2);
      }
    }
    Second::encode_lattice_batch(residual, n, second);
    for (size_t k = 0; k < n; ++k) first[k] |= second[k] << 16;
  }
}

/// x̂ = (c1 + c2·(1/s2))·(1/s1), unfused.
template <class Second>
E8KV_HD inline void decode_two_stage(uint32_t index, float inverse_s1, float inverse_s2, float y[8]) {
  float c1[8], c2[8];
  E8P::decode_lattice(index & 0xFFFFu, c1);
  Second::decode_lattice(index >> 16, c2);
  for (int i = 0; i < 8; ++i) y[i] = fp::mul(fp::add(c1[i], fp::mul(c2[i], inverse_s2)), inverse_s1);
}

/// What a two-stage code does with its scales (Code::kInputScale s1, kResidualScale s2 and their
/// inverses) and its second stage: one definition for Rvq3 and Rvq4.
template <class Code, class Second>
struct TwoStageCode {
  E8KV_HD static uint32_t encode(const float x[8]) { return encode_with(x, SerialFallback{}); }
  /// encode() with the near-ties' exhaustive searches done by `fallback` (the same index).
  template <class Fallback>
  E8KV_HD static uint32_t encode_with(const float x[8], const Fallback& fallback) {
    return encode_two_stage<Second>(x, Code::kInputScale, Code::kResidualScale, fallback);
  }
  /// encode() of `count` consecutive blocks (vectorized on the host; the same indices).
  E8KV_HD static void encode_batch(const float* x, size_t count, uint32_t* index) {
    encode_two_stage_batch<Second>(x, count, Code::kInputScale, Code::kResidualScale, index);
  }
  E8KV_HD static void decode(uint32_t index, float y[8]) {
    decode_two_stage<Second>(index, Code::kInverseInputScale, Code::kInverseResidualScale, y);
  }
};

}  // namespace rvq_detail

/// 3 bits/element: E8P + E81B, 24-bit index (bits above 23 are ignored by decode).
struct Rvq3 : rvq_detail::TwoStageCode<Rvq3, E81B> {
  static constexpr const char* kName = "rvq3";
  static constexpr int kIndexBits = 24;
  static constexpr float kInputScale = 0.98f;     // s1
  static constexpr float kResidualScale = 2.04f;  // s2
  static constexpr float kInverseInputScale = 1.0f / kInputScale;
  static constexpr float kInverseResidualScale = 1.0f / kResidualScale;
};

/// 4 bits/element: E8P + E8P, 32-bit index.
struct Rvq4 : rvq_detail::TwoStageCode<Rvq4, E8P> {
  static constexpr const char* kName = "rvq4";
  static constexpr int kIndexBits = 32;
  static constexpr float kInputScale = 0.90f;     // s1
  static constexpr float kResidualScale = 3.80f;  // s2
  static constexpr float kInverseInputScale = 1.0f / kInputScale;
  static constexpr float kInverseResidualScale = 1.0f / kResidualScale;
};

}  // namespace e8kv::codebook
