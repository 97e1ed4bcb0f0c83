// Tests of the orthonormal FWHT and the randomized Hadamard rotation: the small Paley factors,
// agreement with an independently built dense matrix (double), orthogonality, energy, exact
// inverse, the fixed operation order (bit for bit), sign masks, batches and error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/transform/hadamard.hpp"
#include "testing/test_util.hpp"

namespace {
using e8kv::transform::RandomizedHadamard;

const std::vector<int> kDims = {32, 64, 80, 96, 112, 128, 160, 192, 256, 512};

// ---- independent references -------------------------------------------------------------

// Legendre symbol by Euler's criterion v^((q-1)/2) mod q (independent of the header's mask).
int legendre(int v, int q) {
  v = ((v % q) + q) % q;
  if (v == 0) return 0;
  long long r = 1, b = v;
  for (int e = (q - 1) / 2; e > 0; e >>= 1, b = b * b % q)
    if (e & 1) r = r * b % q;
  return r == 1 ? 1 : -1;
}

using Matrix = std::vector<std::vector<int>>;

// Paley I, q ≡ 3 mod 4: Q[i][j] = χ(j - i); S = [[0, 1ᵀ], [-1, Q]]; H = I + S.
Matrix paley1(int q) {
  const int n = q + 1;
  Matrix h(n, std::vector<int>(n));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      int s;
      if (i == 0) s = (j == 0) ? 0 : 1;
      else if (j == 0) s = -1;
      else s = legendre(j - i, q);
      h[i][j] = s + (i == j ? 1 : 0);
    }
  return h;
}

// Paley II, q ≡ 1 mod 4: C = [[0, 1ᵀ], [1, Q]]; each 0 -> [[1,1],[1,-1]], ±1 -> ±[[1,-1],[-1,-1]].
Matrix paley2(int q) {
  const int n = q + 1;
  Matrix c(n, std::vector<int>(n));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) c[i][j] = (i == j) ? 0 : (i == 0 || j == 0) ? 1 : legendre(j - i, q);
  const int zero_block[2][2] = {{1, 1}, {1, -1}};
  const int one_block[2][2] = {{1, -1}, {-1, -1}};
  Matrix h(2 * n, std::vector<int>(2 * n));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      for (int s = 0; s < 2; ++s)
        for (int t = 0; t < 2; ++t)
          h[2 * i + s][2 * j + t] = c[i][j] == 0 ? zero_block[s][t] : c[i][j] * one_block[s][t];
  return h;
}

Matrix small_reference(int m) {
  if (m == 12) return paley1(11);
  if (m == 20) return paley1(19);
  if (m == 28) return paley2(13);
  return Matrix(1, std::vector<int>(1, 1));
}

int small_factor_of(int d) {
  for (int m : {12, 20, 28})
    if (d % m == 0) return m;
  return 1;
}

// Dense orthonormal H_d = (H_m ⊗ Sylvester_p)/√d in double.
std::vector<double> dense_hadamard(int d) {
  const int m = small_factor_of(d), p = d / m;
  const Matrix hm = small_reference(m);
  std::vector<double> h(static_cast<size_t>(d) * d);
  const double s = 1.0 / std::sqrt(static_cast<double>(d));
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      const int syl = (__builtin_popcount(static_cast<unsigned>((i % p) & (j % p))) & 1) ? -1 : 1;
      h[static_cast<size_t>(i) * d + j] = hm[i / p][j / p] * syl * s;
    }
  return h;
}

