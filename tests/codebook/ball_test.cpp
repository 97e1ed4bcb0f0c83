// Tests of the leader-indexed E8 ball codes Ball3 (‖y‖² ≤ 44, 24 bits) and Ball4 (‖y‖² ≤ 178,
// 32 bits): exhaustive index bijection (Ball3), shells and random indices (Ball4), encoder
// optimality against a brute-force box search and the 240-root certificate, MSE targets,
// non-finite input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "e8kv/codebook/ball.hpp"
#include "e8kv/codebook/block_code.hpp"
#include "e8kv/lattice/e8.hpp"
#include "e8kv/lattice/shells.hpp"
#include "testing/test_util.hpp"

namespace {
using e8kv::codebook::Ball3;
using e8kv::codebook::Ball4;

static_assert(e8kv::codebook::is_block_code_v<Ball3>);
static_assert(e8kv::codebook::is_block_code_v<Ball4>);
static_assert(Ball3::kIndexBits == 24 && Ball4::kIndexBits == 32);

uint64_t sigma3(uint64_t m) {
  uint64_t s = 0;
  for (uint64_t d = 1; d <= m; ++d)
    if (m % d == 0) s += d * d * d;
  return s;
}

int64_t norm4_of(const int32_t t[8]) {
  int64_t n = 0;
  for (int i = 0; i < 8; ++i) n += int64_t{t[i]} * t[i];
  return n;
}

bool in_e8(const int32_t t[8]) {
  int64_t t64[8];
  for (int i = 0; i < 8; ++i) t64[i] = t[i];
  return e8kv::lattice::is_e8_twice(t64);
}

TEST(Ball, TablesMatchTheShellEnumeration) {
  for (int r : {44, 178}) {
    const auto view = r == 44 ? Ball3::table() : Ball4::table();
    const auto leaders = e8kv::lattice::make_e8_leader_table(r);
    ASSERT_EQ(size_t(view.count), leaders.leaders.size());
    for (int i = 0; i < view.count; ++i) {
      int32_t desc[8];
      e8kv::codebook::detail::ball_leader_from_key(view.keys[i], desc);
      ASSERT_TRUE(std::equal(desc, desc + 8, leaders.leaders[i].twice_abs)) << i;
      ASSERT_EQ(view.offsets[i], leaders.offsets[i]);
      if (i > 0) {
        ASSERT_LT(view.keys[i - 1], view.keys[i]);
      }
    }
    ASSERT_EQ(view.offsets[view.count], leaders.ball_size());
  }
  EXPECT_EQ(Ball3::size(), 16702321u);
  EXPECT_EQ(Ball4::size(), 4158269521ull);
  EXPECT_EQ(Ball3::table().count, 305);
  EXPECT_EQ(Ball4::table().count, 10693);
}

TEST(Ball, SortingNetworkSortsEvery01Input) {
  // 0-1 principle: a comparator network that sorts all 2^8 binary inputs sorts every input.
  for (int m = 0; m < 256; ++m) {
    int32_t v[8];
    for (int i = 0; i < 8; ++i) v[i] = (m >> i) & 1;
    e8kv::codebook::detail::sort_descending8(v);
    for (int i = 1; i < 8; ++i) ASSERT_GE(v[i - 1], v[i]) << m;
  }
}

// Every one of the 16,702,321 indices: a distinct ball point (the re-rank gives the index back),
// in E8, within the norm bound; per-shell counts equal 240·σ3(m).
TEST(Ball, Ball3IndexIsABijectionOnTheWholeBall) {
  const uint32_t n = static_cast<uint32_t>(Ball3::size());
  std::vector<uint64_t> per_norm(23, 0);
  uint32_t bad = 0;
  for (uint32_t index = 0; index < n; ++index) {
    int32_t t[8];
    Ball3::point_of(index, t);
    const int64_t n4 = norm4_of(t);
    if (n4 > 4 * 44 || !in_e8(t) || Ball3::index_of(t) != index) {
      if (++bad < 5) ADD_FAILURE() << "index " << index;
      continue;
    }
    ++per_norm[n4 / 8];
  }
  EXPECT_EQ(bad, 0u);
  for (int m = 0; m <= 22; ++m) EXPECT_EQ(per_norm[m], m == 0 ? 1 : 240 * sigma3(m)) << "norm " << 2 * m;
}

TEST(Ball, Ball4FullShellsUpTo12AndRandomIndices) {
  const uint32_t small_ball = 117361;  // ‖y‖² ≤ 12 (first three shells after the origin...)
  std::map<int64_t, uint64_t> per_norm;
  for (uint32_t index = 0; index < small_ball; ++index) {
    int32_t t[8];
    Ball4::point_of(index, t);
    ASSERT_TRUE(in_e8(t)) << index;
    ASSERT_EQ(Ball4::index_of(t), index);
    ++per_norm[norm4_of(t) / 4];
  }
  ASSERT_EQ(per_norm.size(), 7u);
  for (const auto& [norm, count] : per_norm) EXPECT_EQ(count, norm == 0 ? 1 : 240 * sigma3(norm / 2)) << norm;

  auto rng = e8kv::test::seeded_rng(401);
  std::uniform_int_distribution<uint64_t> pick(0, Ball4::size() - 1);
  std::vector<uint32_t> indices = {0, 1, 239, 240, 241, small_ball, static_cast<uint32_t>(Ball4::size() - 1),
                                   static_cast<uint32_t>(Ball4::size() / 2)};
  for (int i = 0; i < 1000000; ++i) indices.push_back(static_cast<uint32_t>(pick(rng)));
  for (uint32_t index : indices) {
    int32_t t[8];
    Ball4::point_of(index, t);
    ASSERT_TRUE(in_e8(t)) << index;
    ASSERT_LE(norm4_of(t), 4 * 178) << index;
    ASSERT_EQ(Ball4::index_of(t), index);
  }
  // The last index lands on the outermost shell.
  int32_t last[8];
  Ball4::point_of(static_cast<uint32_t>(Ball4::size() - 1), last);
  EXPECT_EQ(norm4_of(last), 4 * 178);
}

TEST(Ball, UnusedIndicesDecodeToTheOrigin) {
  const uint32_t unused[] = {static_cast<uint32_t>(Ball3::size()), (1u << 24) - 1, 1u << 24, 0xFFFFFFFFu};
  for (uint32_t index : unused) {
    float y[8];
    Ball3::decode(index, y);
    for (float v : y) EXPECT_EQ(v, 0.0f) << index;
  }
  for (uint32_t index : {static_cast<uint32_t>(Ball4::size()), 0xFFFFFFFFu}) {
    float y[8];
    Ball4::decode(index, y);
    for (float v : y) EXPECT_EQ(v, 0.0f) << index;
  }
  int32_t t[8];
  Ball3::point_of(0, t);
  for (int v : t) EXPECT_EQ(v, 0);
}

TEST(Ball, Ball3IndicesEqualBall4IndicesForTheSamePoint) {
  auto rng = e8kv::test::seeded_rng(402);
  std::uniform_int_distribution<uint32_t> pick(0, static_cast<uint32_t>(Ball3::size() - 1));
  for (int i = 0; i < 100000; ++i) {
    const uint32_t index = pick(rng);
    int32_t a[8], b[8];
    Ball3::point_of(index, a);
    Ball4::point_of(index, b);
    ASSERT_TRUE(std::equal(a, a + 8, b)) << index;
  }
}

TEST(Ball, IndexOfRejectsNonBallPoints) {
  // Twice values. Not in E8 or not in the ball: 0xFFFFFFFF.
  const int32_t odd_sum[8] = {14, 0, 0, 0, 0, 0, 0, 0};      // (7,0,...): Σy odd (and ‖y‖² = 49)
  const int32_t odd_norm[8] = {12, 4, 2, 0, 0, 0, 0, 0};     // (6,2,1): Σy odd
  const int32_t half_odd[8] = {1, 1, 1, 1, 1, 1, 1, -1};     // (½,...,−½): Σy = 3
  const int32_t mixed[8] = {2, 1, 1, 1, 1, 1, 1, 1};         // mixes the cosets
  const int32_t norm46[8] = {12, 4, 4, 2, 2, 0, 0, 0};       // (6,2,2,1,1): E8, ‖y‖² = 46 > 44
  // In E8 and in the ball.
  const int32_t norm42[8] = {12, 2, 2, 2, 2, 2, 2, 0};       // (6,1,1,1,1,1,1,0): ‖y‖² = 42
  const int32_t norm44[8] = {12, -4, 4, 0, 0, 0, 0, 0};      // (6,−2,2): ‖y‖² = 44
  const int32_t half44[8] = {-13, 1, 1, 1, 1, 1, 1, 1};      // (−6.5, ½, ...): Σy = −3 ... odd
  const int32_t half44e[8] = {-13, 1, 1, 1, 1, 1, -1, 1};    // Σy = −4: E8, ‖y‖² = 44
  EXPECT_EQ(Ball3::index_of(odd_sum), 0xFFFFFFFFu);
  EXPECT_EQ(Ball3::index_of(odd_norm), 0xFFFFFFFFu);
  EXPECT_EQ(Ball3::index_of(half_odd), 0xFFFFFFFFu);
  EXPECT_EQ(Ball3::index_of(mixed), 0xFFFFFFFFu);
  EXPECT_EQ(Ball3::index_of(norm46), 0xFFFFFFFFu);
  EXPECT_EQ(Ball3::index_of(half44), 0xFFFFFFFFu);
  EXPECT_NE(Ball4::index_of(norm46), 0xFFFFFFFFu);
  for (const auto* p : {norm42, norm44, half44e}) {
    const uint32_t index = Ball3::index_of(p);
    ASSERT_LT(index, Ball3::size());
    int32_t back[8];
    Ball3::point_of(index, back);
    EXPECT_TRUE(std::equal(back, back + 8, p));
  }
}

// Brute force: all E8 points y of the ball with |y_i − x_i| ≤ r for every i, where r² is the
// encoder's own squared error, contain every point at least as close as the encoder's answer.
template <class Code>
double brute_force_best(const float x[8], double radius) {
  double best = std::numeric_limits<double>::infinity();
  for (int coset = 0; coset < 2; ++coset) {
    std::vector<int> cand[8];  // twice values per coordinate
    for (int i = 0; i < 8; ++i) {
      const int lo = static_cast<int>(std::floor(2.0 * (x[i] - radius))) - 1;
      const int hi = static_cast<int>(std::ceil(2.0 * (x[i] + radius))) + 1;
      for (int v = lo; v <= hi; ++v)
        if ((v & 1) == coset && std::fabs(0.5 * v - x[i]) <= radius) cand[i].push_back(v);
      if (cand[i].empty()) break;
    }
    bool empty = false;
    for (auto& c : cand) empty |= c.empty();
    if (empty) continue;
    int idx[8] = {};
    while (true) {
      int64_t t[8], n4 = 0;
      double d = 0;
      for (int i = 0; i < 8; ++i) {
        t[i] = cand[i][idx[i]];
        n4 += t[i] * t[i];
        const double e = x[i] - 0.5 * t[i];
        d += e * e;
      }
      if (n4 <= 4 * Code::kMaxSquaredNorm && e8kv::lattice::is_e8_twice(t)) best = std::min(best, d);
      int k = 0;
      while (k < 8 && ++idx[k] == static_cast<int>(cand[k].size())) idx[k++] = 0;
      if (k == 8) break;
    }
  }
  return best;
}

template <class Code>
void check_against_brute_force(uint64_t seed, int samples) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::uniform_real_distribution<float> stretch(0.98f, 1.08f);
  const float radius = std::sqrt(float(Code::kMaxSquaredNorm));
  int checked = 0, overloaded = 0;
  for (int s = 0; s < samples; ++s) {
    float x[8];
    double n2 = 0;
    for (auto& v : x) {
      v = g(rng) * Code::kInputScale;
      n2 += double(v) * v;
    }
    if (s % 2 == 1) {  // odd samples: move the input to radius·[0.98, 1.08] (mostly overload)
      const float f = radius * stretch(rng) / static_cast<float>(std::sqrt(n2));
      for (auto& v : x) v *= f;
    }
    int32_t t[8];
    Code::nearest_point(x, t);
    ASSERT_TRUE(in_e8(t));
    ASSERT_LE(norm4_of(t), 4 * Code::kMaxSquaredNorm);
    double d = 0;
    for (int i = 0; i < 8; ++i) d += (x[i] - 0.5 * t[i]) * (x[i] - 0.5 * t[i]);
    if (d > 2.6) continue;  // keep the box small (≤ 4 values per coordinate)
    const double best = brute_force_best<Code>(x, std::sqrt(d) + 1e-6);
    ASSERT_LE(d, best + 1e-4) << "sample " << s;
    ++checked;
    int64_t t64[8];
    e8kv::lattice::nearest_e8_twice(x, t64);
    int64_t n4 = 0;
    for (auto v : t64) n4 += v * v;
    overloaded += n4 > 4 * Code::kMaxSquaredNorm;
  }
  std::printf("brute-force checked %d of %d samples, %d of them overloaded\n", checked, samples, overloaded);
  EXPECT_GE(checked, samples * 3 / 4);
  EXPECT_GE(overloaded, samples / 4);
}

