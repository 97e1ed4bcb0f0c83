// KVCompressor throughput on a 7B-like layer (8 KV heads x 128, GQA 4:1): compress, tokens/s.
// Decode attention is measured by bench/attention (e8kv-attention-bench) beside dense baselines.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "e8kv/compressor.hpp"
#include "e8kv/numeric/cpu_features.hpp"

namespace {
using namespace e8kv;

constexpr int kKvHeads = 8, kQHeads = 32, kDim = 128;

constexpr int kObsWindow = 32;

struct LayerData {
  int64_t tokens;
  std::vector<float> k, v, q;
  std::vector<float> obs;  ///< [kObsWindow, kQHeads, kDim] observation queries
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
    slot->obs.resize(static_cast<size_t>(kObsWindow) * kQHeads * kDim);
    for (auto& x : slot->obs) x = g(rng);
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
  c.key_frame = pre_rope ? KeyFrame::kPreRope : KeyFrame::kPostRope;
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

void BM_CompressK3V2Residual(benchmark::State& state) {
  const auto& d = layer_data(4096);
  Config cfg = Config::preset("quant-k3v2");
  cfg.key_frame = KeyFrame::kRopeResidual;
  KVCompressor c({1, kKvHeads, kQHeads, kDim}, cfg);
  const auto seq = view(d);
  for (auto _ : state) {
    auto cache = c.compress(seq);
    benchmark::DoNotOptimize(cache.bytes());
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations() * d.tokens),
                                                      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CompressK3V2Residual)->Unit(benchmark::kMillisecond);

// With observation queries (query-weighted keys), without and with a rate budget or an fp16 tier:
// the cost of the sensitivity estimate (select/rate_allocation.hpp) or of the tier's scores is the
// difference, in the same run.
void compress_with_queries(benchmark::State& state, const char* spec) {
  const auto& d = layer_data(4096);
  KVCompressor c({1, kKvHeads, kQHeads, kDim}, Config::parse(spec));
  const auto seq = view(d);
  std::vector<LayerQueries> queries(1);
  queries[0].queries = TensorView::nhd(d.obs.data(), DType::kF32, kObsWindow, kQHeads, kDim);
  for (auto _ : state) {
    auto cache = c.compress(seq, &queries);
    benchmark::DoNotOptimize(cache.bytes());
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations() * d.tokens),
                                                      benchmark::Counter::kIsRate);
}
void BM_CompressK3V2Queries(benchmark::State& state) { compress_with_queries(state, "preset=quant-k3v2"); }
BENCHMARK(BM_CompressK3V2Queries)->Unit(benchmark::kMillisecond);
void BM_CompressBudget2p5Queries(benchmark::State& state) { compress_with_queries(state, "preset=quant-k3v2,budget=2.5"); }
BENCHMARK(BM_CompressBudget2p5Queries)->Unit(benchmark::kMillisecond);
// The 1 % fp16 tier: the observation-window scorer picks its tokens (what an evicting preset runs).
void BM_CompressK3V2Fp16TierQueries(benchmark::State& state) { compress_with_queries(state, "preset=quant-k3v2,fp16_tier=0.01"); }
BENCHMARK(BM_CompressK3V2Fp16TierQueries)->Unit(benchmark::kMillisecond);
// The 5 % code tier: the same scorer, and its tokens coded with rvq4 in a stream of their own.
void BM_CompressK3V2CodeTierQueries(benchmark::State& state) { compress_with_queries(state, "preset=quant-k3v2,code_tier=0.05"); }
BENCHMARK(BM_CompressK3V2CodeTierQueries)->Unit(benchmark::kMillisecond);

}  // namespace
