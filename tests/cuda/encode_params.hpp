// cuda::EncodeParams from what an encode call site already has (codec tables, layout, pool, the
// device K/V, positions and slots). Shared by tests/cuda/*_test and bench/gpu/gpu_bench.cu, so it
// needs nothing beyond the library header (no gtest).
#pragma once

#include <cstdint>

#include "e8kv/cuda/paged_kv.cuh"

namespace e8kv::gputest {

/// paged_encode of n_tokens new tokens whose K and V are NHD: token_stride kv_heads·head_dim and
/// head_stride head_dim, both of `codec`. Centring means with their token_seq when given; no key
/// scales, gain references, pool bound (n_pages 0) or status word: a caller sets those (and the
/// strides of another layout) on the result.
inline cuda::EncodeParams nhd_encode_params(const cuda::LayerCodecParams& codec, const PagedLayout& layout,
                                            uint8_t* pool, int n_tokens, const void* keys, const void* values,
                                            DType dtype, const int32_t* positions, const int64_t* slot_mapping,
                                            const uint16_t* means = nullptr, const int32_t* token_seq = nullptr) {
  cuda::EncodeParams p;
  p.codec = codec;
  p.layout = layout;
  p.pool = pool;
  p.n_tokens = n_tokens;
  p.keys = keys;
  p.values = values;
  p.dtype = dtype;
  p.token_stride = static_cast<int64_t>(codec.kv_heads) * codec.head_dim;
  p.head_stride = codec.head_dim;
  p.positions = positions;
  p.slot_mapping = slot_mapping;
  p.means = means;
  p.token_seq = token_seq;
  return p;
}

}  // namespace e8kv::gputest
