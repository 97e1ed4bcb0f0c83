// Tests of the Voronoi codes E8 / 2^K·E8: the codebook is exactly E8 ∩ (qV + a) with q^8 points
// (exhaustive for K = 1, 2, against an independent enumeration), the index map is a bijection,
// encode(decode(i)) == i, the primitives (nearest point, cell gauge, root enumeration, facet and
// adjacent roots) against brute force, encoder quality against exhaustive search, MSE targets
// and non-finite input.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "e8kv/codebook/ball.hpp"
#include "e8kv/codebook/block_code.hpp"
#include "e8kv/codebook/voronoi.hpp"
#include "e8kv/lattice/e8.hpp"
#include "e8kv/lattice/shells.hpp"
#include "testing/test_util.hpp"

namespace {
using e8kv::codebook::Voronoi;
namespace detail = e8kv::codebook::detail;

static_assert(e8kv::codebook::is_block_code_v<e8kv::codebook::Voronoi1>);
static_assert(e8kv::codebook::is_block_code_v<e8kv::codebook::Voronoi2>);
static_assert(e8kv::codebook::is_block_code_v<e8kv::codebook::Voronoi3>);
static_assert(e8kv::codebook::is_block_code_v<e8kv::codebook::Voronoi4>);
static_assert(Voronoi<2>::kIndexBits == 16 && Voronoi<3>::kIndexBits == 24 && Voronoi<4>::kIndexBits == 32);

using Twice = std::array<int32_t, 8>;

// The 240 roots as twice values, written out here (not taken from the library).
std::vector<Twice> roots() {
  std::vector<Twice> r;
  for (int i = 0; i < 8; ++i)
    for (int j = i + 1; j < 8; ++j)
      for (int si : {-2, 2})
        for (int sj : {-2, 2}) {
          Twice v{};
          v[i] = si;
          v[j] = sj;
          r.push_back(v);
        }
  for (int m = 0; m < 256; ++m) {
    if (__builtin_popcount(m) % 2) continue;
    Twice v;
    for (int k = 0; k < 8; ++k) v[k] = (m >> k & 1) ? -1 : 1;
    r.push_back(v);
  }
  return r;
}

// Offset a = (1,2,3,4,5,6,7,9)/64 in units of 1/128: 2a_i·64.
constexpr int kOffset128[8] = {2, 4, 6, 8, 10, 12, 14, 18};

// max over roots of ⟨λ − a, r⟩ in units of 1/256 (exact integers): λ in twice values.
int64_t max_root_dot_256(const int32_t twice[8], const std::vector<Twice>& rs) {
  int64_t best = std::numeric_limits<int64_t>::min();
  for (const auto& r : rs) {
    int64_t d = 0;  // Σ (64·t_i − o_i)·r_i with (λ − a)_i = (64 t_i − o_i)/128 and r = r2/2
    for (int i = 0; i < 8; ++i) d += (64 * int64_t{twice[i]} - kOffset128[i]) * r[i];
    best = std::max(best, d);
  }
  return best;
}

// λ ∈ qV + a ⟺ ⟨λ − a, r⟩ < q for all roots ⟺ max_root_dot_256 < 256·q.
bool in_region(const int32_t twice[8], int q, const std::vector<Twice>& rs) {
  return max_root_dot_256(twice, rs) < 256LL * q;
}

bool in_e8(const int32_t t[8]) {
  int64_t t64[8];
  for (int i = 0; i < 8; ++i) t64[i] = t[i];
  return e8kv::lattice::is_e8_twice(t64);
}

TEST(Voronoi, OffsetBreaksEveryTie) {
  // ⟨a, r⟩ ∉ Z for every root, so no E8 point lies on the boundary of qV + a.
  for (const auto& r : roots()) {
    int64_t d = 0;  // 256·⟨a, r⟩
    for (int i = 0; i < 8; ++i) d += kOffset128[i] * r[i];
    EXPECT_NE(d % 256, 0);
  }
}

// The index formula against G built explicitly: λ = G·k for random integer k (any range).
template <int K>
void check_generator(uint64_t seed) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::uniform_int_distribution<int> digit(-40, 40);
  const int q = 1 << K;
  for (int n = 0; n < 20000; ++n) {
    int k[8];
    for (auto& v : k) v = digit(rng);
    // Columns 2e1, e2 − e1, ..., e7 − e6, ½·1 (0-based: g0 = 2e0, g_j = e_j − e_{j−1}, g7 = ½·1).
    double y[8] = {};
    y[0] += 2.0 * k[0];
    for (int j = 1; j <= 6; ++j) {
      y[j] += k[j];
      y[j - 1] -= k[j];
    }
    for (int i = 0; i < 8; ++i) y[i] += 0.5 * k[7];
    int32_t t[8];
    for (int i = 0; i < 8; ++i) t[i] = static_cast<int32_t>(std::lround(2.0 * y[i]));
    ASSERT_TRUE(in_e8(t));
    uint32_t expected = 0;
    for (int j = 0; j < 8; ++j) expected |= static_cast<uint32_t>(((k[j] % q) + q) % q) << (K * j);
    ASSERT_EQ(Voronoi<K>::index_of(t), expected);
  }
}

