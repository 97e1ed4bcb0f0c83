// Dense causal attention over uncompressed rows (attention/dense.hpp) against a float64 reference:
// outputs and log-sum-exp, causal by position (with gaps), sliding windows, grouped-query heads,
// head_dim 8 / 24 / 64 / 128 / 256, fp16 and fp32 rows, strided rows; bit-identical for any thread count;
// bad arguments refused by name.
#include "e8kv/attention/dense.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/parallel.hpp"

namespace e8kv {
namespace {

constexpr uint64_t kSeed = 4622;

struct Case {
  int H, Q, d;
  int64_t rows, tokens;
  DType dtype;
  int32_t window;
  int64_t pad;  // extra elements per row (row_stride > H·d)
};

struct Data {
  std::vector<float> k, v, q;  // rows [rows][stride], queries [tokens][Q][d]
  std::vector<uint16_t> k16, v16;
  std::vector<int32_t> pos, qpos;
  int64_t stride = 0;
};

Data make(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  Data x;
  x.stride = c.H * c.d + c.pad;
  x.k.resize(static_cast<size_t>(c.rows * x.stride));
  x.v.resize(x.k.size());
  for (auto& e : x.k) e = 1.5f * g(rng);
  for (auto& e : x.v) e = g(rng);
  if (c.dtype == DType::kF16) {  // the rows the reference reads are the fp16 ones
    for (auto* f : {&x.k, &x.v}) {
      auto& h = f == &x.k ? x.k16 : x.v16;
      h.resize(f->size());
      for (size_t i = 0; i < f->size(); ++i) {
        h[i] = float_to_fp16_bits((*f)[i]);
        (*f)[i] = fp16_bits_to_float(h[i]);
      }
    }
  }
  int32_t p = 3;
  for (int64_t r = 0; r < c.rows; ++r) {
    x.pos.push_back(p);
    p += 1 + static_cast<int32_t>(rng() % 3 == 0);  // gaps: evicted or other sequences' positions
  }
  x.q.resize(static_cast<size_t>(c.tokens * c.Q * c.d));
  for (auto& e : x.q) e = g(rng);
  for (int64_t t = 0; t < c.tokens; ++t)  // queries at row positions (the prompt's own) and between
    x.qpos.push_back(c.rows == 0 ? 5 : x.pos[static_cast<size_t>((t * 7) % c.rows)] + static_cast<int32_t>(t % 2));
  return x;
}

// float64 reference: out [tokens][Q][d], lse [tokens][Q].
void reference(const Case& c, const Data& x, float scale, std::vector<double>& out, std::vector<double>& lse) {
  const int G = c.Q / c.H;
  out.assign(static_cast<size_t>(c.tokens * c.Q * c.d), 0.0);
  lse.assign(static_cast<size_t>(c.tokens * c.Q), -std::numeric_limits<double>::infinity());
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int qh = 0; qh < c.Q; ++qh) {
      const int h = qh / G;
      const float* q = &x.q[static_cast<size_t>((t * c.Q + qh) * c.d)];
      std::vector<double> s;
      std::vector<int64_t> rows;
      for (int64_t r = 0; r < c.rows; ++r) {
        const int32_t p = x.pos[static_cast<size_t>(r)], qp = x.qpos[static_cast<size_t>(t)];
        if (p > qp || (c.window > 0 && p <= qp - c.window)) continue;
        double dot = 0;
        for (int i = 0; i < c.d; ++i) dot += double(q[i]) * x.k[static_cast<size_t>(r * x.stride + h * c.d + i)];
        s.push_back(dot * scale);
        rows.push_back(r);
      }
      if (s.empty()) continue;
      double m = -1e300, z = 0;
      for (double v : s) m = std::max(m, v);
      for (double v : s) z += std::exp(v - m);
      for (size_t k = 0; k < s.size(); ++k) {
        const double w = std::exp(s[k] - m) / z;
        for (int i = 0; i < c.d; ++i)
          out[static_cast<size_t>((t * c.Q + qh) * c.d + i)] += w * x.v[static_cast<size_t>(rows[k] * x.stride + h * c.d + i)];
      }
      lse[static_cast<size_t>(t * c.Q + qh)] = m + std::log(z);
    }
}

void run(const Case& c, const Data& x, Executor* ex, std::vector<float>& out, std::vector<float>& lse) {
  DenseRows kv;
  kv.dtype = c.dtype;
  kv.keys = c.dtype == DType::kF16 ? static_cast<const void*>(x.k16.data()) : x.k.data();
  kv.values = c.dtype == DType::kF16 ? static_cast<const void*>(x.v16.data()) : x.v.data();
  kv.n = c.rows;
  kv.positions = x.pos.data();
  kv.row_stride = x.stride;
  out.assign(static_cast<size_t>(c.tokens * c.Q * c.d), -7.f);
  lse.assign(static_cast<size_t>(c.tokens * c.Q), -7.f);
  AttendOptions o;
  o.executor = ex;
  dense_attention(kv, DenseShape{c.H, c.Q, c.d, 0.f, c.window}, x.q.data(), x.qpos.data(), c.tokens, out.data(),
                  lse.data(), o);
}

TEST(DenseAttention, MatchesFloat64Reference) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const Case cases[] = {
      {2, 8, 64, 200, 37, DType::kF16, 0, 0},   {1, 4, 128, 130, 17, DType::kF32, 0, 0},
      {4, 4, 64, 65, 64, DType::kF16, 0, 5},    {1, 1, 256, 90, 9, DType::kF16, 0, 0},
      {2, 6, 64, 300, 40, DType::kF32, 48, 0},  {3, 9, 128, 1, 3, DType::kF16, 0, 0},
      {2, 14, 64, 129, 129, DType::kF16, 16, 0}, {2, 4, 64, 0, 4, DType::kF32, 0, 0},
      {2, 4, 8, 70, 20, DType::kF32, 0, 3},     {1, 3, 24, 80, 18, DType::kF16, 0, 0},  // odd blocks of 8
  };
  uint64_t seed = kSeed;
  for (const Case& c : cases) {
    SCOPED_TRACE("H " + std::to_string(c.H) + " Q " + std::to_string(c.Q) + " d " + std::to_string(c.d) + " rows " +
                 std::to_string(c.rows) + " tokens " + std::to_string(c.tokens) + " " + to_string(c.dtype) +
                 " window " + std::to_string(c.window));
    const Data x = make(c, ++seed);
    std::vector<double> ref_out, ref_lse;
    const float scale = 1.f / std::sqrt(static_cast<float>(c.d));
    reference(c, x, scale, ref_out, ref_lse);
    std::vector<float> out, lse;
    run(c, x, nullptr, out, lse);
    for (size_t i = 0; i < ref_lse.size(); ++i) {
      if (std::isinf(ref_lse[i])) {
        EXPECT_EQ(lse[i], -std::numeric_limits<float>::infinity()) << i;
        for (int e = 0; e < c.d; ++e) ASSERT_EQ(out[i * c.d + e], 0.f);
        continue;
      }
      EXPECT_NEAR(lse[i], ref_lse[i], 2e-5 * (1 + std::fabs(ref_lse[i]))) << i;
      for (int e = 0; e < c.d; ++e) ASSERT_NEAR(out[i * c.d + e], ref_out[i * c.d + e], 2e-5) << i << " " << e;
    }
    // Any thread count: the same bits.
    ThreadPool pool(3);
    std::vector<float> out3, lse3;
    run(c, x, &pool, out3, lse3);
    EXPECT_EQ(out, out3);
    EXPECT_EQ(lse, lse3);
  }
}

