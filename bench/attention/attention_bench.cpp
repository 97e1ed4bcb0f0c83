// Decode attention on one CPU core: e8kv::attend reading the codes, beside the strongest plain
// dense attention we can write over the same tokens, in the same run.
//
// Shape: one layer of a 7B-class model, 8 KV heads × 128, 32 query heads (GQA 4), one query token
// (the "queries:4" rows: four per call, as a speculative-decoding verify step sends).
// Dense baselines (the alternative an engine has): K/V as plain fp16 (or fp32) rows in the NHD
// layout engines use, token-outer, each K/V row read once for its 4 query heads, fused
// multiply-adds and F16C conversion, chunks of 512 tokens with their softmax states merged — the
// same kernels (src/attention/attend_kernels.inc) e8kv's fp16 window uses, so both sides get the
// same care. "cold" rotates through enough copies of the data that every call reads it from DRAM:
// more than twice the last-level cache (read from sysconf, at least 96 MiB) is touched between two
// reads of one copy. (A fixed 96 MiB, sized for a 32 MiB L3, left e8kv's 21 MB caches partly
// L3-resident on a host with 105 MiB of L3 while the 128 MiB dense copies were not.)
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

#include <unistd.h>

#include "attention/attend_kernels.hpp"
#include "e8kv/attention/attend.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/parallel.hpp"

