// Tests of RoPE: a reference written here from the HF formulas (inverse frequencies per scaling
// type, then a full rotation matrix in double), defining properties of each scaling, exact
// inversion, untouched partial-rotary dimensions, the batched path against the scalar one,
// and parameter validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/transform/rope.hpp"
#include "testing/test_util.hpp"

namespace {
using e8kv::transform::Rope;
using e8kv::transform::RopeLayout;
using e8kv::transform::RopeParams;
using e8kv::transform::RopeScaling;

constexpr double kPi = 3.14159265358979323846;

// ---- the reference -------------------------------------------------------------------------

/// HF's inverse frequencies, computed straightforwardly from the published formulas. `length` is
/// the sequence length for dynamic NTK.
std::vector<double> reference_inv_freq(const RopeParams& p, int64_t length) {
  const int dim = p.rotary_dim == 0 ? p.head_dim : p.rotary_dim;
  double base = p.theta;
  if (p.scaling == RopeScaling::kDynamicNtk && length > p.original_max_position) {
    base = p.theta * std::pow(p.factor * double(length) / p.original_max_position - (p.factor - 1.0),
                              double(dim) / (dim - 2));
  }
  std::vector<double> inv;
  for (int j = 0; j < dim; j += 2) inv.push_back(1.0 / std::pow(base, double(j) / dim));
  if (p.scaling == RopeScaling::kLinear) {
    for (double& f : inv) f = f / p.factor;
  } else if (p.scaling == RopeScaling::kLlama3) {
    const double low_wavelen = p.original_max_position / p.low_freq_factor;
    const double high_wavelen = p.original_max_position / p.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * kPi / f;
      if (wavelen > low_wavelen) {
        f = f / p.factor;
      } else if (wavelen >= high_wavelen) {
        const double s = (p.original_max_position / wavelen - p.low_freq_factor) /
                         (p.high_freq_factor - p.low_freq_factor);
        f = (1 - s) * f / p.factor + s * f;
      }
    }
  } else if (p.scaling == RopeScaling::kYarn) {
    auto corr = [&](double rot) {
      return dim * std::log(p.original_max_position / (rot * 2 * kPi)) / (2 * std::log(p.theta));
    };
    double lo = std::floor(corr(p.beta_fast));
    double hi = std::ceil(corr(p.beta_slow));
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001;
    for (size_t i = 0; i < inv.size(); ++i) {
      double ramp = (double(i) - lo) / (hi - lo);
      ramp = ramp < 0 ? 0 : (ramp > 1 ? 1 : ramp);
      const double extrapolation_weight = 1 - ramp;
      inv[i] = inv[i] / p.factor * (1 - extrapolation_weight) + inv[i] * extrapolation_weight;
    }
  }
  return inv;
}

/// y = R·x with R the full head_dim x head_dim rotation matrix, in double.
std::vector<double> reference_apply(const RopeParams& p, const std::vector<float>& x, int64_t position,
                                    int64_t length) {
  const int d = p.head_dim;
  const int dim = p.rotary_dim == 0 ? d : p.rotary_dim;
  const std::vector<double> inv = reference_inv_freq(p, length);
  std::vector<double> r(size_t(d) * d, 0.0);
  for (int i = 0; i < d; ++i) r[size_t(i) * d + i] = 1.0;
  for (int i = 0; i < dim / 2; ++i) {
    // rotate_half pairs element i with i + dim/2; GPT-J pairs 2i with 2i+1.
    const int a = p.layout == RopeLayout::kSplitHalf ? i : 2 * i;
    const int b = p.layout == RopeLayout::kSplitHalf ? i + dim / 2 : 2 * i + 1;
    const double t = double(position) * inv[size_t(i)];
    r[size_t(a) * d + a] = std::cos(t);
    r[size_t(a) * d + b] = -std::sin(t);
    r[size_t(b) * d + a] = std::sin(t);
    r[size_t(b) * d + b] = std::cos(t);
  }
  std::vector<double> y(size_t(d), 0.0);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) y[size_t(i)] += r[size_t(i) * d + j] * x[size_t(j)];
  return y;
}

