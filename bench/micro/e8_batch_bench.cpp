// Batched E8 nearest point (e8_batch.hpp) in elements/s, beside BM_NearestE8Scalar and
// BM_Memcpy (lattice_bench.cpp) on the same 2^14 Gaussian blocks.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "e8kv/lattice/e8_batch.hpp"

namespace {
constexpr size_t kBatchBlocks = 1 << 14;

std::vector<float> gaussian_blocks(size_t n_blocks, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> v(n_blocks * 8);
  for (auto& x : v) x = g(rng);
  return v;
}

void BM_NearestE8Batch(benchmark::State& state) {
  const auto in = gaussian_blocks(kBatchBlocks, 2);
  std::vector<float> out(in.size());
  for (auto _ : state) {
    e8kv::lattice::nearest_e8_batch(in.data(), out.data(), kBatchBlocks);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * in.size()));
}
BENCHMARK(BM_NearestE8Batch);

void BM_NearestE8TwiceBatch(benchmark::State& state) {
  const auto in = gaussian_blocks(kBatchBlocks, 2);
  std::vector<int32_t> out(in.size());
  for (auto _ : state) {
    e8kv::lattice::nearest_e8_twice_batch(in.data(), out.data(), kBatchBlocks);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * in.size()));
}
BENCHMARK(BM_NearestE8TwiceBatch);

#if E8KV_E8_BATCH_SIMD
// The baseline-ISA kernel (4 lanes: SSE2 on x86-64), what CPUs without AVX2 run.
void BM_NearestE8BatchBaselineIsa(benchmark::State& state) {
  const auto in = gaussian_blocks(kBatchBlocks, 2);
  std::vector<float> out(in.size());
  for (auto _ : state) {
    e8kv::lattice::detail::e8_batch_body<e8kv::lattice::detail::e8_f32x4, false>(in.data(), out.data(), kBatchBlocks);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * in.size()));
}
BENCHMARK(BM_NearestE8BatchBaselineIsa);
#endif

}  // namespace
