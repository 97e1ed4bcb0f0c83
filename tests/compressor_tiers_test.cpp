// KVCompressor's selections over the model and its tiers, each against a brute-force reference:
// one kept set shared by every layer (shared=1), eviction spread over layers (evict_layers=1),
// the fp16 tier and the code tier (what they pin, decode, cost and buy, with appends), and
// drop_before's sliding window over all of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/parallel.hpp"
#include "e8kv/select/eviction.hpp"
#include "e8kv/select/scorer.hpp"
#include "testing/compressor_fixture.hpp"
#include "testing/kv_fixture.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv;
using namespace e8kv::testkit;

/// Brute force of the layers' normalized scores (shared selection, eviction spread over layers):
/// per layer, score_layer and aggregate_heads, shifted to a minimum of 0 when some are negative and
/// divided by their sum (uniform when that is 0), in double.
std::vector<std::vector<double>> normalized_layer_scores(const SequenceKV& chunk, const std::vector<LayerQueries>& queries,
                                                         const Config& cfg, float softmax_scale) {
  const int64_t n = chunk.tokens();
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = chunk.position(t);
  const select::ScorerOptions so = cfg.scorer_options();
  std::vector<std::vector<double>> out;
  for (size_t l = 0; l < chunk.layers.size(); ++l) {
    const auto per_token = select::aggregate_heads(
        select::score_layer(chunk.layers[l].keys, pos.data(), &queries[l], so, softmax_scale), cfg.head_aggregation);
    const double lo = std::min(0.0, static_cast<double>(*std::min_element(per_token.begin(), per_token.end())));
    double sum = 0;
    for (float x : per_token) sum += x - lo;
    std::vector<double> share(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t)
      share[static_cast<size_t>(t)] = sum > 0 ? (per_token[static_cast<size_t>(t)] - lo) / sum : 1.0 / n;
    out.push_back(std::move(share));
  }
  return out;
}

// Shared selection, brute force: the positions every layer keeps of `chunk` (`before` tokens
// already in the cache): the mean over layers of normalized_layer_scores, then select_tokens once.
std::vector<int32_t> shared_reference(const SequenceKV& chunk, const std::vector<LayerQueries>& queries,
                                      const Config& cfg, int64_t before, float softmax_scale) {
  const int64_t n = chunk.tokens();
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = chunk.position(t);
  std::vector<double> mean(static_cast<size_t>(n), 0.0);
  for (const auto& share : normalized_layer_scores(chunk, queries, cfg, softmax_scale))
    for (int64_t t = 0; t < n; ++t) mean[static_cast<size_t>(t)] += share[static_cast<size_t>(t)];
  std::vector<float> avg(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t)
    avg[static_cast<size_t>(t)] = static_cast<float>(mean[static_cast<size_t>(t)] / chunk.layers.size());
  select::EvictionOptions eo = cfg.eviction_options();
  eo.sinks = static_cast<int>(std::clamp<int64_t>(cfg.sinks - before, 0, n));
  std::vector<int32_t> kept;
  for (int64_t t : select::select_tokens(avg, eo)) kept.push_back(pos[static_cast<size_t>(t)]);
  return kept;
}

// What a tier buys: attention through K2V2's codes with it (`tiered`) is closer to fp32 attention
// than without it (`base`), in output error and in attention KL.
void expect_tier_cuts_the_error(const Fixture& f, const Config& base, const Config& tiered, const char* tier) {
  const Errors ea = measure(f, base), eb = measure(f, tiered);
  std::printf("k2v2: out rel l2 %.4f kl %.5f; with %s: %.4f %.5f\n", ea.out_rel_l2, ea.kl, tier, eb.out_rel_l2, eb.kl);
  EXPECT_LT(eb.out_rel_l2, ea.out_rel_l2);
  EXPECT_LT(eb.kl, ea.kl);
}

