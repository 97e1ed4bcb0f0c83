// Host-side table decoders for the fast-tier codes (E8P, Rvq3, Rvq4): the same floats as
// Code::decode, bit for bit, in a form the compiler vectorizes. decode_lattice builds each
// coordinate from bit fields with a branch per sign; here a block is one row of magnitudes, one
// row of sign masks (XOR on the float sign bit is exactly negation) and one add, eight lanes
// wide. Used by decode_vector on the host; the device keeps the bit-field decoders (its tables
// live in __constant__ memory, where per-lane row loads would serialize).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/numeric/fp.hpp"

namespace e8kv::codebook::host_decode {

struct E8pRows {
  alignas(32) float magnitude[256][8];  ///< |z_i| of pattern id p, lattice units
  alignas(32) uint32_t sign[256][8];    ///< 0x80000000 in lane i when bit i of the mask is set
  uint8_t parity_bit[256];              ///< bit 16 of the pattern entry
  uint8_t parity7[128];                 ///< parity of a 7-bit sign field
};

inline const E8pRows& e8p_rows() {
  static const E8pRows rows = [] {
    E8pRows r{};
    const auto& t = e8p_detail::kHostTables;
    for (int p = 0; p < 256; ++p) {
      for (int i = 0; i < 8; ++i) r.magnitude[p][i] = e8p_detail::magnitude(t.pattern[p], i);
      r.parity_bit[p] = static_cast<uint8_t>((t.pattern[p] >> 16) & 1u);
    }
    for (int m = 0; m < 256; ++m)
      for (int i = 0; i < 8; ++i) r.sign[m][i] = ((m >> i) & 1) ? 0x80000000u : 0u;
    for (int s = 0; s < 128; ++s) {
      int ones = 0;
      for (int b = 0; b < 7; ++b) ones += (s >> b) & 1;
      r.parity7[s] = static_cast<uint8_t>(ones & 1);
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

/// E8P::decode_lattice(index, z), table form.
E8KV_FORCE_INLINE void e8p_lattice(const E8pRows& r, uint32_t index, float z[8]) {
  const uint32_t id = (index >> 8) & 0xFFu;
  const uint32_t signs = (index >> 1) & 0x7Fu;
  const uint32_t negative = (signs << 1) | ((r.parity7[signs] ^ r.parity_bit[id]) & 1u);
  const float shift = (index & 1u) ? -0.25f : 0.25f;
  uint32_t bits[8];
  std::memcpy(bits, r.magnitude[id], sizeof bits);
  for (int i = 0; i < 8; ++i) bits[i] ^= r.sign[negative][i];
  std::memcpy(z, bits, sizeof bits);
  for (int i = 0; i < 8; ++i) z[i] = z[i] + shift;
}

/// True for the codes this header decodes.
template <class Code>
inline constexpr bool kHasTableDecode =
    std::is_same_v<Code, E8P> || std::is_same_v<Code, Rvq3> || std::is_same_v<Code, Rvq4>;

/// The codes whose table decoder is the faster one (e8kv-micro BM_*Decode vs BM_*DecodeTable, and
/// attend at 4K): E8P and Rvq3. Rvq4's two E8P stages decode faster from bit fields (0.83 vs
/// 0.72 G elements/s alone; K4V2 attend 20.0 vs 21.9 ms), so it keeps Code::decode.
template <class Code>
inline constexpr bool kPreferTableDecode = std::is_same_v<Code, E8P> || std::is_same_v<Code, Rvq3>;

/// Code::decode(index, y), table form.
template <class Code>
E8KV_FORCE_INLINE void decode_block(uint32_t index, float y[8]) {
  static_assert(kHasTableDecode<Code>, "no table decoder for this code");
  const E8pRows& r = e8p_rows();
  float c1[8];
  e8p_lattice(r, index & 0xFFFFu, c1);
  if constexpr (std::is_same_v<Code, E8P>) {
    for (int i = 0; i < 8; ++i) y[i] = c1[i] * E8P::kInverseInputScale;
  } else {
    float c2[8];
    if constexpr (std::is_same_v<Code, Rvq3>) {
      std::memcpy(c2, e81b_rows().point[(index >> 16) & 0xFFu], sizeof c2);
    } else {
      e8p_lattice(r, index >> 16, c2);
    }
    for (int i = 0; i < 8; ++i) y[i] = (c1[i] + c2[i] * Code::kInverseResidualScale) * Code::kInverseInputScale;
  }
}

/// Code::decode(index, y), then y·gain: the floats of decode_vector, for one block.
template <class Code>
E8KV_FORCE_INLINE void decode_scaled_block(uint32_t index, float gain, float y[8]) {
  float q[8];
  decode_block<Code>(index, q);
  for (int i = 0; i < 8; ++i) y[i] = gain * q[i];
}

}  // namespace e8kv::codebook::host_decode
