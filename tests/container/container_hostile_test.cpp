// Hostile input: truncation, bit flips, and header and chunk fields set to values the format
// refuses, with and without checksums; and containers whose checksums pass (recomputed by
// whoever crafted them, or not verified) but whose sizes lie, which must be rejected with
// e8kv::Error before the read allocates what the lies ask for (issue 18, class 1). This binary
// replaces the global operator new to record the largest single allocation a read makes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "container/format.hpp"
#include "container/layer_table.hpp"
#include "container/container_test_util.hpp"

namespace {

std::atomic<bool> g_probing{false};
std::atomic<size_t> g_largest{0};

void* counted_alloc(size_t n) {
  if (g_probing.load(std::memory_order_relaxed)) {
    size_t prev = g_largest.load(std::memory_order_relaxed);
    while (n > prev && !g_largest.compare_exchange_weak(prev, n)) {
    }
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(size_t n) { return counted_alloc(n); }
void* operator new[](size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace {

using namespace e8kv;
using namespace e8kv::container_test;

// Runs f and returns the largest single allocation it made (through operator new).
template <class F>
size_t largest_allocation(F&& f) {
  g_largest = 0;
  g_probing = true;
  try {
    f();
  } catch (...) {
    g_probing = false;
    throw;
  }
  g_probing = false;
  return g_largest;
}

std::vector<uint8_t> read_golden(const std::string& name) { return read_all(data_dir() + "/" + name); }

// Reads `bytes` as the kind it holds, through every partial entry point and the full read. With
// `known` codecs the full read runs only when the header's layout is theirs (it reuses them:
// rebuilding codecs for each of thousands of changed headers would take minutes).
void read_everything(const std::vector<uint8_t>& bytes, ent::DeserializeOptions o,
                     const std::shared_ptr<const CacheCodecs>& known = nullptr) {
  const ent::ContainerInfo info = ent::read_info(bytes.data(), bytes.size(), o);
  if (info.kind == ent::ContainerKind::kPlain) {
    (void)ent::deserialize_plain(bytes.data(), bytes.size(), o);
    return;
  }
  for (int l = 0; l < info.layout.n_layers; ++l) {
    (void)ent::deserialize_layer(bytes.data(), bytes.size(), l, o);
    (void)ent::deserialize_tokens(bytes.data(), bytes.size(), l, 3, 40, o);
  }
  if (known && !ent::layout_difference(known->layout(), info.layout).empty()) return;
  o.codecs = known;
  (void)ent::deserialize(bytes.data(), bytes.size(), o);
}

// The reported case: a 10 KB plain container (2 bf16 tensors [24, 2, 64]) whose head_dim has a
// high bit set asks for 2 × 1.6 GB. It must be refused from its header, before any allocation
// of that size, whether the CRC was recomputed or not verified.
TEST(ContainerHostile, PlainContainerWithCorruptedHeadDimIsRejectedBeforeAllocating) {
  const std::vector<uint8_t> golden = read_golden("plain_bf16.e8kv");
  ASSERT_EQ(get_at<uint64_t>(golden, 80), 64u) << "head_dim sits at offset 80 (docs/format.md 2.3)";
  for (uint64_t head_dim : {uint64_t{64} | (uint64_t{1} << 24), uint64_t{64} | (uint64_t{1} << 20), uint64_t{65536}}) {
    for (bool verify : {true, false}) {
      std::vector<uint8_t> t = golden;
      put_at<uint64_t>(t, 80, head_dim);
      if (verify) fix_header_crc(t);
      ent::DeserializeOptions o;
      o.verify_checksums = verify;
      const auto start = std::chrono::steady_clock::now();
      std::string message;
      const size_t largest = largest_allocation([&] {
        try {
          (void)ent::deserialize_plain(t.data(), t.size(), o);
        } catch (const Error& e) {
          message = e.what();
        }
      });
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_FALSE(message.empty()) << "head_dim " << head_dim << " was accepted";
      EXPECT_LE(largest, size_t{1} << 20) << "head_dim " << head_dim << ": allocated " << largest
                                          << " bytes for a " << t.size() << "-byte input (" << message << ")";
      std::printf("head_dim %llu, checksums %s: rejected after %.3f s, largest allocation %zu bytes: %s\n",
                  static_cast<unsigned long long>(head_dim), verify ? "recomputed" : "off", seconds, largest,
                  message.c_str());
    }
  }
}

// A compressed-cache header (CRC recomputed) whose layer table claims up to 2^20 coded tokens in
// the one chunk of each layer of an 8 KB container: refused before the layer's vectors are
// reserved (the old reader reserved them, then found the chunk's sizes disagree).
TEST(ContainerHostile, CacheHeaderClaimingMoreTokensThanItsChunksHoldIsRejectedBeforeAllocating) {
  const Made m = make_cache("preset=quant-k3v2", small_spec(2, 2, 4, 64, 64, 51));
  ent::ContainerOptions one_chunk;
  one_chunk.chunk_tokens = 1 << 20;
  const std::vector<uint8_t> bytes = ent::serialize(m.cache, one_chunk);
  const size_t table = kLayoutAt + 128 + 2 * 2;  // layer table, after the per-layer codecs
  const uint64_t window = get_at<uint64_t>(bytes, table + 40);
  for (uint64_t stored : {uint64_t{1} << 12, uint64_t{1} << 16, uint64_t{1} << 20}) {
    std::vector<uint8_t> t = bytes;
    put_at<int64_t>(t, table, int64_t{1} << 40);    // original_tokens
    put_at<uint64_t>(t, table + 32, stored - window);  // coded tokens of set 0: still one chunk
    fix_header_crc(t);
    std::string message;
    const size_t largest = largest_allocation([&] {
      try {
        read_everything(t, ent::DeserializeOptions{});
      } catch (const Error& e) {
        message = e.what();
      }
    });
    EXPECT_FALSE(message.empty()) << stored << " stored tokens were accepted";
    EXPECT_LE(largest, size_t{1} << 20) << stored << " stored tokens: allocated " << largest << " bytes (" << message
                                        << ")";
  }
}

// Header bytes of every golden file set to a few values, the CRC recomputed: each read
// either succeeds or throws e8kv::Error, and no single allocation exceeds 4 times the input's
// size (a valid read's largest vector is a fraction of it; the old reader allocated 3.2 GB for
// one of these changes).
TEST(ContainerHostile, HeaderFieldLiesNeverCauseLargeAllocations) {
  for (const char* name : {"k3v2_evict_window.e8kv", "perhead_ball_vor.e8kv", "lossless_fp16.e8kv", "plain_bf16.e8kv",
                           "k3v2_code_tier.e8kv"}) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> golden = read_golden(name);
    const size_t hb = static_cast<size_t>(get_at<uint64_t>(golden, 16));
    const ent::ContainerInfo info = ent::read_info(golden.data(), golden.size());
    const std::shared_ptr<const CacheCodecs> codecs =
        info.kind == ent::ContainerKind::kCompressedCache ? deser(golden).shared_codecs() : nullptr;
    const size_t bound = 4 * golden.size();
    size_t worst = 0, worst_at = 0;
    int rejected = 0, accepted = 0;
    // Every byte of the prefix, the layout record and the first layer entry; every third byte
    // after it (later layer entries; the means between them are data). Under ASan the whole
    // header would take a minute.
    for (size_t at = 8; at + 4 < hb; at += at < 256 ? 1 : 3) {
      if (at >= 16 && at < 32) continue;  // header_bytes / total_bytes: checked against the input size
      for (uint8_t value : {uint8_t(golden[at] ^ 0x01), uint8_t(golden[at] ^ 0x80), uint8_t{0xFF}}) {
        std::vector<uint8_t> t = golden;
        t[at] = value;
        fix_header_crc(t);
        const size_t largest = largest_allocation([&] {
          try {
            read_everything(t, ent::DeserializeOptions{}, codecs);
            ++accepted;
          } catch (const Error&) {
            ++rejected;
          }
        });
        if (largest > worst) {
          worst = largest;
          worst_at = at;
        }
      }
    }
    EXPECT_LE(worst, bound) << "largest allocation " << worst << " bytes after a change of header byte " << worst_at;
    EXPECT_GT(rejected, 0);
    std::printf("%s: %d header changes rejected, %d accepted, largest allocation %zu bytes (byte %zu)\n", name,
                rejected, accepted, worst, worst_at);
  }
}

// ---- corruption with checksums -----------------------------------------------------------------------

TEST(ContainerLimits, MaxDecodedBytesIsEnforcedBeforeAllocation) {
  const Made m = make_cache("preset=quant-k3v2", small_spec(2, 2, 4, 64, 64, 51));
  const auto bytes = ent::serialize(m.cache);
  const auto info = ent::read_info(bytes.data(), bytes.size());
  ent::DeserializeOptions o;
  o.max_decoded_bytes = info.decoded_bytes - 1;
  expect_error([&] { deser(bytes, o); }, "max_decoded_bytes");
  o.max_decoded_bytes = info.decoded_bytes * 4;
  expect_cache_eq(m.cache, deser(bytes, o));
  // A header claiming 2^20 coded tokens in layer 0 (still one chunk; CRC fixed) is refused by a
  // bound below what that needs before any chunk is read; above it, the chunk's sizes disagree.
  ent::ContainerOptions one_chunk;
  one_chunk.chunk_tokens = 1 << 20;
  auto big = ent::serialize(m.cache, one_chunk);
  const size_t table = kLayoutAt + 128 + 2 * 2;  // layer table, after the per-layer codecs
  put_at<int64_t>(big, table, int64_t{1} << 21);        // original_tokens
  const uint64_t window = get_at<uint64_t>(big, table + 40);
  put_at<uint64_t>(big, table + 32, (uint64_t{1} << 20) - window);  // coded tokens of set 0: one chunk
  fix_header_crc(big);
  const auto big_info = ent::read_info(big.data(), big.size());
  EXPECT_GT(big_info.decoded_bytes, uint64_t{1} << 26);
  o.max_decoded_bytes = uint64_t{1} << 26;
  expect_error([&] { deser(big, o); }, "max_decoded_bytes");
  expect_error([&] { deser(big); }, "the layer table implies");
}

class ContainerCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    made_ = make_cache("preset=high,residual=4,flush=8,rope=pre", small_spec(2, 2, 4, 64, 80, 61), 5);
    ent::ContainerOptions o;
    o.chunk_tokens = 24;
    bytes_ = ent::serialize(made_.cache, o);
    codecs_.codecs = made_.cache.shared_codecs();
  }
  Made made_;
  std::vector<uint8_t> bytes_;
  ent::DeserializeOptions codecs_;
};

TEST_F(ContainerCorruption, EveryTruncationIsRejected) {
  for (size_t n = 0; n < bytes_.size(); ++n) {
    std::vector<uint8_t> t(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      (void)ent::deserialize(t.data(), t.size());
      ADD_FAILURE() << "truncation to " << n << " bytes was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("too short") != std::string::npos ||
                  msg.find("header_bytes") != std::string::npos)
          << n << ": " << msg;
    }
  }
  expect_error([&] { ent::deserialize(nullptr, 0); }, "too short");
}

TEST_F(ContainerCorruption, TrailingBytesAreRejected) {
  auto t = bytes_;
  t.push_back(0);
  expect_error([&] { deser(t); }, "1 trailing bytes");
}

TEST_F(ContainerCorruption, EveryHeaderBitFlipIsRejected) {
  const size_t hb = header_bytes(bytes_);
  for (size_t byte = 0; byte < hb; ++byte)
    for (int bit = 0; bit < 8; ++bit) {
      auto t = bytes_;
      t[byte] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_THROW(deser(t), Error) << "flip of bit " << bit << " of header byte " << byte;
    }
}

TEST_F(ContainerCorruption, ChunkBitFlipsFailTheChecksum) {
  auto rng = test::seeded_rng(404);
  const size_t hb = header_bytes(bytes_);
  for (int i = 0; i < 1500; ++i) {
    auto t = bytes_;
    const size_t byte = hb + rng() % (t.size() - hb);
    t[byte] ^= static_cast<uint8_t>(1u << (rng() % 8));
    expect_error([&] { deser(t); }, "chunk", "byte " + std::to_string(byte));
  }
}

TEST_F(ContainerCorruption, WithoutChecksumsDamageIsDetectedOrHarmless) {
  // Structural checks alone: each flip either raises e8kv::Error or yields a cache of the same
  // shape (the flipped bit was in code or gain data). Never a crash (CI runs this under ASan).
  auto rng = test::seeded_rng(405);
  ent::DeserializeOptions o = codecs_;
  o.verify_checksums = false;
  int rejected = 0, accepted = 0;
  for (int i = 0; i < 400; ++i) {
    auto t = bytes_;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) t[rng() % t.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    CompressedKV c;
    try {
      c = deser(t, o);
    } catch (const Error&) {
      ++rejected;
      continue;
    }
    ++accepted;
    ASSERT_EQ(c.n_layers(), 2);
    // Usable, whatever the data: attention answers, or refuses scores that a damaged gain pushed
    // past the float range (e8kv::Error), never a crash or a silent answer of zeros.
    std::vector<float> q(4 * 64, 0.1f), out(4 * 64);
    if (every_head_has_tokens(c, 0)) {
      try {
        e8kv::attend(c, 0, q.data(), out.data());
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("overflow"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(rejected + accepted, 400);
}

TEST_F(ContainerCorruption, VersionMagicAndKindAreChecked) {
  auto t = bytes_;
  ASSERT_EQ(ent::read_info(t.data(), t.size()).format_version, 2) << "the fixture uses query-weighted keys";
  put_at<uint16_t>(t, 8, static_cast<uint16_t>(ent::kFormatVersion + 1));
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "format version " + std::to_string(ent::kFormatVersion + 1) + " is not supported");
  // In version 1 the query_weighted_keys byte is reserved and must be 0.
  const Made v1 = make_cache("preset=high,residual=4,flush=8,qweight=0,gain_bits=16,rope=pre", small_spec(2, 2, 4, 64, 80, 61), 5);
  t = ent::serialize(v1.cache);
  ASSERT_EQ(ent::read_info(t.data(), t.size()).format_version, 1);
  t[kLayoutAt + 21] = 1;
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "reserved");
  put_at<uint16_t>(t, 8, 0);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "format version 0 is not supported");
  t = bytes_;
  t[1] = 'X';
  expect_error([&] { deser(t); }, "bad magic");
  t = bytes_;
  put_at<uint16_t>(t, 10, 3);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "kind 3 is unknown");
  t = bytes_;
  put_at<uint16_t>(t, 10, 2);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "deserialize_plain");
  t = bytes_;
  put_at<uint32_t>(t, 12, 1);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "flags");
  // A different writer library version is fine (informational).
  t = bytes_;
  put_at<uint32_t>(t, 32, 99999);
  fix_header_crc(t);
  EXPECT_EQ(ent::read_info(t.data(), t.size()).library_version, 99999);
  expect_cache_eq(made_.cache, deser(t));
}

