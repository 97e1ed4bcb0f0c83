// e8kv's RoPE of a llama.cpp layer (rope_params, memory/e8kv_layers.hpp) against llama.cpp's own
// ggml_rope_ext on the same vectors and positions, for every variant the memory maps: NORM and
// NEOX pairs, partial rotary, linear scaling, per-pair frequency factors (Llama-3's rope_freqs,
// Phi-3's LongRoPE), YaRN (ext 1 and a partial mix, with and without factors), head_dim 64 to 256.
// ggml turns pair i by float(p·theta_scale^i) accumulated in float; e8kv computes the angles in
// double: they agree to float rounding of the angle (|Δ| ≲ p·1e-7 rad), the tolerance below.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "e8kv/transform/rope.hpp"
#include "e8kv_layers.hpp"
#include "ggml-cpu.h"
#include "ggml.h"
#include "llama.h"

namespace {

constexpr uint64_t kSeed = 3511;
const std::vector<int32_t> kPositions = {0, 1, 2, 7, 100, 1000, 4095, 4096, 9000};

struct Variant {
  const char* name;
  e8kv_llama::GgmlRope rope;
  float attn_factor = 1.f;
};

// ggml_rope_ext over n_heads × positions of head_dim floats; returns [position][head][head_dim].
std::vector<float> ggml_rotate(const Variant& v, const std::vector<float>& x, int n_heads) {
  const auto& g = v.rope;
  ggml_init_params ip{static_cast<size_t>(64) << 20, nullptr, false};
  ggml_context* ctx = ggml_init(ip);
  const int n = static_cast<int>(kPositions.size());
  ggml_tensor* a = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, g.head_dim, n_heads, n);
  std::copy(x.begin(), x.end(), static_cast<float*>(a->data));
  ggml_tensor* pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
  std::copy(kPositions.begin(), kPositions.end(), static_cast<int32_t*>(pos->data));
  ggml_tensor* ff = nullptr;
  if (!g.freq_factors.empty()) {
    ff = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, static_cast<int64_t>(g.freq_factors.size()));
    std::copy(g.freq_factors.begin(), g.freq_factors.end(), static_cast<float*>(ff->data));
  }
  ggml_tensor* r = ggml_rope_ext(ctx, a, pos, ff, g.n_rot, g.mode, g.n_ctx_orig, g.freq_base, g.freq_scale, g.ext_factor,
                                 v.attn_factor, g.beta_fast, g.beta_slow);
  ggml_cgraph* gf = ggml_new_graph(ctx);
  ggml_build_forward_expand(gf, r);
  EXPECT_EQ(ggml_graph_compute_with_ctx(ctx, gf, 1), GGML_STATUS_SUCCESS);
  std::vector<float> out(static_cast<const float*>(r->data), static_cast<const float*>(r->data) + x.size());
  ggml_free(ctx);
  return out;
}

std::vector<Variant> variants() {
  std::vector<Variant> v;
  auto base = [](int mode, int head_dim, int n_rot, float theta) {
    e8kv_llama::GgmlRope g;
    g.mode = mode;
    g.head_dim = head_dim;
    g.n_rot = n_rot;
    g.freq_base = theta;
    g.n_ctx_orig = 4096;
    return g;
  };
  v.push_back({"NORM (Llama, SmolLM2)", base(LLAMA_ROPE_TYPE_NORM, 64, 64, 10000.f)});
  v.push_back({"NEOX (Qwen, Gemma, Phi)", base(LLAMA_ROPE_TYPE_NEOX, 128, 128, 1000000.f)});
  v.push_back({"NEOX head_dim 256", base(LLAMA_ROPE_TYPE_NEOX, 256, 256, 10000.f)});
  v.push_back({"partial rotary NEOX (32 of 64)", base(LLAMA_ROPE_TYPE_NEOX, 64, 32, 10000.f)});
  v.push_back({"partial rotary NORM (64 of 96)", base(LLAMA_ROPE_TYPE_NORM, 96, 64, 10000.f)});
  Variant lin{"linear scaling 1/4", base(LLAMA_ROPE_TYPE_NORM, 64, 64, 10000.f)};
  lin.rope.freq_scale = 0.25f;
  v.push_back(lin);
  // Llama-3.1's rope_freqs: its bands (factor 8, low 1, high 4, original context 8192) as the
  // tensor the GGUF carries; the memory reads the tensor, not the formula.
  Variant llama3{"rope_freqs (Llama-3.1 bands)", base(LLAMA_ROPE_TYPE_NORM, 128, 128, 500000.f)};
  for (int i = 0; i < 64; ++i) {
    const double freq = 1.0 / std::pow(500000.0, 2.0 * i / 128), wavelen = 2 * M_PI / freq;
    double f = 1.0;
    if (wavelen > 8192.0 / 1.0) f = 8.0;
    else if (wavelen > 8192.0 / 4.0) {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      f = 1.0 / ((1 - smooth) / 8.0 + smooth);
    }
    llama3.rope.freq_factors.push_back(static_cast<float>(f));
  }
  v.push_back(llama3);
  Variant longrope{"LongRoPE factors (Phi-3), head_dim 96", base(LLAMA_ROPE_TYPE_NEOX, 96, 96, 10000.f)};
  std::mt19937_64 rng(kSeed);
  std::uniform_real_distribution<float> u(1.f, 40.f);
  for (int i = 0; i < 48; ++i) longrope.rope.freq_factors.push_back(u(rng));
  longrope.attn_factor = 1.19f;
  v.push_back(longrope);
  Variant yarn{"YaRN x4 (Qwen2.5 long context)", base(LLAMA_ROPE_TYPE_NEOX, 128, 128, 1000000.f)};
  yarn.rope.freq_scale = 0.25f;
  yarn.rope.ext_factor = 1.f;
  yarn.rope.n_ctx_orig = 32768;
  v.push_back(yarn);
  Variant yarn_norm{"YaRN x8 NORM, ext 0.5, factors", base(LLAMA_ROPE_TYPE_NORM, 64, 64, 10000.f)};
  yarn_norm.rope.freq_scale = 0.125f;
  yarn_norm.rope.ext_factor = 0.5f;
  yarn_norm.rope.beta_fast = 16.f;
  yarn_norm.rope.beta_slow = 2.f;
  yarn_norm.rope.n_ctx_orig = 2048;
  for (int i = 0; i < 32; ++i) yarn_norm.rope.freq_factors.push_back(1.f + 0.05f * static_cast<float>(i));
  v.push_back(yarn_norm);
  return v;
}

