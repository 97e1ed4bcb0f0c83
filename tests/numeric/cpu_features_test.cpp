// Every run-time ISA choice, end to end: with the baseline build forced, compress writes the same
// bytes and attend and decompress give the same floats as with AVX2 (Hadamard, encoders and the
// attention kernels included). The attention kernels alone: tests/attention/attend_kernels_test.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "testing/synthetic_kv.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv;

// Restores the default ISA choice even when an assertion returns early.
struct BaselineIsaScope {
  explicit BaselineIsaScope(bool on) { force_baseline_isa(on); }
  ~BaselineIsaScope() { force_baseline_isa(false); }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// End to end: with the baseline build forced, compress writes the same bytes and attend and
// decompress give the same floats as with AVX2 (Hadamard, encoders and attend kernels included).
TEST(CpuFeatures, WholePipelineIsBitIdenticalAcrossIsas) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "this CPU has no AVX2: only the baseline build runs";
  synth::SyntheticSpec spec;
  spec.n_layers = 2;
  spec.n_kv_heads = 3;
  spec.n_q_heads = 9;
  // Under the sanitizers: 160 tokens (still past the 64 mean tokens, the 32-token window and
  // several flush blocks), head_dim 64 and 80 (the power-of-two and the odd Hadamard paths), and
  // per head_dim half of the (preset, key frame) pairs, the other half at the other head_dim.
  spec.tokens = e8kv::test::kUnderSanitizer ? 160 : 300;
  spec.seed = 41;
  std::printf("seed %llu\n", static_cast<unsigned long long>(spec.seed));
  const std::vector<int> dims = e8kv::test::kUnderSanitizer ? std::vector<int>{64, 80} : std::vector<int>{64, 80, 128};
  for (int d : dims) {
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
    int pair_index = 0;
    for (const char* preset : {"quant-k3v2", "quant-k4v2", "quant-k3v3", "high"}) {
      for (KeyFrame frame : {KeyFrame::kPreRope, KeyFrame::kPostRope, KeyFrame::kRopeResidual}) {
        if (e8kv::test::kUnderSanitizer && (pair_index++ + d) % 2 != 0) continue;
        Config cfg = Config::preset(preset);
        cfg.key_frame = frame;
        KVCompressor c(shape, cfg);
        std::vector<uint8_t> bytes[2];
        std::vector<float> out[2], dense[2];
        for (int forced = 0; forced < 2; ++forced) {
          BaselineIsaScope scope(forced == 1);
          const auto cache = c.compress(seq, &queries);
          bytes[forced] = container::serialize(cache);
          out[forced].resize(static_cast<size_t>(spec.n_q_heads) * d);
          e8kv::attend(cache, 1, &data.queries[1][0], out[forced].data());
          dense[forced] = cache.decompress_head(0, 2).keys;
        }
        EXPECT_EQ(bytes[0], bytes[1]) << preset << " d " << d << " frame " << transform::to_string(frame);
        EXPECT_TRUE(same_bits(out[0], out[1])) << preset << " d " << d << " frame " << transform::to_string(frame);
        EXPECT_TRUE(same_bits(dense[0], dense[1])) << preset << " d " << d << " frame " << transform::to_string(frame);
      }
    }
  }
}

}  // namespace
