// KVCompressor throughput on a 7B-like layer (8 KV heads x 128, GQA 4:1): compress (tokens/s)
// and CPU decode attention over the compressed cache beside dense fp32 attention over the same
// tokens, in the same run.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "e8kv/cache/attend_cpu.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/numeric/cpu_features.hpp"
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

// Dense fp32 decode attention over the NHD cache, two ways. Both have an AVX2 twin chosen at run
// time, as attend's loops do, so the ratios compare like with like.
//  - per query head: each of the 32 query heads reads its KV head's keys and values
//    (what a GQA-unaware engine does, e.g. K/V repeated per query head);
//  - GQA: each K/V row is read once for its 4 query heads, with attend's own multi-head dot
//    product and 8-wide accumulate (the fair, strong baseline).
struct DenseArgs {
  const float *k, *v, *q;
  int64_t n;
  float* logits;  // kQHeads/kKvHeads rows of n
  float* out;
};

E8KV_FORCE_INLINE void softmax_rows(float* l, int64_t n, int rows) {
  for (int g = 0; g < rows; ++g) {
    float* x = l + static_cast<size_t>(g) * n;
    float m = -INFINITY;
    for (int64_t t = 0; t < n; ++t) m = std::max(m, x[t]);
    float z = 0.f;
    for (int64_t t = 0; t < n; ++t) z += (x[t] = std::exp(x[t] - m));
    const float inv = 1.f / z;
    for (int64_t t = 0; t < n; ++t) x[t] *= inv;
  }
}

E8KV_FORCE_INLINE void dense_per_head_body(const DenseArgs& a) {
  const float scale = 1.f / std::sqrt(static_cast<float>(kDim));
  for (int qh = 0; qh < kQHeads; ++qh) {
    const int h = qh / (kQHeads / kKvHeads);
    const float* q = a.q + static_cast<size_t>(qh) * kDim;
    for (int64_t t = 0; t < a.n; ++t)
      a.logits[t] = dot_product(q, a.k + (static_cast<size_t>(t) * kKvHeads + h) * kDim, kDim) * scale;
    softmax_rows(a.logits, a.n, 1);
    float* o = a.out + static_cast<size_t>(qh) * kDim;
    std::fill(o, o + kDim, 0.f);
    for (int64_t t = 0; t < a.n; ++t) {
      const float p = a.logits[t];
      const float* v = a.v + (static_cast<size_t>(t) * kKvHeads + h) * kDim;
      for (int i = 0; i < kDim; ++i) o[i] += p * v[i];
    }
  }
}

E8KV_FORCE_INLINE void dense_gqa_body(const DenseArgs& a) {
  using namespace e8kv::attend_cpu;
  constexpr int G = kQHeads / kKvHeads;
  const float scale = 1.f / std::sqrt(static_cast<float>(kDim));
  for (int h = 0; h < kKvHeads; ++h) {
    const float* q = a.q + static_cast<size_t>(h) * G * kDim;
    for (int64_t t = 0; t < a.n; ++t)
      dot_heads(q, G, kDim, a.k + (static_cast<size_t>(t) * kKvHeads + h) * kDim, scale, a.logits + t,
                static_cast<size_t>(a.n));
    softmax_rows(a.logits, a.n, G);
    float* o = a.out + static_cast<size_t>(h) * G * kDim;
    std::fill(o, o + G * kDim, 0.f);
    for (int64_t t = 0; t < a.n; ++t)
      accumulate_token(a.v + (static_cast<size_t>(t) * kKvHeads + h) * kDim, a.logits, static_cast<size_t>(a.n), t, G,
                       kDim, o);
  }
}

E8KV_TARGET_BASE_FLAT void dense_per_head_base(const DenseArgs& a) { dense_per_head_body(a); }
E8KV_TARGET_AVX2_FLAT void dense_per_head_avx2(const DenseArgs& a) { dense_per_head_body(a); }
E8KV_TARGET_BASE_FLAT void dense_gqa_base(const DenseArgs& a) { dense_gqa_body(a); }
E8KV_TARGET_AVX2_FLAT void dense_gqa_avx2(const DenseArgs& a) { dense_gqa_body(a); }

template <bool kGqa>
void BM_AttendDenseFp32(benchmark::State& state) {
  const auto& d = layer_data(state.range(0));
  std::vector<float> logits(static_cast<size_t>(d.tokens) * (kQHeads / kKvHeads)), out(static_cast<size_t>(kQHeads) * kDim);
  const DenseArgs args{d.k.data(), d.v.data(), d.q.data(), d.tokens, logits.data(), out.data()};
  const bool avx2 = cpu_has_avx2() && state.range(1) == 0;  // range(1) = 1: baseline ISA build
  for (auto _ : state) {
    if (kGqa)
      avx2 ? dense_gqa_avx2(args) : dense_gqa_base(args);
    else
      avx2 ? dense_per_head_avx2(args) : dense_per_head_base(args);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * d.tokens), benchmark::Counter::kIsRate);
}
// Args: tokens, then 1 to force the baseline (non-AVX2) build of every run-time ISA choice.
BENCHMARK_TEMPLATE(BM_AttendDenseFp32, false)
    ->Name("BM_AttendDenseFp32PerHead")
    ->ArgNames({"tokens", "baseline_isa"})
    ->Args({4096, 0})->Args({32768, 0})->Args({4096, 1})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AttendDenseFp32, true)
    ->Name("BM_AttendDenseFp32Gqa")
    ->ArgNames({"tokens", "baseline_isa"})
    ->Args({512, 0})->Args({4096, 0})->Args({32768, 0})->Args({4096, 1})
    ->Unit(benchmark::kMillisecond);

template <bool kPreRope>
void BM_AttendCompressedK3V2(benchmark::State& state) {
  const auto& d = layer_data(state.range(0));
  KVCompressor c({1, kKvHeads, kQHeads, kDim}, bench_config(kPreRope));
  const auto cache = c.compress(view(d));
  std::vector<float> out(static_cast<size_t>(kQHeads) * kDim);
  force_baseline_isa(state.range(1) != 0);
  for (auto _ : state) {
    c.attend(cache, 0, d.q.data(), static_cast<int32_t>(d.tokens), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  force_baseline_isa(false);
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * d.tokens), benchmark::Counter::kIsRate);
  state.counters["compression_ratio"] = cache.compression_ratio();
}
BENCHMARK_TEMPLATE(BM_AttendCompressedK3V2, true)
    ->ArgNames({"tokens", "baseline_isa"})
    ->Args({512, 0})->Args({4096, 0})->Args({32768, 0})->Args({4096, 1})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AttendCompressedK3V2, false)
    ->ArgNames({"tokens", "baseline_isa"})
    ->Args({4096, 0})->Args({32768, 0})
    ->Unit(benchmark::kMillisecond);

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
