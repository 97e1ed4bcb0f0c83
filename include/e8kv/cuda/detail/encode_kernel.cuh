// Kernel template of paged_encode: one head vector per D/8 lanes, fused RoPE removal, randomized
// Hadamard, gain and block encode, written straight into the vector's page slot. Inputs are
// first rounded to fp16, the cache's working precision, exactly as compress()/append() round
// them on the CPU (f32 and bf16 inputs give the codes of their fp16 roundings). The body is a
// __device__ function so that scripts/kernel_cost.cu can compile it with a launch's uniform
// parameters fixed.
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
  bool remove_rope = false;
  const float* rope_table = nullptr;
  int rotary_dim = 0;
  transform::RopeLayout rope_layout = transform::RopeLayout::kSplitHalf;
  bool write_positions = false;
  const uint16_t* means = nullptr;  ///< [batch][kv_heads][2][D] fp16 bits, or null
  const int32_t* token_seq = nullptr;
  int64_t pool_slots = 0;           ///< n_pages · page_tokens; 0 = not checked
  uint32_t* status = nullptr;       ///< device status word (kDeviceStatus* bits), or null
};

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
    if (a.means != nullptr) {  // centring, as CompressedKV::flush: x − μ (keys: μ at the position)
      const int64_t seq = in_range ? a.token_seq[j] : 0;
      float mu[8];
      load8_half_bits(a.means + ((seq * a.kv_heads + h) * 2 + a.kind) * D + 8 * lane, mu);
      if (a.kind == 0 && a.remove_rope) lane_rope<kLanes>(mu, lane, a.rope_table, a.rotary_dim, a.rope_layout, position, false);
#pragma unroll
      for (int r = 0; r < 8; ++r) v[r] = fp::add(v[r], -mu[r]);
    }
    if (a.remove_rope) lane_rope<kLanes>(v, lane, a.rope_table, a.rotary_dim, a.rope_layout, position, true);
    quant::lane_apply_signs(v, quant::lane_sign_byte(a.sign_bits + (static_cast<int64_t>(h) * 2 + a.kind) * a.sign_words, lane));
    lane_fwht<kLanes>(v, lane);
    const double norm2 = lane_tree_sum<kLanes>(quant::block_sum_squares(v));
    const float to_u = quant::unit_scale_factor(norm2, D, a.scale);
    double xq = 0.0, qq = 0.0;
    const uint32_t index = quant::encode_block_with_stats<Code>(v, to_u, &xq, &qq);
    xq = lane_tree_sum<kLanes>(xq);
    qq = lane_tree_sum<kLanes>(qq);
    if (active) {
      // cost-report: per-vector path (scripts/kernel_cost.py counts the paths through the next line)
      store_block_index<Code>(page_ptr + code_offset + lane * (Code::kIndexBits / 8), index);
      if (lane == 0) {
        const int64_t gain_offset = a.kind == 0 ? L.key_gain_offset(h, s) : L.value_gain_offset(h, s);
        *reinterpret_cast<uint16_t*>(page_ptr + gain_offset) = quant::gain_bits_from_stats(a.gain, norm2, xq, qq);
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

}  // namespace e8kv::cuda::detail