TEST_F(ContainerCorruption, HeaderFieldsAndEnumsAreChecked) {
  struct Case {
    size_t offset;
    int size;
    uint64_t value;
    const char* needle;
  };
  const size_t L = kLayoutAt;
  const Case cases[] = {
      {36, 4, 0, "chunk_tokens 0"},
      {36, 4, (1u << 20) + 1, "chunk_tokens"},
      {40, 8, 1u << 30, "n_chunks"},
      {L + 0, 4, 5000, "n_layers 5000"},
      {L + 4, 4, 0, "n_kv_heads 0"},
      {L + 8, 4, 3, "n_q_heads 3"},
      {L + 12, 4, 72, "head_dim 72 is not accepted"},
      {L + 16, 1, 3, "key_gain 3 is not accepted"},
      {L + 17, 1, 7, "value_gain 7"},
      {L + 18, 1, 3, "key_frame 3 is not accepted (accepted: post (0), pre (1), residual (2))"},
      {L + 18, 1, 2, "key_frame residual needs format version 3; the container is version 2"},
      {L + 19, 1, 9, "per_head_positions 9 is not accepted (accepted: 0 or 1)"},
      {L + 20, 1, 2, "center 2 is not accepted"},
      {L + 21, 1, 2, "query_weighted_keys 2"},
      {L + 22, 1, 1, "gain_bits 1 is not accepted (accepted: 8 or 16)"},
      {L + 23, 1, 1, "reserved"},
      {L + 24, 4, 0xFFC00000u, "key_scale"},  // NaN
      {L + 28, 4, 0, "value_scale"},
      {L + 32, 4, 0x7F800000u, "softmax_scale"},  // +Inf
      {L + 36, 4, 0xFFFFFFFFu, "residual_length"},
      {L + 40, 4, 0, "flush_block"},
      {L + 44, 4, 0, "mean_tokens"},
      {L + 56, 1, 2, "rope.layout 2"},
      {L + 57, 1, 5, "rope.scaling 5"},
      {L + 58, 2, 1, "reserved"},
      {L + 64, 4, 66, "rope.rotary_dim 66"},
      {L + 72, 8, 0x7FF8000000000000ull, "rope.theta nan is not accepted (accepted: finite numbers)"},
      {L + 128, 1, 12, "key codec id 12 of layer 0"},
      {L + 131, 1, 200, "value codec id 200 of layer 1"},
      {L + 132, 8, 1, "original_tokens 1"},  // below the stored tokens
      {L + 132 + 8, 8, 1000, "pinned 1000"},
      {L + 132 + 8, 8, static_cast<uint64_t>(-1), "pinned -1"},
      {L + 132 + 16, 8, 1, "chunk range"},
      {L + 132 + 32, 8, (uint64_t{1} << 31), "exceed"},
      {L + 132 + 48, 2, 5, "mean lengths 5"},
  };
  for (const auto& c : cases) {
    auto t = bytes_;
    std::memcpy(t.data() + c.offset, &c.value, static_cast<size_t>(c.size));
    fix_header_crc(t);
    expect_error([&] { deser(t); }, c.needle, "offset " + std::to_string(c.offset));
  }
  // header_bytes and total_bytes.
  auto t = bytes_;
  put_at<uint64_t>(t, 16, t.size() + 1);
  expect_error([&] { deser(t); }, "header_bytes");
  t = bytes_;
  put_at<uint64_t>(t, 24, t.size() + 5);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "truncated");
  t = bytes_;
  put_at<uint64_t>(t, 24, t.size() - 5);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "trailing");
  // Directory: an entry that does not follow its predecessor, or overruns the container.
  const size_t n = static_cast<size_t>(get_at<uint64_t>(bytes_, 40));
  const size_t dir = header_bytes(bytes_) - 4 - 16 * n;
  t = bytes_;
  put_at<uint64_t>(t, dir + 16, get_at<uint64_t>(t, dir + 16) + 1);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "chunks follow each other");
  t = bytes_;
  put_at<uint64_t>(t, dir + 8, uint64_t{1} << 60);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "does not fit");
}

