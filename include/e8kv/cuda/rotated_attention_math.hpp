// The math of decode attention over keys coded as RoPE residuals (or post-RoPE), as pure
// host/device functions: the tensor-core kernel (cuda/detail/rotated_attention_kernel.cuh) runs
// them per lane, and tests/cache/paged_rotated_attention_test.cpp runs the same functions for
// all 32 lanes of a warp on the CPU, with the warp's mma.sync emulated, against e8kv::attend.
// No CUDA header is needed: g++ compiles this file as it is.
//
// Form of the scores (docs/paged_layout.md, "Decode attention"). A key is coded as
// c = code(H·D·S·(k − R_t·μ)), decoded as k̂ = S⁻¹·Dᵀ·Hᵀ·(g·ĉ/α) + R_t·μ (α the codebook's
// input scale; μ = 0 for post-RoPE keys without centring, R_t = I for post-RoPE keys), so
//   q·k̂ = g·(q̃·ĉ) + q·R_t·μ,   q̃ = H·D·S⁻¹·q / α.
// The first term is a product of the lattice points ĉ (exact in tf32: multiples of 1/4 or 1/2
// below 3) with q̃, on tensor cores (mma.sync m16n8k8 .tf32, fp32 accumulation): a 16-token tile
// of keys is the A operand, q̃ of the (up to 8) query heads of one KV head the B operand, split
// into a tf32 high part and a remainder (two products: error ~2^-21 relative, fp32-like). E8P's
// ±1/4 shift is not decoded per element: its share t·Σ_block q̃ is a third, small product over
// blocks. The second term, Σ_p A_p·cos(θ_p·t) + B_p·sin(θ_p·t) over rotary pairs (A_p = q_a·μ_a
// + q_b·μ_b, B_p = q_b·μ_a − q_a·μ_b), is a product too: with t = 1024·U + Δ, R_t = R_Δ·R_{1024U}, the
// coefficients are formed once per run of tiles with the same U from R_{1024U}·μ, and the
// cos/sin of Δ·θ come from one table (rope_delta_table, pre-split into tf32 high and low parts),
// shared by every KV head and query head. Three products (hi·hi, hi·lo, lo·hi).
// Values accumulate in the rotated domain, o += Σ_t p_t·g_t·ĉ_t (the probabilities times the
// gains are the B operand, high and low parts; the values' points the A operand), and are rotated
// back once per output row by the reduction kernel.
//
// Fragment layouts (PTX ISA, mma.m16n8k8 with .tf32; lane = 4·grp + tig):
//   A (16×8, row): a0 (grp, tig), a1 (grp+8, tig), a2 (grp, tig+4), a3 (grp+8, tig+4)
//   B (8×8, col):  b0 (k tig, n grp), b1 (k tig+4, n grp)
//   C/D (16×8):    c0 (grp, 2·tig), c1 (grp, 2·tig+1), c2 (grp+8, 2·tig), c3 (grp+8, 2·tig+1)
// The summation index k of every product is ours to order: it is permuted so that each lane
// decodes whole 8-element blocks (one index, one sign word, one pattern per block) and never a
// block another lane decodes:
//   scores (M = tokens, N = query heads, K = elements): lane tig owns key blocks
//     tig·NB/4 .. tig·NB/4 + NB/4 − 1 (NB = D/8) of the tile's tokens grp and grp+8; k-step
//     κ = 4·s + e covers elements e and e+4 of its block s;
//   key shifts (K = blocks): k-step σ covers the lanes' blocks 2σ (columns 0-3) and 2σ+1 (4-7);
//   mean term (K = 2·pairs): k-step κ covers cos (columns 0-3) and sin (4-7) of pairs 4κ..4κ+3;
//   values (M = elements, N = query heads, K = tokens): lane grp owns value blocks
//     grp·NB/8 .. grp·NB/8 + NB/8 − 1 of the tokens tig, tig+4 of each 8-token k-step; m-tile μ's
//     rows grp and grp+8 are the elements μ % 4 and μ % 4 + 4 of its block μ / 4;
//   value shifts (M = blocks): rows grp and grp+8 of m-tile ς are its blocks 2ς and 2ς+1.
#pragma once

