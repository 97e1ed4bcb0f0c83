// LayerWrite: the window, the flush rule, means, channel scales and gain codes (layer_write.hpp).
//
// The flush rule. After a write, a position set's window holds its pinned tokens (sinks and the
// fp16 tier; ascending, at any position), then the tokens not yet coded (ascending, after every
// coded token). While at least residual_length + flush_block unpinned tokens wait (and, before a
// set's first flush with centring, at least mean_tokens), the oldest of them are coded in whole
// flush_block blocks, leaving residual_length or more. The coded count is a function of the kept
// count only, and every rule below is fixed by token order, never by how the tokens were split
// into calls: so compressing a sequence at once gives the same bytes as compressing any prefix
// and appending the rest.
//  - Pinned: the sequence's first `sinks` tokens, whichever call brought them, and the fp16 tier
//    a compress / extend chunk chose stay fp16 in the window for good.
//  - Means: from the first mean_tokens unpinned tokens, keys in the frame they are subtracted in
//    (RoPE removed by the same table that turns the mean back for each key). A centred code tier
//    needs them when its tokens arrive: a write that promotes tokens to the tier before the set's
//    first flush fixes the means from the unpinned tokens it leaves in the window (up to
//    mean_tokens of them), or from the promoted tokens when it leaves none. They never change after.
//  - Channel scales: from the same tokens and the first chunk's observation queries.
//  - 8-bit gain reference: the geometric mean of the float gains of the first flush_block coded
//    tokens; gains are coded once, from float.
#include "cache/layer_write.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "detail/fp16_batch.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/quant/gain_code.hpp"

namespace e8kv::detail {
namespace {

// Key channel scales s_i = ((w_i + f·w̄)/(σ_i² + f·σ̄²))^e, geometric mean 1, pair-averaged
// energies (so S commutes with RoPE). The floor f: a channel the 32 observation queries barely
// touch may still matter later, and a near-constant key channel must not get an unbounded scale.
// The exponent is below the Cauchy–Schwarz optimum 1/4: the energies are estimated from few
// queries, so the scales shrink toward 1. Both chosen on SmolLM2 at ctx 1024 (docs/accuracy.md,
// "Query-weighted keys"); KL varied by ±15 % over floor 0.01–0.5 and exponent 0.1–0.35.
constexpr double kScaleFloor = 0.2;
constexpr double kScaleExponent = 0.2;

std::vector<uint16_t> channel_scales(const CacheCodecs& codecs, const std::vector<float>& query_energy,
                                     const std::vector<double>& key_energy) {
  const int d = codecs.layout().head_dim;
  std::vector<float> sigma2(static_cast<size_t>(d));
  double mean_w = 0, mean_s = 0;
  for (int i = 0; i < d; ++i) {
    sigma2[static_cast<size_t>(i)] = static_cast<float>(key_energy[static_cast<size_t>(i)]);
    mean_w += query_energy[static_cast<size_t>(i)] / d;
  }
  codecs.average_rope_pairs(sigma2.data());
  for (float s : sigma2) mean_s += static_cast<double>(s) / d;
  std::vector<double> s(static_cast<size_t>(d));
  double log_sum = 0;
  for (int i = 0; i < d; ++i) {
    const double w = query_energy[static_cast<size_t>(i)] + kScaleFloor * mean_w + 1e-30;
    const double e = sigma2[static_cast<size_t>(i)] + kScaleFloor * mean_s + 1e-30;
    s[static_cast<size_t>(i)] = std::pow(w / e, kScaleExponent);
    log_sum += std::log(s[static_cast<size_t>(i)]);
  }
  const double norm = std::exp(-log_sum / d);  // geometric mean 1 (the gain absorbs any scale)
  std::vector<uint16_t> out(static_cast<size_t>(d));
  for (int i = 0; i < d; ++i) out[static_cast<size_t>(i)] = float_to_fp16_bits(static_cast<float>(s[static_cast<size_t>(i)] * norm));
  return out;
}

/// The 8-bit gains' reference: the geometric mean of the positive gains among the first n, as
/// fp16 (kept positive); quant::gain_reference_bits, which the GPU's state estimate runs too.
uint16_t gain_reference(const float* gains, size_t n) { return quant::gain_reference_bits(gains, static_cast<int>(n)); }

std::vector<float> half_to_float_vector(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  fp16_bits_to_floats(h.data(), f.data(), h.size());
  return f;
}

/// fp16 bits of x[0..n), in a vector of exactly n.
std::vector<uint16_t> to_half_vector(const std::vector<double>& x, double divisor) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float_to_fp16_bits(static_cast<float>(x[i] / divisor));
  return out;
}

/// Grows a vector's capacity for `extra` more elements: exactly, or by at least a sixteenth.
template <class T>
void reserve_more(std::vector<T>& v, size_t extra, bool exact) {
  const size_t need = v.size() + extra;
  if (need <= v.capacity()) return;
  v.reserve(exact ? need : std::max(need, v.capacity() + v.capacity() / 16));
}

/// Appends without allocating (capacity reserved before).
template <class T>
void append(std::vector<T>& v, const std::vector<T>& more) noexcept {
  v.insert(v.end(), more.begin(), more.end());
}

}  // namespace

