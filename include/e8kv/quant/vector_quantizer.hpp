// Quantizer for one (already rotated) head vector: one fp16 gain per vector, then blocks of 8
// elements through a block code. A host object over the per-vector functions of
// quant/kv_vector_codec.hpp (encode_rotated_vector, decode_vector): the one implementation.
//
//   u = x * sqrt(d) / ‖x‖ * scale          (unit variance per element on average)
//   index_j = Code::encode(u[8j .. 8j+8))    (the code applies its own lattice scale)
//   Q = decode(indices)                      (in u units)
//   x̂ = gain * Q,  gain stored as fp16, chosen by the gain policy
//
// With scale = 1 the effective α of the research note is Code::kInputScale * sqrt(d)
// (≈ 1.03·√d for E8P at 2 bits). Codes of one vector are d/8 indices of Code::kIndexBits bits,
// written as a little-endian bit stream (index j in bits [j·w, (j+1)·w)); every supported width
// is a multiple of 8, so vectors are byte aligned.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "e8kv/platform.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/fp.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/quant/codec.hpp"
#include "e8kv/quant/kv_vector_codec.hpp"

namespace e8kv::quant {

/// Host object for one (head_dim, codec, gain policy, scale) choice, with runtime dispatch.
/// kFp16 stores the vector itself as fp16 (no gain). Const methods are thread-safe.
class VectorQuantizer {
 public:
  VectorQuantizer(int head_dim, Codec codec, GainPolicy gain = GainPolicy::kNormPreserving, float scale = 1.0f)
      : d_(head_dim), codec_(codec), gain_(gain), scale_(scale) {
    require(head_dim > 0 && head_dim % 8 == 0 && head_dim <= kMaxCodecHeadDim,
            "VectorQuantizer: head_dim must be a positive multiple of 8 up to " + std::to_string(kMaxCodecHeadDim) +
                ", got " + std::to_string(head_dim));
    require(scale > 0.f && std::isfinite(scale), "VectorQuantizer: scale must be positive and finite");
    (void)to_string(codec);
    if (codec != Codec::kFp16) dispatch_block_code(codec, [](auto) { return 0; });  // validates the id
  }

  int head_dim() const { return d_; }
  Codec codec() const { return codec_; }
  GainPolicy gain_policy() const { return gain_; }
  float scale() const { return scale_; }
  /// Bytes of codes per vector (2·d for fp16).
  size_t code_bytes() const {
    return codec_ == Codec::kFp16 ? static_cast<size_t>(2 * d_) : static_cast<size_t>(d_ / 8 * index_bits(codec_) / 8);
  }
  /// Bytes of gain per vector (0 for fp16).
  size_t gain_bytes() const { return codec_ == Codec::kFp16 ? 0 : 2; }
  /// Honest rate: index bits plus the gain, per element.
  double bits_per_element() const { return 8.0 * static_cast<double>(code_bytes() + gain_bytes()) / d_; }

  /// Encodes x[0..d). Throws e8kv::Error on non-finite input.
  void encode(const float* x, uint8_t* codes, uint16_t* gain_bits) const {
    for (int i = 0; i < d_; ++i)
      if (!std::isfinite(x[i])) throw Error("VectorQuantizer::encode: non-finite input at element " + std::to_string(i));
    if (codec_ == Codec::kFp16) {
      for (int i = 0; i < d_; ++i) detail::store_index(float_to_fp16_bits(x[i]), 2, codes + 2 * i);
      *gain_bits = 0;
      return;
    }
    dispatch_block_code(codec_, [&](auto code) {
      encode_vector<decltype(code)>(x, d_, scale_, gain_, codes, gain_bits);
      return 0;
    });
  }

  /// Decodes into y[0..d).
  void decode(const uint8_t* codes, uint16_t gain_bits, float* y) const {
    if (codec_ == Codec::kFp16) {
      for (int i = 0; i < d_; ++i) y[i] = fp16_bits_to_float(static_cast<uint16_t>(detail::load_index(codes + 2 * i, 2)));
      return;
    }
    dispatch_block_code(codec_, [&](auto code) {
      decode_vector<decltype(code)>(codes, gain_bits, d_, y);
      return 0;
    });
  }

 private:
  int d_;
  Codec codec_;
  GainPolicy gain_;
  float scale_;
};

}  // namespace e8kv::quant
