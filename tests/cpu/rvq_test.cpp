// Tests of the fast-tier residual codes: the E81B stage code (points, order, exhaustive encoder),
// Rvq3 = E8P + E81B and Rvq4 = E8P + E8P (stage-wise exactness against brute force, index
// ranges, reconstruction formula, Gaussian MSE, scales, non-finite input).
#include "e8kv/codebook/rvq.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "e8kv/codebook/block_code.hpp"
#include "e8kv/lattice/e8.hpp"
#include "test_util.hpp"

namespace {
using e8kv::codebook::E81B;
using e8kv::codebook::E8P;
using e8kv::codebook::Rvq3;
using e8kv::codebook::Rvq4;
namespace rvq_detail = e8kv::codebook::rvq_detail;

static_assert(e8kv::codebook::is_block_code_v<E81B>, "E81B follows the block-code contract");
static_assert(e8kv::codebook::is_block_code_v<Rvq3>, "Rvq3 follows the block-code contract");
static_assert(e8kv::codebook::is_block_code_v<Rvq4>, "Rvq4 follows the block-code contract");

using Point = std::array<double, 8>;

std::vector<Point> decoded_points(void (*decode)(uint32_t, float*), uint32_t count) {
  std::vector<Point> pts(count);
  for (uint32_t i = 0; i < count; ++i) {
    float z[8];
    decode(i, z);
    for (int k = 0; k < 8; ++k) pts[i][k] = z[k];
  }
  return pts;
}

double dist2(const float* z, const Point& c) {
  double s = 0;
  for (int k = 0; k < 8; ++k) s += (double(z[k]) - c[k]) * (double(z[k]) - c[k]);
  return s;
}

uint32_t brute_force(const float* z, const std::vector<Point>& pts) {
  double best = std::numeric_limits<double>::infinity();
  uint32_t best_i = 0;
  for (uint32_t i = 0; i < pts.size(); ++i) {
    const double d = dist2(z, pts[i]);
    if (d < best) {
      best = d;
      best_i = i;
    }
  }
  return best_i;
}

// ---- E81B ----------------------------------------------------------------------------------

TEST(E81B, PointsAreTheDocumentedSubsetOfE8) {
  const auto pts = decoded_points(E81B::decode_lattice, 256);
  std::set<Point> distinct(pts.begin(), pts.end());
  EXPECT_EQ(distinct.size(), 256u);
  int by_norm[5] = {};
  for (const auto& p : pts) {
    ASSERT_TRUE(e8kv::lattice::is_e8(p.data()));
    double n = 0;
    for (double v : p) n += v * v;
    ASSERT_TRUE(n == 0 || n == 2 || n == 4) << n;
    ++by_norm[static_cast<int>(n)];
  }
  EXPECT_EQ(by_norm[0], 1);
  EXPECT_EQ(by_norm[2], 240);  // all roots of E8
  EXPECT_EQ(by_norm[4], 15);   // ±2e_i except −2e_7
  Point minus_2e7{}, plus_2e7{};
  minus_2e7[7] = -2;
  plus_2e7[7] = 2;
  EXPECT_EQ(distinct.count(minus_2e7), 0u);
  EXPECT_EQ(distinct.count(plus_2e7), 1u);
  // Documented order: origin first, then 112 integer roots, 128 half roots, 15 points ±2e_i.
  EXPECT_EQ(pts[0], Point{});
  for (int i = 1; i <= 112; ++i) EXPECT_EQ(std::count(pts[i].begin(), pts[i].end(), 0.0), 6) << i;
  for (int i = 113; i <= 240; ++i)
    for (double v : pts[i]) EXPECT_EQ(std::fabs(v), 0.5) << i;
  Point plus_2e0{};
  plus_2e0[0] = 2;
  EXPECT_EQ(pts[241], plus_2e0);
  EXPECT_EQ(pts[255], plus_2e7);
}

TEST(E81B, EncoderIsExhaustiveAndExact) {
  const auto pts = decoded_points(E81B::decode_lattice, 256);
  auto rng = e8kv::test::seeded_rng(31337);
  std::normal_distribution<float> g(0.f, 1.f);
  for (float spread : {1e-3f, 0.3f, 0.7f, 1.0f, 2.0f, 10.0f}) {
    for (int n = 0; n < 2000; ++n) {
      float z[8];
      for (float& v : z) v = g(rng) * spread;
      const uint32_t idx = E81B::encode(z);
      ASSERT_LT(idx, 256u);
      const uint32_t ref = brute_force(z, pts);
      if (idx != ref) {
        ASSERT_LE(dist2(z, pts[idx]) - dist2(z, pts[ref]), 1e-6) << spread << " " << n;
      }
    }
  }
  for (uint32_t i = 0; i < 256; ++i) {  // every point is its own nearest point
    float z[8];
    E81B::decode(i, z);
    ASSERT_EQ(E81B::encode(z), i);
    E81B::decode(i | 0xFFFFFF00u, z);  // bits above 7 are ignored
    ASSERT_EQ(E81B::encode(z), i);
  }
  float zero[8] = {};
  EXPECT_EQ(E81B::encode(zero), 0u);
}

TEST(E81B, HostAndGenericSearchesAgreeBitForBit) {
  auto rng = e8kv::test::seeded_rng(8118);
  std::normal_distribution<float> g(0.f, 1.f);
  std::uniform_int_distribution<int> q(-6, 6);
  for (int k = 0; k < 20000; ++k) {
    float z[8];
    for (float& v : z) v = (k % 4 == 3) ? q(rng) * 0.25f : g(rng) * (k % 3 == 2 ? 5.f : 1.f);
    ASSERT_EQ(e8kv::codebook::e81b_detail::search_host(z), e8kv::codebook::e81b_detail::search_generic(z)) << k;
  }
}

// ---- Rvq3 / Rvq4 -----------------------------------------------------------------------------

template <class Code>
void check_stagewise(uint64_t seed, int n, const std::vector<Point>& second_points) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  const auto first_points = decoded_points(E8P::decode_lattice, 65536);
  for (int k = 0; k < n; ++k) {
    float x[8], z[8], r[8], y[8];
    const float spread = (k % 4 == 3) ? 4.0f : 1.0f;
    for (float& v : x) v = g(rng) * spread;
    const uint32_t idx = Code::encode(x);
    if (Code::kIndexBits < 32) {
      ASSERT_LT(idx, 1u << Code::kIndexBits);
    }
    for (int i = 0; i < 8; ++i) z[i] = x[i] * Code::kInputScale;
    const uint32_t first = idx & 0xFFFFu, second = idx >> 16;
    // Stage 1 is the exact nearest E8P codeword of s1·x.
    const uint32_t first_ref = brute_force(z, first_points);
    if (first != first_ref) {
      ASSERT_LE(dist2(z, first_points[first]) - dist2(z, first_points[first_ref]), 1e-6);
    }
    // Stage 2 is the exact nearest point to s2·(s1·x − c1).
    for (int i = 0; i < 8; ++i) r[i] = static_cast<float>((z[i] - first_points[first][i])) * Code::kResidualScale;
    const uint32_t second_ref = brute_force(r, second_points);
    if (second != second_ref) {
      ASSERT_LE(dist2(r, second_points[second]) - dist2(r, second_points[second_ref]), 1e-6) << k;
    }
    // Reconstruction x̂ = (c1 + c2/s2)/s1.
    Code::decode(idx, y);
    for (int i = 0; i < 8; ++i) {
      const double expect =
          (first_points[first][i] + second_points[second][i] / Code::kResidualScale) / Code::kInputScale;
      ASSERT_NEAR(y[i], expect, 1e-5);
    }
  }
}

