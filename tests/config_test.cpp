// Tests of include/e8kv/config.hpp: Config::parse, describe (which must round-trip parse for
// every field), validate, presets.
#include "e8kv/config.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "e8kv/compressor.hpp"
#include "e8kv/error.hpp"
#include "container/container_test_util.hpp"  // expect_layout_eq
#include "testing/test_util.hpp"

namespace {

using namespace e8kv;

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Every field of Config, compared one by one (floats bit for bit). Written by hand, not from the
// field table, so that a field the table forgets shows up here.
void expect_config_eq(const Config& a, const Config& b, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(a.key_codec, b.key_codec);
  EXPECT_EQ(a.value_codec, b.value_codec);
  EXPECT_EQ(a.key_gain, b.key_gain);
  EXPECT_EQ(a.value_gain, b.value_gain);
  EXPECT_TRUE(same_bits(a.key_scale, b.key_scale)) << a.key_scale << " vs " << b.key_scale;
  EXPECT_TRUE(same_bits(a.value_scale, b.value_scale)) << a.value_scale << " vs " << b.value_scale;
  EXPECT_EQ(a.protect_boundary, b.protect_boundary);
  ASSERT_EQ(a.layer_rates.size(), b.layer_rates.size());
  for (size_t l = 0; l < a.layer_rates.size(); ++l) {
    EXPECT_EQ(a.layer_rates[l].key, b.layer_rates[l].key) << "layer " << l;
    EXPECT_EQ(a.layer_rates[l].value, b.layer_rates[l].value) << "layer " << l;
  }
  EXPECT_TRUE(same_bits(a.rate_budget, b.rate_budget)) << a.rate_budget << " vs " << b.rate_budget;
  EXPECT_TRUE(same_bits(a.index_budget, b.index_budget)) << a.index_budget << " vs " << b.index_budget;
  EXPECT_EQ(a.rotation_seed, b.rotation_seed);
  EXPECT_EQ(a.key_frame, b.key_frame);
  EXPECT_EQ(a.rope.layout, b.rope.layout);
  EXPECT_EQ(a.rope.head_dim, b.rope.head_dim);
  EXPECT_EQ(a.rope.rotary_dim, b.rope.rotary_dim);
  EXPECT_TRUE(same_bits(a.rope.theta, b.rope.theta)) << a.rope.theta << " vs " << b.rope.theta;
  EXPECT_EQ(a.rope.scaling, b.rope.scaling);
  EXPECT_TRUE(same_bits(a.rope.factor, b.rope.factor));
  EXPECT_EQ(a.rope.original_max_position, b.rope.original_max_position);
  EXPECT_TRUE(same_bits(a.rope.low_freq_factor, b.rope.low_freq_factor));
  EXPECT_TRUE(same_bits(a.rope.high_freq_factor, b.rope.high_freq_factor));
  EXPECT_TRUE(same_bits(a.rope.beta_fast, b.rope.beta_fast));
  EXPECT_TRUE(same_bits(a.rope.beta_slow, b.rope.beta_slow));
  EXPECT_TRUE(same_bits(a.rope.attention_factor, b.rope.attention_factor));
  EXPECT_TRUE(same_bits(a.eviction_rate, b.eviction_rate)) << a.eviction_rate << " vs " << b.eviction_rate;
  EXPECT_TRUE(same_bits(a.fp16_tier, b.fp16_tier)) << a.fp16_tier << " vs " << b.fp16_tier;
  EXPECT_TRUE(same_bits(a.code_tier, b.code_tier)) << a.code_tier << " vs " << b.code_tier;
  EXPECT_EQ(a.tier_key_codec, b.tier_key_codec);
  EXPECT_EQ(a.tier_value_codec, b.tier_value_codec);
  EXPECT_EQ(a.sinks, b.sinks);
  EXPECT_EQ(a.recent_window, b.recent_window);
  EXPECT_EQ(a.scorer, b.scorer);
  EXPECT_EQ(a.obs_window, b.obs_window);
  EXPECT_EQ(a.pool_kernel, b.pool_kernel);
  EXPECT_EQ(a.gqa_aggregation, b.gqa_aggregation);
  EXPECT_EQ(a.head_aggregation, b.head_aggregation);
  EXPECT_EQ(a.per_head_selection, b.per_head_selection);
  EXPECT_EQ(a.shared_selection, b.shared_selection);
  EXPECT_EQ(a.layer_adaptive_eviction, b.layer_adaptive_eviction);
  EXPECT_EQ(a.scorer_seed, b.scorer_seed);
  EXPECT_EQ(a.residual_length, b.residual_length);
  EXPECT_EQ(a.flush_block, b.flush_block);
  EXPECT_EQ(a.fp16_sinks, b.fp16_sinks);
  EXPECT_EQ(a.center, b.center);
  EXPECT_EQ(a.mean_tokens, b.mean_tokens);
  EXPECT_EQ(a.query_weighted_keys, b.query_weighted_keys);
  EXPECT_EQ(a.gain_bits, b.gain_bits);
  EXPECT_TRUE(same_bits(a.softmax_scale, b.softmax_scale)) << a.softmax_scale << " vs " << b.softmax_scale;
}

// When Config gains a field this fails: add it to the field table (src/config_fields.hpp)
// so that parse and describe know it, then to expect_config_eq and this mirror.
TEST(ConfigFields, ExpectConfigEqCoversEveryField) {
  struct Mirror {
    quant::Codec key_codec, value_codec;
    quant::GainPolicy key_gain, value_gain;
    float key_scale, value_scale;
    int protect_boundary;
    std::vector<LayerRate> layer_rates;
    double rate_budget;
    double index_budget;
    uint64_t rotation_seed;
    transform::KeyFrame key_frame;
    transform::RopeParams rope;
    double eviction_rate;
    double fp16_tier;
    double code_tier;
    quant::Codec tier_key_codec, tier_value_codec;
    int sinks, recent_window;
    select::ScorerKind scorer;
    int obs_window, pool_kernel;
    select::Aggregation gqa_aggregation, head_aggregation;
    bool per_head_selection, shared_selection, layer_adaptive_eviction;
    uint64_t scorer_seed;
    int residual_length, flush_block;
    bool fp16_sinks, center;
    int mean_tokens;
    bool query_weighted_keys;
    int gain_bits;
    float softmax_scale;
  };
  EXPECT_EQ(sizeof(Config), sizeof(Mirror));
}

std::vector<std::string> preset_list() {
  std::vector<std::string> out;
  std::stringstream names(Config::preset_names());
  std::string name;
  while (std::getline(names, name, ',')) {
    name.erase(0, name.find_first_not_of(' '));
    out.push_back(name);
  }
  return out;
}

template <class F>
void expect_error(F&& f, const std::string& needle, const std::string& context = "") {
  try {
    f();
    ADD_FAILURE() << "no e8kv::Error (expected one mentioning '" << needle << "') " << context;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "' " << context;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "a " << typeid(e).name() << " (" << e.what() << ") instead of e8kv::Error " << context;
  }
}

TEST(ConfigDescribe, RoundTripsEveryPreset) {
  const std::vector<std::string> presets = preset_list();
  EXPECT_EQ(presets.size(), 12u);
  for (const auto& name : presets) {
    const Config c = Config::preset(name);
    const std::string d = c.describe();
    expect_config_eq(c, Config::parse(d), name + ": " + d);
    expect_config_eq(c, Config::parse("preset=" + name), name);
  }
}

// A random valid config for `shape` (Config::validate accepts it): every field anywhere in its
// accepted range, starting from a random preset.
Config random_config(std::mt19937_64& rng, const ModelShape& shape) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  auto real = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  const std::vector<std::string> presets = preset_list();
  Config c = Config::preset(presets[static_cast<size_t>(pick(static_cast<int>(presets.size())))]);
  c.key_codec = static_cast<quant::Codec>(pick(quant::kCodecCount));
  c.value_codec = static_cast<quant::Codec>(pick(quant::kCodecCount));
  c.key_gain = static_cast<quant::GainPolicy>(pick(3));
  c.value_gain = static_cast<quant::GainPolicy>(pick(3));
  c.key_scale = static_cast<float>(real(0.01, 4.0));
  c.value_scale = pick(4) == 0 ? 1.0f : static_cast<float>(real(1e-3, 10.0));
  c.protect_boundary = pick(3);
  c.layer_rates.clear();
  if (pick(3) == 0)
    for (int l = 0; l < shape.n_layers; ++l)
      c.layer_rates.push_back({static_cast<quant::Codec>(pick(quant::kCodecCount)),
                               static_cast<quant::Codec>(pick(quant::kCodecCount))});
  c.rotation_seed = rng();
  c.key_frame = static_cast<transform::KeyFrame>(pick(3));
  c.rope.layout = static_cast<transform::RopeLayout>(pick(2));
  c.rope.head_dim = pick(2) == 0 ? 128 : 0;
  c.rope.rotary_dim = 2 * pick(65);
  c.rope.theta = pick(2) == 0 ? 10000.0 : real(100.0, 1e7);
  c.rope.scaling = static_cast<transform::RopeScaling>(pick(5));
  c.rope.factor = real(1.0, 64.0);
  c.rope.original_max_position = pick(1 << 20);
  c.rope.low_freq_factor = real(0.5, 2.0);
  c.rope.high_freq_factor = real(2.0, 8.0);
  c.rope.beta_fast = real(8.0, 64.0);
  c.rope.beta_slow = real(0.5, 2.0);
  c.rope.attention_factor = pick(2) == 0 ? 0.0 : real(0.5, 2.0);
  c.eviction_rate = pick(3) == 0 ? 0.0 : real(0.0, 0.99);
  c.fp16_tier = pick(3) == 0 ? 0.0 : real(0.0, 0.49);
  c.code_tier = pick(3) == 0 ? 0.0 : real(0.0, 0.49);
  c.tier_key_codec = static_cast<quant::Codec>(1 + pick(quant::kCodecCount - 1));  // block codes
  c.tier_value_codec = static_cast<quant::Codec>(1 + pick(quant::kCodecCount - 1));
  c.sinks = pick(64);
  c.recent_window = pick(512);
  c.scorer = static_cast<select::ScorerKind>(pick(6));
  c.obs_window = 1 + pick(256);
  c.pool_kernel = 1 + 2 * pick(8);
  c.gqa_aggregation = static_cast<select::Aggregation>(pick(2));
  c.head_aggregation = static_cast<select::Aggregation>(pick(2));
  c.per_head_selection = pick(2) == 1;
  c.shared_selection = !c.per_head_selection && pick(2) == 1;  // the two exclude each other
  c.layer_adaptive_eviction = !c.shared_selection && pick(2) == 1;  // so do these
  c.scorer_seed = rng() >> pick(64);
  c.residual_length = pick(1000);
  c.flush_block = 1 + pick(256);
  c.fp16_sinks = pick(2) == 1;
  c.center = pick(2) == 1;
  c.mean_tokens = 1 + pick(1000);
  c.query_weighted_keys = pick(2) == 1;
  c.gain_bits = pick(2) == 0 ? 8 : 16;
  c.softmax_scale = pick(3) == 0 ? 0.f : static_cast<float>(real(-1.0, 1.0));
  return c;
}

