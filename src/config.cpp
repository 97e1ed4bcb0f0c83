// Config: presets, parsing of spec strings, validation, description.
#include "e8kv/config.hpp"

#include <cmath>
#include <map>
#include <sstream>
#include <string>

#include "e8kv/error.hpp"

namespace e8kv {

void ModelShape::validate() const {
  require(n_layers >= 1, "ModelShape.n_layers must be >= 1, got " + std::to_string(n_layers));
  require(n_kv_heads >= 1, "ModelShape.n_kv_heads must be >= 1, got " + std::to_string(n_kv_heads));
  require(n_q_heads >= n_kv_heads && n_q_heads % n_kv_heads == 0,
          "ModelShape.n_q_heads (" + std::to_string(n_q_heads) + ") must be a positive multiple of n_kv_heads (" +
              std::to_string(n_kv_heads) + ")");
  require(is_supported_head_dim(head_dim), "ModelShape.head_dim " + std::to_string(head_dim) +
                                               " is not supported; accepted: " + supported_head_dims());
}

// ---- presets and parsing -------------------------------------------------------------------

const char* Config::preset_names() {
  return "lossless, quant-k4v4, quant-k3v3, quant-k4v2, quant-k3v2, quant-k2v2, high, asym, balanced, max";
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
  else if (name == "high") kv(Codec::kRvq3, Codec::kE8P, 0.35);
  else if (name == "asym") kv(Codec::kRvq3, Codec::kE8P, 0.60);
  else if (name == "balanced") kv(Codec::kE8P, Codec::kE8P, 0.60);
  else if (name == "max") kv(Codec::kE8P, Codec::kE8P, 0.80);
  else throw Error("preset '" + name + "' is unknown; accepted: " + preset_names());
  return c;
}

namespace {

std::map<std::string, std::string> split_spec(const std::string& spec) {
  std::map<std::string, std::string> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    require(eq != std::string::npos && eq > 0, "config spec item '" + item + "' must be key=value");
    const std::string key = item.substr(0, eq);
    require(out.count(key) == 0, "config spec sets '" + key + "' twice");
    out[key] = item.substr(eq + 1);
  }
  return out;
}

double to_double(const std::string& key, const std::string& v) {
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  throw Error("config field '" + key + "': '" + v + "' is not a number");
}

int to_int(const std::string& key, const std::string& v) {
  const double x = to_double(key, v);
  require(x == std::floor(x) && std::fabs(x) < 1e9, "config field '" + key + "': '" + v + "' is not an integer");
  return static_cast<int>(x);
}

bool to_bool(const std::string& key, const std::string& v) {
  if (v == "1" || v == "true" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "no") return false;
  throw Error("config field '" + key + "': '" + v + "' is not a boolean (accepted: 0, 1, true, false)");
}

}  // namespace

Config Config::parse(const std::string& spec) {
  auto fields = split_spec(spec);
  Config c;
  if (auto it = fields.find("preset"); it != fields.end()) {
    c = preset(it->second);
    fields.erase(it);
  }
  for (const auto& [key, v] : fields) {
    if (key == "key") c.key_codec = quant::codec_from_string(v);
    else if (key == "value") c.value_codec = quant::codec_from_string(v);
    else if (key == "evict") c.eviction_rate = to_double(key, v);
    else if (key == "sinks") c.sinks = to_int(key, v);
    else if (key == "recent") c.recent_window = to_int(key, v);
    else if (key == "scorer") c.scorer = select::scorer_from_string(v);
    else if (key == "window") c.obs_window = to_int(key, v);
    else if (key == "pool") c.pool_kernel = to_int(key, v);
    else if (key == "protect") c.protect_boundary = to_int(key, v);
    else if (key == "rope") {
      if (v == "pre") c.key_frame = KeyFrame::kPreRope;
      else if (v == "post") c.key_frame = KeyFrame::kPostRope;
      else if (v == "residual") c.key_frame = KeyFrame::kRopeResidual;
      else throw Error("config field 'rope': '" + v + "' (accepted: residual, pre, post)");
    } else if (key == "key_gain") c.key_gain = quant::gain_policy_from_string(v);
    else if (key == "value_gain") c.value_gain = quant::gain_policy_from_string(v);
    else if (key == "key_scale") c.key_scale = static_cast<float>(to_double(key, v));
    else if (key == "value_scale") c.value_scale = static_cast<float>(to_double(key, v));
    else if (key == "residual") c.residual_length = to_int(key, v);
    else if (key == "flush") c.flush_block = to_int(key, v);
    else if (key == "per_head") c.per_head_selection = to_bool(key, v);
    else if (key == "fp16_sinks") c.fp16_sinks = to_bool(key, v);
    else if (key == "center") c.center = to_bool(key, v);
    else if (key == "mean_tokens") c.mean_tokens = to_int(key, v);
    else if (key == "qweight") c.query_weighted_keys = to_bool(key, v);
    else if (key == "gain_bits") c.gain_bits = to_int(key, v);
    else if (key == "gqa") c.gqa_aggregation = v == "max" ? select::Aggregation::kMax : (v == "mean" ? select::Aggregation::kMean : throw Error("config field 'gqa': '" + v + "' (accepted: mean, max)"));
    else if (key == "seed") c.rotation_seed = static_cast<uint64_t>(std::stoull(v));
    else
      throw Error("config field '" + key +
                  "' is unknown; accepted: preset, key, value, evict, sinks, recent, scorer, window, pool, protect, "
                  "rope, key_gain, value_gain, key_scale, value_scale, residual, flush, per_head, fp16_sinks, center, "
                  "mean_tokens, qweight, gain_bits, gqa, seed");
  }
  return c;
}