TEST_F(ContainerCorruption, ChunkFieldsAndEnumsAreChecked) {
  const size_t c1 = chunk_offset(bytes_, 1);
  struct Case {
    size_t offset;  // within the chunk
    int size;
    uint64_t value;
    const char* needle;
  };
  const Case cases[] = {
      {0, 1, 'X', "bad chunk magic"},
      {4, 4, 6, "6 streams, expected 7"},
      {8, 4, 0, "should be (1"},
      {12, 4, 1, "should be (1"},
      {16, 8, 7, "should be (1"},
      {24, 8, 3, "disagrees with the directory"},
      {32, 4, 1, "should be"},
      {40, 1, 3, "kind 3, expected 1 (positions)"},
      {41, 1, 6, "transform id 6"},
      {42, 1, 2, "entropy coder id 2"},
      {43, 1, 1, "reserved"},
      {48, 8, 123456, "raw bytes, the layer table implies"},
      {56, 8, 0, "stored size 0 is impossible"},
      {40 + 24 + 16, 8, 1u << 30, "impossible"},
  };
  for (const auto& c : cases) {
    auto t = bytes_;
    std::memcpy(t.data() + c1 + c.offset, &c.value, static_cast<size_t>(c.size));
    fix_chunk_crc(t, c1);
    expect_error([&] { deser(t); }, c.needle, "chunk offset " + std::to_string(c.offset));
  }
  // A flipped CRC alone.
  auto t = bytes_;
  t[c1 + 36] ^= 1;
  expect_error([&] { deser(t); }, "chunk 1: checksum mismatch");
}

