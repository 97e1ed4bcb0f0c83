// e8kv::attend / attend_batch / merge_attention: attention through the codes against dense
// attention over what the cache decodes to (every key frame and codec), the log-sum-exp, exact
// merging of two halves, batches equal to single calls, and results that do not depend on the
// thread count or the ISA build (bit for bit). Seeds are fixed and printed by the failures.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/parallel.hpp"
#include "testing/kv_fixture.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv;
using namespace e8kv::testkit;

synth::SyntheticSpec spec_of(int kv_heads, int q_heads, int d, int tokens, uint64_t seed) {
  return shaped_spec(1, kv_heads, q_heads, d, tokens, seed);
}

/// Dense attention (double) over the keys and values the cache decodes to, and its lse.
struct Reference {
  std::vector<float> out;
  std::vector<double> lse;
};
Reference reference_attention(const CompressedKV& cache, int layer, const float* q) {
  const auto& L = cache.layout();
  const int H = L.n_kv_heads, G = L.n_q_heads / H, d = L.head_dim;
  const double scale = L.effective_softmax_scale();
  Reference r;
  r.out.assign(static_cast<size_t>(L.n_q_heads) * d, 0.f);
  r.lse.assign(static_cast<size_t>(L.n_q_heads), -std::numeric_limits<double>::infinity());
  for (int h = 0; h < H; ++h) {
    const auto ch = cache.decompress_head(layer, h);
    const size_t n = ch.positions.size();
    for (int g = 0; g < G; ++g) {
      const float* qg = q + (static_cast<size_t>(h) * G + g) * d;
      std::vector<double> logit(n);
      double m = -1e300;
      for (size_t t = 0; t < n; ++t) {
        double s = 0;
        for (int i = 0; i < d; ++i) s += double(qg[i]) * ch.keys[t * d + i];
        logit[t] = s * scale;
        m = std::max(m, logit[t]);
      }
      if (n == 0) continue;
      double z = 0;
      for (auto& x : logit) z += (x = std::exp(x - m));
      r.lse[static_cast<size_t>(h) * G + g] = m + std::log(z);
      for (size_t t = 0; t < n; ++t)
        for (int i = 0; i < d; ++i)
          r.out[(static_cast<size_t>(h) * G + g) * d + i] += static_cast<float>(logit[t] / z * ch.values[t * d + i]);
    }
  }
  return r;
}

double max_rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - ref[i]));
    den = std::max(den, std::fabs(double(ref[i])));
  }
  return den > 0 ? num / den : num;
}

struct Case {
  const char* preset;
  KeyFrame frame;
  std::string extra;  // further Config::parse fields
};

std::string name(const Case& c) { return std::string(c.preset) + "/" + transform::to_string(c.frame) + c.extra; }

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"quant-k3v2", KeyFrame::kRopeResidual, ""},  {"quant-k3v2", KeyFrame::kPreRope, ""},
      {"quant-k3v2", KeyFrame::kPostRope, ""},      {"quant-k2v2", KeyFrame::kRopeResidual, ""},
      {"quant-k4v4", KeyFrame::kRopeResidual, ""},  {"quant-k3v3", KeyFrame::kRopeResidual, ""},
      {"lossless", KeyFrame::kRopeResidual, ""},    {"quant-k3v2", KeyFrame::kRopeResidual, ",key=ball3,value=vor2"},
      {"quant-k3v2", KeyFrame::kRopeResidual, ",center=0,qweight=0"},
      {"quant-k3v2", KeyFrame::kRopeResidual, ",gain_bits=16"},
      {"high", KeyFrame::kRopeResidual, ",per_head=1"},
      {"quant-k3v2", KeyFrame::kRopeResidual, ",protect=1"},
      // The code tier (a second code stream per head, read in its own chunks): table-decoded and
      // decoded-ahead tier codes, with the fp16 tier, eviction, per-head sets, a pre-RoPE layer,
      // and a tier past one 512-token chunk.
      {"quant-k3v2", KeyFrame::kRopeResidual, ",code_tier=0.2"},
      {"quant-k2v2", KeyFrame::kPreRope, ",code_tier=0.2,fp16_tier=0.05,evict=0.3"},
      {"high", KeyFrame::kRopeResidual, ",per_head=1,code_tier=0.15,tier_key=rvq4,tier_value=rvq3"},
      {"quant-k3v2", KeyFrame::kPostRope, ",code_tier=0.2,tier_key=ball4,tier_value=vor3"},
      {"quant-k2v2", KeyFrame::kRopeResidual, ",code_tier=0.95"},
  };
  return all;
}

