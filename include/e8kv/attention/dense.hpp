// Dense attention over uncompressed rows: the prefill side of a compressed cache. A prompt chunk's
// own keys and values are attended as they are (fp16, as an engine's f16 cache holds them, or
// fp32), causally by position, with the log-sum-exp that merges the result with the attention
// over the codes of earlier chunks (merge_attention, attend.hpp):
//
//   e8kv::DenseRows kv{keys, values, e8kv::DType::kF16, n_rows, positions};
//   e8kv::dense_attention(kv, {n_kv_heads, n_q_heads, head_dim, scale}, q, q_positions, n, out, lse, {&pool});
//
// What is computed: for every query token i and query head, softmax(scale·q·Kᵀ)·V over the rows
// whose position p satisfies p <= q_positions[i] and, with a sliding window w > 0,
// p > q_positions[i] − w (llama.cpp's standard SWA mask). Query head g reads KV head
// g / (n_q_heads / n_kv_heads) (grouped-query attention). A token that sees no row gets out = 0 and
// lse = −inf. Work is cut into fixed blocks of query tokens × KV heads and fixed tiles of rows,
// merged in a fixed order: results are bit-identical for any executor and thread count, and
// between the AVX2 + FMA build and the portable one (the kernels of the decode attention).
#pragma once

#include <cstdint>

#include "e8kv/attention/attend.hpp"
#include "e8kv/cache/kv_view.hpp"

namespace e8kv {

/// Key and value rows in the engine's layout: row t's KV head h starts at element
/// t·row_stride + h·head_dim of `keys` (and of `values`).
struct DenseRows {
  const void* keys = nullptr;
  const void* values = nullptr;
  DType dtype = DType::kF16;           ///< kF16 (bits) or kF32
  int64_t n = 0;                       ///< rows
  const int32_t* positions = nullptr;  ///< [n] strictly ascending; null: row r is at position r
  int64_t row_stride = 0;              ///< elements between rows; 0: n_kv_heads·head_dim
};

struct DenseShape {
  int n_kv_heads = 0;
  int n_q_heads = 0;  ///< a multiple of n_kv_heads
  int head_dim = 0;   ///< a multiple of 8, at most 1024
  float scale = 0.f;  ///< of q·k; <= 0: 1/sqrt(head_dim)
  int32_t window = 0; ///< sliding window in positions (> 0), 0: none
};

/// q: [n_tokens, n_q_heads, head_dim] floats at q_positions[n_tokens]; out: the same shape; lse:
/// [n_tokens, n_q_heads] or null. Throws e8kv::Error on a bad shape or dtype, null pointers,
/// positions out of order, a non-finite query, a non-finite value in a row some token reads (named
/// by row and element), or scores that overflow the float range. fp32 rows are read where they lie.
void dense_attention(const DenseRows& kv, const DenseShape& shape, const float* q, const int32_t* q_positions,
                     int64_t n_tokens, float* out, float* lse = nullptr, const AttendOptions& options = {});

}  // namespace e8kv
