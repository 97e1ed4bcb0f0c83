// E8P's tables (pattern keys, membership bitmap, rank bases), the fast path and the exhaustive
// search: the reference steps of e8p.hpp's encoder (see its header comment). Included by e8p.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "e8kv/platform.hpp"
#include "e8kv/codebook/detail/search_fallback.hpp"
#include "e8kv/lattice/e8.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/fp.hpp"

namespace e8kv::codebook::e8p_detail {

constexpr int kPatternCount = 256;
/// Lattice coordinates are clamped to ±kMaxLatticeAbs before encoding (NaN → 0).
constexpr float kMaxLatticeAbs = 4096.0f;

#if E8KV_X86_DISPATCH
inline bool cpu_has_avx2() { return e8kv::cpu_has_avx2(); }
#endif
constexpr int kBitmapWords = 65536 / 32;

/// The 29 chosen norm-12 patterns, as 2|a_i| for coordinates 0..7 (see the header comment).
constexpr const char* kNormTwelvePatterns[29] = {
    "11313333", "11333313", "11333331", "13131333", "13133313", "13313133", "13313313", "13331133",
    "13331313", "13331331", "13333311", "31113333", "31131333", "31133313", "31311333", "31313133",
    "31313313", "31331313", "31331331", "31333131", "33113133", "33113331", "33133131", "33133311",
    "33311133", "33311331", "33313131", "33313311", "33331113"};

struct Tables {
  /// Per pattern id: bits 15..0 the pattern key (2 bits per coordinate, coordinate 0 highest),
  /// bit 16 the parity of Σa (the parity the number of negative signs must have), bits 31..24
  /// the integer 4·‖a‖².
  uint32_t pattern[kPatternCount];
  /// Bit (key & 31) of word (key >> 5) is set when key is a pattern of the codebook.
  uint32_t member_bits[kBitmapWords];
  /// Pattern id of the first member key in each bitmap word (0 for words without members).
  uint8_t rank_base[kBitmapWords];
};

/// Bit position of coordinate i's 2-bit code in a pattern key (coordinate 0 highest).
E8KV_HD constexpr int code_shift(int i) { return 14 - 2 * i; }

/// The pattern key of kNormTwelvePatterns[n] (code (2|a_i| − 1)/2 per coordinate).
constexpr uint32_t norm_twelve_key(int n) {
  uint32_t key = 0;
  for (int i = 0; i < 8; ++i) key |= static_cast<uint32_t>((kNormTwelvePatterns[n][i] - '1') / 2) << code_shift(i);
  return key;
}

// The tables are built at compile time in every translation unit that includes this header (and
// by nvcc's front ends once more per CUDA unit), so their construction is kept cheap for the
// constant evaluator: one pass over the 3^8 code vectors in lexicographic order, counted up like
// a base-3 number with key, norm and code sum updated per changed digit, and the 29 chosen
// norm-12 keys compared as integers. (Decoding every vector's digits and comparing strings cost
// gcc 12 about 2 s per unit.)
/// Calls visit(key, parity of Σa, 4·‖a‖²) for every pattern of the codebook in id order:
/// base-3 counting with coordinate 0 most significant is lexicographic order.
template <class Visit>
constexpr void for_each_pattern(Visit&& visit) {
  uint32_t norm_twelve_keys[29] = {};
  for (int n = 0; n < 29; ++n) norm_twelve_keys[n] = norm_twelve_key(n);
  int code[8] = {};  // all codes 0: |a_i| = ½
  int norm4 = 8, sum_codes = 0;  // 4·‖a‖² = Σ (2·code_i + 1)², Σ code_i
  uint32_t key = 0;
  for (int k = 0; k < 6561; ++k) {
    bool chosen = norm4 <= 40;
    if (norm4 == 48)
      for (uint32_t twelve : norm_twelve_keys) chosen = chosen || twelve == key;
    // Σa = Σ code_i + 4, so its parity is that of the code sum.
    if (chosen) visit(key, static_cast<uint32_t>(sum_codes & 1), static_cast<uint32_t>(norm4));
    for (int i = 7; i >= 0; --i) {  // the next vector: coordinate 7 is the lowest digit
      if (code[i] < 2) {
        norm4 += 8 * code[i] + 8;  // (2c + 3)² − (2c + 1)²
        ++code[i];
        ++sum_codes;
        key += 1u << code_shift(i);
        break;
      }
      code[i] = 0;  // 2 → 0 and carry
      norm4 -= 24;
      sum_codes -= 2;
      key -= 2u << code_shift(i);
    }
  }
}

struct TableFiller {
  Tables* t;
  int* next_id;
  constexpr void operator()(uint32_t key, uint32_t parity, uint32_t norm4) const {
    const int id = (*next_id)++;  // more than kPatternCount patterns: out of bounds, no constant
    t->pattern[id] = key | parity << 16 | norm4 << 24;
    const uint32_t word = key >> 5;
    if (t->member_bits[word] == 0) t->rank_base[word] = static_cast<uint8_t>(id);
    t->member_bits[word] |= 1u << (key & 31);
  }
};
constexpr Tables build_tables() {
  Tables t{};
  int next_id = 0;
  for_each_pattern(TableFiller{&t, &next_id});
  return t;
}

inline constexpr Tables kHostTables = build_tables();
// Exactly kPatternCount patterns: more would write out of bounds (not a constant expression);
// fewer would leave the last entry's 4·‖a‖² (>= 8 for every pattern) zero.
static_assert(kHostTables.pattern[kPatternCount - 1] >> 24 != 0, "E8P needs exactly 256 absolute patterns");

#if defined(__CUDACC__)
static __constant__ Tables kDeviceTables = build_tables();
#endif

/// The tables in the memory space of the caller (host constexpr copy or device __constant__ copy).
E8KV_HD E8KV_FORCE_INLINE const Tables& tables() {
#if E8KV_ON_DEVICE
  return kDeviceTables;
#else
  return kHostTables;
#endif
}

E8KV_HD E8KV_FORCE_INLINE int popcount32(uint32_t v) {
#if E8KV_ON_DEVICE
  return __popc(v);
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__POPCNT__)
  return __builtin_popcount(v);
#else  // without the POPCNT instruction the builtin is a library call; this is inline
  v = v - ((v >> 1) & 0x55555555u);
  v = (v & 0x33333333u) + ((v >> 2) & 0x33333333u);
  return static_cast<int>((((v + (v >> 4)) & 0x0F0F0F0Fu) * 0x01010101u) >> 24);
#endif
}

