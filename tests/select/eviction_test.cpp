// select/eviction.hpp against the naive reference in naive_select.hpp: the kept count (the rate
// met exactly, the sinks + recent floor), the kept set (sinks and recent always kept, the best
// others, ties to the lower index, NaN last), shared versus per-head sets, and the -inf mask.
// Fixed printed seeds; sizes 0, 1, odd, window + 1 and fewer tokens than sinks + recent.
#include "e8kv/select/eviction.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "naive_select.hpp"
#include "testing/test_util.hpp"

namespace {

using e8kv::select::Aggregation;
using e8kv::select::EvictionOptions;
using e8kv::select::LayerScores;
namespace naive = e8kv::naive;

EvictionOptions options(double rate, int sinks, int recent) {
  EvictionOptions o;
  o.rate = rate;
  o.sinks = sinks;
  o.recent = recent;
  return o;
}

struct Protected {
  int sinks, recent;
};
// None, the defaults (4 + 32), sinks only, recent only, and more than most sequences here.
const Protected kProtected[] = {{0, 0}, {4, 32}, {1, 0}, {0, 5}, {40, 40}};
const double kRates[] = {0.0, 0.1, 0.25, 0.35, 0.5, 0.6, 0.8, 0.99};
// 0, 1, odd, the default recent window + 1, fewer than / exactly / more than sinks + recent.
const int64_t kSizes[] = {0, 1, 2, 3, 7, 33, 35, 36, 37, 100, 257};

std::string label(int64_t n, double rate, Protected p) {
  return "n " + std::to_string(n) + " rate " + std::to_string(rate) + " sinks " + std::to_string(p.sinks) +
         " recent " + std::to_string(p.recent);
}

// Scores drawn from a small set of values so ties are common (and exact).
std::vector<float> tied_scores(std::mt19937_64& rng, int64_t n, int distinct) {
  std::vector<float> s(static_cast<size_t>(n));
  for (auto& x : s) x = static_cast<float>(rng() % static_cast<uint64_t>(distinct));
  return s;
}

// ---- kept count --------------------------------------------------------------------------

TEST(KeptCount, MatchesNaive) {
  for (const int64_t n : kSizes)
    for (const double rate : kRates)
      for (const auto p : kProtected)
        EXPECT_EQ(e8kv::select::kept_count(n, options(rate, p.sinks, p.recent)),
                  naive::kept_count(n, rate, p.sinks, p.recent))
            << label(n, rate, p);
}

// Without protected tokens the rate is met exactly: n - round(rate * n) tokens stay, for every n.
TEST(KeptCount, MeetsTheRateExactlyWhenNothingIsProtected) {
  for (int64_t n = 0; n <= 1000; ++n)
    for (const double rate : kRates) {
      const int64_t evicted = static_cast<int64_t>(std::floor(rate * static_cast<double>(n) + 0.5));
      ASSERT_EQ(e8kv::select::kept_count(n, options(rate, 0, 0)), n - evicted) << "n " << n << " rate " << rate;
    }
}

TEST(KeptCount, NeverBelowSinksPlusRecentNorAboveN) {
  for (const int64_t n : kSizes)
    for (const auto p : kProtected) {
      const int64_t k = e8kv::select::kept_count(n, options(0.99, p.sinks, p.recent));
      EXPECT_EQ(k, std::max(n - static_cast<int64_t>(std::floor(0.99 * static_cast<double>(n) + 0.5)),
                            std::min<int64_t>(n, p.sinks + p.recent)))
          << label(n, 0.99, p);
      EXPECT_LE(k, n);
    }
}

TEST(KeptCount, RejectsRatesOutsideZeroToOneAndNegativeCounts) {
  for (const double bad : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN()})
    EXPECT_THROW(e8kv::select::kept_count(10, options(bad, 0, 0)), e8kv::Error) << bad;
  EXPECT_THROW(e8kv::select::kept_count(10, options(0.5, -1, 0)), e8kv::Error);
  EXPECT_THROW(e8kv::select::kept_count(10, options(0.5, 0, -1)), e8kv::Error);
}

