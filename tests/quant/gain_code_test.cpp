// 8-bit log-domain gain codes (quant/gain_code.hpp): relative error within half a step over the
// whole ±4-octave range, zero and non-positive gains, saturation, monotonicity.
#include "e8kv/quant/gain_code.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "e8kv/numeric/half.hpp"

#include "testing/test_util.hpp"

namespace {
using namespace e8kv::quant;

TEST(GainCode, RelativeErrorWithinHalfAStep) {
  auto rng = e8kv::test::seeded_rng(808);
  std::uniform_real_distribution<double> octaves(-3.95, 3.95);
  const double half_step = std::exp2(0.5 / kGainCodeStepsPerOctave) - 1.0;  // 1.09 %
  double sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const float ref = static_cast<float>(std::exp2(octaves(rng) * 2.0));
    const float g = static_cast<float>(ref * std::exp2(octaves(rng)));
    const uint8_t c = gain_to_code(g, ref);
    ASSERT_GE(c, 1);
    const double rel = gain_from_code(ref, c) / g - 1.0;
    ASSERT_LE(std::fabs(rel), half_step + 1e-6) << "gain " << g << " ref " << ref;
    sum_sq += rel * rel;
  }
  const double rms = std::sqrt(sum_sq / n);
  std::printf("8-bit gain: RMS relative error %.4f %%\n", 100 * rms);
  EXPECT_NEAR(rms, half_step / std::sqrt(3.0), 0.0005);  // uniform in log: step/sqrt(12)
}

TEST(GainCode, ZeroSaturationAndOrder) {
  EXPECT_EQ(gain_to_code(0.f, 1.f), 0);
  EXPECT_EQ(gain_to_code(-1.f, 1.f), 0);
  EXPECT_EQ(gain_to_code(1.f, 0.f), 0);
  EXPECT_EQ(gain_to_code(std::nanf(""), 1.f), 0);
  EXPECT_EQ(gain_from_code(3.f, 0), 0.f);
  EXPECT_EQ(gain_to_code(1.f, 1.f), kGainCodeCentre);
  EXPECT_EQ(gain_from_code(1.f, kGainCodeCentre), 1.f);
  EXPECT_EQ(gain_to_code(100.f, 1.f), 255);   // above +4 octaves: saturates
  EXPECT_EQ(gain_to_code(0.01f, 1.f), 1);     // below -4 octaves: smallest non-zero code
  for (int c = 2; c < 256; ++c)
    EXPECT_GT(gain_from_code(1.f, static_cast<uint8_t>(c)), gain_from_code(1.f, static_cast<uint8_t>(c - 1)));
  for (int c = 1; c < 256; ++c) EXPECT_EQ(gain_to_code(gain_from_code(0.37f, static_cast<uint8_t>(c)), 0.37f), c);
}

// The reference of a (layer, head, kind): the geometric mean of the positive gains of the first
// flush, as fp16 (the CPU's flush and the GPU's state estimate both call gain_reference_bits).
TEST(GainCode, ReferenceIsTheGeometricMeanOfPositiveGains) {
  auto rng = e8kv::test::seeded_rng(809);
  std::uniform_real_distribution<double> lg(-6, 6);
  for (int it = 0; it < 2000; ++it) {
    std::vector<float> g(1 + rng() % 64);
    for (auto& x : g) x = (rng() % 8 == 0) ? 0.f : static_cast<float>(std::exp2(lg(rng)));
    double s = 0;
    int n = 0;
    for (float x : g) {
      if (!(x > 0.f)) continue;
      s += std::log2(static_cast<double>(x));
      ++n;
    }
    const float want = n > 0 ? static_cast<float>(std::exp2(s / n)) : 1.0f;
    const uint16_t got = gain_reference_bits(g.data(), static_cast<int>(g.size()));
    ASSERT_EQ(got, e8kv::float_to_fp16_bits(want)) << it;
  }
  EXPECT_EQ(gain_reference_bits(nullptr, 0), e8kv::float_to_fp16_bits(1.0f));  // no gain: 1
  const float zeros[3] = {0.f, -1.f, 0.f};
  EXPECT_EQ(gain_reference_bits(zeros, 3), e8kv::float_to_fp16_bits(1.0f));
  const float tiny[2] = {1e-30f, 1e-30f};  // below fp16: the smallest normal-ish reference, never 0
  EXPECT_EQ(gain_reference_bits(tiny, 2), e8kv::float_to_fp16_bits(6.1e-5f));
}

}  // namespace
