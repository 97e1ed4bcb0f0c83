// The compressed KV cache of one sequence: what attention reads.
//
// Per layer and KV head: the kept tokens' packed key codes and fp16 gains, packed value codes
// and gains, and an fp16 residual window of recent tokens (post-RoPE keys, as given) that
// append() flushes into codes in whole blocks. Positions are kept per layer (one set shared by
// the KV heads) or per KV head. Keys are coded with RoPE removed by default; attention
// re-applies it at each token's stored position.
//
// bytes() counts everything a decoder needs: codes, gains, means and scales, positions, the
// residual window and a descriptor (shape, codec ids, seeds, RoPE parameters, per-layer token
// counts), the descriptor at the size the container writes it. Derived data (rotation sign
// masks, cos/sin tables) is rebuilt from the descriptor and not counted.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "e8kv/cache/cache_layout.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/quant/codec.hpp"
#include "e8kv/quant/gain_code.hpp"
#include "e8kv/quant/kv_vector_codec.hpp"
#include "e8kv/quant/vector_quantizer.hpp"
#include "e8kv/transform/hadamard.hpp"
#include "e8kv/transform/rope.hpp"

namespace e8kv {

/// Keys or values: the two kinds of vectors a cache codes (each with its own codec, rotation and
/// statistics).
enum class KvKind : uint8_t { kKey = 0, kValue = 1 };

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
  const CacheLayout& layout() const { return layout_; }
  const quant::VectorQuantizer& key_quantizer(int layer) const { return key_q_[static_cast<size_t>(layer)]; }
  const quant::VectorQuantizer& value_quantizer(int layer) const { return value_q_[static_cast<size_t>(layer)]; }
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
  CacheLayout layout_;
  std::vector<quant::VectorQuantizer> key_q_, value_q_;
  std::vector<transform::RandomizedHadamard> rotations_;  // [layer][head][kind]
  std::unique_ptr<transform::Rope> rope_;
  int n_pairs_ = 0;
  std::vector<float> rope_tables_;  // [3 levels][entries][pairs][cos, sin]
  std::vector<float> rope_low_planar_;
};

/// A dense view of one layer: positions [first_position, first_position + tokens), with
/// evicted (or never seen) positions masked by -inf, never represented by zeros alone.
/// A layer decoded to dense rows: one row per position that some head of the layer stores, so
/// its size follows the stored tokens, never the span of their positions (a gap in the positions,
/// an eviction shared by every head, an append far ahead: no rows). Heads that do not store a
/// row's position have mask −inf there and zero keys/values.
struct DenseLayer {
  int32_t first_position = 0;       ///< positions.front() (0 when empty)
  int64_t tokens = 0;               ///< rows: positions.size()
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  std::vector<int32_t> positions;   ///< [tokens] ascending: the position of each row
  std::vector<float> keys;          ///< [tokens, kv_heads, head_dim] post-RoPE
  std::vector<float> values;        ///< [tokens, kv_heads, head_dim]
  std::vector<float> mask;          ///< [kv_heads, tokens]: 0 = stored, −inf = not stored by this head
};

/// The kept tokens of one (layer, head), decoded: positions ascending.
struct CompactHead {
  std::vector<int32_t> positions;
  std::vector<float> keys;    ///< [n, head_dim] post-RoPE
  std::vector<float> values;  ///< [n, head_dim]
};

namespace detail {
struct CacheStorage;
}

class CompressedKV {
 public:
  struct HeadData {
    std::vector<uint8_t> key_codes, value_codes;       ///< coded tokens × code bytes
    std::vector<uint16_t> key_gains, value_gains;      ///< coded tokens (empty for fp16 codecs)
    std::vector<uint16_t> window_keys, window_values;  ///< window tokens × head_dim, fp16 bits
    std::vector<uint16_t> key_mean, value_mean;        ///< fp16 bits, head_dim each, once computed (centring)
    std::vector<uint16_t> key_channel_scale;           ///< fp16 bits, head_dim (query-weighted keys) or empty
    std::vector<uint8_t> key_gain_codes, value_gain_codes;  ///< coded tokens, when gain_bits == 8
    uint16_t key_gain_ref = 0, value_gain_ref = 0;     ///< fp16 references of the 8-bit gains (0: not set yet)
    /// The gains of the coded tokens as floats, whichever way they are stored.
    struct GainReader {
      const uint16_t* fp16 = nullptr;  ///< fp16 gains (gain_bits 16), or
      const uint8_t* codes = nullptr;  ///< 8-bit codes around `ref` (gain_bits 8); neither: 0
      float ref = 0.f;
      float operator()(size_t t) const {
        return codes ? ref * quant::gain_code_factors()[codes[t]] : (fp16 ? fp16_bits_to_float(fp16[t]) : 0.f);
      }
    };
    GainReader key_gains_reader() const { return reader(key_gains, key_gain_codes, key_gain_ref); }
    GainReader value_gains_reader() const { return reader(value_gains, value_gain_codes, value_gain_ref); }

