// keep_positions (compressed_kv.hpp): a cache cut to a position range keeps exactly the stored
// tokens inside it, decoding to the same floats, through the container and on to later appends.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "testing/kv_fixture.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv;
using namespace e8kv::testkit;

// What decompress_head of `all` gives for the positions in [begin, end).
CompactHead within(const CompactHead& all, int64_t begin, int64_t end, size_t d) {
  CompactHead want;
  for (size_t i = 0; i < all.positions.size(); ++i) {
    if (all.positions[i] < begin || all.positions[i] >= end) continue;
    want.positions.push_back(all.positions[i]);
    want.keys.insert(want.keys.end(), all.keys.begin() + i * d, all.keys.begin() + (i + 1) * d);
    want.values.insert(want.values.end(), all.values.begin() + i * d, all.values.begin() + (i + 1) * d);
  }
  return want;
}

// A compressed prompt of 300 tokens and 20 appended ones (positions 0..319), cut to its first
// `end` tokens, for the fixed-rate, tiered, evicting, per-head and lossless configurations: what
// stays decodes to the same floats, original_tokens becomes the tokens kept given (0..end-1),
// the cut cache round-trips through the container and takes the next position's append. Per-head
// sets whose pinned counts would diverge are refused, the cache unchanged.
TEST(KeepPositions, TailCutKeepsTheFirstTokens) {
  const auto spec = seeded_spec(181, 300, "keep_positions");
  Fixture f(spec);
  const int H = spec.n_kv_heads, d = spec.head_dim;
  const std::vector<const char*> all = {"preset=quant-k3v2",
                                        "preset=quant-k3v2,residual=8",
                                        "preset=tier-k3v2",
                                        "preset=quant-k2v2,fp16_tier=0.05",
                                        "preset=high",
                                        "preset=lossless",
                                        "preset=high,per_head=1,fp16_tier=0.05"};
  const std::vector<const char*> some = {all[0], all[2], all[6]};
  const std::vector<int64_t> all_cuts = {1, 64, 151, 300, 305, 319, 320, 1000}, some_cuts = {64, 305};
  int cut_count = 0, refused = 0;
  for (const char* spec_string : e8kv::test::kUnderSanitizer ? some : all) {
    SCOPED_TRACE(spec_string);
    KVCompressor c(f.shape, Config::parse(spec_string));
    CompressedKV cache = c.compress(f.seq, &f.queries);
    for (int t = 0; t < 20; ++t)
      for (int l = 0; l < spec.n_layers; ++l)
        c.append(cache, l, &f.data.keys[l][static_cast<size_t>(t) * H * d],
                 &f.data.values[l][static_cast<size_t>(t) * H * d], spec.tokens + t);
    for (int64_t end : e8kv::test::kUnderSanitizer ? some_cuts : all_cuts) {
      SCOPED_TRACE("keep [0, " + std::to_string(end) + ")");
      CompressedKV copy = cache;
      const auto before = container::serialize(copy);
      try {
        keep_positions(copy, 0, end);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("one pinned count per layer"), std::string::npos) << e.what();
        EXPECT_EQ(container::serialize(copy), before);
        ++refused;
        continue;
      }
      ++cut_count;
      for (int l = 0; l < spec.n_layers; ++l)
        for (int h = 0; h < H; ++h) {
          const CompactHead kept = copy.decompress_head(l, h);
          const CompactHead want = within(cache.decompress_head(l, h), 0, end, static_cast<size_t>(d));
          ASSERT_EQ(kept.positions, want.positions) << "layer " << l << " head " << h;
          ASSERT_EQ(kept.keys, want.keys);
          ASSERT_EQ(kept.values, want.values);
        }
      EXPECT_EQ(copy.original_tokens(), std::min<int64_t>(end, cache.original_tokens()));
      EXPECT_LE(copy.resident_bytes(), cache.resident_bytes());
      const auto bytes = container::serialize(copy);
      EXPECT_EQ(container::serialize(container::deserialize(bytes.data(), bytes.size())), bytes);
      // The next position's token goes on after the cut (nothing stored at or past `end`).
      const int32_t next = static_cast<int32_t>(std::min<int64_t>(end, spec.tokens + 20));
      for (int l = 0; l < spec.n_layers; ++l)
        c.append(copy, l, &f.data.keys[l][0], &f.data.values[l][0], next);
      EXPECT_EQ(copy.stored_positions(0).back(), next);
    }
  }
  EXPECT_GE(cut_count, e8kv::test::kUnderSanitizer ? 4 : 40);
  std::printf("keep_positions tail cuts: %d applied, %d refused (per-head sets with different pinned counts)\n",
              cut_count, refused);
}

// A range cut on both sides is the two one-sided cuts one after the other; a reversed range and a
// default-constructed cache are refused by name; the empty range leaves an empty, usable cache.
TEST(KeepPositions, RangeIsBothCutsAndBadInputIsRefused) {
  const auto spec = seeded_spec(182, 300, "keep_positions");
  Fixture f(spec);
  KVCompressor c(f.shape, Config::parse("preset=quant-k3v2,residual=16"));
  const CompressedKV cache = c.compress(f.seq, &f.queries);
  CompressedKV both = cache, one_then_other = cache;
  keep_positions(both, 40, 250);
  keep_positions(one_then_other, 0, 250);
  c.drop_before(one_then_other, 40);
  EXPECT_EQ(container::serialize(both), container::serialize(one_then_other));
  for (int h = 0; h < spec.n_kv_heads; ++h)
    EXPECT_EQ(both.decompress_head(1, h).positions, within(cache.decompress_head(1, h), 40, 250, 64).positions);

  CompressedKV copy = cache;
  try {
    keep_positions(copy, 10, 5);
    ADD_FAILURE() << "a reversed range was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reversed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(container::serialize(copy), container::serialize(cache));
  CompressedKV none;
  EXPECT_THROW(keep_positions(none, 0, 10), Error);

  CompressedKV empty = cache;
  keep_positions(empty, 0, 0);
  EXPECT_EQ(empty.stored_tokens(0), 0);
  EXPECT_EQ(empty.original_tokens(), 0);
  c.append(empty, 0, &f.data.keys[0][0], &f.data.values[0][0], 0);
  EXPECT_EQ(empty.stored_positions(0), std::vector<int32_t>{0});
}

}  // namespace
