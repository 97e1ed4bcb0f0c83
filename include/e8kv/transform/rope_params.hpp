// RoPE's parameters and the key frame a cache codes its keys in: the plain types a Config, a
// CacheLayout or a container record names, apart from the RoPE math (transform/rope.hpp).
#pragma once

#include <cstdint>
#include <vector>

namespace e8kv::transform {

enum class RopeLayout { kSplitHalf, kInterleaved };

/// The frame a cache codes its keys in. Values are part of the container format: never renumber.
///  - kPostRope: the engine's post-RoPE key k, centred on a post-RoPE mean μ (q·μ is one dot
///    per query head); the mean drifts as RoPE turns the pairs, so centring fades with distance.
///  - kPreRope: RoPE removed (R_t⁻¹·k), centred on μ; attention must re-apply RoPE per key.
///  - kRopeResidual: k − R_t·μ, the post-RoPE residual of the pre-RoPE mean: the centring of
///    kPreRope at any distance, while attention scores the codes in the rotated domain with no
///    per-key transform (q·R_t·μ is added analytically from cos/sin rows).
enum class KeyFrame : uint8_t { kPostRope = 0, kPreRope = 1, kRopeResidual = 2 };
inline const char* to_string(KeyFrame f) {
  switch (f) {
    case KeyFrame::kPostRope: return "post";
    case KeyFrame::kPreRope: return "pre";
    case KeyFrame::kRopeResidual: return "residual";
  }
  return "?";
}
enum class RopeScaling { kNone, kLinear, kDynamicNtk, kLlama3, kYarn };

struct RopeParams {
  RopeLayout layout = RopeLayout::kSplitHalf;
  int head_dim = 128;
  int rotary_dim = 0;  // 0 = head_dim; must be even and <= head_dim
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;             // linear / dynamic / llama3 / yarn; >= 1
  int original_max_position = 0;   // dynamic, llama3, yarn
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  double attention_factor = 0.0;  // yarn: 0 = default 0.1*ln(factor)+1 (HF semantics)
  /// Per rotary pair, a divisor of the pair's base inverse frequency, applied before any scaling
  /// (llama.cpp's `rope_freqs` tensor: Llama-3.1+ bakes its frequency bands into it, LongRoPE
  /// models their factors): inv_freq[i] = theta^(−2i/rotary_dim) / freq_factors[i]. Empty: none;
  /// else rotary_dim/2 finite values > 0. Stored by the container from format version 6.
  std::vector<float> freq_factors;
};

}  // namespace e8kv::transform
