// E8P and the fast-tier RVQ codes: decode and encode throughput (elements/s per core), single
// blocks and host batches (encode_batch), beside BM_Memcpy (lattice_bench.cpp) as the baseline.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/host_decode.hpp"
#include "e8kv/codebook/rvq.hpp"

namespace {
using e8kv::codebook::E81B;
using e8kv::codebook::E8P;
using e8kv::codebook::Rvq3;
using e8kv::codebook::Rvq4;

constexpr size_t kBlocks = 1 << 14;

std::vector<float> gaussian_blocks(size_t blocks, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> v(8 * blocks);
  for (auto& x : v) x = g(rng);
  return v;
}

template <class Code>
std::vector<uint32_t> encoded(const std::vector<float>& x) {
  std::vector<uint32_t> idx(x.size() / 8);
  for (size_t b = 0; b < idx.size(); ++b) idx[b] = Code::encode(&x[8 * b]);
  return idx;
}

template <class Code>
void BM_Decode(benchmark::State& state) {
  const auto idx = encoded<Code>(gaussian_blocks(kBlocks, 11));
  std::vector<float> out(8 * kBlocks);
  for (auto _ : state) {
    for (size_t b = 0; b < kBlocks; ++b) Code::decode(idx[b], &out[8 * b]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * out.size());
}

// The host table decoder (codebook/host_decode.hpp) on the same indices: the same floats as
// Code::decode (host_decode_test), what decode_vector and attend use on the CPU.
template <class Code>
void BM_DecodeTable(benchmark::State& state) {
  const auto idx = encoded<Code>(gaussian_blocks(kBlocks, 11));
  std::vector<float> out(8 * kBlocks);
  for (auto _ : state) {
    for (size_t b = 0; b < kBlocks; ++b) e8kv::codebook::host_decode::decode_block<Code>(idx[b], &out[8 * b]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * out.size());
}

template <class Code>
void BM_Encode(benchmark::State& state) {
  const auto in = gaussian_blocks(kBlocks, 12);
  std::vector<uint32_t> idx(kBlocks);
  for (auto _ : state) {
    for (size_t b = 0; b < kBlocks; ++b) idx[b] = Code::encode(&in[8 * b]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * in.size());
}

void BM_E8pDecodeLattice(benchmark::State& state) {
  const auto idx = encoded<E8P>(gaussian_blocks(kBlocks, 11));
  std::vector<float> out(8 * kBlocks);
  for (auto _ : state) {
    for (size_t b = 0; b < kBlocks; ++b) E8P::decode_lattice(idx[b], &out[8 * b]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * out.size());
}

void BM_E8pEncodeWithHitRate(benchmark::State& state) {
  const auto in = gaussian_blocks(kBlocks, 12);
  size_t fast = 0;  // measured once, outside the timed loop
  for (size_t b = 0; b < kBlocks; ++b) {
    float z[8];
    for (int i = 0; i < 8; ++i) z[i] = in[8 * b + i] * E8P::kInputScale;
    uint32_t unused = 0;
    fast += E8P::encode_lattice_fast(z, &unused);
  }
  std::vector<uint32_t> idx(kBlocks);
  for (auto _ : state) {
    for (size_t b = 0; b < kBlocks; ++b) idx[b] = E8P::encode(&in[8 * b]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * in.size());
  state.counters["fast_path_rate"] = static_cast<double>(fast) / kBlocks;
}

void BM_E8pEncodeFallbackOnly(benchmark::State& state) {
  const auto in = gaussian_blocks(kBlocks / 16, 13);
  std::vector<float> z(in.size());
  for (size_t i = 0; i < in.size(); ++i) z[i] = in[i] * E8P::kInputScale;
  std::vector<uint32_t> idx(kBlocks / 16);
  for (auto _ : state) {
    for (size_t b = 0; b < idx.size(); ++b) idx[b] = E8P::encode_lattice_exhaustive(&z[8 * b]);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * in.size());
}

/// Code::encode_batch over the same blocks (vectorized on the host; the same indices as encode).
template <class Code>
void BM_EncodeBatch(benchmark::State& state) {
  const auto in = gaussian_blocks(kBlocks, 12);
  std::vector<uint32_t> idx(kBlocks);
  for (auto _ : state) {
    Code::encode_batch(in.data(), kBlocks, idx.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * in.size());
}

#if E8KV_HOST_VECTORS
/// The batch on 128-bit vectors only (what a CPU without AVX2 runs).
void BM_E8pEncodeBatchSse2(benchmark::State& state) {
  const auto in = gaussian_blocks(kBlocks, 12);
  std::vector<uint32_t> idx(kBlocks);
  for (auto _ : state) {
    e8kv::codebook::e8p_detail::Batch::portable(in.data(), E8P::kInputScale, kBlocks, idx.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * in.size());
}
BENCHMARK(BM_E8pEncodeBatchSse2);
#endif

/// E81B on Rvq3-like residuals (Gaussian, σ ≈ 0.6 in lattice units).
template <bool kBatch>
void BM_E81bEncode(benchmark::State& state) {
  auto in = gaussian_blocks(kBlocks, 14);
  for (float& v : in) v *= 0.6f;
  std::vector<uint32_t> idx(kBlocks);
  for (auto _ : state) {
    if (kBatch) {
      E81B::encode_batch(in.data(), kBlocks, idx.data());
    } else {
      for (size_t b = 0; b < kBlocks; ++b) idx[b] = E81B::encode(&in[8 * b]);
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * in.size());
}

BENCHMARK_TEMPLATE(BM_Decode, E8P)->Name("BM_E8pDecode");
BENCHMARK(BM_E8pDecodeLattice);
BENCHMARK(BM_E8pEncodeWithHitRate)->Name("BM_E8pEncode");
BENCHMARK(BM_E8pEncodeFallbackOnly);
BENCHMARK_TEMPLATE(BM_Encode, Rvq3)->Name("BM_Rvq3Encode");
BENCHMARK_TEMPLATE(BM_Decode, Rvq3)->Name("BM_Rvq3Decode");
BENCHMARK_TEMPLATE(BM_DecodeTable, E8P)->Name("BM_E8pDecodeTable");
BENCHMARK_TEMPLATE(BM_DecodeTable, Rvq3)->Name("BM_Rvq3DecodeTable");
BENCHMARK_TEMPLATE(BM_DecodeTable, Rvq4)->Name("BM_Rvq4DecodeTable");
BENCHMARK_TEMPLATE(BM_Encode, Rvq4)->Name("BM_Rvq4Encode");
BENCHMARK_TEMPLATE(BM_Decode, Rvq4)->Name("BM_Rvq4Decode");
BENCHMARK_TEMPLATE(BM_EncodeBatch, E8P)->Name("BM_E8pEncodeBatch");
BENCHMARK_TEMPLATE(BM_EncodeBatch, Rvq3)->Name("BM_Rvq3EncodeBatch");
BENCHMARK_TEMPLATE(BM_EncodeBatch, Rvq4)->Name("BM_Rvq4EncodeBatch");
BENCHMARK_TEMPLATE(BM_E81bEncode, false)->Name("BM_E81bEncode");
BENCHMARK_TEMPLATE(BM_E81bEncode, true)->Name("BM_E81bEncodeBatch");
}  // namespace
