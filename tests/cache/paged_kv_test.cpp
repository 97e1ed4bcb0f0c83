// Paged layout (cache/paged_layout.hpp) and the host conversion CompressedKV <-> pages
// (cache/paged_kv.hpp): hand-computed offsets, block tables, round trips on ragged batches.
#include "e8kv/attention/attend.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/cache/paged_kv.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/quant/kv_vector_codec.hpp"
#include "testing/kv_fixture.hpp"
#include "testing/synthetic_kv.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv;

TEST(PagedLayout, OffsetsMatchAHandComputedPage) {
  // d = 128, 8 KV heads, 16 tokens per page, E8P keys and values (32 bytes per vector).
  const PagedLayout L = make_paged_layout(16, 8, 128, 16, 16, false);
  EXPECT_EQ(L.key_code_bytes, 32);
  EXPECT_EQ(L.value_code_bytes, 32);
  EXPECT_EQ(L.key_codes_offset, 0);
  EXPECT_EQ(L.key_gains_offset, 8 * 16 * 32);
  EXPECT_EQ(L.value_codes_offset, 8 * 16 * 32 + 8 * 16 * 2);
  EXPECT_EQ(L.value_gains_offset, 2 * 8 * 16 * 32 + 8 * 16 * 2);
  EXPECT_EQ(L.positions_offset, 2 * (8 * 16 * 32 + 8 * 16 * 2));
  EXPECT_EQ(L.page_bytes, 2 * (8 * 16 * 32 + 8 * 16 * 2) + 16 * 4);
  EXPECT_EQ(L.key_code_offset(3, 5), (3 * 16 + 5) * 32);
  EXPECT_EQ(L.position_offset(7, 5), L.positions_offset + 5 * 4);  // shared set: head ignored
  // Rvq3 keys (24 bytes per 8 of d = 64: 24), fp16 values (128 bytes), 3 tokens, 2 heads,
  // per-head positions: every section starts at a multiple of 16.
  const PagedLayout M = make_paged_layout(3, 2, 64, 24, 0, true);
  EXPECT_EQ(M.key_code_bytes, 8 * 3);
  EXPECT_EQ(M.value_code_bytes, 128);
  EXPECT_EQ(M.value_gain_bytes, 0);
  EXPECT_EQ(M.key_gains_offset, 144);           // 2·3·24 = 144
  EXPECT_EQ(M.value_codes_offset, 160);         // 144 + 12 -> 160
  EXPECT_EQ(M.value_gains_offset, 160 + 768);   // 2·3·128
  EXPECT_EQ(M.positions_offset, 160 + 768);     // no value gains
  EXPECT_EQ(M.page_bytes, 160 + 768 + 32);      // 2·3·4 = 24 -> 32
  EXPECT_EQ(M.position_offset(1, 2), M.positions_offset + (3 + 2) * 4);
  // Out-of-range arguments give page_bytes 0.
  EXPECT_EQ(make_paged_layout(0, 8, 128, 16, 16, false).page_bytes, 0);
  EXPECT_EQ(make_paged_layout(16, 8, 100, 16, 16, false).page_bytes, 0);
  EXPECT_EQ(make_paged_layout(16, 8, 128, 12, 16, false).page_bytes, 0);
}

TEST(PagedLayout, BlockTablesAreValidPermutations) {
  const std::vector<int32_t> lens = {0, 1, 16, 17, 100, 33};
  for (uint64_t seed : {0ull, 1ull, 99ull}) {
    const PagedBlockTable t = make_block_table(lens, 16, seed, 5);
    ASSERT_EQ(t.batch(), 6);
    ASSERT_EQ(t.page_indptr.size(), 7u);
    const int expect_pages[] = {0, 1, 1, 2, 7, 3};
    for (int b = 0; b < 6; ++b) EXPECT_EQ(t.page_indptr[b + 1] - t.page_indptr[b], expect_pages[b]);
    EXPECT_EQ(t.n_pages, 14 + 5);
    std::set<int32_t> seen(t.page_indices.begin(), t.page_indices.end());
    EXPECT_EQ(seen.size(), t.page_indices.size());
    for (int32_t p : t.page_indices) EXPECT_TRUE(p >= 0 && p < t.n_pages);
    if (seed == 0) {
      for (size_t i = 0; i < t.page_indices.size(); ++i) EXPECT_EQ(t.page_indices[i], static_cast<int32_t>(i));
    }
    EXPECT_EQ(t.slot(4, 37), int64_t(t.page_indices[t.page_indptr[4] + 2]) * 16 + 5);
    EXPECT_THROW(t.slot(4, 112), Error);
    EXPECT_THROW(t.slot(6, 0), Error);
  }
  EXPECT_EQ(make_block_table(lens, 16, 7, 5).page_indices, make_block_table(lens, 16, 7, 5).page_indices);
  EXPECT_NE(make_block_table(lens, 16, 7, 5).page_indices, make_block_table(lens, 16, 8, 5).page_indices);
  EXPECT_THROW(make_block_table(lens, 0), Error);
  EXPECT_THROW(make_block_table({-1}, 16), Error);
}

