// The shared host+device KV vector codec (quant/kv_vector_codec.hpp): RoPE table accuracy and
// round trips, agreement with the previous CacheCodecs behaviour (double-angle RoPE removal,
// sequential sums), the CacheCodecs plumbing, and a lane-by-lane emulation of the CUDA kernels'
// data flow (include/e8kv/cuda/detail/lane_ops.cuh) that must reproduce the whole-vector
// functions bit for bit.
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/quant/kv_vector_codec.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv;
using transform::RopeLayout;

CacheLayout make_layout(int d, quant::Codec key, quant::Codec value, bool pre_rope, RopeLayout rope_layout = RopeLayout::kSplitHalf,
                        int rotary_dim = 0, double theta = 10000.0) {
  CacheLayout L;
  L.n_layers = 1;
  L.n_kv_heads = 2;
  L.n_q_heads = 4;
  L.head_dim = d;
  L.key_codec = {key};
  L.value_codec = {value};
  L.key_frame = pre_rope ? transform::KeyFrame::kPreRope : transform::KeyFrame::kPostRope;
  L.rope.layout = rope_layout;
  L.rope.rotary_dim = rotary_dim;
  L.rope.theta = theta;
  L.rotation_seed = 0xC0FFEE;
  return L;
}

// Keys with a mean direction and outlier channels (as real keys have), post-RoPE-like.
std::vector<float> random_vectors(std::mt19937_64& rng, int n, int d) {
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> mean(static_cast<size_t>(d));
  for (auto& m : mean) m = 0.5f * g(rng);
  mean[3 % d] = 8.f;
  mean[(d / 2 + 5) % d] = -6.f;
  std::vector<float> x(static_cast<size_t>(n) * d);
  for (int t = 0; t < n; ++t) {
    const float norm = std::exp(0.3f * g(rng));
    for (int i = 0; i < d; ++i) x[static_cast<size_t>(t) * d + i] = norm * (mean[static_cast<size_t>(i)] + g(rng));
  }
  return x;
}

int ulp_distance_fp16(uint16_t a, uint16_t b) { return std::abs(static_cast<int>(a) - static_cast<int>(b)); }

template <class F>
void for_each_code(F&& f) {
  f(codebook::E8P{}, quant::Codec::kE8P);
  f(codebook::Rvq3{}, quant::Codec::kRvq3);
  f(codebook::Rvq4{}, quant::Codec::kRvq4);
}

// ---- RoPE table -----------------------------------------------------------------------------

TEST(KvVectorCodec, RopeTableMatchesDoublePrecisionAngles) {
  for (double theta : {10000.0, 500000.0}) {
    const CacheCodecs codecs(make_layout(128, quant::Codec::kE8P, quant::Codec::kE8P, true, RopeLayout::kSplitHalf, 0, theta));
    const auto& inv = codecs.rope().inv_freq();
    const int pairs = static_cast<int>(inv.size());
    ASSERT_EQ(codecs.rope_table().size(), quant::rope_table_floats(pairs));
    const int32_t positions[] = {0, 1, 2, 1023, 1024, 1025, 4095, 65537, (1 << 20) - 1, 1 << 20, 123456789,
                                 std::numeric_limits<int32_t>::max()};
    double worst = 0;
    for (int32_t pos : positions)
      for (int p = 0; p < pairs; ++p) {
        float c = 0, s = 0;
        quant::rope_table_cos_sin(codecs.rope_table().data(), pairs, pos, p, c, s);
        // Reference: exact angle pos·inv reduced modulo 2π in long double.
        const long double angle = std::fmod(static_cast<long double>(pos) * inv[static_cast<size_t>(p)],
                                            6.283185307179586476925286766559L);
        worst = std::max({worst, std::fabs(double(c) - double(std::cos(angle))), std::fabs(double(s) - double(std::sin(angle)))});
      }
    // Three table entries (each within 2^-24) and two complex products: a few float ulps; the
    // reference angle itself carries ~pos·inv·1e-16 (≈ 2e-7 at 2^31).
    EXPECT_LT(worst, 2e-6) << "theta " << theta;
  }
}