// shared=1: every layer keeps the same tokens, the brute-force reference's, with the sinks, the
// recent window and the kept count of a per-layer selection; the same cache with a thread pool.
// Key-norm scores are negative (the shift), key-key with head_agg=max a third path.
TEST(Compressor, SharedSelectionKeepsOneSetForEveryLayer) {
  const auto spec = default_spec(160, 4);
  Fixture f(spec);
  const int64_t n = spec.tokens;
  ThreadPool pool(2);
  for (const char* spec_string : {"preset=high,shared=1", "preset=high,shared=1,scorer=key-norm",
                                  "preset=max,shared=1,scorer=key-key,head_agg=max,sinks=6,recent=20"}) {
    SCOPED_TRACE(spec_string);
    const Config cfg = Config::parse(spec_string);
    ASSERT_TRUE(cfg.shared_selection);
    KVCompressor c(f.shape, cfg);
    const auto cache = c.compress(f.seq, &f.queries);
    const auto want = shared_reference(f.seq, f.queries, cfg, 0, cache.layout().effective_softmax_scale());
    const select::EvictionOptions eo = cfg.eviction_options();
    ASSERT_EQ(static_cast<int64_t>(want.size()), select::kept_count(n, eo));
    ASSERT_LT(static_cast<int64_t>(want.size()), n);
    for (int s = 0; s < cfg.sinks; ++s) EXPECT_EQ(want[static_cast<size_t>(s)], s);
    for (int r = 0; r < cfg.recent_window; ++r)
      EXPECT_EQ(want[want.size() - static_cast<size_t>(cfg.recent_window - r)], n - cfg.recent_window + r);
    for (int l = 0; l < spec.n_layers; ++l) {
      EXPECT_EQ(cache.stored_positions(l), want) << "layer " << l;
      EXPECT_EQ(cache.layer(l).pinned, cfg.sinks) << "layer " << l;  // fp16 sinks as without the flag
      for (int h = 0; h < spec.n_kv_heads; ++h) EXPECT_EQ(cache.stored_tokens(l, h), static_cast<int64_t>(want.size()));
    }
    // Without the flag the layers choose differently on this input (so the test above means something).
    Config per_layer = cfg;
    per_layer.shared_selection = false;
    const auto own = compress_with(f, per_layer);
    int differing = 0;
    for (int l = 1; l < spec.n_layers; ++l) differing += own.stored_positions(l) != own.stored_positions(0) ? 1 : 0;
    EXPECT_GE(differing, 1) << "every layer keeps the same tokens even without shared selection";
    // Threads change nothing: scored in parallel, combined in layer order.
    EXPECT_EQ(container::serialize(c.compress(f.seq, &f.queries, &pool)), container::serialize(cache));
  }
}

// evict_layers=1, brute force: each layer's head-combined scores normalized to sum 1 (as for
// shared selection), the candidates (neither sinks nor recent) of all layers sorted by (share,
// layer, later token first), the lowest (tokens one layer evicts) x (layers) evicted. Every layer keeps its
// sinks and recent window and exactly the reference's positions; the total equals uniform
// eviction's; the counts differ between layers on this input; threads change nothing; a second
// chunk (extend) spreads its own evictions.
TEST(Compressor, EvictionSpreadOverLayersEvictsTheLowestSharesOfAllLayers) {
  const auto spec = default_spec(161, 4);
  Fixture f(spec);
  const int64_t n = spec.tokens;
  ThreadPool pool(2);
  for (const char* spec_string : {"preset=lossless,evict=0.4,evict_layers=1",
                                  "preset=quant-k3v2,evict=0.3,evict_layers=1,per_head=1,fp16_tier=0.02",
                                  "preset=lossless,evict=0.5,evict_layers=1,scorer=key-norm,sinks=6,recent=20"}) {
    SCOPED_TRACE(spec_string);
    const Config cfg = Config::parse(spec_string);
    ASSERT_TRUE(cfg.layer_adaptive_eviction);
    KVCompressor c(f.shape, cfg);
    const auto cache = c.compress(f.seq, &f.queries);
    // The reference.
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = f.seq.position(t);
    struct Candidate {
      double share;
      int layer;
      int64_t token;
    };
    std::vector<Candidate> candidates;
    const auto shares = normalized_layer_scores(f.seq, f.queries, cfg, cache.layout().effective_softmax_scale());
    for (int l = 0; l < spec.n_layers; ++l)
      for (int64_t t = cfg.sinks; t < n - cfg.recent_window; ++t)
        candidates.push_back({shares[static_cast<size_t>(l)][static_cast<size_t>(t)], l, t});
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
      if (a.share != b.share) return a.share < b.share;
      if (a.layer != b.layer) return a.layer < b.layer;
      return a.token > b.token;  // of equal scores a layer keeps the earlier token
    });
    const select::EvictionOptions eo = cfg.eviction_options();
    const int64_t per_layer = n - select::kept_count(n, eo);
    ASSERT_GT(per_layer, 0);
    std::vector<std::vector<char>> evicted(static_cast<size_t>(spec.n_layers), std::vector<char>(static_cast<size_t>(n), 0));
    for (int64_t i = 0; i < per_layer * spec.n_layers; ++i)
      evicted[static_cast<size_t>(candidates[static_cast<size_t>(i)].layer)][static_cast<size_t>(candidates[static_cast<size_t>(i)].token)] = 1;
    int64_t total_kept = 0;
    std::vector<int64_t> kept_per_layer;
    for (int l = 0; l < spec.n_layers; ++l) {
      std::vector<int32_t> want;
      for (int64_t t = 0; t < n; ++t)
        if (!evicted[static_cast<size_t>(l)][static_cast<size_t>(t)]) want.push_back(pos[static_cast<size_t>(t)]);
      kept_per_layer.push_back(static_cast<int64_t>(want.size()));
      total_kept += static_cast<int64_t>(want.size());
      for (int h = 0; h < spec.n_kv_heads; ++h) {
        EXPECT_EQ(cache.stored_tokens(l, h), static_cast<int64_t>(want.size())) << "layer " << l << " head " << h;
        if (!cfg.per_head_selection) {
          EXPECT_EQ(cache.stored_positions(l), want) << "layer " << l;
        }
      }
      if (cfg.per_head_selection) continue;  // counts per head above; positions are per head
      const auto stored = cache.stored_positions(l);
      for (int s = 0; s < cfg.sinks; ++s)
        EXPECT_NE(std::find(stored.begin(), stored.end(), s), stored.end()) << "sink " << s << " of layer " << l;
      for (int64_t t = n - cfg.recent_window; t < n; ++t)
        EXPECT_NE(std::find(stored.begin(), stored.end(), pos[static_cast<size_t>(t)]), stored.end())
            << "recent token " << t << " of layer " << l;
    }
    EXPECT_EQ(total_kept, select::kept_count(n, eo) * spec.n_layers) << "the total is uniform eviction's";
    EXPECT_NE(*std::min_element(kept_per_layer.begin(), kept_per_layer.end()),
              *std::max_element(kept_per_layer.begin(), kept_per_layer.end()))
        << "every layer evicts the same count on this input (the test would not tell spread from uniform)";
    EXPECT_EQ(container::serialize(c.compress(f.seq, &f.queries, &pool)), container::serialize(cache));
    // extend: the second chunk's evictions are spread too (the total again uniform eviction's).
    const int64_t m = 200;
    const SequenceKV first = token_range(f.seq, 0, m), second = token_range(f.seq, m, n - m);
    auto grown = c.compress(first, &f.queries);
    c.extend(grown, second, &f.queries);
    select::EvictionOptions e1 = eo, e2 = eo;
    e2.sinks = 0;
    int64_t grown_total = 0;
    for (int l = 0; l < spec.n_layers; ++l) grown_total += grown.stored_tokens(l, 0);
    EXPECT_EQ(grown_total, (select::kept_count(m, e1) + select::kept_count(n - m, e2)) * spec.n_layers);
  }
  // One kept set for every layer and per-layer sizes exclude each other.
  EXPECT_THROW(KVCompressor(f.shape, Config::parse("preset=high,shared=1,evict_layers=1")), Error);
}

