// Tiny randomly initialised models in GGUF, written with ggml's own GGUF writer (gguf.h of the
// pinned llama.cpp tree), for the architectures that have no small real model on PyPI: each with
// its real head layout (Llama-3: head_dim 128 and rope_freqs; Qwen3: head_dim 128 with QK-norm;
// Mistral-3: head_dim 128; Phi-3: head_dim 96, fused QKV, LongRoPE factors). Weights are seeded
// Gaussians scaled by 1/sqrt(fan-in), so the logits are peaked enough for a KL to mean something;
// the vocabulary is a 512-token SentencePiece-style list (the tests pass token ids directly).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace e8kv_llama_test {

struct TinyModel {
  std::string name;      ///< for messages: "Llama-3.x (rope_freqs)"
  std::string arch;      ///< GGUF general.architecture: llama, qwen3, mistral3, phi3, ...
  int n_layer = 2;
  int n_embd = 256;
  int n_head = 4;
  int n_head_kv = 2;
  int head_dim = 64;     ///< written as attention.key_length / value_length when not n_embd / n_head
  int n_ff = 512;
  int n_vocab = 512;
  float rope_theta = 10000.f;
  bool rope_freqs = false;     ///< Llama-3.1's frequency bands as a rope_freqs tensor
  bool long_rope = false;      ///< Phi-3's rope_factors_long / _short tensors
  bool qk_norm = false;        ///< attn_q_norm / attn_k_norm (Qwen3)
  bool qkv_bias = false;       ///< q/k/v biases (Qwen2), large on some key channels
  bool fused_qkv = false;      ///< one attn_qkv tensor (Phi-3)
  bool fused_gate_up = false;  ///< ffn_up holds gate and up (Phi-3)
  uint64_t seed = 1;
};

/// The models the architecture tests build: Llama-3.x, Qwen3, Mistral-3, Phi-3.
std::vector<TinyModel> tiny_models();

/// Writes `m` to `path` (overwriting); throws std::runtime_error when it cannot.
void write_tiny_gguf(const TinyModel& m, const std::string& path);

}  // namespace e8kv_llama_test
