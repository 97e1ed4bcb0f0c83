// The eval backends' at-rest protocol (--at-rest; bench/peers/peers.py runs the same protocol in
// transformers): the prefill is compressed once, later tokens stay dense beside it, and attention
// merges the two by their lse. Checked against DenseKvBackend over the rows each side holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backends.hpp"
#include "e8kv/llama/kv_backend.hpp"

namespace e8kv::eval {
namespace {

constexpr uint64_t kSeed = 20261204;

llama::ModelConfig small_model() {
  llama::ModelConfig mc;
  mc.n_layers = 2;
  mc.n_heads = 4;
  mc.n_kv_heads = 2;
  mc.head_dim = 64;
  mc.rope_dim = 64;
  mc.rope_theta = 10000.0;
  return mc;
}

std::vector<float> gaussian(size_t n, std::mt19937_64& rng, float sigma = 1.f) {
  std::normal_distribution<float> g(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

llama::PrefillCapture capture(const llama::ModelConfig& mc, int64_t n, std::mt19937_64& rng) {
  llama::PrefillCapture cap;
  cap.n_tokens = n;
  cap.obs_window = 8;
  for (int l = 0; l < mc.n_layers; ++l) {
    cap.k.push_back(gaussian(static_cast<size_t>(n) * mc.n_kv_dim(), rng));
    cap.v.push_back(gaussian(static_cast<size_t>(n) * mc.n_kv_dim(), rng));
    cap.q_obs.push_back(gaussian(static_cast<size_t>(cap.obs_window) * mc.n_q_dim(), rng));
  }
  return cap;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Appended keys aligned with the query, so that the tail carries most of the attention mass: a
// backend that dropped or mis-weighted the tail would be far off.
struct Tail {
  std::vector<std::vector<float>> k, v;  // per token: [n_kv_heads * head_dim]
  std::vector<float> q;                  // [n_q_heads * head_dim]
};

Tail make_tail(const llama::ModelConfig& mc, int tokens, std::mt19937_64& rng) {
  Tail t;
  t.q = gaussian(static_cast<size_t>(mc.n_q_dim()), rng);
  for (int i = 0; i < tokens; ++i) {
    auto k = gaussian(static_cast<size_t>(mc.n_kv_dim()), rng, 0.3f);
    for (int h = 0; h < mc.n_kv_heads; ++h)
      for (int j = 0; j < mc.head_dim; ++j) k[static_cast<size_t>(h * mc.head_dim + j)] += 0.5f * t.q[static_cast<size_t>(h * mc.group_size() * mc.head_dim + j)];
    t.k.push_back(k);
    t.v.push_back(gaussian(static_cast<size_t>(mc.n_kv_dim()), rng, 2.f));
  }
  return t;
}

TEST(DenseAttentionLse, MergingTwoHalvesEqualsTheWhole) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  const int H = 2, Q = 4, d = 64;
  for (int64_t n : {1, 2, 7, 65}) {
    const auto k = gaussian(static_cast<size_t>(n) * H * d, rng);
    const auto v = gaussian(static_cast<size_t>(n) * H * d, rng);
    const auto q = gaussian(static_cast<size_t>(Q) * d, rng);
    const float scale = 0.125f;
    std::vector<float> all(static_cast<size_t>(Q) * d), lse_all(Q);
    dense_attention_lse(k.data(), v.data(), n, H, Q, d, q.data(), scale, all.data(), lse_all.data());
    const int64_t a = n / 2;
    std::vector<float> oa(all.size()), ob(all.size()), la(Q), lb(Q), merged(all.size()), lm(Q);
    dense_attention_lse(k.data(), v.data(), a, H, Q, d, q.data(), scale, oa.data(), la.data());
    dense_attention_lse(k.data() + a * H * d, v.data() + a * H * d, n - a, H, Q, d, q.data(), scale, ob.data(),
                        lb.data());
    merge_attention(oa.data(), la.data(), ob.data(), lb.data(), Q, d, merged.data(), lm.data());
    EXPECT_LT(max_abs_diff(all, merged), 1e-5f) << "n " << n;
    EXPECT_LT(max_abs_diff(lse_all, lm), 1e-5f) << "n " << n;
    if (a == 0) {
      EXPECT_TRUE(std::isinf(la[0]) && la[0] < 0) << "an empty set has lse -inf";
    }
  }
}

TEST(E8kvBackendAtRest, CodedPrefixMergedWithDenseTailEqualsDenseAttentionOverBoth) {
  std::mt19937_64 rng(kSeed + 1);
  const auto mc = small_model();
  const int64_t n = 150;
  const auto cap = capture(mc, n, rng);
  const Tail tail = make_tail(mc, 5, rng);
  for (const char* spec : {"preset=lossless", "preset=quant-k3v2", "preset=high"}) {
    auto cfg = Config::parse(spec);
    cfg.rope = llama::rope_params(mc);
    const KVCompressor comp(ModelShape{mc.n_layers, mc.n_kv_heads, mc.n_heads, mc.head_dim}, cfg);
    E8kvBackend at_rest(comp, cap, mc, /*at_rest=*/true);
    const double bytes_before = at_rest.bytes();
    for (int layer = 0; layer < mc.n_layers; ++layer) {
      // The reference: dense attention over the rows the compressed prefix decodes to (evicted
      // rows left out per head through the mask: each KV head gets its own dense backend) and
      // the appended rows as given.
      const DenseLayer dl = at_rest.cache().decompress_layer(layer);
      std::vector<float> want(static_cast<size_t>(mc.n_q_dim()));
      for (int h = 0; h < mc.n_kv_heads; ++h) {
        llama::DenseKvBackend ref(1, mc.group_size(), 1, mc.head_dim);
        for (int64_t t = 0; t < dl.tokens; ++t) {
          if (std::isinf(dl.mask[static_cast<size_t>(h * dl.tokens + t)])) continue;
          const size_t row = (static_cast<size_t>(t) * mc.n_kv_heads + h) * mc.head_dim;
          ref.append(0, &dl.keys[row], &dl.values[row], dl.positions[static_cast<size_t>(t)]);
        }
        for (size_t i = 0; i < tail.k.size(); ++i)
          ref.append(0, &tail.k[i][static_cast<size_t>(h * mc.head_dim)], &tail.v[i][static_cast<size_t>(h * mc.head_dim)],
                     n + static_cast<int64_t>(i));
        ref.attend(0, &tail.q[static_cast<size_t>(h * mc.group_size() * mc.head_dim)], n + 4,
                   &want[static_cast<size_t>(h * mc.group_size() * mc.head_dim)]);
      }
      for (size_t i = 0; i < tail.k.size(); ++i)
        at_rest.append(layer, tail.k[i].data(), tail.v[i].data(), n + static_cast<int64_t>(i));
      std::vector<float> got(want.size());
      at_rest.attend(layer, tail.q.data(), n + 4, got.data());
      EXPECT_LT(max_abs_diff(got, want), 2e-4f) << spec << " layer " << layer;
    }
    EXPECT_EQ(at_rest.bytes(), bytes_before) << spec << ": appended tokens are not stored coded at rest";
  }
}

TEST(E8kvBackendAtRest, RejectsWhatAppendWouldReject) {
  std::mt19937_64 rng(kSeed + 3);
  const auto mc = small_model();
  const auto cap = capture(mc, 80, rng);
  auto cfg = Config::parse("preset=quant-k3v2");
  cfg.rope = llama::rope_params(mc);
  const KVCompressor comp(ModelShape{mc.n_layers, mc.n_kv_heads, mc.n_heads, mc.head_dim}, cfg);
  E8kvBackend at_rest(comp, cap, mc, /*at_rest=*/true);
  auto k = gaussian(static_cast<size_t>(mc.n_kv_dim()), rng), v = k;
  EXPECT_THROW(at_rest.append(0, k.data(), v.data(), 79), Error) << "a position the prefill already holds";
  EXPECT_THROW(at_rest.append(2, k.data(), v.data(), 80), Error) << "a layer out of range";
  k[5] = std::nanf("");
  EXPECT_THROW(at_rest.append(0, k.data(), v.data(), 80), Error) << "a NaN key";
  k[5] = 0.f;
  at_rest.append(0, k.data(), v.data(), 80);
  EXPECT_THROW(at_rest.append(0, k.data(), v.data(), 80), Error) << "the same position twice";
}

TEST(PeerBackendAtRest, RowsAppendedAfterStopQuantizingAreKeptAsGiven) {
  std::mt19937_64 rng(kSeed + 2);
  const auto mc = small_model();
  const auto empty = capture(mc, 0, rng);
  const Tail tail = make_tail(mc, 6, rng);
  for (PeerKind kind : {PeerKind::kQ4_0Rotated, PeerKind::kRelaxedK2V2, PeerKind::kKivi2}) {
    PeerBackend coded(kind, mc, empty), at_rest(kind, mc, empty);
    at_rest.stop_quantizing();
    llama::DenseKvBackend ref(mc);
    for (size_t i = 0; i < tail.k.size(); ++i) {
      coded.append(0, tail.k[i].data(), tail.v[i].data(), static_cast<int64_t>(i));
      at_rest.append(0, tail.k[i].data(), tail.v[i].data(), static_cast<int64_t>(i));
      ref.append(0, tail.k[i].data(), tail.v[i].data(), static_cast<int64_t>(i));
    }
    std::vector<float> want(static_cast<size_t>(mc.n_q_dim())), got(want.size()), quantized(want.size());
    ref.attend(0, tail.q.data(), 5, want.data());
    at_rest.attend(0, tail.q.data(), 5, got.data());
    coded.attend(0, tail.q.data(), 5, quantized.data());
    EXPECT_LT(max_abs_diff(got, want), 1e-5f) << static_cast<int>(kind);
    if (kind != PeerKind::kKivi2) {  // KIVI keeps its last 128 tokens in fp16 anyway
      EXPECT_GT(max_abs_diff(quantized, want), 1e-3f) << static_cast<int>(kind) << ": the coded path must differ";
    }
  }
}

}  // namespace
}  // namespace e8kv::eval
