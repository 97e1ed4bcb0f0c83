// Helpers shared by the container tests (tests/container/): small synthetic caches, field-by-field
// comparisons written independently of the library, and patching of serialized bytes at the
// offsets docs/format.md gives.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/container/checksum.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "testing/kv_fixture.hpp"
#include "testing/synthetic_kv.hpp"
#include "testing/test_util.hpp"

namespace e8kv::container_test {

namespace ent = e8kv::container;
using LayerData = CompressedKV::LayerData;

struct Made {
  synth::SyntheticKV kv;
  std::unique_ptr<KVCompressor> compressor;
  CompressedKV cache;
};

inline synth::SyntheticSpec small_spec(int layers = 2, int kv_heads = 2, int q_heads = 4, int head_dim = 64, int tokens = 100,
                                uint64_t seed = 1) {
  synth::SyntheticSpec s = testkit::shaped_spec(layers, kv_heads, q_heads, head_dim, tokens, seed);
  s.obs_window = std::min(16, std::max(tokens, 1));
  return s;
}

// Compresses tokens [0, tokens - appended) as a prefill and appends the rest one by one. Unless
// the spec says otherwise, centring means come from 8 tokens (the default 64 would leave these
// small caches entirely in the fp16 window).
inline Made make_cache(const std::string& spec, const synth::SyntheticSpec& s, int appended = 0, const Config* config = nullptr,
                bool with_queries = false) {
  Made m;
  m.kv = synth::make_synthetic_kv(s);
  const Config cfg =
      config ? *config : Config::parse(spec + (spec.find("mean_tokens") == std::string::npos ? ",mean_tokens=8" : ""));
  m.compressor = std::make_unique<KVCompressor>(ModelShape{s.n_layers, s.n_kv_heads, s.n_q_heads, s.head_dim}, cfg);
  const int prefill = s.tokens - appended;
  const int w = std::min(s.obs_window, s.tokens);
  SequenceKV seq;
  std::vector<LayerQueries> qs;
  for (int l = 0; l < s.n_layers; ++l) {
    seq.layers.push_back({TensorView::nhd(m.kv.keys[static_cast<size_t>(l)].data(), DType::kF32, prefill, s.n_kv_heads, s.head_dim),
                          TensorView::nhd(m.kv.values[static_cast<size_t>(l)].data(), DType::kF32, prefill, s.n_kv_heads, s.head_dim)});
    qs.push_back({TensorView::nhd(m.kv.queries[static_cast<size_t>(l)].data(), DType::kF32, w, s.n_q_heads, s.head_dim),
                  m.kv.query_positions.data()});
  }
  m.cache = m.compressor->compress(
      seq, cfg.eviction_rate > 0 || cfg.fp16_tier > 0 || cfg.code_tier > 0 || with_queries ? &qs : nullptr);
  const size_t row = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.head_dim);
  for (int t = prefill; t < s.tokens; ++t)
    for (int l = 0; l < s.n_layers; ++l)
      m.compressor->append(m.cache, l, &m.kv.keys[static_cast<size_t>(l)][t * row], &m.kv.values[static_cast<size_t>(l)][t * row], t);
  return m;
}

