// Rotary position embeddings (RoPE): apply to / remove from one head vector, in place.
//
// Matches Hugging Face transformers' definitions (modeling_rope_utils.py):
//   default  inv_freq[i] = 1 / theta^(2i / rotary_dim),  i = 0 .. rotary_dim/2 - 1
//   linear   inv_freq / factor
//   dynamic  (NTK-aware) theta' = theta · (factor·L/orig − (factor − 1))^(rotary_dim/(rotary_dim−2))
//            when the sequence length L exceeds original_max_position, else the default
//   llama3   wavelength bands: high frequencies (wavelen < orig/high_freq_factor) unchanged, low
//            ones (wavelen > orig/low_freq_factor) divided by factor, a smooth blend in between
//   yarn     per-dimension ramp between extrapolation (unchanged) and interpolation (/factor),
//            bounds from beta_fast/beta_slow rotations (floor/ceil, HF's "truncate" default), plus
//            an attention factor (default 0.1·ln(factor) + 1)
// with optional per-pair frequency factors (RopeParams::freq_factors, llama.cpp's rope_freqs)
// dividing the default inverse frequencies before any scaling, as ggml_rope_ext divides them;
// and both pairing layouts:
//   kSplitHalf   (Llama/NeoX "rotate_half"): pairs (i, i + rotary_dim/2)
//   kInterleaved (GPT-J):                     pairs (2i, 2i + 1)
// A pair (a, b) at angle t = position · inv_freq[i] becomes (a cos t − b sin t, a sin t + b cos t).
// Dimensions >= rotary_dim (partial rotary) are never touched.
//
// Angles are computed in double (positions up to 10^6 and beyond stay accurate); the rotation is
// done in float with unfused multiply/add. remove() rotates by −t with the same cos/sin, so it is
// the exact inverse up to float rounding. The rotation is pure: the yarn attention factor is
// NOT folded in (HF multiplies cos and sin, i.e. both q and k, by it); callers that want HF's
// logits scale q·k by attention_factor()².
//
// Non-finite input values give non-finite output only within their own pair; no UB.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "e8kv/platform.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/fp.hpp"
#include "e8kv/transform/rope_params.hpp"

namespace e8kv::transform {

/// Largest head_dim accepted (the batched path keeps per-token cos/sin on the stack).
inline constexpr int kMaxRopeHeadDim = 1024;

/// Rotates the pair (a, b) by the angle whose cosine and sine are given:
/// (a, b) -> (a·cos − b·sin, a·sin + b·cos). Unfused, so host and device agree bit for bit.
E8KV_HD E8KV_FORCE_INLINE void rope_rotate_pair(float& a, float& b, float cos_t, float sin_t) {
  const float a0 = a;
  const float b0 = b;
  a = fp::add(fp::mul(a0, cos_t), -fp::mul(b0, sin_t));
  b = fp::add(fp::mul(a0, sin_t), fp::mul(b0, cos_t));
}

/// Element indices of rotation pair `pair` (0 .. rotary_dim/2 − 1) in the given layout.
E8KV_HD E8KV_FORCE_INLINE void rope_pair_indices(RopeLayout layout, int rotary_dim, int pair, int& first,
                                                 int& second) {
  if (layout == RopeLayout::kSplitHalf) {
    first = pair;
    second = pair + rotary_dim / 2;
  } else {
    first = 2 * pair;
    second = 2 * pair + 1;
  }
}

/// Rotates the first rotary_dim elements of x pair by pair, with cos_t[i] / sin_t[i] for pair i.
/// inverse = true rotates by the opposite angle (RoPE removal). The pairs of rope_pair_indices,
/// one loop per layout so that each vectorizes on the host.
E8KV_HD inline void rope_rotate(float* x, const float* cos_t, const float* sin_t, int rotary_dim, RopeLayout layout,
                                bool inverse) {
  const int pairs = rotary_dim / 2;
  if (layout == RopeLayout::kSplitHalf) {
    for (int i = 0; i < pairs; ++i) rope_rotate_pair(x[i], x[i + pairs], cos_t[i], inverse ? -sin_t[i] : sin_t[i]);
  } else {
    for (int i = 0; i < pairs; ++i) rope_rotate_pair(x[2 * i], x[2 * i + 1], cos_t[i], inverse ? -sin_t[i] : sin_t[i]);
  }
}

namespace detail {

/// Float cos/sin of position·inv_freq for positions lo and hi·kRopeTableSpan, so that any position
/// below kRopeTableSpan² is one complex product away (angle addition).
inline constexpr int64_t kRopeTableSpan = 1024;

struct RopeTables {
  std::once_flag built;
  std::vector<float> cos_lo, sin_lo, cos_hi, sin_hi;  // [kRopeTableSpan][pairs]
};

inline std::string format_value(int v) { return std::to_string(v); }
inline std::string format_value(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

/// Throws e8kv::Error naming the RopeParams field, its rule and the rejected value.
template <class T>
void require_param(bool ok, const char* field, const std::string& rule, T got) {
  if (!ok) throw Error("RopeParams." + std::string(field) + " " + rule + ", got " + format_value(got));
}

}  // namespace detail

/// RoPE for one (layer) configuration. Immutable after construction; safe to share between
/// threads (the batched path's tables are built once, on first use, under std::call_once).
class Rope {
 public:
  explicit Rope(const RopeParams& params) : params_(params) {
    validate_and_resolve();
    compute_inv_freq();
  }

