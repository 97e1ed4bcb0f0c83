// keep_positions (compressed_kv.hpp): a cache cut to the tokens of a position range, the one
// implementation behind KVCompressor::drop_before (a sliding window's start) and the cut of a
// sequence's tail (llama.cpp's seq_rm of a tail, a fleet's shorter prefix).
#include <algorithm>
#include <limits>
#include <utility>

#include "detail/require.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/error.hpp"

namespace e8kv {

namespace {

/// v's elements [from, to), in a vector of exact capacity.
template <class T>
std::vector<T> slice(const std::vector<T>& v, size_t from, size_t to) {
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to));
}

/// v's elements [a0, a1) followed by [b0, b1), in a vector of exact capacity.
template <class T>
std::vector<T> two_slices(const std::vector<T>& v, size_t a0, size_t a1, size_t b0, size_t b1) {
  std::vector<T> out;
  out.reserve((a1 - a0) + (b1 - b0));
  out.insert(out.end(), v.begin() + static_cast<std::ptrdiff_t>(a0), v.begin() + static_cast<std::ptrdiff_t>(a1));
  out.insert(out.end(), v.begin() + static_cast<std::ptrdiff_t>(b0), v.begin() + static_cast<std::ptrdiff_t>(b1));
  return out;
}

/// The index range [first, last) of an ascending run [begin, end) whose values lie in [lo, hi).
template <class It>
std::pair<size_t, size_t> run_within(It run_begin, It begin, It end, int64_t lo, int64_t hi) {
  const auto first = std::lower_bound(begin, end, lo, [](int32_t p, int64_t v) { return p < v; });
  const auto last = std::lower_bound(first, end, hi, [](int32_t p, int64_t v) { return p < v; });
  return {static_cast<size_t>(first - run_begin), static_cast<size_t>(last - run_begin)};
}

}  // namespace