std::vector<float> gaussian(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s) / norm(b);
}

// ---- the configurations every property is checked on -----------------------------------------

RopeParams make(RopeLayout layout, RopeScaling scaling, int head_dim, int rotary_dim) {
  RopeParams p;
  p.layout = layout;
  p.head_dim = head_dim;
  p.rotary_dim = rotary_dim;
  p.scaling = scaling;
  switch (scaling) {
    case RopeScaling::kNone:
      break;
    case RopeScaling::kLinear:
      p.factor = 4.0;
      break;
    case RopeScaling::kDynamicNtk:
      p.factor = 2.0;
      p.original_max_position = 4096;
      break;
    case RopeScaling::kLlama3:  // Llama-3.1
      p.theta = 500000.0;
      p.factor = 8.0;
      p.original_max_position = 8192;
      p.low_freq_factor = 1.0;
      p.high_freq_factor = 4.0;
      break;
    case RopeScaling::kYarn:
      p.theta = 1000000.0;
      p.factor = 4.0;
      p.original_max_position = 32768;
      break;
  }
  return p;
}

std::vector<RopeParams> all_configs() {
  std::vector<RopeParams> out;
  const int shapes[][2] = {{128, 0}, {128, 64}, {64, 16}, {80, 80}, {96, 32}, {256, 64}, {2, 0}, {6, 4}};
  for (RopeLayout layout : {RopeLayout::kSplitHalf, RopeLayout::kInterleaved})
    for (RopeScaling scaling : {RopeScaling::kNone, RopeScaling::kLinear, RopeScaling::kDynamicNtk,
                                RopeScaling::kLlama3, RopeScaling::kYarn})
      for (const auto& s : shapes) {
        if (scaling == RopeScaling::kDynamicNtk && (s[1] == 0 ? s[0] : s[1]) < 4) continue;  // needs d >= 4
        out.push_back(make(layout, scaling, s[0], s[1]));
      }
  return out;
}

std::string describe(const RopeParams& p) {
  return "layout=" + std::to_string(int(p.layout)) + " scaling=" + std::to_string(int(p.scaling)) +
         " head_dim=" + std::to_string(p.head_dim) + " rotary_dim=" + std::to_string(p.rotary_dim);
}

const int64_t kPositions[] = {0, 1, 7, 4095, 131071, 1000000};

// ---- small cases written out by hand ---------------------------------------------------------

TEST(Rope, HandComputedSmallCases) {
  // head_dim 4, theta 10000: inv_freq = {1, 1/100}.
  RopeParams p;
  p.head_dim = 4;
  const Rope split(p);
  ASSERT_EQ(split.inv_freq().size(), 2u);
  EXPECT_DOUBLE_EQ(split.inv_freq()[0], 1.0);
  EXPECT_DOUBLE_EQ(split.inv_freq()[1], 0.01);
  float x[4] = {1, 2, 3, 4};
  split.apply(x, 1);
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
  // rotate_half: pairs (0, 2) at angle 1 and (1, 3) at angle 0.01.
  EXPECT_NEAR(x[0], 1 * c1 - 3 * s1, 1e-6);
  EXPECT_NEAR(x[2], 1 * s1 + 3 * c1, 1e-6);
  EXPECT_NEAR(x[1], 2 * c2 - 4 * s2, 1e-6);
  EXPECT_NEAR(x[3], 2 * s2 + 4 * c2, 1e-6);

  p.layout = RopeLayout::kInterleaved;
  const Rope gptj(p);
  float y[4] = {1, 2, 3, 4};
  gptj.apply(y, 1);
  // GPT-J: pairs (0, 1) at angle 1 and (2, 3) at angle 0.01.
  EXPECT_NEAR(y[0], 1 * c1 - 2 * s1, 1e-6);
  EXPECT_NEAR(y[1], 1 * s1 + 2 * c1, 1e-6);
  EXPECT_NEAR(y[2], 3 * c2 - 4 * s2, 1e-6);
  EXPECT_NEAR(y[3], 3 * s2 + 4 * c2, 1e-6);

  // Position 0 is the identity, bit for bit.
  float z[4] = {1.5f, -2.25f, 3.0f, 1e-30f};
  float z0[4];
  std::memcpy(z0, z, sizeof z);
  split.apply(z, 0);
  EXPECT_EQ(std::memcmp(z, z0, sizeof z), 0);

  // The pair primitive.
  float a = 1, b = 0;
  e8kv::transform::rope_rotate_pair(a, b, 0.0f, 1.0f);  // +90 degrees
  EXPECT_EQ(a, 0.0f);
  EXPECT_EQ(b, 1.0f);
}