TEST(Ball, Ball3EncoderEqualsBruteForce) { check_against_brute_force<Ball3>(403, 20000); }
TEST(Ball, Ball4EncoderEqualsBruteForce) { check_against_brute_force<Ball4>(404, 10000); }

// Certificate: no neighbour y + r (r one of the 240 roots) inside the ball is closer.
template <class Code>
void check_root_certificate(uint64_t seed, int samples, float spread) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<float> g(0.f, spread);
  int32_t roots[240][8];
  for (int r = 0; r < 240; ++r) e8kv::lattice::e8_root_twice(r, roots[r]);
  for (int s = 0; s < samples; ++s) {
    float x[8];
    for (auto& v : x) v = g(rng) * Code::kInputScale;
    int32_t t[8];
    Code::nearest_point(x, t);
    double d = 0;
    for (int i = 0; i < 8; ++i) d += (x[i] - 0.5 * t[i]) * (x[i] - 0.5 * t[i]);
    for (const auto& r : roots) {
      int32_t z[8];
      double dz = 0;
      for (int i = 0; i < 8; ++i) {
        z[i] = t[i] + r[i];
        dz += (x[i] - 0.5 * z[i]) * (x[i] - 0.5 * z[i]);
      }
      if (norm4_of(z) > 4 * Code::kMaxSquaredNorm) continue;
      ASSERT_GE(dz, d - 1e-4) << "sample " << s;
    }
  }
}

