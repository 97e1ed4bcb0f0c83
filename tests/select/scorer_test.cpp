// select/scorer.hpp against the naive reference in naive_select.hpp: every scorer, max-pooling,
// GQA mean/max over query heads and mean/max over KV heads, on fixed printed seeds and edge
// sizes (0, 1, odd, window, window + 1).
#include "e8kv/select/scorer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/half.hpp"
#include "naive_select.hpp"
#include "testing/test_util.hpp"

namespace {

using e8kv::DType;
using e8kv::LayerQueries;
using e8kv::TensorView;
using e8kv::select::Aggregation;
using e8kv::select::LayerScores;
using e8kv::select::ScorerKind;
using e8kv::select::ScorerOptions;
using e8kv::select::score_layer;
namespace naive = e8kv::naive;

constexpr int64_t kDim = 16;
// Float softmax sums against the double reference: relative 1e-4 plus an absolute floor for the
// tiny probabilities (the library works in float, the reference in double).
constexpr double kRelTol = 1e-4, kAbsTol = 1e-6;

naive::Keys random_keys(std::mt19937_64& rng, int64_t tokens, int64_t heads, int32_t first_position) {
  naive::Keys k;
  k.tokens = tokens;
  k.heads = heads;
  k.dim = kDim;
  // Amplitude 1.5 with d = 16 spreads the logits over a few units: softmax neither flat nor one-hot.
  k.x = naive::uniform_floats(rng, static_cast<size_t>(tokens * heads * kDim), 1.5);
  int32_t p = first_position;
  for (int64_t t = 0; t < tokens; ++t) {
    k.pos.push_back(p);
    p += 1 + static_cast<int32_t>(rng() % 3);  // gaps, as after an earlier eviction
  }
  return k;
}

naive::Queries random_queries(std::mt19937_64& rng, int64_t window, int64_t heads, std::vector<int32_t> positions) {
  naive::Queries q;
  q.window = window;
  q.heads = heads;
  q.dim = kDim;
  q.x = naive::uniform_floats(rng, static_cast<size_t>(window * heads * kDim), 1.5);
  q.pos = std::move(positions);
  return q;
}

TensorView view_of(const naive::Keys& k) { return TensorView::nhd(k.x.data(), DType::kF32, k.tokens, k.heads, k.dim); }
TensorView view_of(const naive::Queries& q) {
  return TensorView::nhd(q.x.data(), DType::kF32, q.window, q.heads, q.dim);
}

double default_scale() { return 1.0 / std::sqrt(static_cast<double>(kDim)); }

void expect_close(const LayerScores& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.scores.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = kAbsTol + kRelTol * std::fabs(want[i]);
    ASSERT_NEAR(got.scores[i], want[i], tol) << what << " at head " << i / static_cast<size_t>(got.tokens ? got.tokens : 1)
                                             << " token " << i % static_cast<size_t>(got.tokens ? got.tokens : 1);
  }
}

naive::Reduce reduce_of(Aggregation a) { return a == Aggregation::kMean ? naive::Reduce::kMean : naive::Reduce::kMax; }

struct GqaShape {
  int64_t kv_heads, q_heads;
};
// MHA, GQA with groups of 3, MQA, and MHA with an odd head count.
const GqaShape kShapes[] = {{1, 1}, {2, 6}, {1, 4}, {3, 3}};
// 1, 2, odd, a window, window + 1 and a longer run (the windows below are 1, 5 and 32).
const int64_t kTokenCounts[] = {1, 2, 7, 32, 33, 50, 65, 130};  // 65, 130: past the logits' 64-key blocks

// ---- observation window ------------------------------------------------------------------

// Where the observation queries sit relative to the keys.
enum class QueryPlacement {
  kImplicit,      // positions == nullptr: the last `window` key positions (documented default)
  kAfterTheKeys,  // explicit, after the last key (a decode-time window): every key visible
  kInsideTheKeys  // explicit, interleaved with the keys: the causal mask hides later keys
};