TEST(Rvq3, StagesAreExactAndDecodeIsTheSum) {
  check_stagewise<Rvq3>(303, 300, decoded_points(E81B::decode_lattice, 256));
}

TEST(Rvq4, StagesAreExactAndDecodeIsTheSum) {
  check_stagewise<Rvq4>(404, 300, decoded_points(E8P::decode_lattice, 65536));
}

TEST(Rvq3, SecondStageNeverHurts) {
  // E81B contains the origin, so each block's error is at most the stage-1 error.
  auto rng = e8kv::test::seeded_rng(333);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int k = 0; k < 5000; ++k) {
    float x[8], y[8], c1[8];
    for (float& v : x) v = g(rng);
    const uint32_t idx = Rvq3::encode(x);
    Rvq3::decode(idx, y);
    E8P::decode_lattice(idx & 0xFFFFu, c1);
    double e_two = 0, e_one = 0;
    for (int i = 0; i < 8; ++i) {
      e_two += std::pow(double(x[i]) - y[i], 2);
      e_one += std::pow(double(x[i]) - c1[i] / Rvq3::kInputScale, 2);
    }
    ASSERT_LE(e_two, e_one + 1e-6) << k;
  }
}

template <class Code>
double gaussian_mse(uint64_t seed, int blocks) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  double se = 0;
  for (int b = 0; b < blocks; ++b) {
    float x[8], y[8];
    for (float& v : x) v = static_cast<float>(g(rng));
    Code::decode(Code::encode(x), y);
    for (int i = 0; i < 8; ++i) se += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  }
  const double mse = se / (8.0 * blocks);
  std::printf("[info] %s Gaussian MSE per element: %.5f (%.2f dB), %d blocks, seed %llu\n", Code::kName, mse,
              -10 * std::log10(mse), blocks, static_cast<unsigned long long>(seed));
  return mse;
}

TEST(Rvq3, GaussianMse) {
  const double mse = gaussian_mse<Rvq3>(3003, 200000);
  EXPECT_LE(mse, 0.0300);
  EXPECT_GE(mse, 0.015625);  // Shannon's D(R) at R = 3
}

TEST(Rvq4, GaussianMse) {
  const double mse = gaussian_mse<Rvq4>(4004, 200000);
  EXPECT_LE(mse, 0.0086);
  EXPECT_GE(mse, 0.00390625);  // Shannon's D(R) at R = 4
}

