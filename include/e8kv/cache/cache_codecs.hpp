// CacheCodecs: the codec of a cache, derived from its CacheLayout (quantizers, rotations, RoPE
// tables). compressed_kv.hpp stores what it produces; this header carries the codebooks, so code
// that only holds or moves caches need not include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "e8kv/cache/cache_layout.hpp"
#include "e8kv/quant/codec.hpp"
#include "e8kv/quant/kv_vector_codec.hpp"
#include "e8kv/quant/vector_quantizer.hpp"
#include "e8kv/transform/hadamard.hpp"
#include "e8kv/transform/rope.hpp"

namespace e8kv {

/// The codec of a cache, derived from its layout: quantizers, per (layer, head, kind) rotations,
/// the RoPE table. It encodes and decodes vectors in batches (faiss sa_encode / sa_decode); the
/// cache stores what it produces and nothing else codes. Shared by a compressor and the caches it
/// made; immutable, all methods const and thread-safe.
class CacheCodecs {
 public:
  /// What the codes of one (layer, head, kind) are relative to, as floats: the mean (null: not
  /// centred) and, for keys, the channel scales S (null: none).
  struct HeadState {
    const float* mean = nullptr;
    const float* channel_scale = nullptr;
  };

  explicit CacheCodecs(CacheLayout layout);
  /// The same, taking the RoPE tables from `rope_source` when its rotary inverse frequencies are
  /// the layout's (a rate budget's per-layer codes for a compressor's cache: only the codecs
  /// differ), instead of computing them again.
  CacheCodecs(CacheLayout layout, const CacheCodecs& rope_source);
  const CacheLayout& layout() const { return layout_; }
  const quant::VectorQuantizer& key_quantizer(int layer) const { return key_q_[static_cast<size_t>(layer)]; }
  const quant::VectorQuantizer& value_quantizer(int layer) const { return value_q_[static_cast<size_t>(layer)]; }
  /// The code tier's quantizer of a kind (an fp16 one when the layout has no code tier).
  const quant::VectorQuantizer& tier_quantizer(KvKind kind) const { return tier_q_[static_cast<size_t>(kind)]; }
  size_t tier_code_bytes(KvKind kind) const { return tier_quantizer(kind).code_bytes(); }
  /// Randomized Hadamard of (layer, head) for keys (kind 0) or values (kind 1).
  const transform::RandomizedHadamard& rotation(int layer, int head, int kind) const;
  const transform::RandomizedHadamard& rotation(int layer, int head, KvKind kind) const {
    return rotation(layer, head, static_cast<int>(kind));
  }
  /// Bytes of codes per vector of a layer and kind (2·head_dim for the fp16 codec).
  size_t code_bytes(int layer, KvKind kind) const;

  /// Encodes n vectors of (layer, head, kind) given as fp16 rows (the cache's working precision;
  /// keys post-RoPE at `positions`, values positions ignored): the key frame's transform,
  /// centring and channel scales (quant::prepare_key / prepare_value), the rotation and the
  /// block codes, the same per-vector functions the GPU encoder runs. codes: n·code_bytes;
  /// gains: n floats, before any gain coding (untouched for the fp16 codec, whose codes are the
  /// rows themselves). Throws e8kv::Error for a negative position in a RoPE key frame.
  void encode(int layer, int head, KvKind kind, size_t n, const uint16_t* rows, const int32_t* positions,
              const HeadState& state, uint8_t* codes, float* gains) const;
  /// The inverse: n vectors decoded into the engine's basis (keys post-RoPE at `positions`),
  /// n·head_dim floats: what decompress returns and what attention is equivalent to.
  void decode(int layer, int head, KvKind kind, size_t n, const uint8_t* codes, const float* gains,
              const int32_t* positions, const HeadState& state, float* out) const;
  const transform::Rope& rope() const { return *rope_; }
  /// Encodes n code-tier vectors of (layer, head, kind) given as fp16 rows (keys post-RoPE at
  /// `positions`): centred on `mean` when the layout's tier is (CacheLayout::tier_centered; keys
  /// less R_t·μ, or μ post-RoPE, values less μ; `mean` must then be given), rotated by the same
  /// randomized Hadamard as the layer's codes and coded (no RoPE step, no channel scales:
  /// CacheLayout::tier_key_codec) with fp16 gains. codes: n·tier_code_bytes(kind). Throws
  /// e8kv::Error without a code tier in `layer`, or without a mean for a centred tier.
  void encode_tier(int layer, int head, KvKind kind, size_t n, const uint16_t* rows, const int32_t* positions,
                   const float* mean, uint8_t* codes, uint16_t* gains) const;
  /// The inverse: n vectors in the engine's basis (keys post-RoPE), n·head_dim floats.
  void decode_tier(int layer, int head, KvKind kind, size_t n, const uint8_t* codes, const uint16_t* gains,
                   const int32_t* positions, const float* mean, float* out) const;