namespace {
using namespace e8kv;

constexpr int kKvHeads = 8, kQHeads = 32, kDim = 128, kGroup = kQHeads / kKvHeads;
/// Query tokens of the multi-token rows (a speculative-decoding verify step, or a short prefill
/// chunk attending to a compressed prefix).
constexpr int kMaxQueryTokens = 4;
constexpr int64_t kChunk = 512;
/// Bytes a cold run touches between two reads of one copy.
size_t cold_bytes() {
  static const size_t bytes = [] {
    long llc = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    return std::max<size_t>(size_t{96} << 20, llc > 0 ? 2 * static_cast<size_t>(llc) : 0);
  }();
  return bytes;
}

struct Layer {
  int64_t tokens = 0;
  std::vector<float> k, v, q;  // NHD fp32, and kMaxQueryTokens query tokens
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
    slot->q.resize(static_cast<size_t>(kMaxQueryTokens) * kQHeads * kDim);
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

/// Row addressing of a dense cache: NHD (token-major: a token's heads side by side, what most
/// engines write) or HND (head-major: each head's tokens contiguous, as inside vLLM/FlashInfer
/// pages).
enum class Layout { kNhd, kHnd };

/// n_q query tokens (q and out: [n_q][kQHeads][kDim]); each chunk of K/V rows is read from memory
/// once for all of them (the later tokens find it in cache), as a multi-token decode step would.
/// KV heads [h_begin, h_end) only: threads split a layer by heads, which needs no merge.
template <class K, class Dec>
void dense_attention(const Dec& dec, Layout layout, const uint8_t* k, const uint8_t* v, size_t elem_bytes, int64_t n,
                     const float* q, float* out, int n_q, int h_begin, int h_end) {
  const size_t row = static_cast<size_t>(kDim) * elem_bytes;
  const size_t stride = layout == Layout::kNhd ? row * kKvHeads : row;
  // NHD: short chunks, every head per chunk, so a chunk's rows (all heads) stay in L2 while each
  // head takes its 256 bytes of every 2 KB token; HND: each head streams its own contiguous rows.
  const int64_t chunk = layout == Layout::kNhd ? 64 : kChunk;
  const float scale = 1.f / std::sqrt(static_cast<float>(kDim));
  alignas(32) float logits[kGroup * kChunk], w[kChunk * kGroup], acc[kGroup * kDim];
  static thread_local std::vector<float> qs, total, m_run, l_run;
  const size_t per_token = static_cast<size_t>(kQHeads) * kDim;
  qs.resize(per_token * n_q);
  total.assign(per_token * n_q, 0.f);
  m_run.assign(static_cast<size_t>(kQHeads) * n_q, -INFINITY);
  l_run.assign(static_cast<size_t>(kQHeads) * n_q, 0.f);
  for (size_t i = 0; i < qs.size(); ++i) qs[i] = q[i] * scale;
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t m = std::min(chunk, n - c0), padded = (m + 7) / 8 * 8;
    for (int h = h_begin; h < h_end; ++h)
    for (int tq = 0; tq < n_q; ++tq) {
      const size_t base = layout == Layout::kNhd ? static_cast<size_t>(c0) * stride + h * row
                                                 : (static_cast<size_t>(h) * n + static_cast<size_t>(c0)) * row;
      const float* qh = qs.data() + tq * per_token + static_cast<size_t>(h) * kGroup * kDim;
      K::template dot_rows<kGroup>(dec, k + base, stride, kDim / 8, qh, m, logits, kChunk);
      float mx[kGroup], sum[kGroup];
      for (int g = 0; g < kGroup; ++g) {
        std::fill(logits + g * kChunk + m, logits + g * kChunk + padded, -INFINITY);
        K::softmax_row(logits + g * kChunk, padded, &mx[g], &sum[g]);
        for (int64_t t = 0; t < m; ++t) w[t * kGroup + g] = logits[g * kChunk + t];
      }
      std::fill(acc, acc + kGroup * kDim, 0.f);
      K::template accumulate_rows<kGroup>(dec, v + base, stride, kDim / 8, w, m, acc);
      for (int g = 0; g < kGroup; ++g) {  // online merge of the chunk into the running state
        const size_t qh = static_cast<size_t>(tq) * kQHeads + h * kGroup + g;
        const float m2 = std::max(m_run[qh], mx[g]);
        const float a = std::exp(m_run[qh] - m2), b = std::exp(mx[g] - m2);
        l_run[qh] = l_run[qh] * a + sum[g] * b;
        float* t = total.data() + qh * kDim;
        for (int i = 0; i < kDim; ++i) t[i] = t[i] * a + acc[g * kDim + i] * b;
        m_run[qh] = m2;
      }
    }
  }
  for (int tq = 0; tq < n_q; ++tq)
    for (int h = h_begin; h < h_end; ++h)
      for (int g = 0; g < kGroup; ++g) {
        const size_t qh = static_cast<size_t>(tq) * kQHeads + h * kGroup + g;
        for (int i = 0; i < kDim; ++i) out[qh * kDim + i] = total[qh * kDim + i] / l_run[qh];
      }
}

/// threads > 1: the KV heads split evenly over the pool's tasks.
void dense_fp16(Layout layout, const uint16_t* k, const uint16_t* v, int64_t n, const float* q, float* out, int n_q = 1,
                Executor* pool = nullptr, int threads = 1) {
  using namespace attention::kernels;
  run_tasks(pool, threads, [&](int64_t task) {
    const int h_begin = static_cast<int>(task * kKvHeads / threads), h_end = static_cast<int>((task + 1) * kKvHeads / threads);
#if E8KV_HOST_AVX2_DISPATCH
    if (cpu_has_avx2_fma())
      return dense_attention<KernelsAvx2Fma>(KernelsAvx2Fma::Fp16RowDecoder{}, layout, reinterpret_cast<const uint8_t*>(k),
                                             reinterpret_cast<const uint8_t*>(v), 2, n, q, out, n_q, h_begin, h_end);
#endif
    dense_attention<KernelsPortable>(KernelsPortable::Fp16RowDecoder{}, layout, reinterpret_cast<const uint8_t*>(k),
                                     reinterpret_cast<const uint8_t*>(v), 2, n, q, out, n_q, h_begin, h_end);
  });
}

void dense_fp32(Layout layout, const float* k, const float* v, int64_t n, const float* q, float* out) {
  using namespace attention::kernels;
#if E8KV_HOST_AVX2_DISPATCH
  if (cpu_has_avx2_fma())
    return dense_attention<KernelsAvx2Fma>(KernelsAvx2Fma::Fp32RowDecoder{}, layout, reinterpret_cast<const uint8_t*>(k),
                                           reinterpret_cast<const uint8_t*>(v), 4, n, q, out, 1, 0, kKvHeads);
#endif
  dense_attention<KernelsPortable>(KernelsPortable::Fp32RowDecoder{}, layout, reinterpret_cast<const uint8_t*>(k),
                                   reinterpret_cast<const uint8_t*>(v), 4, n, q, out, 1, 0, kKvHeads);
}

/// NHD rows [tokens, heads, d] rearranged as HND [heads, tokens, d].
template <class T>
std::vector<T> to_hnd(const std::vector<T>& nhd, int64_t n) {
  std::vector<T> out(nhd.size());
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < kKvHeads; ++h)
      std::copy_n(&nhd[(static_cast<size_t>(t) * kKvHeads + h) * kDim], kDim, &out[(static_cast<size_t>(h) * n + t) * kDim]);
  return out;
}

