// KVCompressor glue: configuration, presets, compress / extend / append.
#include "e8kv/compressor.hpp"

#include <cmath>
#include <map>
#include <sstream>
#include <string>

#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"

namespace e8kv {

// ---- KVCompressor ----------------------------------------------------------------------------

KVCompressor::KVCompressor(const ModelShape& shape, const Config& config) : shape_(shape), config_(config) {
  config_.validate(shape_);
  CacheLayout L;
  L.n_layers = shape.n_layers;
  L.n_kv_heads = shape.n_kv_heads;
  L.n_q_heads = shape.n_q_heads;
  L.head_dim = shape.head_dim;
  for (int l = 0; l < shape.n_layers; ++l) {
    const LayerRate r = config_.layer_rate(l, shape.n_layers);
    L.key_codec.push_back(r.key);
    L.value_codec.push_back(r.value);
  }
  L.key_gain = config_.key_gain;
  L.value_gain = config_.value_gain;
  L.key_scale = config_.key_scale;
  L.value_scale = config_.value_scale;
  L.key_frame = config_.key_frame;
  L.rope = config_.rope;
  L.rope.head_dim = shape.head_dim;
  L.rotation_seed = config_.rotation_seed;
  L.per_head_positions = config_.per_head_selection;
  L.residual_length = config_.residual_length;
  L.flush_block = config_.flush_block;
  L.center = config_.center;
  L.mean_tokens = config_.mean_tokens;
  L.query_weighted_keys = config_.query_weighted_keys;
  L.gain_bits = config_.gain_bits;
  L.softmax_scale = config_.softmax_scale;
  codecs_ = std::make_shared<const CacheCodecs>(std::move(L));
}

namespace {

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
  floats_to_fp16_bits(src, dst, d);
  uint32_t special = 0;
  for (size_t i = 0; i < d; ++i) special |= static_cast<uint32_t>((dst[i] & 0x7C00u) == 0x7C00u);
  if (special == 0) return;
  for (size_t i = 0; i < d; ++i) {
    if (!std::isfinite(src[i]))
      throw Error(std::string(what) + ": non-finite value at token " + std::to_string(t) + ", head " + std::to_string(h));
    if ((dst[i] & 0x7C00u) == 0x7C00u)
      throw Error(std::string(what) + ": value " + std::to_string(src[i]) + " at token " + std::to_string(t) +
                  " exceeds the fp16 range of the cache");
  }
}

void check_layer_view(const TensorView& v, const ModelShape& s, int64_t tokens, const char* what, int layer) {
  const std::string where = std::string(what) + " of layer " + std::to_string(layer);
  require(v.tokens() == tokens, where + ": token count " + std::to_string(v.tokens()) + " differs from keys' " +
                                    std::to_string(tokens));
  require(v.heads() == s.n_kv_heads, where + ": " + std::to_string(v.heads()) + " heads, model has " +
                                         std::to_string(s.n_kv_heads) + " KV heads");
  require(v.head_dim() == s.head_dim, where + ": head_dim " + std::to_string(v.head_dim()) + ", model has " +
                                          std::to_string(s.head_dim));
}

}  // namespace

