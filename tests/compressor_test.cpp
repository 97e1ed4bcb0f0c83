// KVCompressor tests: attention through the codes against fp32 attention, eviction invariants,
// GQA/MQA, RoPE tables, query-weighted keys, byte accounting and error handling. Compressing in
// pieces (append, extend, batches) is compressor_append_test's, the tiers and the selections
// shared over layers compressor_tiers_test's; the fixture they share is testing/compressor_fixture.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "e8kv/compressor.hpp"
#include "e8kv/numeric/half.hpp"
#include "testing/compressor_fixture.hpp"
#include "testing/kv_fixture.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv;
using namespace e8kv::testkit;

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
                fp16_round(f.data.keys[0][(t * spec.n_kv_heads + 1) * spec.head_dim + i]));
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
  append_to_every_layer(c, cache, f, 0, far);
  const auto dense = cache.decompress_layer(0);
  EXPECT_EQ(dense.tokens, f.data.spec.tokens + 1);
  EXPECT_EQ(dense.positions.back(), far);
  EXPECT_EQ(dense.keys.size(), static_cast<size_t>(dense.tokens) * H * d);
  for (int h = 0; h < H; ++h) EXPECT_EQ(dense.mask[static_cast<size_t>(h * dense.tokens + dense.tokens - 1)], 0.f);
}

// attend() on layer l against fp32 attention over decompress_head()'s keys and values: both
// read the same codes, so they agree to float rounding (relative L2 of the outputs). The
// reference holds K/V for `heads` heads, head j being KV head j / (heads / n_kv_heads):
// n_kv_heads (0) as stored, or n_q_heads, each KV head repeated for every query head of its
// group (the MHA layout: a reference that does not share attend's grouping).
double attend_vs_decompress(const KVCompressor& c, const CompressedKV& cache, const synth::SyntheticSpec& spec, int l,
                            const float* q, int32_t position, int heads = 0) {
  if (heads == 0) heads = spec.n_kv_heads;
  const int64_t n = cache.stored_tokens(l, 0);
  std::vector<float> K(static_cast<size_t>(n) * heads * spec.head_dim), V(K.size());
  for (int j = 0; j < heads; ++j) {
    const auto ch = cache.decompress_head(l, j / (heads / spec.n_kv_heads));
    for (int64_t t = 0; t < n; ++t)
      for (int i = 0; i < spec.head_dim; ++i) {
        K[(t * heads + j) * spec.head_dim + i] = ch.keys[t * spec.head_dim + i];
        V[(t * heads + j) * spec.head_dim + i] = ch.values[t * spec.head_dim + i];
      }
  }
  const auto ref = dense_attention(q, K, V, n, heads, spec.n_q_heads, spec.head_dim);
  std::vector<float> out(ref.size());
  c.attend(cache, l, q, position, out.data());
  return rel_l2(out, ref);
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
      for (int l = 0; l < spec.n_layers; ++l)
        EXPECT_LT(attend_vs_decompress(c, cache, spec, l, f.query(l, 3), spec.tokens, spec.n_q_heads), 2e-5)
            << preset << " kv_heads " << kv_heads;
    }
  }
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
  const auto evc = compress_with(f, Config::preset("balanced"));
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
