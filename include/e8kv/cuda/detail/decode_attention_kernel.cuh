// Kernel templates of paged_decode_attention (flash-decoding over the paged codes): the lane
// kernel for pre-RoPE and fp16 keys, and the reduction kernel every launch ends with. Keys coded
// as RoPE residuals or post-RoPE take the tensor-core kernel of rotated_attention_kernel.cuh.
//
// Grid of the split kernel: x = split (coded-token chunks, then one split for the fp16 window),
// y = KV head × query chunk (up to kMaxGroup query heads of one GQA group), z = sequence.
// A CTA of 128 threads holds 128/(D/8) key groups; a key group (D/8 lanes) takes one token per
// step: it decodes the key once in registers and scores it against every query head of the
// chunk, then decodes the value and updates an online softmax per query head. Keys coded
// pre-RoPE are decoded to the engine basis (inverse Hadamard, S⁻¹ of the key channel scales, the
// mean, RoPE at the stored position) and dotted with q; fp16 keys are dotted as they are. Values
// are accumulated in the rotated basis; the reduction kernel merges the splits by their lse
// (cuda/split_plan.hpp) and applies the inverse Hadamard once per output row. The window split
// works in the engine basis. Gains are fp16 or 8-bit codes around per-(sequence, head, kind)
// references (load_gain).
// Partials: [batch][q_heads][splits + 1][2 + D] floats = (lse in the log2 domain, unused, o[D])
// with o normalized by the split's own softmax sum; an empty split is never read.
// The kernel bodies are __device__ functions so that scripts/kernel_cost.cu can compile them
// with a launch's uniform parameters fixed (the static cost report, bench/RESULTS.md).
#pragma once

#include <cfloat>
#include <cmath>

#include "e8kv/cuda/detail/lane_ops.cuh"
#include "e8kv/cuda/detail/validate.cuh"
#include "e8kv/cuda/paged_kv.cuh"
#include "e8kv/cuda/split_plan.hpp"