std::vector<float> gaussian(std::mt19937_64& rng, size_t n, double sigma = 1.0) {
  std::normal_distribution<double> g(0.0, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(g(rng));
  return v;
}

// portable: the plain-C++ code that device builds run (no SSE2 branch).
void fwht_runtime(int d, float* x, bool inverse, bool portable = false) {
  using e8kv::transform::detail::hadamard_orthonormal;
  switch (d) {
#define CASE(N)                                                         \
  case N:                                                               \
    if (portable)                                                       \
      inverse ? hadamard_orthonormal<N, true, true>(x) : hadamard_orthonormal<N, false, true>(x); \
    else                                                                \
      inverse ? e8kv::transform::fwht_orthonormal_inverse<N>(x) : e8kv::transform::fwht_orthonormal<N>(x); \
    break;
    CASE(32) CASE(64) CASE(80) CASE(96) CASE(112) CASE(128) CASE(160) CASE(192) CASE(256) CASE(512)
#undef CASE
    default: FAIL() << "no case for " << d;
  }
}

// Plain radix-2 implementation of the documented operation order (signs, butterflies lowest
// bit first on each chunk, dense step summed in order, scale), for a bit-exact comparison.
std::vector<float> reference_in_documented_order(int d, const std::vector<float>& x, const std::vector<bool>& neg,
                                                 bool transpose) {
  const int m = small_factor_of(d), p = d / m;
  const Matrix hm = small_reference(m);
  std::vector<float> v(x);
  if (!transpose)
    for (int i = 0; i < d; ++i)
      if (neg[i]) v[i] = -v[i];
  for (int a = 0; a < m; ++a)
    for (int h = 1; h < p; h *= 2)
      for (int i = 0; i < p; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const float u = v[a * p + j], w = v[a * p + j + h];
          v[a * p + j] = u + w;
          v[a * p + j + h] = u - w;
        }
  std::vector<float> out(v);
  if (m > 1)
    for (int a = 0; a < m; ++a)
      for (int b = 0; b < p; ++b) {
        float acc = 0;
        for (int c = 0; c < m; ++c) {
          const int sign = transpose ? hm[c][a] : hm[a][c];
          const float term = v[c * p + b];
          acc = c == 0 ? (sign < 0 ? -term : term) : (sign < 0 ? acc - term : acc + term);
        }
        out[a * p + b] = acc;
      }
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (auto& o : out) o = o * scale;
  if (transpose)
    for (int i = 0; i < d; ++i)
      if (neg[i]) out[i] = -out[i];
  return out;
}

std::vector<bool> negations(const RandomizedHadamard& rh) {
  std::vector<bool> n(static_cast<size_t>(rh.dim()));
  for (int i = 0; i < rh.dim(); ++i) n[i] = rh.negates(i);
  return n;
}

// Bitwise float equality that treats every NaN alike.
bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

// ---- tests ---------------------------------------------------------------------------------

TEST(Hadamard, QuadraticResidueMasksMatchEulerCriterion) {
  for (int q : {11, 13, 19}) {
    const uint32_t mask = e8kv::transform::detail::quadratic_residue_mask(q);
    for (int v = 0; v < q; ++v) EXPECT_EQ((mask >> v) & 1u, legendre(v, q) == 1 ? 1u : 0u) << q << " " << v;
  }
}

TEST(Hadamard, SmallFactorsAreHadamardAndMatchIndependentPaley) {
  for (int m : {12, 20, 28}) {
    const Matrix ref = small_reference(m);
    ASSERT_EQ(static_cast<int>(ref.size()), m);
    // The independent reference is itself a Hadamard matrix: H·Hᵀ = m·I.
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j) {
        int dot = 0;
        for (int k = 0; k < m; ++k) dot += ref[i][k] * ref[j][k];
        ASSERT_EQ(dot, i == j ? m : 0) << "m=" << m << " (" << i << "," << j << ")";
      }
    // The header's entries: same matrix, and Hadamard on their own.
    std::vector<std::vector<int>> h(m, std::vector<int>(m));
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j) {
        h[i][j] = e8kv::transform::small_hadamard_negative(m, i, j) ? -1 : 1;
        EXPECT_EQ(h[i][j], ref[i][j]) << "m=" << m << " (" << i << "," << j << ")";
      }
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j) {
        int dot = 0;
        for (int k = 0; k < m; ++k) dot += h[i][k] * h[j][k];
        EXPECT_EQ(dot, i == j ? m : 0);
      }
  }
  // Paley I factors are not symmetric (the inverse must use the transpose).
  EXPECT_NE(e8kv::transform::small_hadamard_negative(12, 0, 1), e8kv::transform::small_hadamard_negative(12, 1, 0));
}

