// CPU decode attention over a compressed cache (include/e8kv/attention/attend.hpp): the requests,
// the merge of their chunks' partial states, and the public calls. The plan and the work items
// are in attend_plan.cpp and attend_chunk.cpp (attend_internal.hpp says how a call runs).
#include "e8kv/attention/attend.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "attention/attend_internal.hpp"
#include "detail/finite.hpp"
#include "detail/require.hpp"
#include "e8kv/attention/state.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/parallel.hpp"

namespace e8kv {
namespace attention {

// ---- merge and finish ---------------------------------------------------------------------------

void begin_fold(ResolvedRequest& r) {
  const LayerPlan& p = r.plan;
  const size_t n = static_cast<size_t>(r.n_tokens) * p.H * p.G;
  r.fold_max.assign(n, kNegInf);
  r.fold_sum.assign(n, 0.0);
  r.fold_mass.assign(n, 0.0);
  r.fold_any_rot.assign(n, 0);
  r.fold_rot.assign(n * static_cast<size_t>(p.d), 0.f);
  r.fold_eng.assign(n * static_cast<size_t>(p.d), 0.f);
}

void fold_wave(ResolvedRequest& r, TokenRange tokens) {
  const LayerPlan& p = r.plan;
  const int H = p.H, G = p.G, d = p.d;
  for (int token = tokens.begin; token < tokens.end; ++token)
    for (int h = 0; h < H; ++h)
      for (int g = 0; g < G; ++g) {
        const size_t f = (static_cast<size_t>(token) * H + h) * G + g;
        SoftmaxRun<double> run{r.fold_max[f], r.fold_sum[f]};
        double mass = r.fold_mass[f];
        bool any_rot = r.fold_any_rot[f] != 0;
        float* acc_rot = r.fold_rot.data() + f * d;
        float* acc_eng = r.fold_eng.data() + f * d;
        for (int64_t c = r.wave_begin; c < r.wave_end; ++c) {
          if (!r.scheduled[static_cast<size_t>(c - r.wave_begin) * H + static_cast<size_t>(h)]) continue;
          const float* st = r.state(c, token, h, g);
          if (!(st[1] > 0.f)) continue;
          const Segment seg = segment_of(p, c);
          const bool rotated = seg == Segment::kTier || (seg == Segment::kCoded && !p.value_in_engine_basis);
          const MergeScales scales = run.add(st[0], static_cast<double>(st[1]), ExpE{});
          const float a = scales.running, b = scales.partial;
          mass = mass * a + static_cast<double>(st[2]) * b;
          for (int i = 0; i < d; ++i) {
            acc_rot[i] *= a;
            acc_eng[i] *= a;
          }
          float* dst = rotated ? acc_rot : acc_eng;
          any_rot = any_rot || rotated;
          for (int i = 0; i < d; ++i) dst[i] += b * st[3 + i];
        }
        r.fold_max[f] = run.max;
        r.fold_sum[f] = run.sum;
        r.fold_mass[f] = mass;
        r.fold_any_rot[f] = any_rot ? 1 : 0;
      }
}

void finish_request(ResolvedRequest& r, TokenRange tokens) {
  const LayerPlan& p = r.plan;
  const int H = p.H, G = p.G, d = p.d;
  const auto& codecs = p.cache->codecs();
  const auto& ld = p.cache->layer(p.layer);
  std::vector<float> rotated_back(static_cast<size_t>(d)), value_mean(static_cast<size_t>(d));
  for (int h = 0; h < H; ++h) {
    const auto& hd = ld.heads[static_cast<size_t>(h)];
    const bool value_mean_used = !hd.value_mean.empty();
    if (value_mean_used) fp16_bits_to_floats(hd.value_mean.data(), value_mean.data(), value_mean.size());
    for (int token = tokens.begin; token < tokens.end; ++token)
      for (int g = 0; g < G; ++g) {
        const size_t f = (static_cast<size_t>(token) * H + h) * G + g;
        const float M = r.fold_max[f];
        const double L = r.fold_sum[f], mass = r.fold_mass[f];
        const float* acc_rot = r.fold_rot.data() + f * d;
        const float* acc_eng = r.fold_eng.data() + f * d;
        float* o = r.out + (static_cast<size_t>(token) * p.L->n_q_heads + static_cast<size_t>(h) * G + g) * d;
        float* lse = r.lse ? r.lse + static_cast<size_t>(token) * p.L->n_q_heads + static_cast<size_t>(h) * G + g : nullptr;
        if (!(L > 0.0)) {
          std::fill(o, o + d, 0.f);
          if (lse) *lse = kNegInf;
          continue;
        }
        if (r.fold_any_rot[f])
          codecs.rotation(p.layer, h, 1).inverse(acc_rot, rotated_back.data());
        else
          std::fill(rotated_back.begin(), rotated_back.end(), 0.f);
        const float inv_l = static_cast<float>(1.0 / L);
        const float m = value_mean_used ? static_cast<float>(mass) : 0.f;
        for (int i = 0; i < d; ++i) {
          const float mean_part = value_mean_used ? m * value_mean[static_cast<size_t>(i)] : 0.f;
          o[i] = (rotated_back[static_cast<size_t>(i)] + acc_eng[i] + mean_part) * inv_l;
        }
        if (lse) *lse = M + static_cast<float>(std::log(L));
      }
  }
}

}  // namespace attention

namespace {

void check_query(const float* q, size_t n, int n_q_heads, int d) {
  const size_t i = detail::first_non_finite(q, n);
  if (i < n)
    detail::fail("attend: non-finite query value at token {}, query head {}, element {}",
                 i / (static_cast<size_t>(n_q_heads) * d), i / d % n_q_heads, i % d);
}

/// A request's position bounds: where its coded and tier runs (ascending per position set) end,
/// and whether any stored token falls outside them (then its chunks mask those tokens).
void resolve_bounds(const AttendRequest& a, attention::ResolvedRequest& r) {
  r.min_position = a.min_position;
  r.max_position = a.max_position;
  const bool per_token = a.token_min_positions != nullptr || a.token_max_positions != nullptr;
  if (per_token) {
    // Each token's bounds within the request's; the request's become their hull (what a chunk
    // reads), each token's own are applied per chunk.
    r.token_min.assign(static_cast<size_t>(a.n_tokens), a.min_position);
    r.token_max.assign(static_cast<size_t>(a.n_tokens), a.max_position);
    for (int t = 0; t < a.n_tokens; ++t) {
      if (a.token_min_positions) r.token_min[static_cast<size_t>(t)] = std::max(a.min_position, a.token_min_positions[t]);
      if (a.token_max_positions) r.token_max[static_cast<size_t>(t)] = std::min(a.max_position, a.token_max_positions[t]);
    }
    r.min_position = *std::min_element(r.token_min.begin(), r.token_min.end());
    r.max_position = *std::max_element(r.token_max.begin(), r.token_max.end());
  }
  const attention::LayerPlan& p = r.plan;
  r.coded_end = p.coded;
  r.tier_end = p.tier;
  r.coded_begin.assign(static_cast<size_t>(p.H), 0);
  r.tier_begin.assign(static_cast<size_t>(p.H), 0);
  if (r.min_position == std::numeric_limits<int32_t>::min() && r.max_position == std::numeric_limits<int32_t>::max())
    return;
  r.bounded = per_token;  // tokens' own bounds are applied in every chunk
  const CompressedKV& cache = *p.cache;
  for (int h = 0; h < p.H; ++h) {
    auto end_of = [&](const std::vector<int32_t>& run) {
      return static_cast<int64_t>(std::upper_bound(run.begin(), run.end(), r.max_position) - run.begin());
    };
    const auto& coded = cache.positions(p.layer, h);
    const auto& tier = cache.tier_positions(p.layer, h);
    const auto& window = cache.window_positions(p.layer, h);
    auto begin_of = [&](const std::vector<int32_t>& run) {
      return static_cast<int64_t>(std::lower_bound(run.begin(), run.end(), r.min_position) - run.begin());
    };
    r.coded_end[static_cast<size_t>(h)] = end_of(coded);
    r.tier_end[static_cast<size_t>(h)] = end_of(tier);
    r.coded_begin[static_cast<size_t>(h)] = begin_of(coded);
    r.tier_begin[static_cast<size_t>(h)] = begin_of(tier);
    auto outside = [&](int32_t pos) { return pos < r.min_position || pos > r.max_position; };
    const bool some_below = (!coded.empty() && coded.front() < r.min_position) ||
                            (!tier.empty() && tier.front() < r.min_position);
    r.bounded = r.bounded || some_below || std::any_of(window.begin(), window.end(), outside) ||
                r.coded_end[static_cast<size_t>(h)] < p.coded[static_cast<size_t>(h)] ||
                r.tier_end[static_cast<size_t>(h)] < p.tier[static_cast<size_t>(h)];
  }
}

}  // namespace

namespace attention {

bool chunk_out_of_bounds(const ResolvedRequest& r, int64_t chunk, HeadRange heads) {
  const LayerPlan& p = r.plan;
  const Segment segment = segment_of(p, chunk);
  if (segment == Segment::kWindow) return false;  // window rows are masked one by one
  const bool tier = segment == Segment::kTier;
  const std::vector<int64_t>& begin = tier ? r.tier_begin : r.coded_begin;
  const std::vector<int64_t>& end = tier ? r.tier_end : r.coded_end;
  const int64_t t_begin = segment_begin(p, chunk), t_end = t_begin + kChunkTokens;
  for (int h = heads.begin; h < heads.end; ++h)
    if (std::max(t_begin, begin[static_cast<size_t>(h)]) < std::min(t_end, end[static_cast<size_t>(h)])) return false;
  return true;
}

}  // namespace attention

namespace {
/// Query tokens of a request from which its work items are cut per KV head, and the fewest
/// query tokens of an item when a request's tokens are cut into parts.
constexpr int kTokensPerHeadItem = 4;
/// AttendOptions::max_state_bytes's default: the partial states a call holds at once.
constexpr size_t kDefaultStateBytes = size_t{16} << 20;
}  // namespace

void attend_batch(const std::vector<AttendRequest>& requests, const AttendOptions& options) {
  using attention::ResolvedRequest;
  using attention::Scratch;
  std::vector<ResolvedRequest> resolved(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const AttendRequest& a = requests[i];
    detail::require(a.cache != nullptr, "attend: request {} has no cache", i);
    detail::require(a.q != nullptr && a.out != nullptr, "attend: request {}: q and out must not be null", i);
    detail::require(a.n_tokens >= 1, "attend: request {}: n_tokens must be >= 1, got {}", i, a.n_tokens);
    ResolvedRequest& r = resolved[i];
    r.plan = attention::plan_layer(*a.cache, a.layer);
    r.n_tokens = a.n_tokens;
    r.q = a.q;
    r.out = a.out;
    r.lse = a.lse;
    const attention::LayerPlan& p = r.plan;
    resolve_bounds(a, r);
    const size_t per_token = static_cast<size_t>(p.L->n_q_heads) * p.d;
    check_query(a.q, per_token * static_cast<size_t>(a.n_tokens), p.L->n_q_heads, p.d);
    r.heads.resize(static_cast<size_t>(a.n_tokens) * p.H);
    attention::begin_fold(r);
  }
  const int64_t threads = options.executor ? std::max(1, options.executor->concurrency()) : 1;
  // Work that is per query token (its queries rotated, its fold, its output) runs on every
  // thread: each request's tokens cut into parts, about two per thread over the call. A token's
  // results do not depend on the cut.
  struct TokenPart {
    size_t request;
    attention::TokenRange tokens;
  };
  std::vector<TokenPart> token_parts;
  {
    int64_t all_tokens = 0;
    for (const ResolvedRequest& r : resolved) all_tokens += r.n_tokens;
    const int64_t per_part = std::max<int64_t>(1, attention::ceil_div(all_tokens, 2 * threads));
    for (size_t i = 0; i < resolved.size(); ++i)
      for (int t = 0; t < resolved[i].n_tokens; t += static_cast<int>(per_part))
        token_parts.push_back({i, {t, static_cast<int>(std::min<int64_t>(t + per_part, resolved[i].n_tokens))}});
  }
  auto for_token_parts = [&](const std::function<void(ResolvedRequest&, attention::TokenRange)>& fn) {
    run_tasks(options.executor, static_cast<int64_t>(token_parts.size()), [&](int64_t k) {
      const TokenPart& part = token_parts[static_cast<size_t>(k)];
      fn(resolved[part.request], part.tokens);
    });
  };
  for_token_parts([&](ResolvedRequest& r, attention::TokenRange tokens) {
    const attention::LayerPlan& p = r.plan;
    const size_t per_token = static_cast<size_t>(p.L->n_q_heads) * p.d;
    for (int t = tokens.begin; t < tokens.end; ++t)
      for (int h = 0; h < p.H; ++h)
        r.heads[static_cast<size_t>(t) * p.H + static_cast<size_t>(h)] =
            attention::prepare_head_query(p, h, r.q + t * per_token + static_cast<size_t>(h) * p.G * p.d);
  });
  // Chunks run in waves of `wave` chunks: each request holds the states of one wave (bounded by
  // AttendOptions::max_state_bytes), folded into its running merge in chunk order after the wave.
  // A wave keeps every thread busy (at least two chunks per thread); a call whose states fit runs
  // in one wave, as a decode step always does.
  int64_t max_chunks = 0;
  size_t bytes_per_chunk = 0;  // the states of one chunk of every request
  for (const ResolvedRequest& r : resolved) {
    const attention::LayerPlan& p = r.plan;
    max_chunks = std::max(max_chunks, r.chunks());
    bytes_per_chunk += static_cast<size_t>(r.n_tokens) * p.H * p.G * attention::state_floats(p.d) * sizeof(float);
  }
  const size_t budget = options.max_state_bytes ? options.max_state_bytes : kDefaultStateBytes;
  const int64_t fits = static_cast<int64_t>(budget / std::max<size_t>(bytes_per_chunk, 1));
  const int64_t wave = std::max<int64_t>(1, std::max(fits, options.max_state_bytes ? 1 : 2 * threads));
  // One Scratch per concurrently running item: a pool indexed by a slot taken under a lock.
  std::mutex slots_mutex;
  std::vector<std::unique_ptr<Scratch>> free_slots;
  struct Item {
    size_t request;
    int64_t chunk;
    attention::HeadRange heads;
    attention::TokenRange tokens;
  };
  std::vector<Item> items;
  for (int64_t begin = 0; begin < max_chunks; begin += wave) {
    items.clear();
    for (size_t i = 0; i < resolved.size(); ++i) {
      ResolvedRequest& r = resolved[i];
      const attention::LayerPlan& p = r.plan;
      r.wave_begin = std::min(begin, r.chunks());
      r.wave_end = std::min(begin + wave, r.chunks());
      // Not cleared between waves: the fold reads only the states a work item wrote (`scheduled`).
      r.states.resize(static_cast<size_t>(r.wave_end - r.wave_begin) * r.n_tokens * p.H * p.G *
                      attention::state_floats(p.d));
      r.scheduled.assign(static_cast<size_t>(r.wave_end - r.wave_begin) * p.H, 0);
      // Per KV head when several query tokens share the chunk (their scores dwarf the cos/sin rows
      // each item computes once) and threads wait for work: the cut never changes a result.
      const bool per_head = r.n_tokens >= kTokensPerHeadItem && threads > 1;
      const int step = per_head ? 1 : p.H;
      for (int64_t c = r.wave_begin; c < r.wave_end; ++c)
        for (int h = 0; h < p.H; h += step) {
          const attention::HeadRange heads{h, std::min(h + step, p.H)};
          if (!attention::chunk_out_of_bounds(r, c, heads)) items.push_back({i, c, heads, {0, r.n_tokens}});
        }
    }
    // Fewer items than threads (a sliding-window layer's one chunk, one KV head): each request's
    // query tokens are cut into parts of at least kTokensPerHeadItem, just enough for every
    // thread to have one, as each part decodes the chunk's codes again (a token's scores and sums
    // do not depend on the others of its item).
    if (threads > 1 && !items.empty() && static_cast<int64_t>(items.size()) < threads) {
      const int64_t parts_wanted = attention::ceil_div(threads, static_cast<int64_t>(items.size()));
      std::vector<Item> cut;
      for (const Item& item : items) {
        const int n = item.tokens.size();
        const int parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(parts_wanted, n / kTokensPerHeadItem)));
        for (int k = 0; k < parts; ++k)
          cut.push_back({item.request, item.chunk, item.heads,
                         {item.tokens.begin + n * k / parts, item.tokens.begin + n * (k + 1) / parts}});
      }
      items.swap(cut);
    }
    for (const Item& item : items) {
      ResolvedRequest& r = resolved[item.request];
      for (int h = item.heads.begin; h < item.heads.end; ++h)
        r.scheduled[static_cast<size_t>(item.chunk - r.wave_begin) * r.plan.H + static_cast<size_t>(h)] = 1;
    }
    run_tasks(options.executor, static_cast<int64_t>(items.size()), [&](int64_t k) {
      std::unique_ptr<Scratch> s;
      {
        std::lock_guard<std::mutex> lock(slots_mutex);
        if (!free_slots.empty()) {
          s = std::move(free_slots.back());
          free_slots.pop_back();
        }
      }
      if (!s) s = std::make_unique<Scratch>();
      const Item& item = items[static_cast<size_t>(k)];
      attention::run_chunk(resolved[item.request], item.chunk, item.heads, item.tokens, *s);
      std::lock_guard<std::mutex> lock(slots_mutex);
      free_slots.push_back(std::move(s));
    });
    // Every token folds its own states, in chunk order.
    for_token_parts([](ResolvedRequest& r, attention::TokenRange tokens) { attention::fold_wave(r, tokens); });
  }
  for (ResolvedRequest& r : resolved) std::vector<float>().swap(r.states);
  for_token_parts([](ResolvedRequest& r, attention::TokenRange tokens) { attention::finish_request(r, tokens); });
}

