// e8kv's llama.cpp memory on the architectures people run, inside llama.cpp through its public
// API: Gemma-3-270M (sliding-window and global layers, head_dim 256) and Qwen2.5-Coder-0.5B
// (qwen2, k_proj biases of a few hundred) as the real GGUFs scripts/fetch-model.sh fetches, and
// tiny randomly initialised GGUFs written here for Llama-3.x (rope_freqs), Qwen3 (QK-norm,
// head_dim 128), Mistral-3 and Phi-3 (LongRoPE, head_dim 96). Per model: `lossless` is llama.cpp's
// f16 cache within llama.cpp's own f16-vs-f32 noise; a later call of 64 tokens gives what 64
// single-token calls give, bit for bit; a lossy preset stays within a KL bound against the f16
// cache (llama-perplexity's protocol); a saved sequence restores into a fresh context and decodes
// on identically. An architecture e8kv does not map is refused by name. On Qwen2.5, e8kv at under
// 3 bits must beat llama.cpp's rotated q4_0 (4.5 bits) in KL, as docs/llama-cpp.md reports.
//
// main() below: exit 77 (skipped) when a real model or the corpus is absent, unless
// E8KV_REQUIRE_DATA=1 (CI), which makes that a failure.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "llama-e8kv-memory.h"
#include "e8kv/llama_cpp/memory_state.hpp"
#include "llama_fixture.hpp"
#include "tiny_gguf.hpp"

namespace e8kv_llama_test {
namespace {

constexpr uint64_t kSeed = 7;

std::string cache_dir() {
  if (const char* c = std::getenv("E8KV_CACHE"); c != nullptr && *c) return c;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/e8kv";
}

struct Subject {
  std::string name;
  std::string path;
  bool real = false;     ///< fetched by scripts/fetch-model.sh (skipped when absent)
  // KL bounds of the perplexity protocol (2 chunks of 512 on the fiction corpus, or of seeded
  // tokens for the tiny models), at 1.5x what was measured when this test was written.
  double kl_quant_k3v2 = 0, kl_tier_k3v2 = 0;
};

std::string tiny_path(const TinyModel& m) { return testing::TempDir() + "e8kv-tiny-" + m.arch + ".gguf"; }

std::vector<Subject>& subjects() {
  static std::vector<Subject> s = [] {
    std::vector<Subject> v;
    // Measured: Gemma-3 0.0404 / 0.0275, Qwen2.5 0.0140 / 0.0130.
    v.push_back({"Gemma-3-270M", cache_dir() + "/models/gemma-3-270m-q4_k_m.gguf", true, 0.061, 0.042});
    v.push_back({"Qwen2.5-Coder-0.5B", cache_dir() + "/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", true, 0.021, 0.020});
    // Tiny random models (quant-k3v2 / tier-k3v2): measured KL 0.060 / 0.058 (Llama-3.x), 0.0058 /
    // 0.0054 (Qwen3), 0.060 / 0.057 (Mistral-3), 0.118 / 0.115 (Phi-3: four KV heads, no GQA). Random
    // keys have no shared direction to centre on, so every key frame gives about the same there.
    const double bounds[][2] = {{0.09, 0.09}, {0.009, 0.009}, {0.09, 0.09}, {0.18, 0.18}};
    size_t i = 0;
    for (const TinyModel& m : tiny_models()) {
      write_tiny_gguf(m, tiny_path(m));
      v.push_back({m.name, tiny_path(m), false, bounds[i][0], bounds[i][1]});
      ++i;
    }
    return v;
  }();
  return s;
}

// Each model loaded once for the whole binary (freed before llama_backend_free, in main).
std::map<std::string, ModelPtr>& loaded_models() {
  static std::map<std::string, ModelPtr> loaded;
  return loaded;
}

llama_model* model_of(const Subject& s) {
  auto& loaded = loaded_models();
  auto it = loaded.find(s.path);
  if (it == loaded.end()) it = loaded.emplace(s.path, load_model(s.path)).first;
  return it->second.get();
}

bool present(const Subject& s) { return std::ifstream(s.path).good(); }

// The tokens a model is tested on: the fiction corpus for the real models (their vocabularies
// tokenize it), seeded ids for the tiny ones (a random model's next token is as random as its text).
std::vector<llama_token> tokens_for(const Subject& s, llama_model* m, size_t n) {
  if (s.real) {
    const std::string text = read_text(cache_dir() + "/text/fiction.txt", 400000);
    if (!text.empty()) return tokenize(m, text, n);
    return {};
  }
  std::vector<llama_token> t;
  uint64_t x = kSeed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t.push_back(static_cast<llama_token>(3 + 256 + (x >> 33) % (static_cast<uint64_t>(n_vocab(m)) - 259)));
  }
  return t;
}

class Architectures : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    subject_ = &subjects()[GetParam()];
    log_text().clear();
    if (!present(*subject_)) GTEST_SKIP() << subject_->name << " absent: " << subject_->path << " (scripts/fetch-data.sh)";
    model_ = model_of(*subject_);
    ASSERT_NE(model_, nullptr) << "cannot load " << subject_->path << ": " << log_text();
    tokens_ = tokens_for(*subject_, model_, 1100);
    if (tokens_.size() < 1024) GTEST_SKIP() << "corpus absent: " << cache_dir() << "/text/fiction.txt";
    log_text().clear();
  }
  ContextPtr context(const char* spec, ggml_type type = GGML_TYPE_F16) {
    ContextOptions o;
    o.spec = spec;
    o.type = type;
    return make_context(model_, o);
  }
  const Subject* subject_ = nullptr;
  llama_model* model_ = nullptr;
  std::vector<llama_token> tokens_;
};

