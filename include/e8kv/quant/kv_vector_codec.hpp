// The KV-cache codec of one head vector, written once for the CPU and the GPU.
//
//   key   k (post-RoPE, engine basis) --RoPE removal at its position (when keys are stored
//         pre-RoPE)--> randomized Hadamard H·D/√d --> gain + 8-element block codes
//   value v --> randomized Hadamard --> gain + block codes
//   decode: block codes · gain --> inverse Hadamard --> (keys) RoPE re-applied at the position
//
// Every function here is E8KV_HD and uses only unfused multiply/add in a fixed order
// (fp::mul / fp::add), so CacheCodecs on the host and the CUDA kernels (include/e8kv/cuda/)
// produce byte-identical codes. The kernels do not call the whole-vector functions: they spread
// one vector over d/8 lanes (lane L owns elements 8L..8L+7, i.e. exactly block L) and call the
// per-lane building blocks below (lane_* and the block statistics), which perform the same float
// operations in the same order; kv_vector_codec_test emulates the lanes on the CPU and checks
// that bit for bit.
//
// RoPE uses a 3-level float table of cos/sin (position bits 0-9, 10-19, 20-30): any position in
// [0, 2^31) is two complex products away, so no table grows with the context and the same float
// table serves host and device (build_rope_table; CacheCodecs::rope_table()).
//
// Sums that decide codes (‖x‖², <x, Q>, ‖Q‖²) are taken in double: per 8-block in index order,
// then over blocks as a pairwise tree (pairwise_tree_sum): the order a warp's xor-butterfly
// reduction produces, so the lanes need no shared memory and agree with the CPU bit for bit.
//
// Non-finite input: elements that are NaN or ±Inf after the rotation count as 0 (so a vector
// gets a defined code and a finite gain); host APIs reject such input earlier with an Error.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "e8kv/platform.hpp"
#include "e8kv/numeric/fp.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/codebook/detail/search_fallback.hpp"
#include "e8kv/codebook/host_decode.hpp"
#include "e8kv/quant/codec_basics.hpp"
#include "e8kv/transform/hadamard.hpp"
#include "e8kv/transform/rope.hpp"