TEST(Voronoi, IndexIsGInverseModQ) {
  check_generator<1>(501);
  check_generator<2>(502);
  check_generator<3>(503);
  check_generator<4>(504);
}

// Exhaustive: every index decodes to a distinct codeword in qV + a and indexes back to itself;
// and an independent enumeration of E8 ∩ (qV + a) (all E8 points of a ball that covers the
// region, tested against all 240 facets) finds exactly the q^8 decoded points.
template <int K>
void check_codebook_exhaustive() {
  const int q = 1 << K;
  const uint32_t n = 1u << (8 * K);
  const auto rs = roots();
  std::set<Twice> decoded;
  for (uint32_t i = 0; i < n; ++i) {
    int32_t t[8];
    Voronoi<K>::point_of(i, t);
    ASSERT_TRUE(in_e8(t)) << i;
    ASSERT_TRUE(in_region(t, q, rs)) << i;
    ASSERT_TRUE(Voronoi<K>::is_codeword(t)) << i;
    ASSERT_EQ(Voronoi<K>::index_of(t), i);
    Twice key;
    std::copy(t, t + 8, key.begin());
    decoded.insert(key);
  }
  EXPECT_EQ(decoded.size(), n);
  // qV + a lies in the ball of radius q·1 + |a| around 0 (the covering radius of E8 is 1), so
  // ‖λ‖² ≤ (q + 0.233)²: 5.3 (q = 2) and 17.9 (q = 4). Ball3 indices are ordered by norm, so the
  // first 9,121 / 340,321 of them are all E8 points with ‖λ‖² ≤ 6 / ≤ 16.
  const uint32_t ball_points = K == 1 ? 9121u : 340321u;
  uint32_t inside = 0;
  for (uint32_t i = 0; i < ball_points; ++i) {
    int32_t t[8];
    e8kv::codebook::Ball3::point_of(i, t);
    if (!in_region(t, q, rs)) continue;
    ++inside;
    Twice key;
    std::copy(t, t + 8, key.begin());
    ASSERT_EQ(decoded.count(key), 1u) << "region point missing from the decoder's image";
  }
  EXPECT_EQ(inside, n);
}

TEST(Voronoi, CodebookIsExactlyTheRegionK1) { check_codebook_exhaustive<1>(); }
TEST(Voronoi, CodebookIsExactlyTheRegionK2) { check_codebook_exhaustive<2>(); }