template <class T>
inline bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Field-by-field layout comparison written independently of ent::layout_difference.
inline void expect_layout_eq(const CacheLayout& a, const CacheLayout& b) {
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.n_q_heads, b.n_q_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.key_codec, b.key_codec);
  EXPECT_EQ(a.value_codec, b.value_codec);
  EXPECT_EQ(a.tier_key_codec, b.tier_key_codec);
  EXPECT_EQ(a.tier_value_codec, b.tier_value_codec);
  EXPECT_EQ(a.key_gain, b.key_gain);
  EXPECT_EQ(a.value_gain, b.value_gain);
  EXPECT_TRUE(same_bits(a.key_scale, b.key_scale));
  EXPECT_TRUE(same_bits(a.value_scale, b.value_scale));
  EXPECT_EQ(a.key_frame, b.key_frame);
  EXPECT_EQ(a.rotation_seed, b.rotation_seed);
  EXPECT_EQ(a.per_head_positions, b.per_head_positions);
  EXPECT_EQ(a.residual_length, b.residual_length);
  EXPECT_EQ(a.flush_block, b.flush_block);
  EXPECT_EQ(a.center, b.center);
  EXPECT_EQ(a.query_weighted_keys, b.query_weighted_keys);
  EXPECT_EQ(a.gain_bits, b.gain_bits);
  EXPECT_EQ(a.mean_tokens, b.mean_tokens);
  EXPECT_TRUE(same_bits(a.softmax_scale, b.softmax_scale));
  const auto& p = a.rope;
  const auto& q = b.rope;
  EXPECT_EQ(p.layout, q.layout);
  EXPECT_EQ(p.head_dim, q.head_dim);
  EXPECT_EQ(p.rotary_dim, q.rotary_dim);
  EXPECT_TRUE(same_bits(p.theta, q.theta));
  EXPECT_EQ(p.scaling, q.scaling);
  EXPECT_TRUE(same_bits(p.factor, q.factor));
  EXPECT_EQ(p.original_max_position, q.original_max_position);
  EXPECT_TRUE(same_bits(p.low_freq_factor, q.low_freq_factor));
  EXPECT_TRUE(same_bits(p.high_freq_factor, q.high_freq_factor));
  EXPECT_TRUE(same_bits(p.beta_fast, q.beta_fast));
  EXPECT_TRUE(same_bits(p.beta_slow, q.beta_slow));
  EXPECT_TRUE(same_bits(p.attention_factor, q.attention_factor));
}

inline void expect_layer_eq(const LayerData& a, const LayerData& b, const std::string& where) {
  EXPECT_EQ(a.original_tokens, b.original_tokens) << where;
  EXPECT_EQ(a.pinned, b.pinned) << where;
  EXPECT_EQ(a.positions, b.positions) << where;
  EXPECT_EQ(a.window_positions, b.window_positions) << where;
  EXPECT_EQ(a.tier_positions, b.tier_positions) << where;
  ASSERT_EQ(a.heads.size(), b.heads.size()) << where;
  for (size_t h = 0; h < a.heads.size(); ++h) {
    const auto& x = a.heads[h];
    const auto& y = b.heads[h];
    EXPECT_EQ(x.key_codes, y.key_codes) << where << " head " << h;
    EXPECT_EQ(x.value_codes, y.value_codes) << where << " head " << h;
    EXPECT_EQ(x.key_gains, y.key_gains) << where << " head " << h;
    EXPECT_EQ(x.value_gains, y.value_gains) << where << " head " << h;
    EXPECT_EQ(x.window_keys, y.window_keys) << where << " head " << h;
    EXPECT_EQ(x.window_values, y.window_values) << where << " head " << h;
    EXPECT_EQ(x.key_mean, y.key_mean) << where << " head " << h;
    EXPECT_EQ(x.value_mean, y.value_mean) << where << " head " << h;
    EXPECT_EQ(x.key_channel_scale, y.key_channel_scale) << where << " head " << h;
    EXPECT_EQ(x.key_gain_codes, y.key_gain_codes) << where << " head " << h;
    EXPECT_EQ(x.value_gain_codes, y.value_gain_codes) << where << " head " << h;
    EXPECT_EQ(x.key_gain_ref, y.key_gain_ref) << where << " head " << h;
    EXPECT_EQ(x.value_gain_ref, y.value_gain_ref) << where << " head " << h;
    EXPECT_EQ(x.tier_key_codes, y.tier_key_codes) << where << " head " << h;
    EXPECT_EQ(x.tier_value_codes, y.tier_value_codes) << where << " head " << h;
    EXPECT_EQ(x.tier_key_gains, y.tier_key_gains) << where << " head " << h;
    EXPECT_EQ(x.tier_value_gains, y.tier_value_gains) << where << " head " << h;
  }
  EXPECT_EQ(a.query_energy, b.query_energy) << where;
}