TEST(Hadamard, FactorizationTable) {
  using e8kv::transform::hadamard_small_factor;
  const int expect[][2] = {{32, 1},  {64, 1},   {80, 20},  {96, 12},  {112, 28},
                           {128, 1}, {160, 20}, {192, 12}, {256, 1}, {512, 1}};
  for (const auto& e : expect) {
    EXPECT_TRUE(e8kv::transform::is_supported_hadamard_dim(e[0]));
    EXPECT_EQ(hadamard_small_factor(e[0]), e[1]);
    const int p = e[0] / e[1];
    EXPECT_EQ(p & (p - 1), 0) << e[0];
  }
  for (int d : {-1, 0, 1, 8, 16, 48, 100, 120, 384, 1024}) {
    EXPECT_FALSE(e8kv::transform::is_supported_hadamard_dim(d)) << d;
    EXPECT_EQ(hadamard_small_factor(d), 0);
  }
}

TEST(Hadamard, ScaleIsRoundedInverseSqrt) {
  for (int d : kDims)
    EXPECT_EQ(e8kv::transform::detail::inverse_sqrt_dim(d), static_cast<float>(1.0 / std::sqrt(double(d)))) << d;
}

TEST(Hadamard, MatchesDenseMatrixProductInDouble) {
  auto rng = e8kv::test::seeded_rng(101);
  for (int d : kDims) {
    const auto h = dense_hadamard(d);
    for (int trial = 0; trial < 20; ++trial) {
      const auto x = gaussian(rng, d, trial % 2 ? 1.0 : 100.0);
      std::vector<float> y(x), yt(x);
      fwht_runtime(d, y.data(), false);
      fwht_runtime(d, yt.data(), true);
      double norm = 0;
      for (float v : x) norm += double(v) * v;
      const double tol = 1e-6 * std::sqrt(norm);  // a few float ulps of the output's rms
      for (int i = 0; i < d; ++i) {
        double ref = 0, ref_t = 0;
        for (int j = 0; j < d; ++j) {
          ref += h[static_cast<size_t>(i) * d + j] * x[j];
          ref_t += h[static_cast<size_t>(j) * d + i] * x[j];
        }
        ASSERT_NEAR(y[i], ref, tol) << "d=" << d << " i=" << i;
        ASSERT_NEAR(yt[i], ref_t, tol) << "transpose d=" << d << " i=" << i;
      }
    }
  }
}

TEST(Hadamard, ColumnsAreOrthonormal) {
  for (int d : kDims) {
    // Column j of the transform's matrix is its image of the unit vector e_j.
    std::vector<std::vector<double>> cols(d);
    for (int j = 0; j < d; ++j) {
      std::vector<float> e(d, 0.0f);
      e[j] = 1.0f;
      fwht_runtime(d, e.data(), false);
      cols[j].assign(e.begin(), e.end());
    }
    double worst = 0;
    for (int i = 0; i < d; ++i)
      for (int j = i; j < d; ++j) {
        double dot = 0;
        for (int k = 0; k < d; ++k) dot += cols[i][k] * cols[j][k];
        worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
      }
    EXPECT_LT(worst, 1e-5) << "d=" << d;
  }
}

