// Tests of the offload container (include/e8kv/entropy/container.hpp, docs/format.md) and of
// CRC-32C (include/e8kv/entropy/checksum.hpp).
#include "e8kv/attention/attend.hpp"
#include "e8kv/entropy/container.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "testing/cache_digest.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/entropy/checksum.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"
#include "testing/synthetic_kv.hpp"
#include "e8kv/version.hpp"
#include "testing/test_util.hpp"

namespace {

using namespace e8kv;
namespace ent = e8kv::entropy;
using LayerData = CompressedKV::LayerData;

// ---- helpers ---------------------------------------------------------------------------------------

struct Made {
  synth::SyntheticKV kv;
  std::unique_ptr<KVCompressor> compressor;
  CompressedKV cache;
};

synth::SyntheticSpec small_spec(int layers = 2, int kv_heads = 2, int q_heads = 4, int head_dim = 64, int tokens = 100,
                                uint64_t seed = 1) {
  synth::SyntheticSpec s;
  s.n_layers = layers;
  s.n_kv_heads = kv_heads;
  s.n_q_heads = q_heads;
  s.head_dim = head_dim;
  s.tokens = tokens;
  s.seed = seed;
  s.obs_window = std::min(16, std::max(tokens, 1));
  return s;
}

// Compresses tokens [0, tokens - appended) as a prefill and appends the rest one by one. Unless
// the spec says otherwise, centring means come from 8 tokens (the default 64 would leave these
// small caches entirely in the fp16 window).
Made make_cache(const std::string& spec, const synth::SyntheticSpec& s, int appended = 0, const Config* config = nullptr,
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
  m.cache = m.compressor->compress(seq, cfg.eviction_rate > 0 || with_queries ? &qs : nullptr);
  const size_t row = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.head_dim);
  for (int t = prefill; t < s.tokens; ++t)
    for (int l = 0; l < s.n_layers; ++l)
      m.compressor->append(m.cache, l, &m.kv.keys[static_cast<size_t>(l)][t * row], &m.kv.values[static_cast<size_t>(l)][t * row], t);
  return m;
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Field-by-field layout comparison written independently of ent::layout_difference.
void expect_layout_eq(const CacheLayout& a, const CacheLayout& b) {
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.n_q_heads, b.n_q_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.key_codec, b.key_codec);
  EXPECT_EQ(a.value_codec, b.value_codec);
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

void expect_layer_eq(const LayerData& a, const LayerData& b, const std::string& where) {
  EXPECT_EQ(a.original_tokens, b.original_tokens) << where;
  EXPECT_EQ(a.pinned, b.pinned) << where;
  EXPECT_EQ(a.positions, b.positions) << where;
  EXPECT_EQ(a.window_positions, b.window_positions) << where;
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
  }
  EXPECT_EQ(a.query_energy, b.query_energy) << where;
}

void expect_cache_eq(const CompressedKV& a, const CompressedKV& b) {
  ASSERT_TRUE(b.valid());
  expect_layout_eq(a.layout(), b.layout());
  ASSERT_EQ(a.n_layers(), b.n_layers());
  for (int l = 0; l < a.n_layers(); ++l) expect_layer_eq(a.layer(l), b.layer(l), "layer " + std::to_string(l));
}

// CompressedKV::attend on a head without any stored token indexes an empty vector
// (src/compressed_kv.cpp, softmax over zero logits; reported), so attention is compared only on
// layers where every head has tokens.
bool every_head_has_tokens(const CompressedKV& c, int l) {
  for (int h = 0; h < c.layout().n_kv_heads; ++h)
    if (c.stored_tokens(l, h) == 0) return false;
  return true;
}

