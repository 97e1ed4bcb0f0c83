// Reading a compressed cache: the whole cache, one layer, or a token range of a layer, from
// memory or a file. Every chunk a read needs has its header and stream descriptors checked
// against the header's tables before the read allocates its result.
#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <memory>

#include "container/chunk.hpp"
#include "container/header.hpp"
#include "container/layer_table.hpp"
#include "container/source.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/container/container.hpp"

namespace e8kv::container {

namespace {

using HeadData = CompressedKV::HeadData;

ChunkExpectation cache_chunk(const Header& h, int l, int64_t ci) {
  const LayerCounts& c = h.layers[static_cast<size_t>(l)];
  const int64_t T = h.info.chunk_tokens;
  return ChunkExpectation{
      static_cast<uint64_t>(c.first_chunk + ci), static_cast<uint32_t>(l), static_cast<uint64_t>(ci * T),
      cache_chunk_plans(h.info.layout, l, chunk_rows_of(c, ci, T), static_cast<uint16_t>(h.info.format_version))};
}

// Chunks of layer l that hold stored tokens [begin, end).
std::pair<int64_t, int64_t> chunk_span(const Header& h, int l, int64_t begin, int64_t end) {
  const int64_t T = h.info.chunk_tokens;
  const LayerCounts& c = h.layers[static_cast<size_t>(l)];
  if (begin >= end || c.n_chunks == 0) return {0, 0};
  return {begin / T, std::min(c.n_chunks, end / T + (end % T != 0 ? 1 : 0))};
}

void check_chunk_heads(ChunkDecoder& dec, const Header& h, int l, int64_t begin, int64_t end) {
  const auto [c0, c1] = chunk_span(h, l, begin, end);
  for (int64_t ci = c0; ci < c1; ++ci) dec.check_descriptors(cache_chunk(h, l, ci));
}

// The part of one chunk's rows of a set that falls in [begin, end): coded rows from `coded_from`
// (relative to the chunk's coded rows), tier rows from `tier_from`, window rows from
// `window_from`.
struct Selection {
  int64_t coded_from = 0, coded = 0, tier_from = 0, tier = 0, window_from = 0, window = 0;
};
Selection select(const ChunkRows& r, int64_t set_coded, int64_t set_tier, int64_t begin, int64_t end) {
  Selection s;
  // [from, from + count) of a part whose chunk rows are stored tokens [lo, hi).
  auto part = [&](int64_t lo, int64_t hi, int64_t& from, int64_t& count) {
    const int64_t a = std::max(lo, begin), b = std::min(hi, end);
    from = std::max<int64_t>(0, a - lo);
    count = std::max<int64_t>(0, b - a);
  };
  part(r.coded_lo, r.coded_hi, s.coded_from, s.coded);
  part(set_coded + r.tier_lo, set_coded + r.tier_hi, s.tier_from, s.tier);
  part(set_coded + set_tier + r.window_lo, set_coded + set_tier + r.window_hi, s.window_from, s.window);
  return s;
}

// The layer's header-held parts (means, scales, energies, gain references, counts) and space for
// the selected tokens, sized exactly (the caller checked the size against the budget).
CompressedKV::LayerData empty_layer(const Header& h, int l, int64_t begin, int64_t end) {
  const CacheLayout& L = h.info.layout;
  const LayerCounts& c = h.layers[static_cast<size_t>(l)];
  const size_t sets = c.coded.size(), H = static_cast<size_t>(L.n_kv_heads), d = static_cast<size_t>(L.head_dim);
  const CodecGeometry kg = key_geometry(L, l), vg = value_geometry(L, l);
  CompressedKV::LayerData out;
  out.original_tokens = c.original_tokens;
  out.pinned = c.pinned;  // the layer's count, as original_tokens (window index < pinned: a sink)
  out.positions.assign(sets, {});
  out.window_positions.assign(sets, {});
  out.tier_positions.assign(sets, {});  // every version: one (possibly empty) set per position set
  out.heads.assign(H, {});
  std::vector<size_t> sel_coded(sets), sel_tier(sets), sel_window(sets);
  for (size_t s = 0; s < sets; ++s) {
    const int64_t n = c.stored(s);
    const int64_t lo = std::min(begin, n), hi = std::min(end, n);
    const int64_t coded = std::max<int64_t>(0, std::min(hi, c.coded[s]) - lo);
    const int64_t tier = std::max<int64_t>(0, std::min(hi, c.coded[s] + c.tier[s]) - std::max(lo, c.coded[s]));
    sel_coded[s] = static_cast<size_t>(coded);
    sel_tier[s] = static_cast<size_t>(tier);
    sel_window[s] = static_cast<size_t>(hi - lo - coded - tier);
    out.positions[s].reserve(sel_coded[s]);
    out.tier_positions[s].reserve(sel_tier[s]);
    out.window_positions[s].reserve(sel_window[s]);
  }
  const CodecGeometry tk = tier_geometry(L, true), tv = tier_geometry(L, false);
  for (size_t hh = 0; hh < H; ++hh) {
    const size_t s = sets == 1 ? 0 : hh;
    const size_t nc = sel_coded[s], nt = sel_tier[s], nw = sel_window[s];
    HeadData& hd = out.heads[hh];
    hd.key_codes.reserve(nc * kg.code_bytes);
    hd.value_codes.reserve(nc * vg.code_bytes);
    if (kg.gain_width == 2) hd.key_gains.reserve(nc);
    if (vg.gain_width == 2) hd.value_gains.reserve(nc);
    if (kg.gain_width == 1) hd.key_gain_codes.reserve(nc);
    if (vg.gain_width == 1) hd.value_gain_codes.reserve(nc);
    hd.tier_key_codes.reserve(nt * tk.code_bytes);
    hd.tier_value_codes.reserve(nt * tv.code_bytes);
    hd.tier_key_gains.reserve(nt);
    hd.tier_value_gains.reserve(nt);
    hd.window_keys.reserve(nw * d);
    hd.window_values.reserve(nw * d);
    const size_t li = static_cast<size_t>(l);
    hd.key_mean = h.key_mean[li][hh];
    hd.value_mean = h.value_mean[li][hh];
    hd.key_channel_scale = h.key_channel_scale[li][hh];
    hd.key_gain_ref = h.gain_ref[li][hh][0];
    hd.value_gain_ref = h.gain_ref[li][hh][1];
  }
  out.query_energy = h.query_energy[static_cast<size_t>(l)];
  return out;
}

template <class T>
void append_bytes(std::vector<T>& v, const uint8_t* a, size_t n) {
  if (n == 0) return;
  const size_t at = v.size();
  v.resize(at + n / sizeof(T));
  std::memcpy(v.data() + at, a, n);
}

// Stored tokens [begin, end) (clamped per set) of layer l, from the chunks overlapping it. The
// chunks' heads were checked by the caller (check_chunk_heads).
CompressedKV::LayerData read_layer_range(ChunkDecoder& dec, const Header& h, int l, int64_t begin, int64_t end) {
  const CacheLayout& L = h.info.layout;
  const LayerCounts& c = h.layers[static_cast<size_t>(l)];
  const int64_t T = h.info.chunk_tokens;
  const size_t sets = c.coded.size();
  const int H = L.n_kv_heads;
  const size_t d = static_cast<size_t>(L.head_dim);
  const CodecGeometry kg = key_geometry(L, l), vg = value_geometry(L, l);
  const CodecGeometry tk = tier_geometry(L, true), tv = tier_geometry(L, false);
  const uint16_t version = static_cast<uint16_t>(h.info.format_version);
  CompressedKV::LayerData out = empty_layer(h, l, begin, end);
  const auto [c0, c1] = chunk_span(h, l, begin, end);
  for (int64_t ci = c0; ci < c1; ++ci) {
    const std::vector<ChunkRows> rows = chunk_rows_of(c, ci, T);
    dec.decode(cache_chunk(h, l, ci));
    std::vector<Selection> sel(sets);
    for (size_t s = 0; s < sets; ++s) sel[s] = select(rows[s], c.coded[s], c.tier[s], begin, end);
    // Positions: segment s holds the chunk's coded rows, tier rows, then window rows of set s.
    const uint8_t* p = dec.view(0);
    for (size_t s = 0; s < sets; ++s) {
      append_bytes(out.positions[s], p + 4 * static_cast<size_t>(sel[s].coded_from), 4 * static_cast<size_t>(sel[s].coded));
      append_bytes(out.tier_positions[s], p + 4 * static_cast<size_t>(rows[s].coded() + sel[s].tier_from),
                   4 * static_cast<size_t>(sel[s].tier));
      append_bytes(out.window_positions[s],
                   p + 4 * static_cast<size_t>(rows[s].coded() + rows[s].tier() + sel[s].window_from),
                   4 * static_cast<size_t>(sel[s].window));
      p += 4 * static_cast<size_t>(rows[s].hi - rows[s].lo);
    }
    // Per-head streams: segment h holds the chunk's rows of one part of head h's set.
    auto scatter = [&](size_t stream, size_t row_bytes, Part part, auto&& append) {
      const uint8_t* q = dec.view(stream);
      for (int hh = 0; hh < H; ++hh) {
        const size_t s = sets == 1 ? 0 : static_cast<size_t>(hh);
        const Selection& e = sel[s];
        const int64_t from = part == Part::kCoded ? e.coded_from : part == Part::kTier ? e.tier_from : e.window_from;
        const int64_t count = part == Part::kCoded ? e.coded : part == Part::kTier ? e.tier : e.window;
        if (row_bytes > 0 && count > 0)
          append(out.heads[static_cast<size_t>(hh)], q + static_cast<size_t>(from) * row_bytes,
                 static_cast<size_t>(count) * row_bytes);
        q += static_cast<size_t>(rows[s].count(part)) * row_bytes;
      }
    };
    scatter(1, kg.code_bytes, Part::kCoded,
            [](HeadData& hd, const uint8_t* a, size_t n) { append_bytes(hd.key_codes, a, n); });
    scatter(2, vg.code_bytes, Part::kCoded,
            [](HeadData& hd, const uint8_t* a, size_t n) { append_bytes(hd.value_codes, a, n); });
    scatter(3, static_cast<size_t>(kg.gain_width), Part::kCoded, [&](HeadData& hd, const uint8_t* a, size_t n) {
      if (kg.gain_width == 1) append_bytes(hd.key_gain_codes, a, n);
      else append_bytes(hd.key_gains, a, n);
    });
    scatter(4, static_cast<size_t>(vg.gain_width), Part::kCoded, [&](HeadData& hd, const uint8_t* a, size_t n) {
      if (vg.gain_width == 1) append_bytes(hd.value_gain_codes, a, n);
      else append_bytes(hd.value_gains, a, n);
    });
    scatter(5, 2 * d, Part::kWindow,
            [](HeadData& hd, const uint8_t* a, size_t n) { append_bytes(hd.window_keys, a, n); });
    scatter(6, 2 * d, Part::kWindow,
            [](HeadData& hd, const uint8_t* a, size_t n) { append_bytes(hd.window_values, a, n); });
    if (version >= kCodeTierSince) {
      scatter(7, tk.code_bytes, Part::kTier,
              [](HeadData& hd, const uint8_t* a, size_t n) { append_bytes(hd.tier_key_codes, a, n); });
      scatter(8, tv.code_bytes, Part::kTier,
              [](HeadData& hd, const uint8_t* a, size_t n) { append_bytes(hd.tier_value_codes, a, n); });
      scatter(9, tk.has_gain ? 2 : 0, Part::kTier,
              [](HeadData& hd, const uint8_t* a, size_t n) { append_bytes(hd.tier_key_gains, a, n); });
      scatter(10, tv.has_gain ? 2 : 0, Part::kTier,
              [](HeadData& hd, const uint8_t* a, size_t n) { append_bytes(hd.tier_value_gains, a, n); });
    }
  }
  for (size_t s = 0; s < sets; ++s) {
    const int64_t before_window = c.coded[s] + c.tier[s];
    // The first selected window token (pinned counts from the window's start).
    const int64_t w0 = std::max(std::min(begin, c.stored(s)), before_window) - before_window;
    check_positions(out.positions[s], out.window_positions[s], c.pinned - w0, l, s, version);
    check_tier_positions(out.tier_positions[s], out.positions[s], out.window_positions[s], c.pinned - w0, l, s);
  }
  return out;
}

CompressedKV read_cache(Source& src, const DeserializeOptions& o) {
  const Header h = parse_header(src, o, ContainerKind::kCompressedCache);
  check_budget(io::sat_add(h.info.decoded_bytes, scratch_bytes(h)), o, "the cache");
  const CacheLayout& L = h.info.layout;
  std::shared_ptr<const CacheCodecs> codecs = o.codecs;
  if (codecs) {
    const std::string diff = layout_difference(codecs->layout(), L);
    io::check(diff.empty(), "DeserializeOptions.codecs has a different layout than the container: {}", diff);
  }
  ChunkDecoder dec(src, h.dir, o);
  for (int l = 0; l < L.n_layers; ++l) check_chunk_heads(dec, h, l, 0, h.layers[static_cast<size_t>(l)].max_stored());
  // Every chunk is read and checked before the (costly) codecs are built.
  std::vector<CompressedKV::LayerData> layers;
  layers.reserve(static_cast<size_t>(L.n_layers));
  for (int l = 0; l < L.n_layers; ++l)
    layers.push_back(read_layer_range(dec, h, l, 0, h.layers[static_cast<size_t>(l)].max_stored()));
  // The writer's checks of a layer (checked_counts) on what was read, before the codecs are built:
  // a cache that deserializes is one that attends, decompresses and serializes again, so data
  // that a later call would refuse (changed, the CRCs recomputed) is refused here, by field.
  for (int l = 0; l < L.n_layers; ++l) (void)checked_counts(L, layers[static_cast<size_t>(l)], l, h.info.chunk_tokens);
  if (!codecs) codecs = std::make_shared<const CacheCodecs>(L);
  CompressedKV cache(std::move(codecs));
  for (int l = 0; l < L.n_layers; ++l) e8kv::detail::CacheStorage::layer(cache, l) = std::move(layers[static_cast<size_t>(l)]);
  return cache;
}

CompressedKV::LayerData read_range(Source& src, const DeserializeOptions& o, int layer, int64_t begin, int64_t end,
                                   const char* what) {
  const Header h = parse_header(src, o, ContainerKind::kCompressedCache);
  const CacheLayout& L = h.info.layout;
  if (layer < 0 || layer >= L.n_layers)
    throw Error(fmt::format("{}: layer {} is out of range [0, {})", what, layer, L.n_layers));
  if (begin < 0 || begin > end)
    throw Error(fmt::format("{}: token range [{}, {}) must satisfy 0 <= begin <= end", what, begin, end));
  const LayerCounts& c = h.layers[static_cast<size_t>(layer)];
  const int64_t e = std::min(end, c.max_stored());
  const int64_t b = std::min(begin, e);
  check_budget(io::sat_add(layer_range_bytes(L, layer, c, b, e), scratch_bytes(h)), o, what);
  ChunkDecoder dec(src, h.dir, o);
  check_chunk_heads(dec, h, layer, b, e);
  CompressedKV::LayerData out = read_layer_range(dec, h, layer, b, e);
  // What the full read checks of each head (deserialize_layer equals its layer), on the range.
  check_layer_heads(L, layer, out);
  return out;
}

constexpr int64_t kWholeLayer = std::numeric_limits<int64_t>::max();

}  // namespace

CompressedKV deserialize(const uint8_t* data, size_t size, const DeserializeOptions& options) {
  SpanSource src(data, size);
  return read_cache(src, options);
}

ContainerInfo read_info(const uint8_t* data, size_t size, const DeserializeOptions& options) {
  SpanSource src(data, size);
  return parse_header(src, options, ContainerKind::kCompressedCache, true).info;
}

CompressedKV::LayerData deserialize_layer(const uint8_t* data, size_t size, int layer, const DeserializeOptions& options) {
  SpanSource src(data, size);
  return read_range(src, options, layer, 0, kWholeLayer, "deserialize_layer");
}

CompressedKV::LayerData deserialize_tokens(const uint8_t* data, size_t size, int layer, int64_t begin, int64_t end,
                                           const DeserializeOptions& options) {
  SpanSource src(data, size);
  return read_range(src, options, layer, begin, end, "deserialize_tokens");
}

CompressedKV read_file(const std::string& path, const DeserializeOptions& options) {
  FileSource src(path);
  return read_cache(src, options);
}

ContainerInfo read_file_info(const std::string& path, const DeserializeOptions& options) {
  FileSource src(path);
  return parse_header(src, options, ContainerKind::kCompressedCache, true).info;
}

CompressedKV::LayerData read_file_layer(const std::string& path, int layer, const DeserializeOptions& options) {
  FileSource src(path);
  return read_range(src, options, layer, 0, kWholeLayer, "read_file_layer");
}

}  // namespace e8kv::container