LayerWrite::LayerWrite(const CompressedKV& cache, int layer, LayerInput input) : layer_(layer), input_(std::move(input)) {
  const CacheCodecs& codecs = cache.codecs();
  const CacheLayout& L = codecs.layout();
  const auto& ld = cache.layer(layer);
  const int d = L.head_dim;
  const size_t n_sets = ld.positions.size();
  require(input_.positions.size() == n_sets && input_.keys.size() == static_cast<size_t>(L.n_kv_heads) &&
              input_.values.size() == input_.keys.size(),
          "LayerWrite: input does not match the cache's position sets and heads");
  const auto kc = L.key_codec[static_cast<size_t>(layer)], vc = L.value_codec[static_cast<size_t>(layer)];
  const bool k_coded = kc != quant::Codec::kFp16, v_coded = vc != quant::Codec::kFp16;
  const size_t kcb = codecs.code_bytes(layer, KvKind::kKey), vcb = codecs.code_bytes(layer, KvKind::kValue);
  require(input_.pinned.size() == n_sets, "LayerWrite: one pinned list per position set is required");
  const size_t new_pinned = input_.pinned[0].size();
  for (size_t s = 0; s < n_sets; ++s) {
    const auto& pin = input_.pinned[s];
    require(pin.size() == new_pinned, "LayerWrite: every position set must pin as many tokens");
    for (size_t i = 0; i < pin.size(); ++i)
      require(pin[i] >= 0 && pin[i] < static_cast<int64_t>(input_.positions[s].size()) && (i == 0 || pin[i] > pin[i - 1]),
              "LayerWrite: pinned indices must be ascending and index the new tokens");
  }
  pinned_after_ = ld.pinned + static_cast<int64_t>(new_pinned);
  const int64_t p = pinned_after_;
  // Without new pinned tokens the order is the identity (order_ stays empty): the common append.
  if (new_pinned > 0) order_.resize(n_sets);
  for (size_t s = 0; s < order_.size(); ++s) {
    const int64_t w_old = static_cast<int64_t>(ld.window_positions[s].size());
    const int64_t n_new = static_cast<int64_t>(input_.positions[s].size());
    const auto& pin = input_.pinned[s];
    auto& order = order_[s];
    order.reserve(static_cast<size_t>(w_old + n_new));
    for (int64_t i = 0; i < ld.pinned; ++i) order.push_back(i);
    for (int64_t j : pin) order.push_back(w_old + j);
    for (int64_t i = ld.pinned; i < w_old; ++i) order.push_back(i);
    size_t k = 0;
    for (int64_t j = 0; j < n_new; ++j) {
      if (k < pin.size() && pin[k] == j) {
        ++k;
        continue;
      }
      order.push_back(w_old + j);
    }
  }
  const std::vector<std::vector<float>>& energy = ld.query_energy.empty() ? input_.query_energy : ld.query_energy;
  sets_.resize(n_sets);
  heads_.resize(static_cast<size_t>(L.n_kv_heads));
  size_t staged_total = 0;
  for (const auto& s : input_.positions) staged_total += s.size();

  bool any_flush = false;
  for (size_t s = 0; s < n_sets; ++s) {
    const int h_begin = n_sets == 1 ? 0 : static_cast<int>(s);
    const int h_end = n_sets == 1 ? L.n_kv_heads : static_cast<int>(s) + 1;
    const auto& old_wpos = ld.window_positions[s];
    const auto& new_pos = input_.positions[s];
    const int64_t w_old = static_cast<int64_t>(old_wpos.size());
    const int64_t w_after = w_old + static_cast<int64_t>(new_pos.size());
    // Window-after token i: an old window token (source < w_old) or a new one.
    auto position_at = [&](int64_t i) {
      const int64_t src = source(s, i);
      return src < w_old ? old_wpos[static_cast<size_t>(src)] : new_pos[static_cast<size_t>(src - w_old)];
    };
    const int64_t flushable = w_after - p;
    const bool first_flush = ld.positions[s].empty();
    // Before a set's first flush with centring, the window waits for the mean tokens (even when
    // a tier write fixed the means already: the flush count stays a function of the kept count).
    const bool centring = L.center && (k_coded || v_coded);
    int64_t threshold = static_cast<int64_t>(L.residual_length) + L.flush_block;
    if (centring && first_flush) threshold = std::max<int64_t>(threshold, L.mean_tokens);
    const int64_t move = flushable < threshold ? 0 : (flushable - L.residual_length) / L.flush_block * L.flush_block;
    SetPlan& sp = sets_[s];
    std::vector<int32_t> moved_positions(static_cast<size_t>(move));
    for (int64_t i = 0; i < move; ++i) moved_positions[static_cast<size_t>(i)] = position_at(p + i);
    sp.coded_positions = moved_positions;
    any_flush = any_flush || move > 0;
    if (move == 0) continue;
    for (int h = h_begin; h < h_end; ++h) {
      const auto& hd = ld.heads[static_cast<size_t>(h)];
      HeadPlan& hp = heads_[static_cast<size_t>(h)];
      const auto& new_k = input_.keys[static_cast<size_t>(h)];
      const auto& new_v = input_.values[static_cast<size_t>(h)];
      auto key_row = [&](int64_t i) {
        const int64_t src = source(s, i);
        return src < w_old ? &hd.window_keys[static_cast<size_t>(src * d)] : &new_k[static_cast<size_t>((src - w_old) * d)];
      };
      auto value_row = [&](int64_t i) {
        const int64_t src = source(s, i);
        return src < w_old ? &hd.window_values[static_cast<size_t>(src * d)]
                           : &new_v[static_cast<size_t>((src - w_old) * d)];
      };
      // The rows to code, contiguous.
      std::vector<uint16_t> krows(static_cast<size_t>(move * d)), vrows(static_cast<size_t>(move * d));
      for (int64_t i = 0; i < move; ++i) {
        std::memcpy(&krows[static_cast<size_t>(i * d)], key_row(p + i), static_cast<size_t>(d) * 2);
        std::memcpy(&vrows[static_cast<size_t>(i * d)], value_row(p + i), static_cast<size_t>(d) * 2);
      }
      // Means (and key channel scales) at the set's first flush, from its first mean_tokens
      // unpinned tokens: the first rows coded now (unless a tier write fixed the means before).
      std::vector<float> key_mean, value_mean, key_scale;
      if (!hd.key_mean.empty()) key_mean = half_to_float_vector(hd.key_mean);
      if (!hd.value_mean.empty()) value_mean = half_to_float_vector(hd.value_mean);
      if (!hd.key_channel_scale.empty()) key_scale = half_to_float_vector(hd.key_channel_scale);
      if (centring && first_flush) {
        // The set's first mean_tokens unpinned tokens: window-after tokens [p, p + mean_tokens).
        const int64_t m = L.mean_tokens;
        if (!has_means(hd, k_coded, v_coded)) {
          std::vector<const uint16_t*> krs, vrs;
          std::vector<int32_t> at;
          for (int64_t t = p; t < p + m; ++t) {
            krs.push_back(key_row(t));
            vrs.push_back(value_row(t));
            at.push_back(position_at(t));
          }
          set_means(codecs, krs, vrs, at, k_coded, v_coded, hp);
          if (k_coded) key_mean = half_to_float_vector(hp.key_mean);
          if (v_coded) value_mean = half_to_float_vector(hp.value_mean);
        }
        std::vector<float> k(static_cast<size_t>(d));
        if (k_coded && L.query_weighted_keys && !energy.empty()) {
          // Key energies of the centred keys in the engine's frame (pair-averaged: RoPE-invariant).
          std::vector<double> e(static_cast<size_t>(d), 0.0);
          std::vector<float> mu(static_cast<size_t>(d));
          for (int64_t t = p; t < p + m; ++t) {
            detail::fp16_bits_to_floats_batch(key_row(t), k.data(), static_cast<size_t>(d));
            mu = key_mean;
            if (L.key_frame != transform::KeyFrame::kPostRope) codecs.apply_rope_fast(mu.data(), position_at(t));
            for (int i = 0; i < d; ++i) {
              const double c = static_cast<double>(k[static_cast<size_t>(i)] - mu[static_cast<size_t>(i)]);
              e[static_cast<size_t>(i)] += c * c;
            }
          }
          for (auto& x : e) x /= static_cast<double>(m);
          hp.key_channel_scale = channel_scales(codecs, energy[static_cast<size_t>(h)], e);
          key_scale = half_to_float_vector(hp.key_channel_scale);
        }
      }
      // Codes and float gains.
      CacheCodecs::HeadState ks, vs;
      ks.mean = key_mean.empty() ? nullptr : key_mean.data();
      ks.channel_scale = key_scale.empty() ? nullptr : key_scale.data();
      vs.mean = value_mean.empty() ? nullptr : value_mean.data();
      std::vector<float> kg(static_cast<size_t>(move)), vg(static_cast<size_t>(move));
      hp.key_codes.resize(static_cast<size_t>(move) * kcb);
      hp.value_codes.resize(static_cast<size_t>(move) * vcb);
      codecs.encode(layer, h, KvKind::kKey, static_cast<size_t>(move), krows.data(), moved_positions.data(), ks,
                    hp.key_codes.data(), kg.data());
      codecs.encode(layer, h, KvKind::kValue, static_cast<size_t>(move), vrows.data(), moved_positions.data(), vs,
                    hp.value_codes.data(), vg.data());
      // Gains, coded once from float.
      auto code_gains = [&](const std::vector<float>& g, uint16_t old_ref, std::vector<uint16_t>& fp16,
                            std::vector<uint8_t>& codes8, uint16_t& new_ref) {
        if (L.gain_bits == 16) {
          fp16.resize(g.size());
          for (size_t i = 0; i < g.size(); ++i) fp16[i] = float_to_fp16_bits(g[i]);
          return;
        }
        uint16_t ref = old_ref;
        if (ref == 0) {  // first flush: the reference of the first flush_block coded tokens
          ref = new_ref = gain_reference(g.data(), std::min<size_t>(g.size(), static_cast<size_t>(L.flush_block)));
        }
        const float r = fp16_bits_to_float(ref);
        codes8.resize(g.size());
        for (size_t i = 0; i < g.size(); ++i) codes8[i] = quant::gain_to_code(g[i], r);
      };
      if (k_coded) code_gains(kg, hd.key_gain_ref, hp.key_gains, hp.key_gain_codes, hp.key_gain_ref);
      if (v_coded) code_gains(vg, hd.value_gain_ref, hp.value_gains, hp.value_gain_codes, hp.value_gain_ref);
    }
  }
  plan_code_tier(cache);
  // The query energy is kept until every head has turned it into channel scales.
  if (!energy.empty()) {
    energy_consumed_ = true;
    for (int h = 0; h < L.n_kv_heads; ++h)
      energy_consumed_ = energy_consumed_ && (!ld.heads[static_cast<size_t>(h)].key_channel_scale.empty() ||
                                              !heads_[static_cast<size_t>(h)].key_channel_scale.empty());
  }
  // The window after the write: pinned tokens, then the tokens not coded. Rebuilt (exact size)
  // when a flush happened, several tokens arrived or a pinned one arrived behind unpinned ones; a
  // lone token without a flush is pushed.
  bool pinned_behind = false;
  for (size_t s = 0; s < n_sets; ++s)
    pinned_behind = pinned_behind || (new_pinned > 0 && static_cast<int64_t>(ld.window_positions[s].size()) > ld.pinned);
  rebuild_window_ = any_flush || staged_total != n_sets || pinned_behind;
  if (!rebuild_window_) return;
  for (size_t s = 0; s < n_sets; ++s) {
    const int h_begin = n_sets == 1 ? 0 : static_cast<int>(s);
    const int h_end = n_sets == 1 ? L.n_kv_heads : static_cast<int>(s) + 1;
    const auto& old_wpos = ld.window_positions[s];
    const auto& new_pos = input_.positions[s];
    const int64_t w_old = static_cast<int64_t>(old_wpos.size());
    const int64_t w_after = w_old + static_cast<int64_t>(new_pos.size());
    const int64_t move = static_cast<int64_t>(sets_[s].coded_positions.size());
    auto keep = [&](int64_t i) { return i < p || i >= p + move; };
    auto& wp = sets_[s].window_positions;
    wp.reserve(static_cast<size_t>(w_after - move));
    for (int64_t i = 0; i < w_after; ++i) {
      if (!keep(i)) continue;
      const int64_t src = source(s, i);
      wp.push_back(src < w_old ? old_wpos[static_cast<size_t>(src)] : new_pos[static_cast<size_t>(src - w_old)]);
    }
    for (int h = h_begin; h < h_end; ++h) {
      const auto& hd = ld.heads[static_cast<size_t>(h)];
      HeadPlan& hp = heads_[static_cast<size_t>(h)];
      hp.window_keys.reserve(static_cast<size_t>((w_after - move) * d));
      hp.window_values.reserve(static_cast<size_t>((w_after - move) * d));
      for (int64_t i = 0; i < w_after; ++i) {
        if (!keep(i)) continue;
        const int64_t src = source(s, i);
        const uint16_t* k = src < w_old ? &hd.window_keys[static_cast<size_t>(src * d)]
                                        : &input_.keys[static_cast<size_t>(h)][static_cast<size_t>((src - w_old) * d)];
        const uint16_t* v = src < w_old ? &hd.window_values[static_cast<size_t>(src * d)]
                                        : &input_.values[static_cast<size_t>(h)][static_cast<size_t>((src - w_old) * d)];
        hp.window_keys.insert(hp.window_keys.end(), k, k + d);
        hp.window_values.insert(hp.window_values.end(), v, v + d);
      }
    }
  }
}

