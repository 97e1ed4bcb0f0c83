// A synthetic multi-layer KV fixture for compressor and attention tests, and the reference they
// are measured against: dense attention in double over given K/V.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "e8kv/cache/kv_view.hpp"
#include "e8kv/config.hpp"
#include "testing/synthetic_kv.hpp"

namespace e8kv::testkit {

/// The synthetic defaults (2 layers, 2 KV heads, 4 query heads, head_dim 64) with `tokens` and a
/// seed, printed so a failing run can be reproduced.
inline synth::SyntheticSpec seeded_spec(uint64_t seed, int tokens, const char* what) {
  synth::SyntheticSpec s;
  s.tokens = tokens;
  s.seed = seed;
  std::printf("%s fixture: seed %llu, %d tokens\n", what, static_cast<unsigned long long>(seed), tokens);
  return s;
}

/// The synthetic generator's spec for a model of this shape: `tokens` tokens from `seed`, the
/// generator's defaults for the rest (observation window, key bias, outliers).
inline synth::SyntheticSpec shaped_spec(int n_layers, int n_kv_heads, int n_q_heads, int head_dim, int tokens,
                                        uint64_t seed) {
  synth::SyntheticSpec s;
  s.n_layers = n_layers;
  s.n_kv_heads = n_kv_heads;
  s.n_q_heads = n_q_heads;
  s.head_dim = head_dim;
  s.tokens = tokens;
  s.seed = seed;
  return s;
}

struct Fixture {
  synth::SyntheticKV data;
  ModelShape shape;
  std::vector<LayerQueries> queries;
  SequenceKV seq;

  explicit Fixture(const synth::SyntheticSpec& spec) : data(synth::make_synthetic_kv(spec)) {
    shape = {spec.n_layers, spec.n_kv_heads, spec.n_q_heads, spec.head_dim};
    for (int l = 0; l < spec.n_layers; ++l) {
      LayerKV kv;
      kv.keys = TensorView::nhd(data.keys[l].data(), DType::kF32, spec.tokens, spec.n_kv_heads, spec.head_dim);
      kv.values = TensorView::nhd(data.values[l].data(), DType::kF32, spec.tokens, spec.n_kv_heads, spec.head_dim);
      seq.layers.push_back(kv);
      LayerQueries q;
      q.queries = TensorView::nhd(data.queries[l].data(), DType::kF32, static_cast<int64_t>(data.query_positions.size()),
                                  spec.n_q_heads, spec.head_dim);
      q.positions = data.query_positions.data();
      queries.push_back(q);
    }
  }
  const float* query(int layer, int w) const {
    return &data.queries[layer][static_cast<size_t>(w) * shape.n_q_heads * shape.head_dim];
  }
};

// Dense fp32 attention of one query token over [n, kv_heads, d] K/V, optionally fp16-rounded.
inline std::vector<float> dense_attention(const float* q, const std::vector<float>& K, const std::vector<float>& V, int64_t n,
                                   int H, int Q, int d, std::vector<std::vector<double>>* weights = nullptr) {
  std::vector<float> out(static_cast<size_t>(Q) * d, 0.f);
  if (weights) weights->assign(Q, {});
  const int G = Q / H;
  for (int qh = 0; qh < Q; ++qh) {
    const int h = qh / G;
    std::vector<double> logit(static_cast<size_t>(n));
    double m = -1e300;
    for (int64_t t = 0; t < n; ++t) {
      double s = 0;
      for (int i = 0; i < d; ++i) s += double(q[qh * d + i]) * K[(t * H + h) * d + i];
      logit[t] = s / std::sqrt(double(d));
      m = std::max(m, logit[t]);
    }
    double z = 0;
    for (auto& x : logit) z += (x = std::exp(x - m));
    for (auto& x : logit) x /= z;
    for (int64_t t = 0; t < n; ++t)
      for (int i = 0; i < d; ++i) out[qh * d + i] += static_cast<float>(logit[t] * V[(t * H + h) * d + i]);
    if (weights) (*weights)[qh] = logit;
  }
  return out;
}

inline double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

}  // namespace e8kv::testkit