/// Pattern id of a key, or -1 when the key is not one of the 256 patterns.
E8KV_HD E8KV_FORCE_INLINE int pattern_id(uint32_t key) {
  const Tables& t = tables();
  const uint32_t word = t.member_bits[key >> 5];
  const uint32_t bit = 1u << (key & 31);
  if (!(word & bit)) return -1;
  return t.rank_base[key >> 5] + popcount32(word & (bit - 1u));
}

/// |a_i| of a pattern table entry.
E8KV_HD E8KV_FORCE_INLINE float magnitude(uint32_t entry, int i) {
  return static_cast<float>((entry >> code_shift(i)) & 3u) + 0.5f;
}

/// What the search needs from z at one shift t: w = |z − t|, the parity of the number of negative
/// z_i − t, and the common term 2t·Σz.
struct ShiftedInput {
  float w[8];
  uint32_t negative_parity;
  float offset;
};

E8KV_HD E8KV_FORCE_INLINE ShiftedInput shifted_input(const float z[8], uint32_t shift_bit, float half_sum) {
  ShiftedInput s{};
  const float t = shift_bit ? -0.25f : 0.25f;
  for (int i = 0; i < 8; ++i) {
    const float d = z[i] - t;
    s.negative_parity ^= d < 0.0f ? 1u : 0u;
    s.w[i] = d < 0.0f ? -d : d;
  }
  s.offset = shift_bit ? -half_sum : half_sum;
  return s;
}

/// ½·Σz, summed in index order: 2t·Σz for t = +¼.
E8KV_HD E8KV_FORCE_INLINE float half_sum_of(const float z[8]) {
  float sum = 0.0f;
  for (int i = 0; i < 8; ++i) sum = fp::add(sum, z[i]);
  return sum * 0.5f;
}

/// Search key of one pattern at one shift: 2·(Σ a_i w_i − [wrong parity]·2·min_i a_i w_i) − ‖a‖²
/// + offset. Every search path computes exactly these float operations in this order.
E8KV_HD E8KV_FORCE_INLINE float pattern_search_key(uint32_t entry, const ShiftedInput& s) {
  float dot = 0.0f;
  float smallest = fp::mul(magnitude(entry, 0), s.w[0]);
  for (int i = 0; i < 8; ++i) {
    const float aw = fp::mul(magnitude(entry, i), s.w[i]);
    dot = fp::add(dot, aw);
    smallest = aw < smallest ? aw : smallest;
  }
  if (((entry >> 16) & 1u) != s.negative_parity) dot = fp::add(dot, -2.0f * smallest);
  const float norm = static_cast<float>(entry >> 24) * 0.25f;  // ‖a‖², exact
  return fp::add(fp::add(2.0f * dot, -norm), s.offset);
}

