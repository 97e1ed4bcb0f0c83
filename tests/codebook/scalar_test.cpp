// Tests of the comparison scalar codecs: Lloyd-Max / uniform tables against a fresh Lloyd
// iteration and published values, Gaussian MSE targets, llama.cpp-style q4_0 / q8_0 blocks
// (golden bytes, error bounds, exactness), KIVI grouped quantization (layout, bounds, bytes)
// and the TurboQuant-style per-vector Lloyd-Max code. Non-finite input everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "e8kv/codebook/block_code.hpp"
#include "e8kv/codebook/scalar.hpp"
#include "e8kv/numeric/half.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv::codebook;
using e8kv::float_to_fp16_bits;
using e8kv::fp16_bits_to_float;

constexpr double kPi = 3.14159265358979323846;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float fp16_round(float x) { return fp16_bits_to_float(float_to_fp16_bits(x)); }

static_assert(is_block_code_v<LloydMax<2>> && is_block_code_v<LloydMax<3>> && is_block_code_v<LloydMax<4>>);
static_assert(is_block_code_v<UniformScalar<2>> && is_block_code_v<UniformScalar<4>>);
static_assert(LloydMax<2>::kIndexBits == 16 && LloydMax<3>::kIndexBits == 24 && LloydMax<4>::kIndexBits == 32);

// ---------------------------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------------------------

template <class Code>
std::vector<double> code_levels() {
  std::vector<double> lv;
  for (uint32_t i = 0; i < (1u << Code::kBits); ++i) lv.push_back(Code::decode_scalar(i));
  return lv;
}

TEST(ScalarTables, GaussianMseFormulaKnownCases) {
  // One level at 0: E[X²] = 1. Two levels ±a: 1 - 2a·sqrt(2/π) + a², minimal at a = sqrt(2/π).
  EXPECT_NEAR(gaussian_scalar_mse({0.0}), 1.0, 1e-12);
  const double a = std::sqrt(2.0 / kPi);
  EXPECT_NEAR(gaussian_scalar_mse({-a, a}), 1.0 - 2.0 / kPi, 1e-12);
  EXPECT_NEAR(gaussian_scalar_mse({-1.0, 1.0}), 2.0 - 2.0 * std::sqrt(2.0 / kPi), 1e-12);
  EXPECT_THROW(gaussian_scalar_mse({}), e8kv::Error);
}

TEST(ScalarTables, LloydMaxMatchesFreshIterationAndMax1960) {
  // Max (1960), Table I: positive output levels for N = 4, 8, 16.
  const std::vector<std::vector<double>> max1960 = {
      {0.4528, 1.510},
      {0.2451, 0.7560, 1.344, 2.152},
      {0.1284, 0.3881, 0.6568, 0.9424, 1.256, 1.618, 2.069, 2.733}};
  const double mse_target[3] = {0.1175, 0.03455, 0.00950};
  auto check = [&](auto code, int b) {
    using Code = decltype(code);
    const int n = 1 << b, h = n / 2;
    const auto fresh = lloyd_max_gaussian_levels(n);
    const auto table = code_levels<Code>();
    ASSERT_EQ(table.size(), static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      EXPECT_NEAR(table[i], fresh[i], 1e-6) << "bits " << b << " level " << i;
      EXPECT_EQ(table[i], -table[n - 1 - i]) << "symmetry";
    }
    for (int k = 0; k < h; ++k) EXPECT_NEAR(table[h + k], max1960[b - 2][k], 6e-4) << "bits " << b << " k " << k;
    EXPECT_NEAR(gaussian_scalar_mse(table), mse_target[b - 2], 0.003 * mse_target[b - 2]);
    EXPECT_NEAR(gaussian_scalar_mse(fresh), mse_target[b - 2], 0.003 * mse_target[b - 2]);
  };
  check(LloydMax<2>{}, 2);
  check(LloydMax<3>{}, 3);
  check(LloydMax<4>{}, 4);
}

