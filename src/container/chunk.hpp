// Chunks (docs/format.md §2.4): a 40-byte header, one descriptor per stream, then the streams,
// each transformed and (when it pays) zstd-compressed. The encoder writes them; the decoder
// checks every field before it trusts it. Shared by the compressed-cache and plain containers.
// Internal.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "container/byte_io.hpp"
#include "container/format.hpp"
#include "container/source.hpp"
#include "container/zstd_frame.hpp"

namespace e8kv::container {

class ChunkEncoder {
 public:
  explicit ChunkEncoder(const ContainerOptions& o);
  /// Appends one stream's data (at the end of out) and fills its descriptor at out[desc]:
  /// `chosen` transform then zstd when the frame saves min_zstd_saving (or, adaptive, the
  /// smallest of every transform).
  void encode_stream(StreamKind kind, Transform chosen, const StreamShape& shape, const uint8_t* raw,
                     std::vector<uint8_t>& out, size_t desc);

 private:
  bool keep_zstd(size_t z, size_t n) const;

  const ContainerOptions& o_;
  int level_;
  zstd::Contexts zstd_;
  std::vector<uint8_t> trans_, cand_, best_;
};

/// Patches the payload size and the CRC of the chunk that starts at out[start].
void finish_chunk(std::vector<uint8_t>& out, size_t start);

/// Writes a chunk header and n_streams descriptors, calls fill(offset of descriptor 0) to append
/// the streams (ChunkEncoder::encode_stream), then patches the payload size and the CRC.
template <class Fill>
void write_chunk(std::vector<uint8_t>& out, uint32_t dir_index, uint32_t layer, uint64_t first_token, int n_streams,
                 Fill&& fill) {
  const size_t start = out.size();
  out.resize(start + kChunkHeaderBytes + static_cast<size_t>(n_streams) * kStreamDescriptorBytes);
  uint8_t* h = out.data() + start;
  std::copy(kChunkMagic, kChunkMagic + 4, h);
  io::store_at<uint32_t>(h + 4, static_cast<uint32_t>(n_streams));
  io::store_at<uint32_t>(h + 8, dir_index);
  io::store_at<uint32_t>(h + 12, layer);
  io::store_at<uint64_t>(h + 16, first_token);
  fill(start + kChunkHeaderBytes);
  finish_chunk(out, start);
}

/// A chunk's place in the directory.
struct DirEntry {
  uint64_t offset = 0, bytes = 0;
};

/// Which chunk a read expects at a directory index: its layer (tensor), first stored token and
/// streams.
struct ChunkExpectation {
  uint64_t index = 0;
  uint32_t layer = 0;
  uint64_t first_token = 0;
  std::vector<StreamPlan> plans;
};

class ChunkDecoder {
 public:
  ChunkDecoder(Source& src, const std::vector<DirEntry>& dir, const DeserializeOptions& o)
      : src_(src), dir_(dir), o_(o) {}

  /// Checks a chunk's header and stream descriptors against what the read expects (sizes the
  /// layer table implies, kinds, ids, reserved bytes) without decoding it or checking its CRC:
  /// reads run it over every chunk they need before they allocate their result.
  void check_descriptors(const ChunkExpectation& e);
  /// Reads the chunk, checks it (CRC included) and decodes its streams; view(i) is stream i's
  /// decoded bytes until the next decode.
  void decode(const ChunkExpectation& e);
  const uint8_t* view(size_t i) const { return out_.data() + view_at_[i]; }

 private:
  struct Descriptor {
    uint8_t kind, transform, entropy;
    uint64_t raw, stored;
  };
  // Parses and checks header and descriptors of the chunk whose first bytes are p.
  std::vector<Descriptor> parse_head(const ChunkExpectation& e, const uint8_t* p, const std::string& where) const;

  Source& src_;
  const std::vector<DirEntry>& dir_;
  const DeserializeOptions& o_;
  zstd::Contexts zstd_;
  std::vector<uint8_t> zbuf_, out_;
  std::vector<size_t> view_at_;
};

}  // namespace e8kv::container
