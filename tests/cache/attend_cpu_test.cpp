// The CPU attention kernels (cache/attend_cpu.hpp) and every other run-time ISA choice: the
// AVX2 and baseline builds give bit-identical results, kernel by kernel and end to end
// (compress -> serialized bytes, attend, decompress); the multi-head dot product equals
// dot_product bit for bit; the kernels agree with the scalar reference paths.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "e8kv/cache/attend_cpu.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/entropy/container.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/dot.hpp"
#include "e8kv/quant/vector_quantizer.hpp"
#include "testing/synthetic_kv.hpp"

namespace {
using namespace e8kv;
namespace ac = e8kv::attend_cpu;

// Restores the default ISA choice even when an assertion returns early.
struct BaselineIsaScope {
  explicit BaselineIsaScope(bool on) { force_baseline_isa(on); }
  ~BaselineIsaScope() { force_baseline_isa(false); }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> gaussian(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng);
  return x;
}

#define SKIP_WITHOUT_AVX2()                                                                    \
  do {                                                                                         \
    if (!cpu_has_avx2()) GTEST_SKIP() << "this CPU has no AVX2: only the baseline build runs"; \
  } while (0)

TEST(AttendCpu, DotHeadsEqualsDotProductBitForBit) {
  const uint64_t seed = 11;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (int d : {8, 64, 80, 96, 128, 256, 13}) {  // 13: the partial-block tail
    for (int G : {1, 2, 3, 4, 5, 7, 8}) {
      const auto q = gaussian(static_cast<size_t>(G) * d, seed + d * 31u + G);
      const auto k = gaussian(static_cast<size_t>(d), seed + 7u * d + G);
      std::vector<float> out(static_cast<size_t>(G) * 3);
      ac::dot_heads(q.data(), G, d, k.data(), 0.125f, out.data(), 3);
      for (int g = 0; g < G; ++g) {
        const float ref = dot_product(q.data() + static_cast<size_t>(g) * d, k.data(), d) * 0.125f;
        EXPECT_EQ(std::memcmp(&out[static_cast<size_t>(g) * 3], &ref, sizeof ref), 0) << "d " << d << " G " << G << " g " << g;
      }
    }
  }
}

// Valid codes of any block code: encode Gaussian vectors.
std::vector<uint8_t> encode_rows(const quant::VectorQuantizer& vq, int64_t rows, uint64_t seed, std::vector<float>& gains) {
  const int d = vq.head_dim();
  const auto x = gaussian(static_cast<size_t>(rows) * d, seed);
  std::vector<uint8_t> codes(static_cast<size_t>(rows) * vq.code_bytes());
  gains.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t g = 0;
    vq.encode(&x[static_cast<size_t>(r) * d], &codes[static_cast<size_t>(r) * vq.code_bytes()], &g);
    gains[static_cast<size_t>(r)] = fp16_bits_to_float(g);
  }
  return codes;
}