TEST_F(ContainerCorruption, DecodedPositionsMustIncrease) {
  // One token per chunk: each positions stream is 4 raw bytes (stored: zstd cannot beat it).
  ent::ContainerOptions o;
  o.chunk_tokens = 1;
  auto t = ent::serialize(made_.cache, o);
  const size_t c0 = chunk_offset(t, 0), c1 = chunk_offset(t, 1);
  ASSERT_EQ(t[c1 + 42], 0) << "the positions stream of a one-token chunk is stored raw";
  const size_t pos1 = c1 + 40 + 7 * 24;
  const int32_t p0 = get_at<int32_t>(t, c0 + 40 + 7 * 24);
  auto u = t;
  put_at<int32_t>(u, pos1, p0);  // repeats the previous position
  fix_chunk_crc(u, c1);
  expect_error([&] { deser(u); }, "strictly increasing");
  u = t;
  put_at<int32_t>(u, c0 + 40 + 7 * 24, -5);
  fix_chunk_crc(u, c0);
  expect_error([&] { deser(u); }, "strictly increasing");
}

// The order rules of a set's positions, per format version (src/container/format.hpp): versions
// 1-3 hold one increasing run (pinned, coded, window); version 4 lets the pinned tokens (sinks,
// fp16 tier) sit anywhere, as long as no position is stored twice.
TEST(ContainerPositions, OrderRulesOfEachVersion) {
  using V = std::vector<int32_t>;
  auto ok = [](const V& coded, const V& window, int64_t pinned, uint16_t version) {
    try {
      ent::check_positions(coded, window, pinned, 0, 0, version);
      return true;
    } catch (const e8kv::Error&) {
      return false;
    }
  };
  // Sinks before everything: every version.
  for (uint16_t v = 1; v <= 4; ++v) EXPECT_TRUE(ok({4, 5, 9}, {0, 1, 10, 11}, 2, v)) << v;
  // A pinned token among the coded ones, or after the unpinned window tokens: version 4 only.
  EXPECT_FALSE(ok({4, 5, 9}, {0, 7, 10, 11}, 2, 3));
  EXPECT_TRUE(ok({4, 5, 9}, {0, 7, 10, 11}, 2, 4));
  EXPECT_FALSE(ok({}, {0, 12, 10, 11}, 2, 3));
  EXPECT_TRUE(ok({}, {0, 12, 10, 11}, 2, 4));
  // Version 4 still refuses: a pinned position stored twice (coded or in the window), pinned or
  // coded runs out of order, unpinned window tokens before the last coded one, negatives.
  EXPECT_FALSE(ok({4, 5, 9}, {0, 5, 10, 11}, 2, 4));
  EXPECT_FALSE(ok({4, 5, 9}, {0, 11, 10, 11}, 2, 4));
  EXPECT_FALSE(ok({4, 5, 9}, {7, 0, 10, 11}, 2, 4));
  EXPECT_FALSE(ok({5, 4, 9}, {0, 7, 10, 11}, 2, 4));
  EXPECT_FALSE(ok({4, 5, 9}, {0, 7, 8, 11}, 2, 4));
  EXPECT_FALSE(ok({4, 5, 9}, {-1, 7, 10, 11}, 2, 4));
}