// extend() selects the new chunk's kept set for the whole model too (earlier tokens stay as they
// are; only the chunk is evicted from, as without the flag). Layers of different lengths (an
// append to one layer only) cannot share a selection: refused, the cache unchanged.
TEST(Compressor, SharedSelectionAppliesToExtend) {
  const auto spec = default_spec(161, 3);
  Fixture f(spec);
  const Config cfg = Config::parse("preset=high,shared=1");
  KVCompressor c(f.shape, cfg);
  const int m = 150;
  const SequenceKV first = token_range(f.seq, 0, m), second = token_range(f.seq, m, spec.tokens - m);
  ThreadPool pool(2);
  auto cache = c.compress(first, &f.queries);
  auto threaded = c.compress(first, &f.queries, &pool);
  c.extend(cache, second, &f.queries);
  c.extend(threaded, second, &f.queries, &pool);
  const float scale = cache.layout().effective_softmax_scale();
  auto want = shared_reference(first, f.queries, cfg, 0, scale);
  const auto want_second = shared_reference(second, f.queries, cfg, m, scale);
  want.insert(want.end(), want_second.begin(), want_second.end());
  for (int l = 0; l < spec.n_layers; ++l) EXPECT_EQ(cache.stored_positions(l), want) << "layer " << l;
  EXPECT_EQ(container::serialize(threaded), container::serialize(cache));

  auto uneven = c.compress(first, &f.queries);
  append_token(c, uneven, f, 0, m, m);  // layer 0 only
  const auto before = container::serialize(uneven);
  const SequenceKV third = token_range(f.seq, m + 1, spec.tokens - m - 1);
  try {
    c.extend(uneven, third, &f.queries);
    ADD_FAILURE() << "extend of a shared selection over layers of different lengths did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("same length"), std::string::npos) << e.what();
  }
  EXPECT_EQ(container::serialize(uneven), before);
}