// Attention outputs of both caches for every layer and a few queries, compared bit for bit.
void expect_same_attention(const CompressedKV& a, const CompressedKV& b, uint64_t seed) {
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

// Stored tokens [b, e) of every set of a layer (the documented meaning of deserialize_tokens).
LayerData slice(const CompressedKV& c, int l, int64_t b, int64_t e) {
  const CacheLayout& L = c.layout();
  const LayerData& ld = c.layer(l);
  LayerData out;
  out.original_tokens = ld.original_tokens;
  out.pinned = ld.pinned;
  const size_t sets = ld.positions.size();
  out.positions.resize(sets);
  out.window_positions.resize(sets);
  out.heads.resize(ld.heads.size());
  const size_t kcb = c.codecs().key_quantizer(l).code_bytes(), vcb = c.codecs().value_quantizer(l).code_bytes();
  const size_t d = static_cast<size_t>(L.head_dim);
  struct Range {
    int64_t c0, c1, w0, w1;
  };
  std::vector<Range> ranges(sets);
  for (size_t s = 0; s < sets; ++s) {
    const int64_t C = static_cast<int64_t>(ld.positions[s].size());
    const int64_t N = C + static_cast<int64_t>(ld.window_positions[s].size());
    const int64_t lo = std::min(b, N), hi = std::min(e, N);
    ranges[s] = {std::min(lo, C), std::min(hi, C), std::max(lo, C) - C, std::max(hi, C) - C};
    out.positions[s].assign(ld.positions[s].begin() + ranges[s].c0, ld.positions[s].begin() + ranges[s].c1);
    out.window_positions[s].assign(ld.window_positions[s].begin() + ranges[s].w0,
                                   ld.window_positions[s].begin() + ranges[s].w1);
  }
  for (size_t h = 0; h < ld.heads.size(); ++h) {
    const auto [c0, c1, w0, w1] = ranges[sets == 1 ? 0 : h];
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
void thin_set(CompressedKV& c, int l, int h) {
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
void expect_error(F&& f, const std::string& needle, const std::string& context = "") {
  try {
    f();
    ADD_FAILURE() << "no e8kv::Error (expected one mentioning '" << needle << "') " << context;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "' " << context;
  }
}

// ---- format patching helpers (offsets from docs/format.md) ----------------------------------------

template <class T>
T get_at(const std::vector<uint8_t>& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}
template <class T>
void put_at(std::vector<uint8_t>& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

size_t header_bytes(const std::vector<uint8_t>& b) { return static_cast<size_t>(get_at<uint64_t>(b, 16)); }

void fix_header_crc(std::vector<uint8_t>& b) {
  const size_t hb = header_bytes(b);
  put_at<uint32_t>(b, hb - 4, ent::crc32c(b.data(), hb - 4));
}

// Offset of chunk i from the directory (16 bytes per entry, ending 4 bytes before header_bytes).
size_t chunk_offset(const std::vector<uint8_t>& b, size_t i) {
  const size_t n = static_cast<size_t>(get_at<uint64_t>(b, 40));
  const size_t dir = header_bytes(b) - 4 - 16 * n;
  return static_cast<size_t>(get_at<uint64_t>(b, dir + 16 * i));
}

void fix_chunk_crc(std::vector<uint8_t>& b, size_t off) {
  const size_t payload = static_cast<size_t>(get_at<uint64_t>(b, off + 24));
  put_at<uint32_t>(b, off + 36, ent::crc32c(b.data() + off + 40, payload, ent::crc32c(b.data() + off, 36)));
}

constexpr size_t kLayoutAt = 48;

CompressedKV deser(const std::vector<uint8_t>& b, const ent::DeserializeOptions& o = {}) {
  return ent::deserialize(b.data(), b.size(), o);
}

// ---- CRC-32C ---------------------------------------------------------------------------------------

TEST(Crc32c, CatalogueCheckValue) {
  const char* s = "123456789";  // CRC catalogue "check" input; CRC-32/ISCSI check = 0xE3069283
  EXPECT_EQ(ent::crc32c_bitwise(s, 9), 0xE3069283u);
  EXPECT_EQ(ent::crc32c_portable(s, 9), 0xE3069283u);
  EXPECT_EQ(ent::crc32c_hardware(s, 9), 0xE3069283u);
  EXPECT_EQ(ent::crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(ent::crc32c(s, 0), 0u);
}

TEST(Crc32c, Rfc3720Vectors) {
  // RFC 3720 (iSCSI), appendix B.4: CRC-32C of 32-byte patterns.
  uint8_t zeros[32] = {}, ones[32], inc[32], dec[32];
  for (int i = 0; i < 32; ++i) {
    ones[i] = 0xFF;
    inc[i] = static_cast<uint8_t>(i);
    dec[i] = static_cast<uint8_t>(31 - i);
  }
  for (auto fn : {&ent::crc32c_bitwise, &ent::crc32c_portable, &ent::crc32c_hardware}) {
    EXPECT_EQ(fn(zeros, 32, 0), 0x8A9136AAu);
    EXPECT_EQ(fn(ones, 32, 0), 0x62A8AB43u);
    EXPECT_EQ(fn(inc, 32, 0), 0x46DD794Eu);
    EXPECT_EQ(fn(dec, 32, 0), 0x113FDB5Cu);
  }
}

TEST(Crc32c, LongBuffersUseTheInterleavedPathCorrectly) {
  // The hardware path runs three streams over 3 × 4096-byte blocks and combines them.
  auto rng = test::seeded_rng(3721);
  std::vector<uint8_t> data(110000);
  for (auto& x : data) x = static_cast<uint8_t>(rng());
  for (size_t start : {size_t{0}, size_t{1}, size_t{5}})
    for (size_t n : {size_t{12287}, size_t{12288}, size_t{12289}, size_t{24576 + 7}, size_t{100000}}) {
      const uint32_t ref = ent::crc32c_portable(data.data() + start, n);
      EXPECT_EQ(ent::crc32c_hardware(data.data() + start, n), ref) << start << " " << n;
      EXPECT_EQ(ent::crc32c(data.data() + start + 777, n - 777, ent::crc32c(data.data() + start, 777)), ref);
    }
  EXPECT_EQ(ent::crc32c_bitwise(data.data(), 30000), ent::crc32c_hardware(data.data(), 30000));
}

TEST(Crc32c, ImplementationsAgreeAndExtend) {
  auto rng = test::seeded_rng(3720);
  std::vector<uint8_t> data(1200);
  for (auto& x : data) x = static_cast<uint8_t>(rng());
  for (size_t start = 0; start < 9; ++start)
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{64}, size_t{65},
                     size_t{1000}}) {
      const uint8_t* p = data.data() + start;
      const uint32_t ref = ent::crc32c_bitwise(p, n);
      EXPECT_EQ(ent::crc32c_portable(p, n), ref) << start << " " << n;
      EXPECT_EQ(ent::crc32c_hardware(p, n), ref) << start << " " << n;
      for (size_t cut : {size_t{0}, n / 3, n}) {
        EXPECT_EQ(ent::crc32c(p + cut, n - cut, ent::crc32c(p, cut)), ref);
        EXPECT_EQ(ent::crc32c_portable(p + cut, n - cut, ent::crc32c_bitwise(p, cut)), ref);
      }
    }
}

// ---- transforms --------------------------------------------------------------------------------------

// Reference transform written from the definition: elements as integers, delta per segment and
// column along rows, then byte planes.
std::vector<uint8_t> reference_forward(ent::Transform t, const ent::StreamShape& s, const std::vector<uint8_t>& in) {
  const int id = static_cast<int>(t);
  const int delta = id >> 1;
  const bool planes = (id & 1) != 0;
  const size_t w = static_cast<size_t>(s.width);
  const size_t n = in.size() / w;
  auto elem = [&](const std::vector<uint8_t>& v, size_t k) {
    uint64_t x = 0;
    for (size_t b = 0; b < w; ++b) x |= static_cast<uint64_t>(v[k * w + b]) << (8 * b);
    return x;
  };
  std::vector<uint64_t> e(n);
  size_t k = 0;
  const uint64_t mask = w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1;
  for (int64_t rows : s.segment_rows)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < s.cols; ++c, ++k) {
        uint64_t x = elem(in, k);
        if (delta != 0 && r > 0) {
          const uint64_t p = elem(in, k - static_cast<size_t>(s.cols));
          x = delta == 1 ? (x ^ p) : ((x - p) & mask);
        }
        e[k] = x;
      }
  std::vector<uint8_t> out(in.size());
  for (size_t i = 0; i < n; ++i)
    for (size_t b = 0; b < w; ++b) {
      const uint8_t byte = static_cast<uint8_t>(e[i] >> (8 * b));
      if (planes) out[b * n + i] = byte;
      else out[i * w + b] = byte;
    }
  return out;
}

TEST(Transform, MatchesDefinitionAndInverts) {
  auto rng = test::seeded_rng(77);
  const std::vector<std::vector<int64_t>> segs = {{}, {0}, {1}, {3}, {0, 2, 0, 5}, {7, 1, 4}};
  for (int w = 1; w <= 8; ++w)
    for (int64_t cols : {0, 1, 3, 16})
      for (const auto& sr : segs)
        for (int t = 0; t < ent::kTransformCount; ++t) {
          const ent::StreamShape s{sr, cols, w};
          std::vector<uint8_t> in(s.bytes()), fwd(s.bytes()), back(s.bytes());
          // Small values so that deltas are often zero (as on correlated data), plus random bytes.
          for (auto& x : in) x = static_cast<uint8_t>(rng() % 4 == 0 ? rng() : rng() % 3);
          ent::transform_forward(static_cast<ent::Transform>(t), s, in.data(), fwd.data());
          EXPECT_EQ(fwd, reference_forward(static_cast<ent::Transform>(t), s, in))
              << "transform " << t << " width " << w << " cols " << cols;
          ent::transform_inverse(static_cast<ent::Transform>(t), s, fwd.data(), back.data());
          EXPECT_EQ(back, in) << "transform " << t << " width " << w << " cols " << cols;
        }
}

TEST(Transform, RejectsUnknownIdsAndBadShapes) {
  uint8_t a[4] = {}, b[4] = {};
  const ent::StreamShape s{{2}, 1, 2};
  expect_error([&] { ent::transform_forward(static_cast<ent::Transform>(6), s, a, b); }, "transform id 6");
  expect_error([&] { ent::transform_inverse(static_cast<ent::Transform>(255), s, a, b); }, "transform id 255");
  expect_error([&] { ent::transform_forward(ent::Transform::kShuffle, ent::StreamShape{{2}, 1, 0}, a, b); }, "width");
  expect_error([&] { ent::transform_forward(ent::Transform::kShuffle, ent::StreamShape{{-1}, 1, 2}, a, b); },
               "segment_rows");
  expect_error([] { ent::transform_from_id(6); }, "accepted 0..5");
  EXPECT_EQ(ent::transform_from_id(3), ent::Transform::kXorDeltaShuffle);
  EXPECT_STREQ(ent::to_string(ent::Transform::kSubDeltaShuffle), "sub-delta+shuffle");
}

// ---- format coverage ------------------------------------------------------------------------------

// The container writes every field of these structs. When one of them gains a field, this test
// fails: serialize the field (src/container.cpp, docs/format.md, a format version bump, new golden
// files) and then extend the mirror. (A small field that fits in padding escapes this check; the
// round-trip tests compare fields one by one.)
TEST(ContainerFormat, CoversEveryFieldOfTheCacheStructs) {
  struct HeadMirror {
    std::vector<uint8_t> key_codes, value_codes;
    std::vector<uint16_t> key_gains, value_gains, window_keys, window_values, key_mean, value_mean, key_channel_scale;
    std::vector<uint8_t> key_gain_codes, value_gain_codes;
    uint16_t key_gain_ref, value_gain_ref;
  };
  EXPECT_EQ(sizeof(CompressedKV::HeadData), sizeof(HeadMirror));
  struct LayerMirror {
    std::vector<std::vector<int32_t>> positions, window_positions;
    std::vector<CompressedKV::HeadData> heads;
    int64_t original_tokens, pinned;
    std::vector<std::vector<float>> query_energy;
  };
  EXPECT_EQ(sizeof(CompressedKV::LayerData), sizeof(LayerMirror));
  struct RopeMirror {
    transform::RopeLayout layout;
    int head_dim, rotary_dim;
    double theta;
    transform::RopeScaling scaling;
    double factor;
    int original_max_position;
    double low_freq_factor, high_freq_factor, beta_fast, beta_slow, attention_factor;
  };
  EXPECT_EQ(sizeof(transform::RopeParams), sizeof(RopeMirror));
  struct LayoutMirror {
    int n_layers, n_kv_heads, n_q_heads, head_dim;
    std::vector<quant::Codec> key_codec, value_codec;
    quant::GainPolicy key_gain, value_gain;
    float key_scale, value_scale;
    bool keys_pre_rope;
    transform::RopeParams rope;
    uint64_t rotation_seed;
    bool per_head_positions;
    int residual_length, flush_block;
    bool center;
    int mean_tokens;
    bool query_weighted_keys;
    int gain_bits;
    float softmax_scale;
  };
  EXPECT_EQ(sizeof(CacheLayout), sizeof(LayoutMirror));
}

// ---- round trips ---------------------------------------------------------------------------------------

void round_trip(const CompressedKV& cache, const ent::ContainerOptions& o, uint64_t seed) {
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

TEST(ContainerRoundTrip, EveryCodecAndGainPolicy) {
  const char* gains[] = {"ls", "norm", "unbiased"};
  for (int c = 0; c < quant::kCodecCount; ++c) {
    const std::string codec = quant::to_string(static_cast<quant::Codec>(c));
    const std::string spec = "key=" + codec + ",value=" + codec + ",key_gain=" + gains[c % 3] + ",value_gain=" +
                             gains[(c + 1) % 3] + ",residual=4";
    SCOPED_TRACE(spec);
    const Made m = make_cache(spec, small_spec(2, 2, 4, 64, 90, 100 + static_cast<uint64_t>(c)), 7);
    EXPECT_GT(m.cache.coded_tokens(1), 0);
    EXPECT_GT(m.cache.window_tokens(1), 0);
    EXPECT_GT(m.cache.layer(1).pinned, 0) << "sinks stay fp16 in the window";
    EXPECT_EQ(m.cache.layer(1).heads[1].key_mean.size(), c == 0 ? 0u : 64u) << "centring means";
    ent::ContainerOptions o;
    o.chunk_tokens = 32;
    round_trip(m.cache, o, static_cast<uint64_t>(c));
  }
}

// Caches without query-weighted keys are written as format version 1 (what older readers
// accept); with them as version 2, which carries the key channel scales and, before the first
// flush, the pending query energy — so a deserialized cache goes on exactly like the original.
TEST(ContainerRoundTrip, QueryWeightedKeysUseVersion2AndLoseNothing) {
  {
    const Made m = make_cache("preset=quant-k3v2,qweight=0,gain_bits=16", small_spec(2, 2, 4, 64, 90, 41), 5, nullptr, true);
    const auto bytes = ent::serialize(m.cache);
    EXPECT_EQ(ent::read_info(bytes.data(), bytes.size()).format_version, 1);
    round_trip(m.cache, ent::ContainerOptions{}, 41);
  }
  {
    const Made m = make_cache("preset=quant-k3v2", small_spec(2, 2, 4, 64, 90, 42), 5, nullptr, true);
    ASSERT_EQ(m.cache.layer(1).heads[0].key_channel_scale.size(), 64u) << "scales need queries and a flush";
    const auto bytes = ent::serialize(m.cache);
    EXPECT_EQ(ent::read_info(bytes.data(), bytes.size()).format_version, 2);
    round_trip(m.cache, ent::ContainerOptions{}, 42);
  }
  {
    // 6 tokens, means from 8: nothing flushed yet, the query energy is still pending.
    synth::SyntheticSpec s = small_spec(2, 2, 4, 64, 40, 43);
    // Reference: make_cache compresses tokens 0..5 and appends 6..39 (flushing on the way).
    Made p = make_cache("preset=quant-k3v2,residual=0", s, 34, nullptr, true);
    Made fresh;
    fresh.kv = synth::make_synthetic_kv(s);
    const Config cfg = Config::parse("preset=quant-k3v2,residual=0,mean_tokens=8");
    fresh.compressor = std::make_unique<KVCompressor>(ModelShape{s.n_layers, s.n_kv_heads, s.n_q_heads, s.head_dim}, cfg);
    SequenceKV seq;
    std::vector<LayerQueries> qs;
    for (int l = 0; l < s.n_layers; ++l) {
      seq.layers.push_back({TensorView::nhd(fresh.kv.keys[static_cast<size_t>(l)].data(), DType::kF32, 6, s.n_kv_heads, s.head_dim),
                            TensorView::nhd(fresh.kv.values[static_cast<size_t>(l)].data(), DType::kF32, 6, s.n_kv_heads, s.head_dim)});
      qs.push_back({TensorView::nhd(fresh.kv.queries[static_cast<size_t>(l)].data(), DType::kF32, s.obs_window, s.n_q_heads, s.head_dim),
                    fresh.kv.query_positions.data()});
    }
    CompressedKV pending = fresh.compressor->compress(seq, &qs);
    ASSERT_EQ(pending.layer(0).query_energy.size(), 2u) << "energy waits for the first flush";
    ASSERT_TRUE(pending.layer(0).heads[0].key_channel_scale.empty());
    const auto bytes = ent::serialize(pending);
    EXPECT_EQ(ent::read_info(bytes.data(), bytes.size()).format_version, 2);
    ent::DeserializeOptions same_codecs;
    same_codecs.codecs = pending.shared_codecs();  // append needs the compressor's codecs
    CompressedKV back = deser(bytes, same_codecs);
    expect_cache_eq(pending, back);
    // Appending the same tokens to both flushes them with the same scales and codes.
    const size_t row = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.head_dim);
    for (int t = 6; t < s.tokens; ++t)
      for (int l = 0; l < s.n_layers; ++l) {
        const float* k = &fresh.kv.keys[static_cast<size_t>(l)][t * row];
        const float* v = &fresh.kv.values[static_cast<size_t>(l)][t * row];
        fresh.compressor->append(pending, l, k, v, t);
        fresh.compressor->append(back, l, k, v, t);
      }
    ASSERT_EQ(pending.layer(1).heads[1].key_channel_scale.size(), 64u);
    expect_cache_eq(pending, back);
    expect_cache_eq(pending, p.cache);  // = prefill of 6 + appends, built by make_cache
  }
}

// 8-bit gains (version 2): every preset with eviction and windows, alone and with
// query-weighted keys, full and partial reads.
TEST(ContainerRoundTrip, EightBitGains) {
  int i = 0;
  for (const char* preset : {"quant-k3v2", "quant-k4v2", "asym", "max"})
    for (const char* qw : {"0", "1"}) {
      const std::string spec = std::string("preset=") + preset + ",gain_bits=8,qweight=" + qw + ",residual=5,recent=8,sinks=2";
      SCOPED_TRACE(spec);
      const Made m = make_cache(spec, small_spec(2, 2, 4, 64, 150, 700 + static_cast<uint64_t>(i)), 13, nullptr, true);
      ASSERT_GT(m.cache.coded_tokens(1), 0);
      ASSERT_EQ(m.cache.layer(1).heads[0].key_gain_codes.size(), static_cast<size_t>(m.cache.coded_tokens(1)));
      ASSERT_TRUE(m.cache.layer(1).heads[0].key_gains.empty());
      ASSERT_NE(m.cache.layer(1).heads[0].key_gain_ref, 0);
      const auto bytes = ent::serialize(m.cache);
      EXPECT_EQ(ent::read_info(bytes.data(), bytes.size()).format_version, 2);
      round_trip(m.cache, ent::ContainerOptions{}, 700 + static_cast<uint64_t>(i));
      ent::ContainerOptions small;
      small.chunk_tokens = 9;
      round_trip(m.cache, small, 800 + static_cast<uint64_t>(i));
      const auto b2 = ent::serialize(m.cache, small);
      const CompressedKV full = deser(b2);
      for (int l = 0; l < 2; ++l)
        expect_layer_eq(slice(full, l, 20, 61), ent::deserialize_tokens(b2.data(), b2.size(), l, 20, 61), "partial");
      ++i;
    }
}

TEST(ContainerRoundTrip, EveryPresetWithEvictionAndWindows) {
  std::stringstream names(Config::preset_names());
  std::string name;
  int i = 0;
  while (std::getline(names, name, ',')) {
    name.erase(0, name.find_first_not_of(' '));
    const std::string spec = "preset=" + name + ",residual=8,flush=16,recent=8,sinks=2";
    SCOPED_TRACE(spec);
    const Made m = make_cache(spec, small_spec(3, 2, 4, 64, 160, 200 + static_cast<uint64_t>(i)), 21);
    EXPECT_GT(m.cache.window_tokens(1), 0) << "the test wants a residual window";
    EXPECT_GT(m.cache.coded_tokens(1), 0) << "the test wants coded tokens";
    round_trip(m.cache, ent::ContainerOptions{}, static_cast<uint64_t>(i));
    ent::ContainerOptions small;
    small.chunk_tokens = 7;
    round_trip(m.cache, small, static_cast<uint64_t>(i));
    ++i;
  }
  EXPECT_EQ(i, 10);
}

TEST(ContainerRoundTrip, PerHeadPositionsPostRopeScaledRopeHeadDims) {
  int i = 0;
  for (int d : {64, 80, 96, 128, 256}) {
    Config cfg = Config::parse("key=rvq4,value=vor3,evict=0.5,per_head=1,rope=post,protect=1,residual=3,flush=8,"
                               "recent=4,sinks=1,key_scale=1.1,value_scale=0.9");
    cfg.rope.scaling = d == 96 ? transform::RopeScaling::kYarn : transform::RopeScaling::kLlama3;
    cfg.rope.factor = 8.0;
    cfg.rope.original_max_position = 64;
    cfg.rope.rotary_dim = d == 80 ? 64 : 0;
    cfg.softmax_scale = 0.07f;
    cfg.rotation_seed = 0xABCDEF12345ull + static_cast<uint64_t>(d);
    cfg.mean_tokens = 8;
    SCOPED_TRACE("head_dim " + std::to_string(d));
    Made m = make_cache("", small_spec(3, 4, 8, d, 70, 300 + static_cast<uint64_t>(d)), 5, &cfg);
    ASSERT_TRUE(m.cache.layout().per_head_positions);
    thin_set(m.cache, 1, 1);  // make sure the sets differ in size and content
    thin_set(m.cache, 2, 3);
    EXPECT_NE(m.cache.positions(1, 0), m.cache.positions(1, 1));
    ent::ContainerOptions o;
    o.chunk_tokens = 16;
    o.adaptive = (i++ % 2) == 1;
    round_trip(m.cache, o, static_cast<uint64_t>(d));
  }
}

TEST(ContainerRoundTrip, ChunkSizesTransformsAndLevels) {
  const Made m = make_cache("preset=high,residual=5", small_spec(2, 2, 4, 64, 130, 9), 11);
  const std::vector<uint8_t> reference = ent::serialize(m.cache);
  for (int chunk : {1, 2, 7, 64, 256, 1 << 20})
    for (int level : {-3, 0, 1, 3, 9}) {
      ent::ContainerOptions o;
      o.chunk_tokens = chunk;
      o.zstd_level = level;
      const auto bytes = ent::serialize(m.cache, o);
      expect_cache_eq(m.cache, deser(bytes));
      EXPECT_EQ(ent::read_info(bytes.data(), bytes.size()).chunk_tokens, chunk);
    }
  for (int t = 0; t < ent::kTransformCount; ++t) {
    const auto tr = static_cast<ent::Transform>(t);
    ent::ContainerOptions o;
    o.transforms = {tr, tr, tr, tr, tr};
    o.chunk_tokens = 40;
    expect_cache_eq(m.cache, deser(ent::serialize(m.cache, o)));
  }
  ent::ContainerOptions every_gain;  // keeping every zstd frame that saves a byte: never larger
  every_gain.min_zstd_saving = 0;
  const auto eager = ent::serialize(m.cache, every_gain);
  expect_cache_eq(m.cache, deser(eager));
  EXPECT_LE(eager.size(), reference.size());
  ent::ContainerOptions stored_only;  // no frame kept: every stream stored
  stored_only.min_zstd_saving = 1;
  const auto stored = ent::serialize(m.cache, stored_only);
  expect_cache_eq(m.cache, deser(stored));
  EXPECT_GE(stored.size(), reference.size());
  ent::ContainerOptions a;
  a.adaptive = true;
  const auto adaptive = ent::serialize(m.cache, a);
  expect_cache_eq(m.cache, deser(adaptive));
  EXPECT_LE(adaptive.size(), reference.size()) << "adaptive keeps the smallest transform per stream";
}

TEST(ContainerRoundTrip, EmptyCaches) {
  // No tokens at all.
  const Made m = make_cache("preset=quant-k3v2", small_spec(2, 2, 4, 64, 0, 5));
  const auto bytes = ent::serialize(m.cache);
  const auto info = ent::read_info(bytes.data(), bytes.size());
  EXPECT_EQ(info.n_chunks, 0);
  round_trip(m.cache, {}, 1);
  // One token (window only), and zero layers.
  const Made one = make_cache("preset=quant-k2v2,residual=4", small_spec(1, 1, 1, 64, 1, 6));
  round_trip(one.cache, {}, 2);
  CacheLayout L;
  L.n_layers = 0;
  L.n_kv_heads = 1;
  L.n_q_heads = 1;
  L.head_dim = 64;
  const CompressedKV none(std::make_shared<const CacheCodecs>(L));
  const auto b0 = ent::serialize(none);
  const CompressedKV back = deser(b0);
  EXPECT_EQ(back.n_layers(), 0);
  expect_layout_eq(none.layout(), back.layout());
}

TEST(ContainerRoundTrip, DeterministicAcrossApis) {
  const Made m = make_cache("preset=asym,residual=6", small_spec(2, 2, 4, 64, 120, 17), 9);
  ent::ContainerOptions o;
  o.chunk_tokens = 33;
  const auto a = ent::serialize(m.cache, o);
  const auto b = ent::serialize(m.cache, o);
  EXPECT_EQ(a, b);
  std::vector<uint8_t> buf(a.size() + 10, 0xEE);
  EXPECT_EQ(ent::serialize(m.cache, o, buf.data(), buf.size()), a.size());
  EXPECT_TRUE(std::equal(a.begin(), a.end(), buf.begin()));
  EXPECT_EQ(buf[a.size()], 0xEE) << "wrote past the container";
  std::ostringstream os;
  EXPECT_EQ(ent::serialize(m.cache, o, os), a.size());
  const std::string s = os.str();
  EXPECT_EQ(std::vector<uint8_t>(s.begin(), s.end()), a);
  expect_error([&] { ent::serialize(m.cache, o, buf.data(), a.size() - 1); }, std::to_string(a.size()));
  // A compressor on an identical config makes an identical cache and identical bytes.
  const Made m2 = make_cache("preset=asym,residual=6", small_spec(2, 2, 4, 64, 120, 17), 9);
  EXPECT_EQ(ent::serialize(m2.cache, o), a);
}

TEST(ContainerRoundTrip, ReusesGivenCodecsSoTheCompressorCanAppend) {
  const Made m = make_cache("preset=quant-k3v2,residual=4,flush=8", small_spec(2, 2, 4, 64, 60, 23), 3);
  const auto bytes = ent::serialize(m.cache);
  ent::DeserializeOptions o;
  o.codecs = m.cache.shared_codecs();
  CompressedKV back = deser(bytes, o);
  EXPECT_EQ(back.shared_codecs(), m.cache.shared_codecs());
  CompressedKV orig = m.cache;
  const size_t row = 2 * 64;
  std::vector<float> k(row, 0.25f), v(row, -0.5f);
  for (int t = 60; t < 75; ++t)
    for (int l = 0; l < 2; ++l) {
      m.compressor->append(back, l, k.data(), v.data(), t);
      m.compressor->append(orig, l, k.data(), v.data(), t);
    }
  expect_cache_eq(orig, back);
  // Codecs of another layout are refused, naming the field.
  const Made other = make_cache("preset=quant-k2v2", small_spec(2, 2, 4, 64, 10, 1));
  o.codecs = other.cache.shared_codecs();
  expect_error([&] { deser(bytes, o); }, "key_codec[0]");
}

TEST(ContainerRoundTrip, LayoutDifferenceNamesTheField) {
  const Made m = make_cache("preset=quant-k3v2", small_spec(2, 2, 4, 64, 8, 1));
  const CacheLayout a = m.cache.layout();
  EXPECT_EQ(ent::layout_difference(a, a), "");
  auto changed = [&](auto&& edit, const std::string& field) {
    CacheLayout b = a;
    edit(b);
    const std::string d = ent::layout_difference(a, b);
    EXPECT_EQ(d.rfind(field, 0), 0u) << "'" << d << "' should start with " << field;
  };
  changed([](CacheLayout& b) { b.head_dim = 128; }, "head_dim");
  changed([](CacheLayout& b) { b.value_codec[1] = quant::Codec::kBall3; }, "value_codec[1]");
  changed([](CacheLayout& b) { b.rotation_seed ^= 1; }, "rotation_seed");
  changed([](CacheLayout& b) { b.softmax_scale = -0.0f; }, "softmax_scale");
  changed([](CacheLayout& b) { b.rope.beta_slow = 2.0; }, "rope.beta_slow");
  changed([](CacheLayout& b) { b.per_head_positions = true; }, "per_head_positions");
}

// ---- partial reads ------------------------------------------------------------------------------------

TEST(ContainerPartialRead, LayersAndTokenRangesEqualTheFullRead) {
  for (const char* spec : {"preset=high,residual=6,flush=8", "key=ball4,value=e8p2,evict=0.3,per_head=1,residual=3"}) {
    SCOPED_TRACE(spec);
    const Made m = make_cache(spec, small_spec(3, 2, 4, 64, 150, 31), 13);
    ent::ContainerOptions o;
    o.chunk_tokens = 16;
    const auto bytes = ent::serialize(m.cache, o);
    const CompressedKV full = deser(bytes);
    const auto info = ent::read_info(bytes.data(), bytes.size());
    for (int l = 0; l < 3; ++l) {
      expect_layer_eq(full.layer(l), ent::deserialize_layer(bytes.data(), bytes.size(), l), "layer " + std::to_string(l));
      const int64_t n = std::max(info.layers[static_cast<size_t>(l)].coded_tokens[0] + info.layers[static_cast<size_t>(l)].window_tokens[0],
                                 info.layers[static_cast<size_t>(l)].coded_tokens.back() +
                                     info.layers[static_cast<size_t>(l)].window_tokens.back());
      const std::vector<std::pair<int64_t, int64_t>> ranges = {
          {0, 0}, {0, 1}, {0, 16}, {5, 70}, {15, 17}, {16, 32}, {n - 3, n}, {n - 1, n + 50}, {n, n + 5}, {n + 100, n + 200},
          {0, std::numeric_limits<int64_t>::max()}, {33, 34}};
      for (const auto& [b, e] : ranges) {
        if (b < 0 || b > e) continue;
        const LayerData part = ent::deserialize_tokens(bytes.data(), bytes.size(), l, b, e);
        expect_layer_eq(slice(full, l, b, e), part,
                        "layer " + std::to_string(l) + " tokens [" + std::to_string(b) + ", " + std::to_string(e) + ")");
      }
    }
    expect_error([&] { ent::deserialize_layer(bytes.data(), bytes.size(), 3); }, "layer 3 is out of range");
    expect_error([&] { ent::deserialize_tokens(bytes.data(), bytes.size(), 0, 5, 4); }, "0 <= begin <= end");
    expect_error([&] { ent::deserialize_tokens(bytes.data(), bytes.size(), -1, 0, 4); }, "out of range");
  }
}

TEST(ContainerPartialRead, InfoDescribesTheHeader) {
  const Made m = make_cache("preset=high,residual=4", small_spec(2, 2, 4, 64, 90, 41), 6);
  ent::ContainerOptions o;
  o.chunk_tokens = 20;
  const auto bytes = ent::serialize(m.cache, o);
  const auto info = ent::read_info(bytes.data(), bytes.size());
  EXPECT_EQ(info.format_version, 2);  // the lowest version holding 8-bit gains (pre-RoPE keys)
  EXPECT_EQ(info.library_version, kVersion);
  EXPECT_EQ(info.kind, ent::ContainerKind::kCompressedCache);
  EXPECT_EQ(info.total_bytes, bytes.size());
  expect_layout_eq(m.cache.layout(), info.layout);
  ASSERT_EQ(info.layers.size(), 2u);
  int64_t chunks = 0;
  for (int l = 0; l < 2; ++l) {
    const auto& li = info.layers[static_cast<size_t>(l)];
    EXPECT_EQ(li.original_tokens, m.cache.layer(l).original_tokens);
    EXPECT_EQ(li.coded_tokens[0], m.cache.coded_tokens(l));
    EXPECT_EQ(li.window_tokens[0], m.cache.window_tokens(l));
    EXPECT_EQ(li.first_chunk, chunks);
    EXPECT_EQ(li.n_chunks, (m.cache.stored_tokens(l) + 19) / 20);
    chunks += li.n_chunks;
  }
  EXPECT_EQ(info.n_chunks, chunks);
  EXPECT_GE(info.decoded_bytes, m.cache.bytes() - m.cache.layout().descriptor_bytes());
}

// bytes() counts the descriptor as the container writes it: a version-1 header is exactly the
// 48-byte prefix + descriptor_bytes() + per layer its chunk range (16 bytes) and per head the two
// mean lengths and the fp16 means + 16 bytes per directory entry + the CRC. Both position-set modes.
TEST(ContainerHeader, DescriptorBytesMatchTheSerializedHeader) {
  for (const char* spec : {"preset=high,residual=4,gain_bits=16,qweight=0",
                           "preset=high,residual=4,gain_bits=16,qweight=0,per_head=1"}) {
    const Made m = make_cache(spec, small_spec(3, 2, 4, 64, 90, 43), 6);
    const auto bytes = ent::serialize(m.cache);
    const auto info = ent::read_info(bytes.data(), bytes.size());
    ASSERT_EQ(info.format_version, 1) << spec;
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, bytes.data() + 16, sizeof header_bytes);
    const auto& L = m.cache.layout();
    size_t means = 0;
    for (int l = 0; l < L.n_layers; ++l)
      for (const auto& h : m.cache.layer(l).heads) means += 4 + 2 * (h.key_mean.size() + h.value_mean.size());
    EXPECT_EQ(header_bytes, 48 + L.descriptor_bytes() + 16 * static_cast<size_t>(L.n_layers) + means +
                                16 * static_cast<size_t>(info.n_chunks) + 4)
        << spec;
    EXPECT_EQ(L.position_sets(), L.per_head_positions ? 2u : 1u) << spec;
  }
}

// ---- allocation bound ------------------------------------------------------------------------------------

TEST(ContainerLimits, MaxDecodedBytesIsEnforcedBeforeAllocation) {
  const Made m = make_cache("preset=quant-k3v2", small_spec(2, 2, 4, 64, 64, 51));
  const auto bytes = ent::serialize(m.cache);
  const auto info = ent::read_info(bytes.data(), bytes.size());
  ent::DeserializeOptions o;
  o.max_decoded_bytes = info.decoded_bytes - 1;
  expect_error([&] { deser(bytes, o); }, "max_decoded_bytes");
  o.max_decoded_bytes = info.decoded_bytes * 4;
  expect_cache_eq(m.cache, deser(bytes, o));
  // A header claiming 2^20 coded tokens in layer 0 (still one chunk; CRC fixed) is refused by a
  // bound below what that needs before any chunk is read; above it, the chunk's sizes disagree.
  ent::ContainerOptions one_chunk;
  one_chunk.chunk_tokens = 1 << 20;
  auto big = ent::serialize(m.cache, one_chunk);
  const size_t table = kLayoutAt + 128 + 2 * 2;  // layer table, after the per-layer codecs
  put_at<int64_t>(big, table, int64_t{1} << 21);        // original_tokens
  const uint64_t window = get_at<uint64_t>(big, table + 40);
  put_at<uint64_t>(big, table + 32, (uint64_t{1} << 20) - window);  // coded tokens of set 0: one chunk
  fix_header_crc(big);
  const auto big_info = ent::read_info(big.data(), big.size());
  EXPECT_GT(big_info.decoded_bytes, uint64_t{1} << 26);
  o.max_decoded_bytes = uint64_t{1} << 26;
  expect_error([&] { deser(big, o); }, "max_decoded_bytes");
  expect_error([&] { deser(big); }, "the layer table implies");
}

// ---- corruption --------------------------------------------------------------------------------------

class ContainerCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    made_ = make_cache("preset=high,residual=4,flush=8", small_spec(2, 2, 4, 64, 80, 61), 5);
    ent::ContainerOptions o;
    o.chunk_tokens = 24;
    bytes_ = ent::serialize(made_.cache, o);
    codecs_.codecs = made_.cache.shared_codecs();
  }
  Made made_;
  std::vector<uint8_t> bytes_;
  ent::DeserializeOptions codecs_;
};