inline void expect_cache_eq(const CompressedKV& a, const CompressedKV& b) {
  ASSERT_TRUE(b.valid());
  expect_layout_eq(a.layout(), b.layout());
  ASSERT_EQ(a.n_layers(), b.n_layers());
  for (int l = 0; l < a.n_layers(); ++l) expect_layer_eq(a.layer(l), b.layer(l), "layer " + std::to_string(l));
}

// CompressedKV::attend on a head without any stored token indexes an empty vector
// (src/cache/compressed_kv.cpp, softmax over zero logits; reported), so attention is compared only on
// layers where every head has tokens.
inline bool every_head_has_tokens(const CompressedKV& c, int l) {
  for (int h = 0; h < c.layout().n_kv_heads; ++h)
    if (c.stored_tokens(l, h) == 0) return false;
  return true;
}

// Attention outputs of both caches for every layer and a few queries, compared bit for bit.
inline void expect_same_attention(const CompressedKV& a, const CompressedKV& b, uint64_t seed) {
  const CacheLayout& L = a.layout();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  const size_t n = static_cast<size_t>(L.n_q_heads) * static_cast<size_t>(L.head_dim);
  std::vector<float> q(n), oa(n), ob(n);
  for (int l = 0; l < L.n_layers; ++l) {
    if (!every_head_has_tokens(a, l)) continue;
    int32_t last = 0;
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const auto& w = a.window_positions(l, h);
      const auto& c = a.positions(l, h);
      if (!w.empty()) last = std::max(last, w.back());
      else if (!c.empty()) last = std::max(last, c.back());
    }
    for (int r = 0; r < 2; ++r) {
      for (auto& x : q) x = g(rng);
      e8kv::attend(a, l, q.data(), oa.data());
      e8kv::attend(b, l, q.data(), ob.data());
      EXPECT_EQ(std::memcmp(oa.data(), ob.data(), n * sizeof(float)), 0) << "attention differs at layer " << l;
    }
  }
}