// The fp16 tier (fp16_tier): per layer and position set, round(f·n) tokens beyond the sinks stay
// fp16, exactly the highest-scoring ones eviction competes over (the brute-force reference is
// select_tier on the scorer's own scores); they decode to their fp16-rounded input; the window
// pins them ahead of the unpinned tokens; the container (version 4: pinned tokens among coded
// ones) reads back identical; with eviction, per-head sets and one set for the model.
TEST(Compressor, Fp16TierPinsTheTopScoredTokensInFp16) {
  const auto spec = default_spec(170, 3);
  Fixture f(spec);
  const int64_t n = spec.tokens;
  const int H = spec.n_kv_heads, d = spec.head_dim;
  const int64_t tier = std::llround(0.05 * static_cast<double>(n));
  // Under the sanitizers two of the four: per-head sets and one set for the model.
  const std::vector<const char*> all = {"preset=quant-k3v2,fp16_tier=0.05", "preset=high,fp16_tier=0.05",
                                        "preset=high,fp16_tier=0.05,per_head=1,scorer=key-key",
                                        "preset=high,fp16_tier=0.05,shared=1"};
  const std::vector<const char*> some = {all[2], all[3]};
  for (const char* spec_string : e8kv::test::kUnderSanitizer ? some : all) {
    SCOPED_TRACE(spec_string);
    const Config cfg = Config::parse(spec_string);
    KVCompressor c(f.shape, cfg);
    const CompressedKV cache = c.compress(f.seq, &f.queries);
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    const select::ScorerOptions so = cfg.scorer_options();
    const select::EvictionOptions eo = cfg.eviction_options();
    std::vector<int32_t> shared_pins;
    for (int l = 0; l < spec.n_layers; ++l) {
      const auto& ld = cache.layer(l);
      EXPECT_EQ(ld.pinned, cfg.sinks + tier) << "layer " << l;
      const auto scores = select::score_layer(f.seq.layers[static_cast<size_t>(l)].keys, pos.data(),
                                              &f.queries[static_cast<size_t>(l)], so, cache.layout().effective_softmax_scale());
      const auto sets = cfg.eviction_rate > 0 ? select::select_layer(scores, eo) : std::vector<std::vector<int64_t>>{};
      for (int h = 0; h < H; ++h) {
        const auto& w = cache.window_positions(l, h);
        const std::vector<int32_t> pins(w.begin(), w.begin() + ld.pinned);
        // Reference (not for shared=1, whose scores are the model's: there, one set for all layers).
        if (!cfg.shared_selection) {
          const size_t s = cfg.per_head_selection ? static_cast<size_t>(h) : 0;
          std::vector<float> row = cfg.per_head_selection
                                       ? std::vector<float>(scores.scores.begin() + h * n, scores.scores.begin() + (h + 1) * n)
                                       : select::aggregate_heads(scores, cfg.head_aggregation);
          std::vector<int64_t> kept = sets.empty() ? std::vector<int64_t>{} : sets[s];
          if (sets.empty())
            for (int64_t t = 0; t < n; ++t) kept.push_back(t);
          std::vector<int32_t> want;
          for (int t = 0; t < cfg.sinks; ++t) want.push_back(t);
          for (int64_t t : select::select_tier(row, kept, tier, eo)) want.push_back(static_cast<int32_t>(t));
          EXPECT_EQ(pins, want) << "layer " << l << " head " << h;
        } else if (shared_pins.empty()) {
          shared_pins = pins;
        } else {
          EXPECT_EQ(pins, shared_pins) << "layer " << l << " head " << h;
        }
        // Pinned tokens decode to their fp16-rounded input; at least one sits among coded tokens.
        const CompactHead ch = cache.decompress_head(l, h);
        int among_coded = 0;
        for (int32_t p : pins) {
          const auto it = std::find(ch.positions.begin(), ch.positions.end(), p);
          ASSERT_NE(it, ch.positions.end());
          const size_t i = static_cast<size_t>(it - ch.positions.begin());
          for (int e = 0; e < d; ++e) {
            const size_t src = (static_cast<size_t>(p) * H + h) * d + e;
            ASSERT_EQ(ch.keys[i * d + e], fp16_round(f.data.keys[l][src]));
            ASSERT_EQ(ch.values[i * d + e], fp16_round(f.data.values[l][src]));
          }
          among_coded += !cache.positions(l, h).empty() && p > cache.positions(l, h).front() ? 1 : 0;
        }
        EXPECT_GE(among_coded, 1);
        EXPECT_EQ(cache.stored_tokens(l, h), static_cast<int64_t>(ch.positions.size()));
      }
    }
    const auto bytes = container::serialize(cache);
    EXPECT_EQ(container::read_info(bytes.data(), bytes.size()).format_version, 4);
    ThreadPool pool(2);  // the tier does not depend on the executor
    EXPECT_EQ(container::serialize(c.compress(f.seq, &f.queries, &pool)), bytes);
    const CompressedKV back = container::deserialize(bytes.data(), bytes.size());
    EXPECT_EQ(container::serialize(back), bytes);
    std::vector<float> a(static_cast<size_t>(spec.n_q_heads) * d), b(a.size());
    for (int l = 0; l < spec.n_layers; ++l) {
      c.attend(cache, l, f.query(l, 0), static_cast<int32_t>(n), a.data());
      c.attend(back, l, f.query(l, 0), static_cast<int32_t>(n), b.data());
      EXPECT_EQ(a, b);
    }
  }
  // Without the tier nothing changes: pinned is the sinks, and the container keeps its version.
  const CompressedKV plain = compress_with(f, Config::parse("preset=quant-k3v2"));
  EXPECT_EQ(plain.layer(0).pinned, 4);
  const auto plain_bytes = container::serialize(plain);
  EXPECT_EQ(container::read_info(plain_bytes.data(), plain_bytes.size()).format_version, 3);
}

