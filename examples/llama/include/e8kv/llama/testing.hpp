// Tiny random-weight Llama models written as GGUF, for tests that must not download anything
// (the engine's own tests and the evaluation harness's tests).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace e8kv::llama {

struct TinyLlamaSpec {
  int n_layers = 2;
  int n_embd = 64;  // multiple of 32 (quantized rows)
  int n_heads = 4;
  int n_kv_heads = 2;  // GQA
  int n_ff = 96;       // multiple of 32
  int context_length = 512;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = true;  // false: adds an F16 output.weight
  std::string pre = "smollm";   // tokenizer.ggml.pre
  std::string architecture = "llama";
  uint64_t seed = 1;
  // Faults for error tests (tensor names; empty: none).
  std::string omit_tensor;      // left out of the file
  std::string misshape_tensor;  // stored as F32 with one extra row
  std::string bf16_tensor;      // stored as BF16 (a type the engine does not dequantize)
  std::string nan_tensor;       // stored as F32 with a NaN
};

/// The tokenizer part of a tiny model: <|endoftext|>, <|im_start|>, <|im_end|> (control), the
/// 256 GPT-2 byte tokens, then one token per merge of tiny_llama_merges() (in order).
std::vector<std::string> tiny_llama_merges();

/// A complete GGUF v3 image: llama metadata, a ChatML chat template, a byte-level BPE
/// vocabulary with a handful of merges, and random weights (token_embd Q8_0, attention and
/// ffn_down Q4_1, ffn_gate/up F16, norms F32).
std::vector<uint8_t> make_tiny_llama_gguf(const TinyLlamaSpec& spec = {});
/// Writes make_tiny_llama_gguf(spec) to `path`.
void write_tiny_llama_gguf(const std::string& path, const TinyLlamaSpec& spec = {});

}  // namespace e8kv::llama
