// What the llama.cpp tests share: a model and its contexts through llama.cpp's public API
// (e8kv's memory with a spec, or llama.cpp's own cache of a type), decode calls that return every
// token's logits, and the comparisons (largest logit difference, mean next-token KL).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "llama.h"

namespace e8kv_llama_test {

struct ModelDeleter {
  void operator()(llama_model* m) const { llama_model_free(m); }
};
struct ContextDeleter {
  void operator()(llama_context* c) const { llama_free(c); }
};
using ModelPtr = std::unique_ptr<llama_model, ModelDeleter>;
using ContextPtr = std::unique_ptr<llama_context, ContextDeleter>;

// Two paragraphs of plain prose, tokenized once by the tests (258 tokens with SmolLM2's vocabulary).
inline const char* kText =
    "The lighthouse keeper wrote in his log every evening. On the first of March the wind came from the "
    "north-east and the sea was grey. Two fishing boats returned late, and the younger captain, whose name "
    "was Elena Brandt, said the nets had caught almost nothing but weed. The keeper noted the barometer at "
    "1012 hectopascals, falling slowly. In the morning he repaired the lamp's clockwork, which had lost "
    "eleven minutes overnight, and he oiled the gears with the last of the whale oil from the storeroom. "
    "A letter from the harbour master asked whether the fog signal could be tested on Thursday. He replied "
    "that the compressor was worn and that a new one had been ordered from the mainland in January. "
    "On Friday the supply boat brought flour, paraffin, two crates of apples and a newspaper that was nine "
    "days old. The keeper read that the railway would reach the northern villages by the autumn, and that "
    "the price of coal had risen again. He counted the paraffin cans twice, because the last delivery had "
    "been short by three, and he wrote the number in red ink: fourteen. That night the beam turned every "
    "twelve seconds as it always had, and the captain's boat passed the point at a quarter past ten.";

/// llama.cpp's warnings and errors since the last clear (the memory's refusals and its bits line).
inline std::string& log_text() {
  static std::string text;
  return text;
}

inline void capture_log() {
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) log_text() += text;
      },
      nullptr);
}

inline ModelPtr load_model(const std::string& path) {
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  return ModelPtr(llama_model_load_from_file(path.c_str(), mp));
}

struct ContextOptions {
  const char* spec = nullptr;  ///< e8kv's memory with this spec, or null: llama.cpp's own cache
  ggml_type type = GGML_TYPE_F16;
  int n_seq = 1;
  int threads = 2;
  uint32_t n_ctx = 1024, n_batch = 512, n_ubatch = 512;
};

inline ContextPtr make_context(llama_model* model, const ContextOptions& o) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = o.n_ctx;
  cp.n_batch = o.n_batch;
  cp.n_ubatch = o.n_ubatch;
  cp.n_seq_max = static_cast<uint32_t>(o.n_seq);
  cp.n_threads = o.threads;
  cp.n_threads_batch = o.threads;
  cp.type_k = o.type;
  cp.type_v = o.type;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.kv_e8kv = o.spec;
  return ContextPtr(llama_init_from_model(model, cp));
}

inline int n_vocab(const llama_model* model) { return llama_vocab_n_tokens(llama_model_get_vocab(model)); }

/// Decodes toks[begin, end) of sequence `seq` at positions begin.. in one llama_decode call,
/// returning every token's logits (n_vocab each); empty when llama_decode fails (rc_out: its code).
inline std::vector<float> decode(llama_context* ctx, const std::vector<llama_token>& toks, size_t begin, size_t end,
                                 llama_seq_id seq = 0, int* rc_out = nullptr) {
  const int n = static_cast<int>(end - begin);
  llama_batch b = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    b.token[i] = toks[begin + static_cast<size_t>(i)];
    b.pos[i] = static_cast<llama_pos>(begin) + i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = seq;
    b.logits[i] = 1;
  }
  b.n_tokens = n;
  const int rc = llama_decode(ctx, b);
  llama_batch_free(b);
  if (rc_out) *rc_out = rc;
  if (rc != 0) return {};
  const int nv = n_vocab(llama_get_model(ctx));
  std::vector<float> out;
  for (int i = 0; i < n; ++i) {
    const float* l = llama_get_logits_ith(ctx, i);
    out.insert(out.end(), l, l + nv);
  }
  return out;
}

