// The host table decoders (codebook/host_decode.hpp) give the floats of Code::decode times the
// gain bit for bit: every E8P index, every Rvq3 index, and random Rvq4 indices, at several gains.
#include "e8kv/codebook/host_decode.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "e8kv/numeric/half.hpp"
#include "e8kv/quant/vector_quantizer.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv::codebook;

template <class Code>
bool same_bits(uint32_t index, float gain) {
  float ref[8], fast[8];
  Code::decode(index, ref);
  for (float& v : ref) v = gain * v;
  host_decode::decode_scaled_block<Code>(index, gain, fast);
  return std::memcmp(ref, fast, sizeof ref) == 0;
}

constexpr float kGains[] = {1.0f, 0.3337f, 7.25f, 0.f};

TEST(HostDecode, E8pEveryIndex) {
  for (float g : kGains)
    for (uint32_t i = 0; i < (1u << 16); ++i) ASSERT_TRUE(same_bits<E8P>(i, g)) << "index " << i << " gain " << g;
}

TEST(HostDecode, Rvq3EveryIndex) {
  for (uint32_t i = 0; i < (1u << 24); ++i) ASSERT_TRUE(same_bits<Rvq3>(i, 1.0f)) << "index " << i;
  for (uint32_t i = 0; i < (1u << 24); i += 97) ASSERT_TRUE(same_bits<Rvq3>(i, 0.3337f)) << "index " << i;
}

TEST(HostDecode, Rvq4RandomIndices) {
  auto rng = e8kv::test::seeded_rng(20261130);
  for (int n = 0; n < 2000000; ++n) {
    const auto i = static_cast<uint32_t>(rng());
    ASSERT_TRUE(same_bits<Rvq4>(i, kGains[n & 3])) << "index " << i;
  }
}

// decode_vector (which takes the table path on the host) equals the block-by-block definition.
TEST(HostDecode, DecodeVectorMatchesBlockDefinition) {
  auto rng = e8kv::test::seeded_rng(7);
  uint8_t codes[16 * 4];
  for (auto& b : codes) b = static_cast<uint8_t>(rng());
  const uint16_t gain_bits = e8kv::float_to_fp16_bits(1.75f);
  float fast[128], ref[128];
  e8kv::quant::decode_vector<Rvq4>(codes, gain_bits, 128, fast);
  for (int j = 0; j < 16; ++j) {
    float q[8];
    Rvq4::decode(e8kv::quant::detail::load_index(codes + 4 * j, 4), q);
    for (int i = 0; i < 8; ++i) ref[8 * j + i] = 1.75f * q[i];
  }
  EXPECT_EQ(std::memcmp(fast, ref, sizeof ref), 0);
}

}  // namespace
