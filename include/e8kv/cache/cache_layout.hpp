// CacheLayout: everything a decoder needs to interpret a cache's codes (its descriptor). The
// container writes it as the layout record (docs/format.md); bytes() counts it at that size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "e8kv/quant/codec_basics.hpp"
#include "e8kv/quant/codec_id.hpp"
#include "e8kv/transform/rope_params.hpp"

namespace e8kv {

/// Keys or values: the two kinds of vectors a cache codes (each with its own codec, rotation and
/// statistics).
enum class KvKind : uint8_t { kKey = 0, kValue = 1 };

/// Everything a decoder needs to interpret the codes of a cache (its descriptor).
struct CacheLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int n_q_heads = 0;
  int head_dim = 0;
  std::vector<quant::Codec> key_codec;    ///< per layer
  std::vector<quant::Codec> value_codec;  ///< per layer
  /// The code tier (Config::code_tier): the codecs of the tokens a compress / extend chunk
  /// promoted to a higher rate, stored as a second code stream per head (HeadData::tier_*).
  /// kFp16 for both: the cache has no code tier. Tier keys are coded post-RoPE and tier vectors
  /// uncentred, without channel scales (the tokens are coded when they arrive, before a layer's
  /// means exist), with fp16 gains; a layer uses the tier only where it raises a rate
  /// (layer_has_code_tier).
  quant::Codec tier_key_codec = quant::Codec::kFp16;
  quant::Codec tier_value_codec = quant::Codec::kFp16;
  /// The code tier's vectors are centred on the head's means (Config::tier_center; format version
  /// 6): a tier key is coded as k − R_t·μ (RoPE-residual frame) or k − μ (post-RoPE frame), a
  /// tier value as v − μ_v, still without channel scales, and decodes with the means added back.
  /// Only with a code tier, centring and a key frame other than pre (make_layout clears it
  /// otherwise). False: the version-5 tier, uncentred.
  bool tier_centered = false;
  quant::GainPolicy key_gain = quant::GainPolicy::kNormPreserving;
  quant::GainPolicy value_gain = quant::GainPolicy::kNormPreserving;
  float key_scale = 1.f;
  float value_scale = 1.f;
  transform::KeyFrame key_frame = transform::KeyFrame::kPreRope;  ///< see transform::KeyFrame
  transform::RopeParams rope{};
  uint64_t rotation_seed = 0;
  bool per_head_positions = false;
  int residual_length = 0;
  int flush_block = 16;
  /// Centre coded vectors on a per-(layer, head) mean (fp16, estimated from the first
  /// mean_tokens coded tokens; keys in the frame they are coded in). Pre-RoPE keys of one head
  /// share a large common component (‖k − μ‖² is 10-25 % of ‖k‖² on SmolLM2), so coding k − μ
  /// cuts the key error several-fold for 2·d fp16 values per head.
  bool center = true;
  int mean_tokens = 64;
  /// Query-weighted keys. The error that matters for a key is q·(k − k̂), whose expectation over
  /// queries is Σ_i w_i e_i² with w_i the query energy of channel i, while the codec spreads its
  /// error evenly over the channels it sees. Coding S·k (S diagonal, σ_i² the key energy) and
  /// decoding S⁻¹·(S·k)^ gives an expected error ∝ Σ s_i² σ_i² · Σ w_i / s_i², least at
  /// s_i ∝ (w_i / σ_i²)^(1/4) (Cauchy–Schwarz); we use a shrunk exponent (see key_channel_scales). s is equal within each RoPE pair (energies are pair-averaged), so S commutes with
  /// RoPE and applies in either key frame. Stored per (layer, head): head_dim fp16 values, once
  /// estimated from the observation queries and the mean tokens (compress() must get queries).
  bool query_weighted_keys = false;
  /// Bits per stored vector gain: 16 (fp16, HeadData::key_gains / value_gains) or 8 (a log-domain
  /// code relative to a per-(layer, head, kind) fp16 reference, quant/gain_code.hpp;
  /// HeadData::key_gain_codes / value_gain_codes and key_gain_ref / value_gain_ref).
  int gain_bits = 16;
  float softmax_scale = 0.f;  ///< <= 0: 1/sqrt(head_dim)

  /// Bytes of the descriptor counted by bytes(): exactly what the container format writes for it
  /// (docs/format.md §2.2) — the 128-byte layout record, two codec ids per layer, and per layer
  /// original_tokens and pinned (16 bytes) plus the (coded, window) token counts of each position
  /// set (16 bytes per set). Container framing (prefix, chunk directory, checksums, length fields)
  /// is not part of it; container_test checks the sum against a serialized header.
  static constexpr size_t kLayoutRecordBytes = 128;
  static constexpr size_t kLayerCodecBytes = 2;
  static constexpr size_t kLayerCountBytes = 16;
  static constexpr size_t kSetCountBytes = 16;
  static constexpr size_t kSetTierCountBytes = 8;  ///< a set's tier token count (format 5 and later)
  size_t position_sets() const { return per_head_positions ? static_cast<size_t>(n_kv_heads) : 1u; }
  /// From format version 6 on, the record's variable part ends with the RoPE frequency factors:
  /// a u16 count and that many f32 (rope.freq_factors).
  static constexpr size_t kRopeFactorCountBytes = 2;
  /// The container format version this layout is written in (its newest field or value; format
  /// version 6 adds the centred code tier and the RoPE frequency factors).
  uint16_t format_version() const;
  size_t descriptor_bytes() const {
    // Format versions 5 and later hold a tier token count per set (0 without a code tier).
    const uint16_t version = format_version();
    const size_t per_set = kSetCountBytes + (version >= 5 ? kSetTierCountBytes : 0);
    const size_t rope_factors = version >= 6 ? kRopeFactorCountBytes + sizeof(float) * rope.freq_factors.size() : 0;
    return kLayoutRecordBytes + rope_factors +
           static_cast<size_t>(n_layers) * (kLayerCodecBytes + kLayerCountBytes + per_set * position_sets());
  }
  bool has_code_tier() const { return tier_key_codec != quant::Codec::kFp16 || tier_value_codec != quant::Codec::kFp16; }
  /// Whether layer `l` codes its promoted tokens in the tier: the layout has one, the layer's own
  /// codecs are block codes (a protected fp16 layer keeps every token exact), and the tier raises
  /// the key or the value rate (a layer already at the tier's rates codes better without it:
  /// centred, with channel scales). Elsewhere the promoted tokens stay in the layer's codes.
  bool layer_has_code_tier(int l) const {
    if (!has_code_tier() || l < 0 || l >= n_layers) return false;
    const quant::Codec k = key_codec[static_cast<size_t>(l)], v = value_codec[static_cast<size_t>(l)];
    if (k == quant::Codec::kFp16 || v == quant::Codec::kFp16) return false;
    return quant::index_bits(tier_key_codec) > quant::index_bits(k) ||
           quant::index_bits(tier_value_codec) > quant::index_bits(v);
  }
  float effective_softmax_scale() const;
};

}  // namespace e8kv