// Decode against the textbook formula with the library's reference nearest point.
template <int K>
void check_decode_formula(uint64_t seed) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::uniform_int_distribution<uint32_t> pick(0, K == 4 ? 0xFFFFFFFFu : (1u << (8 * K)) - 1);
  const int q = 1 << K;
  for (int n = 0; n < 100000; ++n) {
    const uint32_t index = pick(rng);
    int k[8];
    for (int j = 0; j < 8; ++j) k[j] = (index >> (K * j)) & (q - 1);
    double y[8] = {};
    y[0] += 2.0 * k[0];
    for (int j = 1; j <= 6; ++j) {
      y[j] += k[j];
      y[j - 1] -= k[j];
    }
    for (int i = 0; i < 8; ++i) y[i] += 0.5 * k[7];
    double p[8], z[8];
    for (int i = 0; i < 8; ++i) p[i] = (y[i] - kOffset128[i] / 128.0) / q;
    e8kv::lattice::nearest_e8(p, z);
    int32_t t[8];
    Voronoi<K>::point_of(index, t);
    for (int i = 0; i < 8; ++i) ASSERT_EQ(t[i], std::lround(2.0 * (y[i] - q * z[i]))) << index;
    // Index bits above 8K are ignored.
    if (K < 4) {
      int32_t u[8];
      Voronoi<K>::point_of(index | (0xFFFFFFFFu << (8 * K)), u);
      for (int i = 0; i < 8; ++i) ASSERT_EQ(u[i], t[i]);
    }
  }
}

TEST(Voronoi, DecodeIsOneNearestPointCall) {
  check_decode_formula<1>(511);
  check_decode_formula<2>(512);
  check_decode_formula<3>(513);
  check_decode_formula<4>(514);
}

template <int K>
void check_reencode_all() {
  for (uint32_t i = 0; i < (1u << (8 * K)); ++i) {
    float y[8];
    Voronoi<K>::decode(i, y);
    ASSERT_EQ(Voronoi<K>::encode(y), i);
  }
}

template <int K>
void check_reencode_random(uint64_t seed) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::uniform_int_distribution<uint32_t> pick(0, K == 4 ? 0xFFFFFFFFu : (1u << (8 * K)) - 1);
  for (int n = 0; n < 300000; ++n) {
    const uint32_t i = pick(rng);
    float y[8];
    Voronoi<K>::decode(i, y);
    ASSERT_EQ(Voronoi<K>::encode(y), i);
  }
}

TEST(Voronoi, EncodeOfDecodeIsIdentity) {
  check_reencode_all<1>();
  check_reencode_all<2>();
  check_reencode_random<3>(521);
  check_reencode_random<4>(522);
}

// is_codeword agrees with the definition through the decoder on points near the boundary.
template <int K>
void check_codeword_test(uint64_t seed) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  int inside = 0, outside = 0;
  for (int n = 0; n < 100000; ++n) {
    float x[8];
    for (auto& v : x) v = g(rng) * Voronoi<K>::kInputScale * 1.3f;
    int64_t t64[8];
    e8kv::lattice::nearest_e8_twice(x, t64);
    int32_t t[8], back[8];
    for (int i = 0; i < 8; ++i) t[i] = static_cast<int32_t>(t64[i]);
    Voronoi<K>::point_of(Voronoi<K>::index_of(t), back);
    const bool by_decoder = std::equal(t, t + 8, back);
    ASSERT_EQ(Voronoi<K>::is_codeword(t), by_decoder) << n;
    (by_decoder ? inside : outside)++;
  }
  EXPECT_GT(inside, 1000);
  EXPECT_GT(outside, 1000);
}

TEST(Voronoi, CodewordTestMatchesTheDecoder) {
  check_codeword_test<1>(531);
  check_codeword_test<2>(532);
  check_codeword_test<3>(533);
  check_codeword_test<4>(534);
}

// ---- primitives ---------------------------------------------------------------------------------

double dist2_twice(const float x[8], const int32_t t[8]) {
  double d = 0;
  for (int i = 0; i < 8; ++i) d += (x[i] - 0.5 * t[i]) * (x[i] - 0.5 * t[i]);
  return d;
}

