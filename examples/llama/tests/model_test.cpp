// Forward pass on tiny random-weight GGUF models written by the test: an independent fp64
// reference implementation, prefill == step-by-step decode through DenseKvBackend, decode_batch ==
// decode_step, captures, kernels against naive loops, thread/SIMD independence, and load errors.
#include "e8kv/llama/model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <complex>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/llama/gguf.hpp"
#include "e8kv/llama/testing.hpp"
#include "e8kv/llama/thread_pool.hpp"
#include "kernels.hpp"
#include "testing/test_util.hpp"

namespace {

using e8kv::llama::DenseKvBackend;
using e8kv::llama::GgufFile;
using e8kv::llama::KvBackend;
using e8kv::llama::LogitsMode;
using e8kv::llama::Model;
using e8kv::llama::ModelConfig;
using e8kv::llama::PrefillCapture;
using e8kv::llama::TinyLlamaSpec;

GgufFile tiny_file(const TinyLlamaSpec& spec = {}) { return GgufFile::parse(e8kv::llama::make_tiny_llama_gguf(spec)); }

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int n, int vocab) {
  std::uniform_int_distribution<int> pick(0, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = pick(rng);
  return t;
}

// ---- independent fp64 reference -------------------------------------------------------------

struct Reference {
  const GgufFile& f;
  ModelConfig c;
  std::vector<double> get(const std::string& name) const {
    const auto v = f.dequantize(*f.find_tensor(name));
    return std::vector<double>(v.begin(), v.end());
  }
  // y[o] = sum_k W[o][k] x[k]; GGUF rows are dims[0] = n_in long.
  static std::vector<double> matvec(const std::vector<double>& w, const std::vector<double>& x) {
    const size_t n_in = x.size(), n_out = w.size() / n_in;
    std::vector<double> y(n_out, 0.0);
    for (size_t o = 0; o < n_out; ++o)
      for (size_t k = 0; k < n_in; ++k) y[o] += w[o * n_in + k] * x[k];
    return y;
  }
  std::vector<double> rms(const std::vector<double>& x, const std::vector<double>& w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c.rms_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
    return y;
  }
  // Rotary embedding as complex multiplication of adjacent pairs.
  void rope(std::vector<double>& x, int n_heads, int pos) const {
    for (int h = 0; h < n_heads; ++h)
      for (int i = 0; i < c.rope_dim / 2; ++i) {
        const double angle = pos * std::pow(c.rope_theta, -2.0 * i / c.rope_dim);
        const std::complex<double> z =
            std::complex<double>(x[h * c.head_dim + 2 * i], x[h * c.head_dim + 2 * i + 1]) * std::polar(1.0, angle);
        x[h * c.head_dim + 2 * i] = z.real();
        x[h * c.head_dim + 2 * i + 1] = z.imag();
      }
  }
  std::vector<std::vector<double>> logits(const std::vector<int32_t>& tokens) const {
    const int n = static_cast<int>(tokens.size()), d = c.n_embd, hd = c.head_dim;
    const auto emb = get("token_embd.weight");
    std::vector<std::vector<double>> x(n);
    for (int i = 0; i < n; ++i) x[i].assign(emb.begin() + tokens[i] * d, emb.begin() + (tokens[i] + 1) * d);
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      const auto an = get(b + "attn_norm.weight"), fn = get(b + "ffn_norm.weight");
      const auto wq = get(b + "attn_q.weight"), wk = get(b + "attn_k.weight"), wv = get(b + "attn_v.weight");
      const auto wo = get(b + "attn_output.weight"), wg = get(b + "ffn_gate.weight"), wu = get(b + "ffn_up.weight");
      const auto wd = get(b + "ffn_down.weight");
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (int i = 0; i < n; ++i) {
        const auto h = rms(x[i], an);
        q[i] = matvec(wq, h);
        k[i] = matvec(wk, h);
        v[i] = matvec(wv, h);
        rope(q[i], c.n_heads, i);
        rope(k[i], c.n_kv_heads, i);
      }
      for (int i = 0; i < n; ++i) {
        std::vector<double> att(static_cast<size_t>(c.n_heads) * hd, 0.0);
        for (int h = 0; h < c.n_heads; ++h) {
          const int g = h / (c.n_heads / c.n_kv_heads);
          std::vector<double> s(i + 1);
          double mx = -1e300;
          for (int j = 0; j <= i; ++j) {
            double dot = 0;
            for (int e = 0; e < hd; ++e) dot += q[i][h * hd + e] * k[j][g * hd + e];
            s[j] = dot / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, s[j]);
          }
          double z = 0;
          for (double& sj : s) z += (sj = std::exp(sj - mx));
          for (int j = 0; j <= i; ++j)
            for (int e = 0; e < hd; ++e) att[h * hd + e] += s[j] / z * v[j][g * hd + e];
        }
        const auto o = matvec(wo, att);
        for (int e = 0; e < d; ++e) x[i][e] += o[e];
        const auto h = rms(x[i], fn);
        const auto gate = matvec(wg, h), up = matvec(wu, h);
        std::vector<double> a(gate.size());
        for (size_t e = 0; e < a.size(); ++e) a[e] = gate[e] / (1.0 + std::exp(-gate[e])) * up[e];
        const auto down = matvec(wd, a);
        for (int e = 0; e < d; ++e) x[i][e] += down[e];
      }
    }
    const auto on = get("output_norm.weight");
    const auto out = c.tied_embeddings ? emb : get("output.weight");
    std::vector<std::vector<double>> logits(n);
    for (int i = 0; i < n; ++i) logits[i] = matvec(out, rms(x[i], on));
    return logits;
  }
};