TEST(Ball, Ball3RootCertificate) { check_root_certificate<Ball3>(405, 20000, 1.3f); }
TEST(Ball, Ball4RootCertificate) { check_root_certificate<Ball4>(406, 20000, 1.3f); }

template <class Code>
double gaussian_mse(uint64_t seed, size_t blocks, double* overload) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  double err = 0;
  size_t over = 0, out_of_range = 0;
  for (size_t b = 0; b < blocks; ++b) {
    float x[8], y[8], s[8];
    for (auto& v : x) v = g(rng);
    const uint32_t index = Code::encode(x);
    out_of_range += uint64_t{index} >= Code::size();
    Code::decode(index, y);
    for (int i = 0; i < 8; ++i) err += double(x[i] - y[i]) * (x[i] - y[i]);
    Code::scale_input(x, Code::kInputScale, s);
    int64_t t64[8];
    e8kv::lattice::nearest_e8_twice(s, t64);
    int64_t n4 = 0;
    for (auto v : t64) n4 += v * v;
    over += n4 > 4 * Code::kMaxSquaredNorm;
  }
  EXPECT_EQ(out_of_range, 0u);
  *overload = double(over) / blocks;
  return err / (8.0 * blocks);
}

TEST(Ball, GaussianMseTargets) {
  double over3 = 0, over4 = 0;
  const double mse3 = gaussian_mse<Ball3>(407, 200000, &over3);
  const double mse4 = gaussian_mse<Ball4>(407, 200000, &over4);
  std::printf("ball3 mse %.6f (%.2f dB) overload %.4f\nball4 mse %.6f (%.2f dB) overload %.4f\n", mse3,
              -10 * std::log10(mse3), over3, mse4, -10 * std::log10(mse4), over4);
  EXPECT_LE(mse3, 0.0265);
  EXPECT_LE(mse4, 0.0078);
  // Sanity floor: no fixed-rate code beats the Shannon bound 2^-2R.
  EXPECT_GT(mse3, std::pow(2.0, -6.0));
  EXPECT_GT(mse4, std::pow(2.0, -8.0));
}