/// Copies of a data set enough to make every read a DRAM read when cycled (1 when hot).
size_t copies_for(size_t bytes, bool cold) { return cold ? std::max<size_t>(2, cold_bytes() / std::max<size_t>(bytes, 1) + 1) : 1; }

void BM_DenseFp16(benchmark::State& state) {
  const auto& d = layer(state.range(0));
  const bool cold = state.range(1) != 0;
  const Layout layout = state.range(2) ? Layout::kHnd : Layout::kNhd;
  const int n_q = static_cast<int>(state.range(3));
  const int threads = static_cast<int>(state.range(4));
  std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
  const size_t elems = d.k.size();
  const size_t copies = copies_for(4 * elems, cold);
  std::vector<uint16_t> k16(elems), v16(elems);
  floats_to_fp16_bits(d.k.data(), k16.data(), elems);
  floats_to_fp16_bits(d.v.data(), v16.data(), elems);
  if (layout == Layout::kHnd) {
    k16 = to_hnd(k16, d.tokens);
    v16 = to_hnd(v16, d.tokens);
  }
  std::vector<std::vector<uint16_t>> k(copies, k16), v(copies, v16);
  std::vector<float> out(static_cast<size_t>(n_q) * kQHeads * kDim);
  size_t i = 0;
  for (auto _ : state) {
    dense_fp16(layout, k[i].data(), v[i].data(), d.tokens, d.q.data(), out.data(), n_q, pool.get(), threads);
    benchmark::DoNotOptimize(out.data());
    i = (i + 1) % copies;
  }
  state.counters["bytes_per_token_head"] = 2.0 * 2 * kDim;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(4 * elems));
}
// Args: tokens, cold, layout (0 NHD, 1 HND), query tokens per call, threads (KV heads split).
BENCHMARK(BM_DenseFp16)
    ->ArgNames({"tokens", "cold", "hnd", "queries", "threads"})
    ->ArgsProduct({{4096, 32768}, {0, 1}, {0, 1}, {1}, {1}})
    ->ArgsProduct({{4096, 32768}, {0, 1}, {1}, {kMaxQueryTokens}, {1}})
    ->ArgsProduct({{32768}, {0, 1}, {1}, {1}, {2}})
    ->Unit(benchmark::kMillisecond);

void BM_DenseFp32(benchmark::State& state) {
  const auto& d = layer(state.range(0));
  const bool cold = state.range(1) != 0;
  const Layout layout = state.range(2) ? Layout::kHnd : Layout::kNhd;
  const size_t copies = copies_for(8 * d.k.size(), cold);
  std::vector<std::vector<float>> k(copies, layout == Layout::kHnd ? to_hnd(d.k, d.tokens) : d.k),
      v(copies, layout == Layout::kHnd ? to_hnd(d.v, d.tokens) : d.v);
  std::vector<float> out(static_cast<size_t>(kQHeads) * kDim);
  size_t i = 0;
  for (auto _ : state) {
    dense_fp32(layout, k[i].data(), v[i].data(), d.tokens, d.q.data(), out.data());
    benchmark::DoNotOptimize(out.data());
    i = (i + 1) % copies;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(8 * d.k.size()));
}
BENCHMARK(BM_DenseFp32)->ArgNames({"tokens", "cold", "hnd"})->ArgsProduct({{4096, 32768}, {0, 1}, {0, 1}})->Unit(benchmark::kMillisecond);

// ---- the kernels alone, data in L1 ---------------------------------------------------------------