/// The index of the best sign vector for pattern `id` at the given shift: σ_i = sign(z_i − t)
/// (zero counts as positive); with the wrong parity, the first coordinate minimizing a_i·w_i flips.
E8KV_HD inline uint32_t index_for(const float z[8], uint32_t id, uint32_t shift_bit) {
  const uint32_t entry = tables().pattern[id];
  const float t = shift_bit ? -0.25f : 0.25f;
  uint32_t negative = 0, parity = 0;
  int smallest_at = 0;
  float smallest = 0.0f;
  for (int i = 0; i < 8; ++i) {
    const float d = z[i] - t;
    const bool neg = d < 0.0f;
    negative |= static_cast<uint32_t>(neg) << i;
    parity ^= static_cast<uint32_t>(neg);
    const float aw = fp::mul(magnitude(entry, i), neg ? -d : d);
    if (i == 0 || aw < smallest) {
      smallest = aw;
      smallest_at = i;
    }
  }
  if (parity != ((entry >> 16) & 1u)) negative ^= 1u << smallest_at;
  return id << 8 | (negative & 0xFEu) | shift_bit;
}

/// The exhaustive search, one pattern at a time (the device path; also runs on the host).
/// The first maximum in the order (shift +¼ before −¼, pattern id ascending) wins.
E8KV_HD inline uint32_t search_generic(const float z[8]) {
  const float half_sum = half_sum_of(z);
  float best_key = 0.0f;
  uint32_t best_id = 0, best_shift = 0;
  for (uint32_t shift_bit = 0; shift_bit < 2; ++shift_bit) {
    const ShiftedInput s = shifted_input(z, shift_bit, half_sum);
    for (uint32_t id = 0; id < static_cast<uint32_t>(kPatternCount); ++id) {
      const float k = pattern_search_key(tables().pattern[id], s);
      if ((shift_bit == 0 && id == 0) || k > best_key) {
        best_key = k;
        best_id = id;
        best_shift = shift_bit;
      }
    }
  }
  return index_for(z, best_id, best_shift);
}

#if defined(__CUDACC__)
/// The pattern entries once more, in global memory: the warp-shared search reads 32 consecutive
/// ids per step, one coalesced line (the same 32 reads from __constant__ memory are serialized).
struct PatternRows {
  uint32_t pattern[kPatternCount];
};
constexpr PatternRows build_pattern_rows() {
  PatternRows rows{};
  const Tables t = build_tables();
  for (int id = 0; id < kPatternCount; ++id) rows.pattern[id] = t.pattern[id];
  return rows;
}
static __device__ const PatternRows kDevicePatternRows = build_pattern_rows();
#endif

/// The pattern entry of `id` for the sliced search (identical to tables().pattern[id]).
E8KV_HD E8KV_FORCE_INLINE uint32_t slice_pattern(uint32_t id) {
#if E8KV_ON_DEVICE
  return __ldg(&kDevicePatternRows.pattern[id]);
#else
  return kHostTables.pattern[id];
#endif
}

/// Slice `slice` of `slices` of search_generic (search_fallback.hpp): the candidates whose place
/// in its order, shift bit · 256 + pattern id, is ≡ slice (mod slices). The same keys, so the
/// better_candidate() of all slices is search_generic's winner. One candidate per trip (the
/// shift by selects, not by a run-time choice of record, which would move both to local memory).
E8KV_HD inline SearchCandidate search_slice(const float z[8], uint32_t slice, uint32_t slices) {
  const float half_sum = half_sum_of(z);
  const ShiftedInput s0 = shifted_input(z, 0, half_sum), s1 = shifted_input(z, 1, half_sum);
  SearchCandidate best{0.0f, kNoSearchCandidate};
#if E8KV_ON_DEVICE
#pragma unroll 1
#endif
  for (uint32_t order = slice; order < 2u * kPatternCount; order += slices) {
    // cost-report: search slice trip, 16 per lane (one candidate; the warp passes 32 slices)
    const bool upper = order >= static_cast<uint32_t>(kPatternCount);
    ShiftedInput s;
    for (int i = 0; i < 8; ++i) s.w[i] = upper ? s1.w[i] : s0.w[i];
    s.negative_parity = upper ? s1.negative_parity : s0.negative_parity;
    s.offset = upper ? s1.offset : s0.offset;
    best = better_candidate(best, SearchCandidate{pattern_search_key(slice_pattern(order & 0xFFu), s), order});
  }
  return best;
}