TEST(AttendCpu, DecodeAndAccumulateKernelsAgreeAcrossIsasAndWithDecodeVector) {
  const uint64_t seed = 21;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const int64_t rows = 37;  // odd, past a 16-key tile twice
  for (auto codec : {quant::Codec::kE8P, quant::Codec::kRvq3, quant::Codec::kRvq4, quant::Codec::kBall3,
                     quant::Codec::kLloydMax3}) {
    for (int d : {64, 80, 128}) {
      const quant::VectorQuantizer vq(d, codec);
      std::vector<float> gains;
      const auto codes = encode_rows(vq, rows, seed + d, gains);
      const int G = 3;
      const auto p = gaussian(static_cast<size_t>(G) * rows, seed + 5);
      quant::dispatch_block_code(codec, [&](auto code) {
        using Code = decltype(code);
        std::vector<float> base(static_cast<size_t>(rows) * d), ref(base.size());
        ac::decode_rows_base<Code>(codes.data(), vq.code_bytes(), gains.data(), rows, d, base.data());
        for (int64_t r = 0; r < rows; ++r)
          quant::decode_vector_with_gain<Code>(&codes[static_cast<size_t>(r) * vq.code_bytes()], gains[static_cast<size_t>(r)],
                                               d, &ref[static_cast<size_t>(r) * d]);
        EXPECT_TRUE(same_bits(base, ref)) << quant::to_string(codec) << " d " << d;
        std::vector<float> acc_base(static_cast<size_t>(G) * d, 0.5f), acc_ref(acc_base);
        ac::accumulate_values_base<Code>(codes.data(), vq.code_bytes(), gains.data(), p.data(), static_cast<size_t>(rows),
                                         rows, G, d, acc_base.data());
        for (int64_t t = 0; t < rows; ++t)
          for (int g = 0; g < G; ++g)
            for (int i = 0; i < d; ++i)
              acc_ref[static_cast<size_t>(g * d + i)] += p[static_cast<size_t>(g * rows + t)] * ref[static_cast<size_t>(t * d + i)];
        EXPECT_TRUE(same_bits(acc_base, acc_ref)) << quant::to_string(codec) << " d " << d;
        if (!cpu_has_avx2()) return 0;
        std::vector<float> avx(base.size()), acc_avx(static_cast<size_t>(G) * d, 0.5f);
        ac::decode_rows_avx2<Code>(codes.data(), vq.code_bytes(), gains.data(), rows, d, avx.data());
        ac::accumulate_values_avx2<Code>(codes.data(), vq.code_bytes(), gains.data(), p.data(), static_cast<size_t>(rows),
                                         rows, G, d, acc_avx.data());
        EXPECT_TRUE(same_bits(avx, base)) << quant::to_string(codec) << " d " << d;
        EXPECT_TRUE(same_bits(acc_avx, acc_base)) << quant::to_string(codec) << " d " << d;
        return 0;
      });
    }
  }
}

