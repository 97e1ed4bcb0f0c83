// Bit packing throughput (items = indices packed or unpacked per second) for 16-, 24- and
// 32-bit indices, beside BM_Memcpy (lattice_bench.cpp) as the memory-bound baseline.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "e8kv/pack/bitpack.hpp"

namespace {
constexpr size_t kIndices = 1 << 16;

std::vector<uint32_t> random_indices(int width, unsigned seed) {
  std::mt19937 rng(seed);
  const uint32_t mask = width == 32 ? 0xffffffffu : ((1u << width) - 1u);
  std::vector<uint32_t> v(kIndices);
  for (auto& x : v) x = static_cast<uint32_t>(rng()) & mask;
  return v;
}

void BM_PackBits(benchmark::State& state) {
  const int width = static_cast<int>(state.range(0));
  const auto values = random_indices(width, 1);
  std::vector<uint8_t> packed(e8kv::pack::packed_bytes(kIndices, width));
  for (auto _ : state) {
    e8kv::pack::pack_bits(values.data(), kIndices, width, packed.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kIndices));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * packed.size()));
}
BENCHMARK(BM_PackBits)->Arg(16)->Arg(24)->Arg(32);

void BM_UnpackBits(benchmark::State& state) {
  const int width = static_cast<int>(state.range(0));
  const auto values = random_indices(width, 2);
  std::vector<uint8_t> packed(e8kv::pack::packed_bytes(kIndices, width));
  e8kv::pack::pack_bits(values.data(), kIndices, width, packed.data());
  std::vector<uint32_t> out(kIndices);
  for (auto _ : state) {
    e8kv::pack::unpack_bits(packed.data(), kIndices, width, out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kIndices));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * packed.size()));
}
BENCHMARK(BM_UnpackBits)->Arg(16)->Arg(24)->Arg(32);

// Random access: one unpack_one per index, in a scattered order.
void BM_UnpackOneRandom(benchmark::State& state) {
  const int width = static_cast<int>(state.range(0));
  const auto values = random_indices(width, 3);
  std::vector<uint8_t> packed(e8kv::pack::packed_bytes(kIndices, width));
  e8kv::pack::pack_bits(values.data(), kIndices, width, packed.data());
  std::vector<uint32_t> order(kIndices);
  std::mt19937 rng(4);
  for (auto& i : order) i = rng() % kIndices;
  for (auto _ : state) {
    uint32_t acc = 0;
    for (uint32_t i : order) acc ^= e8kv::pack::unpack_one(packed.data(), i, width);
    benchmark::DoNotOptimize(acc);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kIndices));
}
BENCHMARK(BM_UnpackOneRandom)->Arg(16)->Arg(24)->Arg(32);
}  // namespace
