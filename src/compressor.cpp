// KVCompressor glue: configuration, presets, compress / extend / append.
#include "e8kv/compressor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "detail/fp16_batch.hpp"
#include "detail/finite.hpp"
#include "detail/require.hpp"
#include "cache/layer_write.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/parallel.hpp"
#include "e8kv/select/rate_allocation.hpp"

namespace e8kv {

// ---- KVCompressor ----------------------------------------------------------------------------

KVCompressor::KVCompressor(const ModelShape& shape, const Config& config) : shape_(shape), config_(config) {
  codecs_ = std::make_shared<const CacheCodecs>(make_layout(config_, shape_));  // validates
}

namespace {

/// The ascending token list `a` without the tokens of the ascending list `b`.
std::vector<int64_t> without_tokens(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out;
  out.reserve(a.size());
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// Reads one head vector, rounded to fp16 (the cache's working precision); rejects non-finite
// values and values beyond the fp16 range (both convert to an all-ones exponent).
void load_fp16_rounded(const TensorView& v, int64_t t, int64_t h, uint16_t* dst, const char* what) {
  float buf[512];
  const size_t d = static_cast<size_t>(v.head_dim());
  const float* src = buf;
  if (v.dtype() == DType::kF32)  // convert in place of a copy
    src = static_cast<const float*>(v.data()) + t * v.token_stride() + h * v.head_stride();
  else
    v.load(t, h, buf);
  detail::floats_to_fp16_bits_batch(src, dst, d);
  uint32_t special = 0;
  for (size_t i = 0; i < d; ++i) special |= static_cast<uint32_t>((dst[i] & 0x7C00u) == 0x7C00u);
  if (special == 0) return;
  for (size_t i = 0; i < d; ++i) {
    if (!std::isfinite(src[i])) detail::fail("{}: non-finite value at token {}, head {}", what, t, h);
    if ((dst[i] & 0x7C00u) == 0x7C00u)
      detail::fail("{}: value {} at token {} exceeds the fp16 range of the cache", what, src[i], t);
  }
}

void check_layer_view(const TensorView& v, const ModelShape& s, int64_t tokens, const char* what, int layer) {
  detail::require(v.tokens() == tokens, "{} of layer {}: token count {} differs from keys' {}", what, layer, v.tokens(),
                  tokens);
  detail::require(v.heads() == s.n_kv_heads, "{} of layer {}: {} heads, model has {} KV heads", what, layer, v.heads(),
                  s.n_kv_heads);
  detail::require(v.head_dim() == s.head_dim, "{} of layer {}: head_dim {}, model has {}", what, layer, v.head_dim(),
                  s.head_dim);
}

/// Throws e8kv::Error naming the first non-finite element of a layer's tensor.
void require_finite_layer(const TensorView& v, const char* what, int layer) {
  float buf[512];
  const int64_t d = v.head_dim();
  for (int64_t t = 0; t < v.tokens(); ++t)
    for (int64_t h = 0; h < v.heads(); ++h) {
      const float* x = buf;
      if (v.dtype() == DType::kF32)
        x = static_cast<const float*>(v.data()) + t * v.token_stride() + h * v.head_stride();
      else
        v.load(t, h, buf);
      const size_t i = detail::first_non_finite(x, static_cast<size_t>(d));
      if (i < static_cast<size_t>(d))
        detail::fail("{} of layer {}: non-finite value at token {}, head {}, element {}", what, layer, t, h, i);
    }
}

/// A layer's per-token scores as weights that sum to 1 over the chunk (shared selection,
/// eviction spread over layers), so that no layer dominates by the scale of its scores. Attention
/// scores are attention mass (>= 0): divided by their sum they are the layer's share of it, and a
/// flat layer stays near-uniform (no preference) where shifting it to a minimum of 0 would blow
/// its noise up to full weight. Scores below 0 (key-norm's −‖k‖: dividing by a negative sum would
/// invert the order) shift the layer to a minimum of 0 first. Scores all equal (sum 0 after the
/// shift) weigh every token alike: the layer has no preference.
std::vector<double> normalized_scores(const std::vector<float>& scores, int layer, const char* mode) {
  double lo = 0.0;
  for (size_t t = 0; t < scores.size(); ++t) {
    if (!std::isfinite(scores[t]))
      detail::fail("compress: {}: non-finite score of token {} in layer {}", mode, t, layer);
    lo = std::min(lo, static_cast<double>(scores[t]));
  }
  double sum = 0.0;
  for (float x : scores) sum += static_cast<double>(x) - lo;
  const double n = static_cast<double>(scores.size());
  std::vector<double> out(scores.size());
  for (size_t t = 0; t < scores.size(); ++t) out[t] = sum > 0.0 ? (static_cast<double>(scores[t]) - lo) / sum : 1.0 / n;
  return out;
}

/// Eviction spread over layers (Config::layer_adaptive_eviction): how many of the chunk's tokens
/// each layer evicts. The total is what `eo` evicts from one layer, times the layers; the evicted
/// are the candidates (neither sinks nor recent) with the lowest normalized scores over all
/// layers, ties to the lower layer, then the later token (select_tokens keeps the earlier of equal
/// scores, so each layer then evicts exactly these). Evicting them removes the least attention
/// share summed over layers that any choice of that many tokens could.
std::vector<int64_t> spread_evictions(const std::vector<std::vector<float>>& token_scores,
                                      const select::EvictionOptions& eo) {
  const size_t L = token_scores.size();
  std::vector<int64_t> count(L, 0);
  if (L == 0) return count;
  const int64_t n = static_cast<int64_t>(token_scores[0].size());
  const int64_t per_layer = n - select::kept_count(n, eo);
  if (per_layer <= 0) return count;
  struct Candidate {
    double share;
    int layer;
    int64_t token;
  };
  std::vector<Candidate> candidates;
  const int64_t first = std::min<int64_t>(eo.sinks, n), end = std::max<int64_t>(first, n - eo.recent);
  candidates.reserve(L * static_cast<size_t>(end - first));
  for (size_t l = 0; l < L; ++l) {
    const std::vector<double> share = normalized_scores(token_scores[l], static_cast<int>(l), "evict_layers");
    for (int64_t t = first; t < end; ++t)
      candidates.push_back({share[static_cast<size_t>(t)], static_cast<int>(l), t});
  }
  // kept_count keeps at least sinks + recent, so every layer has per_layer candidates or more.
  const size_t total = static_cast<size_t>(per_layer) * L;
  auto lower = [](const Candidate& a, const Candidate& b) {
    if (a.share != b.share) return a.share < b.share;
    if (a.layer != b.layer) return a.layer < b.layer;
    return a.token > b.token;
  };
  std::nth_element(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(total) - 1, candidates.end(),
                   lower);
  for (size_t i = 0; i < total; ++i) ++count[static_cast<size_t>(candidates[i].layer)];
  return count;
}

/// A chunk's layer count and query sets checked against the model, and its positions read once
/// (>= 0, strictly increasing): what the rate allocation, the scores and extend all use.
std::vector<int32_t> checked_chunk_positions(const SequenceKV& chunk, const std::vector<LayerQueries>* queries,
                                             int n_layers) {
  detail::require(static_cast<int>(chunk.layers.size()) == n_layers, "compress: {} layers given, model has {}",
                  chunk.layers.size(), n_layers);
  require(queries == nullptr || static_cast<int>(queries->size()) == n_layers,
          "compress: queries must hold one LayerQueries per layer");
  const int64_t n = chunk.tokens();
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    pos[static_cast<size_t>(t)] = chunk.position(t);
    require(pos[static_cast<size_t>(t)] >= 0, "compress: positions must be >= 0");
    require(t == 0 || pos[static_cast<size_t>(t)] > pos[static_cast<size_t>(t - 1)],
            "compress: positions must be strictly increasing");
  }
  return pos;
}

}  // namespace

/// What layer_sensitivities gives.
struct KVCompressor::Sensitivities {
  std::vector<select::LayerSensitivity> sensitivity;
  std::vector<bool> fixed;
  std::vector<LayerRate> fixed_rate;
};

KVCompressor::Sensitivities KVCompressor::layer_sensitivities(const SequenceKV& prefill,
                                                              const std::vector<LayerQueries>* queries,
                                                              Executor* executor, const std::vector<int32_t>& pos) const {
  const int L = shape_.n_layers;
  const int64_t n = prefill.tokens();
  Sensitivities out;
  std::vector<bool>& fixed = out.fixed;
  std::vector<LayerRate>& fixed_rate = out.fixed_rate;
  std::vector<select::LayerSensitivity>& sensitivity = out.sensitivity;
  fixed.resize(static_cast<size_t>(L));
  fixed_rate.resize(static_cast<size_t>(L));
  sensitivity.resize(static_cast<size_t>(L));
  const auto& layout = codecs_->layout();
  run_tasks(executor, L, [&](int64_t li) {
    const int l = static_cast<int>(li);
    const LayerRate r = config_.layer_rate(l, L);
    if (r.key == quant::Codec::kFp16 && r.value == quant::Codec::kFp16) {  // protected layer
      fixed[static_cast<size_t>(l)] = true;
      fixed_rate[static_cast<size_t>(l)] = r;
      return;
    }
    const LayerKV& kv = prefill.layers[static_cast<size_t>(l)];
    check_layer_view(kv.keys, shape_, n, "keys", l);
    check_layer_view(kv.values, shape_, n, "values", l);
    require_finite_layer(kv.keys, "keys", l);
    require_finite_layer(kv.values, "values", l);
    select::SensitivityInput in;
    in.keys = kv.keys;
    in.values = kv.values;
    in.positions = pos.data();
    if (queries != nullptr) {
      const LayerQueries& lq = (*queries)[static_cast<size_t>(l)];
      in.queries = &lq.queries;
      in.query_positions = lq.positions;
      detail::require(lq.queries.heads() == shape_.n_q_heads && lq.queries.head_dim() == shape_.head_dim,
                      "compress: layer {} queries must be [window, {}, {}]", l, shape_.n_q_heads, shape_.head_dim);
    }
    in.q_heads = shape_.n_q_heads;
    in.softmax_scale = layout.effective_softmax_scale();
    in.center = config_.center;
    in.fp16_prefix = config_.fp16_sinks ? config_.sinks : 0;
    in.query_weighted_keys = config_.query_weighted_keys && queries != nullptr;
    in.rope = config_.key_frame == transform::KeyFrame::kPostRope ? nullptr : &codecs_->rope();
    sensitivity[static_cast<size_t>(l)] = select::estimate_sensitivity(in);
  });
  return out;
}

/// What score_chunk gives: per layer the per-token scores with the KV heads combined
/// (Config::head_aggregation); with the spread also each layer's scores and evicted count.
struct KVCompressor::ChunkScores {
  std::vector<std::vector<float>> token_scores;
  std::vector<select::LayerScores> layer_scores;
  std::vector<int64_t> spread_counts;
};

namespace {
/// The eviction options of a chunk that follows `before` tokens: the sequence's first `sinks`
/// tokens are always kept (and, with fp16_sinks, pinned in fp16), whichever call brings them.
select::EvictionOptions chunk_eviction_options(const Config& config, int64_t before, int64_t n) {
  select::EvictionOptions eo = config.eviction_options();
  eo.sinks = static_cast<int>(std::clamp<int64_t>(config.sinks - before, 0, n));
  return eo;
}
}  // namespace

KVCompressor::ChunkScores KVCompressor::score_chunk(const SequenceKV& chunk, const std::vector<LayerQueries>* queries,
                                                    Executor* executor, const std::vector<int32_t>& positions,
                                                    float softmax_scale, int64_t before, bool spread) const {
  const int64_t n = chunk.tokens();
  const select::ScorerOptions so = config_.scorer_options();
  ChunkScores out;
  out.token_scores.resize(static_cast<size_t>(shape_.n_layers));
  if (spread) out.layer_scores.resize(static_cast<size_t>(shape_.n_layers));
  run_tasks(executor, shape_.n_layers, [&](int64_t li) {
    const int l = static_cast<int>(li);
    const LayerKV& kv = chunk.layers[static_cast<size_t>(l)];
    check_layer_view(kv.keys, shape_, n, "keys", l);
    require_finite_layer(kv.keys, "keys", l);  // before scoring: the error names the element
    const LayerQueries* lq = queries ? &(*queries)[static_cast<size_t>(l)] : nullptr;
    auto scores = select::score_layer(kv.keys, positions.data(), lq, so, softmax_scale);
    out.token_scores[static_cast<size_t>(l)] = select::aggregate_heads(scores, config_.head_aggregation);
    if (spread) out.layer_scores[static_cast<size_t>(l)] = std::move(scores);
  });
  if (spread) out.spread_counts = spread_evictions(out.token_scores, chunk_eviction_options(config_, before, n));
  return out;
}

CompressedKV KVCompressor::compress(const SequenceKV& prefill, const std::vector<LayerQueries>* queries,
                                    Executor* executor) const {
  if (config_.rate_budget <= 0.0 && config_.index_budget <= 0.0) {
    CompressedKV cache(codecs_);
    extend(cache, prefill, queries, executor);
    return cache;
  }
  // Rate allocation: this prefill's per-layer codes, recorded in the cache's own layout. With
  // eviction spread over layers the layers keep different numbers of tokens: the chunk is scored
  // first, and each layer's bits weigh in the budget by the tokens it codes (kept, less the
  // fp16-pinned sinks and tier, which every layer has alike).
  const std::vector<int32_t> pos = checked_chunk_positions(prefill, queries, shape_.n_layers);
  const int64_t n = prefill.tokens();
  const bool spread = config_.eviction_rate > 0.0 && config_.layer_adaptive_eviction && n > 0;
  std::unique_ptr<ChunkScores> scored;
  std::vector<int64_t> layer_tokens;
  if (spread) {
    scored = std::make_unique<ChunkScores>(
        score_chunk(prefill, queries, executor, pos, codecs_->layout().effective_softmax_scale(), 0, true));
    // What extend pins in every kept set: the sinks of a first chunk (with fp16_sinks) and the
    // fp16 tier; the code tier's tokens too (in a layer whose codes the tier does not raise they
    // stay in its codes: a weight, not an exact count).
    const int64_t pinned = (config_.fp16_sinks ? chunk_eviction_options(config_, 0, n).sinks : 0) +
                           select::tier_count(n, config_.fp16_tier + config_.code_tier);
    for (int64_t evicted : scored->spread_counts) layer_tokens.push_back(std::max<int64_t>(n - evicted - pinned, 0));
  }
  const Sensitivities s = layer_sensitivities(prefill, queries, executor, pos);
  const std::vector<select::RateOption>& options = select::block_rate_options(shape_.head_dim);
  // The chunk compressed with given per-layer codes (extend_scored consumes the scores: a copy each).
  auto compress_with = [&](const std::vector<LayerRate>& rates) {
    Config allocated = config_;
    allocated.layer_rates = rates;
    allocated.rate_budget = 0.0;
    allocated.index_budget = 0.0;
    CompressedKV cache(std::make_shared<const CacheCodecs>(make_layout(allocated, shape_), *codecs_));
    std::unique_ptr<ChunkScores> copy = scored ? std::make_unique<ChunkScores>(*scored) : nullptr;
    extend_scored(cache, prefill, queries, executor, copy.get(), pos);
    return cache;
  };
  if (config_.index_budget > 0.0)
    return compress_with(select::allocate_rates(s.sensitivity, options, config_.index_budget, s.fixed, s.fixed_rate,
                                                layer_tokens));

  // Bits per element as bytes() counts them. Everything but the index bits (gains, means,
  // positions, the fp16 window, sinks and tiers, the descriptor) is fixed by the chunk's tokens
  // and the configuration, not by the codes chosen: a first pass at the cheapest codes measures
  // it and each free layer's coded vectors; the budget less that is what the indices may spend.
  std::vector<LayerRate> cheapest(static_cast<size_t>(shape_.n_layers));
  for (size_t l = 0; l < cheapest.size(); ++l)
    cheapest[l] = s.fixed[l] ? s.fixed_rate[l] : LayerRate{options.front().codec, options.front().codec};
  CompressedKV probe = compress_with(cheapest);
  if (n == 0) return probe;
  const double elements = static_cast<double>(n) * shape_.n_layers * shape_.n_kv_heads * shape_.head_dim * 2;
  std::vector<int64_t> coded(static_cast<size_t>(shape_.n_layers), 0);
  double coded_elements = 0.0;  // keys and values of the free layers' coded vectors
  for (int l = 0; l < shape_.n_layers; ++l) {
    if (s.fixed[static_cast<size_t>(l)]) continue;
    for (int h = 0; h < shape_.n_kv_heads; ++h) coded[static_cast<size_t>(l)] += probe.coded_tokens(l, h);
    coded_elements += 2.0 * static_cast<double>(coded[static_cast<size_t>(l)]) * shape_.head_dim;
  }
  const double probe_bits = 8.0 * static_cast<double>(probe.bytes());
  const double side_bits = probe_bits - options.front().bits * coded_elements;
  const double budget_bits = config_.rate_budget * elements;
  if (probe_bits > budget_bits) {
    const double minimum = std::ceil(probe_bits / elements * 1e4) / 1e4;  // printed rounded up: it is met
    detail::fail("compress: budget={} bits per element cannot be met by this chunk of {} tokens: at that length the "
                 "cache needs at least {:.4f} bits per element ({:.4f} of them fp16 window, sinks, tiers, gains, means, "
                 "positions and descriptor, which every code choice pays; the rest the cheapest codes, {}). Accepted: "
                 "a budget of at least {:.4f} for this length, a longer chunk (the side data's share falls with "
                 "length), or index_budget= to budget the index bits alone",
                 config_.rate_budget, n, minimum, side_bits / elements, quant::to_string(options.front().codec),
                 minimum);
  }
  // Index bits per coded element the budget leaves; a chunk that codes nothing meets any budget
  // its side data meets, and gets the dearest codes (for the tokens appended later).
  double index_bits = coded_elements > 0.0 ? (budget_bits - side_bits) / coded_elements : options.back().bits;
  std::vector<int64_t> weights(coded);
  if (coded_elements <= 0.0) weights.clear();
  // Without a code tier the side data does not depend on the codes and the first allocation is
  // the answer. With one, a layer whose codes reach the tier's rates codes its promoted tokens in
  // its own stream (CacheLayout::layer_has_code_tier), which moves bytes between the side data and
  // the codes: then the bytes measured steer a few more tries, and the largest cache within the
  // budget is kept (the cheapest codes' always is).
  CompressedKV best = std::move(probe);
  double best_bits = probe_bits;
  std::vector<std::vector<LayerRate>> tried{cheapest};
  auto same_rates = [](const std::vector<LayerRate>& a, const std::vector<LayerRate>& b) {
    for (size_t l = 0; l < a.size(); ++l)
      if (a[l].key != b[l].key || a[l].value != b[l].value) return false;
    return true;
  };
  for (int attempt = 0; attempt < 4; ++attempt) {
    index_bits = std::min<double>(index_bits, options.back().bits);
    if (index_bits < options.front().bits) break;
    const std::vector<LayerRate> rates =
        select::allocate_rates(s.sensitivity, options, index_bits, s.fixed, s.fixed_rate, weights);
    if (std::any_of(tried.begin(), tried.end(), [&](const auto& t) { return same_rates(t, rates); })) break;
    tried.push_back(rates);
    CompressedKV cache = compress_with(rates);
    const double bits = 8.0 * static_cast<double>(cache.bytes());
    const double mean = select::mean_index_bits(rates, options, s.fixed, weights);
    if (coded_elements <= 0.0) {
      if (bits <= budget_bits) best = std::move(cache);
      break;
    }
    // Spend what is left, or give back what is over, at the measured rate.
    index_bits = mean + (budget_bits - bits) / coded_elements;
    if (bits <= budget_bits) {
      if (bits > best_bits) {
        best = std::move(cache);
        best_bits = bits;
      }
    } else {
      index_bits = std::min(index_bits, mean - 1e-9);
    }
  }
  return best;
}

std::vector<CompressedKV> KVCompressor::compress_batch(const std::vector<SequenceKV>& batch,
                                                       const std::vector<std::vector<LayerQueries>>* queries) const {
  require(queries == nullptr || queries->size() == batch.size(),
          "compress_batch: one query set per sequence is required");
  std::vector<CompressedKV> out;
  out.reserve(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) out.push_back(compress(batch[b], queries ? &(*queries)[b] : nullptr));
  return out;
}

std::string KVCompressor::layout_difference(const CacheLayout& layout) const {
  CacheLayout mine = codecs_->layout();
  // With a rate budget every cache has its own per-layer codes: each must be one the budget may
  // choose for that layer (a protected layer's own, else one of the block rate options); the
  // rest must match.
  if ((config_.rate_budget > 0.0 || config_.index_budget > 0.0) && layout.n_layers == mine.n_layers &&
      layout.key_codec.size() == mine.key_codec.size() && layout.value_codec.size() == mine.value_codec.size()) {
    const auto& options = select::block_rate_options(shape_.head_dim);
    auto allowed = [&](quant::Codec c, quant::Codec protected_codec, bool is_fixed) {
      if (is_fixed) return c == protected_codec;
      return std::any_of(options.begin(), options.end(), [&](const select::RateOption& o) { return o.codec == c; });
    };
    for (int l = 0; l < mine.n_layers; ++l) {
      const LayerRate r = config_.layer_rate(l, mine.n_layers);
      const bool is_fixed = r.key == quant::Codec::kFp16 && r.value == quant::Codec::kFp16;
      const size_t i = static_cast<size_t>(l);
      if (!allowed(layout.key_codec[i], r.key, is_fixed) || !allowed(layout.value_codec[i], r.value, is_fixed))
        return fmt::format("key_codec[{}] / value_codec[{}] {} / {}: not a code the budget chooses for that layer", l,
                           l, quant::to_string(layout.key_codec[i]), quant::to_string(layout.value_codec[i]));
      mine.key_codec[i] = layout.key_codec[i];
      mine.value_codec[i] = layout.value_codec[i];
    }
  }
  return container::layout_difference(layout, mine);
}

void KVCompressor::check_cache(const CompressedKV& cache, const char* what) const {
  detail::require(cache.valid(), "{}: the cache is empty (default-constructed)", what);
  if (cache.shared_codecs() == codecs_) return;
  // A cache read back from a container carries codecs of its own: equal layouts are the same codec.
  const std::string diff = layout_difference(cache.layout());
  detail::require(diff.empty(), "{}: the cache was made with another layout ({})", what, diff);
}

void KVCompressor::extend(CompressedKV& cache, const SequenceKV& chunk, const std::vector<LayerQueries>* queries,
                          Executor* executor) const {
  check_cache(cache, "extend");
  extend_scored(cache, chunk, queries, executor, nullptr, checked_chunk_positions(chunk, queries, shape_.n_layers));
}

void KVCompressor::extend_scored(CompressedKV& cache, const SequenceKV& chunk, const std::vector<LayerQueries>* queries,
                                 Executor* executor, ChunkScores* scored, const std::vector<int32_t>& pos) const {
  const int64_t n = chunk.tokens();
  const int64_t H = shape_.n_kv_heads, d = shape_.head_dim;
  const select::ScorerOptions so = config_.scorer_options();
  const bool evict = config_.eviction_rate > 0.0 && n > 0;
  const int64_t tier = select::tier_count(n, config_.fp16_tier);  // fp16-tier tokens per kept set
  // Code-tier tokens per kept set: the next ones by score (counted so both tiers together round once).
  const int64_t code_tier = select::tier_count(n, config_.fp16_tier + config_.code_tier) - tier;
  const bool score = evict || tier > 0 || code_tier > 0;
  auto eviction_options = [&](int64_t before) { return chunk_eviction_options(config_, before, n); };

  // Shared selection (one kept set and fp16 tier for every layer, from the mean over layers of
  // each layer's normalized per-token scores) and eviction spread over layers (per-layer evicted
  // counts from the same normalized scores) need every layer's scores before any layer is
  // planned. Layers are scored in parallel and combined in layer order, so the result does not
  // depend on the executor; like the rest of the plan it is made before the cache changes.
  const bool spread = evict && config_.layer_adaptive_eviction;
  std::vector<int64_t> shared_set, shared_tier, shared_code_tier;
  std::vector<select::LayerScores> spread_scores;  // spread: each layer's scores, reused below
  std::vector<int64_t> spread_counts;              // spread: tokens each layer evicts
  if ((config_.shared_selection && score) || spread) {
    const char* mode = spread ? "eviction spread over layers" : "shared selection";
    const int64_t before = cache.layer(0).original_tokens;
    for (int l = 1; l < shape_.n_layers; ++l)
      detail::require(cache.layer(l).original_tokens == before,
                      "compress: {} needs every layer at the same length; layer {} has {} tokens, layer 0 {}", mode,
                      l, cache.layer(l).original_tokens, before);
    ChunkScores fresh;  // this call's own scores, unless the caller scored the chunk already
    ChunkScores& chunk_scores = scored != nullptr ? *scored : fresh;
    if (scored == nullptr)
      fresh = score_chunk(chunk, queries, executor, pos, cache.layout().effective_softmax_scale(), before, spread);
    const std::vector<std::vector<float>>& token_scores = chunk_scores.token_scores;
    const select::EvictionOptions eo = eviction_options(before);
    if (spread) {
      spread_scores = std::move(chunk_scores.layer_scores);
      spread_counts = chunk_scores.spread_counts;
    } else {
      std::vector<double> acc(static_cast<size_t>(n), 0.0);
      for (int l = 0; l < shape_.n_layers; ++l) {
        const std::vector<double> share = normalized_scores(token_scores[static_cast<size_t>(l)], l, mode);
        for (int64_t t = 0; t < n; ++t) acc[static_cast<size_t>(t)] += share[static_cast<size_t>(t)];
      }
      std::vector<float> mean(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t)
        mean[static_cast<size_t>(t)] = static_cast<float>(acc[static_cast<size_t>(t)] / shape_.n_layers);
      if (evict) {
        shared_set = select::select_tokens(mean, eo);
      } else {
        shared_set.resize(static_cast<size_t>(n));
        for (int64_t t = 0; t < n; ++t) shared_set[static_cast<size_t>(t)] = t;
      }
      shared_tier = select::select_tier(mean, shared_set, tier, eo);
      if (code_tier > 0) shared_code_tier = without_tokens(select::select_tier(mean, shared_set, tier + code_tier, eo), shared_tier);
    }
  }

  // Plan every layer (validation, selection, fp16 rounding, the codes of every flush) before the
  // cache changes: a failure in any layer leaves the cache exactly as it was. The scoring pass
  // of shared selection and of the spread has checked every layer's keys already.
  const bool keys_checked = (config_.shared_selection && score) || spread;
  std::vector<std::unique_ptr<detail::LayerWrite>> writes(static_cast<size_t>(shape_.n_layers));
  run_tasks(executor, shape_.n_layers, [&](int64_t li) {
    const int l = static_cast<int>(li);
    const LayerKV& kv = chunk.layers[static_cast<size_t>(l)];
    if (!keys_checked) check_layer_view(kv.keys, shape_, n, "keys", l);
    check_layer_view(kv.values, shape_, n, "values", l);
    // Evicted tokens too: bad input is an error, never dropped.
    if (!keys_checked) require_finite_layer(kv.keys, "keys", l);
    require_finite_layer(kv.values, "values", l);
    const auto& ld = cache.layer(l);
    if (n > 0) {
      const int64_t last = cache.last_position(l);
      detail::require(last < pos[0], "extend: the chunk's first position {} does not follow position {} stored in layer {}",
                      pos[0], last, l);
    }
    select::EvictionOptions eo = eviction_options(ld.original_tokens);
    if (spread) eo.evict_count = spread_counts[static_cast<size_t>(l)];
    const int64_t sinks_here = eo.sinks;
    // The kept sets (chunk indices), and per set its fp16-tier and code-tier tokens.
    std::vector<std::vector<int64_t>> sets, tiers, code_tiers;
    const bool layer_code_tier = code_tier > 0 && cache.layout().layer_has_code_tier(l);
    if (score && config_.shared_selection) {
      sets.assign(1, shared_set);
      tiers.assign(1, shared_tier);
      code_tiers.assign(1, layer_code_tier ? shared_code_tier : std::vector<int64_t>{});
    } else {
      select::LayerScores scores;
      if (spread) {
        scores = std::move(spread_scores[static_cast<size_t>(l)]);  // this task's own entry
      } else if (score) {
        const LayerQueries* lq = queries ? &(*queries)[static_cast<size_t>(l)] : nullptr;
        scores = select::score_layer(kv.keys, pos.data(), lq, so, cache.layout().effective_softmax_scale());
      }
      if (evict) {
        sets = select::select_layer(scores, eo);
      } else {
        std::vector<int64_t> all(static_cast<size_t>(n));
        for (int64_t t = 0; t < n; ++t) all[static_cast<size_t>(t)] = t;
        sets.assign(config_.per_head_selection ? static_cast<size_t>(H) : 1, all);
      }
      tiers.resize(sets.size());
      code_tiers.resize(sets.size());
      if (tier > 0 || layer_code_tier)
        for (size_t s = 0; s < sets.size(); ++s) {
          const std::vector<float> row =
              sets.size() == 1 ? select::aggregate_heads(scores, config_.head_aggregation)
                               : std::vector<float>(scores.scores.begin() + static_cast<int64_t>(s) * n,
                                                    scores.scores.begin() + static_cast<int64_t>(s + 1) * n);
          tiers[s] = select::select_tier(row, sets[s], tier, eo);
          if (layer_code_tier) code_tiers[s] = without_tokens(select::select_tier(row, sets[s], tier + code_tier, eo), tiers[s]);
        }
    }
    // The chunk's tokens `chosen[s]` of every position set: positions, and per KV head the rows
    // (fp16-rounded) of the heads that use the set.
    auto load_sets = [&](const std::vector<std::vector<int64_t>>& chosen, std::vector<std::vector<int32_t>>& positions,
                         std::vector<std::vector<uint16_t>>& keys, std::vector<std::vector<uint16_t>>& values) {
      positions.resize(chosen.size());
      keys.resize(static_cast<size_t>(H));
      values.resize(static_cast<size_t>(H));
      for (size_t s = 0; s < chosen.size(); ++s) {
        for (int64_t t : chosen[s]) positions[s].push_back(pos[static_cast<size_t>(t)]);
        const int h_begin = chosen.size() == 1 ? 0 : static_cast<int>(s);
        const int h_end = chosen.size() == 1 ? static_cast<int>(H) : static_cast<int>(s) + 1;
        for (int h = h_begin; h < h_end; ++h) {
          auto& kr = keys[static_cast<size_t>(h)];
          auto& vr = values[static_cast<size_t>(h)];
          kr.resize(chosen[s].size() * static_cast<size_t>(d));
          vr.resize(kr.size());
          for (size_t i = 0; i < chosen[s].size(); ++i) {
            load_fp16_rounded(kv.keys, chosen[s][i], h, &kr[i * static_cast<size_t>(d)], "keys");
            load_fp16_rounded(kv.values, chosen[s][i], h, &vr[i * static_cast<size_t>(d)], "values");
          }
        }
      }
    };
    // The code tier leaves the kept sets: its tokens go to their own stream (LayerInput::tier_*).
    detail::LayerInput in;
    if (layer_code_tier) {
      load_sets(code_tiers, in.tier_positions, in.tier_keys, in.tier_values);
      for (size_t s = 0; s < sets.size(); ++s) sets[s] = without_tokens(sets[s], code_tiers[s]);
    }
    in.given = n;
    load_sets(sets, in.positions, in.keys, in.values);
    // Pinned in fp16: the sinks (with fp16_sinks) and the fp16 tier, as indices into each set.
    // Every set pins as many: the sinks and the recent window are in every kept set, and every
    // kept set has as many tokens, so as many compete for the tier.
    in.pinned.resize(sets.size());
    for (size_t s = 0; s < sets.size(); ++s) {
      size_t j = 0;
      for (size_t i = 0; i < sets[s].size(); ++i) {
        const int64_t t = sets[s][i];
        while (j < tiers[s].size() && tiers[s][j] < t) ++j;
        const bool in_tier = j < tiers[s].size() && tiers[s][j] == t;
        if ((config_.fp16_sinks && t < sinks_here) || in_tier) in.pinned[s].push_back(static_cast<int64_t>(i));
      }
    }
    // Query-weighted keys: the observation queries' energy per channel and KV head (mean over the
    // window and the head's query group), kept until the first flush turns it into scales.
    const bool scales_pending = ld.query_energy.empty() && ld.heads[0].key_channel_scale.empty() && ld.positions[0].empty();
    if (config_.query_weighted_keys && queries != nullptr && scales_pending &&
        cache.codecs().key_quantizer(l).codec() != quant::Codec::kFp16) {
      const TensorView& qv = (*queries)[static_cast<size_t>(l)].queries;
      const int64_t G = shape_.n_q_heads / H;
      detail::require(qv.heads() == shape_.n_q_heads && qv.head_dim() == d && qv.tokens() >= 1,
                      "compress: layer {} queries must be [window >= 1, {}, {}] for query-weighted keys", l,
                      shape_.n_q_heads, d);
      in.query_energy.assign(static_cast<size_t>(H), std::vector<float>(static_cast<size_t>(d), 0.f));
      std::vector<double> acc(static_cast<size_t>(d));
      float qbuf[512];
      for (int64_t h = 0; h < H; ++h) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t w = 0; w < qv.tokens(); ++w)
          for (int64_t g = 0; g < G; ++g) {
            qv.load(w, h * G + g, qbuf);
            for (int64_t i = 0; i < d; ++i) acc[static_cast<size_t>(i)] += static_cast<double>(qbuf[i]) * qbuf[i];
          }
        auto& e = in.query_energy[static_cast<size_t>(h)];
        for (int64_t i = 0; i < d; ++i)
          e[static_cast<size_t>(i)] = static_cast<float>(acc[static_cast<size_t>(i)] / static_cast<double>(qv.tokens() * G));
        cache.codecs().average_rope_pairs(e.data());
        for (float x : e) detail::require(std::isfinite(x), "compress: non-finite observation queries in layer {}", l);
      }
    }
    writes[static_cast<size_t>(l)] = std::make_unique<detail::LayerWrite>(cache, l, std::move(in));
  });
  for (int l = 0; l < shape_.n_layers; ++l) writes[static_cast<size_t>(l)]->reserve(cache, /*exact=*/true);
  for (int l = 0; l < shape_.n_layers; ++l) writes[static_cast<size_t>(l)]->commit(cache);
}