TEST_F(ContainerCorruption, EveryTruncationIsRejected) {
  for (size_t n = 0; n < bytes_.size(); ++n) {
    std::vector<uint8_t> t(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      (void)ent::deserialize(t.data(), t.size());
      ADD_FAILURE() << "truncation to " << n << " bytes was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("too short") != std::string::npos ||
                  msg.find("header_bytes") != std::string::npos)
          << n << ": " << msg;
    }
  }
  expect_error([&] { ent::deserialize(nullptr, 0); }, "too short");
}

TEST_F(ContainerCorruption, TrailingBytesAreRejected) {
  auto t = bytes_;
  t.push_back(0);
  expect_error([&] { deser(t); }, "1 trailing bytes");
}

TEST_F(ContainerCorruption, EveryHeaderBitFlipIsRejected) {
  const size_t hb = header_bytes(bytes_);
  for (size_t byte = 0; byte < hb; ++byte)
    for (int bit = 0; bit < 8; ++bit) {
      auto t = bytes_;
      t[byte] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_THROW(deser(t), Error) << "flip of bit " << bit << " of header byte " << byte;
    }
}

TEST_F(ContainerCorruption, ChunkBitFlipsFailTheChecksum) {
  auto rng = test::seeded_rng(404);
  const size_t hb = header_bytes(bytes_);
  for (int i = 0; i < 1500; ++i) {
    auto t = bytes_;
    const size_t byte = hb + rng() % (t.size() - hb);
    t[byte] ^= static_cast<uint8_t>(1u << (rng() % 8));
    expect_error([&] { deser(t); }, "chunk", "byte " + std::to_string(byte));
  }
}

