// THE field table: every scalar field of CacheLayout and of Config, written once. It drives
//   Config::parse and Config::describe (src/config.cpp; describe round-trips parse),
//   Config::validate's per-field checks and make_layout (the Config -> CacheLayout copy),
//   the container's layout record: write, read, validate and layout_difference
//   (src/container/layout_record.cpp; docs/format.md §2.2 lists the same offsets + 48).
// Internal to the library (not installed): the spec keys and record offsets are documented in
// config.hpp and docs/format.md, the table is how the code keeps them in one place.
//
// A row is one of
//   SHAPE (ModelShape member, CacheLayout member, accepted values, record offset, wire, since)
//   SHARED(Config member, CacheLayout member, spec key, accepted values, record offset, wire, since)
//   CONFIG(Config member, spec key, accepted values)   -- not part of the layout record
// where the accepted values are a kind from field_kinds.hpp, the offset is within the 128-byte
// layout record (bytes no field of a version covers are reserved and must be 0), and `since` is
// v1 or since(version, the value older versions mean). A user of the table defines the three
// row macros (E8KV_FIELD_IGNORE drops a class) and expands E8KV_LAYOUT_FIELDS(SHAPE, SHARED,
// CONFIG). Rows are in describe() order.
//
// Not in the table (their semantics are code): the per-layer codecs of CacheLayout (the
// record's variable part, from Config::layer_rate), the RoPE frequency factors (a CONFIG row for
// the spec; in the record's variable part from version 6), rope.head_dim of a layout (always the
// model's head_dim), tier_centered's dependence on the tier, centring and the key frame, and the
// relations between fields (n_q_heads a multiple of n_kv_heads,
// rotary_dim <= head_dim, layer_rates one per layer).
//
// Adding a field: one row, plus its meaning where it is used. Example, the key frame: its row
//   SHARED(key_frame, key_frame, "rope", named<transform::KeyFrame>(kKeyFrameSince), 18, wire::u8, v1)
// sits in the byte that held keys_pre_rope (post 0, pre 1: unchanged files) and its id 2
// (residual) needs format version 3 (kKeyFrameSince), so the writer picks version 3 for it and
// older versions refuse it.
#pragma once

#include "config_field_kinds.hpp"

namespace e8kv::detail::fields {

inline constexpr EnumName kRopeLayoutNames[] = {{"split-half"}, {"interleaved"}};
/// The format version each key frame needs: post (0) and pre (1) are version 1 (the byte was
/// keys_pre_rope), residual (2) came with version 3.
inline constexpr uint16_t kKeyFrameSince[] = {1, 1, 3};
inline constexpr EnumName kRopeScalingNames[] = {{"none"}, {"linear"}, {"dynamic"}, {"llama3"}, {"yarn"}};
inline constexpr EnumName kAggregationNames[] = {{"mean"}, {"max"}};

/// Bytes of the fixed layout record (the per-layer codecs follow it).
inline constexpr size_t kLayoutRecordBytes = 128;

}  // namespace e8kv::detail::fields

#define E8KV_FIELD_IGNORE(...)

