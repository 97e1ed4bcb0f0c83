// Decode attention on one CPU core: e8kv::attend reading the codes, beside the strongest plain
// dense attention we can write over the same tokens, in the same run.
//
// Shape: one layer of a 7B-class model, 8 KV heads × 128, 32 query heads (GQA 4), one query token.
// Dense baselines (the alternative an engine has): K/V as plain fp16 (or fp32) rows in the NHD
// layout engines use, token-outer, each K/V row read once for its 4 query heads, fused
// multiply-adds and F16C conversion, chunks of 512 tokens with their softmax states merged — the
// same kernels (src/attention/attend_kernels.inc) e8kv's fp16 window uses, so both sides get the
// same care. "cold" rotates through enough copies of the data that every call reads it from DRAM
// (> 96 MiB touched between two reads of one copy; the last-level cache here is 32 MiB).
//
//   build/<dir>/bench/attention/e8kv-attention-bench --benchmark_filter=... [--benchmark_repetitions=5]
//   scripts/attention_ratios.py out.json   # ratios against the fp16 baseline of the same run
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/attend_kernels.hpp"
#include "e8kv/attention/attend.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/half.hpp"

namespace {
using namespace e8kv;

constexpr int kKvHeads = 8, kQHeads = 32, kDim = 128, kGroup = kQHeads / kKvHeads;
constexpr int64_t kChunk = 512;
constexpr size_t kColdBytes = size_t{96} << 20;

struct Layer {
  int64_t tokens = 0;
  std::vector<float> k, v, q;  // NHD fp32, and one query token
};

const Layer& layer(int64_t tokens) {
  static std::map<int64_t, std::unique_ptr<Layer>> cache;
  auto& slot = cache[tokens];
  if (!slot) {
    slot = std::make_unique<Layer>();
    slot->tokens = tokens;
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.f, 1.f);
    slot->k.resize(static_cast<size_t>(tokens) * kKvHeads * kDim);
    slot->v.resize(slot->k.size());
    slot->q.resize(static_cast<size_t>(kQHeads) * kDim);
    // Keys with a per-head common component (as real pre-RoPE keys have), values Gaussian.
    std::vector<float> bias(static_cast<size_t>(kKvHeads) * kDim);
    for (auto& x : bias) x = 2.f * g(rng);
    for (size_t i = 0; i < slot->k.size(); ++i) slot->k[i] = g(rng) + bias[i % bias.size()];
    for (auto& x : slot->v) x = g(rng);
    for (auto& x : slot->q) x = g(rng) * 0.3f;
  }
  return *slot;
}

// ---- the dense baselines ------------------------------------------------------------------------

template <class K, class Dec>
void dense_attention(const Dec& dec, const uint8_t* k, const uint8_t* v, size_t elem_bytes, int64_t n, const float* q,
                     float* out) {
  const size_t row = static_cast<size_t>(kDim) * elem_bytes, stride = row * kKvHeads;
  const float scale = 1.f / std::sqrt(static_cast<float>(kDim));
  alignas(32) float qs[kGroup * kDim], logits[kGroup * kChunk], w[kChunk * kGroup], acc[kGroup * kDim],
      total[kGroup * kDim];
  for (int h = 0; h < kKvHeads; ++h) {
    for (int i = 0; i < kGroup * kDim; ++i) qs[i] = q[h * kGroup * kDim + i] * scale;
    float m_run[kGroup], l_run[kGroup];
    std::fill(m_run, m_run + kGroup, -INFINITY);
    std::fill(l_run, l_run + kGroup, 0.f);
    std::fill(total, total + kGroup * kDim, 0.f);
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
      const int64_t m = std::min(kChunk, n - c0), padded = (m + 7) / 8 * 8;
      const uint8_t* kr = k + static_cast<size_t>(c0) * stride + h * row;
      const uint8_t* vr = v + static_cast<size_t>(c0) * stride + h * row;
      K::template dot_rows<kGroup>(dec, kr, stride, kDim / 8, qs, m, logits, kChunk);
      float mx[kGroup], sum[kGroup];
      for (int g = 0; g < kGroup; ++g) {
        std::fill(logits + g * kChunk + m, logits + g * kChunk + padded, -INFINITY);
        K::softmax_row(logits + g * kChunk, padded, &mx[g], &sum[g]);
        for (int64_t t = 0; t < m; ++t) w[t * kGroup + g] = logits[g * kChunk + t];
      }
      std::fill(acc, acc + kGroup * kDim, 0.f);
      K::template accumulate_rows<kGroup>(dec, vr, stride, kDim / 8, w, m, acc);
      for (int g = 0; g < kGroup; ++g) {  // online merge of the chunk into the running state
        const float m2 = std::max(m_run[g], mx[g]);
        const float a = std::exp(m_run[g] - m2), b = std::exp(mx[g] - m2);
        l_run[g] = l_run[g] * a + sum[g] * b;
        for (int i = 0; i < kDim; ++i) total[g * kDim + i] = total[g * kDim + i] * a + acc[g * kDim + i] * b;
        m_run[g] = m2;
      }
    }
    for (int g = 0; g < kGroup; ++g)
      for (int i = 0; i < kDim; ++i) out[(h * kGroup + g) * kDim + i] = total[g * kDim + i] / l_run[g];
  }
}

