// Writer and reader together (include/e8kv/container/container.hpp): every codec, preset, gain
// width and position-set mode survives serialize -> deserialize field by field and attends
// identically; partial reads equal slices of the full read; the writer refuses what it could
// not read back.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "e8kv/version.hpp"
#include "container/container_test_util.hpp"
#include "testing/cache_digest.hpp"

namespace {

using namespace e8kv;
using namespace e8kv::container_test;

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
    const Made m = make_cache("preset=quant-k3v2,qweight=0,gain_bits=16,rope=pre", small_spec(2, 2, 4, 64, 90, 41), 5, nullptr, true);
    const auto bytes = ent::serialize(m.cache);
    EXPECT_EQ(ent::read_info(bytes.data(), bytes.size()).format_version, 1);
    round_trip(m.cache, ent::ContainerOptions{}, 41);
  }
  {
    const Made m = make_cache("preset=quant-k3v2,rope=pre", small_spec(2, 2, 4, 64, 90, 42), 5, nullptr, true);
    ASSERT_EQ(m.cache.layer(1).heads[0].key_channel_scale.size(), 64u) << "scales need queries and a flush";
    const auto bytes = ent::serialize(m.cache);
    EXPECT_EQ(ent::read_info(bytes.data(), bytes.size()).format_version, 2);
    round_trip(m.cache, ent::ContainerOptions{}, 42);
  }
  {
    // 6 tokens, means from 8: nothing flushed yet, the query energy is still pending.
    synth::SyntheticSpec s = small_spec(2, 2, 4, 64, 40, 43);
    // Reference: make_cache compresses tokens 0..5 and appends 6..39 (flushing on the way).
    Made p = make_cache("preset=quant-k3v2,residual=0,rope=pre", s, 34, nullptr, true);
    Made fresh;
    fresh.kv = synth::make_synthetic_kv(s);
    const Config cfg = Config::parse("preset=quant-k3v2,residual=0,mean_tokens=8,rope=pre");
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
      const std::string spec = std::string("preset=") + preset + ",gain_bits=8,qweight=" + qw + ",residual=5,recent=8,sinks=2,rope=pre";
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

// ---- the code tier (format version 5) -------------------------------------------------------------------

// A cache with a code tier from two compress calls (a prefill of `first` tokens, then extend() with
// the rest, which promotes its own tokens after the first chunk's), then `appended` tokens.
Made make_tier_cache(const std::string& spec, const synth::SyntheticSpec& s, int first, int appended) {
  Made m;
  m.kv = synth::make_synthetic_kv(s);
  const Config cfg = Config::parse(spec + ",mean_tokens=8");
  m.compressor = std::make_unique<KVCompressor>(ModelShape{s.n_layers, s.n_kv_heads, s.n_q_heads, s.head_dim}, cfg);
  const int prefill = s.tokens - appended;
  SequenceKV a, b;
  std::vector<LayerQueries> qs;
  for (int l = 0; l < s.n_layers; ++l) {
    const size_t li = static_cast<size_t>(l);
    const TensorView k = TensorView::nhd(m.kv.keys[li].data(), DType::kF32, prefill, s.n_kv_heads, s.head_dim);
    const TensorView v = TensorView::nhd(m.kv.values[li].data(), DType::kF32, prefill, s.n_kv_heads, s.head_dim);
    a.layers.push_back({k.token_slice(0, first), v.token_slice(0, first)});
    b.layers.push_back({k.token_slice(first, prefill - first), v.token_slice(first, prefill - first)});
    qs.push_back({TensorView::nhd(m.kv.queries[li].data(), DType::kF32, s.obs_window, s.n_q_heads, s.head_dim),
                  m.kv.query_positions.data()});
  }
  b.first_position = first;
  m.cache = m.compressor->compress(a, &qs);
  m.compressor->extend(m.cache, b, &qs);
  const size_t row = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.head_dim);
  for (int t = prefill; t < s.tokens; ++t)
    for (int l = 0; l < s.n_layers; ++l)
      m.compressor->append(m.cache, l, &m.kv.keys[static_cast<size_t>(l)][t * row],
                           &m.kv.values[static_cast<size_t>(l)][t * row], t);
  return m;
}