namespace e8kv::cuda::detail {

inline constexpr int kAttentionThreads = 128;
/// Query heads one CTA serves (larger GQA groups take several CTAs per KV head).
inline constexpr int kMaxGroup = 8;

struct AttentionKernelArgs {
  const uint8_t* pool = nullptr;
  PagedLayout layout;
  const int32_t* page_indptr = nullptr;
  const int32_t* page_indices = nullptr;
  const int32_t* coded_lens = nullptr;
  const uint16_t* window_keys = nullptr;
  const uint16_t* window_values = nullptr;
  const int32_t* window_lens = nullptr;
  int64_t window_seq_stride = 0, window_head_stride = 0, window_token_stride = 0;
  const void* q = nullptr;
  DType q_dtype = DType::kF32;
  int q_heads = 0, group = 1, q_chunks = 1;
  float scale_log2 = 0.f;  ///< softmax scale · log2(e)
  quant::Codec value_codec = quant::Codec::kE8P;
  const float* rope_table = nullptr;
  int rotary_dim = 0;
  transform::RopeLayout rope_layout = transform::RopeLayout::kSplitHalf;
  const uint32_t* sign_bits = nullptr;
  int sign_words = 0;
  int chunk = 0;            ///< coded tokens per split
  int coded_splits = 0;     ///< the window split has index coded_splits
  float* partial = nullptr;
  const uint16_t* means = nullptr;       ///< [batch][kv_heads][2][D] fp16 bits, or null
  const uint16_t* key_scales = nullptr;  ///< [batch][kv_heads][D] fp16 bits, or null
  const uint16_t* gain_refs = nullptr;   ///< [batch][kv_heads][2] fp16 bits (8-bit gains), or null
};

template <int D, class KeyCode>
__device__ __forceinline__ void decode_attention_split(const AttentionKernelArgs& a) {
  constexpr int kLanes = D / 8;
  constexpr int kGroups = kAttentionThreads / kLanes;
  constexpr bool kKeyRotated = !kIsFp16<KeyCode>;
  const int b = blockIdx.z;
  const int h = static_cast<int>(blockIdx.y) / a.q_chunks;
  const int g0 = (static_cast<int>(blockIdx.y) % a.q_chunks) * kMaxGroup;
  const int gn = min(kMaxGroup, a.group - g0);
  const int split = blockIdx.x;
  const bool window = split == a.coded_splits;
  int begin = 0, end = 0;
  if (!window) {
    begin = split * a.chunk;
    end = min(begin + a.chunk, a.coded_lens[b]);
  } else {
    end = a.window_lens != nullptr ? a.window_lens[b] : 0;
  }
  if (begin >= end) return;  // uniform over the CTA: nothing to write, the reducer skips it

  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int my_group = static_cast<int>(threadIdx.x) / kLanes;
  const int qh0 = h * a.group + g0;
  const uint32_t key_signs =
      kKeyRotated ? quant::lane_sign_byte(a.sign_bits + static_cast<int64_t>(h) * 2 * a.sign_words, lane) : 0u;
  const int64_t bh = static_cast<int64_t>(b) * a.layout.kv_heads + h;

  // Pre-RoPE keys k = R_t·(S⁻¹·x̂ + μ): μ and 1/s per element from shared memory (zeros and ones
  // when the layer has none); the gain-code mantissas for 8-bit gains.
  __shared__ float s_key_mean[D];
  __shared__ float s_key_inv_scale[D];
  __shared__ uint32_t s_mantissas[32];
  const bool key_centred = !window && kKeyRotated && a.means != nullptr;
  if (my_group == 0) {
    float mu[8], inv[8];
    if (key_centred) {
      load8_half_bits(a.means + bh * 2 * D + 8 * lane, mu);
    } else {
#pragma unroll
      for (int r = 0; r < 8; ++r) mu[r] = 0.f;
    }
    load8_inverse_scales(kKeyRotated && a.key_scales != nullptr ? a.key_scales + bh * D : nullptr, lane, inv);
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      s_key_mean[8 * lane + r] = mu[r];
      s_key_inv_scale[8 * lane + r] = inv[r];
    }
  }
  if (threadIdx.x < 32) s_mantissas[threadIdx.x] = kDeviceGainMantissas[threadIdx.x];
  const bool gains8 = a.layout.key_gain_bytes == 1 || a.layout.value_gain_bytes == 1;
  const float key_ref = gains8 && a.gain_refs != nullptr ? half_bits_to_float(a.gain_refs[bh * 2]) : 0.f;
  const float value_ref = gains8 && a.gain_refs != nullptr ? half_bits_to_float(a.gain_refs[bh * 2 + 1]) : 0.f;
  __syncthreads();
  float q[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < gn) {
      load8(a.q, a.q_dtype, (static_cast<int64_t>(b) * a.q_heads + qh0 + g) * D + 8 * lane, q[g]);
    } else {
#pragma unroll
      for (int r = 0; r < 8; ++r) q[g][r] = 0.f;
    }
  }
  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int r = 0; r < 8; ++r) acc[g][r] = 0.f;
  }

  const PagedLayout& L = a.layout;
  const int32_t* pages = a.page_indices + (window ? 0 : a.page_indptr[b]);
  // cost-report: per-token loop (scripts/kernel_cost.py finds the loop whose back edge is the next line)
  for (int base = begin; base < end; base += kGroups) {
    const int t_raw = base + my_group;
    const bool valid = t_raw < end;
    const int t = valid ? t_raw : end - 1;  // invalid key groups still shuffle, on real data
    float kv[8], vv[8];
    if (window) {
      const int64_t off = b * a.window_seq_stride + h * a.window_head_stride + t * a.window_token_stride + 8 * lane;
      load8_half_bits(a.window_keys + off, kv);
      load8_half_bits(a.window_values + off, vv);
    } else {
      const int s = t % L.page_tokens;
      const uint8_t* page = a.pool + static_cast<int64_t>(pages[t / L.page_tokens]) * L.page_bytes;
      decode_lane<KeyCode>(page + L.key_code_offset(h, s),
                           load_gain(page + L.key_gain_offset(h, s), L.key_gain_bytes, key_ref, s_mantissas), lane, kv);
      if constexpr (kKeyRotated) {  // pre-RoPE keys: the dispatcher sends no other block-coded keys here
        lane_fwht<kLanes>(kv, lane);
        quant::lane_apply_signs(kv, key_signs);
#pragma unroll
        for (int r = 0; r < 8; ++r) kv[r] = fmaf(kv[r], s_key_inv_scale[8 * lane + r], s_key_mean[8 * lane + r]);
        const int32_t position = *reinterpret_cast<const int32_t*>(page + L.position_offset(h, s));
        lane_rope<kLanes>(kv, lane, a.rope_table, a.rotary_dim, a.rope_layout, position, false);
      }
      decode_lane_runtime(a.value_codec, page + L.value_code_offset(h, s),
                          load_gain(page + L.value_gain_offset(h, s), L.value_gain_bytes, value_ref, s_mantissas), lane, vv);
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < gn) {
        float dot = 0.f;
#pragma unroll
        for (int r = 0; r < 8; ++r) dot = fmaf(q[g][r], kv[r], dot);
        const float score = lane_sum<kLanes>(dot) * a.scale_log2;
        if (valid) {
          const float m_new = fmaxf(m[g], score);
          const float alpha = exp2f(m[g] - m_new);  // 0 on the first token (m = -inf)
          const float p = exp2f(score - m_new);
          l[g] = fmaf(l[g], alpha, p);
#pragma unroll
          for (int r = 0; r < 8; ++r) acc[g][r] = fmaf(acc[g][r], alpha, p * vv[r]);
          m[g] = m_new;
        }
      }
    }
  }

  // Merge the key groups of the CTA, then write this split's partial.
  __shared__ float s_m[kGroups][kMaxGroup];
  __shared__ float s_l[kGroups][kMaxGroup];
  __shared__ float s_acc[kGroups][kMaxGroup][D];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < gn) {
#pragma unroll
      for (int r = 0; r < 8; ++r) s_acc[my_group][g][8 * lane + r] = acc[g][r];
      if (lane == 0) {
        s_m[my_group][g] = m[g];
        s_l[my_group][g] = l[g];
      }
    }
  }
  __syncthreads();
  const int64_t g_stride = static_cast<int64_t>(a.coded_splits + 1) * (D + 2);
  float* out = a.partial + (static_cast<int64_t>(b) * a.q_heads + qh0) * g_stride + static_cast<int64_t>(split) * (D + 2);
  for (int idx = threadIdx.x; idx < gn * D; idx += kAttentionThreads) {
    const int g = idx / D, i = idx % D;
    float mx = -INFINITY;
    for (int k = 0; k < kGroups; ++k) mx = fmaxf(mx, s_m[k][g]);
    float sum_acc = 0.f, sum_l = 0.f;
    for (int k = 0; k < kGroups; ++k) {
      const float mk = s_m[k][g];
      if (mk == -INFINITY) continue;  // a key group without tokens
      const float w = exp2f(mk - mx);
      sum_acc = fmaf(w, s_acc[k][g][i], sum_acc);
      sum_l = fmaf(w, s_l[k][g], sum_l);
    }
    // sum_l >= 1 (the maximum's own term) unless every logit was NaN: then o is NaN as on the CPU.
    float* o = out + g * g_stride;
    o[2 + i] = sum_acc / sum_l;
    if (i == 0) {
      o[0] = partial_lse2(mx, sum_l);
      o[1] = 0.f;
    }
  }
}