TEST(VoronoiPrimitives, FastNearestPointMatchesTheReference) {
  auto rng = e8kv::test::seeded_rng(541);
  std::normal_distribution<float> g(0.f, 1.f);
  std::uniform_int_distribution<int> sixty_fourths(-640, 640);
  std::uniform_int_distribution<int> halves(-12, 12);
  int dyadic_checked = 0;
  for (int n = 0; n < 400000; ++n) {
    float x[8];
    const int kind = n % 4;
    for (auto& v : x) {
      if (kind == 0) v = g(rng) * 3.0f;
      if (kind == 1) v = sixty_fourths(rng) / 64.0f;  // exact distances: must match bit for bit
      if (kind == 2) v = halves(rng) * 0.5f;          // ties everywhere
      if (kind == 3) v = g(rng) * 1000.0f;
    }
    if (n % 97 == 0) x[n % 8] = -0.0f;
    int32_t fast[8], portable[8];
    int64_t ref[8];
    detail::nearest_e8_twice_fast(x, fast);
    detail::nearest_e8_twice_portable(x, portable);
    e8kv::lattice::nearest_e8_twice(x, ref);
    ASSERT_TRUE(std::equal(fast, fast + 8, portable)) << n;  // SSE2 (when built) == portable
    int32_t ref32[8];
    for (int i = 0; i < 8; ++i) ref32[i] = static_cast<int32_t>(ref[i]);
    if (kind == 1 || kind == 2) {
      ASSERT_TRUE(std::equal(fast, fast + 8, ref32)) << n;
      ++dyadic_checked;
    } else {
      ASSERT_TRUE(in_e8(fast));
      const double a = dist2_twice(x, fast), b = dist2_twice(x, ref32);
      ASSERT_NEAR(a, b, 1e-5 * (1.0 + b)) << n;
    }
  }
  EXPECT_EQ(dyadic_checked, 200000);
  // Fixed tie rules (the same cases as the E8 lattice test).
  const float quarter[8] = {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
  int32_t t[8];
  detail::nearest_e8_twice_fast(quarter, t);
  for (int v : t) EXPECT_EQ(v, 0);  // coset tie: integer coset
  const float odd[8] = {1, 0, 0, 0, 0, 0, 0, 0};
  detail::nearest_e8_twice_fast(odd, t);
  EXPECT_EQ(t[0], 4);  // every error 0: index 0 moves by +1
  const float minus_zero[8] = {-0.0f, 1, 0, 0, 0, 0, 0, 0};
  detail::nearest_e8_twice_fast(minus_zero, t);
  EXPECT_EQ(t[0], 2);  // -0 counts as error ≥ 0: +1
  EXPECT_EQ(t[1], 2);
}

TEST(VoronoiPrimitives, InputScalingClampsAndMatchesThePortableFormula) {
  auto rng = e8kv::test::seeded_rng(545);
  std::normal_distribution<float> g(0.f, 1.f);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {inf, -inf, nan, -nan, 1e30f, -1e30f, 65536.0f, -65537.0f, -0.0f, 1e-40f};
  for (int n = 0; n < 20000; ++n) {
    float x[8], s[8];
    for (auto& v : x) v = g(rng) * (n % 2 ? 1.0f : 1e5f);
    if (n % 3 == 0) x[n % 8] = specials[n % 10];
    detail::scale_block(x, 1.778f, s);
    for (int i = 0; i < 8; ++i) {
      const float expected = e8kv::fp::mul(e8kv::fp::sanitize(x[i], 65536.0f), 1.778f);
      ASSERT_EQ(s[i], expected) << n << " " << x[i];
      ASSERT_EQ(detail::clamp_voronoi_input(x[i]), e8kv::fp::sanitize(x[i], 65536.0f));
    }
  }
}

TEST(VoronoiPrimitives, GaugeIsTheMaximumOverRoots) {
  auto rng = e8kv::test::seeded_rng(542);
  std::normal_distribution<float> g(0.f, 1.f);
  const auto rs = roots();
  for (int n = 0; n < 50000; ++n) {
    float p[8];
    for (auto& v : p) v = g(rng) * (n % 2 ? 0.3f : 2.0f);
    double best = -1e300;
    for (const auto& r : rs) {
      double d = 0;
      for (int i = 0; i < 8; ++i) d += p[i] * 0.5 * r[i];
      best = std::max(best, d);
    }
    const float fast = detail::e8_root_gauge(p);
    ASSERT_EQ(fast, detail::e8_root_gauge_portable(p));
    ASSERT_NEAR(fast, best, 1e-5 * (1 + std::fabs(best)));
  }
}

// for_each_root_above visits exactly the roots above the threshold, with their values.
TEST(VoronoiPrimitives, RootEnumerationMatchesAScan) {
  auto rng = e8kv::test::seeded_rng(543);
  std::normal_distribution<float> g(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.f, 3.f);
  const auto rs = roots();
  int visited_total = 0;
  for (int n = 0; n < 20000; ++n) {
    float v[8];
    const float spread = n % 3 == 0 ? 0.5f : (n % 3 == 1 ? 1.5f : 4.0f);
    for (auto& x : v) x = g(rng) * spread;
    const float threshold = u(rng);
    std::set<Twice> got;
    detail::for_each_root_above(v, threshold, [&](int32_t code, float value) {
      int32_t r[8];
      detail::root_twice_from_code(code, r);
      Twice key;
      std::copy(r, r + 8, key.begin());
      double d = 0;
      for (int i = 0; i < 8; ++i) d += v[i] * 0.5 * r[i];
      EXPECT_NEAR(value, d, 1e-5 * (1 + std::fabs(d)));
      EXPECT_GT(value, threshold);
      EXPECT_TRUE(got.insert(key).second) << "visited twice";
    });
    for (const auto& r : rs) {
      double d = 0;
      for (int i = 0; i < 8; ++i) d += v[i] * 0.5 * r[i];
      if (d > threshold + 1e-4 * (1 + std::fabs(d))) {
        ASSERT_EQ(got.count(r), 1u) << n;
      }
      if (d < threshold - 1e-4 * (1 + std::fabs(d))) {
        ASSERT_EQ(got.count(r), 0u) << n;
      }
    }
    visited_total += static_cast<int>(got.size());
  }
  EXPECT_GT(visited_total, 20000);
}

TEST(VoronoiPrimitives, FacetAndAdjacentRootsAreOptimal) {
  auto rng = e8kv::test::seeded_rng(544);
  std::normal_distribution<float> g(0.f, 1.f);
  const auto rs = roots();
  using V = Voronoi<2>;
  for (int n = 0; n < 20000; ++n) {
    float p[8], u[8];
    for (auto& v : p) v = g(rng);
    for (auto& v : u) v = g(rng);
    int32_t z[8];
    V::facet_root(p, z);
    double zd = 0, best = -1e300;
    for (int i = 0; i < 8; ++i) zd += p[i] * 0.5 * z[i];
    for (const auto& r : rs) {
      double d = 0;
      for (int i = 0; i < 8; ++i) d += p[i] * 0.5 * r[i];
      best = std::max(best, d);
    }
    ASSERT_NEAR(zd, best, 1e-5);
    ASSERT_EQ(std::count(rs.begin(), rs.end(), Twice{z[0], z[1], z[2], z[3], z[4], z[5], z[6], z[7]}), 1);
    // The best root adjacent to z (⟨r, z⟩ = 1) for ⟨u, r⟩ → min.
    int32_t r[8];
    V::min_adjacent_root(z, u, r);
    int64_t rz = 0;
    double rd = 0, lowest = 1e300;
    for (int i = 0; i < 8; ++i) {
      rz += int64_t{r[i]} * z[i];
      rd += u[i] * 0.5 * r[i];
    }
    ASSERT_EQ(rz, 4) << n;  // ⟨r, z⟩ = 1 in twice units
    ASSERT_EQ(std::count(rs.begin(), rs.end(), Twice{r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]}), 1);
    int adjacent = 0;
    for (const auto& s : rs) {
      int64_t sz = 0;
      double d = 0;
      for (int i = 0; i < 8; ++i) {
        sz += int64_t{s[i]} * z[i];
        d += u[i] * 0.5 * s[i];
      }
      if (sz != 4) continue;
      ++adjacent;
      lowest = std::min(lowest, d);
    }
    ASSERT_EQ(adjacent, 56);
    ASSERT_NEAR(rd, lowest, 1e-5) << n;
  }
}

