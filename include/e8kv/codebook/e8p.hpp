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
// Encoder (exact nearest codeword). The result is defined by two reference steps:
//   1. Fast path: the nearest point e of E8 to z − ¼·1 (lattice::nearest_e8 tie rules) plus ¼ is the
//      nearest point of E8+¼; if its |·| pattern (after moving the −¼ half back to D8+½) is in A,
//      it is the answer. A 65,536-bit membership bitmap answers that, and the pattern id is a rank
//      (bitmap popcount + per-word base). Taken for ≈ 69 % of Gaussian blocks at scale 1.03.
//   2. Otherwise exhaustive search over both shifts and all 256 patterns. For shift t and pattern
//      a, with w = |z − t|, the best sign vector takes σ_i = sign(z_i − t) and, when that has the
//      wrong parity, flips the coordinate with the smallest a_i·w_i. The codeword maximizes
//      key = 2·(Σ a_i w_i − [wrong parity]·2·min_i a_i w_i) − ‖a‖² + 2t·Σz_i,
//      which equals ‖z‖² + 8t² − ‖z − c‖² (the first two terms are common to all codewords).
// Ties (only for measure-zero inputs): the fast path's choice when it accepts; otherwise the first
// maximum in the order (shift +¼ before −¼, pattern id ascending); a zero z_i − t counts as
// positive and the parity repair flips the first coordinate that attains the minimum.
// All arithmetic is float with unfused multiply/add in a fixed order, so CPU and GPU agree.
//
// How it is computed: first a certified class search (see "the certified class search" below):
// sorting w gives every pattern class's best member and a lower bound on how much worse all other
// codewords are; when the winner leads by more than a float error margin it is the unique nearest
// codeword, which both reference steps return too. Only near-ties (≈ 0.6 % of Gaussian blocks)
// run the reference steps themselves. The host runs the exhaustive step column-wise (search_host:
// the same float operations per pattern as the per-pattern device loop search_generic, so the
// same answer; checked by the tests). Host batches (encode_batch) run the class search on 4 or 8
// blocks at once with vector instructions (AVX2 chosen at run time where the CPU has it).
// One core of the development machine (a shared 2.3 GHz Xeon VM): single blocks ≈ 45 M elements/s,
// batches ≈ 170 M elements/s with AVX2 and ≈ 115 M elements/s with SSE2 (before: ≈ 19 M
// elements/s, the exhaustive step alone ≈ 10 M elements/s).
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

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "e8kv/platform.hpp"
#include "e8kv/lattice/e8.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/fp.hpp"

// Host batches: E8KV_HOST_VECTORS / E8KV_X86_DISPATCH (e8kv/platform.hpp).