const ModelShape kShape{6, 2, 8, 128};

// Random valid configs survive describe -> parse.
TEST(ConfigDescribe, RoundTripsRandomValidConfigs) {
  auto rng = test::seeded_rng(1812);
  for (int i = 0; i < 400; ++i) {
    const Config c = random_config(rng, kShape);
    ASSERT_NO_THROW(c.validate(kShape)) << "the generator made an invalid config: " << c.describe();
    const std::string d = c.describe();
    expect_config_eq(c, Config::parse(d), "config " + std::to_string(i) + ": " + d);
  }
}

// make_layout against the copy KVCompressor's constructor made by hand before the field table.
CacheLayout hand_copy(const Config& c, const ModelShape& shape) {
  CacheLayout L;
  L.n_layers = shape.n_layers;
  L.n_kv_heads = shape.n_kv_heads;
  L.n_q_heads = shape.n_q_heads;
  L.head_dim = shape.head_dim;
  for (int l = 0; l < shape.n_layers; ++l) {
    const LayerRate r = c.layer_rate(l, shape.n_layers);
    L.key_codec.push_back(r.key);
    L.value_codec.push_back(r.value);
  }
  L.key_gain = c.key_gain;
  L.value_gain = c.value_gain;
  L.key_scale = c.key_scale;
  L.value_scale = c.value_scale;
  L.key_frame = c.key_frame;
  L.rope = c.rope;
  L.rope.head_dim = shape.head_dim;
  L.rotation_seed = c.rotation_seed;
  L.per_head_positions = c.per_head_selection;
  L.residual_length = c.residual_length;
  L.flush_block = c.flush_block;
  L.center = c.center;
  L.mean_tokens = c.mean_tokens;
  L.query_weighted_keys = c.query_weighted_keys;
  L.gain_bits = c.gain_bits;
  L.softmax_scale = c.softmax_scale;
  if (c.code_tier != 0.0) {  // tier codecs without a tier fraction make no tier
    L.tier_key_codec = c.tier_key_codec;
    L.tier_value_codec = c.tier_value_codec;
  }
  return L;
}

