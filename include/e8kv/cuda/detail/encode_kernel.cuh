// Kernel templates of paged_encode and paged_estimate_state: one head vector per D/8 lanes, the
// key frame's centring (x − μ, keys k − R_t·μ for the pre and residual frames), the key channel
// scales, RoPE removal (pre-RoPE keys), randomized Hadamard, gain and block encode, written
// straight into the vector's page slot, the gain as fp16 or as an 8-bit code around its
// reference. Inputs are first rounded to fp16, the cache's working precision, exactly as
// compress()/append() round them on the CPU (f32 and bf16 inputs give the codes of their fp16
// roundings). The bodies are __device__ functions so that scripts/kernel_cost.cu can compile
// them with a launch's uniform parameters fixed.
#pragma once

#include "e8kv/cuda/detail/lane_ops.cuh"
#include "e8kv/cuda/detail/validate.cuh"
#include "e8kv/cuda/paged_kv.cuh"

namespace e8kv::cuda::detail {

inline constexpr int kEncodeThreads = 128;

/// Everything one launch (keys or values of a chunk) needs.
struct EncodeKernelArgs {
  const void* src = nullptr;
  DType dtype = DType::kF16;
  int64_t token_stride = 0, head_stride = 0;
  int n_tokens = 0, kv_heads = 0;
  const int32_t* positions = nullptr;
  const int64_t* slot_mapping = nullptr;
  uint8_t* pool = nullptr;
  PagedLayout layout;
  int kind = 0;  ///< 0 keys, 1 values
  float scale = 1.f;
  quant::GainPolicy gain = quant::GainPolicy::kNormPreserving;
  const uint32_t* sign_bits = nullptr;  ///< [kv_heads][2][sign_words]
  int sign_words = 0;
  transform::KeyFrame key_frame = transform::KeyFrame::kRopeResidual;
  const float* rope_table = nullptr;
  int rotary_dim = 0;
  transform::RopeLayout rope_layout = transform::RopeLayout::kSplitHalf;
  bool write_positions = false;
  const uint16_t* means = nullptr;  ///< [batch][kv_heads][2][D] fp16 bits, or null
  const int32_t* token_seq = nullptr;
  const uint16_t* key_scales = nullptr;  ///< [batch][kv_heads][D] fp16 bits, or null
  const uint16_t* gain_refs = nullptr;   ///< [batch][kv_heads][2] fp16 bits (gain_bits 8)
  int64_t pool_slots = 0;           ///< n_pages · page_tokens; 0 = not checked
  uint32_t* status = nullptr;       ///< device status word (kDeviceStatus* bits), or null
};

/// The codec of one vector on its D/8 lanes (lane L holds elements 8L..8L+7 of the fp16-rounded
/// input v): the kind's centring (mean_row: μ, fp16 bits, or null; keys of the pre and residual
/// frames turn it to `position`), key channel scales (scale_row, or null / a first entry of 0),
/// RoPE removal for pre-RoPE keys, the rotation, the block index of this lane and the vector's
/// gain as a float (quant::gain_from_stats). Exactly quant::prepare_key / prepare_value then
/// encode_*_vector_gain of the CPU. Every lane of the warp must call it (it shuffles).
template <int D, class Code>
__device__ __forceinline__ uint32_t encode_lane(float v[8], int lane, int kind, transform::KeyFrame frame, int32_t position,
                                                const uint16_t* mean_row, const uint16_t* scale_row, const uint32_t* signs,
                                                const float* rope_table, int rotary_dim, transform::RopeLayout rope_layout,
                                                float scale, quant::GainPolicy policy, float& gain) {
  constexpr int kLanes = D / 8;
  const bool key = kind == 0;
  if (mean_row != nullptr) {  // x − μ (keys: μ at the position, unless post-RoPE)
    float mu[8];
    load8_half_bits(mean_row + 8 * lane, mu);
    if (key && frame != transform::KeyFrame::kPostRope)
      lane_rope<kLanes>(mu, lane, rope_table, rotary_dim, rope_layout, position, false);
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = fp::add(v[r], -mu[r]);
  }
  if (key && scale_row != nullptr && scale_row[0] != 0) {  // S·(k − ...)
    float sc[8];
    load8_half_bits(scale_row + 8 * lane, sc);
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = fp::mul(v[r], sc[r]);
  }
  if (key && frame == transform::KeyFrame::kPreRope) lane_rope<kLanes>(v, lane, rope_table, rotary_dim, rope_layout, position, true);
  quant::lane_apply_signs(v, quant::lane_sign_byte(signs, lane));
  lane_fwht<kLanes>(v, lane);
  const double norm2 = lane_tree_sum<kLanes>(quant::block_sum_squares(v));
  const float to_u = quant::unit_scale_factor(norm2, D, scale);
  double xq = 0.0, qq = 0.0;
  const uint32_t index = quant::encode_block_with_stats<Code>(v, to_u, &xq, &qq, DeviceWarpFallback{});
  xq = lane_tree_sum<kLanes>(xq);
  qq = lane_tree_sum<kLanes>(qq);
  gain = quant::gain_from_stats(policy, norm2, xq, qq);
  return index;
}

template <int D, class Code>
__device__ __forceinline__ void paged_encode(const EncodeKernelArgs& a) {
  constexpr int kLanes = D / 8;
  constexpr int kVectorsPerCta = kEncodeThreads / kLanes;
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int64_t vec = static_cast<int64_t>(blockIdx.x) * kVectorsPerCta + threadIdx.x / kLanes;
  const int64_t total = static_cast<int64_t>(a.n_tokens) * a.kv_heads;
  // Lanes past the end or of skipped tokens still take part in the shuffles (on zeros).
  const bool in_range = vec < total;
  const int64_t j = in_range ? vec / a.kv_heads : 0;
  const int h = in_range ? static_cast<int>(vec % a.kv_heads) : 0;
  int64_t slot = in_range ? a.slot_mapping[j] : -1;
  if (a.pool_slots > 0 && slot >= a.pool_slots) {  // outside the pool: skipped, and said so
    if (lane == 0 && a.status != nullptr) atomicOr(a.status, kDeviceStatusSlotOutOfPool);
    slot = -1;
  }
  const bool active = slot >= 0;
  const PagedLayout& L = a.layout;
  float v[8];
  if (in_range) {
    load8_as_fp16(a.src, a.dtype, j * a.token_stride + h * a.head_stride + 8 * lane, v);
  } else {
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = 0.f;
  }
  const int64_t page = active ? slot / L.page_tokens : 0;
  const int s = active ? static_cast<int>(slot % L.page_tokens) : 0;
  uint8_t* page_ptr = a.pool + page * L.page_bytes;
  const int64_t code_offset = a.kind == 0 ? L.key_code_offset(h, s) : L.value_code_offset(h, s);
  if constexpr (kIsFp16<Code>) {
    if (active) {
      uint32_t words[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        words[k] = static_cast<uint32_t>(float_to_fp16_bits(v[2 * k])) |
                   static_cast<uint32_t>(float_to_fp16_bits(v[2 * k + 1])) << 16;
      *reinterpret_cast<uint4*>(page_ptr + code_offset + 16 * lane) = make_uint4(words[0], words[1], words[2], words[3]);
    }
  } else {
    const int32_t position = in_range ? a.positions[j] : 0;
    const int64_t bh = (in_range && a.token_seq != nullptr ? static_cast<int64_t>(a.token_seq[j]) : 0) * a.kv_heads + h;
    const uint16_t* mean_row = a.means != nullptr ? a.means + (bh * 2 + a.kind) * D : nullptr;
    const uint16_t* scale_row = a.kind == 0 && a.key_scales != nullptr ? a.key_scales + bh * D : nullptr;
    float gain = 0.f;
    const uint32_t index = encode_lane<D, Code>(v, lane, a.kind, a.key_frame, position, mean_row, scale_row,
                                                a.sign_bits + (static_cast<int64_t>(h) * 2 + a.kind) * a.sign_words,
                                                a.rope_table, a.rotary_dim, a.rope_layout, a.scale, a.gain, gain);
    if (active) {
      // cost-report: per-vector path (scripts/kernel_cost.py counts the paths through the next line)
      store_block_index<Code>(page_ptr + code_offset + lane * (Code::kIndexBits / 8), index);
      if (lane == 0) {
        const int64_t gain_offset = a.kind == 0 ? L.key_gain_offset(h, s) : L.value_gain_offset(h, s);
        const int gain_bytes = a.kind == 0 ? L.key_gain_bytes : L.value_gain_bytes;
        if (gain_bytes == 2) {
          *reinterpret_cast<uint16_t*>(page_ptr + gain_offset) = float_to_fp16_bits(gain);
        } else {  // 8-bit code around the (sequence, head, kind) reference, as the CPU's flush codes it
          page_ptr[gain_offset] = quant::gain_code_of(gain, fp16_bits_to_float(a.gain_refs[bh * 2 + a.kind]));
        }
      }
    }
  }
  if (active && a.write_positions && lane == 0 && (L.position_sets > 1 || h == 0))
    *reinterpret_cast<int32_t*>(page_ptr + L.position_offset(h, s)) = a.positions[j];
}

template <int D, class Code>
__global__ void __launch_bounds__(kEncodeThreads) paged_encode_kernel(const EncodeKernelArgs a) {
  paged_encode<D, Code>(a);
}

/// Launches one kind (keys or values) with the codec `Code`.
template <int D, class Code>
Status launch_paged_encode(const EncodeKernelArgs& a, cudaStream_t stream) {
  constexpr int kVectorsPerCta = kEncodeThreads / (D / 8);
  const int64_t total = static_cast<int64_t>(a.n_tokens) * a.kv_heads;
  const int64_t blocks = (total + kVectorsPerCta - 1) / kVectorsPerCta;
  if (blocks == 0) return Status::kSuccess;
  if (blocks > 0x7FFFFFFF) return Status::kInvalidArgument;
  paged_encode_kernel<D, Code><<<static_cast<unsigned>(blocks), kEncodeThreads, 0, stream>>>(a);
  return launch_status();
}

// ---- paged_estimate_state ----------------------------------------------------------------------

struct StateKernelArgs {
  const void* src = nullptr;  ///< keys or values of this launch's kind
  DType dtype = DType::kF16;
  int64_t token_stride = 0, head_stride = 0;
  const int64_t* rows = nullptr;
  const int32_t* positions = nullptr;
  int tokens_per_seq = 0, mean_tokens = 0, ref_tokens = 0;
  int kv_heads = 0;
  int kind = 0;
  transform::KeyFrame key_frame = transform::KeyFrame::kRopeResidual;
  const float* rope_table = nullptr;
  int rotary_dim = 0;
  transform::RopeLayout rope_layout = transform::RopeLayout::kSplitHalf;
  const uint32_t* sign_bits = nullptr;
  int sign_words = 0;
  float scale = 1.f;
  quant::GainPolicy gain = quant::GainPolicy::kNormPreserving;
  uint16_t* means = nullptr;
  uint16_t* gain_refs = nullptr;
  const uint16_t* key_scales = nullptr;
};

inline constexpr int kStateThreads = 128;
/// Reference tokens one CTA codes (CacheLayout::flush_block is at most this in the kernels).
inline constexpr int kMaxRefTokens = 1024;

/// One (KV head, sequence) of one kind: the mean of the first mean_tokens rows (double sums per
/// element in token order, keys with RoPE removed unless post-RoPE: src/cache/layer_write.cpp's loop),
/// then the gains of the first ref_tokens rows coded with that fp16 mean and the key channel
/// scales, and their reference (quant::gain_reference_bits). Fp16-coded kinds: zeros.
template <int D, class Code>
__device__ __forceinline__ void paged_state(const StateKernelArgs& a) {
  constexpr int kLanes = D / 8;
  constexpr int kVectors = kStateThreads / kLanes;
  const int h = blockIdx.x, b = blockIdx.y;
  const int64_t bh = static_cast<int64_t>(b) * a.kv_heads + h;
  __shared__ uint16_t s_mean[D];
  __shared__ float s_gains[kMaxRefTokens];
  const int64_t* rows = a.rows + static_cast<int64_t>(b) * a.tokens_per_seq;
  const int32_t* positions = a.positions + static_cast<int64_t>(b) * a.tokens_per_seq;
  const bool centred = a.mean_tokens > 0 && a.means != nullptr;
  if (centred) {
    const int pairs = a.rotary_dim / 2;
    for (int i = threadIdx.x; i < D; i += kStateThreads) {
      uint16_t bits = 0;
      if constexpr (!kIsFp16<Code>) {
        int partner = i, pair = 0;
        bool first = true;
        const bool rotary = a.kind == 0 && a.key_frame != transform::KeyFrame::kPostRope &&
                            quant::rope_partner(i, a.rotary_dim, a.rope_layout, partner, pair, first);
        double acc = 0.0;
        for (int t = 0; t < a.mean_tokens; ++t) {
          const int64_t row = rows[t] * a.token_stride + h * a.head_stride;
          float x[8], y[8];  // load8_as_fp16 rounds like compress(); one element used (and its partner)
          load8_as_fp16(a.src, a.dtype, row + (i & ~7), x);
          float v = x[i & 7];
          if (rotary) {
            load8_as_fp16(a.src, a.dtype, row + (partner & ~7), y);
            float c = 0.f, sn = 0.f;
            quant::rope_table_cos_sin(a.rope_table, pairs, positions[t], pair, c, sn);
            v = quant::rope_element(v, y[partner & 7], c, sn, first, true);
          }
          acc += static_cast<double>(v);
        }
        bits = float_to_fp16_bits(static_cast<float>(acc / static_cast<double>(a.mean_tokens)));
      }
      s_mean[i] = bits;
      a.means[(bh * 2 + a.kind) * D + i] = bits;
    }
  }
  __syncthreads();
  if (a.gain_refs == nullptr || a.ref_tokens <= 0) return;
  if constexpr (kIsFp16<Code>) {
    if (threadIdx.x == 0) a.gain_refs[bh * 2 + a.kind] = 0;
  } else {
    const int lane = threadIdx.x % kLanes;
    const int n = min(a.ref_tokens, kMaxRefTokens);
    for (int t0 = 0; t0 < n; t0 += kVectors) {
      const int t = t0 + static_cast<int>(threadIdx.x) / kLanes;
      const bool active = t < n;
      float v[8];
      if (active) {
        load8_as_fp16(a.src, a.dtype, rows[t] * a.token_stride + h * a.head_stride + 8 * lane, v);
      } else {
#pragma unroll
        for (int r = 0; r < 8; ++r) v[r] = 0.f;
      }
      float gain = 0.f;
      (void)encode_lane<D, Code>(v, lane, a.kind, a.key_frame, active ? positions[t] : 0, centred ? s_mean : nullptr,
                                 a.kind == 0 && a.key_scales != nullptr ? a.key_scales + bh * D : nullptr,
                                 a.sign_bits + (static_cast<int64_t>(h) * 2 + a.kind) * a.sign_words, a.rope_table,
                                 a.rotary_dim, a.rope_layout, a.scale, a.gain, gain);
      if (active && lane == 0) s_gains[t] = gain;
    }
    __syncthreads();
    if (threadIdx.x == 0) a.gain_refs[bh * 2 + a.kind] = quant::gain_reference_bits(s_gains, n);
  }
}

template <int D, class Code>
__global__ void __launch_bounds__(kStateThreads) paged_state_kernel(const StateKernelArgs a) {
  paged_state<D, Code>(a);
}

}  // namespace e8kv::cuda::detail
