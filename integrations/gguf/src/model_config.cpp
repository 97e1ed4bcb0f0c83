// The model facts e8kv reads from a GGUF file (include/e8kv/llama/model_config.hpp).
#include "e8kv/llama/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "e8kv/error.hpp"
#include "e8kv/llama/gguf.hpp"

namespace e8kv::llama {

namespace {

int read_count(const GgufFile& f, const std::string& key, uint64_t lo, uint64_t hi) {
  const uint64_t v = f.get_uint(key);
  if (!(v >= lo && v <= hi))
    throw Error("GGUF metadata '" + key + "' = " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  return static_cast<int>(v);
}

int read_count(const GgufFile& f, const std::string& key, uint64_t lo, uint64_t hi, uint64_t fallback) {
  return f.has(key) ? read_count(f, key, lo, hi) : static_cast<int>(fallback);
}

}  // namespace

ModelConfig read_config(const GgufFile& f) {
  ModelConfig c;
  c.architecture = f.get_string("general.architecture");
  if (!(c.architecture == "llama"))
    throw Error("model architecture '" + c.architecture + "' is not supported (supported: llama)");
  c.name = f.get_string("general.name", "");
  const std::string p = c.architecture + ".";
  c.n_layers = read_count(f, p + "block_count", 1, 1024);
  c.n_embd = read_count(f, p + "embedding_length", 1, 1 << 16);
  c.n_ff = read_count(f, p + "feed_forward_length", 1, 1 << 18);
  c.n_heads = read_count(f, p + "attention.head_count", 1, 1024);
  c.n_kv_heads = read_count(f, p + "attention.head_count_kv", 1, static_cast<uint64_t>(c.n_heads), c.n_heads);
  if (!(c.n_heads % c.n_kv_heads == 0))
    throw Error("attention.head_count " + std::to_string(c.n_heads) + " is not a multiple of head_count_kv " +
                std::to_string(c.n_kv_heads));
  if (f.has(p + "attention.key_length")) {
    c.head_dim = read_count(f, p + "attention.key_length", 1, 1024);
  } else {
    if (!(c.n_embd % c.n_heads == 0))
      throw Error("embedding_length is not a multiple of head_count and key_length is absent");
    c.head_dim = c.n_embd / c.n_heads;
  }
  if (f.has(p + "attention.value_length"))
    if (!(read_count(f, p + "attention.value_length", 1, 1024) == c.head_dim))
      throw Error("attention.value_length differs from key_length (unsupported)");
  c.rope_dim = read_count(f, p + "rope.dimension_count", 2, static_cast<uint64_t>(c.head_dim), c.head_dim);
  if (!(c.rope_dim % 2 == 0)) throw Error("rope.dimension_count must be even, found " + std::to_string(c.rope_dim));
  c.rope_theta = f.get_float(p + "rope.freq_base", 10000.0);
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 1.0)) throw Error("rope.freq_base must be a finite number > 1");
  const std::string scaling = f.get_string(p + "rope.scaling.type", "none");
  if (scaling == "linear") {
    c.rope_scaling = RopeScaling::kLinear;
    c.rope_scaling_factor = f.get_float(p + "rope.scaling.factor", 1.0);
  } else if (scaling == "none") {
    if (f.has(p + "rope.scale_linear")) {  // older files
      c.rope_scaling_factor = f.get_float(p + "rope.scale_linear");
      if (c.rope_scaling_factor != 1.0) c.rope_scaling = RopeScaling::kLinear;
    }
  } else {
    throw Error("rope.scaling.type '" + scaling + "' is not supported (supported: none, linear)");
  }
  if (!(std::isfinite(c.rope_scaling_factor) && c.rope_scaling_factor > 0))
    throw Error("rope.scaling.factor must be a finite number > 0");
  c.rope_scaling_original_context = read_count(f, p + "rope.scaling.original_context_length", 0, 1u << 30, 0);
  c.rms_eps = f.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5);
  if (!(std::isfinite(c.rms_eps) && c.rms_eps > 0 && c.rms_eps < 1))
    throw Error("attention.layer_norm_rms_epsilon must be in (0, 1)");
  c.context_length = read_count(f, p + "context_length", 1, 1u << 30, 2048);
  const auto* embd = f.find_tensor("token_embd.weight");
  if (!(embd != nullptr)) throw Error("tensor 'token_embd.weight' is missing");
  if (!(embd->dims.size() == 2 && embd->dims[0] == c.n_embd))
    throw Error("tensor 'token_embd.weight' must have shape [" + std::to_string(c.n_embd) + ", vocab]");
  c.vocab_size = static_cast<int>(std::min<int64_t>(embd->dims[1], 1 << 30));
  if (f.has(p + "vocab_size"))
    if (!(f.get_uint(p + "vocab_size") == static_cast<uint64_t>(c.vocab_size)))
      throw Error("vocab_size metadata differs from the rows of token_embd.weight");
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.rope_freq_factors = f.find_tensor("rope_freqs.weight") != nullptr;
  c.bos_id = f.has("tokenizer.ggml.bos_token_id") ? static_cast<int>(f.get_uint("tokenizer.ggml.bos_token_id")) : -1;
  c.eos_id = f.has("tokenizer.ggml.eos_token_id") ? static_cast<int>(f.get_uint("tokenizer.ggml.eos_token_id")) : -1;
  return c;
}

transform::RopeParams rope_params(const ModelConfig& c) {
  transform::RopeParams r;
  r.layout = c.rope_adjacent_pairs ? transform::RopeLayout::kInterleaved : transform::RopeLayout::kSplitHalf;
  r.head_dim = c.head_dim;
  r.rotary_dim = c.rope_dim;
  r.theta = c.rope_theta;
  if (c.rope_scaling == RopeScaling::kLinear) {
    r.scaling = transform::RopeScaling::kLinear;
    r.factor = c.rope_scaling_factor;
  }
  return r;
}

std::string default_cache_dir() {
  if (const char* c = std::getenv("E8KV_CACHE"); c && *c) return c;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/e8kv";
}

std::string default_model_path() {
  if (const char* m = std::getenv("E8KV_MODEL"); m && *m) return m;
  return default_cache_dir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace e8kv::llama