constexpr size_t kPrompt = 200, kLater = 64;

TEST_P(Architectures, LosslessIsLlamaCppsCacheWithinItsNoise) {
  ContextPtr f32 = context(nullptr, GGML_TYPE_F32), f16 = context(nullptr), e8 = context("preset=lossless");
  ASSERT_TRUE(f32 && f16 && e8) << log_text();
  auto run = [&](llama_context* c) {
    std::vector<float> p = decode(c, tokens_, 0, kPrompt), d = decode(c, tokens_, kPrompt, kPrompt + kLater);
    p.insert(p.end(), d.begin(), d.end());
    return p;
  };
  const std::vector<float> a = run(f32.get()), b = run(f16.get()), c = run(e8.get());
  ASSERT_FALSE(a.empty() || b.empty() || c.empty()) << log_text();
  const int nv = n_vocab(model_);
  const double noise = mean_kl(a, b, nv), kl = mean_kl(a, c, nv);
  std::printf("%s: lossless vs f32 cache KL %.3g; f16 cache vs f32 cache %.3g\n", subject_->name.c_str(), kl, noise);
  EXPECT_LE(kl, 2.0 * noise + 1e-4);
}

TEST_P(Architectures, LaterCallEqualsTokenByToken) {
  auto batched = [&](llama_context* c) {
    if (decode(c, tokens_, 0, kPrompt).empty()) return std::vector<float>{};
    return decode(c, tokens_, kPrompt, kPrompt + kLater);
  };
  auto single = [&](llama_context* c) {
    if (decode(c, tokens_, 0, kPrompt).empty()) return std::vector<float>{};
    return decode_one_by_one(c, tokens_, kPrompt, kPrompt + kLater);
  };
  ContextPtr a = context(nullptr), b = context(nullptr);
  const std::vector<float> fa = batched(a.get()), fb = single(b.get());
  const int nv = n_vocab(model_);
  const float f16_noise = max_abs_diff(fa, fb);
  const double f16_kl = mean_kl(fb, fa, nv);
  for (const char* spec : {"preset=quant-k3v2", "preset=tier-k3v2"}) {
    ContextPtr x = context(spec), y = context(spec);
    ASSERT_TRUE(x && y) << log_text();
    const std::vector<float> bx = batched(x.get()), sy = single(y.get());
    ASSERT_FALSE(bx.empty() || sy.empty()) << spec << ": " << log_text();
    const float diff = max_abs_diff(bx, sy);
    const double kl = mean_kl(sy, bx, nv);
    std::printf("%s %s: %zu tokens in one call vs one by one: max |logit diff| %.3g, KL %.3g (f16 cache: %.3g, "
                "KL %.3g)\n", subject_->name.c_str(), spec, kLater, diff, kl, f16_noise, f16_kl);
    if (f16_noise == 0.f) {
      // llama.cpp computes every batch size alike (the tiny models' f32 weights): e8kv must too.
      EXPECT_EQ(diff, 0.f) << spec;
    } else {
      // Quantized weights: llama.cpp's own matrix products round differently per batch size (the
      // f16 cache's difference, whole logits on Gemma-3); e8kv adds nothing measurable to it.
      EXPECT_LE(kl, 2.0 * f16_kl + 1e-4) << spec;
    }
  }
}