TEST_F(ContainerCorruption, WithoutChecksumsDamageIsDetectedOrHarmless) {
  // Structural checks alone: each flip either raises e8kv::Error or yields a cache of the same
  // shape (the flipped bit was in code or gain data). Never a crash (CI runs this under ASan).
  auto rng = test::seeded_rng(405);
  ent::DeserializeOptions o = codecs_;
  o.verify_checksums = false;
  int rejected = 0, accepted = 0;
  for (int i = 0; i < 400; ++i) {
    auto t = bytes_;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) t[rng() % t.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    try {
      const CompressedKV c = deser(t, o);
      ++accepted;
      ASSERT_EQ(c.n_layers(), 2);
      std::vector<float> q(4 * 64, 0.1f), out(4 * 64);
      if (every_head_has_tokens(c, 0)) e8kv::attend(c, 0, q.data(), out.data());  // usable, whatever the data
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(rejected + accepted, 400);
}

TEST_F(ContainerCorruption, VersionMagicAndKindAreChecked) {
  auto t = bytes_;
  ASSERT_EQ(ent::read_info(t.data(), t.size()).format_version, 2) << "the fixture uses query-weighted keys";
  put_at<uint16_t>(t, 8, static_cast<uint16_t>(ent::kFormatVersion + 1));
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "format version " + std::to_string(ent::kFormatVersion + 1) + " is not supported");
  // In version 1 the query_weighted_keys byte is reserved and must be 0.
  const Made v1 = make_cache("preset=high,residual=4,flush=8,qweight=0,gain_bits=16", small_spec(2, 2, 4, 64, 80, 61), 5);
  t = ent::serialize(v1.cache);
  ASSERT_EQ(ent::read_info(t.data(), t.size()).format_version, 1);
  t[kLayoutAt + 21] = 1;
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "reserved");
  put_at<uint16_t>(t, 8, 0);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "format version 0 is not supported");
  t = bytes_;
  t[1] = 'X';
  expect_error([&] { deser(t); }, "bad magic");
  t = bytes_;
  put_at<uint16_t>(t, 10, 3);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "kind 3 is unknown");
  t = bytes_;
  put_at<uint16_t>(t, 10, 2);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "deserialize_plain");
  t = bytes_;
  put_at<uint32_t>(t, 12, 1);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "flags");
  // A different writer library version is fine (informational).
  t = bytes_;
  put_at<uint32_t>(t, 32, 99999);
  fix_header_crc(t);
  EXPECT_EQ(ent::read_info(t.data(), t.size()).library_version, 99999);
  expect_cache_eq(made_.cache, deser(t));
}

