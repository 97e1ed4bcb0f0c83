// KVCompressor: the object an inference engine calls after prefill and on every decoded token.
//
//   e8kv::ModelShape shape{n_layers, n_kv_heads, n_q_heads, head_dim};
//   e8kv::KVCompressor c(shape, e8kv::Config::preset("high"));
//   e8kv::CompressedKV cache = c.compress(prefill_kv, &obs_queries);   // score, evict, quantize
//   c.append(cache, layer, k, v, position);                             // each decoded token
//   c.attend(cache, layer, q, position, out);                           // reads the codes
//
// Thread safety: a KVCompressor is immutable after construction; its const methods and the
// const methods of CompressedKV (attend, decompress, bytes) may be called concurrently. Calls
// that modify one CompressedKV (append, extend) must not overlap other calls on that cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/cache/kv_view.hpp"
#include "e8kv/config.hpp"
#include "e8kv/select/eviction.hpp"
#include "e8kv/select/scorer.hpp"

namespace e8kv {

class Executor;  // e8kv/parallel.hpp (ThreadPool, or an engine's own pool); used by pointer only

class KVCompressor {
 public:
  KVCompressor(const ModelShape& shape, const Config& config);

  const ModelShape& shape() const { return shape_; }
  const Config& config() const { return config_; }

  /// Compresses a prefill: scores (attention scorers need `queries`, one LayerQueries per layer),
  /// evicts, removes RoPE, rotates, quantizes. Inputs are rounded to fp16 first (the cache's
  /// working precision), so without chunk-level rules compressing at once equals compressing a
  /// prefix and appending; eviction, the tiers and the rate budget are decided per chunk
  /// (docs/architecture.md, "Prefix consistency, per preset").
  /// `executor` (optional) plans the layers in parallel; the result does not depend on it.
  /// With Config::rate_budget or index_budget the layers' codes are chosen from this prefill
  /// first (select/rate_allocation.hpp) and recorded in the cache's layout; extend and append keep
  /// them. rate_budget (`budget=`) compresses twice (the first pass, at the cheapest codes,
  /// measures the side data) and throws e8kv::Error, giving the minimum, when the chunk cannot
  /// meet it.
  CompressedKV compress(const SequenceKV& prefill, const std::vector<LayerQueries>* queries = nullptr,
                        Executor* executor = nullptr) const;
  /// Ragged batch: one CompressedKV per sequence (queries[b] per sequence, or nullptr).
  std::vector<CompressedKV> compress_batch(const std::vector<SequenceKV>& batch,
                                           const std::vector<std::vector<LayerQueries>>* queries = nullptr) const;
  /// Multi-turn: compresses a later prefill chunk into an existing cache. Tokens already in the
  /// cache are never re-quantized; eviction applies to the new chunk only.
  /// A call that throws (bad shape, non-finite value, positions out of order) leaves the cache
  /// exactly as it was.
  void extend(CompressedKV& cache, const SequenceKV& chunk, const std::vector<LayerQueries>* queries = nullptr,
              Executor* executor = nullptr) const;

  /// Sliding window: removes every stored token whose position is below `position`, from every
  /// layer (coded tokens, the fp16 window, pinned sinks and fp16-tier tokens alike), as an engine
  /// with sliding-window attention drops cells that left the window. The remaining tokens keep
  /// their codes; the means, key channel scales and gain references they were coded with stay.
  /// original_tokens is unchanged (tokens ever given). Throws when per-KV-head position sets
  /// would keep different numbers of pinned tokens; a call that throws leaves the cache as it was.
  void drop_before(CompressedKV& cache, int32_t position) const;

  /// Appends one token of one layer: k and v are [n_kv_heads * head_dim] post-RoPE. Validates
  /// everything before changing the cache (a throw leaves it as it was).
  void append(CompressedKV& cache, int layer, const float* k, const float* v, int32_t position) const;

  /// Whether the next append() to `layer` codes window tokens (a flush: whole blocks of the fp16
  /// window become codes). An engine that appends a batch of tokens before attending them attends
  /// the tokens appended so far before such an append: each token then sees its predecessors as
  /// decoding one token at a time shows them (attend.hpp's position bounds keep the later ones out).
  bool append_flushes(const CompressedKV& cache, int layer) const;