void dense_fp16(const uint16_t* k, const uint16_t* v, int64_t n, const float* q, float* out) {
  using namespace attention::kernels;
#if E8KV_HOST_AVX2_DISPATCH
  if (cpu_has_avx2_fma())
    return dense_attention<KernelsAvx2Fma>(KernelsAvx2Fma::Fp16RowDecoder{}, reinterpret_cast<const uint8_t*>(k),
                                           reinterpret_cast<const uint8_t*>(v), 2, n, q, out);
#endif
  dense_attention<KernelsPortable>(KernelsPortable::Fp16RowDecoder{}, reinterpret_cast<const uint8_t*>(k),
                                   reinterpret_cast<const uint8_t*>(v), 2, n, q, out);
}

void dense_fp32(const float* k, const float* v, int64_t n, const float* q, float* out) {
  using namespace attention::kernels;
#if E8KV_HOST_AVX2_DISPATCH
  if (cpu_has_avx2_fma())
    return dense_attention<KernelsAvx2Fma>(KernelsAvx2Fma::Fp32RowDecoder{}, reinterpret_cast<const uint8_t*>(k),
                                           reinterpret_cast<const uint8_t*>(v), 4, n, q, out);
#endif
  dense_attention<KernelsPortable>(KernelsPortable::Fp32RowDecoder{}, reinterpret_cast<const uint8_t*>(k),
                                   reinterpret_cast<const uint8_t*>(v), 4, n, q, out);
}

/// Copies of a data set enough to make every read a DRAM read when cycled (1 when hot).
size_t copies_for(size_t bytes, bool cold) { return cold ? std::max<size_t>(2, kColdBytes / std::max<size_t>(bytes, 1) + 1) : 1; }

void BM_DenseFp16(benchmark::State& state) {
  const auto& d = layer(state.range(0));
  const bool cold = state.range(1) != 0;
  const size_t elems = d.k.size();
  const size_t copies = copies_for(4 * elems, cold);
  std::vector<std::vector<uint16_t>> k(copies, std::vector<uint16_t>(elems)), v(copies, std::vector<uint16_t>(elems));
  for (size_t c = 0; c < copies; ++c) {
    floats_to_fp16_bits(d.k.data(), k[c].data(), elems);
    floats_to_fp16_bits(d.v.data(), v[c].data(), elems);
  }
  std::vector<float> out(static_cast<size_t>(kQHeads) * kDim);
  size_t i = 0;
  for (auto _ : state) {
    dense_fp16(k[i].data(), v[i].data(), d.tokens, d.q.data(), out.data());
    benchmark::DoNotOptimize(out.data());
    i = (i + 1) % copies;
  }
  state.counters["bytes_per_token_head"] = 2.0 * 2 * kDim;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(4 * elems));
}
BENCHMARK(BM_DenseFp16)->ArgNames({"tokens", "cold"})->ArgsProduct({{4096, 32768}, {0, 1}})->Unit(benchmark::kMillisecond);