TEST(AttendCpu, KeyTileKernelsAgreeAcrossIsas) {
  SKIP_WITHOUT_AVX2();
  const uint64_t seed = 31;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (int d : {64, 80, 128, 256}) {
    for (int rotary : {d, 32}) {
      for (auto layout : {transform::RopeLayout::kSplitHalf, transform::RopeLayout::kInterleaved}) {
        const int pairs = rotary / 2;
        std::vector<double> inv_freq(static_cast<size_t>(pairs));
        for (int i = 0; i < pairs; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(10000.0, -2.0 * i / rotary);
        const auto table = quant::build_rope_table(inv_freq.data(), pairs);
        quant::RopeTableView view{table.data(), rotary, layout};
        const auto planar = ac::build_planar_rope_low(table.data(), pairs);
        for (int G : {1, 4, 5}) {
          const int64_t m = 16, n = 40, t0 = 3;
          const auto q = gaussian(static_cast<size_t>(G) * d, seed + d + G);
          const auto rows0 = gaussian(static_cast<size_t>(m) * d, seed + 2);
          const auto inv_scale = gaussian(static_cast<size_t>(d), seed + 3), mean = gaussian(static_cast<size_t>(d), seed + 4);
          std::vector<int32_t> pos(static_cast<size_t>(n));
          for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(1010 + 3 * t);  // crosses 1024
          for (bool extras : {false, true}) {
            std::vector<float> lb(static_cast<size_t>(G) * n, 0.f), la(lb);
            ac::KeyTileArgs a;
            a.d = d;
            a.G = G;
            a.q = q.data();
            a.inv_scale = extras ? inv_scale.data() : nullptr;
            a.mean = extras ? mean.data() : nullptr;
            a.softmax_scale = 0.3f;
            a.n = static_cast<size_t>(n);
            auto rb = rows0, ra = rows0;
            ac::IncrementalRope rope_b(view, planar.data()), rope_a(view, planar.data());
            a.logits = lb.data();
            ac::finish_key_tile_base(a, rb.data(), t0, m, pos.data(), rope_b);
            a.logits = la.data();
            ac::finish_key_tile_avx2(a, ra.data(), t0, m, pos.data(), rope_a);
            EXPECT_TRUE(same_bits(ra, rb)) << "d " << d << " rotary " << rotary << " G " << G;
            EXPECT_TRUE(same_bits(la, lb)) << "d " << d << " rotary " << rotary << " G " << G;
          }
          const auto mu = gaussian(static_cast<size_t>(G), seed + 6);
          std::vector<float> lb(static_cast<size_t>(G) * n, 0.f), la(lb);
          ac::score_rows_base(q.data(), mu.data(), G, d, 0.2f, rows0.data(), t0, m, lb.data(), static_cast<size_t>(n));
          ac::score_rows_avx2(q.data(), mu.data(), G, d, 0.2f, rows0.data(), t0, m, la.data(), static_cast<size_t>(n));
          EXPECT_TRUE(same_bits(la, lb)) << "d " << d << " G " << G;
        }
      }
    }
  }
}

TEST(AttendCpu, WindowAccumulateAgreesAcrossIsasAndWithScalar) {
  const uint64_t seed = 51;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (int d : {64, 80, 256}) {
    for (int G : {1, 3, 4, 6}) {
      const int64_t m = 9, n = 20, t0 = 11;
      const auto rows = gaussian(static_cast<size_t>(m) * d, seed + d);
      const auto p = gaussian(static_cast<size_t>(G) * n, seed + G);
      std::vector<float> base(static_cast<size_t>(G) * d, 0.25f), ref(base), avx(base);
      ac::accumulate_rows_base(rows.data(), p.data(), static_cast<size_t>(n), t0, m, G, d, base.data());
      for (int64_t k = 0; k < m; ++k)
        for (int g = 0; g < G; ++g)
          for (int i = 0; i < d; ++i)
            ref[static_cast<size_t>(g * d + i)] += p[static_cast<size_t>(g * n + t0 + k)] * rows[static_cast<size_t>(k * d + i)];
      EXPECT_TRUE(same_bits(base, ref)) << "d " << d << " G " << G;
      if (!cpu_has_avx2()) continue;
      ac::accumulate_rows_avx2(rows.data(), p.data(), static_cast<size_t>(n), t0, m, G, d, avx.data());
      EXPECT_TRUE(same_bits(avx, base)) << "d " << d << " G " << G;
    }
  }
}

// End to end: with the baseline build forced, compress writes the same bytes and attend and
// decompress give the same floats as with AVX2 (Hadamard, encoders and attend kernels included).
TEST(AttendCpu, WholePipelineIsBitIdenticalAcrossIsas) {
  SKIP_WITHOUT_AVX2();
  synth::SyntheticSpec spec;
  spec.n_layers = 2;
  spec.n_kv_heads = 3;
  spec.n_q_heads = 9;
  spec.tokens = 300;
  spec.seed = 41;
  std::printf("seed %llu\n", static_cast<unsigned long long>(spec.seed));
  for (int d : {64, 80, 128}) {
    spec.head_dim = d;
    const auto data = synth::make_synthetic_kv(spec);
    const ModelShape shape{spec.n_layers, spec.n_kv_heads, spec.n_q_heads, d};
    SequenceKV seq;
    std::vector<LayerQueries> queries;
    for (int l = 0; l < spec.n_layers; ++l) {
      seq.layers.push_back({TensorView::nhd(data.keys[l].data(), DType::kF32, spec.tokens, spec.n_kv_heads, d),
                            TensorView::nhd(data.values[l].data(), DType::kF32, spec.tokens, spec.n_kv_heads, d)});
      LayerQueries lq;
      lq.queries = TensorView::nhd(data.queries[l].data(), DType::kF32, static_cast<int64_t>(data.query_positions.size()),
                                   spec.n_q_heads, d);
      lq.positions = data.query_positions.data();
      queries.push_back(lq);
    }
    for (const char* preset : {"quant-k3v2", "quant-k4v2", "quant-k3v3", "high"}) {
      for (bool pre_rope : {true, false}) {
        Config cfg = Config::preset(preset);
        cfg.keys_pre_rope = pre_rope;
        KVCompressor c(shape, cfg);
        std::vector<uint8_t> bytes[2];
        std::vector<float> out[2], dense[2];
        for (int forced = 0; forced < 2; ++forced) {
          BaselineIsaScope scope(forced == 1);
          const auto cache = c.compress(seq, &queries);
          bytes[forced] = entropy::serialize(cache);
          out[forced].resize(static_cast<size_t>(spec.n_q_heads) * d);
          c.attend(cache, 1, &data.queries[1][0], spec.tokens, out[forced].data());
          dense[forced] = cache.decompress_head(0, 2).keys;
        }
        EXPECT_EQ(bytes[0], bytes[1]) << preset << " d " << d << " pre " << pre_rope;
        EXPECT_TRUE(same_bits(out[0], out[1])) << preset << " d " << d << " pre " << pre_rope;
        EXPECT_TRUE(same_bits(dense[0], dense[1])) << preset << " d " << d << " pre " << pre_rope;
      }
    }
  }
}

}  // namespace