// ---- encoder ------------------------------------------------------------------------------------

// Not overloaded: the nearest E8 point is a codeword and the encoder returns it.
TEST(VoronoiEncoder, ExactWhenNotOverloaded) {
  auto rng = e8kv::test::seeded_rng(551);
  std::normal_distribution<float> g(0.f, 1.f);
  int checked = 0;
  for (int n = 0; n < 100000; ++n) {
    float x[8], s[8];
    for (auto& v : x) v = g(rng);
    for (int i = 0; i < 8; ++i) s[i] = x[i] * Voronoi<3>::kInputScale;
    int32_t t[8];
    detail::nearest_e8_twice_fast(s, t);
    if (!Voronoi<3>::is_codeword(t)) continue;
    ASSERT_EQ(Voronoi<3>::encode(x), Voronoi<3>::index_of(t));
    ++checked;
  }
  EXPECT_GT(checked, 85000);
}

// Overloaded: a box search over all E8 points at most as far as the encoder's answer finds the
// true nearest codeword. The encoder is allowed to miss rarely (documented), by little.
template <int K>
double brute_force_codeword(const float x[8], double d0) {
  const double r = std::sqrt(d0) + 1e-6;
  double best = d0;
  for (int coset = 0; coset < 2; ++coset) {
    std::vector<int> c[8];
    bool empty = false;
    for (int i = 0; i < 8; ++i) {
      const int lo = static_cast<int>(std::floor(2 * (x[i] - r))) - 1;
      const int hi = static_cast<int>(std::ceil(2 * (x[i] + r))) + 1;
      for (int v = lo; v <= hi; ++v)
        if ((v & 1) == coset && std::fabs(0.5 * v - x[i]) <= r) c[i].push_back(v);
      empty |= c[i].empty();
    }
    if (empty) continue;
    int idx[8] = {};
    while (true) {
      int32_t t[8];
      double d = 0;
      for (int i = 0; i < 8; ++i) {
        t[i] = c[i][idx[i]];
        d += (x[i] - 0.5 * t[i]) * (x[i] - 0.5 * t[i]);
      }
      if (d < best && in_e8(t) && Voronoi<K>::is_codeword(t)) best = d;
      int k = 0;
      while (k < 8 && ++idx[k] == static_cast<int>(c[k].size())) idx[k++] = 0;
      if (k == 8) break;
    }
  }
  return best;
}