void expect_matches_reference(const Model& m, const GgufFile& f, const std::vector<int32_t>& tokens, double tol) {
  const Reference ref{f, m.config()};
  const auto want = ref.logits(tokens);
  const auto got = m.prefill(tokens);
  const int vocab = m.config().vocab_size;
  ASSERT_EQ(got.size(), tokens.size() * static_cast<size_t>(vocab));
  double worst = 0, scale = 0;
  int agree = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (int v = 0; v < vocab; ++v) {
      worst = std::max(worst, std::fabs(got[i * vocab + v] - want[i][v]));
      scale = std::max(scale, std::fabs(want[i][v]));
    }
    const auto a = std::max_element(got.begin() + static_cast<std::ptrdiff_t>(i * vocab),
                                    got.begin() + static_cast<std::ptrdiff_t>((i + 1) * vocab)) -
                   got.begin();
    agree += static_cast<int>(a - static_cast<std::ptrdiff_t>(i * vocab)) ==
             static_cast<int>(std::max_element(want[i].begin(), want[i].end()) - want[i].begin());
  }
  std::printf("[reference] %zu tokens: max |logit - fp64| = %.3g (max |logit| %.2f), top-1 %d/%zu\n", tokens.size(),
              worst, scale, agree, tokens.size());
  EXPECT_LT(worst, tol);
  EXPECT_GT(scale, 0.5);  // the test model is not degenerate
}

// ---- tests ---------------------------------------------------------------------------------

TEST(Config, ReadFromMetadata) {
  TinyLlamaSpec spec;
  spec.n_layers = 3;
  spec.n_heads = 4;
  spec.n_kv_heads = 2;
  spec.rope_theta = 5000.0f;
  const auto f = tiny_file(spec);
  const ModelConfig c = e8kv::llama::read_config(f);
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.n_layers, 3);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_ff, 96);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5000.0);
  EXPECT_NEAR(c.rms_eps, 1e-5, 1e-12);
  EXPECT_EQ(c.vocab_size, 3 + 256 + static_cast<int>(e8kv::llama::tiny_llama_merges().size()));
  EXPECT_EQ(c.context_length, 512);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.group_size(), 2);
}

