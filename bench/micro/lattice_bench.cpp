// E8 nearest point throughput beside a memcpy of the same bytes.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "e8kv/lattice/e8.hpp"

namespace {
constexpr size_t kBlocks = 1 << 14;

std::vector<float> gaussian(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

void BM_Memcpy(benchmark::State& state) {
  const auto in = gaussian(kBlocks * 8, 1);
  std::vector<float> out(in.size());
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), in.size() * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * in.size());
}
BENCHMARK(BM_Memcpy);

void BM_NearestE8Scalar(benchmark::State& state) {
  const auto in = gaussian(kBlocks * 8, 2);
  std::vector<float> out(in.size());
  for (auto _ : state) {
    for (size_t b = 0; b < kBlocks; ++b) e8kv::lattice::nearest_e8(&in[8 * b], &out[8 * b]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * in.size());
}
BENCHMARK(BM_NearestE8Scalar);
}  // namespace