struct Batch {
  std::vector<synth::SyntheticKV> data;
  std::unique_ptr<KVCompressor> compressor;
  std::vector<CompressedKV> caches;
};

Batch make_batch(const std::vector<int>& lengths, const char* preset, bool per_head, int residual, uint64_t seed,
                 bool center = true) {
  Batch out;
  Config cfg = Config::preset(preset);
  cfg.gain_bits = 16;  // the paged layout stores fp16 gains
  cfg.center = center;
  cfg.per_head_selection = per_head;
  cfg.residual_length = residual;
  cfg.flush_block = 16;
  ModelShape shape{2, 2, 4, 64};
  out.compressor = std::make_unique<KVCompressor>(shape, cfg);
  for (size_t b = 0; b < lengths.size(); ++b) {
    synth::SyntheticSpec s;
    s.n_layers = 2;
    s.n_kv_heads = 2;
    s.n_q_heads = 4;
    s.head_dim = 64;
    s.tokens = lengths[b];
    s.seed = seed + b;
    out.data.push_back(synth::make_synthetic_kv(s));
  }
  for (size_t b = 0; b < lengths.size(); ++b) {
    SequenceKV seq;
    const auto& d = out.data[b];
    for (int l = 0; l < 2; ++l)
      seq.layers.push_back({TensorView::nhd(d.keys[l].data(), DType::kF32, lengths[b], 2, 64),
                            TensorView::nhd(d.values[l].data(), DType::kF32, lengths[b], 2, 64)});
    out.caches.push_back(out.compressor->compress(seq));
  }
  return out;
}

bool same_layer(const CompressedKV& a, const CompressedKV& b, int l) {
  const auto &x = a.layer(l), &y = b.layer(l);
  if (x.positions != y.positions || x.window_positions != y.window_positions || x.pinned != y.pinned) return false;
  for (size_t h = 0; h < x.heads.size(); ++h) {
    const auto &p = x.heads[h], &q = y.heads[h];
    if (p.key_codes != q.key_codes || p.value_codes != q.value_codes || p.key_gains != q.key_gains ||
        p.value_gains != q.value_gains || p.window_keys != q.window_keys || p.window_values != q.window_values ||
        p.key_mean != q.key_mean || p.value_mean != q.value_mean)
      return false;
  }
  return true;
}