// Codecs built for another layout of the same RoPE (a rate budget's per-layer codes) take the
// tables of the compressor's codecs: the same floats as computing them; another θ or rotary_dim
// computes its own.
TEST(KvVectorCodec, CacheCodecsReuseTheRopeTablesOfTheSameFrequenciesOnly) {
  const CacheCodecs source(make_layout(128, quant::Codec::kRvq3, quant::Codec::kE8P, true));
  for (const double theta : {10000.0, 500000.0})
    for (const int rotary_dim : {0, 64}) {
      CacheLayout L = make_layout(128, quant::Codec::kE8P, quant::Codec::kRvq4, true, RopeLayout::kSplitHalf, rotary_dim, theta);
      const CacheCodecs fresh(L), reused(L, source);
      EXPECT_EQ(reused.rope_table(), fresh.rope_table()) << "theta " << theta << " rotary_dim " << rotary_dim;
      const size_t planar = 2 * 1024 * static_cast<size_t>((fresh.rope().inv_freq().size() + 7) / 8 * 8);
      ASSERT_NE(reused.key_rope_low_planar(), nullptr);
      EXPECT_TRUE(std::equal(fresh.key_rope_low_planar(), fresh.key_rope_low_planar() + planar, reused.key_rope_low_planar()));
      const bool same = theta == 10000.0 && rotary_dim == 0;
      EXPECT_EQ(reused.rope_table() == source.rope_table(), same) << "theta " << theta << " rotary_dim " << rotary_dim;
    }
  const CacheLayout post = make_layout(128, quant::Codec::kE8P, quant::Codec::kE8P, false);
  const CacheCodecs reused_post(post, source);
  EXPECT_EQ(reused_post.rope_table(), CacheCodecs(post).rope_table());
}

TEST(KvVectorCodec, CacheCodecsRopeCosSinIsTheSharedTableFunction) {
  const CacheCodecs codecs(make_layout(64, quant::Codec::kE8P, quant::Codec::kE8P, true));
  const int pairs = 32;
  float c[32], s[32];
  for (int32_t pos : {0, 7, 1500, 3000000}) {
    codecs.rope_cos_sin(pos, c, s);
    for (int p = 0; p < pairs; ++p) {
      float c2 = 0, s2 = 0;
      quant::rope_table_cos_sin(codecs.rope_table().data(), pairs, pos, p, c2, s2);
      ASSERT_EQ(std::memcmp(&c[p], &c2, 4), 0);
      ASSERT_EQ(std::memcmp(&s[p], &s2, 4), 0);
    }
  }
  EXPECT_THROW(codecs.rope_cos_sin(-1, c, s), Error);
  // Device rule for a negative position: treated as 0.
  float cn = 0, sn = 0, c0 = 0, s0 = 0;
  quant::rope_table_cos_sin(codecs.rope_table().data(), pairs, -5, 3, cn, sn);
  quant::rope_table_cos_sin(codecs.rope_table().data(), pairs, 0, 3, c0, s0);
  EXPECT_EQ(cn, c0);
  EXPECT_EQ(sn, s0);
}