/// toks[begin, end) one llama_decode call per token.
inline std::vector<float> decode_one_by_one(llama_context* ctx, const std::vector<llama_token>& toks, size_t begin,
                                            size_t end) {
  std::vector<float> out;
  for (size_t t = begin; t < end; ++t) {
    std::vector<float> l = decode(ctx, toks, t, t + 1);
    if (l.empty()) return {};
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0.f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

/// Mean KL(p_a || p_b) over the rows (softmax of each n_vocab row).
inline double mean_kl(const std::vector<float>& a, const std::vector<float>& b, int nv) {
  const size_t rows = a.size() / static_cast<size_t>(nv);
  if (rows == 0 || a.size() != b.size()) return INFINITY;
  double total = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float* x = a.data() + r * static_cast<size_t>(nv);
    const float* y = b.data() + r * static_cast<size_t>(nv);
    const double mx = *std::max_element(x, x + nv), my = *std::max_element(y, y + nv);
    double sx = 0, sy = 0;
    for (int i = 0; i < nv; ++i) sx += std::exp(x[i] - mx), sy += std::exp(y[i] - my);
    const double lx = mx + std::log(sx), ly = my + std::log(sy);
    double kl = 0;
    for (int i = 0; i < nv; ++i) kl += std::exp(x[i] - lx) * ((x[i] - lx) - (y[i] - ly));
    total += kl;
  }
  return total / static_cast<double>(rows);
}

/// The tokens of `text` (up to `limit`), with BOS.
inline std::vector<llama_token> tokenize(const llama_model* model, const std::string& text, size_t limit) {
  std::vector<llama_token> t(text.size() + 16);
  const int n = llama_tokenize(llama_model_get_vocab(model), text.data(), static_cast<int32_t>(text.size()), t.data(),
                               static_cast<int32_t>(t.size()), true, false);
  t.resize(static_cast<size_t>(std::max(n, 0)));
  if (t.size() > limit) t.resize(limit);
  return t;
}

/// The first `bytes` of a corpus file (scripts/fetch-text.sh), or empty when it is absent.
inline std::string read_text(const std::string& path, size_t bytes) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return {};
  std::string text(bytes, '\0');
  text.resize(std::fread(&text[0], 1, text.size(), f));
  std::fclose(f);
  return text;
}

/// One llama_decode call of toks[first, first + n) at positions pos0.., sequence 0, logits for the
/// tokens where want(i) holds; appends those logits to out. False when the call fails.
template <class Want>
bool decode_call(llama_context* ctx, const std::vector<llama_token>& toks, size_t first, int n, int pos0, Want want,
                 std::vector<float>& out) {
  const int nv = n_vocab(llama_get_model(ctx));
  llama_batch b = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; ++i) {
    b.token[i] = toks[first + static_cast<size_t>(i)];
    b.pos[i] = pos0 + i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = want(i);
  }
  b.n_tokens = n;
  const int rc = llama_decode(ctx, b);
  llama_batch_free(b);
  if (rc != 0) return false;
  for (int i = 0; i < n; ++i) {
    if (!want(i)) continue;
    const float* l = llama_get_logits_ith(ctx, i);
    out.insert(out.end(), l, l + nv);
  }
  return true;
}

/// llama-perplexity's --kl-divergence protocol through the API: per chunk of 2·half tokens, the
/// memory cleared, the first half in one call (the prompt), the second half in later calls of
/// `call` tokens, whose logits (all but the chunk's last token's) are returned. Empty on a failed call.
inline std::vector<float> scored_logits(llama_context* ctx, const std::vector<llama_token>& toks, int chunks, int half,
                                        int call) {
  std::vector<float> out;
  for (int c = 0; c < chunks; ++c) {
    llama_memory_clear(llama_get_memory(ctx), true);
    const size_t base = static_cast<size_t>(c) * 2 * static_cast<size_t>(half);
    if (!decode_call(ctx, toks, base, half, 0, [](int) { return false; }, out)) return {};
    for (int at = half; at < 2 * half; at += call) {
      const int n = std::min(2 * half, at + call) - at;
      if (!decode_call(ctx, toks, base + static_cast<size_t>(at), n, at,
                       [&](int i) { return at + i < 2 * half - 1; }, out))
        return {};
    }
  }
  return out;
}

}  // namespace e8kv_llama_test
