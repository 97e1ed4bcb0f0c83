// Host-side table decoders for the fast-tier codes (E8P, Rvq3, Rvq4): the same floats as
// Code::decode, bit for bit, in a form the compiler vectorizes. decode_lattice builds each
// coordinate from bit fields with a branch per sign; here a block is one row of magnitudes, one
// row of sign masks (XOR on the float sign bit is exactly negation) and one add of the shift
// row, eight lanes wide. Used by decode_vector on the host; the device keeps the bit-field decoders (its tables
// live in __constant__ memory, where per-lane row loads would serialize).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/numeric/fp.hpp"

namespace e8kv::codebook::host_decode {

// E8P's sign rule: the 7 stored sign bits give coordinates 1-7; coordinate 0's sign makes the
// count of negatives even, flipped when the pattern's parity bit is set. Both parts are folded
// into the rows, so a block is one magnitude row XOR one sign row, plus the ±1/4 shift:
//   magnitude[p] = |z| of pattern p, with coordinate 0's float sign bit set when p's parity bit is
//   sign[s]      = float sign bits of coordinates 1-7 from s, and of coordinate 0 from parity(s).
// XOR is commutative, so the bits equal those of E8P::decode_lattice exactly.
struct E8pRows {
  alignas(32) uint32_t magnitude[256][8];  ///< |z_i| of pattern id p (lattice units), parity folded in
  alignas(32) uint32_t sign[128][8];       ///< 0x80000000 in each lane that a 7-bit sign field negates
  alignas(32) float shift[2][8];           ///< +1/4 (index bit 0 clear) or -1/4 in every lane
};

inline const E8pRows& e8p_rows() {
  static const E8pRows rows = [] {
    E8pRows r{};
    const auto& t = e8p_detail::kHostTables;
    for (int p = 0; p < 256; ++p) {
      for (int i = 0; i < 8; ++i) {
        const float m = e8p_detail::magnitude(t.pattern[p], i);
        std::memcpy(&r.magnitude[p][i], &m, sizeof m);
      }
      if ((t.pattern[p] >> 16) & 1u) r.magnitude[p][0] ^= 0x80000000u;
    }
    for (int s = 0; s < 128; ++s) {
      int ones = 0;
      for (int b = 0; b < 7; ++b) ones += (s >> b) & 1;
      const int negative = (s << 1) | (ones & 1);
      for (int i = 0; i < 8; ++i) r.sign[s][i] = ((negative >> i) & 1) ? 0x80000000u : 0u;
    }
    for (int i = 0; i < 8; ++i) {
      r.shift[0][i] = 0.25f;
      r.shift[1][i] = -0.25f;
    }
    return r;
  }();
  return rows;
}

struct E81bRows {
  alignas(32) float point[256][8];
};

inline const E81bRows& e81b_rows() {
  static const E81bRows rows = [] {
    E81bRows r{};
    for (int p = 0; p < 256; ++p)
      for (int i = 0; i < 8; ++i) r.point[p][i] = e81b_detail::coordinate(e81b_detail::kHostTables.point[p], i);
    return r;
  }();
  return rows;
}

/// Both tables, fetched once by a caller that decodes many blocks (each fetch tests a guard).
struct Tables {
  const E8pRows* e8p;
  const E81bRows* e81b;
};
inline Tables tables() { return {&e8p_rows(), &e81b_rows()}; }

/// E8P::decode_lattice(index, z), table form.
E8KV_FORCE_INLINE void e8p_lattice(const E8pRows& r, uint32_t index, float z[8]) {
  const uint32_t* m = r.magnitude[(index >> 8) & 0xFFu];
  const uint32_t* s = r.sign[(index >> 1) & 0x7Fu];
  const float* shift = r.shift[index & 1u];
  uint32_t bits[8];
  for (int i = 0; i < 8; ++i) bits[i] = m[i] ^ s[i];
  std::memcpy(z, bits, sizeof bits);
  for (int i = 0; i < 8; ++i) z[i] = z[i] + shift[i];
}

/// True for the codes this header decodes.
template <class Code>
inline constexpr bool kHasTableDecode =
    std::is_same_v<Code, E8P> || std::is_same_v<Code, Rvq3> || std::is_same_v<Code, Rvq4>;

/// The codes decoded through the tables on the host: all three. Since the parity fold and the
/// in-place residual row, the table form is the faster one for each (e8kv-micro BM_*Decode vs
/// BM_*DecodeTable, one core, baseline build: E8P 1.45 vs 4.25, Rvq3 0.94 vs 2.88, Rvq4 0.80 vs
/// 2.08 G elements/s). Kept as a switch so a code can opt out again if that changes.
template <class Code>
inline constexpr bool kPreferTableDecode = kHasTableDecode<Code>;

/// Code::decode(index, y), table form.
template <class Code>
E8KV_FORCE_INLINE void decode_block(const Tables& t, uint32_t index, float y[8]) {
  static_assert(kHasTableDecode<Code>, "no table decoder for this code");
  float c1[8];
  e8p_lattice(*t.e8p, index & 0xFFFFu, c1);
  if constexpr (std::is_same_v<Code, E8P>) {
    for (int i = 0; i < 8; ++i) y[i] = c1[i] * E8P::kInverseInputScale;
  } else {
    if constexpr (std::is_same_v<Code, Rvq3>) {
      // Read the row in place: a copy into a local array made GCC split it into two 16-byte
      // stores read back as one 32-byte load, a store-forwarding stall per block.
      const float* c2 = t.e81b->point[(index >> 16) & 0xFFu];
      for (int i = 0; i < 8; ++i) y[i] = (c1[i] + c2[i] * Code::kInverseResidualScale) * Code::kInverseInputScale;
    } else {
      float c2[8];
      e8p_lattice(*t.e8p, index >> 16, c2);
      for (int i = 0; i < 8; ++i) y[i] = (c1[i] + c2[i] * Code::kInverseResidualScale) * Code::kInverseInputScale;
    }
  }
}
template <class Code>
E8KV_FORCE_INLINE void decode_block(uint32_t index, float y[8]) {
  decode_block<Code>(tables(), index, y);
}

/// Code::decode(index, y), then y·gain: the floats of decode_vector, for one block.
template <class Code>
E8KV_FORCE_INLINE void decode_scaled_block(const Tables& t, uint32_t index, float gain, float y[8]) {
  float q[8];
  decode_block<Code>(t, index, q);
  for (int i = 0; i < 8; ++i) y[i] = gain * q[i];
}
template <class Code>
E8KV_FORCE_INLINE void decode_scaled_block(uint32_t index, float gain, float y[8]) {
  decode_scaled_block<Code>(tables(), index, gain, y);
}

}  // namespace e8kv::codebook::host_decode