TEST(KvVectorCodec, RopeTableRotationRoundTripsAndMatchesRope) {
  auto rng = test::seeded_rng(501);
  struct Case {
    int d;
    RopeLayout layout;
    int rotary_dim;
  };
  for (const Case& cs : {Case{128, RopeLayout::kSplitHalf, 0}, Case{64, RopeLayout::kInterleaved, 0},
                         Case{128, RopeLayout::kSplitHalf, 64}, Case{256, RopeLayout::kInterleaved, 96}}) {
    const CacheCodecs codecs(make_layout(cs.d, quant::Codec::kE8P, quant::Codec::kE8P, true, cs.layout, cs.rotary_dim));
    const quant::RopeTableView view = codecs.key_rope_view();
    ASSERT_NE(view.table, nullptr);
    const auto x = random_vectors(rng, 64, cs.d);
    std::uniform_int_distribution<int32_t> pos_dist(0, 1 << 21);
    double worst_round = 0, worst_rope = 0;
    for (int t = 0; t < 64; ++t) {
      const float* v = &x[static_cast<size_t>(t) * cs.d];
      const int32_t pos = t < 4 ? t : pos_dist(rng);
      std::vector<float> a(v, v + cs.d), ref(v, v + cs.d);
      quant::rope_table_rotate(a.data(), view, pos, false);
      codecs.rope().apply(ref.data(), pos);
      double norm = 0;
      for (int i = 0; i < cs.d; ++i) norm += double(v[i]) * v[i];
      norm = std::sqrt(norm);
      for (int i = 0; i < cs.d; ++i) worst_rope = std::max(worst_rope, std::fabs(double(a[i]) - ref[static_cast<size_t>(i)]) / norm);
      for (int i = view.rotary_dim; i < cs.d; ++i) ASSERT_EQ(a[static_cast<size_t>(i)], v[i]) << "untouched tail";
      quant::rope_table_rotate(a.data(), view, pos, true);
      for (int i = 0; i < cs.d; ++i) worst_round = std::max(worst_round, std::fabs(double(a[i]) - v[i]) / norm);
    }
    EXPECT_LT(worst_rope, 2e-6) << "d " << cs.d;
    EXPECT_LT(worst_round, 2e-6) << "d " << cs.d;
  }
}

// ---- agreement with the previous behaviour --------------------------------------------------

// The encoder CacheCodecs used before the shared functions: double-angle RoPE removal, the host
// Hadamard object, VectorQuantizer::encode (sequential double sums).
void previous_encode_key(const CacheCodecs& codecs, const float* k, int32_t pos, uint8_t* codes, uint16_t* gain) {
  const int d = codecs.layout().head_dim;
  std::vector<float> tmp(k, k + d);
  if (codecs.layout().key_frame == transform::KeyFrame::kPreRope) codecs.rope().remove(tmp.data(), pos);
  codecs.rotation(0, 0, 0).forward(tmp.data(), tmp.data());
  codecs.key_quantizer(0).encode(tmp.data(), codes, gain);
}

TEST(KvVectorCodec, EncodeAgreesWithThePreviousCacheCodecsClosely) {
  auto rng = test::seeded_rng(502);
  for (bool pre_rope : {true, false}) {
    for_each_code([&](auto code, quant::Codec id) {
      using Code = decltype(code);
      const int d = 128, n = 600;
      const CacheCodecs codecs(make_layout(d, id, quant::Codec::kE8P, pre_rope));
      const auto x = random_vectors(rng, n, d);
      const size_t cb = codecs.key_quantizer(0).code_bytes();
      const int kb = quant::kIndexBytes<Code>;
      int64_t blocks = 0, same_blocks = 0, same_gain = 0, near_gain = 0;
      double err_new = 0, err_old = 0, ref = 0;
      std::vector<uint8_t> a(cb), b(cb);
      std::vector<float> ya(static_cast<size_t>(d)), yb(static_cast<size_t>(d));
      for (int t = 0; t < n; ++t) {
        const float* k = &x[static_cast<size_t>(t) * d];
        uint16_t ga = 0, gb = 0;
        codecs.encode_key(0, 0, k, 1000 + 37 * t, a.data(), &ga);
        previous_encode_key(codecs, k, 1000 + 37 * t, b.data(), &gb);
        for (int j = 0; j < d / 8; ++j) same_blocks += std::memcmp(&a[j * kb], &b[j * kb], kb) == 0;
        blocks += d / 8;
        same_gain += ga == gb;
        near_gain += ulp_distance_fp16(ga, gb) <= 1;
        codecs.decode_key(0, 0, a.data(), ga, 1000 + 37 * t, ya.data());
        codecs.decode_key(0, 0, b.data(), gb, 1000 + 37 * t, yb.data());
        for (int i = 0; i < d; ++i) {
          err_new += (double(ya[i]) - k[i]) * (double(ya[i]) - k[i]);
          err_old += (double(yb[i]) - k[i]) * (double(yb[i]) - k[i]);
          ref += double(k[i]) * k[i];
        }
      }
      const double same = double(same_blocks) / blocks;
      std::printf("%-5s pre_rope %d: identical blocks %.5f, gains equal %.4f, within 1 ulp %.4f, NMSE new %.5f old %.5f\n",
                  Code::kName, pre_rope, same, double(same_gain) / n, double(near_gain) / n, err_new / ref, err_old / ref);
      // Post-RoPE only the summation order changed; pre-RoPE also the RoPE angles (float table
      // instead of double): nearly every block and gain is the same, and the error is too.
      EXPECT_GT(same, pre_rope ? 0.99 : 0.999) << Code::kName;
      EXPECT_GT(double(near_gain) / n, 0.99) << Code::kName;
      EXPECT_NEAR(err_new / ref, err_old / ref, 0.02 * err_old / ref) << Code::kName;
    });
  }
}