// The tier is what it costs: every pinned token is one window row (2·d fp16 values and a
// position) in place of its codes and gains; bits per element go up by exactly that. And it buys
// accuracy: attention through the codes moves closer to fp32 attention.
TEST(Compressor, Fp16TierCostsItsBytesAndCutsTheError) {
  Fixture f(default_spec(171));
  const Config base = Config::parse("preset=quant-k2v2");
  const Config tiered = Config::parse("preset=quant-k2v2,fp16_tier=0.1");
  const CompressedKV a = compress_with(f, base), b = compress_with(f, tiered);
  const auto ba = a.byte_breakdown(), bb = b.byte_breakdown();
  const int H = f.shape.n_kv_heads, d = f.shape.head_dim, L = f.shape.n_layers;
  const int64_t moved = b.layer(0).pinned - a.layer(0).pinned;
  ASSERT_EQ(moved, 30);
  // Codes are flushed in whole blocks, so the window may hold a few more unpinned tokens too.
  const int64_t to_window = b.window_tokens(0) - a.window_tokens(0);
  EXPECT_GE(to_window, moved);
  EXPECT_LT(to_window, moved + b.layout().flush_block);
  EXPECT_EQ(a.coded_tokens(0) - b.coded_tokens(0), to_window);
  EXPECT_EQ(bb.window - ba.window, static_cast<size_t>(to_window) * L * H * 2 * d * 2);
  const size_t code_bytes_per_token = a.layer(0).heads[0].key_codes.size() / static_cast<size_t>(a.coded_tokens(0)) +
                                      a.layer(0).heads[0].value_codes.size() / static_cast<size_t>(a.coded_tokens(0));
  EXPECT_EQ(ba.codes - bb.codes, static_cast<size_t>(to_window) * L * H * code_bytes_per_token);
  EXPECT_EQ(ba.positions, bb.positions);  // a token's position is stored once either way
  expect_tier_cuts_the_error(f, base, tiered, "a 10 % fp16 tier");
}

// Appends after a tiered compress: the tier stays, the flushes code the unpinned tokens only, and
// a pinned token can be the latest position (key-norm ranks the tiny last key first; recent=0):
// an append at or before it is refused, the cache unchanged.
TEST(Compressor, Fp16TierThenAppend) {
  const auto spec = default_spec(172, 1);
  Fixture f(spec);
  const int64_t n = spec.tokens;
  const int H = spec.n_kv_heads, d = spec.head_dim;
  for (int h = 0; h < H; ++h)
    for (int e = 0; e < d; ++e) f.data.keys[0][(static_cast<size_t>(n - 1) * H + h) * d + e] = 1e-3f;
  const Config cfg = Config::parse("preset=quant-k3v2,fp16_tier=0.01,scorer=key-norm,recent=0");
  KVCompressor c(f.shape, cfg);
  auto cache = c.compress(f.seq, &f.queries);
  const auto& w = cache.window_positions(0, 0);
  ASSERT_EQ(cache.layer(0).pinned, 4 + 3);
  ASSERT_EQ(w[static_cast<size_t>(cache.layer(0).pinned) - 1], n - 1) << "the last token is in the tier";
  ASSERT_GT(w.size(), static_cast<size_t>(cache.layer(0).pinned)) << "unpinned tokens wait behind it";
  EXPECT_LT(w.back(), n - 1);
  EXPECT_EQ(cache.last_position(0), n - 1) << "the pinned token, not the window's last";
  const auto before = container::serialize(cache);
  EXPECT_THROW(append_token(c, cache, f, 0, 0, n - 1), Error);
  EXPECT_EQ(container::serialize(cache), before);
  append_tokens(c, cache, f, 0, 40, n);
  EXPECT_EQ(cache.layer(0).pinned, 7);
  EXPECT_EQ(cache.stored_tokens(0), n + 40);
  EXPECT_EQ(cache.last_position(0), n + 39);
  const auto ch = cache.decompress_head(0, 0);
  for (size_t i = 0; i < ch.positions.size(); ++i) ASSERT_EQ(ch.positions[i], static_cast<int32_t>(i));
  const auto bytes = container::serialize(cache);
  EXPECT_EQ(container::serialize(container::deserialize(bytes.data(), bytes.size())), bytes);
}