TEST(Hadamard, RandomizedPreservesEnergyAndInvertsExactly) {
  auto rng = e8kv::test::seeded_rng(102);
  for (int d : kDims) {
    const RandomizedHadamard rh(d, 0x1234u + d);
    for (int trial = 0; trial < 50; ++trial) {
      const auto x = gaussian(rng, d, trial % 3 == 0 ? 1e-3 : trial % 3 == 1 ? 1.0 : 1e4);
      std::vector<float> y(d), back(d);
      rh.forward(x.data(), y.data());
      rh.inverse(y.data(), back.data());
      double ex = 0, ey = 0, err = 0;
      for (int i = 0; i < d; ++i) {
        ex += double(x[i]) * x[i];
        ey += double(y[i]) * y[i];
        err += (double(back[i]) - x[i]) * (double(back[i]) - x[i]);
      }
      ASSERT_NEAR(ey, ex, 1e-5 * ex) << "d=" << d;
      ASSERT_LE(std::sqrt(err), 1e-5 * std::sqrt(ex)) << "d=" << d;
      // Per element too.
      for (int i = 0; i < d; ++i) ASSERT_NEAR(back[i], x[i], 1e-5 * std::sqrt(ex / d) * 4) << "d=" << d;
    }
  }
}

TEST(Hadamard, RandomizedEqualsDenseProductWithSigns) {
  auto rng = e8kv::test::seeded_rng(103);
  for (int d : kDims) {
    const RandomizedHadamard rh(d, 77);
    const auto h = dense_hadamard(d);
    const auto x = gaussian(rng, d);
    std::vector<float> y(d);
    rh.forward(x.data(), y.data());
    for (int i = 0; i < d; ++i) {
      double ref = 0;
      for (int j = 0; j < d; ++j) ref += h[static_cast<size_t>(i) * d + j] * (rh.negates(j) ? -x[j] : x[j]);
      ASSERT_NEAR(y[i], ref, 1e-5) << "d=" << d << " i=" << i;
    }
  }
}

TEST(Hadamard, FollowsTheDocumentedOperationOrderBitForBit) {
  auto rng = e8kv::test::seeded_rng(104);
  for (int d : kDims) {
    for (uint64_t seed : {0ull, 1ull, 0xDEADBEEFull}) {
      const RandomizedHadamard rh(d, seed);
      const auto neg = negations(rh);
      const auto x = gaussian(rng, d, 3.0);
      std::vector<float> y(d), z(d);
      rh.forward(x.data(), y.data());
      rh.inverse(x.data(), z.data());
      const auto ry = reference_in_documented_order(d, x, neg, false);
      const auto rz = reference_in_documented_order(d, x, neg, true);
      for (int i = 0; i < d; ++i) {
        ASSERT_TRUE(same_bits(y[i], ry[i])) << "forward d=" << d << " i=" << i << " " << y[i] << " vs " << ry[i];
        ASSERT_TRUE(same_bits(z[i], rz[i])) << "inverse d=" << d << " i=" << i;
      }
      // The device-usable free functions give the same bits as the class.
      std::vector<float> w(x);
      ASSERT_TRUE(e8kv::transform::randomized_hadamard_forward(d, rh.sign_bits(), w.data()));
      for (int i = 0; i < d; ++i) ASSERT_TRUE(same_bits(w[i], y[i])) << "free forward d=" << d;
      w = x;
      ASSERT_TRUE(e8kv::transform::randomized_hadamard_inverse(d, rh.sign_bits(), w.data()));
      for (int i = 0; i < d; ++i) ASSERT_TRUE(same_bits(w[i], z[i])) << "free inverse d=" << d;
    }
  }
}

TEST(Hadamard, PortableCodeMatchesTheHostFastPathBitForBit) {
  auto rng = e8kv::test::seeded_rng(108);
  for (int d : kDims)
    for (int trial = 0; trial < 20; ++trial)
      for (bool inverse : {false, true}) {
        const auto x = gaussian(rng, d, trial % 2 ? 1.0 : 1e-3);
        std::vector<float> fast(x), portable(x);
        fwht_runtime(d, fast.data(), inverse);
        fwht_runtime(d, portable.data(), inverse, true);
        for (int i = 0; i < d; ++i) ASSERT_TRUE(same_bits(fast[i], portable[i])) << "d=" << d << " i=" << i;
      }
}