TEST(KvVectorCodec, EncodeRotatedVectorEqualsEncodeVectorUpToSummationOrder) {
  auto rng = test::seeded_rng(503);
  for (int d : {64, 128, 256}) {
    const auto x = random_vectors(rng, 400, d);
    int64_t blocks = 0, same = 0, gains_equal = 0;
    for (int t = 0; t < 400; ++t) {
      const float* v = &x[static_cast<size_t>(t) * d];
      std::vector<uint8_t> a(static_cast<size_t>(d / 8 * 2)), b(a.size());
      uint16_t ga = 0, gb = 0;
      quant::encode_rotated_vector<codebook::E8P>(v, d, 1.f, quant::GainPolicy::kLeastSquares, a.data(), &ga);
      quant::encode_vector<codebook::E8P>(v, d, 1.f, quant::GainPolicy::kLeastSquares, b.data(), &gb);
      for (int j = 0; j < d / 8; ++j) same += a[2 * j] == b[2 * j] && a[2 * j + 1] == b[2 * j + 1];
      blocks += d / 8;
      gains_equal += ulp_distance_fp16(ga, gb) <= 1;
    }
    EXPECT_GT(double(same) / blocks, 0.999) << "d " << d;
    EXPECT_EQ(gains_equal, 400) << "d " << d;
  }
}

TEST(KvVectorCodec, CacheCodecsCallTheSharedFunctions) {
  auto rng = test::seeded_rng(504);
  for (bool pre_rope : {true, false}) {
    for_each_code([&](auto code, quant::Codec id) {
      using Code = decltype(code);
      const int d = 64;
      const CacheCodecs codecs(make_layout(d, id, id, pre_rope, RopeLayout::kInterleaved));
      const auto x = random_vectors(rng, 50, d);
      const size_t cb = codecs.key_quantizer(0).code_bytes();
      for (int t = 0; t < 50; ++t) {
        const float* k = &x[static_cast<size_t>(t) * d];
        std::vector<uint8_t> a(cb), b(cb);
        uint16_t ga = 0, gb = 0;
        codecs.encode_key(0, 1, k, 5 * t, a.data(), &ga);
        ASSERT_TRUE(quant::encode_key_vector<Code>(k, codecs.codec_args(0, 1, 0), codecs.key_rope_view(), 5 * t, b.data(), &gb));
        ASSERT_EQ(a, b);
        ASSERT_EQ(ga, gb);
        codecs.encode_value(0, 1, k, a.data(), &ga);
        ASSERT_TRUE(quant::encode_value_vector<Code>(k, codecs.codec_args(0, 1, 1), b.data(), &gb));
        ASSERT_EQ(a, b);
        ASSERT_EQ(ga, gb);
        std::vector<float> ya(static_cast<size_t>(d)), yb(static_cast<size_t>(d));
        codecs.decode_key(0, 1, a.data(), ga, 5 * t, ya.data());
        ASSERT_TRUE(quant::decode_key_vector<Code>(a.data(), ga, codecs.codec_args(0, 1, 0), codecs.key_rope_view(), 5 * t, yb.data()));
        ASSERT_EQ(0, std::memcmp(ya.data(), yb.data(), 4 * d));
      }
    });
  }
}

