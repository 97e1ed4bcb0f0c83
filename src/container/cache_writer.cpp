// Writing a compressed cache (docs/format.md §2.2, §2.4): prefix, layout record, layer table,
// directory, then per layer its chunks of seven streams (eleven from version 5 on: the code tier).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <ostream>

#include "container/chunk.hpp"
#include "container/header.hpp"
#include "container/layer_table.hpp"
#include "container/layout_record.hpp"
#include "e8kv/container/container.hpp"

namespace e8kv::container {

namespace {

using HeadData = CompressedKV::HeadData;

// Gathers the streams of one chunk of layer l and encodes them.
class ChunkStreams {
 public:
  ChunkStreams(const CompressedKV& cache, int l, const ContainerOptions& o, ChunkEncoder& enc, uint16_t version)
      : L_(cache.layout()),
        ld_(cache.layer(l)),
        o_(o),
        enc_(enc),
        version_(version),
        kg_(key_geometry(L_, l)),
        vg_(value_geometry(L_, l)),
        tk_(tier_geometry(L_, true)),
        tv_(tier_geometry(L_, false)) {
    // Key codes repeat along tokens when keys keep a common component (post-RoPE or uncentred):
    // then an XOR delta pays (docs/format.md §3.1). The code tier codes its keys post-RoPE and
    // uncentred always.
    key_codes_ = o.transforms.key_codes ? *o.transforms.key_codes
                                        : (L_.key_frame == transform::KeyFrame::kPostRope || !L_.center ? Transform::kXorDelta
                                                                                             : Transform::kNone);
    tier_key_codes_ = o.transforms.key_codes.value_or(Transform::kXorDelta);
  }

  // Appends the streams of the chunk with rows `rows` (per set); descriptors start at out[desc].
  void write(const std::vector<ChunkRows>& rows, std::vector<uint8_t>& out, size_t desc) {
    rows_ = &rows;
    out_ = &out;
    desc_ = desc;
    positions();
    const auto& tf = o_.transforms;
    per_head(StreamKind::kKeyCodes, kg_.has_gain ? key_codes_ : tf.fp16, kg_.cols, kg_.width, Part::kCoded,
             [](const HeadData& hd) { return hd.key_codes.data(); });
    per_head(StreamKind::kValueCodes, vg_.has_gain ? tf.value_codes : tf.fp16, vg_.cols, vg_.width, Part::kCoded,
             [](const HeadData& hd) { return hd.value_codes.data(); });
    // 8-bit gain codes are one byte each: byte planes and deltas have nothing to work on.
    per_head(StreamKind::kKeyGains, kg_.gain_width == 1 ? Transform::kNone : tf.gains, kg_.has_gain ? 1 : 0,
             kg_.gain_width == 1 ? 1 : 2, Part::kCoded, [this](const HeadData& hd) {
               return kg_.gain_width == 1 ? hd.key_gain_codes.data() : reinterpret_cast<const uint8_t*>(hd.key_gains.data());
             });
    per_head(StreamKind::kValueGains, vg_.gain_width == 1 ? Transform::kNone : tf.gains, vg_.has_gain ? 1 : 0,
             vg_.gain_width == 1 ? 1 : 2, Part::kCoded, [this](const HeadData& hd) {
               return vg_.gain_width == 1 ? hd.value_gain_codes.data()
                                          : reinterpret_cast<const uint8_t*>(hd.value_gains.data());
             });
    per_head(StreamKind::kWindowKeys, tf.fp16, L_.head_dim, 2, Part::kWindow,
             [](const HeadData& hd) { return reinterpret_cast<const uint8_t*>(hd.window_keys.data()); });
    per_head(StreamKind::kWindowValues, tf.fp16, L_.head_dim, 2, Part::kWindow,
             [](const HeadData& hd) { return reinterpret_cast<const uint8_t*>(hd.window_values.data()); });
    if (version_ < kCodeTierSince) return;
    // The code tier: block codes with fp16 gains, as the main streams' block codes and fp16 gains.
    per_head(StreamKind::kTierKeyCodes, tier_key_codes_, tk_.cols, tk_.width, Part::kTier,
             [](const HeadData& hd) { return hd.tier_key_codes.data(); });
    per_head(StreamKind::kTierValueCodes, tf.value_codes, tv_.cols, tv_.width, Part::kTier,
             [](const HeadData& hd) { return hd.tier_value_codes.data(); });
    per_head(StreamKind::kTierKeyGains, tf.gains, tk_.has_gain ? 1 : 0, 2, Part::kTier,
             [](const HeadData& hd) { return reinterpret_cast<const uint8_t*>(hd.tier_key_gains.data()); });
    per_head(StreamKind::kTierValueGains, tf.gains, tv_.has_gain ? 1 : 0, 2, Part::kTier,
             [](const HeadData& hd) { return reinterpret_cast<const uint8_t*>(hd.tier_value_gains.data()); });
  }