void LayerWrite::set_means(const CacheCodecs& codecs, const std::vector<const uint16_t*>& keys,
                           const std::vector<const uint16_t*>& values, const std::vector<int32_t>& positions, bool k,
                           bool v, HeadPlan& hp) {
  const CacheLayout& L = codecs.layout();
  const int d = L.head_dim;
  const size_t m = keys.size();
  require(m > 0 && values.size() == m && positions.size() == m, "LayerWrite: means need at least one token");
  std::vector<double> km(static_cast<size_t>(d), 0.0), vm(static_cast<size_t>(d), 0.0);
  std::vector<float> kf(static_cast<size_t>(d)), vf(static_cast<size_t>(d));
  for (size_t t = 0; t < m; ++t) {
    detail::fp16_bits_to_floats_batch(keys[t], kf.data(), static_cast<size_t>(d));
    detail::fp16_bits_to_floats_batch(values[t], vf.data(), static_cast<size_t>(d));
    if (L.key_frame != transform::KeyFrame::kPostRope) codecs.remove_rope_fast(kf.data(), positions[t]);
    for (int i = 0; i < d; ++i) {
      km[static_cast<size_t>(i)] += kf[static_cast<size_t>(i)];
      vm[static_cast<size_t>(i)] += vf[static_cast<size_t>(i)];
    }
  }
  if (k) hp.key_mean = to_half_vector(km, static_cast<double>(m));
  if (v) hp.value_mean = to_half_vector(vm, static_cast<double>(m));
}