TEST(PagedKV, RoundTripOfARaggedBatch) {
  for (const char* preset : {"quant-k2v2", "quant-k3v2", "quant-k4v2", "lossless"}) {
    for (bool per_head : {false, true}) {
      const bool center = !per_head;  // both centring modes
      Batch batch = make_batch({0, 1, 37, 300}, preset, per_head, 8, 600, center);
      EXPECT_GT(batch.caches[3].layer(0).pinned, 0) << "fp16 sinks are pinned in the window";
      if (center && std::string(preset) != "lossless") {
        EXPECT_EQ(batch.caches[3].layer(0).heads[1].key_mean.size(), 64u);
      }
      std::vector<const CompressedKV*> in;
      for (const auto& c : batch.caches) in.push_back(&c);
      for (int layer = 0; layer < 2; ++layer) {
        PagedOptions opt;
        opt.page_tokens = 16;
        opt.shuffle_seed = 1234 + layer;
        opt.spare_pages = 3;
        opt.pool_fill = 0xA5;
        const PagedLayer paged = to_paged(in, layer, opt);
        EXPECT_EQ(paged.layout.position_sets, per_head ? 2 : 1);
        EXPECT_EQ(paged.means.size(), center ? size_t(4 * 2 * 2 * 64) : 0u);
        EXPECT_EQ(paged.pool.size(), size_t(paged.table.n_pages) * size_t(paged.layout.page_bytes));
        // Codes of one slot read straight from the pool equal the cache's bytes.
        const auto& c3 = batch.caches[3];
        const int64_t slot = paged.table.slot(3, 100);
        const uint8_t* page = paged.pool.data() + slot / 16 * paged.layout.page_bytes;
        const size_t kcb = static_cast<size_t>(paged.layout.key_code_bytes);
        EXPECT_EQ(0, std::memcmp(page + paged.layout.key_code_offset(1, slot % 16),
                                 &c3.layer(layer).heads[1].key_codes[100 * kcb], kcb));
        int32_t pos = -1;
        std::memcpy(&pos, page + paged.layout.position_offset(1, slot % 16), 4);
        EXPECT_EQ(pos, c3.positions(layer, 1)[100]);
        // Back into fresh caches with the same codecs: identical layers, identical attention.
        std::vector<CompressedKV> fresh;
        for (size_t b = 0; b < batch.caches.size(); ++b) fresh.emplace_back(batch.caches[b].shared_codecs());
        std::vector<CompressedKV*> outs;
        for (auto& c : fresh) outs.push_back(&c);
        from_paged(paged, layer, outs);
        for (size_t b = 0; b < batch.caches.size(); ++b) {
          ASSERT_TRUE(same_layer(batch.caches[b], fresh[b], layer)) << preset << " b " << b << " layer " << layer;
          if (batch.caches[b].stored_tokens(layer) == 0) continue;
          std::vector<float> o1(256), o2(256);
          const float* q = batch.data[b].queries[layer].data();
          e8kv::attend(batch.caches[b], layer, q, o1.data());
          e8kv::attend(fresh[b], layer, q, o2.data());
          EXPECT_EQ(o1, o2);
        }
      }
    }
  }
}