TEST(Rope, InverseNormAndPositionZero) {
  const auto f = tiny_file();
  const ModelConfig c = e8kv::llama::read_config(f);
  const e8kv::llama::Rope rope(c);
  auto rng = e8kv::test::seeded_rng(3);
  std::normal_distribution<float> g;
  std::vector<float> x(static_cast<size_t>(c.n_heads) * c.head_dim);
  for (auto& v : x) v = g(rng);
  auto y = x;
  rope.apply(y.data(), c.n_heads, 0);
  EXPECT_EQ(y, x);  // position 0 rotates by zero
  for (int64_t pos : {1, 7, 500, 100000}) {
    y = x;
    rope.apply(y.data(), c.n_heads, pos);
    double nx = 0, ny = 0;
    for (size_t i = 0; i < x.size(); ++i) nx += x[i] * x[i], ny += y[i] * y[i];
    EXPECT_NEAR(ny, nx, 1e-4 * nx);
    rope.remove(y.data(), c.n_heads, pos);
    EXPECT_LT(max_abs_diff(x, y), 1e-4) << pos;
  }
  // Pair 0 turns by exactly `position` radians; the last pair by position * theta^(-(d-2)/d).
  EXPECT_DOUBLE_EQ(rope.frequency(0), 1.0);
  EXPECT_NEAR(rope.frequency(c.rope_dim / 2 - 1), std::pow(10000.0, -(c.rope_dim - 2.0) / c.rope_dim), 1e-15);
  ModelConfig scaled = c;
  scaled.rope_scaling = e8kv::llama::RopeScaling::kLinear;
  scaled.rope_scaling_factor = 4.0;
  EXPECT_DOUBLE_EQ(e8kv::llama::Rope(scaled).frequency(3), rope.frequency(3) / 4.0);
}

TEST(Kernels, MatmulMatchesNaive) {
  auto rng = e8kv::test::seeded_rng(21);
  std::normal_distribution<float> g;
  e8kv::llama::ThreadPool pool(3);
  for (bool simd : {true, false}) {
    e8kv::llama::set_simd_enabled(simd);
    for (int64_t n : {0, 1, 5, 6, 7, 13, 48, 49, 100})
      for (int64_t n_out : {1, 15, 16, 17, 33})
        for (int64_t n_in : {1, 3, 64}) {
          std::vector<float> w(static_cast<size_t>(n_out * n_in)), x(static_cast<size_t>(n * n_in + 1));
          for (auto& v : w) v = g(rng);
          for (auto& v : x) v = g(rng);
          const auto p = e8kv::llama::pack_matrix(w.data(), n_out, n_in);
          for (int64_t o = 0; o < n_out; ++o)
            for (int64_t k = 0; k < n_in; ++k) ASSERT_EQ(p.at(o, k), w[o * n_in + k]);
          const int64_t ldy = n_out + 3;  // strided output rows
          std::vector<float> y(static_cast<size_t>(std::max<int64_t>(n, 1) * ldy), 0.5f);
          for (bool acc : {false, true}) {
            std::fill(y.begin(), y.end(), 0.5f);
            e8kv::llama::matmul(x.data(), n, n_in, p, y.data(), ldy, acc, pool);
            for (int64_t i = 0; i < n; ++i) {
              for (int64_t o = 0; o < n_out; ++o) {
                double want = acc ? 0.5 : 0.0;
                for (int64_t k = 0; k < n_in; ++k) want += double(x[i * n_in + k]) * w[o * n_in + k];
                ASSERT_NEAR(y[i * ldy + o], want, 1e-4 * (1 + std::sqrt(double(n_in))))
                    << n << " " << n_out << " " << n_in;
              }
              for (int64_t o = n_out; o < ldy; ++o) ASSERT_EQ(y[i * ldy + o], 0.5f) << "wrote past the row";
            }
          }
        }
  }
  e8kv::llama::set_simd_enabled(true);
}

