// The layer table of a compressed-cache container (docs/format.md §2.2): per layer its token
// counts (version 5: with the code tier's), chunk range, centring means and (version 2) key
// channel scales, pending query energies and gain references. Written from a cache, parsed into a
// Header; sizes a read needs. Internal.
#pragma once

#include <cstddef>
#include <cstdint>

#include "container/byte_io.hpp"
#include "container/format.hpp"

namespace e8kv::container {

/// The writer's view of layer l: its counts, after checking that every vector of the layer agrees
/// with them and with the layout (so gathering never overruns, and the reader accepts it) and
/// that the layer holds what attention and decompression use (check_layer_heads). The reader
/// runs it on every layer it read, so that a cache that deserializes is one that attends,
/// decompresses and serializes.
LayerCounts checked_counts(const CompressedKV& cache, int l, int64_t chunk_tokens);
LayerCounts checked_counts(const CacheLayout& L, const CompressedKV::LayerData& ld, int l, int64_t chunk_tokens);
/// The part of checked_counts that looks at each head's vectors, against the counts of its
/// position set in `ld` (a whole layer, or the token range a partial read returns): sizes, gain
/// references, key channel scales, the means a centred code tier needs, and finite fp16 values
/// (windows, means, fp16 gains, fp16-codec codes).
void check_layer_heads(const CacheLayout& L, int l, const CompressedKV::LayerData& ld);
/// The format version the positions of `cache` need: kInterleavedPinnedSince when some set pins
/// a token after a coded or unpinned window token's position (fp16 tier), else 1.
uint16_t positions_version(const CompressedKV& cache);
/// Appends layer l's table entry in format `version`.
void write_layer_entry(io::ByteWriter& w, const LayerCounts& c, const CompressedKV::LayerData& ld, uint16_t version);
/// Bytes write_layer_entry appends.
size_t layer_entry_bytes(const CompressedKV::LayerData& ld, size_t sets, uint16_t version);

/// Decoded bytes of `coded` coded, `tier` code-tier and `window` window tokens of one head of
/// layer l.
uint64_t layer_head_bytes(const CacheLayout& L, int l, int64_t coded, int64_t tier, int64_t window);
/// Decoded bytes of stored tokens [begin, end) of every set of layer l (clamped per set).
uint64_t layer_range_bytes(const CacheLayout& L, int l, const LayerCounts& c, int64_t begin, int64_t end);
/// What rebuilding the codecs of L allocates (an estimate with slack).
uint64_t codecs_bytes(const CacheLayout& L);

}  // namespace e8kv::container
