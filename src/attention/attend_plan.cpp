// The CPU decode attention's plan (attend_internal.hpp): what a layer's chunks read, and each
// query head rotated once into the bases of the codes it is scored against.
#include <algorithm>
#include <vector>

#include "attention/attend_internal.hpp"
#include "detail/require.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"

namespace e8kv::attention {

Rows table_rows(Codec c) {
  switch (c) {
    case Codec::kE8P: return Rows::kE8p;
    case Codec::kRvq3: return Rows::kRvq3;
    case Codec::kRvq4: return Rows::kRvq4;
    case Codec::kFp16: return Rows::kFp16;
    default: return Rows::kFp32;  // decoded ahead into float rows
  }
}

LayerPlan plan_layer(const CompressedKV& cache, int layer) {
  require(cache.valid(), "attend: the cache is empty (default-constructed)");
  const CacheLayout& L = cache.layout();
  detail::require(layer >= 0 && layer < L.n_layers, "attend: layer {} out of range [0, {})", layer, L.n_layers);
  const auto& codecs = cache.codecs();
  LayerPlan p;
  p.cache = &cache;
  p.L = &L;
  p.layer = layer;
  p.H = L.n_kv_heads;
  p.G = L.n_q_heads / L.n_kv_heads;
  p.d = L.head_dim;
  p.blocks = L.head_dim / 8;
  // The value kernels hold two blocks at a time (every supported head_dim is a multiple of 16).
  detail::require(p.blocks % 2 == 0, "attend: head_dim {} is not a multiple of 16", p.d);
  p.pairs = codecs.rope().rotary_dim() / 2;
  p.P = (p.pairs + 7) / 8 * 8;
  p.frame = L.key_frame;
  p.key_codec = L.key_codec[static_cast<size_t>(layer)];
  p.value_codec = L.value_codec[static_cast<size_t>(layer)];
  p.key_code_bytes = codecs.key_quantizer(layer).code_bytes();
  p.value_code_bytes = codecs.value_quantizer(layer).code_bytes();
  p.scale = L.effective_softmax_scale();
  const bool key_coded = p.key_codec != Codec::kFp16;
  p.key_in_engine_basis = !key_coded || p.frame == KeyFrame::kPreRope;
  p.key_rows = p.key_in_engine_basis && key_coded ? Rows::kFp32 : table_rows(p.key_codec);
  p.residual_mean = key_coded && p.frame == KeyFrame::kRopeResidual;
  p.value_in_engine_basis = p.value_codec == Codec::kFp16;
  p.value_rows = table_rows(p.value_codec);
  auto input_factor = [](Codec c) {
    switch (c) {
      case Codec::kE8P: return codebook::E8P::kInverseInputScale;
      case Codec::kRvq3: return codebook::Rvq3::kInverseInputScale;
      case Codec::kRvq4: return codebook::Rvq4::kInverseInputScale;
      default: return 1.0f;  // decoded ahead with Code::decode: already in unit scale
    }
  };
  p.query_factor = input_factor(p.key_codec);
  p.value_factor = input_factor(p.value_codec);
  p.tier_key_codec = L.tier_key_codec;
  p.tier_centred = L.tier_centered;
  p.tier_value_codec = L.tier_value_codec;
  p.tier_key_rows = table_rows(p.tier_key_codec);
  p.tier_value_rows = table_rows(p.tier_value_codec);
  p.tier_query_factor = input_factor(p.tier_key_codec);
  p.tier_value_factor = input_factor(p.tier_value_codec);
  p.tier_key_code_bytes = codecs.tier_code_bytes(KvKind::kKey);
  p.tier_value_code_bytes = codecs.tier_code_bytes(KvKind::kValue);
  int64_t max_coded = 0, max_tier = 0, max_window = 0;
  for (int h = 0; h < p.H; ++h) {
    p.coded.push_back(cache.coded_tokens(layer, h));
    p.tier.push_back(cache.tier_tokens(layer, h));
    p.window.push_back(cache.window_tokens(layer, h));
    max_coded = std::max(max_coded, p.coded.back());
    max_tier = std::max(max_tier, p.tier.back());
    max_window = std::max(max_window, p.window.back());
  }
  detail::require(max_tier == 0 || L.layer_has_code_tier(layer), "attend: layer {} stores {} tier tokens without a code tier",
                  layer, max_tier);
  p.coded_chunks = ceil_div(max_coded, kChunkTokens);
  p.tier_chunks = ceil_div(max_tier, kChunkTokens);
  p.window_chunks = ceil_div(max_window, kChunkTokens);
  if (p.frame == KeyFrame::kPreRope && key_coded)
    for (int h = 0; h < p.H; ++h)
      for (int32_t pos : cache.positions(layer, h))
        detail::require(pos >= 0, "attend: RoPE position must be >= 0, got {}", pos);
  return p;
}
HeadQuery prepare_head_query(const LayerPlan& p, int h, const float* q_head) {
  HeadQuery hq;
  hq.q = q_head;
  hq.base.assign(static_cast<size_t>(p.G), 0.f);
  const int d = p.d, G = p.G;
  const auto& codecs = p.cache->codecs();
  if (p.tier_chunks > 0) {  // tier keys: k̂ = M_t + Rᵀ·(g·ĉ), post-RoPE, so q·k̂ = q·M_t + g·(R·q)·ĉ
    hq.qt_tier.resize(static_cast<size_t>(G * d));
    for (int g = 0; g < G; ++g) {
      float* qt = hq.qt_tier.data() + static_cast<size_t>(g) * d;
      codecs.rotation(p.layer, h, 0).forward(q_head + g * d, qt);
      for (int i = 0; i < d; ++i) qt[i] *= p.tier_query_factor;
    }
  }
  if (p.key_in_engine_basis) return hq;
  const auto& hd = p.cache->layer(p.layer).heads[static_cast<size_t>(h)];
  std::vector<float> mu(static_cast<size_t>(d), 0.f), inv_scale(static_cast<size_t>(d), 1.f), tmp(static_cast<size_t>(d));
  if (!hd.key_mean.empty()) fp16_bits_to_floats(hd.key_mean.data(), mu.data(), mu.size());
  for (int i = 0; i < d && !hd.key_channel_scale.empty(); ++i)
    inv_scale[static_cast<size_t>(i)] = 1.0f / fp16_bits_to_float(hd.key_channel_scale[static_cast<size_t>(i)]);
  hq.qt.resize(static_cast<size_t>(G * d));
  const auto& rotation = codecs.rotation(p.layer, h, 0);
  for (int g = 0; g < G; ++g) {
    const float* q = q_head + g * d;
    for (int i = 0; i < d; ++i) tmp[static_cast<size_t>(i)] = q[i] * inv_scale[static_cast<size_t>(i)];
    float* qt = hq.qt.data() + static_cast<size_t>(g) * d;
    rotation.forward(tmp.data(), qt);
    for (int i = 0; i < d; ++i) qt[i] *= p.query_factor;
  }
  if (hd.key_mean.empty()) return hq;
  if (p.frame == KeyFrame::kPostRope) {
    for (int g = 0; g < G; ++g) {
      float s = 0.f;
      for (int i = 0; i < d; ++i) s += q_head[g * d + i] * mu[static_cast<size_t>(i)];
      hq.base[static_cast<size_t>(g)] = s;
    }
    return hq;
  }
  // RoPE residual: q·R_t·μ = Σ_p cos·(q_a·μ_a + q_b·μ_b) + sin·(q_b·μ_a − q_a·μ_b) over the
  // rotary pairs (a, b), plus q·μ over the channels RoPE leaves alone.
  const int rotary = 2 * p.pairs;
  const auto layout = codecs.rope().params().layout;
  hq.mean_coeffs.assign(static_cast<size_t>(G) * 2 * p.P, 0.f);  // padded pairs stay 0
  for (int g = 0; g < G; ++g) {
    const float* q = q_head + g * d;
    float* A = hq.mean_coeffs.data() + static_cast<size_t>(g) * 2 * p.P;
    float* B = A + p.P;
    for (int pr = 0; pr < p.pairs; ++pr) {
      int a = 0, b = 0;
      transform::rope_pair_indices(layout, rotary, pr, a, b);
      A[pr] = q[a] * mu[static_cast<size_t>(a)] + q[b] * mu[static_cast<size_t>(b)];
      B[pr] = q[b] * mu[static_cast<size_t>(a)] - q[a] * mu[static_cast<size_t>(b)];
    }
    float s = 0.f;
    for (int i = rotary; i < d; ++i) s += q[i] * mu[static_cast<size_t>(i)];
    hq.base[static_cast<size_t>(g)] = s;
  }
  return hq;
}
}  // namespace e8kv::attention
