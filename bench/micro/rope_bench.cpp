// RoPE removal throughput (elements/s) on head_dim 128 keys: the batched table path for
// contiguous and scattered positions and both layouts, beside the scalar reference path.
// Compare with BM_Memcpy (lattice_bench.cpp) in the same binary.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "e8kv/transform/rope.hpp"

namespace {
using e8kv::transform::Rope;
using e8kv::transform::RopeLayout;
using e8kv::transform::RopeParams;

constexpr int kHeadDim = 128;
constexpr int64_t kTokens = 4096;

std::vector<float> gaussian_keys(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

std::vector<int64_t> positions(bool contiguous) {
  std::vector<int64_t> pos(kTokens);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> any(0, (int64_t(1) << 20) - 1);
  for (int64_t k = 0; k < kTokens; ++k) pos[size_t(k)] = contiguous ? 100000 + k : any(rng);
  return pos;
}

Rope make_rope(RopeLayout layout) {
  RopeParams p;
  p.layout = layout;
  p.head_dim = kHeadDim;
  p.theta = 500000.0;
  return Rope(p);
}

void run_batch(benchmark::State& state, RopeLayout layout, bool contiguous) {
  const Rope rope = make_rope(layout);
  auto keys = gaussian_keys(size_t(kTokens) * kHeadDim, 3);
  const auto pos = positions(contiguous);
  rope.remove_batch(keys.data(), pos.data(), 1, kHeadDim);  // builds the tables outside the timing
  for (auto _ : state) {
    rope.remove_batch(keys.data(), pos.data(), kTokens, kHeadDim);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kTokens * kHeadDim);
}

void BM_RopeRemoveBatchSplitHalf(benchmark::State& state) { run_batch(state, RopeLayout::kSplitHalf, true); }
BENCHMARK(BM_RopeRemoveBatchSplitHalf);

void BM_RopeRemoveBatchInterleaved(benchmark::State& state) { run_batch(state, RopeLayout::kInterleaved, true); }
BENCHMARK(BM_RopeRemoveBatchInterleaved);

void BM_RopeRemoveBatchScatteredPositions(benchmark::State& state) {
  run_batch(state, RopeLayout::kSplitHalf, false);
}
BENCHMARK(BM_RopeRemoveBatchScatteredPositions);

void BM_RopeRemoveScalar(benchmark::State& state) {
  const Rope rope = make_rope(RopeLayout::kSplitHalf);
  auto keys = gaussian_keys(size_t(kTokens) * kHeadDim, 4);
  const auto pos = positions(true);
  for (auto _ : state) {
    for (int64_t k = 0; k < kTokens; ++k) rope.remove(keys.data() + k * kHeadDim, pos[size_t(k)]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kTokens * kHeadDim);
}
BENCHMARK(BM_RopeRemoveScalar);

}  // namespace
