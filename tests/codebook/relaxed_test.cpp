// Tests of the reproduced NexusQuant "relaxed parity" quantizer: hand-computed points (including
// the argmin repair bug and clamping), its point set D8 ∪ (Z^8+½) (not a lattice), MSE figures of
// the research note, scaling and padding, and the empirical-entropy estimators.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "e8kv/codebook/relaxed.hpp"
#include "e8kv/lattice/e8.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv::codebook;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::array<float, 8> nearest(const std::array<float, 8>& x, RelaxedRepair r = RelaxedRepair::kArgminAsWritten) {
  std::array<float, 8> y{};
  relaxed_nearest(x.data(), y.data(), r);
  return y;
}

bool in_relaxed_set(const std::array<float, 8>& y) {
  int32_t t[8];
  for (int i = 0; i < 8; ++i) {
    const float twice = 2.0f * y[i];
    if (twice != std::round(twice)) return false;
    t[i] = static_cast<int32_t>(twice);
  }
  return is_relaxed_point_twice(t);
}

double dist2(const float* x, const float* y) {
  double s = 0;
  for (int i = 0; i < 8; ++i) s += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  return s;
}

TEST(Relaxed, ArgminRepairDiffersFromArgmax) {
  // Rounded (1,0,...,0) has an odd sum. Gaps: 0 everywhere except 0.4 at index 7.
  // Argmin (reference code) moves index 0 (gap 0, direction +1) -> (2,0,...,0), distance² 1.16.
  // Argmax (Conway–Sloane) moves index 7 -> (1,0,...,0,1), distance² 0.36.
  // The half candidate (½,...,½) is at distance² 1.76, so the integer candidate wins both times.
  const std::array<float, 8> x = {1, 0, 0, 0, 0, 0, 0, 0.4f};
  const std::array<float, 8> as_written = {2, 0, 0, 0, 0, 0, 0, 0};
  const std::array<float, 8> correct = {1, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_EQ(nearest(x), as_written);
  EXPECT_EQ(nearest(x, RelaxedRepair::kArgmaxCorrect), correct);
  int32_t r[8];
  relaxed_integer_candidate(x.data(), r);
  EXPECT_EQ(r[0], 2);
  relaxed_integer_candidate(x.data(), r, RelaxedRepair::kArgmaxCorrect);
  EXPECT_EQ(r[7], 1);
  // The correct variant agrees with the library's E8 nearest point here.
  float e8[8];
  e8kv::lattice::nearest_e8(x.data(), e8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(e8[i], correct[i]);
  EXPECT_GT(dist2(x.data(), as_written.data()), dist2(x.data(), correct.data()));
}

TEST(Relaxed, CosetTieKeepsTheIntegerCandidate) {
  // x = (¼)^8: the integer candidate 0 and the half candidate (½)^8 are both at distance² 0.5;
  // the reference selects the half candidate only when strictly closer.
  const std::array<float, 8> x = {.25f, .25f, .25f, .25f, .25f, .25f, .25f, .25f};
  const std::array<float, 8> zero = {};
  int32_t t[8];
  EXPECT_EQ(relaxed_nearest_twice(x.data(), t), 0);
  EXPECT_EQ(nearest(x), zero);
  const std::array<float, 8> xn = {-.25f, -.25f, -.25f, -.25f, -.25f, -.25f, -.25f, -.25f};
  EXPECT_EQ(nearest(xn), zero);
}

TEST(Relaxed, HandComputedScaledBlockWithClamp) {
  // levels = 4: amax = 2 -> sc = 1. Integer candidate: round = (2,0,1,0,0,1,-1,0), odd sum; argmin
  // moves index 0 (gap 0) to 3: distance² 2.295. Half candidate (2.5,.5,.5,-.5,.5,.5,-.5,.5):
  // distance² 0.295, wins. Clamp to ±2 turns 2.5 into 2: a "mixed" block, off the point set.
  const float x[8] = {2.0f, 0.4f, 0.6f, -0.4f, 0.45f, 0.55f, -0.6f, 0.5f};
  for (auto scaling : {RelaxedScaling::kPerGroupOf8, RelaxedScaling::kPerVector}) {
    int16_t codes[8];
    float scale[1];
    relaxed_encode(x, 8, 4, scaling, RelaxedRepair::kArgminAsWritten, codes, scale);
    EXPECT_EQ(scale[0], 1.0f);
    const int16_t expected[8] = {4, 1, 1, -1, 1, 1, -1, 1};
    for (int i = 0; i < 8; ++i) EXPECT_EQ(codes[i], expected[i]) << i;
    float y[8];
    relaxed_decode(codes, scale, 8, scaling, y);
    const std::array<float, 8> ya = {y[0], y[1], y[2], y[3], y[4], y[5], y[6], y[7]};
    const std::array<float, 8> want = {2, .5f, .5f, -.5f, .5f, .5f, -.5f, .5f};
    EXPECT_EQ(ya, want);
    EXPECT_FALSE(in_relaxed_set(ya));  // clamping left the point set
  }
}

TEST(Relaxed, HandComputedPerVectorWithPadding) {
  // dim 3, levels 4: amax 2 -> sc 1; padded (1,-2,0.5,0,0,0,0,0). Integer: round (0.5 -> 0, half to
  // even) = (1,-2,0,...), sum -1 odd; argmin moves index 0 (gap 0) -> (2,-2,0): distance² 1.25.
  // Half: (½,-1½,½,½,½,½,½,½) at 1.75. Output (2,-2,0); the correct repair gives (1,-2,1) at 0.25.
  const float x[3] = {1.0f, -2.0f, 0.5f};
  int16_t codes[3];
  float sc;
  relaxed_encode(x, 3, 4, RelaxedScaling::kPerVector, RelaxedRepair::kArgminAsWritten, codes, &sc);
  EXPECT_EQ(sc, 1.0f);
  EXPECT_EQ(codes[0], 4);
  EXPECT_EQ(codes[1], -4);
  EXPECT_EQ(codes[2], 0);
  relaxed_encode(x, 3, 4, RelaxedScaling::kPerVector, RelaxedRepair::kArgmaxCorrect, codes, &sc);
  EXPECT_EQ(codes[0], 2);
  EXPECT_EQ(codes[1], -4);
  EXPECT_EQ(codes[2], 2);
}

TEST(Relaxed, OutputSetIsD8UnionHalfIntegersNotE8) {
  auto rng = e8kv::test::seeded_rng(101);
  size_t odd_half = 0, half = 0, total = 0;
  for (double sigma : {0.3, 1.0, 1.7, 5.0}) {
    std::normal_distribution<float> g(0.f, static_cast<float>(sigma));
    for (int t = 0; t < 20000; ++t) {
      std::array<float, 8> x;
      for (auto& v : x) v = g(rng);
      int32_t tw[8];
      const int coset = relaxed_nearest_twice(x.data(), tw);
      ASSERT_TRUE(is_relaxed_point_twice(tw));
      int64_t s = 0;
      for (int i = 0; i < 8; ++i) {
        ASSERT_EQ(tw[i] & 1, coset);  // all odd (half coset) or all even
        s += tw[i];
      }
      if (coset == 0) {
        ASSERT_EQ(s % 4, 0) << "odd-sum integer point";
      }
      half += coset;
      if (coset == 1 && s % 4 != 0) ++odd_half;
      ++total;
      // The corrected variant is the exact nearest point of D8 ∪ (Z^8+½): compare with the
      // library's D8 decoder and the unconstrained half-integer rounding.
      float yc[8], d8[8], h[8];
      relaxed_nearest(x.data(), yc, RelaxedRepair::kArgmaxCorrect);
      e8kv::lattice::nearest_d8(x.data(), d8);
      for (int i = 0; i < 8; ++i) h[i] = std::nearbyint(x[i] - 0.5f) + 0.5f;
      const double best = std::fmin(dist2(x.data(), d8), dist2(x.data(), h));
      ASSERT_NEAR(dist2(x.data(), yc), best, 1e-5);
      // The reference's output is never closer than that.
      float yw[8];
      relaxed_nearest(x.data(), yw);
      ASSERT_GE(dist2(x.data(), yw), best - 1e-5);
    }
  }
  // Odd-sum half-integer points (in the set, not in E8) are common.
  EXPECT_GT(odd_half, total / 10);
  EXPECT_GT(half, total / 4);
}

TEST(Relaxed, NotALattice) {
  // p (sum 3, odd) and q (sum 4) are both fixed points of the quantizer, so both are in its output
  // set; p + q = (1,...,1,0) has odd sum and is an integer vector: not in the set. A lattice would
  // contain it.
  const std::array<float, 8> p = {.5f, .5f, .5f, .5f, .5f, .5f, .5f, -.5f};
  const std::array<float, 8> q = {.5f, .5f, .5f, .5f, .5f, .5f, .5f, .5f};
  EXPECT_EQ(nearest(p), p);
  EXPECT_EQ(nearest(q), q);
  std::array<float, 8> sum;
  for (int i = 0; i < 8; ++i) sum[i] = p[i] + q[i];
  EXPECT_TRUE(in_relaxed_set(p));
  EXPECT_TRUE(in_relaxed_set(q));
  EXPECT_FALSE(in_relaxed_set(sum));
  EXPECT_NE(nearest(sum), sum);                                  // the quantizer never outputs it
  EXPECT_NE(nearest(sum, RelaxedRepair::kArgmaxCorrect), sum);  // not even the corrected one
  // p is not in E8 (odd sum of a half-integer vector): the set is not E8 either.
  EXPECT_FALSE(e8kv::lattice::is_e8(p.data()));
}

// MSE per dimension of x ~ N(0, 1.7²) without scaling or clamping, as in the research note
// (nexusquant.md §2.1: 0.0730 as written, 0.0716 strict E8, 0.0671 corrected union, 0.0903 D8).
TEST(Relaxed, MseMatchesResearchFigures) {
  auto rng = e8kv::test::seeded_rng(202);
  std::normal_distribution<float> g(0.f, 1.7f);
  const int blocks = 100000;
  double as_written = 0, corrected = 0, e8 = 0, d8 = 0;
  for (int b = 0; b < blocks; ++b) {
    float x[8], y[8];
    for (auto& v : x) v = g(rng);
    relaxed_nearest(x, y);
    as_written += dist2(x, y);
    relaxed_nearest(x, y, RelaxedRepair::kArgmaxCorrect);
    corrected += dist2(x, y);
    e8kv::lattice::nearest_e8(x, y);
    e8 += dist2(x, y);
    e8kv::lattice::nearest_d8(x, y);
    d8 += dist2(x, y);
  }
  const double n = 8.0 * blocks;
  EXPECT_NEAR(as_written / n, 0.0730, 0.015 * 0.0730);
  EXPECT_NEAR(corrected / n, 0.0671, 0.015 * 0.0671);
  EXPECT_NEAR(e8 / n, 0.0716, 0.015 * 0.0716);
  EXPECT_NEAR(d8 / n, 0.0903, 0.015 * 0.0903);
  EXPECT_GT(as_written, e8);  // the reference is worse than strict E8 even at equal scale
  std::printf("MSE/dim at sigma 1.7: as written %.5f, corrected union %.5f, E8 %.5f, D8 %.5f\n", as_written / n,
              corrected / n, e8 / n, d8 / n);
}

TEST(Relaxed, ScalingCodesRangeAndPadding) {
  auto rng = e8kv::test::seeded_rng(303);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int levels : {4, 8, 16, 5})
    for (auto scaling : {RelaxedScaling::kPerVector, RelaxedScaling::kPerGroupOf8})
      for (int dim : {1, 3, 8, 13, 64, 128}) {
        const size_t vectors = 50;
        std::vector<float> x(vectors * dim), y(x.size());
        for (auto& v : x) v = g(rng) * 3.0f;
        RelaxedOptions o;
        o.levels = levels;
        o.scaling = scaling;
        const auto c = relaxed_quantize(x.data(), vectors, dim, o);
        ASSERT_EQ(c.codes.size(), vectors * dim);
        ASSERT_EQ(c.scales.size(), vectors * relaxed_scale_count(dim, scaling));
        relaxed_dequantize(c, y.data());
        for (size_t v = 0; v < vectors; ++v) {
          // Independent scale of element i: amax of its scaling group / (levels/2).
          for (int i = 0; i < dim; ++i) {
            const int lo = scaling == RelaxedScaling::kPerVector ? 0 : i / 8 * 8;
            const int hi = scaling == RelaxedScaling::kPerVector ? dim : std::min(dim, lo + 8);
            float amax = 0;
            for (int k = lo; k < hi; ++k) amax = std::fmax(amax, std::fabs(x[v * dim + k]));
            const float sc = amax / (levels * 0.5f);
            const int16_t code = c.codes[v * dim + i];
            ASSERT_LE(std::abs(code), levels);
            ASSERT_EQ(y[v * dim + i], code * 0.5f * sc);
            // Away from the clamp, the error of one coordinate is at most one lattice step (the
            // argmin repair can move a coordinate by a full unit).
            ASSERT_LE(std::fabs(x[v * dim + i] - y[v * dim + i]), 1.5 * sc + 1e-6) << "levels " << levels;
          }
        }
      }
}

TEST(Relaxed, NonFiniteAndZeroInput) {
  float x[8] = {kNaN, kInf, -kInf, 1.0f, 0.f, 0.f, 0.f, 0.f};
  int16_t codes[8];
  float sc;
  relaxed_encode(x, 8, 8, RelaxedScaling::kPerVector, RelaxedRepair::kArgminAsWritten, codes, &sc);
  EXPECT_EQ(sc, kRelaxedMaxAbs / 4.0f);
  float y[8];
  relaxed_decode(codes, &sc, 8, RelaxedScaling::kPerVector, y);
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(y[1], kRelaxedMaxAbs);
  EXPECT_EQ(y[2], -kRelaxedMaxAbs);
  const float zero[8] = {};
  relaxed_encode(zero, 8, 8, RelaxedScaling::kPerGroupOf8, RelaxedRepair::kArgminAsWritten, codes, &sc);
  EXPECT_EQ(sc, 1e-8f / 4.0f);  // amax clamped to 1e-8 as in the reference
  relaxed_decode(codes, &sc, 8, RelaxedScaling::kPerGroupOf8, y);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  EXPECT_THROW(relaxed_quantize(x, 1, 0), e8kv::Error);
  RelaxedOptions bad;
  bad.levels = 1;
  EXPECT_THROW(relaxed_quantize(x, 1, 8, bad), e8kv::Error);
  EXPECT_THROW(relaxed_quantize(nullptr, 1, 8), e8kv::Error);
}

TEST(Entropy, KnownDistributions) {
  // Exactly equal counts of 4 symbols: 2 bits.
  std::vector<int16_t> s;
  for (int i = 0; i < 4000; ++i) s.push_back(static_cast<int16_t>(i % 4 - 2));
  EXPECT_NEAR(empirical_entropy_bits(s.data(), s.size()), 2.0, 1e-12);
  // A constant: 0 bits. Empty: 0.
  std::vector<int16_t> c(800, 7);
  EXPECT_EQ(empirical_entropy_bits(c.data(), c.size()), 0.0);
  EXPECT_EQ(empirical_entropy_bits(nullptr, 0), 0.0);
  // Exact dyadic frequencies (1/2, 1/4, 1/8, 1/8): 1.75 bits.
  std::vector<int16_t> d;
  for (int i = 0; i < 8000; ++i) {
    const int r = i % 8;
    d.push_back(static_cast<int16_t>(r < 4 ? -1 : (r < 6 ? 0 : (r == 6 ? 1 : 32767))));
  }
  EXPECT_NEAR(empirical_entropy_bits(d.data(), d.size()), 1.75, 1e-12);
  // Sampled i.i.d. from that distribution: 1.75 within sampling error.
  auto rng = e8kv::test::seeded_rng(404);
  std::discrete_distribution<int> pick({4, 2, 1, 1});
  std::vector<int16_t> r(1000000);
  for (auto& v : r) v = static_cast<int16_t>(pick(rng) - 3);
  EXPECT_NEAR(empirical_entropy_bits(r.data(), r.size()), 1.75, 0.005);
  // Blocks: a uniform 4-symbol value repeated over each block carries 2 bits per block, 0.25 per
  // element, while the per-coordinate entropy stays 2 bits.
  std::uniform_int_distribution<int> u4(0, 3);
  std::vector<int16_t> rep(8 * 50000);
  for (size_t b = 0; b < rep.size() / 8; ++b) {
    const int16_t v = static_cast<int16_t>(u4(rng));
    for (int i = 0; i < 8; ++i) rep[8 * b + i] = v;
  }
  size_t distinct = 0;
  EXPECT_NEAR(empirical_block_entropy_bits(rep.data(), rep.size(), &distinct), 0.25, 0.001);
  EXPECT_EQ(distinct, 4u);
  EXPECT_NEAR(empirical_entropy_bits(rep.data(), rep.size()), 2.0, 0.001);
  // Independent fair bits: 8 bits per block (256 blocks values, many samples), 1 bit per element.
  std::uniform_int_distribution<int> u2(0, 1);
  std::vector<int16_t> bits(8 * 200000);
  for (auto& v : bits) v = static_cast<int16_t>(u2(rng));
  EXPECT_NEAR(empirical_block_entropy_bits(bits.data(), bits.size(), &distinct), 1.0, 0.002);
  EXPECT_EQ(distinct, 256u);
  EXPECT_THROW(empirical_block_entropy_bits(bits.data(), 7), e8kv::Error);
}

TEST(Entropy, RelaxedCodesOnGaussianVectors) {
  // i.i.d. N(0,1) vectors of 128 (what a randomized Hadamard makes of any vector), per-vector amax.
  // Research note (nexusquant.md §2.4): order-0 entropy 2.48 bits (levels 4) and 3.42 (levels 8).
  auto rng = e8kv::test::seeded_rng(505);
  std::normal_distribution<float> g(0.f, 1.f);
  const size_t vectors = 20000;
  const int dim = 128;
  std::vector<float> x(vectors * dim);
  for (auto& v : x) v = g(rng);
  RelaxedOptions o;
  o.levels = 4;
  const auto e4 = relaxed_empirical_entropy(x.data(), vectors, dim, o);
  EXPECT_NEAR(e4.per_coordinate_bits, 2.48, 0.03);
  EXPECT_NEAR(relaxed_empirical_entropy_bits(x.data(), vectors, dim, o), e4.per_coordinate_bits, 1e-12);
  EXPECT_DOUBLE_EQ(e4.scale_bits, 0.125);
  EXPECT_DOUBLE_EQ(e4.fixed_rate_bits, std::log2(9.0));
  EXPECT_EQ(e4.blocks, vectors * 16);
  // The joint 8-block entropy is below the order-0 figure (the coset choice is shared by 8 coordinates).
  EXPECT_LT(e4.joint_block_bits, e4.per_coordinate_bits);
  // Coding the coset flag first and then each coordinate given it beats order-0 coding.
  EXPECT_LT(e4.coset_conditional_bits, e4.per_coordinate_bits);
  EXPECT_GT(e4.coset_conditional_bits, e4.joint_block_bits);
  o.levels = 8;
  const auto e8 = relaxed_empirical_entropy(x.data(), vectors, dim, o);
  EXPECT_NEAR(e8.per_coordinate_bits, 3.42, 0.03);
  EXPECT_LT(e8.coset_conditional_bits, e8.per_coordinate_bits);
  for (const auto* e : {&e4, &e8})
    std::printf("relaxed levels %d: order-0 %.4f, coset-conditional %.4f, joint-8 %.4f (%zu distinct of %zu "
                "blocks), scale %.3f b/elem\n",
                e == &e4 ? 4 : 8, e->per_coordinate_bits, e->coset_conditional_bits, e->joint_block_bits,
                e->distinct_blocks, e->blocks, e->scale_bits);
}

}  // namespace