TEST(ScalarTables, UniformStepIsOptimalAndMatchesMax1960) {
  // Max (1960), Table II: optimum uniform step and its MSE for N = 4, 8, 16.
  const double step[3] = {0.9957, 0.5860, 0.3352};
  const double mse[3] = {0.1188, 0.03744, 0.01154};
  auto check = [&](auto code, int b) {
    using Code = decltype(code);
    EXPECT_NEAR(Code::kStep, optimal_uniform_step_gaussian(b), 1e-6);
    EXPECT_NEAR(Code::kStep, step[b - 2], 2e-4);
    const auto lv = code_levels<Code>();
    const int n = 1 << b;
    for (int i = 0; i < n; ++i) EXPECT_NEAR(lv[i], (i + 0.5 - n / 2) * Code::kStep, 1e-6);
    EXPECT_NEAR(gaussian_scalar_mse(lv), mse[b - 2], 0.003 * mse[b - 2]);
    // A slightly different step is worse (the optimum is a minimum).
    std::vector<double> wider(lv), narrower(lv);
    for (auto& v : wider) v *= 1.02;
    for (auto& v : narrower) v *= 0.98;
    EXPECT_GT(gaussian_scalar_mse(wider), gaussian_scalar_mse(lv));
    EXPECT_GT(gaussian_scalar_mse(narrower), gaussian_scalar_mse(lv));
  };
  check(UniformScalar<2>{}, 2);
  check(UniformScalar<3>{}, 3);
  check(UniformScalar<4>{}, 4);
}

// ---------------------------------------------------------------------------------------------
// Block codes
// ---------------------------------------------------------------------------------------------

struct MseEstimate {
  double mse;             // mean squared error per element
  double standard_error;  // of that mean (sample standard deviation / sqrt(elements))
};

template <class Code>
MseEstimate monte_carlo_mse(uint64_t seed, size_t blocks) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  double s1 = 0.0, s2 = 0.0;
  float x[8], y[8];
  for (size_t b = 0; b < blocks; ++b) {
    for (auto& v : x) v = static_cast<float>(g(rng));
    Code::decode(Code::encode(x), y);
    for (int i = 0; i < 8; ++i) {
      const double e2 = (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      s1 += e2;
      s2 += e2 * e2;
    }
  }
  const double n = 8.0 * blocks, mean = s1 / n;
  return {mean, std::sqrt((s2 / n - mean * mean) / n)};
}

// The Monte-Carlo MSE agrees with the exact integral of the code's own levels within 4 standard
// errors (a test with real power), and with the published target within `rel` (the brief's check).
template <class Code>
void check_gaussian_mse(uint64_t seed, double target, double rel) {
  const auto est = monte_carlo_mse<Code>(seed, 200000);
  const double exact = gaussian_scalar_mse(code_levels<Code>());
  EXPECT_NEAR(est.mse, exact, 4.0 * est.standard_error) << Code::kName << " " << Code::kBits;
  EXPECT_NEAR(est.mse, target, rel * target) << Code::kName << " " << Code::kBits;
}

TEST(ScalarBlockCodes, LloydMaxGaussianMseTargets) {
  // 200,000 blocks; targets ±0.3 % (classical Lloyd-Max values). With 1.6 M samples one standard
  // error is 0.16 / 0.20 / 0.26 % of the MSE, so the 4-sigma check above carries the statistics.
  check_gaussian_mse<LloydMax<2>>(11, 0.1175, 0.003);
  check_gaussian_mse<LloydMax<3>>(12, 0.03455, 0.003);
  check_gaussian_mse<LloydMax<4>>(13, 0.00950, 0.003);
}

TEST(ScalarBlockCodes, UniformGaussianMseTargets) {
  // One standard error: 0.17 / 0.22 / 0.31 % (overload errors are heavy-tailed), hence ±1 %.
  check_gaussian_mse<UniformScalar<2>>(21, 0.1188, 0.01);
  check_gaussian_mse<UniformScalar<3>>(22, 0.03744, 0.01);
  check_gaussian_mse<UniformScalar<4>>(23, 0.01154, 0.01);
}

template <class Code>
void check_block_code(uint64_t seed) {
  auto rng = e8kv::test::seeded_rng(seed);
  const auto lv = code_levels<Code>();
  // Every index round-trips (each level lies in its own cell).
  std::uniform_int_distribution<uint64_t> idx(0, (uint64_t{1} << Code::kIndexBits) - 1);
  float y[8];
  for (int t = 0; t < 20000; ++t) {
    const uint32_t i = static_cast<uint32_t>(idx(rng));
    Code::decode(i, y);
    ASSERT_EQ(Code::encode(y), i);
  }
  // Index layout: coordinate i in bits [i·B, (i+1)·B), level order increasing.
  for (int c = 0; c < 8; ++c) {
    float x[8] = {};
    for (auto& v : x) v = static_cast<float>(lv.front()) * 3.0f;  // all at the lowest level (index 0)
    x[c] = static_cast<float>(lv.back()) * 3.0f;                   // top level at coordinate c
    EXPECT_EQ(Code::encode(x), static_cast<uint32_t>((1u << Code::kBits) - 1) << (Code::kBits * c));
  }
  // Nearest level by brute force (away from exact ties).
  std::normal_distribution<float> g(0.f, 1.5f);
  for (int t = 0; t < 20000; ++t) {
    float x[8];
    for (auto& v : x) v = g(rng);
    Code::decode(Code::encode(x), y);
    for (int c = 0; c < 8; ++c) {
      double best = 1e30;
      for (double l : lv) best = std::fmin(best, std::fabs(x[c] - l));
      ASSERT_NEAR(std::fabs(x[c] - y[c]), best, 1e-6) << "x=" << x[c];
    }
  }
}