// The code tier's new tokens: coded once, as they arrive (CacheCodecs::encode_tier), and appended
// to the tier stream; nothing about them waits for a flush.
void LayerWrite::plan_code_tier(const CompressedKV& cache) {
  const auto& tp = input_.tier_positions;
  if (tp.empty()) return;
  const CacheCodecs& codecs = cache.codecs();
  const CacheLayout& L = codecs.layout();
  const auto& ld = cache.layer(layer_);
  const size_t n_sets = ld.positions.size();
  require(L.layer_has_code_tier(layer_), "LayerWrite: tier tokens given to a layer without a code tier");
  require(tp.size() == n_sets && ld.tier_positions.size() == n_sets && input_.tier_keys.size() == static_cast<size_t>(L.n_kv_heads) &&
              input_.tier_values.size() == input_.tier_keys.size(),
          "LayerWrite: tier input does not match the cache's position sets and heads");
  const size_t n = tp[0].size();
  for (size_t s = 0; s < n_sets; ++s) {
    require(tp[s].size() == n, "LayerWrite: every position set must promote as many tier tokens");
    for (size_t i = 0; i < n; ++i)
      require(tp[s][i] >= 0 && (i == 0 ? ld.tier_positions[s].empty() || tp[s][i] > ld.tier_positions[s].back()
                                       : tp[s][i] > tp[s][i - 1]),
              "LayerWrite: tier positions must be ascending and follow the set's tier tokens");
  }
  if (n == 0) return;  // nothing promoted by this write
  const size_t d = static_cast<size_t>(L.head_dim);
  const size_t kcb = codecs.tier_code_bytes(KvKind::kKey), vcb = codecs.tier_code_bytes(KvKind::kValue);
  for (int h = 0; h < L.n_kv_heads; ++h) {
    const auto& k = input_.tier_keys[static_cast<size_t>(h)];
    const auto& v = input_.tier_values[static_cast<size_t>(h)];
    require(k.size() == n * d && v.size() == n * d, "LayerWrite: tier rows do not match the tier positions");
    const size_t s = n_sets == 1 ? 0 : static_cast<size_t>(h);
    const auto& hd = ld.heads[static_cast<size_t>(h)];
    HeadPlan& hp = heads_[static_cast<size_t>(h)];
    std::vector<float> key_mean, value_mean;
    if (L.tier_centered) {
      // The head's means: its own, those this write's flush set, or fixed now (before the first flush).
      if (!has_means(hd, true, true) && hp.key_mean.empty()) {
        std::vector<const uint16_t*> krs, vrs;
        std::vector<int32_t> at;
        window_rows_after(cache, s, h, static_cast<size_t>(L.mean_tokens), krs, vrs, at);
        if (krs.empty())
          for (size_t i = 0; i < n; ++i) {
            krs.push_back(&k[i * d]);
            vrs.push_back(&v[i * d]);
            at.push_back(tp[s][i]);
          }
        set_means(codecs, krs, vrs, at, true, true, hp);
      }
      key_mean = half_to_float_vector(hp.key_mean.empty() ? hd.key_mean : hp.key_mean);
      value_mean = half_to_float_vector(hp.value_mean.empty() ? hd.value_mean : hp.value_mean);
    }
    hp.tier_key_codes.resize(n * kcb);
    hp.tier_value_codes.resize(n * vcb);
    hp.tier_key_gains.resize(n);
    hp.tier_value_gains.resize(n);
    const float* km = key_mean.empty() ? nullptr : key_mean.data();
    const float* vm = value_mean.empty() ? nullptr : value_mean.data();
    codecs.encode_tier(layer_, h, KvKind::kKey, n, k.data(), tp[s].data(), km, hp.tier_key_codes.data(),
                       hp.tier_key_gains.data());
    codecs.encode_tier(layer_, h, KvKind::kValue, n, v.data(), tp[s].data(), vm, hp.tier_value_codes.data(),
                       hp.tier_value_gains.data());
  }
}

