// KVCompressor tests: attention through the codes against fp32 attention, eviction invariants,
// GQA/MQA, ragged batches, append/flush equivalence, byte accounting and error handling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/parallel.hpp"
#include "e8kv/select/eviction.hpp"
#include "e8kv/select/scorer.hpp"
#include "testing/synthetic_kv.hpp"
#include "testing/kv_fixture.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv;
using namespace e8kv::testkit;

synth::SyntheticSpec default_spec(uint64_t seed) { return shaped_spec(2, 2, 4, 64, 300, seed); }

struct Errors {
  double out_rel_l2 = 0;  // mean over layers and queries
  double kl = 0;          // mean KL(approx || reference) of attention weights
};

// Attention through the codes vs fp32 attention over the original (unevicted) cache.
Errors measure(const Fixture& f, const Config& cfg) {
  KVCompressor c(f.shape, cfg);
  const CompressedKV cache = c.compress(f.seq, &f.queries);
  const auto& s = f.data.spec;
  Errors e;
  int count = 0;
  for (int l = 0; l < s.n_layers; ++l) {
    std::vector<std::vector<CompactHead>> heads;
    for (int h = 0; h < s.n_kv_heads; ++h) heads.push_back({cache.decompress_head(l, h)});
    for (int w = 0; w < static_cast<int>(f.data.query_positions.size()); w += 4) {
      const float* q = f.query(l, w);
      std::vector<std::vector<double>> wref;
      const auto ref = dense_attention(q, f.data.keys[l], f.data.values[l], s.tokens, s.n_kv_heads, s.n_q_heads,
                                       s.head_dim, &wref);
      std::vector<float> out(ref.size());
      c.attend(cache, l, q, s.tokens, out.data());
      e.out_rel_l2 += rel_l2(out, ref);
      // KL(approx || ref) over the kept tokens of each query head (finite under eviction).
      const int G = s.n_q_heads / s.n_kv_heads;
      for (int qh = 0; qh < s.n_q_heads; ++qh) {
        const CompactHead& ch = heads[qh / G][0];
        const int64_t n = static_cast<int64_t>(ch.positions.size());
        std::vector<double> logit(static_cast<size_t>(n));
        double m = -1e300, z = 0, kl = 0;
        for (int64_t t = 0; t < n; ++t) {
          double dot = 0;
          for (int i = 0; i < s.head_dim; ++i) dot += double(q[qh * s.head_dim + i]) * ch.keys[t * s.head_dim + i];
          logit[t] = dot / std::sqrt(double(s.head_dim));
          m = std::max(m, logit[t]);
        }
        for (auto& x : logit) z += (x = std::exp(x - m));
        for (int64_t t = 0; t < n; ++t) {
          const double p = logit[t] / z, r = wref[qh][ch.positions[t]];
          if (p > 0) kl += p * std::log(p / r);
        }
        e.kl += kl / s.n_q_heads;
      }
      ++count;
    }
  }
  e.out_rel_l2 /= count;
  e.kl /= count;
  return e;
}

// Per-preset tolerances on this synthetic cache: ~1.3x the measured values, far below what a
// broken codec gives (outputs unrelated to the reference have relative error ~1.4).
struct PresetBound {
  const char* name;
  double max_rel_l2;
  double max_kl;
};

TEST(Compressor, PresetsStayWithinTolerance) {
  auto spec = default_spec(101);
  spec.tokens = 640;  // enough that 80 % eviction still leaves tokens to code after the means
  Fixture f(spec);
  const PresetBound bounds[] = {
      // measured (seed 101, 640 tokens, defaults of commit 13d136d+: query-weighted keys, 8-bit
      // gains): k4v2 0.189/0.0071, k3v2 0.231/0.0428, k2v2 0.265/0.0883, high 0.220/0.0366,
      // asym 0.196/0.0153, balanced 0.234/0.0460, max 0.247/0.0682. The synthetic cache has
      // sharp attention (heavy hitters), so value errors do not average out; its near-isotropic
      // queries give the query weighting nothing to exploit (k3v2 was 0.0285 without it).
      // k4v4 0.075/0.0071, k3v3 0.169/0.0428 (attention KL depends on the keys alone).
      // RoPE-residual keys (the default since 2026-12-01; the figures above were pre-RoPE): k4v4
      // 0.075/0.0060, k3v2 0.231/0.0428, k2v2 0.280/0.1072, high 0.211/0.0343, asym
      // 0.214/0.0372, balanced 0.263/0.0942, max 0.276/0.1153. This generator's heavy hitters are
      // 3x the head's pre-RoPE mean, one fixed direction that the pre-RoPE frame codes alike for
      // every such token; with eviction they are most of what is kept, and the residual frame
      // turns that direction with each position. On SmolLM2 the two frames are within noise of
      // each other for every preset (docs/accuracy.md, "Key frames"), so the bounds follow the
      // residual figures here.
      {"quant-k4v4", 0.10, 0.0095}, {"quant-k3v3", 0.22, 0.056},
      {"quant-k4v2", 0.25, 0.0095}, {"quant-k3v2", 0.30, 0.056}, {"quant-k2v2", 0.35, 0.135},
      {"high", 0.29, 0.048},        {"asym", 0.28, 0.048},       {"balanced", 0.34, 0.12},
      {"max", 0.36, 0.15},
  };
  double prev_kl = 0;
  for (const auto& b : bounds) {
    const Errors e = measure(f, Config::preset(b.name));
    std::printf("%-12s rel_l2 %.4f  kl %.5f\n", b.name, e.out_rel_l2, e.kl);
    EXPECT_LT(e.out_rel_l2, b.max_rel_l2) << b.name;
    EXPECT_LT(e.kl, b.max_kl) << b.name;
    if (std::string(b.name) == "quant-k3v2") {
      EXPECT_GT(e.kl, prev_kl) << "3-bit keys must lose more than 4-bit";
    }
    if (std::string(b.name) == "quant-k2v2") {
      EXPECT_GT(e.kl, prev_kl) << "2-bit keys must lose more than 3-bit";
    }
    prev_kl = e.kl;
  }
}

TEST(Compressor, CentringAndFp16SinksReduceAttentionError) {
  auto spec = default_spec(107);
  spec.tokens = 400;
  Fixture f(spec);
  Config plain = Config::preset("quant-k2v2");
  plain.center = false;
  plain.fp16_sinks = false;
  Config centred = plain;
  centred.center = true;
  Config both = centred;
  both.fp16_sinks = true;
  const Errors e0 = measure(f, plain), e1 = measure(f, centred), e2 = measure(f, both);
  std::printf("plain kl %.5f, centred %.5f, centred + fp16 sinks %.5f\n", e0.kl, e1.kl, e2.kl);
  EXPECT_LT(e1.kl, 0.8 * e0.kl);
  // Synthetic sinks are ordinary tokens, so pinning them changes little here (the real-model
  // evaluation measures it); it must not undo the centring gain.
  EXPECT_LT(e2.kl, 0.8 * e0.kl);
  // The sinks are pinned in the window: fp16 and exact.
  KVCompressor c(f.shape, both);
  const auto cache = c.compress(f.seq);
  EXPECT_EQ(cache.layer(0).pinned, 4);
  const auto ch = cache.decompress_head(0, 1);
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < spec.head_dim; ++i)
      EXPECT_EQ(ch.keys[t * spec.head_dim + i],
                fp16_bits_to_float(float_to_fp16_bits(f.data.keys[0][(t * spec.n_kv_heads + 1) * spec.head_dim + i])));
}

TEST(Compressor, PostRopeStorageAlsoWorks) {
  Fixture f(default_spec(102));
  Config cfg = Config::preset("quant-k3v2");
  cfg.key_frame = KeyFrame::kPostRope;
  const Errors e = measure(f, cfg);
  // measured (seed 102): rel_l2 0.272, kl 0.0306
  EXPECT_LT(e.out_rel_l2, 0.33);
  EXPECT_LT(e.kl, 0.045);
}

TEST(Compressor, LosslessIsExactOnFp16Input) {
  const auto spec = default_spec(103);
  Fixture f(spec);
  // Round the cache to fp16 and hand it over as fp16.
  std::vector<std::vector<uint16_t>> kh(spec.n_layers), vh(spec.n_layers);
  std::vector<std::vector<float>> kr(spec.n_layers), vr(spec.n_layers);
  SequenceKV seq;
  for (int l = 0; l < spec.n_layers; ++l) {
    for (float x : f.data.keys[l]) kh[l].push_back(float_to_fp16_bits(x));
    for (float x : f.data.values[l]) vh[l].push_back(float_to_fp16_bits(x));
    for (uint16_t b : kh[l]) kr[l].push_back(fp16_bits_to_float(b));
    for (uint16_t b : vh[l]) vr[l].push_back(fp16_bits_to_float(b));
    seq.layers.push_back({TensorView::nhd(kh[l].data(), DType::kF16, spec.tokens, spec.n_kv_heads, spec.head_dim),
                          TensorView::nhd(vh[l].data(), DType::kF16, spec.tokens, spec.n_kv_heads, spec.head_dim)});
  }
  KVCompressor c(f.shape, Config::preset("lossless"));
  const auto cache = c.compress(seq);
  for (int l = 0; l < spec.n_layers; ++l) {
    for (int h = 0; h < spec.n_kv_heads; ++h) {
      const auto ch = cache.decompress_head(l, h);
      ASSERT_EQ(ch.positions.size(), static_cast<size_t>(spec.tokens));
      for (int t = 0; t < spec.tokens; ++t)
        for (int i = 0; i < spec.head_dim; ++i) {
          ASSERT_EQ(ch.keys[t * spec.head_dim + i], kr[l][(t * spec.n_kv_heads + h) * spec.head_dim + i]);
          ASSERT_EQ(ch.values[t * spec.head_dim + i], vr[l][(t * spec.n_kv_heads + h) * spec.head_dim + i]);
        }
    }
    const float* q = f.query(l, 0);
    const auto ref = dense_attention(q, kr[l], vr[l], spec.tokens, spec.n_kv_heads, spec.n_q_heads, spec.head_dim);
    std::vector<float> out(ref.size());
    c.attend(cache, l, q, spec.tokens, out.data());
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 1e-5f * (1.f + std::fabs(ref[i])));
  }
  EXPECT_NEAR(cache.compression_ratio(), 1.0, 0.01);
}