#include <cstdint>

#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/platform.hpp"

namespace e8kv::cuda {

// ---- tf32 ---------------------------------------------------------------------------------------

/// x rounded to tf32 (10 explicit mantissa bits), nearest with ties away from zero: PTX
/// cvt.rna.tf32.f32, whose result the tensor cores read exactly. Inf and NaN are kept.
E8KV_HD E8KV_FORCE_INLINE float round_tf32(float x) {
#if E8KV_ON_DEVICE
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
#else
  uint32_t u = e8kv::detail::float_bits(x);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return e8kv::detail::bits_float(u);
#endif
}

/// x ≈ hi + lo, both valid tf32 values (hi = round_tf32(x), lo = round_tf32(x − hi)): every
/// operand a tensor core reads is then exactly what it holds (PTX leaves the reading of an f32
/// with non-zero low mantissa bits to the implementation), and hi + lo carries ~22 bits of x:
/// |x − hi − lo| <= 2^-22·|x|.
E8KV_HD E8KV_FORCE_INLINE void split_tf32(float x, float& hi, float& lo) {
  hi = round_tf32(x);
  lo = round_tf32(x - hi);
}

/// True when x is a valid tf32 value (its low 13 mantissa bits are zero); the CPU emulation of
/// mma.sync checks every operand with it.
inline bool is_tf32(float x) { return (e8kv::detail::float_bits(x) & 0x1fffu) == 0; }

/// Four floats, 16-byte aligned (one vector load): the high and low parts of a lane's two B
/// fragment registers (b0 hi, b1 hi, b0 lo, b1 lo), or a rope_delta_table entry (cos hi, sin hi,
/// cos lo, sin lo).
struct alignas(16) RotF4 {
  float x, y, z, w;
};

// ---- shapes -------------------------------------------------------------------------------------

/// Tokens of one warp tile (the M of the score product).
inline constexpr int kRotTileTokens = 16;
/// Query heads of one product (the N of every product): GQA groups of up to 8 share one KV head's
/// decoded tiles; larger groups take several CTAs (query chunks), smaller ones leave columns zero.
inline constexpr int kRotQueryHeads = 8;

template <int D>
struct RotShape {
  static_assert(D == 64 || D == 128 || D == 256, "decode attention head_dim: 64, 128 or 256");
  static constexpr int kBlocks = D / 8;                     ///< 8-element blocks per vector
  static constexpr int kKeyBlocksPerLane = kBlocks / 4;     ///< key blocks a lane decodes per token row
  static constexpr int kKeySteps = kBlocks;                 ///< k-steps of the score product
  static constexpr int kShiftSteps = kBlocks / 8;           ///< k-steps of the key-shift product
  static constexpr int kValueBlocksPerLane = kBlocks / 8;   ///< value blocks a lane decodes per token
  static constexpr int kValueTiles = D / 16;                ///< m-tiles of the value product
  static constexpr int kValueShiftTiles = kBlocks / 16 > 0 ? kBlocks / 16 : 1;
};

/// Score product k-step κ, column col (0..7): the element of the key vector it multiplies.
template <int D>
E8KV_HD constexpr int rot_key_element(int kstep, int col) {
  const int block = (col & 3) * RotShape<D>::kKeyBlocksPerLane + (kstep >> 2);
  return 8 * block + (kstep & 3) + 4 * (col >> 2);
}

/// Key-shift product k-step σ, column col: the key block it multiplies.
template <int D>
E8KV_HD constexpr int rot_key_shift_block(int sstep, int col) {
  return (col & 3) * RotShape<D>::kKeyBlocksPerLane + 2 * sstep + (col >> 2);
}

/// Value product m-tile μ, row r (0..15): the element of the value vector it accumulates: lane
/// grp = r % 8 owns the blocks grp·NB/8 .. ; m-tile μ reads its block μ / 4, elements μ % 4 (row
/// grp) and μ % 4 + 4 (row grp + 8).
template <int D>
E8KV_HD constexpr int rot_value_element(int mtile, int row) {
  return 8 * ((row & 7) * RotShape<D>::kValueBlocksPerLane + (mtile >> 2)) + (mtile & 3) + 4 * (row >> 3);
}

/// Value-shift m-tile ς, row r: the value block it accumulates, or −1 for a padding row.
template <int D>
E8KV_HD constexpr int rot_value_shift_block(int stile, int row) {
  const int w = 2 * stile + (row >> 3);
  return w < RotShape<D>::kValueBlocksPerLane ? (row & 7) * RotShape<D>::kValueBlocksPerLane + w : -1;
}

/// The inverse maps, for filling fragments: where element e of a key goes in the score product
/// (k-step, column), where block j goes in the key-shift product, where element e of a value is
/// accumulated (m-tile, row).
template <int D>
E8KV_HD constexpr void rot_key_slot(int element, int& kstep, int& col) {
  constexpr int kpl = RotShape<D>::kKeyBlocksPerLane;
  const int block = element >> 3, r = element & 7;
  kstep = 4 * (block % kpl) + (r & 3);
  col = block / kpl + 4 * (r >> 2);
}
template <int D>
E8KV_HD constexpr void rot_key_shift_slot(int block, int& sstep, int& col) {
  constexpr int kpl = RotShape<D>::kKeyBlocksPerLane;
  const int s = block % kpl;
  sstep = s >> 1;
  col = block / kpl + 4 * (s & 1);
}
template <int D>
E8KV_HD constexpr void rot_value_slot(int element, int& mtile, int& row) {
  constexpr int vpl = RotShape<D>::kValueBlocksPerLane;
  const int block = element >> 3, r = element & 7;
  mtile = 4 * (block % vpl) + (r & 3);
  row = block / vpl + 8 * (r >> 2);
}

/// Stores x, split into tf32 high and low parts, as the B operand (K = `col` of the k-step, N =
/// query head `head`) of k-step `step` of a product whose fragments are laid out
/// [steps][32 lanes] (the lane holding (k, n) is 4·n + k % 4; b0 is k < 4, b1 k >= 4).
E8KV_HD E8KV_FORCE_INLINE void rot_store_b(RotF4* frags, int step, int col, int head, float x) {
  float* e = &frags[step * 32 + 4 * head + (col & 3)].x;
  split_tf32(x, e[col >> 2], e[2 + (col >> 2)]);
}

// ---- block decoders (lattice units, no shift, no gain, no input scale) -------------------------
// A coordinate costs three instructions: a byte permute builds the float ±(2^23 + code) from a
// byte table of the pattern's codes and a word of sign bytes (0x4B or 0xCB), then
// |x| − (2^23 − 1/2) and the sign bit back. Both operands of a k-step (coordinates e and e+4) sit
// in one word of the table: [code_e, 0 (coordinate 0's word: the pattern's parity bit), code_{e+4}, 0].

/// PRMT / __byte_perm: byte k of the result is byte ((sel >> 4k) & 7) of {b:a} (a bytes 0-3).
E8KV_HD E8KV_FORCE_INLINE uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if E8KV_ON_DEVICE
  return __byte_perm(a, b, sel);
#else
  const uint64_t src = static_cast<uint64_t>(b) << 32 | a;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= static_cast<uint32_t>((src >> (8 * ((sel >> (4 * k)) & 7u))) & 0xFFu) << (8 * k);
  return r;
#endif
}