std::vector<int32_t> query_positions(const naive::Keys& k, int64_t window, QueryPlacement where) {
  std::vector<int32_t> pos(static_cast<size_t>(window));
  for (int64_t w = 0; w < window; ++w) {
    switch (where) {
      case QueryPlacement::kImplicit:
        // Documented: the last `window` positions of the sequence; a window longer than the
        // sequence puts its extra leading queries at the first key's position.
        pos[static_cast<size_t>(w)] = k.pos[static_cast<size_t>(std::max<int64_t>(0, k.tokens - window + w))];
        break;
      case QueryPlacement::kAfterTheKeys: pos[static_cast<size_t>(w)] = k.pos.back() + 1 + static_cast<int32_t>(w); break;
      case QueryPlacement::kInsideTheKeys:
        pos[static_cast<size_t>(w)] = k.pos[static_cast<size_t>((w * 5) % k.tokens)] + static_cast<int32_t>(w % 2);
        break;
    }
  }
  return pos;
}

TEST(ObservationWindowScorer, MatchesNaiveOverShapesSizesWindowsAndPooling) {
  auto rng = e8kv::test::seeded_rng(1101);
  for (const auto shape : kShapes)
    for (const int64_t tokens : kTokenCounts)
      for (const int64_t window : {1, 5, 32})
        for (const auto where : {QueryPlacement::kImplicit, QueryPlacement::kAfterTheKeys, QueryPlacement::kInsideTheKeys})
          for (const auto gqa : {Aggregation::kMean, Aggregation::kMax})
            for (const int pool : {1, 3, 7}) {
              const auto k = random_keys(rng, tokens, shape.kv_heads, 10);
              const auto q = random_queries(rng, window, shape.q_heads, query_positions(k, window, where));
              const LayerQueries lq{view_of(q), where == QueryPlacement::kImplicit ? nullptr : q.pos.data()};
              ScorerOptions o;
              o.kind = ScorerKind::kObservationWindow;
              o.window = 99;  // ignored by this scorer: the window is the queries' token count
              o.pool_kernel = pool;
              o.gqa = gqa;
              const auto got = score_layer(view_of(k), k.pos.data(), &lq, o);
              const auto want = naive::max_pool(naive::attention_scores(k, {q}, reduce_of(gqa), default_scale()),
                                                k.heads, k.tokens, pool);
              expect_close(got, want,
                           "kv " + std::to_string(shape.kv_heads) + " q " + std::to_string(shape.q_heads) + " tokens " +
                               std::to_string(tokens) + " window " + std::to_string(window) + " placement " +
                               std::to_string(static_cast<int>(where)) + " gqa " + std::to_string(static_cast<int>(gqa)) +
                               " pool " + std::to_string(pool));
              if (HasFatalFailure()) return;
            }
}

// The logits run in an AVX2 twin where the CPU has it: the same bits as the baseline build, for
// the observation window and the key-key proxy.
TEST(ObservationWindowScorer, BaselineAndAvx2GiveIdenticalBits) {
  auto rng = e8kv::test::seeded_rng(1109);
  const auto k = random_keys(rng, 130, 2, 0);
  const auto q = random_queries(rng, 32, 6, query_positions(k, 32, QueryPlacement::kImplicit));
  const LayerQueries lq{view_of(q), nullptr};
  for (const ScorerKind kind : {ScorerKind::kObservationWindow, ScorerKind::kKeyKeyProxy}) {
    ScorerOptions o;
    o.kind = kind;
    o.window = 32;
    const auto fast = score_layer(view_of(k), k.pos.data(), &lq, o);
    e8kv::force_baseline_isa(true);
    const auto base = score_layer(view_of(k), k.pos.data(), &lq, o);
    e8kv::force_baseline_isa(false);
    EXPECT_EQ(fast.scores, base.scores) << "scorer " << static_cast<int>(kind);
  }
}

// A query that sees no key (every key after it) adds nothing, so a window of such queries
// scores every token 0.
TEST(ObservationWindowScorer, QueriesBeforeEveryKeyScoreNothing) {
  auto rng = e8kv::test::seeded_rng(1102);
  const auto k = random_keys(rng, 9, 2, 100);
  const auto q = random_queries(rng, 4, 4, {0, 1, 2, 99});
  const LayerQueries lq{view_of(q), q.pos.data()};
  ScorerOptions o;
  o.pool_kernel = 1;
  const auto got = score_layer(view_of(k), k.pos.data(), &lq, o);
  for (float s : got.scores) EXPECT_EQ(s, 0.f);
}

