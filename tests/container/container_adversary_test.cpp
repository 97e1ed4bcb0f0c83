// Containers edited by an adversary who then recomputes the CRCs (issue 49): the header's layer
// table and every stream of every chunk get single-byte and whole-field edits, with both checksums
// made valid again. The rule: a cache that deserializes is usable. Each edited container either
// fails to deserialize (e8kv::Error), or the cache it gives attends on every layer, decompresses
// every layer (finite results) and serializes again; whatever those calls would refuse, the
// reader refuses first. Caches of several presets and format versions (v3 with eviction, per-head
// position sets, the code tier of v5/v6), their streams stored raw so that bytes are values.
// (Before the reader ran the writer's checks on what it read, 489 of these 8,100 edits read and
// then failed a later call: non-finite fp16 windows, means and gains, 8-bit gains without their
// reference.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "container/format.hpp"
#include "container/container_test_util.hpp"

namespace {

using namespace e8kv;
using namespace e8kv::container_test;

constexpr uint64_t kSeed = 4949;

/// One stream of one chunk: where its (raw) bytes lie in the container.
struct StreamAt {
  size_t chunk = 0;  // offset of the chunk
  size_t at = 0;     // offset of the stream's first byte
  size_t bytes = 0;
  ent::StreamKind kind = ent::StreamKind::kPositions;
};

// The non-empty streams of every chunk, from the directory and the stream descriptors
// (docs/format.md §2.4: a 40-byte chunk header, 24 bytes per descriptor, then the streams).
std::vector<StreamAt> streams_of(const std::vector<uint8_t>& b) {
  std::vector<StreamAt> out;
  const size_t n_chunks = static_cast<size_t>(get_at<uint64_t>(b, 40));
  for (size_t i = 0; i < n_chunks; ++i) {
    const size_t c = chunk_offset(b, i);
    const size_t n_streams = get_at<uint32_t>(b, c + 4);
    size_t at = c + ent::kChunkHeaderBytes + ent::kStreamDescriptorBytes * n_streams;
    for (size_t s = 0; s < n_streams; ++s) {
      const size_t d = c + ent::kChunkHeaderBytes + ent::kStreamDescriptorBytes * s;
      EXPECT_EQ(b[d + 2], 0) << "chunk " << i << " stream " << s << " is not stored raw";
      const size_t stored = static_cast<size_t>(get_at<uint64_t>(b, d + 16));
      if (stored > 0) out.push_back({c, at, stored, static_cast<ent::StreamKind>(b[d])});
      at += stored;
    }
  }
  return out;
}

// Where the layer table and the rest of the header before the directory lie: [layout, dir).
size_t directory_at(const std::vector<uint8_t>& b) {
  return header_bytes(b) - 4 - ent::kDirectoryEntryBytes * static_cast<size_t>(get_at<uint64_t>(b, 40));
}

// fp16 values an adversary would pick: infinities, NaNs, the extremes, zeros, a subnormal, 1.
constexpr uint16_t kFp16Picks[] = {0x7C00, 0xFC00, 0x7E00, 0xFFFF, 0x7BFF, 0xFBFF, 0x0000, 0x8000, 0x0001, 0x3C00};

/// A field of the layer table (docs/format.md §2.2).
struct Field {
  enum Type { kCount, kLength, kFp16, kF32 } type;
  size_t at;
  const char* name;
};

// Every field of the layer table of a compressed-cache container of format `version`: per layer
// the counts (original, pinned, first chunk, chunks; per set coded, window, tier), per head the
// mean lengths and values, and from version 2 per head the key channel scales, the pending query
// energies and the two gain references.
std::vector<Field> table_fields(const std::vector<uint8_t>& b, const ent::ContainerInfo& info) {
  const CacheLayout& L = info.layout;
  size_t at = kLayoutAt + CacheLayout::kLayoutRecordBytes + 2 * static_cast<size_t>(L.n_layers);
  if (info.format_version >= 6) at += CacheLayout::kRopeFactorCountBytes + 4 * L.rope.freq_factors.size();
  const size_t sets = L.per_head_positions ? static_cast<size_t>(L.n_kv_heads) : 1;
  std::vector<Field> f;
  auto add = [&](Field::Type t, size_t n, size_t width, const char* name) {
    for (size_t i = 0; i < n; ++i, at += width) f.push_back({t, at, name});
  };
  for (int l = 0; l < L.n_layers; ++l) {
    add(Field::kCount, 4, 8, "layer counts");
    add(Field::kCount, sets * (info.format_version >= 5 ? 3 : 2), 8, "set counts");
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const size_t kl = get_at<uint16_t>(b, at), vl = get_at<uint16_t>(b, at + 2);
      add(Field::kLength, 2, 2, "mean length");
      add(Field::kFp16, kl + vl, 2, "mean");
    }
    if (info.format_version < 2) continue;
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const size_t sl = get_at<uint16_t>(b, at);
      add(Field::kLength, 1, 2, "key_channel_scale length");
      add(Field::kFp16, sl, 2, "key channel scale");
      const size_t el = get_at<uint16_t>(b, at);
      add(Field::kLength, 1, 2, "query_energy length");
      add(Field::kF32, el, 4, "query energy");
      add(Field::kFp16, 2, 2, "gain reference");
    }
  }
  EXPECT_EQ(at, directory_at(b)) << "the layer table ends where the directory starts";
  return f;
}