/// What each inner loop of a decode step costs per stored token (one KV head, its 4 query heads),
/// on 64 tokens (a sub-tile of attend) that sit in L1: the compute floor of each part, without memory or bookkeeping.
/// Parts: 0 key scores from E8P codes, 1 from Rvq3 codes, 2 from fp16 rows (dense), 3 the RoPE-
/// residual mean term (the same kernel over 2·64 floats of [cos | sin] per token), 4 value sums
/// of E8P codes, 5 of fp16 rows (dense). A dense step is 2 + 5; an e8kv K3V2 step 1 + 3 + 4.
void BM_AttendKernel(benchmark::State& state) {
  using namespace attention::kernels;
  const int part = static_cast<int>(state.range(0));
  // head_dim / 8 and the token count from the arguments: constants let the compiler specialize the
  // kernels into code the library never runs (accumulators kept in memory).
  const int blocks = static_cast<int>(state.range(1));
  const int64_t n = state.range(2);
  const int d = 8 * blocks;
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<uint8_t> codes(static_cast<size_t>(n) * blocks * 3);
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  std::vector<float> floats(static_cast<size_t>(n) * d), q(static_cast<size_t>(kGroup) * d), w(static_cast<size_t>(n) * kGroup);
  for (auto& x : floats) x = g(rng);
  for (auto& x : q) x = g(rng);
  for (auto& x : w) x = std::abs(g(rng)) / static_cast<float>(n);
  std::vector<uint16_t> halves(floats.size());
  floats_to_fp16_bits(floats.data(), halves.data(), floats.size());
  std::vector<float> dots(static_cast<size_t>(kGroup) * n), acc(static_cast<size_t>(kGroup) * d);
  const auto* h16 = reinterpret_cast<const uint8_t*>(halves.data());
  const auto* f32 = reinterpret_cast<const uint8_t*>(floats.data());
  auto run = [&](auto k) {
    using K = decltype(k);
    const auto& rows = decode_rows();
    for (auto _ : state) {
      switch (part) {
        case 0: K::template dot_rows<kGroup>(typename K::E8pRowDecoder{&rows}, codes.data(), 2 * blocks, blocks, q.data(), n, dots.data(), n); break;
        case 1: K::template dot_rows<kGroup>(typename K::Rvq3RowDecoder{&rows}, codes.data(), 3 * blocks, blocks, q.data(), n, dots.data(), n); break;
        case 2: K::template dot_rows<kGroup>(typename K::Fp16RowDecoder{}, h16, 2 * d, blocks, q.data(), n, dots.data(), n); break;
        case 3: K::template dot_rows<kGroup>(typename K::Fp32RowDecoder{}, f32, 4 * d, blocks, q.data(), n, dots.data(), n); break;
        case 4: K::template accumulate_rows<kGroup>(typename K::E8pRowDecoder{&rows}, codes.data(), 2 * blocks, blocks, w.data(), n, acc.data()); break;
        default: K::template accumulate_rows<kGroup>(typename K::Fp16RowDecoder{}, h16, 2 * d, blocks, w.data(), n, acc.data()); break;
      }
      benchmark::DoNotOptimize(dots.data());
      benchmark::DoNotOptimize(acc.data());
    }
  };
#if E8KV_HOST_AVX2_DISPATCH
  if (cpu_has_avx2_fma()) run(KernelsAvx2Fma{});
  else
#endif
    run(KernelsPortable{});
  state.counters["ns_per_token"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetLabel(std::vector<const char*>{"keys E8P", "keys Rvq3", "keys fp16", "mean term", "values E8P", "values fp16"}[static_cast<size_t>(part)]);
}
BENCHMARK(BM_AttendKernel)->ArgNames({"part", "blocks", "tokens"})->ArgsProduct({{0, 1, 2, 3, 4, 5}, {kDim / 8}, {64}});

#if E8KV_HOST_AVX2_DISPATCH && (defined(__x86_64__) || defined(__i386__))
/// 256-bit fused multiply-adds per second of one core when nothing else limits them: ten
/// independent chains (more than latency × ports), the registers pinned by an empty asm so the
/// loop stays in them. The yardstick of BM_AttendKernel: a kernel near this rate is compute-bound.
__attribute__((target("avx2,fma"), noinline)) double fma_chains(int64_t n) {
  using v8 = float __attribute__((vector_size(32)));
  v8 a0 = {1, 1, 1, 1, 1, 1, 1, 1}, a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0;
  const v8 b = a0 * 0.999999f, c = a0 * 1e-7f;
  for (int64_t k = 0; k < n; ++k) {
    a0 = __builtin_ia32_vfmaddps256(a0, b, c);
    a1 = __builtin_ia32_vfmaddps256(a1, b, c);
    a2 = __builtin_ia32_vfmaddps256(a2, b, c);
    a3 = __builtin_ia32_vfmaddps256(a3, b, c);
    a4 = __builtin_ia32_vfmaddps256(a4, b, c);
    a5 = __builtin_ia32_vfmaddps256(a5, b, c);
    a6 = __builtin_ia32_vfmaddps256(a6, b, c);
    a7 = __builtin_ia32_vfmaddps256(a7, b, c);
    a8 = __builtin_ia32_vfmaddps256(a8, b, c);
    a9 = __builtin_ia32_vfmaddps256(a9, b, c);
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9));
  }
  const v8 r = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9;
  return r[0];
}