// ---- one kept set --------------------------------------------------------------------------

// Checks what must hold for any scores: the count, order, the protected tokens, and that no
// evicted token outranks a kept one (higher score, or equal score and lower index; NaN last).
void expect_valid_selection(const std::vector<int64_t>& kept, const std::vector<float>& s, const EvictionOptions& o,
                            const std::string& what) {
  const int64_t n = static_cast<int64_t>(s.size());
  ASSERT_EQ(static_cast<int64_t>(kept.size()), e8kv::select::kept_count(n, o)) << what;
  std::vector<char> in(static_cast<size_t>(n), 0);
  for (size_t i = 0; i < kept.size(); ++i) {
    ASSERT_TRUE(kept[i] >= 0 && kept[i] < n) << what;
    if (i > 0) {
      ASSERT_LT(kept[i - 1], kept[i]) << what << ": not sorted ascending and unique";
    }
    in[static_cast<size_t>(kept[i])] = 1;
  }
  for (int64_t t = 0; t < n; ++t) {
    if (t < o.sinks || t >= n - o.recent) {
      ASSERT_TRUE(in[static_cast<size_t>(t)]) << what << ": protected token " << t;
    }
  }
  auto outranks = [&](int64_t a, int64_t b) {  // a strictly before b in the ranking
    const float sa = s[static_cast<size_t>(a)], sb = s[static_cast<size_t>(b)];
    if (std::isnan(sa) != std::isnan(sb)) return std::isnan(sb);
    if (!std::isnan(sa) && sa != sb) return sa > sb;
    return a < b;
  };
  for (int64_t e = 0; e < n; ++e) {
    if (in[static_cast<size_t>(e)]) continue;
    for (int64_t k = 0; k < n; ++k) {
      if (!in[static_cast<size_t>(k)] || k < o.sinks || k >= n - o.recent) continue;
      ASSERT_TRUE(outranks(k, e)) << what << ": evicted token " << e << " outranks kept token " << k;
    }
  }
}

TEST(SelectTokens, MatchesNaiveWithDistinctScores) {
  auto rng = e8kv::test::seeded_rng(2101);
  for (const int64_t n : kSizes)
    for (const double rate : kRates)
      for (const auto p : kProtected) {
        const auto s = naive::uniform_floats(rng, static_cast<size_t>(n), 10.0);
        const auto o = options(rate, p.sinks, p.recent);
        const auto kept = e8kv::select::select_tokens(s, o);
        ASSERT_EQ(kept, naive::select(s, rate, p.sinks, p.recent)) << label(n, rate, p);
        expect_valid_selection(kept, s, o, label(n, rate, p));
        if (HasFatalFailure()) return;
      }
}

TEST(SelectTokens, MatchesNaiveWithManyTies) {
  auto rng = e8kv::test::seeded_rng(2102);
  for (const int distinct : {1, 2, 5})
    for (const int64_t n : kSizes)
      for (const double rate : kRates)
        for (const auto p : kProtected) {
          const auto s = tied_scores(rng, n, distinct);
          const auto o = options(rate, p.sinks, p.recent);
          const auto kept = e8kv::select::select_tokens(s, o);
          ASSERT_EQ(kept, naive::select(s, rate, p.sinks, p.recent)) << label(n, rate, p) << " distinct " << distinct;
          expect_valid_selection(kept, s, o, label(n, rate, p));
          if (HasFatalFailure()) return;
        }
}

// Worked by hand: 10 tokens, 1 sink, 2 recent, rate 0.5 -> keep 5: tokens 0, 8, 9 plus the two
// best of 1..7. Scores 1..7 are {3, 7, 7, 1, 7, 2, 0}: three tokens tie at 7; the lower indices
// (2 and 3) win.
TEST(SelectTokens, HandWorkedExampleWithATie) {
  const std::vector<float> s = {9, 3, 7, 7, 1, 7, 2, 0, -5, -5};
  EXPECT_EQ(e8kv::select::select_tokens(s, options(0.5, 1, 2)), (std::vector<int64_t>{0, 2, 3, 8, 9}));
}