TEST(Hadamard, Splitmix64MatchesPublishedFirstOutputs) {
  // splitmix64 seeded with 0: the first outputs as published with the reference implementation.
  uint64_t state = 0;
  EXPECT_EQ(e8kv::transform::detail::splitmix64(state), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(e8kv::transform::detail::splitmix64(state), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(e8kv::transform::detail::splitmix64(state), 0x06C45D188009454Full);
}

TEST(Hadamard, SignMaskLayout) {
  for (int d : kDims) {
    const RandomizedHadamard rh(d, 42);
    ASSERT_EQ(rh.sign_word_count(), static_cast<size_t>((d + 31) / 32));
    uint64_t state = 42;
    std::vector<uint32_t> expect;
    while (expect.size() < rh.sign_word_count()) {
      const uint64_t r = e8kv::transform::detail::splitmix64(state);
      expect.push_back(static_cast<uint32_t>(r));
      expect.push_back(static_cast<uint32_t>(r >> 32));
    }
    for (size_t w = 0; w < rh.sign_word_count(); ++w) {
      uint32_t e = expect[w];
      const int valid = std::min(32, d - static_cast<int>(32 * w));
      if (valid < 32) e &= (1u << valid) - 1u;  // bits past d are zero
      EXPECT_EQ(rh.sign_bits()[w], e) << "d=" << d << " word " << w;
    }
    for (int i = 0; i < d; ++i) EXPECT_EQ(rh.negates(i), ((rh.sign_bits()[i / 32] >> (i % 32)) & 1u) != 0);
    EXPECT_FALSE(rh.negates(-1));
    EXPECT_FALSE(rh.negates(d));
  }
}

TEST(Hadamard, SeedChangesSignsAndOutput) {
  auto rng = e8kv::test::seeded_rng(105);
  for (int d : kDims) {
    const auto x = gaussian(rng, d);
    const RandomizedHadamard a(d, 1), b(d, 2);
    int differing_bits = 0;
    for (int i = 0; i < d; ++i) differing_bits += a.negates(i) != b.negates(i);
    EXPECT_GT(differing_bits, d / 4) << d;  // about d/2 for independent masks
    EXPECT_LT(differing_bits, 3 * d / 4) << d;
    std::vector<float> ya(d), yb(d);
    a.forward(x.data(), ya.data());
    b.forward(x.data(), yb.data());
    EXPECT_NE(ya, yb) << d;
  }
  // Across many seeds, each coordinate is negated about half of the time.
  int negated = 0;
  for (uint64_t s = 0; s < 200; ++s) {
    const RandomizedHadamard r(128, s);
    for (int i = 0; i < 128; ++i) negated += r.negates(i);
  }
  EXPECT_NEAR(negated / (200.0 * 128.0), 0.5, 0.02);
}

TEST(Hadamard, DeterministicForEqualSeeds) {
  auto rng = e8kv::test::seeded_rng(106);
  for (int d : kDims) {
    const RandomizedHadamard a(d, 987654321), b(d, 987654321);
    ASSERT_EQ(a.dim(), d);
    ASSERT_EQ(a.seed(), 987654321u);
    for (size_t w = 0; w < a.sign_word_count(); ++w) ASSERT_EQ(a.sign_bits()[w], b.sign_bits()[w]);
    const auto x = gaussian(rng, d);
    std::vector<float> ya(d), yb(d);
    a.forward(x.data(), ya.data());
    b.forward(x.data(), yb.data());
    ASSERT_EQ(0, std::memcmp(ya.data(), yb.data(), d * sizeof(float)));
    a.forward(x.data(), yb.data());  // repeated call on the same object
    ASSERT_EQ(0, std::memcmp(ya.data(), yb.data(), d * sizeof(float)));
  }
}

TEST(Hadamard, BatchesMatchSingleVectorsAndRespectStride) {
  auto rng = e8kv::test::seeded_rng(107);
  for (int d : kDims) {
    const RandomizedHadamard rh(d, 5);
    for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(17)}) {
      const size_t stride = static_cast<size_t>(d) + 7;  // gaps must stay untouched
      auto x = gaussian(rng, n * stride + 1);
      const float sentinel = 12345.0f;
      std::vector<float> y(n * stride + 1, sentinel);
      rh.forward_batch(x.data(), y.data(), n, stride);
      for (size_t v = 0; v < n; ++v) {
        std::vector<float> single(d);
        rh.forward(&x[v * stride], single.data());
        ASSERT_EQ(0, std::memcmp(single.data(), &y[v * stride], d * sizeof(float))) << d << " " << v;
        for (size_t g = d; g < stride; ++g) ASSERT_EQ(y[v * stride + g], sentinel);
      }
      ASSERT_EQ(y.back(), sentinel);
      // In place, then back.
      std::vector<float> inplace(x);
      rh.forward_batch(inplace.data(), inplace.data(), n, stride);
      for (size_t v = 0; v < n; ++v)
        ASSERT_EQ(0, std::memcmp(&inplace[v * stride], &y[v * stride], d * sizeof(float)));
      rh.inverse_batch(inplace.data(), inplace.data(), n, stride);
      for (size_t v = 0; v < n; ++v) {
        for (int i = 0; i < d; ++i) ASSERT_NEAR(inplace[v * stride + i], x[v * stride + i], 1e-5);
        for (size_t g = d; g < stride; ++g) ASSERT_EQ(inplace[v * stride + g], x[v * stride + g]);
      }
    }
  }
}

