// Token-importance scoring for eviction.
//
// Every scorer returns one score per (kv_head, token) of a layer: higher = more important.
// Attention-based scorers (obs-window, multi-window, key-key) sum softmax(scale * q.k) over their
// queries with the causal mask (a query only sees keys at positions <= its own; one that sees
// none adds nothing), aggregate over the query heads of each GQA group explicitly (mean or max),
// then max-pool over neighbouring tokens. The per-token baselines (streaming, random, key-norm)
// are never pooled. tests/select/ checks every scorer against a naive reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "e8kv/cache/kv_view.hpp"

namespace e8kv::select {

enum class ScorerKind : uint8_t {
  kObservationWindow = 0,  ///< softmax of the last W real queries against all keys, summed
  kMultiWindow = 1,        ///< same, over several windows (e.g. first and last queries) concatenated by the caller
  kKeyKeyProxy = 2,        ///< the last W keys act as queries (engines that cannot hand over queries)
  kStreaming = 3,          ///< StreamingLLM baseline: sinks + most recent (score = position - first key's position)
  kRandom = 4,             ///< seeded random scores (baseline): top 24 bits of random_bits(seed, position)
  kKeyNorm = 5,            ///< baseline: lower key L2 norm = more important (KNorm)
};

enum class Aggregation : uint8_t { kMean = 0, kMax = 1 };

const char* to_string(ScorerKind k);
ScorerKind scorer_from_string(const std::string& name);  // throws e8kv::Error listing the names

struct ScorerOptions {
  ScorerKind kind = ScorerKind::kObservationWindow;
  int window = 32;                 ///< observation window (queries, or proxy keys)
  int pool_kernel = 7;             ///< max-pool over tokens t +- pool_kernel/2 (1 = off; odd; attention scorers)
  Aggregation gqa = Aggregation::kMean;  ///< over the query heads of one KV head
  uint64_t seed = 0;               ///< kRandom only
};

/// Scores of one layer: scores[h * tokens + t] for kv head h, token t.
struct LayerScores {
  int64_t kv_heads = 0;
  int64_t tokens = 0;
  std::vector<float> scores;
  float at(int64_t h, int64_t t) const { return scores[static_cast<size_t>(h * tokens + t)]; }
};

/// Scores the tokens of one layer. `keys` are the layer's keys as stored by the engine
/// (post-RoPE), `key_positions[t]` their absolute positions. `queries` are required by the
/// attention scorers (kObservationWindow, kMultiWindow) and ignored by the others; their head
/// count must be a multiple of the KV head count (GQA; equal = MHA, one KV head = MQA; query head
/// g belongs to KV head g / (q_heads / kv_heads)). Without query positions, query w of W takes
/// the position of key T - W + w (the first key's for the extra queries of a window longer than
/// the layer).
/// `softmax_scale` is applied to q·k (default 1/sqrt(head_dim) when <= 0).
LayerScores score_layer(const TensorView& keys, const int32_t* key_positions, const LayerQueries* queries,
                        const ScorerOptions& options, float softmax_scale = 0.f);

/// Combines the KV heads of a layer into one score per token (for a kept set shared by heads).
std::vector<float> aggregate_heads(const LayerScores& s, Aggregation how);

}  // namespace e8kv::select