/// Per E8P pattern: 4 words, word e = code_e | parity << 8 (e = 0) | code_{e+4} << 16, code_i =
/// |z_i| − 1/2 (0, 1 or 2) of coordinate i and parity the pattern's sign-parity bit.
struct RotE8pBytes {
  uint32_t w[256][4];
};
constexpr RotE8pBytes build_rot_e8p_bytes() {
  RotE8pBytes t{};
  const auto tables = codebook::e8p_detail::build_tables();
  for (int p = 0; p < 256; ++p) {
    const uint32_t entry = tables.pattern[p];
    for (int e = 0; e < 4; ++e) {
      const uint32_t lo = (entry >> (14 - 2 * e)) & 3u, hi = (entry >> (14 - 2 * (e + 4))) & 3u;
      t.w[p][e] = lo | (e == 0 ? ((entry >> 16) & 1u) << 8 : 0u) | hi << 16;
    }
  }
  return t;
}

/// Per E81B point: 4 words, word e = nibble_e | nibble_{e+4} << 16 (coordinate = nibble/2 − 2).
struct RotE81bBytes {
  uint32_t w[256][4];
};
constexpr RotE81bBytes build_rot_e81b_bytes() {
  RotE81bBytes t{};
  const auto tables = codebook::e81b_detail::build_tables();
  for (int p = 0; p < 256; ++p)
    for (int e = 0; e < 4; ++e)
      t.w[p][e] = ((tables.point[p] >> (4 * e)) & 15u) | ((tables.point[p] >> (4 * (e + 4))) & 15u) << 16;
  return t;
}

