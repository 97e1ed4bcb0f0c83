// Rate allocation (select/rate_allocation.hpp): the greedy allocator against brute force, the
// budget met exactly, fixed layers, the sensitivity estimate's closed forms, and the compressor's
// budget mode end to end (the chosen codes in the cache's layout, a container round trip,
// extend/append keeping them).
#include "e8kv/select/rate_allocation.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/parallel.hpp"
#include "testing/kv_fixture.hpp"

namespace e8kv::select {
namespace {

using quant::Codec;

std::vector<RateOption> convex_options() {
  return {{Codec::kE8P, 2, 0.09}, {Codec::kRvq3, 3, 0.03}, {Codec::kRvq4, 4, 0.008}};
}

double total_error(const std::vector<LayerSensitivity>& s, const std::vector<LayerRate>& r,
                   const std::vector<RateOption>& o) {
  auto D = [&](Codec c) {
    for (const auto& x : o)
      if (x.codec == c) return x.distortion;
    ADD_FAILURE() << "codec outside the options";
    return 0.0;
  };
  double e = 0.0;
  for (size_t l = 0; l < s.size(); ++l) e += s[l].key * D(r[l].key) + s[l].value * D(r[l].value);
  return e;
}

TEST(RateAllocation, GreedyMatchesBruteForceUnderTheBudget) {
  const uint64_t seed = 20261202;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> sens(0.0, 1.5);
  const auto options = convex_options();
  for (int trial = 0; trial < 40; ++trial) {
    const int L = 1 + trial % 3;  // up to 6 items: 3^6 profiles
    std::vector<LayerSensitivity> s(static_cast<size_t>(L));
    for (auto& x : s) x = {sens(rng), sens(rng)};
    const double budget = 2.0 + 0.25 * (trial % 9);
    const auto got = allocate_rates(s, options, budget);
    ASSERT_EQ(got.size(), s.size());
    const double rate = mean_index_bits(got, options);
    EXPECT_LE(rate, budget + 1e-12);
    // Brute force over every profile within the budget.
    const int items = 2 * L;
    double best = INFINITY;
    int combos = 1;
    for (int i = 0; i < items; ++i) combos *= 3;
    for (int c = 0; c < combos; ++c) {
      std::vector<LayerRate> r(static_cast<size_t>(L));
      int code = c, bits = 0;
      for (int i = 0; i < items; ++i) {
        const auto& o = options[static_cast<size_t>(code % 3)];
        code /= 3;
        bits += o.bits;
        (i % 2 ? r[static_cast<size_t>(i / 2)].value : r[static_cast<size_t>(i / 2)].key) = o.codec;
      }
      if (bits > budget * items + 1e-9) continue;
      best = std::min(best, total_error(s, r, options));
    }
    EXPECT_NEAR(total_error(s, got, options), best, 1e-12 * best) << "trial " << trial;
  }
}

TEST(RateAllocation, BudgetIsMetExactlyWhenReachable) {
  const auto options = convex_options();
  std::vector<LayerSensitivity> s(10, {1.0, 1.0});
  for (double budget : {2.0, 2.05, 2.5, 2.8, 3.35, 4.0}) {
    const auto r = allocate_rates(s, options, budget);
    EXPECT_DOUBLE_EQ(mean_index_bits(r, options), std::floor(budget * 20 + 1e-9) / 20) << budget;
  }
  // Between steps: the largest reachable rate below the budget.
  std::vector<LayerSensitivity> three(3, {1.0, 1.0});
  EXPECT_DOUBLE_EQ(mean_index_bits(allocate_rates(three, options, 2.1), options), 2.0);
  EXPECT_DOUBLE_EQ(mean_index_bits(allocate_rates(three, options, 2.2), options), 2.0 + 1.0 / 6);
}

TEST(RateAllocation, LayerTokensWeighTheBudget) {
  const uint64_t seed = 20261204;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> sens(0.0, 1.5);
  std::uniform_int_distribution<int64_t> tokens(0, 300);
  const auto options = convex_options();
  for (int trial = 0; trial < 60; ++trial) {
    const int L = 1 + trial % 5;
    std::vector<LayerSensitivity> s(static_cast<size_t>(L));
    for (auto& x : s) x = {sens(rng), sens(rng)};
    std::vector<int64_t> w(static_cast<size_t>(L));
    for (auto& x : w) x = tokens(rng);
    const double budget = 2.0 + 0.25 * (trial % 9);
    const auto got = allocate_rates(s, options, budget, {}, {}, w);
    const double rate = mean_index_bits(got, options, {}, w);
    EXPECT_LE(rate, budget + 1e-12) << "trial " << trial;
    // Nothing more fits: every remaining upgrade would cross the budget.
    int64_t units = 0, spent = 0;
    for (int l = 0; l < L; ++l) {
      units += 2 * w[static_cast<size_t>(l)];
      spent += w[static_cast<size_t>(l)] * (quant::index_bits(got[static_cast<size_t>(l)].key) / 8 +
                                            quant::index_bits(got[static_cast<size_t>(l)].value) / 8);
    }
    const int64_t total = static_cast<int64_t>(std::floor(budget * static_cast<double>(units) + 1e-9));
    for (int l = 0; l < L; ++l)
      for (Codec c : {got[static_cast<size_t>(l)].key, got[static_cast<size_t>(l)].value})
        if (c != Codec::kRvq4 && w[static_cast<size_t>(l)] > 0) {
          EXPECT_GT(spent + w[static_cast<size_t>(l)], total) << "trial " << trial << " layer " << l;
        }
    // Equal weights are the unweighted allocation.
    const std::vector<int64_t> equal(static_cast<size_t>(L), 37);
    const auto a = allocate_rates(s, options, budget), b = allocate_rates(s, options, budget, {}, {}, equal);
    for (int l = 0; l < L; ++l) {
      EXPECT_EQ(a[static_cast<size_t>(l)].key, b[static_cast<size_t>(l)].key);
      EXPECT_EQ(a[static_cast<size_t>(l)].value, b[static_cast<size_t>(l)].value);
    }
    EXPECT_DOUBLE_EQ(mean_index_bits(a, options), mean_index_bits(b, options, {}, equal));
  }
  // A layer that codes few tokens gets its bits cheaply: same sensitivities, 10 vs 1000 tokens.
  const std::vector<LayerSensitivity> same(2, {1.0, 1.0});
  const auto r = allocate_rates(same, options, 2.5, {}, {}, {10, 1000});
  EXPECT_EQ(r[0].key, Codec::kRvq4);
  EXPECT_EQ(r[0].value, Codec::kRvq4);
  EXPECT_THROW(allocate_rates(same, options, 2.5, {}, {}, {10}), Error);
  EXPECT_THROW(allocate_rates(same, options, 2.5, {}, {}, {10, -1}), Error);
}

TEST(RateAllocation, BitsGoWhereTheErrorIs) {
  const auto options = convex_options();
  // Layer 1's values dominate: its values get the first bits, then its keys.
  std::vector<LayerSensitivity> s = {{1.0, 1.0}, {10.0, 1000.0}, {1.0, 1.0}};
  auto r = allocate_rates(s, options, 2.0 + 1.0 / 6);  // one step
  EXPECT_EQ(r[1].value, Codec::kRvq3);
  EXPECT_EQ(r[1].key, Codec::kE8P);
  r = allocate_rates(s, options, 2.0 + 2.0 / 6);
  EXPECT_EQ(r[1].value, Codec::kRvq4);
  r = allocate_rates(s, options, 2.0 + 3.0 / 6);
  EXPECT_EQ(r[1].key, Codec::kRvq3);
  // Ties: lower layer first, keys before values.
  std::vector<LayerSensitivity> even(2, {1.0, 1.0});
  r = allocate_rates(even, options, 2.25);
  EXPECT_EQ(r[0].key, Codec::kRvq3);
  EXPECT_EQ(r[0].value, Codec::kE8P);
  EXPECT_EQ(r[1].key, Codec::kE8P);
}

TEST(RateAllocation, FixedLayersStayOutsideTheBudget) {
  const auto options = convex_options();
  std::vector<LayerSensitivity> s = {{100.0, 100.0}, {1.0, 1.0}, {1.0, 1.0}, {100.0, 100.0}};
  const std::vector<bool> fixed = {true, false, false, true};
  const std::vector<LayerRate> fixed_rate(4, LayerRate{Codec::kFp16, Codec::kFp16});
  const auto r = allocate_rates(s, options, 3.0, fixed, fixed_rate);
  EXPECT_EQ(r[0].key, Codec::kFp16);
  EXPECT_EQ(r[3].value, Codec::kFp16);
  EXPECT_DOUBLE_EQ(mean_index_bits(r, options, fixed), 3.0);
}

TEST(RateAllocation, BadInputIsAClearError) {
  const auto options = convex_options();
  std::vector<LayerSensitivity> s(2, {1.0, 1.0});
  EXPECT_THROW(allocate_rates(s, options, 1.9), Error);
  EXPECT_THROW(allocate_rates(s, options, std::nan("")), Error);
  EXPECT_THROW(allocate_rates({{1.0, -1.0}}, options, 3.0), Error);
  EXPECT_THROW(allocate_rates({{INFINITY, 1.0}}, options, 3.0), Error);
  EXPECT_THROW(allocate_rates(s, {}, 3.0), Error);
  EXPECT_THROW(allocate_rates(s, options, 3.0, {true}), Error);
  EXPECT_THROW(mean_index_bits({{Codec::kFp16, Codec::kE8P}}, options), Error);
  EXPECT_THROW(block_rate_options(12), Error);
}

TEST(RateAllocation, BlockOptionsAreOrderedAndConvex) {
  for (int d : {64, 128, 256}) {
    const auto& o = block_rate_options(d);
    ASSERT_EQ(o.size(), 3u);
    EXPECT_EQ(o[0].codec, Codec::kE8P);
    EXPECT_EQ(o[1].codec, Codec::kRvq3);
    EXPECT_EQ(o[2].codec, Codec::kRvq4);
    // Each bit removes most of the error (~1/4 per bit near Gaussian-optimal codes), convex.
    EXPECT_GT(o[0].distortion, o[1].distortion);
    EXPECT_GT(o[1].distortion, o[2].distortion);
    EXPECT_GT(o[0].distortion - o[1].distortion, o[1].distortion - o[2].distortion);
    EXPECT_LT(o[0].distortion, 0.15);
    EXPECT_GT(o[2].distortion, 0.0);
    std::printf("head_dim %d: D(e8p2) %.5f D(rvq3) %.5f D(rvq4) %.5f\n", d, o[0].distortion, o[1].distortion,
                o[2].distortion);
  }
}

// A layer for the sensitivity estimate: Gaussian keys, values (plus value_mean) and queries (zero
// when zero_queries; drawn after K and V from the same generator, which a test may go on using),
// positions first + stride·t, and the estimate's input over them (views into the vectors).
struct SensitivityData {
  std::mt19937_64 rng;
  std::normal_distribution<float> g{0.f, 1.f};
  std::vector<float> K, V, Q;
  std::vector<int32_t> pos;
  TensorView qv;
  SensitivityInput in;
  SensitivityData(int n, int H, int G, int d, int w, uint64_t seed, float value_mean, bool zero_queries, int32_t stride,
                  int32_t first)
      : rng(seed), K(static_cast<size_t>(n) * H * d), V(K.size()), Q(static_cast<size_t>(w) * H * G * d, 0.f),
        pos(static_cast<size_t>(n)) {
    for (auto& x : K) x = g(rng);
    for (auto& x : V) x = g(rng) + value_mean;
    if (!zero_queries)
      for (auto& x : Q) x = g(rng);
    for (int t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = first + stride * t;
    qv = TensorView::nhd(Q.data(), DType::kF32, w, H * G, d);
    in.keys = TensorView::nhd(K.data(), DType::kF32, n, H, d);
    in.values = TensorView::nhd(V.data(), DType::kF32, n, H, d);
    in.positions = pos.data();
    in.queries = &qv;
  }
  SensitivityData(const SensitivityData&) = delete;
  SensitivityData& operator=(const SensitivityData&) = delete;
};

// Closed forms of the sensitivity: zero queries attend uniformly, so with n visible tokens, w queries and
// G query heads per KV head, O = μ and S_V = Σ_h w·G·Σ_t ‖v_t − μ_h‖²/n² / Σ_h w·G·‖μ_h‖² exactly,
// and S_K = 0 (‖q‖ = 0).
TEST(RateAllocation, SensitivityClosedFormsAndScaling) {
  const int n = 37, H = 2, G = 3, d = 64, w = 5;
  SensitivityData f(n, H, G, d, w, 7, 0.5f, /*zero_queries=*/true, 3, 0);
  auto &K = f.K, &V = f.V, &Q = f.Q;
  auto& rng = f.rng;
  auto& g = f.g;
  const auto& pos = f.pos;
  const TensorView& qv = f.qv;
  SensitivityInput& in = f.in;
  const std::vector<int32_t> last(static_cast<size_t>(w), pos.back());  // every key visible
  in.query_positions = last.data();
  in.q_heads = H * G;
  in.max_queries = w;
  const LayerSensitivity s = estimate_sensitivity(in);
  double expect = 0.0, output = 0.0;
  for (int h = 0; h < H; ++h) {
    std::vector<double> mu(d, 0.0);
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < d; ++i) mu[static_cast<size_t>(i)] += V[(static_cast<size_t>(t) * H + h) * d + i] / double(n);
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < d; ++i) {
        const double x = V[(static_cast<size_t>(t) * H + h) * d + i] - mu[static_cast<size_t>(i)];
        expect += double(w) * G * x * x / (double(n) * n);
      }
    for (double m : mu) output += double(w) * G * m * m;  // O = μ for every query of the head
  }
  expect /= output;
  EXPECT_NEAR(s.value, expect, 1e-6 * expect);  // float sums inside
  EXPECT_EQ(s.key, 0.0);

