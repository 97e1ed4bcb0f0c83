// Configuration of the pipeline: the model's KV shape, the Config (codecs, eviction, RoPE,
// window, gains) and the named presets. Config::parse reads the spec strings users type
// ("preset=high,evict=0.5"); describe() writes one back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "e8kv/cache/cache_layout.hpp"
#include "e8kv/quant/codec_basics.hpp"
#include "e8kv/quant/codec_id.hpp"
#include "e8kv/select/eviction.hpp"
#include "e8kv/select/scorer.hpp"
#include "e8kv/transform/rope_params.hpp"

namespace e8kv {

using transform::KeyFrame;

struct ModelShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int n_q_heads = 0;   ///< a multiple of n_kv_heads (GQA); equal = MHA; n_kv_heads = 1 is MQA
  int head_dim = 0;    ///< one of 64, 80, 96, 128, 256
  void validate() const;
};

/// Per-layer override of the key and value codecs (the "rate profile").
struct LayerRate {
  quant::Codec key = quant::Codec::kRvq3;
  quant::Codec value = quant::Codec::kE8P;
};

struct Config {
  // Quantization.
  quant::Codec key_codec = quant::Codec::kRvq3;
  quant::Codec value_codec = quant::Codec::kE8P;
  quant::GainPolicy key_gain = quant::GainPolicy::kNormPreserving;
  quant::GainPolicy value_gain = quant::GainPolicy::kNormPreserving;
  float key_scale = 1.0f;    ///< relative to the code's Gaussian-optimal scale (α = scale·kInputScale·√d)
  float value_scale = 1.0f;
  int protect_boundary = 0;  ///< the first and the last N layers stay fp16
  std::vector<LayerRate> layer_rates;  ///< empty, or one entry per layer (overrides the two codecs)
  /// Rate allocation (select/rate_allocation.hpp), spec key `budget`: when > 0, compress()
  /// chooses each layer's key and value codes among E8P / Rvq3 / Rvq4 (2 / 3 / 4 index bits per
  /// element) so that the cache it returns has bits_per_element() <= this: bits as bytes() counts
  /// them (codes, gains, means, positions, the fp16 window, sinks and tiers, the descriptor) for
  /// the chunk compressed. It measures that side data at the chunk's length (a first pass at the
  /// cheapest codes), solves for the index bits left, and spends them where the observation
  /// queries say errors cost the most. A budget the chunk cannot meet even at the cheapest codes
  /// (a short chunk is mostly fp16 window and sinks) is refused with e8kv::Error giving the
  /// minimum at that length; one above the dearest codes gets them. The cache records the chosen
  /// codes (as layer_rates would; extend and append keep them); key_codec / value_codec are then
  /// unused, layer_rates must be empty. 0: off.
  double rate_budget = 0.0;
  /// The same allocation with the budget in index bits only (spec key `index_budget`, 2 to 4): the
  /// mean index bits per coded element over the unprotected layers' keys and values (with
  /// layer_adaptive_eviction each layer weighs by the tokens it codes) is at most this; gains,
  /// means, positions and the fp16 window come on top. (Before issue 40 this was `budget`.)
  /// Excludes rate_budget. 0: off.
  double index_budget = 0.0;
  uint64_t rotation_seed = 0x5EED'E8C0'DE00'0001ull;  ///< per (layer, head) signs derive from it

  /// The frame keys are coded in (transform::KeyFrame): "residual" (k − R_t·μ), "pre" (RoPE
  /// removed) or "post".
  transform::KeyFrame key_frame = transform::KeyFrame::kRopeResidual;
  transform::RopeParams rope{};