TEST_F(ContainerCorruption, HeaderFieldsAndEnumsAreChecked) {
  struct Case {
    size_t offset;
    int size;
    uint64_t value;
    const char* needle;
  };
  const size_t L = kLayoutAt;
  const Case cases[] = {
      {36, 4, 0, "chunk_tokens 0"},
      {36, 4, (1u << 20) + 1, "chunk_tokens"},
      {40, 8, 1u << 30, "n_chunks"},
      {L + 0, 4, 5000, "n_layers 5000"},
      {L + 4, 4, 0, "n_kv_heads 0"},
      {L + 8, 4, 3, "n_q_heads 3"},
      {L + 12, 4, 72, "head_dim 72 is not supported"},
      {L + 16, 1, 3, "key_gain id 3"},
      {L + 17, 1, 7, "value_gain id 7"},
      {L + 18, 1, 2, "keys_pre_rope must be 0 or 1"},
      {L + 19, 1, 9, "per_head_positions must be 0 or 1"},
      {L + 20, 1, 2, "center must be 0 or 1"},
      {L + 21, 1, 2, "query_weighted_keys must be 0 or 1"},
      {L + 22, 1, 1, "gain_bits must be 8 or 16"},
      {L + 23, 1, 1, "reserved"},
      {L + 24, 4, 0xFFC00000u, "key_scale"},  // NaN
      {L + 28, 4, 0, "value_scale"},
      {L + 32, 4, 0x7F800000u, "softmax_scale"},  // +Inf
      {L + 36, 4, 0xFFFFFFFFu, "residual_length"},
      {L + 40, 4, 0, "flush_block"},
      {L + 44, 4, 0, "mean_tokens"},
      {L + 56, 1, 2, "rope.layout id 2"},
      {L + 57, 1, 5, "rope.scaling id 5"},
      {L + 58, 2, 1, "reserved"},
      {L + 64, 4, 66, "rope.rotary_dim 66"},
      {L + 72, 8, 0x7FF8000000000000ull, "rope parameters must be finite"},
      {L + 128, 1, 12, "key codec id 12 of layer 0"},
      {L + 131, 1, 200, "value codec id 200 of layer 1"},
      {L + 132, 8, 1, "original_tokens 1"},  // below the stored tokens
      {L + 132 + 8, 8, 1000, "pinned 1000"},
      {L + 132 + 8, 8, static_cast<uint64_t>(-1), "pinned -1"},
      {L + 132 + 16, 8, 1, "chunk range"},
      {L + 132 + 32, 8, (uint64_t{1} << 31), "exceed"},
      {L + 132 + 48, 2, 5, "mean lengths 5"},
  };
  for (const auto& c : cases) {
    auto t = bytes_;
    std::memcpy(t.data() + c.offset, &c.value, static_cast<size_t>(c.size));
    fix_header_crc(t);
    expect_error([&] { deser(t); }, c.needle, "offset " + std::to_string(c.offset));
  }
  // header_bytes and total_bytes.
  auto t = bytes_;
  put_at<uint64_t>(t, 16, t.size() + 1);
  expect_error([&] { deser(t); }, "header_bytes");
  t = bytes_;
  put_at<uint64_t>(t, 24, t.size() + 5);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "truncated");
  t = bytes_;
  put_at<uint64_t>(t, 24, t.size() - 5);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "trailing");
  // Directory: an entry that does not follow its predecessor, or overruns the container.
  const size_t n = static_cast<size_t>(get_at<uint64_t>(bytes_, 40));
  const size_t dir = header_bytes(bytes_) - 4 - 16 * n;
  t = bytes_;
  put_at<uint64_t>(t, dir + 16, get_at<uint64_t>(t, dir + 16) + 1);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "chunks follow each other");
  t = bytes_;
  put_at<uint64_t>(t, dir + 8, uint64_t{1} << 60);
  fix_header_crc(t);
  expect_error([&] { deser(t); }, "does not fit");
}