TEST(SelectTokens, NaNScoresRankLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> s = {nan, 1, nan, -100, nan, 2};
  // No protected tokens, keep 3 of 6: the three numbers, even -100, before any NaN.
  EXPECT_EQ(e8kv::select::select_tokens(s, options(0.5, 0, 0)), (std::vector<int64_t>{1, 3, 5}));
  // Keep 4: one NaN joins, the lowest-indexed.
  EXPECT_EQ(e8kv::select::select_tokens(s, options(1.0 / 3.0, 0, 0)), (std::vector<int64_t>{0, 1, 3, 5}));
}

TEST(SelectTokens, FewerTokensThanSinksPlusRecentKeepsAll) {
  auto rng = e8kv::test::seeded_rng(2103);
  for (const int64_t n : {0, 1, 5, 35}) {
    const auto s = naive::uniform_floats(rng, static_cast<size_t>(n), 1.0);
    std::vector<int64_t> all(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) all[static_cast<size_t>(t)] = t;
    EXPECT_EQ(e8kv::select::select_tokens(s, options(0.9, 4, 32)), all) << "n " << n;
  }
}

// select_tier against a brute-force reference: the candidates are the kept tokens outside the
// sinks and the recent window, ranked by score (higher first, NaN last, ties to the lower index),
// the first `count` taken and sorted; for every size, rate, protection and count (0, some, more
// than compete), on distinct and on tied scores.
std::vector<int64_t> naive_tier(const std::vector<float>& s, const std::vector<int64_t>& kept, int64_t count, int sinks,
                                int recent) {
  const int64_t n = static_cast<int64_t>(s.size());
  std::vector<int64_t> c;
  for (int64_t t : kept)
    if (t >= sinks && t < n - recent) c.push_back(t);
  std::stable_sort(c.begin(), c.end(), [&](int64_t a, int64_t b) {
    const bool na = std::isnan(s[static_cast<size_t>(a)]), nb = std::isnan(s[static_cast<size_t>(b)]);
    if (na || nb) return !na && nb;
    return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)];
  });
  if (static_cast<int64_t>(c.size()) > count) c.resize(static_cast<size_t>(count));
  std::sort(c.begin(), c.end());
  return c;
}

TEST(SelectTier, MatchesBruteForce) {
  auto rng = e8kv::test::seeded_rng(2104);
  int checked = 0;
  for (const int distinct : {0, 2, 5})  // 0: distinct scores
    for (const int64_t n : kSizes)
      for (const double rate : kRates)
        for (const auto p : kProtected) {
          auto s = distinct == 0 ? naive::uniform_floats(rng, static_cast<size_t>(n), 10.0) : tied_scores(rng, n, distinct);
          if (n > 3) s[static_cast<size_t>(n / 2)] = std::numeric_limits<float>::quiet_NaN();
          const auto o = options(rate, p.sinks, p.recent);
          const auto kept = e8kv::select::select_tokens(s, o);
          for (const int64_t count : {int64_t{0}, int64_t{1}, e8kv::select::tier_count(n, 0.05), n / 3, n + 1}) {
            ASSERT_EQ(e8kv::select::select_tier(s, kept, count, o), naive_tier(s, kept, count, p.sinks, p.recent))
                << label(n, rate, p) << " count " << count << " distinct " << distinct;
            ++checked;
          }
        }
  EXPECT_GT(checked, 100);
}