TEST(ScalarBlockCodes, RoundTripLayoutAndNearestLevel) {
  check_block_code<LloydMax<2>>(31);
  check_block_code<LloydMax<3>>(32);
  check_block_code<LloydMax<4>>(33);
  check_block_code<UniformScalar<2>>(34);
  check_block_code<UniformScalar<3>>(35);
  check_block_code<UniformScalar<4>>(36);
}

template <class Code>
void check_ties_and_non_finite() {
  const auto lv = code_levels<Code>();
  const int n = 1 << Code::kBits, h = n / 2;
  EXPECT_EQ(Code::encode_scalar(0.0f), static_cast<uint32_t>(h));   // smallest positive level
  EXPECT_EQ(Code::encode_scalar(-0.0f), static_cast<uint32_t>(h));  // -0 is 0
  EXPECT_EQ(Code::encode_scalar(kNaN), static_cast<uint32_t>(h));   // NaN is 0
  EXPECT_EQ(Code::encode_scalar(kInf), static_cast<uint32_t>(n - 1));
  EXPECT_EQ(Code::encode_scalar(-kInf), 0u);
  EXPECT_EQ(Code::encode_scalar(3.0e38f), static_cast<uint32_t>(n - 1));
  // A magnitude exactly on a threshold takes the smaller-magnitude level.
  const float t = static_cast<float>(0.5 * (lv[h] + lv[h + 1]));
  const float tf = 0.5f * (static_cast<float>(lv[h]) + static_cast<float>(lv[h + 1]));
  if (t == tf) {
    EXPECT_EQ(Code::encode_scalar(t), static_cast<uint32_t>(h));
    EXPECT_EQ(Code::encode_scalar(-t), static_cast<uint32_t>(h - 1));
  }
  EXPECT_EQ(Code::encode_scalar(std::nextafter(t, 10.f)), static_cast<uint32_t>(h + 1));
  float x[8] = {kNaN, kInf, -kInf, 0.f, -0.f, 1e30f, -1e30f, 0.1f};
  float y[8];
  Code::decode(Code::encode(x), y);
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(y[0], static_cast<float>(lv[h]));
  EXPECT_EQ(y[1], static_cast<float>(lv[n - 1]));
  EXPECT_EQ(y[2], static_cast<float>(lv[0]));
}

TEST(ScalarBlockCodes, TiesAndNonFiniteInput) {
  check_ties_and_non_finite<LloydMax<2>>();
  check_ties_and_non_finite<LloydMax<3>>();
  check_ties_and_non_finite<LloydMax<4>>();
  check_ties_and_non_finite<UniformScalar<2>>();
  check_ties_and_non_finite<UniformScalar<3>>();
  check_ties_and_non_finite<UniformScalar<4>>();
}

// ---------------------------------------------------------------------------------------------
// q4_0 / q8_0
// ---------------------------------------------------------------------------------------------

TEST(LlamaBlocks, BytesAndBitsPerElement) {
  EXPECT_EQ(q4_0_bytes(0), 0u);
  EXPECT_EQ(q4_0_bytes(32), 18u);
  EXPECT_EQ(q4_0_bytes(4096), 128u * 18u);
  EXPECT_EQ(q8_0_bytes(32), 34u);
  EXPECT_EQ(q8_0_bytes(96), 102u);
  EXPECT_DOUBLE_EQ(kQ4_0BitsPerElement, 8.0 * kQ4_0BlockBytes / kQ4_0BlockElements);
  EXPECT_DOUBLE_EQ(kQ8_0BitsPerElement, 8.0 * kQ8_0BlockBytes / kQ8_0BlockElements);
  EXPECT_DOUBLE_EQ(kQ4_0BitsPerElement, 4.5);
  EXPECT_DOUBLE_EQ(kQ8_0BitsPerElement, 8.5);
  EXPECT_THROW(q4_0_bytes(33), e8kv::Error);
  EXPECT_THROW(q8_0_bytes(1), e8kv::Error);
  std::vector<float> x(31);
  std::vector<uint8_t> out(64);
  EXPECT_THROW(encode_q4_0(x.data(), 31, out.data()), e8kv::Error);
  EXPECT_THROW(decode_q8_0(out.data(), 31, x.data()), e8kv::Error);
  EXPECT_THROW(encode_q4_0(nullptr, 32, out.data()), e8kv::Error);
  EXPECT_NO_THROW(encode_q4_0(nullptr, 0, nullptr));
}