void Config::validate(const ModelShape& shape) const {
  shape.validate();
  require(eviction_rate >= 0.0 && eviction_rate < 1.0,
          "Config.eviction_rate must be in [0, 1), got " + std::to_string(eviction_rate));
  require(sinks >= 0, "Config.sinks must be >= 0");
  require(recent_window >= 0, "Config.recent_window must be >= 0");
  require(obs_window >= 1, "Config.obs_window must be >= 1");
  require(pool_kernel >= 1 && pool_kernel % 2 == 1, "Config.pool_kernel must be odd and >= 1");
  require(protect_boundary >= 0, "Config.protect_boundary must be >= 0");
  require(residual_length >= 0, "Config.residual_length must be >= 0");
  require(flush_block >= 1, "Config.flush_block must be >= 1");
  require(mean_tokens >= 1, "Config.mean_tokens must be >= 1");
  require(gain_bits == 8 || gain_bits == 16, "Config.gain_bits must be 8 or 16, got " + std::to_string(gain_bits));
  require(key_scale > 0.f && std::isfinite(key_scale), "Config.key_scale must be positive");
  require(value_scale > 0.f && std::isfinite(value_scale), "Config.value_scale must be positive");
  require(layer_rates.empty() || static_cast<int>(layer_rates.size()) == shape.n_layers,
          "Config.layer_rates must be empty or have one entry per layer (" + std::to_string(shape.n_layers) + ")");
  require(rope.head_dim == shape.head_dim || rope.head_dim == 0 || rope.head_dim == 128,
          "Config.rope.head_dim (" + std::to_string(rope.head_dim) + ") differs from the model head_dim");
  // Queries for the attention scorers are checked at compress time, when eviction is on.
}

LayerRate Config::layer_rate(int layer, int n_layers) const {
  if (layer < protect_boundary || layer >= n_layers - protect_boundary)
    return LayerRate{quant::Codec::kFp16, quant::Codec::kFp16};
  if (!layer_rates.empty()) return layer_rates[static_cast<size_t>(layer)];
  return LayerRate{key_codec, value_codec};
}

std::string Config::describe() const {
  std::ostringstream s;
  s << "key=" << quant::to_string(key_codec) << ",value=" << quant::to_string(value_codec)
    << ",evict=" << eviction_rate << ",sinks=" << sinks << ",recent=" << recent_window
    << ",scorer=" << select::to_string(scorer) << ",window=" << obs_window << ",pool=" << pool_kernel
    << ",protect=" << protect_boundary << ",rope=" << transform::to_string(key_frame)
    << ",key_gain=" << quant::to_string(key_gain) << ",value_gain=" << quant::to_string(value_gain)
    << ",key_scale=" << key_scale << ",value_scale=" << value_scale << ",residual=" << residual_length
    << ",flush=" << flush_block << ",per_head=" << (per_head_selection ? 1 : 0)
    << ",fp16_sinks=" << (fp16_sinks ? 1 : 0) << ",center=" << (center ? 1 : 0) << ",mean_tokens=" << mean_tokens
    << ",qweight=" << (query_weighted_keys ? 1 : 0) << ",gain_bits=" << gain_bits;
  return s.str();
}

}  // namespace e8kv
