// Header parsing and writing shared by both kinds (src/container/header.hpp).
#include "container/header.hpp"

#include <fmt/format.h>

#include <cstring>

#include "e8kv/container/checksum.hpp"
#include "e8kv/version.hpp"

namespace e8kv::container {

Header parse_header(Source& src, const DeserializeOptions& o, ContainerKind expect, bool any_kind) {
  const uint64_t size = src.size();
  io::check(size >= kPrefixBytes, "input of {} bytes is too short for a container (at least {} bytes)", size,
            kPrefixBytes);
  Header h;
  {
    const uint8_t* p = src.read(0, kPrefixBytes);
    io::check(std::memcmp(p, kMagic.data(), kMagic.size()) == 0, "bad magic: the input is not an e8kv container");
    io::ByteReader r(p + 8, kPrefixBytes - 8, "header", io::kPrefix);
    const uint16_t version = r.u16("format_version");
    io::check(version >= 1 && version <= kFormatVersion,
              "format version {} is not supported (this library reads versions 1..{})", version, kFormatVersion);
    const uint16_t kind = r.u16("kind");
    io::check(kind == 1 || kind == 2, "container kind {} is unknown (accepted 1 compressed cache, 2 plain)", kind);
    h.info.format_version = version;
    h.info.kind = static_cast<ContainerKind>(kind);
    io::check(any_kind || h.info.kind == expect, "the container holds {}; use {}",
              kind == 1 ? "a compressed cache" : "a plain fp16/bf16 cache", kind == 1 ? "deserialize" : "deserialize_plain");
    io::check(r.u32("flags") == 0, "header flags must be 0 in format versions 1..{}", kFormatVersion);
    h.header_bytes = r.u64("header_bytes");
    h.info.total_bytes = r.u64("total_bytes");
    io::check(h.header_bytes >= kPrefixBytes + 4 && h.header_bytes <= size,
              "header_bytes {} is outside [{}, input size {}] (truncated or corrupted input)", h.header_bytes,
              kPrefixBytes + 4, size);
  }
  const uint8_t* hp = src.read(0, static_cast<size_t>(h.header_bytes));
  const size_t hb = static_cast<size_t>(h.header_bytes);
  if (o.verify_checksums)
    io::check(crc32c(hp, hb - 4) == io::load_at<uint32_t>(hp + hb - 4), "header checksum mismatch (the header is corrupted)");
  io::check(h.info.total_bytes >= h.header_bytes, "total_bytes {} is below header_bytes {}", h.info.total_bytes,
            h.header_bytes);
  io::check(h.info.total_bytes <= size, "truncated input: the container has {} bytes, the input only {}",
            h.info.total_bytes, size);
  io::check(h.info.total_bytes == size, "the input has {} trailing bytes after the container's {}",
            size - h.info.total_bytes, h.info.total_bytes);
  io::ByteReader r(hp + 32, hb - 4 - 32, "header", io::kPrefix);
  h.info.library_version = static_cast<int>(r.u32("library_version"));
  const uint32_t chunk_tokens = r.u32("chunk_tokens");
  io::check(chunk_tokens >= 1 && chunk_tokens <= kMaxChunkTokens, "chunk_tokens {} is outside [1, {}]", chunk_tokens,
            kMaxChunkTokens);
  h.info.chunk_tokens = static_cast<int>(chunk_tokens);
  const uint64_t n_chunks = r.u64("n_chunks");
  io::check(n_chunks <= (hb - kPrefixBytes) / kDirectoryEntryBytes, "n_chunks {} does not fit in the header's {} bytes",
            n_chunks, hb);
  h.info.n_chunks = static_cast<int64_t>(n_chunks);
  if (h.info.kind == ContainerKind::kCompressedCache) parse_cache_tables(r, h, n_chunks);
  else parse_plain_shape(r, h, n_chunks);

  // Directory: chunks follow each other from header_bytes to total_bytes, and each one's bytes
  // can hold what the tables say it decodes to (zstd::kMaxExpansion). That bounds every size the
  // header claims by the input's size before a read allocates anything for it.
  io::check(r.remaining() == kDirectoryEntryBytes * n_chunks,
            "header_bytes {} does not match its contents ({} bytes where the chunk directory needs {})", hb,
            r.remaining(), kDirectoryEntryBytes * n_chunks);
  const size_t streams = h.info.kind == ContainerKind::kCompressedCache
                             ? static_cast<size_t>(cache_streams(static_cast<uint16_t>(h.info.format_version)))
                             : 1;
  const uint64_t chunk_head = kChunkHeaderBytes + kStreamDescriptorBytes * streams;
  h.dir.resize(static_cast<size_t>(n_chunks));
  uint64_t expect_offset = h.header_bytes;
  for (uint64_t i = 0; i < n_chunks; ++i) {
    DirEntry& e = h.dir[static_cast<size_t>(i)];
    e.offset = r.u64("chunk offset");
    e.bytes = r.u64("chunk bytes");
    io::check(e.offset == expect_offset, "chunk {} offset {} should be {} (chunks follow each other)", i, e.offset,
              expect_offset);
    io::check(e.bytes >= kChunkHeaderBytes && e.bytes <= h.info.total_bytes - e.offset,
              "chunk {} of {} bytes at offset {} does not fit in the {}-byte container", i, e.bytes, e.offset,
              h.info.total_bytes);
    const uint64_t raw = h.chunk_raw[static_cast<size_t>(i)];
    io::check(zstd::can_expand_to(e.bytes > chunk_head ? e.bytes - chunk_head : 0, raw),
              "chunk {} of {} bytes cannot hold the {} decoded bytes the header implies (zstd expands at most {}x)", i,
              e.bytes, raw, zstd::kMaxExpansion);
    expect_offset = e.offset + e.bytes;
  }
  io::check(expect_offset == h.info.total_bytes, "the chunks end at {} but the container has {} bytes", expect_offset,
            h.info.total_bytes);
  return h;
}

void check_budget(uint64_t need, const DeserializeOptions& o, const char* what) {
  io::check(need <= o.max_decoded_bytes, "{} needs {} bytes of memory, above DeserializeOptions.max_decoded_bytes = {}",
            what, need, o.max_decoded_bytes);
}

void write_prefix(io::ByteWriter& w, ContainerKind kind, uint64_t chunk_tokens, uint64_t n_chunks, uint16_t version) {
  w.bytes(kMagic.data(), kMagic.size());
  w.u16(version);
  w.u16(static_cast<uint16_t>(kind));
  w.u32(0);  // flags
  w.u64(0);  // header_bytes, patched
  w.u64(0);  // total_bytes, patched
  w.u32(static_cast<uint32_t>(kVersion));
  w.u32(static_cast<uint32_t>(chunk_tokens));
  w.u64(n_chunks);
}

void finish_container(std::vector<uint8_t>& out, size_t dir_at, size_t header_bytes,
                      const std::vector<uint64_t>& chunk_offsets) {
  const size_t n_chunks = chunk_offsets.size();
  for (size_t i = 0; i < n_chunks; ++i) {
    const uint64_t end = i + 1 < n_chunks ? chunk_offsets[i + 1] : out.size();
    io::store_at<uint64_t>(out.data() + dir_at + kDirectoryEntryBytes * i, chunk_offsets[i]);
    io::store_at<uint64_t>(out.data() + dir_at + kDirectoryEntryBytes * i + 8, end - chunk_offsets[i]);
  }
  io::store_at<uint64_t>(out.data() + 16, header_bytes);
  io::store_at<uint64_t>(out.data() + 24, out.size());
  io::store_at<uint32_t>(out.data() + header_bytes - 4, crc32c(out.data(), header_bytes - 4));
}

size_t copy_out(const std::vector<uint8_t>& bytes, uint8_t* out, size_t cap, const char* what) {
  if (out == nullptr && cap != 0) throw Error(fmt::format("{}: null output buffer with a capacity of {}", what, cap));
  if (bytes.size() > cap)
    throw Error(fmt::format("{}: the output buffer holds {} bytes, the container needs {}", what, cap, bytes.size()));
  if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
  return bytes.size();
}

}  // namespace e8kv::container