TEST(Compressor, SinksAndRecentKeptAndRateMetExactly) {
  Fixture f(default_spec(104));
  for (bool per_head : {false, true}) {
    for (double rate : {0.35, 0.6, 0.8}) {
      Config cfg = Config::preset("balanced");
      cfg.eviction_rate = rate;
      cfg.per_head_selection = per_head;
      cfg.sinks = 4;
      cfg.recent_window = 16;
      KVCompressor c(f.shape, cfg);
      const auto cache = c.compress(f.seq, &f.queries);
      const int64_t n = f.data.spec.tokens;
      const int64_t expect = n - std::llround(rate * n);
      for (int l = 0; l < f.shape.n_layers; ++l)
        for (int h = 0; h < f.shape.n_kv_heads; ++h) {
          const auto ch = cache.decompress_head(l, h);
          ASSERT_EQ(static_cast<int64_t>(ch.positions.size()), expect) << "rate " << rate;
          for (int s = 0; s < 4; ++s) EXPECT_EQ(ch.positions[s], s);
          for (int r = 0; r < 16; ++r) EXPECT_EQ(ch.positions[expect - 16 + r], n - 16 + r);
          for (size_t i = 1; i < ch.positions.size(); ++i) ASSERT_LT(ch.positions[i - 1], ch.positions[i]);
        }
      if (!per_head) {
        for (int l = 0; l < f.shape.n_layers; ++l) EXPECT_EQ(cache.positions(l, 0), cache.positions(l, 1));
      }
    }
  }
}

TEST(Compressor, EvictedTokensAreMaskedOrAbsentNeverZeroed) {
  Fixture f(default_spec(105));
  KVCompressor c(f.shape, Config::preset("balanced"));
  const auto cache = c.compress(f.seq, &f.queries);
  const auto dense = cache.decompress_layer(0);
  ASSERT_EQ(dense.positions.size(), static_cast<size_t>(dense.tokens));
  const int64_t H = dense.kv_heads, d = dense.head_dim;
  for (int64_t h = 0; h < H; ++h) {
    std::vector<int32_t> stored = cache.positions(0, static_cast<int>(h));
    const auto& w = cache.window_positions(0, static_cast<int>(h));
    stored.insert(stored.end(), w.begin(), w.end());
    std::vector<int32_t> present;
    for (int64_t t = 0; t < dense.tokens; ++t) {
      const float m = dense.mask[static_cast<size_t>(h * dense.tokens + t)];
      ASSERT_TRUE(m == 0.f || m == -std::numeric_limits<float>::infinity());
      if (m == 0.f) {
        present.push_back(dense.positions[static_cast<size_t>(t)]);
      } else {
        for (int64_t i = 0; i < d; ++i) ASSERT_EQ(dense.keys[static_cast<size_t>((t * H + h) * d + i)], 0.f);
      }
    }
    std::sort(stored.begin(), stored.end());
    EXPECT_EQ(present, stored) << "head " << h;
  }
  // Tokens no head keeps have no row: evicted, never a zero row that attention would weigh.
  EXPECT_LT(dense.tokens, f.data.spec.tokens);
  EXPECT_EQ(dense.positions.front(), 0);
  EXPECT_EQ(dense.positions.back(), f.data.spec.tokens - 1);
}

// A dense layer is sized by the tokens stored, not by the span of their positions: one token
// appended a billion positions ahead used to make decompress_layer allocate for the whole span
// (std::bad_alloc).
TEST(Compressor, DenseLayerIsSizedByTokensNotPositionSpan) {
  Fixture f(default_spec(107));
  KVCompressor c(f.shape, Config::preset("quant-k3v2"));
  auto cache = c.compress(f.seq);
  const int H = f.shape.n_kv_heads, d = f.shape.head_dim;
  const int32_t far = 1'000'000'000;
  for (int l = 0; l < f.shape.n_layers; ++l)
    c.append(cache, l, &f.data.keys[l][0], &f.data.values[l][0], far);
  const auto dense = cache.decompress_layer(0);
  EXPECT_EQ(dense.tokens, f.data.spec.tokens + 1);
  EXPECT_EQ(dense.positions.back(), far);
  EXPECT_EQ(dense.keys.size(), static_cast<size_t>(dense.tokens) * H * d);
  for (int h = 0; h < H; ++h) EXPECT_EQ(dense.mask[static_cast<size_t>(h * dense.tokens + dense.tokens - 1)], 0.f);
}

TEST(Compressor, GqaAndMqaMatchRepeatedKVReference) {
  for (int kv_heads : {2, 1}) {  // GQA 2:1 and MQA 4:1
    auto spec = default_spec(106);
    spec.n_kv_heads = kv_heads;
    spec.n_q_heads = 4;
    Fixture f(spec);
    for (const char* preset : {"quant-k3v2", "lossless"}) {
      KVCompressor c(f.shape, Config::preset(preset));
      const auto cache = c.compress(f.seq);
      for (int l = 0; l < spec.n_layers; ++l) {
        // Reference: decode K/V once, repeat it for every query head of the group (MHA layout).
        const int64_t n = cache.stored_tokens(l, 0);
        std::vector<float> K(static_cast<size_t>(n) * spec.n_q_heads * spec.head_dim), V(K.size());
        for (int qh = 0; qh < spec.n_q_heads; ++qh) {
          const auto ch = cache.decompress_head(l, qh / (spec.n_q_heads / kv_heads));
          for (int64_t t = 0; t < n; ++t)
            for (int i = 0; i < spec.head_dim; ++i) {
              K[(t * spec.n_q_heads + qh) * spec.head_dim + i] = ch.keys[t * spec.head_dim + i];
              V[(t * spec.n_q_heads + qh) * spec.head_dim + i] = ch.values[t * spec.head_dim + i];
            }
        }
        const float* q = f.query(l, 3);
        const auto ref = dense_attention(q, K, V, n, spec.n_q_heads, spec.n_q_heads, spec.head_dim);
        std::vector<float> out(ref.size());
        c.attend(cache, l, q, spec.tokens, out.data());
        EXPECT_LT(rel_l2(out, ref), 2e-5) << preset << " kv_heads " << kv_heads;
      }
    }
  }
}

// attend() on layer l against fp32 attention over decompress_head()'s keys and values: both
// read the same codes, so they agree to float rounding (relative L2 of the outputs).
double attend_vs_decompress(const KVCompressor& c, const CompressedKV& cache, const synth::SyntheticSpec& spec, int l,
                            const float* q, int32_t position) {
  const int64_t n = cache.stored_tokens(l, 0);
  std::vector<float> K(static_cast<size_t>(n) * spec.n_kv_heads * spec.head_dim), V(K.size());
  for (int h = 0; h < spec.n_kv_heads; ++h) {
    const auto ch = cache.decompress_head(l, h);
    for (int64_t t = 0; t < n; ++t)
      for (int i = 0; i < spec.head_dim; ++i) {
        K[(t * spec.n_kv_heads + h) * spec.head_dim + i] = ch.keys[t * spec.head_dim + i];
        V[(t * spec.n_kv_heads + h) * spec.head_dim + i] = ch.values[t * spec.head_dim + i];
      }
  }
  const auto ref = dense_attention(q, K, V, n, spec.n_kv_heads, spec.n_q_heads, spec.head_dim);
  std::vector<float> out(ref.size());
  c.attend(cache, l, q, position, out.data());
  return rel_l2(out, ref);
}

// attend re-applies RoPE with a cached product of the table's upper levels; decompress_head uses
// the per-position table path. They must agree wherever positions cross a 1024 or 2^20 boundary,
// for both pair layouts and partial rotary dims.
TEST(Compressor, AttendMatchesDecompressAcrossRopeTableBoundaries) {
  auto spec = default_spec(107);
  Fixture f(spec);
  for (int32_t first : {0, 1000, (1 << 20) - 150, (1 << 30) + 5}) {
    for (auto layout : {transform::RopeLayout::kSplitHalf, transform::RopeLayout::kInterleaved}) {
      for (int rotary : {0, 32})
       for (KeyFrame frame : {KeyFrame::kPreRope, KeyFrame::kRopeResidual}) {
        // Under the sanitizers half of the grid: every first position with each layout, rotary
        // width and frame twice (the half where the three choices' parity is even).
        const int parity = (layout == transform::RopeLayout::kInterleaved) + (rotary != 0) + (frame == KeyFrame::kPreRope);
        if (e8kv::test::kUnderSanitizer && parity % 2 != 0) continue;
        Config cfg = Config::preset("quant-k3v2");
        cfg.rope.layout = layout;
        cfg.rope.rotary_dim = rotary;
        cfg.key_frame = frame;
        KVCompressor c(f.shape, cfg);
        SequenceKV seq = f.seq;
        seq.first_position = first;
        const auto cache = c.compress(seq);
        for (int l = 0; l < spec.n_layers; ++l)
          EXPECT_LT(attend_vs_decompress(c, cache, spec, l, f.query(l, 7), first + spec.tokens), 2e-5)
              << "first position " << first << " rotary " << rotary << " frame " << transform::to_string(frame);
      }
    }
  }
}

// Query-weighted keys: scales exist only with queries, are equal within every RoPE pair (so they
// commute with RoPE), are counted by bytes(), and attend still equals attention over
// decompress() for both key frames; with queries concentrated on a few RoPE pairs they cut the
// error of q·k (what they minimize) well below unscaled coding.
TEST(Compressor, QueryWeightedKeys) {
  auto spec = default_spec(108);
  Fixture f(spec);
  for (auto layout : {transform::RopeLayout::kSplitHalf, transform::RopeLayout::kInterleaved}) {
    for (KeyFrame frame : {KeyFrame::kPreRope, KeyFrame::kPostRope, KeyFrame::kRopeResidual}) {
      Config cfg = Config::preset("quant-k3v2");
      cfg.rope.layout = layout;
      cfg.key_frame = frame;
      KVCompressor c(f.shape, cfg);
      const auto plain = c.compress(f.seq);
      const auto weighted = c.compress(f.seq, &f.queries);
      EXPECT_TRUE(plain.layer(0).heads[0].key_channel_scale.empty()) << "no queries, no scales";
      EXPECT_EQ(weighted.bytes(), plain.bytes() + 2u * spec.head_dim * spec.n_layers * spec.n_kv_heads);
      for (int l = 0; l < spec.n_layers; ++l) {
        for (int h = 0; h < spec.n_kv_heads; ++h) {
          const auto& s = weighted.layer(l).heads[static_cast<size_t>(h)].key_channel_scale;
          ASSERT_EQ(s.size(), static_cast<size_t>(spec.head_dim));
          for (int i = 0; i < spec.head_dim / 2; ++i) {
            int a = 0, b = 0;
            transform::rope_pair_indices(layout, spec.head_dim, i, a, b);
            EXPECT_EQ(s[static_cast<size_t>(a)], s[static_cast<size_t>(b)]) << "pair " << i;
          }
        }
        EXPECT_LT(attend_vs_decompress(c, weighted, spec, l, f.query(l, 5), spec.tokens), 2e-5) << "key frame " << transform::to_string(frame);
      }
    }
  }
  // Queries 4x larger on the first 4 rotary pairs (split halves: channels j and j + 32), as real
  // queries concentrate on a few frequencies; the synthetic ones are otherwise near-isotropic.
  for (auto& layer_q : f.data.queries)
    for (size_t r = 0; r < layer_q.size() / 64; ++r)
      for (int j = 0; j < 4; ++j) {
        layer_q[r * 64 + j] *= 4.f;
        layer_q[r * 64 + j + 32] *= 4.f;
      }
  auto logit_mse = [&](bool weighted) {
    Config cfg = Config::preset("quant-k3v2");
    cfg.query_weighted_keys = weighted;
    KVCompressor c(f.shape, cfg);
    const auto cache = c.compress(f.seq, &f.queries);
    double sum = 0;
    int64_t count = 0;
    const int G = spec.n_q_heads / spec.n_kv_heads, d = spec.head_dim;
    for (int l = 0; l < spec.n_layers; ++l)
      for (int h = 0; h < spec.n_kv_heads; ++h) {
        const auto ch = cache.decompress_head(l, h);
        for (size_t t = 0; t < ch.positions.size(); ++t) {
          const float* k = &f.data.keys[l][(static_cast<size_t>(ch.positions[t]) * spec.n_kv_heads + h) * d];
          for (size_t w = 0; w < f.data.query_positions.size(); ++w)
            for (int g = 0; g < G; ++g) {
              const float* q = f.query(l, static_cast<int>(w)) + (h * G + g) * d;
              double e = 0;
              for (int i = 0; i < d; ++i) e += double(q[i]) * (k[i] - ch.keys[t * d + i]);
              sum += e * e;
              ++count;
            }
        }
      }
    return sum / static_cast<double>(count);
  };
  const double off = logit_mse(false), on = logit_mse(true);
  std::printf("query-weighted keys: mean (q.(k - k^))^2 over the observation queries %.4f -> %.4f\n", off, on);
  EXPECT_LT(on, 0.8 * off);
}

