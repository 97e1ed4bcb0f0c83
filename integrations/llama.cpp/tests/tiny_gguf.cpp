// Tiny randomly initialised GGUF models (tiny_gguf.hpp), written with ggml's gguf.h.
#include "tiny_gguf.hpp"

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>

#include "ggml.h"
#include "gguf.h"

namespace e8kv_llama_test {

std::vector<TinyModel> tiny_models() {
  std::vector<TinyModel> v;
  TinyModel llama3;  // Llama-3.2-1B's head layout: head_dim 128, 4 query heads per KV head, rope_freqs
  llama3.name = "Llama-3.x (rope_freqs)";
  llama3.arch = "llama";
  llama3.n_embd = 512;
  llama3.n_head = 4;
  llama3.n_head_kv = 1;
  llama3.head_dim = 128;
  llama3.rope_theta = 500000.f;
  llama3.rope_freqs = true;
  llama3.seed = 31;
  v.push_back(llama3);
  TinyModel qwen3;  // Qwen3-0.6B's: head_dim 128 (more than n_embd / n_head), QK-norm, NEOX
  qwen3.name = "Qwen3 (QK-norm, head_dim 128)";
  qwen3.arch = "qwen3";
  qwen3.n_embd = 256;
  qwen3.n_head = 4;
  qwen3.n_head_kv = 2;
  qwen3.head_dim = 128;
  qwen3.rope_theta = 1000000.f;
  qwen3.qk_norm = true;
  qwen3.seed = 32;
  v.push_back(qwen3);
  TinyModel mistral3;  // Ministral's: head_dim 128, 4 query heads per KV head
  mistral3.name = "Mistral-3 (Ministral)";
  mistral3.arch = "mistral3";
  mistral3.n_embd = 384;
  mistral3.n_head = 4;
  mistral3.n_head_kv = 1;
  mistral3.head_dim = 128;
  mistral3.rope_theta = 1000000.f;
  mistral3.seed = 33;
  v.push_back(mistral3);
  TinyModel phi3;  // Phi-3-mini's: head_dim 96, no GQA, fused QKV and gate/up, LongRoPE factors
  phi3.name = "Phi-3 (LongRoPE, head_dim 96)";
  phi3.arch = "phi3";
  phi3.n_embd = 384;
  phi3.n_head = 4;
  phi3.n_head_kv = 4;
  phi3.head_dim = 96;
  phi3.long_rope = true;
  phi3.fused_qkv = true;
  phi3.fused_gate_up = true;
  phi3.seed = 34;
  v.push_back(phi3);
  return v;
}

namespace {

struct GgufDeleter {
  void operator()(gguf_context* g) const { gguf_free(g); }
};
struct GgmlDeleter {
  void operator()(ggml_context* c) const { ggml_free(c); }
};

}  // namespace

void write_tiny_gguf(const TinyModel& m, const std::string& path) {
  std::unique_ptr<gguf_context, GgufDeleter> g(gguf_init_empty());
  const std::string a = m.arch;
  auto key = [&](const char* k) { return a + "." + k; };
  gguf_set_val_str(g.get(), "general.architecture", a.c_str());
  // A neutral name: llama.cpp sets per-model token attributes by name ("phi-3" wants <|endoftext|>).
  gguf_set_val_str(g.get(), "general.name", "e8kv tiny random model");
  if (a == "granite") gguf_set_val_f32(g.get(), key("logit_scale").c_str(), 1.f);  // required by its loader
  gguf_set_val_u32(g.get(), key("context_length").c_str(), 4096);
  gguf_set_val_u32(g.get(), key("embedding_length").c_str(), static_cast<uint32_t>(m.n_embd));
  gguf_set_val_u32(g.get(), key("block_count").c_str(), static_cast<uint32_t>(m.n_layer));
  gguf_set_val_u32(g.get(), key("feed_forward_length").c_str(), static_cast<uint32_t>(m.n_ff));
  gguf_set_val_u32(g.get(), key("attention.head_count").c_str(), static_cast<uint32_t>(m.n_head));
  gguf_set_val_u32(g.get(), key("attention.head_count_kv").c_str(), static_cast<uint32_t>(m.n_head_kv));
  gguf_set_val_u32(g.get(), key("attention.key_length").c_str(), static_cast<uint32_t>(m.head_dim));
  gguf_set_val_u32(g.get(), key("attention.value_length").c_str(), static_cast<uint32_t>(m.head_dim));
  gguf_set_val_u32(g.get(), key("rope.dimension_count").c_str(), static_cast<uint32_t>(m.head_dim));
  gguf_set_val_f32(g.get(), key("attention.layer_norm_rms_epsilon").c_str(), 1e-5f);
  gguf_set_val_f32(g.get(), key("rope.freq_base").c_str(), m.rope_theta);
  if (m.long_rope) gguf_set_val_u32(g.get(), key("rope.scaling.original_context_length").c_str(), 4096);
  // A SentencePiece-style vocabulary: <unk> <s> </s>, the 256 byte tokens, then plain pieces.
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int i = 0; i < m.n_vocab; ++i) {
    char buf[16];
    if (i == 0) pieces.emplace_back("<unk>");
    else if (i == 1) pieces.emplace_back("<s>");
    else if (i == 2) pieces.emplace_back("</s>");
    else if (i < 3 + 256) {
      std::snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
      pieces.emplace_back(buf);
    } else {
      std::snprintf(buf, sizeof buf, "\xe2\x96\x81t%d", i);  // "▁t<i>"
      pieces.emplace_back(buf);
    }
    scores.push_back(-static_cast<float>(i));
    types.push_back(i == 0 ? 2 : i < 3 ? 3 : i < 3 + 256 ? 6 : 1);
  }
  std::vector<const char*> cstr;
  for (const auto& p : pieces) cstr.push_back(p.c_str());
  gguf_set_val_str(g.get(), "tokenizer.ggml.model", "llama");
  gguf_set_arr_str(g.get(), "tokenizer.ggml.tokens", cstr.data(), cstr.size());
  gguf_set_arr_data(g.get(), "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores.data(), scores.size());
  gguf_set_arr_data(g.get(), "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types.data(), types.size());
  gguf_set_val_u32(g.get(), "tokenizer.ggml.unknown_token_id", 0);
  gguf_set_val_u32(g.get(), "tokenizer.ggml.bos_token_id", 1);
  gguf_set_val_u32(g.get(), "tokenizer.ggml.eos_token_id", 2);

  const int64_t E = m.n_embd, Dq = static_cast<int64_t>(m.n_head) * m.head_dim,
                Dkv = static_cast<int64_t>(m.n_head_kv) * m.head_dim, F = m.n_ff, V = m.n_vocab;
  const int64_t pairs = m.head_dim / 2;
  int64_t elements = E * V + E + E * V;
  for (int l = 0; l < m.n_layer; ++l)
    elements += 2 * E + E * (Dq + 2 * Dkv) + (Dq + 2 * Dkv) + Dq * E + 2 * m.head_dim + 3 * E * F + E;
  elements += 2 * pairs;
  ggml_init_params ip{static_cast<size_t>(elements) * sizeof(float) + static_cast<size_t>(1024 + 64 * m.n_layer) * ggml_tensor_overhead(),
                      nullptr, false};
  std::unique_ptr<ggml_context, GgmlDeleter> ctx(ggml_init(ip));
  if (!ctx) throw std::runtime_error("tiny GGUF: ggml_init failed");
  std::mt19937_64 rng(m.seed);
  std::normal_distribution<float> gauss(0.f, 1.f);
  auto tensor = [&](const std::string& name, std::vector<int64_t> ne, float std_dev, float mean = 0.f) {
    ggml_tensor* t = ne.size() == 1 ? ggml_new_tensor_1d(ctx.get(), GGML_TYPE_F32, ne[0])
                                    : ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, ne[0], ne[1]);
    ggml_set_name(t, name.c_str());
    auto* d = static_cast<float*>(t->data);
    for (int64_t i = 0; i < ggml_nelements(t); ++i) d[i] = mean + std_dev * gauss(rng);
    gguf_add_tensor(g.get(), t);
    return d;
  };
  const float s_e = 1.f / std::sqrt(static_cast<float>(E));
  tensor("token_embd.weight", {E, V}, 1.f);
  tensor("output_norm.weight", {E}, 0.f, 1.f);
  tensor("output.weight", {E, V}, 2.f * s_e);  // peaked enough next-token distributions
  for (int l = 0; l < m.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    tensor(b + "attn_norm.weight", {E}, 0.f, 1.f);
    if (m.fused_qkv) {
      tensor(b + "attn_qkv.weight", {E, Dq + 2 * Dkv}, 1.5f * s_e);
    } else {
      tensor(b + "attn_q.weight", {E, Dq}, 1.5f * s_e);
      tensor(b + "attn_k.weight", {E, Dkv}, 1.5f * s_e);
      tensor(b + "attn_v.weight", {E, Dkv}, s_e);
    }
    if (m.qkv_bias) {
      tensor(b + "attn_q.bias", {Dq}, 0.1f);
      float* kb = tensor(b + "attn_k.bias", {Dkv}, 0.1f);
      for (int64_t i = 0; i < Dkv; i += 17) kb[i] = 60.f * (i % 2 ? 1.f : -1.f);  // a few large channels
      tensor(b + "attn_v.bias", {Dkv}, 0.1f);
    }
    if (m.qk_norm) {
      tensor(b + "attn_q_norm.weight", {m.head_dim}, 0.2f, 1.f);
      tensor(b + "attn_k_norm.weight", {m.head_dim}, 0.2f, 1.f);
    }
    tensor(b + "attn_output.weight", {Dq, E}, 1.f / std::sqrt(static_cast<float>(Dq)));
    tensor(b + "ffn_norm.weight", {E}, 0.f, 1.f);
    if (m.fused_gate_up) {
      tensor(b + "ffn_up.weight", {E, 2 * F}, s_e);
    } else {
      tensor(b + "ffn_gate.weight", {E, F}, s_e);
      tensor(b + "ffn_up.weight", {E, F}, s_e);
    }
    tensor(b + "ffn_down.weight", {F, E}, 1.f / std::sqrt(static_cast<float>(F)));
  }
  if (m.rope_freqs) {  // Llama-3.1's bands: factor 8, low 1, high 4, original context 8192
    float* f = tensor("rope_freqs.weight", {pairs}, 0.f, 1.f);
    for (int64_t i = 0; i < pairs; ++i) {
      const double freq = 1.0 / std::pow(static_cast<double>(m.rope_theta), 2.0 * static_cast<double>(i) / m.head_dim);
      const double wavelen = 2 * M_PI / freq;
      double factor = 1.0;
      if (wavelen > 8192.0) factor = 8.0;
      else if (wavelen > 8192.0 / 4.0) {
        const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
        factor = 1.0 / ((1 - smooth) / 8.0 + smooth);
      }
      f[i] = static_cast<float>(factor);
    }
  }
  if (m.long_rope) {
    float* lo = tensor("rope_factors_short.weight", {pairs}, 0.f, 1.f);
    float* hi = tensor("rope_factors_long.weight", {pairs}, 0.f, 1.f);
    for (int64_t i = 0; i < pairs; ++i) {
      lo[i] = 1.f + 0.04f * static_cast<float>(i);
      hi[i] = 1.f + 0.6f * static_cast<float>(i);
    }
  }
  if (!gguf_write_to_file(g.get(), path.c_str(), false)) throw std::runtime_error("tiny GGUF: cannot write " + path);
}

}  // namespace e8kv_llama_test
