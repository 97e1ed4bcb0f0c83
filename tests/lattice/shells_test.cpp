// Tests of the E8 shell / absolute-leader tables against known facts (shell sizes 240·σ3(m),
// leader and ball counts) and against a brute-force enumeration of small balls.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "e8kv/lattice/e8.hpp"
#include "e8kv/lattice/shells.hpp"
#include "testing/test_util.hpp"

namespace {
using e8kv::lattice::E8LeaderTable;
using e8kv::lattice::make_e8_leader_table;

using Leader = std::array<int32_t, 8>;

// σ3(m) written out independently of the library.
uint64_t sigma3(uint64_t m) {
  uint64_t s = 0;
  for (uint64_t d = 1; d <= m; ++d)
    if (m % d == 0) s += d * d * d;
  return s;
}

std::map<int, uint64_t> shell_counts(const E8LeaderTable& t) {
  std::map<int, uint64_t> counts;
  for (const auto& l : t.leaders) counts[l.squared_norm] += l.orbit_size;
  return counts;
}

TEST(E8Shells, ShellSizesAreKnownValues) {
  // Theta series of E8: 1 + 240 q + 2160 q^2 + 6720 q^3 + 17520 q^4 + 30240 q^5 + 60480 q^6 + ...
  const uint64_t known[] = {1, 240, 2160, 6720, 17520, 30240, 60480, 82560, 140400};
  const auto& table = make_e8_leader_table(16);
  const auto counts = shell_counts(table);
  for (int m = 0; m <= 8; ++m) {
    EXPECT_EQ(counts.at(2 * m), known[m]) << "norm " << 2 * m;
    EXPECT_EQ(e8kv::lattice::e8_shell_size(2 * m), known[m]) << "norm " << 2 * m;
  }
  EXPECT_EQ(e8kv::lattice::e8_shell_size(3), 0u);
  EXPECT_EQ(e8kv::lattice::e8_shell_size(-2), 0u);
}

TEST(E8Shells, EveryShellUpTo178Has240Sigma3Points) {
  const auto table = make_e8_leader_table(178);
  const auto counts = shell_counts(table);
  ASSERT_EQ(counts.size(), 90u);  // norms 0, 2, ..., 178
  uint64_t total = 0;
  for (const auto& [norm, count] : counts) {
    ASSERT_EQ(norm % 2, 0);
    EXPECT_EQ(count, norm == 0 ? 1 : 240 * sigma3(norm / 2)) << "norm " << norm;
    total += count;
  }
  EXPECT_EQ(total, table.ball_size());
}

TEST(E8Shells, LeaderAndBallCounts) {
  struct Case {
    int radius2;
    size_t leaders, integer_leaders, half_leaders;
    uint64_t ball;
  };
  const Case cases[] = {
      {10, 19, 12, 7, 56881},
      {44, 305, 159, 146, 16702321},
      {178, 10693, 4789, 5904, 4158269521ull},
  };
  for (const auto& c : cases) {
    const auto t = make_e8_leader_table(c.radius2);
    size_t half = 0;
    for (const auto& l : t.leaders) half += l.half_integer;
    EXPECT_EQ(t.leaders.size(), c.leaders) << "R=" << c.radius2;
    EXPECT_EQ(t.leaders.size() - half, c.integer_leaders) << "R=" << c.radius2;
    EXPECT_EQ(half, c.half_leaders) << "R=" << c.radius2;
    EXPECT_EQ(t.ball_size(), c.ball) << "R=" << c.radius2;
  }
  EXPECT_LE(make_e8_leader_table(44).ball_size(), uint64_t{1} << 24);
  EXPECT_LE(make_e8_leader_table(178).ball_size(), uint64_t{1} << 32);
  EXPECT_GT(make_e8_leader_table(46).ball_size(), uint64_t{1} << 24);   // 44 is the largest 24-bit ball
  EXPECT_GT(make_e8_leader_table(180).ball_size(), uint64_t{1} << 32);  // 178 is the largest 32-bit ball
}

TEST(E8Shells, EdgeRadii) {
  const auto t0 = make_e8_leader_table(0);
  ASSERT_EQ(t0.leaders.size(), 1u);
  EXPECT_EQ(t0.ball_size(), 1u);
  for (int v : t0.leaders[0].twice_abs) EXPECT_EQ(v, 0);
  EXPECT_EQ(make_e8_leader_table(1).ball_size(), 1u);
  const auto t2 = make_e8_leader_table(2);
  ASSERT_EQ(t2.leaders.size(), 3u);  // origin, (½)^8, (1,1,0,...)
  EXPECT_EQ(t2.ball_size(), 241u);
  EXPECT_EQ(make_e8_leader_table(3).ball_size(), 241u);
  EXPECT_THROW(make_e8_leader_table(-1), e8kv::Error);
  EXPECT_THROW(make_e8_leader_table(e8kv::lattice::kMaxEnumeratedSquaredNorm + 1), e8kv::Error);
  EXPECT_NO_THROW(make_e8_leader_table(e8kv::lattice::kMaxEnumeratedSquaredNorm));
}

TEST(E8Shells, OrderOffsetsAndPrefixProperty) {
  const auto small = make_e8_leader_table(44);
  const auto big = make_e8_leader_table(178);
  for (size_t i = 0; i < big.leaders.size(); ++i) {
    const auto& l = big.leaders[i];
    // Descending, one coset, valid E8 point.
    for (int k = 1; k < 8; ++k) ASSERT_GE(l.twice_abs[k - 1], l.twice_abs[k]);
    int64_t t[8], n4 = 0;
    for (int k = 0; k < 8; ++k) {
      t[k] = l.twice_abs[k];
      n4 += t[k] * t[k];
    }
    // A half-type absolute leader is in E8 itself or after flipping one sign.
    const bool in_e8 = e8kv::lattice::is_e8_twice(t);
    t[7] = -t[7];
    ASSERT_TRUE(in_e8 || (l.half_integer && e8kv::lattice::is_e8_twice(t))) << "leader " << i;
    ASSERT_EQ(n4, 4 * l.squared_norm);
    ASSERT_EQ(l.half_integer, (l.twice_abs[0] & 1) == 1);
    ASSERT_EQ(big.offsets[i + 1] - big.offsets[i], l.orbit_size);
    if (i > 0) {
      const auto& p = big.leaders[i - 1];
      ASSERT_TRUE(p.squared_norm < l.squared_norm ||
                  (p.squared_norm == l.squared_norm &&
                   std::lexicographical_compare(p.twice_abs, p.twice_abs + 8, l.twice_abs, l.twice_abs + 8)));
    }
  }
  ASSERT_LE(small.leaders.size(), big.leaders.size());
  for (size_t i = 0; i < small.leaders.size(); ++i) {
    ASSERT_TRUE(std::equal(small.leaders[i].twice_abs, small.leaders[i].twice_abs + 8, big.leaders[i].twice_abs));
    ASSERT_EQ(small.offsets[i], big.offsets[i]);
  }
}

// Brute force: every E8 point with ‖y‖² ≤ 12, grouped by its absolute leader.
TEST(E8Shells, BruteForceBallMatchesLeaders) {
  constexpr int kRadius2 = 12;
  std::map<Leader, uint64_t> orbit;
  for (int coset = 0; coset < 2; ++coset) {
    // twice values: even in [-6, 6] or odd in [-5, 5] (|y| ≤ √12 < 3.5)
    std::vector<int> values;
    for (int v = -7; v <= 7; ++v)
      if ((v & 1) == coset && v * v <= 4 * kRadius2) values.push_back(v);
    const size_t n = values.size();
    size_t total = 1;
    for (int i = 0; i < 8; ++i) total *= n;
    for (size_t code = 0; code < total; ++code) {
      size_t c = code;
      int64_t t[8];
      int64_t n4 = 0;
      for (int i = 0; i < 8; ++i) {
        t[i] = values[c % n];
        c /= n;
        n4 += t[i] * t[i];
      }
      if (n4 > 4 * kRadius2 || !e8kv::lattice::is_e8_twice(t)) continue;
      Leader l;
      for (int i = 0; i < 8; ++i) l[i] = static_cast<int32_t>(t[i] < 0 ? -t[i] : t[i]);
      std::sort(l.rbegin(), l.rend());
      ++orbit[l];
    }
  }
  const auto table = make_e8_leader_table(kRadius2);
  ASSERT_EQ(table.leaders.size(), orbit.size());
  uint64_t total = 0;
  for (const auto& l : table.leaders) {
    Leader key;
    std::copy(l.twice_abs, l.twice_abs + 8, key.begin());
    ASSERT_EQ(orbit.count(key), 1u);
    EXPECT_EQ(orbit[key], l.orbit_size);
    total += orbit[key];
  }
  EXPECT_EQ(total, 117361u);
  EXPECT_EQ(table.ball_size(), 117361u);
}

TEST(E8Shells, TheRoots) {
  std::set<Leader> seen;
  int half = 0;
  for (int r = 0; r < 240; ++r) {
    int32_t t[8];
    e8kv::lattice::e8_root_twice(r, t);
    int64_t t64[8], n4 = 0;
    Leader key;
    for (int i = 0; i < 8; ++i) {
      t64[i] = t[i];
      n4 += t64[i] * t64[i];
      key[i] = t[i];
    }
    EXPECT_EQ(n4, 8) << "root " << r;  // ‖y‖² = 2
    EXPECT_TRUE(e8kv::lattice::is_e8_twice(t64)) << "root " << r;
    EXPECT_EQ((t[0] & 1) == 1, r >= 112) << "root " << r;
    half += r >= 112;
    seen.insert(key);
  }
  EXPECT_EQ(seen.size(), 240u);
  EXPECT_EQ(half, 128);
}

TEST(E8Shells, ArrangementAndOrbitSizes) {
  const int32_t distinct[8] = {7, 6, 5, 4, 3, 2, 1, 0};
  EXPECT_EQ(e8kv::lattice::e8_arrangement_count(distinct), 40320u);
  const int32_t same[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(e8kv::lattice::e8_arrangement_count(same), 1u);
  EXPECT_EQ(e8kv::lattice::e8_orbit_size(same), 128u);  // the 128 half roots
  const int32_t root[8] = {2, 2, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(e8kv::lattice::e8_orbit_size(root), 112u);  // 28 · 4
  const int32_t mixed[8] = {3, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(e8kv::lattice::e8_orbit_size(mixed), 8u * 128u);
  const int32_t origin[8] = {};
  EXPECT_EQ(e8kv::lattice::e8_orbit_size(origin), 1u);
}

TEST(E8Shells, CachedTableIsSharedAcrossThreads) {
  const E8LeaderTable* seen[4] = {};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&seen, i] { seen[i] = &e8kv::lattice::e8_leader_table(44); });
  for (auto& th : threads) th.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(seen[i], seen[0]);
  EXPECT_EQ(seen[0]->ball_size(), 16702321u);
  EXPECT_THROW(e8kv::lattice::e8_leader_table(-3), e8kv::Error);
}

}  // namespace