bool same_codes(const CompressedKV& a, const CompressedKV& b) {
  if (a.n_layers() != b.n_layers()) return false;
  for (int l = 0; l < a.n_layers(); ++l) {
    const auto &x = a.layer(l), &y = b.layer(l);
    if (x.positions != y.positions || x.window_positions != y.window_positions) return false;
    for (size_t h = 0; h < x.heads.size(); ++h) {
      const auto &p = x.heads[h], &q = y.heads[h];
      if (p.key_codes != q.key_codes || p.value_codes != q.value_codes || p.key_gains != q.key_gains ||
          p.value_gains != q.value_gains || p.window_keys != q.window_keys || p.window_values != q.window_values)
        return false;
    }
  }
  return true;
}

TEST(Compressor, RaggedBatchEqualsSingleRuns) {
  std::vector<Fixture> fs;
  const int lengths[3] = {300, 37, 129};
  for (int b = 0; b < 3; ++b) {
    auto spec = default_spec(110 + b);
    spec.tokens = lengths[b];
    fs.emplace_back(spec);
  }
  Config cfg = Config::preset("high");
  KVCompressor c(fs[0].shape, cfg);
  std::vector<SequenceKV> batch;
  std::vector<std::vector<LayerQueries>> qs;
  for (auto& f : fs) {
    batch.push_back(f.seq);
    qs.push_back(f.queries);
  }
  const auto out = c.compress_batch(batch, &qs);
  ASSERT_EQ(out.size(), 3u);
  for (int b = 0; b < 3; ++b) {
    const auto single = c.compress(fs[b].seq, &fs[b].queries);
    EXPECT_TRUE(same_codes(out[b], single)) << "sequence " << b;
    EXPECT_EQ(out[b].bytes(), single.bytes());
    EXPECT_EQ(out[b].original_tokens(), lengths[b]);
  }
}

TEST(Compressor, AppendAndFlushEqualWholeCompression) {
  for (int residual : {0, 8}) {
    auto spec = default_spec(120);
    Fixture f(spec);
    Config cfg = Config::preset("quant-k3v2");
    cfg.residual_length = residual;
    cfg.flush_block = 16;
    KVCompressor c(f.shape, cfg);
    const auto whole = c.compress(f.seq);
    const int m = 101;
    SequenceKV prefix;
    for (const auto& kv : f.seq.layers) prefix.layers.push_back({kv.keys.token_slice(0, m), kv.values.token_slice(0, m)});
    auto cache = c.compress(prefix);
    const int H = spec.n_kv_heads, d = spec.head_dim;
    for (int t = m; t < spec.tokens; ++t)
      for (int l = 0; l < spec.n_layers; ++l)
        c.append(cache, l, &f.data.keys[l][static_cast<size_t>(t) * H * d], &f.data.values[l][static_cast<size_t>(t) * H * d], t);
    EXPECT_TRUE(same_codes(whole, cache)) << "residual " << residual;
    EXPECT_EQ(whole.bytes(), cache.bytes());
    // The window obeys the flush rule: residual <= window < residual + flush_block.
    EXPECT_GE(cache.window_tokens(0), std::min<int64_t>(residual, spec.tokens));
    EXPECT_LT(cache.window_tokens(0), residual + 16);
  }
}

// Compressing at once equals compressing any prefix and appending the rest, byte for byte in
// the container: for every quantized preset (with queries, so query-weighted keys and 8-bit gains
// are in play), with residual 0 and 8, at every split point from 0 to past the first flush —
// including prefixes shorter than `sinks` (sinks are pinned by position, whichever call brings
// them) and the 8-bit gain reference (fixed by the first flush_block coded tokens).
TEST(Compressor, EverySplitPointEqualsWholeCompression) {
  auto spec = default_spec(124);
  spec.tokens = 110;
  spec.n_layers = 1;
  Fixture f(spec);
  const int H = spec.n_kv_heads, d = spec.head_dim;
  for (const char* preset : {"quant-k3v2", "quant-k2v2", "quant-k4v4", "lossless"})
    for (int residual : {0, 8}) {
      Config cfg = Config::preset(preset);
      cfg.residual_length = residual;
      KVCompressor c(f.shape, cfg);
      const auto whole = container::serialize(c.compress(f.seq, &f.queries));
      std::printf("%s residual %d: whole %zu bytes\n", preset, residual, whole.size());
      // Under the sanitizers the split points around the sinks (0-5), a flush block (16, 17), the
      // mean tokens (64, 65), the end (89, 90) and every 7th: the same code paths; the optimized
      // build checks every point.
      for (int m = 0; m <= 90; ++m) {
        const bool edge = m <= 5 || m == 16 || m == 17 || m == 64 || m == 65 || m >= 89 || m % 7 == 0;
        if (e8kv::test::kUnderSanitizer && !edge) continue;
        SequenceKV prefix;
        for (const auto& kv : f.seq.layers) prefix.layers.push_back({kv.keys.token_slice(0, m), kv.values.token_slice(0, m)});
        auto cache = c.compress(prefix, &f.queries);
        for (int t = m; t < spec.tokens; ++t)
          c.append(cache, 0, &f.data.keys[0][static_cast<size_t>(t) * H * d], &f.data.values[0][static_cast<size_t>(t) * H * d], t);
        ASSERT_EQ(container::serialize(cache), whole) << preset << " residual " << residual << " split at " << m;
      }
    }
}

// A call that throws leaves the cache exactly as it was: extend with a NaN (or a shape error) in a
// later layer, append with a NaN or a position out of order. The cache then goes on like one that
// never saw the failed call.
TEST(Compressor, FailedCallsLeaveTheCacheUnchanged) {
  auto spec = default_spec(125);
  spec.n_layers = 3;
  spec.tokens = 200;
  Fixture f(spec);
  const int H = spec.n_kv_heads, d = spec.head_dim;
  // Shared selection and the spread over layers check the keys in their scoring pass only (there
  // require_finite_layer names the element; score_layer's own finiteness check stands behind it,
  // so removing the first alone does not make this test fail: the call still throws).
  for (const char* preset : {"quant-k3v2", "high", "high,shared=1", "high,evict_layers=1", "tier-k3v2,per_head=1"}) {
    KVCompressor c(f.shape, Config::parse(std::string("preset=") + preset));
    SequenceKV first, second;
    for (const auto& kv : f.seq.layers) {
      first.layers.push_back({kv.keys.token_slice(0, 120), kv.values.token_slice(0, 120)});
      second.layers.push_back({kv.keys.token_slice(120, 80), kv.values.token_slice(120, 80)});
    }
    second.first_position = 120;
    auto cache = c.compress(first, &f.queries);
    const auto before = container::serialize(cache);
    const size_t resident = cache.resident_bytes();
    // A NaN in the last layer's values.
    std::vector<float> bad(f.data.values[2]);
    bad[static_cast<size_t>(150) * H * d + 3] = std::numeric_limits<float>::quiet_NaN();
    SequenceKV poisoned = second;
    poisoned.layers[2].values = TensorView::nhd(bad.data(), DType::kF32, spec.tokens, H, d).token_slice(120, 80);
    EXPECT_THROW(c.extend(cache, poisoned, &f.queries), Error);
    EXPECT_EQ(container::serialize(cache), before) << preset;
    // A NaN in the last layer's keys.
    std::vector<float> bad_keys(f.data.keys[2]);
    bad_keys[static_cast<size_t>(170) * H * d + 5] = std::numeric_limits<float>::quiet_NaN();
    SequenceKV poisoned_keys = second;
    poisoned_keys.layers[2].keys = TensorView::nhd(bad_keys.data(), DType::kF32, spec.tokens, H, d).token_slice(120, 80);
    EXPECT_THROW(c.extend(cache, poisoned_keys, &f.queries), Error) << preset;
    EXPECT_EQ(container::serialize(cache), before) << preset;
    // A shape error in the last layer.
    SequenceKV short_layer = second;
    short_layer.layers[2].values = short_layer.layers[2].values.token_slice(0, 79);
    EXPECT_THROW(c.extend(cache, short_layer, &f.queries), Error);
    EXPECT_EQ(container::serialize(cache), before) << preset;
    // append: NaN key, huge value, position going back.
    std::vector<float> k(&f.data.keys[1][static_cast<size_t>(120) * H * d], &f.data.keys[1][static_cast<size_t>(121) * H * d]);
    std::vector<float> v(&f.data.values[1][static_cast<size_t>(120) * H * d], &f.data.values[1][static_cast<size_t>(121) * H * d]);
    k[5] = std::numeric_limits<float>::infinity();
    EXPECT_THROW(c.append(cache, 1, k.data(), v.data(), 120), Error);
    k[5] = 0.f;
    v[7] = 1e9f;  // beyond fp16
    EXPECT_THROW(c.append(cache, 1, k.data(), v.data(), 120), Error);
    v[7] = 0.f;
    EXPECT_THROW(c.append(cache, 1, k.data(), v.data(), 119), Error);
    EXPECT_EQ(container::serialize(cache), before) << preset;
    EXPECT_EQ(cache.resident_bytes(), resident) << preset;
    // It goes on exactly like a cache that never saw those calls.
    auto clean = c.compress(first, &f.queries);
    c.extend(clean, second, &f.queries);
    c.extend(cache, second, &f.queries);
    EXPECT_EQ(container::serialize(cache), container::serialize(clean)) << preset;
  }
}

