// The real SmolLM2-135M-Instruct vocabulary (label `model`; main() in tests/testing/real_model_main.cpp exits 77
// = skipped when the model or a corpus is absent): known ids, and exact round trips of the two
// fetched corpora (scripts/fetch-data.sh).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "e8kv/llama/gguf.hpp"
#include "e8kv/llama/model.hpp"
#include "e8kv/llama/tokenizer.hpp"

namespace {

using e8kv::llama::GgufFile;
using e8kv::llama::Tokenizer;

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::from_gguf(GgufFile::open(e8kv::llama::default_model_path()));
  return t;
}

TEST(RealTokenizer, KnownIds) {
  const Tokenizer& t = tokenizer();
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.pre_name(), "smollm");
  EXPECT_EQ(t.find("<|im_start|>"), 1);
  EXPECT_EQ(t.find("<|im_end|>"), 2);
  // Whole words of common English are single tokens with the leading-space form.
  for (const char* w : {" the", " and", " of", " house"}) EXPECT_EQ(t.encode(w).size(), 1u) << w;
  EXPECT_EQ(t.encode("2024").size(), 4u);  // digits are split one by one
}

class RealCorpus : public ::testing::TestWithParam<const char*> {};

TEST_P(RealCorpus, ExactRoundTrip) {
  const std::string path = e8kv::llama::default_cache_dir() + "/text/" + GetParam();
  std::ifstream in(path, std::ios::binary);
  if (!in) GTEST_SKIP() << "corpus absent: " << path << " (scripts/fetch-text.sh)";
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const Tokenizer& t = tokenizer();
  const auto ids = t.encode(text);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_GT(ids.size(), text.size() / 8);  // English BPE: ~4 bytes per token, never 8
  std::printf("[corpus] %s: %zu bytes -> %zu tokens, exact round trip\n", GetParam(), text.size(), ids.size());
}

INSTANTIATE_TEST_SUITE_P(Fetched, RealCorpus, ::testing::Values("tech.txt", "fiction.txt"));

}  // namespace