CompressedKV KVCompressor::compress(const SequenceKV& prefill, const std::vector<LayerQueries>* queries) const {
  CompressedKV cache(codecs_);
  extend(cache, prefill, queries);
  return cache;
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

void KVCompressor::extend(CompressedKV& cache, const SequenceKV& chunk, const std::vector<LayerQueries>* queries) const {
  require(cache.valid() && cache.shared_codecs() == codecs_, "extend: the cache was not made by this compressor");
  require(static_cast<int>(chunk.layers.size()) == shape_.n_layers,
          "compress: " + std::to_string(chunk.layers.size()) + " layers given, model has " + std::to_string(shape_.n_layers));
  require(queries == nullptr || static_cast<int>(queries->size()) == shape_.n_layers,
          "compress: queries must hold one LayerQueries per layer");
  const int64_t n = chunk.tokens();
  const int64_t H = shape_.n_kv_heads, d = shape_.head_dim;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    pos[static_cast<size_t>(t)] = chunk.position(t);
    require(pos[static_cast<size_t>(t)] >= 0, "compress: positions must be >= 0");
    require(t == 0 || pos[static_cast<size_t>(t)] > pos[static_cast<size_t>(t - 1)],
            "compress: positions must be strictly increasing");
  }
  select::ScorerOptions so;
  so.kind = config_.scorer;
  so.window = config_.obs_window;
  so.pool_kernel = config_.pool_kernel;
  so.gqa = config_.gqa_aggregation;
  so.seed = config_.scorer_seed;
  select::EvictionOptions eo;
  eo.rate = config_.eviction_rate;
  eo.sinks = config_.sinks;
  eo.recent = config_.recent_window;
  eo.per_head = config_.per_head_selection;
  eo.head_aggregation = config_.head_aggregation;
  const bool first_chunk = cache.original_tokens() == 0;
  if (!first_chunk) eo.sinks = 0;  // sinks are the sequence's first tokens, already in the cache

  for (int l = 0; l < shape_.n_layers; ++l) {
    const LayerKV& kv = chunk.layers[static_cast<size_t>(l)];
    check_layer_view(kv.keys, shape_, n, "keys", l);
    check_layer_view(kv.values, shape_, n, "values", l);
    auto& ld = cache.mutable_layer(l);
    if (n > 0) {
      const auto& last_sets = ld.window_positions[0].empty() ? ld.positions[0] : ld.window_positions[0];
      require(last_sets.empty() || pos[0] > last_sets.back(),
              "compress: chunk positions must follow the cache's last position");
    }
    std::vector<std::vector<int64_t>> sets;
    if (config_.eviction_rate > 0.0 && n > 0) {
      const LayerQueries* lq = queries ? &(*queries)[static_cast<size_t>(l)] : nullptr;
      const auto scores = select::score_layer(kv.keys, pos.data(), lq, so, codecs_->layout().effective_softmax_scale());
      sets = select::select_layer(scores, eo);
    } else {
      std::vector<int64_t> all(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) all[static_cast<size_t>(t)] = t;
      sets.assign(config_.per_head_selection ? static_cast<size_t>(H) : 1, all);
    }
    // New tokens enter the residual window, then whole blocks are flushed into codes: the same
    // path append() takes, so a prefix plus appends equals compressing everything at once.
    for (size_t s = 0; s < sets.size(); ++s) {
      for (int64_t t : sets[s]) ld.window_positions[s].push_back(pos[static_cast<size_t>(t)]);
      const int h_begin = sets.size() == 1 ? 0 : static_cast<int>(s);
      const int h_end = sets.size() == 1 ? static_cast<int>(H) : static_cast<int>(s) + 1;
      for (int h = h_begin; h < h_end; ++h) {
        auto& hd = ld.heads[static_cast<size_t>(h)];
        const size_t w0 = hd.window_keys.size();
        hd.window_keys.resize(w0 + sets[s].size() * d);
        hd.window_values.resize(w0 + sets[s].size() * d);
        for (size_t i = 0; i < sets[s].size(); ++i) {
          load_fp16_rounded(kv.keys, sets[s][i], h, &hd.window_keys[w0 + i * d], "keys");
          load_fp16_rounded(kv.values, sets[s][i], h, &hd.window_values[w0 + i * d], "values");
        }
      }
    }
    // Query-weighted keys: the observation queries' energy per channel, per KV head (mean over
    // the window and the head's query group), until the first flush turns it into scales.
    if (first_chunk && config_.query_weighted_keys && queries != nullptr && ld.query_energy.empty() &&
        codecs_->key_quantizer(l).codec() != quant::Codec::kFp16) {
      const TensorView& qv = (*queries)[static_cast<size_t>(l)].queries;
      const int64_t G = shape_.n_q_heads / H;
      require(qv.heads() == shape_.n_q_heads && qv.head_dim() == d && qv.tokens() >= 1,
              "compress: layer " + std::to_string(l) + " queries must be [window >= 1, " +
                  std::to_string(shape_.n_q_heads) + ", " + std::to_string(d) + "] for query-weighted keys");
      ld.query_energy.assign(static_cast<size_t>(H), std::vector<float>(static_cast<size_t>(d), 0.f));
      std::vector<double> acc(static_cast<size_t>(d));
      float qbuf[512];
      for (int64_t h = 0; h < H; ++h) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t w = 0; w < qv.tokens(); ++w)
          for (int64_t g = 0; g < G; ++g) {
            qv.load(w, h * G + g, qbuf);
            for (int64_t i = 0; i < d; ++i) acc[static_cast<size_t>(i)] += static_cast<double>(qbuf[i]) * qbuf[i];
          }
        auto& e = ld.query_energy[static_cast<size_t>(h)];
        for (int64_t i = 0; i < d; ++i)
          e[static_cast<size_t>(i)] = static_cast<float>(acc[static_cast<size_t>(i)] / static_cast<double>(qv.tokens() * G));
        codecs_->average_rope_pairs(e.data());
        for (float x : e) require(std::isfinite(x), "compress: non-finite observation queries in layer " + std::to_string(l));
      }
    }
    // The first chunk's sink tokens stay in fp16 at the front of the window for good: they draw
    // most of the attention, so their logit errors cost the most.
    if (first_chunk && config_.fp16_sinks)
      for (int64_t t : sets[0])
        if (t < config_.sinks) ++ld.pinned;
    ld.original_tokens += n;
    cache.flush(l);
  }
}