// The CPU twin of tests/cuda/decode_attention_test's coverage cases: attention computed by
// reading only what the kernels read (the pool through the block table at PagedLayout's offsets,
// the window buffers, the means) must reproduce e8kv::attend, for every layout variant
// the GPU tests use: Rvq3/Rvq4 values, interleaved and partial RoPE, per-head positions, page
// sizes 1-48, positions beyond 2^20, post-RoPE keys, more heads, GQA up to 12, batch 13.
std::vector<float> attend_from_pages(const PagedLayer& pl, const CacheCodecs& codecs, int b, const float* q, int q_heads) {
  const PagedLayout& L = pl.layout;
  const int H = L.kv_heads, d = L.head_dim, G = q_heads / H;
  const CacheLayout& CL = codecs.layout();
  const float scale = CL.effective_softmax_scale();
  const int coded = pl.table.coded_lens[static_cast<size_t>(b)];
  const int window = pl.window_lens[static_cast<size_t>(b)];
  std::vector<float> out(static_cast<size_t>(q_heads) * d, 0.f);
  for (int h = 0; h < H; ++h) {
    // Every token of this head as (key, value) floats in the engine basis.
    std::vector<float> keys, values;
    for (int t = 0; t < coded; ++t) {
      const int64_t slot = pl.table.slot(b, t);
      const uint8_t* page = pl.pool.data() + slot / L.page_tokens * L.page_bytes;
      const int s = static_cast<int>(slot % L.page_tokens);
      int32_t pos = 0;
      uint16_t kg = 0, vg = 0;
      std::memcpy(&pos, page + L.position_offset(h, s), 4);
      if (L.key_gain_bytes) std::memcpy(&kg, page + L.key_gain_offset(h, s), 2);
      if (L.value_gain_bytes) std::memcpy(&vg, page + L.value_gain_offset(h, s), 2);
      std::vector<float> k(static_cast<size_t>(d)), v(static_cast<size_t>(d));
      codecs.decode_key(0, h, page + L.key_code_offset(h, s), kg, pos, k.data());
      codecs.decode_value(0, h, page + L.value_code_offset(h, s), vg, v.data());
      if (!pl.means.empty()) {  // + R(pos)·μ_k (μ_k post-RoPE) and μ_v for block-coded kinds
        std::vector<float> mk(static_cast<size_t>(d)), mv(static_cast<size_t>(d));
        for (int i = 0; i < d; ++i) {
          mk[static_cast<size_t>(i)] = fp16_bits_to_float(pl.means[((static_cast<size_t>(b) * H + h) * 2 + 0) * d + i]);
          mv[static_cast<size_t>(i)] = fp16_bits_to_float(pl.means[((static_cast<size_t>(b) * H + h) * 2 + 1) * d + i]);
        }
        if (CL.key_frame == transform::KeyFrame::kPreRope && L.key_gain_bytes) quant::rope_table_rotate(mk.data(), codecs.key_rope_view(), pos, false);
        for (int i = 0; i < d; ++i) {
          if (L.key_gain_bytes) k[static_cast<size_t>(i)] += mk[static_cast<size_t>(i)];
          if (L.value_gain_bytes) v[static_cast<size_t>(i)] += mv[static_cast<size_t>(i)];
        }
      }
      keys.insert(keys.end(), k.begin(), k.end());
      values.insert(values.end(), v.begin(), v.end());
    }
    for (int t = 0; t < window; ++t)
      for (int i = 0; i < d; ++i) {
        const size_t at = static_cast<size_t>(b * pl.window_seq_stride() + h * pl.window_head_stride() +
                                              t * pl.window_token_stride() + i);
        keys.push_back(fp16_bits_to_float(pl.window_keys[at]));
        values.push_back(fp16_bits_to_float(pl.window_values[at]));
      }
    const size_t n = keys.size() / static_cast<size_t>(d);
    for (int g = 0; g < G; ++g) {
      const float* qh = q + static_cast<size_t>(h * G + g) * d;
      std::vector<double> logit(n);
      double mx = -INFINITY;
      for (size_t t = 0; t < n; ++t) {
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += static_cast<double>(qh[i]) * keys[t * d + static_cast<size_t>(i)];
        logit[t] = dot * scale;
        mx = std::max(mx, logit[t]);
      }
      double sum = 0;
      std::vector<double> acc(static_cast<size_t>(d), 0.0);
      for (size_t t = 0; t < n; ++t) {
        const double p = std::exp(logit[t] - mx);
        sum += p;
        for (int i = 0; i < d; ++i) acc[static_cast<size_t>(i)] += p * values[t * d + static_cast<size_t>(i)];
      }
      for (int i = 0; i < d; ++i)
        out[static_cast<size_t>(h * G + g) * d + i] = sum > 0 ? static_cast<float>(acc[static_cast<size_t>(i)] / sum) : 0.f;
    }
  }
  return out;
}