TEST_P(Architectures, LossyPresetsWithinKlBounds) {
  const std::vector<float> base = [&] {
    ContextPtr c = context(nullptr);
    return scored_logits(c.get(), tokens_, 2, 256, 64);
  }();
  ASSERT_FALSE(base.empty()) << log_text();
  const int nv = n_vocab(model_);
  const struct {
    const char* spec;
    double bound;
  } rows[] = {{"preset=quant-k3v2", subject_->kl_quant_k3v2}, {"preset=tier-k3v2", subject_->kl_tier_k3v2}};
  for (const auto& r : rows) {
    ContextPtr c = context(r.spec);
    ASSERT_TRUE(c) << log_text();
    const std::vector<float> got = scored_logits(c.get(), tokens_, 2, 256, 64);
    ASSERT_FALSE(got.empty()) << r.spec << ": " << log_text();
    const double kl = mean_kl(base, got, nv);
    std::printf("%s %s: mean KL %.5f against the f16 cache over %zu scored tokens (bound %.4f)\n",
                subject_->name.c_str(), r.spec, kl, got.size() / static_cast<size_t>(nv), r.bound);
    EXPECT_LE(kl, r.bound) << r.spec;
    EXPECT_GT(kl, 1e-7) << r.spec << ": a quantized cache that changes nothing is not being read";
  }
}

TEST_P(Architectures, SavedSequenceRestoresAndDecodesOn) {
  ContextPtr a = context("preset=tier-k3v2"), b = context("preset=tier-k3v2");
  ASSERT_TRUE(a && b) << log_text();
  ASSERT_FALSE(decode(a.get(), tokens_, 0, kPrompt).empty()) << log_text();
  ASSERT_FALSE(decode(a.get(), tokens_, kPrompt, kPrompt + 16).empty()) << log_text();
  std::vector<uint8_t> state(llama_state_seq_get_size(a.get(), 0));
  ASSERT_EQ(llama_state_seq_get_data(a.get(), state.data(), state.size(), 0), state.size());
  // The fleet tool checks a --kv-e8kv server's codes against the spec alone (spec_difference,
  // with each container's own shape and RoPE): every group of every architecture must pass, or
  // push would refuse this model's slots.
  {
    const e8kv::llama_cpp::MemoryState parsed = e8kv::llama_cpp::parse_memory_state(state.data() + 8, state.size() - 8);
    ASSERT_EQ(parsed.sequences.size(), 1u);
    const e8kv::Config spec = e8kv::Config::parse("preset=tier-k3v2");
    size_t groups = 0;
    e8kv::llama_cpp::check_memory_state(parsed, [&](size_t g, const e8kv::CompressedKV& cache) {
      ++groups;
      EXPECT_EQ(e8kv::llama_cpp::spec_difference(spec, cache), "") << "layer group " << g;
      EXPECT_NE(e8kv::llama_cpp::spec_difference(e8kv::Config::parse("preset=quant-k2v2"), cache), "");
    });
    EXPECT_GE(groups, 1u);
  }
  ASSERT_EQ(llama_state_seq_set_data(b.get(), state.data(), state.size(), 0), state.size()) << log_text();
  const size_t next = kPrompt + 16;
  const std::vector<float> x = decode(a.get(), tokens_, next, next + 8), y = decode(b.get(), tokens_, next, next + 8);
  ASSERT_FALSE(x.empty() || y.empty()) << log_text();
  EXPECT_EQ(max_abs_diff(x, y), 0.f);
}

INSTANTIATE_TEST_SUITE_P(Models, Architectures, ::testing::Range<size_t>(0, 6), [](const auto& info) {
  std::string n = subjects()[info.param].name;
  std::string out;
  for (char ch : n)
    if (std::isalnum(static_cast<unsigned char>(ch))) out += ch;
  return out;
});