// A version-4 container (fp16 tier: pinned tokens among the coded ones) relabelled as version 3
// is refused by the version-3 order rule, not read into a cache no version-3 writer made.
TEST(ContainerPositions, TieredCacheNeedsVersion4) {
  const Made m = make_cache("preset=quant-k3v2,fp16_tier=0.1,rope=pre", small_spec(2, 2, 4, 64, 120, 62), 0);
  auto bytes = ent::serialize(m.cache);
  ASSERT_EQ(ent::read_info(bytes.data(), bytes.size()).format_version, 4);
  expect_cache_eq(m.cache, deser(bytes));
  put_at<uint16_t>(bytes, 8, 3);
  fix_header_crc(bytes);
  expect_error([&] { deser(bytes); }, "strictly increasing");
}

// ---- the code tier (version 5) ----------------------------------------------------------------------

// A version-5 container: rvq3/e8p2 layers with an rvq4 code tier (uncentred: tier_center=0; a
// centred tier is version 6, whose record adds a factor count after the codec ids), 3 layers of
// which the first and last are fp16 (protect=1: no code tier there), shared positions.
class ContainerCodeTier : public ::testing::Test {
 protected:
  void SetUp() override {
    made_ = make_cache("preset=quant-k3v2,code_tier=0.2,protect=1,residual=4,flush=8,tier_center=0",
                       small_spec(3, 2, 4, 64, 80, 63), 5);
    const CacheLayout& L = made_.cache.layout();
    ASSERT_FALSE(L.layer_has_code_tier(0));
    ASSERT_TRUE(L.layer_has_code_tier(1));
    ASSERT_GT(made_.cache.tier_tokens(1), 2);
    ent::ContainerOptions o;
    o.chunk_tokens = 24;
    bytes_ = ent::serialize(made_.cache, o);
    ASSERT_EQ(ent::read_info(bytes_.data(), bytes_.size()).format_version, 5);
  }
  // The layer table's entry of layer l (version 5, one position set): 32 bytes, 24 per set, then
  // per head the mean lengths and means, and the version-2 fields.
  size_t entry_at(int l) const {
    size_t at = kLayoutAt + 128 + 2 * 3;
    for (int i = 0; i < l; ++i) {
      at += 32 + 24;
      for (const auto& hd : made_.cache.layer(i).heads)
        at += 4 + 2 * (hd.key_mean.size() + hd.value_mean.size()) + 8 + 2 * hd.key_channel_scale.size();
      for (const auto& e : made_.cache.layer(i).query_energy) at += 4 * e.size();
    }
    return at;
  }
  Made made_;
  std::vector<uint8_t> bytes_;
};