template <int K>
void check_overload_quality(uint64_t seed, int samples) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  int overloaded = 0, missed = 0;
  double sum_encoder = 0, sum_best = 0;
  while (overloaded < samples) {
    float s[8];
    for (auto& v : s) v = g(rng) * Voronoi<K>::kInputScale;
    int32_t t[8];
    detail::nearest_e8_twice_fast(s, t);
    if (Voronoi<K>::is_codeword(t)) continue;
    ++overloaded;
    Voronoi<K>::nearest_codeword(s, t);
    ASSERT_TRUE(in_e8(t));
    ASSERT_TRUE(Voronoi<K>::is_codeword(t));
    const double d = dist2_twice(s, t);
    const double best = brute_force_codeword<K>(s, d);
    missed += best < d - 1e-6;
    sum_encoder += d;
    sum_best += best;
  }
  std::printf("K=%d: %d of %d overloaded blocks not at the nearest codeword; error sum %.4f vs %.4f\n", K,
              missed, overloaded, sum_encoder, sum_best);
  EXPECT_LE(missed, samples / 50);                   // ≤ 2 %
  EXPECT_LE(sum_encoder, sum_best * 1.01);           // ≤ 1 % more error on overloaded blocks
}

TEST(VoronoiEncoder, OverloadIsNearlyOptimalK2) { check_overload_quality<2>(552, 300); }
TEST(VoronoiEncoder, OverloadIsNearlyOptimalK3) { check_overload_quality<3>(553, 200); }
TEST(VoronoiEncoder, OverloadIsNearlyOptimalK4) { check_overload_quality<4>(554, 50); }

