// Importance scorers and eviction (host reference implementation).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "detail/require.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/dot.hpp"
#include "e8kv/numeric/random.hpp"
#include "e8kv/platform.hpp"
#include "e8kv/select/eviction.hpp"
#include "e8kv/select/scorer.hpp"

namespace e8kv::select {

const char* to_string(ScorerKind k) {
  switch (k) {
    case ScorerKind::kObservationWindow: return "obs-window";
    case ScorerKind::kMultiWindow: return "multi-window";
    case ScorerKind::kKeyKeyProxy: return "key-key";
    case ScorerKind::kStreaming: return "streaming";
    case ScorerKind::kRandom: return "random";
    case ScorerKind::kKeyNorm: return "key-norm";
  }
  return "?";
}

ScorerKind scorer_from_string(const std::string& name) {
  for (auto k : {ScorerKind::kObservationWindow, ScorerKind::kMultiWindow, ScorerKind::kKeyKeyProxy,
                 ScorerKind::kStreaming, ScorerKind::kRandom, ScorerKind::kKeyNorm})
    if (name == to_string(k)) return k;
  throw Error("scorer '" + name +
              "' is unknown; accepted: obs-window, multi-window, key-key, streaming, random, key-norm");
}

namespace {

// Scaled logits of `rows` queries (row r at qs + r·dim, at position q_pos[r]) against one head's
// keys into logits[r·tokens + t]; a key after its query is −inf. Key blocks are the outer loop, so
// each block is read from memory once for all the queries rather than once per query (at 4K
// tokens a head's keys are 2 MiB, and the observation window scores 128 query vectors per head).
inline void attention_logits_body(const float* qs, const int32_t* q_pos, int64_t rows, const float* keys,
                                  int64_t tokens, int64_t dim, const int32_t* key_pos, float scale, float* logits) {
  constexpr int64_t kKeyBlock = 64;
  for (int64_t t0 = 0; t0 < tokens; t0 += kKeyBlock) {
    const int64_t t1 = std::min(tokens, t0 + kKeyBlock);
    for (int64_t r = 0; r < rows; ++r) {
      const float* q = qs + r * dim;
      float* out = logits + r * tokens;
      for (int64_t t = t0; t < t1; ++t)
        // Eight interleaved partial sums (numeric/dot.hpp): vectorized, the same order on every
        // machine.
        out[t] = key_pos[t] > q_pos[r] ? -std::numeric_limits<float>::infinity()
                                       : dot_product(q, keys + t * dim, static_cast<int>(dim)) * scale;
    }
  }
}

// The same loop compiled for the baseline ISA and for AVX2 (no FMA: the eight partial sums are one
// register there, the same bits as two in the baseline), picked per call.
E8KV_TARGET_BASE_FLAT void attention_logits_base(const float* qs, const int32_t* q_pos, int64_t rows, const float* keys,
                                                 int64_t tokens, int64_t dim, const int32_t* key_pos, float scale,
                                                 float* logits) {
  attention_logits_body(qs, q_pos, rows, keys, tokens, dim, key_pos, scale, logits);
}
E8KV_TARGET_AVX2_FLAT void attention_logits_avx2(const float* qs, const int32_t* q_pos, int64_t rows, const float* keys,
                                                 int64_t tokens, int64_t dim, const int32_t* key_pos, float scale,
                                                 float* logits) {
  attention_logits_body(qs, q_pos, rows, keys, tokens, dim, key_pos, scale, logits);
}
void attention_logits(const float* qs, const int32_t* q_pos, int64_t rows, const std::vector<float>& keys,
                      int64_t tokens, int64_t dim, const int32_t* key_pos, float scale, float* logits) {
  if (cpu_has_avx2()) return attention_logits_avx2(qs, q_pos, rows, keys.data(), tokens, dim, key_pos, scale, logits);
  attention_logits_base(qs, q_pos, rows, keys.data(), tokens, dim, key_pos, scale, logits);
}

// acc[t] += softmax(logits)[t]; logits is overwritten. A row that sees no key adds nothing.
void accumulate_softmax(float* logits, int64_t tokens, float* acc) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < tokens; ++t) max_logit = std::max(max_logit, logits[t]);
  if (max_logit == -std::numeric_limits<float>::infinity()) return;  // query sees no key
  double sum = 0.0;
  for (int64_t t = 0; t < tokens; ++t) {
    const float e = logits[t] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(logits[t] - max_logit);
    logits[t] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t t = 0; t < tokens; ++t) acc[t] += logits[t] * inv;
}

