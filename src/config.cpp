// Config: presets, parsing of spec strings, validation, description, and the Config -> CacheLayout
// copy. Everything per field comes from the field table (src/config_fields.hpp).
#include "e8kv/config.hpp"

#include <fmt/format.h>

#include <map>
#include <sstream>
#include <string>

#include "config_fields.hpp"
#include "e8kv/error.hpp"

namespace e8kv {

void ModelShape::validate() const {
  if (n_layers < 1) throw Error(fmt::format("ModelShape.n_layers is {}; accepted: >= 1", n_layers));
  if (n_kv_heads < 1) throw Error(fmt::format("ModelShape.n_kv_heads is {}; accepted: >= 1", n_kv_heads));
  if (n_q_heads < n_kv_heads || n_q_heads % n_kv_heads != 0)
    throw Error(fmt::format("ModelShape.n_q_heads is {}; accepted: a positive multiple of n_kv_heads ({})", n_q_heads,
                            n_kv_heads));
  if (!is_supported_head_dim(head_dim))
    throw Error(fmt::format("ModelShape.head_dim {} is not supported; accepted: {}", head_dim, supported_head_dims()));
}

// ---- presets and parsing -------------------------------------------------------------------

const char* Config::preset_names() {
  return "lossless, quant-k4v4, quant-k3v3, quant-k4v2, quant-k3v2, quant-k2v2, tier-k3v2, tier-k2v2, high, asym, "
         "balanced, max";
}

Config Config::preset(const std::string& name) {
  using quant::Codec;
  Config c;
  auto kv = [&](Codec k, Codec v, double evict) {
    c.key_codec = k;
    c.value_codec = v;
    c.eviction_rate = evict;
  };
  if (name == "lossless") kv(Codec::kFp16, Codec::kFp16, 0.0);
  else if (name == "quant-k4v4") kv(Codec::kRvq4, Codec::kRvq4, 0.0);
  else if (name == "quant-k3v3") kv(Codec::kRvq3, Codec::kRvq3, 0.0);
  else if (name == "quant-k4v2") kv(Codec::kRvq4, Codec::kE8P, 0.0);
  else if (name == "quant-k3v2") kv(Codec::kRvq3, Codec::kE8P, 0.0);
  else if (name == "quant-k2v2") kv(Codec::kE8P, Codec::kE8P, 0.0);
  else if (name == "tier-k3v2" || name == "tier-k2v2") {
    // The layer's codes plus a 5 % 4-bit code tier: 2.80 / 2.33 bits per element at 4K tokens on
    // SmolLM2, KL 0.30× / 0.70× rotated q4_0's on the docs' corpora (docs/accuracy.md, "The code tier").
    kv(name == "tier-k3v2" ? Codec::kRvq3 : Codec::kE8P, Codec::kE8P, 0.0);
    c.code_tier = 0.05;
  } else if (name == "high") kv(Codec::kRvq3, Codec::kE8P, 0.35);
  else if (name == "asym") kv(Codec::kRvq3, Codec::kE8P, 0.60);
  else if (name == "balanced") kv(Codec::kE8P, Codec::kE8P, 0.60);
  else if (name == "max") kv(Codec::kE8P, Codec::kE8P, 0.80);
  else throw Error(fmt::format("preset '{}' is unknown; accepted: {}", name, preset_names()));
  return c;
}

namespace {

using namespace detail::fields;

std::map<std::string, std::string> split_spec(const std::string& spec) {
  std::map<std::string, std::string> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) throw Error(fmt::format("config spec item '{}' must be key=value", item));
    const std::string key = item.substr(0, eq);
    if (out.count(key) != 0) throw Error(fmt::format("config spec sets '{}' twice", key));
    out[key] = item.substr(eq + 1);
  }
  return out;
}

// The spec keys of the field table, in describe() order.
std::string spec_keys() {
  std::string keys = "preset";
#define E8KV_KEY(member, key, kind) keys += ", " key;
#define E8KV_KEY_SHARED(config_member, layout_member, key, kind, offset, w, since_) E8KV_KEY(config_member, key, kind)
  E8KV_LAYOUT_FIELDS(E8KV_FIELD_IGNORE, E8KV_KEY_SHARED, E8KV_KEY)
#undef E8KV_KEY_SHARED
#undef E8KV_KEY
  return keys;
}