TEST(ConfigMakeLayout, CopiesEveryLayoutFieldOfEveryPresetAndRandomConfig) {
  for (const auto& name : preset_list()) {
    SCOPED_TRACE(name);
    container_test::expect_layout_eq(hand_copy(Config::preset(name), kShape), make_layout(Config::preset(name), kShape));
  }
  auto rng = test::seeded_rng(1813);
  for (int i = 0; i < 200; ++i) {
    const Config c = random_config(rng, kShape);
    SCOPED_TRACE(c.describe());
    container_test::expect_layout_eq(hand_copy(c, kShape), make_layout(c, kShape));
  }
  Config bad;
  bad.sinks = -1;
  expect_error([&] { make_layout(bad, kShape); }, "sinks");
  expect_error([&] { make_layout(Config(), ModelShape{2, 2, 4, 72}); }, "head_dim");
}

// A compressor's caches carry make_layout's layout (what the compressor is to call).
TEST(ConfigMakeLayout, IsTheLayoutOfTheCompressorsCaches) {
  for (const auto& name : preset_list()) {
    Config c = Config::preset(name);
    c.rope.scaling = transform::RopeScaling::kLinear;
    c.rope.factor = 2.0;
    const ModelShape shape{3, 2, 4, 64};
    const KVCompressor compressor(shape, c);
    std::vector<float> none;
    SequenceKV empty;
    for (int l = 0; l < shape.n_layers; ++l)
      empty.layers.push_back({TensorView::nhd(none.data(), DType::kF32, 0, shape.n_kv_heads, shape.head_dim),
                              TensorView::nhd(none.data(), DType::kF32, 0, shape.n_kv_heads, shape.head_dim)});
    SCOPED_TRACE(name);
    container_test::expect_layout_eq(make_layout(c, shape), compressor.compress(empty).layout());
  }
}

