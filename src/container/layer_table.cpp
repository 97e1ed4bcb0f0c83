// The layer table (src/container/layer_table.hpp) and the geometry of a layer's chunks
// (src/container/format.hpp): what the writer checks and writes per layer, and what the reader
// parses and sizes.
#include "container/layer_table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "container/header.hpp"
#include "container/layout_record.hpp"
#include "e8kv/numeric/half.hpp"

namespace e8kv::container {

using io::check;
using io::fail;
using io::sat_add;
using io::sat_mul;

// ---- geometry --------------------------------------------------------------------------------------

CodecGeometry geometry(quant::Codec c, int head_dim, int gain_bits) {
  CodecGeometry g;
  if (c == quant::Codec::kFp16) {
    g.width = 2;
    g.cols = head_dim;
    g.code_bytes = static_cast<size_t>(2 * head_dim);
    g.has_gain = false;
  } else {
    g.width = quant::index_bits(c) / 8;
    g.cols = head_dim / 8;
    g.code_bytes = static_cast<size_t>(g.width) * static_cast<size_t>(g.cols);
    g.has_gain = true;
    g.gain_width = gain_bits == 8 ? 1 : 2;
  }
  return g;
}

ChunkRows chunk_rows(int64_t chunk, int64_t chunk_tokens, int64_t coded, int64_t tier, int64_t window) {
  const int64_t n = coded + tier + window;
  const int64_t before_window = coded + tier;
  ChunkRows r;
  r.lo = std::min(chunk * chunk_tokens, n);
  r.hi = std::min(r.lo + chunk_tokens, n);
  r.coded_lo = std::min(r.lo, coded);
  r.coded_hi = std::min(r.hi, coded);
  r.tier_lo = std::min(std::max(r.lo, coded), before_window) - coded;
  r.tier_hi = std::min(std::max(r.hi, coded), before_window) - coded;
  r.window_lo = std::max(r.lo, before_window) - before_window;
  r.window_hi = std::max(r.hi, before_window) - before_window;
  return r;
}

std::vector<ChunkRows> chunk_rows_of(const LayerCounts& c, int64_t chunk, int64_t chunk_tokens) {
  std::vector<ChunkRows> rows(c.coded.size());
  for (size_t s = 0; s < rows.size(); ++s)
    rows[s] = chunk_rows(chunk, chunk_tokens, c.coded[s], c.tier[s], c.window[s]);
  return rows;
}

std::vector<StreamPlan> cache_chunk_plans(const CacheLayout& L, int l, const std::vector<ChunkRows>& rows,
                                          uint16_t version) {
  const size_t sets = rows.size();
  const CodecGeometry kg = key_geometry(L, l), vg = value_geometry(L, l);
  std::vector<StreamPlan> plans;
  StreamShape pos{{}, 1, 4};
  for (const auto& r : rows) pos.segment_rows.push_back(r.hi - r.lo);
  plans.push_back({StreamKind::kPositions, pos});
  auto per_head = [&](StreamKind k, int64_t cols, int width, Part part) {
    StreamShape sh{{}, cols, width};
    for (int h = 0; h < L.n_kv_heads; ++h)
      sh.segment_rows.push_back(rows[sets == 1 ? 0 : static_cast<size_t>(h)].count(part));
    plans.push_back({k, sh});
  };
  per_head(StreamKind::kKeyCodes, kg.cols, kg.width, Part::kCoded);
  per_head(StreamKind::kValueCodes, vg.cols, vg.width, Part::kCoded);
  per_head(StreamKind::kKeyGains, kg.has_gain ? 1 : 0, kg.gain_width == 1 ? 1 : 2, Part::kCoded);
  per_head(StreamKind::kValueGains, vg.has_gain ? 1 : 0, vg.gain_width == 1 ? 1 : 2, Part::kCoded);
  per_head(StreamKind::kWindowKeys, L.head_dim, 2, Part::kWindow);
  per_head(StreamKind::kWindowValues, L.head_dim, 2, Part::kWindow);
  if (version >= kCodeTierSince) {
    const CodecGeometry tk = tier_geometry(L, true), tv = tier_geometry(L, false);
    per_head(StreamKind::kTierKeyCodes, tk.cols, tk.width, Part::kTier);
    per_head(StreamKind::kTierValueCodes, tv.cols, tv.width, Part::kTier);
    per_head(StreamKind::kTierKeyGains, tk.has_gain ? 1 : 0, 2, Part::kTier);
    per_head(StreamKind::kTierValueGains, tv.has_gain ? 1 : 0, 2, Part::kTier);
  }
  return plans;
}

uint64_t cache_chunk_raw_bytes(const CacheLayout& L, int l, const LayerCounts& c, int64_t chunk, int64_t chunk_tokens) {
  const size_t sets = c.coded.size();
  uint64_t b = 0;
  for (size_t s = 0; s < sets; ++s) {
    const ChunkRows r = chunk_rows(chunk, chunk_tokens, c.coded[s], c.tier[s], c.window[s]);
    b = sat_add(b, 4 * static_cast<uint64_t>(r.hi - r.lo));  // positions
    const uint64_t heads = sets == 1 ? static_cast<uint64_t>(L.n_kv_heads) : 1;
    b = sat_add(b, sat_mul(heads, layer_head_bytes(L, l, r.coded(), r.tier(), r.window())));
  }
  return b;
}

void check_positions(const std::vector<int32_t>& coded, const std::vector<int32_t>& window, int64_t pinned, int layer,
                     size_t set, uint16_t version) {
  const size_t np = static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(pinned, 0), static_cast<int64_t>(window.size())));
  auto increasing = [&](const int32_t* p, size_t n, int32_t prev, const char* order) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i] <= prev)
        fail(fmt::format("positions of layer {}, set {} are not >= 0 and strictly increasing ({}): {} after {}", layer,
                         set, order, p[i], prev));
      prev = p[i];
    }
  };
  if (version < kInterleavedPinnedSince) {
    // One run: pinned window tokens, coded tokens, the other window tokens.
    const char* order = "pinned window tokens, coded tokens, window tokens";
    increasing(window.data(), np, -1, order);
    increasing(coded.data(), coded.size(), np > 0 ? window[np - 1] : -1, order);
    increasing(window.data() + np, window.size() - np,
               !coded.empty() ? coded.back() : (np > 0 ? window[np - 1] : -1), order);
    return;
  }
  // Version 4: the pinned tokens (sinks, fp16 tier) are one increasing run at any positions, the
  // coded tokens then the other window tokens another; no position in both.
  increasing(window.data(), np, -1, "pinned window tokens");
  const char* order = "coded tokens, then unpinned window tokens";
  increasing(coded.data(), coded.size(), -1, order);
  increasing(window.data() + np, window.size() - np, coded.empty() ? -1 : coded.back(), order);
  size_t c = 0, w = np;
  for (size_t i = 0; i < np; ++i) {
    const int32_t pos = window[i];
    while (c < coded.size() && coded[c] < pos) ++c;
    while (w < window.size() && window[w] < pos) ++w;
    if ((c < coded.size() && coded[c] == pos) || (w < window.size() && window[w] == pos))
      fail(fmt::format("positions of layer {}, set {}: position {} is both pinned and stored elsewhere", layer, set,
                       pos));
  }
}

