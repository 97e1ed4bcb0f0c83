// The real SmolLM2-135M-Instruct (Q4_1 GGUF; E8KV_MODEL or the cache path, scripts/fetch-model.sh):
// hyperparameters from the issue, a greedy chat answer, prefill/decode consistency, batched
// decoding and a perplexity sanity bound. Label `model`: main() in tests/testing/real_model_main.cpp exits 77
// (ctest: skipped) when the file is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "e8kv/llama/model.hpp"

namespace {

using e8kv::llama::DenseKvBackend;
using e8kv::llama::KvBackend;
using e8kv::llama::LogitsMode;
using e8kv::llama::Model;
using e8kv::llama::PrefillCapture;

// The opening of Pride and Prejudice (public domain).
const char* kText =
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
    "want of a wife. However little known the feelings or views of such a man may be on his first entering a "
    "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is considered "
    "the rightful property of some one or other of their daughters.";

const Model& model() {
  static const Model m = Model::load(e8kv::llama::default_model_path());
  return m;
}

int argmax(const float* v, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

TEST(RealModel, HyperparametersFromMetadata) {
  const auto& c = model().config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_embd, 576);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tied_embeddings);
}

TEST(RealModel, GreedyChatAnswerNamesParis) {
  const Model& m = model();
  const auto& tok = m.tokenizer();
  const auto ids = tok.encode(tok.chat_prompt("What is the capital of France?"), true);
  PrefillCapture cap;
  auto logits = m.prefill(ids, &cap, LogitsMode::kLast);
  DenseKvBackend kv = DenseKvBackend::from_capture(m.config(), cap);
  std::string answer;
  for (int i = 0; i < 12; ++i) {
    const int next = argmax(logits.data(), m.config().vocab_size);
    if (next == tok.find("<|im_end|>")) break;
    answer += tok.decode_token(next);
    logits = m.decode_step(next, static_cast<int64_t>(ids.size()) + i, kv);
  }
  std::printf("[chat] %s\n", answer.c_str());
  EXPECT_NE(answer.find("Paris"), std::string::npos) << answer;
}

TEST(RealModel, PrefillDecodeAndBatchAgree) {
  const Model& m = model();
  const int vocab = m.config().vocab_size;
  auto ids = m.tokenizer().encode(kText);
  ids.resize(48);
  const auto full = m.prefill(ids);
  PrefillCapture cap;
  m.prefill(std::vector<int32_t>(ids.begin(), ids.begin() + 40), &cap, LogitsMode::kNone);
  std::vector<DenseKvBackend> kvs;
  for (int b = 0; b < 3; ++b) kvs.push_back(DenseKvBackend::from_capture(m.config(), cap));
  DenseKvBackend solo = DenseKvBackend::from_capture(m.config(), cap);
  double worst_prefill = 0, worst_batch = 0;
  for (int i = 40; i < 48; ++i) {
    const auto batch = m.decode_batch({ids[i], ids[i], ids[i]}, {i, i, i}, {&kvs[0], &kvs[1], &kvs[2]});
    const auto one = m.decode_step(ids[i], i, solo);
    for (int v = 0; v < vocab; ++v) {
      worst_prefill = std::max(worst_prefill, std::fabs(double(one[v]) - full[static_cast<size_t>(i) * vocab + v]));
      for (int b = 0; b < 3; ++b)
        worst_batch = std::max(worst_batch, std::fabs(double(one[v]) - batch[static_cast<size_t>(b) * vocab + v]));
    }
  }
  std::printf("[real] max |decode - prefill| = %.3g, max |batch - single| = %.3g\n", worst_prefill, worst_batch);
  EXPECT_LT(worst_prefill, 1e-3);
  EXPECT_LT(worst_batch, 1e-5);
}

TEST(RealModel, PerplexityOfKnownProseIsLow) {
  const Model& m = model();
  const auto ids = m.tokenizer().encode(kText);
  const auto logits = m.prefill(ids);
  const int vocab = m.config().vocab_size;
  double nll = 0;
  for (size_t i = 1; i < ids.size(); ++i) {
    const float* l = logits.data() + (i - 1) * vocab;
    double mx = l[0], z = 0;
    for (int v = 1; v < vocab; ++v) mx = std::max(mx, double(l[v]));
    for (int v = 0; v < vocab; ++v) z += std::exp(l[v] - mx);
    nll += std::log(z) + mx - l[ids[i]];
  }
  const double ppl = std::exp(nll / double(ids.size() - 1));
  std::printf("[real] perplexity of the Pride and Prejudice opening: %.2f over %zu tokens\n", ppl, ids.size());
  EXPECT_LT(ppl, 60.0);  // measured ~30; a broken forward pass gives hundreds or thousands
  EXPECT_GT(ppl, 1.0);
}

}  // namespace
