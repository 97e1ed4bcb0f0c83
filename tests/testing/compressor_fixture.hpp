// What the KVCompressor tests (compressor_test, compressor_append_test, compressor_tiers_test)
// share: their synthetic cache, attention through the codes measured against fp32 attention over
// it, and the fixture's tokens sliced into chunks or appended one at a time. The rest of the
// fixture (Fixture, dense_attention, rel_l2) is testing/kv_fixture.hpp's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "e8kv/compressor.hpp"
#include "e8kv/numeric/half.hpp"
#include "testing/kv_fixture.hpp"

namespace e8kv::testkit {

/// The compressor tests' cache: 300 tokens of 2 layers, 2 KV heads, 4 query heads, head_dim 64
/// (`n_layers` others), from `seed`.
inline synth::SyntheticSpec default_spec(uint64_t seed, int n_layers = 2) {
  return shaped_spec(n_layers, 2, 4, 64, 300, seed);
}

/// x as fp16 stores it.
inline float fp16_round(float x) { return fp16_bits_to_float(float_to_fp16_bits(x)); }

/// `cfg`'s compression of the fixture, scored with its observation queries.
inline CompressedKV compress_with(const Fixture& f, const Config& cfg) {
  return KVCompressor(f.shape, cfg).compress(f.seq, &f.queries);
}

/// Tokens [from, from + count) of `seq` (contiguous positions) as a chunk of their own, at their
/// positions: a prefix to compress, or the rest to extend it with.
inline SequenceKV token_range(const SequenceKV& seq, int64_t from, int64_t count) {
  SequenceKV chunk;
  for (const auto& kv : seq.layers)
    chunk.layers.push_back({kv.keys.token_slice(from, count), kv.values.token_slice(from, count)});
  chunk.first_position = static_cast<int32_t>(seq.first_position + from);
  return chunk;
}

/// Appends the fixture's token `t` of `layer` at `position`.
inline void append_token(const KVCompressor& c, CompressedKV& cache, const Fixture& f, int layer, int64_t t,
                         int64_t position) {
  const size_t at = static_cast<size_t>(t) * f.shape.n_kv_heads * f.shape.head_dim;
  c.append(cache, layer, &f.data.keys[static_cast<size_t>(layer)][at], &f.data.values[static_cast<size_t>(layer)][at],
           static_cast<int32_t>(position));
}

/// Appends the fixture's token `t` of every layer at `position`, layer by layer.
inline void append_to_every_layer(const KVCompressor& c, CompressedKV& cache, const Fixture& f, int64_t t,
                                  int64_t position) {
  for (int l = 0; l < f.shape.n_layers; ++l) append_token(c, cache, f, l, t, position);
}

/// Appends the fixture's tokens [from, from + count) at first_position onwards, token by token,
/// each to every layer (as a decoder appends them).
inline void append_tokens(const KVCompressor& c, CompressedKV& cache, const Fixture& f, int64_t from, int64_t count,
                          int64_t first_position) {
  for (int64_t i = 0; i < count; ++i) append_to_every_layer(c, cache, f, from + i, first_position + i);
}

struct Errors {
  double out_rel_l2 = 0;  // mean over layers and queries
  double kl = 0;          // mean KL(approx || reference) of attention weights
};

// Attention through the codes vs fp32 attention over the original (unevicted) cache.
inline Errors measure(const Fixture& f, const Config& cfg) {
  KVCompressor c(f.shape, cfg);
  const CompressedKV cache = c.compress(f.seq, &f.queries);
  const auto& s = f.data.spec;
  Errors e;
  int count = 0;
  for (int l = 0; l < s.n_layers; ++l) {
    std::vector<std::vector<CompactHead>> heads;
    for (int h = 0; h < s.n_kv_heads; ++h) heads.push_back({cache.decompress_head(l, h)});
    for (int w = 0; w < static_cast<int>(f.data.query_positions.size()); w += 4) {
      const float* q = f.query(l, w);
      std::vector<std::vector<double>> wref;
      const auto ref = dense_attention(q, f.data.keys[l], f.data.values[l], s.tokens, s.n_kv_heads, s.n_q_heads,
                                       s.head_dim, &wref);
      std::vector<float> out(ref.size());
      c.attend(cache, l, q, s.tokens, out.data());
      e.out_rel_l2 += rel_l2(out, ref);
      // KL(approx || ref) over the kept tokens of each query head (finite under eviction).
      const int G = s.n_q_heads / s.n_kv_heads;
      for (int qh = 0; qh < s.n_q_heads; ++qh) {
        const CompactHead& ch = heads[qh / G][0];
        const int64_t n = static_cast<int64_t>(ch.positions.size());
        std::vector<double> logit(static_cast<size_t>(n));
        double m = -1e300, z = 0, kl = 0;
        for (int64_t t = 0; t < n; ++t) {
          double dot = 0;
          for (int i = 0; i < s.head_dim; ++i) dot += double(q[qh * s.head_dim + i]) * ch.keys[t * s.head_dim + i];
          logit[t] = dot / std::sqrt(double(s.head_dim));
          m = std::max(m, logit[t]);
        }
        for (auto& x : logit) z += (x = std::exp(x - m));
        for (int64_t t = 0; t < n; ++t) {
          const double p = logit[t] / z, r = wref[qh][ch.positions[t]];
          if (p > 0) kl += p * std::log(p / r);
        }
        e.kl += kl / s.n_q_heads;
      }
      ++count;
    }
  }
  e.out_rel_l2 /= count;
  e.kl /= count;
  return e;
}

}  // namespace e8kv::testkit
