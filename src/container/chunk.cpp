// Chunk encoding and decoding (src/container/chunk.hpp), the writer's options, stream names.
#include "container/chunk.hpp"

#include <fmt/format.h>

#include <cstring>

#include "e8kv/container/checksum.hpp"

namespace e8kv::container {

// ---- writing ---------------------------------------------------------------------------------------

// Level 0 is zstd's default level (3) for zstd as for ContainerOptions.
ChunkEncoder::ChunkEncoder(const ContainerOptions& o) : o_(o), level_(o.zstd_level) {}

// A zstd frame of z bytes for n raw bytes is kept when it saves at least min_zstd_saving.
bool ChunkEncoder::keep_zstd(size_t z, size_t n) const {
  return z < n && static_cast<double>(n - z) >= o_.min_zstd_saving * static_cast<double>(n);
}

void ChunkEncoder::encode_stream(StreamKind kind, Transform chosen, const StreamShape& shape, const uint8_t* raw,
                                 std::vector<uint8_t>& out, size_t desc) {
  const size_t n = shape.bytes();
  Transform best_t = chosen;
  uint8_t entropy = kEntropyStored;
  const size_t data_at = out.size();
  if (n > 0 && !o_.adaptive) {
    const uint8_t* src = raw;
    if (chosen != Transform::kNone) {
      trans_.resize(n);
      transform_forward(chosen, shape, raw, trans_.data());
      src = trans_.data();
    }
    const size_t bound = zstd::Contexts::bound(n);
    out.resize(data_at + bound);
    const size_t z = zstd_.compress(level_, src, n, out.data() + data_at, bound);
    if (keep_zstd(z, n)) {
      entropy = kEntropyZstd;
      out.resize(data_at + z);
    } else {
      std::memcpy(out.data() + data_at, src, n);
      out.resize(data_at + n);
    }
  } else if (n > 0) {
    size_t best = SIZE_MAX;
    trans_.resize(n);
    for (int t = 0; t < kTransformCount; ++t) {
      const auto tr = static_cast<Transform>(t);
      transform_forward(tr, shape, raw, trans_.data());
      const size_t bound = zstd::Contexts::bound(n);
      cand_.resize(bound);
      const size_t z = zstd_.compress(level_, trans_.data(), n, cand_.data(), bound);
      const size_t stored = keep_zstd(z, n) ? z : n;
      if (stored < best) {  // ties keep the lower id
        best = stored;
        best_t = tr;
        entropy = keep_zstd(z, n) ? kEntropyZstd : kEntropyStored;
        if (entropy == kEntropyZstd) best_.assign(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(z));
        else best_.assign(trans_.begin(), trans_.end());
      }
    }
    out.insert(out.end(), best_.begin(), best_.end());
  }
  uint8_t* d = out.data() + desc;
  d[0] = static_cast<uint8_t>(kind);
  d[1] = static_cast<uint8_t>(n > 0 ? best_t : Transform::kNone);
  d[2] = entropy;
  std::memset(d + 3, 0, 5);
  io::store_at<uint64_t>(d + 8, n);
  io::store_at<uint64_t>(d + 16, out.size() - data_at);
}

void finish_chunk(std::vector<uint8_t>& out, size_t start) {
  uint8_t* h = out.data() + start;
  const uint64_t payload = out.size() - start - kChunkHeaderBytes;
  io::store_at<uint64_t>(h + 24, payload);
  io::store_at<uint32_t>(h + 32, 0);
  io::store_at<uint32_t>(h + 36, crc32c(h + kChunkHeaderBytes, payload, crc32c(h, 36)));
}

// ---- reading ---------------------------------------------------------------------------------------

std::vector<ChunkDecoder::Descriptor> ChunkDecoder::parse_head(const ChunkExpectation& e, const uint8_t* p,
                                                                const std::string& where) const {
  const DirEntry& entry = dir_[static_cast<size_t>(e.index)];
  io::check(std::memcmp(p, kChunkMagic, 4) == 0, "{}: bad chunk magic", where);
  io::ByteReader hr(p + 4, kChunkHeaderBytes - 4, where, io::kPrefix);
  const uint32_t n_streams = hr.u32("n_streams");
  const uint32_t dir_index = hr.u32("directory index");
  const uint32_t layer = hr.u32("layer");
  const uint64_t first = hr.u64("first token");
  const uint64_t payload = hr.u64("payload bytes");
  const uint32_t reserved = hr.u32("reserved");
  io::check(payload == entry.bytes - kChunkHeaderBytes, "{}: payload of {} bytes disagrees with the directory's {}-byte chunk",
            where, payload, entry.bytes);
  io::check(n_streams == e.plans.size(), "{}: {} streams, expected {}", where, n_streams, e.plans.size());
  io::check(dir_index == e.index && layer == e.layer && first == e.first_token && reserved == 0,
            "{}: header (index {}, layer {}, first token {}, reserved {}) should be ({}, {}, {}, 0)", where, dir_index,
            layer, first, reserved, e.index, e.layer, e.first_token);
  io::ByteReader r(p + kChunkHeaderBytes, static_cast<size_t>(payload), where, io::kPrefix);
  r.need(kStreamDescriptorBytes * e.plans.size(), "stream descriptors");
  std::vector<Descriptor> descs;
  uint64_t total = 0;
  for (size_t i = 0; i < e.plans.size(); ++i) {
    Descriptor d{};
    d.kind = r.u8("stream kind");
    d.transform = r.u8("transform");
    d.entropy = r.u8("entropy");
    for (int k = 0; k < 5; ++k) io::check(r.u8("reserved") == 0, "{}: stream descriptor reserved bytes must be 0", where);
    d.raw = r.u64("raw bytes");
    d.stored = r.u64("stored bytes");
    const StreamPlan& plan = e.plans[i];
    io::check(d.kind == static_cast<uint8_t>(plan.kind), "{} stream {}: kind {}, expected {} ({})", where, i, d.kind,
              static_cast<int>(plan.kind), to_string(plan.kind));
    io::check(d.transform < kTransformCount, "{} stream {}: transform id {} is unknown (accepted 0..5)", where, i,
              d.transform);
    io::check(d.entropy == kEntropyStored || d.entropy == kEntropyZstd,
              "{} stream {}: entropy coder id {} is unknown (accepted 0 stored, 1 zstd)", where, i, d.entropy);
    const uint64_t implied = plan.shape.bytes();
    io::check(d.raw == implied, "{} stream {}: {} raw bytes, the layer table implies {}", where, i, d.raw, implied);
    const bool possible = d.entropy == kEntropyZstd
                              ? d.stored > 0 && d.stored <= zstd::Contexts::bound(d.raw) && zstd::can_expand_to(d.stored, d.raw)
                              : d.stored == d.raw;
    io::check(possible, "{} stream {}: stored size {} is impossible for {} raw bytes", where, i, d.stored, d.raw);
    total = io::sat_add(total, d.stored);
    descs.push_back(d);
  }
  io::check(total == r.remaining(), "{}: streams hold {} bytes, the chunk {}", where, total, r.remaining());
  return descs;
}

void ChunkDecoder::check_descriptors(const ChunkExpectation& e) {
  const DirEntry& entry = dir_[static_cast<size_t>(e.index)];
  const size_t head = kChunkHeaderBytes + kStreamDescriptorBytes * e.plans.size();
  const std::string where = fmt::format("chunk {}", e.index);
  // The directory guarantees >= 40 bytes. parse_head reads the descriptors through a reader
  // bounded by the payload size, which it has checked against the directory: a chunk too short
  // for its descriptors fails there, before reading past what was read here.
  const uint8_t* p = src_.read(entry.offset, static_cast<size_t>(std::min<uint64_t>(entry.bytes, head)));
  (void)parse_head(e, p, where);
}

void ChunkDecoder::decode(const ChunkExpectation& e) {
  const DirEntry& entry = dir_[static_cast<size_t>(e.index)];
  const std::string where = fmt::format("chunk {}", e.index);
  const uint8_t* p = src_.read(entry.offset, static_cast<size_t>(entry.bytes));
  const uint64_t payload = entry.bytes - kChunkHeaderBytes;
  if (o_.verify_checksums)
    io::check(crc32c(p + kChunkHeaderBytes, static_cast<size_t>(payload), crc32c(p, 36)) == io::load_at<uint32_t>(p + 36),
              "{}: checksum mismatch (the chunk is corrupted)", where);
  const std::vector<Descriptor> descs = parse_head(e, p, where);
  // Decode into one scratch buffer (views stay valid until the next decode).
  uint64_t raw_total = 0;
  for (const auto& d : descs) raw_total += d.raw;
  out_.resize(static_cast<size_t>(raw_total));
  view_at_.assign(descs.size(), 0);
  const uint8_t* sp = p + kChunkHeaderBytes + kStreamDescriptorBytes * descs.size();
  size_t out_at = 0;
  for (size_t i = 0; i < descs.size(); ++i) {
    const Descriptor& d = descs[i];
    const size_t raw = static_cast<size_t>(d.raw), stored = static_cast<size_t>(d.stored);
    const uint8_t* transformed = sp;
    uint8_t* dst = out_.data() + out_at;
    const bool plain = d.transform == static_cast<uint8_t>(Transform::kNone);
    if (d.entropy == kEntropyZstd) {
      if (!plain) zbuf_.resize(raw);
      uint8_t* target = plain ? dst : zbuf_.data();
      zstd_.decompress(sp, stored, target, raw, fmt::format("{} stream {}", where, i));
      transformed = target;
    }
    if (raw > 0 && transformed != dst)
      transform_inverse(static_cast<Transform>(d.transform), e.plans[i].shape, transformed, dst);
    view_at_[i] = out_at;
    out_at += raw;
    sp += stored;
  }
}

// ---- names and options ----------------------------------------------------------------------------

const char* to_string(StreamKind s) {
  switch (s) {
    case StreamKind::kPositions: return "positions";
    case StreamKind::kKeyCodes: return "key codes";
    case StreamKind::kValueCodes: return "value codes";
    case StreamKind::kKeyGains: return "key gains";
    case StreamKind::kValueGains: return "value gains";
    case StreamKind::kWindowKeys: return "window keys";
    case StreamKind::kWindowValues: return "window values";
    case StreamKind::kPlainValues: return "plain values";
    case StreamKind::kTierKeyCodes: return "tier key codes";
    case StreamKind::kTierValueCodes: return "tier value codes";
    case StreamKind::kTierKeyGains: return "tier key gains";
    case StreamKind::kTierValueGains: return "tier value gains";
  }
  return "?";
}

void ContainerOptions::validate() const {
  if (chunk_tokens < 1 || chunk_tokens > kMaxChunkTokens)
    throw Error(fmt::format("ContainerOptions.chunk_tokens is {}; accepted: 1 .. {}", chunk_tokens, kMaxChunkTokens));
  if (zstd_level < -7 || zstd_level > 22)
    throw Error(fmt::format("ContainerOptions.zstd_level is {}; accepted: -7 .. 22 (0 = zstd's default 3)", zstd_level));
  if (!(min_zstd_saving >= 0.0 && min_zstd_saving <= 1.0))
    throw Error(fmt::format("ContainerOptions.min_zstd_saving is {}; accepted: [0, 1]", min_zstd_saving));
  const std::pair<const char*, Transform> fields[] = {{"positions", transforms.positions},
                                                      {"key_codes", transforms.key_codes.value_or(Transform::kNone)},
                                                      {"value_codes", transforms.value_codes},
                                                      {"gains", transforms.gains},
                                                      {"fp16", transforms.fp16}};
  for (const auto& [name, t] : fields)
    if (static_cast<int>(t) >= kTransformCount)
      throw Error(fmt::format("ContainerOptions.transforms.{}: id {} is unknown (accepted 0..5)", name, static_cast<int>(t)));
}

}  // namespace e8kv::container
