// A small Llama-architecture inference engine in fp32 on the CPU: weights from GGUF are
// dequantized once at load and packed for a register-blocked matrix product (AVX2/FMA when the
// CPU has it, portable code otherwise); prefill is batched; decoding goes through KvBackend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "e8kv/llama/kv_backend.hpp"
#include "e8kv/transform/rope_params.hpp"
#include "e8kv/llama/tokenizer.hpp"

namespace e8kv::llama {

class GgufFile;
class ThreadPool;
struct ModelWeights;

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

/// Rotary position embedding with the model's parameters. Rotates pair i of each head
/// (adjacent elements 2i, 2i+1 for i < rope_dim / 2) by position · θ_i with
/// θ_i = rope_theta^(-2i / rope_dim) / freq_factor_i / scaling_factor (linear scaling).
class Rope {
 public:
  explicit Rope(const ModelConfig& config, std::vector<float> freq_factors = {});
  /// In place on x [n_heads][head_dim].
  void apply(float* x, int n_heads, int64_t position) const;
  /// The inverse rotation (recovers pre-RoPE vectors).
  void remove(float* x, int n_heads, int64_t position) const;
  /// cos/sin of the rope_dim/2 angles at `position` (fp64 angles rounded to fp32).
  void angles(int64_t position, float* cos_out, float* sin_out) const;
  /// Rotates with precomputed angles (sign = +1 apply, -1 remove).
  void rotate(float* x, int n_heads, const float* cos_v, const float* sin_v, float sign = 1.0f) const;
  double frequency(int pair) const { return inv_freq_.at(static_cast<size_t>(pair)); }
  int head_dim() const { return head_dim_; }
  int rope_dim() const { return rope_dim_; }

 private:
  int head_dim_, rope_dim_;
  std::vector<double> inv_freq_;
};

enum class LogitsMode { kAll, kLast, kNone };

class Model {
 public:
  /// Loads a GGUF Llama model (architecture "llama"). Throws e8kv::Error for a corrupt file, a
  /// missing or mis-shaped tensor (named), an unsupported tensor type (named) or non-finite weights.
  /// threads = 0: std::thread::hardware_concurrency().
  static Model load(const std::string& path, int threads = 0);
  static Model from_gguf(const GgufFile& file, int threads = 0);

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const Rope& rope() const { return *rope_; }

  /// Dense causal forward over tokens at positions 0..n-1. Returns logits [n][vocab] (kAll),
  /// [1][vocab] of the last token (kLast) or nothing (kNone). Fills `capture` when given.
  std::vector<float> prefill(const std::vector<int32_t>& tokens, PrefillCapture* capture = nullptr,
                             LogitsMode mode = LogitsMode::kAll) const;
  /// One token through the cache: appends its k/v to `kv` in every layer, returns logits [vocab].
  std::vector<float> decode_step(int32_t token, int64_t position, KvBackend& kv) const;
  /// One step for several independent sequences (weights read once): logits [batch][vocab].
  /// Backends must be distinct. Throws e8kv::Error on mismatched sizes, bad ids or positions.
  std::vector<float> decode_batch(const std::vector<int32_t>& tokens, const std::vector<int64_t>& positions,
                                  const std::vector<KvBackend*>& backends) const;

  /// Threads used by the matrix products and attention (the calling thread included).
  void set_threads(int threads);
  int threads() const;
  /// When true (default), decode_batch calls append/attend of different backends concurrently.
  void set_concurrent_backends(bool on) { concurrent_backends_ = on; }

  /// Row `token` of the token embedding (fp32, n_embd values).
  std::vector<float> embedding(int32_t token) const;

 private:
  Model();
  std::vector<float> forward(const std::vector<int32_t>& tokens, const std::vector<int64_t>& positions,
                             PrefillCapture* capture, LogitsMode mode, const std::vector<KvBackend*>* backends) const;

  ModelConfig config_;
  Tokenizer tokenizer_;
  std::unique_ptr<Rope> rope_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<ThreadPool> pool_;
  bool concurrent_backends_ = true;
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

/// Forces the portable (non-AVX2) kernels when false; for tests and comparisons.
void set_simd_enabled(bool enabled);
bool simd_enabled();

}  // namespace e8kv::llama
