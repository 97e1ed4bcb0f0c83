// The batch fp16 conversions of src/detail/fp16_batch.* (F16C where the CPU has it) give the bits
// of numeric/half.hpp's integer definitions (signalling fp16 NaNs come back quiet from F16C): every
// fp16 pattern to float, and float to fp16 over
// every float whose low bits are near an fp16 rounding boundary plus a strided sweep of all 2^32
// patterns (NaNs, infinities, subnormals, overflow included); odd lengths reach the scalar tail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "detail/fp16_batch.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/half.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv;

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

TEST(Fp16Batch, EveryHalfPatternToFloat) {
  if (!cpu_has_avx2_fma()) std::printf("[ SKIPPED  ] no F16C here: the batch form is the scalar definition\n");
  std::vector<uint16_t> h(65536 + 3);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> want(h.size()), got(h.size());
  fp16_bits_to_floats(h.data(), want.data(), h.size());
  detail::fp16_bits_to_floats_batch(h.data(), got.data(), h.size());
  int signalling = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    const uint16_t b = h[i];
    if ((b & 0x7C00u) == 0x7C00u && (b & 0x3FFu) != 0 && (b & 0x200u) == 0) {
      // A signalling fp16 NaN: vcvtph2ps returns it quieted (the integer definition keeps the
      // payload as is); still a NaN of the same sign. The callers convert checked-finite rows only.
      ASSERT_TRUE(std::isnan(got[i])) << "fp16 bits 0x" << std::hex << b;
      ASSERT_EQ(std::signbit(got[i]), std::signbit(want[i]));
      ++signalling;
      continue;
    }
    uint32_t gw, gg;
    std::memcpy(&gw, &want[i], sizeof gw);
    std::memcpy(&gg, &got[i], sizeof gg);
    ASSERT_EQ(gg, gw) << "fp16 bits 0x" << std::hex << b;
  }
  EXPECT_EQ(signalling, 2 * 511);
}

TEST(Fp16Batch, FloatsToHalfAtEveryBoundaryAndAStridedSweep) {
  std::vector<float> x;
  // Around every fp16 rounding boundary: the float bits of each fp16 value's upper midpoint, ±3.
  for (uint32_t h = 0; h < 0x8000u; ++h) {
    const float v = fp16_bits_to_float(static_cast<uint16_t>(h));
    float next = fp16_bits_to_float(static_cast<uint16_t>(h + 1));
    if (h == 0x7bffu) next = 65536.f;  // beyond the largest finite fp16: the overflow boundary
    uint32_t mid_bits;
    const float mid = (v + next) / 2;
    std::memcpy(&mid_bits, &mid, sizeof mid_bits);
    for (int k = -3; k <= 3; ++k) {
      x.push_back(from_bits(mid_bits + static_cast<uint32_t>(k)));
      x.push_back(-from_bits(mid_bits + static_cast<uint32_t>(k)));
    }
  }
  // Every float pattern with a stride (fewer under the sanitizers), odd so every low-bit mix occurs.
  const uint64_t stride = e8kv::test::kUnderSanitizer ? 4099 : 211;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += stride) x.push_back(from_bits(static_cast<uint32_t>(b)));
  for (uint32_t b : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x00000001u, 0x80000001u})
    x.push_back(from_bits(b));
  x.push_back(1.0f);  // an odd length: the scalar tail runs too
  std::vector<uint16_t> want(x.size()), got(x.size());
  floats_to_fp16_bits(x.data(), want.data(), x.size());
  detail::floats_to_fp16_bits_batch(x.data(), got.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t b;
    std::memcpy(&b, &x[i], sizeof b);
    ASSERT_EQ(got[i], want[i]) << "float bits 0x" << std::hex << b;
  }
  std::printf("%zu floats compared\n", x.size());
}

}  // namespace