// Enum options arrive from configs and containers as bytes: a value outside the enum is an
// error, not a silent fallback to some other scorer or reduction.
bool known(ScorerKind k) { return static_cast<uint8_t>(k) <= static_cast<uint8_t>(ScorerKind::kKeyNorm); }
bool known(Aggregation a) { return a == Aggregation::kMean || a == Aggregation::kMax; }

void check_finite(float v, const char* what) {
  if (!std::isfinite(v)) throw Error(std::string("score_layer: non-finite value in ") + what);
}

std::vector<float> load_head(const TensorView& v, int64_t h) {
  std::vector<float> out(static_cast<size_t>(v.tokens() * v.head_dim()));
  for (int64_t t = 0; t < v.tokens(); ++t) v.load(t, h, &out[static_cast<size_t>(t * v.head_dim())]);
  for (float x : out) check_finite(x, "keys or queries");
  return out;
}

void max_pool(std::vector<float>& s, int64_t heads, int64_t tokens, int kernel) {
  if (kernel <= 1 || tokens == 0) return;
  const int64_t r = kernel / 2;
  std::vector<float> row(static_cast<size_t>(tokens));
  for (int64_t h = 0; h < heads; ++h) {
    float* p = &s[static_cast<size_t>(h * tokens)];
    for (int64_t t = 0; t < tokens; ++t) {
      float m = p[t];
      for (int64_t u = std::max<int64_t>(0, t - r); u <= std::min(tokens - 1, t + r); ++u) m = std::max(m, p[u]);
      row[static_cast<size_t>(t)] = m;
    }
    std::copy(row.begin(), row.end(), p);
  }
}

}  // namespace

