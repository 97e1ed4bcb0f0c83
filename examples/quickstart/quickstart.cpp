// What an engine does with e8kv: compress a prefill, append decoded tokens, attend to the codes.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "e8kv/compressor.hpp"

int main() {
  const e8kv::ModelShape shape{/*layers*/ 2, /*kv heads*/ 2, /*q heads*/ 8, /*head_dim*/ 128};
  e8kv::Config cfg = e8kv::Config::preset("high");  // K3V2 + 35 % eviction
  cfg.rope.theta = 500000.0;                        // the model's RoPE parameters
  const e8kv::KVCompressor compressor(shape, cfg);

  // The engine's prefill cache (post-RoPE keys, NHD, fp32 here) and its last 32 queries.
  const int T = 1000, W = 32, H = shape.n_kv_heads, Q = shape.n_q_heads, D = shape.head_dim;
  std::mt19937 rng(1);
  std::normal_distribution<float> g;
  std::vector<std::vector<float>> k(2), v(2), q(2);
  e8kv::SequenceKV prefill;
  std::vector<e8kv::LayerQueries> queries;
  for (int l = 0; l < shape.n_layers; ++l) {
    for (auto* buf : {&k[l], &v[l]}) buf->resize(size_t(T) * H * D);
    q[l].resize(size_t(W) * Q * D);
    for (auto* buf : {&k[l], &v[l], &q[l]})
      for (float& x : *buf) x = g(rng);
    prefill.layers.push_back({e8kv::TensorView::nhd(k[l].data(), e8kv::DType::kF32, T, H, D),
                              e8kv::TensorView::nhd(v[l].data(), e8kv::DType::kF32, T, H, D)});
    queries.push_back({e8kv::TensorView::nhd(q[l].data(), e8kv::DType::kF32, W, Q, D), nullptr});
  }
  e8kv::CompressedKV cache = compressor.compress(prefill, &queries);

  // Decode: each new token's K/V is appended per layer, then attention reads the codes.
  std::vector<float> nk(size_t(H) * D), nv(nk.size()), nq(size_t(Q) * D), out(nq.size());
  for (int pos = T; pos < T + 40; ++pos)
    for (int l = 0; l < shape.n_layers; ++l) {
      for (auto* buf : {&nk, &nv, &nq})
        for (float& x : *buf) x = g(rng);
      compressor.append(cache, l, nk.data(), nv.data(), pos);
      compressor.attend(cache, l, nq.data(), pos, out.data());
    }
  std::printf("tokens %lld, stored %lld in layer 0, %zu bytes (%.2f bits/element, %.2fx vs fp16)\n",
              static_cast<long long>(cache.original_tokens()), static_cast<long long>(cache.stored_tokens(0)),
              cache.bytes(), cache.bits_per_element(), cache.compression_ratio());
  return std::isfinite(out[0]) ? 0 : 1;
}