TEST(Rope, MatchesFullRotationMatrixReference) {
  auto rng = e8kv::test::seeded_rng(777);
  for (const RopeParams& p : all_configs()) {
    const Rope rope(p);
    for (int64_t pos : kPositions) {
      for (int64_t seq_len : {int64_t(0), int64_t(200000)}) {
        const std::vector<float> x = gaussian(rng, size_t(p.head_dim));
        std::vector<float> y = x;
        rope.apply(y.data(), pos, seq_len);
        const int64_t length = std::max(seq_len, pos + 1);
        const std::vector<double> ref = reference_apply(p, x, pos, length);
        double max_err = 0;
        for (size_t i = 0; i < y.size(); ++i) max_err = std::max(max_err, std::fabs(y[i] - ref[i]));
        ASSERT_LT(max_err, 2e-6 * norm(x)) << describe(p) << " pos=" << pos << " seq_len=" << seq_len;
      }
    }
  }
}

TEST(Rope, InvFreqMatchesReference) {
  for (const RopeParams& p : all_configs()) {
    const Rope rope(p);
    const std::vector<double> ref = reference_inv_freq(p, 0);
    ASSERT_EQ(rope.inv_freq().size(), ref.size()) << describe(p);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(rope.inv_freq()[i], ref[i], 1e-14 * ref[i]) << describe(p);
    EXPECT_EQ(rope.params().rotary_dim, p.rotary_dim == 0 ? p.head_dim : p.rotary_dim);
  }
}

// ---- exact inversion, untouched dims, norm -----------------------------------------------------

TEST(Rope, RemoveInvertsApplyEverywhere) {
  auto rng = e8kv::test::seeded_rng(31337);
  for (const RopeParams& p : all_configs()) {
    const Rope rope(p);
    for (int64_t pos : kPositions) {
      const std::vector<float> x = gaussian(rng, size_t(p.head_dim));
      std::vector<float> y = x;
      rope.apply(y.data(), pos, 5000);
      rope.remove(y.data(), pos, 5000);
      ASSERT_LT(relative_diff(y, x), 1e-5) << describe(p) << " pos=" << pos;
      // And the other order: applying undoes a removal.
      y = x;
      rope.remove(y.data(), pos);
      rope.apply(y.data(), pos);
      ASSERT_LT(relative_diff(y, x), 1e-5) << describe(p) << " pos=" << pos;
    }
  }
}

TEST(Rope, PartialRotaryLeavesTheRestBitExact) {
  auto rng = e8kv::test::seeded_rng(4242);
  for (const RopeParams& p : all_configs()) {
    const Rope rope(p);
    const int rd = rope.rotary_dim();
    for (int64_t pos : kPositions) {
      std::vector<float> x = gaussian(rng, size_t(p.head_dim));
      if (rd < p.head_dim) {  // include values whose bits must survive as they are
        x[size_t(rd)] = -0.0f;
        x[size_t(p.head_dim - 1)] = std::numeric_limits<float>::denorm_min();
      }
      std::vector<float> y = x;
      rope.apply(y.data(), pos);
      ASSERT_EQ(std::memcmp(y.data() + rd, x.data() + rd, sizeof(float) * size_t(p.head_dim - rd)), 0)
          << describe(p);
      rope.remove(y.data(), pos);
      ASSERT_EQ(std::memcmp(y.data() + rd, x.data() + rd, sizeof(float) * size_t(p.head_dim - rd)), 0)
          << describe(p);
    }
  }
}