// The last stored position is the larger of the coded tokens' and the window's: with only the
// pinned sinks left in the window (positions 0..3), the coded tokens reach further. A position
// between them is refused by append, extend and attend (found through the C ABI: accepted before,
// leaving a cache the container could not write).
TEST(Compressor, PositionsMustFollowTheLastCodedTokenToo) {
  auto spec = default_spec(127);
  spec.tokens = 68;
  spec.n_layers = 1;
  Fixture f(spec);
  Config cfg = Config::preset("quant-k3v2");
  cfg.residual_length = 0;  // 64 unpinned tokens flush whole
  KVCompressor c(f.shape, cfg);
  auto cache = c.compress(f.seq, &f.queries);
  ASSERT_EQ(cache.window_tokens(0), 4) << "the window holds the sinks only";
  const auto before = container::serialize(cache);
  const int H = spec.n_kv_heads, d = spec.head_dim;
  EXPECT_THROW(c.append(cache, 0, &f.data.keys[0][0], &f.data.values[0][0], 10), Error);
  SequenceKV late = f.seq;
  late.first_position = 10;
  EXPECT_THROW(c.extend(cache, late, &f.queries), Error);
  std::vector<float> out(static_cast<size_t>(spec.n_q_heads) * d);
  EXPECT_THROW(c.attend(cache, 0, f.query(0, 0), 10, out.data()), Error);
  EXPECT_EQ(container::serialize(cache), before);
  c.append(cache, 0, &f.data.keys[0][0], &f.data.values[0][0], 68);
  EXPECT_NO_THROW(container::serialize(cache));
  (void)H;
}

// Resident memory is what bytes() counts: right after compress, for every preset, the heap the
// cache holds is within 5 % of bytes(). Appends keep spare capacity of at most a sixteenth of the
// coded buffers plus one flush block of window rows per head (the window fills up to its flush).
TEST(Compressor, ResidentMemoryMatchesBytes) {
  auto spec = default_spec(126);
  spec.n_kv_heads = 4;
  spec.n_q_heads = 8;
  spec.head_dim = 128;
  // Enough tokens that the fixed per-cache overhead (~18 KB here) stays within the 5 % bound.
  spec.tokens = 1024;
  Fixture f(spec);
  const int H = spec.n_kv_heads, d = spec.head_dim;
  const std::vector<const char*> all = {"quant-k4v4", "quant-k3v3", "quant-k4v2", "quant-k3v2", "quant-k2v2",
                                        "high",       "asym",       "balanced",   "max",        "lossless"};
  const std::vector<const char*> some = {"quant-k3v2", "high", "lossless"};
  // Under the sanitizers three presets (the default codes, `high`'s residual codes with eviction,
  // fp16) and
  // fewer appends (still several growths of every buffer).
  const int appends = e8kv::test::kUnderSanitizer ? 120 : 300;
  for (const char* preset : e8kv::test::kUnderSanitizer ? some : all) {
    KVCompressor c(f.shape, Config::preset(preset));
    auto cache = c.compress(f.seq, &f.queries);
    const double ratio = static_cast<double>(cache.resident_bytes()) / static_cast<double>(cache.bytes());
    std::printf("%-12s bytes %zu resident %zu (x%.4f)\n", preset, cache.bytes(), cache.resident_bytes(), ratio);
    EXPECT_LE(ratio, 1.05) << preset;
    EXPECT_GE(ratio, 0.9) << preset << ": resident memory well below bytes() means bytes() overcounts";
    // Appended tokens: capacities grow by a sixteenth at a time.
    for (int t = 0; t < appends; ++t)
      for (int l = 0; l < spec.n_layers; ++l)
        c.append(cache, l, &f.data.keys[l][static_cast<size_t>(t % spec.tokens) * H * d],
                 &f.data.values[l][static_cast<size_t>(t % spec.tokens) * H * d], spec.tokens + t);
    const double window_spare = static_cast<double>(spec.n_layers) * H * 16 * d * 2 * 2;
    EXPECT_LE(static_cast<double>(cache.resident_bytes()), (1.0 + 1.0 / 16) * static_cast<double>(cache.bytes()) + window_spare)
        << preset << " after appends";
  }
}

TEST(Compressor, ExtendNeverRequantizesEarlierTokens) {
  auto spec = default_spec(121);
  Fixture f(spec);
  Config cfg = Config::preset("high");
  KVCompressor c(f.shape, cfg);
  const int m = 160;
  SequenceKV first, second;
  for (const auto& kv : f.seq.layers) {
    first.layers.push_back({kv.keys.token_slice(0, m), kv.values.token_slice(0, m)});
    second.layers.push_back({kv.keys.token_slice(m, spec.tokens - m), kv.values.token_slice(m, spec.tokens - m)});
  }
  second.first_position = m;
  auto cache = c.compress(first, &f.queries);  // queries at later positions see only earlier keys
  const auto before = cache.layer(0).heads[0].key_codes;
  c.extend(cache, second, &f.queries);
  const auto& after = cache.layer(0).heads[0].key_codes;
  ASSERT_GE(after.size(), before.size());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), after.begin()));
  EXPECT_EQ(cache.original_tokens(), spec.tokens);
  // Only the new chunk is evicted from: kept = kept(first) + kept(second).
  select::EvictionOptions eo = cfg.eviction_options();
  const int64_t k1 = select::kept_count(m, eo);
  eo.sinks = 0;
  EXPECT_EQ(cache.stored_tokens(0), k1 + select::kept_count(spec.tokens - m, eo));
}

/// Brute force of the layers' normalized scores (shared selection, eviction spread over layers):
/// per layer, score_layer and aggregate_heads, shifted to a minimum of 0 when some are negative and
/// divided by their sum (uniform when that is 0), in double.
std::vector<std::vector<double>> normalized_layer_scores(const SequenceKV& chunk, const std::vector<LayerQueries>& queries,
                                                         const Config& cfg, float softmax_scale) {
  const int64_t n = chunk.tokens();
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = chunk.position(t);
  const select::ScorerOptions so = cfg.scorer_options();
  std::vector<std::vector<double>> out;
  for (size_t l = 0; l < chunk.layers.size(); ++l) {
    const auto per_token = select::aggregate_heads(
        select::score_layer(chunk.layers[l].keys, pos.data(), &queries[l], so, softmax_scale), cfg.head_aggregation);
    const double lo = std::min(0.0, static_cast<double>(*std::min_element(per_token.begin(), per_token.end())));
    double sum = 0;
    for (float x : per_token) sum += x - lo;
    std::vector<double> share(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t)
      share[static_cast<size_t>(t)] = sum > 0 ? (per_token[static_cast<size_t>(t)] - lo) / sum : 1.0 / n;
    out.push_back(std::move(share));
  }
  return out;
}

// Shared selection, brute force: the positions every layer keeps of `chunk` (`before` tokens
// already in the cache): the mean over layers of normalized_layer_scores, then select_tokens once.
std::vector<int32_t> shared_reference(const SequenceKV& chunk, const std::vector<LayerQueries>& queries,
                                      const Config& cfg, int64_t before, float softmax_scale) {
  const int64_t n = chunk.tokens();
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = chunk.position(t);
  std::vector<double> mean(static_cast<size_t>(n), 0.0);
  for (const auto& share : normalized_layer_scores(chunk, queries, cfg, softmax_scale))
    for (int64_t t = 0; t < n; ++t) mean[static_cast<size_t>(t)] += share[static_cast<size_t>(t)];
  std::vector<float> avg(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t)
    avg[static_cast<size_t>(t)] = static_cast<float>(mean[static_cast<size_t>(t)] / chunk.layers.size());
  select::EvictionOptions eo = cfg.eviction_options();
  eo.sinks = static_cast<int>(std::clamp<int64_t>(cfg.sinks - before, 0, n));
  std::vector<int32_t> kept;
  for (int64_t t : select::select_tokens(avg, eo)) kept.push_back(pos[static_cast<size_t>(t)]);
  return kept;
}

// shared=1: every layer keeps the same tokens, the brute-force reference's, with the sinks, the
// recent window and the kept count of a per-layer selection; the same cache with a thread pool.
// Key-norm scores are negative (the shift), key-key with head_agg=max a third path.
TEST(Compressor, SharedSelectionKeepsOneSetForEveryLayer) {
  auto spec = default_spec(160);
  spec.n_layers = 4;
  Fixture f(spec);
  const int64_t n = spec.tokens;
  ThreadPool pool(2);
  for (const char* spec_string : {"preset=high,shared=1", "preset=high,shared=1,scorer=key-norm",
                                  "preset=max,shared=1,scorer=key-key,head_agg=max,sinks=6,recent=20"}) {
    SCOPED_TRACE(spec_string);
    const Config cfg = Config::parse(spec_string);
    ASSERT_TRUE(cfg.shared_selection);
    KVCompressor c(f.shape, cfg);
    const auto cache = c.compress(f.seq, &f.queries);
    const auto want = shared_reference(f.seq, f.queries, cfg, 0, cache.layout().effective_softmax_scale());
    const select::EvictionOptions eo = cfg.eviction_options();
    ASSERT_EQ(static_cast<int64_t>(want.size()), select::kept_count(n, eo));
    ASSERT_LT(static_cast<int64_t>(want.size()), n);
    for (int s = 0; s < cfg.sinks; ++s) EXPECT_EQ(want[static_cast<size_t>(s)], s);
    for (int r = 0; r < cfg.recent_window; ++r)
      EXPECT_EQ(want[want.size() - static_cast<size_t>(cfg.recent_window - r)], n - cfg.recent_window + r);
    for (int l = 0; l < spec.n_layers; ++l) {
      EXPECT_EQ(cache.stored_positions(l), want) << "layer " << l;
      EXPECT_EQ(cache.layer(l).pinned, cfg.sinks) << "layer " << l;  // fp16 sinks as without the flag
      for (int h = 0; h < spec.n_kv_heads; ++h) EXPECT_EQ(cache.stored_tokens(l, h), static_cast<int64_t>(want.size()));
    }
    // Without the flag the layers choose differently on this input (so the test above means something).
    Config per_layer = cfg;
    per_layer.shared_selection = false;
    const auto own = KVCompressor(f.shape, per_layer).compress(f.seq, &f.queries);
    int differing = 0;
    for (int l = 1; l < spec.n_layers; ++l) differing += own.stored_positions(l) != own.stored_positions(0) ? 1 : 0;
    EXPECT_GE(differing, 1) << "every layer keeps the same tokens even without shared selection";
    // Threads change nothing: scored in parallel, combined in layer order.
    EXPECT_EQ(container::serialize(c.compress(f.seq, &f.queries, &pool)), container::serialize(cache));
  }
}