// Stored tokens [b, e) of every set of a layer (the documented meaning of deserialize_tokens:
// coded tokens, then code-tier tokens, then window tokens).
inline LayerData slice(const CompressedKV& c, int l, int64_t b, int64_t e) {
  const CacheLayout& L = c.layout();
  const LayerData& ld = c.layer(l);
  LayerData out;
  out.original_tokens = ld.original_tokens;
  out.pinned = ld.pinned;
  const size_t sets = ld.positions.size();
  out.positions.resize(sets);
  out.window_positions.resize(sets);
  out.tier_positions.resize(sets);
  out.heads.resize(ld.heads.size());
  const size_t kcb = c.codecs().key_quantizer(l).code_bytes(), vcb = c.codecs().value_quantizer(l).code_bytes();
  const size_t tkcb = c.codecs().tier_code_bytes(KvKind::kKey), tvcb = c.codecs().tier_code_bytes(KvKind::kValue);
  const size_t d = static_cast<size_t>(L.head_dim);
  struct Range {
    int64_t c0, c1, t0, t1, w0, w1;
  };
  std::vector<Range> ranges(sets);
  static const std::vector<int32_t> kNoTier;
  for (size_t s = 0; s < sets; ++s) {
    const std::vector<int32_t>& tier = s < ld.tier_positions.size() ? ld.tier_positions[s] : kNoTier;
    const int64_t C = static_cast<int64_t>(ld.positions[s].size());
    const int64_t CT = C + static_cast<int64_t>(tier.size());
    const int64_t N = CT + static_cast<int64_t>(ld.window_positions[s].size());
    const int64_t lo = std::min(b, N), hi = std::min(e, N);
    auto clamp = [](int64_t x, int64_t a, int64_t z) { return std::min(std::max(x, a), z); };
    ranges[s] = {std::min(lo, C),      std::min(hi, C),       clamp(lo, C, CT) - C,
                 clamp(hi, C, CT) - C, std::max(lo, CT) - CT, std::max(hi, CT) - CT};
    out.positions[s].assign(ld.positions[s].begin() + ranges[s].c0, ld.positions[s].begin() + ranges[s].c1);
    out.tier_positions[s].assign(tier.begin() + ranges[s].t0, tier.begin() + ranges[s].t1);
    out.window_positions[s].assign(ld.window_positions[s].begin() + ranges[s].w0,
                                   ld.window_positions[s].begin() + ranges[s].w1);
  }
  for (size_t h = 0; h < ld.heads.size(); ++h) {
    const auto [c0, c1, t0, t1, w0, w1] = ranges[sets == 1 ? 0 : h];
    const auto& x = ld.heads[h];
    auto& y = out.heads[h];
    y.key_codes.assign(x.key_codes.begin() + c0 * static_cast<int64_t>(kcb), x.key_codes.begin() + c1 * static_cast<int64_t>(kcb));
    y.value_codes.assign(x.value_codes.begin() + c0 * static_cast<int64_t>(vcb),
                         x.value_codes.begin() + c1 * static_cast<int64_t>(vcb));
    if (!x.key_gains.empty()) y.key_gains.assign(x.key_gains.begin() + c0, x.key_gains.begin() + c1);
    if (!x.value_gains.empty()) y.value_gains.assign(x.value_gains.begin() + c0, x.value_gains.begin() + c1);
    if (!x.key_gain_codes.empty()) y.key_gain_codes.assign(x.key_gain_codes.begin() + c0, x.key_gain_codes.begin() + c1);
    if (!x.value_gain_codes.empty())
      y.value_gain_codes.assign(x.value_gain_codes.begin() + c0, x.value_gain_codes.begin() + c1);
    y.key_gain_ref = x.key_gain_ref;
    y.value_gain_ref = x.value_gain_ref;
    if (t1 > t0) {
      y.tier_key_codes.assign(x.tier_key_codes.begin() + t0 * static_cast<int64_t>(tkcb),
                              x.tier_key_codes.begin() + t1 * static_cast<int64_t>(tkcb));
      y.tier_value_codes.assign(x.tier_value_codes.begin() + t0 * static_cast<int64_t>(tvcb),
                                x.tier_value_codes.begin() + t1 * static_cast<int64_t>(tvcb));
      y.tier_key_gains.assign(x.tier_key_gains.begin() + t0, x.tier_key_gains.begin() + t1);
      y.tier_value_gains.assign(x.tier_value_gains.begin() + t0, x.tier_value_gains.begin() + t1);
    }
    y.window_keys.assign(x.window_keys.begin() + w0 * static_cast<int64_t>(d), x.window_keys.begin() + w1 * static_cast<int64_t>(d));
    y.window_values.assign(x.window_values.begin() + w0 * static_cast<int64_t>(d),
                           x.window_values.begin() + w1 * static_cast<int64_t>(d));
    y.key_mean = x.key_mean;
    y.value_mean = x.value_mean;
    y.key_channel_scale = x.key_channel_scale;
  }
  out.query_energy = ld.query_energy;
  return out;
}

