// AttendRequest's position bounds (a causal limit, a sliding window) against dense attention over
// the decoded tokens whose positions lie inside them, and scores that overflow the float range
// refused instead of answered with zeros. Seeds are fixed and printed by the failures.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/error.hpp"
#include "e8kv/parallel.hpp"
#include "testing/kv_fixture.hpp"

namespace {
using namespace e8kv;
using namespace e8kv::testkit;

constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
constexpr int32_t kMax = std::numeric_limits<int32_t>::max();

synth::SyntheticSpec spec_of(int kv_heads, int q_heads, int d, int tokens, uint64_t seed) {
  return shaped_spec(1, kv_heads, q_heads, d, tokens, seed);
}

/// Dense attention (double) over the decoded tokens of `layer` with positions in [lo, hi].
std::vector<float> bounded_reference(const CompressedKV& cache, int layer, const float* q, int32_t lo, int32_t hi,
                                     std::vector<double>* lse) {
  const auto& L = cache.layout();
  const int H = L.n_kv_heads, G = L.n_q_heads / H, d = L.head_dim;
  const double scale = L.effective_softmax_scale();
  std::vector<float> out(static_cast<size_t>(L.n_q_heads) * d, 0.f);
  lse->assign(static_cast<size_t>(L.n_q_heads), -std::numeric_limits<double>::infinity());
  for (int h = 0; h < H; ++h) {
    const auto ch = cache.decompress_head(layer, h);
    for (int g = 0; g < G; ++g) {
      const float* qg = q + (static_cast<size_t>(h) * G + g) * d;
      std::vector<double> logit;
      std::vector<size_t> rows;
      double m = -1e300;
      for (size_t t = 0; t < ch.positions.size(); ++t) {
        if (ch.positions[t] < lo || ch.positions[t] > hi) continue;
        double s = 0;
        for (int i = 0; i < d; ++i) s += double(qg[i]) * ch.keys[t * d + i];
        logit.push_back(s * scale);
        rows.push_back(t);
        m = std::max(m, logit.back());
      }
      if (rows.empty()) continue;
      double z = 0;
      for (auto& x : logit) z += (x = std::exp(x - m));
      (*lse)[static_cast<size_t>(h) * G + g] = m + std::log(z);
      for (size_t j = 0; j < rows.size(); ++j)
        for (int i = 0; i < d; ++i)
          out[(static_cast<size_t>(h) * G + g) * d + i] += static_cast<float>(logit[j] / z * ch.values[rows[j] * d + i]);
    }
  }
  return out;
}

double max_abs_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double e = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e = std::max(e, std::fabs(double(a[i]) - ref[i]));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return scale > 0 ? e / scale : e;
}

// Caches whose stored tokens sit in every stream: codes past one 512-token chunk, the fp16
// window with pinned sinks and an fp16 tier at any position, the code tier, per-head sets after
// eviction. Positions are sparse (every third) so that bounds fall between stored tokens too.
TEST(AttendBounds, EqualDenseAttentionOverTheTokensInside) {
  const char* specs[] = {"preset=quant-k3v2", "preset=quant-k3v2,fp16_tier=0.05,code_tier=0.1",
                         "preset=high,per_head=1,code_tier=0.1", "preset=lossless", "preset=quant-k2v2,rope=pre"};
  uint64_t seed = 7100;
  for (const char* spec : specs) {
    Fixture f(spec_of(2, 6, 64, 700, ++seed));
    std::vector<int32_t> positions(700);
    for (int t = 0; t < 700; ++t) positions[static_cast<size_t>(t)] = 3 * t + 1;
    f.seq.positions = positions.data();
    std::vector<int32_t> qpos(f.data.query_positions.size());
    for (size_t i = 0; i < qpos.size(); ++i) qpos[i] = positions[static_cast<size_t>(f.data.query_positions[i])];
    for (auto& lq : f.queries) lq.positions = qpos.data();
    KVCompressor comp(f.shape, Config::parse(spec));
    CompressedKV cache = comp.compress(f.seq, &f.queries);
    // A few appended tokens: the unpinned window past the codes.
    for (int t = 0; t < 5; ++t) comp.append(cache, 0, f.query(0, t), f.query(0, t + 1), 2101 + t);
    const int32_t bounds[][2] = {{kMin, kMax}, {kMin, 1000},  {500, kMax},  {2, 3},   {0, 0},   {kMin, -1},
                                 {2100, kMax}, {1, 1},        {300, 1536},  {1537, 2099}, {4, 1}, {2102, 2103}};
    const float* q = f.query(0, 3);
    for (const auto& b : bounds) {
      std::vector<double> ref_lse;
      const auto ref = bounded_reference(cache, 0, q, b[0], b[1], &ref_lse);
      std::vector<float> out(ref.size()), lse(ref_lse.size());
      AttendRequest r;
      r.cache = &cache;
      r.q = q;
      r.out = out.data();
      r.lse = lse.data();
      r.min_position = b[0];
      r.max_position = b[1];
      attend_batch({r});
      EXPECT_LT(max_abs_err(out, ref), 2e-5) << spec << " seed " << seed << " bounds [" << b[0] << ", " << b[1] << "]";
      for (size_t i = 0; i < lse.size(); ++i) {
        if (std::isinf(ref_lse[i])) {
          EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << spec << " head " << i << " [" << b[0] << ", " << b[1] << "]";
        } else {
          EXPECT_NEAR(lse[i], ref_lse[i], 2e-5 * (1 + std::fabs(ref_lse[i]))) << spec << " head " << i;
        }
      }
    }
  }
}

