// Fast-tier 3- and 4-bit/element block codes: two-stage residual quantization of table codes
// (QuIP#'s RVQ scheme), decoded with two table lookups.
//
//   Rvq3 (24-bit index): stage 1 E8P on s1·x, stage 2 E81B (8 bits) on s2·(s1·x − c1).
//   Rvq4 (32-bit index): stage 1 E8P on s1·x, stage 2 E8P on s2·(s1·x − c1).
//   index = stage-1 index | stage-2 index << 16;  reconstruction x̂ = (c1 + c2/s2) / s1.
// Encoding is greedy stage-wise: each stage takes its exact nearest codeword (E8P's exact encoder,
// E81B's exhaustive 256-point search). Non-finite input: s1·x is sanitized like E8P's lattice input
// (NaN → 0, clamp to ±E8P::kMaxLatticeAbs) before both stages, so every input gives a valid index.
//
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
// Tables: E81B 1 KB (one host constexpr copy, one __constant__ copy per nvcc translation unit);
// the host runs E81B's exhaustive search column-wise (same float operations, same answer as the
// per-point device loop), so it vectorizes.
#pragma once

#include <cstdint>

#include "e8kv/codebook/e8p.hpp"
#include "e8kv/config.hpp"
#include "e8kv/numeric/fp.hpp"

namespace e8kv::codebook {

namespace e81b_detail {

constexpr int kPointCount = 256;

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

}  // namespace e81b_detail

/// E81B: the 256 points of E8 with ‖v‖² ≤ 2 (origin + 240 roots) plus 15 of the 16 points ±2e_i
/// (‖v‖² = 4): −2e_7 is left out. The rate-8 second stage of Rvq3; usable alone.
/// Index order: 0 the origin; 1..112 ±e_i±e_j (i < j ascending, signs ++, +−, −+, −−);
/// 113..240 (±½)^8 with an even number of minus signs, ascending in the minus-sign mask (bit k:
/// coordinate k); 241..255 +2e_0, −2e_0, +2e_1, ..., +2e_7.
/// encode is exhaustive over the 256 points (squared distances summed in index order, unfused;
/// ties: smallest index). Input is sanitized like E8P (NaN → 0, clamp to ±kMaxLatticeAbs).
/// decode ignores bits above 7.
struct E81B {
  static constexpr const char* kName = "e81b";
  static constexpr int kIndexBits = 8;
  /// A stage code: it is used on residuals already in its own units, so no internal scale.
  static constexpr float kInputScale = 1.0f;
  static constexpr float kMaxLatticeAbs = E8P::kMaxLatticeAbs;

  E8KV_HD static uint32_t encode(const float x[8]) { return encode_lattice(x); }
  E8KV_HD static void decode(uint32_t index, float y[8]) { decode_lattice(index, y); }

  E8KV_HD static uint32_t encode_lattice(const float z[8]) {
    float zs[8];
    for (int i = 0; i < 8; ++i) zs[i] = fp::sanitize(z[i], kMaxLatticeAbs);
#if E8KV_ON_DEVICE
    return e81b_detail::search_generic(zs);
#else
    return e81b_detail::search_host(zs);
#endif
  }

  /// The point of `index` (exact multiples of ½). Bits above 7 are ignored.
  E8KV_HD static void decode_lattice(uint32_t index, float z[8]) {
    const uint32_t word = e81b_detail::tables().point[index & 0xFFu];
    for (int i = 0; i < 8; ++i) z[i] = e81b_detail::coordinate(word, i);
  }
};

namespace rvq_detail {

/// Greedy two-stage encode: E8P on s1·x, then Second on s2·residual.
template <class Second>
E8KV_HD inline uint32_t encode_two_stage(const float x[8], float s1, float s2) {
  float z[8];
  for (int i = 0; i < 8; ++i) z[i] = fp::sanitize(fp::mul(x[i], s1), E8P::kMaxLatticeAbs);
  const uint32_t first = E8P::encode_lattice(z);
  float c[8], r[8];
  E8P::decode_lattice(first, c);
  for (int i = 0; i < 8; ++i) r[i] = fp::mul(fp::add(z[i], -c[i]), s2);
  return first | Second::encode_lattice(r) << 16;
}

/// x̂ = (c1 + c2·(1/s2))·(1/s1), unfused.
template <class Second>
E8KV_HD inline void decode_two_stage(uint32_t index, float inverse_s1, float inverse_s2, float y[8]) {
  float c1[8], c2[8];
  E8P::decode_lattice(index & 0xFFFFu, c1);
  Second::decode_lattice(index >> 16, c2);
  for (int i = 0; i < 8; ++i) y[i] = fp::mul(fp::add(c1[i], fp::mul(c2[i], inverse_s2)), inverse_s1);
}

}  // namespace rvq_detail

/// 3 bits/element: E8P + E81B, 24-bit index (bits above 23 are ignored by decode).
struct Rvq3 {
  static constexpr const char* kName = "rvq3";
  static constexpr int kIndexBits = 24;
  static constexpr float kInputScale = 0.98f;     // s1
  static constexpr float kResidualScale = 2.04f;  // s2
  static constexpr float kInverseInputScale = 1.0f / kInputScale;
  static constexpr float kInverseResidualScale = 1.0f / kResidualScale;

  E8KV_HD static uint32_t encode(const float x[8]) {
    return rvq_detail::encode_two_stage<E81B>(x, kInputScale, kResidualScale);
  }
  E8KV_HD static void decode(uint32_t index, float y[8]) {
    rvq_detail::decode_two_stage<E81B>(index, kInverseInputScale, kInverseResidualScale, y);
  }
};

/// 4 bits/element: E8P + E8P, 32-bit index.
struct Rvq4 {
  static constexpr const char* kName = "rvq4";
  static constexpr int kIndexBits = 32;
  static constexpr float kInputScale = 0.90f;     // s1
  static constexpr float kResidualScale = 3.80f;  // s2
  static constexpr float kInverseInputScale = 1.0f / kInputScale;
  static constexpr float kInverseResidualScale = 1.0f / kResidualScale;

  E8KV_HD static uint32_t encode(const float x[8]) {
    return rvq_detail::encode_two_stage<E8P>(x, kInputScale, kResidualScale);
  }
  E8KV_HD static void decode(uint32_t index, float y[8]) {
    rvq_detail::decode_two_stage<E8P>(index, kInverseInputScale, kInverseResidualScale, y);
  }
};

}  // namespace e8kv::codebook
