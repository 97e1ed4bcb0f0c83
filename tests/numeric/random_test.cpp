// Tests of the counter-based generator: published SplitMix64 outputs, agreement with a sequential
// SplitMix64 written here from its definition, determinism, distinctness and bit balance.
#include <gtest/gtest.h>

#include <algorithm>
#include <bitset>
#include <cmath>
#include <cstdint>
#include <unordered_set>
#include <vector>

#include "e8kv/numeric/random.hpp"
#include "testing/test_util.hpp"

namespace {
using e8kv::derive_seed;
using e8kv::random_bits;
using e8kv::splitmix64;

/// Sequential SplitMix64 (Steele, Lea & Flood 2014): state += golden gamma, then the finalizer.
class SequentialSplitMix64 {
 public:
  explicit SequentialSplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

TEST(Random, PublishedSplitMix64OutputsForSeedZero) {
  // The first outputs of SplitMix64 seeded with 0, as listed by the reference implementation's
  // users (e.g. the xoshiro seeding examples and Java's SplittableRandom).
  const uint64_t expected[] = {0xE220A8397B1DCDAFull, 0x6E789E6AA1B965F4ull, 0x06C45D188009454Full,
                               0xF88BB8A8724C81ECull};
  for (uint64_t k = 0; k < 4; ++k) EXPECT_EQ(random_bits(0, k), expected[k]) << k;
  EXPECT_EQ(splitmix64(0), expected[0]);
  static_assert(splitmix64(0) == 0xE220A8397B1DCDAFull, "usable in constant expressions");
  static_assert(random_bits(0, 1) == 0x6E789E6AA1B965F4ull);
}

TEST(Random, RandomBitsIsTheCounterthOutputOfSequentialSplitMix) {
  auto rng = e8kv::test::seeded_rng(20240601);
  std::vector<uint64_t> seeds = {0, 1, 42, ~0ull, 0x8000000000000000ull};
  for (int i = 0; i < 5; ++i) seeds.push_back(rng());
  for (uint64_t seed : seeds) {
    SequentialSplitMix64 gen(seed);
    for (uint64_t k = 0; k < 2000; ++k) ASSERT_EQ(random_bits(seed, k), gen.next()) << seed << " " << k;
  }
  // splitmix64(x) is one step from state x.
  for (uint64_t seed : seeds) EXPECT_EQ(splitmix64(seed), SequentialSplitMix64(seed).next());
}

TEST(Random, DeterministicAndOrderIndependent) {
  std::vector<uint64_t> forward, backward;
  for (uint64_t k = 0; k < 1000; ++k) forward.push_back(random_bits(7, k));
  for (uint64_t k = 1000; k-- > 0;) backward.push_back(random_bits(7, k));
  std::reverse(backward.begin(), backward.end());
  EXPECT_EQ(forward, backward);
  EXPECT_EQ(derive_seed(1, 2, 3), derive_seed(1, 2, 3));
  EXPECT_EQ(derive_seed(1, 2), derive_seed(1, 2, 0));
}

TEST(Random, DerivedSeedsMatchTheirDefinitionAndDiffer) {
  // derive_seed(base, a, b) = splitmix64(splitmix64(splitmix64(base) ^ a) ^ b), written out with
  // the sequential generator.
  auto one_step = [](uint64_t x) { return SequentialSplitMix64(x).next(); };
  for (uint64_t base : {0ull, 1ull, 0xdeadbeefull})
    for (uint64_t a : {0ull, 5ull})
      for (uint64_t b : {0ull, 9ull})
        EXPECT_EQ(derive_seed(base, a, b), one_step(one_step(one_step(base) ^ a) ^ b));

  // Per-layer / per-head seeds: all distinct for 256 layers x 256 heads and for 4 bases.
  std::unordered_set<uint64_t> seen;
  for (uint64_t base : {0ull, 1ull, 2ull, 0x123456789ull})
    for (uint64_t layer = 0; layer < 256; ++layer)
      for (uint64_t head = 0; head < 256; ++head) seen.insert(derive_seed(base, layer, head));
  EXPECT_EQ(seen.size(), 4u * 256u * 256u);
  // Argument order matters.
  for (uint64_t a = 0; a < 100; ++a)
    for (uint64_t b = a + 1; b < 100; ++b) ASSERT_NE(derive_seed(3, a, b), derive_seed(3, b, a));
}

TEST(Random, DifferentCountersAndSeedsGiveDifferentBits) {
  std::unordered_set<uint64_t> seen;
  for (uint64_t seed : {0ull, 1ull, 2ull, 3ull})
    for (uint64_t k = 0; k < 50000; ++k) seen.insert(random_bits(seed, k));
  EXPECT_EQ(seen.size(), 4u * 50000u);
  // splitmix64 is a bijection: no collisions among consecutive inputs.
  std::unordered_set<uint64_t> images;
  for (uint64_t x = 0; x < 100000; ++x) images.insert(splitmix64(x));
  EXPECT_EQ(images.size(), 100000u);
}

TEST(Random, BitsAreBalancedAndAvalanche) {
  const int n = 100000;
  std::vector<int> ones(64, 0);
  double popcount_sum = 0;
  for (int k = 0; k < n; ++k) {
    const uint64_t r = random_bits(0x5eed, static_cast<uint64_t>(k));
    for (int b = 0; b < 64; ++b) ones[static_cast<size_t>(b)] += static_cast<int>((r >> b) & 1u);
    popcount_sum += static_cast<double>(std::bitset<64>(r).count());
  }
  // Each bit: frequency 1/2 with standard deviation 0.5/sqrt(n) = 0.0016; allow 6 sigma.
  for (int b = 0; b < 64; ++b) EXPECT_NEAR(ones[static_cast<size_t>(b)] / double(n), 0.5, 0.0095) << "bit " << b;
  EXPECT_NEAR(popcount_sum / n, 32.0, 0.12);  // sd of the mean: 4/sqrt(n) = 0.013

  // Flipping one bit of the counter or of the seed changes about half of the output bits.
  double flipped = 0;
  int trials = 0;
  for (uint64_t k = 0; k < 2000; ++k)
    for (int b = 0; b < 64; b += 7) {
      flipped += static_cast<double>(std::bitset<64>(random_bits(11, k) ^ random_bits(11, k ^ (1ull << b))).count());
      flipped += static_cast<double>(std::bitset<64>(random_bits(11, k) ^ random_bits(11 ^ (1ull << b), k)).count());
      trials += 2;
    }
  EXPECT_NEAR(flipped / trials, 32.0, 0.5);
}

TEST(Random, UnitDoublesAndSigns) {
  EXPECT_EQ(e8kv::bits_to_unit_double(0), 0.0);
  EXPECT_LT(e8kv::bits_to_unit_double(~0ull), 1.0);
  EXPECT_EQ(e8kv::bits_to_unit_double(1ull << 63), 0.5);
  double sum = 0;
  const int n = 100000;
  for (int k = 0; k < n; ++k) {
    const double u = e8kv::bits_to_unit_double(random_bits(99, static_cast<uint64_t>(k)));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.006);  // sd 0.29/sqrt(n) = 0.0009

  int plus = 0;
  for (uint64_t i = 0; i < 64 * 1000; ++i) {
    const float s = e8kv::random_sign(5, i);
    ASSERT_TRUE(s == 1.0f || s == -1.0f);
    ASSERT_EQ(s < 0, ((random_bits(5, i / 64) >> (i % 64)) & 1u) == 1u);
    plus += s > 0;
  }
  EXPECT_NEAR(plus / 64000.0, 0.5, 0.012);
}

}  // namespace
