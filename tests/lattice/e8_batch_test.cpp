// The batched E8 nearest point must give exactly the scalar nearest_e8 / nearest_e8_twice
// results (same bits, same tie rules) for every input, in every SIMD variant, at every size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "e8kv/lattice/e8.hpp"
#include "e8kv/lattice/e8_batch.hpp"
#include "testing/test_util.hpp"

namespace {
using e8kv::lattice::nearest_e8;
using e8kv::lattice::nearest_e8_batch;
using e8kv::lattice::nearest_e8_twice;
using e8kv::lattice::nearest_e8_twice_batch;

const std::vector<size_t> kSizes = {0, 1, 7, 8, 9, 15, 16, 17, 1000};

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Every implementation the header can run on this machine, as (name, twice fn, point fn).
struct Variant {
  std::string name;
  void (*twice)(const float*, int32_t*, size_t);
  void (*point)(const float*, float*, size_t);
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({"public", nearest_e8_twice_batch, nearest_e8_batch});
  v.push_back({"scalar-loop", e8kv::lattice::detail::nearest_e8_twice_blocks_scalar,
               e8kv::lattice::detail::nearest_e8_blocks_scalar});
#if E8KV_E8_BATCH_SIMD
  using e8kv::lattice::detail::e8_batch_body;
  using e8kv::lattice::detail::e8_f32x4;
  v.push_back({"simd4", [](const float* x, int32_t* t, size_t n) { e8_batch_body<e8_f32x4, true>(x, t, n); },
               [](const float* x, float* y, size_t n) { e8_batch_body<e8_f32x4, false>(x, y, n); }});
#endif
#if E8KV_E8_BATCH_AVX2
  if (e8kv::lattice::detail::e8_cpu_has_avx2()) {
    v.push_back({"avx2", [](const float* x, int32_t* t, size_t n) { e8kv::lattice::detail::e8_batch_avx2(x, t, n, true); },
                 [](const float* x, float* y, size_t n) { e8kv::lattice::detail::e8_batch_avx2(x, y, n, false); }});
  } else {
    std::printf("[note] no AVX2 on this CPU: the avx2 variant is not tested here\n");
  }
#endif
  return v;
}

// Compares every variant with the scalar functions on n blocks of x. Returns the number of
// blocks checked (so callers can assert that real work happened).
size_t expect_identical(const std::vector<float>& x, size_t n, const std::string& what) {
  // References, block by block.
  std::vector<int32_t> ref_twice(8 * n);
  std::vector<float> ref_point(8 * n);
  for (size_t b = 0; b < n; ++b) {
    int64_t t[8];
    nearest_e8_twice(&x[8 * b], t);
    float y[8];
    nearest_e8(&x[8 * b], y);
    for (int i = 0; i < 8; ++i) {
      EXPECT_LE(std::llabs(t[i]), int64_t{1} << 22);
      ref_twice[8 * b + i] = static_cast<int32_t>(t[i]);
      ref_point[8 * b + i] = y[i];
    }
  }
  const int32_t sentinel_i = 0x5A5A5A5A;
  const float sentinel_f = -777.0f;
  for (const auto& v : variants()) {
    std::vector<int32_t> twice(8 * n + 8, sentinel_i);
    std::vector<float> point(8 * n + 8, sentinel_f);
    v.twice(x.data(), twice.data(), n);
    v.point(x.data(), point.data(), n);
    for (size_t e = 0; e < 8 * n; ++e) {
      if (twice[e] != ref_twice[e] || bits_of(point[e]) != bits_of(ref_point[e])) {
        const size_t b = e / 8;
        std::string in;
        for (int i = 0; i < 8; ++i) in += std::to_string(x[8 * b + i]) + " ";
        ADD_FAILURE() << what << " [" << v.name << "] n=" << n << " block " << b << " coord " << e % 8
                      << ": twice " << twice[e] << " vs " << ref_twice[e] << ", point " << point[e] << " vs "
                      << ref_point[e] << "; input " << in;
        return 0;
      }
    }
    for (size_t e = 8 * n; e < 8 * n + 8; ++e) {  // nothing written past the end
      EXPECT_EQ(twice[e], sentinel_i) << v.name;
      EXPECT_EQ(bits_of(point[e]), bits_of(sentinel_f)) << v.name;
    }
    // In place (y == x).
    std::vector<float> inplace(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(8 * n));
    v.point(inplace.data(), inplace.data(), n);
    for (size_t e = 0; e < 8 * n; ++e) {
      if (bits_of(inplace[e]) != bits_of(ref_point[e])) {
        ADD_FAILURE() << what << " [" << v.name << "] in place, element " << e;
        return 0;
      }
    }
  }
  return n;
}

// A pool of awkward values: ties, boundaries, non-finite, tiny, huge.
std::vector<float> special_values() {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float denorm = std::numeric_limits<float>::denorm_min();
  const float lim = 1048576.0f;  // kMaxAbs = 2^20
  std::vector<float> v = {0.0f, -0.0f, nan, -nan, inf, -inf, 1e30f, -1e30f,
                          std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          denorm, -denorm, std::numeric_limits<float>::min(), -std::numeric_limits<float>::min(),
                          1e-30f, -1e-30f, lim, -lim, lim + 0.5f, -lim - 0.5f, lim - 0.5f, -lim + 0.5f,
                          lim - 0.125f, lim + 1.0f, 4194304.0f, -8388608.0f, 12582912.0f, 16777216.0f};
  for (int k = -12; k <= 12; ++k) v.push_back(k * 0.25f);  // integers, halves and quarters
  for (float c : {0.5f, -0.5f, 1.5f, -1.5f, 0.25f, -0.25f, 0.75f}) {
    v.push_back(std::nextafter(c, inf));
    v.push_back(std::nextafter(c, -inf));
  }
  return v;
}

TEST(E8Batch, GaussianAtSeveralSpreads) {
  auto rng = e8kv::test::seeded_rng(201);
  size_t checked = 0;
  for (double sigma : {0.05, 0.3, 1.0, 3.0, 30.0, 1e4, 1e6}) {
    std::normal_distribution<float> g(0.0f, static_cast<float>(sigma));
    const size_t n = 150000;
    std::vector<float> x(8 * n);
    for (auto& v : x) v = g(rng);
    checked += expect_identical(x, n, "gaussian sigma=" + std::to_string(sigma));
  }
  EXPECT_EQ(checked, 7u * 150000u);
}

TEST(E8Batch, Uniform) {
  auto rng = e8kv::test::seeded_rng(202);
  size_t checked = 0;
  for (float range : {1.0f, 4.0f, 100.0f}) {
    std::uniform_real_distribution<float> u(-range, range);
    const size_t n = 150000;
    std::vector<float> x(8 * n);
    for (auto& v : x) v = u(rng);
    checked += expect_identical(x, n, "uniform " + std::to_string(range));
  }
  EXPECT_EQ(checked, 3u * 150000u);
}

TEST(E8Batch, ExactTiesOnGrids) {
  auto rng = e8kv::test::seeded_rng(203);
  // Coordinates on the integer, half-integer and quarter grids: every rounding, argmax and coset
  // tie the scalar rules decide happens here many times.
  size_t checked = 0;
  for (int denominator : {1, 2, 4, 8}) {
    std::uniform_int_distribution<int> k(-6 * denominator, 6 * denominator);
    const size_t n = 200000;
    std::vector<float> x(8 * n);
    for (auto& v : x) v = static_cast<float>(k(rng)) / static_cast<float>(denominator);
    checked += expect_identical(x, n, "grid 1/" + std::to_string(denominator));
  }
  // All coordinates equal (whole-block ties), e.g. (¼)^8 and (½)^8.
  std::vector<float> same;
  for (int k = -16; k <= 16; ++k)
    for (int i = 0; i < 8; ++i) same.push_back(k * 0.125f);
  checked += expect_identical(same, same.size() / 8, "constant blocks");
  EXPECT_EQ(checked, 4u * 200000u + 33u);
}

TEST(E8Batch, SpecialValuesMixed) {
  auto rng = e8kv::test::seeded_rng(204);
  const auto pool = special_values();
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  std::uniform_int_distribution<int> mode(0, 3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const size_t n = 300000;
  std::vector<float> x(8 * n);
  for (auto& v : x) v = mode(rng) == 0 ? g(rng) : pool[pick(rng)];
  EXPECT_EQ(expect_identical(x, n, "special mix"), n);
  // Every special value alone in every position of an otherwise zero or Gaussian block.
  std::vector<float> single;
  for (float s : pool)
    for (int pos = 0; pos < 8; ++pos)
      for (int background = 0; background < 2; ++background)
        for (int i = 0; i < 8; ++i) single.push_back(i == pos ? s : (background ? g(rng) : 0.0f));
  EXPECT_EQ(expect_identical(single, single.size() / 8, "special single"), single.size() / 8);
}

TEST(E8Batch, EverySizeAroundTheTileWidths) {
  auto rng = e8kv::test::seeded_rng(205);
  std::normal_distribution<float> g(0.0f, 2.0f);
  const auto pool = special_values();
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  for (size_t n : kSizes) {
    std::vector<float> x(8 * n);
    for (size_t e = 0; e < x.size(); ++e) x[e] = (e % 5 == 0) ? pool[pick(rng)] : g(rng);
    EXPECT_EQ(expect_identical(x, n, "size"), n);
  }
  // Exact-size buffers (no slack after the last block) must not be read past their end.
  for (size_t n : kSizes) {
    std::vector<float> x(8 * n);
    for (auto& v : x) v = g(rng);
    std::vector<int32_t> t(8 * n);
    std::vector<float> y(8 * n);
    nearest_e8_twice_batch(x.data(), t.data(), n);
    nearest_e8_batch(x.data(), y.data(), n);
    for (size_t b = 0; b < n; ++b) {
      int64_t r[8];
      nearest_e8_twice(&x[8 * b], r);
      for (int i = 0; i < 8; ++i) ASSERT_EQ(t[8 * b + i], r[i]);
    }
  }
  // n = 0 touches nothing (null pointers are fine).
  nearest_e8_twice_batch(nullptr, nullptr, 0);
  nearest_e8_batch(nullptr, nullptr, 0);
}

TEST(E8Batch, OutputsAreLatticePoints) {
  auto rng = e8kv::test::seeded_rng(206);
  std::normal_distribution<float> g(0.0f, 1.5f);
  const size_t n = 20000;
  std::vector<float> x(8 * n);
  for (auto& v : x) v = g(rng);
  std::vector<int32_t> t(8 * n);
  std::vector<float> y(8 * n);
  nearest_e8_twice_batch(x.data(), t.data(), n);
  nearest_e8_batch(x.data(), y.data(), n);
  for (size_t b = 0; b < n; ++b) {
    int64_t tw[8];
    for (int i = 0; i < 8; ++i) tw[i] = t[8 * b + i];
    ASSERT_TRUE(e8kv::lattice::is_e8_twice(tw)) << b;
    ASSERT_TRUE(e8kv::lattice::is_e8(&y[8 * b])) << b;
    for (int i = 0; i < 8; ++i) ASSERT_EQ(y[8 * b + i] * 2.0f, static_cast<float>(t[8 * b + i]));
  }
}

}  // namespace