template <class Second>
double mse_at_scales(const std::vector<float>& x, float s1, float s2) {
  double se = 0;
  for (size_t b = 0; b < x.size() / 8; ++b) {
    float y[8];
    const uint32_t idx = rvq_detail::encode_two_stage<Second>(&x[8 * b], s1, s2);
    rvq_detail::decode_two_stage<Second>(idx, 1.0f / s1, 1.0f / s2, y);
    for (int i = 0; i < 8; ++i) se += std::pow(double(x[8 * b + i]) - y[i], 2);
  }
  return se / x.size();
}

TEST(Rvq, ScalesBeatGridNeighboursFarAway) {
  // Same blocks for every scale pair. Measured gaps: Rvq3 (0.94, 2.04) +1.2 %, (0.98, 1.90)
  // +1.2 %; Rvq4 (0.84, 3.80) +3.5 %, (0.90, 3.40) +6.6 %.
  auto rng = e8kv::test::seeded_rng(1234);
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<float> x(8 * 30000);
  for (float& v : x) v = static_cast<float>(g(rng));
  const double r3 = mse_at_scales<E81B>(x, Rvq3::kInputScale, Rvq3::kResidualScale);
  EXPECT_LT(r3, mse_at_scales<E81B>(x, 0.94f, Rvq3::kResidualScale));
  EXPECT_LT(r3, mse_at_scales<E81B>(x, Rvq3::kInputScale, 1.90f));
  const double r4 = mse_at_scales<E8P>(x, Rvq4::kInputScale, Rvq4::kResidualScale);
  EXPECT_LT(r4, mse_at_scales<E8P>(x, 0.84f, Rvq4::kResidualScale));
  EXPECT_LT(r4, mse_at_scales<E8P>(x, Rvq4::kInputScale, 3.40f));
  // The helpers reproduce the codes themselves.
  float y3[8], y4[8];
  rvq_detail::decode_two_stage<E81B>(rvq_detail::encode_two_stage<E81B>(x.data(), Rvq3::kInputScale,
                                                                         Rvq3::kResidualScale),
                                     Rvq3::kInverseInputScale, Rvq3::kInverseResidualScale, y3);
  rvq_detail::decode_two_stage<E8P>(rvq_detail::encode_two_stage<E8P>(x.data(), Rvq4::kInputScale,
                                                                      Rvq4::kResidualScale),
                                    Rvq4::kInverseInputScale, Rvq4::kInverseResidualScale, y4);
  float z3[8], z4[8];
  Rvq3::decode(Rvq3::encode(x.data()), z3);
  Rvq4::decode(Rvq4::encode(x.data()), z4);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(y3[i], z3[i]);
    EXPECT_EQ(y4[i], z4[i]);
  }
}

template <class Code>
void check_non_finite() {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  const std::vector<std::array<float, 8>> inputs = {{nan, nan, nan, nan, nan, nan, nan, nan},
                                                    {inf, -inf, inf, -inf, inf, -inf, inf, -inf},
                                                    {nan, 1, -1, inf, -inf, big, -big, 0},
                                                    {1e30f, 0, 0, 0, 0, 0, 0, -1e30f}};
  for (const auto& x : inputs) {
    const uint32_t idx = Code::encode(x.data());
    if (Code::kIndexBits < 32) {
      ASSERT_LT(idx, 1u << Code::kIndexBits);
    }
    float y[8];
    Code::decode(idx, y);
    for (float v : y) ASSERT_TRUE(std::isfinite(v));
    // NaN coordinates behave as zeros.
    std::array<float, 8> zeroed = x;
    for (float& v : zeroed) v = std::isnan(v) ? 0.f : v;
    ASSERT_EQ(idx, Code::encode(zeroed.data()));
  }
}

TEST(Rvq3, NonFiniteInputsGiveValidIndices) { check_non_finite<Rvq3>(); }
TEST(Rvq4, NonFiniteInputsGiveValidIndices) { check_non_finite<Rvq4>(); }
TEST(E81B, NonFiniteInputsGiveValidIndices) { check_non_finite<E81B>(); }

TEST(Rvq, IndexRangesAndHighBits) {
  auto rng = e8kv::test::seeded_rng(55);
  std::uniform_int_distribution<uint32_t> any;
  uint32_t seen_or3 = 0;
  std::normal_distribution<float> g(0.f, 1.f);
  for (int k = 0; k < 3000; ++k) {
    float x[8];
    for (float& v : x) v = g(rng);
    seen_or3 |= Rvq3::encode(x);
  }
  EXPECT_EQ(seen_or3 >> 24, 0u);
  EXPECT_EQ(seen_or3, (1u << 24) - 1);  // every bit of the 24-bit index is used
  for (int k = 0; k < 100; ++k) {       // decode is defined for any uint32; Rvq3 ignores bits 24+
    const uint32_t idx = any(rng);
    float a[8], b[8];
    Rvq3::decode(idx, a);
    Rvq3::decode(idx & 0xFFFFFFu, b);
    for (int i = 0; i < 8; ++i) ASSERT_EQ(a[i], b[i]);
    Rvq4::decode(idx, a);
    for (float v : a) ASSERT_TRUE(std::isfinite(v));
  }
}

}  // namespace