// evict_layers=1, brute force: each layer's head-combined scores normalized to sum 1 (as for
// shared selection), the candidates (neither sinks nor recent) of all layers sorted by (share,
// layer, later token first), the lowest (tokens one layer evicts) x (layers) evicted. Every layer keeps its
// sinks and recent window and exactly the reference's positions; the total equals uniform
// eviction's; the counts differ between layers on this input; threads change nothing; a second
// chunk (extend) spreads its own evictions.
TEST(Compressor, EvictionSpreadOverLayersEvictsTheLowestSharesOfAllLayers) {
  auto spec = default_spec(161);
  spec.n_layers = 4;
  Fixture f(spec);
  const int64_t n = spec.tokens;
  ThreadPool pool(2);
  for (const char* spec_string : {"preset=lossless,evict=0.4,evict_layers=1",
                                  "preset=quant-k3v2,evict=0.3,evict_layers=1,per_head=1,fp16_tier=0.02",
                                  "preset=lossless,evict=0.5,evict_layers=1,scorer=key-norm,sinks=6,recent=20"}) {
    SCOPED_TRACE(spec_string);
    const Config cfg = Config::parse(spec_string);
    ASSERT_TRUE(cfg.layer_adaptive_eviction);
    KVCompressor c(f.shape, cfg);
    const auto cache = c.compress(f.seq, &f.queries);
    // The reference.
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = f.seq.position(t);
    struct Candidate {
      double share;
      int layer;
      int64_t token;
    };
    std::vector<Candidate> candidates;
    const auto shares = normalized_layer_scores(f.seq, f.queries, cfg, cache.layout().effective_softmax_scale());
    for (int l = 0; l < spec.n_layers; ++l)
      for (int64_t t = cfg.sinks; t < n - cfg.recent_window; ++t)
        candidates.push_back({shares[static_cast<size_t>(l)][static_cast<size_t>(t)], l, t});
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
      if (a.share != b.share) return a.share < b.share;
      if (a.layer != b.layer) return a.layer < b.layer;
      return a.token > b.token;  // of equal scores a layer keeps the earlier token
    });
    const select::EvictionOptions eo = cfg.eviction_options();
    const int64_t per_layer = n - select::kept_count(n, eo);
    ASSERT_GT(per_layer, 0);
    std::vector<std::vector<char>> evicted(static_cast<size_t>(spec.n_layers), std::vector<char>(static_cast<size_t>(n), 0));
    for (int64_t i = 0; i < per_layer * spec.n_layers; ++i)
      evicted[static_cast<size_t>(candidates[static_cast<size_t>(i)].layer)][static_cast<size_t>(candidates[static_cast<size_t>(i)].token)] = 1;
    int64_t total_kept = 0;
    std::vector<int64_t> kept_per_layer;
    for (int l = 0; l < spec.n_layers; ++l) {
      std::vector<int32_t> want;
      for (int64_t t = 0; t < n; ++t)
        if (!evicted[static_cast<size_t>(l)][static_cast<size_t>(t)]) want.push_back(pos[static_cast<size_t>(t)]);
      kept_per_layer.push_back(static_cast<int64_t>(want.size()));
      total_kept += static_cast<int64_t>(want.size());
      for (int h = 0; h < spec.n_kv_heads; ++h) {
        EXPECT_EQ(cache.stored_tokens(l, h), static_cast<int64_t>(want.size())) << "layer " << l << " head " << h;
        if (!cfg.per_head_selection) {
          EXPECT_EQ(cache.stored_positions(l), want) << "layer " << l;
        }
      }
      if (cfg.per_head_selection) continue;  // counts per head above; positions are per head
      const auto stored = cache.stored_positions(l);
      for (int s = 0; s < cfg.sinks; ++s)
        EXPECT_NE(std::find(stored.begin(), stored.end(), s), stored.end()) << "sink " << s << " of layer " << l;
      for (int64_t t = n - cfg.recent_window; t < n; ++t)
        EXPECT_NE(std::find(stored.begin(), stored.end(), pos[static_cast<size_t>(t)]), stored.end())
            << "recent token " << t << " of layer " << l;
    }
    EXPECT_EQ(total_kept, select::kept_count(n, eo) * spec.n_layers) << "the total is uniform eviction's";
    EXPECT_NE(*std::min_element(kept_per_layer.begin(), kept_per_layer.end()),
              *std::max_element(kept_per_layer.begin(), kept_per_layer.end()))
        << "every layer evicts the same count on this input (the test would not tell spread from uniform)";
    EXPECT_EQ(container::serialize(c.compress(f.seq, &f.queries, &pool)), container::serialize(cache));
    // extend: the second chunk's evictions are spread too (the total again uniform eviction's).
    const int64_t m = 200;
    SequenceKV first, second;
    for (const auto& kv : f.seq.layers) {
      first.layers.push_back({kv.keys.token_slice(0, m), kv.values.token_slice(0, m)});
      second.layers.push_back({kv.keys.token_slice(m, n - m), kv.values.token_slice(m, n - m)});
    }
    second.first_position = static_cast<int32_t>(m);
    auto grown = c.compress(first, &f.queries);
    c.extend(grown, second, &f.queries);
    select::EvictionOptions e1 = eo, e2 = eo;
    e2.sinks = 0;
    int64_t grown_total = 0;
    for (int l = 0; l < spec.n_layers; ++l) grown_total += grown.stored_tokens(l, 0);
    EXPECT_EQ(grown_total, (select::kept_count(m, e1) + select::kept_count(n - m, e2)) * spec.n_layers);
  }
  // One kept set for every layer and per-layer sizes exclude each other.
  EXPECT_THROW(KVCompressor(f.shape, Config::parse("preset=high,shared=1,evict_layers=1")), Error);
}

// extend() selects the new chunk's kept set for the whole model too (earlier tokens stay as they
// are; only the chunk is evicted from, as without the flag). Layers of different lengths (an
// append to one layer only) cannot share a selection: refused, the cache unchanged.
TEST(Compressor, SharedSelectionAppliesToExtend) {
  auto spec = default_spec(161);
  spec.n_layers = 3;
  Fixture f(spec);
  const Config cfg = Config::parse("preset=high,shared=1");
  KVCompressor c(f.shape, cfg);
  const int m = 150;
  SequenceKV first, second;
  for (const auto& kv : f.seq.layers) {
    first.layers.push_back({kv.keys.token_slice(0, m), kv.values.token_slice(0, m)});
    second.layers.push_back({kv.keys.token_slice(m, spec.tokens - m), kv.values.token_slice(m, spec.tokens - m)});
  }
  second.first_position = m;
  ThreadPool pool(2);
  auto cache = c.compress(first, &f.queries);
  auto threaded = c.compress(first, &f.queries, &pool);
  c.extend(cache, second, &f.queries);
  c.extend(threaded, second, &f.queries, &pool);
  const float scale = cache.layout().effective_softmax_scale();
  auto want = shared_reference(first, f.queries, cfg, 0, scale);
  const auto want_second = shared_reference(second, f.queries, cfg, m, scale);
  want.insert(want.end(), want_second.begin(), want_second.end());
  for (int l = 0; l < spec.n_layers; ++l) EXPECT_EQ(cache.stored_positions(l), want) << "layer " << l;
  EXPECT_EQ(container::serialize(threaded), container::serialize(cache));

  auto uneven = c.compress(first, &f.queries);
  const int H = spec.n_kv_heads, d = spec.head_dim;
  const size_t at = static_cast<size_t>(m) * H * d;
  c.append(uneven, 0, &f.data.keys[0][at], &f.data.values[0][at], m);  // layer 0 only
  const auto before = container::serialize(uneven);
  SequenceKV third = second;
  const int64_t rest = spec.tokens - m - 1;
  for (auto& kv : third.layers) kv = {kv.keys.token_slice(1, rest), kv.values.token_slice(1, rest)};
  third.first_position = m + 1;
  try {
    c.extend(uneven, third, &f.queries);
    ADD_FAILURE() << "extend of a shared selection over layers of different lengths did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("same length"), std::string::npos) << e.what();
  }
  EXPECT_EQ(container::serialize(uneven), before);
}

// The fp16 tier (fp16_tier): per layer and position set, round(f·n) tokens beyond the sinks stay
// fp16, exactly the highest-scoring ones eviction competes over (the brute-force reference is
// select_tier on the scorer's own scores); they decode to their fp16-rounded input; the window
// pins them ahead of the unpinned tokens; the container (version 4: pinned tokens among coded
// ones) reads back identical; with eviction, per-head sets and one set for the model.
TEST(Compressor, Fp16TierPinsTheTopScoredTokensInFp16) {
  auto spec = default_spec(170);
  spec.n_layers = 3;
  Fixture f(spec);
  const int64_t n = spec.tokens;
  const int H = spec.n_kv_heads, d = spec.head_dim;
  const int64_t tier = std::llround(0.05 * static_cast<double>(n));
  // Under the sanitizers two of the four: per-head sets and one set for the model.
  const std::vector<const char*> all = {"preset=quant-k3v2,fp16_tier=0.05", "preset=high,fp16_tier=0.05",
                                        "preset=high,fp16_tier=0.05,per_head=1,scorer=key-key",
                                        "preset=high,fp16_tier=0.05,shared=1"};
  const std::vector<const char*> some = {all[2], all[3]};
  for (const char* spec_string : e8kv::test::kUnderSanitizer ? some : all) {
    SCOPED_TRACE(spec_string);
    const Config cfg = Config::parse(spec_string);
    KVCompressor c(f.shape, cfg);
    const CompressedKV cache = c.compress(f.seq, &f.queries);
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    const select::ScorerOptions so = cfg.scorer_options();
    const select::EvictionOptions eo = cfg.eviction_options();
    std::vector<int32_t> shared_pins;
    for (int l = 0; l < spec.n_layers; ++l) {
      const auto& ld = cache.layer(l);
      EXPECT_EQ(ld.pinned, cfg.sinks + tier) << "layer " << l;
      const auto scores = select::score_layer(f.seq.layers[static_cast<size_t>(l)].keys, pos.data(),
                                              &f.queries[static_cast<size_t>(l)], so, cache.layout().effective_softmax_scale());
      const auto sets = cfg.eviction_rate > 0 ? select::select_layer(scores, eo) : std::vector<std::vector<int64_t>>{};
      for (int h = 0; h < H; ++h) {
        const auto& w = cache.window_positions(l, h);
        const std::vector<int32_t> pins(w.begin(), w.begin() + ld.pinned);
        // Reference (not for shared=1, whose scores are the model's: there, one set for all layers).
        if (!cfg.shared_selection) {
          const size_t s = cfg.per_head_selection ? static_cast<size_t>(h) : 0;
          std::vector<float> row = cfg.per_head_selection
                                       ? std::vector<float>(scores.scores.begin() + h * n, scores.scores.begin() + (h + 1) * n)
                                       : select::aggregate_heads(scores, cfg.head_aggregation);
          std::vector<int64_t> kept = sets.empty() ? std::vector<int64_t>{} : sets[s];
          if (sets.empty())
            for (int64_t t = 0; t < n; ++t) kept.push_back(t);
          std::vector<int32_t> want;
          for (int t = 0; t < cfg.sinks; ++t) want.push_back(t);
          for (int64_t t : select::select_tier(row, kept, tier, eo)) want.push_back(static_cast<int32_t>(t));
          EXPECT_EQ(pins, want) << "layer " << l << " head " << h;
        } else if (shared_pins.empty()) {
          shared_pins = pins;
        } else {
          EXPECT_EQ(pins, shared_pins) << "layer " << l << " head " << h;
        }
        // Pinned tokens decode to their fp16-rounded input; at least one sits among coded tokens.
        const CompactHead ch = cache.decompress_head(l, h);
        int among_coded = 0;
        for (int32_t p : pins) {
          const auto it = std::find(ch.positions.begin(), ch.positions.end(), p);
          ASSERT_NE(it, ch.positions.end());
          const size_t i = static_cast<size_t>(it - ch.positions.begin());
          for (int e = 0; e < d; ++e) {
            const size_t src = (static_cast<size_t>(p) * H + h) * d + e;
            ASSERT_EQ(ch.keys[i * d + e], fp16_bits_to_float(float_to_fp16_bits(f.data.keys[l][src])));
            ASSERT_EQ(ch.values[i * d + e], fp16_bits_to_float(float_to_fp16_bits(f.data.values[l][src])));
          }
          among_coded += !cache.positions(l, h).empty() && p > cache.positions(l, h).front() ? 1 : 0;
        }
        EXPECT_GE(among_coded, 1);
        EXPECT_EQ(cache.stored_tokens(l, h), static_cast<int64_t>(ch.positions.size()));
      }
    }
    const auto bytes = container::serialize(cache);
    EXPECT_EQ(container::read_info(bytes.data(), bytes.size()).format_version, 4);
    ThreadPool pool(2);  // the tier does not depend on the executor
    EXPECT_EQ(container::serialize(c.compress(f.seq, &f.queries, &pool)), bytes);
    const CompressedKV back = container::deserialize(bytes.data(), bytes.size());
    EXPECT_EQ(container::serialize(back), bytes);
    std::vector<float> a(static_cast<size_t>(spec.n_q_heads) * d), b(a.size());
    for (int l = 0; l < spec.n_layers; ++l) {
      c.attend(cache, l, f.query(l, 0), static_cast<int32_t>(n), a.data());
      c.attend(back, l, f.query(l, 0), static_cast<int32_t>(n), b.data());
      EXPECT_EQ(a, b);
    }
  }
  // Without the tier nothing changes: pinned is the sinks, and the container keeps its version.
  const CompressedKV plain = KVCompressor(f.shape, Config::parse("preset=quant-k3v2")).compress(f.seq, &f.queries);
  EXPECT_EQ(plain.layer(0).pinned, 4);
  const auto plain_bytes = container::serialize(plain);
  EXPECT_EQ(container::read_info(plain_bytes.data(), plain_bytes.size()).format_version, 3);
}