CompressedKV make_cache(const Fixture& f, const Case& c) {
  Config cfg = Config::parse(std::string("preset=") + c.preset + c.extra);
  cfg.key_frame = c.frame;
  KVCompressor comp(f.shape, cfg);
  return comp.compress(f.seq, &f.queries);
}

// Every key frame and codec: attend equals dense attention over the decoded cache, lse too.
// Shapes: GQA 1, 2, 3, 4, 5, 8, 12 query heads per KV head; head_dim 64/128/256; token counts
// around the 512-token chunk and the 64-token sub-tile.
TEST(Attend, MatchesDenseAttentionOverDecodedCache) {
  struct Shape {
    int kv, q, d, tokens;
  };
  const Shape shapes[] = {{2, 4, 64, 300}, {1, 3, 64, 577}, {2, 2, 128, 70}, {1, 5, 64, 129},
                          {1, 8, 128, 513}, {1, 12, 64, 200}, {2, 4, 256, 90}};
  uint64_t seed = 500;
  size_t shape_index = 0;
  for (const auto& s : shapes) {
    Fixture f(spec_of(s.kv, s.q, s.d, s.tokens, ++seed));
    ++shape_index;
    size_t case_index = 0;
    for (const auto& c : cases()) {
      ++case_index;
      if (c.extra == ",protect=1") continue;  // one layer: protecting it makes it fp16 (covered by lossless)
      // Under the sanitizers a third of the (shape, case) grid, staggered so that every case still
      // runs on two or three of the shapes and every shape on several cases.
      if (e8kv::test::kUnderSanitizer && (shape_index + case_index) % 3 != 0) continue;
      const auto cache = make_cache(f, c);
      if (c.extra.find("code_tier") != std::string::npos) {  // the tier cases do read a tier
        EXPECT_GT(cache.tier_tokens(0, 0), s.tokens / 10) << name(c) << " seed " << seed;
      }
      for (int w : {0, 9}) {
        const float* q = f.query(0, w);
        const auto ref = reference_attention(cache, 0, q);
        std::vector<float> out(ref.out.size()), lse(ref.lse.size());
        attend(cache, 0, q, out.data(), lse.data());
        EXPECT_LT(max_rel_err(out, ref.out), 2e-5) << name(c) << " seed " << seed << " d " << s.d << " G " << s.q / s.kv;
        for (size_t i = 0; i < lse.size(); ++i)
          EXPECT_NEAR(lse[i], ref.lse[i], 2e-5 * (1 + std::fabs(ref.lse[i]))) << name(c) << " head " << i;
      }
    }
  }
}

