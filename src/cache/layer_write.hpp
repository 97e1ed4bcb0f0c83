// Writing a compressed cache: new tokens enter the fp16 window, whole blocks of it are coded
// (means, channel scales and gain references estimated on the way). The compressor is the only
// caller; internal (not installed).
//
// Every write is planned in full before the cache changes (the codes, gains, means and scales it
// will add are computed aside), its allocations are made next (capacities only), and the commit
// neither allocates nor throws: a call that fails leaves the cache exactly as it was.
#pragma once

#include <cstdint>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"

namespace e8kv::detail {

/// The new tokens of one layer, validated and rounded to fp16, before anything is written.
struct LayerInput {
  std::vector<std::vector<int32_t>> positions;      ///< per position set: the kept tokens' positions
  std::vector<std::vector<uint16_t>> keys, values;  ///< per KV head: those tokens' rows, fp16 bits
  /// Per position set: indices into positions[s] (ascending) of the tokens pinned in fp16 for
  /// good — the sequence's first `sinks` with fp16_sinks, and the fp16 tier. As many in every set
  /// (the layer has one pinned count).
  std::vector<std::vector<int64_t>> pinned;
  /// The code tier (Config::code_tier), apart from the tokens above: per set the promoted tokens'
  /// positions (ascending, after every tier token the set stores; as many in every set), per KV
  /// head their rows (fp16 bits). Empty when none is promoted.
  std::vector<std::vector<int32_t>> tier_positions;
  std::vector<std::vector<uint16_t>> tier_keys, tier_values;
  int64_t given = 0;  ///< tokens given to the layer, before eviction
  std::vector<std::vector<float>> query_energy;  ///< per head (query-weighted keys), or empty
};

/// One layer's write: planned by the constructor, then reserve() and commit().
class LayerWrite {
 public:
  /// Plans writing `input` to `layer` and every flush it triggers. May throw; the cache is untouched.
  LayerWrite(const CompressedKV& cache, int layer, LayerInput input);
  /// Makes the allocations commit() needs; changes capacities only, never contents. exact: the
  /// touched buffers end up holding exactly what they store (compress, extend); otherwise code
  /// buffers grow by a sixteenth at a time (append).
  void reserve(CompressedKV& cache, bool exact);
  /// Applies the planned write. Needs reserve() first; never allocates, never throws.
  void commit(CompressedKV& cache) noexcept;

 private:
  struct HeadPlan {
    std::vector<uint8_t> key_codes, value_codes;
    std::vector<uint16_t> key_gains, value_gains;     // gain_bits 16
    std::vector<uint8_t> key_gain_codes, value_gain_codes;  // gain_bits 8
    std::vector<uint16_t> key_mean, value_mean, key_channel_scale;  // set by this write (first flush)
    uint16_t key_gain_ref = 0, value_gain_ref = 0;    // set by this write (first flush)
    std::vector<uint16_t> window_keys, window_values;  // the window after the write (rebuilt, exact)
    std::vector<uint8_t> tier_key_codes, tier_value_codes;  // the code tier's new tokens
    std::vector<uint16_t> tier_key_gains, tier_value_gains;
  };
  struct SetPlan {
    std::vector<int32_t> coded_positions;   // window tokens coded by this write, in order
    std::vector<int32_t> window_positions;  // the set's window after the write (when rebuilt)
  };

  /// Codes the write's tier tokens; after the flush plan, so that a centred tier finds the
  /// head's means (fixing them here when neither the head nor this write has any yet).
  void plan_code_tier(const CompressedKV& cache);
  /// Whether a head holds the means of the kinds asked for.
  static bool has_means(const CompressedKV::HeadData& hd, bool keys, bool values) {
    return (!keys || !hd.key_mean.empty()) && (!values || !hd.value_mean.empty());
  }
  /// Fixes the means of the kinds asked for from the given rows (fp16 bits; keys post-RoPE at
  /// `positions`, RoPE removed unless the key frame is post-RoPE), rounded to fp16, into hp.
  static void set_means(const CacheCodecs& codecs, const std::vector<const uint16_t*>& keys,
                        const std::vector<const uint16_t*>& values, const std::vector<int32_t>& positions, bool k,
                        bool v, HeadPlan& hp);
  /// The first up-to-`limit` unpinned tokens that set s's window holds after this write (head h's
  /// rows and their positions).
  void window_rows_after(const CompressedKV& cache, size_t s, int h, size_t limit, std::vector<const uint16_t*>& keys,
                         std::vector<const uint16_t*>& values, std::vector<int32_t>& positions) const;

  int layer_;
  LayerInput input_;
  // Per set, the window after the write in order: the old pinned tokens, the new pinned ones, the
  // old unpinned ones, the new unpinned ones. An entry below the old window's size indexes it,
  // w_old + j the new token j. Empty when no new token is pinned: the order is then the identity.
  std::vector<std::vector<int64_t>> order_;
  int64_t source(size_t set, int64_t i) const { return order_.empty() ? i : order_[set][static_cast<size_t>(i)]; }
  int64_t pinned_after_ = 0;
  // The window is rebuilt (new vectors of exact size, swapped in) when tokens are coded or more
  // than one arrives; a lone appended token without a flush is pushed in place.
  bool rebuild_window_ = false;
  bool energy_consumed_ = false;  // every head has its channel scales after this write
  std::vector<SetPlan> sets_;
  std::vector<HeadPlan> heads_;
};

}  // namespace e8kv::detail