// Each query's attention sums to 1 over the keys it sees: with every key visible and no pooling,
// a head's scores sum to the window length (mean over the group) for any data.
TEST(ObservationWindowScorer, ScoresOfAHeadSumToTheWindowLength) {
  auto rng = e8kv::test::seeded_rng(1103);
  const auto k = random_keys(rng, 33, 2, 0);
  const auto q = random_queries(rng, 5, 6, query_positions(k, 5, QueryPlacement::kAfterTheKeys));
  const LayerQueries lq{view_of(q), q.pos.data()};
  ScorerOptions o;
  o.pool_kernel = 1;
  const auto got = score_layer(view_of(k), k.pos.data(), &lq, o);
  for (int64_t h = 0; h < 2; ++h) {
    double sum = 0;
    for (int64_t t = 0; t < 33; ++t) sum += got.at(h, t);
    EXPECT_NEAR(sum, 5.0, 1e-4) << "head " << h;
  }
}

TEST(ObservationWindowScorer, ExplicitSoftmaxScaleIsUsed) {
  auto rng = e8kv::test::seeded_rng(1104);
  const auto k = random_keys(rng, 17, 1, 0);
  const auto q = random_queries(rng, 3, 2, query_positions(k, 3, QueryPlacement::kAfterTheKeys));
  const LayerQueries lq{view_of(q), q.pos.data()};
  ScorerOptions o;
  o.pool_kernel = 1;
  for (const float scale : {0.05f, 0.7f}) {
    const auto got = score_layer(view_of(k), k.pos.data(), &lq, o, scale);
    expect_close(got, naive::attention_scores(k, {q}, naive::Reduce::kMean, scale), "scale " + std::to_string(scale));
  }
}

// ---- multi-window ------------------------------------------------------------------------

// Two windows handed over as one LayerQueries (first queries, then last queries, each with its
// positions): the score is the attention summed over both windows.
TEST(MultiWindowScorer, MatchesNaiveSumOverBothWindows) {
  auto rng = e8kv::test::seeded_rng(1201);
  for (const auto shape : kShapes)
    for (const int64_t tokens : {7, 33, 50})
      for (const auto gqa : {Aggregation::kMean, Aggregation::kMax})
        for (const int pool : {1, 5}) {
          const auto k = random_keys(rng, tokens, shape.kv_heads, 0);
          // First window: queries at the first three key positions (each sees only a prefix);
          // last window: four queries after the keys.
          const auto early = random_queries(rng, 3, shape.q_heads, {k.pos[0], k.pos[1], k.pos[2]});
          const auto late = random_queries(rng, 4, shape.q_heads, query_positions(k, 4, QueryPlacement::kAfterTheKeys));
          naive::Queries both = early;
          both.window = early.window + late.window;
          both.x.insert(both.x.end(), late.x.begin(), late.x.end());
          both.pos.insert(both.pos.end(), late.pos.begin(), late.pos.end());
          const LayerQueries lq{view_of(both), both.pos.data()};
          ScorerOptions o;
          o.kind = ScorerKind::kMultiWindow;
          o.pool_kernel = pool;
          o.gqa = gqa;
          const auto got = score_layer(view_of(k), k.pos.data(), &lq, o);
          const auto want = naive::max_pool(naive::attention_scores(k, {early, late}, reduce_of(gqa), default_scale()),
                                            k.heads, k.tokens, pool);
          expect_close(got, want, "tokens " + std::to_string(tokens) + " q " + std::to_string(shape.q_heads));
          if (HasFatalFailure()) return;
        }
}

// ---- key-key proxy -----------------------------------------------------------------------