 private:
  void emit(StreamKind kind, Transform t, const StreamShape& shape) {
    enc_.encode_stream(kind, t, shape, raw_.data(), *out_, desc_);
    desc_ += kStreamDescriptorBytes;
  }

  // Per set: its coded rows, then its code-tier rows, then its window rows.
  void positions() {
    StreamShape sh{{}, 1, 4};
    raw_.clear();
    auto add = [&](const std::vector<int32_t>& p, int64_t lo, int64_t n) {
      const auto* b = reinterpret_cast<const uint8_t*>(p.data() + lo);
      if (n > 0) raw_.insert(raw_.end(), b, b + 4 * static_cast<size_t>(n));
    };
    for (size_t s = 0; s < rows_->size(); ++s) {
      const ChunkRows& r = (*rows_)[s];
      sh.segment_rows.push_back(r.hi - r.lo);
      add(ld_.positions[s], r.coded_lo, r.coded());
      if (r.tier() > 0) add(ld_.tier_positions[s], r.tier_lo, r.tier());
      add(ld_.window_positions[s], r.window_lo, r.window());
    }
    emit(StreamKind::kPositions, o_.transforms.positions, sh);
  }

  // Per head: the chunk's rows of one part (coded, tier or window) of its set, `cols` × `width`
  // bytes each.
  template <class Pick>
  void per_head(StreamKind kind, Transform t, int64_t cols, int width, Part part, Pick&& pick) {
    StreamShape sh{{}, cols, width};
    raw_.clear();
    const size_t row_bytes = static_cast<size_t>(cols) * static_cast<size_t>(width);
    for (int h = 0; h < L_.n_kv_heads; ++h) {
      const ChunkRows& r = (*rows_)[rows_->size() == 1 ? 0 : static_cast<size_t>(h)];
      const int64_t lo = r.first(part), n = r.count(part);
      sh.segment_rows.push_back(n);
      const uint8_t* src = pick(ld_.heads[static_cast<size_t>(h)]);
      if (n > 0 && row_bytes > 0)
        raw_.insert(raw_.end(), src + static_cast<size_t>(lo) * row_bytes, src + static_cast<size_t>(lo + n) * row_bytes);
    }
    emit(kind, t, sh);
  }

