// Strided, non-owning views over caller memory holding K, V or Q for one layer of one sequence.
//
// A view is [tokens, heads, head_dim] with the head_dim axis contiguous and arbitrary token and
// head strides, so it describes NHD ([tokens, heads, dim]), HND ([heads, tokens, dim]) and
// slices of larger engine buffers alike. Elements are fp32, fp16 or bf16 (storage types from
// numeric/half.hpp). A batch is a list of sequences of different lengths (ragged): see
// RaggedLayerView::sequence().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"

namespace e8kv {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

inline const char* to_string(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

inline size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }

/// Head dimensions the whole pipeline supports (Hadamard rotation + 8-dim blocks).
inline bool is_supported_head_dim(int d) {
  return d == 64 || d == 80 || d == 96 || d == 128 || d == 256;
}
inline const char* supported_head_dims() { return "64, 80, 96, 128, 256"; }

class TensorView {
 public:
  TensorView() = default;
  /// General strided view; strides are in elements.
  TensorView(const void* data, DType dtype, int64_t tokens, int64_t heads, int64_t head_dim,
             int64_t token_stride, int64_t head_stride)
      : data_(data), dtype_(dtype), tokens_(tokens), heads_(heads), dim_(head_dim),
        token_stride_(token_stride), head_stride_(head_stride) {
    require(tokens >= 0 && heads >= 0 && head_dim >= 0, "TensorView: negative extent");
    require(data != nullptr || tokens * heads * head_dim == 0, "TensorView: null data for a non-empty view");
  }
  /// [tokens, heads, head_dim], contiguous.
  static TensorView nhd(const void* data, DType dtype, int64_t tokens, int64_t heads, int64_t head_dim) {
    return TensorView(data, dtype, tokens, heads, head_dim, heads * head_dim, head_dim);
  }
  /// [heads, tokens, head_dim], contiguous; `token_capacity` is the allocated token extent
  /// (engines often preallocate), defaulting to `tokens`.
  static TensorView hnd(const void* data, DType dtype, int64_t tokens, int64_t heads, int64_t head_dim,
                        int64_t token_capacity = -1) {
    const int64_t cap = token_capacity < 0 ? tokens : token_capacity;
    require(cap >= tokens, "TensorView::hnd: token_capacity < tokens");
    return TensorView(data, dtype, tokens, heads, head_dim, head_dim, cap * head_dim);
  }

  const void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  int64_t tokens() const { return tokens_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return dim_; }
  int64_t token_stride() const { return token_stride_; }
  int64_t head_stride() const { return head_stride_; }
  bool empty() const { return tokens_ == 0 || heads_ == 0 || dim_ == 0; }

  /// Element (t, h, i) as float.
  float at(int64_t t, int64_t h, int64_t i) const {
    const int64_t off = t * token_stride_ + h * head_stride_ + i;
    switch (dtype_) {
      case DType::kF32: return static_cast<const float*>(data_)[off];
      case DType::kF16: return fp16_bits_to_float(static_cast<const uint16_t*>(data_)[off]);
      case DType::kBF16: return bf16_bits_to_float(static_cast<const uint16_t*>(data_)[off]);
    }
    return 0.f;
  }
  /// Copies the head vector (t, h) into out[0..head_dim) as float.
  void load(int64_t t, int64_t h, float* out) const {
    const int64_t off = t * token_stride_ + h * head_stride_;
    switch (dtype_) {
      case DType::kF32: {
        const float* p = static_cast<const float*>(data_) + off;
        for (int64_t i = 0; i < dim_; ++i) out[i] = p[i];
        break;
      }
      case DType::kF16: {
        fp16_bits_to_floats(static_cast<const uint16_t*>(data_) + off, out, static_cast<size_t>(dim_));
        break;
      }
      case DType::kBF16: {
        const uint16_t* p = static_cast<const uint16_t*>(data_) + off;
        for (int64_t i = 0; i < dim_; ++i) out[i] = bf16_bits_to_float(p[i]);
        break;
      }
    }
  }
  /// Sub-view of tokens [begin, begin + count).
  TensorView token_slice(int64_t begin, int64_t count) const {
    require(begin >= 0 && count >= 0 && begin + count <= tokens_, "TensorView::token_slice: out of range");
    const char* p = static_cast<const char*>(data_);
    if (p) p += static_cast<size_t>(begin * token_stride_) * dtype_size(dtype_);
    return TensorView(p, dtype_, count, heads_, dim_, token_stride_, head_stride_);
  }

 private:
  const void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  int64_t tokens_ = 0, heads_ = 0, dim_ = 0, token_stride_ = 0, head_stride_ = 0;
};

/// One layer of one sequence: keys and values (same token count), as the engine holds them
/// (keys post-RoPE, as every mainstream engine stores them).
struct LayerKV {
  TensorView keys;
  TensorView values;
};

/// A prefill (or a later prefill chunk) of one sequence: every layer's K/V, and the absolute
/// position of each token (nullptr = 0, 1, 2, ... offset by `first_position`).
struct SequenceKV {
  std::vector<LayerKV> layers;
  const int32_t* positions = nullptr;
  int32_t first_position = 0;

  int64_t tokens() const { return layers.empty() ? 0 : layers[0].keys.tokens(); }
  /// Absolute position of token t (0 <= t). Without `positions`, first_position + t computed in
  /// 64 bits: a position past INT32_MAX (or a negative t) throws e8kv::Error instead of
  /// overflowing a signed int (undefined behaviour).
  int32_t position(int64_t t) const {
    if (positions) return positions[t];
    const int64_t p = static_cast<int64_t>(first_position) + t;
    if (t < 0 || p > static_cast<int64_t>(INT32_MAX)) throw_position_out_of_range(t);
    return static_cast<int32_t>(p);
  }

 private:
  // Out of line of the check so position() stays small on the per-token path.
  [[noreturn]] void throw_position_out_of_range(int64_t t) const {
    throw Error("SequenceKV::position: token " + std::to_string(t) + " with first_position " +
                std::to_string(first_position) + " is outside 0 <= t and first_position + t <= INT32_MAX");
  }
};

/// Observation queries for one layer: [window, q_heads, head_dim] post-RoPE, with the absolute
/// position of each query (nullptr = the last `window` positions of the sequence).
struct LayerQueries {
  TensorView queries;
  const int32_t* positions = nullptr;
};

/// Packed ragged batch for one layer: sequences stored back to back in NHD order, sequence b
/// owning tokens [indptr[b], indptr[b+1]) (the CSR convention FlashInfer and vLLM use).
struct RaggedLayerView {
  const void* keys = nullptr;
  const void* values = nullptr;
  DType dtype = DType::kF32;
  const int64_t* indptr = nullptr;
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;

  LayerKV sequence(int64_t b) const {
    require(b >= 0 && b < batch, "RaggedLayerView::sequence: index out of range");
    const int64_t begin = indptr[b], end = indptr[b + 1];
    require(begin >= 0 && end >= begin, "RaggedLayerView: indptr must be non-decreasing from 0");
    const size_t off = static_cast<size_t>(begin * heads * head_dim) * dtype_size(dtype);
    LayerKV kv;
    kv.keys = TensorView::nhd(static_cast<const char*>(keys) + off, dtype, end - begin, heads, head_dim);
    kv.values = TensorView::nhd(static_cast<const char*>(values) + off, dtype, end - begin, heads, head_dim);
    return kv;
  }
};

}  // namespace e8kv
