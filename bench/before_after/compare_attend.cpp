// Before/after timing of one source against two installed e8kv packages (issue 12's done-when):
// compress and attend on a 7B-like layer (8 KV heads x 128, 32 query heads), Gaussian K/V, seed 7.
// Only the API both versions share: Config::parse, KVCompressor::compress, KVCompressor::attend.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "e8kv/compressor.hpp"

using namespace e8kv;
constexpr int kKvHeads = 8, kQHeads = 32, kDim = 128;

template <class F>
double median_ms(F&& f, int reps, int inner) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) f();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::milli>(b - a).count() / inner);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  const char* label = argc > 1 ? argv[1] : "?";
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int64_t tokens : {4096, 32768}) {
    std::vector<float> k(static_cast<size_t>(tokens) * kKvHeads * kDim), v(k.size()), q(kQHeads * kDim), out(q.size());
    for (auto& x : k) x = g(rng);
    for (auto& x : v) x = g(rng);
    for (auto& x : q) x = g(rng);
    SequenceKV s;
    s.layers.push_back({TensorView::nhd(k.data(), DType::kF32, tokens, kKvHeads, kDim),
                        TensorView::nhd(v.data(), DType::kF32, tokens, kKvHeads, kDim)});
    for (const char* spec : {"preset=quant-k3v2", "preset=quant-k3v2,rope=pre", "preset=quant-k3v2,rope=post"}) {
      if (argc > 2 && std::string(spec) != argv[2]) continue;
      KVCompressor c({1, kKvHeads, kQHeads, kDim}, Config::parse(spec));
      double compress_ms = 0;
      if (tokens == 4096)
        compress_ms = median_ms([&] { auto cache = c.compress(s); if (cache.bytes() == 0) std::puts("?"); }, 5, 1);
      const auto cache = c.compress(s);
      const double attend_ms =
          median_ms([&] { c.attend(cache, 0, q.data(), static_cast<int32_t>(tokens), out.data()); }, 7,
                    tokens == 4096 ? 20 : 3);
      double check = 0;
      for (float x : out) check += x;
      std::printf("%s\t%lld\t%s\tcompress_ms %.2f\tattend_ms %.3f\tbits %.3f\tchecksum %.6f\n", label,
                  static_cast<long long>(tokens), spec, compress_ms, attend_ms, cache.bits_per_element(), check);
      std::fflush(stdout);
    }
  }
}