/// One deterministic edit of `b`, the CRCs fixed afterwards; returns what it did, for messages.
std::string edit(std::vector<uint8_t>& b, const std::vector<Field>& table, const std::vector<StreamAt>& streams,
                 std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto byte_op = [&](size_t at) {
    const uint8_t old = b[at];
    switch (pick(5)) {
      case 0: b[at] = static_cast<uint8_t>(old ^ (1u << pick(8))); break;
      case 1: b[at] = 0x00; break;
      case 2: b[at] = 0xFF; break;
      case 3: b[at] = static_cast<uint8_t>(old + 1); break;
      default: b[at] = static_cast<uint8_t>(old - 1); break;
    }
    return fmt::format("byte {} {:#04x} -> {:#04x}", at, old, b[at]);
  };
  auto fp16_op = [&](size_t at) {
    const uint16_t old = get_at<uint16_t>(b, at);
    put_at<uint16_t>(b, at, kFp16Picks[pick(std::size(kFp16Picks))]);
    return fmt::format("fp16 at {} {:#06x} -> {:#06x}", at, old, get_at<uint16_t>(b, at));
  };
  const size_t kind = pick(10);
  if (kind < 4) {  // the header: any byte of the layout record and the layer table, or a field
    std::string what;
    if (kind < 2) {
      what = "header " + byte_op(kLayoutAt + pick(directory_at(b) - kLayoutAt));
    } else {
      // A kind of field first (counts, lengths, means, scales, energies, references), then one of
      // them: the few references and lengths are edited as often as the many means.
      std::vector<const char*> names;
      for (const Field& f : table)
        if (std::find(names.begin(), names.end(), f.name) == names.end()) names.push_back(f.name);
      const char* name = names[pick(names.size())];
      std::vector<const Field*> of_name;
      for (const Field& f : table)
        if (f.name == name) of_name.push_back(&f);
      const Field& f = *of_name[pick(of_name.size())];
      what = fmt::format("header field '{}': ", f.name);
      if (f.type == Field::kFp16) {
        what += fp16_op(f.at);
      } else if (f.type == Field::kF32) {
        const float picks[] = {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), -1.f,
                               0.f, 3e38f};
        put_at<float>(b, f.at, picks[pick(std::size(picks))]);
        what += fmt::format("f32 at {} -> {}", f.at, get_at<float>(b, f.at));
      } else if (f.type == Field::kLength) {
        const uint16_t old = get_at<uint16_t>(b, f.at);
        const uint16_t picks[] = {0, 64, static_cast<uint16_t>(old + 1), static_cast<uint16_t>(old - 1)};
        put_at<uint16_t>(b, f.at, picks[pick(std::size(picks))]);
        what += fmt::format("u16 at {} {} -> {}", f.at, old, get_at<uint16_t>(b, f.at));
      } else {
        const int64_t old = get_at<int64_t>(b, f.at);
        const int64_t picks[] = {old + 1, old - 1, 0, old + 32, int64_t{1} << 40};
        put_at<int64_t>(b, f.at, picks[pick(std::size(picks))]);
        what += fmt::format("count at {} {} -> {}", f.at, old, get_at<int64_t>(b, f.at));
      }
    }
    fix_header_crc(b);
    return what;
  }
  const StreamAt& s = streams[pick(streams.size())];
  std::string what = fmt::format("chunk at {} stream '{}': ", s.chunk, ent::to_string(s.kind));
  if (kind < 6 || s.bytes < 2) {
    what += byte_op(s.at + pick(s.bytes));
  } else if (s.kind == ent::StreamKind::kPositions) {  // whole positions: a neighbour's, one off, extremes
    const size_t n = s.bytes / 4, i = pick(n);
    const size_t at = s.at + 4 * i;
    const int32_t old = get_at<int32_t>(b, at);
    const int32_t picks[] = {i > 0 ? get_at<int32_t>(b, at - 4) : old - 1,
                             i + 1 < n ? get_at<int32_t>(b, at + 4) : old + 1,
                             old + 1,
                             old - 1,
                             -1,
                             std::numeric_limits<int32_t>::max(),
                             0};
    put_at<int32_t>(b, at, picks[pick(std::size(picks))]);
    what += fmt::format("position {} {} -> {}", i, old, get_at<int32_t>(b, at));
  } else {  // a whole fp16 element (gains, windows, fp16 codes), or two bytes of block codes
    what += fp16_op(s.at + 2 * pick(s.bytes / 2));
  }
  fix_chunk_crc(b, s.chunk);
  return what;
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

