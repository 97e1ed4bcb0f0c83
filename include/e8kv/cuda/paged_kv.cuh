// CUDA kernels over the paged compressed KV cache (cache/paged_layout.hpp, docs/paged_layout.md):
// the public API. Every launcher takes raw device pointers, one params struct by value and a
// stream, never synchronizes the host (CUDA-graph friendly) and returns a Status:
//
//   paged_estimate_state    the first coded tokens of each sequence -> its centring means and
//                           8-bit gain references, equal to what the CPU's first flush stores.
//   paged_encode            new K/V tokens (fp16/bf16/fp32, any token/head strides: NHD, HND)
//                           -> the key frame's centring (k − R_t·μ, or RoPE removal), channel
//                           scales, randomized Hadamard, gain, block codes, fp16 or 8-bit gains ->
//                           pages. Codes are byte-identical to CacheCodecs::encode.
//   paged_decode_attention  one query token per sequence over a ragged batch, split-K
//                           (flash-decoding) + a reduction kernel, fp32 softmax, plus the fp16
//                           residual window. Keys coded as RoPE residuals or post-RoPE: scored in
//                           the rotated domain on tensor cores (the query rotated once per CTA,
//                           no key transformed; cuda/rotated_attention_math.hpp). Pre-RoPE keys:
//                           decoded to the engine basis in registers (GQA groups share each key).
//   paged_dequantize        codes -> dense fp16/bf16 K/V (post-RoPE keys, engine basis).
//
// Guard rails: pools and workspaces must be 16-byte aligned (kMisaligned); other buffers may
// sit at any element boundary (the kernels fall back to scalar loads). What only the device
// can see (a sequence longer than the launch planned for, a slot outside the pool) is reported
// through an optional device status word the caller reads after the stream (device_status()),
// never by truncating silently: attention rows of such a sequence are NaN, and no byte outside
// the pool is written.
//
// Closed dispatch (anything else returns a loud status and launches nothing):
//   head_dim 64, 128, 256 (kUnsupportedHeadDim); codecs fp16, e8p2, rvq3, rvq4 for keys and values
//   (kUnsupportedBits); K/V input f16/bf16/f32, query f16/bf16/f32, output f16/bf16/f32, dense
//   output f16/bf16 (kUnsupportedDtype); RoPE: rotary_dim a multiple of 16 in [16, head_dim]
//   for split-half pairs, even for interleaved pairs (kInvalidArgument); key frames pre, post,
//   residual; gains fp16 or 8-bit (gain_bits 16 or 8); key channel scales or none.
// The implementation lives in e8kv/cuda/detail/*.cuh (kernel templates) and kernels/*.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/cache/kv_view.hpp"
#include "e8kv/cache/paged_layout.hpp"
#include "e8kv/error.hpp"
#include "e8kv/quant/codec.hpp"
#include "e8kv/quant/vector_quantizer.hpp"
#include "e8kv/transform/rope.hpp"

