// E8P: the 2-bit/element E8 block code with a 16-bit index (QuIP#'s construction, our layout).
//
// Codebook. Let A be 256 "absolute patterns" a ∈ {½, 3/2, 5/2}^8 (position specific):
//   * all 227 patterns |v| of points v ∈ D8+½ with ‖v‖² ≤ 10, plus
//   * 29 of the 56 norm-12 patterns with five 3/2 and three ½ (the choice is explained below).
// S = {σ⊙a : a ∈ A, σ ∈ {±1}^8, Σ σ⊙a even} ⊂ D8+½ has 2^15 points (128 sign vectors per a,
// because flipping one sign changes the sum by an odd number). The codebook is
//   E8P = (S + ¼·1) ∪ (S − ¼·1)  ⊂  E8 + ¼·1,
// 65,536 points, none with a zero coordinate, max |coordinate| 2.75. E8P = −E8P.
//
// Pattern order (the pattern id): ascending lexicographic order of (|a_0|, ..., |a_7|). That is the
// order of the 16-bit pattern key with 2 bits per coordinate, code_i = |a_i| − ½ ∈ {0, 1, 2},
// coordinate 0 in bits 15..14 and coordinate 7 in bits 1..0.
//
// Index layout (16 bits):
//   bits 15..8  pattern id
//   bits  7..1  sign of coordinates 1..7 (bit k set: coordinate k negative)
//   bit      0  shift bit (0: +¼, 1: −¼)
// The sign of coordinate 0 is implied by the parity: #negative ≡ Σa (mod 2), so that Σσ⊙a is even.
// decode() ignores bits above 15 (every uint32 decodes to a codeword).
//
// Choice of the 29 norm-12 patterns (reproduced by e8p_test, NormTwelveChoiceFollowsTheRule):
// draw 65,536 blocks x with i.i.d. N(0,1) coordinates (splitmix64 seeded 0xE8E8E8E8, 53-bit uniforms,
// Box–Muller pairs r·cos, r·sin with r = sqrt(−2 ln(1−u1))), quantize 1.03·x exactly (in double)
// with the 283-pattern code that contains all 56 norm-12 patterns, and keep the 29 norm-12 patterns
// that are nearest most often (ties: lexicographically smaller pattern first). By the permutation
// symmetry of i.i.d. data every choice is equally good in expectation. Measured on 200,000 other
// blocks (std::mt19937_64 seed 2024) at scale 1.03: this choice 0.09142, five random choices
// 0.09143–0.09146, no norm-12 pattern 0.0937, all 56 (not a 16-bit code) 0.0900 per element.
//
// Scale. kInputScale = 1.03 (E8P quantizes 1.03·x). Per-element MSE on N(0,1), same 200,000 blocks:
//   0.95 → 0.0944, 0.98 → 0.0927, 1.00 → 0.0919, 1.02 → 0.0915, 1.03 → 0.0914, 1.04 → 0.0914,
//   1.06 → 0.0916, 1.08 → 0.0920, 1.10 → 0.0927 (flat optimum at 1.03–1.04, as in the research).
//
// Encoder (exact nearest codeword):
//   1. Fast path: the nearest point e of E8 to z − ¼·1 (lattice::nearest_e8 tie rules) plus ¼ is the
//      nearest point of E8+¼; if its |·| pattern (after moving the −¼ half back to D8+½) is in A,
//      it is the answer. A 65,536-bit membership bitmap answers that, and the pattern id is a rank
//      (bitmap popcount + per-word base). Taken for ≈ 69 % of Gaussian blocks at scale 1.03.
//   2. Fallback: exhaustive search over both shifts and all 256 patterns. For shift t and pattern a,
//      with w = |z − t|, the best sign vector takes σ_i = sign(z_i − t) and, when that has the wrong
//      parity, flips the coordinate with the smallest a_i·w_i. The codeword maximizes
//      key = 2·(Σ a_i w_i − [wrong parity]·2·min_i a_i w_i) − ‖a‖² + 2t·Σz_i,
//      which equals ‖z‖² + 8t² − ‖z − c‖² (the first two terms are common to all codewords).
// Ties (only for measure-zero inputs): the fast path's choice when it accepts; otherwise the first
// maximum in the order (shift +¼ before −¼, pattern id ascending); a zero z_i − t counts as
// positive and the parity repair flips the first coordinate that attains the minimum.
// All arithmetic is float with unfused multiply/add in a fixed order, so CPU and GPU agree.
//
// The host runs the fallback column-wise (search_host: same float operations per pattern, so the
// same answer as the per-pattern device loop search_generic, checked by the tests) so that it
// vectorizes: ≈ 0.8 µs per block on one core; the whole encoder ≈ 20 M elements/s.
//
// Non-finite and huge input: every lattice coordinate is sanitized first: NaN → 0, values clamped
// to ±kMaxLatticeAbs = 4096 (≈ 1500× the largest codeword coordinate; float still resolves the
// search keys there). The result is the exact nearest codeword of that sanitized vector, so every
// input gives a valid index. (Clamping to the codebook's own range ±2.75 would not do: a
// coordinate beyond 2.75 still changes which codeword is nearest through the other coordinates.)
//
// Decode: one table load (pattern key + parity bit) plus bit operations.
// Tables: 1 KB patterns, 8 KB membership bitmap, 2 KB rank bases; one host constexpr copy and,
// under nvcc, one __constant__ copy per translation unit.
#pragma once

#include <cstdint>

#include "e8kv/config.hpp"
#include "e8kv/lattice/e8.hpp"
#include "e8kv/numeric/fp.hpp"