  // Eviction.
  double eviction_rate = 0.0;
  /// The fp16 tier (per-token rates): this fraction of each compress / extend chunk's tokens,
  /// the most important by the scorer among those eviction competes over (not the sinks, not the
  /// last recent_window tokens, only kept ones), stays in fp16 for good, pinned in the window
  /// beside the sinks, at any position; the other kept tokens are coded. 0 (off) to below 1.
  /// Appended tokens are not promoted (they enter the codes through the window). Counted by
  /// bytes() as window rows and positions.
  double fp16_tier = 0.0;
  /// The code tier (per-token rates): the next this fraction of each compress / extend chunk's
  /// tokens by the same scores (after the fp16 tier's, the same candidates) is coded with
  /// tier_key_codec / tier_value_codec (4 bits by default) in a second code stream per head,
  /// while the other kept tokens get the layer's codes. Per token a 4-bit row costs an eighth
  /// (K3V2) to a sixth (K2V2) of an fp16 row's extra bytes, so at equal bytes it reaches six to
  /// eight times the tokens (docs/accuracy.md, "The code tier"). Only in layers where it raises a rate
  /// (CacheLayout::layer_has_code_tier); appended tokens are not promoted. 0 (off) to below 1;
  /// fp16_tier + code_tier below 1. The paged GPU layout refuses caches with a code tier.
  double code_tier = 0.0;
  quant::Codec tier_key_codec = quant::Codec::kRvq4;    ///< a block code (not fp16)
  quant::Codec tier_value_codec = quant::Codec::kRvq4;  ///< a block code (not fp16)
  /// Code the tier's tokens centred, as the layer's codes are (spec key `tier_center`): keys as
  /// the RoPE-residual k − R_t·μ (post-RoPE frame: k − μ), values as v − μ, on the head's means
  /// (CacheLayout::tier_centered). Without it a key offset shared by a head's keys — Qwen2's
  /// k_proj bias reaches ~200 against a token-dependent part of a few units — takes the tier's
  /// bits and its tokens, the most important ones, decode worst (tier-k3v2's KL on
  /// Qwen2.5-Coder-0.5B in llama.cpp: 1.28 uncentred). Applies with `center` and a key frame other
  /// than pre; on by default.
  bool tier_center = true;
  int sinks = 4;
  int recent_window = 32;
  select::ScorerKind scorer = select::ScorerKind::kObservationWindow;
  int obs_window = 32;
  int pool_kernel = 7;
  select::Aggregation gqa_aggregation = select::Aggregation::kMean;
  select::Aggregation head_aggregation = select::Aggregation::kMean;
  bool per_head_selection = false;
  /// One kept set for the whole model: every layer keeps the same tokens of a compress / extend
  /// chunk (engines whose KV cells are shared by all layers, as llama.cpp's, can only restore
  /// such a cache). Each layer's per-token scores (KV heads combined by head_aggregation) are
  /// normalized to sum 1 over the chunk, shifted to a minimum of 0 first when some are negative
  /// (key-norm scores are −‖k‖; a layer whose scores are all equal weighs every token alike),
  /// then averaged over layers; the set is selected once from that average. Excludes
  /// per_head_selection.
  bool shared_selection = false;
  /// Eviction spread over layers: the chunk's evicted-token total stays what eviction_rate gives
  /// every layer, but which layer gives them up is chosen from the scores. Each layer's per-token
  /// scores (KV heads combined by head_aggregation) are normalized to sum 1 over the chunk, as
  /// for shared_selection, and the tokens with the lowest normalized scores over all layers are
  /// evicted (ties: lower layer, then later token); sinks and the recent window stay in every
  /// layer. A layer whose attention is flat (every token a similar share) so keeps more than one
  /// whose attention is concentrated. Needs every layer at the same length; excludes
  /// shared_selection.
  bool layer_adaptive_eviction = false;
  uint64_t scorer_seed = 0;

  // Residual fp16 window for appended tokens, flushed into codes in whole blocks. The latest
  // residual_length + 0..flush_block−1 tokens stay fp16: decoding in memory, where the next token
  // attends its neighbours most, 16 halves K2V2's KL on SmolLM2 for a constant 16 rows per head
  // (+0.2 bits at 1,151 tokens, +0.007 at 32K; docs/accuracy.md, "The recent window"). A state
  // stored at rest and restored into a dense cache gains little from it: parse_at_rest.
  int residual_length = 16;  ///< tokens always left in fp16 after a flush
  int flush_block = 16;     ///< tokens coded per flush (a page of the GPU cache)
  bool fp16_sinks = true;   ///< the first `sinks` tokens stay in fp16 (pinned in the window)
  bool center = true;       ///< code k − μ and v − μ with per-(layer, head) fp16 means
  int mean_tokens = 64;     ///< tokens the means are estimated from (coding waits for them)
  /// Query-weighted keys: scale each key channel pair by (query energy / key energy)^(1/4),
  /// measured on the observation-window queries and the mean tokens, before coding (undone on
  /// decode). It minimizes the expected q·k error rather than ‖k − k̂‖²; needs queries at
  /// compress time (without them keys are coded unscaled). See CacheLayout::query_weighted_keys.
  /// On by default: K3V2's next-token KL on SmolLM2 drops by a third (docs/accuracy.md).
  bool query_weighted_keys = true;
  /// Bits per stored vector gain: 8 (log-domain code, 1/32-octave steps around a per-head
  /// reference; quant/gain_code.hpp) or 16 (fp16). 8 by default: it saves 0.125 bits per element
  /// at head_dim 64 and left SmolLM2's K3V2 KL unchanged (docs/accuracy.md). The paged GPU
  /// layout (cache/paged_kv.hpp) holds either width.
  int gain_bits = 8;