/// What a reader does with a cache it read: attends on every layer (a query of the cache's shape,
/// drawn from `seed`), decompresses every layer, serializes the cache and reads that back. Empty
/// when every call succeeds with finite results; otherwise what failed.
std::string use(const CompressedKV& c, uint64_t seed) {
  const CacheLayout& L = c.layout();
  const size_t n = static_cast<size_t>(L.n_q_heads) * static_cast<size_t>(L.head_dim);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> q(n), out(n), lse(static_cast<size_t>(L.n_q_heads));
  for (auto& x : q) x = g(rng);
  for (int l = 0; l < L.n_layers; ++l) {
    try {
      e8kv::attend(c, l, q.data(), out.data(), lse.data());
    } catch (const Error& e) {
      return fmt::format("attend of layer {} refused it: {}", l, e.what());
    }
    if (!all_finite(out)) return fmt::format("attend of layer {} gave a non-finite output", l);
    for (float x : lse)
      if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
        return fmt::format("attend of layer {} gave lse {}", l, x);
    try {
      const DenseLayer d = c.decompress_layer(l);
      if (!all_finite(d.keys) || !all_finite(d.values))
        return fmt::format("decompress_layer({}) gave non-finite keys or values", l);
    } catch (const Error& e) {
      return fmt::format("decompress_layer({}) refused it: {}", l, e.what());
    }
  }
  try {
    const std::vector<uint8_t> again = ent::serialize(c);
    ent::DeserializeOptions o;
    o.codecs = c.shared_codecs();
    (void)ent::deserialize(again.data(), again.size(), o);
  } catch (const Error& e) {
    return fmt::format("serialize (or reading its output) refused it: {}", e.what());
  }
  return {};
}

