// Quantizer for one (already rotated) head vector: one fp16 gain per vector, then blocks of 8
// elements through a block code.
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
#include <cstdint>
#include <string>

#include "e8kv/config.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/quant/codec.hpp"

namespace e8kv::quant {

/// Which fp16 gain is stored with a vector (research note §3a). The choice is an attention
/// quality decision: least-squares minimizes MSE but shrinks q·k by ~9 %; the unbiased gain
/// keeps E[q·k̂] = q·k at a small MSE cost.
enum class GainPolicy : uint8_t {
  kLeastSquares = 0,          ///< g = <x,Q>/‖Q‖²  (minimum MSE)
  kNormPreserving = 1,        ///< g = ‖x‖/‖Q‖     (‖x̂‖ = ‖x‖)
  kUnbiasedInnerProduct = 2,  ///< g = ‖x‖²/<x,Q>  (<x, x̂> = ‖x‖²)
};

inline const char* to_string(GainPolicy g) {
  switch (g) {
    case GainPolicy::kLeastSquares: return "ls";
    case GainPolicy::kNormPreserving: return "norm";
    case GainPolicy::kUnbiasedInnerProduct: return "unbiased";
  }
  return "?";
}
inline GainPolicy gain_policy_from_string(const std::string& s) {
  if (s == "ls") return GainPolicy::kLeastSquares;
  if (s == "norm") return GainPolicy::kNormPreserving;
  if (s == "unbiased") return GainPolicy::kUnbiasedInnerProduct;
  throw Error("gain policy '" + s + "' is unknown; accepted: ls, norm, unbiased");
}

namespace detail {

E8KV_HD inline void store_index(uint32_t index, int bytes, uint8_t* out) {
  for (int b = 0; b < bytes; ++b) out[b] = static_cast<uint8_t>(index >> (8 * b));
}
E8KV_HD inline uint32_t load_index(const uint8_t* in, int bytes) {
  uint32_t v = 0;
  for (int b = 0; b < bytes; ++b) v |= static_cast<uint32_t>(in[b]) << (8 * b);
  return v;
}

}  // namespace detail

/// Encodes one rotated vector x[0..d) (d a multiple of 8). Non-finite elements are treated as 0
/// (host callers reject them earlier with an Error). Writes d/8 indices and the fp16 gain bits.
template <class Code>
E8KV_HD inline void encode_vector(const float* x, int d, float scale, GainPolicy policy, uint8_t* codes,
                                  uint16_t* gain_bits) {
  constexpr int kBytes = Code::kIndexBits / 8;
  double norm2 = 0.0;
  for (int i = 0; i < d; ++i) {
    const float v = x[i];
    if (v == v && v - v == 0.f) norm2 += static_cast<double>(v) * v;
  }
  const double norm = sqrt(norm2);
  const float to_u = norm > 0.0 ? static_cast<float>(sqrt(static_cast<double>(d)) / norm * scale) : 0.f;
  double xq = 0.0, qq = 0.0;
  for (int j = 0; j < d / 8; ++j) {
    float u[8], q[8];
    for (int i = 0; i < 8; ++i) {
      const float v = x[8 * j + i];
      u[i] = (v == v && v - v == 0.f) ? v * to_u : 0.f;
    }
    const uint32_t index = Code::encode(u);
    detail::store_index(index, kBytes, codes + j * kBytes);
    Code::decode(index, q);
    for (int i = 0; i < 8; ++i) {
      const float v = x[8 * j + i];
      xq += static_cast<double>((v == v && v - v == 0.f) ? v : 0.f) * q[i];
      qq += static_cast<double>(q[i]) * q[i];
    }
  }
  double gain = 0.0;
  if (norm > 0.0 && qq > 0.0) {
    switch (policy) {
      case GainPolicy::kLeastSquares: gain = xq / qq; break;
      case GainPolicy::kNormPreserving: gain = norm / sqrt(qq); break;
      case GainPolicy::kUnbiasedInnerProduct: gain = xq > 0.0 ? norm2 / xq : norm / sqrt(qq); break;
    }
  }
  if (gain > 65504.0) gain = 65504.0;  // fp16 max: saturate rather than store Inf
  if (gain < 0.0) gain = 0.0;          // least squares can only go negative for a degenerate Q
  *gain_bits = float_to_fp16_bits(static_cast<float>(gain));
}

/// Decodes one vector (in the rotated basis) into y[0..d).
template <class Code>
E8KV_HD inline void decode_vector(const uint8_t* codes, uint16_t gain_bits, int d, float* y) {
  constexpr int kBytes = Code::kIndexBits / 8;
  const float gain = fp16_bits_to_float(gain_bits);
  for (int j = 0; j < d / 8; ++j) {
    float q[8];
    Code::decode(detail::load_index(codes + j * kBytes, kBytes), q);
    for (int i = 0; i < 8; ++i) y[8 * j + i] = gain * q[i];
  }
}

/// Host object for one (head_dim, codec, gain policy, scale) choice, with runtime dispatch.
/// kFp16 stores the vector itself as fp16 (no gain). Const methods are thread-safe.
class VectorQuantizer {
 public:
  VectorQuantizer(int head_dim, Codec codec, GainPolicy gain = GainPolicy::kNormPreserving, float scale = 1.0f)
      : d_(head_dim), codec_(codec), gain_(gain), scale_(scale) {
    require(head_dim > 0 && head_dim % 8 == 0,
            "VectorQuantizer: head_dim must be a positive multiple of 8, got " + std::to_string(head_dim));
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
