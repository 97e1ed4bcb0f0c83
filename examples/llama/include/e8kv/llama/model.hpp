// A small Llama-architecture inference engine in fp32 on the CPU: weights from GGUF are
// dequantized once at load and packed for a register-blocked matrix product (AVX2/FMA when the
// CPU has it, portable code otherwise); prefill is batched; decoding goes through KvBackend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "e8kv/llama/kv_backend.hpp"
#include "e8kv/llama/model_config.hpp"
#include "e8kv/llama/tokenizer.hpp"

namespace e8kv::llama {

class ThreadPool;
struct ModelWeights;

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

/// Forces the portable (non-AVX2) kernels when false; for tests and comparisons.
void set_simd_enabled(bool enabled);
bool simd_enabled();

}  // namespace e8kv::llama