TEST_F(ContainerCorruption, ChunkFieldsAndEnumsAreChecked) {
  const size_t c1 = chunk_offset(bytes_, 1);
  struct Case {
    size_t offset;  // within the chunk
    int size;
    uint64_t value;
    const char* needle;
  };
  const Case cases[] = {
      {0, 1, 'X', "bad chunk magic"},
      {4, 4, 6, "6 streams, expected 7"},
      {8, 4, 0, "should be (1"},
      {12, 4, 1, "should be (1"},
      {16, 8, 7, "should be (1"},
      {24, 8, 3, "disagrees with the directory"},
      {32, 4, 1, "should be"},
      {40, 1, 3, "kind 3, expected 1 (positions)"},
      {41, 1, 6, "transform id 6"},
      {42, 1, 2, "entropy coder id 2"},
      {43, 1, 1, "reserved"},
      {48, 8, 123456, "raw bytes, the layer table implies"},
      {56, 8, 0, "stored size 0 is impossible"},
      {40 + 24 + 16, 8, 1u << 30, "impossible"},
  };
  for (const auto& c : cases) {
    auto t = bytes_;
    std::memcpy(t.data() + c1 + c.offset, &c.value, static_cast<size_t>(c.size));
    fix_chunk_crc(t, c1);
    expect_error([&] { deser(t); }, c.needle, "chunk offset " + std::to_string(c.offset));
  }
  // A flipped CRC alone.
  auto t = bytes_;
  t[c1 + 36] ^= 1;
  expect_error([&] { deser(t); }, "chunk 1: checksum mismatch");
}

