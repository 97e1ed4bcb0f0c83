// What the writer and the reader of the container share: the format's constants and bounds
// (docs/format.md), the geometry of a layer's streams, and how stored tokens fall into chunks.
// Internal.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "container/stream_transform.hpp"
#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/container/container.hpp"

namespace e8kv::container {

// ---- constants (docs/format.md §2) ----------------------------------------------------------------

inline constexpr size_t kPrefixBytes = 48;  // magic .. n_chunks, common to both kinds
inline constexpr size_t kPlainFixedBytes = 40;
inline constexpr size_t kDirectoryEntryBytes = 16;
inline constexpr size_t kChunkHeaderBytes = 40;
inline constexpr size_t kStreamDescriptorBytes = 24;
inline constexpr uint8_t kChunkMagic[4] = {'C', 'H', 'N', 'K'};
inline constexpr int kCacheStreams = 7;  // StreamKind 1..7 in order
inline constexpr int kTierStreams = 4;   // version 5: StreamKind 9..12 after them
/// The first format version with the code tier (layout bytes 106-107, a tier token count per
/// position set, the tier streams).
inline constexpr uint16_t kCodeTierSince = 5;
/// The first format version with the centred code tier and the RoPE frequency factors.
inline constexpr uint16_t kRopeFactorsSince = 6;
/// Streams of a compressed-cache chunk in format `version`.
inline int cache_streams(uint16_t version) { return kCacheStreams + (version >= kCodeTierSince ? kTierStreams : 0); }
inline constexpr uint8_t kEntropyStored = 0;
inline constexpr uint8_t kEntropyZstd = 1;
/// Per layer: original_tokens, pinned, first_chunk, n_chunks; then 16 bytes per position set
/// (coded, window), 24 from version 5 on (coded, window, tier).
inline constexpr size_t kLayerEntryFixedBytes = 32;
inline constexpr size_t kLayerEntrySetBytes = 16;
inline constexpr size_t kLayerEntrySetTierBytes = 8;
static_assert(kLayerEntrySetBytes == CacheLayout::kSetCountBytes &&
                  kLayerEntrySetTierBytes == CacheLayout::kSetTierCountBytes,
              "CacheLayout::descriptor_bytes counts the layer table as the container writes it");
inline size_t layer_entry_set_bytes(uint16_t version) {
  return kLayerEntrySetBytes + (version >= kCodeTierSince ? kLayerEntrySetTierBytes : 0);
}

// Bounds on header fields (far above real models; they keep a hostile header from asking for
// absurd work before max_decoded_bytes is even computed).
inline constexpr int64_t kMaxChunkTokens = int64_t{1} << 20;
inline constexpr int64_t kMaxSetTokens = std::numeric_limits<int32_t>::max();  // positions are int32
inline constexpr int64_t kMaxOriginalTokens = int64_t{1} << 62;
inline constexpr int64_t kMaxPlainExtent = int64_t{1} << 40;

// ---- geometry --------------------------------------------------------------------------------------

/// How one codec's vectors sit in the streams.
struct CodecGeometry {
  size_t code_bytes = 0;  // per vector
  int width = 2;          // bytes per stream element
  int64_t cols = 0;       // elements per vector
  bool has_gain = false;
  int gain_width = 0;     // bytes per stored gain: 0 (fp16 codec), 2 (fp16 gains) or 1 (8-bit codes)
};
CodecGeometry geometry(quant::Codec c, int head_dim, int gain_bits);
inline CodecGeometry key_geometry(const CacheLayout& L, int layer) {
  return geometry(L.key_codec[static_cast<size_t>(layer)], L.head_dim, L.gain_bits);
}
inline CodecGeometry value_geometry(const CacheLayout& L, int layer) {
  return geometry(L.value_codec[static_cast<size_t>(layer)], L.head_dim, L.gain_bits);
}
/// The code tier's codec of keys or values: its gains are fp16 whatever gain_bits says.
inline CodecGeometry tier_geometry(const CacheLayout& L, bool keys) {
  return geometry(keys ? L.tier_key_codec : L.tier_value_codec, L.head_dim, 16);
}

inline size_t position_sets(const CacheLayout& L) {
  return L.per_head_positions ? static_cast<size_t>(L.n_kv_heads) : 1;
}
inline int64_t chunks_for(int64_t tokens, int64_t chunk_tokens) { return (tokens + chunk_tokens - 1) / chunk_tokens; }

/// The parts of a set's stored tokens, in stored order.
enum class Part { kCoded, kTier, kWindow };

/// Rows of one chunk for one position set, as stored-token indices (coded first, then the code
/// tier, then window).
struct ChunkRows {
  int64_t lo = 0, hi = 0;                // unified range [lo, hi)
  int64_t coded_lo = 0, coded_hi = 0;    // coded indices
  int64_t tier_lo = 0, tier_hi = 0;      // tier indices (0-based in the tier)
  int64_t window_lo = 0, window_hi = 0;  // window indices (0-based in the window)
  int64_t coded() const { return coded_hi - coded_lo; }
  int64_t tier() const { return tier_hi - tier_lo; }
  int64_t window() const { return window_hi - window_lo; }
  /// The first row of a part (0-based in the part) and the part's rows in the chunk.
  int64_t first(Part p) const { return p == Part::kCoded ? coded_lo : p == Part::kTier ? tier_lo : window_lo; }
  int64_t count(Part p) const { return p == Part::kCoded ? coded() : p == Part::kTier ? tier() : window(); }
};
ChunkRows chunk_rows(int64_t chunk, int64_t chunk_tokens, int64_t coded, int64_t tier, int64_t window);

/// A layer-table entry as the writer and the reader see it.
struct LayerCounts {
  int64_t original_tokens = 0;
  int64_t pinned = 0;                        // leading window tokens of every set kept in fp16
  std::vector<int64_t> coded, tier, window;  // per set (tier: 0 before version 5)
  int64_t first_chunk = 0, n_chunks = 0;
  int64_t stored(size_t set) const { return coded[set] + tier[set] + window[set]; }
  int64_t max_stored() const {
    int64_t m = 0;
    for (size_t s = 0; s < coded.size(); ++s) m = std::max(m, stored(s));
    return m;
  }
};

/// One stream of a chunk: its kind and the shape the layer table implies.
struct StreamPlan {
  StreamKind kind;
  StreamShape shape;
};
/// The streams (cache_streams(version)) of chunk rows `rows` (one entry per position set) of
/// layer l.
std::vector<StreamPlan> cache_chunk_plans(const CacheLayout& L, int l, const std::vector<ChunkRows>& rows,
                                          uint16_t version);
/// Raw (decoded) bytes of chunk `chunk` of layer l: the sum of its streams' sizes.
uint64_t cache_chunk_raw_bytes(const CacheLayout& L, int l, const LayerCounts& c, int64_t chunk, int64_t chunk_tokens);
/// The rows of every set of a chunk.
std::vector<ChunkRows> chunk_rows_of(const LayerCounts& c, int64_t chunk, int64_t chunk_tokens);

/// The first format version whose pinned window tokens (sinks, fp16 tier) may sit anywhere among
/// the coded and window tokens' positions.
inline constexpr uint16_t kInterleavedPinnedSince = 4;

/// Fails unless the positions of one set are >= 0 and ordered as format `version` stores them.
/// Versions 1-3: strictly increasing in token order, the window's first `pinned` tokens
/// (attention sinks), then the coded tokens, then the rest. Version 4: the pinned tokens
/// strictly increasing, the coded tokens then the rest strictly increasing, no position in both.
void check_positions(const std::vector<int32_t>& coded, const std::vector<int32_t>& window, int64_t pinned, int layer,
                     size_t set, uint16_t version);
/// Fails unless the code-tier positions of one set are >= 0, strictly increasing and disjoint
/// from the set's coded and window positions (which check_positions has accepted).
void check_tier_positions(const std::vector<int32_t>& tier, const std::vector<int32_t>& coded,
                          const std::vector<int32_t>& window, int64_t pinned, int layer, size_t set);

}  // namespace e8kv::container
