// Appending a batch of tokens and attending them together, as an engine's later decode call does:
// KVCompressor::append_flushes predicts every flush, and a batch attended in segments that end
// before a flushing append, each token bounded by its own position (token_max_positions), gives
// every token exactly what appending and attending one token at a time gives it, bit for bit;
// with a sliding window too (each token's own lower bound, token_min_positions).
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/parallel.hpp"
#include "testing/kv_fixture.hpp"

namespace e8kv {
namespace {

constexpr uint64_t kSeed = 771;
constexpr int kPrefill = 70, kAppended = 150;

synth::SyntheticSpec spec() {
  synth::SyntheticSpec s = testkit::shaped_spec(2, 2, 6, 64, kPrefill + kAppended, kSeed);
  s.obs_window = kAppended;  // a query for every appended token (the fixture's last obs_window)
  return s;
}

// The prefill: the fixture's first kPrefill tokens.
SequenceKV prefix(const testkit::Fixture& f, int n) {
  SequenceKV kv;
  for (size_t l = 0; l < f.seq.layers.size(); ++l) {
    LayerKV x;
    x.keys = TensorView::nhd(f.data.keys[l].data(), DType::kF32, n, f.shape.n_kv_heads, f.shape.head_dim);
    x.values = TensorView::nhd(f.data.values[l].data(), DType::kF32, n, f.shape.n_kv_heads, f.shape.head_dim);
    kv.layers.push_back(x);
  }
  kv.positions = f.data.positions.data();
  return kv;
}

const float* row(const std::vector<float>& x, int t, int width) { return x.data() + static_cast<size_t>(t) * width; }

const char* kSpecs[] = {"preset=quant-k3v2", "preset=tier-k3v2", "preset=quant-k2v2,per_head=1", "preset=lossless",
                        "preset=quant-k4v4,residual=0,flush=4", "preset=high,sinks=80"};

TEST(AppendFlushes, PredictsEveryFlush) {
  const testkit::Fixture f(spec());
  const int width = f.shape.n_kv_heads * f.shape.head_dim;
  for (const char* s : kSpecs) {
    SCOPED_TRACE(s);
    const KVCompressor c(f.shape, Config::parse(s));
    for (int prefill : {1, 3, kPrefill}) {
      CompressedKV cache = c.compress(prefix(f, prefill), &f.queries);
      int flushes = 0;
      for (int t = prefill; t < prefill + kAppended; ++t)
        for (int l = 0; l < f.shape.n_layers; ++l) {
          const bool predicted = c.append_flushes(cache, l);
          const int64_t before = cache.coded_tokens(l, 1);
          c.append(cache, l, row(f.data.keys[static_cast<size_t>(l)], t, width),
                   row(f.data.values[static_cast<size_t>(l)], t, width), t);
          ASSERT_EQ(predicted, cache.coded_tokens(l, 1) != before) << "prefill " << prefill << " token " << t << " layer " << l;
          flushes += predicted;
        }
      EXPECT_GT(flushes, 0);
    }
  }
}

TEST(AppendFlushes, BatchAttendedInSegmentsEqualsTokenByToken) {
  std::printf("seed %llu, %d-token prefill, %d appended tokens\n", static_cast<unsigned long long>(kSeed), kPrefill,
              kAppended);
  const testkit::Fixture f(spec());
  const int width = f.shape.n_kv_heads * f.shape.head_dim, qwidth = f.shape.n_q_heads * f.shape.head_dim;
  for (const char* s : kSpecs) {
    SCOPED_TRACE(s);
    const KVCompressor c(f.shape, Config::parse(s));
    const CompressedKV start = c.compress(prefix(f, kPrefill), &f.queries);
    for (int32_t window : {0, 40})
    for (int l = 0; l < f.shape.n_layers; ++l) {
      SCOPED_TRACE("window " + std::to_string(window));
      auto lowest = [&](int32_t t) { return window > 0 ? t - window + 1 : std::numeric_limits<int32_t>::min(); };
      const auto& K = f.data.keys[static_cast<size_t>(l)];
      const auto& V = f.data.values[static_cast<size_t>(l)];
      // One token at a time: append, then attend.
      CompressedKV one = start;
      std::vector<float> want(static_cast<size_t>(kAppended) * qwidth), want_lse(static_cast<size_t>(kAppended) * f.shape.n_q_heads);
      for (int i = 0; i < kAppended; ++i) {
        const int t = kPrefill + i;
        c.append(one, l, row(K, t, width), row(V, t, width), t);
        AttendRequest r;
        r.cache = &one;
        r.layer = l;
        r.q = f.query(l, i);
        r.out = &want[static_cast<size_t>(i) * qwidth];
        r.lse = &want_lse[static_cast<size_t>(i) * f.shape.n_q_heads];
        r.min_position = lowest(t);
        attend_batch({r});
      }
      // The batch: appended in order; before an append that flushes, the tokens appended since the
      // last such point attend in one request, each bounded by its own position.
      CompressedKV batch = start;
      std::vector<float> got(want.size(), -1.f), got_lse(want_lse.size(), -1.f);
      std::vector<int32_t> positions, lows;
      int segment = 0, segments = 0;
      auto attend_segment = [&](int end) {
        if (end == segment) return;
        AttendRequest r;
        r.cache = &batch;
        r.layer = l;
        r.n_tokens = end - segment;
        r.q = f.query(l, segment);
        r.out = &got[static_cast<size_t>(segment) * qwidth];
        r.lse = &got_lse[static_cast<size_t>(segment) * f.shape.n_q_heads];
        r.token_max_positions = positions.data() + segment;
        if (window > 0) r.token_min_positions = lows.data() + segment;
        attend_batch({r});
        segment = end;
        ++segments;
      };
      for (int i = 0; i < kAppended; ++i) {
        if (c.append_flushes(batch, l)) attend_segment(i);
        const int t = kPrefill + i;
        c.append(batch, l, row(K, t, width), row(V, t, width), t);
        positions.push_back(t);
        lows.push_back(lowest(t));
      }
      attend_segment(kAppended);
      EXPECT_GT(segments, 1);
      for (size_t k = 0; k < want.size(); ++k) ASSERT_EQ(got[k], want[k]) << "layer " << l << " element " << k;
      EXPECT_EQ(got_lse, want_lse);
    }
  }
}

// KVCompressor::append_attend: the same batch in one call, for three sequences at once (each its own
// cache: the same start, shifted positions... here the same tokens, so every result must agree).
TEST(AppendAttend, EqualsTokenByTokenBitForBit) {
  synth::SyntheticSpec s = spec();
  const int prefill = 1200, appended = 150;
  s.tokens = prefill + appended;
  s.obs_window = appended;
  std::printf("seed %llu, %d-token prefill, %d appended tokens\n", static_cast<unsigned long long>(kSeed), prefill,
              appended);
  const testkit::Fixture f(s);
  const int width = f.shape.n_kv_heads * f.shape.head_dim, qwidth = f.shape.n_q_heads * f.shape.head_dim;
  for (const char* spec_text : {"preset=quant-k3v2", "preset=tier-k3v2", "preset=quant-k2v2,per_head=1,evict=0.3"}) {
    SCOPED_TRACE(spec_text);
    const KVCompressor c(f.shape, Config::parse(spec_text));
    const CompressedKV start = c.compress(prefix(f, prefill), &f.queries);
    ASSERT_GE(start.coded_tokens(1, 0), 512);  // at least one full chunk (eviction: fewer)
    for (int32_t window : {0, 600}) {
      SCOPED_TRACE("window " + std::to_string(window));
      const int l = 1;
      const auto& K = f.data.keys[static_cast<size_t>(l)];
      const auto& V = f.data.values[static_cast<size_t>(l)];
      std::vector<int32_t> positions, lows;
      for (int i = 0; i < appended; ++i) {
        positions.push_back(prefill + i);
        lows.push_back(window > 0 ? prefill + i - window + 1 : std::numeric_limits<int32_t>::min());
      }
      CompressedKV one = start;
      std::vector<float> want(static_cast<size_t>(appended) * qwidth), want_lse(static_cast<size_t>(appended) * f.shape.n_q_heads);
      for (int i = 0; i < appended; ++i) {
        c.append(one, l, row(K, prefill + i, width), row(V, prefill + i, width), positions[static_cast<size_t>(i)]);
        AttendRequest r;
        r.cache = &one;
        r.layer = l;
        r.q = f.query(l, i);
        r.out = &want[static_cast<size_t>(i) * qwidth];
        r.lse = &want_lse[static_cast<size_t>(i) * f.shape.n_q_heads];
        r.min_position = lows[static_cast<size_t>(i)];
        attend_batch({r});
      }
      // Three sequences in one call: each its own copy of the cache, the same tokens.
      std::vector<CompressedKV> batch(3, start);
      std::vector<std::vector<float>> got(3, std::vector<float>(want.size(), -1.f)),
          got_lse(3, std::vector<float>(want_lse.size(), -1.f));
      std::vector<KVCompressor::AppendAttendRequest> requests;
      for (size_t b = 0; b < 3; ++b) {
        KVCompressor::AppendAttendRequest r;
        r.cache = &batch[b];
        r.layer = l;
        r.n_tokens = appended - static_cast<int>(b) * 10;  // of different lengths
        r.k = row(K, prefill, width);
        r.v = row(V, prefill, width);
        r.positions = positions.data();
        r.q = f.query(l, 0);
        r.out = got[b].data();
        r.lse = got_lse[b].data();
        r.token_min_positions = window > 0 ? lows.data() : nullptr;
        requests.push_back(r);
      }
      ThreadPool pool(3);
      c.append_attend(requests, &pool);
      for (size_t b = 0; b < 3; ++b) {
        const size_t n = static_cast<size_t>(requests[b].n_tokens);
        for (size_t e = 0; e < n * qwidth; ++e) ASSERT_EQ(got[b][e], want[e]) << "sequence " << b << " element " << e;
        for (size_t e = 0; e < n * f.shape.n_q_heads; ++e) ASSERT_EQ(got_lse[b][e], want_lse[e]) << "sequence " << b;
      }
      EXPECT_EQ(batch[0].bytes(), one.bytes());
    }
  }
}

}  // namespace
}  // namespace e8kv