struct Case {
  const char* spec;
  int appended;  // tokens appended one by one after the prefill (a longer fp16 window)
  int edits;
};

// Per preset: `edits` edited containers; each is refused by deserialize or usable.
TEST(ContainerAdversary, EditedContainersWithValidChecksumsAreRefusedOrUsable) {
  const Case cases[] = {
      {"preset=tier-k2v2", 6, 1500},
      {"preset=tier-k2v2,per_head=1,rope=residual", 6, 1200},
      {"preset=quant-k3v2,evict=0.3", 9, 1500},
      {"preset=quant-k3v2,per_head=1,evict=0.3", 9, 1500},
      {"preset=quant-k4v4", 0, 1200},
      {"preset=high,fp16_tier=0.1,evict=0.2", 4, 1200},
  };
  auto rng = test::seeded_rng(kSeed);
  // Stored raw (a zstd frame never saves 100 %) and untransformed: a byte of a stream is a byte
  // of the value it stores. Chunks of 32 tokens: several per layer.
  ent::ContainerOptions raw;
  raw.chunk_tokens = 32;
  raw.min_zstd_saving = 1.0;
  raw.transforms.positions = ent::Transform::kNone;
  raw.transforms.key_codes = ent::Transform::kNone;
  raw.transforms.gains = ent::Transform::kNone;
  raw.transforms.fp16 = ent::Transform::kNone;
  int total_refused = 0, total_usable = 0, total_slipped = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    const Made m = make_cache(c.spec, small_spec(2, 2, 4, 64, 120, 77), c.appended);
    const std::vector<uint8_t> bytes = ent::serialize(m.cache, raw);
    const ent::ContainerInfo info = ent::read_info(bytes.data(), bytes.size());
    const std::vector<StreamAt> streams = streams_of(bytes);
    const std::vector<Field> table = table_fields(bytes, info);
    ASSERT_FALSE(streams.empty());
    const std::shared_ptr<const CacheCodecs> codecs = m.cache.shared_codecs();
    const uint64_t query_seed = rng();
    ASSERT_EQ(use(deser(bytes), query_seed), "") << "the unedited container";
    int refused = 0, usable = 0, slipped = 0;
    std::map<std::string, int> reasons;
    // The sanitizers need each path once, not the whole sample.
    const int edits = test::kUnderSanitizer ? c.edits / 10 : c.edits;
    for (int i = 0; i < edits; ++i) {
      std::vector<uint8_t> t = bytes;
      const std::string what = edit(t, table, streams, rng);
      CompressedKV back;
      try {
        // The writer's codecs when the layout is untouched (rebuilding them for each container
        // would take most of the test's time).
        ent::DeserializeOptions o;
        const ent::ContainerInfo edited = ent::read_info(t.data(), t.size());
        if (ent::layout_difference(edited.layout, codecs->layout()).empty()) o.codecs = codecs;
        back = deser(t, o);
      } catch (const Error&) {
        ++refused;
        continue;
      }
      const std::string failure = use(back, query_seed);
      if (failure.empty()) {
        ++usable;
        continue;
      }
      ++slipped;
      if (++reasons[failure.substr(0, failure.find(':'))] <= 2)
        ADD_FAILURE() << "edit " << i << " (" << what << ") deserialized, but " << failure;
    }
    std::printf("%s (format v%d, %zu bytes): %d edits refused, %d usable, %d slipped through\n", c.spec,
                info.format_version, bytes.size(), refused, usable, slipped);
    for (const auto& [reason, n] : reasons) std::printf("  %d x %s\n", n, reason.c_str());
    EXPECT_GT(refused, 0);
    EXPECT_GT(usable, 0);
    total_refused += refused;
    total_usable += usable;
    total_slipped += slipped;
  }
  std::printf("all presets: %d refused, %d usable, %d slipped through\n", total_refused, total_usable, total_slipped);
  EXPECT_EQ(total_slipped, 0);
}

