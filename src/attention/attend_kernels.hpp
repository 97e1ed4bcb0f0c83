// The CPU decode attention's kernels, one struct per ISA (attend_kernels.inc, included twice):
// KernelsPortable for any x86-64 (or other) host, KernelsAvx2Fma where the CPU has AVX2, FMA and
// F16C (cpu_has_avx2_fma()). Internal (not installed).
//
// A "row decoder" yields block j (8 floats) of one stored vector, straight from its bytes:
//   E8pRowDecoder, Rvq3RowDecoder, Rvq4RowDecoder   block codes, in lattice units (no gain, no
//                                                   input scale: both are folded into the query
//                                                   and the weights), decoded in registers from
//                                                   the host tables (magnitude XOR sign + shift);
//   Fp16RowDecoder                                  fp16 rows (window, fp16 codec, dense baseline);
//   Fp32RowDecoder                                  float rows (keys decoded ahead of time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "detail/simd.hpp"
#include "e8kv/codebook/host_decode.hpp"

namespace e8kv::attention::kernels {

/// Little-endian index of `bytes` bytes.
E8KV_FORCE_INLINE uint32_t load_index(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int b = 0; b < bytes; ++b) v |= static_cast<uint32_t>(p[b]) << (8 * b);
  return v;
}

/// What E8P's low index byte b (shift bit 0, sign bits 1-7) selects: the sign masks and the
/// ±1/4 shift side by side, so one scaled byte addresses both (no bit-field arithmetic).
struct E8pLowRow {
  uint32_t sign[8];  ///< sign masks of b's bits 1-7 (and coordinate 0's, by parity)
  float shift[8];    ///< +1/4 (bit 0 clear) or -1/4
};

/// The rows the register decoders read, built once from the host decode tables. E8P's index
/// bytes are used as they lie in memory: the low byte picks a sign-and-shift row, the high byte
/// (pattern id) a magnitude row, so a block costs one 16-bit load, two byte extractions and two
/// scalings.
struct DecodeRows {
  alignas(64) uint32_t magnitude[256][8];  ///< |z| of pattern p, coordinate 0's parity sign folded in
  alignas(64) E8pLowRow low[256];          ///< by E8P's low index byte
  alignas(32) float rvq3_residual[256][8]; ///< E81B point p times 1/s2 (Rvq3's second stage)
};

inline const DecodeRows& decode_rows() {
  static const DecodeRows rows = [] {
    DecodeRows r{};
    const auto& e8p = codebook::host_decode::e8p_rows();
    const auto& e81b = codebook::host_decode::e81b_rows();
    std::memcpy(r.magnitude, e8p.magnitude, sizeof r.magnitude);
    for (int b = 0; b < 256; ++b) {
      std::memcpy(r.low[b].sign, e8p.sign[b >> 1], sizeof r.low[b].sign);
      std::memcpy(r.low[b].shift, e8p.shift[b & 1], sizeof r.low[b].shift);
    }
    for (int p = 0; p < 256; ++p)
      for (int i = 0; i < 8; ++i) r.rvq3_residual[p][i] = e81b.point[p][i] * codebook::Rvq3::kInverseResidualScale;
    return r;
  }();
  return rows;
}

#define E8KV_KERNELS KernelsPortable
#define E8KV_KERNEL_TARGET
#define E8KV_KERNEL_ISA simd::IsaPortable
#include "attention/attend_kernels.inc"
#undef E8KV_KERNELS
#undef E8KV_KERNEL_TARGET
#undef E8KV_KERNEL_ISA

#if E8KV_HOST_AVX2_DISPATCH
#define E8KV_KERNELS KernelsAvx2Fma
#define E8KV_KERNEL_TARGET __attribute__((target("avx2,fma,f16c")))
#define E8KV_KERNEL_ISA simd::IsaAvx2Fma
#include "attention/attend_kernels.inc"
#undef E8KV_KERNELS
#undef E8KV_KERNEL_TARGET
#undef E8KV_KERNEL_ISA
#endif

}  // namespace e8kv::attention::kernels