  /// Applies RoPE at `position` to x[0 .. head_dim) in place.
  /// seq_len matters for dynamic NTK only: the length used is L = max(seq_len, position + 1),
  /// which mirrors HF (there L is the largest position + 1 of the forward call that produced
  /// the vector: pass the prefill length for prefill tokens, 0 for decode tokens).
  void apply(float* x, int64_t position, int64_t seq_len = 0) const { rotate_one(x, position, seq_len, false); }

  /// Removes RoPE (rotation by the opposite angle); the exact inverse of apply with the same
  /// position and seq_len, up to float rounding.
  void remove(float* x, int64_t position, int64_t seq_len = 0) const { rotate_one(x, position, seq_len, true); }

  /// Batched apply: token k is x[k·stride .. k·stride + head_dim) at positions[k]; elements
  /// between head_dim and stride are untouched. Uses precomputed cos/sin tables (float, angle
  /// addition; agrees with apply() to ~2e-7 relative) for 0 <= position < 2^20 and the direct
  /// double-precision path otherwise (and for dynamic NTK lengths above original_max_position).
  void apply_batch(float* x, const int64_t* positions, int64_t n_tokens, int64_t stride,
                   int64_t seq_len = 0) const {
    rotate_batch(x, positions, n_tokens, stride, seq_len, false);
  }
  void remove_batch(float* x, const int64_t* positions, int64_t n_tokens, int64_t stride,
                    int64_t seq_len = 0) const {
    rotate_batch(x, positions, n_tokens, stride, seq_len, true);
  }

  /// rotary_dim/2 inverse frequencies for the base length (dynamic NTK: unscaled).
  const std::vector<double>& inv_freq() const { return inv_freq_; }

  /// Inverse frequencies in effect for sequence length seq_len (differs from inv_freq() only for
  /// dynamic NTK with seq_len > original_max_position).
  std::vector<double> inv_freq_at(int64_t seq_len) const {
    require(seq_len >= 0, "Rope::inv_freq_at: seq_len must be >= 0, got " + std::to_string(seq_len));
    const double base = dynamic_base(seq_len);
    if (base == 0.0) return inv_freq_;
    std::vector<double> out(static_cast<size_t>(pairs_));
    for (int i = 0; i < pairs_; ++i) out[static_cast<size_t>(i)] = default_inv_freq(base, i);
    return out;
  }

  /// Yarn's attention (mscale) factor; 1 for every other scaling. HF multiplies both cos and sin
  /// by it, so its logits are q·k · attention_factor()².
  double attention_factor() const { return attention_factor_; }

  /// The parameters, with rotary_dim resolved (never 0).
  const RopeParams& params() const { return params_; }

  int rotary_dim() const { return params_.rotary_dim; }
  int head_dim() const { return params_.head_dim; }