// The first up-to-`limit` unpinned tokens of set s's window after this write (head h's rows),
// in window order.
void LayerWrite::window_rows_after(const CompressedKV& cache, size_t s, int h, size_t limit,
                                   std::vector<const uint16_t*>& keys, std::vector<const uint16_t*>& values,
                                   std::vector<int32_t>& positions) const {
  const auto& ld = cache.layer(layer_);
  const auto& hd = ld.heads[static_cast<size_t>(h)];
  const int64_t d = cache.layout().head_dim;
  const auto& old_wpos = ld.window_positions[s];
  const auto& new_pos = input_.positions[s];
  const int64_t w_old = static_cast<int64_t>(old_wpos.size());
  const int64_t w_after = w_old + static_cast<int64_t>(new_pos.size());
  const int64_t coded = static_cast<int64_t>(sets_[s].coded_positions.size());
  for (int64_t i = pinned_after_ + coded; i < w_after && keys.size() < limit; ++i) {
    const int64_t src = source(s, i);
    if (src < w_old) {
      keys.push_back(&hd.window_keys[static_cast<size_t>(src * d)]);
      values.push_back(&hd.window_values[static_cast<size_t>(src * d)]);
      positions.push_back(old_wpos[static_cast<size_t>(src)]);
    } else {
      keys.push_back(&input_.keys[static_cast<size_t>(h)][static_cast<size_t>((src - w_old) * d)]);
      values.push_back(&input_.values[static_cast<size_t>(h)][static_cast<size_t>((src - w_old) * d)]);
      positions.push_back(new_pos[static_cast<size_t>(src - w_old)]);
    }
  }
}