// An architecture e8kv does not map (Granite: llama's tensors, other scales in its graph) is
// refused at context creation, by name; llama.cpp's own cache still serves the model.
TEST(ArchitectureRefusal, UnmappedArchitectureRefusedByName) {
  TinyModel g = tiny_models()[0];
  g.name = "Granite";
  g.arch = "granite";
  g.rope_freqs = false;
  const std::string path = testing::TempDir() + "e8kv-tiny-granite.gguf";
  write_tiny_gguf(g, path);
  ModelPtr m = load_model(path);
  ASSERT_TRUE(m) << log_text();
  log_text().clear();
  ContextOptions o;
  o.spec = "preset=quant-k3v2";
  EXPECT_FALSE(make_context(m.get(), o));
  EXPECT_NE(log_text().find("architecture 'granite' is not supported"), std::string::npos) << log_text();
  EXPECT_NE(log_text().find("gemma3"), std::string::npos) << "the supported ones are listed: " << log_text();
  o.spec = nullptr;
  EXPECT_TRUE(make_context(m.get(), o));
}

// Qwen2.5's k_proj biases (up to 211 on one channel of the 0.5B) break llama.cpp's scalar 4-bit
// keys even with its Hadamard rotation; e8kv codes centred keys. Its 3-bit presets must keep a
// KL below rotated q4_0's, whose 4.5 bits are 1.5x theirs.
TEST(Qwen25, E8kvUnderThreeBitsBeatsRotatedQ4_0) {
  const Subject& s = subjects()[1];
  if (!present(s)) GTEST_SKIP() << s.name << " absent: " << s.path << " (scripts/fetch-data.sh)";
  llama_model* m = model_of(s);
  ASSERT_NE(m, nullptr);
  const std::vector<llama_token> toks = tokens_for(s, m, 1100);
  if (toks.size() < 1024) GTEST_SKIP() << "corpus absent";
  ContextOptions o;
  const std::vector<float> base = scored_logits(make_context(m, o).get(), toks, 2, 256, 64);
  // llama.cpp's q4_0 cache needs flash attention for its values; its rotation is on by default.
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 1024;
  cp.n_batch = cp.n_ubatch = 512;
  cp.n_threads = cp.n_threads_batch = 2;
  cp.type_k = cp.type_v = GGML_TYPE_Q4_0;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  ContextPtr q4(llama_init_from_model(m, cp));
  ASSERT_TRUE(q4) << log_text();
  const std::vector<float> q4_logits = scored_logits(q4.get(), toks, 2, 256, 64);
  o.spec = "preset=quant-k3v2";
  const std::vector<float> e8_logits = scored_logits(make_context(m, o).get(), toks, 2, 256, 64);
  ASSERT_FALSE(base.empty() || q4_logits.empty() || e8_logits.empty()) << log_text();
  const int nv = n_vocab(m);
  const double kl_q4 = mean_kl(base, q4_logits, nv), kl_e8 = mean_kl(base, e8_logits, nv);
  std::printf("Qwen2.5-Coder-0.5B: KL against the f16 cache: rotated q4_0 %.4f, e8kv quant-k3v2 %.4f\n", kl_q4, kl_e8);
  EXPECT_LT(kl_e8, kl_q4 / 4);
}

}  // namespace
}  // namespace e8kv_llama_test

namespace {

bool data_required() {
  const char* v = std::getenv("E8KV_REQUIRE_DATA");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  llama_backend_init();
  e8kv_llama_test::capture_log();
  const int rc = RUN_ALL_TESTS();
  e8kv_llama_test::loaded_models().clear();
  llama_backend_free();
  if (rc != 0) return rc;
  const int skipped = ::testing::UnitTest::GetInstance()->skipped_test_count();
  if (skipped == 0) return 0;
  if (data_required()) {
    std::printf("FAILED: %d test(s) skipped for want of fetched data, and E8KV_REQUIRE_DATA=1\n", skipped);
    return 1;
  }
  std::printf("SKIPPED: %d test(s) for want of fetched data (scripts/fetch-data.sh); exit 77 = skipped\n", skipped);
  return 77;
}
