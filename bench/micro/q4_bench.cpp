// llama.cpp-style q4_0 / q8_0 encode and decode throughput (items = elements per second): the
// scalar baseline other benches compare against, beside BM_Memcpy (lattice_bench.cpp).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "e8kv/codebook/scalar.hpp"

namespace {
constexpr size_t kElements = 1 << 17;  // a multiple of 32

std::vector<float> gaussian_elements(unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> v(kElements);
  for (auto& x : v) x = g(rng);
  return v;
}

void BM_Q4_0Encode(benchmark::State& state) {
  const auto x = gaussian_elements(1);
  std::vector<uint8_t> out(e8kv::codebook::q4_0_bytes(kElements));
  for (auto _ : state) {
    e8kv::codebook::encode_q4_0(x.data(), kElements, out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kElements));
}
BENCHMARK(BM_Q4_0Encode);

void BM_Q4_0Decode(benchmark::State& state) {
  const auto x = gaussian_elements(2);
  std::vector<uint8_t> packed(e8kv::codebook::q4_0_bytes(kElements));
  e8kv::codebook::encode_q4_0(x.data(), kElements, packed.data());
  std::vector<float> y(kElements);
  for (auto _ : state) {
    e8kv::codebook::decode_q4_0(packed.data(), kElements, y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kElements));
}
BENCHMARK(BM_Q4_0Decode);

void BM_Q8_0Encode(benchmark::State& state) {
  const auto x = gaussian_elements(3);
  std::vector<uint8_t> out(e8kv::codebook::q8_0_bytes(kElements));
  for (auto _ : state) {
    e8kv::codebook::encode_q8_0(x.data(), kElements, out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kElements));
}
BENCHMARK(BM_Q8_0Encode);

void BM_Q8_0Decode(benchmark::State& state) {
  const auto x = gaussian_elements(4);
  std::vector<uint8_t> packed(e8kv::codebook::q8_0_bytes(kElements));
  e8kv::codebook::encode_q8_0(x.data(), kElements, packed.data());
  std::vector<float> y(kElements);
  for (auto _ : state) {
    e8kv::codebook::decode_q8_0(packed.data(), kElements, y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kElements));
}
BENCHMARK(BM_Q8_0Decode);

// 2-bit Lloyd-Max as an 8-block code (encode + decode), the scalar floor of the E8 codes.
void BM_LloydMax2RoundTrip(benchmark::State& state) {
  const auto x = gaussian_elements(5);
  std::vector<float> y(kElements);
  for (auto _ : state) {
    for (size_t b = 0; b < kElements / 8; ++b)
      e8kv::codebook::LloydMax<2>::decode(e8kv::codebook::LloydMax<2>::encode(&x[8 * b]), &y[8 * b]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kElements));
}
BENCHMARK(BM_LloydMax2RoundTrip);
}  // namespace