TEST(Rope, PreservesNorm) {
  auto rng = e8kv::test::seeded_rng(99);
  for (const RopeParams& p : all_configs()) {
    const Rope rope(p);
    for (int64_t pos : kPositions) {
      const std::vector<float> x = gaussian(rng, size_t(p.head_dim));
      std::vector<float> y = x;
      rope.apply(y.data(), pos);
      ASSERT_NEAR(norm(y), norm(x), 1e-6 * norm(x)) << describe(p) << " pos=" << pos;
    }
  }
}

TEST(Rope, DotProductDependsOnlyOnPositionDifference) {
  auto rng = e8kv::test::seeded_rng(2718);
  for (const RopeParams& p : all_configs()) {
    const Rope rope(p);
    const std::vector<float> q = gaussian(rng, size_t(p.head_dim));
    const std::vector<float> k = gaussian(rng, size_t(p.head_dim));
    auto dot_at = [&](int64_t m, int64_t n) {
      std::vector<float> qm = q, kn = k;
      rope.apply(qm.data(), m, 1 << 20);  // a fixed length: dynamic NTK uses one base throughout
      rope.apply(kn.data(), n, 1 << 20);
      double s = 0;
      for (size_t i = 0; i < q.size(); ++i) s += double(qm[i]) * kn[i];
      return s;
    };
    const double scale = norm(q) * norm(k);
    for (int64_t delta : {0, 1, 5, 300}) {
      const double d0 = dot_at(10 + delta, 10);
      for (int64_t shift : {1, 1000, 65536, 900000}) {
        ASSERT_NEAR(dot_at(10 + delta + shift, 10 + shift), d0, 1e-5 * scale)
            << describe(p) << " delta=" << delta << " shift=" << shift;
      }
    }
  }
}

// ---- defining properties of each scaling -------------------------------------------------------

TEST(Rope, LinearDividesEveryFrequencyByFactor) {
  for (double factor : {1.0, 2.0, 8.0, 32.5}) {
    RopeParams base;
    base.head_dim = 96;
    RopeParams lin = base;
    lin.scaling = RopeScaling::kLinear;
    lin.factor = factor;
    const Rope a(base), b(lin);
    for (size_t i = 0; i < a.inv_freq().size(); ++i)
      EXPECT_NEAR(b.inv_freq()[i], a.inv_freq()[i] / factor, 1e-15 * a.inv_freq()[i]);
    // Equivalently: position m under linear scaling is position m/factor unscaled.
    if (factor == 2.0) {
      std::vector<float> x(96, 0.5f), y(96, 0.5f);
      b.apply(x.data(), 1000);
      a.apply(y.data(), 500);
      for (int i = 0; i < 96; ++i) EXPECT_NEAR(x[size_t(i)], y[size_t(i)], 1e-6);
    }
  }
}

// llama.cpp's rope_freqs: each pair's base inverse frequency divided by its factor, before any
// scaling (linear and yarn scale every pair's frequency by the same rule either way).
TEST(Rope, FrequencyFactorsDivideEachPair) {
  RopeParams base;
  base.head_dim = 64;
  base.rotary_dim = 48;  // partial rotary: 24 pairs
  RopeParams ff = base;
  for (int i = 0; i < 24; ++i) ff.freq_factors.push_back(1.0f + 0.5f * static_cast<float>(i % 5));
  const Rope a(base), b(ff);
  for (size_t i = 0; i < a.inv_freq().size(); ++i)
    EXPECT_NEAR(b.inv_freq()[i], a.inv_freq()[i] / ff.freq_factors[i], 1e-15 * a.inv_freq()[i]) << i;
  RopeParams lin = ff, lin_base = base;
  lin.scaling = lin_base.scaling = RopeScaling::kLinear;
  lin.factor = lin_base.factor = 4.0;
  const Rope c(lin), d(lin_base);
  for (size_t i = 0; i < c.inv_freq().size(); ++i)
    EXPECT_NEAR(c.inv_freq()[i], d.inv_freq()[i] / ff.freq_factors[i], 1e-15 * d.inv_freq()[i]) << i;
  // Applying then removing is the identity up to rounding, and the channels past rotary_dim stay.
  std::vector<float> x(64), y;
  for (int i = 0; i < 64; ++i) x[size_t(i)] = std::sin(0.3f * static_cast<float>(i)) + 0.1f;
  y = x;
  b.apply(y.data(), 12345);
  for (int i = 48; i < 64; ++i) EXPECT_EQ(y[size_t(i)], x[size_t(i)]);
  b.remove(y.data(), 12345);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(y[size_t(i)], x[size_t(i)], 1e-5);
  // Pair i turns by position·inv_freq[i]: at position p with factor f, as position p/f without.
  std::vector<float> u(64, 0.f), v(64, 0.f);
  u[1] = v[1] = 1.f;  // pair 1 (split-half: channels 1 and 25)
  b.apply(u.data(), 1000);
  a.apply(v.data(), 1000);
  const double turned = std::atan2(u[25], u[1]), unscaled = std::atan2(v[25], v[1]);
  const double want = std::remainder(1000.0 * a.inv_freq()[1] / ff.freq_factors[1], 2 * M_PI);
  EXPECT_NEAR(turned, want, 1e-5);
  EXPECT_NE(turned, unscaled);
}