TEST(ConfigParse, SeedsAreUnsigned64BitIntegers) {
  EXPECT_EQ(Config::parse("seed=0").rotation_seed, 0u);
  EXPECT_EQ(Config::parse("seed=18446744073709551615").rotation_seed, UINT64_MAX);
  for (const char* bad : {"seed=-1", "seed=abc", "seed=", "seed=18446744073709551616", "seed=1.5", "seed=1e3",
                          "seed= 7", "seed=+7", "seed=0x10"})
    expect_error([&] { Config::parse(bad); }, "seed", bad);
}

TEST(ConfigParse, RejectsMalformedValuesWithTheFieldName) {
  for (const char* bad :
       {"sinks=-1", "sinks=abc", "sinks=1.5", "sinks=99999999999", "evict=abc", "evict=1", "evict=nan", "key_scale=0",
        "key_scale=inf", "pool=4", "gain_bits=12", "flush=0", "mean_tokens=0", "per_head=2", "shared=2",
        "center=yes please", "gqa=median", "rope=sideways"}) {
    const std::string s = bad;
    expect_error([&] { Config::parse(s); }, s.substr(0, s.find('=')), s);
  }
  expect_error([] { Config::parse("colour=red"); }, "colour");
  expect_error([] { Config::parse("key=e8p5"); }, "accepted");
  expect_error([] { Config::parse("sinks=1,sinks=2"); }, "twice");
  expect_error([] { Config::parse("sinks"); }, "key=value");
}

TEST(ConfigParse, SharedSelection) {
  EXPECT_FALSE(Config().shared_selection);
  EXPECT_FALSE(Config::parse("preset=high").shared_selection);
  const Config c = Config::parse("preset=high,shared=1");
  EXPECT_TRUE(c.shared_selection);
  EXPECT_FALSE(Config::parse("shared=0").shared_selection);
  const std::string d = c.describe();
  EXPECT_NE(d.find("shared=1"), std::string::npos) << d;
  EXPECT_NE(Config().describe().find("shared=0"), std::string::npos);
  expect_config_eq(c, Config::parse(d), d);
  const ModelShape shape{2, 2, 4, 64};
  EXPECT_NO_THROW(c.validate(shape));
  // One kept set for the model and one per KV head exclude each other; the message names both.
  const Config both = Config::parse("preset=high,shared=1,per_head=1");
  expect_error([&] { both.validate(shape); }, "'shared'");
  expect_error([&] { both.validate(shape); }, "'per_head'");
  expect_error([&] { KVCompressor(shape, both); }, "shared_selection");
  expect_error([&] { make_layout(both, shape); }, "per_head_selection");
}

