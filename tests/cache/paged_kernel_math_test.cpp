// The host/device math of the paged CUDA kernels, checked on the CPU (no device needed):
// the split planner and the lse merge of decode attention (cuda/split_plan.hpp), and the fp16
// rounding the encode kernel applies to f32/bf16 inputs (the conversions of numeric/half.hpp that
// compress() uses). The GPU tests (tests/cuda/) check the kernels that call these.
#include "e8kv/cuda/split_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "e8kv/numeric/half.hpp"

namespace {
using namespace e8kv;
using cuda::Lse2Merge;
using cuda::SplitPlan;
using cuda::plan_decode_splits;

// ---- planner -------------------------------------------------------------------------------------

TEST(SplitPlan, RoundsTheSplitCountDownToOneWave) {
  // Batch 8 × 8 KV heads × 1 query chunk = 64 rows on 132 SMs × 2 CTAs: 264 slots give each row
  // 4 CTAs, one of them the window's, so 3 coded splits: 256 CTAs, one wave (the old planner
  // rounded up to 5 + 1 per row: 384 CTAs, a second wave of 120).
  const SplitPlan p = plan_decode_splits(32768, 64, 264, true, 0);
  EXPECT_EQ(p.splits, 3);
  EXPECT_EQ(p.chunk, 10944);  // ceil(32768 / 3) = 10923, up to a multiple of 32
  EXPECT_EQ(cuda::planned_ctas(p, 64, true), 256);
  EXPECT_TRUE(cuda::covered_by_plan(32768, p));
  EXPECT_FALSE(cuda::covered_by_plan(3 * 10944 + 1, p));
  EXPECT_FALSE(cuda::covered_by_plan(-1, p));
}

TEST(SplitPlan, AllowsChunksBelow256Tokens) {
  // One sequence, 8 KV heads, 4K tokens, 264 slots, no window: 33 CTAs per row -> 128-token splits.
  const SplitPlan p = plan_decode_splits(4096, 8, 264, false, 0);
  EXPECT_EQ(p.chunk, 128);
  EXPECT_EQ(p.splits, 32);
  // Tiny contexts stop at the minimum split.
  const SplitPlan q = plan_decode_splits(100, 1, 264, true, 0);
  EXPECT_EQ(q.chunk, cuda::kMinSplitTokens);
  EXPECT_EQ(q.splits, 2);
}

TEST(SplitPlan, MoreRowsThanSlotsGiveOneSplitPerRow) {
  const SplitPlan p = plan_decode_splits(5000, 1024, 264, true, 0);
  EXPECT_EQ(p.splits, 1);
  EXPECT_GE(p.chunk, 5000);
  EXPECT_EQ(p.chunk % cuda::kSplitGranule, 0);
}

TEST(SplitPlan, FixedChunksAndEmptyCaches) {
  const SplitPlan p = plan_decode_splits(1000, 4, 264, true, 300);
  EXPECT_EQ(p.chunk, 300);
  EXPECT_EQ(p.splits, 4);
  EXPECT_EQ(plan_decode_splits(0, 4, 264, true, 0).splits, 0);
  EXPECT_GT(plan_decode_splits(0, 4, 264, true, 0).chunk, 0);
  EXPECT_EQ(plan_decode_splits(-5, 4, 264, false, 0).splits, 0);
  // Degenerate slot counts are taken as 1: still a valid plan.
  const SplitPlan z = plan_decode_splits(777, 3, 0, false, 0);
  EXPECT_EQ(z.splits, 1);
  EXPECT_TRUE(cuda::covered_by_plan(777, z));
}

TEST(SplitPlan, InvariantsOverRandomShapes) {
  const uint64_t seed = 4242;
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int it = 0; it < 20000; ++it) {
    const int64_t len = static_cast<int64_t>(rng() % 300000);
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 2048);
    const int64_t slots = 1 + static_cast<int64_t>(rng() % 2000);
    const bool window = (rng() & 1) != 0;
    const SplitPlan p = plan_decode_splits(len, rows, slots, window, 0);
    SCOPED_TRACE("len " + std::to_string(len) + " rows " + std::to_string(rows) + " slots " + std::to_string(slots) +
                 " window " + std::to_string(window));
    ASSERT_GE(p.chunk, cuda::kMinSplitTokens);
    ASSERT_EQ(p.chunk % cuda::kSplitGranule, 0);
    ASSERT_TRUE(cuda::covered_by_plan(len, p));
    if (len == 0) {
      ASSERT_EQ(p.splits, 0);
      continue;
    }
    // No planned split is empty.
    ASSERT_LT(static_cast<int64_t>(p.splits - 1) * p.chunk, len);
    // Rounded down: one wave whenever every row fits in the slots with one coded split.
    const int64_t per_row = std::max<int64_t>(slots / rows - (window ? 1 : 0), 1);
    ASSERT_LE(p.splits, per_row);
    if (rows * (1 + (window ? 1 : 0)) <= slots) {
      ASSERT_LE(cuda::planned_ctas(p, rows, window), slots);
    }
  }
}

