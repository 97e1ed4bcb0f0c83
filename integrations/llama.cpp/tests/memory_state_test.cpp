// The memory state's bytes (memory_state.hpp) on synthetic caches: written and parsed back byte
// for byte; every truncation and a flipped byte in each record refused by name; the containers'
// positions checked against the record's; a cut on the bytes equal to keep_positions on the cache.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "e8kv/llama_cpp/memory_state.hpp"
#include "testing/kv_fixture.hpp"

namespace e8kv::llama_cpp {
namespace {

using testkit::Fixture;

struct OneSequence {
  Fixture fixture;
  CompressedKV cache;
  MemoryState state;
};

OneSequence make_state(uint64_t seed) {
  const synth::SyntheticSpec spec = testkit::seeded_spec(seed, 160, "memory state");
  OneSequence o{Fixture(spec), {}, {}};
  o.cache = KVCompressor(o.fixture.shape, Config::parse("preset=quant-k3v2")).compress(o.fixture.seq, &o.fixture.queries);
  MemorySequence s;
  s.id = 0;
  s.pos_min = 0;
  s.pos_max = spec.tokens - 1;
  s.groups.push_back(container::serialize(o.cache));
  o.state.sequences.push_back(s);
  return o;
}

std::string error_of(const std::vector<uint8_t>& b) {
  try {
    check_memory_state(parse_memory_state(b.data(), b.size()));
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST(MemoryState, RoundTripsAndRefusesDamage) {
  const OneSequence o = make_state(191);
  const std::vector<uint8_t> bytes = write_memory_state(o.state);
  ASSERT_TRUE(is_memory_state(bytes.data(), bytes.size()));
  EXPECT_EQ(write_memory_state(parse_memory_state(bytes.data(), bytes.size())), bytes);
  EXPECT_EQ(error_of(bytes), "");
  // Every truncation inside the header and the record, and a sample of those inside the container.
  for (size_t n = 0; n < bytes.size(); n += n < 64 ? 1 : 997) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_NE(error_of(cut), "") << "accepted at " << n << " of " << bytes.size() << " bytes";
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_NE(error_of(longer).find("follow the last sequence"), std::string::npos) << error_of(longer);
  for (size_t at : {size_t{4}, size_t{12}, size_t{20}, size_t{28}, size_t{40}, bytes.size() / 2, bytes.size() - 1}) {
    std::vector<uint8_t> bad = bytes;
    bad[at] ^= 0x10;
    EXPECT_NE(error_of(bad), "") << "a flipped byte at " << at << " was accepted";
  }
  MemoryState outside = o.state;
  outside.sequences[0].pos_max = 100;  // the container stores positions up to 159
  const auto w = write_memory_state(outside);
  EXPECT_NE(error_of(w).find("stores 0..159"), std::string::npos) << error_of(w);
  EXPECT_NE(error_of({0x45, 0x38, 0x4b, 0x4e}).find("E8KM"), std::string::npos);
}

TEST(MemoryState, CutOnTheBytesIsKeepPositionsOnTheCache) {
  const OneSequence o = make_state(192);
  const MemoryState cut = cut_memory_state(o.state, 100);
  EXPECT_EQ(cut.sequences[0].pos_max, 99);
  CompressedKV want = o.cache;
  keep_positions(want, 0, 100);
  EXPECT_EQ(cut.sequences[0].groups[0], container::serialize(want));
  EXPECT_EQ(error_of(write_memory_state(cut)), "");
  EXPECT_THROW(cut_memory_state(o.state, 0), Error);
  EXPECT_THROW(cut_memory_state(o.state, 161), Error);
  MemoryState two_groups = o.state;
  two_groups.sequences[0].groups.push_back(two_groups.sequences[0].groups[0]);
  try {
    cut_memory_state(two_groups, 100);
    ADD_FAILURE() << "a two-group state was cut";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding-window"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace e8kv::llama_cpp
