// Scenario instantiations for the static cost report (scripts/kernel_cost.py); never linked.
//
// The real kernels (kernels/*.cu) take the group size, the value codec, the RoPE mode and the
// input dtype as uniform run-time values, so their per-token loops hold the code of every case
// and a path through them is only an upper bound. Each scenario below is the same kernel body
// (the __device__ function the real kernel calls) with one launch's uniform parameters fixed, so
// the compiler drops the branches that launch never takes: its hot path is what that launch runs.
// Resource figures (registers, stack, occupancy) are reported for the real kernels; the
// scenarios' own are informational.
//
// One "cost-scenario:" line per kernel, read by the script:
//   name | what | vectors per warp step | bytes per token-head | family
// where a warp step is one trip of the per-token loop (decode: one token per D/8-lane key group,
// so 32 / (D/8) tokens per warp) or one pass of the kernel (encode, dequantize: one vector per
// D/8 lanes), and the bytes are what one token-head moves through HBM: decode reads key + value
// codes and gains (+ the 4-byte position shared by 8 KV heads when keys are pre-RoPE); encode
// reads fp16 K or V and writes codes and gain (+ position); dequantize reads codes, gain and
// position and writes fp16.
//
// The decode rows with 8-bit gains (the library's default Config) read 1-byte gains; the bytes of
// a token-head are key codes + value codes + 2 gain bytes + the 4-byte position shared by 8 KV
// heads. The RoPE-residual and post-RoPE rows are the tensor-core kernel
// (detail/rotated_attention_kernel.cuh; a warp step is one warp's 16-token tile), the pre-RoPE and
// fp16 rows the lane kernel (detail/decode_attention_kernel.cuh; two tokens per warp step).
//
// cost-scenario: cost_decode_k2v2_d128_g4_res  | decode K2V2 d128 GQA 4 RoPE-residual | 16 | 66.5  | decode
// cost-scenario: cost_decode_k2v2_d128_g8_res  | decode K2V2 d128 GQA 8 RoPE-residual | 16 | 66.5  | decode
// cost-scenario: cost_decode_k3v2_d128_g4_res  | decode K3V2 d128 GQA 4 RoPE-residual | 16 | 82.5  | decode
// cost-scenario: cost_decode_k3v2_d128_g8_res  | decode K3V2 d128 GQA 8 RoPE-residual | 16 | 82.5  | decode
// cost-scenario: cost_decode_k2v2_d128_g4_post | decode K2V2 d128 GQA 4 post-RoPE     | 16 | 66.5  | decode
// cost-scenario: cost_decode_k3v2_d128_g8_post | decode K3V2 d128 GQA 8 post-RoPE     | 16 | 82.5  | decode
// cost-scenario: cost_decode_k4v4_d128_g4_res  | decode K4V4 d128 GQA 4 RoPE-residual | 16 | 130.5 | decode
// cost-scenario: cost_decode_k2v2_d128_g4_pre  | decode K2V2 d128 GQA 4 pre-RoPE      | 2  | 66.5  | decode
// cost-scenario: cost_decode_k2v2_d128_g8_pre  | decode K2V2 d128 GQA 8 pre-RoPE      | 2  | 66.5  | decode
// cost-scenario: cost_decode_k3v2_d128_g4_pre  | decode K3V2 d128 GQA 4 pre-RoPE      | 2  | 82.5  | decode
// cost-scenario: cost_decode_k3v2_d128_g8_pre  | decode K3V2 d128 GQA 8 pre-RoPE      | 2  | 82.5  | decode
// cost-scenario: cost_decode_fp16_d128_g4      | decode fp16 d128 GQA 4 (ours)        | 2  | 512   | decode
// cost-scenario: cost_encode_key_e8p_d128      | encode E8P key d128 residual f16     | 2  | 289.5 | encode
// cost-scenario: cost_encode_key_rvq3_d128     | encode Rvq3 key d128 residual f16    | 2  | 305.5 | encode
// cost-scenario: cost_encode_value_e8p_d128    | encode E8P value d128 f16            | 2  | 289   | encode
// cost-scenario: cost_dequant_key_e8p_d128     | dequantize E8P key d128 residual     | 2  | 289.5 | dequantize
// cost-scenario: cost_dequant_value_e8p_d128   | dequantize E8P value d128            | 2  | 289.5 | dequantize
#include "e8kv/cuda/detail/decode_attention_kernel.cuh"
#include "e8kv/cuda/detail/dequantize_kernel.cuh"
#include "e8kv/cuda/detail/encode_kernel.cuh"
#include "e8kv/cuda/detail/rotated_attention_kernel.cuh"