TEST(ConfigParse, EvictionSpreadOverLayers) {
  EXPECT_FALSE(Config().layer_adaptive_eviction);
  const Config c = Config::parse("preset=high,evict_layers=1");
  EXPECT_TRUE(c.layer_adaptive_eviction);
  const std::string d = c.describe();
  EXPECT_NE(d.find("evict_layers=1"), std::string::npos) << d;
  expect_config_eq(c, Config::parse(d), d);
  const ModelShape shape{2, 2, 4, 64};
  EXPECT_NO_THROW(c.validate(shape));
  EXPECT_NO_THROW(Config::parse("preset=high,evict_layers=1,per_head=1").validate(shape));
  // Per-layer set sizes and one set for the model exclude each other; the message names both.
  const Config both = Config::parse("preset=high,shared=1,evict_layers=1");
  expect_error([&] { both.validate(shape); }, "'shared'");
  expect_error([&] { both.validate(shape); }, "'evict_layers'");
  expect_error([&] { KVCompressor(shape, both); }, "layer_adaptive_eviction");
  expect_error([] { Config::parse("evict_layers=2"); }, "evict_layers");
}

// The code tier: its three keys parse and describe back, it is off by default (and the layout
// then has none), its codecs must be block codes and both tiers together stay below 1; the
// messages name the keys.
TEST(ConfigParse, CodeTier) {
  EXPECT_EQ(Config().code_tier, 0.0);
  const ModelShape shape{2, 2, 4, 64};
  EXPECT_FALSE(make_layout(Config(), shape).has_code_tier());
  const Config c = Config::parse("preset=quant-k2v2,code_tier=0.05,tier_key=rvq4,tier_value=rvq3");
  EXPECT_EQ(c.code_tier, 0.05);
  EXPECT_EQ(c.tier_key_codec, quant::Codec::kRvq4);
  EXPECT_EQ(c.tier_value_codec, quant::Codec::kRvq3);
  const std::string d = c.describe();
  EXPECT_NE(d.find("code_tier=0.05"), std::string::npos) << d;
  expect_config_eq(c, Config::parse(d), d);
  const CacheLayout L = make_layout(c, shape);
  EXPECT_TRUE(L.has_code_tier());
  EXPECT_EQ(L.tier_key_codec, quant::Codec::kRvq4);
  EXPECT_EQ(L.tier_value_codec, quant::Codec::kRvq3);
  EXPECT_TRUE(L.layer_has_code_tier(0));
  EXPECT_FALSE(L.layer_has_code_tier(2));  // out of range: none
  // A centred tier is format 6: the record's variable part ends with a (here zero) RoPE factor count.
  EXPECT_TRUE(L.tier_centered);
  EXPECT_EQ(L.descriptor_bytes(), make_layout(Config::parse("preset=quant-k2v2"), shape).descriptor_bytes() +
                                      2 * CacheLayout::kSetTierCountBytes + CacheLayout::kRopeFactorCountBytes);
  Config uncentred = c;
  uncentred.tier_center = false;
  EXPECT_FALSE(make_layout(uncentred, shape).tier_centered);
  EXPECT_EQ(make_layout(uncentred, shape).descriptor_bytes(),
            make_layout(Config::parse("preset=quant-k2v2"), shape).descriptor_bytes() + 2 * CacheLayout::kSetTierCountBytes);
  // No tier, no centring or pre-RoPE codes: nothing to centre, version 6 not needed.
  EXPECT_FALSE(make_layout(Config::parse("preset=quant-k3v2"), shape).tier_centered);
  EXPECT_FALSE(make_layout(Config::parse("preset=tier-k3v2,center=0"), shape).tier_centered);
  EXPECT_FALSE(make_layout(Config::parse("preset=tier-k3v2,rope=pre"), shape).tier_centered);
  EXPECT_EQ(Config::parse("code_tier=0.1").tier_key_codec, quant::Codec::kRvq4);  // the default
  expect_error([&] { Config::parse("code_tier=0.1,tier_key=fp16").validate(shape); }, "'tier_key'");
  expect_error([&] { Config::parse("code_tier=0.6,fp16_tier=0.4").validate(shape); }, "'code_tier'");
  expect_error([] { Config::parse("code_tier=1"); }, "code_tier");
  expect_error([] { Config::parse("tier_value=rvq5"); }, "tier_value");
  // Codecs without a tier fraction make no tier.
  EXPECT_FALSE(make_layout(Config::parse("tier_key=ball4"), shape).has_code_tier());
}