namespace e8kv::codebook {

namespace e8p_detail {

constexpr int kPatternCount = 256;
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

constexpr bool is_chosen_norm_twelve(const int twice_abs[8]) {
  for (const char* p : kNormTwelvePatterns) {
    bool same = true;
    for (int i = 0; i < 8; ++i) same = same && (p[i] - '0') == twice_abs[i];
    if (same) return true;
  }
  return false;
}

/// Calls visit(key, parity of Σa, 4·‖a‖²) for every pattern of the codebook in id order:
/// base-3 counting with coordinate 0 most significant is lexicographic order.
template <class Visit>
constexpr void for_each_pattern(Visit&& visit) {
  for (int k = 0; k < 6561; ++k) {
    int twice_abs[8] = {};
    int rest = k, norm4 = 0, sum_codes = 0;
    uint32_t key = 0;
    for (int i = 7; i >= 0; --i) {
      const int code = rest % 3;
      rest /= 3;
      twice_abs[i] = 2 * code + 1;
      norm4 += twice_abs[i] * twice_abs[i];  // 4·‖a‖²
      sum_codes += code;
      key |= static_cast<uint32_t>(code) << code_shift(i);
    }
    // Σa = Σ code_i + 4, so its parity is that of the code sum.
    if (norm4 <= 40 || (norm4 == 48 && is_chosen_norm_twelve(twice_abs)))
      visit(key, static_cast<uint32_t>(sum_codes & 1), static_cast<uint32_t>(norm4));
  }
}

struct PatternCounter {
  int* count;
  constexpr void operator()(uint32_t, uint32_t, uint32_t) const { ++*count; }
};
constexpr int count_patterns() {
  int count = 0;
  for_each_pattern(PatternCounter{&count});
  return count;
}
static_assert(count_patterns() == kPatternCount, "E8P needs exactly 256 absolute patterns");

struct TableFiller {
  Tables* t;
  int* next_id;
  constexpr void operator()(uint32_t key, uint32_t parity, uint32_t norm4) const {
    const int id = (*next_id)++;
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
#elif defined(__GNUC__) || defined(__clang__)
  return __builtin_popcount(v);
#else
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

/// The exhaustive search on a sanitized z, in the caller's execution space.
E8KV_HD E8KV_FORCE_INLINE uint32_t search(const float z[8]) {
#if E8KV_ON_DEVICE
  return search_generic(z);
#else
  return search_host(z);
#endif
}

}  // namespace e8p_detail

struct E8P {
  static constexpr const char* kName = "e8p";
  static constexpr int kIndexBits = 16;
  /// E8P quantizes kInputScale·x (measured optimum for unit-variance input, see the file comment).
  static constexpr float kInputScale = 1.03f;
  static constexpr float kInverseInputScale = 1.0f / kInputScale;
  /// Lattice-unit coordinates are clamped to ±kMaxLatticeAbs before encoding (NaN → 0).
  static constexpr float kMaxLatticeAbs = 4096.0f;

  /// Index of the nearest codeword to kInputScale·x.
  E8KV_HD static uint32_t encode(const float x[8]) {
    float z[8];
    for (int i = 0; i < 8; ++i) z[i] = fp::mul(x[i], kInputScale);
    return encode_lattice(z);
  }

  /// The codeword of `index`, divided by kInputScale.
  E8KV_HD static void decode(uint32_t index, float y[8]) {
    decode_lattice(index, y);
    for (int i = 0; i < 8; ++i) y[i] = fp::mul(y[i], kInverseInputScale);
  }

  /// Index of the nearest codeword to z (already in lattice units). Total: see the file comment.
  E8KV_HD static uint32_t encode_lattice(const float z[8]) {
    float zs[8];
    for (int i = 0; i < 8; ++i) zs[i] = fp::sanitize(z[i], kMaxLatticeAbs);
    uint32_t index = 0;
    if (e8p_detail::fast_path(zs, &index)) return index;
    return e8p_detail::search(zs);
  }

  /// The codeword of `index` in lattice units: exact (multiples of ¼). Bits above 15 are ignored.
  E8KV_HD static void decode_lattice(uint32_t index, float z[8]) {
    const uint32_t entry = e8p_detail::tables().pattern[(index >> 8) & 0xFFu];
    const uint32_t signs = (index >> 1) & 0x7Fu;
    uint32_t parity = signs ^ (signs >> 4);
    parity ^= parity >> 2;
    parity ^= parity >> 1;
    // Bit i of `negative` is the sign of coordinate i.
    const uint32_t negative = (signs << 1) | ((parity ^ (entry >> 16)) & 1u);
    const float shift = (index & 1u) ? -0.25f : 0.25f;
    for (int i = 0; i < 8; ++i) {
      const float m = e8p_detail::magnitude(entry, i);
      z[i] = ((negative >> i) & 1u ? -m : m) + shift;
    }
  }

  /// Fast path alone: true (and *index set) when the nearest point of E8+¼ to the sanitized z is
  /// a codeword; false otherwise (*index untouched).
  E8KV_HD static bool encode_lattice_fast(const float z[8], uint32_t* index) {
    float zs[8];
    for (int i = 0; i < 8; ++i) zs[i] = fp::sanitize(z[i], kMaxLatticeAbs);
    return e8p_detail::fast_path(zs, index);
  }

  /// The fallback alone: exhaustive exact search over both shifts and all 256 patterns of the
  /// sanitized z (same tie order as encode_lattice's fallback).
  E8KV_HD static uint32_t encode_lattice_exhaustive(const float z[8]) {
    float zs[8];
    for (int i = 0; i < 8; ++i) zs[i] = fp::sanitize(z[i], kMaxLatticeAbs);
    return e8p_detail::search(zs);
  }
};

}  // namespace e8kv::codebook