TEST_F(ContainerCodeTier, TheLayerTableSitsWhereTheFormatSays) {
  for (int l = 0; l < 3; ++l) {
    const size_t at = entry_at(l);
    EXPECT_EQ(get_at<uint64_t>(bytes_, at + 32), static_cast<uint64_t>(made_.cache.coded_tokens(l))) << l;
    EXPECT_EQ(get_at<uint64_t>(bytes_, at + 40), static_cast<uint64_t>(made_.cache.window_tokens(l))) << l;
    EXPECT_EQ(get_at<uint64_t>(bytes_, at + 48), static_cast<uint64_t>(made_.cache.tier_tokens(l))) << l;
  }
  EXPECT_EQ(bytes_[kLayoutAt + 58], 3) << "tier_key_codec rvq4 at offset 106";
  EXPECT_EQ(bytes_[kLayoutAt + 59], 3) << "tier_value_codec rvq4 at offset 107";
  EXPECT_EQ(get_at<uint32_t>(bytes_, chunk_offset(bytes_, 0) + 4), 11u) << "version-5 chunks hold 11 streams";
}

TEST_F(ContainerCodeTier, EveryTruncationIsRejected) {
  for (size_t n = 0; n < bytes_.size(); ++n) {
    std::vector<uint8_t> t(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      (void)ent::deserialize(t.data(), t.size());
      ADD_FAILURE() << "truncation to " << n << " bytes was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("too short") != std::string::npos ||
                  msg.find("header_bytes") != std::string::npos)
          << n << ": " << msg;
    }
  }
}

TEST_F(ContainerCodeTier, TierCodecIdsAreChecked) {
  struct Case {
    size_t offset;
    uint8_t value;
    const char* needle;
  };
  const Case cases[] = {
      {kLayoutAt + 58, 0,
       "layout tier_key_codec fp16 and tier_value_codec rvq4 are not accepted (accepted: both fp16 (0)"},
      {kLayoutAt + 59, 0, "layout tier_key_codec rvq4 and tier_value_codec fp16 are not accepted"},
      {kLayoutAt + 58, 12, "layout tier_key_codec 12 is not accepted (accepted: fp16 (0), e8p2 (1)"},
      {kLayoutAt + 59, 0xC8, "layout tier_value_codec 200 is not accepted"},
  };
  for (const auto& c : cases) {
    auto t = bytes_;
    t[c.offset] = c.value;
    fix_header_crc(t);
    expect_error([&] { deser(t); }, c.needle, "offset " + std::to_string(c.offset));
    expect_error([&] { ent::read_info(t.data(), t.size()); }, c.needle, "offset " + std::to_string(c.offset));
  }
  // Both 0: no code tier, so layer 1's tier tokens are in a layer without one.
  auto t = bytes_;
  t[kLayoutAt + 58] = t[kLayoutAt + 59] = 0;
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "layer 1 set 0: tier_tokens");
}

TEST_F(ContainerCodeTier, TierCountsOnlyInLayersWithACodeTier) {
  auto t = bytes_;
  put_at<uint64_t>(t, entry_at(0) + 48, 1);  // layer 0 is fp16: no code tier
  fix_header_crc(t);
  expect_error([&] { deser(t); },
               "layer 0 set 0: tier_tokens 1 in a layer without a code tier (tier codecs rvq4/rvq4, "
               "layer codecs fp16/fp16); accepted: 0");
  expect_error([&] { ent::deserialize_layer(t.data(), t.size(), 2); }, "tier_tokens 1");
  // A count that overflows the set.
  t = bytes_;
  put_at<uint64_t>(t, entry_at(1) + 48, uint64_t{1} << 31);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "(coded, window, tier) exceed");
  // One more tier token than the chunks hold: the chunks' raw sizes disagree with the table.
  t = bytes_;
  put_at<uint64_t>(t, entry_at(1) + 48, static_cast<uint64_t>(made_.cache.tier_tokens(1)) + 1);
  put_at<int64_t>(t, entry_at(1), made_.cache.layer(1).original_tokens + 1);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "the layer table implies");
}

