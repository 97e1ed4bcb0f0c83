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
// blocks at once with vector instructions (AVX2 chosen at run time where the CPU has it). The
// paged GPU encoders share each open block's exhaustive step across the warp, one slice of the
// search order per lane (encode_with + detail/search_fallback.hpp): the same index.
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
// under nvcc, one __constant__ copy per translation unit (plus the patterns in global memory for
// the warp-shared search's coalesced reads).
#pragma once

#include <cstdint>

#include "e8kv/codebook/detail/e8p_batch_search.hpp"
#include "e8kv/platform.hpp"

namespace e8kv::codebook {

struct E8P {
  static constexpr const char* kName = "e8p";
  static constexpr int kIndexBits = 16;
  /// E8P quantizes kInputScale·x (measured optimum for unit-variance input, see the file comment).
  static constexpr float kInputScale = 1.03f;
  static constexpr float kInverseInputScale = 1.0f / kInputScale;
  /// Lattice-unit coordinates are clamped to ±kMaxLatticeAbs before encoding (NaN → 0).
  static constexpr float kMaxLatticeAbs = e8p_detail::kMaxLatticeAbs;

  /// Index of the nearest codeword to kInputScale·x.
  E8KV_HD static uint32_t encode(const float x[8]) { return encode_with(x, SerialFallback{}); }

  /// encode() with the near-ties' exhaustive search done by `fallback` (search_fallback.hpp):
  /// the same index whatever the policy.
  template <class Fallback>
  E8KV_HD static uint32_t encode_with(const float x[8], const Fallback& fallback) {
    float z[8];
    for (int i = 0; i < 8; ++i) z[i] = fp::mul(x[i], kInputScale);
    return encode_lattice_with(z, fallback);
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
  E8KV_HD static uint32_t encode_lattice(const float z[8]) { return encode_lattice_with(z, SerialFallback{}); }

  /// encode_lattice() with the exhaustive step done by `fallback`; every lane calls the policy.
  template <class Fallback>
  E8KV_HD static uint32_t encode_lattice_with(const float z[8], const Fallback& fallback) {
    float zs[8];
    for (int i = 0; i < 8; ++i) zs[i] = fp::sanitize(z[i], kMaxLatticeAbs);
    uint32_t index = 0;
    const bool decided = e8p_detail::certified_search(zs, &index) || e8p_detail::fast_path(zs, &index);
    return fallback.template resolve<e8p_detail::Exhaustive>(zs, decided, index);
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