TEST(KeyKeyScorer, MatchesNaiveOverSizesWindowsAndPooling) {
  auto rng = e8kv::test::seeded_rng(1301);
  for (const int64_t heads : {1, 3})
    for (const int64_t tokens : kTokenCounts)
      for (const int window : {1, 5, 32, 100})  // 100: longer than every sequence here
        for (const int pool : {1, 3, 7}) {
          const auto k = random_keys(rng, tokens, heads, 3);
          ScorerOptions o;
          o.kind = ScorerKind::kKeyKeyProxy;
          o.window = window;
          o.pool_kernel = pool;
          // Queries are not needed and are ignored when given.
          const auto got = score_layer(view_of(k), k.pos.data(), nullptr, o);
          const auto want = naive::max_pool(naive::key_key_scores(k, window, default_scale()), heads, tokens, pool);
          expect_close(got, want, "tokens " + std::to_string(tokens) + " window " + std::to_string(window) + " pool " +
                                      std::to_string(pool));
          if (HasFatalFailure()) return;
        }
}

// ---- key norm, streaming, random: per-token baselines, never pooled -------------------------

TEST(KeyNormScorer, IsMinusTheL2NormAndIsNotPooled) {
  auto rng = e8kv::test::seeded_rng(1401);
  for (const int64_t tokens : kTokenCounts) {
    const auto k = random_keys(rng, tokens, 3, 0);
    ScorerOptions o;
    o.kind = ScorerKind::kKeyNorm;
    o.pool_kernel = 7;  // documented: pooling applies to the attention scorers only
    const auto got = score_layer(view_of(k), k.pos.data(), nullptr, o);
    expect_close(got, naive::key_norm_scores(k), "tokens " + std::to_string(tokens));
  }
}

// Naive: the score is the token's distance in positions from the layer's first key, for every
// head; not pooled (a pool would flatten the ranking near the end).
TEST(StreamingScorer, IsThePositionCountedFromTheFirstKeyAndIsNotPooled) {
  auto rng = e8kv::test::seeded_rng(1501);
  for (const int64_t tokens : kTokenCounts) {
    const auto k = random_keys(rng, tokens, 2, 5);
    ScorerOptions o;
    o.kind = ScorerKind::kStreaming;
    o.pool_kernel = 7;
    const auto got = score_layer(view_of(k), k.pos.data(), nullptr, o);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < tokens; ++t)
        ASSERT_EQ(got.at(h, t), static_cast<float>(k.pos[static_cast<size_t>(t)] - k.pos[0]))
            << "tokens " << tokens << " head " << h << " token " << t;
  }
}

// Positions past 2^24 are not all representable as floats: scoring by the raw position made
// neighbours tie (and a tie goes to the older token), so the most recent tokens were not the
// ones ranked highest. Scores count from the layer's first key instead.
TEST(StreamingScorer, StaysStrictlyIncreasingAtPositionsPastTwoToThe24) {
  naive::Keys k;
  k.tokens = 64;
  k.heads = 1;
  k.dim = kDim;
  k.x.assign(static_cast<size_t>(k.tokens * kDim), 0.5f);
  for (int64_t t = 0; t < k.tokens; ++t) k.pos.push_back((1 << 25) + 1 + static_cast<int32_t>(t));
  ScorerOptions o;
  o.kind = ScorerKind::kStreaming;
  const auto got = score_layer(view_of(k), k.pos.data(), nullptr, o);
  for (int64_t t = 1; t < k.tokens; ++t) EXPECT_LT(got.at(0, t - 1), got.at(0, t)) << "token " << t;
}

TEST(RandomScorer, IsSplitMix64OfThePositionTop24BitsSameForEveryHead) {
  auto rng = e8kv::test::seeded_rng(1601);
  for (const uint64_t seed : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}})
    for (const int64_t tokens : kTokenCounts) {
      const auto k = random_keys(rng, tokens, 3, 7);
      ScorerOptions o;
      o.kind = ScorerKind::kRandom;
      o.seed = seed;
      o.pool_kernel = 7;
      const auto got = score_layer(view_of(k), k.pos.data(), nullptr, o);
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t t = 0; t < tokens; ++t) {
          const uint64_t counter = static_cast<uint64_t>(k.pos[static_cast<size_t>(t)]);
          const float want = static_cast<float>(naive::splitmix64_sequential(seed, counter + 1) >> 40);
          ASSERT_EQ(got.at(h, t), want) << "seed " << seed << " tokens " << tokens << " head " << h << " token " << t;
        }
    }
}