TEST(Forward, MatchesFp64Reference) {
  TinyLlamaSpec spec;
  spec.n_layers = 3;
  spec.seed = 7;
  const auto f = tiny_file(spec);
  const Model m = Model::from_gguf(f, 2);
  auto rng = e8kv::test::seeded_rng(7);
  const auto tokens = random_tokens(rng, 40, m.config().vocab_size);
  expect_matches_reference(m, f, tokens, 2e-3);
  expect_matches_reference(m, f, {tokens[0]}, 2e-3);  // a single token
  e8kv::llama::set_simd_enabled(false);
  expect_matches_reference(m, f, tokens, 2e-3);
  e8kv::llama::set_simd_enabled(true);
}

TEST(Forward, UntiedOutputAndOtherShapes) {
  TinyLlamaSpec spec;
  spec.tied_embeddings = false;
  spec.n_heads = 2;
  spec.n_kv_heads = 1;  // head_dim 32, group 2
  spec.n_embd = 64;
  spec.n_layers = 1;
  spec.seed = 9;
  const auto f = tiny_file(spec);
  const Model m = Model::from_gguf(f, 1);
  EXPECT_FALSE(m.config().tied_embeddings);
  auto rng = e8kv::test::seeded_rng(9);
  expect_matches_reference(m, f, random_tokens(rng, 20, m.config().vocab_size), 2e-3);
  TinyLlamaSpec mha;  // no GQA: n_kv_heads == n_heads, head_dim 8
  mha.n_heads = 8;
  mha.n_kv_heads = 8;
  mha.seed = 10;
  const auto f2 = tiny_file(mha);
  expect_matches_reference(Model::from_gguf(f2, 2), f2, random_tokens(rng, 17, m.config().vocab_size), 2e-3);
}

TEST(Forward, PrefillEqualsStepByStepDecode) {
  TinyLlamaSpec spec;
  spec.n_layers = 3;
  const Model m = Model::from_gguf(tiny_file(spec), 2);
  auto rng = e8kv::test::seeded_rng(8);
  const auto tokens = random_tokens(rng, 64, m.config().vocab_size);
  const auto full = m.prefill(tokens);
  DenseKvBackend kv(m.config());
  const int vocab = m.config().vocab_size;
  double worst = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto step = m.decode_step(tokens[i], static_cast<int64_t>(i), kv);
    const std::vector<float> row(full.begin() + static_cast<std::ptrdiff_t>(i * vocab),
                                 full.begin() + static_cast<std::ptrdiff_t>((i + 1) * vocab));
    worst = std::max(worst, max_abs_diff(step, row));
  }
  std::printf("[prefill vs decode] max |diff| = %.3g\n", worst);
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(kv.size(0), 64);
  EXPECT_EQ(kv.bytes(), 3u * 2 * 64 * m.config().n_kv_dim() * sizeof(float));
  // LogitsMode::kLast is the last row; kNone returns nothing.
  const auto last = m.prefill(tokens, nullptr, LogitsMode::kLast);
  EXPECT_EQ(last, std::vector<float>(full.end() - vocab, full.end()));
  EXPECT_TRUE(m.prefill(tokens, nullptr, LogitsMode::kNone).empty());
  EXPECT_TRUE(m.prefill({}).empty());
}

