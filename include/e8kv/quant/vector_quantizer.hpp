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
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "e8kv/codebook/host_decode.hpp"
#include "e8kv/platform.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/fp.hpp"
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

/// Pairwise sum of a stream of doubles, streamed with a stack of partial sums: the same tree (and
/// so the same result) as summing partial[0..n) in place at strides 1, 2, 4, ... with
/// partial[j] += partial[j + s] for every j that is a multiple of 2s and has a partner.
struct PairwiseSum {
  double value[64];
  int level[64];
  int size = 0;

  E8KV_HD void push(double v) {
    int l = 0;
    while (size > 0 && level[size - 1] == l) {  // merge equal-size neighbours: left + right
      v = fp::add(value[size - 1], v);
      --size;
      ++l;
    }
    value[size] = v;
    level[size] = l;
    ++size;
  }
  /// The remaining partial sums, combined from the right: left + (sum of everything after it).
  E8KV_HD double total() const {
    if (size == 0) return 0.0;
    double acc = value[size - 1];
    for (int k = size - 2; k >= 0; --k) acc = fp::add(value[k], acc);
    return acc;
  }
};

}  // namespace detail

/// Encodes one rotated vector x[0..d) (d a multiple of 8). Non-finite elements are treated as 0
/// (host callers reject them earlier with an Error). Writes d/8 indices and the fp16 gain bits.
/// ‖x‖², <x, Q> and ‖Q‖² are summed in double: in index order within each 8-block, then as a
/// pairwise tree over the blocks (detail::PairwiseSum), the order quant::encode_rotated_vector
/// uses too; independent per-block sums also keep the loop fast.
template <class Code>
E8KV_HD inline void encode_vector(const float* x, int d, float scale, GainPolicy policy, uint8_t* codes,
                                  uint16_t* gain_bits) {
  constexpr int kBytes = Code::kIndexBits / 8;
  const int blocks = d / 8;
  detail::PairwiseSum norm_sum;
  for (int j = 0; j < blocks; ++j) {
    float v[8];
    for (int i = 0; i < 8; ++i) v[i] = detail::finite_or_zero(x[8 * j + i]);
    double s = 0.0;
    for (int i = 0; i < 8; ++i) s = fp::add(s, fp::mul(static_cast<double>(v[i]), static_cast<double>(v[i])));
    norm_sum.push(s);
  }
  const double norm2 = norm_sum.total();
  const double norm = sqrt(norm2);
  const float to_u = norm > 0.0 ? static_cast<float>(sqrt(static_cast<double>(d)) / norm * scale) : 0.f;
  detail::PairwiseSum xq_sum, qq_sum;
  // Chunks of blocks are scaled, then encoded together (Code::encode_batch where the code has it:
  // vectorized on the host, the same indices as Code::encode block by block).
  constexpr int kChunk = detail::kEncodeChunkBlocks;
  for (int j0 = 0; j0 < blocks; j0 += kChunk) {
    const int n = blocks - j0 < kChunk ? blocks - j0 : kChunk;
    float v[8 * kChunk], u[8 * kChunk];
    uint32_t index[kChunk];
    for (int k = 0; k < 8 * n; ++k) {
      v[k] = detail::finite_or_zero(x[8 * j0 + k]);
      u[k] = fp::mul(v[k], to_u);
    }
    detail::encode_blocks<Code>(u, n, index);
    for (int jj = 0; jj < n; ++jj) {
      float q[8];
      detail::store_index(index[jj], kBytes, codes + (j0 + jj) * kBytes);
      Code::decode(index[jj], q);
      double a = 0.0, b = 0.0;
      for (int i = 0; i < 8; ++i) {
        const double vi = v[8 * jj + i], qi = q[i];
        a = fp::add(a, fp::mul(vi, qi));
        b = fp::add(b, fp::mul(qi, qi));
      }
      xq_sum.push(a);
      qq_sum.push(b);
    }
  }
  const double xq = xq_sum.total(), qq = qq_sum.total();
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

/// Decodes one vector (in the rotated basis) into y[0..d), given its gain as a float.
template <class Code>
E8KV_HD inline void decode_vector_with_gain(const uint8_t* codes, float gain, int d, float* y) {
  constexpr int kBytes = Code::kIndexBits / 8;
#if !E8KV_ON_DEVICE
  if constexpr (codebook::host_decode::kPreferTableDecode<Code>) {
    const auto tables = codebook::host_decode::tables();
    for (int j = 0; j < d / 8; ++j)
      codebook::host_decode::decode_scaled_block<Code>(tables, detail::load_index(codes + j * kBytes, kBytes), gain,
                                                       y + 8 * j);
    return;
  }
#endif
  for (int j = 0; j < d / 8; ++j) {
    float q[8];
    Code::decode(detail::load_index(codes + j * kBytes, kBytes), q);
    for (int i = 0; i < 8; ++i) y[8 * j + i] = gain * q[i];
  }
}

/// Decodes one vector (in the rotated basis) into y[0..d); the gain is stored as fp16 bits.
template <class Code>
E8KV_HD inline void decode_vector(const uint8_t* codes, uint16_t gain_bits, int d, float* y) {
  decode_vector_with_gain<Code>(codes, fp16_bits_to_float(gain_bits), d, y);
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