TEST(Rope, Llama3BandsFollowTheirRules) {
  // Llama-3.1 8B: theta 500000, head_dim 128, factor 8, low 1, high 4, original 8192.
  const RopeParams p = make(RopeLayout::kSplitHalf, RopeScaling::kLlama3, 128, 0);
  RopeParams unscaled = p;
  unscaled.scaling = RopeScaling::kNone;
  const Rope r(p), u(unscaled);
  const double low_wavelen = 8192.0 / 1.0, high_wavelen = 8192.0 / 4.0;
  int high = 0, low = 0, mid = 0;
  double previous_ratio = 2.0;
  for (size_t i = 0; i < r.inv_freq().size(); ++i) {
    const double f0 = u.inv_freq()[i];
    const double f = r.inv_freq()[i];
    const double wavelen = 2 * kPi / f0;
    const double ratio = f / f0;
    if (wavelen < high_wavelen) {
      EXPECT_EQ(f, f0) << i;  // untouched
      ++high;
    } else if (wavelen > low_wavelen) {
      EXPECT_NEAR(ratio, 1.0 / 8.0, 1e-15) << i;
      ++low;
    } else {
      EXPECT_GT(ratio, 1.0 / 8.0 - 1e-15) << i;
      EXPECT_LT(ratio, 1.0 + 1e-15) << i;
      // The blend weight is linear in orig/wavelen (the number of turns over the old context).
      const double s = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      EXPECT_NEAR(ratio, (1 - s) / 8.0 + s, 1e-12) << i;
      ++mid;
    }
    EXPECT_LE(ratio, previous_ratio + 1e-15) << "scale must fall monotonically with wavelength, i=" << i;
    previous_ratio = ratio;
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
}

TEST(Rope, DynamicNtkEqualsDefaultUpToOriginalLength) {
  auto rng = e8kv::test::seeded_rng(555);
  const RopeParams p = make(RopeLayout::kSplitHalf, RopeScaling::kDynamicNtk, 128, 0);
  RopeParams unscaled = p;
  unscaled.scaling = RopeScaling::kNone;
  const Rope d(p), u(unscaled);
  EXPECT_EQ(d.inv_freq(), u.inv_freq());
  EXPECT_EQ(d.inv_freq_at(4096), u.inv_freq());
  EXPECT_EQ(d.inv_freq_at(1), u.inv_freq());
  for (int64_t pos : {int64_t(0), int64_t(17), int64_t(4095)}) {
    const std::vector<float> x = gaussian(rng, 128);
    std::vector<float> a = x, b = x;
    d.apply(a.data(), pos, 4096);
    u.apply(b.data(), pos);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * 128), 0) << pos;
    a = x;
    d.apply(a.data(), pos);  // seq_len 0: length = pos + 1 <= 4096
    EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * 128), 0) << pos;
  }
  // Beyond the original length the base grows as HF's formula says, so frequencies fall.
  const std::vector<double> scaled = d.inv_freq_at(16384);
  const std::vector<double> ref = reference_inv_freq(p, 16384);
  EXPECT_EQ(scaled[0], 1.0);
  for (size_t i = 1; i < scaled.size(); ++i) {
    EXPECT_NEAR(scaled[i], ref[i], 1e-14 * ref[i]);
    EXPECT_LT(scaled[i], u.inv_freq()[i]);
  }
  // Position 5000 without seq_len uses length 5001 > 4096: scaled.
  const std::vector<float> x = gaussian(rng, 128);
  std::vector<float> a = x, b = x;
  d.apply(a.data(), 5000);
  d.apply(b.data(), 5000, 5001);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * 128), 0);
  u.apply(b.data(), 0);
  std::vector<float> c = x;
  u.apply(c.data(), 5000);
  EXPECT_GT(relative_diff(a, c), 1e-3);
}