namespace e8kv::cuda::cost {

using detail::AttentionKernelArgs;
using detail::DequantizeKernelArgs;
using detail::EncodeKernelArgs;
using detail::RotKernelArgs;

/// 8-bit gain entries (the default Config), as make_paged_layout gives them.
template <class Args>
__device__ __forceinline__ void gains8(Args& a) {
  a.layout.key_gain_bytes = 1;
  a.layout.value_gain_bytes = 1;
}

/// The lane kernel (pre-RoPE / fp16 keys) with the group size and value codec of one launch fixed.
template <int D, class KeyCode, quant::Codec kValue, int kGroup>
__device__ __forceinline__ void decode_scenario(AttentionKernelArgs a) {
  a.group = kGroup;
  a.q_chunks = (kGroup + detail::kMaxGroup - 1) / detail::kMaxGroup;
  a.value_codec = kValue;
  a.rotary_dim = D;
  a.rope_layout = transform::RopeLayout::kSplitHalf;
  a.q_dtype = DType::kF16;
  if constexpr (!detail::kIsFp16<KeyCode>) gains8(a);
  detail::decode_attention_split<D, KeyCode>(a);
}

/// The tensor-core kernel (RoPE-residual or post-RoPE keys, centred, 8-bit gains).
template <int D, class KeyCode, class ValueCode, int kGroup, bool kResidual>
__device__ __forceinline__ void rotated_scenario(RotKernelArgs a, detail::RotSmem<D, KeyCode, ValueCode>& sm) {
  a.group = kGroup;
  a.q_chunks = (kGroup + kRotQueryHeads - 1) / kRotQueryHeads;
  a.residual = kResidual;
  a.rotary_dim = D;
  a.rope_layout = transform::RopeLayout::kSplitHalf;
  a.q_dtype = DType::kF16;
  gains8(a);
  detail::rotated_attention_split<D, KeyCode, ValueCode>(a, sm);
}

/// Encode of one kind with an fp16 NHD input, centring on, RoPE-residual keys with channel
/// scales, 8-bit gains, the default gain policy.
template <int D, class Code, int kKind>
__device__ __forceinline__ void encode_scenario(EncodeKernelArgs a) {
  a.dtype = DType::kF16;
  a.kind = kKind;
  a.key_frame = transform::KeyFrame::kRopeResidual;
  a.write_positions = kKind == 0;
  a.rotary_dim = D;
  a.rope_layout = transform::RopeLayout::kSplitHalf;
  a.gain = quant::GainPolicy::kNormPreserving;
  gains8(a);
  detail::paged_encode<D, Code>(a);
}

/// Dequantize of one kind to fp16 (RoPE-residual keys, 8-bit gains).
template <int D, class Code, int kKind>
__device__ __forceinline__ void dequantize_scenario(DequantizeKernelArgs a) {
  a.kind = kKind;
  a.key_frame = transform::KeyFrame::kRopeResidual;
  a.rotary_dim = D;
  a.rope_layout = transform::RopeLayout::kSplitHalf;
  a.out_dtype = DType::kF16;
  gains8(a);
  detail::paged_dequantize<D, Code>(a);
}

// Plain C names, so the report's rows read as the scenario lines above.
#define E8KV_DECODE_SCENARIO(name, D, KeyCode, kValue, kGroup)                                         \
  extern "C" __global__ void __launch_bounds__(detail::kAttentionThreads) name(const AttentionKernelArgs a) { \
    decode_scenario<D, KeyCode, kValue, kGroup>(a);                                                    \
  }
#define E8KV_ROTATED_SCENARIO(name, D, KeyCode, ValueCode, kGroup, kResidual)                           \
  extern "C" __global__ void __launch_bounds__(detail::kRotThreads, 4) name(const RotKernelArgs a) {      \
    __shared__ detail::RotSmem<D, KeyCode, ValueCode> sm;                                              \
    rotated_scenario<D, KeyCode, ValueCode, kGroup, kResidual>(a, sm);                                \
  }
#define E8KV_ENCODE_SCENARIO(name, D, Code, kKind)                                                   \
  extern "C" __global__ void __launch_bounds__(detail::kEncodeThreads) name(const EncodeKernelArgs a) { \
    encode_scenario<D, Code, kKind>(a);                                                              \
  }
#define E8KV_DEQUANTIZE_SCENARIO(name, D, Code, kKind)                                                        \
  extern "C" __global__ void __launch_bounds__(detail::kDequantizeThreads) name(const DequantizeKernelArgs a) { \
    dequantize_scenario<D, Code, kKind>(a);                                                                   \
  }

E8KV_ROTATED_SCENARIO(cost_decode_k2v2_d128_g4_res, 128, codebook::E8P, codebook::E8P, 4, true)
E8KV_ROTATED_SCENARIO(cost_decode_k2v2_d128_g8_res, 128, codebook::E8P, codebook::E8P, 8, true)
E8KV_ROTATED_SCENARIO(cost_decode_k3v2_d128_g4_res, 128, codebook::Rvq3, codebook::E8P, 4, true)
E8KV_ROTATED_SCENARIO(cost_decode_k3v2_d128_g8_res, 128, codebook::Rvq3, codebook::E8P, 8, true)
E8KV_ROTATED_SCENARIO(cost_decode_k2v2_d128_g4_post, 128, codebook::E8P, codebook::E8P, 4, false)
E8KV_ROTATED_SCENARIO(cost_decode_k3v2_d128_g8_post, 128, codebook::Rvq3, codebook::E8P, 8, false)
E8KV_ROTATED_SCENARIO(cost_decode_k4v4_d128_g4_res, 128, codebook::Rvq4, codebook::Rvq4, 4, true)
E8KV_DECODE_SCENARIO(cost_decode_k2v2_d128_g4_pre, 128, codebook::E8P, quant::Codec::kE8P, 4)
E8KV_DECODE_SCENARIO(cost_decode_k2v2_d128_g8_pre, 128, codebook::E8P, quant::Codec::kE8P, 8)
E8KV_DECODE_SCENARIO(cost_decode_k3v2_d128_g4_pre, 128, codebook::Rvq3, quant::Codec::kE8P, 4)
E8KV_DECODE_SCENARIO(cost_decode_k3v2_d128_g8_pre, 128, codebook::Rvq3, quant::Codec::kE8P, 8)
E8KV_DECODE_SCENARIO(cost_decode_fp16_d128_g4, 128, detail::Fp16Code, quant::Codec::kFp16, 4)
E8KV_ENCODE_SCENARIO(cost_encode_key_e8p_d128, 128, codebook::E8P, 0)
E8KV_ENCODE_SCENARIO(cost_encode_key_rvq3_d128, 128, codebook::Rvq3, 0)
E8KV_ENCODE_SCENARIO(cost_encode_value_e8p_d128, 128, codebook::E8P, 1)
E8KV_DEQUANTIZE_SCENARIO(cost_dequant_key_e8p_d128, 128, codebook::E8P, 0)
E8KV_DEQUANTIZE_SCENARIO(cost_dequant_value_e8p_d128, 128, codebook::E8P, 1)

}  // namespace e8kv::cuda::cost
