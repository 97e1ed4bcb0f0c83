#include "model_kv.hpp"

#include "e8kv/error.hpp"
#include "e8kv/llama/gguf.hpp"
#include "e8kv/llama/model_config.hpp"

namespace e8kv::llama_cpp {

namespace {

int count(const llama::GgufFile& f, const std::string& key, uint64_t lo, uint64_t hi) {
  const uint64_t v = f.get_uint(key);
  if (v < lo || v > hi)
    throw Error(f.name() + ": " + key + " is " + std::to_string(v) + "; accepted " + std::to_string(lo) + " to " +
                std::to_string(hi));
  return static_cast<int>(v);
}

ModelKv read_llama(const std::string& path, const llama::GgufFile& f) {
  const llama::ModelConfig mc = llama::read_config(f);
  if (mc.rope_freq_factors)
    throw Error(path + ": RoPE frequency factors (rope_freqs.weight) are not mapped to e8kv's RoPE parameters");
  ModelKv m;
  m.architecture = mc.architecture;
  m.n_layers = mc.n_layers;
  ModelKvCache c;
  for (int l = 0; l < mc.n_layers; ++l) c.layers.push_back(l);
  c.shape = ModelShape{mc.n_layers, mc.n_kv_heads, mc.n_heads, mc.head_dim};
  c.rope = llama::rope_params(mc);  // llama.cpp rotates GGUF llama keys in adjacent pairs too
  m.caches.push_back(c);
  return m;
}

// gemma3 as llama.cpp 0c1e57098bba reads it (src/models/gemma3.cpp, llama_hparams::set_swa_pattern,
// llama_model::get_rope_freq_base/_scale).
ModelKv read_gemma3(const std::string& path, const llama::GgufFile& f) {
  const std::string p = "gemma3.";
  ModelKv m;
  m.architecture = "gemma3";
  m.n_layers = count(f, p + "block_count", 1, 1024);
  const int n_heads = count(f, p + "attention.head_count", 1, 1024);
  const int n_kv = f.has(p + "attention.head_count_kv") ? count(f, p + "attention.head_count_kv", 1, 1024) : n_heads;
  if (n_heads % n_kv != 0) throw Error(path + ": head_count is not a multiple of head_count_kv");
  const int head_dim = count(f, p + "attention.key_length", 1, 1024);
  if (f.has(p + "attention.value_length") && count(f, p + "attention.value_length", 1, 1024) != head_dim)
    throw Error(path + ": attention.value_length differs from key_length (unsupported)");
  const int rope_dim = f.has(p + "rope.dimension_count") ? count(f, p + "rope.dimension_count", 2, head_dim) : head_dim;
  transform::RopeParams global;
  global.layout = transform::RopeLayout::kSplitHalf;  // llama.cpp's NEOX rotation for gemma3
  global.head_dim = head_dim;
  global.rotary_dim = rope_dim;
  global.theta = f.get_float(p + "rope.freq_base", 10000.0);
  const std::string scaling = f.get_string(p + "rope.scaling.type", "none");
  if (scaling == "linear") {
    global.scaling = transform::RopeScaling::kLinear;
    global.factor = f.get_float(p + "rope.scaling.factor", 1.0);
  } else if (scaling != "none") {
    throw Error(path + ": rope.scaling.type '" + scaling + "' is not mapped (gemma3: none or linear)");
  }
  if (!(std::isfinite(global.theta) && global.theta > 1.0 && std::isfinite(global.factor) && global.factor >= 1.0))
    throw Error(path + ": rope.freq_base or rope.scaling.factor out of range");
  if (f.find_tensor("rope_freqs.weight") != nullptr)
    throw Error(path + ": RoPE frequency factors (rope_freqs.weight) are not mapped to e8kv's RoPE parameters");
  const ModelShape shape{0, n_kv, n_heads, head_dim};
  const int window = f.has(p + "attention.sliding_window") ? count(f, p + "attention.sliding_window", 0, 1 << 30) : 0;
  ModelKvCache full{{}, shape, global, 0};
  if (window == 0) {
    for (int l = 0; l < m.n_layers; ++l) full.layers.push_back(l);
  } else {
    const std::string pattern_key = p + "attention.sliding_window_pattern";
    int pattern = 6;
    if (f.has(pattern_key)) {
      try {
        pattern = count(f, pattern_key, 0, 1024);
      } catch (const Error&) {
        throw Error(path + ": " + pattern_key + " is not a number (a per-layer pattern is not mapped)");
      }
    }
    ModelKvCache swa{{}, shape, global, window};
    swa.rope.scaling = transform::RopeScaling::kNone;  // rope_freq_scale_train_swa = 1
    swa.rope.factor = 1.0;
    swa.rope.theta = f.get_float(p + "rope.freq_base_swa", 10000.0);
    for (int l = 0; l < m.n_layers; ++l) {
      const bool is_swa = pattern == 0 || l % pattern < pattern - 1;
      (is_swa ? swa : full).layers.push_back(l);
    }
    if (full.layers.empty() || swa.layers.empty())
      throw Error(path + ": every layer is " + (full.layers.empty() ? "sliding-window" : "global") +
                  "; llama.cpp keeps one cache then, a layout the adapter does not map");
    swa.shape.n_layers = static_cast<int>(swa.layers.size());
    full.shape.n_layers = static_cast<int>(full.layers.size());
    m.caches.push_back(full);
    m.caches.push_back(swa);
    return m;
  }
  full.shape.n_layers = m.n_layers;
  m.caches.push_back(full);
  return m;
}

}  // namespace

ModelKv read_model_kv(const std::string& gguf_path) { return read_model_kv(gguf_path, llama::GgufFile::open_header(gguf_path)); }

ModelKv read_model_kv(const std::string& gguf_path, const llama::GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  if (arch == "llama") return read_llama(gguf_path, f);
  if (arch == "gemma3") return read_gemma3(gguf_path, f);
  throw Error(gguf_path + ": architecture '" + arch +
              "' is not mapped to its KV caches (mapped: llama, gemma3); M-RoPE and per-layer-embedding models "
              "also write cell extensions the adapter does not read");
}

Config model_config(const std::string& spec, const ModelKvCache& cache) {
  Config c = Config::parse_at_rest(spec);  // a state at rest: no fp16 window unless asked
  c.rope = cache.rope;
  c.validate(cache.shape);
  return c;
}

std::vector<KVCompressor> model_compressors(const std::string& spec, const ModelKv& model) {
  std::vector<KVCompressor> out;
  for (const ModelKvCache& c : model.caches) out.emplace_back(c.shape, model_config(spec, c));
  return out;
}

std::vector<const KVCompressor*> pointers(const std::vector<KVCompressor>& compressors) {
  std::vector<const KVCompressor*> p;
  for (const auto& c : compressors) p.push_back(&c);
  return p;
}

}  // namespace e8kv::llama_cpp