// The code tier (code_tier): per layer and position set, round((f + c)·n) − round(f·n) tokens
// beyond the sinks and the recent tokens, the next-scored after the fp16 tier's, leave the
// layer's codes for a second code stream per head: together with the fp16 tier they are exactly
// what an fp16 tier of f + c pins (same scores, same kept sets). Every stored position is in
// exactly one of coded / tier / window; tier tokens decode through the tier codec (decode_tier),
// and the bytes are the two streams' codes and gains. With eviction, per-head sets and one set
// for the model; the result does not depend on the executor.
TEST(Compressor, CodeTierCodesTheNextScoredTokensInTheirOwnStream) {
  const auto spec = default_spec(174, 3);
  Fixture f(spec);
  const int64_t n = spec.tokens;
  const int H = spec.n_kv_heads, d = spec.head_dim;
  const std::vector<std::string> all = {"preset=quant-k3v2,code_tier=0.1", "preset=quant-k2v2,code_tier=0.1,fp16_tier=0.05",
                                        "preset=high,code_tier=0.1,per_head=1,scorer=key-key,evict=0.3",
                                        "preset=high,code_tier=0.1,shared=1,evict=0.2"};
  const std::vector<std::string> some = {all[1], all[2]};
  for (const std::string& spec_string : e8kv::test::kUnderSanitizer ? some : all) {
    SCOPED_TRACE(spec_string);
    const Config cfg = Config::parse(spec_string);
    Config union_cfg = cfg;  // the reference: both tiers as one fp16 tier
    union_cfg.fp16_tier = cfg.fp16_tier + cfg.code_tier;
    union_cfg.code_tier = 0.0;
    KVCompressor c(f.shape, cfg);
    const CompressedKV cache = c.compress(f.seq, &f.queries);
    const CompressedKV reference = compress_with(f, union_cfg);
    const int64_t fp16 = std::llround(cfg.fp16_tier * static_cast<double>(n));
    const int64_t promoted = std::llround((cfg.fp16_tier + cfg.code_tier) * static_cast<double>(n)) - fp16;
    ASSERT_EQ(promoted, 30);
    const auto tk = cache.codecs().tier_code_bytes(KvKind::kKey), tv = cache.codecs().tier_code_bytes(KvKind::kValue);
    size_t want_codes = 0, want_gains = 0;
    for (int l = 0; l < spec.n_layers; ++l) {
      ASSERT_TRUE(cache.layout().layer_has_code_tier(l));
      EXPECT_EQ(cache.layer(l).pinned, cfg.sinks + fp16) << "layer " << l;
      for (int h = 0; h < H; ++h) {
        const auto& tier = cache.tier_positions(l, h);
        ASSERT_EQ(static_cast<int64_t>(tier.size()), promoted) << "layer " << l << " head " << h;
        EXPECT_TRUE(std::is_sorted(tier.begin(), tier.end()));
        const auto& w = cache.window_positions(l, h);
        std::vector<int32_t> both(w.begin() + cfg.sinks, w.begin() + cache.layer(l).pinned);
        both.insert(both.end(), tier.begin(), tier.end());
        std::sort(both.begin(), both.end());
        const auto& rw = reference.window_positions(l, h);
        const std::vector<int32_t> want(rw.begin() + cfg.sinks, rw.begin() + reference.layer(l).pinned);
        EXPECT_EQ(both, want) << "layer " << l << " head " << h;
        // Every stored position once; the same positions as the reference stores.
        std::vector<int32_t> stored = cache.positions(l, h);
        stored.insert(stored.end(), w.begin(), w.end());
        stored.insert(stored.end(), tier.begin(), tier.end());
        std::sort(stored.begin(), stored.end());
        EXPECT_EQ(std::adjacent_find(stored.begin(), stored.end()), stored.end());
        const CompactHead ch = cache.decompress_head(l, h), rh = reference.decompress_head(l, h);
        EXPECT_EQ(ch.positions, stored);
        EXPECT_EQ(ch.positions, rh.positions);
        // Tier rows decode through the tier codec: decode_tier of the stored codes, bit for bit.
        const auto& hd = cache.layer(l).heads[static_cast<size_t>(h)];
        // (Centred on the head's means: format 6's tier.)
        std::vector<float> k(tier.size() * d), v(tier.size() * d), km(d), vm(d);
        ASSERT_TRUE(cache.layout().tier_centered);
        fp16_bits_to_floats(hd.key_mean.data(), km.data(), km.size());
        fp16_bits_to_floats(hd.value_mean.data(), vm.data(), vm.size());
        cache.codecs().decode_tier(l, h, KvKind::kKey, tier.size(), hd.tier_key_codes.data(), hd.tier_key_gains.data(),
                                   tier.data(), km.data(), k.data());
        cache.codecs().decode_tier(l, h, KvKind::kValue, tier.size(), hd.tier_value_codes.data(), hd.tier_value_gains.data(),
                                   tier.data(), vm.data(), v.data());
        for (size_t i = 0; i < tier.size(); ++i) {
          const size_t row = static_cast<size_t>(std::lower_bound(ch.positions.begin(), ch.positions.end(), tier[i]) -
                                                 ch.positions.begin());
          for (int e = 0; e < d; ++e) {
            ASSERT_EQ(ch.keys[row * d + e], k[i * d + e]);
            ASSERT_EQ(ch.values[row * d + e], v[i * d + e]);
          }
        }
        want_codes += cache.positions(l, h).size() * (cache.codecs().code_bytes(l, KvKind::kKey) +
                                                      cache.codecs().code_bytes(l, KvKind::kValue)) +
                      tier.size() * (tk + tv);
        want_gains += cache.positions(l, h).size() * 2 + 4 /* 8-bit gain references */ + tier.size() * 4;
      }
    }
    const auto b = cache.byte_breakdown();
    EXPECT_EQ(b.codes, want_codes);
    EXPECT_EQ(b.gains, want_gains);
    EXPECT_LE(cache.resident_bytes(), cache.bytes() + cache.bytes() / 10);
    ThreadPool pool(2);  // the tier does not depend on the executor
    const CompressedKV again = c.compress(f.seq, &f.queries, &pool);
    for (int l = 0; l < spec.n_layers; ++l) {
      const DenseLayer a = cache.decompress_layer(l), z = again.decompress_layer(l);
      EXPECT_EQ(a.positions, z.positions);
      EXPECT_EQ(a.keys, z.keys);
      EXPECT_EQ(a.values, z.values);
    }
  }
}

