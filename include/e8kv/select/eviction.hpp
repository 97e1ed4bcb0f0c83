// Eviction: which tokens of a layer stay. Sinks and a recent window are always kept; the rest
// is filled with the highest-scoring tokens until the eviction rate is met.
#pragma once

#include <cstdint>
#include <vector>

#include "e8kv/select/scorer.hpp"

namespace e8kv::select {

struct EvictionOptions {
  double rate = 0.0;       ///< fraction of tokens to evict, in [0, 1)
  int sinks = 4;           ///< first tokens always kept (attention sinks)
  int recent = 32;         ///< last tokens always kept
  bool per_head = false;   ///< one kept set per KV head instead of one per layer
  Aggregation head_aggregation = Aggregation::kMean;  ///< combining KV heads for a shared set
  /// When >= 0, the number of tokens to evict instead of round(rate * n) (rate is then unused):
  /// per-layer counts of an eviction spread over layers (Config::layer_adaptive_eviction).
  int64_t evict_count = -1;
};

/// Number of tokens kept out of n: n - round(rate * n) (or n - evict_count), but never fewer than
/// min(n, sinks + recent).
int64_t kept_count(int64_t n, const EvictionOptions& o);

/// Indices (0-based token indices into the layer, not positions) of the kept tokens, sorted
/// ascending. Ties in score are broken by the lower index (deterministic).
std::vector<int64_t> select_tokens(const std::vector<float>& scores, const EvictionOptions& o);

/// Tier size for a chunk of n tokens: round(fraction · n), fraction in [0, 1).
int64_t tier_count(int64_t n, double fraction);

/// The tokens of a kept set promoted to a higher-rate tier (Config::fp16_tier): the `count`
/// highest-scoring of `kept` (chunk indices, ascending) among those eviction competes over — not
/// among the first o.sinks nor the last o.recent of the scores.size() scored tokens — as chunk
/// indices, ascending; all of them when fewer compete. Ties go to the lower index, NaN ranks last.
std::vector<int64_t> select_tier(const std::vector<float>& scores, const std::vector<int64_t>& kept, int64_t count,
                                 const EvictionOptions& o);

/// Kept sets of a layer: one shared set (size 1) or one per KV head (size kv_heads).
std::vector<std::vector<int64_t>> select_layer(const LayerScores& scores, const EvictionOptions& o);

/// Additive attention mask over the original tokens: 0 for kept, -inf for evicted
/// (evicted tokens are never represented by zeros).
std::vector<float> additive_mask(int64_t n_tokens, const std::vector<int64_t>& kept);

}  // namespace e8kv::select