namespace e8kv::cuda {

/// Bits the kernels OR into a caller's device status word (a uint32_t in device memory, zeroed
/// by the caller; DecodeAttentionParams::status, DequantizeParams::status, EncodeParams::status).
/// Reading it back is the caller's synchronization point, not the launcher's (graph-safe).
enum DeviceStatusBits : uint32_t {
  kDeviceStatusOk = 0,
  /// A sequence had more coded tokens than the launch was planned for (coded_lens[b] >
  /// max_coded_len for dequantize, beyond splits · split_tokens for attention): its attention
  /// rows are NaN, its dequantized tail is not written.
  kDeviceStatusBeyondPlan = 1u << 0,
  /// An encode slot lay outside the pool (slot >= EncodeParams::n_pages · page_tokens): skipped.
  kDeviceStatusSlotOutOfPool = 1u << 1,
};

/// The Status a status word read back from the device stands for (kSuccess when it is 0,
/// kBeyondPlan or kInvalidArgument otherwise).
inline Status device_status(uint32_t word) {
  if (word == kDeviceStatusOk) return Status::kSuccess;
  if (word & kDeviceStatusBeyondPlan) return Status::kBeyondPlan;
  return Status::kInvalidArgument;
}

/// The codec of one layer as the kernels see it; the pointers are device memory.
struct LayerCodecParams {
  int head_dim = 0;
  int kv_heads = 0;
  quant::Codec key_codec = quant::Codec::kE8P;
  quant::Codec value_codec = quant::Codec::kE8P;
  quant::GainPolicy key_gain = quant::GainPolicy::kNormPreserving;
  quant::GainPolicy value_gain = quant::GainPolicy::kNormPreserving;
  float key_scale = 1.f;
  float value_scale = 1.f;
  /// What block-coded keys are (transform::KeyFrame): RoPE residuals k − R_t·μ (the library's
  /// default), pre-RoPE (RoPE removed, re-applied at attention) or post-RoPE.
  transform::KeyFrame key_frame = transform::KeyFrame::kRopeResidual;
  int gain_bits = 16;                            ///< 16: fp16 gains; 8: 8-bit codes around PagedCacheView::gain_refs
  int rotary_dim = 0;                            ///< 0 = head_dim
  transform::RopeLayout rope_layout = transform::RopeLayout::kSplitHalf;
  /// quant::rope_table_floats(rotary_dim/2) floats: CacheCodecs::rope_table() (needed by block-coded
  /// keys of the pre and residual frames).
  const float* rope_table = nullptr;
  /// rope_delta_table() (cache/paged_kv.hpp): attention over centred RoPE-residual keys needs it.
  const float* rope_delta_table = nullptr;
  const uint32_t* sign_bits = nullptr;           ///< [kv_heads][2][head_dim/32]: packed_sign_bits()
};

/// One layer's pages and block table (device memory).
struct PagedCacheView {
  PagedLayout layout;
  const uint8_t* pool = nullptr;        ///< n_pages · layout.page_bytes
  const int32_t* page_indptr = nullptr; ///< [batch + 1]
  const int32_t* page_indices = nullptr;
  const int32_t* coded_lens = nullptr;  ///< [batch] coded tokens per sequence
  int batch = 0;
  int max_coded_len = 0;                ///< host-side upper bound of coded_lens (sizes the grid)
  /// Centring means (CacheLayout::center): [batch][kv_heads][2: key, value][head_dim] fp16 bits,
  /// keys in their coding frame (pre-RoPE for the pre and residual frames); block-coded kinds are
  /// stored as x − μ (keys: k − R_t·μ, or k − μ post-RoPE) and decoded as x̂ + μ. Null: no
  /// centring. (PagedLayer::means.)
  const uint16_t* means = nullptr;
  /// Key channel scales S (CacheLayout::query_weighted_keys): [batch][kv_heads][head_dim] fp16
  /// bits; block-coded keys are S·(k − ...), decoded with S⁻¹. A row whose first entry is 0 (or a
  /// null pointer): none. (PagedLayer::key_scales.)
  const uint16_t* key_scales = nullptr;
  /// 8-bit gain references (gain_bits 8): [batch][kv_heads][2: key, value] fp16 bits: a gain
  /// code c stands for ref · 2^((c − 128)/32) (quant/gain_code.hpp). (PagedLayer::gain_refs.)
  const uint16_t* gain_refs = nullptr;
};

struct EncodeParams {
  LayerCodecParams codec;
  PagedLayout layout;
  uint8_t* pool = nullptr;
  int n_tokens = 0;
  /// K and V of the new tokens, element (token j, head h, i) at ptr + j·token_stride +
  /// h·head_stride + i (elements). NHD: token_stride = H·d, head_stride = d; HND: d and T·d.
  const void* keys = nullptr;
  const void* values = nullptr;
  DType dtype = DType::kF16;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  const int32_t* positions = nullptr;     ///< [n_tokens] absolute positions (>= 0)
  const int64_t* slot_mapping = nullptr;  ///< [n_tokens] page · page_tokens + slot; < 0 skips the token
  /// Centring (as PagedCacheView::means): block-coded keys are coded as k − R(pos)·μ_k (μ_k when
  /// keys are stored post-RoPE) and values as v − μ_v, exactly as the CPU's flush does.
  /// token_seq[j] is the sequence (row of means, scales and references) of token j; needed by
  /// any of means, key_scales, gain_refs.
  const uint16_t* means = nullptr;
  const int32_t* token_seq = nullptr;
  /// Key channel scales (as PagedCacheView::key_scales), or null.
  const uint16_t* key_scales = nullptr;
  /// 8-bit gain references (as PagedCacheView::gain_refs); required when codec.gain_bits is 8.
  const uint16_t* gain_refs = nullptr;
  /// Pool size in pages: slots at or beyond n_pages · page_tokens are skipped and flagged
  /// (kDeviceStatusSlotOutOfPool) instead of written. 0: not checked.
  int64_t n_pages = 0;
  uint32_t* status = nullptr;  ///< device status word (DeviceStatusBits), or null
};

struct DecodeAttentionParams {
  LayerCodecParams codec;
  PagedCacheView cache;
  int q_heads = 0;                 ///< multiple of codec.kv_heads; q head h·G + g uses KV head h
  float softmax_scale = 0.f;       ///< <= 0: 1/sqrt(head_dim)
  const void* q = nullptr;         ///< [batch][q_heads][head_dim], post-RoPE
  DType q_dtype = DType::kF32;
  void* out = nullptr;             ///< [batch][q_heads][head_dim]
  DType out_dtype = DType::kF32;
  /// fp16 residual window (post-RoPE keys, engine basis): element (b, h, t, i) at
  /// ptr + b·seq_stride + h·head_stride + t·token_stride + i. Null lens = no window.
  const uint16_t* window_keys = nullptr;
  const uint16_t* window_values = nullptr;
  const int32_t* window_lens = nullptr;  ///< [batch]
  int64_t window_seq_stride = 0;
  int64_t window_head_stride = 0;
  int64_t window_token_stride = 0;
  int split_tokens = 0;            ///< coded tokens per split; 0 = automatic (split_plan.hpp)
  /// CTAs the device runs at once for the split kernel (SMs × CTAs per SM), the automatic plan's
  /// budget; 0 = queried once per device and kernel instantiation, then cached (no sync).
  int sm_slots = 0;
  uint32_t* status = nullptr;      ///< device status word (DeviceStatusBits), or null
};

struct DequantizeParams {
  LayerCodecParams codec;
  PagedCacheView cache;
  /// Dense output: token t of sequence b, head h at ptr + (out_indptr[b] + t)·token_stride +
  /// h·head_stride (elements). Either pointer may be null (that half is skipped).
  void* keys_out = nullptr;
  void* values_out = nullptr;
  DType out_dtype = DType::kF16;
  const int64_t* out_indptr = nullptr;  ///< [batch] first output token of each sequence
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;
  uint32_t* status = nullptr;  ///< device status word (DeviceStatusBits), or null
};

/// What a sequence's first flush estimates on the CPU (src/cache/layer_write.cpp), from its first coded
/// tokens on the device: the centring means (the first mean_tokens tokens; keys with RoPE removed
/// for the pre and residual frames, as the CPU's flush) and the 8-bit gain references (the
/// geometric mean of the gains of the first ref_tokens tokens, coded with those means and the
/// given key channel scales). One CTA per (sequence, KV head, kind).
struct StateParams {
  LayerCodecParams codec;
  int batch = 0;
  /// K and V, element (row j, head h, i) at ptr + j·token_stride + h·head_stride + i, as EncodeParams.
  const void* keys = nullptr;
  const void* values = nullptr;
  DType dtype = DType::kF16;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  /// Sequence b's first coded tokens are rows rows[b·tokens_per_seq + t] at positions[same],
  /// t < tokens_per_seq = max(mean_tokens, ref_tokens) (CacheLayout::mean_tokens, flush_block).
  const int64_t* rows = nullptr;
  const int32_t* positions = nullptr;
  int tokens_per_seq = 0;
  int mean_tokens = 0;  ///< 0: no centring (means not written, references of uncentred vectors)
  int ref_tokens = 0;   ///< 0: no references (fp16 gains)
  /// Outputs: [batch][kv_heads][2][head_dim] means (fp16 bits; zeros for fp16-coded kinds) and
  /// [batch][kv_heads][2] references. Input: key channel scales [batch][kv_heads][head_dim] or null.
  uint16_t* means = nullptr;
  uint16_t* gain_refs = nullptr;
  const uint16_t* key_scales = nullptr;
};

/// Estimates the means and gain references of `batch` sequences (their first flush).
Status paged_estimate_state(const StateParams& p, cudaStream_t stream);

/// Encodes n_tokens new tokens of one layer into their slots.
Status paged_encode(const EncodeParams& p, cudaStream_t stream);

/// Workspace that paged_decode_attention needs for these params (depends on batch, q_heads,
/// head_dim, max_coded_len, the window and the split plan only). 16-byte aligned.
Status decode_attention_workspace_bytes(const DecodeAttentionParams& p, size_t* bytes);

/// Decode attention: out[b] = softmax(scale·q·Kᵀ)·V over the coded tokens and the window.
Status paged_decode_attention(const DecodeAttentionParams& p, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream);

/// Writes the coded tokens as dense fp16/bf16 K (post-RoPE) and V.
Status paged_dequantize(const DequantizeParams& p, cudaStream_t stream);

/// Number of coded-token splits decode attention uses for these params (the window adds one);
/// *split_tokens receives the tokens per split. Automatic plans (split_tokens == 0) use
/// p.sm_slots, or the device's slots for the kernel these params dispatch to (cached query).
int decode_attention_splits(const DecodeAttentionParams& p, int* split_tokens);

/// The slot count the automatic plan uses for these params on the current device: SMs × CTAs
/// per SM of the split kernel instantiation p dispatches to (p.sm_slots when set); 0 when
/// the codec is unsupported or no device answers.
int decode_attention_slots(const DecodeAttentionParams& p);

/// The codec of `layer` of caches made with `codecs`, pointing at device copies of
/// codecs.rope_table(), packed_sign_bits(codecs, layer) and rope_delta_table(codecs)
/// (cache/paged_kv.hpp; the last one only matters for centred RoPE-residual keys).
inline LayerCodecParams layer_codec_params(const CacheCodecs& codecs, int layer, const float* device_rope_table,
                                           const uint32_t* device_sign_bits,
                                           const float* device_rope_delta_table = nullptr) {
  const CacheLayout& L = codecs.layout();
  require(layer >= 0 && layer < L.n_layers, "layer_codec_params: layer " + std::to_string(layer) + " out of range");
  LayerCodecParams c;
  c.head_dim = L.head_dim;
  c.kv_heads = L.n_kv_heads;
  c.key_codec = L.key_codec[static_cast<size_t>(layer)];
  c.value_codec = L.value_codec[static_cast<size_t>(layer)];
  c.key_gain = L.key_gain;
  c.value_gain = L.value_gain;
  c.key_scale = L.key_scale;
  c.value_scale = L.value_scale;
  c.key_frame = L.key_frame;
  c.gain_bits = L.gain_bits;
  c.rotary_dim = codecs.rope().rotary_dim();
  c.rope_layout = codecs.rope().params().layout;
  c.rope_table = device_rope_table;
  c.rope_delta_table = device_rope_delta_table;
  c.sign_bits = device_sign_bits;
  return c;
}

}  // namespace e8kv::cuda