// Rows without positions sit at 0, 1, 2, ...: the same bits as those positions given, with and
// without a window (the engine's dense cache and e8kv-eval's tails pass none).
TEST(DenseAttention, NoPositionsMeansRowIndices) {
  for (int32_t window : {0, 5}) {
    const Case c{2, 6, 64, 40, 12, DType::kF32, window, 0};
    Data x = make(c, kSeed + 7);
    for (int64_t r = 0; r < c.rows; ++r) x.pos[static_cast<size_t>(r)] = static_cast<int32_t>(r);
    for (int64_t t = 0; t < c.tokens; ++t) x.qpos[static_cast<size_t>(t)] = static_cast<int32_t>(3 * t + 2);
    std::vector<float> given, given_lse, none, none_lse;
    run(c, x, nullptr, given, given_lse);
    DenseRows kv;
    kv.dtype = c.dtype;
    kv.keys = x.k.data();
    kv.values = x.v.data();
    kv.n = c.rows;
    kv.row_stride = x.stride;
    none.assign(given.size(), -7.f);
    none_lse.assign(given_lse.size(), -7.f);
    dense_attention(kv, DenseShape{c.H, c.Q, c.d, 0.f, c.window}, x.q.data(), x.qpos.data(), c.tokens, none.data(),
                    none_lse.data());
    EXPECT_EQ(given, none) << "window " << window;
    EXPECT_EQ(given_lse, none_lse) << "window " << window;
  }
}

TEST(DenseAttention, RefusesBadArgumentsByName) {
  const Case c{2, 4, 64, 10, 2, DType::kF32, 0, 0};
  Data x = make(c, kSeed);
  std::vector<float> out(2 * 4 * 64), lse(8);
  DenseRows kv;
  kv.dtype = DType::kF32;
  kv.keys = x.k.data();
  kv.values = x.v.data();
  kv.n = c.rows;
  kv.positions = x.pos.data();
  auto expect_error = [&](const DenseRows& rows, DenseShape shape, const float* q, const char* what) {
    try {
      dense_attention(rows, shape, q, x.qpos.data(), 2, out.data(), lse.data());
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const DenseShape ok{2, 4, 64, 0.f, 0};
  expect_error(kv, DenseShape{2, 5, 64, 0.f, 0}, x.q.data(), "n_q_heads");
  expect_error(kv, DenseShape{2, 4, 68, 0.f, 0}, x.q.data(), "head_dim");
  expect_error(kv, DenseShape{2, 4, 64, 0.f, -1}, x.q.data(), "window");
  DenseRows bf = kv;
  bf.dtype = DType::kBF16;
  expect_error(bf, ok, x.q.data(), "f16 or f32");
  expect_error(kv, ok, nullptr, "must not be null");
  DenseRows unordered = kv;
  std::vector<int32_t> pos = x.pos;
  std::swap(pos[3], pos[4]);
  unordered.positions = pos.data();
  expect_error(unordered, ok, x.q.data(), "ascending");
  std::vector<float> k = x.k;
  k[5 * 128 + 3] = std::numeric_limits<float>::quiet_NaN();
  DenseRows nan_rows = kv;
  nan_rows.keys = k.data();
  expect_error(nan_rows, ok, x.q.data(), "non-finite key");
  std::vector<float> v = x.v;
  v[2 * 128 + 70] = std::numeric_limits<float>::infinity();
  DenseRows inf_values = kv;
  inf_values.values = v.data();
  expect_error(inf_values, ok, x.q.data(), "non-finite value at row 2, element 70");
  std::vector<float> q = x.q;
  q[70] = std::numeric_limits<float>::infinity();
  expect_error(kv, ok, q.data(), "non-finite query");
  std::vector<float> big = x.q;
  for (auto& e : big) e = 3e37f;
  expect_error(kv, ok, big.data(), "overflow");
}

}  // namespace
}  // namespace e8kv