void KVCompressor::drop_before(CompressedKV& cache, int32_t position) const {
  check_cache(cache, "drop_before");
  keep_positions(cache, position, std::numeric_limits<int64_t>::max());
}

void KVCompressor::append(CompressedKV& cache, int layer, const float* k, const float* v, int32_t position) const {
  check_cache(cache, "append");
  require(k != nullptr && v != nullptr, "append: null key or value");
  const auto& ld = cache.layer(layer);
  const int64_t H = shape_.n_kv_heads, d = shape_.head_dim;
  const int64_t last = cache.last_position(layer);
  detail::require(position >= 0 && position > last,
                  "append: position {} must be >= 0 and follow position {} stored in layer {}", position, last, layer);
  const TensorView kv_k = TensorView::nhd(k, DType::kF32, 1, H, d);
  const TensorView kv_v = TensorView::nhd(v, DType::kF32, 1, H, d);
  detail::LayerInput in;
  in.given = 1;
  in.positions.assign(ld.positions.size(), std::vector<int32_t>{position});
  in.keys.assign(static_cast<size_t>(H), std::vector<uint16_t>(static_cast<size_t>(d)));
  in.values.assign(static_cast<size_t>(H), std::vector<uint16_t>(static_cast<size_t>(d)));
  for (int64_t h = 0; h < H; ++h) {  // validate everything before changing the cache
    load_fp16_rounded(kv_k, 0, h, in.keys[static_cast<size_t>(h)].data(), "append keys");
    load_fp16_rounded(kv_v, 0, h, in.values[static_cast<size_t>(h)].data(), "append values");
  }
  const bool sink = config_.fp16_sinks && ld.original_tokens < config_.sinks;
  in.pinned.assign(ld.positions.size(), sink ? std::vector<int64_t>{0} : std::vector<int64_t>{});
  detail::LayerWrite write(cache, layer, std::move(in));
  write.reserve(cache, /*exact=*/false);
  write.commit(cache);
}

