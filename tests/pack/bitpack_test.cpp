// Tests of fixed-width bit packing: exact round trips for every width, golden byte layouts
// computed by hand, agreement with a bit-by-bit reference packer, random access, no access
// past the stream (guard page), and argument checking of the host wrappers.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "e8kv/pack/bitpack.hpp"
#include "testing/test_util.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace {
using e8kv::pack::pack_bits;
using e8kv::pack::pack_bits_checked;
using e8kv::pack::packed_bytes;
using e8kv::pack::unpack_bits;
using e8kv::pack::unpack_bits_checked;
using e8kv::pack::unpack_one;

const size_t kCounts[] = {0, 1, 2, 3, 7, 8, 9, 31, 33, 1000, 100003};

uint32_t width_mask(int w) { return w == 32 ? 0xffffffffu : ((1u << w) - 1u); }

std::vector<uint32_t> random_values(std::mt19937_64& rng, size_t n, int w) {
  std::vector<uint32_t> v(n);
  for (auto& x : v) x = static_cast<uint32_t>(rng()) & width_mask(w);
  // Make the extreme values appear too.
  if (n > 0) v[0] = width_mask(w);
  if (n > 1) v[n - 1] = width_mask(w);
  if (n > 2) v[1] = 0;
  return v;
}

// Independent reference: sets stream bit i*w + b for every set bit b of value i.
std::vector<uint8_t> reference_pack(const std::vector<uint32_t>& v, int w) {
  std::vector<uint8_t> out((v.size() * w + 7) / 8, 0);
  for (size_t i = 0; i < v.size(); ++i)
    for (int b = 0; b < w; ++b)
      if ((v[i] >> b) & 1u) {
        const size_t bit = i * w + b;
        out[bit / 8] = static_cast<uint8_t>(out[bit / 8] | (1u << (bit % 8)));
      }
  return out;
}

TEST(BitPack, PackedBytes) {
  EXPECT_EQ(packed_bytes(0, 7), 0u);
  EXPECT_EQ(packed_bytes(1, 1), 1u);
  EXPECT_EQ(packed_bytes(8, 1), 1u);
  EXPECT_EQ(packed_bytes(9, 1), 2u);
  EXPECT_EQ(packed_bytes(3, 3), 2u);   // 9 bits
  EXPECT_EQ(packed_bytes(2, 12), 3u);  // 24 bits
  EXPECT_EQ(packed_bytes(3, 32), 12u);
  EXPECT_EQ(packed_bytes(5, 17), 11u);  // 85 bits
  static_assert(packed_bytes(100003, 24) == 300009, "constexpr");
}

TEST(BitPack, RoundTripAllWidthsAndCounts) {
  auto rng = e8kv::test::seeded_rng(20240601);
  for (int w = 1; w <= 32; ++w) {
    for (size_t n : kCounts) {
      const auto values = random_values(rng, n, w);
      // Exactly packed_bytes bytes on the heap, so ASan builds catch any overrun.
      std::vector<uint8_t> packed(packed_bytes(n, w));
      pack_bits(values.data(), n, w, packed.data());
      ASSERT_EQ(packed, reference_pack(values, w)) << "w=" << w << " n=" << n;
      std::vector<uint32_t> back(n, 0xa5a5a5a5u);
      unpack_bits(packed.data(), n, w, back.data());
      ASSERT_EQ(back, values) << "w=" << w << " n=" << n;
    }
  }
}

TEST(BitPack, GoldenLayouts) {
  struct Case {
    int w;
    std::vector<uint32_t> values;
    std::vector<uint8_t> bytes;
  };
  // Computed by hand from the layout rule (bit 0 = LSB of byte 0, value LSB first).
  const Case cases[] = {
      {3, {5, 3, 7, 1}, {0xDD, 0x03}},
      {4, {0x1, 0x2, 0x3}, {0x21, 0x03}},
      {12, {0xABC, 0x123}, {0xBC, 0x3A, 0x12}},
      {32, {0xDEADBEEF}, {0xEF, 0xBE, 0xAD, 0xDE}},
      {1, {1, 0, 1, 1, 0, 0, 0, 0, 1}, {0x0D, 0x01}},
      {24, {0x010203, 0xA0B0C0}, {0x03, 0x02, 0x01, 0xC0, 0xB0, 0xA0}},
      {17, {0x1FFFF, 0}, {0xFF, 0xFF, 0x01, 0x00, 0x00}},
      {16, {0x1234, 0xABCD, 0x00FF}, {0x34, 0x12, 0xCD, 0xAB, 0xFF, 0x00}},
  };
  for (const auto& c : cases) {
    std::vector<uint8_t> out(packed_bytes(c.values.size(), c.w), 0x77);
    ASSERT_EQ(out.size(), c.bytes.size()) << "w=" << c.w;
    pack_bits(c.values.data(), c.values.size(), c.w, out.data());
    EXPECT_EQ(out, c.bytes) << "w=" << c.w;
    for (size_t i = 0; i < c.values.size(); ++i) EXPECT_EQ(unpack_one(c.bytes.data(), i, c.w), c.values[i]);
  }
}

TEST(BitPack, RandomAccessEqualsBulk) {
  auto rng = e8kv::test::seeded_rng(7);
  for (int w = 1; w <= 32; ++w) {
    const size_t n = 1000 + static_cast<size_t>(w);
    const auto values = random_values(rng, n, w);
    std::vector<uint8_t> packed(packed_bytes(n, w));
    pack_bits(values.data(), n, w, packed.data());
    std::vector<uint32_t> bulk(n);
    unpack_bits(packed.data(), n, w, bulk.data());
    std::uniform_int_distribution<size_t> pick(0, n - 1);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(unpack_one(packed.data(), i, w), bulk[i]) << "w=" << w << " i=" << i;
    for (int t = 0; t < 200; ++t) {
      const size_t i = pick(rng);
      ASSERT_EQ(unpack_one(packed.data(), i, w), values[i]);
    }
  }
}