// ---- lse merge -----------------------------------------------------------------------------------

// One split as the split kernel computes it: running maximum m, l = Σ 2^(s − m), o = Σ 2^(s − m) v / l.
struct Partial {
  float lse = -INFINITY;
  std::vector<float> o;
};

Partial split_partial(const std::vector<float>& s, const std::vector<float>& v, int d, size_t begin, size_t end) {
  Partial p;
  p.o.assign(static_cast<size_t>(d), 0.f);
  if (begin >= end) return p;
  float m = -INFINITY, l = 0.f;
  std::vector<float> acc(static_cast<size_t>(d), 0.f);
  for (size_t t = begin; t < end; ++t) {  // the kernel's online update
    const float m_new = std::max(m, s[t]);
    const float alpha = std::exp2(m - m_new), p_t = std::exp2(s[t] - m_new);
    l = l * alpha + p_t;
    for (int i = 0; i < d; ++i) acc[static_cast<size_t>(i)] = acc[static_cast<size_t>(i)] * alpha + p_t * v[t * d + i];
    m = m_new;
  }
  p.lse = cuda::partial_lse2(m, l);
  for (int i = 0; i < d; ++i) p.o[static_cast<size_t>(i)] = acc[static_cast<size_t>(i)] / l;
  return p;
}

// The reduction kernel's merge: Lse2Merge over the partials, then Σ 2^(lse_s − lse) o_s.
std::vector<float> merge(const std::vector<Partial>& parts, int d, float* lse_out, float* mass_of_first = nullptr) {
  Lse2Merge m;
  for (const Partial& p : parts) m.add(p.lse);
  const float lse = m.lse();
  std::vector<float> out(static_cast<size_t>(d), 0.f);
  for (size_t k = 0; k < parts.size(); ++k) {
    const float w = cuda::lse2_weight(parts[k].lse, lse);
    if (k == 0 && mass_of_first) *mass_of_first = w;
    for (int i = 0; i < d; ++i) out[static_cast<size_t>(i)] += w * parts[k].o[static_cast<size_t>(i)];
  }
  *lse_out = lse;
  return out;
}

TEST(LseMerge, SplitPartialsCombineToTheWholeSoftmax) {
  const uint64_t seed = 777;
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  const int d = 16;
  for (float spread : {1.f, 8.f, 150.f}) {  // 150: 2^150 overflows a float, the lse form must not
    for (int trial = 0; trial < 50; ++trial) {
      const size_t n = 1 + rng() % 2000;
      std::vector<float> s(n), v(n * d);
      for (auto& x : s) x = spread * g(rng) + (trial % 2 ? 120.f : -120.f);
      for (auto& x : v) x = g(rng);
      // Reference in double: softmax over all tokens.
      double mx = -INFINITY;
      for (float x : s) mx = std::max(mx, static_cast<double>(x));
      double sum = 0;
      std::vector<double> ref(d, 0.0);
      for (size_t t = 0; t < n; ++t) {
        const double w = std::exp2(static_cast<double>(s[t]) - mx);
        sum += w;
        for (int i = 0; i < d; ++i) ref[static_cast<size_t>(i)] += w * v[t * d + i];
      }
      // Random contiguous splits, some empty (begin >= end: the kernel writes nothing, the
      // reducer never reads it; here an empty partial must weigh 0).
      std::vector<size_t> cuts = {0, n};
      const int n_cuts = static_cast<int>(rng() % 9);
      for (int c = 0; c < n_cuts; ++c) cuts.push_back(rng() % (n + 1));
      std::sort(cuts.begin(), cuts.end());
      std::vector<Partial> parts;
      for (size_t c = 0; c + 1 < cuts.size(); ++c) parts.push_back(split_partial(s, v, d, cuts[c], cuts[c + 1]));
      float lse = 0.f;
      const std::vector<float> got = merge(parts, d, &lse);
      ASSERT_TRUE(std::isfinite(lse));
      EXPECT_NEAR(lse, mx + std::log2(sum), 1e-4 * std::max(1.0, std::fabs(mx))) << "spread " << spread;
      // A float lse of magnitude L is known to ~L·2^-24, and a weight 2^(lse_s − lse) to that
      // relative error: the tolerance grows with |lse| (several hundred at spread 150).
      const double tol = 2e-5 * std::max(1.0, std::fabs(static_cast<double>(lse)) / 64.0);
      for (int i = 0; i < d; ++i)
        ASSERT_NEAR(got[static_cast<size_t>(i)], ref[static_cast<size_t>(i)] / sum, tol)
            << "spread " << spread << " trial " << trial << " element " << i;
      // Merging is order-independent (up to rounding).
      std::reverse(parts.begin(), parts.end());
      float lse_rev = 0.f;
      const std::vector<float> rev = merge(parts, d, &lse_rev);
      for (int i = 0; i < d; ++i) ASSERT_NEAR(rev[static_cast<size_t>(i)], got[static_cast<size_t>(i)], tol);
    }
  }
}