TEST(SelectTier, CountAndBadInput) {
  EXPECT_EQ(e8kv::select::tier_count(300, 0.05), 15);
  EXPECT_EQ(e8kv::select::tier_count(0, 0.5), 0);
  EXPECT_EQ(e8kv::select::tier_count(3, 0.5), 2);  // round half away from zero
  EXPECT_THROW(e8kv::select::tier_count(10, 1.0), e8kv::Error);
  EXPECT_THROW(e8kv::select::tier_count(10, -0.1), e8kv::Error);
  const std::vector<float> s = {1, 2, 3, 4};
  const auto o = options(0.0, 0, 0);
  EXPECT_THROW(e8kv::select::select_tier(s, {2, 1}, 1, o), e8kv::Error);  // not ascending
  EXPECT_THROW(e8kv::select::select_tier(s, {0, 4}, 1, o), e8kv::Error);  // out of range
  EXPECT_THROW(e8kv::select::select_tier(s, {0, 1}, -1, o), e8kv::Error);
  EXPECT_EQ(e8kv::select::select_tier(s, {0, 1, 3}, 2, o), (std::vector<int64_t>{1, 3}));
}

// StreamingLLM end to end: streaming scores + eviction keep the sinks and then the most recent
// tokens, whatever the positions (here past 2^24, where raw positions as floats would tie).
TEST(SelectTokens, StreamingScoresKeepTheSinksAndTheMostRecentTokens) {
  for (const int64_t n : kSizes)
    for (const int32_t first : {0, (1 << 25) + 1}) {
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = first + static_cast<int32_t>(t);
      const std::vector<float> keys(static_cast<size_t>(n * 8), 1.f);
      e8kv::select::ScorerOptions so;
      so.kind = e8kv::select::ScorerKind::kStreaming;
      const auto scores =
          e8kv::select::score_layer(e8kv::TensorView::nhd(keys.data(), e8kv::DType::kF32, n, 1, 8), pos.data(), nullptr, so);
      const auto o = options(0.5, 4, 8);
      const int64_t keep = e8kv::select::kept_count(n, o);
      std::vector<int64_t> want;
      for (int64_t t = 0; t < n; ++t)
        if (t < 4 || t >= n - (keep - std::min<int64_t>(4, n))) want.push_back(t);
      EXPECT_EQ(e8kv::select::select_layer(scores, o)[0], want) << "n " << n << " first position " << first;
    }
}

// ---- a layer: one shared set or one set per KV head -----------------------------------------

LayerScores layer_scores(std::vector<float> s, int64_t heads, int64_t tokens) {
  LayerScores l;
  l.kv_heads = heads;
  l.tokens = tokens;
  l.scores = std::move(s);
  return l;
}

// Integer scores over 1, 2 or 4 heads: the mean is exact in float too, so the naive reference
// computes the whole chain (combine heads, then select) on its own, ties included.
TEST(SelectLayer, SharedSetMatchesNaiveOnExactScores) {
  auto rng = e8kv::test::seeded_rng(2201);
  for (const int64_t heads : {1, 2, 4})
    for (const int64_t n : kSizes)
      for (const auto how : {Aggregation::kMean, Aggregation::kMax})
        for (const double rate : {0.25, 0.6}) {
          const auto s = tied_scores(rng, heads * n, 6);
          auto o = options(rate, 2, 3);
          o.head_aggregation = how;
          const auto sets = e8kv::select::select_layer(layer_scores(s, heads, n), o);
          ASSERT_EQ(sets.size(), 1u);
          const auto combined = naive::combine_heads(
              s, heads, n, how == Aggregation::kMean ? naive::Reduce::kMean : naive::Reduce::kMax);
          const std::vector<float> combined_f(combined.begin(), combined.end());  // exact: small dyadic values
          EXPECT_EQ(sets[0], naive::select(combined_f, rate, 2, 3)) << heads << " heads, n " << n << " rate " << rate;
        }
}