  float softmax_scale = 0.f;  ///< scale of q·k; <= 0 means 1/sqrt(head_dim)

  /// Named presets: lossless, quant-k4v4, quant-k3v3, quant-k4v2, quant-k3v2, quant-k2v2,
  /// tier-k3v2, tier-k2v2 (quant-k3v2 / quant-k2v2 with a 5 % code tier: compress() needs the
  /// observation queries), high, asym, balanced, max. (K3V3 and K4V4: at equal bits, balanced
  /// rates beat K4V2 on SmolLM2.)
  static Config preset(const std::string& name);
  static const char* preset_names();
  /// Reads a spec string: comma-separated key=value items, "preset=NAME" first wherever it
  /// appears (an explicit field always wins over the preset). Keys (the field each one sets):
  ///   key, value (codecs: fp16, e8p2, rvq3, rvq4, ball3, ball4, vor2..4, lm2..4), evict, fp16_tier,
  ///   code_tier, tier_key, tier_value (the code tier's codecs), sinks,
  ///   recent, scorer (obs-window, multi-window, key-key, streaming, random, key-norm), window,
  ///   pool, protect, rope (pre | post), key_gain, value_gain (ls, norm, unbiased), key_scale,
  ///   value_scale, residual, flush, per_head, shared (shared_selection), evict_layers
  ///   (layer_adaptive_eviction), fp16_sinks, center,
  ///   mean_tokens, qweight, gain_bits, gqa (mean | max), head_agg, scorer_seed, seed
  ///   (rotation_seed), softmax_scale,
  ///   layer_rates (key/value per layer, ';' between layers), budget (rate_budget), index_budget, rope_layout (split-half |
  ///   interleaved), rope_scaling (none, linear, dynamic, llama3, yarn), rope_head_dim,
  ///   rope_dim, rope_original_max_position, rope_theta, rope_factor, rope_low_freq_factor,
  ///   rope_high_freq_factor, rope_beta_fast, rope_beta_slow, rope_attention_factor.
  /// Every value is checked as it is read; a malformed or unaccepted one raises e8kv::Error
  /// naming the key and the accepted values.
  static Config parse(const std::string& spec);
  /// parse(spec) for a cache compressed to be stored and later restored into a dense cache (a
  /// sequence state, a transfer between engines): residual_length 0 unless the spec sets
  /// `residual`, since the continuation of a restored state is dense anyway (at rest a 16-token
  /// window moved K3V2's KL 0.0164 → 0.0152 for +0.21 bits at 1,023 tokens).
  static Config parse_at_rest(const std::string& spec);
  /// Throws e8kv::Error naming the field and the accepted values.
  void validate(const ModelShape& shape) const;
  /// Key and value codecs of a layer after boundary protection and the rate profile.
  LayerRate layer_rate(int layer, int n_layers) const;
  /// Every field as a spec string: parse(describe()) reproduces the Config field by field
  /// (floats bit for bit).
  std::string describe() const;
  /// The token scorer compress() runs: scorer, obs_window, pool_kernel, gqa_aggregation,
  /// scorer_seed.
  select::ScorerOptions scorer_options() const;
  /// The eviction compress() applies to a prefill: eviction_rate, sinks, recent_window,
  /// per_head_selection, head_aggregation (evict_count stays −1: rate decides).
  select::EvictionOptions eviction_options() const;
};

/// The CacheLayout of caches made with `config` for a model of `shape` (validates both first):
/// what KVCompressor gives its codecs.
CacheLayout make_layout(const Config& config, const ModelShape& shape);

}  // namespace e8kv
