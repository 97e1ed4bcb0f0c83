// E8P / Rvq3 encode speed, batch (vector lanes) and one block at a time (scalar certified search).
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
using namespace e8kv::codebook;
template <class F> double best_ns(F&& f, size_t n) {
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    auto a = std::chrono::steady_clock::now(); f(); auto b = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(b - a).count() / n);
  }
  return best;
}
int main(int argc, char** argv) {
  const size_t n = 1 << 18;
  std::mt19937 rng(3); std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(8 * n); for (auto& v : x) v = g(rng);
  std::vector<uint32_t> idx(n); uint64_t sum = 0;
  const double batch = best_ns([&] { E8P::encode_batch(x.data(), n, idx.data()); }, n);
  for (auto i : idx) sum += i;
  const double single = best_ns([&] { for (size_t b = 0; b < n; ++b) idx[b] = E8P::encode(&x[8 * b]); }, n);
  for (auto i : idx) sum += i;
  const double rvq = best_ns([&] { Rvq3::encode_batch(x.data(), n, idx.data()); }, n);
  for (auto i : idx) sum += i;
  std::printf("%s E8P batch %.1f ns/block, one block %.1f ns/block, Rvq3 batch %.1f ns/block (sum %llu)\n",
              argc > 1 ? argv[1] : "", batch, single, rvq, (unsigned long long)sum);
}