// Caches with a code tier are written as version 5 and come back field by field (tier positions,
// codes and fp16 gains included), with equal content digests and attention; shared and per-head
// position sets, with and without eviction, 8- and 16-bit main gains, two tier codec pairs, an
// fp16 tier beside it; any chunk size (chunks then hold coded, tier and window rows together).
TEST(ContainerRoundTrip, CodeTierUsesVersion5Or6AndLosesNothing) {
  const char* specs[] = {
      "preset=quant-k3v2,code_tier=0.15",
      "preset=quant-k3v2,code_tier=0.15,per_head=1",
      "preset=quant-k3v2,code_tier=0.15,evict=0.3",
      "preset=quant-k3v2,code_tier=0.15,evict=0.3,per_head=1",
      "preset=quant-k3v2,code_tier=0.2,tier_key=rvq3,tier_value=rvq4",
      "preset=quant-k3v2,code_tier=0.1,fp16_tier=0.05,gain_bits=16,qweight=0,evict=0.3",
  };
  int i = 0;
  for (const char* spec_head : specs) {
    for (const char* centring : {"", ",tier_center=0"}) {  // version 6 (centred tier), version 5
      const std::string spec = std::string(spec_head) + ",residual=5,recent=8,sinks=2" + centring;
      SCOPED_TRACE(spec);
      const Made m = make_tier_cache(spec, small_spec(2, 2, 4, 64, 170, 900 + static_cast<uint64_t>(i)), 90, 13);
      const CacheLayout& L = m.cache.layout();
      ASSERT_TRUE(L.has_code_tier());
      for (int l = 0; l < 2; ++l) {
        ASSERT_TRUE(L.layer_has_code_tier(l));
        for (int h = 0; h < 2; ++h) {
          const int64_t n = m.cache.tier_tokens(l, h);
          ASSERT_GT(n, 0) << "layer " << l << " head " << h;
          const auto& hd = m.cache.layer(l).heads[static_cast<size_t>(h)];
          ASSERT_EQ(hd.tier_key_gains.size(), static_cast<size_t>(n));  // fp16, whatever gain_bits says
          ASSERT_EQ(hd.tier_value_codes.size(),
                    static_cast<size_t>(n) * m.cache.codecs().tier_code_bytes(KvKind::kValue));
        }
      }
      // Tier tokens from both chunks: some sit after a coded token of the second chunk's.
      ASSERT_LT(m.cache.tier_positions(1, 0).front(), m.cache.positions(1, 0).back());
      if (L.gain_bits == 8) {
        ASSERT_FALSE(m.cache.layer(1).heads[0].key_gain_codes.empty());
      }
      if (L.per_head_positions) {
        EXPECT_NE(m.cache.tier_positions(1, 0), m.cache.tier_positions(1, 1)) << "the heads' sets differ";
      }
      const auto bytes = ent::serialize(m.cache);
      const auto info = ent::read_info(bytes.data(), bytes.size());
      EXPECT_EQ(info.format_version, L.tier_centered ? 6 : 5);
      EXPECT_EQ(L.tier_centered, *centring == '\0');
      for (int l = 0; l < 2; ++l)
        for (size_t s = 0; s < L.position_sets(); ++s)
          EXPECT_EQ(info.layers[static_cast<size_t>(l)].tier_tokens[s], m.cache.tier_tokens(l, static_cast<int>(s)));
      const CompressedKV back = deser(bytes);
      EXPECT_EQ(test::cache_digest_v5(back), test::cache_digest_v5(m.cache));
      round_trip(m.cache, ent::ContainerOptions{}, 900 + static_cast<uint64_t>(i));
      for (int chunk : {1, 9, 40}) {
        ent::ContainerOptions o;
        o.chunk_tokens = chunk;
        o.adaptive = chunk == 40;
        round_trip(m.cache, o, 950 + static_cast<uint64_t>(i));
      }
      ++i;
    }
  }
}

// A decode node that reads a tier cache with its compressor's codecs goes on exactly like the
// original: appends (which never promote) and a later extend (which does).
TEST(ContainerRoundTrip, CodeTierCacheReadBackExtendsLikeTheOriginal) {
  const synth::SyntheticSpec s = small_spec(2, 2, 4, 64, 160, 931);
  Made m = make_tier_cache("preset=quant-k3v2,code_tier=0.15,evict=0.3,residual=5,recent=8,sinks=2", s, 60, 0);
  ent::DeserializeOptions o;
  o.codecs = m.cache.shared_codecs();
  CompressedKV back = deser(ent::serialize(m.cache), o);
  // Extend both with more tokens (a fresh synthetic sequence's, at later positions) and compare.
  const synth::SyntheticKV more = synth::make_synthetic_kv(small_spec(2, 2, 4, 64, 60, 932));
  SequenceKV chunk;
  std::vector<LayerQueries> qs;
  std::vector<int32_t> qpos;
  for (int32_t p : more.query_positions) qpos.push_back(p + 160);
  for (int l = 0; l < 2; ++l) {
    const size_t li = static_cast<size_t>(l);
    chunk.layers.push_back({TensorView::nhd(more.keys[li].data(), DType::kF32, 60, 2, 64),
                            TensorView::nhd(more.values[li].data(), DType::kF32, 60, 2, 64)});
    qs.push_back({TensorView::nhd(more.queries[li].data(), DType::kF32, s.obs_window, 4, 64), qpos.data()});
  }
  chunk.first_position = 160;
  const int64_t tier_before = m.cache.tier_tokens(1);
  m.compressor->extend(m.cache, chunk, &qs);
  m.compressor->extend(back, chunk, &qs);
  EXPECT_GT(m.cache.tier_tokens(1), tier_before) << "the extend promoted tokens of its own";
  expect_cache_eq(m.cache, back);
  std::vector<float> k(2 * 64, 0.25f), v(2 * 64, -0.5f);
  for (int t = 220; t < 240; ++t)
    for (int l = 0; l < 2; ++l) {
      m.compressor->append(m.cache, l, k.data(), v.data(), t);
      m.compressor->append(back, l, k.data(), v.data(), t);
    }
  expect_cache_eq(m.cache, back);
  round_trip(back, ent::ContainerOptions{}, 933);
}

