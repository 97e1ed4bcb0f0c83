// paged_encode and paged_estimate_state: validation, closed dispatch over head_dim x codec, and
// the explicit kernel instantiations (include/e8kv/cuda/detail/encode_kernel.cuh).
#include <algorithm>

#include "e8kv/cuda/detail/encode_kernel.cuh"
#include "e8kv/cuda/paged_kv.cuh"

namespace e8kv::cuda {

namespace {

using detail::EncodeKernelArgs;

template <int D>
Status launch_kind(quant::Codec codec, const EncodeKernelArgs& a, cudaStream_t stream) {
  return detail::dispatch_kernel_codec(codec, [&](auto code) {
    return detail::launch_paged_encode<D, decltype(code)>(a, stream);
  });
}

Status launch_dim(int d, quant::Codec codec, const EncodeKernelArgs& a, cudaStream_t stream) {
  switch (d) {
    case 64: return launch_kind<64>(codec, a, stream);
    case 128: return launch_kind<128>(codec, a, stream);
    case 256: return launch_kind<256>(codec, a, stream);
    default: return Status::kUnsupportedHeadDim;
  }
}

}  // namespace

Status paged_encode(const EncodeParams& p, cudaStream_t stream) {
  const LayerCodecParams& c = p.codec;
  E8KV_RETURN_IF_ERROR(detail::check_codec(c));
  E8KV_RETURN_IF_ERROR(detail::check_layout(p.layout, c));
  if (!detail::is_kernel_dtype(p.dtype)) return Status::kUnsupportedDtype;
  if (p.n_tokens < 0) return Status::kInvalidArgument;
  if (p.n_tokens == 0) return Status::kSuccess;
  const bool per_seq = p.means != nullptr || p.key_scales != nullptr || p.gain_refs != nullptr;
  const bool block_coded = c.key_codec != quant::Codec::kFp16 || c.value_codec != quant::Codec::kFp16;
  if (p.pool == nullptr || p.keys == nullptr || p.values == nullptr || p.positions == nullptr ||
      p.slot_mapping == nullptr || p.token_stride < 0 || p.head_stride < 0 || (per_seq && p.token_seq == nullptr) ||
      (p.means == nullptr && p.key_scales == nullptr && p.gain_refs == nullptr && p.token_seq != nullptr) ||
      (c.gain_bits == 8 && block_coded && p.gain_refs == nullptr) || p.n_pages < 0)
    return Status::kInvalidArgument;
  E8KV_RETURN_IF_ERROR(detail::check_pool_alignment(p.pool, p.layout, p.status));
  EncodeKernelArgs a;
  a.dtype = p.dtype;
  a.token_stride = p.token_stride;
  a.head_stride = p.head_stride;
  a.n_tokens = p.n_tokens;
  a.kv_heads = c.kv_heads;
  a.positions = p.positions;
  a.slot_mapping = p.slot_mapping;
  a.pool = p.pool;
  a.layout = p.layout;
  a.sign_bits = c.sign_bits;
  a.sign_words = transform::hadamard_sign_words(c.head_dim);
  a.rope_table = c.rope_table;
  a.rotary_dim = detail::effective_rotary_dim(c);
  a.rope_layout = c.rope_layout;
  a.means = p.means;
  a.token_seq = p.token_seq;
  a.key_scales = p.key_scales;
  a.gain_refs = p.gain_refs;
  a.key_frame = c.key_frame;
  a.pool_slots = p.n_pages * p.layout.page_tokens;
  a.status = p.status;
  // Keys (and the positions).
  a.src = p.keys;
  a.kind = 0;
  a.scale = c.key_scale;
  a.gain = c.key_gain;
  a.write_positions = true;
  E8KV_RETURN_IF_ERROR(launch_dim(c.head_dim, c.key_codec, a, stream));
  // Values.
  a.src = p.values;
  a.kind = 1;
  a.scale = c.value_scale;
  a.gain = c.value_gain;
  a.write_positions = false;
  return launch_dim(c.head_dim, c.value_codec, a, stream);
}

namespace {

template <int D>
Status launch_state_kind(quant::Codec codec, const detail::StateKernelArgs& a, int batch, cudaStream_t stream) {
  return detail::dispatch_kernel_codec(codec, [&](auto code) {
    detail::paged_state_kernel<D, decltype(code)>
        <<<dim3(static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(batch)), detail::kStateThreads, 0, stream>>>(a);
    return detail::launch_status();
  });
}

Status launch_state(int d, quant::Codec codec, const detail::StateKernelArgs& a, int batch, cudaStream_t stream) {
  switch (d) {
    case 64: return launch_state_kind<64>(codec, a, batch, stream);
    case 128: return launch_state_kind<128>(codec, a, batch, stream);
    case 256: return launch_state_kind<256>(codec, a, batch, stream);
    default: return Status::kUnsupportedHeadDim;
  }
}

}  // namespace

Status paged_estimate_state(const StateParams& p, cudaStream_t stream) {
  const LayerCodecParams& c = p.codec;
  E8KV_RETURN_IF_ERROR(detail::check_codec(c));
  if (!detail::is_kernel_dtype(p.dtype)) return Status::kUnsupportedDtype;
  if (p.batch < 0 || p.mean_tokens < 0 || p.ref_tokens < 0 || p.ref_tokens > detail::kMaxRefTokens ||
      p.tokens_per_seq < std::max(p.mean_tokens, p.ref_tokens) || p.token_stride < 0 || p.head_stride < 0 ||
      c.kv_heads > 65535)
    return Status::kInvalidArgument;
  if (p.batch == 0 || (p.mean_tokens == 0 && p.ref_tokens == 0)) return Status::kSuccess;
  if (p.keys == nullptr || p.values == nullptr || p.rows == nullptr || p.positions == nullptr ||
      (p.mean_tokens > 0 && p.means == nullptr) || (p.ref_tokens > 0 && p.gain_refs == nullptr) || p.batch > 65535)
    return Status::kInvalidArgument;
  detail::StateKernelArgs a;
  a.dtype = p.dtype;
  a.token_stride = p.token_stride;
  a.head_stride = p.head_stride;
  a.rows = p.rows;
  a.positions = p.positions;
  a.tokens_per_seq = p.tokens_per_seq;
  a.mean_tokens = p.mean_tokens;
  a.ref_tokens = p.ref_tokens;
  a.kv_heads = c.kv_heads;
  a.key_frame = c.key_frame;
  a.rope_table = c.rope_table;
  a.rotary_dim = detail::effective_rotary_dim(c);
  a.rope_layout = c.rope_layout;
  a.sign_bits = c.sign_bits;
  a.sign_words = transform::hadamard_sign_words(c.head_dim);
  a.means = p.mean_tokens > 0 ? p.means : nullptr;
  a.gain_refs = p.ref_tokens > 0 ? p.gain_refs : nullptr;
  a.key_scales = p.key_scales;
  a.src = p.keys;
  a.kind = 0;
  a.scale = c.key_scale;
  a.gain = c.key_gain;
  E8KV_RETURN_IF_ERROR(launch_state(c.head_dim, c.key_codec, a, p.batch, stream));
  a.src = p.values;
  a.kind = 1;
  a.scale = c.value_scale;
  a.gain = c.value_gain;
  return launch_state(c.head_dim, c.value_codec, a, p.batch, stream);
}

}  // namespace e8kv::cuda
