// The CPU decode attention's internals (attend.hpp's implementation), shared by its three
// sources: attend_plan.cpp (what a layer's chunks read, the query in each basis), attend_chunk.cpp
// (one work item: a chunk of stored tokens for every query token and head) and attend.cpp (the
// requests, the merge, the public calls). Internal (not installed).
//
// Plan of one call: every request (sequence × layer × query tokens) is cut into work items of
// kChunkTokens stored tokens (coded chunks first, then the code tier's, then the fp16 window),
// each item covering all KV heads so the cos/sin rows of the RoPE-residual mean term are
// computed once per position; a request of several query tokens (whose scores outweigh those
// rows) is cut per KV head as well, so that a batch's few chunks still spread over the threads.
// An item scores its tokens for every query token and head, takes the chunk's softmax and sums
// the values, leaving a partial state (max, Σp, Σp over coded tokens, weighted value sum) per
// (query token, query head). States are merged in chunk order once every item has run, so the
// result does not depend on which thread ran what. A request's position bounds shorten the coded
// and tier runs (ascending) at both ends and mask window rows: the chunks stay where they are, a
// chunk's sub-tiles wholly below every token's bounds are skipped (their scores stay -inf and their
// weights 0, as masking gives), and a chunk with nothing in bounds runs no item. When a call has
// fewer items than threads (a sliding-window layer's one chunk, a model of one KV head), a
// request's query tokens are cut into parts as well: no cut changes a result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/quant/codec_id.hpp"
#include "e8kv/transform/rope_params.hpp"