// Decoding in memory keeps a 16-token fp16 window by default; a state compressed to be stored
// (parse_at_rest) codes its last tokens too unless the spec asks for a window; nothing else moves.
TEST(ConfigParse, AtRestCodesTheRecentTokensUnlessTheSpecSetsAWindow) {
  EXPECT_EQ(Config().residual_length, 16);
  for (const char* spec : {"preset=quant-k3v2", "preset=high,fp16_tier=0.01", "", "budget=2.5,evict=0.2"}) {
    SCOPED_TRACE(spec);
    const Config in_memory = Config::parse(spec);
    const Config at_rest = Config::parse_at_rest(spec);
    EXPECT_EQ(in_memory.residual_length, 16);
    EXPECT_EQ(at_rest.residual_length, 0);
    Config same = at_rest;
    same.residual_length = in_memory.residual_length;
    expect_config_eq(same, in_memory, spec);
  }
  EXPECT_EQ(Config::parse_at_rest("preset=quant-k2v2,residual=8").residual_length, 8);
  EXPECT_EQ(Config::parse_at_rest("residual=16").residual_length, 16);
  expect_error([] { Config::parse_at_rest("preset=quant-k2v2,residual=-1"); }, "residual");
}

TEST(ConfigValidate, UnknownEnumIdsAreRejected) {
  const ModelShape shape{2, 2, 4, 64};
  for (double evict : {0.0, 0.5}) {
    Config c = Config::preset("high");
    c.eviction_rate = evict;
    c.scorer = static_cast<select::ScorerKind>(17);
    expect_error([&] { c.validate(shape); }, "scorer");
  }
  Config c;
  c.gqa_aggregation = static_cast<select::Aggregation>(7);
  expect_error([&] { c.validate(shape); }, "gqa_aggregation");
  c = Config();
  c.key_codec = static_cast<quant::Codec>(40);
  expect_error([&] { c.validate(shape); }, "key_codec");
  c = Config();
  c.value_gain = static_cast<quant::GainPolicy>(3);
  expect_error([&] { c.validate(shape); }, "value_gain");
  c = Config();
  c.rope.scaling = static_cast<transform::RopeScaling>(9);
  expect_error([&] { c.validate(shape); }, "rope.scaling");
  c = Config();
  c.layer_rates.assign(2, LayerRate{quant::Codec::kE8P, static_cast<quant::Codec>(99)});
  expect_error([&] { c.validate(shape); }, "layer_rates");
}

}  // namespace

// The scorer and eviction settings compress() derives from a Config: every field maps, and
// evict_count stays -1 (the rate decides).
TEST(ConfigOptions, ScorerAndEvictionOptionsCarryEveryField) {
  const Config c = Config::parse(
      "preset=quant-k3v2,scorer=key-key,window=17,pool=5,gqa=max,scorer_seed=99,evict=0.3,sinks=6,recent=40,"
      "per_head=1,head_agg=max");
  const select::ScorerOptions so = c.scorer_options();
  EXPECT_EQ(so.kind, select::ScorerKind::kKeyKeyProxy);
  EXPECT_EQ(so.window, 17);
  EXPECT_EQ(so.pool_kernel, 5);
  EXPECT_EQ(so.gqa, select::Aggregation::kMax);
  EXPECT_EQ(so.seed, 99u);
  const select::EvictionOptions eo = c.eviction_options();
  EXPECT_EQ(eo.rate, 0.3);
  EXPECT_EQ(eo.sinks, 6);
  EXPECT_EQ(eo.recent, 40);
  EXPECT_TRUE(eo.per_head);
  EXPECT_EQ(eo.head_aggregation, select::Aggregation::kMax);
  EXPECT_EQ(eo.evict_count, -1);
  // The defaults map to the option structs' own defaults.
  const Config d;
  const select::ScorerOptions ds = d.scorer_options();
  const select::ScorerOptions s0;
  EXPECT_EQ(ds.kind, s0.kind);
  EXPECT_EQ(ds.window, s0.window);
  EXPECT_EQ(ds.pool_kernel, s0.pool_kernel);
  EXPECT_EQ(ds.gqa, s0.gqa);
  const select::EvictionOptions de = d.eviction_options();
  EXPECT_EQ(de.sinks, d.sinks);
  EXPECT_EQ(de.recent, d.recent_window);
  EXPECT_FALSE(de.per_head);
}