inline constexpr RotE8pBytes kHostRotE8pBytes = build_rot_e8p_bytes();
inline constexpr RotE81bBytes kHostRotE81bBytes = build_rot_e81b_bytes();

/// Sign bytes of 4 coordinates: byte k is 0xCB when bit k of n4 is set, else 0x4B.
E8KV_HD E8KV_FORCE_INLINE uint32_t rot_sign_bytes(uint32_t n4) {
  return ((n4 * 0x10204080u) & 0x80808080u) | 0x4B4B4B4Bu;
}

/// One E8P block, ready for per-coordinate reads: the pattern's byte words, the sign bytes of
/// coordinates 0-3 and 4-7 (coordinate 0's sign from the parity rule) and the ±1/4 shift.
struct E8pBlock {
  uint32_t w[4] = {0, 0, 0, 0};
  uint32_t s_lo = 0, s_hi = 0;
  float shift = 0.f;
};

/// bytes: RotE8pBytes (a shared-memory copy on the device; 16-byte rows).
E8KV_HD E8KV_FORCE_INLINE E8pBlock e8p_block(const uint32_t* bytes, uint32_t index) {
  E8pBlock b;
  const uint32_t* row = bytes + 4 * ((index >> 8) & 0xFFu);
#if E8KV_ON_DEVICE
  const uint4 v = *reinterpret_cast<const uint4*>(row);
  b.w[0] = v.x, b.w[1] = v.y, b.w[2] = v.z, b.w[3] = v.w;
#else
  for (int e = 0; e < 4; ++e) b.w[e] = row[e];
#endif
  const uint32_t signs = index & 0xFEu;
  const uint32_t neg = signs | ((static_cast<uint32_t>(codebook::e8p_detail::popcount32(signs)) ^ (b.w[0] >> 8)) & 1u);
  b.s_lo = rot_sign_bytes(neg & 0xFu);
  b.s_hi = rot_sign_bytes(neg >> 4);
  b.shift = e8kv::detail::bits_float(0x3E800000u | (index << 31));  // +1/4, or −1/4 when bit 0 is set
  return b;
}

/// ±(2^23 + code) -> ±(code + 1/2): |x| − (2^23 − 1/2), then x's sign (exact).
E8KV_HD E8KV_FORCE_INLINE float rot_half_odd(uint32_t x) {
  const float m = fabsf(e8kv::detail::bits_float(x)) - 8388607.5f;
  return e8kv::detail::bits_float(e8kv::detail::float_bits(m) | (x & 0x80000000u));
}

/// Coordinate i (0..7) of the block without its shift: E8P::decode_lattice(index)[i] ==
/// e8p_coordinate(block, i) + block.shift exactly.
E8KV_HD E8KV_FORCE_INLINE float e8p_coordinate(const E8pBlock& b, int i) {
  const int e = i & 3;
  const uint32_t x = i < 4 ? byte_perm(b.w[e], b.s_lo, 0x0330u | (4u + e) << 12)
                           : byte_perm(b.w[e], b.s_hi, 0x0332u | (4u + e) << 12);
  return rot_half_odd(x);
}