TEST(Rope, YarnRampAndAttentionFactor) {
  RopeParams p;
  p.head_dim = 128;
  p.theta = 10000.0;
  p.scaling = RopeScaling::kYarn;
  p.factor = 4.0;
  p.original_max_position = 4096;
  const Rope y(p);
  EXPECT_NEAR(y.attention_factor(), 0.1 * std::log(4.0) + 1.0, 1e-15);
  RopeParams unscaled = p;
  unscaled.scaling = RopeScaling::kNone;
  const Rope u(unscaled);
  EXPECT_EQ(u.attention_factor(), 1.0);
  // Ramp bounds for these parameters: d(beta) = 128·ln(4096/(2π·beta)) / (2 ln 10000);
  // floor(d(32)) = 20, ceil(d(1)) = 46 (computed here independently of the library).
  const double d_fast = 128 * std::log(4096 / (2 * kPi * 32)) / (2 * std::log(10000.0));
  const double d_slow = 128 * std::log(4096 / (2 * kPi * 1)) / (2 * std::log(10000.0));
  const int lo = int(std::floor(d_fast)), hi = int(std::ceil(d_slow));
  ASSERT_EQ(lo, 20);
  ASSERT_EQ(hi, 46);
  for (int i = 0; i < 64; ++i) {
    const double f0 = u.inv_freq()[size_t(i)];
    const double f = y.inv_freq()[size_t(i)];
    if (i <= lo) {
      EXPECT_NEAR(f, f0, 1e-15 * f0) << i;  // extrapolated: unchanged high frequencies
    } else if (i >= hi) {
      EXPECT_NEAR(f, f0 / 4.0, 1e-15 * f0) << i;  // interpolated: divided by factor
    } else {
      const double t = double(i - lo) / (hi - lo);  // the linear ramp
      EXPECT_NEAR(f, f0 * (t / 4.0 + (1 - t)), 1e-14 * f0) << i;
    }
  }
  // An explicit attention factor is used as given; factor 1 gives the default frequencies.
  p.attention_factor = 1.25;
  EXPECT_EQ(Rope(p).attention_factor(), 1.25);
  p.attention_factor = 0;
  p.factor = 1.0;
  const Rope y1(p);
  EXPECT_EQ(y1.attention_factor(), 1.0);
  for (size_t i = 0; i < 64; ++i) EXPECT_NEAR(y1.inv_freq()[i], u.inv_freq()[i], 1e-15 * u.inv_freq()[i]);
  // Non-yarn scalings have attention factor 1.
  EXPECT_EQ(Rope(make(RopeLayout::kSplitHalf, RopeScaling::kLlama3, 128, 0)).attention_factor(), 1.0);
}

// ---- batched path against the scalar reference path ------------------------------------------