// Any float scores (3 heads, not exact): the shared set is the selection of aggregate_heads
// (itself compared with the naive mean in scorer_test), and it is valid for those scores.
TEST(SelectLayer, SharedSetSelectsOnTheAggregatedScores) {
  auto rng = e8kv::test::seeded_rng(2202);
  for (const int64_t n : kSizes)
    for (const auto how : {Aggregation::kMean, Aggregation::kMax}) {
      const auto l = layer_scores(naive::uniform_floats(rng, static_cast<size_t>(3 * n), 1.0), 3, n);
      auto o = options(0.5, 4, 32);
      o.head_aggregation = how;
      const auto sets = e8kv::select::select_layer(l, o);
      ASSERT_EQ(sets.size(), 1u);
      const auto combined = e8kv::select::aggregate_heads(l, how);
      EXPECT_EQ(sets[0], naive::select(combined, 0.5, 4, 32)) << "n " << n;
      expect_valid_selection(sets[0], combined, o, "n " + std::to_string(n));
    }
}

TEST(SelectLayer, PerHeadSetsSelectEachHeadOnItsOwnScores) {
  auto rng = e8kv::test::seeded_rng(2203);
  for (const int64_t heads : {1, 3})
    for (const int64_t n : kSizes)
      for (const int distinct : {2, 1000}) {
        const auto s = tied_scores(rng, heads * n, distinct);
        auto o = options(0.6, 1, 4);
        o.per_head = true;
        o.head_aggregation = Aggregation::kMax;  // ignored for per-head sets
        const auto sets = e8kv::select::select_layer(layer_scores(s, heads, n), o);
        ASSERT_EQ(sets.size(), static_cast<size_t>(heads));
        for (int64_t h = 0; h < heads; ++h) {
          const std::vector<float> row(s.begin() + h * n, s.begin() + (h + 1) * n);
          EXPECT_EQ(sets[static_cast<size_t>(h)], naive::select(row, 0.6, 1, 4)) << "head " << h << " n " << n;
        }
      }
}

// Heads that disagree: per-head sets differ, and each keeps exactly the rate's count.
TEST(SelectLayer, PerHeadSetsFollowTheirHeadWhereSharedSetsCannot) {
  const int64_t n = 8;
  // Head 0 prefers the early middle tokens, head 1 the late ones.
  const std::vector<float> s = {0, 9, 8, 7, 1, 1, 1, 0,  //
                                0, 1, 1, 1, 7, 8, 9, 0};
  auto o = options(0.5, 1, 1);
  o.per_head = true;
  const auto per_head = e8kv::select::select_layer(layer_scores(s, 2, n), o);
  ASSERT_EQ(per_head.size(), 2u);
  EXPECT_EQ(per_head[0], (std::vector<int64_t>{0, 1, 2, 7}));
  EXPECT_EQ(per_head[1], (std::vector<int64_t>{0, 5, 6, 7}));
  o.per_head = false;
  o.head_aggregation = Aggregation::kMax;  // max: 9, 8, 7, 7, 8, 9 over tokens 1..6 -> 1 and 6
  EXPECT_EQ(e8kv::select::select_layer(layer_scores(s, 2, n), o), (std::vector<std::vector<int64_t>>{{0, 1, 6, 7}}));
  o.head_aggregation = Aggregation::kMean;  // mean: 5, 4.5, 4, 4, 4.5, 5 -> 1 and 6
  EXPECT_EQ(e8kv::select::select_layer(layer_scores(s, 2, n), o), (std::vector<std::vector<int64_t>>{{0, 1, 6, 7}}));
}

// ---- mask ------------------------------------------------------------------------------------

TEST(AdditiveMask, ZeroForKeptMinusInfinityForEvicted) {
  const auto m = e8kv::select::additive_mask(6, {0, 2, 5});
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(m, (std::vector<float>{0.f, -inf, 0.f, -inf, -inf, 0.f}));
  EXPECT_TRUE(e8kv::select::additive_mask(0, {}).empty());
  EXPECT_THROW(e8kv::select::additive_mask(3, {3}), e8kv::Error);
  EXPECT_THROW(e8kv::select::additive_mask(3, {-1}), e8kv::Error);
}

}  // namespace
