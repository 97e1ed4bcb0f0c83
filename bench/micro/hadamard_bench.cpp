// Randomized Hadamard rotation throughput (elements/s) at common head dims; compare with
// BM_Memcpy (lattice_bench.cpp) in the same binary.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "e8kv/transform/hadamard.hpp"

namespace {

void BM_RandomizedHadamardForward(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const size_t vectors = (size_t{1} << 17) / static_cast<size_t>(dim);  // 512 KiB of floats
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> in(vectors * dim), out(in.size());
  for (auto& v : in) v = g(rng);
  const e8kv::transform::RandomizedHadamard rh(dim, 12345);
  for (auto _ : state) {
    rh.forward_batch(in.data(), out.data(), vectors, static_cast<size_t>(dim));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * in.size()));
}
BENCHMARK(BM_RandomizedHadamardForward)->Arg(64)->Arg(96)->Arg(128)->Arg(256);

void BM_RandomizedHadamardInverse(benchmark::State& state) {
  const int dim = static_cast<int>(state.range(0));
  const size_t vectors = (size_t{1} << 17) / static_cast<size_t>(dim);
  std::mt19937 rng(4);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> in(vectors * dim), out(in.size());
  for (auto& v : in) v = g(rng);
  const e8kv::transform::RandomizedHadamard rh(dim, 12345);
  for (auto _ : state) {
    rh.inverse_batch(in.data(), out.data(), vectors, static_cast<size_t>(dim));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * in.size()));
}
BENCHMARK(BM_RandomizedHadamardInverse)->Arg(128);

}  // namespace