// Bounds that hold every stored token change nothing, bit for bit; a batch of requests with
// different bounds equals the requests one by one, on any executor.
TEST(AttendBounds, InclusiveBoundsAreBitIdenticalAndBatchesEqualSingles) {
  Fixture f(spec_of(1, 4, 128, 600, 7201));
  KVCompressor comp(f.shape, Config::parse("preset=quant-k3v2,code_tier=0.05"));
  const CompressedKV cache = comp.compress(f.seq, &f.queries);
  const int n_out = 4 * 128;
  std::vector<float> plain(n_out), bounded(n_out);
  attend(cache, 0, f.query(0, 2), plain.data());
  AttendRequest r;
  r.cache = &cache;
  r.q = f.query(0, 2);
  r.out = bounded.data();
  r.min_position = 0;
  r.max_position = 599;
  attend_batch({r});
  EXPECT_EQ(plain, bounded);

  const int32_t maxes[] = {599, 300, 17, 511, 512, 80};
  std::vector<std::vector<float>> singles, batched(6, std::vector<float>(n_out));
  std::vector<AttendRequest> batch;
  for (int i = 0; i < 6; ++i) {
    AttendRequest a = r;
    a.q = f.query(0, i);
    a.max_position = maxes[i];
    a.min_position = i == 3 ? 200 : 0;
    singles.emplace_back(n_out);
    a.out = singles.back().data();
    attend_batch({a});
    a.out = batched[static_cast<size_t>(i)].data();
    batch.push_back(a);
  }
  ThreadPool pool(3);
  attend_batch(batch, {&pool});
  for (int i = 0; i < 6; ++i) EXPECT_EQ(singles[static_cast<size_t>(i)], batched[static_cast<size_t>(i)]) << "request " << i;
}

// Sliding windows over a deep cache (one KV head, as Gemma-3's layers): a request of many query
// tokens, each with its own window, skips the chunks and sub-tiles below every token's window and
// cuts its tokens into parts across threads; each token still equals itself attended alone (whose
// narrower bounds skip more), bit for bit, on any executor.
TEST(AttendBounds, WindowedTokensEqualThemselvesAloneWhateverIsSkipped) {
  for (const char* spec : {"preset=quant-k3v2", "preset=quant-k3v2,code_tier=0.05"}) {
    const uint64_t seed = 7401;
    Fixture f(spec_of(1, 4, 64, 1800, seed));
    KVCompressor comp(f.shape, Config::parse(spec));
    const CompressedKV cache = comp.compress(f.seq, &f.queries);
    const int n_tokens = 24, q_row = 4 * 64;
    std::vector<float> q(static_cast<size_t>(n_tokens) * q_row);
    for (int t = 0; t < n_tokens; ++t) std::copy(f.query(0, t % 8), f.query(0, t % 8) + q_row, q.begin() + t * q_row);
    for (int32_t window : {100, 300, 700, 5000}) {
      std::vector<int32_t> lows(n_tokens), highs(n_tokens);
      for (int t = 0; t < n_tokens; ++t) {
        highs[static_cast<size_t>(t)] = 1690 + 4 * t;
        lows[static_cast<size_t>(t)] = highs[static_cast<size_t>(t)] - window + 1;
      }
      std::vector<float> alone(q.size()), lse_alone(static_cast<size_t>(n_tokens) * 4);
      for (int t = 0; t < n_tokens; ++t) {
        AttendRequest a;
        a.cache = &cache;
        a.q = q.data() + t * q_row;
        a.out = alone.data() + t * q_row;
        a.lse = lse_alone.data() + t * 4;
        a.min_position = lows[static_cast<size_t>(t)];
        a.max_position = highs[static_cast<size_t>(t)];
        attend_batch({a});
      }
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        std::vector<float> out(q.size()), lse(lse_alone.size());
        AttendRequest b;
        b.cache = &cache;
        b.n_tokens = n_tokens;
        b.q = q.data();
        b.out = out.data();
        b.lse = lse.data();
        b.token_min_positions = lows.data();
        b.token_max_positions = highs.data();
        attend_batch({b}, {&pool});
        EXPECT_EQ(out, alone) << spec << " seed " << seed << " window " << window << " threads " << threads;
        EXPECT_EQ(lse, lse_alone) << spec << " seed " << seed << " window " << window << " threads " << threads;
      }
    }
  }
}

// A finite query so large that scale·q·k overflows the float range: an error naming the
// overflow, for lossless and coded caches alike, never an output of zeros.
TEST(AttendBounds, OverflowingScoresAreRefused) {
  Fixture f(spec_of(1, 2, 64, 200, 7301));
  for (const char* spec : {"preset=lossless", "preset=quant-k3v2", "preset=quant-k3v2,code_tier=0.1"}) {
    KVCompressor comp(f.shape, Config::parse(spec));
    const CompressedKV cache = comp.compress(f.seq, &f.queries);
    std::vector<float> q(f.query(0, 0), f.query(0, 0) + 2 * 64), out(2 * 64);
    for (float& x : q) x = std::copysign(3e38f, x);
    try {
      attend(cache, 0, q.data(), out.data());
      ADD_FAILURE() << spec << ": an overflowing query was answered";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("overflow"), std::string::npos) << e.what();
    }
    // Large but representable scores still attend.
    for (float& x : q) x = std::copysign(1e3f, x);
    EXPECT_NO_THROW(attend(cache, 0, q.data(), out.data())) << spec;
    for (float x : out) EXPECT_TRUE(std::isfinite(x)) << spec;
  }
}

}  // namespace