// LayerWrite's flush rule (layer_write.cpp) for one more unpinned token: a set flushes once its
// unpinned window tokens reach residual_length + flush_block (before its first flush with
// centring, mean_tokens if more).
bool KVCompressor::append_flushes(const CompressedKV& cache, int layer) const {
  check_cache(cache, "append_flushes");
  const auto& ld = cache.layer(layer);
  if (config_.fp16_sinks && ld.original_tokens < config_.sinks) return false;  // a sink: pinned, never coded
  const CacheLayout& L = cache.layout();
  const bool coded = L.key_codec[static_cast<size_t>(layer)] != quant::Codec::kFp16 ||
                     L.value_codec[static_cast<size_t>(layer)] != quant::Codec::kFp16;
  for (size_t s = 0; s < ld.positions.size(); ++s) {
    const int64_t unpinned = static_cast<int64_t>(ld.window_positions[s].size()) - ld.pinned + 1;
    int64_t threshold = static_cast<int64_t>(L.residual_length) + L.flush_block;
    if (L.center && coded && ld.positions[s].empty()) threshold = std::max<int64_t>(threshold, L.mean_tokens);
    if (unpinned >= threshold) return true;
  }
  return false;
}

void KVCompressor::attend(const CompressedKV& cache, int layer, const float* q, int32_t position, float* out) const {
  require(cache.valid() && cache.layout().n_layers == shape_.n_layers, "attend: the cache does not fit this compressor");
  const int64_t last = cache.last_position(layer);
  if (last > position)
    detail::fail("attend: query position {} precedes position {} stored in layer {}", position, last, layer);
  e8kv::attend(cache, layer, q, out);
}

}  // namespace e8kv