void LayerWrite::reserve(CompressedKV& cache, bool exact) {
  auto& ld = CacheStorage::layer(cache, layer_);
  const int d = cache.layout().head_dim;
  for (size_t s = 0; s < sets_.size(); ++s) {
    reserve_more(ld.positions[s], sets_[s].coded_positions.size(), exact);
    if (!input_.tier_positions.empty()) reserve_more(ld.tier_positions[s], input_.tier_positions[s].size(), true);
    if (!rebuild_window_) reserve_more(ld.window_positions[s], input_.positions[s].size(), false);
  }
  for (size_t h = 0; h < heads_.size(); ++h) {
    auto& hd = ld.heads[h];
    const HeadPlan& hp = heads_[h];
    reserve_more(hd.key_codes, hp.key_codes.size(), exact);
    reserve_more(hd.value_codes, hp.value_codes.size(), exact);
    reserve_more(hd.key_gains, hp.key_gains.size(), exact);
    reserve_more(hd.value_gains, hp.value_gains.size(), exact);
    reserve_more(hd.key_gain_codes, hp.key_gain_codes.size(), exact);
    reserve_more(hd.value_gain_codes, hp.value_gain_codes.size(), exact);
    reserve_more(hd.tier_key_codes, hp.tier_key_codes.size(), true);
    reserve_more(hd.tier_value_codes, hp.tier_value_codes.size(), true);
    reserve_more(hd.tier_key_gains, hp.tier_key_gains.size(), true);
    reserve_more(hd.tier_value_gains, hp.tier_value_gains.size(), true);
    if (!rebuild_window_) {
      // Room for the window to fill up to its next flush without reallocating.
      const CacheLayout& L = cache.layout();
      // Before a set's first flush with centring, the window also waits for the mean tokens.
      const size_t set = ld.positions.size() == 1 ? 0 : h;
      const bool means_pending = L.center && ld.positions[set].empty();
      const size_t rows = static_cast<size_t>(pinned_after_ + L.residual_length + L.flush_block +
                                              (means_pending ? L.mean_tokens : 0));
      if (hd.window_keys.capacity() < hd.window_keys.size() + input_.keys[h].size()) {
        hd.window_keys.reserve(std::max(hd.window_keys.size() + input_.keys[h].size(), rows * d));
        hd.window_values.reserve(std::max(hd.window_values.size() + input_.values[h].size(), rows * d));
      }
    }
  }

}

