// Naive reference for select/ (scorers, pooling, GQA and head aggregation, eviction), written
// from the header comments and the literature, not from src/select/select.cpp: double precision,
// plain loops, one formula per line, no shortcuts. Tests compare the library against it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace e8kv::naive {

/// A layer's keys, [tokens][heads][dim] row-major, and each token's absolute position.
struct Keys {
  int64_t tokens = 0, heads = 0, dim = 0;
  std::vector<float> x;
  std::vector<int32_t> pos;
  double at(int64_t t, int64_t h, int64_t i) const { return x[static_cast<size_t>((t * heads + h) * dim + i)]; }
};

/// One window of observation queries, [window][q_heads][dim], with each query's position.
struct Queries {
  int64_t window = 0, heads = 0, dim = 0;
  std::vector<float> x;
  std::vector<int32_t> pos;
  double at(int64_t w, int64_t h, int64_t i) const { return x[static_cast<size_t>((w * heads + h) * dim + i)]; }
};

/// Uniform floats in [-amplitude, amplitude) from a 64-bit engine (portable: no std distribution).
inline std::vector<float> uniform_floats(std::mt19937_64& rng, size_t n, double amplitude) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(amplitude * (2.0 * static_cast<double>(rng() >> 11) * 0x1p-53 - 1.0));
  return v;
}

/// softmax(scale · q·k_t) over the keys with pos_t <= q_pos (causal); 0 for the others. A query
/// that sees no key contributes nothing (all zeros).
inline std::vector<double> attention_row(const std::vector<double>& q, const Keys& k, int64_t head, int32_t q_pos,
                                         double scale) {
  std::vector<double> p(static_cast<size_t>(k.tokens), 0.0);
  std::vector<double> logit(static_cast<size_t>(k.tokens), 0.0);
  bool any = false;
  double max_logit = -std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < k.tokens; ++t) {
    if (k.pos[static_cast<size_t>(t)] > q_pos) continue;
    double dot = 0.0;
    for (int64_t i = 0; i < k.dim; ++i) dot += q[static_cast<size_t>(i)] * k.at(t, head, i);
    logit[static_cast<size_t>(t)] = scale * dot;
    max_logit = std::max(max_logit, logit[static_cast<size_t>(t)]);
    any = true;
  }
  if (!any) return p;
  double z = 0.0;
  for (int64_t t = 0; t < k.tokens; ++t)
    if (k.pos[static_cast<size_t>(t)] <= q_pos) z += std::exp(logit[static_cast<size_t>(t)] - max_logit);
  for (int64_t t = 0; t < k.tokens; ++t)
    if (k.pos[static_cast<size_t>(t)] <= q_pos) p[static_cast<size_t>(t)] = std::exp(logit[static_cast<size_t>(t)] - max_logit) / z;
  return p;
}

enum class Reduce { kMean, kMax };

/// Observation-window scores (SnapKV style), one or more query windows: for every KV head h and
/// every query head g of its GQA group (query heads h·G .. h·G + G − 1), the attention each key
/// receives summed over all queries of all windows; then mean or max over the group.
/// Result [heads][tokens], before pooling.
inline std::vector<double> attention_scores(const Keys& k, const std::vector<Queries>& windows, Reduce gqa,
                                            double scale) {
  const int64_t group = windows.at(0).heads / k.heads;
  std::vector<double> out(static_cast<size_t>(k.heads * k.tokens), 0.0);
  for (int64_t h = 0; h < k.heads; ++h) {
    std::vector<std::vector<double>> per_query_head(static_cast<size_t>(group),
                                                    std::vector<double>(static_cast<size_t>(k.tokens), 0.0));
    for (int64_t g = 0; g < group; ++g)
      for (const Queries& qs : windows)
        for (int64_t w = 0; w < qs.window; ++w) {
          std::vector<double> q(static_cast<size_t>(qs.dim));
          for (int64_t i = 0; i < qs.dim; ++i) q[static_cast<size_t>(i)] = qs.at(w, h * group + g, i);
          const auto p = attention_row(q, k, h, qs.pos[static_cast<size_t>(w)], scale);
          for (int64_t t = 0; t < k.tokens; ++t) per_query_head[static_cast<size_t>(g)][static_cast<size_t>(t)] += p[static_cast<size_t>(t)];
        }
    for (int64_t t = 0; t < k.tokens; ++t) {
      double r = gqa == Reduce::kMean ? 0.0 : -std::numeric_limits<double>::infinity();
      for (int64_t g = 0; g < group; ++g) {
        const double v = per_query_head[static_cast<size_t>(g)][static_cast<size_t>(t)];
        r = gqa == Reduce::kMean ? r + v / static_cast<double>(group) : std::max(r, v);
      }
      out[static_cast<size_t>(h * k.tokens + t)] = r;
    }
  }
  return out;
}

