// What e8kv needs to know of a Llama-family model, read from its GGUF file without loading a
// weight: the hyperparameters (ModelConfig), the RoPE as e8kv's compressor takes it, and where the
// fetched model and corpora live. Used by the example engine (examples/llama), the llama.cpp
// tools (e8kv-llama-state, the fleet) and the tests that need the real model.
#pragma once

#include <string>

#include "e8kv/transform/rope_params.hpp"

namespace e8kv::llama {

class GgufFile;

enum class RopeScaling { kNone, kLinear };

/// Every hyperparameter, read from the GGUF metadata ({arch}.*).
struct ModelConfig {
  std::string architecture;                       // "llama"
  std::string name;                               // general.name
  int n_layers = 0;                               // block_count
  int n_embd = 0;                                 // embedding_length
  int n_ff = 0;                                   // feed_forward_length
  int n_heads = 0;                                // attention.head_count
  int n_kv_heads = 0;                             // attention.head_count_kv (default n_heads)
  int head_dim = 0;                               // attention.key_length (default n_embd / n_heads)
  int rope_dim = 0;                               // rope.dimension_count (default head_dim)
  double rope_theta = 10000.0;                    // rope.freq_base
  RopeScaling rope_scaling = RopeScaling::kNone;  // rope.scaling.type
  double rope_scaling_factor = 1.0;               // rope.scaling.factor
  int rope_scaling_original_context = 0;          // rope.scaling.original_context_length
  bool rope_freq_factors = false;                 // a rope_freqs.weight tensor divides the frequencies
  /// GGUF Llama keys/queries are rotated in adjacent pairs (x[2i], x[2i+1]) (ggml "normal"
  /// mode); the converter permuted the Q/K weights so this equals HF's half-split rotation.
  bool rope_adjacent_pairs = true;
  double rms_eps = 1e-5;        // attention.layer_norm_rms_epsilon
  int vocab_size = 0;           // vocab_size (default: token count)
  int context_length = 0;       // context_length
  bool tied_embeddings = true;  // no output.weight: logits use token_embd.weight
  int bos_id = -1, eos_id = -1;
  int n_q_dim() const { return n_heads * head_dim; }
  int n_kv_dim() const { return n_kv_heads * head_dim; }
  int group_size() const { return n_heads / n_kv_heads; }
};

/// Reads the configuration alone (no weights), validating every value.
ModelConfig read_config(const GgufFile& file);

/// The model's RoPE as e8kv's compressor takes it (Config::rope): GGUF Llama rotates adjacent
/// pairs (RopeLayout::kInterleaved), theta, rotary dims and linear scaling from the GGUF.
transform::RopeParams rope_params(const ModelConfig& config);

/// Default model path: $E8KV_MODEL, else ${E8KV_CACHE:-$HOME/.cache/e8kv}/models/SmolLM2-135M-Instruct.Q4_1.gguf.
std::string default_model_path();
/// ${E8KV_CACHE:-$HOME/.cache/e8kv}
std::string default_cache_dir();

}  // namespace e8kv::llama
