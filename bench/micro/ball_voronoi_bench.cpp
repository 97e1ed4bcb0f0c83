// Quality-tier ball codes (Ball3, Ball4) and table-free Voronoi codes (K = 1..4): encode and
// decode throughput in elements/s per core on i.i.d. N(0,1) blocks, beside BM_Memcpy
// (lattice_bench.cpp) as the baseline. BM_VoronoiNearestE8 is the nearest-point step the Voronoi
// codes use, to compare with BM_NearestE8Scalar.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "e8kv/codebook/ball.hpp"
#include "e8kv/codebook/voronoi.hpp"

namespace {
using e8kv::codebook::Ball3;
using e8kv::codebook::Ball4;
using e8kv::codebook::Voronoi;

constexpr size_t kBallVoronoiBlocks = 1 << 14;

std::vector<float> normal_blocks(size_t blocks, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> v(8 * blocks);
  for (auto& x : v) x = g(rng);
  return v;
}

template <class Code>
void BM_BallVoronoiEncode(benchmark::State& state) {
  const auto in = normal_blocks(kBallVoronoiBlocks, 21);
  std::vector<uint32_t> idx(kBallVoronoiBlocks);
  for (auto _ : state) {
    for (size_t b = 0; b < kBallVoronoiBlocks; ++b) idx[b] = Code::encode(&in[8 * b]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * in.size());
}

template <class Code>
void BM_BallVoronoiDecode(benchmark::State& state) {
  const auto in = normal_blocks(kBallVoronoiBlocks, 22);
  std::vector<uint32_t> idx(kBallVoronoiBlocks);
  for (size_t b = 0; b < kBallVoronoiBlocks; ++b) idx[b] = Code::encode(&in[8 * b]);
  std::vector<float> out(in.size());
  for (auto _ : state) {
    for (size_t b = 0; b < kBallVoronoiBlocks; ++b) Code::decode(idx[b], &out[8 * b]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * out.size());
}

void BM_VoronoiNearestE8(benchmark::State& state) {
  const auto in = normal_blocks(kBallVoronoiBlocks, 23);
  std::vector<int32_t> out(in.size());
  for (auto _ : state) {
    for (size_t b = 0; b < kBallVoronoiBlocks; ++b)
      e8kv::codebook::detail::nearest_e8_twice_fast(&in[8 * b], &out[8 * b]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * in.size());
}

BENCHMARK(BM_VoronoiNearestE8);
BENCHMARK_TEMPLATE(BM_BallVoronoiEncode, Voronoi<1>);
BENCHMARK_TEMPLATE(BM_BallVoronoiEncode, Voronoi<2>);
BENCHMARK_TEMPLATE(BM_BallVoronoiEncode, Voronoi<3>);
BENCHMARK_TEMPLATE(BM_BallVoronoiEncode, Voronoi<4>);
BENCHMARK_TEMPLATE(BM_BallVoronoiDecode, Voronoi<1>);
BENCHMARK_TEMPLATE(BM_BallVoronoiDecode, Voronoi<2>);
BENCHMARK_TEMPLATE(BM_BallVoronoiDecode, Voronoi<3>);
BENCHMARK_TEMPLATE(BM_BallVoronoiDecode, Voronoi<4>);
BENCHMARK_TEMPLATE(BM_BallVoronoiEncode, Ball3);
BENCHMARK_TEMPLATE(BM_BallVoronoiEncode, Ball4);
BENCHMARK_TEMPLATE(BM_BallVoronoiDecode, Ball3);
BENCHMARK_TEMPLATE(BM_BallVoronoiDecode, Ball4);

}  // namespace
