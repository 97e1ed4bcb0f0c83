// Host-side checks shared by the paged KV launchers: the closed set of shapes, codecs and
// dtypes, and the consistency of a PagedLayout with the codec.
#pragma once

#include <cuda_runtime_api.h>

#include "e8kv/cuda/detail/lane_ops.cuh"
#include "e8kv/cuda/paged_kv.cuh"

namespace e8kv::cuda::detail {

inline constexpr bool is_kernel_head_dim(int d) { return d == 64 || d == 128 || d == 256; }

inline bool is_kernel_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

/// Validates the codec of a layer (RoPE data is needed when pre-RoPE keys use a block code).
inline Status check_codec(const LayerCodecParams& c) {
  if (!is_kernel_head_dim(c.head_dim)) return Status::kUnsupportedHeadDim;
  if (!is_kernel_codec(c.key_codec) || !is_kernel_codec(c.value_codec)) return Status::kUnsupportedBits;
  if (c.kv_heads < 1) return Status::kInvalidArgument;
  const bool key_coded = c.key_codec != quant::Codec::kFp16;
  const bool value_coded = c.value_codec != quant::Codec::kFp16;
  if ((key_coded || value_coded) && c.sign_bits == nullptr) return Status::kInvalidArgument;
  if (static_cast<int>(c.key_gain) > 2 || static_cast<int>(c.value_gain) > 2) return Status::kInvalidArgument;
  if (!(c.key_scale > 0.f) || !(c.value_scale > 0.f)) return Status::kInvalidArgument;
  if (c.gain_bits != 8 && c.gain_bits != 16) return Status::kInvalidArgument;
  if (c.key_frame != transform::KeyFrame::kPreRope && c.key_frame != transform::KeyFrame::kPostRope &&
      c.key_frame != transform::KeyFrame::kRopeResidual)
    return Status::kInvalidArgument;
  if (key_coded && c.key_frame != transform::KeyFrame::kPostRope) {
    const int rd = c.rotary_dim == 0 ? c.head_dim : c.rotary_dim;
    if (c.rope_table == nullptr || rd < 2 || rd > c.head_dim || rd % 2 != 0) return Status::kInvalidArgument;
    if (c.rope_layout == transform::RopeLayout::kSplitHalf && rd % 16 != 0) return Status::kInvalidArgument;
    if (c.rope_layout != transform::RopeLayout::kSplitHalf && c.rope_layout != transform::RopeLayout::kInterleaved)
      return Status::kInvalidArgument;
  }
  return Status::kSuccess;
}

inline int effective_rotary_dim(const LayerCodecParams& c) { return c.rotary_dim == 0 ? c.head_dim : c.rotary_dim; }

/// The layout must be the one make_paged_layout gives for this codec.
inline Status check_layout(const PagedLayout& L, const LayerCodecParams& c) {
  if (L.page_bytes <= 0 || L.page_tokens < 1) return Status::kInvalidArgument;
  const PagedLayout e = make_paged_layout(L.page_tokens, c.kv_heads, c.head_dim, quant::index_bits(c.key_codec),
                                          quant::index_bits(c.value_codec), L.position_sets != 1, c.gain_bits);
  if (e.page_bytes != L.page_bytes || e.kv_heads != L.kv_heads || e.head_dim != L.head_dim ||
      e.key_code_bytes != L.key_code_bytes || e.value_code_bytes != L.value_code_bytes ||
      e.key_gain_bytes != L.key_gain_bytes || e.value_gain_bytes != L.value_gain_bytes ||
      e.key_codes_offset != L.key_codes_offset || e.key_gains_offset != L.key_gains_offset ||
      e.value_codes_offset != L.value_codes_offset || e.value_gains_offset != L.value_gains_offset ||
      e.positions_offset != L.positions_offset || e.position_sets != L.position_sets)
    return Status::kInvalidArgument;
  return Status::kSuccess;
}

/// Pools and workspaces are read and written with 16-byte vector accesses.
inline constexpr uintptr_t kBufferAlignment = 16;

inline bool is_aligned(const void* p, uintptr_t alignment = kBufferAlignment) {
  return (reinterpret_cast<uintptr_t>(p) & (alignment - 1)) == 0;
}

/// kMisaligned unless the pool and its page size keep every page 16-byte aligned, and the
/// status word (when given) is 4-byte aligned.
inline Status check_pool_alignment(const void* pool, const PagedLayout& L, const uint32_t* status) {
  if (!is_aligned(pool) || L.page_bytes % static_cast<int64_t>(kBufferAlignment) != 0) return Status::kMisaligned;
  if (!is_aligned(status, alignof(uint32_t))) return Status::kMisaligned;
  return Status::kSuccess;
}

/// kCudaError when the last launch failed (reads and clears the error).
inline Status launch_status() { return cudaGetLastError() == cudaSuccess ? Status::kSuccess : Status::kCudaError; }

#define E8KV_RETURN_IF_ERROR(expr)                               \
  do {                                                           \
    const ::e8kv::Status e8kv_status_ = (expr);                  \
    if (e8kv_status_ != ::e8kv::Status::kSuccess) return e8kv_status_; \
  } while (0)

}  // namespace e8kv::cuda::detail
