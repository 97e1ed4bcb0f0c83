// Synthetic KV caches with the structure real ones show, for tests and benches (not for quality
// claims: those come from the real-model evaluation).
//
// Per (layer, kv head): keys have a per-head mean direction, a few outlier channels with large
// magnitude, per-token norm spread (log-normal), and RoPE applied at their positions (split-half,
// theta 10000) — so pre-RoPE keys share one subspace and post-RoPE keys do not. Values are
// Gaussian with per-channel scales and per-token norm spread. Queries resemble keys of their
// head plus noise, with RoPE at their positions, and a few "heavy hitter" tokens attract most
// attention.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "e8kv/transform/rope.hpp"

namespace e8kv::synth {

struct SyntheticSpec {
  int n_layers = 2;
  int n_kv_heads = 2;
  int n_q_heads = 4;
  int head_dim = 64;
  int tokens = 256;
  int obs_window = 32;
  int outlier_channels = 4;
  float outlier_scale = 6.0f;
  float norm_spread = 0.3f;   ///< sigma of the log-normal per-token norm factor
  float heavy_fraction = 0.05f;
  double rope_theta = 10000.0;
  uint64_t seed = 1;
};

/// Layer-major fp32 buffers in NHD order.
struct SyntheticKV {
  SyntheticSpec spec;
  std::vector<std::vector<float>> keys;     ///< [layer][tokens * kv_heads * head_dim], post-RoPE
  std::vector<std::vector<float>> values;   ///< same shape
  std::vector<std::vector<float>> queries;  ///< [layer][obs_window * q_heads * head_dim], post-RoPE
  std::vector<int32_t> positions;           ///< 0..tokens-1
  std::vector<int32_t> query_positions;     ///< the last obs_window positions
};

inline SyntheticKV make_synthetic_kv(const SyntheticSpec& s) {
  SyntheticKV out;
  out.spec = s;
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> g(0.f, 1.f);
  transform::RopeParams rp;
  rp.head_dim = s.head_dim;
  rp.theta = s.rope_theta;
  const transform::Rope rope(rp);
  const int d = s.head_dim, H = s.n_kv_heads, Q = s.n_q_heads, T = s.tokens, W = std::min(s.obs_window, s.tokens);
  out.positions.resize(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) out.positions[static_cast<size_t>(t)] = t;
  for (int w = 0; w < W; ++w) out.query_positions.push_back(T - W + w);
  std::bernoulli_distribution heavy(s.heavy_fraction);
  std::vector<char> is_heavy(static_cast<size_t>(T));
  for (auto& h : is_heavy) h = heavy(rng);
  for (int l = 0; l < s.n_layers; ++l) {
    std::vector<float> keys(static_cast<size_t>(T) * H * d), values(keys.size()),
        queries(static_cast<size_t>(W) * Q * d);
    std::vector<std::vector<float>> mean(static_cast<size_t>(H), std::vector<float>(static_cast<size_t>(d)));
    std::vector<std::vector<float>> chan(static_cast<size_t>(H), std::vector<float>(static_cast<size_t>(d), 1.f));
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < d; ++i) mean[h][i] = 0.5f * g(rng);
      for (int o = 0; o < s.outlier_channels; ++o) {
        const int c = static_cast<int>(rng() % static_cast<uint64_t>(d));
        chan[h][c] = s.outlier_scale;
        mean[h][c] = s.outlier_scale * (g(rng) > 0 ? 1.f : -1.f);
      }
    }
    for (int t = 0; t < T; ++t) {
      const float norm_k = std::exp(s.norm_spread * g(rng)), norm_v = std::exp(s.norm_spread * g(rng));
      for (int h = 0; h < H; ++h) {
        float* k = &keys[(static_cast<size_t>(t) * H + h) * d];
        float* v = &values[(static_cast<size_t>(t) * H + h) * d];
        const float pull = is_heavy[static_cast<size_t>(t)] ? 3.f : 1.f;
        for (int i = 0; i < d; ++i) {
          k[i] = norm_k * (pull * mean[h][i] + chan[h][i] * 0.5f * g(rng));
          v[i] = norm_v * (0.3f * chan[h][i] * g(rng) + 0.2f * mean[h][i]);
        }
        rope.apply(k, t);
      }
    }
    for (int w = 0; w < W; ++w) {
      for (int qh = 0; qh < Q; ++qh) {
        const int h = qh / (Q / H);
        float* q = &queries[(static_cast<size_t>(w) * Q + qh) * d];
        for (int i = 0; i < d; ++i) q[i] = 0.6f * mean[h][i] + 0.5f * g(rng);
        rope.apply(q, out.query_positions[static_cast<size_t>(w)]);
      }
    }
    out.keys.push_back(std::move(keys));
    out.values.push_back(std::move(values));
    out.queries.push_back(std::move(queries));
  }
  return out;
}

}  // namespace e8kv::synth