namespace e8kv::quant {

// ---- RoPE cos/sin table ----------------------------------------------------------------------

/// Rows of the 3-level table: 1024 rows for position bits 0-9, 1024 for bits 10-19 and 2048
/// for bits 20-30. Row r holds, for every rotary pair p, (cos, sin) of (row value)·inv_freq[p].
inline constexpr int kRopeTableLevelBits = 10;
inline constexpr int kRopeTableRows = 4096;
/// Largest head_dim of the whole-vector functions (their scratch lives on the stack).
inline constexpr int kMaxCodecHeadDim = 512;

/// Floats in a table for n_pairs rotary pairs: rows × pairs × (cos, sin).
E8KV_HD constexpr size_t rope_table_floats(int n_pairs) {
  return static_cast<size_t>(kRopeTableRows) * static_cast<size_t>(n_pairs < 0 ? 0 : n_pairs) * 2u;
}

/// Builds the table from the rotary inverse frequencies (host only: double cos/sin of the angle
/// reduced modulo 2π). Level k row e holds angle e·2^(10k)·inv_freq[p].
inline std::vector<float> build_rope_table(const double* inv_freq, int n_pairs) {
  std::vector<float> table(rope_table_floats(n_pairs));
  constexpr int kEntries[3] = {1 << kRopeTableLevelBits, 1 << kRopeTableLevelBits, 2 << kRopeTableLevelBits};
  constexpr int kOffset[3] = {0, 1 << kRopeTableLevelBits, 2 << kRopeTableLevelBits};
  const double two_pi = 6.283185307179586476925286766559;
  for (int level = 0; level < 3; ++level) {
    const double step = std::ldexp(1.0, kRopeTableLevelBits * level);
    for (int e = 0; e < kEntries[level]; ++e) {
      float* row = &table[static_cast<size_t>(kOffset[level] + e) * static_cast<size_t>(n_pairs) * 2u];
      for (int p = 0; p < n_pairs; ++p) {
        const double angle = std::fmod(e * step * inv_freq[p], two_pi);
        row[2 * p] = static_cast<float>(std::cos(angle));
        row[2 * p + 1] = static_cast<float>(std::sin(angle));
      }
    }
  }
  return table;
}

/// A RoPE table and the pairing it is used with. table == nullptr means "no RoPE step".
struct RopeTableView {
  const float* table = nullptr;  ///< rope_table_floats(rotary_dim / 2) floats
  int rotary_dim = 0;            ///< even, <= head_dim; pairs = rotary_dim / 2
  transform::RopeLayout layout = transform::RopeLayout::kSplitHalf;
};

/// cos and sin of position·inv_freq[pair] from the table: e^{i(a+b+c)} = (e^{ia}·e^{ib})·e^{ic}
/// with a, b, c the angles of the three position fields. A negative position is treated as 0
/// (host APIs reject it before it gets here).
E8KV_HD inline void rope_table_cos_sin(const float* table, int n_pairs, int32_t position, int pair, float& cos_out,
                                       float& sin_out) {
  const uint32_t p = position < 0 ? 0u : static_cast<uint32_t>(position);
  const size_t stride = static_cast<size_t>(n_pairs) * 2u;
  const float* t0 = table + static_cast<size_t>(p & 1023u) * stride + 2 * pair;
  const float* t1 = table + static_cast<size_t>(1024u + ((p >> 10) & 1023u)) * stride + 2 * pair;
  const float* t2 = table + static_cast<size_t>(2048u + (p >> 20)) * stride + 2 * pair;
  const float c0 = t0[0], s0 = t0[1], c1 = t1[0], s1 = t1[1], c2 = t2[0], s2 = t2[1];
  const float c01 = fp::add(fp::mul(c0, c1), -fp::mul(s0, s1));
  const float s01 = fp::add(fp::mul(c0, s1), fp::mul(s0, c1));
  cos_out = fp::add(fp::mul(c01, c2), -fp::mul(s01, s2));
  sin_out = fp::add(fp::mul(c01, s2), fp::mul(s01, c2));
}

/// Rotates x's rotary pairs by +angle (apply) or −angle (inverse = removal), in place.
E8KV_HD inline void rope_table_rotate(float* x, const RopeTableView& rope, int32_t position, bool inverse) {
  const int pairs = rope.rotary_dim / 2;
  for (int i = 0; i < pairs; ++i) {
    float c = 0.f, s = 0.f;
    rope_table_cos_sin(rope.table, pairs, position, i, c, s);
    int a = 0, b = 0;
    transform::rope_pair_indices(rope.layout, rope.rotary_dim, i, a, b);
    transform::rope_rotate_pair(x[a], x[b], c, inverse ? -s : s);
  }
}

// ---- block statistics and gain ---------------------------------------------------------------

E8KV_HD E8KV_FORCE_INLINE bool is_finite_value(float v) {
#if E8KV_ON_DEVICE
  return v == v && v - v == 0.f;
#else
  uint32_t b;  // exponent test on the bits: the same answer, and it vectorizes on the host
  std::memcpy(&b, &v, sizeof b);
  return (b & 0x7f800000u) != 0x7f800000u;
#endif
}

/// Σ x_i² of one 8-block in double, index order; non-finite elements count as 0.
E8KV_HD inline double block_sum_squares(const float x[8]) {
  double s = 0.0;
  E8KV_LANE_UNROLL
  for (int i = 0; i < 8; ++i) {
    const double v = is_finite_value(x[i]) ? static_cast<double>(x[i]) : 0.0;
    s = fp::add(s, fp::mul(v, v));
  }
  return s;
}

/// Sums partial[0..n) as a pairwise tree, in place (partial[0] receives the sum): at stride
/// s = 1, 2, 4, ..., partial[j] += partial[j + s] for every j that is a multiple of 2s and has
/// a partner. For n a power of two this is exactly what an xor-butterfly over n lanes computes.
E8KV_HD inline double pairwise_tree_sum(double* partial, int n) {
  if (n <= 0) return 0.0;
  for (int s = 1; s < n; s *= 2)
    for (int j = 0; j + s < n; j += 2 * s) partial[j] = fp::add(partial[j], partial[j + s]);
  return partial[0];
}

/// The factor that maps x to unit variance per element times `scale`: √d/‖x‖·scale (0 for x = 0).
E8KV_HD inline float unit_scale_factor(double norm2, int d, float scale) {
  const double norm = sqrt(norm2);
  return norm > 0.0 ? static_cast<float>(fp::mul(sqrt(static_cast<double>(d)) / norm, static_cast<double>(scale)))
                    : 0.f;
}

namespace detail {
/// True for codes whose encoder takes a fallback policy (E8P, E81B, Rvq3, Rvq4).
template <class Code, class = void>
struct TakesSearchFallback : std::false_type {};
template <class Code>
struct TakesSearchFallback<Code, std::void_t<decltype(&Code::template encode_with<codebook::SerialFallback>)>>
    : std::true_type {};

template <class Code, class Fallback>
E8KV_HD E8KV_FORCE_INLINE uint32_t encode_block_index(const float u[8], const Fallback& fallback) {
  if constexpr (TakesSearchFallback<Code>::value) return Code::encode_with(u, fallback);
  else return Code::encode(u);
}
}  // namespace detail

/// Encodes one 8-block of the rotated vector: u = x·to_u (non-finite x → 0), index = encode(u),
/// and adds this block's <x, Q> and ‖Q‖² (double, index order) to *xq and *qq. `fallback`
/// finishes the codebook's near-ties (codebook/detail/search_fallback.hpp; the same index).
template <class Code, class Fallback = codebook::SerialFallback>
E8KV_HD inline uint32_t encode_block_with_stats(const float x[8], float to_u, double* xq, double* qq,
                                                const Fallback& fallback = Fallback{}) {
  float u[8], q[8], v[8];
  E8KV_LANE_UNROLL
  for (int i = 0; i < 8; ++i) {
    v[i] = is_finite_value(x[i]) ? x[i] : 0.f;
    u[i] = fp::mul(v[i], to_u);
  }
  const uint32_t index = detail::encode_block_index<Code>(u, fallback);
  Code::decode(index, q);
  double a = 0.0, b = 0.0;
  E8KV_LANE_UNROLL
  for (int i = 0; i < 8; ++i) {
    a = fp::add(a, fp::mul(static_cast<double>(v[i]), static_cast<double>(q[i])));
    b = fp::add(b, fp::mul(static_cast<double>(q[i]), static_cast<double>(q[i])));
  }
  *xq = a;
  *qq = b;
  return index;
}

/// The gain for the policy from ‖x‖², <x, Q> and ‖Q‖² (double), saturated to [0, 65504] (the
/// fp16 range, so every gain code can hold it) and rounded to float once.
E8KV_HD inline float gain_from_stats(GainPolicy policy, double norm2, double xq, double qq) {
  const double norm = sqrt(norm2);
  double gain = 0.0;
  if (norm > 0.0 && qq > 0.0) {
    switch (policy) {
      case GainPolicy::kLeastSquares: gain = xq / qq; break;
      case GainPolicy::kNormPreserving: gain = norm / sqrt(qq); break;
      case GainPolicy::kUnbiasedInnerProduct: gain = xq > 0.0 ? norm2 / xq : norm / sqrt(qq); break;
    }
  }
  if (gain > 65504.0) gain = 65504.0;  // fp16 max: saturate rather than store Inf
  if (!(gain >= 0.0)) gain = 0.0;      // negative only for a degenerate Q; NaN cannot occur
  return static_cast<float>(gain);
}

/// gain_from_stats as fp16 bits (the paged GPU layout's gains).
E8KV_HD inline uint16_t gain_bits_from_stats(GainPolicy policy, double norm2, double xq, double qq) {
  return float_to_fp16_bits(gain_from_stats(policy, norm2, xq, qq));
}

/// Bytes of one block index of Code in the packed codes (index bits / 8).
template <class Code>
inline constexpr int kIndexBytes = Code::kIndexBits / 8;

/// Encodes one already-rotated vector x[0..d) (d a multiple of 8, d <= kMaxCodecHeadDim):
/// d/8 little-endian indices of kIndexBytes<Code> bytes each; returns the gain.
template <class Code>
E8KV_HD inline float encode_rotated_vector_gain(const float* x, int d, float scale, GainPolicy policy, uint8_t* codes) {
  constexpr int kBytes = kIndexBytes<Code>;
  const int blocks = d / 8;
  double norm_part[kMaxCodecHeadDim / 8], xq_part[kMaxCodecHeadDim / 8], qq_part[kMaxCodecHeadDim / 8];  // [0, blocks) written before read
  for (int j = 0; j < blocks; ++j) norm_part[j] = block_sum_squares(x + 8 * j);
  const double norm2 = pairwise_tree_sum(norm_part, blocks);
  const float to_u = unit_scale_factor(norm2, d, scale);
#if !E8KV_ON_DEVICE
  // Host: encode all blocks of the vector in one SIMD batch (the same indices as one block at a
  // time), then the same per-block statistics as encode_block_with_stats.
  float u[kMaxCodecHeadDim];
  uint32_t index[kMaxCodecHeadDim / 8];
  for (int i = 0; i < 8 * blocks; ++i) u[i] = fp::mul(is_finite_value(x[i]) ? x[i] : 0.f, to_u);
  // u[0, 8·blocks) is written above and the batch encoders read no further; GCC cannot follow
  // that through the RVQ batches at -O1 and warns (a false positive: zeroing all 512 floats per
  // vector would cost compress time for nothing).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
  detail::encode_blocks<Code>(u, blocks, index);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  const auto tables = codebook::host_decode::tables();  // fetched once: each fetch tests two guards
  for (int j = 0; j < blocks; ++j) {
    float q[8];
    if constexpr (codebook::host_decode::kPreferTableDecode<Code>)
      codebook::host_decode::decode_block<Code>(tables, index[j], q);  // the same floats, vectorized
    else
      Code::decode(index[j], q);
    double a = 0.0, b = 0.0;
    for (int i = 0; i < 8; ++i) {
      const float v = is_finite_value(x[8 * j + i]) ? x[8 * j + i] : 0.f;
      a = fp::add(a, fp::mul(static_cast<double>(v), static_cast<double>(q[i])));
      b = fp::add(b, fp::mul(static_cast<double>(q[i]), static_cast<double>(q[i])));
    }
    xq_part[j] = a;
    qq_part[j] = b;
    detail::store_index(index[j], kBytes, codes + j * kBytes);
  }
#else
  for (int j = 0; j < blocks; ++j) {
    const uint32_t index = encode_block_with_stats<Code>(x + 8 * j, to_u, &xq_part[j], &qq_part[j]);
    detail::store_index(index, kBytes, codes + j * kBytes);
  }
#endif
  const double xq = pairwise_tree_sum(xq_part, blocks);
  const double qq = pairwise_tree_sum(qq_part, blocks);
  return gain_from_stats(policy, norm2, xq, qq);
}

/// encode_rotated_vector_gain with the gain stored as fp16 bits.
template <class Code>
E8KV_HD inline void encode_rotated_vector(const float* x, int d, float scale, GainPolicy policy, uint8_t* codes,
                                          uint16_t* gain_bits) {
  *gain_bits = float_to_fp16_bits(encode_rotated_vector_gain<Code>(x, d, scale, policy, codes));
}

/// encode_rotated_vector under its short name (rate-distortion benches, VectorQuantizer).
/// d must be a multiple of 8 and at most kMaxCodecHeadDim (the scratch of the per-vector
/// functions lives on the stack); the host throws otherwise.
template <class Code>
E8KV_HD inline void encode_vector(const float* x, int d, float scale, GainPolicy policy, uint8_t* codes,
                                  uint16_t* gain_bits) {
#if !E8KV_ON_DEVICE
  if (d <= 0 || d % 8 != 0 || d > kMaxCodecHeadDim)
    throw Error("quant::encode_vector: d must be a positive multiple of 8 up to " + std::to_string(kMaxCodecHeadDim) +
                ", got " + std::to_string(d));
#endif
  encode_rotated_vector<Code>(x, d, scale, policy, codes, gain_bits);
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

/// Decodes one 8-block: gain·decode(index), the product unfused (the same float on every device).
template <class Code>
E8KV_HD inline void decode_block(uint32_t index, float gain, float y[8]) {
  float q[8];
  Code::decode(index, q);
  E8KV_LANE_UNROLL
  for (int i = 0; i < 8; ++i) y[i] = fp::mul(gain, q[i]);
}

// ---- whole vectors ----------------------------------------------------------------------------

/// One (layer, head, kind) of the codec: what encode and decode need besides the data.
struct VectorCodecArgs {
  int head_dim = 0;                     ///< multiple of 8, a supported Hadamard dim, <= 512
  float scale = 1.f;                    ///< relative input scale (CacheLayout key_scale / value_scale)
  GainPolicy gain = GainPolicy::kNormPreserving;
  const uint32_t* sign_bits = nullptr;  ///< hadamard_sign_words(head_dim) words of the rotation
};

E8KV_HD inline bool is_codec_head_dim(int d) {
  return d > 0 && d % 8 == 0 && d <= kMaxCodecHeadDim && transform::is_supported_hadamard_dim(d);
}

/// Subtracts the mean from a value and returns nothing else to do: v − μ in place (μ null: none).
E8KV_HD inline void prepare_value(float* v, int d, const float* mean) {
  if (mean != nullptr)
    for (int i = 0; i < d; ++i) v[i] = fp::add(v[i], -mean[i]);
}

/// The centring and channel scaling of a post-RoPE key k before the codec proper, in place:
///   kPostRope: S·(k − μ);   kPreRope and kRopeResidual: S·(k − R_t·μ)
/// (μ null: no centring, S null: no scaling). `mean_rope` is the table μ is turned with (every
/// rotary pair); for kPreRope the codec then removes RoPE from the result (encode_key_vector
/// with the table), so the pre-RoPE code is R_t⁻¹·S·(k − R_t·μ) = S·(R_t⁻¹·k − μ).
E8KV_HD inline void prepare_key(float* k, int d, const float* mean, const float* channel_scale,
                                const RopeTableView& mean_rope, transform::KeyFrame frame, int32_t position) {
  if (mean != nullptr) {
    float mu[kMaxCodecHeadDim];
    for (int i = 0; i < d; ++i) mu[i] = mean[i];
    if (frame != transform::KeyFrame::kPostRope) rope_table_rotate(mu, mean_rope, position, /*inverse=*/false);
    for (int i = 0; i < d; ++i) k[i] = fp::add(k[i], -mu[i]);
  }
  if (channel_scale != nullptr)
    for (int i = 0; i < d; ++i) k[i] = fp::mul(k[i], channel_scale[i]);
}

/// Encodes a (prepared) value: rotate, then gain + block codes; returns the gain, or −1 (nothing
/// written) when head_dim is not supported.
template <class Code>
E8KV_HD inline float encode_value_vector_gain(const float* v, const VectorCodecArgs& a, uint8_t* codes) {
  if (!is_codec_head_dim(a.head_dim)) return -1.f;
  float tmp[kMaxCodecHeadDim];
  for (int i = 0; i < a.head_dim; ++i) tmp[i] = v[i];
  transform::randomized_hadamard_forward(a.head_dim, a.sign_bits, tmp);
  return encode_rotated_vector_gain<Code>(tmp, a.head_dim, a.scale, a.gain, codes);
}

/// Encodes a (prepared) key: RoPE removed at `position` when rope.table is set (keys stored
/// pre-RoPE), then as a value. Returns the gain, or −1 when head_dim is not supported.
template <class Code>
E8KV_HD inline float encode_key_vector_gain(const float* k, const VectorCodecArgs& a, const RopeTableView& rope,
                                            int32_t position, uint8_t* codes) {
  if (!is_codec_head_dim(a.head_dim) || rope.rotary_dim > a.head_dim) return -1.f;
  float tmp[kMaxCodecHeadDim];
  for (int i = 0; i < a.head_dim; ++i) tmp[i] = k[i];
  if (rope.table != nullptr) rope_table_rotate(tmp, rope, position, /*inverse=*/true);
  transform::randomized_hadamard_forward(a.head_dim, a.sign_bits, tmp);
  return encode_rotated_vector_gain<Code>(tmp, a.head_dim, a.scale, a.gain, codes);
}

/// encode_value_vector_gain with the gain as fp16 bits; false when head_dim is not supported.
template <class Code>
E8KV_HD inline bool encode_value_vector(const float* v, const VectorCodecArgs& a, uint8_t* codes, uint16_t* gain_bits) {
  const float g = encode_value_vector_gain<Code>(v, a, codes);
  if (g < 0.f) return false;
  *gain_bits = float_to_fp16_bits(g);
  return true;
}

/// encode_key_vector_gain with the gain as fp16 bits; false when head_dim is not supported.
template <class Code>
E8KV_HD inline bool encode_key_vector(const float* k, const VectorCodecArgs& a, const RopeTableView& rope,
                                      int32_t position, uint8_t* codes, uint16_t* gain_bits) {
  const float g = encode_key_vector_gain<Code>(k, a, rope, position, codes);
  if (g < 0.f) return false;
  *gain_bits = float_to_fp16_bits(g);
  return true;
}

/// Decodes a value into v[0..head_dim) (engine basis). Returns false when head_dim is unsupported.
template <class Code>
E8KV_HD inline bool decode_value_vector_with_gain(const uint8_t* codes, float gain, const VectorCodecArgs& a, float* v) {
  if (!is_codec_head_dim(a.head_dim)) return false;
  constexpr int kBytes = kIndexBytes<Code>;
  for (int j = 0; j < a.head_dim / 8; ++j) decode_block<Code>(detail::load_index(codes + j * kBytes, kBytes), gain, v + 8 * j);
  transform::randomized_hadamard_inverse(a.head_dim, a.sign_bits, v);
  return true;
}

/// decode_value_vector_with_gain with the gain stored as fp16 bits.
template <class Code>
E8KV_HD inline bool decode_value_vector(const uint8_t* codes, uint16_t gain_bits, const VectorCodecArgs& a, float* v) {
  return decode_value_vector_with_gain<Code>(codes, fp16_bits_to_float(gain_bits), a, v);
}

/// Decodes a key into k[0..head_dim), post-RoPE at `position` when rope.table is set.
template <class Code>
E8KV_HD inline bool decode_key_vector_with_gain(const uint8_t* codes, float gain, const VectorCodecArgs& a,
                                                const RopeTableView& rope, int32_t position, float* k) {
  if (!decode_value_vector_with_gain<Code>(codes, gain, a, k)) return false;
  if (rope.table != nullptr) rope_table_rotate(k, rope, position, /*inverse=*/false);
  return true;
}

/// decode_key_vector_with_gain with the gain stored as fp16 bits.
template <class Code>
E8KV_HD inline bool decode_key_vector(const uint8_t* codes, uint16_t gain_bits, const VectorCodecArgs& a,
                                      const RopeTableView& rope, int32_t position, float* k) {
  if (!decode_value_vector<Code>(codes, gain_bits, a, k)) return false;
  if (rope.table != nullptr) rope_table_rotate(k, rope, position, /*inverse=*/false);
  return true;
}

// ---- per-lane building blocks of the GPU kernels ----------------------------------------------
// A vector of d elements lives on d/8 lanes; lane L holds v[r] = x[8L + r], r = 0..7.

/// The three radix-2 butterfly stages over index bits 0, 1, 2 (inside one lane), lowest first:
/// (u, v) -> (u + v, u - v), exactly the CPU FWHT's first stages.
E8KV_HD E8KV_FORCE_INLINE void lane_fwht_in_register(float v[8]) {
  E8KV_LANE_UNROLL
  for (int h = 1; h < 8; h *= 2)
    E8KV_LANE_UNROLL
    for (int r = 0; r < 8; ++r)
      if ((r & h) == 0) {
        const float a = v[r], b = v[r + h];
        v[r] = a + b;
        v[r + h] = a - b;
      }
}

/// One cross-lane butterfly stage: `partner` is the same register of lane L ^ m. The lane whose
/// bit m is clear holds u and keeps u + v; the other holds v and keeps u - v = (−v) + u. Written
/// as one signed add: ±1·mine is exact, so the device's fused multiply-add rounds once, as the
/// host's add does (the same bits, signed zeros included), in one instruction instead of two
/// adds and a select.
E8KV_HD E8KV_FORCE_INLINE float lane_butterfly(float mine, float partner, bool upper) {
  const float sign = upper ? -1.0f : 1.0f;
#if E8KV_ON_DEVICE
  return __fmaf_rn(sign, mine, partner);
#else
  return fp::add(fp::mul(sign, mine), partner);
#endif
}

/// Negates v[r] where bit 8L + r of the sign mask is set (L = lane).
E8KV_HD E8KV_FORCE_INLINE uint32_t lane_sign_byte(const uint32_t* sign_bits, int lane) {
  return (sign_bits[lane >> 2] >> ((lane & 3) * 8)) & 0xFFu;
}
E8KV_HD E8KV_FORCE_INLINE void lane_apply_signs(float v[8], uint32_t sign_byte) {
  E8KV_LANE_UNROLL
  for (int r = 0; r < 8; ++r)
    if ((sign_byte >> r) & 1u) v[r] = -v[r];
}

/// Where element e's RoPE partner is, and whether e is the pair's first element. Elements at or
/// beyond rotary_dim have no partner (returns false).
E8KV_HD E8KV_FORCE_INLINE bool rope_partner(int e, int rotary_dim, transform::RopeLayout layout, int& partner,
                                            int& pair, bool& first) {
  if (e >= rotary_dim) return false;
  if (layout == transform::RopeLayout::kSplitHalf) {
    const int half = rotary_dim / 2;
    first = e < half;
    pair = first ? e : e - half;
    partner = first ? e + half : e - half;
  } else {
    first = (e & 1) == 0;
    pair = e >> 1;
    partner = e ^ 1;
  }
  return true;
}

/// The new value of one element of a rotary pair: the first element a becomes a·c − b·s', the
/// second b becomes a·s' + b·c (s' = −s for removal), the exact operations of rope_rotate_pair.
E8KV_HD E8KV_FORCE_INLINE float rope_element(float mine, float partner, float c, float s, bool first, bool inverse) {
  const float sp = inverse ? -s : s;
  return first ? fp::add(fp::mul(mine, c), -fp::mul(partner, sp)) : fp::add(fp::mul(partner, sp), fp::mul(mine, c));
}

}  // namespace e8kv::quant