void check_tier_positions(const std::vector<int32_t>& tier, const std::vector<int32_t>& coded,
                          const std::vector<int32_t>& window, int64_t pinned, int layer, size_t set) {
  int32_t prev = -1;
  for (const int32_t p : tier) {
    if (p <= prev)
      fail(fmt::format("code-tier positions of layer {}, set {} are not >= 0 and strictly increasing: {} after {}",
                       layer, set, p, prev));
    prev = p;
  }
  // The coded tokens, the pinned window tokens and the other window tokens are each one
  // increasing run (check_positions): a merge against each finds a shared position.
  auto disjoint = [&](const int32_t* p, size_t n, const char* what) {
    size_t i = 0, j = 0;
    while (i < tier.size() && j < n) {
      if (tier[i] < p[j]) ++i;
      else if (p[j] < tier[i]) ++j;
      else
        fail(fmt::format("positions of layer {}, set {}: position {} is both a code-tier token and a {} token", layer,
                         set, p[j], what));
    }
  };
  const size_t np =
      static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(pinned, 0), static_cast<int64_t>(window.size())));
  disjoint(coded.data(), coded.size(), "coded");
  disjoint(window.data(), np, "pinned window");
  disjoint(window.data() + np, window.size() - np, "window");
}

uint16_t positions_version(const CompressedKV& cache) {
  for (int l = 0; l < cache.n_layers(); ++l) {
    const auto& ld = cache.layer(l);
    for (size_t s = 0; s < ld.positions.size(); ++s) {
      const auto& w = ld.window_positions[s];
      const size_t np = static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(ld.pinned, 0), static_cast<int64_t>(w.size())));
      if (np == 0) continue;
      const int32_t last_pinned = w[np - 1];
      if ((!ld.positions[s].empty() && ld.positions[s].front() <= last_pinned) || (w.size() > np && w[np] <= last_pinned))
        return kInterleavedPinnedSince;
    }
  }
  return 1;
}