// Splitting the keys in two (two caches of the same sequence's halves) and merging the partial
// attentions with their lse gives the attention over the union, to float rounding.
TEST(Attend, MergingTwoHalvesEqualsTheWhole) {
  const auto s = spec_of(2, 8, 64, 600, 601);
  Fixture f(s);
  for (const char* preset : {"lossless", "quant-k3v2"}) {
    Config cfg = Config::preset(preset);
    cfg.key_frame = KeyFrame::kRopeResidual;
    KVCompressor comp(f.shape, cfg);
    const int64_t half = 256;
    SequenceKV first, second;
    for (const auto& l : f.seq.layers) {
      first.layers.push_back({l.keys.token_slice(0, half), l.values.token_slice(0, half)});
      second.layers.push_back({l.keys.token_slice(half, s.tokens - half), l.values.token_slice(half, s.tokens - half)});
    }
    second.first_position = static_cast<int32_t>(half);
    const auto a = comp.compress(first, &f.queries), b = comp.compress(second, &f.queries);
    const float* q = f.query(0, 3);
    const size_t n = static_cast<size_t>(s.n_q_heads) * s.head_dim;
    std::vector<float> oa(n), ob(n), la(s.n_q_heads), lb(s.n_q_heads), merged(n), lm(s.n_q_heads);
    attend(a, 0, q, oa.data(), la.data());
    attend(b, 0, q, ob.data(), lb.data());
    merge_attention(oa.data(), la.data(), ob.data(), lb.data(), s.n_q_heads, s.head_dim, merged.data(), lm.data());
    // The reference: dense attention over both halves' decoded keys and values.
    const auto ra = reference_attention(a, 0, q), rb = reference_attention(b, 0, q);
    for (int qh = 0; qh < s.n_q_heads; ++qh) {
      const double m = std::max(ra.lse[qh], rb.lse[qh]);
      const double wa = std::exp(ra.lse[qh] - m), wb = std::exp(rb.lse[qh] - m);
      EXPECT_NEAR(lm[qh], m + std::log(wa + wb), 2e-5 * (1 + std::fabs(m))) << preset << " head " << qh;
      for (int i = 0; i < s.head_dim; ++i) {
        const double want = (wa * ra.out[qh * s.head_dim + i] + wb * rb.out[qh * s.head_dim + i]) / (wa + wb);
        EXPECT_NEAR(merged[qh * s.head_dim + i], want, 3e-5 * (1 + std::fabs(want))) << preset << " head " << qh;
      }
    }
    // An empty side leaves the other unchanged.
    std::vector<float> none(n, 0.f), lnone(s.n_q_heads, -std::numeric_limits<float>::infinity()), o2(n), l2(s.n_q_heads);
    merge_attention(oa.data(), la.data(), none.data(), lnone.data(), s.n_q_heads, s.head_dim, o2.data(), l2.data());
    for (size_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(o2[i], oa[i]);
  }
}

// A batch of requests (several caches, layers and query tokens) gives, bit for bit, what single
// calls give; so does every executor and thread count, and both ISA builds.
TEST(Attend, BatchThreadsAndIsaGiveIdenticalBits) {
  Fixture f1(spec_of(2, 8, 128, 1300, 602)), f2(spec_of(2, 8, 128, 90, 603));
  std::vector<CompressedKV> caches;
  for (const auto& c : cases()) {
    if (c.extra == ",protect=1") continue;
    // Under the sanitizers (where MatchesDenseAttentionOverDecodedCache runs every case on some
    // shapes): the table-decoded, fp16 and per-head-position paths through the batch and its threads.
    const bool sanitizer_case = (std::string(c.preset) == "quant-k3v2" && c.extra.empty() &&
                                 c.frame != KeyFrame::kPostRope) ||
                                std::string(c.preset) == "lossless" || std::string(c.preset) == "high";
    if (e8kv::test::kUnderSanitizer && !sanitizer_case) continue;
    caches.push_back(make_cache(f1, c));
    caches.push_back(make_cache(f2, c));
  }
  const size_t n = 8 * 128;
  // Singles, one thread, best ISA.
  std::vector<std::vector<float>> single(caches.size()), single_lse(caches.size());
  for (size_t i = 0; i < caches.size(); ++i) {
    const Fixture& f = i % 2 ? f2 : f1;
    single[i].resize(2 * n);
    single_lse[i].resize(16);
    for (int t = 0; t < 2; ++t) attend(caches[i], 0, f.query(0, t), &single[i][t * n], &single_lse[i][t * 8]);
  }
  auto run_batch = [&](Executor* ex, size_t max_state_bytes = 0) {
    std::vector<std::vector<float>> out(caches.size(), std::vector<float>(2 * n)), lse(caches.size(), std::vector<float>(16));
    std::vector<AttendRequest> reqs;
    for (size_t i = 0; i < caches.size(); ++i) {
      const Fixture& f = i % 2 ? f2 : f1;
      AttendRequest r;
      r.cache = &caches[i];
      r.n_tokens = 2;
      r.q = f.query(0, 0);  // queries 0 and 1 are consecutive rows
      r.out = out[i].data();
      r.lse = lse[i].data();
      reqs.push_back(r);
    }
    AttendOptions options;
    options.executor = ex;
    options.max_state_bytes = max_state_bytes;
    attend_batch(reqs, options);
    return std::make_pair(out, lse);
  };
  ThreadPool one(1), two(2), three(3);
  for (Executor* ex : {static_cast<Executor*>(nullptr), static_cast<Executor*>(&one), static_cast<Executor*>(&two),
                       static_cast<Executor*>(&three)}) {
    const auto [out, lse] = run_batch(ex);
    for (size_t i = 0; i < caches.size(); ++i) {
      EXPECT_EQ(out[i], single[i]) << "cache " << i << " threads " << (ex ? ex->concurrency() : 0);
      EXPECT_EQ(lse[i], single_lse[i]) << "cache " << i;
    }
  }
  // Chunks in waves (a state budget of one byte: one chunk per wave; 40 KB: a few), folded wave
  // after wave: the same bits, with the 1,300-token caches' chunks beside the 90-token ones'.
  for (size_t budget : {size_t{1}, size_t{40} << 10})
    for (Executor* ex : {static_cast<Executor*>(nullptr), static_cast<Executor*>(&three)}) {
      const auto [out, lse] = run_batch(ex, budget);
      for (size_t i = 0; i < caches.size(); ++i) {
        EXPECT_EQ(out[i], single[i]) << "cache " << i << " state budget " << budget;
        EXPECT_EQ(lse[i], single_lse[i]) << "cache " << i << " state budget " << budget;
      }
    }
  force_baseline_isa(true);
  const auto [base_out, base_lse] = run_batch(&two);
  force_baseline_isa(false);
  for (size_t i = 0; i < caches.size(); ++i) {
    EXPECT_EQ(base_out[i], single[i]) << "portable build differs, cache " << i;
    EXPECT_EQ(base_lse[i], single_lse[i]) << "portable build differs, cache " << i;
  }
}

TEST(Attend, EmptyLayerGivesZerosAndMinusInfinity) {
  Fixture f(spec_of(1, 2, 64, 10, 604));
  KVCompressor comp(f.shape, Config::preset("quant-k3v2"));
  SequenceKV empty;
  for (const auto& l : f.seq.layers) empty.layers.push_back({l.keys.token_slice(0, 0), l.values.token_slice(0, 0)});
  const auto cache = comp.compress(empty);
  std::vector<float> out(128, 1.f), lse(2, 0.f);
  attend(cache, 0, f.query(0, 0), out.data(), lse.data());
  for (float x : out) EXPECT_EQ(x, 0.f);
  for (float x : lse) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
}

TEST(Attend, BadArgumentsGiveClearErrors) {
  Fixture f(spec_of(1, 2, 64, 40, 605));
  KVCompressor comp(f.shape, Config::preset("quant-k3v2"));
  const auto cache = comp.compress(f.seq);
  std::vector<float> q(f.query(0, 0), f.query(0, 0) + 128), out(128);
  EXPECT_THROW(attend(cache, 0, nullptr, out.data()), Error);
  EXPECT_THROW(attend(cache, 0, q.data(), nullptr), Error);
  EXPECT_THROW(attend(cache, 1, q.data(), out.data()), Error);
  EXPECT_THROW(attend(cache, -1, q.data(), out.data()), Error);
  EXPECT_THROW(attend(CompressedKV(), 0, q.data(), out.data()), Error);
  q[70] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(attend(cache, 0, q.data(), out.data()), Error);
  q[70] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(attend(cache, 0, q.data(), out.data()), Error);
  AttendRequest r;
  r.cache = &cache;
  r.q = f.query(0, 0);
  r.out = out.data();
  r.n_tokens = 0;
  EXPECT_THROW(attend_batch({r}), Error);
  // The compressor's form checks the query's position against the cache.
  EXPECT_THROW(comp.attend(cache, 0, f.query(0, 0), 10, out.data()), Error);
  EXPECT_NO_THROW(comp.attend(cache, 0, f.query(0, 0), 40, out.data()));
}

}  // namespace

namespace {
// Caches of every key frame survive the container (format v3 for RoPE residuals) and attend to
// the same bits after the round trip.
TEST(Attend, EveryKeyFrameRoundTripsThroughTheContainer) {
  Fixture f(spec_of(2, 4, 64, 300, 606));
  for (KeyFrame frame : {KeyFrame::kPreRope, KeyFrame::kPostRope, KeyFrame::kRopeResidual}) {
    Config cfg = Config::preset("quant-k3v2");
    cfg.key_frame = frame;
    KVCompressor comp(f.shape, cfg);
    const auto cache = comp.compress(f.seq, &f.queries);
    const auto bytes = container::serialize(cache);
    EXPECT_EQ(container::read_info(bytes.data(), bytes.size()).format_version, frame == KeyFrame::kRopeResidual ? 3 : 2);
    const auto back = container::deserialize(bytes.data(), bytes.size());
    EXPECT_EQ(back.layout().key_frame, frame);
    std::vector<float> a(256), b(256);
    attend(cache, 0, f.query(0, 1), a.data());
    attend(back, 0, f.query(0, 1), b.data());
    EXPECT_EQ(a, b) << transform::to_string(frame);
  }
}
}  // namespace