TEST_F(ContainerCorruption, DecodedPositionsMustIncrease) {
  // One token per chunk: each positions stream is 4 raw bytes (stored: zstd cannot beat it).
  ent::ContainerOptions o;
  o.chunk_tokens = 1;
  auto t = ent::serialize(made_.cache, o);
  const size_t c0 = chunk_offset(t, 0), c1 = chunk_offset(t, 1);
  ASSERT_EQ(t[c1 + 42], 0) << "the positions stream of a one-token chunk is stored raw";
  const size_t pos1 = c1 + 40 + 7 * 24;
  const int32_t p0 = get_at<int32_t>(t, c0 + 40 + 7 * 24);
  auto u = t;
  put_at<int32_t>(u, pos1, p0);  // repeats the previous position
  fix_chunk_crc(u, c1);
  expect_error([&] { deser(u); }, "strictly increasing");
  u = t;
  put_at<int32_t>(u, c0 + 40 + 7 * 24, -5);
  fix_chunk_crc(u, c0);
  expect_error([&] { deser(u); }, "strictly increasing");
}

TEST_F(ContainerCorruption, ZstdDamageWithoutChecksumsIsAnError) {
  // Find a zstd-coded stream and damage its frame header; checksums off.
  const size_t c0 = chunk_offset(bytes_, 0);
  size_t data = c0 + 40 + 7 * 24;
  for (int s = 0; s < 7; ++s) {
    const size_t desc = c0 + 40 + 24 * static_cast<size_t>(s);
    const uint64_t stored = get_at<uint64_t>(bytes_, desc + 16);
    if (bytes_[desc + 2] == 1) {
      ent::DeserializeOptions o;
      o.verify_checksums = false;
      auto t = bytes_;
      t[data] ^= 0xFF;  // zstd magic
      expect_error([&] { deser(t, o); }, "zstd");
      t = bytes_;
      t[data + stored - 1] ^= 0x5A;  // end of the frame
      EXPECT_THROW(deser(t, o), Error);
      return;
    }
    data += stored;
  }
  FAIL() << "no zstd stream in chunk 0";
}

// ---- writer-side validation --------------------------------------------------------------------------

TEST(ContainerWriter, RefusesInconsistentCachesAndBadOptions) {
  const Made m = make_cache("preset=quant-k3v2,residual=4", small_spec(2, 2, 4, 64, 50, 71));
  {
    CompressedKV c = m.cache;
    e8kv::detail::CacheStorage::layer(c, 1).heads[0].key_codes.pop_back();
    expect_error([&] { ent::serialize(c); }, "layer 1 head 0");
  }
  {
    CompressedKV c = m.cache;
    e8kv::detail::CacheStorage::layer(c, 0).heads[1].value_gain_codes.clear();  // 8-bit gains (the default)
    expect_error([&] { ent::serialize(c); }, "layer 0 head 1");
  }
  {
    CompressedKV c = m.cache;
    e8kv::detail::CacheStorage::layer(c, 0).heads[1].value_gains.assign(c.layer(0).heads[1].value_gain_codes.size(), 0x3C00);
    expect_error([&] { ent::serialize(c); }, "layer 0 head 1");  // fp16 gains in an 8-bit cache
  }
  {
    CompressedKV c = m.cache;
    e8kv::detail::CacheStorage::layer(c, 1).heads[0].key_gain_ref = 0;
    expect_error([&] { ent::serialize(c); }, "8-bit gains need their reference");
  }
  {
    CompressedKV c = m.cache;
    auto& p = e8kv::detail::CacheStorage::layer(c, 0).positions[0];
    std::swap(p[3], p[4]);
    expect_error([&] { ent::serialize(c); }, "strictly increasing");
  }
  {
    CompressedKV c = m.cache;
    e8kv::detail::CacheStorage::layer(c, 1).original_tokens = 3;
    expect_error([&] { ent::serialize(c); }, "original_tokens 3");
  }
  expect_error([] { ent::serialize(CompressedKV{}); }, "empty");
  ent::ContainerOptions o;
  o.chunk_tokens = 0;
  expect_error([&] { ent::serialize(m.cache, o); }, "chunk_tokens");
  o = {};
  o.zstd_level = 23;
  expect_error([&] { ent::serialize(m.cache, o); }, "zstd_level");
  o = {};
  o.transforms.gains = static_cast<ent::Transform>(9);
  expect_error([&] { ent::serialize(m.cache, o); }, "transforms.gains");
  o = {};
  o.min_zstd_saving = 1.5;
  expect_error([&] { ent::serialize(m.cache, o); }, "min_zstd_saving");
}

// ---- plain fp16 / bf16 -------------------------------------------------------------------------------

TEST(ContainerPlain, RoundTripFp16Bf16StridedAndChunked) {
  auto rng = test::seeded_rng(81);
  std::normal_distribution<float> g(0.f, 2.f);
  for (DType dt : {DType::kF16, DType::kBF16})
    for (int tokens : {0, 1, 37, 300}) {
      const int heads = 3, dim = 40;
      // HND storage with a token capacity above `tokens` (strided view), two tensors.
      const int cap = tokens + 5;
      std::vector<std::vector<uint16_t>> store(2, std::vector<uint16_t>(static_cast<size_t>(heads * cap * dim)));
      for (auto& s : store)
        for (auto& x : s) x = dt == DType::kF16 ? float_to_fp16_bits(g(rng)) : float_to_bf16_bits(g(rng));
      std::vector<TensorView> views;
      for (const auto& s : store) views.push_back(TensorView::hnd(s.data(), dt, tokens, heads, dim, cap));
      for (int chunk : {1, 16, 256}) {
        ent::ContainerOptions o;
        o.chunk_tokens = chunk;
        const auto bytes = ent::serialize_plain(views, o);
        EXPECT_EQ(ent::serialized_plain_size(views, o), bytes.size());
        const ent::PlainCache p = ent::deserialize_plain(bytes.data(), bytes.size());
        EXPECT_EQ(p.dtype, dt);
        EXPECT_EQ(p.tokens, tokens);
        EXPECT_EQ(p.heads, heads);
        EXPECT_EQ(p.head_dim, dim);
        ASSERT_EQ(p.tensors.size(), 2u);
        for (size_t i = 0; i < 2; ++i) {
          ASSERT_EQ(p.tensors[i].size(), static_cast<size_t>(tokens * heads * dim));
          for (int t = 0; t < tokens; ++t)
            for (int h = 0; h < heads; ++h)
              for (int e = 0; e < dim; ++e)
                ASSERT_EQ(p.tensors[i][static_cast<size_t>((t * heads + h) * dim + e)],
                          store[i][static_cast<size_t>((h * cap + t) * dim + e)]);
        }
        std::vector<uint8_t> buf(bytes.size());
        EXPECT_EQ(ent::serialize_plain(views, o, buf.data(), buf.size()), bytes.size());
        EXPECT_EQ(buf, bytes);
      }
    }
}