  const CacheLayout& L_;
  const CompressedKV::LayerData& ld_;
  const ContainerOptions& o_;
  ChunkEncoder& enc_;
  const uint16_t version_;
  const CodecGeometry kg_, vg_, tk_, tv_;
  Transform key_codes_, tier_key_codes_;
  const std::vector<ChunkRows>* rows_ = nullptr;
  std::vector<uint8_t>* out_ = nullptr;
  size_t desc_ = 0;
  std::vector<uint8_t> raw_;
};

std::vector<uint8_t> encode_cache(const CompressedKV& cache, const ContainerOptions& o) {
  o.validate();
  require(cache.valid(), "serialize: the cache is empty (default-constructed)");
  const CacheLayout& L = cache.layout();
  validate_layout(L);
  const int64_t T = o.chunk_tokens;
  std::vector<LayerCounts> counts;
  int64_t n_chunks = 0;
  for (int l = 0; l < L.n_layers; ++l) {
    counts.push_back(checked_counts(cache, l, T));
    counts.back().first_chunk = n_chunks;
    n_chunks += counts.back().n_chunks;
  }
  io::check(n_chunks <= std::numeric_limits<uint32_t>::max(), "{} chunks are too many; raise chunk_tokens", n_chunks);
  std::vector<uint8_t> out;
  io::ByteWriter w(out);
  const uint16_t version = std::max(format_version_for(L), positions_version(cache));
  write_prefix(w, ContainerKind::kCompressedCache, static_cast<uint64_t>(T), static_cast<uint64_t>(n_chunks), version);
  write_layout_record(w, L, version);
  for (int l = 0; l < L.n_layers; ++l) write_layer_entry(w, counts[static_cast<size_t>(l)], cache.layer(l), version);
  const size_t dir_at = out.size();
  const size_t header_bytes = dir_at + kDirectoryEntryBytes * static_cast<size_t>(n_chunks) + 4;
  out.resize(header_bytes);

  ChunkEncoder enc(o);
  std::vector<uint64_t> offsets;
  for (int l = 0; l < L.n_layers; ++l) {
    const LayerCounts& c = counts[static_cast<size_t>(l)];
    ChunkStreams streams(cache, l, o, enc, version);
    for (int64_t ci = 0; ci < c.n_chunks; ++ci) {
      const std::vector<ChunkRows> rows = chunk_rows_of(c, ci, T);
      offsets.push_back(out.size());
      write_chunk(out, static_cast<uint32_t>(c.first_chunk + ci), static_cast<uint32_t>(l), static_cast<uint64_t>(ci * T),
                  cache_streams(version), [&](size_t desc) { streams.write(rows, out, desc); });
    }
  }
  finish_container(out, dir_at, header_bytes, offsets);
  return out;
}

}  // namespace

size_t serialized_size(const CompressedKV& cache, const ContainerOptions& options) {
  return encode_cache(cache, options).size();
}

size_t serialized_size_bound(const CompressedKV& cache, const ContainerOptions& options) {
  options.validate();
  require(cache.valid(), "serialized_size_bound: the cache is empty (default-constructed)");
  const CacheLayout& L = cache.layout();
  validate_layout(L);
  const int64_t T = options.chunk_tokens;
  const uint16_t version = std::max(format_version_for(L), positions_version(cache));
  uint64_t header = kPrefixBytes + CacheLayout::kLayoutRecordBytes + 2 * static_cast<uint64_t>(L.n_layers) + 4;
  if (version >= kRopeFactorsSince)
    header += CacheLayout::kRopeFactorCountBytes + sizeof(float) * static_cast<uint64_t>(L.rope.freq_factors.size());
  uint64_t body = 0;
  for (int l = 0; l < L.n_layers; ++l) {
    const LayerCounts c = checked_counts(cache, l, T);
    header += layer_entry_bytes(cache.layer(l), c.coded.size(), version) + kDirectoryEntryBytes * static_cast<uint64_t>(c.n_chunks);
    for (int64_t ci = 0; ci < c.n_chunks; ++ci) {
      body += kChunkHeaderBytes + kStreamDescriptorBytes * static_cast<uint64_t>(cache_streams(version));
      for (const auto& p : cache_chunk_plans(L, l, chunk_rows_of(c, ci, T), version))
        body += p.shape.bytes();  // a stream is stored as it is unless its zstd frame is smaller
    }
  }
  return static_cast<size_t>(header + body);
}

std::vector<uint8_t> serialize(const CompressedKV& cache, const ContainerOptions& options) {
  return encode_cache(cache, options);
}

size_t serialize(const CompressedKV& cache, const ContainerOptions& options, uint8_t* out, size_t cap) {
  return copy_out(encode_cache(cache, options), out, cap, "serialize");
}

size_t serialize(const CompressedKV& cache, const ContainerOptions& options, std::ostream& out) {
  const std::vector<uint8_t> bytes = encode_cache(cache, options);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw Error(fmt::format("serialize: writing {} bytes to the stream failed", bytes.size()));
  return bytes.size();
}

void write_file(const std::string& path, const CompressedKV& cache, const ContainerOptions& options) {
  const std::vector<uint8_t> bytes = encode_cache(cache, options);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(fmt::format("write_file: cannot open '{}' for writing", path));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (f.fail()) throw Error(fmt::format("write_file: writing {} bytes to '{}' failed", bytes.size(), path));
}

}  // namespace e8kv::container