// ---- writing ----------------------------------------------------------------------------------------

namespace {

bool positive_fp16(uint16_t bits) {
  const float f = fp16_bits_to_float(bits);
  return std::isfinite(f) && f > 0.f;
}

// fp16 bits of an infinity or a NaN have every exponent bit set.
bool finite_fp16(uint16_t bits) { return (bits & 0x7C00u) != 0x7C00u; }

// Fails at the first non-finite value of `n` fp16 values at `p` (any alignment: the fp16 codec's
// codes are bytes). Attention refuses a non-finite key (its scores leave the float range) and
// answers NaN for a non-finite value; no compress or append stores one (inputs are checked
// finite and within fp16).
void check_finite_fp16(const uint8_t* p, size_t n, int l, int h, const char* field) {
  auto bits = [p](size_t i) {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    return b;
  };
  // A branch-free pass first (it vectorizes: a lossless cache is all fp16), the index on failure.
  unsigned any = 0;
  for (size_t i = 0; i < n; ++i) any |= finite_fp16(bits(i)) ? 0u : 1u;
  if (any == 0) return;
  size_t i = 0;
  while (finite_fp16(bits(i))) ++i;
  fail(fmt::format("layer {} head {}: {}[{}] is not finite (fp16 bits {:#06x}); accepted: finite values", l, h, field,
                   i, bits(i)));
}
void check_finite_fp16(const std::vector<uint16_t>& v, int l, int h, const char* field) {
  check_finite_fp16(reinterpret_cast<const uint8_t*>(v.data()), v.size(), l, h, field);
}

// The vectors of head h of a layer agree with its set's counts and the codecs, and hold what
// attention and decompression can use.
void check_head(const CacheLayout& L, int l, int h, const CompressedKV::HeadData& hd, size_t coded, size_t tier,
                size_t window) {
  const CodecGeometry kg = key_geometry(L, l), vg = value_geometry(L, l);
  const size_t d = static_cast<size_t>(L.head_dim);
  const bool sizes_ok = hd.key_codes.size() == coded * kg.code_bytes && hd.value_codes.size() == coded * vg.code_bytes &&
                        hd.key_gains.size() == (kg.gain_width == 2 ? coded : 0) &&
                        hd.value_gains.size() == (vg.gain_width == 2 ? coded : 0) &&
                        hd.key_gain_codes.size() == (kg.gain_width == 1 ? coded : 0) &&
                        hd.value_gain_codes.size() == (vg.gain_width == 1 ? coded : 0) &&
                        hd.window_keys.size() == window * d && hd.window_values.size() == window * d;
  check(sizes_ok, "layer {} head {}: code, gain or window sizes disagree with its position counts and codecs", l, h);
  const CodecGeometry tk = tier_geometry(L, true), tv = tier_geometry(L, false);
  const bool tier_ok = hd.tier_key_codes.size() == tier * tk.code_bytes &&
                       hd.tier_value_codes.size() == tier * tv.code_bytes && hd.tier_key_gains.size() == tier &&
                       hd.tier_value_gains.size() == tier;
  check(tier_ok,
        "layer {} head {}: code-tier code or gain sizes disagree with its {} tier positions and the tier codecs", l,
        h, tier);
  check((hd.key_mean.empty() || hd.key_mean.size() == d) && (hd.value_mean.empty() || hd.value_mean.size() == d),
        "layer {} head {}: key_mean and value_mean must be empty or hold head_dim values", l, h);
  for (uint16_t ref : {hd.key_gain_ref, hd.value_gain_ref})
    check(ref == 0 || (L.gain_bits == 8 && positive_fp16(ref)),
          "layer {} head {}: gain references must be 0 or (gain_bits 8) positive and finite", l, h);
  check((kg.gain_width != 1 || coded == 0 || hd.key_gain_ref != 0) &&
            (vg.gain_width != 1 || coded == 0 || hd.value_gain_ref != 0),
        "layer {} head {}: 8-bit gains need their reference", l, h);
  check(hd.key_channel_scale.empty() || (hd.key_channel_scale.size() == d && L.query_weighted_keys),
        "layer {} head {}: key_channel_scale must be empty or hold head_dim values (and needs "
        "layout.query_weighted_keys)",
        l, h);
  check(std::all_of(hd.key_channel_scale.begin(), hd.key_channel_scale.end(), positive_fp16),
        "layer {} head {}: key channel scales must be positive and finite", l, h);
  // A centred code tier decodes around the head's means (CacheCodecs::decode_tier): the
  // compressor sets both before it codes the head's first tier token.
  check(tier == 0 || !L.tier_centered || (!hd.key_mean.empty() && !hd.value_mean.empty()),
        "layer {} head {}: {} code-tier tokens are centred (layout tier_centered) but key_mean or value_mean is empty",
        l, h, tier);
  // Every stored fp16 value: what attention and decompression read besides the block codes
  // (any index decodes) and the 8-bit gain codes (any code is a finite factor).
  check_finite_fp16(hd.window_keys, l, h, "window_keys");
  check_finite_fp16(hd.window_values, l, h, "window_values");
  check_finite_fp16(hd.key_mean, l, h, "key_mean");
  check_finite_fp16(hd.value_mean, l, h, "value_mean");
  check_finite_fp16(hd.key_gains, l, h, "key_gains");
  check_finite_fp16(hd.value_gains, l, h, "value_gains");
  check_finite_fp16(hd.tier_key_gains, l, h, "tier_key_gains");
  check_finite_fp16(hd.tier_value_gains, l, h, "tier_value_gains");
  if (!kg.has_gain) check_finite_fp16(hd.key_codes.data(), hd.key_codes.size() / 2, l, h, "key_codes (fp16 codec)");
  if (!vg.has_gain)
    check_finite_fp16(hd.value_codes.data(), hd.value_codes.size() / 2, l, h, "value_codes (fp16 codec)");
}

}  // namespace