/// Key-key proxy: the last min(window, tokens) keys of each head act as that head's queries, at
/// their own positions. Result [heads][tokens], before pooling.
inline std::vector<double> key_key_scores(const Keys& k, int64_t window, double scale) {
  std::vector<double> out(static_cast<size_t>(k.heads * k.tokens), 0.0);
  const int64_t first = std::max<int64_t>(0, k.tokens - window);
  for (int64_t h = 0; h < k.heads; ++h)
    for (int64_t w = first; w < k.tokens; ++w) {
      std::vector<double> q(static_cast<size_t>(k.dim));
      for (int64_t i = 0; i < k.dim; ++i) q[static_cast<size_t>(i)] = k.at(w, h, i);
      const auto p = attention_row(q, k, h, k.pos[static_cast<size_t>(w)], scale);
      for (int64_t t = 0; t < k.tokens; ++t) out[static_cast<size_t>(h * k.tokens + t)] += p[static_cast<size_t>(t)];
    }
  return out;
}

/// Key norm baseline (KNorm): a lower L2 norm means more important, so the score is −‖k‖.
inline std::vector<double> key_norm_scores(const Keys& k) {
  std::vector<double> out(static_cast<size_t>(k.heads * k.tokens));
  for (int64_t h = 0; h < k.heads; ++h)
    for (int64_t t = 0; t < k.tokens; ++t) {
      double ss = 0.0;
      for (int64_t i = 0; i < k.dim; ++i) ss += k.at(t, h, i) * k.at(t, h, i);
      out[static_cast<size_t>(h * k.tokens + t)] = -std::sqrt(ss);
    }
  return out;
}

/// SplitMix64 run sequentially from state `seed`: the output after `steps` increments
/// (steps >= 1). Steele, Lea & Flood 2014; constants from the paper's reference code.
inline uint64_t splitmix64_sequential(uint64_t seed, uint64_t steps) {
  uint64_t state = seed, z = 0;
  for (uint64_t s = 0; s < steps; ++s) {
    state += 0x9E3779B97F4A7C15ull;
    z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z = z ^ (z >> 31);
  }
  return z;
}

/// Max-pool each head's row over the tokens within kernel/2 of t (clipped at the ends).
inline std::vector<double> max_pool(const std::vector<double>& s, int64_t heads, int64_t tokens, int kernel) {
  std::vector<double> out = s;
  const int64_t r = kernel / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t t = 0; t < tokens; ++t) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t u = t - r; u <= t + r; ++u)
        if (u >= 0 && u < tokens) m = std::max(m, s[static_cast<size_t>(h * tokens + u)]);
      out[static_cast<size_t>(h * tokens + t)] = m;
    }
  return out;
}

/// One score per token from the heads' rows: their mean or their max.
inline std::vector<double> combine_heads(const std::vector<float>& s, int64_t heads, int64_t tokens, Reduce how) {
  std::vector<double> out(static_cast<size_t>(tokens), 0.0);
  if (heads == 0) return out;
  for (int64_t t = 0; t < tokens; ++t) {
    double r = how == Reduce::kMean ? 0.0 : -std::numeric_limits<double>::infinity();
    for (int64_t h = 0; h < heads; ++h) {
      const double v = s[static_cast<size_t>(h * tokens + t)];
      r = how == Reduce::kMean ? r + v : std::max(r, v);
    }
    out[static_cast<size_t>(t)] = how == Reduce::kMean ? r / static_cast<double>(heads) : r;
  }
  return out;
}

/// Tokens kept out of n: n minus the evicted count round(rate · n) (halves away from zero),
/// but at least min(n, sinks + recent).
inline int64_t kept_count(int64_t n, double rate, int sinks, int recent) {
  const int64_t evicted = static_cast<int64_t>(std::floor(rate * static_cast<double>(n) + 0.5));
  return std::max(n - evicted, std::min<int64_t>(n, static_cast<int64_t>(sinks) + recent));
}

/// The kept set: the first `sinks` and last `recent` tokens, then the best of the others by
/// score (higher first; NaN last; a tie goes to the lower index) until kept_count tokens are
/// kept. Sorted ascending. Written as "rank everything, take a prefix".
inline std::vector<int64_t> select(const std::vector<float>& scores, double rate, int sinks, int recent) {
  const int64_t n = static_cast<int64_t>(scores.size());
  const int64_t keep = kept_count(n, rate, sinks, recent);
  std::vector<int64_t> kept, others;
  for (int64_t t = 0; t < n; ++t) {
    const bool forced = t < sinks || t >= n - recent;
    (forced ? kept : others).push_back(t);
  }
  std::stable_sort(others.begin(), others.end(), [&](int64_t a, int64_t b) {
    const float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
    if (std::isnan(sa) || std::isnan(sb)) return !std::isnan(sa) && std::isnan(sb);
    return sa > sb;  // stable: equal scores keep index order
  });
  for (size_t i = 0; static_cast<int64_t>(kept.size()) < keep && i < others.size(); ++i) kept.push_back(others[i]);
  std::sort(kept.begin(), kept.end());
  return kept;
}

}  // namespace e8kv::naive