// The descent ends in a local optimum: no root move that stays a codeword gets closer.
TEST(VoronoiEncoder, DescentEndsInALocalOptimum) {
  auto rng = e8kv::test::seeded_rng(555);
  std::normal_distribution<float> g(0.f, 1.f);
  const auto rs = roots();
  using V = Voronoi<2>;
  int checked = 0;
  for (int n = 0; n < 20000 && checked < 2000; ++n) {
    float s[8];
    for (auto& v : s) v = g(rng) * V::kInputScale * 1.2f;
    int32_t t[8];
    detail::nearest_e8_twice_fast(s, t);
    if (V::is_codeword(t)) continue;
    V::shrink_into_code(s, t);
    ASSERT_TRUE(V::is_codeword(t));
    V::descend(s, t);
    ASSERT_TRUE(V::is_codeword(t));
    const double d = dist2_twice(s, t);
    for (const auto& r : rs) {
      int32_t m[8];
      for (int i = 0; i < 8; ++i) m[i] = t[i] + r[i];
      if (!V::is_codeword(m)) continue;
      ASSERT_GE(dist2_twice(s, m), d - 1e-5) << n;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2000);
}

template <int K>
double gaussian_mse(uint64_t seed, int blocks) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  double err = 0;
  for (int b = 0; b < blocks; ++b) {
    float x[8], y[8];
    for (auto& v : x) v = g(rng);
    Voronoi<K>::decode(Voronoi<K>::encode(x), y);
    for (int i = 0; i < 8; ++i) err += double(x[i] - y[i]) * (x[i] - y[i]);
  }
  return err / (8.0 * blocks);
}

TEST(VoronoiEncoder, GaussianMseTargets) {
  const double m1 = gaussian_mse<1>(561, 20000);
  const double m2 = gaussian_mse<2>(562, 200000);
  const double m3 = gaussian_mse<3>(563, 200000);
  const double m4 = gaussian_mse<4>(564, 200000);
  std::printf("voronoi mse: K=1 %.5f, K=2 %.6f (%.2f dB), K=3 %.6f (%.2f dB), K=4 %.6f (%.2f dB)\n", m1, m2,
              -10 * std::log10(m2), m3, -10 * std::log10(m3), m4, -10 * std::log10(m4));
  EXPECT_LE(m2, 0.1000);
  EXPECT_LE(m3, 0.0280);
  EXPECT_LE(m4, 0.0080);
  // Fixed-rate codes cannot beat Shannon's 2^-2R.
  EXPECT_GT(m1, 0.25);
  EXPECT_GT(m2, 0.0625);
  EXPECT_GT(m3, 0.015625);
  EXPECT_GT(m4, 0.00390625);
}

template <int K>
void check_non_finite() {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float cases[][8] = {
      {nan, nan, nan, nan, nan, nan, nan, nan},
      {inf, 0, 0, 0, 0, 0, 0, 0},
      {inf, -inf, inf, -inf, inf, -inf, inf, -inf},
      {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf},
      {nan, 1, -1, nan, 2, inf, -3, 0},
      {1e30f, -1e30f, 0, 0, 0, 0, 0, 0},
      {std::numeric_limits<float>::denorm_min(), 0, 0, 0, 0, 0, 0, 0},
  };
  for (const auto& x : cases) {
    const uint32_t index = Voronoi<K>::encode(x);
    if (K < 4) {
      EXPECT_LT(index, 1u << (8 * K));
    }
    float y[8];
    Voronoi<K>::decode(index, y);
    for (float v : y) EXPECT_TRUE(std::isfinite(v));
    EXPECT_EQ(Voronoi<K>::encode(y), index);  // a codeword
  }
  EXPECT_EQ(Voronoi<K>::encode(cases[0]), 0u);  // NaN counts as 0: the origin, index 0
  // Far along +e0 the answer is a codeword whose first coordinate is positive and largest.
  float y[8];
  Voronoi<K>::decode(Voronoi<K>::encode(cases[1]), y);
  EXPECT_GT(y[0], 0.0f);
  for (int i = 1; i < 8; ++i) EXPECT_LE(std::fabs(y[i]), y[0]);
}

TEST(VoronoiEncoder, NonFiniteInputGivesValidIndices) {
  check_non_finite<1>();
  check_non_finite<2>();
  check_non_finite<3>();
  check_non_finite<4>();
}

}  // namespace