// The writer refuses what the reader would: tier tokens in a layer without a code tier, tier
// codes or gains that disagree with the tier positions, tier positions out of order or stored
// twice.
TEST_F(ContainerCodeTier, WriterRefusesInconsistentTiers) {
  auto edit = [&](auto&& f) {
    CompressedKV c = made_.cache;
    f(e8kv::detail::CacheStorage::layer(c, 1), e8kv::detail::CacheStorage::layer(c, 0));
    return c;
  };
  expect_error([&] { ent::serialize(edit([](LayerData&, LayerData& l0) { l0.tier_positions[0].push_back(3); })); },
               "layer 0 set 0 has 1 code-tier tokens but the layer has no code tier");
  expect_error(
      [&] { ent::serialize(edit([](LayerData& l1, LayerData&) { l1.heads[1].tier_value_gains.pop_back(); })); },
      "layer 1 head 1: code-tier code or gain sizes disagree");
  expect_error(
      [&] { ent::serialize(edit([](LayerData& l1, LayerData&) { l1.heads[0].tier_key_codes.push_back(0); })); },
      "layer 1 head 0: code-tier");
  expect_error(
      [&] {
        ent::serialize(
            edit([](LayerData& l1, LayerData&) { std::swap(l1.tier_positions[0][0], l1.tier_positions[0][1]); }));
      },
      "code-tier positions of layer 1, set 0 are not >= 0 and strictly increasing");
  expect_error(
      [&] { ent::serialize(edit([](LayerData& l1, LayerData&) { l1.tier_positions[0][0] = l1.positions[0][0]; })); },
      "is both a code-tier token and a coded token");
  expect_error([&] { ent::serialize(edit([](LayerData& l1, LayerData&) { l1.tier_positions.resize(2); })); },
               "code-tier sets");
  // No tier sets at all reads as empty ones (layer 0 of a cache built by hand, say).
  const CompressedKV c = edit([](LayerData&, LayerData& l0) { l0.tier_positions.clear(); });
  const CompressedKV back = deser(ent::serialize(c));
  EXPECT_EQ(back.layer(0).tier_positions.size(), 1u) << "the reader builds one tier set per position set";
}

// Decoded tier positions: strictly increasing, >= 0, and disjoint from the set's coded and
// window positions, in full and partial reads. One token per chunk: each positions stream is 4
// raw bytes, stored.
TEST_F(ContainerCodeTier, DecodedTierPositionsAreChecked) {
  ent::ContainerOptions o;
  o.chunk_tokens = 1;
  const auto t = ent::serialize(made_.cache, o);
  const auto info = ent::read_info(t.data(), t.size());
  const auto& li = info.layers[1];
  const int64_t C = li.coded_tokens[0];
  ASSERT_GE(li.tier_tokens[0], 2);
  // Stored token i of layer 1 is its chunk first_chunk + i; its position is the 4 bytes after the
  // chunk's 40-byte header and 11 descriptors.
  auto pos_at = [&](int64_t stored) {
    const size_t c = chunk_offset(t, static_cast<size_t>(li.first_chunk + stored));
    EXPECT_EQ(t[c + 42], 0) << "the positions stream of a one-token chunk is stored raw";
    return std::pair<size_t, size_t>{c, c + 40 + 11 * 24};
  };
  const auto [c_tier0, tier0] = pos_at(C);
  const auto [c_tier1, tier1] = pos_at(C + 1);
  const auto [c_tier_last, tier_last] = pos_at(C + li.tier_tokens[0] - 1);
  const int64_t W0 = C + li.tier_tokens[0];  // the first window token: a pinned sink
  // Values that keep the tier ascending and repeat another position.
  struct Case {
    size_t chunk, at;
    int32_t value;
    const char* needle;
  };
  const Case cases[] = {
      {c_tier1, tier1, get_at<int32_t>(t, tier0),
       "code-tier positions of layer 1, set 0 are not >= 0 and strictly increasing"},
      {c_tier0, tier0, -3, "code-tier positions of layer 1, set 0 are not >= 0"},
      {c_tier0, tier0, get_at<int32_t>(t, pos_at(0).second), "is both a code-tier token and a coded token"},
      {c_tier0, tier0, get_at<int32_t>(t, pos_at(W0).second), "is both a code-tier token and a pinned window token"},
      {c_tier_last, tier_last, get_at<int32_t>(t, pos_at(W0 + li.window_tokens[0] - 1).second),
       "is both a code-tier token and a window token"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.needle);
    auto u = t;
    put_at<int32_t>(u, c.at, c.value);
    fix_chunk_crc(u, c.chunk);
    expect_error([&] { deser(u); }, c.needle);
    expect_error([&] { ent::deserialize_layer(u.data(), u.size(), 1); }, c.needle);
  }
  // A range holding both tier tokens finds the repeat too.
  auto u = t;
  put_at<int32_t>(u, tier1, get_at<int32_t>(t, tier0));
  fix_chunk_crc(u, c_tier1);
  expect_error([&] { ent::deserialize_tokens(u.data(), u.size(), 1, C, C + 2); }, "strictly increasing");
}