TEST(LlamaBlocks, Q4_0GoldenBlock) {
  // d = 0.5 (fp16 0x3800): q_j = j for j < 16, q_{j+16} = 15 - j; x = (q - 8)·d, x_0 = -4 is the
  // element of largest magnitude (x_31 = -4 ties it; the first wins, same d).
  float x[32];
  for (int j = 0; j < 16; ++j) {
    x[j] = (j - 8) * 0.5f;
    x[j + 16] = ((15 - j) - 8) * 0.5f;
  }
  uint8_t out[18];
  encode_q4_0_block(x, out);
  EXPECT_EQ(out[0], 0x00);
  EXPECT_EQ(out[1], 0x38);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(out[2 + j], static_cast<uint8_t>(j | ((15 - j) << 4))) << j;
  float y[32];
  decode_q4_0_block(out, y);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]);

  // Largest magnitude positive: d = -0.5 (fp16 0xB800); +4 -> q = 0; -4 clamps at q = 15 -> -3.5.
  float z[32] = {};
  z[0] = 4.0f;
  z[1] = -4.0f;
  z[2] = 1.0f;
  encode_q4_0_block(z, out);
  EXPECT_EQ(out[0], 0x00);
  EXPECT_EQ(out[1], 0xB8);
  EXPECT_EQ(out[2] & 0x0f, 0);
  EXPECT_EQ(out[3] & 0x0f, 15);
  decode_q4_0_block(out, y);
  EXPECT_EQ(y[0], 4.0f);
  EXPECT_EQ(y[1], -3.5f);  // documented clamp: error |d|
  EXPECT_EQ(y[2], 1.0f);
  EXPECT_EQ(y[3], 0.0f);
}

TEST(LlamaBlocks, Q8_0GoldenBlock) {
  // d = 0.25 (fp16 0x3400): x_0 = 127·d, x_j = (j - 16)·d.
  float x[32];
  x[0] = 127 * 0.25f;
  for (int j = 1; j < 32; ++j) x[j] = (j - 16) * 0.25f;
  uint8_t out[34];
  encode_q8_0_block(x, out);
  EXPECT_EQ(out[0], 0x00);
  EXPECT_EQ(out[1], 0x34);
  EXPECT_EQ(out[2], 127);
  for (int j = 1; j < 32; ++j) EXPECT_EQ(out[2 + j], static_cast<uint8_t>(static_cast<int8_t>(j - 16))) << j;
  float y[32];
  decode_q8_0_block(out, y);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]);
}

TEST(LlamaBlocks, Q4_0ErrorBoundsOnRandomBlocks) {
  auto rng = e8kv::test::seeded_rng(41);
  std::normal_distribution<float> g(0.f, 1.f);
  std::uniform_real_distribution<float> scale_exp(-12.f, 12.f);
  const size_t blocks = 4000;
  std::vector<float> x(32 * blocks), y(32 * blocks);
  for (size_t b = 0; b < blocks; ++b) {
    const float s = std::exp2(scale_exp(rng));
    for (int j = 0; j < 32; ++j) x[32 * b + j] = g(rng) * s;
  }
  std::vector<uint8_t> packed(q4_0_bytes(x.size()));
  encode_q4_0(x.data(), x.size(), packed.data());
  decode_q4_0(packed.data(), x.size(), y.data());
  for (size_t b = 0; b < blocks; ++b) {
    const float* xb = &x[32 * b];
    // Independent scale: the signed element of largest magnitude, divided by -8.
    float m = 0.f;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(xb[j]) > std::fabs(m)) m = xb[j];
    const double d = m / -8.0, d16 = fp16_round(m / -8.0f);
    const double scale_err = 8.0 * std::fabs(d - d16);
    for (int j = 0; j < 32; ++j) {
      const double err = std::fabs(double(xb[j]) - y[32 * b + j]);
      const bool clamped = xb[j] / d >= 7.5;  // opposite sign to m, beyond the 7·d level
      const double bound = (clamped ? std::fabs(d) : 0.5 * std::fabs(d)) + scale_err + 1e-5 * std::fabs(d);
      ASSERT_LE(err, bound) << "block " << b << " j " << j;
    }
  }
}

