// "Compressing at once equals compressing a prefix and appending the rest", per preset (issue
// 40, item 4; docs/architecture.md, "Prefix consistency, per preset"). For every preset of
// Config::preset_names() and the budgets, at every split point m of a short sequence, the cache
// compress(prefix m) + append(rest) is checked against the rule its preset documents:
//  - per-token rules only (lossless, quant-*): the same container as compress(all), byte for byte;
//  - eviction (high, asym, balanced, max): eviction applies to the compressed chunk only, appended
//    tokens are all kept: each layer stores kept_count(m) + (n - m) tokens, and where the prefix
//    evicts nothing the cache is byte for byte that of the preset without eviction at once;
//  - the code tier (tier-k3v2, tier-k2v2): the prefix's tier_count(m) tokens are promoted, all
//    before m, appended tokens never: where the prefix promotes none, attention is bit for bit
//    that of the preset without the tier at once;
//  - budget= and index_budget=: the per-layer codes are the prefix's own allocation (or the prefix
//    is refused: budget= below the prefix's minimum), and the cache is byte for byte
//    compress(all) with those codes fixed (layer_rates).
// Fixed seeds, printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "e8kv/select/eviction.hpp"
#include "testing/kv_fixture.hpp"
#include "testing/test_util.hpp"

namespace e8kv {
namespace {

std::vector<std::string> presets() {
  std::vector<std::string> out;
  std::stringstream names(Config::preset_names());
  std::string name;
  while (std::getline(names, name, ',')) {
    name.erase(0, name.find_first_not_of(' '));
    out.push_back("preset=" + name);
  }
  out.push_back("preset=quant-k3v2,budget=9");
  out.push_back("preset=quant-k3v2,index_budget=2.5");
  return out;
}

struct Splitter {
  const testkit::Fixture& fx;
  int n;
  SequenceKV prefix(int m) const {
    SequenceKV s;
    for (const auto& kv : fx.seq.layers) s.layers.push_back({kv.keys.token_slice(0, m), kv.values.token_slice(0, m)});
    return s;
  }
  void append_rest(const KVCompressor& c, CompressedKV& cache, int m) const {
    const size_t row = static_cast<size_t>(fx.shape.n_kv_heads) * fx.shape.head_dim;
    for (int t = m; t < n; ++t)
      for (int l = 0; l < fx.shape.n_layers; ++l)
        c.append(cache, l, &fx.data.keys[static_cast<size_t>(l)][t * row], &fx.data.values[static_cast<size_t>(l)][t * row], t);
  }
  std::vector<float> attention(const CompressedKV& cache) const {
    const size_t row = static_cast<size_t>(fx.shape.n_q_heads) * fx.shape.head_dim;
    std::vector<float> out(row * fx.shape.n_layers), lse(static_cast<size_t>(fx.shape.n_q_heads));
    for (int l = 0; l < fx.shape.n_layers; ++l) attend(cache, l, fx.query(l, 0), &out[l * row], lse.data());
    return out;
  }
};

TEST(PrefixSplit, EveryPresetAtEverySplitPointFollowsItsDocumentedRule) {
  synth::SyntheticSpec spec;
  spec.n_layers = 2;
  spec.tokens = 100;
  spec.seed = 4004;
  std::printf("[seed] PrefixSplit: %llu\n", static_cast<unsigned long long>(spec.seed));
  const testkit::Fixture fx(spec);
  const Splitter run{fx, spec.tokens};
  const int n = spec.tokens;
  for (const std::string& s : presets()) {
    SCOPED_TRACE(s);
    const Config cfg = Config::parse(s);
    const KVCompressor c(fx.shape, cfg);
    const bool budget = cfg.rate_budget > 0.0 || cfg.index_budget > 0.0;
    const bool evicts = cfg.eviction_rate > 0.0, tier = cfg.code_tier > 0.0;
    ASSERT_FALSE(cfg.fp16_tier > 0.0) << "a preset with an fp16 tier: add its rule (it is the code tier's)";
    Config plain_cfg = cfg;  // the preset without its chunk-level rules
    plain_cfg.eviction_rate = 0.0;
    plain_cfg.code_tier = 0.0;
    const KVCompressor plain(fx.shape, plain_cfg);
    std::vector<uint8_t> whole;
    if (!budget) whole = container::serialize(c.compress(fx.seq, &fx.queries));
    const std::vector<uint8_t> plain_whole = container::serialize(plain.compress(fx.seq, &fx.queries));
    const std::vector<float> plain_attention = run.attention(plain.compress(fx.seq, &fx.queries));
    // The tier's tokens of a chunk of m: tier_count(m) among the candidates eviction competes
    // over (neither the sinks nor the last recent_window tokens).
    auto tier_of = [&](int m) {
      const int64_t candidates = std::max<int64_t>(0, m - std::min(cfg.sinks, m) - cfg.recent_window);
      return std::min<int64_t>(select::tier_count(m, cfg.code_tier), candidates);
    };
    int identical = 0, refused = 0;
    for (int m = 0; m <= n; ++m) {
      const bool edge = m <= 5 || m == 16 || m == 17 || m == 63 || m == 64 || m == 65 || m >= n - 2 || m % 9 == 0;
      if (test::kUnderSanitizer && !edge) continue;
      CompressedKV cache;
      try {
        cache = c.compress(run.prefix(m), &fx.queries);
      } catch (const Error& e) {
        // Only budget= may refuse a chunk: one too short to meet it, with the minimum named.
        ASSERT_GT(cfg.rate_budget, 0.0) << "split at " << m << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("at least"), std::string::npos) << e.what();
        ++refused;
        continue;
      }
      const CompressedKV prefix_only = cache;
      run.append_rest(c, cache, m);
      const std::vector<uint8_t> chunked = container::serialize(cache);
      if (budget) {
        // The prefix's codes, kept by every append; then the same bytes as compress(all) with them.
        EXPECT_EQ(cache.layout().key_codec, prefix_only.layout().key_codec) << "split at " << m;
        Config fixed = cfg;
        fixed.rate_budget = fixed.index_budget = 0.0;
        fixed.layer_rates.clear();
        for (int l = 0; l < spec.n_layers; ++l)
          fixed.layer_rates.push_back({cache.layout().key_codec[static_cast<size_t>(l)], cache.layout().value_codec[static_cast<size_t>(l)]});
        ASSERT_EQ(chunked, container::serialize(KVCompressor(fx.shape, fixed).compress(fx.seq, &fx.queries)))
            << "split at " << m;
        identical += chunked == container::serialize(c.compress(fx.seq, &fx.queries));
        continue;
      }
      if (!evicts && !tier) {
        ASSERT_EQ(chunked, whole) << "split at " << m;
        ++identical;
        continue;
      }
      for (int l = 0; l < spec.n_layers; ++l) {
        if (evicts) {
          select::EvictionOptions eo = cfg.eviction_options();
          eo.sinks = std::min(cfg.sinks, m);
          EXPECT_EQ(cache.stored_tokens(l), select::kept_count(m, eo) + (n - m)) << "split at " << m << ", layer " << l;
        }
        if (tier) {
          EXPECT_EQ(cache.tier_positions(l, 0), prefix_only.tier_positions(l, 0)) << "split at " << m;
          EXPECT_EQ(cache.tier_tokens(l), tier_of(m)) << "split at " << m << ", layer " << l;
          for (int32_t p : cache.tier_positions(l, 0)) EXPECT_LT(p, m);
        }
      }
      const bool prefix_plain = (!evicts || prefix_only.stored_tokens(0) == m) &&
                                (!tier || tier_of(m) == 0);
      if (prefix_plain) {
        if (evicts) {
          EXPECT_EQ(chunked, plain_whole) << "split at " << m;
        }
        if (tier) {
          const std::vector<float> got = run.attention(cache);
          EXPECT_EQ(std::memcmp(got.data(), plain_attention.data(), got.size() * sizeof(float)), 0) << "split at " << m;
        }
      }
      identical += chunked == whole;
    }
    std::printf("%-40s identical to compress(all) at %d of %d split points%s\n", s.c_str(), identical, n + 1,
                refused ? (", refused at " + std::to_string(refused)).c_str() : "");
  }
}

}  // namespace
}  // namespace e8kv