TEST(BitPack, UncheckedPackKeepsLowBits) {
  const uint32_t values[3] = {0xFFu, 0x10u, 0xFFFFFFFFu};
  uint8_t out[2] = {0, 0};
  pack_bits(values, 3, 4, out);  // low nibbles: F, 0, F
  EXPECT_EQ(out[0], 0x0F);
  EXPECT_EQ(out[1], 0x0F);
  // Invalid widths write and read nothing.
  uint8_t untouched[4] = {1, 2, 3, 4};
  pack_bits(values, 3, 0, untouched);
  pack_bits(values, 3, 33, untouched);
  EXPECT_EQ(untouched[0], 1);
  EXPECT_EQ(unpack_one(untouched, 0, 0), 0u);
  uint32_t sink[3] = {9, 9, 9};
  unpack_bits(untouched, 3, 40, sink);
  EXPECT_EQ(sink[0], 9u);
}

TEST(BitPack, CheckedWrapperRejectsBadArguments) {
  const uint32_t ok[2] = {3, 1};
  uint8_t out[8] = {0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55};
  EXPECT_THROW(pack_bits_checked(ok, 2, 0, out), e8kv::Error);
  EXPECT_THROW(pack_bits_checked(ok, 2, 33, out), e8kv::Error);
  EXPECT_THROW(pack_bits_checked(ok, 2, -1, out), e8kv::Error);
  EXPECT_THROW(pack_bits_checked(nullptr, 2, 4, out), e8kv::Error);
  EXPECT_THROW(pack_bits_checked(ok, 2, 4, nullptr), e8kv::Error);
  EXPECT_NO_THROW(pack_bits_checked(nullptr, 0, 4, nullptr));
  for (int w = 1; w < 32; ++w) {
    const uint32_t bad[3] = {0, (1u << w) - 1u, 1u << w};  // the last one does not fit
    EXPECT_THROW(pack_bits_checked(bad, 3, w, out), e8kv::Error) << "w=" << w;
    EXPECT_NO_THROW(pack_bits_checked(bad, 2, w, out)) << "w=" << w;
  }
  // Nothing is written when it throws.
  uint8_t fresh[4] = {0x55, 0x55, 0x55, 0x55};
  const uint32_t bad[2] = {1, 4};
  try {
    pack_bits_checked(bad, 2, 2, fresh);
    FAIL() << "expected an exception";
  } catch (const e8kv::Error& e) {
    EXPECT_NE(std::string(e.what()).find("values[1]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fresh[0], 0x55);
  const uint32_t full[1] = {0xFFFFFFFFu};
  EXPECT_NO_THROW(pack_bits_checked(full, 1, 32, out));
  EXPECT_EQ(out[0], 0xFF);
  EXPECT_EQ(out[3], 0xFF);

  uint32_t back[2];
  EXPECT_THROW(unpack_bits_checked(out, 2, 0, back), e8kv::Error);
  EXPECT_THROW(unpack_bits_checked(nullptr, 2, 4, back), e8kv::Error);
  uint8_t packed[1] = {0x13};
  unpack_bits_checked(packed, 2, 4, back);
  EXPECT_EQ(back[0], 3u);
  EXPECT_EQ(back[1], 1u);
}

#if defined(__linux__)
// The stream ends exactly at a page that is mapped PROT_NONE: any read or write past
// packed_bytes(count, width) crashes the test. Works without sanitizers.
TEST(BitPack, NoAccessPastTheStreamGuardPage) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* mem = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  uint8_t* base = static_cast<uint8_t*>(mem);
  ASSERT_EQ(mprotect(base + page, page, PROT_NONE), 0);
  auto rng = e8kv::test::seeded_rng(99);
  for (int w = 1; w <= 32; ++w) {
    for (size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{9}, size_t{31}, size_t{33}, size_t{1000}}) {
      const size_t bytes = packed_bytes(n, w);
      ASSERT_LE(bytes, page);
      uint8_t* stream = base + page - bytes;  // last byte of the stream is the last mapped byte
      const auto values = random_values(rng, n, w);
      pack_bits(values.data(), n, w, stream);
      std::vector<uint32_t> back(n);
      unpack_bits(stream, n, w, back.data());
      ASSERT_EQ(back, values) << "w=" << w << " n=" << n;
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(unpack_one(stream, i, w), values[i]);
    }
  }
  munmap(mem, 2 * page);
}
#endif

TEST(BitPack, WritesExactlyPackedBytes) {
  auto rng = e8kv::test::seeded_rng(3);
  for (int w = 1; w <= 32; ++w) {
    for (size_t n : {size_t{1}, size_t{5}, size_t{33}, size_t{257}}) {
      const size_t bytes = packed_bytes(n, w);
      std::vector<uint8_t> buf(bytes + 16, 0xCC);
      const auto values = random_values(rng, n, w);
      pack_bits(values.data(), n, w, buf.data());
      for (size_t k = bytes; k < buf.size(); ++k) ASSERT_EQ(buf[k], 0xCC) << "w=" << w << " n=" << n;
      // Unused high bits of the last byte are zero.
      const int used = static_cast<int>((n * w) % 8);
      if (used) {
        ASSERT_EQ(buf[bytes - 1] >> used, 0) << "w=" << w << " n=" << n;
      }
    }
  }
}

}  // namespace