namespace e8kv::attention {

using quant::Codec;
using transform::KeyFrame;

/// Stored tokens per work item (per head). Fixed, so results never depend on the thread count.
constexpr int64_t kChunkTokens = 512;
/// Tokens whose cos/sin rows and decoded keys are held at once inside a chunk.
constexpr int64_t kSubTile = 64;
/// Query heads per kernel call (the kernels keep at most eight accumulators in registers).
constexpr int kMaxGroup = 8;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- what a layer's chunks read -----------------------------------------------------------------

enum class Rows : uint8_t { kE8p, kRvq3, kRvq4, kFp16, kFp32 };

Rows table_rows(Codec c);

struct LayerPlan {
  const CompressedKV* cache = nullptr;
  const CacheLayout* L = nullptr;
  int layer = 0, H = 0, G = 0, d = 0, blocks = 0;
  int pairs = 0, P = 0;  // rotary pairs, padded to a multiple of 8
  KeyFrame frame = KeyFrame::kPreRope;
  Codec key_codec = Codec::kFp16, value_codec = Codec::kFp16;
  Rows key_rows = Rows::kFp16, value_rows = Rows::kFp16;
  bool key_in_engine_basis = true;   // scored with the raw query (fp16 codec, pre-RoPE decoded ahead)
  bool value_in_engine_basis = true;  // fp16 codec: summed in the engine's basis
  bool residual_mean = false;        // q·R_t·μ per token from cos/sin rows
  float query_factor = 1.f;          // the key codebook's 1/input scale, folded into the query
  float value_factor = 1.f;          // the value codebook's 1/input scale, folded into the weights
  size_t key_code_bytes = 0, value_code_bytes = 0;
  float scale = 1.f;
  // The code tier (CacheLayout::tier_key_codec): keys post-RoPE, no channel scales, fp16 gains;
  // read in the same rotated bases as the layer's codes with the tier codec's factors. Centred
  // (tier_centred, format 6) like the codes: the mean term and the value mean apply to its tokens.
  Codec tier_key_codec = Codec::kFp16, tier_value_codec = Codec::kFp16;
  bool tier_centred = false;
  Rows tier_key_rows = Rows::kFp32, tier_value_rows = Rows::kFp32;
  float tier_query_factor = 1.f, tier_value_factor = 1.f;
  size_t tier_key_code_bytes = 0, tier_value_code_bytes = 0;
  std::vector<int64_t> coded, tier, window;  // per head
  int64_t coded_chunks = 0, tier_chunks = 0, window_chunks = 0;
};

/// What a chunk of a layer reads: the layer's codes, the code tier or the fp16 window.
enum class Segment : uint8_t { kCoded, kTier, kWindow };
inline Segment segment_of(const LayerPlan& p, int64_t chunk) {
  if (chunk < p.coded_chunks) return Segment::kCoded;
  return chunk < p.coded_chunks + p.tier_chunks ? Segment::kTier : Segment::kWindow;
}
/// The chunk's first token within its segment.
inline int64_t segment_begin(const LayerPlan& p, int64_t chunk) {
  switch (segment_of(p, chunk)) {
    case Segment::kCoded: return chunk * kChunkTokens;
    case Segment::kTier: return (chunk - p.coded_chunks) * kChunkTokens;
    case Segment::kWindow: break;
  }
  return (chunk - p.coded_chunks - p.tier_chunks) * kChunkTokens;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Checks the cache and the layer; what every chunk of `layer` reads.
LayerPlan plan_layer(const CompressedKV& cache, int layer);

// ---- per (query token, KV head): the query in each basis the chunks need -------------------------

struct HeadQuery {
  const float* q = nullptr;  // G·d, engine basis
  std::vector<float> qt;     // G·d, rotated basis of the coded keys, times the input factor
  std::vector<float> qt_tier;  // G·d, rotated basis of the tier keys (no S⁻¹), times the tier's factor
  std::vector<float> mean_coeffs;  // G·2P: per query head A (P floats) then B (P floats), RoPE residual
  std::vector<float> base;   // G, constant part of q·k̂ (post-RoPE mean, non-rotary channels)
};

// Coded keys decode to k̂ = M_t + S⁻¹·Rᵀ·(g·ĉ), with R the randomized Hadamard, S the key
// channel scales and M_t the mean in the engine's frame (μ, or R_t·μ for RoPE residuals). So
// q·k̂ = q·M_t + g·(R·S⁻¹·q)·ĉ: the query is rotated once, the mean term is one dot (post-RoPE)
// or Σ_p A_p·cos(θ_p·t) + B_p·sin(θ_p·t) over the rotary pairs (RoPE residual): the dot product
// of the 2P-float row [A | B] with the position's cos/sin row [cos | sin], which the key kernel
// computes as it would with a row of float keys.
HeadQuery prepare_head_query(const LayerPlan& p, int h, const float* q_head);

// ---- requests and their partial states ---------------------------------------------------------

/// Floats of one partial state: max logit, Σp, Σp over coded tokens, then the d-float value sum.
inline int state_floats(int d) { return 3 + d; }

struct ResolvedRequest {
  LayerPlan plan;
  int n_tokens = 0;
  const float* q = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
  std::vector<HeadQuery> heads;  // [token][head]
  // The partial states of the chunks of the running wave, [wave_begin, wave_end): a call over a
  // deep cache runs its chunks in waves, so that it holds the states of a wave, not of every chunk
  // (chunks x tokens x query heads x (d + 3) floats: 40 MB for a 512-token ubatch at 16K depth).
  std::vector<float> states;     // [chunk - wave_begin][token][head][g][state_floats]
  int64_t wave_begin = 0, wave_end = 0;
  // Per [chunk - wave_begin][head]: 1 when a work item writes that chunk's states for the head
  // (all its tokens' or a part's; parts cover every token), 0 when none runs: the fold skips
  // those, so a wave need not clear the states the previous one left.
  std::vector<uint8_t> scheduled;
  // The chunks merged so far, per (token, head, g), in chunk order: the running maximum, sum and
  // value-mean mass, the value sums (rotated basis and engine basis) and whether any was rotated.
  std::vector<float> fold_max, fold_rot, fold_eng;
  std::vector<double> fold_sum, fold_mass;
  std::vector<uint8_t> fold_any_rot;
  // AttendRequest's position bounds. bounded: some stored token may fall outside them; then
  // coded_end / tier_end (per head) end each ascending run after its last token <= max_position,
  // and every other token outside [min_position, max_position] is masked (-inf) in its chunk.
  bool bounded = false;
  int32_t min_position = std::numeric_limits<int32_t>::min();
  int32_t max_position = std::numeric_limits<int32_t>::max();
  // AttendRequest::token_min_positions / token_max_positions (each within the request's bounds,
  // which then hold their hull), or empty.
  std::vector<int32_t> token_min, token_max;
  int32_t min_for(int token) const {
    return token_min.empty() ? min_position : token_min[static_cast<size_t>(token)];
  }
  int32_t max_for(int token) const {
    return token_max.empty() ? max_position : token_max[static_cast<size_t>(token)];
  }
  std::vector<int64_t> coded_end, tier_end;
  // Per head: the first token of the coded and tier runs at or above min_position (0 unbounded).
  std::vector<int64_t> coded_begin, tier_begin;
  int64_t chunks() const { return plan.coded_chunks + plan.tier_chunks + plan.window_chunks; }
  float* state(int64_t chunk, int token, int h, int g) {
    const auto& p = plan;
    const size_t idx = ((static_cast<size_t>(chunk - wave_begin) * n_tokens + token) * p.H + h) * p.G + g;
    return states.data() + idx * static_cast<size_t>(state_floats(p.d));
  }
};

/// Reusable buffers of one work item.
struct Scratch {
  std::vector<float> logits;   // [token][head][g][kChunkTokens]
  std::vector<float> dots, mean;  // [kMaxGroup][kSubTile]
  std::vector<float> cs;       // [kSubTile][2·P]: cos row, sin row per token
  std::vector<float> rows;     // [kSubTile][d]: keys or values decoded ahead
  std::vector<float> key_gains, value_gains;  // [kChunkTokens]
  std::vector<float> weights;  // [token][head][kChunkTokens] in the kernels' group layout
  std::vector<float> acc;      // [token][head][d]: value sums of the chunk
  std::vector<float> upper_cos, upper_sin;
  uint32_t upper = 0xFFFFFFFFu;
};

/// KV heads [begin, end) of a work item.
struct HeadRange {
  int begin = 0, end = 0;
};

/// Query tokens [begin, end) of a request in a work item.
struct TokenRange {
  int begin = 0, end = 0;
  int size() const { return end - begin; }
};

/// True when chunk `chunk` of r holds no stored token within r's bounds for any head of `heads`
/// (its states stay empty: the merge skips them).
bool chunk_out_of_bounds(const ResolvedRequest& r, int64_t chunk, HeadRange heads);

/// One work item: chunk `chunk` of request r for the KV heads of `heads` (their query heads) and
/// the query tokens of `tokens`, into r's states.
void run_chunk(ResolvedRequest& r, int64_t chunk, HeadRange heads, TokenRange tokens, Scratch& s);
/// Sizes r's fold: nothing merged yet.
void begin_fold(ResolvedRequest& r);
/// Merges the states of r's running wave into its fold, in chunk order, for the query tokens of
/// `tokens` (each token's fold is its own: any cut of the tokens gives the same bits). Folding wave
/// after wave adds the same terms in the same order as one fold of every chunk.
void fold_wave(ResolvedRequest& r, TokenRange tokens);
/// r's fold, every chunk merged, into out and lse, for the query tokens of `tokens`.
void finish_request(ResolvedRequest& r, TokenRange tokens);

}  // namespace e8kv::attention