TEST(ContainerPlain, RejectsBadInputAndCorruption) {
  std::vector<float> f32(2 * 2 * 8);
  std::vector<uint16_t> a(2 * 2 * 8), b(3 * 2 * 8);
  expect_error([&] { ent::serialize_plain({TensorView::nhd(f32.data(), DType::kF32, 2, 2, 8)}); }, "f32");
  expect_error(
      [&] {
        ent::serialize_plain({TensorView::nhd(a.data(), DType::kF16, 2, 2, 8), TensorView::nhd(b.data(), DType::kF16, 3, 2, 8)});
      },
      "tensor 1 differs");
  const auto empty = ent::serialize_plain({});
  EXPECT_EQ(ent::deserialize_plain(empty.data(), empty.size()).tensors.size(), 0u);
  const auto bytes = ent::serialize_plain({TensorView::nhd(a.data(), DType::kF16, 2, 2, 8)});
  expect_error([&] { deser(bytes); }, "use deserialize_plain");
  const Made m = make_cache("preset=quant-k2v2", small_spec(1, 1, 1, 64, 4, 1));
  const auto cache_bytes = ent::serialize(m.cache);
  expect_error([&] { ent::deserialize_plain(cache_bytes.data(), cache_bytes.size()); }, "use deserialize");
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(ent::deserialize_plain(bytes.data(), n), Error) << n;
  auto t = bytes;
  put_at<uint8_t>(t, 48, 3);
  fix_header_crc(t);
  expect_error([&] { ent::deserialize_plain(t.data(), t.size()); }, "plain dtype id 3");
  t = bytes;
  put_at<uint64_t>(t, 48 + 16, 1000);  // tokens: the chunk count no longer matches
  fix_header_crc(t);
  expect_error([&] { ent::deserialize_plain(t.data(), t.size()); }, "n_chunks");
}

// ---- files, golden files, another process ------------------------------------------------------------

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/e8kv_container_test_" + std::to_string(getpid()) + "_" + name;
}

TEST(ContainerFiles, WriteReadLayerAndInfo) {
  const Made m = make_cache("preset=high,residual=4", small_spec(2, 2, 4, 64, 70, 91), 4);
  const std::string path = temp_path("files.e8kv");
  ent::write_file(path, m.cache);
  expect_cache_eq(m.cache, ent::read_file(path));
  expect_layer_eq(m.cache.layer(1), ent::read_file_layer(path, 1), "file layer 1");
  EXPECT_EQ(ent::read_file_info(path).total_bytes, ent::serialized_size(m.cache));
  // A truncated file is rejected.
  {
    const auto bytes = ent::serialize(m.cache);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() - 10));
  }
  expect_error([&] { ent::read_file(path); }, "truncated");
  std::remove(path.c_str());
  expect_error([&] { ent::read_file(path); }, "cannot open");
  expect_error([&] { ent::write_file("/nonexistent-dir/x.e8kv", m.cache); }, "cannot open");
}

std::string data_dir() { return E8KV_TEST_DATA_DIR; }

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

TEST(ContainerGolden, FilesOfFormatVersion1ReadBack) {
  std::ifstream manifest(data_dir() + "/golden.txt");
  ASSERT_TRUE(manifest.good()) << "tests/data/golden.txt is missing";
  std::string line;
  int files = 0;
  while (std::getline(manifest, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string name, kind, digest, codecs;
    int layers, kv_heads, q_heads, head_dim, per_head, pre_rope;
    ASSERT_TRUE(in >> name >> kind >> digest >> layers >> kv_heads >> q_heads >> head_dim >> per_head >> pre_rope >> codecs)
        << line;
    SCOPED_TRACE(name);
    const auto bytes = read_all(data_dir() + "/" + name);
    ASSERT_FALSE(bytes.empty());
    const auto info = ent::read_info(bytes.data(), bytes.size());
    EXPECT_EQ(info.format_version, 1);
    if (kind == "plain") {
      EXPECT_EQ(info.kind, ent::ContainerKind::kPlain);
      const ent::PlainCache p = ent::deserialize_plain(bytes.data(), bytes.size());
      EXPECT_EQ(test::plain_digest(p), digest);
      EXPECT_EQ(static_cast<int>(p.tensors.size()), layers);
      EXPECT_EQ(p.heads, kv_heads);
      EXPECT_EQ(p.head_dim, head_dim);
    } else {
      EXPECT_EQ(info.kind, ent::ContainerKind::kCompressedCache);
      const CompressedKV c = deser(bytes);
      EXPECT_EQ(test::cache_digest(c), digest);
      const CacheLayout& L = c.layout();
      EXPECT_EQ(L.n_layers, layers);
      EXPECT_EQ(L.n_kv_heads, kv_heads);
      EXPECT_EQ(L.n_q_heads, q_heads);
      EXPECT_EQ(L.head_dim, head_dim);
      EXPECT_EQ(L.per_head_positions ? 1 : 0, per_head);
      EXPECT_EQ(static_cast<int>(L.key_frame), pre_rope);
      std::string got;
      for (int l = 0; l < L.n_layers; ++l)
        got += std::string(l ? "," : "") + quant::to_string(L.key_codec[static_cast<size_t>(l)]) + "/" +
               quant::to_string(L.value_codec[static_cast<size_t>(l)]);
      EXPECT_EQ(got, codecs);
      // Partial reads of golden files agree with the full read, and the cache re-serializes.
      for (int l = 0; l < L.n_layers; ++l)
        expect_layer_eq(c.layer(l), ent::deserialize_layer(bytes.data(), bytes.size(), l), "golden layer");
      expect_cache_eq(c, deser(ent::serialize(c)));
      std::vector<float> q(static_cast<size_t>(L.n_q_heads * L.head_dim), 0.05f), out(q.size());
      for (int l = 0; l < L.n_layers; ++l)
        if (every_head_has_tokens(c, l)) e8kv::attend(c, l, q.data(), out.data());
    }
    ++files;
  }
  EXPECT_EQ(files, 4);
}

// Writes the cache to a file in one child process, reads it and attends in a second child
// process, and compares that output with the attention of the original cache in this one.
TEST(ContainerFiles, WrittenAndReadBackInOtherProcesses) {
  const Made m = make_cache("preset=high,residual=8,flush=16", small_spec(3, 2, 8, 128, 140, 97), 12);
  const CacheLayout& L = m.cache.layout();
  const size_t n = static_cast<size_t>(L.n_q_heads * L.head_dim);
  std::vector<float> q(n);
  auto rng = test::seeded_rng(98);
  std::normal_distribution<float> g(0.f, 1.f);
  for (auto& x : q) x = g(rng);
  std::vector<float> expected(n * static_cast<size_t>(L.n_layers));
  for (int l = 0; l < L.n_layers; ++l) e8kv::attend(m.cache, l, q.data(), &expected[n * static_cast<size_t>(l)]);

  const std::string file = temp_path("proc.e8kv"), result = temp_path("proc.out");
  std::fflush(stdout);
  pid_t writer = fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    int rc = 0;
    try {
      ent::write_file(file, m.cache);
    } catch (...) {
      rc = 3;
    }
    _exit(rc);
  }
  int status = 0;
  ASSERT_EQ(waitpid(writer, &status, 0), writer);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer process failed";

  pid_t reader = fork();
  ASSERT_GE(reader, 0);
  if (reader == 0) {
    int rc = 0;
    try {
      const CompressedKV c = ent::read_file(file);  // fresh codecs from the header
      std::vector<float> out(n * static_cast<size_t>(c.n_layers()));
      for (int l = 0; l < c.n_layers(); ++l) e8kv::attend(c, l, q.data(), &out[n * static_cast<size_t>(l)]);
      std::ofstream f(result, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size() * sizeof(float)));
      rc = f.good() ? 0 : 4;
    } catch (...) {
      rc = 5;
    }
    _exit(rc);
  }
  ASSERT_EQ(waitpid(reader, &status, 0), reader);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "reader process failed";
  const auto got = read_all(result);
  ASSERT_EQ(got.size(), expected.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size()), 0) << "attention after the file round trip differs";
  std::remove(file.c_str());
  std::remove(result.c_str());
}

}  // namespace
