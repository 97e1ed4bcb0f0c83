// The compressed KV cache of one sequence: what attention reads.
//
// Per layer and KV head: the kept tokens' packed key codes and fp16 gains, packed value codes
// and gains, the code tier's codes and gains (tokens promoted to a higher rate), and an fp16 window (post-RoPE keys, as given): pinned tokens kept in fp16 for good
// (sinks, the fp16 tier of important tokens) and recent tokens that append() flushes into codes
// in whole blocks. Positions are kept per layer (one set shared by
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
#include "e8kv/quant/gain_code.hpp"

namespace e8kv {

/// The codec of a cache (cache/cache_codecs.hpp): what codes and decodes its vectors.
class CacheCodecs;

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
    /// The code tier (CacheLayout::tier_key_codec): its tokens' codes (tier tokens × the tier
    /// codec's code bytes) and fp16 gains, empty without one.
    std::vector<uint8_t> tier_key_codes, tier_value_codes;
    std::vector<uint16_t> tier_key_gains, tier_value_gains;
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
    /// Code-tier tokens, same sets (as many as `positions`, empty without a tier): ascending, at
    /// any position (each compress / extend chunk's promoted tokens follow the earlier chunks').
    std::vector<std::vector<int32_t>> tier_positions;
    std::vector<HeadData> heads;
    int64_t original_tokens = 0;  ///< tokens ever given to this layer (before eviction)
    /// Leading window tokens kept in fp16 for good: attention sinks and the fp16 tier
    /// (Config::fp16_tier). Ascending among themselves, at any position; the other window tokens
    /// follow every coded token.
    int64_t pinned = 0;
    /// Query energy per head and channel (pair-averaged), from the first chunk's observation
    /// queries, kept until every head's key channel scales are estimated (its first flush), then
    /// freed. While held it is part of the cache: serialized (format v2+, so a read-back cache
    /// goes on like the original) and counted by bytes() (4·head_dim bytes per head).
    std::vector<std::vector<float>> query_energy;

    /// The largest position stored in position set `set` (coded, pinned or window), -1 when empty.
    int64_t last_position(size_t set) const;
  };
  struct ByteBreakdown {
    size_t codes = 0, gains = 0, positions = 0, window = 0, means = 0, descriptor = 0;  ///< codes, gains: both tiers
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
  /// Code-tier positions of head h's set (empty without a code tier).
  const std::vector<int32_t>& tier_positions(int layer, int head) const;
  int64_t tier_tokens(int layer, int head = 0) const { return static_cast<int64_t>(tier_positions(layer, head).size()); }
  int64_t stored_tokens(int layer, int head = 0) const {
    return coded_tokens(layer, head) + tier_tokens(layer, head) + window_tokens(layer, head);
  }
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
  /// The largest position some head of `layer` stores, -1 when it stores none: a new token of the
  /// layer must come after it, a query must not come before it.
  int64_t last_position(int layer) const;
  CompactHead decompress_head(int layer, int head) const;
  DenseLayer decompress_layer(int layer) const;

 private:
  friend struct detail::CacheStorage;
  LayerData& mutable_layer(int l);

  std::shared_ptr<const CacheCodecs> codecs_;
  std::vector<LayerData> layers_;
};

/// Keeps the stored tokens whose positions lie in [begin, end) and removes every other one, from
/// every layer (coded tokens, the fp16 window, pinned sinks and tier tokens alike): the one cut
/// behind KVCompressor::drop_before (a sliding window, [position, ∞)) and the cut of a sequence to
/// its first tokens ([0, n): an engine removing a sequence's tail, a fleet restoring a shorter
/// prefix). The kept tokens keep their codes, and the means, key channel scales and gain
/// references they were coded with; nothing is decoded or re-encoded. A cut of the tail lowers
/// original_tokens by the positions from `end` to the last stored one (exact for a sequence given
/// one position after another). Throws when per-KV-head position sets would keep different numbers
/// of pinned tokens; a call that throws leaves the cache as it was.
void keep_positions(CompressedKV& cache, int64_t begin, int64_t end);

namespace detail {
/// Write access to a cache's storage, for its writers only: the compressor (src/cache/layer_write.cpp)
/// and the container reader. Everyone else sees the cache read-only.
struct CacheStorage {
  static CompressedKV::LayerData& layer(CompressedKV& cache, int l) { return cache.mutable_layer(l); }
};
}  // namespace detail

}  // namespace e8kv