 private:
  void validate_and_resolve() {
    RopeParams& p = params_;
    using detail::require_param;
    require_param(p.layout == RopeLayout::kSplitHalf || p.layout == RopeLayout::kInterleaved, "layout",
                  "must be kSplitHalf or kInterleaved", static_cast<int>(p.layout));
    require_param(p.head_dim >= 2 && p.head_dim <= kMaxRopeHeadDim, "head_dim",
                  "must be in [2, " + std::to_string(kMaxRopeHeadDim) + "]", p.head_dim);
    if (p.rotary_dim == 0) p.rotary_dim = p.head_dim;
    require_param(p.rotary_dim >= 2 && p.rotary_dim <= p.head_dim && p.rotary_dim % 2 == 0, "rotary_dim",
                  "must be even and in [2, head_dim=" + std::to_string(p.head_dim) + "] (0 = head_dim)",
                  p.rotary_dim);
    require_param(std::isfinite(p.theta) && p.theta > 0.0, "theta", "must be finite and > 0", p.theta);
    require_param(p.freq_factors.empty() || p.freq_factors.size() == static_cast<size_t>(p.rotary_dim / 2),
                  "freq_factors", "must be empty or hold rotary_dim/2 = " + std::to_string(p.rotary_dim / 2) + " values",
                  static_cast<int>(p.freq_factors.size()));
    for (float f : p.freq_factors)
      require_param(std::isfinite(f) && f > 0.f, "freq_factors", "must be finite and > 0", static_cast<double>(f));
    const bool known_scaling = p.scaling == RopeScaling::kNone || p.scaling == RopeScaling::kLinear ||
                               p.scaling == RopeScaling::kDynamicNtk || p.scaling == RopeScaling::kLlama3 ||
                               p.scaling == RopeScaling::kYarn;
    require_param(known_scaling, "scaling", "must be kNone, kLinear, kDynamicNtk, kLlama3 or kYarn",
                  static_cast<int>(p.scaling));
    if (p.scaling == RopeScaling::kNone) return;  // the scaling fields are ignored
    require_param(std::isfinite(p.factor) && p.factor >= 1.0, "factor", "must be finite and >= 1 for scaled RoPE",
                  p.factor);
    if (p.scaling == RopeScaling::kLinear) return;
    require_param(p.original_max_position > 0, "original_max_position",
                  "must be > 0 for dynamic NTK, llama3 and yarn scaling", p.original_max_position);
    if (p.scaling == RopeScaling::kDynamicNtk) {
      require_param(p.rotary_dim >= 4, "rotary_dim", "must be >= 4 for dynamic NTK (exponent d/(d-2))",
                    p.rotary_dim);
    } else if (p.scaling == RopeScaling::kLlama3) {
      require_param(std::isfinite(p.low_freq_factor) && p.low_freq_factor > 0.0, "low_freq_factor",
                    "must be finite and > 0", p.low_freq_factor);
      require_param(std::isfinite(p.high_freq_factor) && p.high_freq_factor > p.low_freq_factor, "high_freq_factor",
                    "must be finite and > low_freq_factor", p.high_freq_factor);
    } else {  // yarn
      require_param(p.theta > 1.0, "theta", "must be > 1 for yarn (its ramp divides by ln theta)", p.theta);
      require_param(std::isfinite(p.beta_slow) && p.beta_slow > 0.0, "beta_slow", "must be finite and > 0",
                    p.beta_slow);
      require_param(std::isfinite(p.beta_fast) && p.beta_fast >= p.beta_slow, "beta_fast",
                    "must be finite and >= beta_slow", p.beta_fast);
      require_param(std::isfinite(p.attention_factor) && p.attention_factor >= 0.0, "attention_factor",
                    "must be finite and >= 0 (0 = default 0.1*ln(factor)+1)", p.attention_factor);
    }
  }

  /// HF's default formula for pair i with the given base, divided by the pair's frequency factor.
  double default_inv_freq(double base, int i) const {
    const double f = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(params_.rotary_dim));
    return params_.freq_factors.empty() ? f : f / static_cast<double>(params_.freq_factors[static_cast<size_t>(i)]);
  }

