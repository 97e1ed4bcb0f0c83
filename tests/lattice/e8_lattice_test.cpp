// Tests of the D8/E8 nearest-point functions: membership, a global optimality certificate
// over the 240 roots, brute force, adversarial inputs and translation covariance.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "e8kv/lattice/e8.hpp"
#include "testing/test_util.hpp"

namespace {
using e8kv::lattice::is_e8;
using e8kv::lattice::nearest_d8;
using e8kv::lattice::nearest_e8;

using Vec = std::array<double, 8>;

// The 240 minimal vectors of E8: ±e_i ± e_j (112) and (±½)^8 with an even number of minus
// signs (128). For E8 these are exactly the Voronoi-relevant vectors.
std::vector<Vec> e8_roots() {
  std::vector<Vec> roots;
  for (int i = 0; i < 8; ++i)
    for (int j = i + 1; j < 8; ++j)
      for (int si : {-1, 1})
        for (int sj : {-1, 1}) {
          Vec v{};
          v[i] = si;
          v[j] = sj;
          roots.push_back(v);
        }
  for (int m = 0; m < 256; ++m) {
    if (__builtin_popcount(m) % 2) continue;
    Vec v{};
    for (int i = 0; i < 8; ++i) v[i] = (m >> i & 1) ? -0.5 : 0.5;
    roots.push_back(v);
  }
  return roots;
}

template <class T>
double dist2(const T* x, const Vec& y) {
  double s = 0;
  for (int i = 0; i < 8; ++i) s += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  return s;
}

TEST(E8Lattice, RootsAreInTheLattice) {
  const auto roots = e8_roots();
  ASSERT_EQ(roots.size(), 240u);
  for (const auto& r : roots) {
    EXPECT_TRUE(is_e8(r.data()));
    double n = 0;
    for (double v : r) n += v * v;
    EXPECT_EQ(n, 2.0);
  }
}

TEST(E8Lattice, MembershipRejectsNonPoints) {
  const double odd_sum[8] = {1, 0, 0, 0, 0, 0, 0, 0};
  const double mixed[8] = {0.5, 0, 0, 0, 0, 0, 0, 0.5};
  const double odd_half[8] = {-0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
  EXPECT_FALSE(is_e8(odd_sum));
  EXPECT_FALSE(is_e8(mixed));
  EXPECT_FALSE(is_e8(odd_half));
}

// Global optimality: no root moves the output closer to the input.
template <class T>
void check_certificate(uint64_t seed, double spread, int n) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<double> g(0.0, spread);
  const auto roots = e8_roots();
  for (int t = 0; t < n; ++t) {
    T x[8], y[8];
    for (auto& v : x) v = static_cast<T>(g(rng));
    nearest_e8(x, y);
    ASSERT_TRUE(is_e8(y));
    Vec yv;
    for (int i = 0; i < 8; ++i) yv[i] = y[i];
    const double d = dist2(x, yv);
    for (const auto& r : roots) {
      Vec z;
      for (int i = 0; i < 8; ++i) z[i] = yv[i] + r[i];
      ASSERT_GE(dist2(x, z), d - 1e-9) << "sample " << t;
    }
  }
}

TEST(E8Lattice, OptimalityCertificateFloat) { check_certificate<float>(11, 1.0, 20000); }
TEST(E8Lattice, OptimalityCertificateDouble) { check_certificate<double>(12, 3.0, 20000); }

// Brute force: every lattice point within a box around the input.
TEST(E8Lattice, BruteForceAgreesOnRandomInputs) {
  auto rng = e8kv::test::seeded_rng(13);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  for (int t = 0; t < 300; ++t) {
    double x[8], y[8];
    for (auto& v : x) v = u(rng);
    nearest_e8(x, y);
    double best = std::numeric_limits<double>::infinity();
    // Candidates: each coordinate within ±1 of floor(x) (integer coset) or floor(x)+½ ±1.
    for (int coset = 0; coset < 2; ++coset) {
      const double off = coset ? 0.5 : 0.0;
      int base[8];
      for (int i = 0; i < 8; ++i) base[i] = static_cast<int>(std::floor(x[i] - off));
      for (int code = 0; code < 6561; ++code) {  // 3^8 offset choices per coordinate
        Vec z;
        int c = code, s2 = 0;
        for (int i = 0; i < 8; ++i) {
          const int k = base[i] + (c % 3) - 1;  // floor-1 .. floor+1 (covering radius 1)
          c /= 3;
          z[i] = k + off;
          s2 += static_cast<int>(2 * z[i]);
        }
        if (s2 % 4 != 0) continue;
        best = std::min(best, dist2(x, z));
      }
    }
    Vec yv;
    for (int i = 0; i < 8; ++i) yv[i] = y[i];
    ASSERT_NEAR(dist2(x, yv), best, 1e-12) << "sample " << t;
  }
}

TEST(E8Lattice, D8OutputHasEvenSumAndIsNearest) {
  auto rng = e8kv::test::seeded_rng(14);
  std::normal_distribution<double> g(0.0, 2.0);
  for (int t = 0; t < 5000; ++t) {
    double x[8], y[8];
    for (auto& v : x) v = g(rng);
    nearest_d8(x, y);
    double s = 0, d = 0;
    for (int i = 0; i < 8; ++i) {
      ASSERT_EQ(y[i], std::round(y[i]));
      s += y[i];
      d += (x[i] - y[i]) * (x[i] - y[i]);
    }
    ASSERT_EQ(std::fmod(std::fabs(s), 2.0), 0.0);
    // D8's Voronoi-relevant vectors are its 112 roots ±e_i±e_j.
    for (int i = 0; i < 8; ++i)
      for (int j = i + 1; j < 8; ++j)
        for (int si : {-1, 1})
          for (int sj : {-1, 1}) {
            double z[8];
            for (int k = 0; k < 8; ++k) z[k] = y[k];
            z[i] += si;
            z[j] += sj;
            double dz = 0;
            for (int k = 0; k < 8; ++k) dz += (x[k] - z[k]) * (x[k] - z[k]);
            ASSERT_GE(dz, d - 1e-12);
          }
  }
}

TEST(E8Lattice, TieRulesAreFixed) {
  // All zeros: the origin.
  float zero[8] = {}, y[8];
  EXPECT_EQ(nearest_e8(zero, y), 0);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  // Exactly between origin (dist 2) and the all-½ point (dist 0)... choose a true coset tie:
  // x = (¼)^8 is at distance 0.5 from 0 and from (½)^8: the integer coset must win.
  float quarter[8] = {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
  EXPECT_EQ(nearest_e8(quarter, y), 0);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  // Half-integer coordinates round half to even: 2.5 -> 2, 3.5 -> 4 then parity repair.
  float halves[8] = {2.5f, 0, 0, 0, 0, 0, 0, 0};
  nearest_d8(halves, y);
  // round gives (2,0,...) sum even: no repair.
  EXPECT_EQ(y[0], 2.0f);
  float odd[8] = {1.0f, 0, 0, 0, 0, 0, 0, 0};  // sum odd, every delta 0: index 0 moves by +1
  nearest_d8(odd, y);
  EXPECT_EQ(y[0], 2.0f);
  for (int i = 1; i < 8; ++i) EXPECT_EQ(y[i], 0.0f);
}

TEST(E8Lattice, AdversarialInputsHaveDefinedResults) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float denorm = std::numeric_limits<float>::denorm_min();
  const float cases[][8] = {
      {1e30f, -1e30f, 0, 0, 0, 0, 0, 0},
      {inf, -inf, inf, 0, 0, 0, 0, 0},
      {nan, nan, nan, nan, nan, nan, nan, nan},
      {denorm, -denorm, denorm, 0, 0, 0, 0, 0},
      {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f},
      {0.5f, -0.5f, 0.5f, -0.5f, 0.5f, -0.5f, 0.5f, 0.5f},
      {1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f},
      {1, 1, 1, 1, 1, 1, 1, 1},
  };
  for (const auto& x : cases) {
    float y[8];
    nearest_e8(x, y);
    EXPECT_TRUE(is_e8(y));
    for (float v : y) EXPECT_TRUE(std::isfinite(v));
  }
  float y[8];
  nearest_e8(cases[2], y);  // NaN behaves as 0
  for (float v : y) EXPECT_EQ(v, 0.0f);
  nearest_e8(cases[0], y);  // clamped to ±2^20
  EXPECT_EQ(y[0], 1048576.0f);
  EXPECT_EQ(y[1], -1048576.0f);
}

TEST(E8Lattice, TranslationByLatticeVectorsCommutes) {
  auto rng = e8kv::test::seeded_rng(15);
  std::normal_distribution<double> g(0.0, 1.0);
  std::uniform_int_distribution<int> pick(0, 239);
  const auto roots = e8_roots();
  for (int t = 0; t < 5000; ++t) {
    double x[8], y[8], xs[8], ys[8];
    for (auto& v : x) v = g(rng);
    nearest_e8(x, y);
    // shift by a random sum of three roots (a lattice vector)
    Vec shift{};
    for (int k = 0; k < 3; ++k) {
      const Vec& r = roots[pick(rng)];
      for (int i = 0; i < 8; ++i) shift[i] += r[i] * 3;
    }
    for (int i = 0; i < 8; ++i) xs[i] = x[i] + shift[i];
    nearest_e8(xs, ys);
    for (int i = 0; i < 8; ++i) ASSERT_DOUBLE_EQ(ys[i], y[i] + shift[i]) << "sample " << t;
  }
}

}  // namespace