void check_layer_heads(const CacheLayout& L, int l, const CompressedKV::LayerData& ld) {
  const size_t sets = ld.positions.size(), H = static_cast<size_t>(L.n_kv_heads);
  check(ld.heads.size() == H && (sets == 1 || sets == H) && ld.window_positions.size() == sets &&
            (ld.tier_positions.empty() || ld.tier_positions.size() == sets),
        "layer {} has {} position sets ({} window, {} code-tier) and {} heads; the layout has {} heads", l, sets,
        ld.window_positions.size(), ld.tier_positions.size(), ld.heads.size(), H);
  for (size_t h = 0; h < H; ++h) {
    const size_t s = sets == 1 ? 0 : h;
    const size_t tier = ld.tier_positions.empty() ? 0 : ld.tier_positions[s].size();
    check_head(L, l, static_cast<int>(h), ld.heads[h], ld.positions[s].size(), tier, ld.window_positions[s].size());
  }
}

LayerCounts checked_counts(const CompressedKV& cache, int l, int64_t chunk_tokens) {
  return checked_counts(cache.layout(), cache.layer(l), l, chunk_tokens);
}

LayerCounts checked_counts(const CacheLayout& L, const CompressedKV::LayerData& ld, int l, int64_t chunk_tokens) {
  const size_t sets = position_sets(L);
  // No tier sets at all stands for empty ones (CompressedKV::tier_positions reads it so).
  const bool tier_sets = !ld.tier_positions.empty();
  check(ld.positions.size() == sets && ld.window_positions.size() == sets &&
            (!tier_sets || ld.tier_positions.size() == sets) && ld.heads.size() == static_cast<size_t>(L.n_kv_heads),
        "layer {} has {} position sets ({} code-tier sets) and {} heads; the layout needs {} and {}", l,
        ld.positions.size(), ld.tier_positions.size(), ld.heads.size(), sets, L.n_kv_heads);
  static const std::vector<int32_t> kNoTier;
  LayerCounts c;
  c.original_tokens = ld.original_tokens;
  c.pinned = ld.pinned;
  for (size_t s = 0; s < sets; ++s) {
    const std::vector<int32_t>& tier = tier_sets ? ld.tier_positions[s] : kNoTier;
    c.coded.push_back(static_cast<int64_t>(ld.positions[s].size()));
    c.tier.push_back(static_cast<int64_t>(tier.size()));
    c.window.push_back(static_cast<int64_t>(ld.window_positions[s].size()));
    check(c.stored(s) <= kMaxSetTokens, "layer {} set {} stores {} tokens; accepted: at most {}", l, s, c.stored(s),
          kMaxSetTokens);
    check(c.tier[s] == 0 || L.layer_has_code_tier(l),
          "layer {} set {} has {} code-tier tokens but the layer has no code tier (tier codecs {}/{}, layer codecs "
          "{}/{}); accepted: 0",
          l, s, c.tier[s], quant::to_string(L.tier_key_codec), quant::to_string(L.tier_value_codec),
          quant::to_string(L.key_codec[static_cast<size_t>(l)]),
          quant::to_string(L.value_codec[static_cast<size_t>(l)]));
    check(c.pinned >= 0 && c.pinned <= c.window[s], "layer {}: pinned {} is outside [0, window tokens of set {} = {}]",
          l, c.pinned, s, c.window[s]);
    check_positions(ld.positions[s], ld.window_positions[s], c.pinned, l, s, kFormatVersion);
    check_tier_positions(tier, ld.positions[s], ld.window_positions[s], c.pinned, l, s);
  }
  check(c.original_tokens >= c.max_stored(), "layer {}: original_tokens {} is below the stored token count {}", l,
        c.original_tokens, c.max_stored());
  check_layer_heads(L, l, ld);
  check(ld.query_energy.empty() || (ld.query_energy.size() == static_cast<size_t>(L.n_kv_heads) && L.query_weighted_keys),
        "layer {}: query_energy must be empty or hold one vector per KV head (and needs layout.query_weighted_keys)", l);
  for (const auto& e : ld.query_energy)
    check(e.size() == static_cast<size_t>(L.head_dim), "layer {}: query_energy vectors must hold head_dim values", l);
  c.n_chunks = chunks_for(c.max_stored(), chunk_tokens);
  return c;
}