TEST(RopeMapping, MatchesGgmlRopeExtForEveryVariant) {
  std::printf("seed %llu, positions 0 .. %d\n", static_cast<unsigned long long>(kSeed), kPositions.back());
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    const auto& g = v.rope;
    const int n_heads = 3, d = g.head_dim, n = static_cast<int>(kPositions.size());
    std::mt19937_64 rng(kSeed + static_cast<uint64_t>(d));
    std::normal_distribution<float> gauss(0.f, 1.f);
    std::vector<float> x(static_cast<size_t>(n) * n_heads * d);
    for (auto& e : x) e = gauss(rng);
    const std::vector<float> want = ggml_rotate(v, x, n_heads);
    const e8kv::transform::Rope rope(e8kv_llama::rope_params(g));
    // YaRN's magnitude factor (attn_factor, and 1 + 0.1·ln(1/scale) with ext_factor) scales the
    // rotated pairs in ggml; e8kv's rotation is pure: the memory sees both sides scaled alike.
    const float mscale = v.attn_factor * (g.ext_factor != 0.f ? 1.f + 0.1f * std::log(1.f / g.freq_scale) : 1.f);
    double worst = 0;
    for (int p = 0; p < n; ++p)
      for (int h = 0; h < n_heads; ++h) {
        const size_t at = (static_cast<size_t>(p) * n_heads + h) * d;
        std::vector<float> got(x.begin() + static_cast<std::ptrdiff_t>(at), x.begin() + static_cast<std::ptrdiff_t>(at + d));
        rope.apply(got.data(), kPositions[static_cast<size_t>(p)]);
        for (int i = 0; i < d; ++i) {
          const float expected = want[at + static_cast<size_t>(i)];
          const float mine = i < g.n_rot ? got[static_cast<size_t>(i)] * mscale : got[static_cast<size_t>(i)];
          if (i >= g.n_rot) {
            ASSERT_EQ(mine, expected) << "unrotated channel " << i;
          }
          // Float angles: ggml's error grows with the angle, p·theta_scale^i.
          const double tol = 2e-6 + 3e-7 * (1.0 + kPositions[static_cast<size_t>(p)]) * 4.0;
          worst = std::max(worst, std::fabs(static_cast<double>(mine) - expected));
          ASSERT_NEAR(mine, expected, tol) << "position " << kPositions[static_cast<size_t>(p)] << " head " << h
                                           << " channel " << i;
        }
        // And removal: e8kv takes ggml's keys back to the unrotated ones (the memory's RoPE step).
        std::vector<float> back(want.begin() + static_cast<std::ptrdiff_t>(at), want.begin() + static_cast<std::ptrdiff_t>(at + d));
        for (int i = 0; i < g.n_rot; ++i) back[static_cast<size_t>(i)] /= mscale;
        rope.remove(back.data(), kPositions[static_cast<size_t>(p)]);
        for (int i = 0; i < d; ++i)
          ASSERT_NEAR(back[static_cast<size_t>(i)], x[at + static_cast<size_t>(i)],
                      2e-6 + 1.2e-6 * (1.0 + kPositions[static_cast<size_t>(p)]))
              << "removal, position " << kPositions[static_cast<size_t>(p)] << " channel " << i;
      }
    std::printf("%-40s largest |e8kv − ggml| %.2e\n", v.name, worst);
    EXPECT_LT(worst, 2e-3);  // float angles at position 9000; a wrong frequency is off by whole units
  }
}

TEST(RopeMapping, RefusesWhatItCannotExpress) {
  auto refused = [](e8kv_llama::GgmlRope g, const char* what) {
    try {
      e8kv_llama::rope_params(g);
      ADD_FAILURE() << "no error for " << what;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  e8kv_llama::GgmlRope g;
  g.mode = LLAMA_ROPE_TYPE_NEOX;
  g.head_dim = 64;
  g.n_rot = 64;
  g.n_ctx_orig = 4096;
  e8kv_llama::GgmlRope m = g;
  m.mode = LLAMA_ROPE_TYPE_MROPE;
  refused(m, "multi-section");
  e8kv_llama::GgmlRope f = g;
  f.freq_factors.assign(31, 1.f);
  refused(f, "32 rotary pairs");
  f.freq_factors.assign(32, 1.f);
  f.freq_factors[3] = 0.f;
  refused(f, "frequency factor");
  e8kv_llama::GgmlRope y = g;
  y.ext_factor = 1.f;
  y.n_ctx_orig = 0;
  refused(y, "original context");
  e8kv_llama::GgmlRope odd = g;
  odd.n_rot = 63;
  refused(odd, "dimensions");
}

}  // namespace
