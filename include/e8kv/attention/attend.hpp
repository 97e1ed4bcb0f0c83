// Decode attention that reads a compressed cache's codes: one query token of one sequence, or a
// batch of sequences and query tokens in one call, with the log-sum-exp an engine needs to merge
// partial attentions (split-K, cascade / shared-prefix caches, a prefix on another device).
//
//   e8kv::attend(cache, layer, q, out, lse);                        // one sequence, one token
//   e8kv::attend_batch(requests, {.executor = &pool});              // many sequences/tokens
//   e8kv::merge_attention(o_a, lse_a, o_b, lse_b, n_heads, d, o, lse);  // exact combination
//
// What is computed: for every query head, softmax(scale·q·Kᵀ)·V over every token the cache
// stores for `layer` (coded tokens and the fp16 window), where K and V are what the cache
// decodes to (CompressedKV::decompress_head); lse = log Σ exp(scale·q·k) in natural log, so
// that o = Σ_i exp(lse_i − lse)·o_i merges two disjoint sets of keys exactly.
//
// How: keys are never transformed one by one. Each query head is rotated once into the codes'
// domain (randomized Hadamard, the inverse key channel scales, the codebook's input scale) and
// scored against the block codes decoded in registers; with RoPE-residual keys the mean term
// q·R_t·μ is added from cos/sin rows. Values are summed in the rotated domain and rotated back
// once per query head. Work is cut into fixed chunks of tokens whose partial softmax states
// merge in a fixed order, so results are bit-identical for any executor and thread count, and
// identical between the AVX2 + FMA build and the portable one.
//
// Thread safety: reads the cache only; any number of calls may run concurrently on one cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"

namespace e8kv {

class Executor;  // e8kv/parallel.hpp (ThreadPool, or an engine's own pool); used by pointer only

struct AttendOptions {
  /// Runs the work items (sequence × chunk of tokens); null: the calling thread.
  Executor* executor = nullptr;
  /// A bound on the partial states a call holds at once (each chunk of stored tokens leaves one
  /// state per query token and head until the chunks are merged): a call whose states would exceed
  /// it runs its chunks in waves, merging each wave before the next. 0: 16 MiB, and waves of at
  /// least two chunks per executor thread. Results never depend on it (the merge adds the same
  /// terms in the same order).
  size_t max_state_bytes = 0;
};

/// q: n_q_heads·head_dim floats (post-RoPE, the engine's basis); out: the same size; lse:
/// n_q_heads floats or null. A layer with no stored token gives out = 0 and lse = −inf.
/// Throws e8kv::Error on a null q or out, a layer out of range, a non-finite query, or scores
/// that overflow the float range (a query or keys too large to attend: never answered with zeros).
void attend(const CompressedKV& cache, int layer, const float* q, float* out, float* lse = nullptr,
            const AttendOptions& options = {});

/// One sequence's share of a batch: n_tokens query tokens of `layer`, each attending to every
/// token the cache stores (queries of a decode step, of speculative drafts or of a prefill chunk
/// whose own keys are attended separately and merged with merge_attention).
struct AttendRequest {
  const CompressedKV* cache = nullptr;
  int layer = 0;
  int n_tokens = 1;
  const float* q = nullptr;  ///< [n_tokens, n_q_heads, head_dim]
  float* out = nullptr;      ///< [n_tokens, n_q_heads, head_dim]
  float* lse = nullptr;      ///< [n_tokens, n_q_heads] or null
  /// Only stored tokens whose position lies in [min_position, max_position] are attended (the
  /// defaults: all of them). For an engine whose cache already holds later tokens than a query's
  /// (a causal limit), or a sliding window (min_position); a request whose bounds leave no token
  /// gives out = 0 and lse = −inf, as an empty layer does.
  int32_t min_position = std::numeric_limits<int32_t>::min();
  int32_t max_position = std::numeric_limits<int32_t>::max();
  /// [n_tokens] or null: query token i attends only stored tokens at positions <= this (and
  /// within the bounds above). A sequence's new tokens appended before they attend (a batch of a
  /// later llama_decode call) each see only their predecessors, while sharing every tile's decode;
  /// each token's result is bit-identical to attending a cache that holds nothing after it
  /// (KVCompressor::append_flushes says when a batch must attend before appending more).
  const int32_t* token_max_positions = nullptr;
  /// [n_tokens] or null: query token i attends only stored tokens at positions >= this (and within
  /// the bounds above): each token's own sliding window.
  const int32_t* token_min_positions = nullptr;
};

/// Every request of the batch, work items spread over the executor. Each request's results are
/// bit-identical to attend() on its tokens one by one; a request's query tokens share the decode
/// of each tile of codes, so one request of n tokens costs less than n calls.
void attend_batch(const std::vector<AttendRequest>& requests, const AttendOptions& options = {});

/// o = (e^{lse_a}·o_a + e^{lse_b}·o_b) / (e^{lse_a} + e^{lse_b}) per head, lse = log of the
/// denominator: the attention over the union of two disjoint key sets. o_a/o_b: n_heads·d
/// floats, lse_a/lse_b: n_heads. An empty side (lse = −inf) leaves the other unchanged. out and
/// lse_out may alias o_a and lse_a.
void merge_attention(const float* o_a, const float* lse_a, const float* o_b, const float* lse_b, int n_heads, int d,
                     float* out, float* lse_out);

}  // namespace e8kv
