// Kernel template of paged_dequantize: one coded head vector per D/8 lanes, decoded exactly as
// CacheCodecs::decode does on the CPU (the gain as its GainReader gives it, inverse Hadamard,
// RoPE for pre-RoPE keys, S⁻¹ of the key channel scales, + the mean turned to the position for
// the pre and residual frames), stored as fp16 or bf16.
#pragma once

#include <algorithm>

#include "e8kv/cuda/detail/lane_ops.cuh"
#include "e8kv/cuda/detail/validate.cuh"
#include "e8kv/cuda/paged_kv.cuh"

namespace e8kv::cuda::detail {

inline constexpr int kDequantizeThreads = 128;

struct DequantizeKernelArgs {
  const uint8_t* pool = nullptr;
  PagedLayout layout;
  const int32_t* page_indptr = nullptr;
  const int32_t* page_indices = nullptr;
  const int32_t* coded_lens = nullptr;
  int kind = 0;  ///< 0 keys, 1 values
  transform::KeyFrame key_frame = transform::KeyFrame::kRopeResidual;
  const float* rope_table = nullptr;
  int rotary_dim = 0;
  transform::RopeLayout rope_layout = transform::RopeLayout::kSplitHalf;
  const uint32_t* sign_bits = nullptr;
  int sign_words = 0;
  void* out = nullptr;
  DType out_dtype = DType::kF16;
  const int64_t* out_indptr = nullptr;
  int64_t out_token_stride = 0, out_head_stride = 0;
  const uint16_t* means = nullptr;  ///< [batch][kv_heads][2][D] fp16 bits, or null
  const uint16_t* key_scales = nullptr;  ///< [batch][kv_heads][D] fp16 bits, or null
  const uint16_t* gain_refs = nullptr;   ///< [batch][kv_heads][2] fp16 bits (8-bit gains), or null
  int max_coded_len = 0;            ///< the launch's plan: the grid covers this many tokens
  uint32_t* status = nullptr;       ///< device status word (kDeviceStatus* bits), or null
};

/// Grid: x covers max_coded_len · kv_heads vectors, y = sequence. A sequence with more coded
/// tokens than the plan gets its first max_coded_len tokens written and flags
/// kDeviceStatusBeyondPlan (the rest of its output rows are left as they were).
template <int D, class Code>
__device__ __forceinline__ void paged_dequantize(const DequantizeKernelArgs& a) {
  constexpr int kLanes = D / 8;
  constexpr int kVectorsPerCta = kDequantizeThreads / kLanes;
  const int b = blockIdx.y;
  const PagedLayout& L = a.layout;
  const int coded = a.coded_lens[b];
  if (blockIdx.x == 0 && threadIdx.x == 0 && a.status != nullptr && (coded > a.max_coded_len || coded < 0))
    atomicOr(a.status, kDeviceStatusBeyondPlan);
  const int64_t total = static_cast<int64_t>(min(max(coded, 0), a.max_coded_len)) * L.kv_heads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kVectorsPerCta;
  if (first >= total) return;  // uniform over the CTA
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int64_t raw = first + threadIdx.x / kLanes;
  const bool active = raw < total;
  const int64_t vec = active ? raw : total - 1;  // inactive lanes shuffle on real data
  const int64_t t = vec / L.kv_heads;
  const int h = static_cast<int>(vec % L.kv_heads);
  const int s = static_cast<int>(t % L.page_tokens);
  const uint8_t* page =
      a.pool + static_cast<int64_t>(a.page_indices[a.page_indptr[b] + t / L.page_tokens]) * L.page_bytes;
  float v[8];
  const int64_t bh = static_cast<int64_t>(b) * L.kv_heads + h;
  const int gain_bytes = a.kind == 0 ? L.key_gain_bytes : L.value_gain_bytes;
  const float ref = gain_bytes == 1 && a.gain_refs != nullptr ? half_bits_to_float(a.gain_refs[bh * 2 + a.kind]) : 0.f;
  const float gain = load_gain(page + (a.kind == 0 ? L.key_gain_offset(h, s) : L.value_gain_offset(h, s)), gain_bytes, ref,
                               kDeviceGainMantissas);
  decode_lane<Code>(page + (a.kind == 0 ? L.key_code_offset(h, s) : L.value_code_offset(h, s)), gain, lane, v);
  if constexpr (!kIsFp16<Code>) {
    lane_fwht<kLanes>(v, lane);
    quant::lane_apply_signs(v, quant::lane_sign_byte(a.sign_bits + (static_cast<int64_t>(h) * 2 + a.kind) * a.sign_words, lane));
    const int32_t position = *reinterpret_cast<const int32_t*>(page + L.position_offset(h, s));
    const bool key = a.kind == 0;
    if (key && a.key_frame == transform::KeyFrame::kPreRope)
      lane_rope<kLanes>(v, lane, a.rope_table, a.rotary_dim, a.rope_layout, position, false);
    if (key && a.key_scales != nullptr) {  // S⁻¹ (1/s per element; S commutes with RoPE)
      float inv[8];
      load8_inverse_scales(a.key_scales + bh * D, lane, inv);
#pragma unroll
      for (int r = 0; r < 8; ++r) v[r] = fp::mul(v[r], inv[r]);
    }
    if (a.means != nullptr) {  // + μ (keys of the pre and residual frames: R(pos)·μ), as CacheCodecs::decode
      float mu[8];
      load8_half_bits(a.means + (bh * 2 + a.kind) * D + 8 * lane, mu);
      if (key && a.key_frame != transform::KeyFrame::kPostRope)
        lane_rope<kLanes>(mu, lane, a.rope_table, a.rotary_dim, a.rope_layout, position, false);
#pragma unroll
      for (int r = 0; r < 8; ++r) v[r] = fp::add(v[r], mu[r]);
    }
  }
  // cost-report: per-vector path (scripts/kernel_cost.py counts the paths through the next line)
  if (active) store8(a.out, a.out_dtype, (a.out_indptr[b] + t) * a.out_token_stride + h * a.out_head_stride + 8 * lane, v);
}

template <int D, class Code>
__global__ void __launch_bounds__(kDequantizeThreads) paged_dequantize_kernel(const DequantizeKernelArgs a) {
  paged_dequantize<D, Code>(a);
}

template <int D, class Code>
Status launch_paged_dequantize(const DequantizeKernelArgs& a, int batch, int max_coded_len, cudaStream_t stream) {
  constexpr int kVectorsPerCta = kDequantizeThreads / (D / 8);
  const int64_t total = static_cast<int64_t>(max_coded_len) * a.layout.kv_heads;
  const int64_t blocks = std::max<int64_t>((total + kVectorsPerCta - 1) / kVectorsPerCta, 1);  // >= 1: the check
  if (batch == 0) return Status::kSuccess;
  if (blocks > 0x7FFFFFFF || batch > 65535) return Status::kInvalidArgument;
  paged_dequantize_kernel<D, Code>
      <<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(batch)), kDequantizeThreads, 0, stream>>>(a);
  return launch_status();
}

}  // namespace e8kv::cuda::detail