TEST(PagedKV, ReadingThePagesReproducesAttend) {
  struct Case {
    const char* what;
    ModelShape shape;
    const char* preset;
    int page_tokens;
    bool pre_rope = true;
    transform::RopeLayout rope_layout = transform::RopeLayout::kSplitHalf;
    int rotary_dim = 0;
    bool per_head = false;
    int32_t first_position = 0;
    int batch = 3;
  };
  std::vector<Case> cases = {
      {"rvq3 values", {1, 2, 8, 128}, "quant-k3v3", 16},
      {"rvq4 values post-RoPE", {1, 2, 8, 128}, "quant-k4v4", 16, false},
      {"interleaved", {1, 2, 8, 128}, "quant-k3v2", 16, true, transform::RopeLayout::kInterleaved},
      {"interleaved partial", {1, 2, 8, 128}, "quant-k3v2", 16, true, transform::RopeLayout::kInterleaved, 96},
      {"split-half partial", {1, 2, 8, 64}, "quant-k2v2", 16, true, transform::RopeLayout::kSplitHalf, 32},
      {"page 1", {1, 2, 8, 128}, "quant-k2v2", 1},
      {"page 3", {1, 2, 8, 128}, "quant-k2v2", 3},
      {"page 48", {1, 2, 8, 128}, "quant-k2v2", 48},
      {"positions >= 2^20", {1, 2, 8, 128}, "quant-k4v4", 16, true, transform::RopeLayout::kSplitHalf, 0, false,
       (1 << 20) + 12345},
      {"per-head positions", {1, 4, 8, 128}, "quant-k2v2", 16, true, transform::RopeLayout::kSplitHalf, 0, true},
      {"8 KV heads", {1, 8, 32, 128}, "quant-k2v2", 16},
      {"GQA 12", {1, 2, 24, 128}, "quant-k3v2", 16},
      {"batch 13", {1, 2, 6, 64}, "quant-k2v2", 16, true, transform::RopeLayout::kSplitHalf, 0, false, 0, 13},
  };
  uint64_t seed = 620;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Config cfg = Config::preset(c.preset);
    cfg.gain_bits = 16;
    cfg.query_weighted_keys = false;
    cfg.residual_length = 4;
    cfg.flush_block = 8;
    cfg.mean_tokens = 16;
    cfg.key_frame = c.pre_rope ? KeyFrame::kPreRope : KeyFrame::kPostRope;
    cfg.rope.layout = c.rope_layout;
    cfg.rope.rotary_dim = c.rotary_dim;
    if (c.per_head) {
      cfg.eviction_rate = 0.35;
      cfg.scorer = select::ScorerKind::kKeyNorm;
      cfg.per_head_selection = true;
      cfg.recent_window = 8;
    }
    KVCompressor compressor(c.shape, cfg);
    std::vector<synth::SyntheticKV> data;
    std::vector<CompressedKV> caches;
    for (int b = 0; b < c.batch; ++b) {
      synth::SyntheticSpec sp;
      sp.n_layers = 1;
      sp.n_kv_heads = c.shape.n_kv_heads;
      sp.n_q_heads = c.shape.n_q_heads;
      sp.head_dim = c.shape.head_dim;
      sp.tokens = 3 + (b * 131 + 57) % 400;
      sp.obs_window = 4;
      sp.seed = seed + 17 * static_cast<uint64_t>(b);
      data.push_back(synth::make_synthetic_kv(sp));
      SequenceKV seq;
      seq.first_position = c.first_position;
      seq.layers.push_back({TensorView::nhd(data.back().keys[0].data(), DType::kF32, sp.tokens, sp.n_kv_heads, sp.head_dim),
                            TensorView::nhd(data.back().values[0].data(), DType::kF32, sp.tokens, sp.n_kv_heads, sp.head_dim)});
      caches.push_back(compressor.compress(seq));
    }
    ++seed;
    std::vector<const CompressedKV*> in;
    for (const auto& x : caches) in.push_back(&x);
    PagedOptions opt;
    opt.page_tokens = c.page_tokens;
    opt.shuffle_seed = seed;
    opt.spare_pages = 2;
    opt.pool_fill = 0xFF;
    const PagedLayer pl = to_paged(in, 0, opt);
    EXPECT_EQ(pl.layout.position_sets, c.per_head ? c.shape.n_kv_heads : 1);
    if (c.per_head) {
      EXPECT_NE(caches.back().positions(0, 0), caches.back().positions(0, 1)) << "the heads' sets should differ";
    }
    if (c.first_position > 0) {
      EXPECT_GE(caches.back().positions(0, 0).back(), 1 << 20);
    }
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> gauss(0.f, 2.f);
    double worst = 0;
    for (int b = 0; b < c.batch; ++b) {
      std::vector<float> q(static_cast<size_t>(c.shape.n_q_heads) * c.shape.head_dim);
      for (auto& x : q) x = gauss(rng);
      std::vector<float> ref(q.size());
      e8kv::attend(caches[static_cast<size_t>(b)], 0, q.data(), ref.data());
      const std::vector<float> got = attend_from_pages(pl, caches[0].codecs(), b, q.data(), c.shape.n_q_heads);
      for (int r = 0; r < c.shape.n_q_heads; ++r) {
        double err = 0, mag = 0;
        for (int i = 0; i < c.shape.head_dim; ++i) {
          const size_t at = static_cast<size_t>(r) * c.shape.head_dim + static_cast<size_t>(i);
          err = std::max(err, std::fabs(static_cast<double>(got[at]) - ref[at]));
          mag = std::max(mag, std::fabs(static_cast<double>(ref[at])));
        }
        worst = std::max(worst, mag > 0 ? err / mag : err);
      }
    }
    EXPECT_LT(worst, 2e-4) << c.what;  // the GPU tests' fp32 tolerance
  }
}