TEST(Forward, CaptureSeedsADenseBackendThatContinuesThePrefill) {
  const Model m = Model::from_gguf(tiny_file(), 2);
  const ModelConfig& c = m.config();
  auto rng = e8kv::test::seeded_rng(12);
  const auto tokens = random_tokens(rng, 30, c.vocab_size);
  const size_t n_prompt = 21;
  PrefillCapture cap;
  cap.obs_window = 4;
  cap.capture_pre_rope_keys = true;
  m.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + n_prompt), &cap, LogitsMode::kNone);
  ASSERT_EQ(cap.n_tokens, static_cast<int64_t>(n_prompt));
  ASSERT_EQ(cap.k.size(), static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    ASSERT_EQ(cap.k[l].size(), n_prompt * c.n_kv_dim());
    ASSERT_EQ(cap.v[l].size(), n_prompt * c.n_kv_dim());
    ASSERT_EQ(cap.q_obs[l].size(), 4u * c.n_q_dim());
    ASSERT_EQ(cap.k_pre_rope[l].size(), n_prompt * c.n_kv_dim());
    for (size_t i = 0; i < n_prompt; ++i) {  // post-RoPE keys are the pre-RoPE keys rotated
      std::vector<float> k(cap.k_pre_rope[l].begin() + static_cast<std::ptrdiff_t>(i * c.n_kv_dim()),
                           cap.k_pre_rope[l].begin() + static_cast<std::ptrdiff_t>((i + 1) * c.n_kv_dim()));
      m.rope().apply(k.data(), c.n_kv_heads, static_cast<int64_t>(i));
      const std::vector<float> want(cap.k[l].begin() + static_cast<std::ptrdiff_t>(i * c.n_kv_dim()),
                                    cap.k[l].begin() + static_cast<std::ptrdiff_t>((i + 1) * c.n_kv_dim()));
      ASSERT_LT(max_abs_diff(k, want), 1e-5);
    }
  }
  DenseKvBackend kv = DenseKvBackend::from_capture(c, cap);
  const auto full = m.prefill(tokens);
  double worst = 0;
  for (size_t i = n_prompt; i < tokens.size(); ++i) {
    const auto step = m.decode_step(tokens[i], static_cast<int64_t>(i), kv);
    worst = std::max(
        worst,
        max_abs_diff(step, std::vector<float>(full.begin() + static_cast<std::ptrdiff_t>(i * c.vocab_size),
                                              full.begin() + static_cast<std::ptrdiff_t>((i + 1) * c.vocab_size))));
  }
  EXPECT_LT(worst, 1e-4);
  // An observation window larger than the prompt keeps every query.
  PrefillCapture big;
  big.obs_window = 100;
  m.prefill({tokens[0], tokens[1]}, &big, LogitsMode::kNone);
  EXPECT_EQ(big.q_obs[0].size(), 2u * c.n_q_dim());
  EXPECT_TRUE(big.k_pre_rope.empty());
}

// Records what the engine hands to a backend, delegating to a dense cache.
class RecordingBackend : public KvBackend {
 public:
  explicit RecordingBackend(const ModelConfig& c) : dense(c) {}
  void append(int layer, const float* k, const float* v, int64_t position) override {
    calls.push_back("append " + std::to_string(layer) + " @" + std::to_string(position));
    dense.append(layer, k, v, position);
  }
  void attend(int layer, const float* q, int64_t position, float* out) override {
    calls.push_back("attend " + std::to_string(layer) + " @" + std::to_string(position));
    queries.emplace_back(q, q + n_q_dim);
    dense.attend(layer, q, position, out);
  }
  DenseKvBackend dense;
  std::vector<std::string> calls;
  std::vector<std::vector<float>> queries;
  size_t n_q_dim = 0;
};

