// paged_decode_attention: split planning (cuda/split_plan.hpp, with the device's CTA slots for
// the kernel it dispatches to), validation, closed dispatch and the explicit kernel
// instantiations. Block-coded keys stored as RoPE residuals or post-RoPE go to the tensor-core
// kernel (detail/rotated_attention_kernel.cuh), one instantiation per head_dim x key codec x
// value codec, compiled in kernels/rotated_attention_d*.cu; pre-RoPE and fp16 keys to the lane
// kernel (detail/decode_attention_kernel.cuh), head_dim x key codec with the value codec a
// uniform run-time branch. The slot query runs once
// per device and instantiation (decode_attention_workspace_bytes, called before any graph capture
// to size the workspace, makes it); launches never synchronize.
#include <atomic>
#include <cmath>

#include "e8kv/cuda/detail/decode_attention_kernel.cuh"
#include "e8kv/cuda/detail/rotated_attention_dispatch.cuh"
#include "e8kv/cuda/paged_kv.cuh"

namespace e8kv::cuda {

namespace {

int query_chunks(const DecodeAttentionParams& p) {
  const int group = p.codec.kv_heads > 0 ? p.q_heads / p.codec.kv_heads : 1;
  return (group + detail::kMaxGroup - 1) / detail::kMaxGroup;
}

/// The fields the lane kernel's and the tensor-core kernel's arguments share, from the launch
/// parameters (each launcher then sets what only its kernel reads).
template <class Args>
void fill_common_args(Args& a, const DecodeAttentionParams& p, float scale_log2, int chunk, int splits,
                      void* workspace) {
  const LayerCodecParams& c = p.codec;
  a.pool = p.cache.pool;
  a.layout = p.cache.layout;
  a.page_indptr = p.cache.page_indptr;
  a.page_indices = p.cache.page_indices;
  a.coded_lens = p.cache.coded_lens;
  a.window_keys = p.window_keys;
  a.window_values = p.window_values;
  a.window_lens = p.window_lens;
  a.window_seq_stride = p.window_seq_stride;
  a.window_head_stride = p.window_head_stride;
  a.window_token_stride = p.window_token_stride;
  a.q = p.q;
  a.q_dtype = p.q_dtype;
  a.q_heads = p.q_heads;
  a.group = p.q_heads / c.kv_heads;
  a.q_chunks = query_chunks(p);
  a.scale_log2 = scale_log2;
  a.means = p.cache.means;
  a.key_scales = p.cache.key_scales;
  a.gain_refs = p.cache.gain_refs;
  a.rope_table = c.rope_table;
  a.rotary_dim = detail::effective_rotary_dim(c);
  a.rope_layout = c.rope_layout;
  a.sign_bits = c.sign_bits;
  a.sign_words = transform::hadamard_sign_words(c.head_dim);
  a.chunk = chunk;
  a.coded_splits = splits;
  a.partial = static_cast<float*>(workspace);
}

int64_t plan_rows(const DecodeAttentionParams& p) {
  return static_cast<int64_t>(p.cache.batch > 0 ? p.cache.batch : 1) * (p.codec.kv_heads > 0 ? p.codec.kv_heads : 1) *
         query_chunks(p);
}

using detail::kMaxCachedDevices;
using detail::rotated_keys;

/// SMs × CTAs per SM of decode_attention_split_kernel<D, KeyCode> (cached per device).
template <int D, class KeyCode>
int split_kernel_slots() {
  static std::atomic<int> cached[kMaxCachedDevices] = {};
  return detail::cached_slots(cached, detail::decode_attention_split_kernel<D, KeyCode>, detail::kAttentionThreads, 0);
}

template <int D>
int slots_dim(const LayerCodecParams& c) {
  if (rotated_keys(c)) return detail::rotated_slots_dim<D>(c);
  return detail::dispatch_kernel_codec(c.key_codec, [&](auto code) { return split_kernel_slots<D, decltype(code)>(); });
}

template <int D>
Status launch_dim(quant::Codec key_codec, const detail::AttentionKernelArgs& a, const detail::ReduceKernelArgs& r,
                  int batch, int kv_heads, cudaStream_t stream) {
  return detail::dispatch_kernel_codec(key_codec, [&](auto code) {
    return detail::launch_decode_attention<D, decltype(code)>(a, r, batch, kv_heads, stream);
  });
}

/// The automatic plan's budget when nothing answers (no device): two CTAs on each of 132 SMs,
/// today's split kernel on an H100/H200. Only reached where no launch can happen either.
constexpr int kFallbackSlots = 264;

SplitPlan plan_for(const DecodeAttentionParams& p) {
  const int slots = decode_attention_slots(p);
  return plan_decode_splits(p.cache.max_coded_len, plan_rows(p), slots > 0 ? slots : kFallbackSlots,
                            p.window_lens != nullptr, p.split_tokens);
}

Status check_params(const DecodeAttentionParams& p) {
  const LayerCodecParams& c = p.codec;
  E8KV_RETURN_IF_ERROR(detail::check_codec(c));
  if (!detail::is_kernel_dtype(p.q_dtype) || !detail::is_kernel_dtype(p.out_dtype)) return Status::kUnsupportedDtype;
  const PagedCacheView& v = p.cache;
  if (v.batch < 0 || v.max_coded_len < 0 || p.q_heads < c.kv_heads || p.q_heads % c.kv_heads != 0)
    return Status::kInvalidArgument;
  if (v.batch == 0) return Status::kSuccess;
  if (p.q == nullptr || p.out == nullptr || v.coded_lens == nullptr) return Status::kInvalidArgument;
  if (p.split_tokens < 0 || p.sm_slots < 0) return Status::kInvalidArgument;
  if (v.max_coded_len > 0) {
    E8KV_RETURN_IF_ERROR(detail::check_layout(v.layout, c));
    if (v.pool == nullptr || v.page_indptr == nullptr || v.page_indices == nullptr) return Status::kInvalidArgument;
    E8KV_RETURN_IF_ERROR(detail::check_pool_alignment(v.pool, v.layout, p.status));
  }
  if (!detail::is_aligned(p.status, alignof(uint32_t))) return Status::kMisaligned;
  if (p.window_lens != nullptr &&
      (p.window_keys == nullptr || p.window_values == nullptr || p.window_seq_stride < 0 || p.window_head_stride < 0 ||
       p.window_token_stride < 0))
    return Status::kInvalidArgument;
  if (!(p.softmax_scale <= 0.f || std::isfinite(p.softmax_scale))) return Status::kInvalidArgument;
  const bool block_coded = c.key_codec != quant::Codec::kFp16 || c.value_codec != quant::Codec::kFp16;
  if (v.max_coded_len > 0 && c.gain_bits == 8 && block_coded && v.gain_refs == nullptr) return Status::kInvalidArgument;
  if (v.max_coded_len > 0 && rotated_keys(c) && c.key_frame == transform::KeyFrame::kRopeResidual && v.means != nullptr &&
      (c.rope_table == nullptr || c.rope_delta_table == nullptr || !detail::is_aligned(c.rope_delta_table)))
    return Status::kInvalidArgument;
  return Status::kSuccess;
}

}  // namespace

int decode_attention_slots(const DecodeAttentionParams& p) {
  if (p.sm_slots > 0) return p.sm_slots;
  if (!detail::is_kernel_codec(p.codec.key_codec)) return 0;
  if (!detail::is_kernel_codec(p.codec.value_codec)) return 0;
  switch (p.codec.head_dim) {
    case 64: return slots_dim<64>(p.codec);
    case 128: return slots_dim<128>(p.codec);
    case 256: return slots_dim<256>(p.codec);
    default: return 0;
  }
}

int decode_attention_splits(const DecodeAttentionParams& p, int* split_tokens) {
  const SplitPlan plan = plan_for(p);
  if (split_tokens != nullptr) *split_tokens = plan.chunk;
  return plan.splits;
}

Status decode_attention_workspace_bytes(const DecodeAttentionParams& p, size_t* bytes) {
  if (bytes == nullptr) return Status::kInvalidArgument;
  E8KV_RETURN_IF_ERROR(check_params(p));
  const int splits = plan_for(p).splits;
  *bytes = static_cast<size_t>(p.cache.batch) * static_cast<size_t>(p.q_heads) * static_cast<size_t>(splits + 1) *
           static_cast<size_t>(p.codec.head_dim + 2) * sizeof(float);
  return Status::kSuccess;
}

Status paged_decode_attention(const DecodeAttentionParams& p, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  E8KV_RETURN_IF_ERROR(check_params(p));
  if (p.cache.batch == 0) return Status::kSuccess;
  size_t need = 0;
  E8KV_RETURN_IF_ERROR(decode_attention_workspace_bytes(p, &need));
  if (workspace == nullptr || workspace_bytes < need) return Status::kInvalidArgument;
  if (!detail::is_aligned(workspace)) return Status::kMisaligned;
  if (p.cache.batch > 65535 || static_cast<int64_t>(p.codec.kv_heads) * query_chunks(p) > 65535)
    return Status::kInvalidArgument;
  const LayerCodecParams& c = p.codec;
  const SplitPlan plan = plan_for(p);
  const int chunk = plan.chunk, splits = plan.splits;
  const float scale = p.softmax_scale > 0.f ? p.softmax_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  detail::ReduceKernelArgs r;
  r.partial = static_cast<float*>(workspace);
  r.coded_lens = p.cache.coded_lens;
  r.window_lens = p.window_lens;
  r.chunk = chunk;
  r.coded_splits = splits;
  r.q_heads = p.q_heads;
  r.group = p.q_heads / c.kv_heads;
  r.values_rotated = c.value_codec != quant::Codec::kFp16;
  r.sign_bits = c.sign_bits;
  r.sign_words = transform::hadamard_sign_words(c.head_dim);
  r.out = p.out;
  r.out_dtype = p.out_dtype;
  r.means = c.value_codec != quant::Codec::kFp16 ? p.cache.means : nullptr;
  r.kv_heads = c.kv_heads;
  r.status = p.status;
  const float scale_log2 = static_cast<float>(static_cast<double>(scale) * 1.4426950408889634);

  if (rotated_keys(c)) {
    detail::RotKernelArgs a;
    fill_common_args(a, p, scale_log2, chunk, splits, workspace);
    rot_page_divider(p.cache.layout.page_tokens > 0 ? p.cache.layout.page_tokens : 1, a.page_magic, a.page_shift);
    a.residual = c.key_frame == transform::KeyFrame::kRopeResidual;
    a.delta_table = reinterpret_cast<const RotF4*>(c.rope_delta_table);
    switch (c.head_dim) {
      case 64: return detail::launch_rotated_dim<64>(c, a, r, p.cache.batch, stream);
      case 128: return detail::launch_rotated_dim<128>(c, a, r, p.cache.batch, stream);
      case 256: return detail::launch_rotated_dim<256>(c, a, r, p.cache.batch, stream);
      default: return Status::kUnsupportedHeadDim;
    }
  }

  detail::AttentionKernelArgs a;
  fill_common_args(a, p, scale_log2, chunk, splits, workspace);
  a.value_codec = c.value_codec;

  switch (c.head_dim) {
    case 64: return launch_dim<64>(c.key_codec, a, r, p.cache.batch, c.kv_heads, stream);
    case 128: return launch_dim<128>(c.key_codec, a, r, p.cache.batch, c.kv_heads, stream);
    case 256: return launch_dim<256>(c.key_codec, a, r, p.cache.batch, c.kv_heads, stream);
    default: return Status::kUnsupportedHeadDim;
  }
}

}  // namespace e8kv::cuda
