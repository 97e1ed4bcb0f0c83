// 8-bit per-vector gains: a log-domain code relative to a per-(layer, head, kind) reference.
//
// An fp16 gain costs 16 bits per vector, 0.25 bits per element at head_dim 64 — a tenth of a
// K3V2 cache. Gains of one head vary little: on SmolLM2 the centred key and value norms of every
// (layer, head) stay within ±1.7 octaves of their geometric mean. So an 8-bit code of
// log2(g / ref) in steps of 1/32 octave (±4 octaves around the reference) is enough: the
// relative gain error is at most 1.1 % (RMS 0.63 %), adding ~4e-5 to a unit-variance vector's
// relative MSE. The error is a scale error, though: it moves a key's logit in proportion to
// q·k, so it is kept well below the codes' own error. Code 0 is gain 0 (a zero vector); gains
// beyond the range saturate to codes 1 and 255.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "e8kv/numeric/half.hpp"
#include "e8kv/platform.hpp"

namespace e8kv::quant {

inline constexpr int kGainCodeStepsPerOctave = 32;
inline constexpr int kGainCodeCentre = 128;

/// 2^((c − 128) / 32) for c = 1..255 (entry 0 is 0): the factor of code c, as a float.
inline const std::array<float, 256>& gain_code_factors() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 1; c < 256; ++c)
      t[static_cast<size_t>(c)] =
          static_cast<float>(std::exp2(static_cast<double>(c - kGainCodeCentre) / kGainCodeStepsPerOctave));
    return t;
  }();
  return table;
}

/// The gain of code c: ref · factor(c) (0 for code 0).
inline float gain_from_code(float ref, uint8_t c) { return ref * gain_code_factors()[c]; }

/// The code whose gain is nearest to `gain` in log scale; 0 for gain <= 0 or a non-positive ref.
inline uint8_t gain_to_code(float gain, float ref) {
  if (!(gain > 0.f) || !(ref > 0.f) || !std::isfinite(gain)) return 0;
  const double steps = std::log2(static_cast<double>(gain) / static_cast<double>(ref)) * kGainCodeStepsPerOctave;
  const double c = std::nearbyint(steps) + kGainCodeCentre;
  return static_cast<uint8_t>(c < 1.0 ? 1.0 : (c > 255.0 ? 255.0 : c));
}

// ---- host and device forms (the GPU encoder, attention and dequantize kernels) ------------------
// The functions above are host-only (a static table, std:: math). These compute the same codes
// and factors in E8KV_HD form: the factor of code c is 2^k · 2^(r/32) with c − 128 = 32k + r, built
// from the 32 mantissas by an exponent add (exact: every factor is a normal float); the code and
// the reference use the same double log2/exp2 formulas as gain_to_code and src/cache/layer_write.cpp
// (CUDA's double log2/exp2 are within 1 ulp of the host libm's, so a GPU result can differ from
// the CPU's only where the double lies within ~1e-15 of a rounding boundary; tested on the CPU
// bit for bit, and on the device by the GPU tests' whole-pool comparisons).

/// Bits of the float 2^(r/32), r = 0..31 (tests/cache/paged_kernel_math_test checks that
/// gain_code_factor reproduces every entry of gain_code_factors() bit for bit).
#define E8KV_GAIN_CODE_MANTISSA_BITS                                                                            \
  0x3f800000u, 0x3f82cd87u, 0x3f85aac3u, 0x3f88980fu, 0x3f8b95c2u, 0x3f8ea43au, 0x3f91c3d3u, 0x3f94f4f0u,        \
      0x3f9837f0u, 0x3f9b8d3au, 0x3f9ef532u, 0x3fa27043u, 0x3fa5fed7u, 0x3fa9a15bu, 0x3fad583fu, 0x3fb123f6u,    \
      0x3fb504f3u, 0x3fb8fbafu, 0x3fbd08a4u, 0x3fc12c4du, 0x3fc5672au, 0x3fc9b9beu, 0x3fce248cu, 0x3fd2a81eu,    \
      0x3fd744fdu, 0x3fdbfbb8u, 0x3fe0ccdfu, 0x3fe5b907u, 0x3feac0c7u, 0x3fefe4bau, 0x3ff5257du, 0x3ffa83b3u

inline constexpr uint32_t kGainCodeMantissaBits[32] = {E8KV_GAIN_CODE_MANTISSA_BITS};

/// The factor of code c (0 for code 0) from a table of the 32 mantissa bit patterns
/// (kGainCodeMantissaBits on the host; the kernels keep a copy in shared memory).
E8KV_HD E8KV_FORCE_INLINE float gain_code_factor(const uint32_t* mantissa_bits, uint32_t c) {
  const int e = static_cast<int>(c & 0xFFu) - kGainCodeCentre;  // -128..127
  const uint32_t k = static_cast<uint32_t>(e >> 5);             // floor(e / 32), two's complement
  const float f = e8kv::detail::bits_float(mantissa_bits[e & 31] + (k << 23));
  return (c & 0xFFu) == 0 ? 0.f : f;
}

/// gain_to_code in host and device form: the code whose gain is nearest to `gain` in log scale
/// (0 for gain <= 0, a non-finite gain or a non-positive ref).
E8KV_HD inline uint8_t gain_code_of(float gain, float ref) {
  const bool finite = (e8kv::detail::float_bits(gain) & 0x7f800000u) != 0x7f800000u;
  if (!(gain > 0.f) || !(ref > 0.f) || !finite) return 0;
  const double steps = log2(static_cast<double>(gain) / static_cast<double>(ref)) * kGainCodeStepsPerOctave;
  const double c = nearbyint(steps) + kGainCodeCentre;
  return static_cast<uint8_t>(c < 1.0 ? 1.0 : (c > 255.0 ? 255.0 : c));
}

/// The 8-bit gains' reference of a (layer, head, kind), as src/cache/layer_write.cpp sets it at the
/// first flush: fp16 bits of the geometric mean of the positive gains among gains[0..n) (1.0 when
/// there is none), never 0 (an underflow becomes fp16(6.1e-5)). Logs summed in index order.
E8KV_HD inline uint16_t gain_reference_bits(const float* gains, int n) {
  double log_sum = 0;
  int count = 0;
  for (int i = 0; i < n; ++i)
    if (gains[i] > 0.f) {
      log_sum += log2(static_cast<double>(gains[i]));
      ++count;
    }
  uint16_t ref = float_to_fp16_bits(count > 0 ? static_cast<float>(exp2(log_sum / count)) : 1.0f);
  if (ref == 0) ref = float_to_fp16_bits(6.1e-5f);
  return ref;
}

}  // namespace e8kv::quant