TEST(Forward, BackendSeesAppendThenAttendPerLayerWithPostRopeQueries) {
  const Model m = Model::from_gguf(tiny_file(), 2);
  const ModelConfig& c = m.config();
  auto rng = e8kv::test::seeded_rng(13);
  const auto tokens = random_tokens(rng, 9, c.vocab_size);
  PrefillCapture prompt, whole;
  whole.obs_window = 1;
  m.prefill(std::vector<int32_t>(tokens.begin(), tokens.end() - 1), &prompt, LogitsMode::kNone);
  m.prefill(tokens, &whole, LogitsMode::kNone);
  RecordingBackend rec(c);
  rec.n_q_dim = static_cast<size_t>(c.n_q_dim());
  rec.dense.seed(prompt);
  m.decode_step(tokens.back(), 8, rec);
  ASSERT_EQ(rec.calls.size(), static_cast<size_t>(2 * c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    EXPECT_EQ(rec.calls[2 * l], "append " + std::to_string(l) + " @8");
    EXPECT_EQ(rec.calls[2 * l + 1], "attend " + std::to_string(l) + " @8");
    // The decode query equals the prefill's (post-RoPE) query of the same token.
    EXPECT_LT(max_abs_diff(rec.queries[l], whole.q_obs[l]), 1e-5) << "layer " << l;
    // And the appended keys equal the prefill's keys of that token.
    const std::vector<float> k = rec.dense.keys(l);
    EXPECT_LT(max_abs_diff(std::vector<float>(k.end() - c.n_kv_dim(), k.end()),
                           std::vector<float>(whole.k[l].end() - c.n_kv_dim(), whole.k[l].end())),
              1e-5);
  }
}

TEST(Forward, DecodeBatchEqualsIndividualSteps) {
  const Model m = Model::from_gguf(tiny_file(), 2);
  const ModelConfig& c = m.config();
  auto rng = e8kv::test::seeded_rng(14);
  const int batch = 5;
  std::vector<std::vector<int32_t>> seqs;
  std::vector<DenseKvBackend> batched, single;
  for (int b = 0; b < batch; ++b) {
    seqs.push_back(random_tokens(rng, 3 + 4 * b + 6, c.vocab_size));  // different lengths
    PrefillCapture cap;
    m.prefill(std::vector<int32_t>(seqs[b].begin(), seqs[b].end() - 6), &cap, LogitsMode::kNone);
    batched.push_back(DenseKvBackend::from_capture(c, cap));
    single.push_back(DenseKvBackend::from_capture(c, cap));
  }
  double worst = 0;
  for (int s = 0; s < 6; ++s) {
    std::vector<int32_t> toks;
    std::vector<int64_t> pos;
    std::vector<KvBackend*> ptrs;
    for (int b = 0; b < batch; ++b) {
      const size_t at = seqs[b].size() - 6 + s;
      toks.push_back(seqs[b][at]);
      pos.push_back(static_cast<int64_t>(at));
      ptrs.push_back(&batched[b]);
    }
    const auto all = m.decode_batch(toks, pos, ptrs);
    ASSERT_EQ(all.size(), static_cast<size_t>(batch) * c.vocab_size);
    for (int b = 0; b < batch; ++b) {
      const auto one = m.decode_step(toks[b], pos[b], single[b]);
      worst = std::max(worst, max_abs_diff(one, std::vector<float>(all.begin() + b * c.vocab_size,
                                                                   all.begin() + (b + 1) * c.vocab_size)));
    }
  }
  std::printf("[decode_batch vs decode_step] max |diff| = %.3g\n", worst);
  EXPECT_LT(worst, 1e-5);
  // Same with backends called serially.
  Model m2 = Model::from_gguf(tiny_file(), 2);
  m2.set_concurrent_backends(false);
  DenseKvBackend a(c), b(c);
  const auto r = m2.decode_batch({5, 6}, {0, 0}, {&a, &b});
  const auto r5 = m2.decode_step(5, 0, *std::make_unique<DenseKvBackend>(c));
  EXPECT_LT(max_abs_diff(std::vector<float>(r.begin(), r.begin() + c.vocab_size), r5), 1e-6);
}

TEST(Forward, ResultsDoNotDependOnThreadCount) {
  const auto f = tiny_file();
  auto rng = e8kv::test::seeded_rng(15);
  const Model one = Model::from_gguf(f, 1);
  Model many = Model::from_gguf(f, 3);
  const auto tokens = random_tokens(rng, 70, one.config().vocab_size);
  EXPECT_EQ(one.prefill(tokens), many.prefill(tokens));
  many.set_threads(2);
  EXPECT_EQ(many.threads(), 2);
  EXPECT_EQ(one.prefill(tokens), many.prefill(tokens));
}

TEST(Forward, InputErrors) {
  const Model m = Model::from_gguf(tiny_file(), 2);
  const ModelConfig& c = m.config();
  DenseKvBackend a(c), b(c);
  EXPECT_THROW(m.prefill({0, c.vocab_size}), e8kv::Error);
  EXPECT_THROW(m.prefill({-1}), e8kv::Error);
  EXPECT_THROW(m.decode_step(0, -1, a), e8kv::Error);
  EXPECT_THROW(m.decode_batch({1, 2}, {0}, {&a, &b}), e8kv::Error);
  EXPECT_THROW(m.decode_batch({1, 2}, {0, 0}, {&a, &a}), e8kv::Error);
  EXPECT_THROW(m.decode_batch({1}, {0}, {nullptr}), e8kv::Error);
  EXPECT_THROW(m.embedding(c.vocab_size), e8kv::Error);
  float q[64] = {}, out[64];
  EXPECT_THROW(a.attend(0, q, 0, out), e8kv::Error);  // nothing appended yet
  EXPECT_THROW(a.append(c.n_layers, q, q, 0), e8kv::Error);
  PrefillCapture wrong;
  wrong.k.resize(1);
  EXPECT_THROW(a.seed(wrong), e8kv::Error);
  EXPECT_TRUE(m.decode_batch({}, {}, {}).empty());
}

TEST(Load, ErrorsNameTheProblem) {
  auto expect_error = [](TinyLlamaSpec spec, const std::string& needle) {
    try {
      Model::from_gguf(tiny_file(spec), 1);
      ADD_FAILURE() << "loaded; expected an error mentioning '" << needle << "'";
    } catch (const e8kv::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TinyLlamaSpec s;
  s.omit_tensor = "blk.1.attn_k.weight";
  expect_error(s, "tensor 'blk.1.attn_k.weight' is missing");
  s = {};
  s.misshape_tensor = "blk.0.ffn_down.weight";
  expect_error(s, "tensor 'blk.0.ffn_down.weight' has shape [96, 65], expected [96, 64]");
  s = {};
  s.misshape_tensor = "output_norm.weight";
  expect_error(s, "'output_norm.weight' has shape [65]");
  s = {};
  s.bf16_tensor = "blk.0.ffn_gate.weight";
  expect_error(s, "BF16");
  s = {};
  s.nan_tensor = "blk.1.attn_norm.weight";
  expect_error(s, "non-finite");
  s = {};
  s.architecture = "gpt2";
  expect_error(s, "architecture 'gpt2' is not supported");
  s = {};
  s.n_kv_heads = 3;
  expect_error(s, "not a multiple of head_count_kv");
  s = {};
  s.omit_tensor = "token_embd.weight";
  expect_error(s, "token_embd.weight");
}

TEST(ThreadPool, RunsEveryTaskOnceAndPropagatesErrors) {
  e8kv::llama::ThreadPool pool(4);
  EXPECT_EQ(pool.size(), 4);
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.run(n, [&](int64_t t, int worker) {
      ASSERT_GE(worker, 0);
      ASSERT_LT(worker, 4);
      hits[t]++;
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
  EXPECT_THROW(pool.run(100,
                        [](int64_t t, int) {
                          if (t == 37) throw e8kv::Error("boom");
                        }),
               e8kv::Error);
  std::atomic<int> inner{0};  // nested runs execute serially instead of deadlocking
  pool.run(8, [&](int64_t, int) { pool.run(3, [&](int64_t, int) { inner++; }); });
  EXPECT_EQ(inner.load(), 24);
}

}  // namespace