TEST(RandomScorer, DependsOnTheSeedAndNotOnTheKeys) {
  auto rng = e8kv::test::seeded_rng(1602);
  const auto a = random_keys(rng, 20, 1, 0);
  auto b = a;
  b.x = naive::uniform_floats(rng, b.x.size(), 3.0);
  ScorerOptions o;
  o.kind = ScorerKind::kRandom;
  o.seed = 9;
  EXPECT_EQ(score_layer(view_of(a), a.pos.data(), nullptr, o).scores,
            score_layer(view_of(b), b.pos.data(), nullptr, o).scores);
  ScorerOptions other = o;
  other.seed = 10;
  EXPECT_NE(score_layer(view_of(a), a.pos.data(), nullptr, o).scores,
            score_layer(view_of(a), a.pos.data(), nullptr, other).scores);
}

// ---- pooling in isolation ------------------------------------------------------------------

// Max-pooling is exact arithmetic, so the pooled scores equal the naive pool of the library's
// own unpooled scores bit for bit, including at both ends of the sequence.
TEST(MaxPooling, EqualsNaivePoolOfUnpooledScoresExactly) {
  auto rng = e8kv::test::seeded_rng(1701);
  for (const int64_t tokens : {1, 2, 3, 7, 8, 33})
    for (const int pool : {3, 5, 7, 9, 65}) {  // 65: wider than every sequence here
      const auto k = random_keys(rng, tokens, 2, 0);
      const auto q = random_queries(rng, 4, 4, query_positions(k, 4, QueryPlacement::kInsideTheKeys));
      const LayerQueries lq{view_of(q), q.pos.data()};
      ScorerOptions o;
      o.pool_kernel = 1;
      const auto unpooled = score_layer(view_of(k), k.pos.data(), &lq, o);
      o.pool_kernel = pool;
      const auto pooled = score_layer(view_of(k), k.pos.data(), &lq, o);
      const std::vector<double> raw(unpooled.scores.begin(), unpooled.scores.end());
      const auto want = naive::max_pool(raw, 2, tokens, pool);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(pooled.scores[i], static_cast<float>(want[i])) << "tokens " << tokens << " pool " << pool << " i " << i;
    }
}

// ---- head aggregation ------------------------------------------------------------------------

TEST(AggregateHeads, MeanAndMaxMatchNaive) {
  auto rng = e8kv::test::seeded_rng(1801);
  for (const int64_t heads : {1, 2, 3, 8})
    for (const int64_t tokens : {0, 1, 7, 33}) {
      LayerScores s;
      s.kv_heads = heads;
      s.tokens = tokens;
      s.scores = naive::uniform_floats(rng, static_cast<size_t>(heads * tokens), 4.0);
      const auto mean = e8kv::select::aggregate_heads(s, Aggregation::kMean);
      const auto max = e8kv::select::aggregate_heads(s, Aggregation::kMax);
      const auto want_mean = naive::combine_heads(s.scores, heads, tokens, naive::Reduce::kMean);
      const auto want_max = naive::combine_heads(s.scores, heads, tokens, naive::Reduce::kMax);
      ASSERT_EQ(mean.size(), static_cast<size_t>(tokens));
      ASSERT_EQ(max.size(), static_cast<size_t>(tokens));
      for (int64_t t = 0; t < tokens; ++t) {
        EXPECT_NEAR(mean[static_cast<size_t>(t)], want_mean[static_cast<size_t>(t)], 1e-6) << heads << " heads, token " << t;
        EXPECT_EQ(max[static_cast<size_t>(t)], static_cast<float>(want_max[static_cast<size_t>(t)])) << heads << " heads, token " << t;
      }
    }
}

TEST(AggregateHeads, NoHeadsGivesZeros) {
  LayerScores s;
  s.kv_heads = 0;
  s.tokens = 3;
  for (const auto how : {Aggregation::kMean, Aggregation::kMax})
    EXPECT_EQ(e8kv::select::aggregate_heads(s, how), std::vector<float>(3, 0.f));
}