TEST(KvVectorCodec, DecodeInvertsEncodeWithinTheCodecError) {
  auto rng = test::seeded_rng(505);
  // Normalized MSE bounds ≈ 1.3x the codes' Gaussian MSE at these rates (0.09, 0.03, 0.0085).
  const double bound[] = {0.12, 0.04, 0.012};
  int which = 0;
  for_each_code([&](auto, quant::Codec id) {
    const int d = 128;
    const CacheCodecs codecs(make_layout(d, id, id, true));
    const auto x = random_vectors(rng, 300, d);
    const size_t cb = codecs.key_quantizer(0).code_bytes();
    double err = 0, ref = 0;
    for (int t = 0; t < 300; ++t) {
      const float* k = &x[static_cast<size_t>(t) * d];
      std::vector<uint8_t> c(cb);
      uint16_t g = 0;
      std::vector<float> y(static_cast<size_t>(d));
      codecs.encode_key(0, 0, k, 70000 + t, c.data(), &g);
      codecs.decode_key(0, 0, c.data(), g, 70000 + t, y.data());
      for (int i = 0; i < d; ++i) {
        err += (double(y[i]) - k[i]) * (double(y[i]) - k[i]);
        ref += double(k[i]) * k[i];
      }
    }
    EXPECT_LT(err / ref, bound[which]) << quant::to_string(id);
    ++which;
  });
}

TEST(KvVectorCodec, NonFiniteAndUnsupportedInputsAreDefined) {
  const CacheCodecs codecs(make_layout(64, quant::Codec::kE8P, quant::Codec::kE8P, true));
  std::vector<float> k(64, 1.f);
  k[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> c(16);
  uint16_t g = 0;
  EXPECT_THROW(codecs.encode_key(0, 0, k.data(), 3, c.data(), &g), Error);
  EXPECT_THROW(codecs.encode_value(0, 0, k.data(), c.data(), &g), Error);
  k[5] = 1.f;
  EXPECT_THROW(codecs.encode_key(0, 0, k.data(), -1, c.data(), &g), Error);
  // The shared function itself: non-finite elements after the rotation count as 0.
  std::vector<float> r(64, 0.5f);
  r[0] = std::numeric_limits<float>::infinity();
  r[9] = std::numeric_limits<float>::quiet_NaN();
  quant::encode_rotated_vector<codebook::E8P>(r.data(), 64, 1.f, quant::GainPolicy::kNormPreserving, c.data(), &g);
  EXPECT_TRUE(std::isfinite(fp16_bits_to_float(g)));
  r[0] = 0.f;
  r[9] = 0.f;
  std::vector<uint8_t> c0(16);
  uint16_t g0 = 0;
  quant::encode_rotated_vector<codebook::E8P>(r.data(), 64, 1.f, quant::GainPolicy::kNormPreserving, c0.data(), &g0);
  EXPECT_EQ(c, c0);
  EXPECT_EQ(g, g0);
  // All zero: gain 0.
  std::vector<float> z(64, 0.f);
  quant::encode_rotated_vector<codebook::E8P>(z.data(), 64, 1.f, quant::GainPolicy::kLeastSquares, c.data(), &g);
  EXPECT_EQ(g, 0);
  // Unsupported head dims are refused without writing.
  quant::VectorCodecArgs a = codecs.codec_args(0, 0, 0);
  for (int d : {0, 72, 1024}) {
    a.head_dim = d;
    std::vector<float> big(1024, 1.f);
    EXPECT_FALSE(quant::encode_value_vector<codebook::E8P>(big.data(), a, c.data(), &g));
    EXPECT_FALSE(quant::decode_value_vector<codebook::E8P>(c.data(), g, a, big.data()));
  }
}

// ---- the kernels' lane decomposition, emulated --------------------------------------------------

TEST(KvVectorCodec, PairwiseTreeSumIsTheXorButterfly) {
  auto rng = test::seeded_rng(506);
  std::uniform_real_distribution<double> mag(-20, 20);
  std::normal_distribution<double> g(0, 1);
  for (int n : {1, 2, 4, 8, 16, 32}) {
    for (int rep = 0; rep < 200; ++rep) {
      std::vector<double> v(static_cast<size_t>(n));
      for (auto& x : v) x = g(rng) * std::exp2(mag(rng));
      std::vector<double> tree = v;
      const double expect = quant::pairwise_tree_sum(tree.data(), n);
      std::vector<double> lanes = v;
      for (int m = 1; m < n; m <<= 1) {
        std::vector<double> next(lanes.size());
        for (int L = 0; L < n; ++L) next[static_cast<size_t>(L)] = lanes[static_cast<size_t>(L)] + lanes[static_cast<size_t>(L ^ m)];
        lanes = next;
      }
      for (int L = 0; L < n; ++L) ASSERT_EQ(std::memcmp(&lanes[static_cast<size_t>(L)], &expect, 8), 0) << "n " << n << " lane " << L;
    }
  }
  // Non-powers of two: every element counted once.
  for (int n : {3, 5, 10, 12}) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = double(1 << i);
    EXPECT_EQ(quant::pairwise_tree_sum(v.data(), n), double((1 << n) - 1));
  }
  EXPECT_EQ(quant::pairwise_tree_sum(nullptr, 0), 0.0);
}

