#include "e8kv/llama/testing.hpp"

#include <cmath>
#include <cstring>
#include <random>

#include "e8kv/llama/gguf.hpp"
#include "e8kv/llama/tokenizer.hpp"

namespace e8kv::llama {

namespace {
std::string cp_utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {  // byte images are < 0x800
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}
}  // namespace

std::vector<std::string> tiny_llama_merges() {
  // "Ġ" is the GPT-2 image of the space byte.
  return {"Ġ t",   "h e", "Ġt he", "i n",   "in g", "Ġ a", "e r", "o n", "a n", "an d",
          "Ġ and", "Ġ s", "Ġ Ġ",   "ĠĠ ĠĠ", "r e",  "o u", "Ġ w", "e d", "Ġ o", "Ġo f"};
}

std::vector<uint8_t> make_tiny_llama_gguf(const TinyLlamaSpec& s) {
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(cp_utf8(gpt2_byte_to_codepoint(static_cast<uint8_t>(b))));
    types.push_back(1);
  }
  const auto merges = tiny_llama_merges();
  for (const auto& m : merges) {
    const size_t sp = m.find(' ');
    tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
    types.push_back(1);
  }
  const int vocab = static_cast<int>(tokens.size());
  const int head_dim = s.n_embd / s.n_heads;

  GgufWriter w;
  w.add_string("general.architecture", s.architecture);
  w.add_string("general.name", "tiny-test-llama");
  const std::string a = s.architecture + ".";
  w.add_uint32(a + "block_count", static_cast<uint32_t>(s.n_layers));
  w.add_uint32(a + "context_length", static_cast<uint32_t>(s.context_length));
  w.add_uint32(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
  w.add_uint32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff));
  w.add_uint32(a + "attention.head_count", static_cast<uint32_t>(s.n_heads));
  w.add_uint32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_kv_heads));
  w.add_float32(a + "rope.freq_base", s.rope_theta);
  w.add_float32(a + "attention.layer_norm_rms_epsilon", s.rms_eps);
  w.add_uint32(a + "rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.add_uint32(a + "vocab_size", static_cast<uint32_t>(vocab));
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", s.pre);
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_int32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", merges);
  w.add_uint32("tokenizer.ggml.bos_token_id", 1);
  w.add_uint32("tokenizer.ggml.eos_token_id", 2);
  w.add_uint32("tokenizer.ggml.unknown_token_id", 0);
  w.add_string("tokenizer.chat_template",
               "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
               "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
               "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}");

  // Adds a tensor, applying the spec's faults.
  auto add = [&](const std::string& name, std::vector<int64_t> dims, GgmlType type, std::vector<float> values) {
    if (name == s.omit_tensor) return;
    if (name == s.misshape_tensor) {
      dims.back() += 1;
      values.resize(values.size() + static_cast<size_t>(values.size() / static_cast<size_t>(dims.back() - 1)), 0.5f);
      type = GgmlType::kF32;
    }
    if (name == s.nan_tensor) {
      values[values.size() / 2] = std::nanf("");
      type = GgmlType::kF32;
    }
    if (name == s.bf16_tensor) {
      std::vector<uint8_t> raw(values.size() * 2);
      for (size_t i = 0; i < values.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &values[i], 4);
        const uint16_t hi = static_cast<uint16_t>(bits >> 16);
        std::memcpy(raw.data() + 2 * i, &hi, 2);
      }
      w.add_raw_tensor(name, dims, static_cast<uint32_t>(GgmlType::kBF16), std::move(raw));
      return;
    }
    w.add_tensor(name, dims, type, values);
  };
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  auto random = [&](size_t n, float scale, float mean = 0.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = mean + scale * gauss(rng);
    return v;
  };
  const int64_t d = s.n_embd, qd = static_cast<int64_t>(s.n_heads) * head_dim,
                kvd = static_cast<int64_t>(s.n_kv_heads) * head_dim, ff = s.n_ff;
  add("token_embd.weight", {d, vocab}, GgmlType::kQ8_0, random(static_cast<size_t>(d * vocab), 1.0f));
  add("output_norm.weight", {d}, GgmlType::kF32, random(d, 0.1f, 1.0f));
  if (!s.tied_embeddings)
    add("output.weight", {d, vocab}, GgmlType::kF16, random(static_cast<size_t>(d * vocab), 0.5f));
  auto scaled = [](int64_t n_in) { return 1.0f / std::sqrt(static_cast<float>(n_in)); };
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", {d}, GgmlType::kF32, random(d, 0.1f, 1.0f));
    // Larger query/key weights give peaked attention, so the test exercises real softmax mixing.
    add(b + "attn_q.weight", {d, qd}, GgmlType::kQ4_1, random(static_cast<size_t>(d * qd), 3 * scaled(d)));
    add(b + "attn_k.weight", {d, kvd}, GgmlType::kQ4_1, random(static_cast<size_t>(d * kvd), 3 * scaled(d)));
    add(b + "attn_v.weight", {d, kvd}, GgmlType::kQ4_1, random(static_cast<size_t>(d * kvd), scaled(d)));
    add(b + "attn_output.weight", {qd, d}, GgmlType::kQ4_1, random(static_cast<size_t>(qd * d), scaled(qd)));
    add(b + "ffn_norm.weight", {d}, GgmlType::kF32, random(d, 0.1f, 1.0f));
    add(b + "ffn_gate.weight", {d, ff}, GgmlType::kF16, random(static_cast<size_t>(d * ff), scaled(d)));
    add(b + "ffn_up.weight", {d, ff}, GgmlType::kF16, random(static_cast<size_t>(d * ff), scaled(d)));
    add(b + "ffn_down.weight", {ff, d}, GgmlType::kQ4_1, random(static_cast<size_t>(ff * d), scaled(ff)));
  }
  return w.bytes();
}

void write_tiny_llama_gguf(const std::string& path, const TinyLlamaSpec& spec) {
  const auto bytes = make_tiny_llama_gguf(spec);
  GgufWriter::write_bytes(path, bytes);
}

}  // namespace e8kv::llama