TEST(LlamaBlocks, Q8_0ErrorBoundsOnRandomBlocks) {
  auto rng = e8kv::test::seeded_rng(42);
  std::normal_distribution<float> g(0.f, 1.f);
  std::uniform_real_distribution<float> scale_exp(-10.f, 10.f);
  const size_t blocks = 4000;
  std::vector<float> x(32 * blocks), y(32 * blocks);
  for (size_t b = 0; b < blocks; ++b) {
    const float s = std::exp2(scale_exp(rng));
    for (int j = 0; j < 32; ++j) x[32 * b + j] = g(rng) * s;
  }
  std::vector<uint8_t> packed(q8_0_bytes(x.size()));
  encode_q8_0(x.data(), x.size(), packed.data());
  decode_q8_0(packed.data(), x.size(), y.data());
  for (size_t b = 0; b < blocks; ++b) {
    const float* xb = &x[32 * b];
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const double d = amax / 127.0, d16 = fp16_round(amax / 127.0f);
    for (int j = 0; j < 32; ++j) {
      const double q = std::fabs(y[32 * b + j]) / d16;  // |q|, exact up to float rounding
      const double err = std::fabs(double(xb[j]) - y[32 * b + j]);
      ASSERT_LE(err, 0.5 * d + (q + 0.5) * std::fabs(d - d16) + 1e-5 * d) << "block " << b << " j " << j;
    }
  }
}

TEST(LlamaBlocks, ExactOnRepresentableValues) {
  auto rng = e8kv::test::seeded_rng(43);
  std::uniform_int_distribution<int> q4(0, 15), q8(-127, 127), mant(0, 1023), ex(5, 25), sign(0, 1);
  for (int t = 0; t < 2000; ++t) {
    // A normal fp16 scale with random sign, mantissa and exponent.
    const uint16_t hb = static_cast<uint16_t>((sign(rng) << 15) | (ex(rng) << 10) | mant(rng));
    const float d = fp16_bits_to_float(hb);
    float x[32], y[32];
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(q4(rng) - 8) * d;
    x[t % 32] = -8.0f * d;  // the element of largest magnitude fixes the scale to d
    uint8_t b4[18];
    encode_q4_0_block(x, b4);
    decode_q4_0_block(b4, y);
    for (int j = 0; j < 32; ++j) ASSERT_EQ(y[j], x[j]) << "q4_0 t " << t << " j " << j;

    const float a = std::fabs(d);
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(q8(rng)) * a;
    x[t % 32] = (sign(rng) ? -127.0f : 127.0f) * a;
    uint8_t b8[34];
    encode_q8_0_block(x, b8);
    decode_q8_0_block(b8, y);
    for (int j = 0; j < 32; ++j) ASSERT_EQ(y[j], x[j]) << "q8_0 t " << t << " j " << j;
  }
}

TEST(LlamaBlocks, ZeroAndNonFiniteBlocks) {
  float zero[32] = {};
  uint8_t b4[18], b8[34];
  float y[32];
  encode_q4_0_block(zero, b4);
  EXPECT_EQ(b4[0] | (b4[1] & 0x7f), 0);  // d = ±0
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b4[2 + j], 0x88);  // q = 8 both nibbles
  decode_q4_0_block(b4, y);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  encode_q8_0_block(zero, b8);
  decode_q8_0_block(b8, y);
  for (float v : y) EXPECT_EQ(v, 0.0f);

  // NaN is 0; ±Inf clamps to the largest input whose scale fits in fp16.
  float x[32] = {};
  x[0] = kNaN;
  x[1] = kInf;
  x[2] = 1.0f;
  x[3] = -kInf;
  encode_q4_0_block(x, b4);
  decode_q4_0_block(b4, y);
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(y[1], kQ4_0MaxAbs);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[3], -7.0f * kFp16Max);  // opposite sign of the extreme: clamped at q = 15
  encode_q8_0_block(x, b8);
  decode_q8_0_block(b8, y);
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(y[1], kQ8_0MaxAbs);
  EXPECT_EQ(y[3], -kQ8_0MaxAbs);
  EXPECT_EQ(y[0], 0.0f);
}