template <class K, class T>
void parse_field(const K& kind, const char* key, const std::string& text, T& field) {
  if (!parse(kind, text, field))
    throw Error(fmt::format("config field '{}': '{}' is not accepted (accepted: {})", key, text, accepted(kind)));
}

void set_field(Config& c, const std::string& key, const std::string& text) {
#define E8KV_PARSE(member, spec_key, kind) \
  if (key == spec_key) return parse_field(kind, spec_key, text, c.member);
#define E8KV_PARSE_SHARED(config_member, layout_member, spec_key, kind, offset, w, since_) \
  E8KV_PARSE(config_member, spec_key, kind)
  E8KV_LAYOUT_FIELDS(E8KV_FIELD_IGNORE, E8KV_PARSE_SHARED, E8KV_PARSE)
#undef E8KV_PARSE_SHARED
#undef E8KV_PARSE
  throw Error(fmt::format("config field '{}' is unknown; accepted: {}", key, spec_keys()));
}

template <class K, class T>
void check_field(const K& kind, const char* member, const char* key, const T& value) {
  if (!accepts(kind, value))
    throw Error(fmt::format("Config.{} (spec key '{}') is {}; accepted: {}", member, key, print(kind, value),
                            accepted(kind)));
}

}  // namespace

Config Config::parse(const std::string& spec) {
  auto fields = split_spec(spec);
  Config c;
  if (auto it = fields.find("preset"); it != fields.end()) {
    c = preset(it->second);
    fields.erase(it);
  }
  for (const auto& [key, text] : fields) set_field(c, key, text);
  return c;
}

Config Config::parse_at_rest(const std::string& spec) {
  Config c = parse(spec);
  if (split_spec(spec).count("residual") == 0) c.residual_length = 0;
  return c;
}

std::string Config::describe() const {
  std::string s;
#define E8KV_DESCRIBE(member, key, kind) s += fmt::format("{}{}={}", s.empty() ? "" : ",", key, print(kind, member));
#define E8KV_DESCRIBE_SHARED(config_member, layout_member, key, kind, offset, w, since_) \
  E8KV_DESCRIBE(config_member, key, kind)
  E8KV_LAYOUT_FIELDS(E8KV_FIELD_IGNORE, E8KV_DESCRIBE_SHARED, E8KV_DESCRIBE)
#undef E8KV_DESCRIBE_SHARED
#undef E8KV_DESCRIBE
  return s;
}

