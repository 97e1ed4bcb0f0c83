// Codec ids: the runtime names of the head-vector codes (Config, CacheLayout, the container),
// apart from the codebooks that implement them (quant/codec.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "e8kv/error.hpp"

namespace e8kv::quant {

/// How one head vector is stored. Ids are part of the container format: never renumber.
enum class Codec : uint8_t {
  kFp16 = 0,       ///< uncompressed fp16 (lossless preset, protected boundary layers)
  kE8P = 1,        ///< 2 bits/element: E8P, 16-bit index per 8 elements
  kRvq3 = 2,       ///< 3 bits: fast tier, E8P + 8-bit E8 second stage (24-bit index)
  kRvq4 = 3,       ///< 4 bits: fast tier, E8P + E8P (32-bit index)
  kBall3 = 4,      ///< 3 bits: quality tier, E8 ball ‖y‖² ≤ 44 with leader indexing
  kBall4 = 5,      ///< 4 bits: quality tier, E8 ball ‖y‖² ≤ 178
  kVoronoi2 = 6,   ///< 2 bits: Voronoi code E8 / 4E8 (table-free)
  kVoronoi3 = 7,   ///< 3 bits: E8 / 8E8
  kVoronoi4 = 8,   ///< 4 bits: E8 / 16E8
  kLloydMax2 = 9,  ///< comparison: scalar Lloyd-Max (TurboQuant-style) at 2 bits
  kLloydMax3 = 10,
  kLloydMax4 = 11,
};
inline constexpr int kCodecCount = 12;

inline const char* to_string(Codec c) {
  switch (c) {
    case Codec::kFp16: return "fp16";
    case Codec::kE8P: return "e8p2";
    case Codec::kRvq3: return "rvq3";
    case Codec::kRvq4: return "rvq4";
    case Codec::kBall3: return "ball3";
    case Codec::kBall4: return "ball4";
    case Codec::kVoronoi2: return "vor2";
    case Codec::kVoronoi3: return "vor3";
    case Codec::kVoronoi4: return "vor4";
    case Codec::kLloydMax2: return "lm2";
    case Codec::kLloydMax3: return "lm3";
    case Codec::kLloydMax4: return "lm4";
  }
  return "?";
}

inline const char* codec_names() {
  return "fp16, e8p2, rvq3, rvq4, ball3, ball4, vor2, vor3, vor4, lm2, lm3, lm4";
}

inline Codec codec_from_string(const std::string& s) {
  for (int i = 0; i < kCodecCount; ++i)
    if (s == to_string(static_cast<Codec>(i))) return static_cast<Codec>(i);
  throw Error("codec '" + s + "' is unknown; accepted: " + codec_names());
}

inline Codec codec_from_id(uint32_t id) {
  if (id >= static_cast<uint32_t>(kCodecCount))
    throw Error("codec id " + std::to_string(id) + " is unknown (accepted 0.." + std::to_string(kCodecCount - 1) + ")");
  return static_cast<Codec>(id);
}

/// Index bits per 8-element block (0 for fp16).
inline int index_bits(Codec c) {
  switch (c) {
    case Codec::kFp16: return 0;
    case Codec::kE8P: case Codec::kVoronoi2: case Codec::kLloydMax2: return 16;
    case Codec::kRvq3: case Codec::kBall3: case Codec::kVoronoi3: case Codec::kLloydMax3: return 24;
    case Codec::kRvq4: case Codec::kBall4: case Codec::kVoronoi4: case Codec::kLloydMax4: return 32;
  }
  return 0;
}

}  // namespace e8kv::quant