LayerScores score_layer(const TensorView& keys, const int32_t* key_positions, const LayerQueries* queries,
                        const ScorerOptions& o, float softmax_scale) {
  const int64_t T = keys.tokens(), H = keys.heads(), d = keys.head_dim();
  if (!known(o.kind))
    detail::fail("ScorerOptions.kind {} is unknown; accepted: {}", static_cast<int>(o.kind),
                 "0 obs-window, 1 multi-window, 2 key-key, 3 streaming, 4 random, 5 key-norm");
  if (!known(o.gqa)) detail::fail("ScorerOptions.gqa {} is unknown; accepted: 0 mean, 1 max", static_cast<int>(o.gqa));
  require(o.window >= 1, "ScorerOptions.window must be >= 1");
  require(o.pool_kernel >= 1 && o.pool_kernel % 2 == 1, "ScorerOptions.pool_kernel must be odd and >= 1");
  require(T == 0 || key_positions != nullptr, "score_layer: key positions are required");
  LayerScores out;
  out.kv_heads = H;
  out.tokens = T;
  out.scores.assign(static_cast<size_t>(H * T), 0.f);
  if (T == 0 || H == 0) return out;
  const float scale = softmax_scale > 0.f ? softmax_scale : 1.f / std::sqrt(static_cast<float>(d));

  switch (o.kind) {
    case ScorerKind::kStreaming:
      // Counted from the first key, not the raw position: floats hold every integer only up to
      // 2^24, and at larger positions neighbours would tie (a tie keeps the older token).
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t)
          out.scores[static_cast<size_t>(h * T + t)] =
              static_cast<float>(static_cast<int64_t>(key_positions[t]) - key_positions[0]);
      return out;  // no pooling: recency is already smooth
    case ScorerKind::kRandom:
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t)
          out.scores[static_cast<size_t>(h * T + t)] =
              static_cast<float>(e8kv::random_bits(o.seed, static_cast<uint64_t>(key_positions[t])) >> 40);
      return out;
    case ScorerKind::kKeyNorm:
      for (int64_t h = 0; h < H; ++h) {
        const auto k = load_head(keys, h);
        for (int64_t t = 0; t < T; ++t) {
          double n = 0;
          for (int64_t i = 0; i < d; ++i) n += double(k[t * d + i]) * k[t * d + i];
          out.scores[static_cast<size_t>(h * T + t)] = -static_cast<float>(std::sqrt(n));
        }
      }
      return out;
    case ScorerKind::kKeyKeyProxy: {
      // The last W keys are the queries: all W rows at once, as the observation window does.
      const int64_t W = std::min<int64_t>(o.window, T);
      std::vector<float> logits(static_cast<size_t>(W * T));
      for (int64_t h = 0; h < H; ++h) {
        const auto k = load_head(keys, h);
        float* acc = &out.scores[static_cast<size_t>(h * T)];
        attention_logits(&k[static_cast<size_t>((T - W) * d)], &key_positions[T - W], W, k, T, d, key_positions, scale,
                         logits.data());
        for (int64_t w = 0; w < W; ++w) accumulate_softmax(&logits[static_cast<size_t>(w * T)], T, acc);
      }
      break;
    }
    case ScorerKind::kObservationWindow:
    case ScorerKind::kMultiWindow: {
      detail::require(queries != nullptr && !queries->queries.empty(), "scorer '{}' needs observation queries",
                      to_string(o.kind));
      const TensorView& q = queries->queries;
      require(q.head_dim() == d, "score_layer: query head_dim differs from key head_dim");
      detail::require(q.heads() % H == 0, "score_layer: query heads ({}) must be a multiple of KV heads ({})",
                      q.heads(), H);
      const int64_t group = q.heads() / H, W = q.tokens();
      std::vector<int32_t> qpos(static_cast<size_t>(W));
      for (int64_t w = 0; w < W; ++w)
        qpos[static_cast<size_t>(w)] = queries->positions ? queries->positions[w] : key_positions[std::max<int64_t>(0, T - W + w)];
      // A query head's W observation queries and their logits against its KV head's keys, all W
      // at once (attention_logits reads each block of keys once for them).
      std::vector<float> qs(static_cast<size_t>(W * d)), logits(static_cast<size_t>(W * T)),
          head_acc(static_cast<size_t>(T));
      for (int64_t h = 0; h < H; ++h) {
        const auto k = load_head(keys, h);
        float* dst = &out.scores[static_cast<size_t>(h * T)];
        for (int64_t g = 0; g < group; ++g) {
          for (int64_t w = 0; w < W; ++w) q.load(w, h * group + g, &qs[static_cast<size_t>(w * d)]);
          for (float x : qs) check_finite(x, "queries");
          attention_logits(qs.data(), qpos.data(), W, k, T, d, key_positions, scale, logits.data());
          std::fill(head_acc.begin(), head_acc.end(), 0.f);
          for (int64_t w = 0; w < W; ++w)
            accumulate_softmax(&logits[static_cast<size_t>(w * T)], T, head_acc.data());
          for (int64_t t = 0; t < T; ++t) {
            if (o.gqa == Aggregation::kMean)
              dst[t] += head_acc[static_cast<size_t>(t)] / static_cast<float>(group);
            else
              dst[t] = std::max(dst[t], head_acc[static_cast<size_t>(t)]);
          }
        }
      }
      break;
    }
  }
  max_pool(out.scores, H, T, o.pool_kernel);
  return out;
}

std::vector<float> aggregate_heads(const LayerScores& s, Aggregation how) {
  if (!known(how))
    detail::fail("aggregate_heads: aggregation {} is unknown; accepted: 0 mean, 1 max", static_cast<int>(how));
  std::vector<float> out(static_cast<size_t>(s.tokens), how == Aggregation::kMax ? -std::numeric_limits<float>::infinity() : 0.f);
  if (s.kv_heads == 0) {
    std::fill(out.begin(), out.end(), 0.f);
    return out;
  }
  for (int64_t h = 0; h < s.kv_heads; ++h)
    for (int64_t t = 0; t < s.tokens; ++t) {
      const float v = s.at(h, t);
      float& o = out[static_cast<size_t>(t)];
      o = how == Aggregation::kMax ? std::max(o, v) : o + v / static_cast<float>(s.kv_heads);
    }
  return out;
}