// Drops every third coded token of head h's own position set (per-head caches): a valid cache
// whose sets differ.
inline void thin_set(CompressedKV& c, int l, int h) {
  auto& ld = e8kv::detail::CacheStorage::layer(c, l);
  auto& pos = ld.positions[static_cast<size_t>(h)];
  auto& hd = ld.heads[static_cast<size_t>(h)];
  const size_t kcb = c.codecs().key_quantizer(l).code_bytes(), vcb = c.codecs().value_quantizer(l).code_bytes();
  CompressedKV::HeadData kept = hd;
  kept.key_codes.clear();
  kept.value_codes.clear();
  kept.key_gains.clear();
  kept.value_gains.clear();
  kept.key_gain_codes.clear();
  kept.value_gain_codes.clear();
  std::vector<int32_t> kept_pos;
  for (size_t t = 0; t < pos.size(); ++t) {
    if (t % 3 == 1) continue;
    kept_pos.push_back(pos[t]);
    kept.key_codes.insert(kept.key_codes.end(), hd.key_codes.begin() + static_cast<std::ptrdiff_t>(t * kcb),
                          hd.key_codes.begin() + static_cast<std::ptrdiff_t>((t + 1) * kcb));
    kept.value_codes.insert(kept.value_codes.end(), hd.value_codes.begin() + static_cast<std::ptrdiff_t>(t * vcb),
                            hd.value_codes.begin() + static_cast<std::ptrdiff_t>((t + 1) * vcb));
    if (!hd.key_gains.empty()) kept.key_gains.push_back(hd.key_gains[t]);
    if (!hd.value_gains.empty()) kept.value_gains.push_back(hd.value_gains[t]);
    if (!hd.key_gain_codes.empty()) kept.key_gain_codes.push_back(hd.key_gain_codes[t]);
    if (!hd.value_gain_codes.empty()) kept.value_gain_codes.push_back(hd.value_gain_codes[t]);
  }
  pos = kept_pos;
  hd = kept;
}

// Expects an e8kv::Error whose message contains `needle`.
template <class F>
inline void expect_error(F&& f, const std::string& needle, const std::string& context = "") {
  try {
    f();
    ADD_FAILURE() << "no e8kv::Error (expected one mentioning '" << needle << "') " << context;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "' " << context;
  }
}

// ---- format patching helpers (offsets from docs/format.md) -----------------------------------------

template <class T>
inline T get_at(const std::vector<uint8_t>& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}
template <class T>
inline void put_at(std::vector<uint8_t>& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

inline size_t header_bytes(const std::vector<uint8_t>& b) { return static_cast<size_t>(get_at<uint64_t>(b, 16)); }

inline void fix_header_crc(std::vector<uint8_t>& b) {
  const size_t hb = header_bytes(b);
  put_at<uint32_t>(b, hb - 4, ent::crc32c(b.data(), hb - 4));
}

// Offset of chunk i from the directory (16 bytes per entry, ending 4 bytes before header_bytes).
inline size_t chunk_offset(const std::vector<uint8_t>& b, size_t i) {
  const size_t n = static_cast<size_t>(get_at<uint64_t>(b, 40));
  const size_t dir = header_bytes(b) - 4 - 16 * n;
  return static_cast<size_t>(get_at<uint64_t>(b, dir + 16 * i));
}

inline void fix_chunk_crc(std::vector<uint8_t>& b, size_t off) {
  const size_t payload = static_cast<size_t>(get_at<uint64_t>(b, off + 24));
  put_at<uint32_t>(b, off + 36, ent::crc32c(b.data() + off + 40, payload, ent::crc32c(b.data() + off, 36)));
}

/// Offset of the layout record in a compressed-cache container.
inline constexpr size_t kLayoutAt = 48;

inline CompressedKV deser(const std::vector<uint8_t>& b, const ent::DeserializeOptions& o = {}) {
  return ent::deserialize(b.data(), b.size(), o);
}

// ---- tests/data ------------------------------------------------------------------------------------

inline std::string data_dir() { return E8KV_TEST_DATA_DIR; }

inline std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// ---- round trips -----------------------------------------------------------------------------------

inline void round_trip(const CompressedKV& cache, const ent::ContainerOptions& o, uint64_t seed) {
  const std::vector<uint8_t> bytes = ent::serialize(cache, o);
  EXPECT_EQ(ent::serialized_size(cache, o), bytes.size());
  EXPECT_GE(ent::serialized_size_bound(cache, o), bytes.size());
  const CompressedKV back = deser(bytes);
  expect_cache_eq(cache, back);
  EXPECT_EQ(back.bytes(), cache.bytes());
  expect_same_attention(cache, back, seed);
  // Re-encoding the decoded cache gives the same bytes.
  EXPECT_EQ(ent::serialize(back, o), bytes);
}

}  // namespace e8kv::container_test