/// Coordinate i of an E81B point from its byte words (RotE81bBytes row): nibble/2 − 2, exact:
/// (2^23 + nibble)·1/2 − (2^22 + 2).
E8KV_HD E8KV_FORCE_INLINE float e81b_coordinate(const uint32_t* w, int i) {
  const uint32_t x = byte_perm(w[i & 3], 0x4B000000u, i < 4 ? 0x7330u : 0x7332u);
  return e8kv::detail::bits_float(x) * 0.5f - 4194306.0f;
}

/// Bytes of one block index of a block code (0 for the fp16 "codec": 16 bytes of 8 halves).
template <class Code>
inline constexpr int kRotIndexBytes = Code::kIndexBits / 8;

/// Little-endian index of `bytes` bytes at byte offset `at` of the words w (compile-time offsets).
template <int kBytes>
E8KV_HD E8KV_FORCE_INLINE uint32_t rot_index_at(const uint32_t* w, int at) {
  const int word = at >> 2, shift = 8 * (at & 3);
  uint32_t v = w[word] >> shift;
  if (shift + 8 * kBytes > 32) v |= w[word + 1] << (32 - shift);
  return kBytes == 4 ? v : (v & ((1u << (8 * kBytes)) - 1u));
}

// ---- coefficients ---------------------------------------------------------------------------------

/// Mean-term coefficients of one rotary pair (a, b) for a query q and a mean μ turned by the
/// upper part of the position (cu, su: cos/sin of 1024·U·θ): μ' = R·μ, A = q_a·μ'_a + q_b·μ'_b,
/// B = q_b·μ'_a − q_a·μ'_b, so that q·R_{1024U+Δ}·μ = Σ_p A_p·cos(Δθ_p) + B_p·sin(Δθ_p).
E8KV_HD E8KV_FORCE_INLINE void rot_mean_coefficients(float qa, float qb, float ma, float mb, float cu, float su,
                                                     float& A, float& B) {
  const float ra = ma * cu - mb * su;
  const float rb = ma * su + mb * cu;
  A = qa * ra + qb * rb;
  B = qb * ra - qa * rb;
}

/// The upper part of a position for the mean term (positions below 0 count as 0).
E8KV_HD E8KV_FORCE_INLINE uint32_t rot_upper(int32_t position) {
  return position < 0 ? 0u : static_cast<uint32_t>(position) >> 10;
}

/// cos/sin of 1024·U·θ_pair from the 3-level RoPE table (quant::build_rope_table: level 1 holds
/// bits 10-19 of a position, level 2 bits 20-30), composed as rope_table_cos_sin composes them.
E8KV_HD E8KV_FORCE_INLINE void rot_upper_cos_sin(const float* rope_table, int pairs, uint32_t upper, int pair, float& cu,
                                                 float& su) {
  const int64_t row = static_cast<int64_t>(pairs) * 2;
  const float* mid = rope_table + (1024 + static_cast<int64_t>(upper & 1023u)) * row + 2 * pair;
  const float* high = rope_table + (2048 + static_cast<int64_t>(upper >> 10)) * row + 2 * pair;
  cu = mid[0] * high[0] - mid[1] * high[1];
  su = mid[0] * high[1] + mid[1] * high[0];
}

/// Stores the mean-term coefficients (A, B) of rotary pair `pair` and query head `head`, times
/// `factor` (the softmax scale in the log2 domain), as the B operand of the mean product: k-step
/// pair / 4, column pair % 4 (cos: A) and pair % 4 + 4 (sin: B).
E8KV_HD E8KV_FORCE_INLINE void rot_store_mean(RotF4* bmean, int pair, int head, float A, float B, float factor) {
  rot_store_b(bmean, pair >> 2, pair & 3, head, A * factor);
  rot_store_b(bmean, pair >> 2, (pair & 3) + 4, head, B * factor);
}

}  // namespace e8kv::cuda