TEST(PagedKV, SignBitsAndErrors) {
  Batch batch = make_batch({40}, "quant-k3v2", false, 0, 610);
  const CacheCodecs& codecs = batch.caches[0].codecs();
  const auto bits = packed_sign_bits(codecs, 1);
  ASSERT_EQ(bits.size(), 2u * 2u * 2u);  // heads x kinds x (64 / 32) words
  for (int h = 0; h < 2; ++h)
    for (int kind = 0; kind < 2; ++kind)
      for (int w = 0; w < 2; ++w) EXPECT_EQ(bits[(h * 2 + kind) * 2 + w], codecs.rotation(1, h, kind).sign_bits()[w]);
  EXPECT_THROW(packed_sign_bits(codecs, 2), Error);
  EXPECT_THROW(paged_layout_for(codecs, 0, 0), Error);
  EXPECT_THROW(to_paged({}, 0), Error);
  // Caches from two compressors cannot share pages.
  Batch other = make_batch({40}, "quant-k3v2", false, 0, 611);
  EXPECT_THROW(to_paged({&batch.caches[0], &other.caches[0]}, 0), Error);
  // Per-head sets of different sizes cannot share pages.
  Batch ph = make_batch({100}, "quant-k3v2", true, 0, 612);  // enough tokens to code past the means
  ASSERT_FALSE(ph.caches[0].layer(0).positions[1].empty());
  auto& ld = e8kv::detail::CacheStorage::layer(ph.caches[0], 0);
  ld.positions[1].pop_back();
  EXPECT_THROW(to_paged({&ph.caches[0]}, 0), Error);
  // Window capacity too small.
  Batch w = make_batch({40}, "quant-k3v2", false, 8, 613);
  PagedOptions opt;
  opt.window_capacity = 1;
  EXPECT_THROW(to_paged({&w.caches[0]}, 0, opt), Error);
  // from_paged into caches of another codec.
  const PagedLayer paged = to_paged({&batch.caches[0]}, 0);
  Batch k2 = make_batch({40}, "quant-k2v2", false, 0, 614);
  EXPECT_THROW(from_paged(paged, 0, {&k2.caches[0]}), Error);
  EXPECT_THROW(from_paged(paged, 0, {}), Error);
  // A key channel scale of 0 would read as "no scales" in the paged layout: refused.
  Batch qw = make_batch({100}, "quant-k3v2", false, 0, 615);
  auto& qw_head = e8kv::detail::CacheStorage::layer(qw.caches[0], 0).heads[1];
  qw_head.key_channel_scale.assign(64, 0x3C00);  // fp16 1.0
  qw_head.key_channel_scale[5] = 0;
  EXPECT_THROW(to_paged({&qw.caches[0]}, 0), Error);
}