   private:
    static GainReader reader(const std::vector<uint16_t>& g, const std::vector<uint8_t>& c, uint16_t ref) {
      GainReader r;
      if (!c.empty()) {
        r.codes = c.data();
        r.ref = fp16_bits_to_float(ref);
      } else if (!g.empty()) {
        r.fp16 = g.data();
      }
      return r;
    }
  };
  struct LayerData {
    std::vector<std::vector<int32_t>> positions;         ///< coded tokens: 1 shared set or one per head
    std::vector<std::vector<int32_t>> window_positions;  ///< residual window, same sets
    std::vector<HeadData> heads;
    int64_t original_tokens = 0;  ///< tokens ever given to this layer (before eviction)
    int64_t pinned = 0;           ///< leading window tokens kept in fp16 for good (attention sinks)
    /// Query energy per head and channel (pair-averaged), from the first chunk's observation
    /// queries, kept until every head's key channel scales are estimated (its first flush), then
    /// freed. While held it is part of the cache: serialized (format v2+, so a read-back cache
    /// goes on like the original) and counted by bytes() (4·head_dim bytes per head).
    std::vector<std::vector<float>> query_energy;
  };
  struct ByteBreakdown {
    size_t codes = 0, gains = 0, positions = 0, window = 0, means = 0, descriptor = 0;
    size_t pending_energy = 0;  ///< query energies waiting for the first flush (LayerData::query_energy)
    size_t total() const { return codes + gains + positions + window + means + descriptor + pending_energy; }
  };

  CompressedKV() = default;
  explicit CompressedKV(std::shared_ptr<const CacheCodecs> codecs);

  bool valid() const { return codecs_ != nullptr; }
  const CacheLayout& layout() const;
  const CacheCodecs& codecs() const { return *codecs_; }
  std::shared_ptr<const CacheCodecs> shared_codecs() const { return codecs_; }
  int n_layers() const { return static_cast<int>(layers_.size()); }
  const LayerData& layer(int l) const;

  /// Positions set used by head h (shared set 0 unless per-head positions).
  const std::vector<int32_t>& positions(int layer, int head) const;
  const std::vector<int32_t>& window_positions(int layer, int head) const;
  int64_t coded_tokens(int layer, int head = 0) const { return static_cast<int64_t>(positions(layer, head).size()); }
  int64_t window_tokens(int layer, int head = 0) const { return static_cast<int64_t>(window_positions(layer, head).size()); }
  int64_t stored_tokens(int layer, int head = 0) const { return coded_tokens(layer, head) + window_tokens(layer, head); }
  /// Tokens ever given (prefill + appended), taken as the largest over layers.
  int64_t original_tokens() const;

  ByteBreakdown byte_breakdown() const;
  size_t bytes() const { return byte_breakdown().total(); }
  /// Heap bytes the cache holds: the capacity of every buffer it owns (what bytes() counts, as
  /// stored in memory, plus spare capacity and the bookkeeping vectors). Writes keep it within a
  /// few percent of bytes(): compress and extend size buffers exactly, append grows them by a
  /// sixteenth.
  size_t resident_bytes() const;
  /// bytes() per original token.
  double bytes_per_token() const;
  /// fp16 bytes of K and V for every original token, divided by bytes().
  double compression_ratio() const;
  /// Honest bits per stored K/V element: 8·bytes() / (original tokens · layers · heads · d · 2).
  double bits_per_element() const;

  /// The positions some head of `layer` stores (coded or in the window), ascending, each once: the
  /// rows of decompress_layer.
  std::vector<int32_t> stored_positions(int layer) const;
  CompactHead decompress_head(int layer, int head) const;
  DenseLayer decompress_layer(int layer) const;

 private:
  friend struct detail::CacheStorage;
  LayerData& mutable_layer(int l);

  std::shared_ptr<const CacheCodecs> codecs_;
  std::vector<LayerData> layers_;
};

namespace detail {
/// Write access to a cache's storage, for its writers only: the compressor (src/layer_write.cpp)
/// and the container reader. Everyone else sees the cache read-only.
struct CacheStorage {
  static CompressedKV::LayerData& layer(CompressedKV& cache, int l) { return cache.mutable_layer(l); }
};
}  // namespace detail

}  // namespace e8kv