void keep_positions(CompressedKV& cache, int64_t begin, int64_t end) {
  detail::require(cache.valid(), "keep_positions: the cache is empty (default-constructed)");
  detail::require(begin <= end, "keep_positions: the range [{}, {}) is reversed", begin, end);
  const CacheLayout& L = cache.layout();
  const CacheCodecs& codecs = cache.codecs();
  const size_t d = static_cast<size_t>(L.head_dim);
  const bool cuts_tail = end <= std::numeric_limits<int32_t>::max();
  // Every layer is rebuilt aside (exact capacities), then swapped in: nothing changes on a throw.
  std::vector<CompressedKV::LayerData> next(static_cast<size_t>(cache.n_layers()));
  for (int l = 0; l < cache.n_layers(); ++l) {
    const auto& ld = cache.layer(l);
    auto& nd = next[static_cast<size_t>(l)];
    nd.original_tokens = ld.original_tokens;
    if (cuts_tail) {
      // Tokens given at end or later leave the count. The cache keeps no list of the positions it
      // was given (evicted ones leave no trace), so they are counted as end..last stored position:
      // exact for a sequence given one position after another, whose recent window always holds its
      // last token.
      const int64_t last = cache.last_position(l);
      if (last >= end) nd.original_tokens = std::max<int64_t>(0, ld.original_tokens - (last + 1 - end));
    }
    nd.query_energy = ld.query_energy;
    // Per head, what the remaining codes were made with; the code, gain and window vectors below.
    nd.heads.resize(ld.heads.size());
    for (size_t h = 0; h < ld.heads.size(); ++h) {
      const auto& hd = ld.heads[h];
      auto& nh = nd.heads[h];
      nh.key_mean = hd.key_mean;
      nh.value_mean = hd.value_mean;
      nh.key_channel_scale = hd.key_channel_scale;
      nh.key_gain_ref = hd.key_gain_ref;
      nh.value_gain_ref = hd.value_gain_ref;
    }
    nd.positions.resize(ld.positions.size());
    nd.window_positions.resize(ld.positions.size());
    nd.tier_positions.resize(ld.positions.size());
    const size_t kcb = codecs.code_bytes(l, KvKind::kKey), vcb = codecs.code_bytes(l, KvKind::kValue);
    const size_t tkcb = codecs.tier_code_bytes(KvKind::kKey), tvcb = codecs.tier_code_bytes(KvKind::kValue);
    int64_t pinned_after = -1;
    int64_t stored_after = 0;
    for (size_t s = 0; s < ld.positions.size(); ++s) {
      const auto& cp = ld.positions[s];
      const auto& w = ld.window_positions[s];
      const auto& tp = ld.tier_positions[s];
      const size_t np = static_cast<size_t>(std::min<int64_t>(ld.pinned, static_cast<int64_t>(w.size())));
      // Each run is ascending: the coded tokens, the pinned ones, the unpinned window, the tier.
      // (Plain variables, not structured bindings: C++17 lambdas below cannot capture those.)
      const std::pair<size_t, size_t> coded = run_within(cp.begin(), cp.begin(), cp.end(), begin, end);
      const std::pair<size_t, size_t> pinned_run =
          run_within(w.begin(), w.begin(), w.begin() + static_cast<std::ptrdiff_t>(np), begin, end);
      const std::pair<size_t, size_t> window =
          run_within(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(np), w.end(), begin, end);
      const std::pair<size_t, size_t> tier = run_within(tp.begin(), tp.begin(), tp.end(), begin, end);
      const size_t c0 = coded.first, c1 = coded.second, p0 = pinned_run.first, p1 = pinned_run.second;
      const size_t w0 = window.first, w1 = window.second, t0 = tier.first, t1 = tier.second;
      const int64_t pinned = static_cast<int64_t>(p1 - p0);
      if (pinned_after >= 0 && pinned != pinned_after)
        detail::fail("keep_positions: the range [{}, {}) leaves {} pinned tokens in one KV head's set of layer {} and {} "
                     "in another; the cache has one pinned count per layer",
                     begin, end, pinned_after, l, pinned);
      pinned_after = pinned;
      stored_after = std::max<int64_t>(stored_after, static_cast<int64_t>((c1 - c0) + (p1 - p0) + (w1 - w0) + (t1 - t0)));
      nd.positions[s] = slice(cp, c0, c1);
      nd.window_positions[s] = two_slices(w, p0, p1, w0, w1);
      nd.tier_positions[s] = slice(tp, t0, t1);
      const int h_begin = ld.positions.size() == 1 ? 0 : static_cast<int>(s);
      const int h_end = ld.positions.size() == 1 ? L.n_kv_heads : static_cast<int>(s) + 1;
      for (int h = h_begin; h < h_end; ++h) {
        const auto& hd = ld.heads[static_cast<size_t>(h)];
        auto& nh = nd.heads[static_cast<size_t>(h)];
        nh.key_codes = slice(hd.key_codes, c0 * kcb, c1 * kcb);
        nh.value_codes = slice(hd.value_codes, c0 * vcb, c1 * vcb);
        auto per_token = [&](const auto& g) { return g.empty() ? std::decay_t<decltype(g)>() : slice(g, c0, c1); };
        nh.key_gains = per_token(hd.key_gains);
        nh.value_gains = per_token(hd.value_gains);
        nh.key_gain_codes = per_token(hd.key_gain_codes);
        nh.value_gain_codes = per_token(hd.value_gain_codes);
        nh.tier_key_codes = slice(hd.tier_key_codes, t0 * tkcb, t1 * tkcb);
        nh.tier_value_codes = slice(hd.tier_value_codes, t0 * tvcb, t1 * tvcb);
        auto per_tier_token = [&](const auto& g) { return g.empty() ? std::decay_t<decltype(g)>() : slice(g, t0, t1); };
        nh.tier_key_gains = per_tier_token(hd.tier_key_gains);
        nh.tier_value_gains = per_tier_token(hd.tier_value_gains);
        nh.window_keys = two_slices(hd.window_keys, p0 * d, p1 * d, w0 * d, w1 * d);
        nh.window_values = two_slices(hd.window_values, p0 * d, p1 * d, w0 * d, w1 * d);
      }
    }
    nd.pinned = std::max<int64_t>(pinned_after, 0);
    nd.original_tokens = std::max(nd.original_tokens, stored_after);
  }
  for (int l = 0; l < cache.n_layers(); ++l)
    std::swap(detail::CacheStorage::layer(cache, l), next[static_cast<size_t>(l)]);
}

}  // namespace e8kv