// The library's default Config (RoPE-residual keys, 8-bit gains, query-weighted keys) goes to
// pages and back without losing a byte: every layer of every cache of a ragged batch is restored
// by from_paged into fresh caches, and the containers of both are identical.
TEST(PagedKV, DefaultConfigRoundTripsByteForByte) {
  const uint64_t seed = 630;
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  // The fp16 tier travels as pinned window rows (window_pinned), at any position.
  for (const char* preset : {"high", "quant-k2v2", "quant-k4v4", "quant-k2v2,fp16_tier=0.05"}) {
    for (bool per_head : {false, true}) {
      SCOPED_TRACE(std::string(preset) + (per_head ? " per-head" : " shared"));
      Config cfg = Config::parse(std::string("preset=") + preset);  // gain_bits 8, qweight, residual keys: the defaults
      ASSERT_EQ(cfg.gain_bits, 8);
      ASSERT_TRUE(cfg.query_weighted_keys);
      ASSERT_EQ(cfg.key_frame, KeyFrame::kRopeResidual);
      cfg.per_head_selection = per_head;
      cfg.flush_block = 16;
      cfg.mean_tokens = 16;
      if (per_head) {
        cfg.eviction_rate = 0.3;
        cfg.scorer = select::ScorerKind::kKeyNorm;
      }
      const ModelShape shape{2, 2, 8, 64};
      KVCompressor compressor(shape, cfg);
      std::vector<synth::SyntheticKV> data;
      std::vector<CompressedKV> caches;
      for (int len : {0, 5, 90, 300}) {
        synth::SyntheticSpec sp;
        sp.n_layers = shape.n_layers;
        sp.n_kv_heads = shape.n_kv_heads;
        sp.n_q_heads = shape.n_q_heads;
        sp.head_dim = shape.head_dim;
        sp.tokens = len;
        sp.obs_window = std::min(8, std::max(len, 1));
        sp.seed = seed + static_cast<uint64_t>(len);
        data.push_back(synth::make_synthetic_kv(sp));
        const auto& d = data.back();
        SequenceKV seq;
        std::vector<LayerQueries> queries;
        for (int l = 0; l < shape.n_layers; ++l) {
          seq.layers.push_back({TensorView::nhd(d.keys[l].data(), DType::kF32, len, shape.n_kv_heads, shape.head_dim),
                                TensorView::nhd(d.values[l].data(), DType::kF32, len, shape.n_kv_heads, shape.head_dim)});
          LayerQueries lq;
          lq.queries = TensorView::nhd(d.queries[l].data(), DType::kF32, static_cast<int64_t>(d.query_positions.size()),
                                       shape.n_q_heads, shape.head_dim);
          lq.positions = d.query_positions.data();
          queries.push_back(lq);
        }
        caches.push_back(compressor.compress(seq, len > 0 ? &queries : nullptr));
      }
      ASSERT_FALSE(caches[3].layer(0).heads[0].key_channel_scale.empty()) << "query-weighted keys expected";
      ASSERT_FALSE(caches[3].layer(0).heads[0].key_gain_codes.empty()) << "8-bit gains expected";
      if (cfg.fp16_tier > 0) {
        ASSERT_EQ(caches[3].layer(0).pinned, cfg.sinks + 15) << "a 15-token fp16 tier expected";
      }
      std::vector<const CompressedKV*> in;
      for (const auto& c : caches) in.push_back(&c);
      std::vector<CompressedKV> fresh;
      for (const auto& c : caches) fresh.emplace_back(c.shared_codecs());
      std::vector<CompressedKV*> outs;
      for (auto& c : fresh) outs.push_back(&c);
      for (int layer = 0; layer < shape.n_layers; ++layer) {
        PagedOptions opt;
        opt.page_tokens = 16;
        opt.shuffle_seed = seed + static_cast<uint64_t>(layer);
        const PagedLayer paged = to_paged(in, layer, opt);
        EXPECT_EQ(paged.layout.key_gain_bytes, 1);
        EXPECT_EQ(paged.layout.value_gain_bytes, 1);
        EXPECT_EQ(paged.key_scales.size(), caches.size() * 2 * 64);
        EXPECT_EQ(paged.gain_refs.size(), caches.size() * 2 * 2);
        from_paged(paged, layer, outs);
      }
      for (size_t b = 0; b < caches.size(); ++b)
        EXPECT_EQ(container::serialize(caches[b]), container::serialize(fresh[b])) << "sequence " << b;
    }
  }
}

// A cache with a code tier (a second code stream per head) cannot go to pages: to_paged and
// paged_layout_for refuse it with an error naming the tier, rather than dropping its tokens.
TEST(PagedKV, CodeTierCachesAreRefused) {
  synth::SyntheticSpec sp = testkit::shaped_spec(1, 1, 2, 64, 200, 640);
  sp.obs_window = 8;
  const testkit::Fixture f(sp);
  const ModelShape& shape = f.shape;
  const SequenceKV& seq = f.seq;
  const std::vector<LayerQueries>& queries = f.queries;
  KVCompressor compressor(shape, Config::parse("preset=quant-k3v2,code_tier=0.1"));
  const CompressedKV cache = compressor.compress(seq, &queries);
  ASSERT_GT(cache.tier_tokens(0, 0), 0);
  try {
    (void)to_paged({&cache}, 0);
    FAIL() << "to_paged accepted a code-tier cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("code tier"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)paged_layout_for(cache.codecs(), 0, 16), Error);
  // Without the tier the same data pages.
  KVCompressor plain(shape, Config::parse("preset=quant-k3v2"));
  const CompressedKV untiered = plain.compress(seq, &queries);
  EXPECT_NO_THROW((void)to_paged({&untiered}, 0));
}

}  // namespace