  void compute_inv_freq() {
    const RopeParams& p = params_;
    pairs_ = p.rotary_dim / 2;
    inv_freq_.resize(static_cast<size_t>(pairs_));
    for (int i = 0; i < pairs_; ++i) inv_freq_[static_cast<size_t>(i)] = default_inv_freq(p.theta, i);
    attention_factor_ = 1.0;
    const double kTwoPi = 6.283185307179586476925;
    switch (p.scaling) {
      case RopeScaling::kNone:
      case RopeScaling::kDynamicNtk:  // scaled per sequence length at use
        break;
      case RopeScaling::kLinear:
        for (double& f : inv_freq_) f /= p.factor;
        break;
      case RopeScaling::kLlama3: {
        const double orig = p.original_max_position;
        const double low_freq_wavelen = orig / p.low_freq_factor;
        const double high_freq_wavelen = orig / p.high_freq_factor;
        for (double& f : inv_freq_) {
          const double wavelen = kTwoPi / f;
          if (wavelen < high_freq_wavelen) continue;  // high frequency: unchanged
          if (wavelen > low_freq_wavelen) {           // low frequency: interpolated
            f /= p.factor;
            continue;
          }
          const double smooth = (orig / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
          f = (1.0 - smooth) * f / p.factor + smooth * f;
        }
        break;
      }
      case RopeScaling::kYarn: {
        const double rd = p.rotary_dim;
        const double orig = p.original_max_position;
        // Dimension index at which the wavelength completes `rotations` turns over orig positions.
        auto correction_dim = [&](double rotations) {
          return rd * std::log(orig / (rotations * kTwoPi)) / (2.0 * std::log(p.theta));
        };
        double low = std::max(std::floor(correction_dim(p.beta_fast)), 0.0);
        double high = std::min(std::ceil(correction_dim(p.beta_slow)), rd - 1.0);
        if (low == high) high += 0.001;  // HF: prevents a zero-width ramp
        for (int i = 0; i < pairs_; ++i) {
          const double ramp = std::min(std::max((i - low) / (high - low), 0.0), 1.0);
          const double extrapolation = inv_freq_[static_cast<size_t>(i)];
          const double interpolation = extrapolation / p.factor;
          // ramp 0: extrapolation (unchanged, high frequency); ramp 1: interpolation.
          inv_freq_[static_cast<size_t>(i)] = interpolation * ramp + extrapolation * (1.0 - ramp);
        }
        attention_factor_ = p.attention_factor > 0.0 ? p.attention_factor : 0.1 * std::log(p.factor) + 1.0;
        break;
      }
    }
  }

  /// Dynamic NTK: the scaled base for sequence length `length`, or 0 when the unscaled
  /// inv_freq_ applies (other scalings, or length <= original_max_position).
  double dynamic_base(int64_t length) const {
    const RopeParams& p = params_;
    if (p.scaling != RopeScaling::kDynamicNtk || length <= p.original_max_position) return 0.0;
    const double ratio = p.factor * static_cast<double>(length) / p.original_max_position - (p.factor - 1.0);
    const double rd = p.rotary_dim;
    return p.theta * std::pow(ratio, rd / (rd - 2.0));
  }

  static int64_t effective_length(int64_t position, int64_t seq_len) {
    const int64_t next = position < std::numeric_limits<int64_t>::max() ? position + 1 : position;
    return seq_len > next ? seq_len : next;
  }

  void rotate_one(float* x, int64_t position, int64_t seq_len, bool inverse) const {
    require(x != nullptr, "Rope::apply/remove: x must not be null");
    require(seq_len >= 0, "Rope::apply/remove: seq_len must be >= 0, got " + std::to_string(seq_len));
    const double base = dynamic_base(effective_length(position, seq_len));
    const double pos = static_cast<double>(position);
    for (int i = 0; i < pairs_; ++i) {
      const double inv = base == 0.0 ? inv_freq_[static_cast<size_t>(i)] : default_inv_freq(base, i);
      const double angle = pos * inv;
      const float c = static_cast<float>(std::cos(angle));
      const float s = static_cast<float>(std::sin(angle));
      int a = 0;
      int b = 0;
      rope_pair_indices(params_.layout, params_.rotary_dim, i, a, b);
      rope_rotate_pair(x[a], x[b], c, inverse ? -s : s);
    }
  }

  const detail::RopeTables& tables() const {
    std::call_once(tables_->built, [this] {
      detail::RopeTables& t = *tables_;
      const size_t n = static_cast<size_t>(detail::kRopeTableSpan) * static_cast<size_t>(pairs_);
      t.cos_lo.resize(n);
      t.sin_lo.resize(n);
      t.cos_hi.resize(n);
      t.sin_hi.resize(n);
      for (int64_t j = 0; j < detail::kRopeTableSpan; ++j) {
        for (int i = 0; i < pairs_; ++i) {
          const size_t k = static_cast<size_t>(j) * static_cast<size_t>(pairs_) + static_cast<size_t>(i);
          const double f = inv_freq_[static_cast<size_t>(i)];
          const double lo = static_cast<double>(j) * f;
          const double hi = static_cast<double>(j * detail::kRopeTableSpan) * f;
          t.cos_lo[k] = static_cast<float>(std::cos(lo));
          t.sin_lo[k] = static_cast<float>(std::sin(lo));
          t.cos_hi[k] = static_cast<float>(std::cos(hi));
          t.sin_hi[k] = static_cast<float>(std::sin(hi));
        }
      }
    });
    return *tables_;
  }

  void rotate_batch(float* x, const int64_t* positions, int64_t n_tokens, int64_t stride, int64_t seq_len,
                    bool inverse) const {
    const char* where = inverse ? "Rope::remove_batch" : "Rope::apply_batch";
    require(n_tokens >= 0, std::string(where) + ": n_tokens must be >= 0, got " + std::to_string(n_tokens));
    require(seq_len >= 0, std::string(where) + ": seq_len must be >= 0, got " + std::to_string(seq_len));
    if (n_tokens == 0) return;
    require(x != nullptr && positions != nullptr, std::string(where) + ": x and positions must not be null");
    require(stride >= params_.head_dim, std::string(where) + ": stride must be >= head_dim=" +
                                            std::to_string(params_.head_dim) + ", got " + std::to_string(stride));
    const detail::RopeTables& t = tables();
    const int n = pairs_;
    const int64_t span = detail::kRopeTableSpan;
    float cos_buf[kMaxRopeHeadDim / 2];
    float sin_buf[kMaxRopeHeadDim / 2];
    std::vector<double> dynamic_inv;  // inverse frequencies for dynamic_inv_base
    double dynamic_inv_base = 0.0;
    for (int64_t k = 0; k < n_tokens; ++k) {
      const int64_t position = positions[k];
      float* v = x + k * stride;
      const double base = dynamic_base(effective_length(position, seq_len));
      if (base == 0.0 && position >= 0 && position < span * span) {
        // cos/sin(lo + hi) from the tables: one complex product per pair, vectorizable.
        const size_t lo = static_cast<size_t>(position % span) * static_cast<size_t>(n);
        const size_t hi = static_cast<size_t>(position / span) * static_cast<size_t>(n);
        const float* __restrict cl = t.cos_lo.data() + lo;
        const float* __restrict sl = t.sin_lo.data() + lo;
        const float* __restrict ch = t.cos_hi.data() + hi;
        const float* __restrict sh = t.sin_hi.data() + hi;
        for (int i = 0; i < n; ++i) {
          cos_buf[i] = ch[i] * cl[i] - sh[i] * sl[i];
          sin_buf[i] = sh[i] * cl[i] + ch[i] * sl[i];
        }
      } else {
        if (base != 0.0 && base != dynamic_inv_base) {
          dynamic_inv.resize(static_cast<size_t>(n));
          for (int i = 0; i < n; ++i) dynamic_inv[static_cast<size_t>(i)] = default_inv_freq(base, i);
          dynamic_inv_base = base;
        }
        const std::vector<double>& inv = base == 0.0 ? inv_freq_ : dynamic_inv;
        const double pos = static_cast<double>(position);
        for (int i = 0; i < n; ++i) {
          const double angle = pos * inv[static_cast<size_t>(i)];
          cos_buf[i] = static_cast<float>(std::cos(angle));
          sin_buf[i] = static_cast<float>(std::sin(angle));
        }
      }
      if (inverse)
        for (int i = 0; i < n; ++i) sin_buf[i] = -sin_buf[i];
      if (params_.layout == RopeLayout::kSplitHalf) {
        float* __restrict a = v;
        float* __restrict b = v + n;
        for (int i = 0; i < n; ++i) {
          const float a0 = a[i];
          const float b0 = b[i];
          a[i] = a0 * cos_buf[i] - b0 * sin_buf[i];
          b[i] = a0 * sin_buf[i] + b0 * cos_buf[i];
        }
      } else {
        float* __restrict w = v;
        for (int i = 0; i < n; ++i) {
          const float a0 = w[2 * i];
          const float b0 = w[2 * i + 1];
          w[2 * i] = a0 * cos_buf[i] - b0 * sin_buf[i];
          w[2 * i + 1] = a0 * sin_buf[i] + b0 * cos_buf[i];
        }
      }
    }
  }

  RopeParams params_;
  int pairs_ = 0;
  std::vector<double> inv_freq_;
  double attention_factor_ = 1.0;
  std::shared_ptr<detail::RopeTables> tables_ = std::make_shared<detail::RopeTables>();
};

}  // namespace e8kv::transform