template <class Code>
void check_reencode(uint64_t seed) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::uniform_int_distribution<uint64_t> pick(0, Code::size() - 1);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t index = static_cast<uint32_t>(pick(rng));
    float y[8];
    Code::decode(index, y);
    ASSERT_EQ(Code::encode(y), index);
  }
}

TEST(Ball, EncodeOfDecodeIsIdentity) {
  check_reencode<Ball3>(408);
  check_reencode<Ball4>(409);
}

TEST(Ball, NonFiniteAndHugeInputs) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float all_nan[8] = {nan, nan, nan, nan, nan, nan, nan, nan};
  EXPECT_EQ(Ball3::encode(all_nan), 0u);  // NaN counts as 0: the origin
  EXPECT_EQ(Ball4::encode(all_nan), 0u);
  // +Inf on one axis: the ball point farthest along it. Ball3: (6.5, ±½, ...) (42.25 + 7/4 = 44);
  // Ball4: (13, ±3 or ±1..., ...) with 169 + 9 = 178.
  const float axis[8] = {inf, 0, 0, 0, 0, 0, 0, 0};
  float y[8];
  Ball3::decode(Ball3::encode(axis), y);
  EXPECT_FLOAT_EQ(y[0] * Ball3::kInputScale, 6.5f);
  Ball4::decode(Ball4::encode(axis), y);
  EXPECT_FLOAT_EQ(y[0] * Ball4::kInputScale, 13.0f);
  const float cases[][8] = {
      {inf, -inf, inf, -inf, inf, -inf, inf, -inf},
      {nan, 1, -1, nan, 2, inf, -3, 0},
      {1e30f, -1e30f, 0, 0, 0, 0, 0, 0},
      {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf},
      {std::numeric_limits<float>::denorm_min(), 0, 0, 0, 0, 0, 0, 0},
  };
  for (const auto& x : cases) {
    const uint32_t i3 = Ball3::encode(x), i4 = Ball4::encode(x);
    EXPECT_LT(i3, Ball3::size());
    EXPECT_LT(uint64_t{i4}, Ball4::size());
    Ball3::decode(i3, y);
    for (float v : y) EXPECT_TRUE(std::isfinite(v));
    Ball4::decode(i4, y);
    for (float v : y) EXPECT_TRUE(std::isfinite(v));
  }
  // All -Inf: far along -(1,...,1) the nearest point minimizes Σy, then ‖y‖². In the ball
  // ‖y‖² ≤ 44, Σy ≥ -√(8·44) > -19 and Σy is even, so Σy = -18, which needs ‖y‖² ≥ 18²/8 > 40,
  // i.e. ‖y‖² = 42 (e.g. (-3,-3,-2,...,-2) or (-2.5 ×6, -1.5 ×2)).
  Ball3::decode(Ball3::encode(cases[3]), y);
  double n2 = 0, sum = 0;
  for (float v : y) {
    EXPECT_LT(v, 0.0f);
    const double lattice_v = double(v) * Ball3::kInputScale;
    n2 += lattice_v * lattice_v;
    sum += lattice_v;
  }
  EXPECT_NEAR(sum, -18.0, 1e-4);
  EXPECT_NEAR(n2, 42.0, 1e-3);
}

}  // namespace