// The tier is what it costs: every pinned token is one window row (2·d fp16 values and a
// position) in place of its codes and gains; bits per element go up by exactly that. And it buys
// accuracy: attention through the codes moves closer to fp32 attention.
TEST(Compressor, Fp16TierCostsItsBytesAndCutsTheError) {
  Fixture f(default_spec(171));
  const Config base = Config::parse("preset=quant-k2v2");
  const Config tiered = Config::parse("preset=quant-k2v2,fp16_tier=0.1");
  const CompressedKV a = KVCompressor(f.shape, base).compress(f.seq, &f.queries);
  const CompressedKV b = KVCompressor(f.shape, tiered).compress(f.seq, &f.queries);
  const auto ba = a.byte_breakdown(), bb = b.byte_breakdown();
  const int H = f.shape.n_kv_heads, d = f.shape.head_dim, L = f.shape.n_layers;
  const int64_t moved = b.layer(0).pinned - a.layer(0).pinned;
  ASSERT_EQ(moved, 30);
  // Codes are flushed in whole blocks, so the window may hold a few more unpinned tokens too.
  const int64_t to_window = b.window_tokens(0) - a.window_tokens(0);
  EXPECT_GE(to_window, moved);
  EXPECT_LT(to_window, moved + b.layout().flush_block);
  EXPECT_EQ(a.coded_tokens(0) - b.coded_tokens(0), to_window);
  EXPECT_EQ(bb.window - ba.window, static_cast<size_t>(to_window) * L * H * 2 * d * 2);
  const size_t code_bytes_per_token = a.layer(0).heads[0].key_codes.size() / static_cast<size_t>(a.coded_tokens(0)) +
                                      a.layer(0).heads[0].value_codes.size() / static_cast<size_t>(a.coded_tokens(0));
  EXPECT_EQ(ba.codes - bb.codes, static_cast<size_t>(to_window) * L * H * code_bytes_per_token);
  EXPECT_EQ(ba.positions, bb.positions);  // a token's position is stored once either way
  const Errors ea = measure(f, base), eb = measure(f, tiered);
  std::printf("k2v2: out rel l2 %.4f kl %.5f; with a 10 %% fp16 tier: %.4f %.5f\n", ea.out_rel_l2, ea.kl, eb.out_rel_l2,
              eb.kl);
  EXPECT_LT(eb.out_rel_l2, ea.out_rel_l2);
  EXPECT_LT(eb.kl, ea.kl);
}

// Appends after a tiered compress: the tier stays, the flushes code the unpinned tokens only, and
// a pinned token can be the latest position (key-norm ranks the tiny last key first; recent=0):
// an append at or before it is refused, the cache unchanged.
TEST(Compressor, Fp16TierThenAppend) {
  auto spec = default_spec(172);
  spec.n_layers = 1;
  Fixture f(spec);
  const int64_t n = spec.tokens;
  const int H = spec.n_kv_heads, d = spec.head_dim;
  for (int h = 0; h < H; ++h)
    for (int e = 0; e < d; ++e) f.data.keys[0][(static_cast<size_t>(n - 1) * H + h) * d + e] = 1e-3f;
  const Config cfg = Config::parse("preset=quant-k3v2,fp16_tier=0.01,scorer=key-norm,recent=0");
  KVCompressor c(f.shape, cfg);
  auto cache = c.compress(f.seq, &f.queries);
  const auto& w = cache.window_positions(0, 0);
  ASSERT_EQ(cache.layer(0).pinned, 4 + 3);
  ASSERT_EQ(w[static_cast<size_t>(cache.layer(0).pinned) - 1], n - 1) << "the last token is in the tier";
  ASSERT_GT(w.size(), static_cast<size_t>(cache.layer(0).pinned)) << "unpinned tokens wait behind it";
  EXPECT_LT(w.back(), n - 1);
  EXPECT_EQ(cache.last_position(0), n - 1) << "the pinned token, not the window's last";
  const auto before = container::serialize(cache);
  EXPECT_THROW(c.append(cache, 0, &f.data.keys[0][0], &f.data.values[0][0], static_cast<int32_t>(n - 1)), Error);
  EXPECT_EQ(container::serialize(cache), before);
  for (int64_t t = 0; t < 40; ++t)
    c.append(cache, 0, &f.data.keys[0][static_cast<size_t>(t) * H * d], &f.data.values[0][static_cast<size_t>(t) * H * d],
             static_cast<int32_t>(n + t));
  EXPECT_EQ(cache.layer(0).pinned, 7);
  EXPECT_EQ(cache.stored_tokens(0), n + 40);
  EXPECT_EQ(cache.last_position(0), n + 39);
  const auto ch = cache.decompress_head(0, 0);
  for (size_t i = 0; i < ch.positions.size(); ++i) ASSERT_EQ(ch.positions[i], static_cast<int32_t>(i));
  const auto bytes = container::serialize(cache);
  EXPECT_EQ(container::serialize(container::deserialize(bytes.data(), bytes.size())), bytes);
}