namespace e8kv::codebook {

namespace e8p_detail {

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

// ---- the certified class search ------------------------------------------------------------
//
// In exact arithmetic the search key of a pattern has a simple structure. With a = ½ + c
// (code c ∈ {0, 1, 2}), 2·a·w − a² = (w − ¼) + inc(c, w) where inc(0, w) = 0, inc(1, w) = 2w − 2 and
// inc(2, w) = 4w − 6, and a wrong parity costs 4·min_i a_i w_i. So, with W = Σ w_i,
//   key(a) = (W − 2 + offset) + Σ_i inc(c_i, w_i) − [parity(a) ≠ p]·4·min_i a_i w_i.
// The 256 patterns form 8 classes by their codes: c0 all ½ (parity 0); c1..c4 k codes 1 at any
// k positions (parity k mod 2); c5 one code 2 (parity 0); c6 one 2 and one 1 (parity 1); c7 five
// 1s at 29 position sets (parity 1). With w sorted descending (v1 ≥ ... ≥ v8), the best pattern
// of a class puts its large codes on the largest w (ck: top k; c5: v1; c6: 2 on v1, 1 on v2), and
// its parity repair costs 2·v8 (flipping a ½ coordinate at the smallest w is always cheapest);
// c7 is evaluated set by set. Every other pattern of the class is worse by at least a known gap
// (ck: 2(v_k − v_{k+1}); c5: 4(v1 − v2); c6: 2·min(v1 − v2, v2 − v3)), since its repair cannot
// cost less than 2·v8.
//
// certified_search evaluates these class maxima for both shifts in float (c7 only when its bound,
// the top-5 sum, comes within the margin of the leader; otherwise the bound counts as a rival)
// and accepts the leader only when it beats every other pattern, and its sign vector every other
// sign vector of the pattern (by 4(m2 − m1) with wrong parity, else 4(m1 + m2), m1 ≤ m2 the two
// smallest a_i·w_i), by more than margin = 2^-13·(Σ|z_i| + 8). A reference key is a float sum
// of ≤ 12 rounded terms of size ≤ 5W + |offset| + 12.5 (W ≤ Σ|z| + 2, |offset| ≤ ½Σ|z|), so its
// error is below 64·2^-24·(W + |offset| + 1); the estimates use fewer operations on the same
// magnitudes; twice both errors stay below 2^-15·(Σ|z| + 8), a quarter of the margin. Then the
// leader is the unique exact nearest codeword: the exhaustive search returns it (its float keys
// keep the strict order) and so does the fast path when it accepts (it finds the nearest point of
// E8+¼ up to a float error < 2^-19, far below the margin ≥ 2^-10). Otherwise (near-ties, ≈ 0.6 %
// of Gaussian blocks) the caller runs the fast path and the exhaustive search. So encode_lattice
// returns bit for bit what those two reference steps return, whichever route it takes, on the
// host and on the device; the float estimates only choose the route.

/// The three coordinates with |a_i| = ½ of each chosen norm-12 pattern, and its pattern key.
struct NormTwelveSet {
  uint8_t half[3];
  uint16_t key;
};

struct NormTwelveSets {
  NormTwelveSet set[29];
};

constexpr NormTwelveSets build_norm_twelve_sets() {
  NormTwelveSets s{};
  for (int n = 0; n < 29; ++n) {
    int halves = 0;
    uint32_t key = 0;
    for (int i = 0; i < 8; ++i) {
      if (kNormTwelvePatterns[n][i] == '1') s.set[n].half[halves++] = static_cast<uint8_t>(i);
      else key |= 1u << code_shift(i);
    }
    s.set[n].key = static_cast<uint16_t>(key);
  }
  return s;
}

inline constexpr NormTwelveSets kHostNormTwelveSets = build_norm_twelve_sets();
#if defined(__CUDACC__)
static __constant__ NormTwelveSets kDeviceNormTwelveSets = build_norm_twelve_sets();
#endif

E8KV_HD E8KV_FORCE_INLINE const NormTwelveSets& norm_twelve_sets() {
#if E8KV_ON_DEVICE
  return kDeviceNormTwelveSets;
#else
  return kHostNormTwelveSets;
#endif
}

E8KV_HD E8KV_FORCE_INLINE float abs_value(float x) {
#if E8KV_ON_DEVICE
  return fabsf(x);
#else
  return std::fabs(x);
#endif
}

E8KV_HD E8KV_FORCE_INLINE uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/// c ? a : b as a bit select (vectorizes where the plain select would become a branch).
E8KV_HD E8KV_FORCE_INLINE float pick(bool c, float a, float b) {
#if E8KV_ON_DEVICE
  return c ? a : b;
#else
  uint32_t ua, ub;
  memcpy(&ua, &a, sizeof ua);
  memcpy(&ub, &b, sizeof ub);
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  const uint32_t r = (ua & mask) | (ub & ~mask);
  float f;
  memcpy(&f, &r, sizeof f);
  return f;
#endif
}

// max(a, b) and min(a, b) of non-NaN values, branch-free: one maxss/minss on x86 hosts (compilers
// turn the plain select into a branch here), fmaxf/fminf on the device. Which of two equal
// values (±0) comes back is not specified; the class search only uses the values.
#if !E8KV_ON_DEVICE && (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && \
    defined(__SSE__)
#define E8KV_E8P_X86_MINMAX 1
#else
#define E8KV_E8P_X86_MINMAX 0
#endif
E8KV_HD E8KV_FORCE_INLINE float max_of(float a, float b) {
#if E8KV_ON_DEVICE
  return fmaxf(a, b);
#elif E8KV_E8P_X86_MINMAX && defined(__AVX__)
  float r;
  __asm__("vmaxss {%2, %1, %0|%0, %1, %2}" : "=x"(r) : "x"(a), "x"(b));
  return r;
#elif E8KV_E8P_X86_MINMAX
  __asm__("maxss {%1, %0|%0, %1}" : "+x"(a) : "x"(b));
  return a;
#else
  return a < b ? b : a;
#endif
}
E8KV_HD E8KV_FORCE_INLINE float min_of(float a, float b) {
#if E8KV_ON_DEVICE
  return fminf(a, b);
#elif E8KV_E8P_X86_MINMAX && defined(__AVX__)
  float r;
  __asm__("vminss {%2, %1, %0|%0, %1, %2}" : "=x"(r) : "x"(a), "x"(b));
  return r;
#elif E8KV_E8P_X86_MINMAX
  __asm__("minss {%1, %0|%0, %1}" : "+x"(a) : "x"(b));
  return a;
#else
  return a < b ? a : b;
#endif
}
#undef E8KV_E8P_X86_MINMAX

/// The class id of the norm-12 patterns (c7).
constexpr int kClassC7 = 7;

/// What the class search keeps of one shift.
struct ShiftClasses {
  float w[8];       // |z − t|
  float sorted[8];  // w sorted descending: v1 ≥ ... ≥ v8
  uint32_t odd;     // parity of the number of negative z_i − t
  float sum;        // W = Σ w
  float base;       // W − 2 + 2t·Σz
  float c7_bound;   // upper bound of every c7 key
};

/// The best candidate so far, its own runner-up bound, and the largest value of all others.
struct Leader {
  float best, best_runner_up, others;
  int winner;    // class (0..7) + 8·shift bit
  uint32_t key;  // pattern key of a c7 winner
};

E8KV_HD E8KV_FORCE_INLINE void offer(Leader& l, float value, float runner_up, int winner) {
  // Branch-free: the outcome is data dependent and unpredictable.
  const bool better = value > l.best;
  const int mask = -static_cast<int>(better);
  l.others = max_of(l.others, min_of(l.best, value));  // the loser joins the others
  l.best = max_of(l.best, value);
  l.best_runner_up = pick(better, runner_up, l.best_runner_up);
  l.winner = (winner & mask) | (l.winner & ~mask);
}

E8KV_HD E8KV_FORCE_INLINE void order_descending(float& a, float& b) {
  const float hi = max_of(a, b), lo = min_of(a, b);
  a = hi;
  b = lo;
}

/// Batcher's odd-even merge sort network for 8 values (19 comparators), descending, branch-free.
E8KV_HD E8KV_FORCE_INLINE void sort_descending(float v[8]) {
  order_descending(v[0], v[1]), order_descending(v[2], v[3]), order_descending(v[4], v[5]), order_descending(v[6], v[7]);
  order_descending(v[0], v[2]), order_descending(v[1], v[3]), order_descending(v[4], v[6]), order_descending(v[5], v[7]);
  order_descending(v[1], v[2]), order_descending(v[5], v[6]);
  order_descending(v[0], v[4]), order_descending(v[1], v[5]), order_descending(v[2], v[6]), order_descending(v[3], v[7]);
  order_descending(v[2], v[4]), order_descending(v[3], v[5]);
  order_descending(v[1], v[2]), order_descending(v[3], v[4]), order_descending(v[5], v[6]);
}

/// Offers the maxima of classes c0..c6 of one shift and records what c7 and the winner need.
E8KV_HD E8KV_FORCE_INLINE void offer_shift(const float z[8], float half_sum, int shift_bit, ShiftClasses& c,
                                           Leader& l) {
  const float t = shift_bit ? -0.25f : 0.25f;
  uint32_t signs = 0;
  c.sum = 0.0f;
  for (int i = 0; i < 8; ++i) {
    const float d = z[i] - t;  // never −0 (t ≠ 0), so the sign bit says d < 0
    signs ^= float_bits(d);
    c.w[i] = abs_value(d);
    c.sorted[i] = c.w[i];
    c.sum += c.w[i];
  }
  c.odd = signs >> 31;
  sort_descending(c.sorted);
  const float* v = c.sorted;
  c.base = (c.sum - 2.0f) + (shift_bit ? -half_sum : half_sum);
  // Parity repair (2·v8) of the even (c0, c2, c4, c5) and the odd (c1, c3, c6, c7) classes.
  const float repair = 2.0f * v[7];
  const float even_repair = c.odd ? repair : 0.0f, odd_repair = c.odd ? 0.0f : repair;
  const int tag = 8 * shift_bit;
  offer(l, c.base - even_repair, -3.0e38f, tag);
  float inc = 0.0f;  // Σ of the top k increments 2·v − 2 of code 1
  for (int k = 1; k <= 4; ++k) {
    inc += 2.0f * v[k - 1] - 2.0f;
    const float value = (c.base + inc) - ((k & 1) ? odd_repair : even_repair);
    offer(l, value, value - 2.0f * (v[k - 1] - v[k]), tag + k);
  }
  c.c7_bound = (c.base + (inc + (2.0f * v[4] - 2.0f))) - odd_repair;
  const float inc_two = 4.0f * v[0] - 6.0f;
  float value = (c.base + inc_two) - even_repair;
  offer(l, value, value - 4.0f * (v[0] - v[1]), tag + 5);
  value = (c.base + (inc_two + (2.0f * v[1] - 2.0f))) - odd_repair;
  offer(l, value, value - 2.0f * min_of(v[0] - v[1], v[1] - v[2]), tag + 6);
}

/// Offers the best c7 pattern of one shift, with the second best as its runner-up bound.
E8KV_HD inline void offer_norm_twelve(const ShiftClasses& c, int shift_bit, Leader& l) {
  const bool wrong_parity = c.odd == 0u;  // c7 has parity 1
  const float cap = 6.0f * c.sorted[7];
  const float total = 2.0f * c.sum - 10.0f;
  float best = -3.0e38f, second = -3.0e38f;
  uint32_t key = 0;
  for (int n = 0; n < 29; ++n) {
    const NormTwelveSet& set = norm_twelve_sets().set[n];
    const float a = c.w[set.half[0]], b = c.w[set.half[1]], d = c.w[set.half[2]];
    // Repair: the cheaper of a ½ coordinate (2·w) and a 3/2 coordinate (6·w, at best 6·v8).
    const float repair = min_of(2.0f * min_of(min_of(a, b), d), cap);
    const float value = (c.base + (total - 2.0f * ((a + b) + d))) - (wrong_parity ? repair : 0.0f);
    const bool better = value > best;
    second = max_of(second, min_of(best, value));
    best = max_of(best, value);
    key = better ? set.key : key;
  }
  const bool better = best > l.best;
  offer(l, best, second, kClassC7 + 8 * shift_bit);
  l.key = better ? key : l.key;
}

/// The pattern key of a certified winner of classes c0..c6: its class gaps are positive, so the
/// thresholds select exactly the right coordinates (ck: code 1 on w ≥ v_k; c5: code 2 on w ≥ v1;
/// c6: code 2 on w ≥ v1 and code 1 on v2 ≤ w < v1).
E8KV_HD inline uint32_t winner_key(const ShiftClasses& c, int cls) {
  const float one = cls >= 1 && cls <= 4 ? c.sorted[cls - 1] : cls == 6 ? c.sorted[1] : 3.0e38f;
  const float two = cls == 5 || cls == 6 ? c.sorted[0] : 3.0e38f;
  uint32_t key = 0;
  for (int i = 0; i < 8; ++i) {
    const uint32_t code = c.w[i] >= two ? 2u : (c.w[i] >= one ? 1u : 0u);
    key |= code << code_shift(i);
  }
  return key;
}

/// The certified search on a sanitized z: true (and *index set) when the nearest codeword is
/// unique by more than the margin; false when the caller must decide otherwise.
E8KV_HD inline bool certified_search(const float z[8], uint32_t* index) {
  float sum = 0.0f, magnitude_sum = 0.0f;
  for (int i = 0; i < 8; ++i) {
    sum += z[i];
    magnitude_sum += abs_value(z[i]);
  }
  const float half_sum = 0.5f * sum;
  // The float error of every key (reference or estimate) stays below ~500·2^-24·(Σ|z| + 4).
  const float margin = (magnitude_sum + 8.0f) * 0x1.0p-13f;
  Leader l{-3.0e38f, -3.0e38f, -3.0e38f, 0, 0u};
  ShiftClasses c[2];
  offer_shift(z, half_sum, 0, c[0], l);
  offer_shift(z, half_sum, 1, c[1], l);
  for (int shift_bit = 0; shift_bit < 2; ++shift_bit) {  // c7 only where it may win
    if (c[shift_bit].c7_bound >= l.best - margin) offer_norm_twelve(c[shift_bit], shift_bit, l);
    else l.others = max_of(l.others, c[shift_bit].c7_bound);
  }
  if (!(l.best - max_of(l.best_runner_up, l.others) > margin)) return false;
  const int shift_bit = l.winner >> 3, cls = l.winner & 7;
  const ShiftClasses& s = c[shift_bit];
  const uint32_t key = cls == kClassC7 ? l.key : winner_key(s, cls);
  // The sign vector of the winner: the next best flips the two smallest a_i·w_i (right parity)
  // or the second smallest instead of the smallest (wrong parity).
  float m1 = 3.0e38f, m2 = 3.0e38f;
  uint32_t code_sum = 0;
  for (int i = 0; i < 8; ++i) {
    const uint32_t code = (key >> code_shift(i)) & 3u;
    code_sum += code;
    const float aw = (static_cast<float>(code) + 0.5f) * s.w[i];
    m2 = min_of(m2, max_of(m1, aw));
    m1 = min_of(m1, aw);
  }
  const float sign_gap = (code_sum & 1u) != s.odd ? 4.0f * (m2 - m1) : 4.0f * (m1 + m2);
  if (!(sign_gap > margin)) return false;
  *index = index_for(z, static_cast<uint32_t>(pattern_id(key)), static_cast<uint32_t>(shift_bit));
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

#if E8KV_HOST_VECTORS
// ---- host batches: the class search on W blocks at once (GCC/Clang vector extensions) --------
//
// The same certificate as certified_search, evaluated with W-lane vectors (one block per lane,
// one vector per coordinate; branch-free: c7 runs when any lane needs it). Its float estimates may
// round differently from the scalar code, which does not matter: a certified lane returns the
// exact nearest codeword (the same index as every other route) and an uncertified lane takes the
// scalar fast path + exhaustive search.
namespace vec {

typedef float Float4 __attribute__((vector_size(16)));
typedef int32_t Int4 __attribute__((vector_size(16)));
typedef float Float8 __attribute__((vector_size(32)));
typedef int32_t Int8 __attribute__((vector_size(32)));
template <int W>
struct Raw;
template <>
struct Raw<4> {
  typedef Float4 F;
  typedef Int4 I;
};
template <>
struct Raw<8> {
  typedef Float8 F;
  typedef Int8 I;
};

// W lanes of float (VF) and of int32 (VI; comparisons return all-ones / zero lane masks). The
// raw vectors sit in structs and helpers take const references: 32-byte vectors passed by value
// outside AVX code would trigger GCC's ABI notes (-Wpsabi), even in always-inline helpers.
template <int W>
struct VF {
  typename Raw<W>::F v;
};
template <int W>
struct VI {
  typename Raw<W>::I v;
};

#define E8KV_VEC_OP(T, R, op)                                                            \
  template <int W>                                                                       \
  E8KV_FORCE_INLINE R<W> operator op(const T<W>& a, const T<W>& b) {                     \
    return R<W>{a.v op b.v};                                                             \
  }
E8KV_VEC_OP(VF, VF, +)
E8KV_VEC_OP(VF, VF, -)
E8KV_VEC_OP(VF, VF, *)
E8KV_VEC_OP(VF, VI, <)
E8KV_VEC_OP(VF, VI, >)
E8KV_VEC_OP(VF, VI, <=)
E8KV_VEC_OP(VF, VI, >=)
E8KV_VEC_OP(VF, VI, ==)
E8KV_VEC_OP(VI, VI, +)
E8KV_VEC_OP(VI, VI, &)
E8KV_VEC_OP(VI, VI, |)
E8KV_VEC_OP(VI, VI, ^)
E8KV_VEC_OP(VI, VI, ==)
E8KV_VEC_OP(VI, VI, !=)
#undef E8KV_VEC_OP
template <int W>
E8KV_FORCE_INLINE VI<W> operator~(const VI<W>& a) {
  return VI<W>{~a.v};
}
template <int W>
E8KV_FORCE_INLINE VF<W> operator-(const VF<W>& a) {
  return VF<W>{-a.v};
}
template <int W>
E8KV_FORCE_INLINE VI<W> operator<<(const VI<W>& a, int n) {
  return VI<W>{a.v << n};
}
template <int W>
E8KV_FORCE_INLINE VI<W> operator>>(const VI<W>& a, int n) {
  return VI<W>{a.v >> n};
}

/// Lane-wise helpers on W lanes.
template <int W>
struct Ops {
  typedef VF<W> F;
  typedef VI<W> I;

  static E8KV_FORCE_INLINE F splat(float x) {
    F r;
    for (int k = 0; k < W; ++k) r.v[k] = x;
    return r;
  }
  static E8KV_FORCE_INLINE I splat_int(int32_t x) {
    I r;
    for (int k = 0; k < W; ++k) r.v[k] = x;
    return r;
  }
  static E8KV_FORCE_INLINE F select(const I& mask, const F& a, const F& b) {
    typedef typename Raw<W>::F RF;
    typedef typename Raw<W>::I RI;
    return F{(RF)(((RI)a.v & mask.v) | ((RI)b.v & ~mask.v))};
  }
  static E8KV_FORCE_INLINE I select(const I& mask, const I& a, const I& b) { return I{(a.v & mask.v) | (b.v & ~mask.v)}; }
  static E8KV_FORCE_INLINE F max_of(const F& a, const F& b) { return select(a < b, b, a); }
  static E8KV_FORCE_INLINE F min_of(const F& a, const F& b) { return select(a < b, a, b); }
  static E8KV_FORCE_INLINE F abs_value(const F& a) {
    typedef typename Raw<W>::F RF;
    typedef typename Raw<W>::I RI;
    return F{(RF)((RI)a.v & splat_int(0x7FFFFFFF).v)};
  }
  static E8KV_FORCE_INLINE F to_float(const I& a) {
    typedef typename Raw<W>::F RF;
    return F{__builtin_convertvector(a.v, RF)};
  }
  static E8KV_FORCE_INLINE bool any(const I& mask) {
    bool r = false;
    for (int k = 0; k < W; ++k) r |= mask.v[k] != 0;
    return r;
  }
  static E8KV_FORCE_INLINE void order(F& a, F& b) {
    const F hi = max_of(a, b), lo = min_of(a, b);
    a = hi;
    b = lo;
  }
  /// Batcher's odd-even merge sort network for 8 values (19 comparators), descending per lane.
  static E8KV_FORCE_INLINE void sort_descending(F* v) {
    order(v[0], v[1]), order(v[2], v[3]), order(v[4], v[5]), order(v[6], v[7]);
    order(v[0], v[2]), order(v[1], v[3]), order(v[4], v[6]), order(v[5], v[7]);
    order(v[1], v[2]), order(v[5], v[6]);
    order(v[0], v[4]), order(v[1], v[5]), order(v[2], v[6]), order(v[3], v[7]);
    order(v[2], v[4]), order(v[3], v[5]);
    order(v[1], v[2]), order(v[3], v[4]), order(v[5], v[6]);
  }
  /// x[8k + i] of W blocks as lane k of z[i], times scale, sanitized like fp::sanitize.
  static E8KV_FORCE_INLINE void load_sanitized(const float* x, float scale, float limit, F z[8]) {
    const F upper = splat(limit), lower = splat(-limit), zero = splat(0.0f), s = splat(scale);
    for (int i = 0; i < 8; ++i) {
      F v;
      for (int k = 0; k < W; ++k) v.v[k] = x[8 * k + i];
      v = v * s;
      v = select(v == v, v, zero);
      v = select(v > upper, upper, v);
      z[i] = select(v < lower, lower, v);
    }
  }
};

/// The E8P kernel on W lanes (W = 4: 128-bit vectors, any SSE2/NEON host; W = 8: AVX2).
template <int W>
struct Kernel : Ops<W> {
  typedef Ops<W> O;
  typedef VF<W> F;
  typedef VI<W> I;
  using O::abs_value;
  using O::max_of;
  using O::min_of;
  using O::select;
  using O::splat;
  using O::splat_int;

  /// Running leader of the class search per lane.
  struct Leader {
    F best, runner_up, others;
    I winner;  // class + 8·shift bit, or for c7 the pattern key | 0x10000 | shift bit << 17
  };

  static E8KV_FORCE_INLINE void offer(Leader& l, const F& value, const F& runner_up, const I& winner) {
    const I better = value > l.best;
    l.others = max_of(l.others, select(better, l.best, value));
    l.best = max_of(l.best, value);
    l.runner_up = select(better, runner_up, l.runner_up);
    l.winner = select(better, winner, l.winner);
  }

  struct Shift {
    F w[8];
    F sorted[8];
    I odd;  // parity of the number of negative z_i − t, as a mask
    F sum, base, c7_bound;
  };

  static E8KV_FORCE_INLINE void offer_shift(const F z[8], const F& half_sum, int shift_bit, Shift& s, Leader& l) {
    const F t = splat(shift_bit ? -0.25f : 0.25f);
    const F zero = splat(0.0f);
    I odd = splat_int(0);
    F sum = zero;
    for (int i = 0; i < 8; ++i) {
      const F d = z[i] - t;
      odd = odd ^ (d < zero);
      s.w[i] = abs_value(d);
      sum = sum + s.w[i];
    }
    s.odd = odd;
    s.sum = sum;
    F* v = s.sorted;
    for (int i = 0; i < 8; ++i) v[i] = s.w[i];
    O::sort_descending(v);
    const F two = splat(2.0f), four = splat(4.0f);
    s.base = (sum - two) + (shift_bit ? -half_sum : half_sum);
    const F repair = two * v[7];
    const F even_repair = select(odd, repair, zero), odd_repair = select(odd, zero, repair);
    const int tag = 8 * shift_bit;
    offer(l, s.base - even_repair, splat(-3.0e38f), splat_int(tag));
    F inc = zero;
    for (int k = 1; k <= 4; ++k) {
      inc = inc + (two * v[k - 1] - two);
      const F value = (s.base + inc) - ((k & 1) ? odd_repair : even_repair);
      offer(l, value, value - two * (v[k - 1] - v[k]), splat_int(tag + k));
    }
    s.c7_bound = (s.base + (inc + (two * v[4] - two))) - odd_repair;
    const F inc_two = four * v[0] - splat(6.0f);
    F value = (s.base + inc_two) - even_repair;
    offer(l, value, value - four * (v[0] - v[1]), splat_int(tag + 5));
    value = (s.base + (inc_two + (two * v[1] - two))) - odd_repair;
    offer(l, value, value - two * min_of(v[0] - v[1], v[1] - v[2]), splat_int(tag + 6));
  }

  /// c7 for every lane of one shift: the best set as the candidate, the second best as its
  /// runner-up bound.
  static E8KV_FORCE_INLINE void offer_norm_twelve(const Shift& s, int shift_bit, Leader& l) {
    const F zero = splat(0.0f), two = splat(2.0f);
    const F cap = splat(6.0f) * s.sorted[7];
    const I wrong_parity = ~s.odd;  // c7 has parity 1
    const F total = two * s.sum - splat(10.0f);
    F best = splat(-3.0e38f), second = best;
    I key = splat_int(0);
    for (int n = 0; n < 29; ++n) {
      const NormTwelveSet& set = kHostNormTwelveSets.set[n];
      const F& a = s.w[set.half[0]];
      const F& b = s.w[set.half[1]];
      const F& d = s.w[set.half[2]];
      const F repair = min_of(two * min_of(min_of(a, b), d), cap);
      const F value = (s.base + (total - two * ((a + b) + d))) - select(wrong_parity, repair, zero);
      const I better = value > best;
      second = max_of(second, select(better, best, value));
      best = max_of(best, value);
      key = select(better, splat_int(set.key), key);
    }
    offer(l, best, second, key | splat_int(0x10000 | shift_bit << 17));
  }

  /// Encodes W blocks x[0..8W) (scaled by `scale`, then sanitized); writes index[0..count).
  static E8KV_FORCE_INLINE void encode(const float* x, float scale, uint32_t* index, int count = W) {
    F z[8];
    const F zero = splat(0.0f);
    O::load_sanitized(x, scale, kMaxLatticeAbs, z);
    F sum = zero, magnitude_sum = zero;
    for (int i = 0; i < 8; ++i) {
      sum = sum + z[i];
      magnitude_sum = magnitude_sum + abs_value(z[i]);
    }
    const F half_sum = splat(0.5f) * sum;
    const F margin = (magnitude_sum + splat(8.0f)) * splat(0x1.0p-13f);
    Leader l{splat(-3.0e38f), splat(-3.0e38f), splat(-3.0e38f), splat_int(0)};
    Shift s[2];
    offer_shift(z, half_sum, 0, s[0], l);
    offer_shift(z, half_sum, 1, s[1], l);
    for (int shift_bit = 0; shift_bit < 2; ++shift_bit) {
      if (O::any(s[shift_bit].c7_bound >= l.best - margin)) offer_norm_twelve(s[shift_bit], shift_bit, l);
      else l.others = max_of(l.others, s[shift_bit].c7_bound);
    }
    I certified = l.best - max_of(l.runner_up, l.others) > margin;
    // The winner's pattern key from its class and the sorted magnitudes of its shift.
    const I is_c7 = (l.winner & splat_int(0x10000)) != splat_int(0);
    const I shift_bit = select(is_c7, l.winner >> 17, l.winner >> 3) & splat_int(1);
    const I upper = shift_bit != splat_int(0);
    const I cls = l.winner & splat_int(7);
    F w[8], sorted[5];
    for (int i = 0; i < 8; ++i) w[i] = select(upper, s[1].w[i], s[0].w[i]);
    for (int k = 0; k < 5; ++k) sorted[k] = select(upper, s[1].sorted[k], s[0].sorted[k]);
    const I odd = select(upper, s[1].odd, s[0].odd);
    // Codes 1 on w ≥ v_k for c1..c4; c5: code 2 on w ≥ v1; c6: 2 on w ≥ v1, 1 on w ≥ v2.
    const F never = splat(3.0e38f);
    F one_threshold = never;
    for (int k = 1; k <= 4; ++k) one_threshold = select(cls == splat_int(k), sorted[k - 1], one_threshold);
    one_threshold = select(cls == splat_int(6), sorted[1], one_threshold);
    const F two_threshold = select((cls == splat_int(5)) | (cls == splat_int(6)), sorted[0], never);
    I key = splat_int(0);
    for (int i = 0; i < 8; ++i) {
      const I code = select(w[i] >= two_threshold, splat_int(2), select(w[i] >= one_threshold, splat_int(1), splat_int(0)));
      key = key | (code << code_shift(i));
    }
    key = select(is_c7, l.winner & splat_int(0xFFFF), key);
    // The sign vector: its certificate, the negative bits and the parity repair (index_for's
    // rule: the first coordinate with the smallest a_i·w_i flips).
    F m1 = never, m2 = never, aw[8];
    I code_sum = splat_int(0);
    for (int i = 0; i < 8; ++i) {
      const I code = (key >> code_shift(i)) & splat_int(3);
      code_sum = code_sum + code;
      aw[i] = (O::to_float(code) + splat(0.5f)) * w[i];
      m2 = min_of(m2, max_of(m1, aw[i]));
      m1 = min_of(m1, aw[i]);
    }
    const I wrong = ((code_sum & splat_int(1)) != splat_int(0)) != odd;
    const F four = splat(4.0f);
    const F sign_gap = select(wrong, four * (m2 - m1), four * (m1 + m2));
    certified = certified & (sign_gap > margin);
    const F t = select(upper, splat(-0.25f), splat(0.25f));
    I negative = splat_int(0), found = splat_int(0), flip = splat_int(0);
    for (int i = 0; i < 8; ++i) {
      negative = negative | ((z[i] - t < zero) & splat_int(1 << i));
      const I first = (aw[i] == m1) & ~found;
      flip = flip | (first & splat_int(1 << i));
      found = found | first;
    }
    negative = negative ^ (flip & wrong);
    const I low_bits = (negative & splat_int(0xFE)) | shift_bit;
    for (int k = 0; k < count; ++k) {
      if (certified.v[k]) {
        index[k] = static_cast<uint32_t>(pattern_id(static_cast<uint32_t>(key.v[k]))) << 8 |
                   static_cast<uint32_t>(low_bits.v[k]);
        continue;
      }
      float zk[8];
      for (int i = 0; i < 8; ++i) zk[i] = z[i].v[k];
      if (!fast_path(zk, &index[k])) index[k] = search(zk);
    }
  }

};

/// Batches of any length for a W-lane kernel (Kernel<W>::encode takes W blocks, or fewer with a
/// count): whole groups of W in place, the tail through a zero-padded copy. Shared by the E8P and
/// E81B kernels, with their two builds: 128-bit vectors (every SSE2 / NEON host) and, on x86,
/// 256-bit AVX2 vectors chosen at run time (no FMA: the same results).
template <template <int> class Kernel>
struct BatchEncoder {
  template <int W>
  static E8KV_FORCE_INLINE void run(const float* x, float scale, size_t count, uint32_t* index) {
    size_t b = 0;
    for (; b + W <= count; b += W) Kernel<W>::encode(x + 8 * b, scale, index + b);
    if (b < count) {
      float tail[8 * W] = {};
      uint32_t tail_index[W];
      for (size_t k = 0; k < 8 * (count - b); ++k) tail[k] = x[8 * b + k];
      Kernel<W>::encode(tail, scale, tail_index, static_cast<int>(count - b));
      for (size_t k = 0; k < count - b; ++k) index[b + k] = tail_index[k];
    }
  }
  static void portable(const float* x, float scale, size_t count, uint32_t* index) { run<4>(x, scale, count, index); }
#if E8KV_X86_DISPATCH
  __attribute__((target("avx2"), noinline)) static void avx2(const float* x, float scale, size_t count, uint32_t* index) {
    run<8>(x, scale, count, index);
  }
#endif
  /// The AVX2 build where the CPU has it, else the portable one.
  static void host(const float* x, float scale, size_t count, uint32_t* index) {
#if E8KV_X86_DISPATCH
    if (cpu_has_avx2()) return avx2(x, scale, count, index);
#endif
    portable(x, scale, count, index);
  }
};

}  // namespace vec

/// E8P host batches: Batch::portable, Batch::avx2 (x86), Batch::host (run-time choice).
using Batch = vec::BatchEncoder<vec::Kernel>;
#endif  // E8KV_HOST_VECTORS

/// index[b] = exact nearest codeword of sanitize(fl(scale·x[8b + i])) for b < count.
E8KV_HD inline void encode_batch(const float* x, float scale, size_t count, uint32_t* index) {
#if E8KV_HOST_VECTORS && !E8KV_ON_DEVICE
  Batch::host(x, scale, count, index);
#else
  for (size_t b = 0; b < count; ++b) {
    float z[8];
    for (int i = 0; i < 8; ++i) z[i] = fp::sanitize(fp::mul(x[8 * b + i], scale), kMaxLatticeAbs);
    uint32_t result = 0;
    if (!certified_search(z, &result) && !fast_path(z, &result)) result = search(z);
    index[b] = result;
  }
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
  static constexpr float kMaxLatticeAbs = e8p_detail::kMaxLatticeAbs;

  /// Index of the nearest codeword to kInputScale·x.
  E8KV_HD static uint32_t encode(const float x[8]) {
    float z[8];
    for (int i = 0; i < 8; ++i) z[i] = fp::mul(x[i], kInputScale);
    return encode_lattice(z);
  }

  /// encode() of `count` consecutive blocks: index[b] = encode(x + 8b). The host runs it on
  /// vectors of 4 or 8 blocks (AVX2 when the CPU has it); the indices are the same.
  E8KV_HD static void encode_batch(const float* x, size_t count, uint32_t* index) {
    e8p_detail::encode_batch(x, kInputScale, count, index);
  }

  /// encode_lattice() of `count` consecutive blocks.
  E8KV_HD static void encode_lattice_batch(const float* z, size_t count, uint32_t* index) {
    e8p_detail::encode_batch(z, 1.0f, count, index);  // 1·z is z exactly, NaN included
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
    if (e8p_detail::certified_search(zs, &index)) return index;
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