void write_layer_entry(io::ByteWriter& w, const LayerCounts& c, const CompressedKV::LayerData& ld, uint16_t version) {
  w.i64(c.original_tokens);
  w.i64(c.pinned);
  w.u64(static_cast<uint64_t>(c.first_chunk));
  w.u64(static_cast<uint64_t>(c.n_chunks));
  for (size_t s = 0; s < c.coded.size(); ++s) {
    w.u64(static_cast<uint64_t>(c.coded[s]));
    w.u64(static_cast<uint64_t>(c.window[s]));
    if (version >= kCodeTierSince) w.u64(static_cast<uint64_t>(c.tier[s]));
  }
  // Per head the centring means (u16 lengths, fp16 values).
  for (const auto& hd : ld.heads) {
    w.u16(static_cast<uint16_t>(hd.key_mean.size()));
    w.u16(static_cast<uint16_t>(hd.value_mean.size()));
    w.bytes(hd.key_mean.data(), 2 * hd.key_mean.size());
    w.bytes(hd.value_mean.data(), 2 * hd.value_mean.size());
  }
  if (version < 2) return;
  // Version 2, per head: the key channel scales (fp16), the pending query energy (f32; kept
  // until the first flush turns it into scales, which a reader that appends needs) and the
  // references of the 8-bit gains (fp16; 0 while unset or with fp16 gains).
  for (size_t h = 0; h < ld.heads.size(); ++h) {
    const auto& hd = ld.heads[h];
    w.u16(static_cast<uint16_t>(hd.key_channel_scale.size()));
    w.bytes(hd.key_channel_scale.data(), 2 * hd.key_channel_scale.size());
    const size_t ne = ld.query_energy.empty() ? 0 : ld.query_energy[h].size();
    w.u16(static_cast<uint16_t>(ne));
    for (size_t i = 0; i < ne; ++i) w.f32(ld.query_energy[h][i]);
    w.u16(hd.key_gain_ref);
    w.u16(hd.value_gain_ref);
  }
}