// ---- empty layers, layouts and dtypes, errors --------------------------------------------------

TEST(ScoreLayer, EmptyLayerGivesEmptyScoresForEveryScorer) {
  const std::vector<float> none;
  const TensorView keys = TensorView::nhd(nullptr, DType::kF32, 0, 2, kDim);
  for (const auto kind : {ScorerKind::kObservationWindow, ScorerKind::kMultiWindow, ScorerKind::kKeyKeyProxy,
                          ScorerKind::kStreaming, ScorerKind::kRandom, ScorerKind::kKeyNorm}) {
    ScorerOptions o;
    o.kind = kind;
    const auto s = score_layer(keys, nullptr, nullptr, o);
    EXPECT_EQ(s.kv_heads, 2) << to_string(kind);
    EXPECT_EQ(s.tokens, 0) << to_string(kind);
    EXPECT_TRUE(s.scores.empty()) << to_string(kind);
  }
}

// The same keys through an NHD f32 view, an HND view with spare capacity, and fp16 / bf16 views
// of the rounded values score identically (the scorer reads through TensorView::load).
TEST(ScoreLayer, LayoutsAndDtypesGiveIdenticalScores) {
  auto rng = e8kv::test::seeded_rng(1901);
  const int64_t T = 13, H = 2, Q = 4, cap = 16;
  auto k = random_keys(rng, T, H, 0);
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> bits(k.x.size());
    std::vector<float> rounded(k.x.size());
    for (size_t i = 0; i < k.x.size(); ++i) {
      bits[i] = dtype == DType::kF16 ? e8kv::float_to_fp16_bits(k.x[i]) : e8kv::float_to_bf16_bits(k.x[i]);
      rounded[i] = dtype == DType::kF16 ? e8kv::fp16_bits_to_float(bits[i]) : e8kv::bf16_bits_to_float(bits[i]);
    }
    std::vector<float> hnd(static_cast<size_t>(H * cap * kDim), std::numeric_limits<float>::quiet_NaN());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < kDim; ++i)
          hnd[static_cast<size_t>((h * cap + t) * kDim + i)] = rounded[static_cast<size_t>((t * H + h) * kDim + i)];
    const auto q = random_queries(rng, 3, Q, query_positions(k, 3, QueryPlacement::kAfterTheKeys));
    const LayerQueries lq{view_of(q), q.pos.data()};
    for (const auto kind : {ScorerKind::kObservationWindow, ScorerKind::kKeyKeyProxy, ScorerKind::kKeyNorm}) {
      ScorerOptions o;
      o.kind = kind;
      const auto f32 = score_layer(TensorView::nhd(rounded.data(), DType::kF32, T, H, kDim), k.pos.data(), &lq, o);
      const auto half = score_layer(TensorView::nhd(bits.data(), dtype, T, H, kDim), k.pos.data(), &lq, o);
      const auto hnd_view = score_layer(TensorView::hnd(hnd.data(), DType::kF32, T, H, kDim, cap), k.pos.data(), &lq, o);
      EXPECT_EQ(half.scores, f32.scores) << to_string(kind) << " dtype " << to_string(dtype);
      EXPECT_EQ(hnd_view.scores, f32.scores) << to_string(kind);
    }
  }
}