TEST(Rope, BatchMatchesScalarPath) {
  auto rng = e8kv::test::seeded_rng(8080);
  std::uniform_int_distribution<int64_t> any_pos(0, (int64_t(1) << 20) - 1);
  for (const RopeParams& p : all_configs()) {
    const Rope rope(p);
    const Rope copy = rope;  // copies share the lazily built tables
    const int d = p.head_dim;
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(61)}) {
      const int64_t stride = d + (n % 2 ? 3 : 0);
      std::vector<int64_t> pos(static_cast<size_t>(n));
      const int64_t special[] = {0, 1, 1023, 1024, 1025, (int64_t(1) << 20) - 1, int64_t(1) << 20, 1000000,
                                 -5, 3000000, std::numeric_limits<int64_t>::max()};
      for (int64_t k = 0; k < n; ++k) pos[size_t(k)] = k < 11 ? special[k] : any_pos(rng);
      std::vector<float> x = gaussian(rng, size_t(std::max<int64_t>(n * stride, 1)));
      const std::vector<float> original = x;
      for (bool remove : {false, true}) {
        for (int64_t seq_len : {int64_t(0), int64_t(10000)}) {
          x = original;
          if (remove) {
            copy.remove_batch(x.data(), pos.data(), n, stride, seq_len);
          } else {
            rope.apply_batch(x.data(), pos.data(), n, stride, seq_len);
          }
          for (int64_t k = 0; k < n; ++k) {
            std::vector<float> ref(original.begin() + k * stride, original.begin() + k * stride + d);
            if (remove) {
              rope.remove(ref.data(), pos[size_t(k)], seq_len);
            } else {
              rope.apply(ref.data(), pos[size_t(k)], seq_len);
            }
            const std::vector<float> got(x.begin() + k * stride, x.begin() + k * stride + d);
            ASSERT_LT(relative_diff(got, ref), 1e-6) << describe(p) << " pos=" << pos[size_t(k)];
            // Padding between head_dim and stride is untouched.
            for (int64_t j = d; j < stride; ++j)
              ASSERT_EQ(x[size_t(k * stride + j)], original[size_t(k * stride + j)]);
            // Unrotated dims are bit-exact in the batched path too.
            const int rd = rope.rotary_dim();
            ASSERT_EQ(std::memcmp(&x[size_t(k * stride + rd)], &original[size_t(k * stride + rd)],
                                  sizeof(float) * size_t(d - rd)),
                      0);
          }
        }
      }
      // Batched round trip.
      x = original;
      rope.apply_batch(x.data(), pos.data(), n, stride);
      rope.remove_batch(x.data(), pos.data(), n, stride);
      if (n > 0) {
        ASSERT_LT(relative_diff(x, original), 1e-5) << describe(p);
      }
    }
  }
}

TEST(Rope, BatchRejectsBadArguments) {
  const Rope rope{RopeParams{}};
  std::vector<float> x(256);
  int64_t pos[2] = {0, 1};
  EXPECT_THROW(rope.apply_batch(x.data(), pos, 2, 127), e8kv::Error);
  EXPECT_THROW(rope.apply_batch(nullptr, pos, 2, 128), e8kv::Error);
  EXPECT_THROW(rope.apply_batch(x.data(), nullptr, 2, 128), e8kv::Error);
  EXPECT_THROW(rope.remove_batch(x.data(), pos, -1, 128), e8kv::Error);
  EXPECT_THROW(rope.remove_batch(x.data(), pos, 2, 128, -3), e8kv::Error);
  EXPECT_NO_THROW(rope.remove_batch(nullptr, nullptr, 0, 0));
  EXPECT_THROW(rope.apply(nullptr, 0), e8kv::Error);
  EXPECT_THROW(rope.apply(x.data(), 0, -1), e8kv::Error);
  EXPECT_THROW(rope.inv_freq_at(-1), e8kv::Error);
}

// ---- bad input values and bad parameters -------------------------------------------------------