void KVCompressor::append(CompressedKV& cache, int layer, const float* k, const float* v, int32_t position) const {
  require(cache.valid() && cache.shared_codecs() == codecs_, "append: the cache was not made by this compressor");
  require(k != nullptr && v != nullptr, "append: null key or value");
  auto& ld = cache.mutable_layer(layer);
  const int64_t H = shape_.n_kv_heads, d = shape_.head_dim;
  const auto& last = ld.window_positions[0].empty() ? ld.positions[0] : ld.window_positions[0];
  require(position >= 0 && (last.empty() || position > last.back()),
          "append: position " + std::to_string(position) + " must be >= 0 and follow the layer's last position");
  const TensorView kv_k = TensorView::nhd(k, DType::kF32, 1, H, d);
  const TensorView kv_v = TensorView::nhd(v, DType::kF32, 1, H, d);
  std::vector<uint16_t> kb(static_cast<size_t>(H * d)), vb(static_cast<size_t>(H * d));
  for (int64_t h = 0; h < H; ++h) {  // validate everything before changing the cache
    load_fp16_rounded(kv_k, 0, h, &kb[static_cast<size_t>(h * d)], "append keys");
    load_fp16_rounded(kv_v, 0, h, &vb[static_cast<size_t>(h * d)], "append values");
  }
  for (auto& wp : ld.window_positions) wp.push_back(position);
  for (int64_t h = 0; h < H; ++h) {
    auto& hd = ld.heads[static_cast<size_t>(h)];
    hd.window_keys.insert(hd.window_keys.end(), kb.begin() + h * d, kb.begin() + (h + 1) * d);
    hd.window_values.insert(hd.window_values.end(), vb.begin() + h * d, vb.begin() + (h + 1) * d);
  }
  ld.original_tokens += 1;
  cache.flush(layer);
}

void KVCompressor::attend(const CompressedKV& cache, int layer, const float* q, int32_t position, float* out) const {
  require(cache.valid() && cache.layout().n_layers == shape_.n_layers, "attend: the cache does not fit this compressor");
  const auto& ld = cache.layer(layer);
  for (size_t s = 0; s < ld.positions.size(); ++s) {
    const auto& last = ld.window_positions[s].empty() ? ld.positions[s] : ld.window_positions[s];
    if (!last.empty() && last.back() > position)
      throw Error("attend: query position " + std::to_string(position) + " precedes stored position " +
                  std::to_string(last.back()) + " of layer " + std::to_string(layer));
  }
  e8kv::attend(cache, layer, q, out);
}

}  // namespace e8kv