/// Host copy of the patterns as float columns, so the key loop vectorizes across patterns.
struct HostColumns {
  float magnitude[8][kPatternCount];
  float norm[kPatternCount];
  /// Multiplier of min_i a_i·w_i added to the dot product: −2 when the parity of the number of
  /// negative signs (index 0: even, 1: odd) differs from the pattern's, else 0.
  float repair[2][kPatternCount];
};

constexpr HostColumns build_host_columns() {
  HostColumns c{};
  for (int id = 0; id < kPatternCount; ++id) {
    const uint32_t e = kHostTables.pattern[id];
    for (int i = 0; i < 8; ++i) c.magnitude[i][id] = static_cast<float>((e >> code_shift(i)) & 3u) + 0.5f;
    c.norm[id] = static_cast<float>(e >> 24) * 0.25f;
    c.repair[0][id] = ((e >> 16) & 1u) != 0u ? -2.0f : 0.0f;
    c.repair[1][id] = ((e >> 16) & 1u) != 1u ? -2.0f : 0.0f;
  }
  return c;
}

inline constexpr HostColumns kHostColumns = build_host_columns();

/// The same search as search_generic with the same float results per pattern (so the same
/// answer), written so that the compiler vectorizes across patterns: dot + (−2)·min equals
/// dot + (−2·min), and dot + 0·min equals dot, exactly.
inline uint32_t search_host(const float z[8]) {
  const HostColumns& c = kHostColumns;
  const float half_sum = half_sum_of(z);
  float best_key = 0.0f;
  uint32_t best_id = 0, best_shift = 0;
  for (uint32_t shift_bit = 0; shift_bit < 2; ++shift_bit) {
    const ShiftedInput s = shifted_input(z, shift_bit, half_sum);
    const float* repair = c.repair[s.negative_parity];
    float key[kPatternCount];
    for (int id = 0; id < kPatternCount; ++id) {
      float aw = fp::mul(c.magnitude[0][id], s.w[0]);
      float dot = fp::add(0.0f, aw);
      float smallest = aw;
      for (int i = 1; i < 8; ++i) {
        aw = fp::mul(c.magnitude[i][id], s.w[i]);
        dot = fp::add(dot, aw);
        smallest = aw < smallest ? aw : smallest;
      }
      dot = fp::add(dot, fp::mul(repair[id], smallest));
      key[id] = fp::add(fp::add(2.0f * dot, -c.norm[id]), s.offset);
    }
    // First maximum: a vectorizable tree reduction for the value, then a scan for its index.
    float tree[kPatternCount / 2];
    for (int id = 0; id < kPatternCount / 2; ++id) {
      const float a = key[id], b = key[id + kPatternCount / 2];
      tree[id] = b > a ? b : a;
    }
    for (int n = kPatternCount / 4; n >= 1; n /= 2)
      for (int id = 0; id < n; ++id) tree[id] = tree[id + n] > tree[id] ? tree[id + n] : tree[id];
    const float shift_best = tree[0];
    if (shift_bit == 0 || shift_best > best_key) {
      uint32_t id = 0;
      while (id + 1 < static_cast<uint32_t>(kPatternCount) && key[id] != shift_best) ++id;
      best_key = shift_best;
      best_id = id;
      best_shift = shift_bit;
    }
  }
  return index_for(z, best_id, best_shift);
}


/// The fast path on a sanitized z (finite, |z_i| ≤ 4096): the nearest point of E8+¼ is the
/// answer when its pattern is one of the 256.
E8KV_HD inline bool fast_path(const float z[8], uint32_t* index) {
  float u[8];
  for (int i = 0; i < 8; ++i) u[i] = z[i] - 0.25f;  // exact for |z| ≤ 2^21
  int64_t twice[8];
  // Half-integer coset: the point is s + ¼ with s = e ∈ D8+½. Integer coset: e + ¼ = s − ¼
  // with s = e + ½ ∈ D8+½.
  const int coset = lattice::nearest_e8_twice(u, twice);
  const uint32_t shift_bit = coset == 1 ? 0u : 1u;
  uint32_t key = 0, negative = 0;
  for (int i = 0; i < 8; ++i) {
    const int64_t s2 = coset == 1 ? twice[i] : twice[i] + 1;  // 2·s_i, odd
    const int64_t a2 = s2 < 0 ? -s2 : s2;
    if (a2 > 5) return false;
    key |= static_cast<uint32_t>((a2 - 1) >> 1) << code_shift(i);
    negative |= static_cast<uint32_t>(s2 < 0) << i;
  }
  const int id = pattern_id(key);
  if (id < 0) return false;
  *index = static_cast<uint32_t>(id) << 8 | (negative & 0xFEu) | shift_bit;
  return true;
}

}  // namespace e8kv::codebook::e8p_detail