TEST(Rope, NonFiniteValuesStayInTheirPair) {
  RopeParams p;
  p.head_dim = 8;
  const Rope rope(p);
  float x[8] = {std::numeric_limits<float>::quiet_NaN(), 1, 2, 3, 4, 5, 6, 7};
  rope.apply(x, 12345);
  // Pair (0, 4) is NaN; the others stay finite.
  EXPECT_TRUE(std::isnan(x[0]) && std::isnan(x[4]));
  for (int i : {1, 2, 3, 5, 6, 7}) EXPECT_TRUE(std::isfinite(x[i])) << i;
  float y[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  rope.apply(y, std::numeric_limits<int64_t>::max());  // huge positions: defined, finite
  rope.apply(y, std::numeric_limits<int64_t>::min());
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
}

TEST(Rope, InvalidParametersThrowNamingTheField) {
  auto expect_error = [](RopeParams p, const char* field) {
    try {
      Rope r(p);
      ADD_FAILURE() << "no error for " << field;
    } catch (const e8kv::Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  RopeParams p;
  p.rotary_dim = 63;
  expect_error(p, "rotary_dim");  // odd
  p.rotary_dim = 130;
  expect_error(p, "rotary_dim");  // > head_dim
  p.rotary_dim = -2;
  expect_error(p, "rotary_dim");
  p = RopeParams{};
  p.head_dim = 0;
  expect_error(p, "head_dim");
  p.head_dim = 4096;
  expect_error(p, "head_dim");
  p = RopeParams{};
  p.head_dim = 7;  // rotary_dim 0 -> 7: odd
  expect_error(p, "rotary_dim");
  p.rotary_dim = 6;  // partial rotary of an odd head is fine
  EXPECT_NO_THROW(Rope{p});
  for (double theta : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    p = RopeParams{};
    p.theta = theta;
    expect_error(p, "theta");
  }
  p = RopeParams{};
  p.layout = static_cast<RopeLayout>(7);
  expect_error(p, "layout");
  p = RopeParams{};
  p.scaling = static_cast<RopeScaling>(9);
  expect_error(p, "scaling");
  p = RopeParams{};
  p.freq_factors.assign(63, 1.f);  // 64 pairs at head_dim 128
  expect_error(p, "freq_factors");
  p.freq_factors.assign(64, 1.f);
  EXPECT_NO_THROW(Rope{p});
  for (float bad : {0.f, -1.f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    p.freq_factors[7] = bad;
    expect_error(p, "freq_factors");
  }

  for (RopeScaling s : {RopeScaling::kLinear, RopeScaling::kDynamicNtk, RopeScaling::kLlama3, RopeScaling::kYarn}) {
    p = make(RopeLayout::kSplitHalf, s, 128, 0);
    EXPECT_NO_THROW(Rope{p});
    p.factor = 0.5;
    expect_error(p, "factor");
    p.factor = std::nan("");
    expect_error(p, "factor");
    if (s != RopeScaling::kLinear) {
      p = make(RopeLayout::kSplitHalf, s, 128, 0);
      p.original_max_position = 0;
      expect_error(p, "original_max_position");
    }
  }
  p = make(RopeLayout::kSplitHalf, RopeScaling::kDynamicNtk, 128, 2);
  expect_error(p, "rotary_dim");  // exponent d/(d-2) undefined
  p = make(RopeLayout::kSplitHalf, RopeScaling::kLlama3, 128, 0);
  p.high_freq_factor = p.low_freq_factor;
  expect_error(p, "high_freq_factor");
  p = make(RopeLayout::kSplitHalf, RopeScaling::kLlama3, 128, 0);
  p.low_freq_factor = 0;
  expect_error(p, "low_freq_factor");
  p = make(RopeLayout::kSplitHalf, RopeScaling::kYarn, 128, 0);
  p.beta_fast = 0.5;  // below beta_slow
  expect_error(p, "beta_fast");
  p = make(RopeLayout::kSplitHalf, RopeScaling::kYarn, 128, 0);
  p.beta_slow = 0;
  expect_error(p, "beta_slow");
  p = make(RopeLayout::kSplitHalf, RopeScaling::kYarn, 128, 0);
  p.attention_factor = -1;
  expect_error(p, "attention_factor");
  p = make(RopeLayout::kSplitHalf, RopeScaling::kYarn, 128, 0);
  p.theta = 1.0;
  expect_error(p, "theta");
  // Scaling fields are ignored without scaling.
  p = RopeParams{};
  p.factor = -3;
  p.original_max_position = -1;
  EXPECT_NO_THROW(Rope{p});
}

}  // namespace