  /// A batch of new tokens of several sequences in one layer (a chat's next turn, a prompt past the
  /// first llama_decode call, one decoding step of many sequences): each request's tokens are
  /// appended in order and each attends its query right after its own append, so every out
  /// ([n_tokens, n_q_heads·head_dim]) and lse ([n_tokens, n_q_heads] or null) is bit for bit what
  /// n calls of append() then e8kv::attend() give. The tokens are appended up to the next flush
  /// (append_flushes), then every request's pending tokens attend in one attend_batch, each bounded
  /// by its own position (and token_min_positions, its window): every tile of codes is decoded
  /// once per segment for all of a segment's tokens. Throws as append and attend do; tokens
  /// appended before a throw stay appended.
  struct AppendAttendRequest {
    CompressedKV* cache = nullptr;
    int layer = 0;
    int n_tokens = 0;
    const float* k = nullptr;                        ///< [n_tokens, n_kv_heads·head_dim] post-RoPE
    const float* v = nullptr;                        ///< the same
    const int32_t* positions = nullptr;              ///< [n_tokens] ascending, after the layer's last
    const float* q = nullptr;                        ///< [n_tokens, n_q_heads·head_dim] post-RoPE
    float* out = nullptr;                            ///< [n_tokens, n_q_heads·head_dim]
    float* lse = nullptr;                            ///< [n_tokens, n_q_heads] or null
    const int32_t* token_min_positions = nullptr;    ///< [n_tokens] or null: each token's window
  };
  void append_attend(const std::vector<AppendAttendRequest>& requests, Executor* executor = nullptr) const;

  /// Decode attention for one new token at `position`: q is [n_q_heads * head_dim] post-RoPE; out
  /// receives softmax(scale·q·Kᵀ)·V over every token of `layer` in the cache, [n_q_heads * head_dim]
  /// (e8kv::attend, attention/attend.hpp, has the lse, batches and threads). Throws e8kv::Error
  /// when `position` precedes a stored token of the layer (the query would see its future).
  void attend(const CompressedKV& cache, int layer, const float* q, int32_t position, float* out) const;

  /// Empty when this compressor accepts caches of `layout` (extend, append, drop_before; the C
  /// ABI's e8kv_deserialize checks a container with it): its own layout, or with a rate budget
  /// (Config::rate_budget, index_budget) that layout with per-layer codes the budget may choose.
  /// Otherwise the first difference, named as container::layout_difference names it.
  std::string layout_difference(const CacheLayout& layout) const;

 private:
  /// Throws unless the cache was made with this compressor's layout (by it, or read back; with a
  /// rate budget the per-layer codes are the cache's own).
  void check_cache(const CompressedKV& cache, const char* what) const;
  /// What the rate allocation reads of a prefill: per layer the sensitivity, and whether it is
  /// protected (fixed, at fixed_rate: fp16).
  struct Sensitivities;
  /// positions: the prefill's, checked (checked_chunk_positions).
  Sensitivities layer_sensitivities(const SequenceKV& prefill, const std::vector<LayerQueries>* queries,
                                    Executor* executor, const std::vector<int32_t>& positions) const;
  /// Every layer's scores of a chunk, for the selections made over all layers at once.
  struct ChunkScores;
  ChunkScores score_chunk(const SequenceKV& chunk, const std::vector<LayerQueries>* queries, Executor* executor,
                          const std::vector<int32_t>& positions, float softmax_scale, int64_t before,
                          bool spread) const;
  /// extend() after its checks (the cache's layout, the chunk's shape and positions), with the
  /// chunk's scores when the caller has them already (compress with a rate budget and eviction
  /// spread over layers scores first, to weigh the layers' bits).
  void extend_scored(CompressedKV& cache, const SequenceKV& chunk, const std::vector<LayerQueries>* queries,
                     Executor* executor, ChunkScores* scored, const std::vector<int32_t>& positions) const;

  ModelShape shape_;
  Config config_;
  std::shared_ptr<const CacheCodecs> codecs_;
};

}  // namespace e8kv
