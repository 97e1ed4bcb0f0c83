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

}  // namespace e8kv::quant