template <int D, class KeyCode>
__global__ void __launch_bounds__(kAttentionThreads) decode_attention_split_kernel(const AttentionKernelArgs a) {
  decode_attention_split<D, KeyCode>(a);
}

struct ReduceKernelArgs {
  const float* partial = nullptr;
  const int32_t* coded_lens = nullptr;
  const int32_t* window_lens = nullptr;
  int chunk = 0, coded_splits = 0, q_heads = 0, group = 1;
  bool values_rotated = true;  ///< coded values accumulate in the rotated basis
  const uint32_t* sign_bits = nullptr;
  int sign_words = 0;
  void* out = nullptr;
  DType out_dtype = DType::kF32;
  const uint16_t* means = nullptr;  ///< [batch][kv_heads][2][D]: coded values add μ_v times their mass
  int kv_heads = 0;
  uint32_t* status = nullptr;       ///< device status word (kDeviceStatus* bits), or null
};

/// One CTA of D threads per (query head, sequence): merges the splits by their lse, applies the
/// inverse Hadamard of the values once (shared-memory butterflies, the CPU's operation order),
/// adds the value mean times the coded tokens' softmax mass. A sequence longer than the plan
/// (coded_lens[b] > splits · chunk: its tail was never read) gets a NaN row and sets
/// kDeviceStatusBeyondPlan in the status word, instead of a silently truncated softmax.
template <int D>
__global__ void __launch_bounds__(D) decode_attention_reduce_kernel(const ReduceKernelArgs a) {
  const int qh = blockIdx.x, b = blockIdx.y, i = threadIdx.x;
  const int h = qh / a.group;
  const int64_t stride = D + 2;
  const float* base = a.partial + (static_cast<int64_t>(b) * a.q_heads + qh) * (a.coded_splits + 1) * stride;
  const int coded = a.coded_lens[b];
  const int64_t o = (static_cast<int64_t>(b) * a.q_heads + qh) * D + i;
  const bool beyond_plan = coded < 0 || static_cast<int64_t>(coded) > static_cast<int64_t>(a.coded_splits) * a.chunk;
  float value = 0.f;
  if (beyond_plan) {  // uniform over the CTA
    if (i == 0 && qh == 0 && a.status != nullptr) atomicOr(a.status, kDeviceStatusBeyondPlan);
    value = __int_as_float(0x7fc00000);  // NaN
  } else {
    const int n_coded = static_cast<int>(split_ceil_div(coded, a.chunk));
    const bool has_window = a.window_lens != nullptr && a.window_lens[b] > 0;
    const float* win = base + static_cast<int64_t>(a.coded_splits) * stride;
    Lse2Merge merge;
    for (int s = 0; s < n_coded; ++s) merge.add(base[s * stride]);
    if (has_window) merge.add(win[0]);
    const float lse = merge.lse();
    float coded_out = 0.f, coded_mass = 0.f;  // coded tokens' share of the row and their softmax mass
    for (int s = 0; s < n_coded; ++s) {
      const float w = lse2_weight(base[s * stride], lse);
      coded_mass += w;
      coded_out = fmaf(w, base[s * stride + 2 + i], coded_out);
    }
    const float window_out = has_window ? lse2_weight(win[0], lse) * win[2 + i] : 0.f;
    if (a.values_rotated) {  // uniform over the CTA
      __shared__ float sv[D];
      sv[i] = coded_out;
      __syncthreads();
      for (int m = 1; m < D; m <<= 1) {
        const float mine = sv[i], partner = sv[i ^ m];
        __syncthreads();
        sv[i] = quant::lane_butterfly(mine, partner, (i & m) != 0);
        __syncthreads();
      }
      coded_out = fp::mul(sv[i], transform::detail::inverse_sqrt_dim(D));
      const uint32_t word = a.sign_bits[(static_cast<int64_t>(h) * 2 + 1) * a.sign_words + (i >> 5)];
      if ((word >> (i & 31)) & 1u) coded_out = -coded_out;
      if (a.means != nullptr)
        coded_out = fmaf(coded_mass,
                         half_bits_to_float(a.means[((static_cast<int64_t>(b) * a.kv_heads + h) * 2 + 1) * D + i]),
                         coded_out);
    }
    value = coded_out + window_out;  // an empty row (no token at all) stays 0, as the CPU's
  }
  if (a.out_dtype == DType::kF32) {
    static_cast<float*>(a.out)[o] = value;
  } else if (a.out_dtype == DType::kF16) {
    static_cast<__half*>(a.out)[o] = __float2half_rn(value);
  } else {
    static_cast<__nv_bfloat16*>(a.out)[o] = __float2bfloat16_rn(value);
  }
}

template <int D, class KeyCode>
Status launch_decode_attention(const AttentionKernelArgs& a, const ReduceKernelArgs& r, int batch, int kv_heads,
                               cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.coded_splits + 1), static_cast<unsigned>(kv_heads * a.q_chunks),
                  static_cast<unsigned>(batch));
  decode_attention_split_kernel<D, KeyCode><<<grid, kAttentionThreads, 0, stream>>>(a);
  E8KV_RETURN_IF_ERROR(launch_status());
  decode_attention_reduce_kernel<D><<<dim3(static_cast<unsigned>(r.q_heads), static_cast<unsigned>(batch)), D, 0, stream>>>(r);
  return launch_status();
}

}  // namespace e8kv::cuda::detail