TEST(LlamaBlocks, ArrayApiMatchesBlocksOnOddBlockCounts) {
  auto rng = e8kv::test::seeded_rng(44);
  std::normal_distribution<float> g(0.f, 2.f);
  for (size_t blocks : {size_t{1}, size_t{3}, size_t{1001}}) {
    std::vector<float> x(32 * blocks);
    for (auto& v : x) v = g(rng);
    std::vector<uint8_t> a(q4_0_bytes(x.size())), c(q8_0_bytes(x.size()));
    encode_q4_0(x.data(), x.size(), a.data());
    encode_q8_0(x.data(), x.size(), c.data());
    for (size_t b = 0; b < blocks; ++b) {
      uint8_t one4[18], one8[34];
      encode_q4_0_block(&x[32 * b], one4);
      encode_q8_0_block(&x[32 * b], one8);
      ASSERT_EQ(0, std::memcmp(one4, &a[18 * b], 18));
      ASSERT_EQ(0, std::memcmp(one8, &c[34 * b], 34));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// KIVI
// ---------------------------------------------------------------------------------------------

TEST(Kivi, ByteCounts) {
  // 2-bit, group 32: 8 code bytes + 4 parameter bytes per 32 elements = 3 bits/element.
  EXPECT_EQ(kivi_bytes(KiviAxis::kPerChannel, 64, 128, 2), 3072u);
  EXPECT_EQ(kivi_bytes(KiviAxis::kPerToken, 64, 128, 2), 3072u);
  EXPECT_EQ(kivi_bytes(KiviAxis::kPerChannel, 64, 128, 4), 5120u);  // 5 bits/element
  EXPECT_EQ(kivi_groups(KiviAxis::kPerChannel, 33, 128), 256u);     // partial token group
  EXPECT_EQ(kivi_groups(KiviAxis::kPerToken, 10, 80), 30u);         // 80 channels: 3 groups
  EXPECT_EQ(kivi_bytes(KiviAxis::kPerToken, 10, 80, 2), 30u * 12u);
  EXPECT_EQ(kivi_bytes(KiviAxis::kPerChannel, 0, 128, 2), 0u);
  // One head, 1000 tokens, 128-token residual (hand computed): keys 864 quantized tokens
  // (27 groups × 128 channels × 12 B) + 136 fp16 rows; values 872 tokens × 4 groups × 12 B + 128 rows.
  EXPECT_EQ(kivi_cache_bytes(1000, 128, 2), 41472u + 34816u + 41856u + 32768u);
  EXPECT_EQ(kivi_cache_bytes(100, 128, 2), 2u * 100u * 256u);  // all in the window
  EXPECT_EQ(kivi_cache_bytes(0, 128, 4), 0u);
  EXPECT_THROW(kivi_bytes(KiviAxis::kPerToken, 4, 128, 3), e8kv::Error);
  EXPECT_THROW(kivi_bytes(KiviAxis::kPerToken, 4, 0, 2), e8kv::Error);
  EXPECT_THROW(kivi_bytes(KiviAxis::kPerToken, -1, 8, 2), e8kv::Error);
  EXPECT_THROW(kivi_bytes(KiviAxis::kPerToken, 4, 8, 2, 0), e8kv::Error);
  EXPECT_THROW(kivi_cache_bytes(4, 8, 2, 32, -1), e8kv::Error);
  EXPECT_THROW(kivi_quantize_keys(nullptr, 4, 8, 2), e8kv::Error);
}

TEST(Kivi, GoldenLayout) {
  // Keys [32 tokens, 2 channels]: channel 0 = t mod 4 (min 0, max 3 -> scale 1, zero 0, code t mod 4),
  // channel 1 = 5 (scale 0, zero 5, codes 0).
  std::vector<float> k(64);
  for (int t = 0; t < 32; ++t) {
    k[2 * t] = static_cast<float>(t % 4);
    k[2 * t + 1] = 5.0f;
  }
  const auto q = kivi_quantize_keys(k.data(), 32, 2, 2);
  ASSERT_EQ(q.codes.size(), 16u);
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_EQ(q.scales[0], 0x3C00);  // 1.0
  EXPECT_EQ(q.zeros[0], 0x0000);
  EXPECT_EQ(q.scales[1], 0x0000);
  EXPECT_EQ(q.zeros[1], 0x4500);  // 5.0
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q.codes[i], 0xE4) << i;  // codes 0,1,2,3 LSB first
  for (int i = 8; i < 16; ++i) EXPECT_EQ(q.codes[i], 0x00) << i;
  EXPECT_EQ(q.bytes(), 16u + 8u);
  std::vector<float> back(64);
  kivi_dequantize(q, back.data());
  EXPECT_EQ(back, k);

  // Values [2 tokens, 32 channels] at 4 bits: token 0 = c mod 16 -> codes c mod 16.
  std::vector<float> v(64, -2.0f);
  for (int c = 0; c < 32; ++c) v[c] = static_cast<float>(c % 16);
  const auto qv = kivi_quantize_values(v.data(), 2, 32, 4);
  ASSERT_EQ(qv.codes.size(), 32u);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(qv.codes[i], static_cast<uint8_t>((2 * i) % 16 | (((2 * i + 1) % 16) << 4)));
  EXPECT_EQ(qv.zeros[1], float_to_fp16_bits(-2.0f));
  kivi_dequantize(qv, back.data());
  EXPECT_EQ(back, v);
}

// Checks every element against the bound implied by the fp16 parameters of its group.
void check_kivi_group_bounds(const float* x, const float* y, int count, ptrdiff_t stride, int bits,
                             const char* what) {
  float mn = 65504.f, mx = -65504.f;
  for (int j = 0; j < count; ++j) {
    mn = std::fmin(mn, x[j * stride]);
    mx = std::fmax(mx, x[j * stride]);
  }
  const int qmax = (1 << bits) - 1;
  const double scale = (double(mx) - mn) / qmax;
  const double s16 = fp16_round(static_cast<float>(scale)), z16 = fp16_round(mn);
  const double bound =
      0.5 * s16 + std::fabs(mn - z16) + qmax * std::fabs(scale - s16) + 1e-5 * (std::fabs(mn) + std::fabs(mx)) + 1e-30;
  for (int j = 0; j < count; ++j)
    ASSERT_LE(std::fabs(double(x[j * stride]) - y[j * stride]), bound) << what << " j=" << j;
}

TEST(Kivi, RoundTripErrorBoundsPerGroup) {
  auto rng = e8kv::test::seeded_rng(51);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int bits : {2, 4})
    for (int tokens : {1, 31, 32, 33, 100})
      for (int dim : {8, 80, 128}) {
        std::vector<float> x(static_cast<size_t>(tokens) * dim), y(x.size());
        // Keys have outlier channels: give each channel its own scale and offset.
        std::vector<float> ch_scale(dim), ch_off(dim);
        for (int c = 0; c < dim; ++c) {
          ch_scale[c] = std::exp2(static_cast<float>(c % 7) - 2.0f);
          ch_off[c] = g(rng) * 3.0f;
        }
        for (int t = 0; t < tokens; ++t)
          for (int c = 0; c < dim; ++c) x[t * dim + c] = ch_off[c] + ch_scale[c] * g(rng);

        const auto qk = kivi_quantize_keys(x.data(), tokens, dim, bits);
        EXPECT_EQ(qk.bytes(), kivi_bytes(KiviAxis::kPerChannel, tokens, dim, bits));
        kivi_dequantize(qk, y.data());
        for (int g0 = 0; g0 < tokens; g0 += 32)
          for (int c = 0; c < dim; ++c)
            check_kivi_group_bounds(&x[g0 * dim + c], &y[g0 * dim + c], std::min(32, tokens - g0), dim, bits, "keys");

        const auto qv = kivi_quantize_values(x.data(), tokens, dim, bits);
        EXPECT_EQ(qv.bytes(), kivi_bytes(KiviAxis::kPerToken, tokens, dim, bits));
        kivi_dequantize(qv, y.data());
        for (int t = 0; t < tokens; ++t)
          for (int h = 0; h < dim; h += 32)
            check_kivi_group_bounds(&x[t * dim + h], &y[t * dim + h], std::min(32, dim - h), 1, bits, "values");
      }
}

TEST(Kivi, MseIsAsExpectedForUniformGroups) {
  // Uniform data on [0, 1] in groups of n = 32 (a check that the codes use the whole range,
  // independent of the implementation). Given the group's range R, the n - 2 interior elements have
  // uniform error over one step R/qmax and the min and max are exact:
  //   MSE ≈ E[R²] / (12·qmax²) · (n - 2)/n,   E[R²] = (n - 1)·n / ((n + 1)(n + 2)) for uniform data.
  auto rng = e8kv::test::seeded_rng(52);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  const int tokens = 256, dim = 128, n = 32;
  std::vector<float> x(tokens * dim), y(x.size());
  for (auto& v : x) v = u(rng);
  const double er2 = (n - 1.0) * n / ((n + 1.0) * (n + 2.0));
  for (int bits : {2, 4}) {
    const auto q = kivi_quantize_values(x.data(), tokens, dim, bits);
    kivi_dequantize(q, y.data());
    double se = 0;
    for (size_t i = 0; i < x.size(); ++i) se += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    const double qmax = (1 << bits) - 1;
    const double expected = er2 / (12.0 * qmax * qmax) * (n - 2.0) / n;
    EXPECT_NEAR(se / x.size(), expected, 0.03 * expected) << bits;
  }
}

TEST(Kivi, ZeroConstantAndNonFiniteGroups) {
  std::vector<float> zero(32 * 16, 0.f), y(32 * 16, 1.f);
  auto q = kivi_quantize_keys(zero.data(), 32, 16, 2);
  kivi_dequantize(q, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
  std::vector<float> x(32, 0.25f);
  x[0] = kNaN;   // treated as 0
  x[1] = kInf;   // clamped to 65504
  x[2] = -kInf;  // clamped to -65504
  x[3] = 3.0f;
  std::vector<float> out(32);
  const auto qv = kivi_quantize_values(x.data(), 1, 32, 4);
  kivi_dequantize(qv, out.data());
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
  std::vector<float> sanitized(x);
  sanitized[0] = 0.f;
  sanitized[1] = 65504.f;
  sanitized[2] = -65504.f;
  check_kivi_group_bounds(sanitized.data(), out.data(), 32, 1, 4, "non-finite");
  EXPECT_EQ(out[1], fp16_round(-65504.f) + 15.0f * fp16_round(2.f * 65504.f / 15.f));
}

// ---------------------------------------------------------------------------------------------
// TurboQuant-style per-vector Lloyd-Max
// ---------------------------------------------------------------------------------------------

TEST(LloydMaxVectorCode, BytesAndBits) {
  EXPECT_EQ(LloydMaxVector<2>::bytes(128), 34u);
  EXPECT_EQ(LloydMaxVector<3>::bytes(128), 50u);
  EXPECT_EQ(LloydMaxVector<4>::bytes(128), 66u);
  EXPECT_EQ(LloydMaxVector<3>::bytes(5), 4u);  // 2 + ceil(15/8)
  EXPECT_EQ(LloydMaxVector<2>::bytes(0), 0u);
  EXPECT_DOUBLE_EQ(LloydMaxVector<2>::bits_per_element(128), 2.125);
  EXPECT_DOUBLE_EQ(LloydMaxVector<4>::bits_per_element(64), 4.25);
}

template <int B>
void check_vector_code(uint64_t seed, int dim, double mse_target) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  const auto lv = code_levels<LloydMax<B>>();
  const int vectors = 4000;
  std::vector<uint8_t> buf(LloydMaxVector<B>::bytes(dim));
  std::vector<float> x(dim), y(dim);
  double se = 0, energy = 0;
  size_t code_mismatch = 0;
  for (int v = 0; v < vectors; ++v) {
    const double s = std::exp2(static_cast<double>(v % 9) - 4.0);  // the gain makes the code scale-free
    for (auto& e : x) e = static_cast<float>(g(rng) * s);
    LloydMaxVector<B>::encode(x.data(), dim, buf.data());
    LloydMaxVector<B>::decode(buf.data(), dim, y.data());
    // Independent reference in double: nearest level of x·sqrt(d)/‖x‖ by brute force.
    double n2 = 0;
    for (float e : x) n2 += double(e) * e;
    const double norm = std::sqrt(n2);
    const double gain = fp16_round(static_cast<float>(norm)) / std::sqrt(double(dim));
    for (int i = 0; i < dim; ++i) {
      const double u = x[i] * std::sqrt(double(dim)) / norm;
      double best = 1e30, level = 0;
      for (double l : lv)
        if (std::fabs(u - l) < best) best = std::fabs(u - l), level = l;
      const double ref = level * gain;
      if (std::fabs(ref - y[i]) > 1e-5 * std::fabs(ref) + 1e-30) ++code_mismatch;  // only at thresholds
      se += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      energy += double(x[i]) * x[i];
    }
  }
  EXPECT_LE(code_mismatch, static_cast<size_t>(vectors) * dim / 100000 + 2);
  // Normalized vectors have lighter tails than i.i.d. N(0,1), so the NMSE is close to, and not
  // above, the scalar Lloyd-Max MSE (within 5 %).
  EXPECT_NEAR(se / energy, mse_target, 0.05 * mse_target);
}

TEST(LloydMaxVectorCode, MatchesReferenceAndMse) {
  check_vector_code<2>(61, 128, 0.1175);
  check_vector_code<3>(62, 128, 0.03455);
  check_vector_code<4>(63, 128, 0.00950);
  check_vector_code<3>(64, 80, 0.03455);
}

TEST(LloydMaxVectorCode, ZeroAndNonFiniteVectors) {
  std::vector<float> x(64, 0.f), y(64, 1.f);
  std::vector<uint8_t> buf(LloydMaxVector<2>::bytes(64));
  LloydMaxVector<2>::encode(x.data(), 64, buf.data());
  LloydMaxVector<2>::decode(buf.data(), 64, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
  x[0] = kNaN;
  x[1] = kInf;
  x[2] = -1.0f;
  LloydMaxVector<2>::encode(x.data(), 64, buf.data());
  LloydMaxVector<2>::decode(buf.data(), 64, y.data());
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
  EXPECT_GT(y[1], 0.f);
  EXPECT_LT(y[2], 0.f);
  EXPECT_EQ(fp16_bits_to_float(static_cast<uint16_t>(buf[0] | buf[1] << 8)), 65504.0f);  // norm clamped
  // dim <= 0 writes nothing.
  uint8_t canary = 0x5a;
  LloydMaxVector<2>::encode(x.data(), 0, &canary);
  EXPECT_EQ(canary, 0x5a);
}

}  // namespace