// The tier buys accuracy: its 4-bit rows decode closer to their input than K2V2's 2-bit codes to
// theirs, and 7 % of the tokens in it bring attention through the codes closer to fp32 attention.
// (Its bytes are CodeTierCodesTheNextScoredTokensInTheirOwnStream's; a change of the coded count
// also moves the window's flush cycle, so the total is not a per-token figure at this size.)
TEST(Compressor, CodeTierRowsAreCloserAndCutTheError) {
  Fixture f(default_spec(175));
  const Config base = Config::parse("preset=quant-k2v2");
  const Config tiered = Config::parse("preset=quant-k2v2,code_tier=0.07");
  const CompressedKV b = compress_with(f, tiered);
  const int H = f.shape.n_kv_heads, d = f.shape.head_dim, L = f.shape.n_layers;
  ASSERT_EQ(b.tier_tokens(0), 21);
  // Decoded rows of the tier against their fp16-rounded input, and the coded rows against theirs.
  double tier_err = 0, tier_norm = 0, coded_err = 0, coded_norm = 0;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const CompactHead ch = b.decompress_head(l, h);
      const auto& tier = b.tier_positions(l, h);
      const auto& coded = b.positions(l, h);
      for (size_t i = 0; i < ch.positions.size(); ++i) {
        const int32_t p = ch.positions[i];
        const bool in_tier = std::binary_search(tier.begin(), tier.end(), p);
        const bool in_codes = std::binary_search(coded.begin(), coded.end(), p);
        if (!in_tier && !in_codes) continue;
        for (int e = 0; e < d; ++e) {
          const float x = fp16_round(f.data.values[l][(static_cast<size_t>(p) * H + h) * d + e]);
          const double err = double(ch.values[i * d + e]) - x;
          (in_tier ? tier_err : coded_err) += err * err;
          (in_tier ? tier_norm : coded_norm) += double(x) * x;
        }
      }
    }
  std::printf("value rel err: tier %.4f, coded %.4f\n", std::sqrt(tier_err / tier_norm), std::sqrt(coded_err / coded_norm));
  EXPECT_LT(std::sqrt(tier_err / tier_norm), 0.5 * std::sqrt(coded_err / coded_norm));
  expect_tier_cuts_the_error(f, base, tiered, "a 7 % code tier");
}

// Only where it raises a rate: protected fp16 layers and layers already at the tier's rates keep
// every token in their own codes (no tier stream), the others promote; a rate budget's per-layer
// codes follow the same rule.
TEST(Compressor, CodeTierOnlyInLayersItRaises) {
  const auto spec = default_spec(176, 4);
  Fixture f(spec);
  const Config protect = Config::parse("preset=quant-k3v2,code_tier=0.1,protect=1");
  const CompressedKV p = compress_with(f, protect);
  EXPECT_EQ(p.tier_tokens(0), 0);
  EXPECT_GT(p.tier_tokens(1), 0);
  EXPECT_GT(p.tier_tokens(2), 0);
  EXPECT_EQ(p.tier_tokens(3), 0);
  EXPECT_EQ(p.stored_tokens(0), spec.tokens);
  const Config rates = Config::parse("code_tier=0.1,layer_rates=rvq4/rvq4;rvq3/e8p2;rvq4/e8p2;e8p2/rvq4");
  const CompressedKV r = compress_with(f, rates);
  const std::vector<bool> want = {false, true, true, true};
  for (int l = 0; l < spec.n_layers; ++l) {
    EXPECT_EQ(r.layout().layer_has_code_tier(l), want[static_cast<size_t>(l)]) << "layer " << l;
    EXPECT_EQ(r.tier_tokens(l) > 0, want[static_cast<size_t>(l)]) << "layer " << l;
    EXPECT_EQ(r.stored_tokens(l), spec.tokens);
  }
  const Config budget = Config::parse("preset=quant-k2v2,index_budget=2.5,code_tier=0.05");
  const CompressedKV bc = compress_with(f, budget);
  for (int l = 0; l < spec.n_layers; ++l) {
    EXPECT_EQ(bc.tier_tokens(l) > 0, bc.layout().layer_has_code_tier(l)) << "layer " << l;
    EXPECT_EQ(bc.stored_tokens(l), spec.tokens);
  }
  // No tier: the layout says so, and the tier streams stay empty.
  const CompressedKV none = compress_with(f, Config::parse("preset=quant-k3v2"));
  EXPECT_FALSE(none.layout().has_code_tier());
  EXPECT_EQ(none.layout().tier_key_codec, quant::Codec::kFp16);
  EXPECT_EQ(none.tier_tokens(0), 0);
}