// The code tier (code_tier): per layer and position set, round((f + c)·n) − round(f·n) tokens
// beyond the sinks and the recent tokens, the next-scored after the fp16 tier's, leave the
// layer's codes for a second code stream per head: together with the fp16 tier they are exactly
// what an fp16 tier of f + c pins (same scores, same kept sets). Every stored position is in
// exactly one of coded / tier / window; tier tokens decode through the tier codec (decode_tier),
// and the bytes are the two streams' codes and gains. With eviction, per-head sets and one set
// for the model; the result does not depend on the executor.
TEST(Compressor, CodeTierCodesTheNextScoredTokensInTheirOwnStream) {
  auto spec = default_spec(174);
  spec.n_layers = 3;
  Fixture f(spec);
  const int64_t n = spec.tokens;
  const int H = spec.n_kv_heads, d = spec.head_dim;
  const std::vector<std::string> all = {"preset=quant-k3v2,code_tier=0.1", "preset=quant-k2v2,code_tier=0.1,fp16_tier=0.05",
                                        "preset=high,code_tier=0.1,per_head=1,scorer=key-key,evict=0.3",
                                        "preset=high,code_tier=0.1,shared=1,evict=0.2"};
  const std::vector<std::string> some = {all[1], all[2]};
  for (const std::string& spec_string : e8kv::test::kUnderSanitizer ? some : all) {
    SCOPED_TRACE(spec_string);
    const Config cfg = Config::parse(spec_string);
    Config union_cfg = cfg;  // the reference: both tiers as one fp16 tier
    union_cfg.fp16_tier = cfg.fp16_tier + cfg.code_tier;
    union_cfg.code_tier = 0.0;
    KVCompressor c(f.shape, cfg);
    const CompressedKV cache = c.compress(f.seq, &f.queries);
    const CompressedKV reference = KVCompressor(f.shape, union_cfg).compress(f.seq, &f.queries);
    const int64_t fp16 = std::llround(cfg.fp16_tier * static_cast<double>(n));
    const int64_t promoted = std::llround((cfg.fp16_tier + cfg.code_tier) * static_cast<double>(n)) - fp16;
    ASSERT_EQ(promoted, 30);
    const auto tk = cache.codecs().tier_code_bytes(KvKind::kKey), tv = cache.codecs().tier_code_bytes(KvKind::kValue);
    size_t want_codes = 0, want_gains = 0;
    for (int l = 0; l < spec.n_layers; ++l) {
      ASSERT_TRUE(cache.layout().layer_has_code_tier(l));
      EXPECT_EQ(cache.layer(l).pinned, cfg.sinks + fp16) << "layer " << l;
      for (int h = 0; h < H; ++h) {
        const auto& tier = cache.tier_positions(l, h);
        ASSERT_EQ(static_cast<int64_t>(tier.size()), promoted) << "layer " << l << " head " << h;
        EXPECT_TRUE(std::is_sorted(tier.begin(), tier.end()));
        const auto& w = cache.window_positions(l, h);
        std::vector<int32_t> both(w.begin() + cfg.sinks, w.begin() + cache.layer(l).pinned);
        both.insert(both.end(), tier.begin(), tier.end());
        std::sort(both.begin(), both.end());
        const auto& rw = reference.window_positions(l, h);
        const std::vector<int32_t> want(rw.begin() + cfg.sinks, rw.begin() + reference.layer(l).pinned);
        EXPECT_EQ(both, want) << "layer " << l << " head " << h;
        // Every stored position once; the same positions as the reference stores.
        std::vector<int32_t> stored = cache.positions(l, h);
        stored.insert(stored.end(), w.begin(), w.end());
        stored.insert(stored.end(), tier.begin(), tier.end());
        std::sort(stored.begin(), stored.end());
        EXPECT_EQ(std::adjacent_find(stored.begin(), stored.end()), stored.end());
        const CompactHead ch = cache.decompress_head(l, h), rh = reference.decompress_head(l, h);
        EXPECT_EQ(ch.positions, stored);
        EXPECT_EQ(ch.positions, rh.positions);
        // Tier rows decode through the tier codec: decode_tier of the stored codes, bit for bit.
        const auto& hd = cache.layer(l).heads[static_cast<size_t>(h)];
        // (Centred on the head's means: format 6's tier.)
        std::vector<float> k(tier.size() * d), v(tier.size() * d), km(d), vm(d);
        ASSERT_TRUE(cache.layout().tier_centered);
        fp16_bits_to_floats(hd.key_mean.data(), km.data(), km.size());
        fp16_bits_to_floats(hd.value_mean.data(), vm.data(), vm.size());
        cache.codecs().decode_tier(l, h, KvKind::kKey, tier.size(), hd.tier_key_codes.data(), hd.tier_key_gains.data(),
                                   tier.data(), km.data(), k.data());
        cache.codecs().decode_tier(l, h, KvKind::kValue, tier.size(), hd.tier_value_codes.data(), hd.tier_value_gains.data(),
                                   tier.data(), vm.data(), v.data());
        for (size_t i = 0; i < tier.size(); ++i) {
          const size_t row = static_cast<size_t>(std::lower_bound(ch.positions.begin(), ch.positions.end(), tier[i]) -
                                                 ch.positions.begin());
          for (int e = 0; e < d; ++e) {
            ASSERT_EQ(ch.keys[row * d + e], k[i * d + e]);
            ASSERT_EQ(ch.values[row * d + e], v[i * d + e]);
          }
        }
        want_codes += cache.positions(l, h).size() * (cache.codecs().code_bytes(l, KvKind::kKey) +
                                                      cache.codecs().code_bytes(l, KvKind::kValue)) +
                      tier.size() * (tk + tv);
        want_gains += cache.positions(l, h).size() * 2 + 4 /* 8-bit gain references */ + tier.size() * 4;
      }
    }
    const auto b = cache.byte_breakdown();
    EXPECT_EQ(b.codes, want_codes);
    EXPECT_EQ(b.gains, want_gains);
    EXPECT_LE(cache.resident_bytes(), cache.bytes() + cache.bytes() / 10);
    ThreadPool pool(2);  // the tier does not depend on the executor
    const CompressedKV again = c.compress(f.seq, &f.queries, &pool);
    for (int l = 0; l < spec.n_layers; ++l) {
      const DenseLayer a = cache.decompress_layer(l), z = again.decompress_layer(l);
      EXPECT_EQ(a.positions, z.positions);
      EXPECT_EQ(a.keys, z.keys);
      EXPECT_EQ(a.values, z.values);
    }
  }
}

// The tier buys accuracy: its 4-bit rows decode closer to their input than K2V2's 2-bit codes to
// theirs, and 7 % of the tokens in it bring attention through the codes closer to fp32 attention.
// (Its bytes are CodeTierCodesTheNextScoredTokensInTheirOwnStream's; a change of the coded count
// also moves the window's flush cycle, so the total is not a per-token figure at this size.)
TEST(Compressor, CodeTierRowsAreCloserAndCutTheError) {
  Fixture f(default_spec(175));
  const Config base = Config::parse("preset=quant-k2v2");
  const Config tiered = Config::parse("preset=quant-k2v2,code_tier=0.07");
  const CompressedKV b = KVCompressor(f.shape, tiered).compress(f.seq, &f.queries);
  const int H = f.shape.n_kv_heads, d = f.shape.head_dim, L = f.shape.n_layers;
  ASSERT_EQ(b.tier_tokens(0), 21);
  // Decoded rows of the tier against their fp16-rounded input, and the coded rows against theirs.
  double tier_err = 0, tier_norm = 0, coded_err = 0, coded_norm = 0;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const CompactHead ch = b.decompress_head(l, h);
      const auto& tier = b.tier_positions(l, h);
      const auto& coded = b.positions(l, h);
      for (size_t i = 0; i < ch.positions.size(); ++i) {
        const int32_t p = ch.positions[i];
        const bool in_tier = std::binary_search(tier.begin(), tier.end(), p);
        const bool in_codes = std::binary_search(coded.begin(), coded.end(), p);
        if (!in_tier && !in_codes) continue;
        for (int e = 0; e < d; ++e) {
          const float x = fp16_bits_to_float(float_to_fp16_bits(f.data.values[l][(static_cast<size_t>(p) * H + h) * d + e]));
          const double err = double(ch.values[i * d + e]) - x;
          (in_tier ? tier_err : coded_err) += err * err;
          (in_tier ? tier_norm : coded_norm) += double(x) * x;
        }
      }
    }
  std::printf("value rel err: tier %.4f, coded %.4f\n", std::sqrt(tier_err / tier_norm), std::sqrt(coded_err / coded_norm));
  EXPECT_LT(std::sqrt(tier_err / tier_norm), 0.5 * std::sqrt(coded_err / coded_norm));
  const Errors ea = measure(f, base), eb = measure(f, tiered);
  std::printf("k2v2: out rel l2 %.4f kl %.5f; with a 7 %% code tier: %.4f %.5f\n", ea.out_rel_l2, ea.kl, eb.out_rel_l2, eb.kl);
  EXPECT_LT(eb.out_rel_l2, ea.out_rel_l2);
  EXPECT_LT(eb.kl, ea.kl);
}

// Only where it raises a rate: protected fp16 layers and layers already at the tier's rates keep
// every token in their own codes (no tier stream), the others promote; a rate budget's per-layer
// codes follow the same rule.
TEST(Compressor, CodeTierOnlyInLayersItRaises) {
  auto spec = default_spec(176);
  spec.n_layers = 4;
  Fixture f(spec);
  const Config protect = Config::parse("preset=quant-k3v2,code_tier=0.1,protect=1");
  const CompressedKV p = KVCompressor(f.shape, protect).compress(f.seq, &f.queries);
  EXPECT_EQ(p.tier_tokens(0), 0);
  EXPECT_GT(p.tier_tokens(1), 0);
  EXPECT_GT(p.tier_tokens(2), 0);
  EXPECT_EQ(p.tier_tokens(3), 0);
  EXPECT_EQ(p.stored_tokens(0), spec.tokens);
  const Config rates = Config::parse("code_tier=0.1,layer_rates=rvq4/rvq4;rvq3/e8p2;rvq4/e8p2;e8p2/rvq4");
  const CompressedKV r = KVCompressor(f.shape, rates).compress(f.seq, &f.queries);
  const std::vector<bool> want = {false, true, true, true};
  for (int l = 0; l < spec.n_layers; ++l) {
    EXPECT_EQ(r.layout().layer_has_code_tier(l), want[static_cast<size_t>(l)]) << "layer " << l;
    EXPECT_EQ(r.tier_tokens(l) > 0, want[static_cast<size_t>(l)]) << "layer " << l;
    EXPECT_EQ(r.stored_tokens(l), spec.tokens);
  }
  const Config budget = Config::parse("preset=quant-k2v2,index_budget=2.5,code_tier=0.05");
  const CompressedKV bc = KVCompressor(f.shape, budget).compress(f.seq, &f.queries);
  for (int l = 0; l < spec.n_layers; ++l) {
    EXPECT_EQ(bc.tier_tokens(l) > 0, bc.layout().layer_has_code_tier(l)) << "layer " << l;
    EXPECT_EQ(bc.stored_tokens(l), spec.tokens);
  }
  // No tier: the layout says so, and the tier streams stay empty.
  const CompressedKV none = KVCompressor(f.shape, Config::parse("preset=quant-k3v2")).compress(f.seq, &f.queries);
  EXPECT_FALSE(none.layout().has_code_tier());
  EXPECT_EQ(none.layout().tier_key_codec, quant::Codec::kFp16);
  EXPECT_EQ(none.tier_tokens(0), 0);
}

// Appends after a tiered compress leave the tier as it is (appended tokens enter through the
// window); drop_before removes the tier tokens below its position with the others, and what
// remains decodes to the same floats.
TEST(Compressor, CodeTierThenAppendAndDropBefore) {
  auto spec = default_spec(177);
  spec.n_layers = 1;
  Fixture f(spec);
  const int64_t n = spec.tokens;
  const int H = spec.n_kv_heads, d = spec.head_dim;
  KVCompressor c(f.shape, Config::parse("preset=quant-k3v2,code_tier=0.1"));
  auto cache = c.compress(f.seq, &f.queries);
  const std::vector<int32_t> tier = cache.tier_positions(0, 0);
  ASSERT_EQ(tier.size(), 30u);
  for (int64_t t = 0; t < 40; ++t)
    c.append(cache, 0, &f.data.keys[0][static_cast<size_t>(t) * H * d], &f.data.values[0][static_cast<size_t>(t) * H * d],
             static_cast<int32_t>(n + t));
  EXPECT_EQ(cache.tier_positions(0, 0), tier);
  EXPECT_EQ(cache.stored_tokens(0), n + 40);
  EXPECT_EQ(cache.last_position(0), n + 39);
  const CompactHead before = cache.decompress_head(0, 1);
  for (size_t i = 0; i < before.positions.size(); ++i) ASSERT_EQ(before.positions[i], static_cast<int32_t>(i));
  const int32_t cut = tier[tier.size() / 2];  // a tier token: it goes, the ones after it stay
  c.drop_before(cache, cut);
  const auto& left = cache.tier_positions(0, 1);
  EXPECT_EQ(left, std::vector<int32_t>(tier.begin() + static_cast<std::ptrdiff_t>(tier.size() / 2), tier.end()));
  const CompactHead after = cache.decompress_head(0, 1);
  ASSERT_EQ(after.positions.size(), before.positions.size() - static_cast<size_t>(cut));
  for (size_t i = 0; i < after.positions.size(); ++i) {
    ASSERT_EQ(after.positions[i], cut + static_cast<int32_t>(i));
    for (int e = 0; e < d; ++e) {
      ASSERT_EQ(after.keys[i * d + e], before.keys[(static_cast<size_t>(cut) + i) * d + e]);
      ASSERT_EQ(after.values[i * d + e], before.values[(static_cast<size_t>(cut) + i) * d + e]);
    }
  }
  EXPECT_LE(cache.resident_bytes(), cache.bytes() + cache.bytes() / 10);
}