size_t layer_entry_bytes(const CompressedKV::LayerData& ld, size_t sets, uint16_t version) {
  size_t b = kLayerEntryFixedBytes + layer_entry_set_bytes(version) * sets;
  for (const auto& hd : ld.heads) b += 4 + 2 * (hd.key_mean.size() + hd.value_mean.size());
  if (version >= 2)
    for (size_t h = 0; h < ld.heads.size(); ++h)
      b += 8 + 2 * ld.heads[h].key_channel_scale.size() + (ld.query_energy.empty() ? 0 : 4 * ld.query_energy[h].size());
  return b;
}

// ---- sizes ------------------------------------------------------------------------------------------

uint64_t codecs_bytes(const CacheLayout& L) {
  // CacheCodecs: rotations (sign words + multipliers), quantizers, RoPE tables (4096 entries of
  // rotary pairs × cos, sin), plus slack for the objects themselves.
  const uint64_t d = static_cast<uint64_t>(L.head_dim);
  uint64_t b = sat_mul(sat_mul(static_cast<uint64_t>(L.n_layers), static_cast<uint64_t>(L.n_kv_heads)),
                       2 * (d * 4 + d / 8 + 128));
  b = sat_add(b, sat_mul(static_cast<uint64_t>(L.n_layers) + 1, 256));  // quantizers: per layer, and the code tier's
  b = sat_add(b, 4096 * d * 4 + 65536);
  return b;
}

uint64_t layer_head_bytes(const CacheLayout& L, int l, int64_t coded, int64_t tier, int64_t window) {
  const CodecGeometry kg = key_geometry(L, l), vg = value_geometry(L, l);
  const CodecGeometry tk = tier_geometry(L, true), tv = tier_geometry(L, false);
  const uint64_t per_coded = kg.code_bytes + vg.code_bytes + static_cast<uint64_t>(kg.gain_width + vg.gain_width);
  const uint64_t per_tier = tk.code_bytes + tv.code_bytes + 2 * 2;  // fp16 gains
  const uint64_t per_window = 4 * static_cast<uint64_t>(L.head_dim);
  const uint64_t b =
      sat_add(sat_mul(static_cast<uint64_t>(coded), per_coded), sat_mul(static_cast<uint64_t>(tier), per_tier));
  return sat_add(b, sat_mul(static_cast<uint64_t>(window), per_window));
}

uint64_t layer_range_bytes(const CacheLayout& L, int l, const LayerCounts& c, int64_t begin, int64_t end) {
  const size_t sets = c.coded.size();
  uint64_t b = sizeof(CompressedKV::LayerData) + sets * 3 * sizeof(std::vector<int32_t>) +
               static_cast<uint64_t>(L.n_kv_heads) * sizeof(CompressedKV::HeadData);
  for (int h = 0; h < L.n_kv_heads; ++h) {
    const size_t s = sets == 1 ? 0 : static_cast<size_t>(h);
    const int64_t n = c.stored(s);
    const int64_t lo = std::min(begin, n), hi = std::min(end, n);
    const int64_t coded = std::max<int64_t>(0, std::min(hi, c.coded[s]) - lo);
    const int64_t tier = std::max<int64_t>(0, std::min(hi, c.coded[s] + c.tier[s]) - std::max(lo, c.coded[s]));
    const int64_t window = (hi - lo) - coded - tier;
    b = sat_add(b, layer_head_bytes(L, l, coded, tier, window));
  }
  for (size_t s = 0; s < sets; ++s) {
    const int64_t n = c.stored(s);
    b = sat_add(b, 4 * static_cast<uint64_t>(std::min(end, n) - std::min(begin, n)));
  }
  return b;
}

// ---- parsing ----------------------------------------------------------------------------------------