TEST(LseMerge, WeightsAreSoftmaxMassesAndEmptyRowsStayZero) {
  // Two partials of one token each with logits 0 and 1 (log2 domain): masses 1/3 and 2/3.
  std::vector<Partial> parts(2);
  parts[0].lse = 0.f;
  parts[0].o = {1.f};
  parts[1].lse = 1.f;
  parts[1].o = {4.f};
  float lse = 0.f, mass0 = 0.f;
  const auto out = merge(parts, 1, &lse, &mass0);
  EXPECT_NEAR(lse, std::log2(3.f), 1e-6);
  EXPECT_NEAR(mass0, 1.f / 3.f, 1e-6);  // the weight the reducer gives the value mean of coded tokens
  EXPECT_NEAR(out[0], 1.f / 3.f + 8.f / 3.f, 1e-6);
  // No token at all: lse -inf, every weight 0, the output row 0 (as the CPU's attend).
  Lse2Merge empty;
  empty.add(-INFINITY);
  EXPECT_EQ(empty.lse(), -INFINITY);
  EXPECT_EQ(cuda::lse2_weight(-INFINITY, empty.lse()), 0.f);
  EXPECT_EQ(cuda::lse2_weight(3.f, -INFINITY), 0.f);
}

// ---- encode input rounding --------------------------------------------------------------------

// The encode kernel rounds f32/bf16 inputs with fp16_bits_to_float(float_to_fp16_bits(x)), one
// element at a time; compress() rounds with the batch conversion floats_to_fp16_bits. Same bits.
TEST(EncodeInputRounding, ElementwiseRoundingEqualsCompressBatchRounding) {
  const uint64_t seed = 99;
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::vector<float> x = {0.f,       -0.f,        65504.f,    65519.996f, 65520.f,     -65520.f, 6.1035156e-05f,
                          5.96e-08f, 2.98e-08f,   2.99e-08f,  1.0f + 1.0f / 2048.f,      1.0f + 3.0f / 2048.f,
                          1e-10f,    -3.4e38f,    std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  std::normal_distribution<float> g(0.f, 1.f);
  for (int i = 0; i < 100000; ++i) x.push_back(g(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 40) - 25)));
  for (int i = 0; i < 20000; ++i) {  // bf16 inputs: bf16 -> float is exact, then the same rounding
    uint32_t bits = static_cast<uint32_t>(rng()) & 0xFFFF0000u;
    float f;
    std::memcpy(&f, &bits, 4);
    x.push_back(f);
  }
  std::vector<uint16_t> batch(x.size());
  floats_to_fp16_bits(x.data(), batch.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t one = float_to_fp16_bits(x[i]);
    ASSERT_EQ(one, batch[i]) << "x = " << x[i];
    // And the float the kernel then codes is the fp16 value (NaN stays NaN).
    const float back = fp16_bits_to_float(one);
    if (std::isnan(x[i])) {
      ASSERT_TRUE(std::isnan(back));
    } else {
      ASSERT_EQ(float_to_fp16_bits(back), one);
    }
  }
}

}  // namespace
