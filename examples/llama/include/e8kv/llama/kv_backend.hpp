// The KV-cache hook of the engine: decoding appends each new token's post-RoPE key/value to a
// KvBackend and asks it for the attention output. DenseKvBackend is the exact fp32 reference;
// a compressed cache implements the same interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace e8kv::llama {

struct ModelConfig;

/// One per sequence. Calls on one backend are sequential; Model::decode_batch may call
/// different backends from different threads at once (see Model::set_concurrent_backends).
class KvBackend {
 public:
  virtual ~KvBackend() = default;
  /// Post-RoPE key and value of one new token: [n_kv_heads * head_dim] each.
  virtual void append(int layer, const float* k, const float* v, int64_t position) = 0;
  /// Post-RoPE query of the current token [n_q_heads * head_dim]; writes
  /// softmax(q·Kᵀ/sqrt(d))·V over every token appended so far (including this step's) into
  /// out [n_q_heads * head_dim]. GQA: query head h uses kv head h / (n_q_heads / n_kv_heads).
  virtual void attend(int layer, const float* q, int64_t position, float* out) = 0;
};

/// Filled by Model::prefill when requested. Per layer: keys post-RoPE [n_tokens][n_kv_heads][head_dim],
/// values, and the post-RoPE queries of the last `obs_window` tokens [obs_window][n_q_heads][head_dim]
/// (fewer when the prompt is shorter: q_obs[l].size() / (n_q_heads * head_dim) rows, the last ones);
/// positions are 0..n_tokens-1. Set obs_window (and capture_pre_rope_keys) before calling prefill.
struct PrefillCapture {
  std::vector<std::vector<float>> k, v, q_obs;
  int obs_window = 0;
  /// When true, prefill also stores the keys before RoPE in k_pre_rope (same layout as k).
  bool capture_pre_rope_keys = false;
  std::vector<std::vector<float>> k_pre_rope;
  int64_t n_tokens = 0;
};

/// Exact fp32 cache: keeps every key and value and attends densely (e8kv::dense_attention).
class DenseKvBackend : public KvBackend {
 public:
  DenseKvBackend(int n_layers, int n_q_heads, int n_kv_heads, int head_dim);
  explicit DenseKvBackend(const ModelConfig& config);
  /// A backend holding the prefill's keys and values (positions 0..n_tokens-1).
  static DenseKvBackend from_capture(const ModelConfig& config, const PrefillCapture& capture);

  void append(int layer, const float* k, const float* v, int64_t position) override;
  void attend(int layer, const float* q, int64_t position, float* out) override;

  /// Replaces the content with the capture's keys and values. Throws e8kv::Error when the
  /// capture's shapes do not match this backend.
  void seed(const PrefillCapture& capture);
  void clear();
  /// Tokens stored in `layer`.
  int64_t size(int layer) const;
  /// Bytes held by keys and values (fp32).
  uint64_t bytes() const;
  /// Copies of the stored keys / values of `layer` as [tokens][n_kv_heads][head_dim].
  std::vector<float> keys(int layer) const;
  std::vector<float> values(int layer) const;

 private:
  void check_layer(int layer) const;
  int n_layers_, n_q_heads_, n_kv_heads_, head_dim_;
  // Per layer, [tokens][n_kv_heads][head_dim] as the model writes them; attention is the
  // library's e8kv::dense_attention over these rows.
  std::vector<std::vector<float>> k_, v_;
};

}  // namespace e8kv::llama