namespace {

// Token counts, pinned and chunk range of layer l (the range is checked by the caller).
LayerCounts read_counts(io::ByteReader& r, const CacheLayout& L, int l, size_t sets, uint16_t version, uint64_t& first,
                        uint64_t& count) {
  LayerCounts c;
  c.original_tokens = r.i64("original_tokens");
  c.pinned = r.i64("pinned");
  first = r.u64("first_chunk");
  count = r.u64("n_chunks");
  for (size_t s = 0; s < sets; ++s) {
    const uint64_t coded = r.u64("coded_tokens"), window = r.u64("window_tokens");
    const uint64_t tier = version >= kCodeTierSince ? r.u64("tier_tokens") : 0;
    check(coded <= static_cast<uint64_t>(kMaxSetTokens) && window <= static_cast<uint64_t>(kMaxSetTokens) - coded &&
              tier <= static_cast<uint64_t>(kMaxSetTokens) - coded - window,
          "layer {} set {}: token counts {} + {} + {} (coded, window, tier) exceed {}", l, s, coded, window, tier,
          kMaxSetTokens);
    // Only a layer whose rates the tier raises holds tier tokens (CacheLayout::layer_has_code_tier).
    check(tier == 0 || L.layer_has_code_tier(l),
          "layer {} set {}: tier_tokens {} in a layer without a code tier (tier codecs {}/{}, layer codecs {}/{}); "
          "accepted: 0",
          l, s, tier, quant::to_string(L.tier_key_codec), quant::to_string(L.tier_value_codec),
          quant::to_string(L.key_codec[static_cast<size_t>(l)]),
          quant::to_string(L.value_codec[static_cast<size_t>(l)]));
    c.coded.push_back(static_cast<int64_t>(coded));
    c.tier.push_back(static_cast<int64_t>(tier));
    c.window.push_back(static_cast<int64_t>(window));
  }
  check(c.original_tokens >= c.max_stored() && c.original_tokens <= kMaxOriginalTokens,
        "layer {}: original_tokens {} is outside [its {} stored tokens, {}]", l, c.original_tokens, c.max_stored(),
        kMaxOriginalTokens);
  for (size_t s = 0; s < sets; ++s)
    check(c.pinned >= 0 && c.pinned <= c.window[s], "layer {}: pinned {} is outside [0, window tokens of set {} = {}]",
          l, c.pinned, s, c.window[s]);
  return c;
}

// `n` fp16 values (checked against what is left).
std::vector<uint16_t> read_fp16s(io::ByteReader& r, size_t n, const char* field) {
  std::vector<uint16_t> v(n);
  const uint8_t* p = r.take(2 * n, field);
  if (n > 0) std::memcpy(v.data(), p, 2 * n);
  return v;
}

// Version 2 fields of one head: key channel scales, pending query energy, gain references.
void read_v2_head(io::ByteReader& r, const CacheLayout& L, int l, int h, Header& hdr, uint64_t& decoded) {
  const uint16_t sl = r.u16("key_channel_scale length");
  check(sl == 0 || (sl == L.head_dim && L.query_weighted_keys),
        "layer {} head {}: key_channel_scale length {} must be 0 or head_dim {} (with query_weighted_keys)", l, h, sl,
        L.head_dim);
  std::vector<uint16_t> scales = read_fp16s(r, sl, "key channel scales");
  check(std::all_of(scales.begin(), scales.end(), positive_fp16),
        "layer {} head {}: key channel scales must be positive and finite", l, h);
  hdr.key_channel_scale.back()[static_cast<size_t>(h)] = std::move(scales);
  auto& energies = hdr.query_energy.back();
  const uint16_t el = r.u16("query_energy length");
  check(el == 0 || (el == L.head_dim && L.query_weighted_keys),
        "layer {} head {}: query_energy length {} must be 0 or head_dim {} (with query_weighted_keys)", l, h, el,
        L.head_dim);
  if (h > 0)
    check((el != 0) == !energies.empty(), "layer {}: query_energy must be given for all heads or none", l);
  r.need(4 * static_cast<size_t>(el), "query energy");
  if (el > 0) {
    std::vector<float> e(el);
    for (auto& x : e) {
      x = r.f32("query energy");
      check(std::isfinite(x) && x >= 0.f, "layer {}: query energies must be finite and >= 0", l);
    }
    energies.push_back(std::move(e));
  }
  decoded = sat_add(decoded, 2 * static_cast<uint64_t>(sl) + 4 * static_cast<uint64_t>(el));
  for (auto& ref : hdr.gain_ref.back()[static_cast<size_t>(h)]) {
    ref = r.u16("gain reference");
    check(ref == 0 || (L.gain_bits == 8 && positive_fp16(ref)),
          "layer {} head {}: gain reference must be 0 or (gain_bits 8) positive and finite", l, h);
  }
}

}  // namespace

