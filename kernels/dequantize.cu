// paged_dequantize: validation, closed dispatch over head_dim x codec and the explicit kernel
// instantiations (include/e8kv/cuda/detail/dequantize_kernel.cuh).
#include "e8kv/cuda/detail/dequantize_kernel.cuh"
#include "e8kv/cuda/paged_kv.cuh"

namespace e8kv::cuda {

namespace {

template <int D>
Status launch_kind(quant::Codec codec, const detail::DequantizeKernelArgs& a, int batch, int max_len,
                   cudaStream_t stream) {
  return detail::dispatch_kernel_codec(codec, [&](auto code) {
    return detail::launch_paged_dequantize<D, decltype(code)>(a, batch, max_len, stream);
  });
}

Status launch_dim(int d, quant::Codec codec, const detail::DequantizeKernelArgs& a, int batch, int max_len,
                  cudaStream_t stream) {
  switch (d) {
    case 64: return launch_kind<64>(codec, a, batch, max_len, stream);
    case 128: return launch_kind<128>(codec, a, batch, max_len, stream);
    case 256: return launch_kind<256>(codec, a, batch, max_len, stream);
    default: return Status::kUnsupportedHeadDim;
  }
}

}  // namespace

Status paged_dequantize(const DequantizeParams& p, cudaStream_t stream) {
  const LayerCodecParams& c = p.codec;
  E8KV_RETURN_IF_ERROR(detail::check_codec(c));
  if (p.out_dtype != DType::kF16 && p.out_dtype != DType::kBF16) return Status::kUnsupportedDtype;
  const PagedCacheView& v = p.cache;
  if (v.batch < 0 || v.max_coded_len < 0 || p.out_token_stride < 0 || p.out_head_stride < 0)
    return Status::kInvalidArgument;
  // With a status word, even a plan of 0 tokens launches (one CTA per sequence) so that a
  // sequence holding coded tokens is flagged rather than skipped in silence.
  if (v.batch == 0 || (v.max_coded_len == 0 && p.status == nullptr) || (p.keys_out == nullptr && p.values_out == nullptr))
    return Status::kSuccess;
  E8KV_RETURN_IF_ERROR(detail::check_layout(v.layout, c));
  if (v.pool == nullptr || v.page_indptr == nullptr || v.page_indices == nullptr || v.coded_lens == nullptr ||
      p.out_indptr == nullptr)
    return Status::kInvalidArgument;
  E8KV_RETURN_IF_ERROR(detail::check_pool_alignment(v.pool, v.layout, p.status));
  if (c.gain_bits == 8 && (c.key_codec != quant::Codec::kFp16 || c.value_codec != quant::Codec::kFp16) &&
      v.gain_refs == nullptr)
    return Status::kInvalidArgument;
  detail::DequantizeKernelArgs a;
  a.pool = v.pool;
  a.layout = v.layout;
  a.page_indptr = v.page_indptr;
  a.page_indices = v.page_indices;
  a.coded_lens = v.coded_lens;
  a.rope_table = c.rope_table;
  a.rotary_dim = detail::effective_rotary_dim(c);
  a.rope_layout = c.rope_layout;
  a.sign_bits = c.sign_bits;
  a.sign_words = transform::hadamard_sign_words(c.head_dim);
  a.out_dtype = p.out_dtype;
  a.out_indptr = p.out_indptr;
  a.out_token_stride = p.out_token_stride;
  a.out_head_stride = p.out_head_stride;
  a.means = v.means;
  a.key_scales = v.key_scales;
  a.gain_refs = v.gain_refs;
  a.key_frame = c.key_frame;
  a.max_coded_len = v.max_coded_len;
  a.status = p.status;
  if (p.keys_out != nullptr) {
    a.kind = 0;
    a.out = p.keys_out;
    E8KV_RETURN_IF_ERROR(launch_dim(c.head_dim, c.key_codec, a, v.batch, v.max_coded_len, stream));
  }
  if (p.values_out != nullptr) {
    a.kind = 1;
    a.out = p.values_out;
    E8KV_RETURN_IF_ERROR(launch_dim(c.head_dim, c.value_codec, a, v.batch, v.max_coded_len, stream));
  }
  return Status::kSuccess;
}

}  // namespace e8kv::cuda
