// The container's header (docs/format.md §2): the 48-byte prefix, the kind-specific tables, the
// chunk directory and the header CRC, written and parsed. Internal.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "container/byte_io.hpp"
#include "container/chunk.hpp"
#include "container/format.hpp"
#include "container/source.hpp"

namespace e8kv::container {

/// Everything a header says, checked.
struct Header {
  ContainerInfo info;
  // kCompressedCache: the layer table.
  std::vector<LayerCounts> layers;
  std::vector<std::vector<std::vector<uint16_t>>> key_mean, value_mean;  // [layer][head]
  std::vector<std::vector<std::vector<uint16_t>>> key_channel_scale;     // [layer][head] (version 2)
  std::vector<std::vector<std::vector<float>>> query_energy;             // [layer][head or none] (version 2)
  std::vector<std::vector<std::array<uint16_t, 2>>> gain_ref;            // [layer][head] key, value (version 2)
  // Both kinds.
  std::vector<DirEntry> dir;
  std::vector<uint64_t> chunk_raw;  // decoded bytes of each chunk, as the tables imply
  uint64_t header_bytes = 0;
  uint64_t max_chunk_raw = 0;  // largest decoded chunk: a read's scratch is a few of them
};

/// Parses and checks the header of the container in `src` (of the kind expected unless
/// any_kind), including the directory, and that every chunk's stored bytes can hold what the
/// tables say it decodes to.
Header parse_header(Source& src, const DeserializeOptions& o, ContainerKind expect, bool any_kind = false);

/// The compressed-cache part of the header (layout record and layer table), after the prefix.
void parse_cache_tables(io::ByteReader& r, Header& h, uint64_t n_chunks);
/// The plain part of the header (dtype and shape), after the prefix.
void parse_plain_shape(io::ByteReader& r, Header& h, uint64_t n_chunks);

/// Memory a read needs besides its result: scratch for decoding a chunk.
inline uint64_t scratch_bytes(const Header& h) { return io::sat_mul(h.max_chunk_raw, 3); }
/// Fails unless `need` bytes fit in DeserializeOptions::max_decoded_bytes.
void check_budget(uint64_t need, const DeserializeOptions& o, const char* what);

/// Writes the prefix; header_bytes and total_bytes are patched by finish_container.
void write_prefix(io::ByteWriter& w, ContainerKind kind, uint64_t chunk_tokens, uint64_t n_chunks, uint16_t version);
/// Finishes a container: directory, header CRC and sizes. `out` holds the header up to the
/// directory at [0, dir_at), then chunk bodies from header_bytes on.
void finish_container(std::vector<uint8_t>& out, size_t dir_at, size_t header_bytes,
                      const std::vector<uint64_t>& chunk_offsets);

/// Copies a finished container into out[0, cap) and returns its size; `what` names the caller
/// in the error for a buffer that is null or too small.
size_t copy_out(const std::vector<uint8_t>& bytes, uint8_t* out, size_t cap, const char* what);

}  // namespace e8kv::container