void BM_DenseFp32(benchmark::State& state) {
  const auto& d = layer(state.range(0));
  const bool cold = state.range(1) != 0;
  const size_t copies = copies_for(8 * d.k.size(), cold);
  std::vector<std::vector<float>> k(copies, d.k), v(copies, d.v);
  std::vector<float> out(static_cast<size_t>(kQHeads) * kDim);
  size_t i = 0;
  for (auto _ : state) {
    dense_fp32(k[i].data(), v[i].data(), d.tokens, d.q.data(), out.data());
    benchmark::DoNotOptimize(out.data());
    i = (i + 1) % copies;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(8 * d.k.size()));
}
BENCHMARK(BM_DenseFp32)->ArgNames({"tokens", "cold"})->ArgsProduct({{4096, 32768}, {0, 1}})->Unit(benchmark::kMillisecond);

// ---- e8kv ---------------------------------------------------------------------------------------

Config bench_config(const std::string& spec) { return Config::parse(spec); }

void attend_bench(benchmark::State& state, const std::string& spec) {
  const auto& d = layer(state.range(0));
  const bool cold = state.range(1) != 0;
  const int threads = static_cast<int>(state.range(2));
  KVCompressor c({1, kKvHeads, kQHeads, kDim}, bench_config(spec));
  SequenceKV seq;
  seq.layers.push_back({TensorView::nhd(d.k.data(), DType::kF32, d.tokens, kKvHeads, kDim),
                        TensorView::nhd(d.v.data(), DType::kF32, d.tokens, kKvHeads, kDim)});
  std::vector<float> qobs(static_cast<size_t>(32) * kQHeads * kDim);
  for (size_t i = 0; i < qobs.size(); ++i) qobs[i] = d.q[i % d.q.size()];
  LayerQueries lq;
  lq.queries = TensorView::nhd(qobs.data(), DType::kF32, 32, kQHeads, kDim);
  std::vector<LayerQueries> queries{lq};
  const CompressedKV first = c.compress(seq, &queries);
  const size_t copies = copies_for(first.bytes(), cold);
  std::vector<CompressedKV> caches(copies, first);
  std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
  std::vector<float> out(static_cast<size_t>(kQHeads) * kDim), lse(kQHeads);
  size_t i = 0;
  for (auto _ : state) {
    attend(caches[i], 0, d.q.data(), out.data(), lse.data(), {pool.get()});
    benchmark::DoNotOptimize(out.data());
    i = (i + 1) % copies;
  }
  state.counters["bits_per_element"] = first.bits_per_element();
  state.counters["bytes_per_token_head"] = static_cast<double>(first.bytes()) / (static_cast<double>(d.tokens) * kKvHeads);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(first.bytes()));
}

// Args: tokens, cold, threads.
BENCHMARK_CAPTURE(attend_bench, k3v2_residual, std::string("preset=quant-k3v2,rope=residual"))
    ->ArgNames({"tokens", "cold", "threads"})
    ->ArgsProduct({{4096, 32768}, {0, 1}, {1}})
    ->Args({32768, 0, 2})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(attend_bench, k2v2_residual, std::string("preset=quant-k2v2,rope=residual"))
    ->ArgNames({"tokens", "cold", "threads"})
    ->ArgsProduct({{4096, 32768}, {0, 1}, {1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(attend_bench, k4v4_residual, std::string("preset=quant-k4v4,rope=residual"))
    ->ArgNames({"tokens", "cold", "threads"})
    ->Args({32768, 1, 1})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(attend_bench, k3v2_post, std::string("preset=quant-k3v2,rope=post"))
    ->ArgNames({"tokens", "cold", "threads"})
    ->Args({32768, 1, 1})
    ->Unit(benchmark::kMillisecond);
// Pre-RoPE codes (format v1/v2 caches): keys decoded ahead, RoPE re-applied per key.
BENCHMARK_CAPTURE(attend_bench, k3v2_pre, std::string("preset=quant-k3v2,rope=pre"))
    ->ArgNames({"tokens", "cold", "threads"})
    ->Args({4096, 0, 1})
    ->Unit(benchmark::kMillisecond);

}  // namespace
