// KVCompressor throughput on a 7B-like layer (8 KV heads x 128, GQA 4:1): compress (tokens/s)
// and CPU decode attention over the compressed cache beside dense fp32 attention over the same
// tokens, in the same run.
#include <benchmark/benchmark.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "e8kv/compressor.hpp"
#include "e8kv/numeric/dot.hpp"

namespace {
using namespace e8kv;

constexpr int kKvHeads = 8, kQHeads = 32, kDim = 128;

struct LayerData {
  int64_t tokens;
  std::vector<float> k, v, q;
};

const LayerData& layer_data(int64_t tokens) {
  static std::map<int64_t, std::unique_ptr<LayerData>> cache;
  auto& slot = cache[tokens];
  if (!slot) {
    slot = std::make_unique<LayerData>();
    slot->tokens = tokens;
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.f, 1.f);
    slot->k.resize(static_cast<size_t>(tokens) * kKvHeads * kDim);
    slot->v.resize(slot->k.size());
    slot->q.resize(static_cast<size_t>(kQHeads) * kDim);
    for (auto& x : slot->k) x = g(rng);
    for (auto& x : slot->v) x = g(rng);
    for (auto& x : slot->q) x = g(rng);
  }
  return *slot;
}

SequenceKV view(const LayerData& d) {
  SequenceKV s;
  s.layers.push_back({TensorView::nhd(d.k.data(), DType::kF32, d.tokens, kKvHeads, kDim),
                      TensorView::nhd(d.v.data(), DType::kF32, d.tokens, kKvHeads, kDim)});
  return s;
}

Config bench_config(bool pre_rope) {
  Config c = Config::preset("quant-k3v2");
  c.keys_pre_rope = pre_rope;
  return c;
}

void BM_CompressK3V2(benchmark::State& state) {
  const auto& d = layer_data(4096);
  KVCompressor c({1, kKvHeads, kQHeads, kDim}, bench_config(true));
  const auto seq = view(d);
  for (auto _ : state) {
    auto cache = c.compress(seq);
    benchmark::DoNotOptimize(cache.bytes());
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations() * d.tokens),
                                                      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CompressK3V2)->Unit(benchmark::kMillisecond);

void BM_AttendDenseFp32(benchmark::State& state) {
  const auto& d = layer_data(state.range(0));
  const int64_t n = d.tokens;
  std::vector<float> logits(static_cast<size_t>(n)), out(static_cast<size_t>(kQHeads) * kDim);
  const float scale = 1.f / std::sqrt(static_cast<float>(kDim));
  for (auto _ : state) {
    for (int qh = 0; qh < kQHeads; ++qh) {
      const int h = qh / (kQHeads / kKvHeads);
      const float* q = &d.q[static_cast<size_t>(qh) * kDim];
      float m = -INFINITY;
      for (int64_t t = 0; t < n; ++t) {
        const float* k = &d.k[(static_cast<size_t>(t) * kKvHeads + h) * kDim];
        const float s = dot_product(q, k, kDim);  // the dot product attend uses
        logits[static_cast<size_t>(t)] = s * scale;
        m = std::max(m, s * scale);
      }
      float z = 0.f;
      for (auto& x : logits) z += (x = std::exp(x - m));
      float* o = &out[static_cast<size_t>(qh) * kDim];
      std::fill(o, o + kDim, 0.f);
      for (int64_t t = 0; t < n; ++t) {
        const float p = logits[static_cast<size_t>(t)] / z;
        const float* v = &d.v[(static_cast<size_t>(t) * kKvHeads + h) * kDim];
        for (int i = 0; i < kDim; ++i) o[i] += p * v[i];
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations() * n), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AttendDenseFp32)->Arg(4096)->Arg(32768)->Unit(benchmark::kMillisecond);

template <bool kPreRope>
void BM_AttendCompressedK3V2(benchmark::State& state) {
  const auto& d = layer_data(state.range(0));
  KVCompressor c({1, kKvHeads, kQHeads, kDim}, bench_config(kPreRope));
  const auto cache = c.compress(view(d));
  std::vector<float> out(static_cast<size_t>(kQHeads) * kDim);
  for (auto _ : state) {
    c.attend(cache, 0, d.q.data(), static_cast<int32_t>(d.tokens), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * d.tokens), benchmark::Counter::kIsRate);
  state.counters["compression_ratio"] = cache.compression_ratio();
}
BENCHMARK_TEMPLATE(BM_AttendCompressedK3V2, true)->Arg(4096)->Arg(32768)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AttendCompressedK3V2, false)->Arg(4096)->Arg(32768)->Unit(benchmark::kMillisecond);

// The other fast-tier key/value codes at 4K (pre-RoPE keys): K4V2 (Rvq4 keys) and K3V3 (Rvq3 values).
void BM_AttendCompressedPreset(benchmark::State& state, const char* preset) {
  const auto& d = layer_data(4096);
  KVCompressor c({1, kKvHeads, kQHeads, kDim}, Config::preset(preset));
  const auto cache = c.compress(view(d));
  std::vector<float> out(static_cast<size_t>(kQHeads) * kDim);
  for (auto _ : state) {
    c.attend(cache, 0, d.q.data(), static_cast<int32_t>(d.tokens), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * d.tokens), benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_AttendCompressedPreset, k4v2, "quant-k4v2")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_AttendCompressedPreset, k3v3, "quant-k3v3")->Unit(benchmark::kMillisecond);

}  // namespace