// Lanes of one vector: lane L holds x[8L .. 8L+8).
using Lanes = std::vector<std::array<float, 8>>;

Lanes to_lanes(const float* x, int d) {
  Lanes l(static_cast<size_t>(d / 8));
  for (int L = 0; L < d / 8; ++L)
    for (int r = 0; r < 8; ++r) l[static_cast<size_t>(L)][static_cast<size_t>(r)] = x[8 * L + r];
  return l;
}

// lane_ops.cuh lane_fwht: in-register stages, xor-shuffle stages, scale.
void emulate_lane_fwht(Lanes& l) {
  const int n = static_cast<int>(l.size());
  for (auto& v : l) quant::lane_fwht_in_register(v.data());
  for (int m = 1; m < n; m <<= 1) {
    Lanes next = l;
    for (int L = 0; L < n; ++L)
      for (int r = 0; r < 8; ++r)
        next[static_cast<size_t>(L)][static_cast<size_t>(r)] =
            quant::lane_butterfly(l[static_cast<size_t>(L)][static_cast<size_t>(r)], l[static_cast<size_t>(L ^ m)][static_cast<size_t>(r)], (L & m) != 0);
    l = next;
  }
  const float scale = transform::detail::inverse_sqrt_dim(8 * n);
  for (auto& v : l)
    for (auto& x : v) x = fp::mul(x, scale);
}

// lane_ops.cuh lane_rope (split-half: partner lane at ±rotary_dim/16, same register).
void emulate_lane_rope(Lanes& l, const quant::RopeTableView& rope, int32_t pos, bool inverse) {
  const int n = static_cast<int>(l.size());
  const int pairs = rope.rotary_dim / 2;
  Lanes next = l;
  for (int L = 0; L < n; ++L) {
    const int e0 = 8 * L;
    if (rope.layout == RopeLayout::kSplitHalf) {
      const int half = rope.rotary_dim / 2;
      if (e0 >= rope.rotary_dim) continue;
      const bool first = e0 < half;
      const int partner_lane = first ? L + half / 8 : L - half / 8;
      const int pair0 = first ? e0 : e0 - half;
      for (int r = 0; r < 8; ++r) {
        float c = 0, s = 0;
        quant::rope_table_cos_sin(rope.table, pairs, pos, pair0 + r, c, s);
        next[static_cast<size_t>(L)][static_cast<size_t>(r)] = quant::rope_element(
            l[static_cast<size_t>(L)][static_cast<size_t>(r)], l[static_cast<size_t>(partner_lane)][static_cast<size_t>(r)], c, s, first, inverse);
      }
    } else {
      for (int r = 0; r < 8; r += 2) {
        if (e0 + r >= rope.rotary_dim) continue;
        float c = 0, s = 0;
        quant::rope_table_cos_sin(rope.table, pairs, pos, (e0 + r) / 2, c, s);
        const float a = l[static_cast<size_t>(L)][static_cast<size_t>(r)], b = l[static_cast<size_t>(L)][static_cast<size_t>(r + 1)];
        next[static_cast<size_t>(L)][static_cast<size_t>(r)] = quant::rope_element(a, b, c, s, true, inverse);
        next[static_cast<size_t>(L)][static_cast<size_t>(r + 1)] = quant::rope_element(b, a, c, s, false, inverse);
      }
    }
  }
  l = next;
}