// Appends after a tiered compress leave the tier as it is (appended tokens enter through the
// window); drop_before removes the tier tokens below its position with the others, and what
// remains decodes to the same floats.
TEST(Compressor, CodeTierThenAppendAndDropBefore) {
  const auto spec = default_spec(177, 1);
  Fixture f(spec);
  const int64_t n = spec.tokens;
  const int d = spec.head_dim;
  KVCompressor c(f.shape, Config::parse("preset=quant-k3v2,code_tier=0.1"));
  auto cache = c.compress(f.seq, &f.queries);
  const std::vector<int32_t> tier = cache.tier_positions(0, 0);
  ASSERT_EQ(tier.size(), 30u);
  append_tokens(c, cache, f, 0, 40, n);
  EXPECT_EQ(cache.tier_positions(0, 0), tier);
  EXPECT_EQ(cache.stored_tokens(0), n + 40);
  EXPECT_EQ(cache.last_position(0), n + 39);
  const CompactHead before = cache.decompress_head(0, 1);
  for (size_t i = 0; i < before.positions.size(); ++i) ASSERT_EQ(before.positions[i], static_cast<int32_t>(i));
  const int32_t cut = tier[tier.size() / 2];  // a tier token: it goes, the ones after it stay
  c.drop_before(cache, cut);
  const auto& left = cache.tier_positions(0, 1);
  EXPECT_EQ(left, std::vector<int32_t>(tier.begin() + static_cast<std::ptrdiff_t>(tier.size() / 2), tier.end()));
  const CompactHead after = cache.decompress_head(0, 1);
  ASSERT_EQ(after.positions.size(), before.positions.size() - static_cast<size_t>(cut));
  for (size_t i = 0; i < after.positions.size(); ++i) {
    ASSERT_EQ(after.positions[i], cut + static_cast<int32_t>(i));
    for (int e = 0; e < d; ++e) {
      ASSERT_EQ(after.keys[i * d + e], before.keys[(static_cast<size_t>(cut) + i) * d + e]);
      ASSERT_EQ(after.values[i * d + e], before.values[(static_cast<size_t>(cut) + i) * d + e]);
    }
  }
  EXPECT_LE(cache.resident_bytes(), cache.bytes() + cache.bytes() / 10);
}

// Sliding window: drop_before removes exactly the stored tokens below a position (coded, window,
// pinned sinks and tier tokens), the others decode to the same floats, the cache round-trips
// through the container, appends go on, and resident memory stays at bytes(). Per-head sets whose
// pinned counts would diverge are refused, the cache unchanged.
TEST(Compressor, DropBeforeRemovesTheTokensBelowAPosition) {
  auto spec = default_spec(173);
  spec.tokens = 300;
  Fixture f(spec);
  const int H = spec.n_kv_heads, d = spec.head_dim;
  int refused = 0, dropped = 0;
  // Under the sanitizers the tiered shared and per-head configs, three cuts each.
  const std::vector<const char*> all = {"preset=quant-k3v2,residual=8", "preset=quant-k2v2,fp16_tier=0.05",
                                        "preset=lossless", "preset=high,per_head=1",
                                        "preset=high,per_head=1,fp16_tier=0.05"};
  const std::vector<const char*> some = {all[1], all[4]};
  const std::vector<int32_t> all_cuts = {0, 2, 100, 151, 310, 319, 400}, some_cuts = {2, 151, 319};
  for (const char* spec_string : e8kv::test::kUnderSanitizer ? some : all) {
    SCOPED_TRACE(spec_string);
    KVCompressor c(f.shape, Config::parse(spec_string));
    auto cache = c.compress(f.seq, &f.queries);
    append_tokens(c, cache, f, 0, 20, spec.tokens);
    for (int32_t cut : e8kv::test::kUnderSanitizer ? some_cuts : all_cuts) {
      SCOPED_TRACE("drop_before " + std::to_string(cut));
      CompressedKV copy = cache;
      const auto before = container::serialize(copy);
      try {
        c.drop_before(copy, cut);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("one pinned count per layer"), std::string::npos) << e.what();
        EXPECT_EQ(container::serialize(copy), before);
        ++refused;
        continue;
      }
      ++dropped;
      for (int l = 0; l < spec.n_layers; ++l)
        for (int h = 0; h < H; ++h) {
          const CompactHead all = cache.decompress_head(l, h), kept = copy.decompress_head(l, h);
          CompactHead want;
          for (size_t i = 0; i < all.positions.size(); ++i) {
            if (all.positions[i] < cut) continue;
            want.positions.push_back(all.positions[i]);
            want.keys.insert(want.keys.end(), all.keys.begin() + i * d, all.keys.begin() + (i + 1) * d);
            want.values.insert(want.values.end(), all.values.begin() + i * d, all.values.begin() + (i + 1) * d);
          }
          ASSERT_EQ(kept.positions, want.positions) << "layer " << l << " head " << h;
          ASSERT_EQ(kept.keys, want.keys);
          ASSERT_EQ(kept.values, want.values);
        }
      EXPECT_EQ(copy.original_tokens(), cache.original_tokens());
      EXPECT_LE(copy.resident_bytes(), cache.resident_bytes());
      const auto bytes = container::serialize(copy);
      EXPECT_EQ(container::serialize(container::deserialize(bytes.data(), bytes.size())), bytes);
      append_to_every_layer(c, copy, f, 0, spec.tokens + 20);
      EXPECT_EQ(copy.stored_positions(0).back(), spec.tokens + 20);
    }
  }
  EXPECT_GE(dropped, e8kv::test::kUnderSanitizer ? 4 : 25);
  std::printf("drop_before: %d cuts applied, %d refused (per-head sets with different pinned counts)\n", dropped,
              refused);
}

}  // namespace