void attend(const CompressedKV& cache, int layer, const float* q, float* out, float* lse, const AttendOptions& options) {
  AttendRequest r;
  r.cache = &cache;
  r.layer = layer;
  r.q = q;
  r.out = out;
  r.lse = lse;
  attend_batch({r}, options);
}

void merge_attention(const float* o_a, const float* lse_a, const float* o_b, const float* lse_b, int n_heads, int d,
                     float* out, float* lse_out) {
  require(o_a && lse_a && o_b && lse_b && out && lse_out, "merge_attention: null argument");
  require(n_heads >= 0 && d >= 0, "merge_attention: n_heads and d must be >= 0");
  for (int h = 0; h < n_heads; ++h) {
    const float la = lse_a[h], lb = lse_b[h];
    const float m = std::max(la, lb);
    float* o = out + static_cast<size_t>(h) * d;
    const float* a = o_a + static_cast<size_t>(h) * d;
    const float* b = o_b + static_cast<size_t>(h) * d;
    if (m == attention::kNegInf) {
      std::fill(o, o + d, 0.f);
      lse_out[h] = attention::kNegInf;
      continue;
    }
    const double wa = std::exp(static_cast<double>(la) - m), wb = std::exp(static_cast<double>(lb) - m);
    const double z = wa + wb;
    for (int i = 0; i < d; ++i) o[i] = static_cast<float>((wa * a[i] + wb * b[i]) / z);
    lse_out[h] = m + static_cast<float>(std::log(z));
  }
}

}  // namespace e8kv