double emulate_tree(const std::vector<double>& part) {
  std::vector<double> lanes = part;
  const int n = static_cast<int>(part.size());
  for (int m = 1; m < n; m <<= 1) {
    std::vector<double> next(lanes.size());
    for (int L = 0; L < n; ++L) next[static_cast<size_t>(L)] = fp::add(lanes[static_cast<size_t>(L)], lanes[static_cast<size_t>(L ^ m)]);
    lanes = next;
  }
  return lanes[0];
}

// The encode kernel's data flow for one key (encode_kernel.cuh), on emulated lanes.
template <class Code>
void emulate_encode_key(const float* k, const quant::VectorCodecArgs& a, const quant::RopeTableView& rope, int32_t pos,
                        uint8_t* codes, uint16_t* gain) {
  const int d = a.head_dim, n = d / 8;
  Lanes l = to_lanes(k, d);
  if (rope.table) emulate_lane_rope(l, rope, pos, true);
  for (int L = 0; L < n; ++L) quant::lane_apply_signs(l[static_cast<size_t>(L)].data(), quant::lane_sign_byte(a.sign_bits, L));
  emulate_lane_fwht(l);
  std::vector<double> part(static_cast<size_t>(n)), xq(static_cast<size_t>(n)), qq(static_cast<size_t>(n));
  for (int L = 0; L < n; ++L) part[static_cast<size_t>(L)] = quant::block_sum_squares(l[static_cast<size_t>(L)].data());
  const double norm2 = emulate_tree(part);
  const float to_u = quant::unit_scale_factor(norm2, d, a.scale);
  for (int L = 0; L < n; ++L) {
    const uint32_t index = quant::encode_block_with_stats<Code>(l[static_cast<size_t>(L)].data(), to_u, &xq[static_cast<size_t>(L)], &qq[static_cast<size_t>(L)]);
    quant::detail::store_index(index, quant::kIndexBytes<Code>, codes + L * quant::kIndexBytes<Code>);
  }
  *gain = quant::gain_bits_from_stats(a.gain, norm2, emulate_tree(xq), emulate_tree(qq));
}

// The dequantize kernel's data flow for one key (dequantize_kernel.cuh).
template <class Code>
std::vector<float> emulate_decode_key(const uint8_t* codes, uint16_t gain, const quant::VectorCodecArgs& a,
                                      const quant::RopeTableView& rope, int32_t pos) {
  const int d = a.head_dim, n = d / 8;
  Lanes l(static_cast<size_t>(n));
  for (int L = 0; L < n; ++L)
    quant::decode_block<Code>(quant::detail::load_index(codes + L * quant::kIndexBytes<Code>, quant::kIndexBytes<Code>),
                              fp16_bits_to_float(gain), l[static_cast<size_t>(L)].data());
  emulate_lane_fwht(l);
  for (int L = 0; L < n; ++L) quant::lane_apply_signs(l[static_cast<size_t>(L)].data(), quant::lane_sign_byte(a.sign_bits, L));
  if (rope.table) emulate_lane_rope(l, rope, pos, false);
  std::vector<float> out(static_cast<size_t>(d));
  for (int L = 0; L < n; ++L)
    for (int r = 0; r < 8; ++r) out[static_cast<size_t>(8 * L + r)] = l[static_cast<size_t>(L)][static_cast<size_t>(r)];
  return out;
}