void parse_cache_tables(io::ByteReader& r, Header& h, uint64_t n_chunks) {
  const int64_t T = h.info.chunk_tokens;
  const uint16_t version = static_cast<uint16_t>(h.info.format_version);
  CacheLayout& L = h.info.layout;
  L = read_layout_record(r, version);
  const size_t sets = position_sets(L);
  const size_t H = static_cast<size_t>(L.n_kv_heads);
  r.need(static_cast<size_t>(L.n_layers) * (kLayerEntryFixedBytes + layer_entry_set_bytes(version) * sets + 4 * H),
         "layer table");
  uint64_t decoded = codecs_bytes(L);
  int64_t next_chunk = 0;
  for (int l = 0; l < L.n_layers; ++l) {
    uint64_t first = 0, count = 0;
    LayerCounts c = read_counts(r, L, l, sets, version, first, count);
    h.key_mean.emplace_back(H);
    h.value_mean.emplace_back(H);
    for (size_t hh = 0; hh < H; ++hh) {
      const uint16_t kl = r.u16("key_mean length"), vl = r.u16("value_mean length");
      check((kl == 0 || kl == L.head_dim) && (vl == 0 || vl == L.head_dim),
            "layer {} head {}: mean lengths {}, {} must be 0 or head_dim {}", l, hh, kl, vl, L.head_dim);
      h.key_mean.back()[hh] = read_fp16s(r, kl, "means");
      h.value_mean.back()[hh] = read_fp16s(r, vl, "means");
      decoded = sat_add(decoded, 2 * (static_cast<uint64_t>(kl) + vl));
    }
    h.key_channel_scale.emplace_back(H);
    h.query_energy.emplace_back();
    h.gain_ref.emplace_back(H, std::array<uint16_t, 2>{0, 0});
    if (h.info.format_version >= 2)
      for (int hh = 0; hh < L.n_kv_heads; ++hh) read_v2_head(r, L, l, hh, h, decoded);
    c.n_chunks = chunks_for(c.max_stored(), T);
    check(first == static_cast<uint64_t>(next_chunk) && count == static_cast<uint64_t>(c.n_chunks),
          "layer {}: chunk range (first {}, count {}) should be ({}, {})", l, first, count, next_chunk, c.n_chunks);
    c.first_chunk = next_chunk;
    next_chunk += c.n_chunks;
    check(static_cast<uint64_t>(next_chunk) <= n_chunks, "the layer table needs more chunks than the header's n_chunks {}",
          n_chunks);
    decoded = sat_add(decoded, layer_range_bytes(L, l, c, 0, c.max_stored()));
    for (int64_t ci = 0; ci < c.n_chunks; ++ci) {
      h.chunk_raw.push_back(cache_chunk_raw_bytes(L, l, c, ci, T));
      h.max_chunk_raw = std::max(h.max_chunk_raw, h.chunk_raw.back());
    }
    ContainerInfo::Layer info;
    info.original_tokens = c.original_tokens;
    info.pinned = c.pinned;
    info.coded_tokens = c.coded;
    info.tier_tokens = c.tier;
    info.window_tokens = c.window;
    info.first_chunk = c.first_chunk;
    info.n_chunks = c.n_chunks;
    h.info.layers.push_back(std::move(info));
    h.layers.push_back(std::move(c));
  }
  check(static_cast<uint64_t>(next_chunk) == n_chunks, "the header's n_chunks {} differs from the layer table's {}",
        n_chunks, next_chunk);
  h.info.decoded_bytes = decoded;
}

}  // namespace e8kv::container