// clang-format off
#define E8KV_LAYOUT_FIELDS(SHAPE, SHARED, CONFIG)                                                                    \
  SHAPE(n_layers, n_layers, ints(0, 4096), 0, wire::u32, v1)                                                         \
  SHAPE(n_kv_heads, n_kv_heads, ints(1, 4096), 4, wire::u32, v1)                                                     \
  SHAPE(n_q_heads, n_q_heads, ints(1, 65536), 8, wire::u32, v1)                                                      \
  SHAPE(head_dim, head_dim, head_dims(), 12, wire::u32, v1)                                                          \
  CONFIG(key_codec, "key", named<quant::Codec>())                                                                    \
  CONFIG(value_codec, "value", named<quant::Codec>())                                                                \
  CONFIG(eviction_rate, "evict", fraction_below_one())                                                               \
  CONFIG(fp16_tier, "fp16_tier", fraction_below_one())                                                               \
  CONFIG(code_tier, "code_tier", fraction_below_one())                                                               \
  SHARED(tier_key_codec, tier_key_codec, "tier_key", named<quant::Codec>(), 58, wire::u8, since(5, 0))               \
  SHARED(tier_value_codec, tier_value_codec, "tier_value", named<quant::Codec>(), 59, wire::u8, since(5, 0))         \
  SHARED(tier_center, tier_centered, "tier_center", flag(), 23, wire::u8, since(6, 0))                               \
  CONFIG(sinks, "sinks", ints(0, kIntMax))                                                                           \
  CONFIG(recent_window, "recent", ints(0, kIntMax))                                                                  \
  CONFIG(scorer, "scorer", named<select::ScorerKind>())                                                              \
  CONFIG(obs_window, "window", ints(1, kIntMax))                                                                     \
  CONFIG(pool_kernel, "pool", odd_ints(1, kIntMax))                                                                  \
  CONFIG(protect_boundary, "protect", ints(0, kIntMax))                                                              \
  SHARED(key_frame, key_frame, "rope", named<transform::KeyFrame>(kKeyFrameSince), 18, wire::u8, v1)               \
  SHARED(key_gain, key_gain, "key_gain", named<quant::GainPolicy>(), 16, wire::u8, v1)                               \
  SHARED(value_gain, value_gain, "value_gain", named<quant::GainPolicy>(), 17, wire::u8, v1)                         \
  SHARED(key_scale, key_scale, "key_scale", positive(), 24, wire::f32, v1)                                           \
  SHARED(value_scale, value_scale, "value_scale", positive(), 28, wire::f32, v1)                                     \
  SHARED(residual_length, residual_length, "residual", ints(0, kIntMax), 36, wire::i32, v1)                          \
  SHARED(flush_block, flush_block, "flush", ints(1, kIntMax), 40, wire::i32, v1)                                     \
  SHARED(per_head_selection, per_head_positions, "per_head", flag(), 19, wire::u8, v1)                               \
  CONFIG(shared_selection, "shared", flag())                                                                         \
  CONFIG(layer_adaptive_eviction, "evict_layers", flag())                                                            \
  CONFIG(fp16_sinks, "fp16_sinks", flag())                                                                           \
  SHARED(center, center, "center", flag(), 20, wire::u8, v1)                                                         \
  SHARED(mean_tokens, mean_tokens, "mean_tokens", ints(1, kIntMax), 44, wire::i32, v1)                               \
  SHARED(query_weighted_keys, query_weighted_keys, "qweight", flag(), 21, wire::u8, since(2, 0))                     \
  SHARED(gain_bits, gain_bits, "gain_bits", one_of(8, 16), 22, wire::u8, since(2, 16))                               \
  CONFIG(gqa_aggregation, "gqa", names<select::Aggregation>(kAggregationNames))                                      \
  CONFIG(head_aggregation, "head_agg", names<select::Aggregation>(kAggregationNames))                                \
  CONFIG(scorer_seed, "scorer_seed", seed())                                                                         \
  SHARED(rotation_seed, rotation_seed, "seed", seed(), 48, wire::u64, v1)                                            \
  SHARED(softmax_scale, softmax_scale, "softmax_scale", finite(), 32, wire::f32, v1)                                 \
  CONFIG(layer_rates, "layer_rates", rates())                                                                        \
  CONFIG(rate_budget, "budget", rate_budget_bits())                                                                  \
  CONFIG(index_budget, "index_budget", index_budget_bits())                                                          \
  SHARED(rope.layout, rope.layout, "rope_layout", names<transform::RopeLayout>(kRopeLayoutNames), 56, wire::u8, v1)  \
  SHARED(rope.scaling, rope.scaling, "rope_scaling", names<transform::RopeScaling>(kRopeScalingNames), 57, wire::u8, \
         v1)                                                                                                         \
  SHARED(rope.head_dim, rope.head_dim, "rope_head_dim", ints(0, 1024), 60, wire::i32, v1)                            \
  SHARED(rope.rotary_dim, rope.rotary_dim, "rope_dim", ints(0, 1024), 64, wire::i32, v1)                             \
  SHARED(rope.original_max_position, rope.original_max_position, "rope_original_max_position", ints(0, kIntMax),   \
         68, wire::i32, v1)                                                                                          \
  SHARED(rope.theta, rope.theta, "rope_theta", finite(), 72, wire::f64, v1)                                          \
  SHARED(rope.factor, rope.factor, "rope_factor", finite(), 80, wire::f64, v1)                                       \
  SHARED(rope.low_freq_factor, rope.low_freq_factor, "rope_low_freq_factor", finite(), 88, wire::f64, v1)            \
  SHARED(rope.high_freq_factor, rope.high_freq_factor, "rope_high_freq_factor", finite(), 96, wire::f64, v1)         \
  SHARED(rope.beta_fast, rope.beta_fast, "rope_beta_fast", finite(), 104, wire::f64, v1)                             \
  SHARED(rope.beta_slow, rope.beta_slow, "rope_beta_slow", finite(), 112, wire::f64, v1)                             \
  SHARED(rope.attention_factor, rope.attention_factor, "rope_attention_factor", finite(), 120, wire::f64, v1)     \
  CONFIG(rope.freq_factors, "rope_freq_factors", positive_floats())
// clang-format on

namespace e8kv::detail::fields {

// The record's fields do not overlap and fit in it (checked when this header compiles).
struct RecordSpan {
  size_t offset, bytes;
};
#define E8KV_RECORD_SPAN(member, kind, offset, w, since_) RecordSpan{offset, wire_bytes(w)},
#define E8KV_RECORD_SPAN_SHAPE(shape_member, member, kind, offset, w, since_) E8KV_RECORD_SPAN(member, kind, offset, w, since_)
#define E8KV_RECORD_SPAN_SHARED(config_member, member, key, kind, offset, w, since_) \
  E8KV_RECORD_SPAN(member, kind, offset, w, since_)
inline constexpr RecordSpan kRecordSpans[] = {
    E8KV_LAYOUT_FIELDS(E8KV_RECORD_SPAN_SHAPE, E8KV_RECORD_SPAN_SHARED, E8KV_FIELD_IGNORE)};
#undef E8KV_RECORD_SPAN_SHARED
#undef E8KV_RECORD_SPAN_SHAPE
#undef E8KV_RECORD_SPAN

constexpr bool record_spans_are_disjoint() {
  constexpr size_t n = sizeof(kRecordSpans) / sizeof(kRecordSpans[0]);
  for (size_t i = 0; i < n; ++i) {
    if (kRecordSpans[i].offset + kRecordSpans[i].bytes > kLayoutRecordBytes) return false;
    if (kRecordSpans[i].offset % kRecordSpans[i].bytes != 0) return false;  // naturally aligned
    for (size_t j = i + 1; j < n; ++j)
      if (kRecordSpans[i].offset < kRecordSpans[j].offset + kRecordSpans[j].bytes &&
          kRecordSpans[j].offset < kRecordSpans[i].offset + kRecordSpans[i].bytes)
        return false;
  }
  return true;
}
static_assert(record_spans_are_disjoint(), "layout record fields overlap, leave the record or are misaligned");

}  // namespace e8kv::detail::fields