TEST(Hadamard, UnsupportedDimsThrowListingSupportedOnes) {
  for (int d : {0, 8, 100, 1024, -1}) {
    try {
      RandomizedHadamard rh(d, 1);
      FAIL() << "no exception for dim " << d;
    } catch (const e8kv::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::to_string(d)), std::string::npos) << msg;
      EXPECT_NE(msg.find(e8kv::transform::supported_hadamard_dims()), std::string::npos) << msg;
    }
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const uint32_t bits[1] = {0};
    EXPECT_FALSE(e8kv::transform::randomized_hadamard_forward(d, bits, x));
    EXPECT_FALSE(e8kv::transform::randomized_hadamard_inverse(d, bits, x));
    EXPECT_EQ(x[0], 1.0f);  // untouched
  }
  EXPECT_EQ(e8kv::transform::supported_hadamard_dims(), "32, 64, 80, 96, 112, 128, 160, 192, 256, 512");
}

TEST(Hadamard, BadBatchArgumentsThrow) {
  const RandomizedHadamard rh(64, 3);
  std::vector<float> buf(64 * 4);
  EXPECT_THROW(rh.forward_batch(buf.data(), buf.data(), 2, 63), e8kv::Error);
  EXPECT_THROW(rh.inverse_batch(buf.data(), buf.data(), 2, 10), e8kv::Error);
  EXPECT_THROW(rh.forward(nullptr, buf.data()), e8kv::Error);
  EXPECT_THROW(rh.inverse(buf.data(), nullptr), e8kv::Error);
  EXPECT_NO_THROW(rh.forward_batch(nullptr, nullptr, 0, 0));  // nothing to do
  EXPECT_NO_THROW(rh.forward_batch(buf.data(), buf.data(), 1, 0));  // stride unused for one vector
}

TEST(Hadamard, NonFiniteInputSpreadsWithoutUB) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int d : kDims) {
    const RandomizedHadamard rh(d, 9);
    std::vector<float> x(d, 0.5f), y(d);
    x[d / 3] = nan;
    rh.forward(x.data(), y.data());
    for (float v : y) EXPECT_TRUE(std::isnan(v)) << d;
    x[d / 3] = inf;
    rh.forward(x.data(), y.data());
    for (float v : y) EXPECT_FALSE(std::isfinite(v)) << d;
  }
}

}  // namespace