void BM_FmaPeak(benchmark::State& state) {
  if (!cpu_has_avx2_fma()) {
    state.SkipWithError("no AVX2 + FMA on this CPU");
    return;
  }
  const int64_t n = state.range(0);
  for (auto _ : state) benchmark::DoNotOptimize(fma_chains(n));
  state.counters["fma256_per_s"] = benchmark::Counter(static_cast<double>(10 * n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_FmaPeak)->Arg(1 << 20);
#endif

// ---- e8kv ---------------------------------------------------------------------------------------

Config bench_config(const std::string& spec) { return Config::parse(spec); }

void attend_bench(benchmark::State& state, const std::string& spec) {
  const auto& d = layer(state.range(0));
  const bool cold = state.range(1) != 0;
  const int threads = static_cast<int>(state.range(2));
  const int n_q = static_cast<int>(state.range(3));
  KVCompressor c({1, kKvHeads, kQHeads, kDim}, bench_config(spec));
  SequenceKV seq;
  seq.layers.push_back({TensorView::nhd(d.k.data(), DType::kF32, d.tokens, kKvHeads, kDim),
                        TensorView::nhd(d.v.data(), DType::kF32, d.tokens, kKvHeads, kDim)});
  std::vector<float> qobs(static_cast<size_t>(32) * kQHeads * kDim);
  const size_t one_token = static_cast<size_t>(kQHeads) * kDim;
  for (size_t i = 0; i < qobs.size(); ++i) qobs[i] = d.q[i % one_token];
  LayerQueries lq;
  lq.queries = TensorView::nhd(qobs.data(), DType::kF32, 32, kQHeads, kDim);
  std::vector<LayerQueries> queries{lq};
  const CompressedKV first = c.compress(seq, &queries);
  const size_t copies = copies_for(first.bytes(), cold);
  std::vector<CompressedKV> caches(copies, first);
  std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
  std::vector<float> out(static_cast<size_t>(n_q) * kQHeads * kDim), lse(static_cast<size_t>(n_q) * kQHeads);
  size_t i = 0;
  for (auto _ : state) {
    AttendRequest request;
    request.cache = &caches[i];
    request.n_tokens = n_q;
    request.q = d.q.data();
    request.out = out.data();
    request.lse = lse.data();
    attend_batch({request}, {pool.get()});
    benchmark::DoNotOptimize(out.data());
    i = (i + 1) % copies;
  }
  state.counters["bits_per_element"] = first.bits_per_element();
  state.counters["bytes_per_token_head"] = static_cast<double>(first.bytes()) / (static_cast<double>(d.tokens) * kKvHeads);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(first.bytes()));
}

// Args: tokens, cold, threads, query tokens per call (one request of attend_batch).
BENCHMARK_CAPTURE(attend_bench, k3v2_residual, std::string("preset=quant-k3v2,rope=residual"))
    ->ArgNames({"tokens", "cold", "threads", "queries"})
    ->ArgsProduct({{4096, 32768}, {0, 1}, {1}, {1}})
    ->ArgsProduct({{32768}, {0, 1}, {2}, {1}})
    ->ArgsProduct({{4096, 32768}, {0, 1}, {1}, {kMaxQueryTokens}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(attend_bench, k2v2_residual, std::string("preset=quant-k2v2,rope=residual"))
    ->ArgNames({"tokens", "cold", "threads", "queries"})
    ->ArgsProduct({{4096, 32768}, {0, 1}, {1}, {1}})
    ->Unit(benchmark::kMillisecond);
// The 5 % code tier: its tokens' 4-bit codes read in chunks of their own (compare k3v2_residual).
BENCHMARK_CAPTURE(attend_bench, k3v2_code_tier, std::string("preset=quant-k3v2,rope=residual,code_tier=0.05"))
    ->ArgNames({"tokens", "cold", "threads", "queries"})
    ->ArgsProduct({{4096, 32768}, {0, 1}, {1}, {1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(attend_bench, k4v4_residual, std::string("preset=quant-k4v4,rope=residual"))
    ->ArgNames({"tokens", "cold", "threads", "queries"})
    ->Args({32768, 1, 1, 1})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(attend_bench, k3v2_post, std::string("preset=quant-k3v2,rope=post"))
    ->ArgNames({"tokens", "cold", "threads", "queries"})
    ->Args({32768, 1, 1, 1})
    ->Unit(benchmark::kMillisecond);
// Pre-RoPE codes (format v1/v2 caches): keys decoded ahead, RoPE re-applied per key.
BENCHMARK_CAPTURE(attend_bench, k3v2_pre, std::string("preset=quant-k3v2,rope=pre"))
    ->ArgNames({"tokens", "cold", "threads", "queries"})
    ->Args({4096, 0, 1, 1})
    ->Unit(benchmark::kMillisecond);

}  // namespace
