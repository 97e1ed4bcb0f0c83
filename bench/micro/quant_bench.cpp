// The per-vector encode path (randomized Hadamard + gain + block encode + pack) and a 7B-like
// layer's K/V encode through quant::encode_vector, in elements/s per core beside BM_Memcpy
// (lattice_bench.cpp) in the same binary.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/quant/vector_quantizer.hpp"
#include "e8kv/transform/hadamard.hpp"

namespace {
using e8kv::codebook::E8P;
using e8kv::codebook::Rvq3;
using e8kv::codebook::Rvq4;
using e8kv::quant::GainPolicy;

constexpr int kDim = 128;
constexpr size_t kVectors = 1024;  // 512 KiB of fp32 input

std::vector<float> gaussian(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

/// One head vector: rotate, then gain + codes (what a cache append does per vector).
template <class Code>
void BM_RotateAndEncodeVector(benchmark::State& state) {
  const auto in = gaussian(kVectors * kDim, 21);
  const e8kv::transform::RandomizedHadamard rh(kDim, 12345);
  constexpr int kBytes = Code::kIndexBits / 8;
  std::vector<uint8_t> codes(kVectors * kDim / 8 * kBytes);
  std::vector<uint16_t> gains(kVectors);
  float rotated[kDim];
  for (auto _ : state) {
    for (size_t v = 0; v < kVectors; ++v) {
      rh.forward(&in[v * kDim], rotated);
      e8kv::quant::encode_vector<Code>(rotated, kDim, 1.0f, GainPolicy::kNormPreserving,
                                       &codes[v * kDim / 8 * kBytes], &gains[v]);
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * in.size()));
}
BENCHMARK_TEMPLATE(BM_RotateAndEncodeVector, E8P)->Name("BM_RotateAndEncodeVectorE8p");
BENCHMARK_TEMPLATE(BM_RotateAndEncodeVector, Rvq3)->Name("BM_RotateAndEncodeVectorRvq3");
BENCHMARK_TEMPLATE(BM_RotateAndEncodeVector, Rvq4)->Name("BM_RotateAndEncodeVectorRvq4");

/// A 7B-like layer (8 KV heads × 128): per token, keys with Rvq3 and values with E8P, each
/// rotated and encoded through encode_vector. items/s are elements (K and V); tokens_per_s too.
void BM_LayerEncodeK3V2(benchmark::State& state) {
  constexpr int kHeads = 8;
  constexpr size_t kTokens = 256;
  const auto k = gaussian(kTokens * kHeads * kDim, 22), v = gaussian(kTokens * kHeads * kDim, 23);
  const e8kv::transform::RandomizedHadamard rk(kDim, 1), rv(kDim, 2);
  std::vector<uint8_t> k_codes(kTokens * kHeads * kDim / 8 * 3), v_codes(kTokens * kHeads * kDim / 8 * 2);
  std::vector<uint16_t> gains(2 * kTokens * kHeads);
  float rotated[kDim];
  for (auto _ : state) {
    for (size_t t = 0; t < kTokens; ++t)
      for (int h = 0; h < kHeads; ++h) {
        const size_t vec = t * kHeads + static_cast<size_t>(h);
        rk.forward(&k[vec * kDim], rotated);
        e8kv::quant::encode_vector<Rvq3>(rotated, kDim, 1.0f, GainPolicy::kNormPreserving, &k_codes[vec * kDim / 8 * 3],
                                         &gains[2 * vec]);
        rv.forward(&v[vec * kDim], rotated);
        e8kv::quant::encode_vector<E8P>(rotated, kDim, 1.0f, GainPolicy::kNormPreserving, &v_codes[vec * kDim / 8 * 2],
                                        &gains[2 * vec + 1]);
      }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * (k.size() + v.size())));
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * kTokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LayerEncodeK3V2);

}  // namespace