// Sliding window: drop_before removes exactly the stored tokens below a position (coded, window,
// pinned sinks and tier tokens), the others decode to the same floats, the cache round-trips
// through the container, appends go on, and resident memory stays at bytes(). Per-head sets whose
// pinned counts would diverge are refused, the cache unchanged.
TEST(Compressor, DropBeforeRemovesTheTokensBelowAPosition) {
  auto spec = default_spec(173);
  spec.tokens = 300;
  Fixture f(spec);
  const int H = spec.n_kv_heads, d = spec.head_dim;
  int refused = 0, dropped = 0;
  // Under the sanitizers the tiered shared and per-head configs, three cuts each.
  const std::vector<const char*> all = {"preset=quant-k3v2,residual=8", "preset=quant-k2v2,fp16_tier=0.05",
                                        "preset=lossless", "preset=high,per_head=1",
                                        "preset=high,per_head=1,fp16_tier=0.05"};
  const std::vector<const char*> some = {all[1], all[4]};
  const std::vector<int32_t> all_cuts = {0, 2, 100, 151, 310, 319, 400}, some_cuts = {2, 151, 319};
  for (const char* spec_string : e8kv::test::kUnderSanitizer ? some : all) {
    SCOPED_TRACE(spec_string);
    KVCompressor c(f.shape, Config::parse(spec_string));
    auto cache = c.compress(f.seq, &f.queries);
    for (int t = 0; t < 20; ++t)
      for (int l = 0; l < spec.n_layers; ++l)
        c.append(cache, l, &f.data.keys[l][static_cast<size_t>(t) * H * d], &f.data.values[l][static_cast<size_t>(t) * H * d],
                 spec.tokens + t);
    for (int32_t cut : e8kv::test::kUnderSanitizer ? some_cuts : all_cuts) {
      SCOPED_TRACE("drop_before " + std::to_string(cut));
      CompressedKV copy = cache;
      const auto before = container::serialize(copy);
      try {
        c.drop_before(copy, cut);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("one pinned count per layer"), std::string::npos) << e.what();
        EXPECT_EQ(container::serialize(copy), before);
        ++refused;
        continue;
      }
      ++dropped;
      for (int l = 0; l < spec.n_layers; ++l)
        for (int h = 0; h < H; ++h) {
          const CompactHead all = cache.decompress_head(l, h), kept = copy.decompress_head(l, h);
          CompactHead want;
          for (size_t i = 0; i < all.positions.size(); ++i) {
            if (all.positions[i] < cut) continue;
            want.positions.push_back(all.positions[i]);
            want.keys.insert(want.keys.end(), all.keys.begin() + i * d, all.keys.begin() + (i + 1) * d);
            want.values.insert(want.values.end(), all.values.begin() + i * d, all.values.begin() + (i + 1) * d);
          }
          ASSERT_EQ(kept.positions, want.positions) << "layer " << l << " head " << h;
          ASSERT_EQ(kept.keys, want.keys);
          ASSERT_EQ(kept.values, want.values);
        }
      EXPECT_EQ(copy.original_tokens(), cache.original_tokens());
      EXPECT_LE(copy.resident_bytes(), cache.resident_bytes());
      const auto bytes = container::serialize(copy);
      EXPECT_EQ(container::serialize(container::deserialize(bytes.data(), bytes.size())), bytes);
      for (int l = 0; l < spec.n_layers; ++l)
        c.append(copy, l, &f.data.keys[l][0], &f.data.values[l][0], spec.tokens + 20);
      EXPECT_EQ(copy.stored_positions(0).back(), spec.tokens + 20);
    }
  }
  EXPECT_GE(dropped, e8kv::test::kUnderSanitizer ? 4 : 25);
  std::printf("drop_before: %d cuts applied, %d refused (per-head sets with different pinned counts)\n", dropped,
              refused);
}

TEST(Compressor, BytesEqualHandComputedFormula) {
  auto spec = default_spec(130);
  spec.tokens = 200;
  Fixture f(spec);
  Config cfg = Config::preset("quant-k3v2");  // keys rvq3 (24-bit per 8), values e8p (16-bit per 8)
  cfg.flush_block = 16;
  cfg.gain_bits = 16;  // fp16 gains here; 8-bit gains below
  KVCompressor c(f.shape, cfg);
  const auto cache = c.compress(f.seq);
  const int L = spec.n_layers, H = spec.n_kv_heads, d = spec.head_dim;
  // 200 tokens: 4 pinned fp16 sinks, then 196 >= mean_tokens (64) flushable: leaving at least the
  // 16-token residual window (the default), 11 blocks of 16 are coded and 20 tokens stay in the
  // window beside the sinks.
  ASSERT_EQ(cfg.residual_length, 16);
  const int coded = 176, window = 24;
  const size_t codes = size_t(L) * H * coded * (d / 8 * 3 + d / 8 * 2);
  const size_t gains = size_t(L) * H * coded * 2 * 2;
  const size_t win = size_t(L) * H * window * d * 2 * 2;
  const size_t positions = size_t(L) * 8;  // contiguous: (start, count) per layer
  const size_t means = size_t(L) * H * 2 * d * 2;  // fp16 key and value mean per (layer, head)
  // layout record 128 bytes; per layer 2 codec ids, original_tokens + pinned, one (coded, window) pair
  const size_t descriptor = 128 + size_t(L) * (2 + 16 + 16);
  const auto b = cache.byte_breakdown();
  EXPECT_EQ(b.codes, codes);
  EXPECT_EQ(b.gains, gains);
  EXPECT_EQ(b.window, win);
  EXPECT_EQ(b.positions, positions);
  EXPECT_EQ(b.means, means);
  EXPECT_EQ(b.descriptor, descriptor);
  EXPECT_EQ(cache.bytes(), codes + gains + win + positions + means + descriptor);
  const double fp16 = double(L) * H * spec.tokens * d * 2 * 2;
  EXPECT_DOUBLE_EQ(cache.compression_ratio(), fp16 / cache.bytes());
  // With eviction the positions are no longer contiguous: 4 bytes each.
  Config ev = Config::preset("balanced");
  KVCompressor ce(f.shape, ev);
  const auto evc = ce.compress(f.seq, &f.queries);
  EXPECT_EQ(evc.byte_breakdown().positions, size_t(L) * 4 * evc.stored_tokens(0));
  // 8-bit gains: one byte per coded vector plus two fp16 references per (layer, head); with
  // queries, query-weighted keys add head_dim fp16 scales per (layer, head).
  Config g8 = Config::preset("quant-k3v2");
  g8.gain_bits = 8;
  KVCompressor c8(f.shape, g8);
  const auto b8 = c8.compress(f.seq, &f.queries).byte_breakdown();
  EXPECT_EQ(b8.gains, size_t(L) * H * (coded * 2 + 2 * 2));
  EXPECT_EQ(b8.means, means + size_t(L) * H * d * 2);
  EXPECT_EQ(b8.codes, codes);
}

// 8-bit gains: attend equals attention over decompress() (both decode the same float gains),
// and the error against the original cache stays within 3 % of fp16 gains' (the gain code adds
// ~1.6e-4 relative MSE per vector).
TEST(Compressor, EightBitGains) {
  auto spec = default_spec(131);
  Fixture f(spec);
  Config g16 = Config::preset("quant-k3v2"), g8 = g16;
  g16.gain_bits = 16;
  g8.gain_bits = 8;
  KVCompressor c(f.shape, g8);
  const auto cache = c.compress(f.seq, &f.queries);
  for (int l = 0; l < spec.n_layers; ++l)
    EXPECT_LT(attend_vs_decompress(c, cache, spec, l, f.query(l, 9), spec.tokens), 2e-5);
  const Errors e16 = measure(f, g16), e8 = measure(f, g8);
  std::printf("gain_bits 16 -> 8: output rel L2 %.5f -> %.5f, KL %.5f -> %.5f\n", e16.out_rel_l2, e8.out_rel_l2, e16.kl,
              e8.kl);
  EXPECT_LT(e8.out_rel_l2, 1.03 * e16.out_rel_l2);
}

TEST(Compressor, ConcurrentAttendIsDeterministic) {
  Fixture f(default_spec(140));
  KVCompressor c(f.shape, Config::preset("high"));
  const auto cache = c.compress(f.seq, &f.queries);
  const size_t n = static_cast<size_t>(f.shape.n_q_heads * f.shape.head_dim);
  std::vector<float> ref(n);
  c.attend(cache, 1, f.query(1, 5), 300, ref.data());
  std::vector<std::vector<float>> outs(4, std::vector<float>(n));
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] {
      for (int r = 0; r < 20; ++r) c.attend(cache, 1, f.query(1, 5), 300, outs[i].data());
    });
  for (auto& t : ts) t.join();
  for (const auto& o : outs) EXPECT_EQ(o, ref);
}

TEST(Compressor, InvalidConfigsAndShapesGiveClearErrors) {
  Fixture f(default_spec(150));
  auto expect_error = [](auto&& fn, const char* needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([] { Config::preset("ultra"); }, "lossless");
  expect_error([] { Config::parse("key=e8p5"); }, "accepted");
  expect_error([] { Config::parse("evict=abc"); }, "evict");
  expect_error([] { Config::parse("colour=red"); }, "colour");
  Config bad = Config::preset("high");
  bad.eviction_rate = 1.0;
  expect_error([&] { KVCompressor(f.shape, bad); }, "eviction_rate");
  bad = Config::preset("high");
  bad.pool_kernel = 4;
  expect_error([&] { KVCompressor(f.shape, bad); }, "pool_kernel");
  expect_error([&] { KVCompressor(ModelShape{2, 2, 4, 72}, Config()); }, "64, 80, 96, 128, 256");
  expect_error([&] { KVCompressor(ModelShape{2, 3, 4, 64}, Config()); }, "multiple");
  KVCompressor c(f.shape, Config::preset("high"));
  expect_error([&] { c.compress(f.seq); }, "queries");  // attention scorer without queries
  SequenceKV one_layer;
  one_layer.layers.push_back(f.seq.layers[0]);
  expect_error([&] { c.compress(one_layer, nullptr); }, "layers");
  std::vector<float> k(f.data.keys[0]);
  k[5] = std::numeric_limits<float>::quiet_NaN();
  SequenceKV nan_seq = f.seq;
  nan_seq.layers[0].keys = TensorView::nhd(k.data(), DType::kF32, 300, 2, 64);
  KVCompressor q(f.shape, Config::preset("quant-k3v2"));
  expect_error([&] { q.compress(nan_seq); }, "non-finite");
  auto cache = q.compress(f.seq);
  std::vector<float> kv(2 * 64, 0.f);
  expect_error([&] { q.append(cache, 0, kv.data(), kv.data(), 10); }, "position");
  expect_error([&] { q.append(cache, 7, kv.data(), kv.data(), 400); }, "layer");
}

}  // namespace