TEST(KvVectorCodec, LaneButterflyIsTheAddAndSubtractBitForBit) {
  // lane_butterfly is one signed add (±1·mine + partner); it must give the bits of the plain
  // u + v / u − v it replaced, signed zeros, infinities, subnormals and rounding included.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {0.f, -0.f, 1.f, -1.f, 3.5f, 1e-40f, -1e-40f, 1e38f, -3e38f, 3.4e38f, inf, -inf,
                          0.1f, -0.3f, 1.f + 0x1p-23f, 0x1p-126f};
  auto rng = test::seeded_rng(4106);
  std::normal_distribution<float> g(0.f, 10.f);
  for (int i = 0; i < 200; ++i) x.push_back(g(rng));
  auto bits = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
  };
  for (float mine : x)
    for (float partner : x)
      for (bool upper : {false, true}) {
        const float want = upper ? partner - mine : mine + partner;
        const float got = quant::lane_butterfly(mine, partner, upper);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << mine << " " << partner << " " << upper;
        } else {
          ASSERT_EQ(bits(got), bits(want)) << mine << " " << partner << " " << upper;
        }
      }
}

TEST(KvVectorCodec, LaneEmulationOfTheKernelsIsBitExact) {
  auto rng = test::seeded_rng(507);
  struct Case {
    int d;
    RopeLayout layout;
    int rotary_dim;
    bool pre_rope;
  };
  const Case cases[] = {{64, RopeLayout::kSplitHalf, 0, true},     {128, RopeLayout::kSplitHalf, 0, true},
                        {256, RopeLayout::kSplitHalf, 0, true},    {128, RopeLayout::kSplitHalf, 64, true},
                        {128, RopeLayout::kInterleaved, 0, true},  {64, RopeLayout::kInterleaved, 20, true},
                        {128, RopeLayout::kSplitHalf, 0, false}};
  for (const Case& cs : cases) {
    for_each_code([&](auto code, quant::Codec id) {
      using Code = decltype(code);
      const CacheCodecs codecs(make_layout(cs.d, id, id, cs.pre_rope, cs.layout, cs.rotary_dim));
      const quant::VectorCodecArgs args = codecs.codec_args(0, 1, 0);
      const quant::RopeTableView rope = codecs.key_rope_view();
      auto x = random_vectors(rng, 40, cs.d);
      // Adversarial rows: all zero, one spike, huge values, exact lattice-like halves.
      for (int i = 0; i < cs.d; ++i) {
        x[static_cast<size_t>(i)] = 0.f;
        x[static_cast<size_t>(cs.d + i)] = i == 7 ? 1000.f : 0.f;
        x[static_cast<size_t>(2 * cs.d + i)] = 60000.f * ((i % 3) - 1);
        x[static_cast<size_t>(3 * cs.d + i)] = 0.5f * static_cast<float>((i % 5) - 2);
      }
      const size_t cb = static_cast<size_t>(cs.d / 8 * quant::kIndexBytes<Code>);
      for (int t = 0; t < 40; ++t) {
        const float* k = &x[static_cast<size_t>(t) * cs.d];
        const int32_t pos = t < 4 ? t : 4096 * t + 17;
        std::vector<uint8_t> a(cb), b(cb);
        uint16_t ga = 0, gb = 0;
        ASSERT_TRUE(quant::encode_key_vector<Code>(k, args, rope, pos, a.data(), &ga));
        emulate_encode_key<Code>(k, args, rope, pos, b.data(), &gb);
        ASSERT_EQ(a, b) << Code::kName << " d " << cs.d << " t " << t;
        ASSERT_EQ(ga, gb) << Code::kName << " d " << cs.d << " t " << t;
        std::vector<float> y(static_cast<size_t>(cs.d));
        ASSERT_TRUE(quant::decode_key_vector<Code>(a.data(), ga, args, rope, pos, y.data()));
        const std::vector<float> z = emulate_decode_key<Code>(a.data(), ga, args, rope, pos);
        ASSERT_EQ(0, std::memcmp(y.data(), z.data(), 4 * static_cast<size_t>(cs.d))) << Code::kName << " d " << cs.d;
      }
    });
  }
}

}  // namespace