int64_t kept_count(int64_t n, const EvictionOptions& o) {
  detail::require(o.rate >= 0.0 && o.rate < 1.0, "EvictionOptions.rate must be in [0, 1), got {}", o.rate);
  require(o.sinks >= 0 && o.recent >= 0, "EvictionOptions: sinks and recent must be >= 0");
  const int64_t evict = o.evict_count >= 0 ? o.evict_count : std::llround(o.rate * static_cast<double>(n));
  const int64_t floor_keep = std::min<int64_t>(n, static_cast<int64_t>(o.sinks) + o.recent);
  return std::max(floor_keep, n - evict);
}

namespace {
/// Score order of select_tokens and select_tier: higher first, NaN last, ties to the lower index.
struct ScoreOrder {
  const std::vector<float>& scores;
  bool operator()(int64_t a, int64_t b) const {
    const float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
    const bool na = std::isnan(sa), nb = std::isnan(sb);
    if (na != nb) return nb;
    if (!na && sa != sb) return sa > sb;
    return a < b;
  }
};
}  // namespace

std::vector<int64_t> select_tokens(const std::vector<float>& scores, const EvictionOptions& o) {
  const int64_t n = static_cast<int64_t>(scores.size());
  const int64_t keep = kept_count(n, o);
  std::vector<char> kept(static_cast<size_t>(n), 0);
  int64_t forced = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (t < o.sinks || t >= n - o.recent) {
      kept[static_cast<size_t>(t)] = 1;
      ++forced;
    }
  }
  std::vector<int64_t> middle;
  for (int64_t t = 0; t < n; ++t)
    if (!kept[static_cast<size_t>(t)]) middle.push_back(t);
  const int64_t budget = std::max<int64_t>(0, keep - forced);
  const ScoreOrder better{scores};
  if (budget < static_cast<int64_t>(middle.size())) {
    std::nth_element(middle.begin(), middle.begin() + budget, middle.end(), better);
    middle.resize(static_cast<size_t>(budget));
  }
  for (int64_t t : middle) kept[static_cast<size_t>(t)] = 1;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(keep));
  for (int64_t t = 0; t < n; ++t)
    if (kept[static_cast<size_t>(t)]) out.push_back(t);
  return out;
}

int64_t tier_count(int64_t n, double fraction) {
  require(n >= 0 && fraction >= 0.0 && fraction < 1.0, "tier_count: n must be >= 0 and fraction in [0, 1)");
  return std::min<int64_t>(n, static_cast<int64_t>(std::llround(fraction * static_cast<double>(n))));
}

std::vector<int64_t> select_tier(const std::vector<float>& scores, const std::vector<int64_t>& kept, int64_t count,
                                 const EvictionOptions& o) {
  const int64_t n = static_cast<int64_t>(scores.size());
  require(count >= 0, "select_tier: count must be >= 0");
  std::vector<int64_t> candidates;
  for (size_t i = 0; i < kept.size(); ++i) {
    const int64_t t = kept[i];
    require(t >= 0 && t < n && (i == 0 || t > kept[i - 1]), "select_tier: kept indices must be ascending and < n");
    if (t >= o.sinks && t < n - o.recent) candidates.push_back(t);
  }
  if (count < static_cast<int64_t>(candidates.size())) {
    std::nth_element(candidates.begin(), candidates.begin() + count, candidates.end(), ScoreOrder{scores});
    candidates.resize(static_cast<size_t>(count));
    std::sort(candidates.begin(), candidates.end());
  }
  return candidates;
}

std::vector<std::vector<int64_t>> select_layer(const LayerScores& s, const EvictionOptions& o) {
  std::vector<std::vector<int64_t>> sets;
  if (!o.per_head) {
    sets.push_back(select_tokens(aggregate_heads(s, o.head_aggregation), o));
    return sets;
  }
  for (int64_t h = 0; h < s.kv_heads; ++h) {
    std::vector<float> row(s.scores.begin() + h * s.tokens, s.scores.begin() + (h + 1) * s.tokens);
    sets.push_back(select_tokens(row, o));
  }
  return sets;
}

std::vector<float> additive_mask(int64_t n_tokens, const std::vector<int64_t>& kept) {
  std::vector<float> mask(static_cast<size_t>(n_tokens), -std::numeric_limits<float>::infinity());
  for (int64_t t : kept) {
    require(t >= 0 && t < n_tokens, "additive_mask: kept index out of range");
    mask[static_cast<size_t>(t)] = 0.f;
  }
  return mask;
}

}  // namespace e8kv::select