void LayerWrite::commit(CompressedKV& cache) noexcept {
  auto& ld = CacheStorage::layer(cache, layer_);
  for (size_t s = 0; s < sets_.size(); ++s) {
    append(ld.positions[s], sets_[s].coded_positions);
    if (!input_.tier_positions.empty()) append(ld.tier_positions[s], input_.tier_positions[s]);
    if (rebuild_window_)
      ld.window_positions[s].swap(sets_[s].window_positions);
    else
      append(ld.window_positions[s], input_.positions[s]);
  }
  for (size_t h = 0; h < heads_.size(); ++h) {
    auto& hd = ld.heads[h];
    HeadPlan& hp = heads_[h];
    append(hd.key_codes, hp.key_codes);
    append(hd.value_codes, hp.value_codes);
    append(hd.key_gains, hp.key_gains);
    append(hd.value_gains, hp.value_gains);
    append(hd.key_gain_codes, hp.key_gain_codes);
    append(hd.value_gain_codes, hp.value_gain_codes);
    append(hd.tier_key_codes, hp.tier_key_codes);
    append(hd.tier_value_codes, hp.tier_value_codes);
    append(hd.tier_key_gains, hp.tier_key_gains);
    append(hd.tier_value_gains, hp.tier_value_gains);
    if (!hp.key_mean.empty()) hd.key_mean.swap(hp.key_mean);
    if (!hp.value_mean.empty()) hd.value_mean.swap(hp.value_mean);
    if (!hp.key_channel_scale.empty()) hd.key_channel_scale.swap(hp.key_channel_scale);
    if (hp.key_gain_ref != 0) hd.key_gain_ref = hp.key_gain_ref;
    if (hp.value_gain_ref != 0) hd.value_gain_ref = hp.value_gain_ref;
    if (rebuild_window_) {
      hd.window_keys.swap(hp.window_keys);
      hd.window_values.swap(hp.window_values);
    } else {
      append(hd.window_keys, input_.keys[h]);
      append(hd.window_values, input_.values[h]);
    }
  }
  if (energy_consumed_)
    std::vector<std::vector<float>>().swap(ld.query_energy);  // freed: nothing reads it any more
  else if (!input_.query_energy.empty() && ld.query_energy.empty())
    ld.query_energy.swap(input_.query_energy);
  ld.pinned = pinned_after_;
  ld.original_tokens += input_.given;
}

}  // namespace e8kv::detail