  /// Encodes one post-RoPE key into codes + gain. Block codecs go through
  /// quant::encode_key_vector (the same function the GPU encode kernel runs, so codes are
  /// byte-identical); RoPE is removed with the table of rope_table() when keys are pre-RoPE.
  /// Throws e8kv::Error on non-finite input or (pre-RoPE keys) a negative position.
  void encode_key(int layer, int head, const float* k, int32_t position, uint8_t* codes, uint16_t* gain) const;
  void encode_value(int layer, int head, const float* v, uint8_t* codes, uint16_t* gain) const;
  /// Decodes a key back to the engine's basis, post-RoPE at `position` (quant::decode_key_vector).
  void decode_key(int layer, int head, const uint8_t* codes, uint16_t gain, int32_t position, float* k) const;
  void decode_value(int layer, int head, const uint8_t* codes, uint16_t gain, float* v) const;
  /// decode_key / decode_value with the gain as a float (8-bit gain codes decode to floats).
  void decode_key_with_gain(int layer, int head, const uint8_t* codes, float gain, int32_t position, float* k) const;
  void decode_value_with_gain(int layer, int head, const uint8_t* codes, float gain, float* v) const;

  /// cos/sin of position·inv_freq[i] for the rotary pairs (count rotary_dim/2), from three
  /// small tables (position split into 10 + 10 + 11 bits) so no table grows with the context.
  /// Throws e8kv::Error for a negative position.
  void rope_cos_sin(int32_t position, float* cos_out, float* sin_out) const;
  /// Applies RoPE at `position` to x (head_dim floats) using rope_cos_sin (attention path).
  void apply_rope_fast(float* x, int32_t position) const;
  /// Removes RoPE at `position` from x (head_dim floats) with the same table (the mean estimate).
  void remove_rope_fast(float* x, int32_t position) const;
  /// Replaces x[a] and x[b] of every RoPE pair (a, b) by their mean (head_dim floats).
  void average_rope_pairs(float* x) const;

  /// The 3-level cos/sin table (quant::build_rope_table of the rotary inverse frequencies; the
  /// unscaled ones for dynamic NTK): upload it as is for the GPU kernels.
  const std::vector<float>& rope_table() const { return rope_tables_; }
  /// attention's planar copy of the table's low level (1024 cos rows, then 1024 sin rows, each padded to a multiple of 8 pairs); empty
  /// when keys are stored post-RoPE.
  const float* key_rope_low_planar() const { return rope_low_planar_.data(); }
  /// The table with its rotary_dim and pair layout; table == nullptr when keys are stored
  /// post-RoPE (no RoPE step in the key codec).
  quant::RopeTableView key_rope_view() const;
  /// Head dim, scale, gain policy and Hadamard signs of (layer, head, kind: 0 key, 1 value).
  quant::VectorCodecArgs codec_args(int layer, int head, int kind) const;

 private:
  CacheCodecs(CacheLayout layout, const CacheCodecs* rope_source);
  void tier_mean(KvKind kind, const float* mean, int32_t position, float* out) const;
  CacheLayout layout_;
  std::vector<quant::VectorQuantizer> key_q_, value_q_;
  std::vector<quant::VectorQuantizer> tier_q_;  // [kind]
  std::vector<transform::RandomizedHadamard> rotations_;  // [layer][head][kind]
  std::unique_ptr<transform::Rope> rope_;
  int n_pairs_ = 0;
  std::vector<float> rope_tables_;  // [3 levels][entries][pairs][cos, sin]
  std::vector<float> rope_low_planar_;
};

}  // namespace e8kv