  // Real queries: relative errors do not depend on the values' scale, nor on how q and k share
  // the logits' scale (the key error τ·q·e scales with ‖q‖·‖k‖).
  for (auto& x : Q) x = g(rng);
  const LayerSensitivity a = estimate_sensitivity(in);
  EXPECT_GT(a.key, 0.0);
  for (auto& x : V) x *= 4.f;
  const LayerSensitivity b = estimate_sensitivity(in);
  EXPECT_NEAR(b.value, a.value, 1e-6 * a.value);
  EXPECT_NEAR(b.key, a.key, 1e-6 * a.key);
  for (auto& x : V) x /= 4.f;
  for (auto& x : Q) x *= 0.5f;
  for (auto& x : K) x *= 2.f;  // the same logits
  const LayerSensitivity k2 = estimate_sensitivity(in);
  EXPECT_NEAR(k2.value, a.value, 1e-6 * a.value);
  EXPECT_NEAR(k2.key, a.key, 1e-6 * a.key);
  // Causality: the first query position sees only the first key (a one-token softmax, p = 1).
  std::vector<int32_t> qpos(static_cast<size_t>(w), 0);
  in.query_positions = qpos.data();
  const LayerSensitivity c = estimate_sensitivity(in);
  EXPECT_GT(c.value, 0.0);
  EXPECT_LT(c.key, 1e-6 * a.key);  // ‖v_0 − O‖ = 0 when O = v_0 (up to float rounding)
  // Without queries the last keys stand in (key-key proxy).
  in.queries = nullptr;
  in.query_positions = nullptr;
  const LayerSensitivity k = estimate_sensitivity(in);
  EXPECT_GT(k.key, 0.0);
  EXPECT_GT(k.value, 0.0);
  // Tokens that stay fp16 carry no code error: all of them fp16, nothing to spend bits on.
  in.queries = &qv;
  in.query_positions = last.data();
  const LayerSensitivity all = estimate_sensitivity(in);
  in.fp16_prefix = n;
  const LayerSensitivity none = estimate_sensitivity(in);
  EXPECT_EQ(none.key, 0.0);
  EXPECT_EQ(none.value, 0.0);
  in.fp16_prefix = 4;
  const LayerSensitivity some = estimate_sensitivity(in);
  EXPECT_LT(some.value, all.value);
  EXPECT_LT(some.key, all.key);
  EXPECT_GT(some.value, 0.0);
  // Query-weighted keys: the key term shrinks by a factor in (0, 1], the value term stays.
  in.query_weighted_keys = true;
  const LayerSensitivity qw = estimate_sensitivity(in);
  EXPECT_EQ(qw.value, some.value);
  EXPECT_LE(qw.key, some.key);
  EXPECT_GT(qw.key, 0.0);
  in.query_weighted_keys = false;
  in.fp16_prefix = -1;
  EXPECT_THROW(estimate_sensitivity(in), Error);
  in.fp16_prefix = 0;
  // Shapes are checked.
  in.values = TensorView::nhd(V.data(), DType::kF32, n - 1, H, d);
  EXPECT_THROW(estimate_sensitivity(in), Error);
}

// The estimate runs in an AVX2 twin where the CPU has it: the same bits as the baseline build,
// with observation queries (query-weighted keys, an fp16 prefix) and with the key-key proxy.
TEST(RateAllocation, SensitivityBaselineAndAvx2GiveIdenticalBits) {
  const int H = 2, G = 4, w = 8;
  SensitivityData f(141, H, G, 64, w, 11, 0.25f, /*zero_queries=*/false, 2, 1);
  const TensorView& qv = f.qv;
  SensitivityInput& in = f.in;
  in.q_heads = H * G;
  in.max_queries = w;
  in.fp16_prefix = 4;
  in.query_weighted_keys = true;
  for (const bool with_queries : {true, false}) {
    in.queries = with_queries ? &qv : nullptr;
    const LayerSensitivity fast = estimate_sensitivity(in);
    force_baseline_isa(true);
    const LayerSensitivity base = estimate_sensitivity(in);
    force_baseline_isa(false);
    EXPECT_GT(base.key, 0.0);
    EXPECT_EQ(fast.key, base.key) << "queries " << with_queries;
    EXPECT_EQ(fast.value, base.value) << "queries " << with_queries;
  }
}

/// A double as a spec value, every digit kept.
std::string fmt_double(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

/// Index bits per element of layer l's key and value codes, summed.
double layer_index_bits(const CacheLayout& L, int l) {
  return quant::index_bits(L.key_codec[static_cast<size_t>(l)]) / 8.0 +
         quant::index_bits(L.value_codec[static_cast<size_t>(l)]) / 8.0;
}

TEST(RateAllocation, CompressorSpendsTheBudgetAndKeepsItsCodes) {
  synth::SyntheticSpec spec;
  spec.n_layers = 6;
  spec.tokens = 160;
  spec.seed = 11;
  testkit::Fixture fx(spec);
  // Layer 2's values are 8x larger: the estimate must see it.
  for (auto& x : fx.data.values[2]) x *= 8.f;
  const Config c = Config::parse("preset=quant-k3v2,index_budget=2.5");
  EXPECT_DOUBLE_EQ(c.index_budget, 2.5);
  EXPECT_EQ(Config::parse(c.describe()).describe(), c.describe());
  KVCompressor comp(fx.shape, c);
  CompressedKV cache = comp.compress(fx.seq, &fx.queries);
  const CacheLayout& L = cache.layout();
  double bits = 0.0;
  for (int l = 0; l < spec.n_layers; ++l) {
    bits += layer_index_bits(L, l);
    std::printf("layer %d: key %s value %s\n", l, quant::to_string(L.key_codec[static_cast<size_t>(l)]),
                quant::to_string(L.value_codec[static_cast<size_t>(l)]));
  }
  EXPECT_DOUBLE_EQ(bits / (2 * spec.n_layers), 2.5);
  EXPECT_NE(L.value_codec[2], Codec::kE8P);  // the loud layer's values got bits
  // Deterministic.
  EXPECT_EQ(container::serialize(comp.compress(fx.seq, &fx.queries)), container::serialize(cache));

  // The codes travel with the cache: read back, extended and appended with the same compressor.
  const auto blob = container::serialize(cache);
  CompressedKV back = container::deserialize(blob.data(), blob.size());
  EXPECT_EQ(back.layout().key_codec, L.key_codec);
  std::vector<float> k(static_cast<size_t>(spec.n_kv_heads) * spec.head_dim, 0.25f), v(k.size(), -0.5f);
  for (int l = 0; l < spec.n_layers; ++l) comp.append(back, l, k.data(), v.data(), spec.tokens + 5);
  EXPECT_EQ(back.layout().value_codec, L.value_codec);
  std::vector<float> out(static_cast<size_t>(spec.n_q_heads) * spec.head_dim);
  comp.attend(back, 0, fx.query(0, 0), spec.tokens + 5, out.data());
  for (float x : out) EXPECT_TRUE(std::isfinite(x));
  // Another compressor's layout is still refused.
  KVCompressor other(fx.shape, Config::parse("preset=quant-k3v2,index_budget=2.5,seed=9"));
  EXPECT_THROW(other.append(back, 0, k.data(), v.data(), spec.tokens + 6), Error);
  KVCompressor fixed_rates(fx.shape, Config::parse("preset=quant-k3v2"));
  EXPECT_THROW(fixed_rates.append(back, 0, k.data(), v.data(), spec.tokens + 6), Error);

  // Positions out of order and a missing layer are refused before any work, with one message
  // whichever path (budget, budget with eviction spread over layers, plain extend) reads them.
  std::vector<int32_t> swapped(static_cast<size_t>(spec.tokens));
  for (size_t t = 0; t < swapped.size(); ++t) swapped[t] = static_cast<int32_t>(t);
  std::swap(swapped[5], swapped[6]);
  SequenceKV out_of_order = fx.seq, short_one = fx.seq;
  out_of_order.positions = swapped.data();
  short_one.layers.pop_back();
  for (const char* s : {"preset=quant-k3v2,index_budget=2.5", "preset=quant-k3v2,budget=3.2,evict=0.3,evict_layers=1",
                        "preset=quant-k3v2"}) {
    KVCompressor cs(fx.shape, Config::parse(s));
    auto message = [&](const SequenceKV& seq) {
      try {
        (void)cs.compress(seq, &fx.queries);
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    EXPECT_NE(message(out_of_order).find("positions must be strictly increasing"), std::string::npos) << s;
    EXPECT_NE(message(short_one).find("layers given, model has"), std::string::npos) << s;
  }
}

TEST(RateAllocation, EvictionSpreadOverLayersWeighsEachLayerByItsCodedTokens) {
  synth::SyntheticSpec spec;
  spec.n_layers = 6;
  spec.tokens = 200;
  spec.seed = 12;
  testkit::Fixture fx(spec);
  // The layer that keeps the most tokens is made the most sensitive (the other layers' values
  // get a large common offset, which the output carries and the centred code errors do not:
  // their relative error drops; scores read keys only, so the kept counts stay). An allocation
  // that weighs layers alike gives it bits that cost more than the budget allows.
  std::vector<int64_t> kept;
  const CompressedKV plain_cache =
      KVCompressor(fx.shape, Config::parse("preset=quant-k3v2,evict=0.4,evict_layers=1")).compress(fx.seq, &fx.queries);
  for (int l = 0; l < spec.n_layers; ++l) kept.push_back(plain_cache.stored_tokens(l));
  const size_t busiest = static_cast<size_t>(std::max_element(kept.begin(), kept.end()) - kept.begin());
  for (size_t l = 0; l < kept.size(); ++l)
    if (l != busiest)
      for (auto& x : fx.data.values[l]) x += 4.f;
  const Config c = Config::parse("preset=quant-k3v2,index_budget=2.5,evict=0.4,evict_layers=1");
  KVCompressor comp(fx.shape, c);
  ThreadPool pool(2);
  const CompressedKV cache = comp.compress(fx.seq, &fx.queries);
  EXPECT_EQ(container::serialize(comp.compress(fx.seq, &fx.queries, &pool)), container::serialize(cache));
  const CacheLayout& L = cache.layout();
  // The tokens each layer codes: kept, less the pinned sinks (fp16_sinks).
  std::vector<int64_t> coded;
  double bits = 0.0, units = 0.0, plain = 0.0;
  for (int l = 0; l < spec.n_layers; ++l) {
    coded.push_back(cache.stored_tokens(l) - c.sinks);
    const double b = layer_index_bits(L, l);
    bits += b * static_cast<double>(coded.back());
    units += 2.0 * static_cast<double>(coded.back());
    plain += b;
    std::printf("layer %d: %lld coded tokens, key %s value %s\n", l, static_cast<long long>(coded.back()),
                quant::to_string(L.key_codec[static_cast<size_t>(l)]), quant::to_string(L.value_codec[static_cast<size_t>(l)]));
  }
  std::printf("mean index bits: %.4f by coded tokens, %.4f per layer alike\n", bits / units, plain / (2 * spec.n_layers));
  ASSERT_NE(*std::min_element(coded.begin(), coded.end()), *std::max_element(coded.begin(), coded.end()))
      << "the spread must keep different counts here, or this test checks nothing";
  for (int l = 0; l < spec.n_layers; ++l) EXPECT_EQ(cache.stored_tokens(l), kept[static_cast<size_t>(l)]);
  EXPECT_LE(bits / units, 2.5 + 1e-12);
  // Close to the budget: what is left is less than one bit of the costliest layer's elements.
  EXPECT_GT(bits / units, 2.5 - static_cast<double>(*std::max_element(coded.begin(), coded.end())) / units);
}

TEST(RateAllocation, ConfigChecksTheBudget) {
  const ModelShape shape{2, 2, 4, 64};
  EXPECT_THROW(Config::parse("index_budget=1.5").validate(shape), Error);
  EXPECT_THROW(Config::parse("index_budget=4.5"), Error);
  EXPECT_THROW(Config::parse("budget=-1"), Error);
  EXPECT_THROW(Config::parse("budget=65"), Error);
  EXPECT_THROW(Config::parse("budget=3,layer_rates=rvq3/e8p2;rvq3/e8p2").validate(shape), Error);
  EXPECT_THROW(Config::parse("index_budget=3,layer_rates=rvq3/e8p2;rvq3/e8p2").validate(shape), Error);
  EXPECT_THROW(Config::parse("budget=3,index_budget=3").validate(shape), Error);
  EXPECT_NO_THROW(Config::parse("budget=0").validate(shape));
  EXPECT_NO_THROW(Config::parse("budget=1.5").validate(shape));  // bits as bytes() counts them: refused at compress if unmet
  EXPECT_NO_THROW(Config::parse("budget=4.5").validate(shape));
  EXPECT_NO_THROW(Config::parse("index_budget=2").validate(shape));
}

// budget= is bits per element as bytes() counts them, for the chunk compressed: every preset
// family (plain, eviction, fp16 tier, code tier, the spread, protected layers) at several lengths
// and budgets lands at or below the budget and within what one step of the allocator costs; a
// budget the chunk cannot meet is refused with the minimum in the message, and the minimum itself
// is met. index_budget= keeps the index-bit meaning (its bytes exceed the same number).
TEST(RateAllocation, BudgetIsBitsPerElementAsBytesCountsThem) {
  for (const int tokens : {120, 260}) {
    synth::SyntheticSpec spec;
    spec.n_layers = 4;
    spec.tokens = tokens;
    spec.seed = 40;
    testkit::Fixture fx(spec);
    const double elements = 2.0 * tokens * spec.n_layers * spec.n_kv_heads * spec.head_dim;
    for (const char* base : {"preset=quant-k3v2", "preset=high", "preset=tier-k2v2", "preset=quant-k2v2,fp16_tier=0.02",
                             "preset=quant-k3v2,evict=0.3,evict_layers=1", "preset=quant-k3v2,protect=1"}) {
      // The floor: the cheapest codes everywhere (the message's minimum).
      double minimum = 0.0;
      try {
        (void)KVCompressor(fx.shape, Config::parse(std::string(base) + ",budget=0.5")).compress(fx.seq, &fx.queries);
        ADD_FAILURE() << base << ": budget=0.5 was accepted";
      } catch (const Error& e) {
        const std::string m = e.what();
        const size_t at = m.find("at least ");
        ASSERT_NE(at, std::string::npos) << m;
        minimum = std::stod(m.substr(at + 9));
        EXPECT_NE(m.find("index_budget="), std::string::npos) << m;
        EXPECT_NE(m.find(std::to_string(tokens) + " tokens"), std::string::npos) << m;
      }
      // Every allocation step moves the bits by at most one bit per element of one layer's keys
      // or values (the dearest layer codes all its tokens).
      const double step = 2.0 * tokens * spec.n_kv_heads * spec.head_dim / elements;
      for (const double above : {0.0, 0.2, 0.45, 0.9, 5.0}) {
        const double budget = minimum + above + 1e-9;
        const std::string s = std::string(base) + ",budget=" + fmt_double(budget);
        const CompressedKV cache = KVCompressor(fx.shape, Config::parse(s)).compress(fx.seq, &fx.queries);
        const double bits = 8.0 * static_cast<double>(cache.bytes()) / elements;
        std::printf("%d tokens, %s: %.4f bits per element (minimum %.4f)\n", tokens, s.c_str(), bits, minimum);
        EXPECT_DOUBLE_EQ(bits, cache.bits_per_element());
        EXPECT_LE(bits, budget) << s;
        // Close: below the budget by less than one step, unless every free layer is at the top.
        bool all_top = true;
        for (int l = 0; l < spec.n_layers; ++l) {
          const auto k = cache.layout().key_codec[static_cast<size_t>(l)], v = cache.layout().value_codec[static_cast<size_t>(l)];
          all_top = all_top && (k == Codec::kFp16 || (k == Codec::kRvq4 && v == Codec::kRvq4));
        }
        // With a code tier, a layer raised to the tier's rates absorbs its promoted tokens
        // (layer_has_code_tier), so bytes are not monotone along the allocator's steps: the
        // result is the largest within the budget among a few tries, within two steps of it.
        const bool tiered = cache.layout().has_code_tier();
        if (!all_top) {
          EXPECT_GT(bits, budget - (tiered ? 2 : 1) * step) << s;
        }
      }
    }
  }
  // index_budget= counts index bits only: at 2.5 the cache's own count is well above 2.5.
  synth::SyntheticSpec spec;
  spec.n_layers = 4;
  spec.tokens = 700;
  spec.seed = 41;
  testkit::Fixture fx(spec);
  const CompressedKV idx =
      KVCompressor(fx.shape, Config::parse("preset=quant-k3v2,index_budget=2.5,residual=0")).compress(fx.seq, &fx.queries);
  const CompressedKV honest =
      KVCompressor(fx.shape, Config::parse("preset=quant-k3v2,budget=2.5,residual=0")).compress(fx.seq, &fx.queries);
  std::printf("index_budget=2.5: %.4f bits per element; budget=2.5: %.4f\n", idx.bits_per_element(),
              honest.bits_per_element());
  EXPECT_GT(idx.bits_per_element(), 2.6);
  EXPECT_LE(honest.bits_per_element(), 2.5);
}

}  // namespace
}  // namespace e8kv::select