void Config::validate(const ModelShape& shape) const {
  shape.validate();
#define E8KV_CHECK(member, key, kind) check_field(kind, #member, key, member);
#define E8KV_CHECK_SHARED(config_member, layout_member, key, kind, offset, w, since_) E8KV_CHECK(config_member, key, kind)
  E8KV_LAYOUT_FIELDS(E8KV_FIELD_IGNORE, E8KV_CHECK_SHARED, E8KV_CHECK)
#undef E8KV_CHECK_SHARED
#undef E8KV_CHECK
  // Relations between fields (the table checks each field alone).
  if (!layer_rates.empty() && static_cast<int>(layer_rates.size()) != shape.n_layers)
    throw Error(fmt::format("Config.layer_rates has {} entries; accepted: none, or one per layer ({})",
                            layer_rates.size(), shape.n_layers));
  if (index_budget != 0.0 && index_budget < 2.0)
    throw Error(fmt::format("Config.index_budget (spec key 'index_budget') is {}; accepted: 0 (off) or 2 to 4 index "
                            "bits per element",
                            index_budget));
  if (rate_budget != 0.0 && index_budget != 0.0)
    throw Error("Config.rate_budget (spec key 'budget', bits per element as bytes() counts them) and "
                "Config.index_budget (spec key 'index_budget', index bits only) both set; accepted: one of them");
  if ((rate_budget != 0.0 || index_budget != 0.0) && !layer_rates.empty())
    throw Error(fmt::format("Config.{} (spec key '{}') and Config.layer_rates both set; accepted: one of them (the "
                            "budget chooses the per-layer codes itself)",
                            rate_budget != 0.0 ? "rate_budget" : "index_budget",
                            rate_budget != 0.0 ? "budget" : "index_budget"));
  if (fp16_tier + code_tier >= 1.0)
    throw Error(fmt::format("Config.fp16_tier + Config.code_tier (spec keys 'fp16_tier', 'code_tier') is {}; accepted: "
                            "below 1",
                            fp16_tier + code_tier));
  if (code_tier > 0.0 && (tier_key_codec == quant::Codec::kFp16 || tier_value_codec == quant::Codec::kFp16))
    throw Error(fmt::format("Config.tier_key_codec / tier_value_codec (spec keys 'tier_key', 'tier_value') are {} / {}; "
                            "accepted: block codes ({}, not fp16: the fp16 tier is fp16_tier)",
                            quant::to_string(tier_key_codec), quant::to_string(tier_value_codec), quant::codec_names()));
  if (shared_selection && per_head_selection)
    throw Error(
        "Config.shared_selection (spec key 'shared') and Config.per_head_selection (spec key 'per_head') "
        "both set; accepted: one of them (a kept set for the whole model, or one per KV head)");
  if (shared_selection && layer_adaptive_eviction)
    throw Error(
        "Config.shared_selection (spec key 'shared') and Config.layer_adaptive_eviction (spec key 'evict_layers') "
        "both set; accepted: one of them (one kept set for every layer, or per-layer sets of per-layer sizes)");
  if (rope.head_dim != shape.head_dim && rope.head_dim != 0 && rope.head_dim != 128)
    throw Error(fmt::format("Config.rope.head_dim is {}, the model's head_dim {}; accepted: {}, 0 or 128 (the "
                            "layout always uses the model's)",
                            rope.head_dim, shape.head_dim, shape.head_dim));
  // Queries for the attention scorers are checked at compress time, when eviction is on.
}

LayerRate Config::layer_rate(int layer, int n_layers) const {
  if (layer < protect_boundary || layer >= n_layers - protect_boundary)
    return LayerRate{quant::Codec::kFp16, quant::Codec::kFp16};
  if (!layer_rates.empty()) return layer_rates[static_cast<size_t>(layer)];
  return LayerRate{key_codec, value_codec};
}

CacheLayout make_layout(const Config& config, const ModelShape& shape) {
  config.validate(shape);
  CacheLayout L;
#define E8KV_COPY_SHAPE(shape_member, layout_member, kind, offset, w, since_) L.layout_member = shape.shape_member;
#define E8KV_COPY_SHARED(config_member, layout_member, key, kind, offset, w, since_) \
  L.layout_member = config.config_member;
  E8KV_LAYOUT_FIELDS(E8KV_COPY_SHAPE, E8KV_COPY_SHARED, E8KV_FIELD_IGNORE)
#undef E8KV_COPY_SHARED
#undef E8KV_COPY_SHAPE
  // RoPE runs at the model's head_dim, whatever the config's default (128) says.
  L.rope.head_dim = shape.head_dim;
  if (config.code_tier == 0.0) L.tier_key_codec = L.tier_value_codec = quant::Codec::kFp16;  // no tier
  L.rope.freq_factors = config.rope.freq_factors;
  // The tier is centred on the head's means: there must be a tier, means, and keys coded in a
  // frame whose mean term attention adds per token (pre-RoPE codes have none for post-RoPE tier keys).
  L.tier_centered = L.tier_centered && L.has_code_tier() && L.center && L.key_frame != transform::KeyFrame::kPreRope;
  for (int l = 0; l < shape.n_layers; ++l) {
    const LayerRate r = config.layer_rate(l, shape.n_layers);
    L.key_codec.push_back(r.key);
    L.value_codec.push_back(r.value);
  }
  return L;
}

select::ScorerOptions Config::scorer_options() const {
  select::ScorerOptions o;
  o.kind = scorer;
  o.window = obs_window;
  o.pool_kernel = pool_kernel;
  o.gqa = gqa_aggregation;
  o.seed = scorer_seed;
  return o;
}

select::EvictionOptions Config::eviction_options() const {
  select::EvictionOptions o;
  o.rate = eviction_rate;
  o.sinks = sinks;
  o.recent = recent_window;
  o.per_head = per_head_selection;
  o.head_aggregation = head_aggregation;
  return o;
}

}  // namespace e8kv