// Version-5 fields in an older container: a version-5 file relabelled 4, a version-4 file with a
// tier codec id, and a version-5 chunk with the seven streams of version 4.
TEST_F(ContainerCodeTier, Version5FieldsInOlderVersionsAreRejected) {
  auto t = bytes_;
  put_at<uint16_t>(t, 8, 4);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "layout reserved byte 58 (offset 106) must be 0 in format version 4, got 3");
  const Made v4 = make_cache("preset=quant-k3v2,fp16_tier=0.1", small_spec(2, 2, 4, 64, 80, 64));
  auto b4 = ent::serialize(v4.cache);
  ASSERT_EQ(ent::read_info(b4.data(), b4.size()).format_version, 4);
  b4[kLayoutAt + 59] = 3;
  fix_header_crc(b4);
  expect_error([&] { deser(b4); }, "layout reserved byte 59 (offset 107) must be 0 in format version 4");
  t = bytes_;
  const size_t c1 = chunk_offset(t, 1);
  put_at<uint32_t>(t, c1 + 4, 7);
  fix_chunk_crc(t, c1);
  expect_error([&] { deser(t); }, "chunk 1: 7 streams, expected 11");
  // A tier stream with the wrong kind id.
  t = bytes_;
  t[c1 + 40 + 7 * 24] = 10;
  fix_chunk_crc(t, c1);
  expect_error([&] { deser(t); }, "stream 7: kind 10, expected 9 (tier key codes)");
}

// A header whose layer table claims up to 2^20 tier tokens in a one-chunk layer (CRC
// recomputed) is refused before anything of that size is allocated, and the memory a read needs
// counts the tier's codes and gains.
TEST_F(ContainerCodeTier, TierCountLiesAreRejectedBeforeAllocating) {
  ent::ContainerOptions one_chunk;
  one_chunk.chunk_tokens = 1 << 20;
  const auto bytes = ent::serialize(made_.cache, one_chunk);
  for (uint64_t tier : {uint64_t{1} << 12, uint64_t{1} << 16, uint64_t{1} << 20}) {
    std::vector<uint8_t> t = bytes;
    put_at<int64_t>(t, entry_at(1), int64_t{1} << 40);  // original_tokens
    put_at<uint64_t>(t, entry_at(1) + 48, tier);
    fix_header_crc(t);
    std::string message;
    const size_t largest = largest_allocation([&] {
      try {
        read_everything(t, ent::DeserializeOptions{});
      } catch (const Error& e) {
        message = e.what();
      }
    });
    EXPECT_FALSE(message.empty()) << tier << " tier tokens were accepted";
    EXPECT_LE(largest, size_t{1} << 20) << tier << " tier tokens: allocated " << largest << " bytes (" << message
                                        << ")";
  }
}

// The decoded size a read is checked against counts every vector of the result, the tier's too.
TEST(ContainerLimits, DecodedBytesCountTheCodeTier) {
  const Made m = make_cache("preset=quant-k3v2,code_tier=0.6,residual=4", small_spec(2, 2, 4, 64, 400, 65));
  const CacheLayout& L = m.cache.layout();
  size_t data = 0, tier = 0;
  auto bytes_of = [](const auto& v) { return v.size() * sizeof(v[0]); };
  for (int l = 0; l < L.n_layers; ++l) {
    const auto& ld = m.cache.layer(l);
    for (const auto* sets : {&ld.positions, &ld.window_positions})
      for (const auto& p : *sets) data += bytes_of(p);
    for (const auto& h : ld.heads) {
      data += bytes_of(h.key_codes) + bytes_of(h.value_codes) + bytes_of(h.key_gains) + bytes_of(h.value_gains) +
              bytes_of(h.key_gain_codes) + bytes_of(h.value_gain_codes) + bytes_of(h.window_keys) +
              bytes_of(h.window_values) + bytes_of(h.key_mean) + bytes_of(h.value_mean) + bytes_of(h.key_channel_scale);
      tier += bytes_of(h.tier_key_codes) + bytes_of(h.tier_value_codes) + bytes_of(h.tier_key_gains) +
              bytes_of(h.tier_value_gains);
    }
    for (const auto& p : ld.tier_positions) tier += bytes_of(p);
  }
  ASSERT_GT(tier, data / 3) << "the test wants the tier to weigh";
  const auto bytes = ent::serialize(m.cache);
  const auto info = ent::read_info(bytes.data(), bytes.size());
  EXPECT_GE(info.decoded_bytes, ent::codecs_bytes(L) + data + tier);
  ent::DeserializeOptions o;
  o.max_decoded_bytes = info.decoded_bytes - 1;
  expect_error([&] { deser(bytes, o); }, "max_decoded_bytes");
}

TEST_F(ContainerCorruption, ZstdDamageWithoutChecksumsIsAnError) {
  // Find a zstd-coded stream and damage its frame header; checksums off.
  const size_t c0 = chunk_offset(bytes_, 0);
  size_t data = c0 + 40 + 7 * 24;
  for (int s = 0; s < 7; ++s) {
    const size_t desc = c0 + 40 + 24 * static_cast<size_t>(s);
    const uint64_t stored = get_at<uint64_t>(bytes_, desc + 16);
    if (bytes_[desc + 2] == 1) {
      ent::DeserializeOptions o;
      o.verify_checksums = false;
      auto t = bytes_;
      t[data] ^= 0xFF;  // zstd magic
      expect_error([&] { deser(t, o); }, "zstd");
      t = bytes_;
      t[data + stored - 1] ^= 0x5A;  // end of the frame
      EXPECT_THROW(deser(t, o), Error);
      return;
    }
    data += stored;
  }
  FAIL() << "no zstd stream in chunk 0";
}

}  // namespace
