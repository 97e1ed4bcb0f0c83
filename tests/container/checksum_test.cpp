// Tests of CRC-32C (include/e8kv/container/checksum.hpp): catalogue and RFC 3720 vectors, every
// implementation against the bitwise reference, extension across calls.
#include "e8kv/container/checksum.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "testing/test_util.hpp"

namespace {

namespace ent = e8kv::container;
using namespace e8kv;

TEST(Crc32c, CatalogueCheckValue) {
  const char* s = "123456789";  // CRC catalogue "check" input; CRC-32/ISCSI check = 0xE3069283
  EXPECT_EQ(ent::crc32c_bitwise(s, 9), 0xE3069283u);
  EXPECT_EQ(ent::crc32c_portable(s, 9), 0xE3069283u);
  EXPECT_EQ(ent::crc32c_hardware(s, 9), 0xE3069283u);
  EXPECT_EQ(ent::crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(ent::crc32c(s, 0), 0u);
}

TEST(Crc32c, Rfc3720Vectors) {
  // RFC 3720 (iSCSI), appendix B.4: CRC-32C of 32-byte patterns.
  uint8_t zeros[32] = {}, ones[32], inc[32], dec[32];
  for (int i = 0; i < 32; ++i) {
    ones[i] = 0xFF;
    inc[i] = static_cast<uint8_t>(i);
    dec[i] = static_cast<uint8_t>(31 - i);
  }
  for (auto fn : {&ent::crc32c_bitwise, &ent::crc32c_portable, &ent::crc32c_hardware}) {
    EXPECT_EQ(fn(zeros, 32, 0), 0x8A9136AAu);
    EXPECT_EQ(fn(ones, 32, 0), 0x62A8AB43u);
    EXPECT_EQ(fn(inc, 32, 0), 0x46DD794Eu);
    EXPECT_EQ(fn(dec, 32, 0), 0x113FDB5Cu);
  }
}

TEST(Crc32c, LongBuffersUseTheInterleavedPathCorrectly) {
  // The hardware path runs three streams over 3 × 4096-byte blocks and combines them.
  auto rng = test::seeded_rng(3721);
  std::vector<uint8_t> data(110000);
  for (auto& x : data) x = static_cast<uint8_t>(rng());
  for (size_t start : {size_t{0}, size_t{1}, size_t{5}})
    for (size_t n : {size_t{12287}, size_t{12288}, size_t{12289}, size_t{24576 + 7}, size_t{100000}}) {
      const uint32_t ref = ent::crc32c_portable(data.data() + start, n);
      EXPECT_EQ(ent::crc32c_hardware(data.data() + start, n), ref) << start << " " << n;
      EXPECT_EQ(ent::crc32c(data.data() + start + 777, n - 777, ent::crc32c(data.data() + start, 777)), ref);
    }
  EXPECT_EQ(ent::crc32c_bitwise(data.data(), 30000), ent::crc32c_hardware(data.data(), 30000));
}

TEST(Crc32c, ImplementationsAgreeAndExtend) {
  auto rng = test::seeded_rng(3720);
  std::vector<uint8_t> data(1200);
  for (auto& x : data) x = static_cast<uint8_t>(rng());
  for (size_t start = 0; start < 9; ++start)
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{64}, size_t{65},
                     size_t{1000}}) {
      const uint8_t* p = data.data() + start;
      const uint32_t ref = ent::crc32c_bitwise(p, n);
      EXPECT_EQ(ent::crc32c_portable(p, n), ref) << start << " " << n;
      EXPECT_EQ(ent::crc32c_hardware(p, n), ref) << start << " " << n;
      for (size_t cut : {size_t{0}, n / 3, n}) {
        EXPECT_EQ(ent::crc32c(p + cut, n - cut, ent::crc32c(p, cut)), ref);
        EXPECT_EQ(ent::crc32c_portable(p + cut, n - cut, ent::crc32c_bitwise(p, cut)), ref);
      }
    }
}

}  // namespace
