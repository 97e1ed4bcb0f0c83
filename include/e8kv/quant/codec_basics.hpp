// The basics every per-vector codec function shares: the gain policies, the little-endian index
// layout of block codes, and the batched block encoder (Code::encode_batch where a code has it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "e8kv/error.hpp"
#include "e8kv/platform.hpp"

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

/// True when Code has encode_batch(const float* x, size_t count, uint32_t* index), the batched
/// (on the host vectorized) form of encode with the same indices.
template <class Code, class = void>
struct has_encode_batch : std::false_type {};
template <class Code>
struct has_encode_batch<Code, std::void_t<decltype(Code::encode_batch(static_cast<const float*>(nullptr), size_t{0},
                                                                      static_cast<uint32_t*>(nullptr)))>>
    : std::true_type {};

/// index[j] = Code::encode(u + 8j) for j < blocks, through Code::encode_batch where it exists.
template <class Code>
E8KV_HD inline void encode_blocks(const float* u, int blocks, uint32_t* index) {
  if constexpr (has_encode_batch<Code>::value) {
    Code::encode_batch(u, static_cast<size_t>(blocks), index);
  } else {
    for (int j = 0; j < blocks; ++j) index[j] = Code::encode(u + 8 * j);
  }
}

/// Blocks that encode_vector scales and encodes together (a 128-element head vector at once).
constexpr int kEncodeChunkBlocks = 16;

/// v when finite, else 0 (v − v is 0 exactly for finite v, NaN for ±Inf and NaN).
E8KV_HD E8KV_FORCE_INLINE float finite_or_zero(float v) { return v - v == 0.f ? v : 0.f; }


}  // namespace detail

}  // namespace e8kv::quant
