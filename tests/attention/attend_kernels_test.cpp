// The attention kernels (src/attention/attend_kernels.inc) pinned bit for bit across the two ISA
// builds, and to a scalar reference written from their definitions: fused multiply-adds in lane
// order, the fixed summation tree, the table decoders equal to Code::decode. Sizes 0, 1, odd,
// tile and tile + 1; seeds fixed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "attention/attend_kernels.hpp"
#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/half.hpp"

namespace {
using namespace e8kv;
using namespace e8kv::attention::kernels;

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}
std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// The scalar definition of one dot: lanes i sum q[8j+i]·c[8j+i] over j with fma, then the tree.
float reference_dot(const float* q, const float* c, int d) {
  float lane[8] = {};
  for (int j = 0; j < d / 8; ++j)
    for (int i = 0; i < 8; ++i) lane[i] = std::fma(q[8 * j + i], c[8 * j + i], lane[i]);
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

template <class Code>
std::vector<float> decode_lattice_rows(const std::vector<uint8_t>& codes, int n, int d) {
  // The lattice-unit floats the register decoders yield: Code::decode times the input scale,
  // which for the fast tier is exactly (c1 + c2·(1/s2)) (E8P: c1).
  constexpr int kBytes = Code::kIndexBits / 8;
  std::vector<float> rows(static_cast<size_t>(n) * d);
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < d / 8; ++j) {
      uint32_t index = 0;
      for (int b = 0; b < kBytes; ++b) index |= uint32_t(codes[static_cast<size_t>(t) * d / 8 * kBytes + j * kBytes + b]) << (8 * b);
      float c1[8], c2[8];
      codebook::E8P::decode_lattice(index & 0xFFFFu, c1);
      if constexpr (std::is_same_v<Code, codebook::E8P>) {
        std::memcpy(&rows[(static_cast<size_t>(t) * d) + 8 * j], c1, sizeof c1);
      } else if constexpr (std::is_same_v<Code, codebook::Rvq3>) {
        codebook::E81B::decode_lattice(index >> 16, c2);
        for (int i = 0; i < 8; ++i) rows[static_cast<size_t>(t) * d + 8 * j + i] = c1[i] + c2[i] * Code::kInverseResidualScale;
      } else {
        codebook::E8P::decode_lattice(index >> 16, c2);
        for (int i = 0; i < 8; ++i) rows[static_cast<size_t>(t) * d + 8 * j + i] = c1[i] + c2[i] * Code::kInverseResidualScale;
      }
    }
  return rows;
}

template <class K>
std::vector<float> run_dots(int rows_kind, const std::vector<uint8_t>& bytes, size_t stride, int blocks,
                            const std::vector<float>& q, int ng, int64_t n) {
  std::vector<float> dots(8 * static_cast<size_t>(n + 1), -1.f);
  const auto& tables = decode_rows();
  auto go = [&](const auto& dec) {
    switch (ng) {
      case 1: K::template dot_rows<1>(dec, bytes.data(), stride, blocks, q.data(), n, dots.data(), n + 1); break;
      case 2: K::template dot_rows<2>(dec, bytes.data(), stride, blocks, q.data(), n, dots.data(), n + 1); break;
      case 3: K::template dot_rows<3>(dec, bytes.data(), stride, blocks, q.data(), n, dots.data(), n + 1); break;
      case 4: K::template dot_rows<4>(dec, bytes.data(), stride, blocks, q.data(), n, dots.data(), n + 1); break;
      default: K::template dot_rows<8>(dec, bytes.data(), stride, blocks, q.data(), n, dots.data(), n + 1); break;
    }
  };
  switch (rows_kind) {
    case 0: go(typename K::E8pRowDecoder{&tables}); break;
    case 1: go(typename K::Rvq3RowDecoder{&tables}); break;
    case 2: go(typename K::Rvq4RowDecoder{&tables, codebook::Rvq4::kInverseResidualScale}); break;
    case 3: go(typename K::Fp16RowDecoder{}); break;
    default: go(typename K::Fp32RowDecoder{}); break;
  }
  return dots;
}

TEST(AttendKernels, DotRowsMatchTheScalarDefinitionInBothBuilds) {
  const int d = 64, blocks = d / 8;
  uint64_t seed = 900;
  for (int kind = 0; kind < 5; ++kind)
    for (int ng : {1, 2, 3, 4, 8})
      for (int64_t n : {0, 1, 7, 8, 9, 17}) {
        ++seed;
        const auto q = randn(static_cast<size_t>(ng) * d, seed);
        std::vector<uint8_t> bytes;
        std::vector<float> rows;
        size_t stride = 0;
        if (kind <= 2) {
          const int ib = kind == 0 ? 2 : (kind == 1 ? 3 : 4);
          stride = static_cast<size_t>(blocks * ib);
          bytes = random_bytes(stride * static_cast<size_t>(n), seed + 1);
          rows = kind == 0 ? decode_lattice_rows<codebook::E8P>(bytes, static_cast<int>(n), d)
                           : (kind == 1 ? decode_lattice_rows<codebook::Rvq3>(bytes, static_cast<int>(n), d)
                                        : decode_lattice_rows<codebook::Rvq4>(bytes, static_cast<int>(n), d));
        } else if (kind == 3) {
          const auto f = randn(static_cast<size_t>(n) * d, seed + 1);
          std::vector<uint16_t> h(f.size());
          for (size_t i = 0; i < f.size(); ++i) h[i] = float_to_fp16_bits(f[i]);
          bytes.resize(h.size() * 2);
          if (!h.empty()) std::memcpy(bytes.data(), h.data(), bytes.size());
          for (uint16_t b : h) rows.push_back(fp16_bits_to_float(b));
          stride = static_cast<size_t>(d) * 2;
        } else {
          rows = randn(static_cast<size_t>(n) * d, seed + 1);
          bytes.resize(rows.size() * 4);
          if (!rows.empty()) std::memcpy(bytes.data(), rows.data(), bytes.size());
          stride = static_cast<size_t>(d) * 4;
        }
        const auto portable = run_dots<KernelsPortable>(kind, bytes, stride, blocks, q, ng, n);
        for (int g = 0; g < ng; ++g)
          for (int64_t t = 0; t < n; ++t)
            ASSERT_EQ(portable[g * (n + 1) + t], reference_dot(&q[g * d], &rows[t * d], d))
                << "kind " << kind << " ng " << ng << " n " << n << " seed " << seed;
#if E8KV_HOST_AVX2_DISPATCH
        if (cpu_has_avx2_fma()) {
          EXPECT_EQ(run_dots<KernelsAvx2Fma>(kind, bytes, stride, blocks, q, ng, n), portable)
              << "kind " << kind << " ng " << ng << " n " << n << " seed " << seed;
        }
#endif
      }
}