TEST(ScoreLayer, RejectsInvalidArguments) {
  auto rng = e8kv::test::seeded_rng(1902);
  const auto k = random_keys(rng, 5, 2, 0);
  const auto q = random_queries(rng, 2, 4, {10, 11});
  const LayerQueries lq{view_of(q), q.pos.data()};
  ScorerOptions o;
  o.window = 0;
  EXPECT_THROW(score_layer(view_of(k), k.pos.data(), &lq, o), e8kv::Error);
  o = {};
  o.pool_kernel = 4;  // even kernels have no centre
  EXPECT_THROW(score_layer(view_of(k), k.pos.data(), &lq, o), e8kv::Error);
  o.pool_kernel = 0;
  EXPECT_THROW(score_layer(view_of(k), k.pos.data(), &lq, o), e8kv::Error);
  o = {};
  EXPECT_THROW(score_layer(view_of(k), nullptr, &lq, o), e8kv::Error);  // positions required
  for (const auto kind : {ScorerKind::kObservationWindow, ScorerKind::kMultiWindow}) {
    o.kind = kind;
    EXPECT_THROW(score_layer(view_of(k), k.pos.data(), nullptr, o), e8kv::Error) << to_string(kind);
  }
  // 3 query heads over 2 KV heads is not a GQA grouping; head_dim must match.
  const auto q3 = random_queries(rng, 2, 3, {10, 11});
  const LayerQueries lq3{view_of(q3), q3.pos.data()};
  o.kind = ScorerKind::kObservationWindow;
  EXPECT_THROW(score_layer(view_of(k), k.pos.data(), &lq3, o), e8kv::Error);
  const std::vector<float> short_q(2 * 4 * 8, 0.f);
  const LayerQueries lq_dim{TensorView::nhd(short_q.data(), DType::kF32, 2, 4, 8), q.pos.data()};
  EXPECT_THROW(score_layer(view_of(k), k.pos.data(), &lq_dim, o), e8kv::Error);
}

// Options arrive from configs and containers as bytes: an id outside the enum is an error, for
// every scorer (it used to fall through to unpooled zeros) and for the GQA reduction.
TEST(ScoreLayer, RejectsUnknownScorerAndAggregationIds) {
  auto rng = e8kv::test::seeded_rng(1904);
  const auto k = random_keys(rng, 5, 1, 0);
  const auto q = random_queries(rng, 2, 1, {10, 11});
  const LayerQueries lq{view_of(q), q.pos.data()};
  ScorerOptions o;
  o.kind = static_cast<ScorerKind>(6);
  EXPECT_THROW(score_layer(view_of(k), k.pos.data(), &lq, o), e8kv::Error);
  o.kind = static_cast<ScorerKind>(255);
  EXPECT_THROW(score_layer(view_of(k), k.pos.data(), &lq, o), e8kv::Error);
  o = {};
  o.gqa = static_cast<Aggregation>(2);
  EXPECT_THROW(score_layer(view_of(k), k.pos.data(), &lq, o), e8kv::Error);
  LayerScores s;
  s.kv_heads = 1;
  s.tokens = 1;
  s.scores = {1.f};
  EXPECT_THROW(e8kv::select::aggregate_heads(s, static_cast<Aggregation>(2)), e8kv::Error);
}

TEST(ScoreLayer, RejectsNonFiniteKeysAndQueries) {
  auto rng = e8kv::test::seeded_rng(1903);
  auto k = random_keys(rng, 5, 1, 0);
  auto q = random_queries(rng, 2, 1, {10, 11});
  ScorerOptions o;
  q.x[3] = std::numeric_limits<float>::quiet_NaN();
  const LayerQueries bad_q{view_of(q), q.pos.data()};
  EXPECT_THROW(score_layer(view_of(k), k.pos.data(), &bad_q, o), e8kv::Error);
  q.x[3] = 0.f;
  k.x[7] = std::numeric_limits<float>::infinity();
  const LayerQueries good_q{view_of(q), q.pos.data()};
  for (const auto kind : {ScorerKind::kObservationWindow, ScorerKind::kKeyKeyProxy, ScorerKind::kKeyNorm}) {
    o.kind = kind;
    EXPECT_THROW(score_layer(view_of(k), k.pos.data(), &good_q, o), e8kv::Error) << to_string(kind);
  }
}

TEST(ScorerNames, RoundTripAndUnknownNamesListTheAccepted) {
  for (const auto kind : {ScorerKind::kObservationWindow, ScorerKind::kMultiWindow, ScorerKind::kKeyKeyProxy,
                          ScorerKind::kStreaming, ScorerKind::kRandom, ScorerKind::kKeyNorm})
    EXPECT_EQ(e8kv::select::scorer_from_string(to_string(kind)), kind);
  try {
    e8kv::select::scorer_from_string("snapkv");
    FAIL() << "no exception";
  } catch (const e8kv::Error& e) {
    EXPECT_NE(std::string(e.what()).find("obs-window"), std::string::npos) << e.what();
  }
}

}  // namespace
