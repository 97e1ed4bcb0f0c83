// Rate allocation across layers and K/V: the sensitivity estimate and the greedy allocator
// (include/e8kv/select/rate_allocation.hpp).
#include "e8kv/select/rate_allocation.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "e8kv/error.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/dot.hpp"
#include "e8kv/numeric/random.hpp"
#include "e8kv/platform.hpp"
#include "e8kv/quant/kv_vector_codec.hpp"

namespace e8kv::select {

namespace {

/// Relative distortion of block code `Code` at head_dim d on fixed-seed Gaussian vectors, through
/// the per-vector codec every cache uses (norm-preserving gain, unit scale). Instantiated for the
/// three rate options only (VectorQuantizer would instantiate every codec).
template <class Code>
double gaussian_distortion(int d) {
  constexpr int kVectors = 512;
  constexpr uint64_t kSeed = 0xD157'0A7E'0000'0001ull;
  std::vector<float> x(static_cast<size_t>(d)), y(static_cast<size_t>(d));
  std::vector<uint8_t> codes(static_cast<size_t>(d / 8 * Code::kIndexBits / 8));
  double err = 0.0, energy = 0.0;
  uint64_t counter = 0;
  for (int v = 0; v < kVectors; ++v) {
    for (int i = 0; i < d; i += 2) {  // Box-Muller, two normals per pair of uniforms
      const double u1 = 1.0 - bits_to_unit_double(random_bits(kSeed, counter++));  // (0, 1]
      const double u2 = bits_to_unit_double(random_bits(kSeed, counter++));
      const double r = std::sqrt(-2.0 * std::log(u1));
      x[static_cast<size_t>(i)] = static_cast<float>(r * std::cos(6.283185307179586 * u2));
      x[static_cast<size_t>(i) + 1] = static_cast<float>(r * std::sin(6.283185307179586 * u2));
    }
    uint16_t gain = 0;
    quant::encode_vector<Code>(x.data(), d, 1.0f, quant::GainPolicy::kNormPreserving, codes.data(), &gain);
    quant::decode_vector<Code>(codes.data(), gain, d, y.data());
    for (int i = 0; i < d; ++i) {
      const double e = static_cast<double>(x[static_cast<size_t>(i)]) - y[static_cast<size_t>(i)];
      err += e * e;
      energy += static_cast<double>(x[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
    }
  }
  return err / energy;
}

/// How much query-weighted channel scales shrink the score error q·e of isotropic code errors:
/// with per-channel (RoPE pairs averaged) query energy Q_i and key residual energy R_i, the
/// scales s_i = (Q_i/R_i)^(1/4) code S·r, so E(q·e)² ∝ Σ Q_i/s_i² · Σ s_i² R_i = (Σ √(Q_i R_i))²
/// against Σ Q_i · Σ R_i unscaled (Cauchy-Schwarz: <= 1; 1 when Q ∝ R).
double query_weighting_factor(const SensitivityInput& in, std::vector<double> Q, std::vector<double> R) {
  if (!in.query_weighted_keys) return 1.0;
  if (in.rope != nullptr) {
    const int rotary = in.rope->rotary_dim();
    for (int i = 0; i < rotary / 2; ++i) {
      int a = 0, b = 0;
      transform::rope_pair_indices(in.rope->params().layout, rotary, i, a, b);
      Q[static_cast<size_t>(a)] = Q[static_cast<size_t>(b)] =
          0.5 * (Q[static_cast<size_t>(a)] + Q[static_cast<size_t>(b)]);
      R[static_cast<size_t>(a)] = R[static_cast<size_t>(b)] =
          0.5 * (R[static_cast<size_t>(a)] + R[static_cast<size_t>(b)]);
    }
  }
  double cross = 0.0, q = 0.0, r = 0.0;
  for (size_t i = 0; i < Q.size(); ++i) {
    cross += std::sqrt(Q[i] * R[i]);
    q += Q[i];
    r += R[i];
  }
  return q > 0.0 && r > 0.0 ? cross * cross / (q * r) : 1.0;
}

}  // namespace

const std::vector<RateOption>& block_rate_options(int head_dim) {
  require(head_dim > 0 && head_dim % 8 == 0 && head_dim <= 512,
          fmt::format("block_rate_options: head_dim {} (accepted: a multiple of 8 up to 512)", head_dim));
  static std::mutex mutex;
  static std::map<int, std::vector<RateOption>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(head_dim);
  if (it == cache.end()) {
    std::vector<RateOption> options;
    options.push_back(RateOption{quant::Codec::kE8P, 2, gaussian_distortion<codebook::E8P>(head_dim)});
    options.push_back(RateOption{quant::Codec::kRvq3, 3, gaussian_distortion<codebook::Rvq3>(head_dim)});
    options.push_back(RateOption{quant::Codec::kRvq4, 4, gaussian_distortion<codebook::Rvq4>(head_dim)});
    it = cache.emplace(head_dim, std::move(options)).first;
  }
  return it->second;
}

namespace {
inline LayerSensitivity estimate_sensitivity_body(const SensitivityInput& in) {
  const TensorView& K = in.keys;
  const TensorView& V = in.values;
  const int64_t n = K.tokens(), H = K.heads(), d = K.head_dim();
  require(V.tokens() == n && V.heads() == H && V.head_dim() == d,
          "estimate_sensitivity: keys and values must have the same shape");
  require(d > 0 && d <= 512, fmt::format("estimate_sensitivity: head_dim {} (accepted 1..512)", d));
  require(n == 0 || in.positions != nullptr, "estimate_sensitivity: positions are required");
  require(in.max_queries >= 1, "estimate_sensitivity: max_queries must be >= 1");
  require(in.fp16_prefix >= 0, "estimate_sensitivity: fp16_prefix must be >= 0");
  LayerSensitivity s;
  if (n == 0 || H == 0) return s;
  double output_energy = 0.0;  // Σ ‖O‖² over the queries and heads: the errors are relative to it
  const bool own_queries = in.queries == nullptr;
  const int64_t QH = own_queries ? H : in.q_heads;
  require(QH >= H && QH % H == 0, fmt::format("estimate_sensitivity: {} query heads for {} KV heads", QH, H));
  if (!own_queries)
    require(in.queries->heads() == QH && in.queries->head_dim() == d,
            fmt::format("estimate_sensitivity: queries must be [w, {}, {}]", QH, d));
  const int64_t G = QH / H;
  const int64_t w_all = own_queries ? n : in.queries->tokens();
  const int64_t w = std::min<int64_t>(w_all, in.max_queries);
  const double tau = in.softmax_scale > 0.f ? in.softmax_scale : 1.0 / std::sqrt(static_cast<double>(d));

  const size_t ds = static_cast<size_t>(d), ns = static_cast<size_t>(n);
  constexpr int64_t kHeadBatch = 4;
  const size_t nbs = static_cast<size_t>(kHeadBatch);
  std::vector<float> k(ns * ds), v(ns * ds), frame(ns * ds), qs(nbs * ds), o(nbs * ds), a(nbs * ds), pw(nbs * ns),
      cw(nbs * ns);
  std::vector<double> key_res(ns), value_res(ns), value_norm(ns), p(nbs * ns), mean(ds);
  std::vector<int64_t> positions64(in.positions, in.positions + n);
  for (int64_t h = 0; h < H; ++h) {
    // The head's rows, and the energy of what the codecs code (centred residuals).
    for (int64_t t = 0; t < n; ++t) {
      K.load(t, h, &k[static_cast<size_t>(t) * ds]);
      V.load(t, h, &v[static_cast<size_t>(t) * ds]);
      value_norm[static_cast<size_t>(t)] =
          dot_product(&v[static_cast<size_t>(t) * ds], &v[static_cast<size_t>(t) * ds], static_cast<int>(d));
    }
    // Per token: ‖x_t − μ‖² in the frame the codecs centre in; per channel (coded tokens only,
    // when `channel` is given): the same energies summed over tokens.
    auto residual_energy = [&](const std::vector<float>& rows, bool remove_rope, std::vector<double>& res,
                               std::vector<double>* channel) {
      std::fill(mean.begin(), mean.end(), 0.0);
      const std::vector<float>* x_rows = &rows;
      if (remove_rope) {  // keys: the pre-RoPE frame, on a copy
        frame = rows;
        in.rope->remove_batch(frame.data(), positions64.data(), n, d);
        x_rows = &frame;
      }
      if (in.center) {
        for (int64_t t = 0; t < n; ++t)
          for (size_t i = 0; i < ds; ++i) mean[i] += (*x_rows)[static_cast<size_t>(t) * ds + i];
        for (double& m : mean) m /= static_cast<double>(n);
      }
      for (int64_t t = 0; t < n; ++t) {
        double e = 0.0;
        for (size_t i = 0; i < ds; ++i) {
          const double x = (*x_rows)[static_cast<size_t>(t) * ds + i] - mean[i];
          e += x * x;
          if (channel != nullptr && t >= in.fp16_prefix) (*channel)[i] += x * x;
        }
        res[static_cast<size_t>(t)] = e;
      }
    };
    std::vector<double> key_channel(ds, 0.0);
    residual_energy(k, in.rope != nullptr, key_res, &key_channel);
    residual_energy(v, false, value_res, nullptr);
    std::vector<double> query_channel(ds, 0.0);  // query energy per channel (the queries used)
    double head_key = 0.0;                       // this head's key term, before query weighting

    for (int64_t wi = 0; wi < w; ++wi) {
      const int64_t qt = w_all - w + wi;  // the last w queries
      // Causal: a query sees the keys at or before its position.
      int64_t qpos = 0;
      if (own_queries)
        qpos = in.positions[qt];
      else if (in.query_positions != nullptr)
        qpos = in.query_positions[qt];
      else
        qpos = in.positions[std::max<int64_t>(0, n - w_all + qt)];
      const int32_t last_seen = static_cast<int32_t>(std::min<int64_t>(qpos, INT32_MAX));
      const int64_t visible = std::upper_bound(in.positions, in.positions + n, last_seen) - in.positions;
      if (visible == 0) continue;
      const int64_t first_coded = std::min(in.fp16_prefix, visible);
      // The query heads of the group in batches: each K and V row is read once per batch.
      for (int64_t g0 = 0; g0 < G; g0 += kHeadBatch) {
        const int64_t nb = std::min<int64_t>(kHeadBatch, G - g0);
        double q2[kHeadBatch] = {}, mx[kHeadBatch], z[kHeadBatch] = {};
        for (int64_t b = 0; b < nb; ++b) {
          float* qb = &qs[static_cast<size_t>(b) * ds];
          if (own_queries)
            std::copy(&k[static_cast<size_t>(qt) * ds], &k[static_cast<size_t>(qt) * ds] + ds, qb);
          else
            in.queries->load(qt, h * G + g0 + b, qb);
          for (size_t i = 0; i < ds; ++i) {
            q2[b] += static_cast<double>(qb[i]) * qb[i];
            query_channel[i] += static_cast<double>(qb[i]) * qb[i];
          }
          mx[b] = -INFINITY;
        }
        for (int64_t t = 0; t < visible; ++t) {
          const float* kt = &k[static_cast<size_t>(t) * ds];
          for (int64_t b = 0; b < nb; ++b) {
            const double l = tau * dot_product(&qs[static_cast<size_t>(b) * ds], kt, static_cast<int>(d));
            p[static_cast<size_t>(b) * ns + static_cast<size_t>(t)] = l;
            mx[b] = std::max(mx[b], l);
          }
        }
        // Weights, and what the key term needs: the values once give O = Σ p_t·v_t and
        // A = Σ c_t·v_t with c_t = p_t²·‖r_t‖² over the coded tokens, so that
        // Σ c_t·‖v_t − O‖² = Σ c_t·‖v_t‖² − 2·O·A + ‖O‖²·Σ c_t.
        double c_sum[kHeadBatch] = {}, c_norm[kHeadBatch] = {};
        for (int64_t b = 0; b < nb; ++b) {
          double* pb = &p[static_cast<size_t>(b) * ns];
          for (int64_t t = 0; t < visible; ++t) z[b] += (pb[t] = std::exp(pb[t] - mx[b]));
          float* pwb = &pw[static_cast<size_t>(b) * ns];
          float* cwb = &cw[static_cast<size_t>(b) * ns];
          for (int64_t t = 0; t < visible; ++t) {
            const double pt = pb[t] / z[b];
            pwb[t] = static_cast<float>(pt);
            cwb[t] = 0.f;
            if (t < first_coded) continue;
            const double c = pt * pt * key_res[static_cast<size_t>(t)];
            cwb[t] = static_cast<float>(c);
            c_sum[b] += c;
            c_norm[b] += c * value_norm[static_cast<size_t>(t)];
            s.value += pt * pt * value_res[static_cast<size_t>(t)];
          }
        }
        std::fill(o.begin(), o.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(nb) * ds), 0.f);
        std::fill(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(nb) * ds), 0.f);
        for (int64_t t = 0; t < visible; ++t) {
          const float* __restrict__ vt = &v[static_cast<size_t>(t) * ds];
          for (int64_t b = 0; b < nb; ++b) {
            const float pf = pw[static_cast<size_t>(b) * ns + static_cast<size_t>(t)];
            const float cf = cw[static_cast<size_t>(b) * ns + static_cast<size_t>(t)];
            float* __restrict__ ob = &o[static_cast<size_t>(b) * ds];
            float* __restrict__ ab = &a[static_cast<size_t>(b) * ds];
            for (size_t i = 0; i < ds; ++i) {
              ob[i] += pf * vt[i];
              ab[i] += cf * vt[i];
            }
          }
        }
        for (int64_t b = 0; b < nb; ++b) {
          const float* ob = &o[static_cast<size_t>(b) * ds];
          const double o2 = dot_product(ob, ob, static_cast<int>(d));
          output_energy += o2;
          const double spread_sum =
              std::max(0.0, c_norm[b] - 2.0 * dot_product(ob, &a[static_cast<size_t>(b) * ds], static_cast<int>(d)) +
                                o2 * c_sum[b]);
          head_key += tau * tau * q2[b] / static_cast<double>(d) * spread_sum;
        }
      }
    }
    s.key += head_key * query_weighting_factor(in, query_channel, key_channel);
  }
  require(std::isfinite(s.key) && std::isfinite(s.value) && std::isfinite(output_energy),
          "estimate_sensitivity: non-finite input");
  if (output_energy > 0.0) {
    s.key /= output_energy;
    s.value /= output_energy;
  }
  return s;
}

// The estimate compiled for the baseline ISA and for AVX2 (no FMA, no reassociation:
// -ffp-contract=off and no fast-math, so both give the same bits), picked per call: its logits
// (dot_product's eight lanes) are most of a budget compress's extra time.
E8KV_TARGET_BASE_FLAT LayerSensitivity estimate_sensitivity_base(const SensitivityInput& in) {
  return estimate_sensitivity_body(in);
}
E8KV_TARGET_AVX2_FLAT LayerSensitivity estimate_sensitivity_avx2(const SensitivityInput& in) {
  return estimate_sensitivity_body(in);
}
}  // namespace

LayerSensitivity estimate_sensitivity(const SensitivityInput& in) {
  return cpu_has_avx2() ? estimate_sensitivity_avx2(in) : estimate_sensitivity_base(in);
}

std::vector<LayerRate> allocate_rates(const std::vector<LayerSensitivity>& sensitivity,
                                      const std::vector<RateOption>& options, double budget_bits,
                                      const std::vector<bool>& fixed, const std::vector<LayerRate>& fixed_rate,
                                      const std::vector<int64_t>& layer_tokens) {
  const size_t L = sensitivity.size();
  require(!options.empty(), "allocate_rates: no rate options");
  for (size_t i = 0; i < options.size(); ++i) {
    require(std::isfinite(options[i].distortion) && options[i].distortion >= 0.0,
            "allocate_rates: option distortions must be finite and >= 0");
    require(i == 0 || options[i].bits > options[i - 1].bits, "allocate_rates: options must be ordered by bits");
  }
  require(fixed.empty() || fixed.size() == L, "allocate_rates: fixed must be empty or one per layer");
  require(fixed.empty() || fixed_rate.size() == L, "allocate_rates: fixed_rate must be one per layer");
  require(layer_tokens.empty() || layer_tokens.size() == L, "allocate_rates: layer_tokens must be empty or one per layer");
  for (int64_t w : layer_tokens) require(w >= 0, "allocate_rates: layer_tokens must be >= 0");
  require(std::isfinite(budget_bits) && budget_bits >= options.front().bits,
          fmt::format("allocate_rates: budget {} bits per element is below the cheapest option ({} bits)", budget_bits,
                      options.front().bits));
  for (const auto& s : sensitivity)
    require(std::isfinite(s.key) && std::isfinite(s.value) && s.key >= 0.0 && s.value >= 0.0,
            "allocate_rates: sensitivities must be finite and >= 0");

  // Items: (layer, key) and (layer, value) of the free layers, each at an option index.
  struct Item {
    size_t layer;
    bool value;
    double weight;
    int64_t elements;  ///< what one bit per element costs, in budget units (1, or the layer's tokens)
    size_t option = 0;
  };
  std::vector<Item> items;
  int64_t units = 0;
  for (size_t l = 0; l < L; ++l) {
    if (!fixed.empty() && fixed[l]) continue;
    const int64_t elements = layer_tokens.empty() ? 1 : layer_tokens[l];
    items.push_back(Item{l, false, sensitivity[l].key, elements});
    items.push_back(Item{l, true, sensitivity[l].value, elements});
    units += 2 * elements;
  }
  // The budget in bit steps: Σ bits · elements over items <= budget · Σ elements (whole bits).
  const int64_t total_bits = static_cast<int64_t>(std::floor(budget_bits * static_cast<double>(units) + 1e-9));
  int64_t spent = 0;
  for (const Item& it : items) spent += it.elements * options.front().bits;
  for (;;) {
    // The upgrade (to the next option) removing the most error per element-bit that still fits.
    size_t best = items.size();
    double best_gain = -1.0;
    for (size_t i = 0; i < items.size(); ++i) {
      const Item& it = items[i];
      if (it.option + 1 >= options.size()) continue;
      const int64_t cost = (options[it.option + 1].bits - options[it.option].bits) * it.elements;
      if (spent + cost > total_bits) continue;
      const double gain = it.weight * (options[it.option].distortion - options[it.option + 1].distortion) /
                          static_cast<double>(cost > 0 ? cost : 1);
      if (gain > best_gain) {  // strict: ties keep the earlier item (lower layer, keys first)
        best_gain = gain;
        best = i;
      }
    }
    if (best == items.size()) break;
    spent += (options[items[best].option + 1].bits - options[items[best].option].bits) * items[best].elements;
    ++items[best].option;
  }
  std::vector<LayerRate> rates(L);
  for (size_t l = 0; l < L; ++l)
    if (!fixed.empty() && fixed[l]) rates[l] = fixed_rate[l];
  for (const Item& it : items) (it.value ? rates[it.layer].value : rates[it.layer].key) = options[it.option].codec;
  return rates;
}

double mean_index_bits(const std::vector<LayerRate>& rates, const std::vector<RateOption>& options,
                       const std::vector<bool>& fixed, const std::vector<int64_t>& layer_tokens) {
  require(layer_tokens.empty() || layer_tokens.size() == rates.size(),
          "mean_index_bits: layer_tokens must be empty or one per layer");
  auto bits = [&](quant::Codec c) {
    for (const auto& o : options)
      if (o.codec == c) return o.bits;
    throw Error(fmt::format("mean_index_bits: codec '{}' is not among the rate options", quant::to_string(c)));
  };
  double sum = 0.0, count = 0.0;
  for (size_t l = 0; l < rates.size(); ++l) {
    if (!fixed.empty() && fixed[l]) continue;
    const double w = layer_tokens.empty() ? 1.0 : static_cast<double>(layer_tokens[l]);
    sum += w * (bits(rates[l].key) + bits(rates[l].value));
    count += 2.0 * w;
  }
  return count == 0.0 ? 0.0 : sum / count;
}

}  // namespace e8kv::select
