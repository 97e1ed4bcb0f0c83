// Rate allocation: where a bit budget goes across layers and K/V (issue 15, item 2).
//
// Every layer's keys and values are coded by one of a few block codes (2, 3 or 4 bits per
// element). Layers differ several-fold in how much their code errors move the attention output,
// so spending the same bits everywhere wastes them. The model used here, calibration-free and
// computed at compress time from the prefill and the observation queries:
//
//   error(layer) = S_K · D(key codec) + S_V · D(value codec)
//
// D(c) is a code's relative distortion E‖x − x̂‖² / E‖x‖² on the rotated (near-Gaussian)
// vectors it codes; S_K and S_V estimate the attention output's error energy per unit of
// relative distortion, to first order and with independent per-token errors:
//   values: ΔO = Σ_t p_t·e_t            E‖ΔO‖² = Σ_t p_t²·‖v_t − μ_V‖²·D
//   keys:   Δs_t = τ·q·e_t, ΔO = Σ_t p_t·Δs_t·(v_t − O)
//                                       E‖ΔO‖² = Σ_t p_t²·τ²·‖q‖²·‖k_t − R_t·μ_K‖²/d·‖v_t − O‖²·D
// (p the softmax of the observation queries, τ the softmax scale, μ the centring means the
// codecs subtract, the key error isotropic in the rotated domain), summed over the observation
// queries and heads. Three things the SmolLM2 eval showed to matter (docs/accuracy.md, "Rate
// allocation"): errors are relative (divided by Σ‖O‖²: a layer's absolute output energy grows
// with depth, and absolute energies put every bit in the last layers); tokens kept in fp16 (the
// sinks, which take much of the softmax mass) carry no error; query-weighted keys shrink the key
// term by what their channel scales save. An allocator then minimises Σ error over the layers
// under the budget: every step buys one bit per element for the (layer, K or V) whose error
// falls the most, which is optimal while each item's distortion is convex in its rate.
#pragma once

#include <cstdint>
#include <vector>

#include "e8kv/cache/kv_view.hpp"
#include "e8kv/config.hpp"
#include "e8kv/transform/rope.hpp"

namespace e8kv::select {

/// Error energy of one layer's attention output, relative to the output's energy, per unit of
/// relative distortion of its keys and of its values (the S_K, S_V above).
struct LayerSensitivity {
  double key = 0.0;
  double value = 0.0;
};

/// One code the allocator may give a layer's keys or values.
struct RateOption {
  quant::Codec codec = quant::Codec::kE8P;
  int bits = 2;             ///< index bits per element (gains and the rest are the same for all)
  double distortion = 1.0;  ///< relative distortion D
};

/// The block codes of 2, 3 and 4 bits per element (E8P, Rvq3, Rvq4) with their relative
/// distortion at `head_dim`, measured once per head_dim on fixed-seed Gaussian vectors through the
/// library's per-vector codec (norm-preserving gain, unit scale). Ordered by bits.
const std::vector<RateOption>& block_rate_options(int head_dim);

/// What the sensitivity of a layer is computed from. keys and values: [n, kv_heads, d], in the
/// engine's basis (post-RoPE keys); positions: n positions (strictly increasing). queries: the
/// observation queries [w, q_heads, d] post-RoPE, or null for the key-key proxy (the layer's last
/// min(n, 8) keys stand in for queries, for every head of their group); query_positions: w
/// positions, or null for the chunk's last w. Keys are centred on their pre-RoPE mean (rope
/// non-null; null: keys centred in their own frame), values on theirs, when `center`.
struct SensitivityInput {
  TensorView keys, values;
  const int32_t* positions = nullptr;
  const TensorView* queries = nullptr;
  const int32_t* query_positions = nullptr;
  int q_heads = 0;
  float softmax_scale = 0.f;
  bool center = true;
  const transform::Rope* rope = nullptr;
  int max_queries = 8;  ///< the last max_queries observation queries are used (cost: w·q_heads·n·d)
  /// Leading tokens that stay fp16 (Config::fp16_sinks): they carry no code error. Attention
  /// sinks take much of the softmax mass, so counting their (absent) errors would swamp the rest.
  int64_t fp16_prefix = 0;
  /// Config::query_weighted_keys: the key term shrinks by what the channel scales save,
  /// (Σ_i √(Q_i·R_i))² / (Σ Q_i · Σ R_i) per head (Q, R: query and key residual energy per channel,
  /// RoPE pairs averaged when `rope` is given).
  bool query_weighted_keys = false;
};

/// S_K and S_V of one layer. Throws e8kv::Error on inconsistent shapes.
LayerSensitivity estimate_sensitivity(const SensitivityInput& in);

/// Codes per layer that minimise Σ_l S_K(l)·D(key) + S_V(l)·D(value) with the mean index bits
/// per element over the free layers' keys and values <= budget_bits. `layer_tokens` (optional,
/// one per layer, >= 0) weighs each layer's elements by the tokens it codes (eviction spread over
/// layers keeps different counts); empty: every layer weighs the same. `fixed[l]` (optional, one
/// per layer) keeps a layer at `fixed_rate[l]` outside the budget (protected fp16 layers). Starts
/// every free item at the cheapest option and buys bits in the order of error removed per
/// element-bit (per bit, unweighted); ties go to the lower layer, keys before values. Throws
/// e8kv::Error when the budget is below the cheapest option or an input is non-finite or
/// negative. The result's mean rate is the largest one <= budget this order reaches (unweighted:
/// exactly the budget when budget·2·layers is a whole number of bit steps).
std::vector<LayerRate> allocate_rates(const std::vector<LayerSensitivity>& sensitivity,
                                      const std::vector<RateOption>& options, double budget_bits,
                                      const std::vector<bool>& fixed = {},
                                      const std::vector<LayerRate>& fixed_rate = {},
                                      const std::vector<int64_t>& layer_tokens = {});

/// Mean index bits per element of the free (not fixed) layers of a rate profile, each layer
/// weighed by layer_tokens (empty: alike).
double mean_index_bits(const std::vector<LayerRate>& rates, const std::vector<RateOption>& options,
                       const std::vector<bool>& fixed = {}, const std::vector<int64_t>& layer_tokens = {});

}  // namespace e8kv::select