// The means of head h of layer l removed from the layer table (both lengths 0), the container
// re-laid as a writer would have written it: the later header bytes move up, header_bytes,
// total_bytes and the directory's offsets follow, the header CRC is recomputed (the chunks do not
// change). An edit no single-byte change makes.
std::vector<uint8_t> without_means(const std::vector<uint8_t>& b, const std::vector<Field>& table, int l, int h,
                                   int n_kv_heads) {
  std::vector<const Field*> lengths;
  for (const Field& f : table)
    if (std::string(f.name) == "mean length") lengths.push_back(&f);
  const size_t at = lengths[2 * static_cast<size_t>(l * n_kv_heads + h)]->at;  // key_mean_len, then value_mean_len
  const size_t removed = 2 * (size_t{get_at<uint16_t>(b, at)} + get_at<uint16_t>(b, at + 2));
  EXPECT_GT(removed, 0u) << "layer " << l << " head " << h << " has no means to remove";
  std::vector<uint8_t> t = b;
  const size_t dir = directory_at(t), n_chunks = static_cast<size_t>(get_at<uint64_t>(t, 40));
  for (size_t i = 0; i < n_chunks; ++i) put_at<uint64_t>(t, dir + 16 * i, get_at<uint64_t>(t, dir + 16 * i) - removed);
  put_at<uint16_t>(t, at, 0);
  put_at<uint16_t>(t, at + 2, 0);
  t.erase(t.begin() + static_cast<std::ptrdiff_t>(at + 4), t.begin() + static_cast<std::ptrdiff_t>(at + 4 + removed));
  put_at<uint64_t>(t, 16, get_at<uint64_t>(t, 16) - removed);
  put_at<uint64_t>(t, 24, t.size());
  fix_header_crc(t);
  return t;
}

// A centred code tier decodes around its head's means (CacheCodecs::decode_tier refuses a head
// without them): a container whose head has tier tokens and no means is refused by the reader,
// naming the field. The same surgery on a head the layer codes alone reads, and is usable: the
// container it makes is well-formed.
TEST(ContainerAdversary, CentredTierTokensNeedTheirHeadsMeans) {
  const Made m = make_cache("preset=tier-k2v2,per_head=1", small_spec(2, 2, 4, 64, 120, 78), 6);
  ASSERT_TRUE(m.cache.layout().tier_centered);
  ent::ContainerOptions o;
  o.chunk_tokens = 32;
  const std::vector<uint8_t> bytes = ent::serialize(m.cache, o);
  const ent::ContainerInfo info = ent::read_info(bytes.data(), bytes.size());
  const std::vector<Field> table = table_fields(bytes, info);
  int tested = 0;
  for (int l = 0; l < m.cache.n_layers(); ++l)
    for (int h = 0; h < m.cache.layout().n_kv_heads; ++h) {
      if (m.cache.tier_tokens(l, h) == 0) continue;
      const std::vector<uint8_t> t = without_means(bytes, table, l, h, m.cache.layout().n_kv_heads);
      expect_error([&] { deser(t); }, fmt::format("layer {} head {}: {} code-tier tokens are centred", l, h,
                                                  m.cache.tier_tokens(l, h)));
      ++tested;
    }
  EXPECT_GT(tested, 0) << "no head holds tier tokens";
  const Made plain = make_cache("preset=quant-k3v2", small_spec(2, 2, 4, 64, 120, 78), 6);
  const std::vector<uint8_t> b = ent::serialize(plain.cache, o);
  const std::vector<uint8_t> t = without_means(b, table_fields(b, ent::read_info(b.data(), b.size())), 1, 0, 2);
  const CompressedKV back = deser(t);
  EXPECT_TRUE(back.layer(1).heads[0].key_mean.empty() && back.layer(1).heads[0].value_mean.empty());
  EXPECT_EQ(use(back, kSeed), "");
}

}  // namespace