// The version-5 digest covers what the code tier adds (and the version-2 digest does not), so a
// golden file's digest would catch a reader that loses a tier field.
TEST(ContainerRoundTrip, DigestV5CoversTheCodeTier) {
  const Made m = make_cache("preset=quant-k3v2,code_tier=0.2", small_spec(2, 2, 4, 64, 80, 941));
  ASSERT_GT(m.cache.tier_tokens(0), 0);
  const std::string v5 = test::cache_digest_v5(m.cache), v2 = test::cache_digest_v2(m.cache);
  auto changed = [&](auto&& edit, const char* what) {
    CompressedKV c = m.cache;
    edit(e8kv::detail::CacheStorage::layer(c, 0));
    EXPECT_NE(test::cache_digest_v5(c), v5) << what;
    EXPECT_EQ(test::cache_digest_v2(c), v2) << what;
  };
  changed([](LayerData& ld) { ld.tier_positions[0].back() += 1; }, "tier position");
  changed([](LayerData& ld) { ld.heads[1].tier_key_codes[3] ^= 1; }, "tier key code");
  changed([](LayerData& ld) { ld.heads[0].tier_value_codes.back() ^= 0x80; }, "tier value code");
  changed([](LayerData& ld) { ld.heads[1].tier_key_gains[0] ^= 1; }, "tier key gain");
  changed([](LayerData& ld) { ld.heads[0].tier_value_gains.back() ^= 1; }, "tier value gain");
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
    if (name.rfind("tier-", 0) == 0) {
      EXPECT_GT(m.cache.tier_tokens(1), 0) << "the tier presets promote tokens";
    }
    round_trip(m.cache, ent::ContainerOptions{}, static_cast<uint64_t>(i));
    ent::ContainerOptions small;
    small.chunk_tokens = 7;
    round_trip(m.cache, small, static_cast<uint64_t>(i));
    ++i;
  }
  EXPECT_EQ(i, 12);
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
  // serialized_size_bound is exactly this container (every stream stored) and bounds every other.
  EXPECT_EQ(ent::serialized_size_bound(m.cache, stored_only), stored.size());
  EXPECT_LE(eager.size(), ent::serialized_size_bound(m.cache, every_gain));
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

// ---- partial reads ------------------------------------------------------------------------------------

// Stored tokens of a set are its coded tokens, then its code-tier tokens (version 5), then its
// window: ranges across both boundaries, in every layer, shared and per-head sets.
TEST(ContainerPartialRead, LayersAndTokenRangesEqualTheFullRead) {
  for (const char* spec : {"preset=high,residual=6,flush=8", "key=ball4,value=e8p2,evict=0.3,per_head=1,residual=3",
                           "preset=quant-k3v2,code_tier=0.2,evict=0.3,residual=6",
                           "preset=quant-k3v2,code_tier=0.2,fp16_tier=0.05,per_head=1,residual=3"}) {
    SCOPED_TRACE(spec);
    const Made m = make_cache(spec, small_spec(3, 2, 4, 64, 150, 31), 13);
    ent::ContainerOptions o;
    o.chunk_tokens = 16;
    const auto bytes = ent::serialize(m.cache, o);
    const CompressedKV full = deser(bytes);
    const auto info = ent::read_info(bytes.data(), bytes.size());
    for (int l = 0; l < 3; ++l) {
      expect_layer_eq(full.layer(l), ent::deserialize_layer(bytes.data(), bytes.size(), l), "layer " + std::to_string(l));
      const auto& li = info.layers[static_cast<size_t>(l)];
      ASSERT_EQ(li.tier_tokens.size(), li.coded_tokens.size());
      int64_t n = 0;
      for (size_t s = 0; s < li.coded_tokens.size(); ++s)
        n = std::max(n, li.coded_tokens[s] + li.tier_tokens[s] + li.window_tokens[s]);
      const int64_t c = li.coded_tokens.back(), ct = c + li.tier_tokens.back();  // the last set's boundaries
      if (m.cache.layout().has_code_tier()) {
        ASSERT_GT(li.tier_tokens.back(), 1) << "layer " << l;
      }
      const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 0},
                                                               {0, 1},
                                                               {0, 16},
                                                               {5, 70},
                                                               {15, 17},
                                                               {16, 32},
                                                               {n - 3, n},
                                                               {n - 1, n + 50},
                                                               {n, n + 5},
                                                               {n + 100, n + 200},
                                                               {0, std::numeric_limits<int64_t>::max()},
                                                               {33, 34},
                                                               {c - 1, c + 1},
                                                               {c, ct},
                                                               {c + 1, ct - 1},
                                                               {ct - 1, ct + 2},
                                                               {ct, ct + 3},
                                                               {c - 2, ct + 2}};
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
  const Made m = make_cache("preset=high,residual=4,rope=pre", small_spec(2, 2, 4, 64, 90, 41), 6);
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

}  // namespace