template <class K>
std::vector<float> run_accumulate(const std::vector<float>& rows, int blocks, const std::vector<float>& w, int ng,
                                  int64_t n, const std::vector<float>& start) {
  std::vector<float> acc = start;
  const auto* bytes = reinterpret_cast<const uint8_t*>(rows.data());
  const size_t stride = static_cast<size_t>(blocks) * 32;
  typename K::Fp32RowDecoder dec;
  switch (ng) {
    case 1: K::template accumulate_rows<1>(dec, bytes, stride, blocks, w.data(), n, acc.data()); break;
    case 3: K::template accumulate_rows<3>(dec, bytes, stride, blocks, w.data(), n, acc.data()); break;
    case 4: K::template accumulate_rows<4>(dec, bytes, stride, blocks, w.data(), n, acc.data()); break;
    default: K::template accumulate_rows<8>(dec, bytes, stride, blocks, w.data(), n, acc.data()); break;
  }
  return acc;
}

TEST(AttendKernels, AccumulateRowsIsAnFmaChainInTokenOrder) {
  for (int d : {64, 80, 128})
    for (int ng : {1, 3, 4, 8})
      for (int64_t n : {0, 1, 5, 64, 65}) {
        const uint64_t seed = 1000 + d + ng * 7 + static_cast<uint64_t>(n);
        const auto rows = randn(static_cast<size_t>(n) * d, seed);
        const auto w = randn(static_cast<size_t>(n) * ng, seed + 1, 0.1f);
        const auto start = randn(static_cast<size_t>(ng) * d, seed + 2);
        const auto got = run_accumulate<KernelsPortable>(rows, d / 8, w, ng, n, start);
        for (int g = 0; g < ng; ++g)
          for (int i = 0; i < d; ++i) {
            float a = start[g * d + i];
            for (int64_t t = 0; t < n; ++t) a = std::fma(w[t * ng + g], rows[t * d + i], a);
            ASSERT_EQ(got[g * d + i], a) << "d " << d << " ng " << ng << " n " << n;
          }
#if E8KV_HOST_AVX2_DISPATCH
        if (cpu_has_avx2_fma()) {
          EXPECT_EQ((run_accumulate<KernelsAvx2Fma>(rows, d / 8, w, ng, n, start)), got);
        }
#endif
      }
}

TEST(AttendKernels, SoftmaxRowAndExp) {
  for (int64_t n : {8, 16, 72}) {
    auto l = randn(static_cast<size_t>(n), 3000 + static_cast<uint64_t>(n), 20.f);
    l[static_cast<size_t>(n) - 1] = -std::numeric_limits<float>::infinity();  // padding
    l[0] = -200.f;                                                           // underflows to exactly 0
    auto lp = l, la = l;
    float mp = 0, sp = 0;
    KernelsPortable::softmax_row(lp.data(), n, &mp, &sp);
    double max = -1e30;
    for (float x : l) max = std::max<double>(max, x);
    EXPECT_EQ(mp, static_cast<float>(max));
    double sum = 0;
    for (int64_t t = 0; t < n; ++t) {
      const double want = std::exp(double(l[t] - static_cast<float>(max)));  // the argument as the kernel rounds it
      EXPECT_NEAR(lp[t], want, 3e-7 * want + 1e-38) << "t " << t;
      sum += lp[t];
    }
    EXPECT_EQ(lp[0], 0.f);
    EXPECT_EQ(lp[static_cast<size_t>(n) - 1], 0.f);
    EXPECT_NEAR(sp, sum, 1e-6 * sum);
#if E8KV_HOST_AVX2_DISPATCH
    if (cpu_has_avx2_fma()) {
      float ma = 0, sa = 0;
      KernelsAvx2Fma::softmax_row(la.data(), n, &ma, &sa);
      EXPECT_EQ(la, lp);
      EXPECT_EQ(ma, mp);
      EXPECT_EQ(sa, sp);
    }
#endif
  }
  // All −inf: zeros, max −inf, sum 0.
  std::vector<float> none(16, -std::numeric_limits<float>::infinity());
  float m = 0, s = 1;
  KernelsPortable::softmax_row(none.data(), 16, &m, &s);
  EXPECT_EQ(s, 0.f);
  EXPECT_EQ(m, -std::numeric_limits<float>::infinity());
}

}  // namespace
