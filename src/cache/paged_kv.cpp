// Host conversion between CompressedKV and the paged layout of the CUDA kernels.
#include "e8kv/cache/paged_kv.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>

#include "detail/require.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/cuda/rotated_attention_math.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/random.hpp"

namespace e8kv {

int64_t PagedBlockTable::slot(int b, int64_t t) const {
  detail::require(b >= 0 && b < batch(), "PagedBlockTable::slot: sequence {} out of range", b);
  const int64_t pages = page_indptr[static_cast<size_t>(b) + 1] - page_indptr[static_cast<size_t>(b)];
  detail::require(t >= 0 && t < pages * page_tokens, "PagedBlockTable::slot: token {} beyond the pages of sequence {}",
                  t, b);
  return paged_slot(page_indptr.data(), page_indices.data(), b, t, page_tokens);
}

PagedBlockTable make_block_table(const std::vector<int32_t>& capacity_tokens, int page_tokens, uint64_t shuffle_seed,
                                 int spare_pages) {
  detail::require(page_tokens >= 1, "make_block_table: page_tokens must be >= 1, got {}", page_tokens);
  detail::require(spare_pages >= 0, "make_block_table: spare_pages must be >= 0, got {}", spare_pages);
  PagedBlockTable t;
  t.page_tokens = page_tokens;
  t.coded_lens = capacity_tokens;
  t.page_indptr.assign(capacity_tokens.size() + 1, 0);
  int64_t used = 0;
  for (size_t b = 0; b < capacity_tokens.size(); ++b) {
    detail::require(capacity_tokens[b] >= 0, "make_block_table: capacity_tokens[{}] is negative", b);
    used += (static_cast<int64_t>(capacity_tokens[b]) + page_tokens - 1) / page_tokens;
    require(used + spare_pages <= std::numeric_limits<int32_t>::max(), "make_block_table: more than 2^31-1 pages");
    t.page_indptr[b + 1] = static_cast<int32_t>(used);
  }
  t.n_pages = static_cast<int32_t>(used + spare_pages);
  std::vector<int32_t> order(static_cast<size_t>(t.n_pages));
  std::iota(order.begin(), order.end(), 0);
  if (shuffle_seed != 0) {
    // Fisher-Yates with the library's counter-based generator (same table on every platform).
    for (int64_t i = t.n_pages - 1; i > 0; --i) {
      const uint64_t r = random_bits(shuffle_seed, static_cast<uint64_t>(i));
      const int64_t j = static_cast<int64_t>(r % static_cast<uint64_t>(i + 1));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
  }
  t.page_indices.assign(order.begin(), order.begin() + used);
  return t;
}

PagedLayout paged_layout_for(const CacheCodecs& codecs, int layer, int page_tokens) {
  const CacheLayout& L = codecs.layout();
  detail::require(layer >= 0 && layer < L.n_layers, "paged_layout_for: layer {} out of range", layer);
  detail::require(page_tokens >= 1, "paged_layout_for: page_tokens must be >= 1, got {}", page_tokens);
  const quant::Codec kc = L.key_codec[static_cast<size_t>(layer)], vc = L.value_codec[static_cast<size_t>(layer)];
  detail::require(L.gain_bits == 8 || L.gain_bits == 16, "paged_layout_for: gain_bits must be 8 or 16, got {}",
                  L.gain_bits);
  // The pages hold one code stream per head; a code tier (second stream, own codec) has no place
  // in them yet: refused for the whole cache rather than dropped or decoded silently.
  detail::require(!L.has_code_tier(),
                  "paged_layout_for: the cache has a code tier (tier_key {}, tier_value {}); the paged GPU layout does "
                  "not carry one: compress for it without code_tier",
                  quant::to_string(L.tier_key_codec), quant::to_string(L.tier_value_codec));
  const PagedLayout out = make_paged_layout(page_tokens, L.n_kv_heads, L.head_dim, quant::index_bits(kc),
                                            quant::index_bits(vc), L.per_head_positions, L.gain_bits);
  detail::require(out.page_bytes > 0, "paged_layout_for: unsupported shape (head_dim {}, kv_heads {})", L.head_dim,
                  L.n_kv_heads);
  // The layout must agree with the quantizers' own byte counts.
  require(static_cast<size_t>(out.key_code_bytes) == codecs.key_quantizer(layer).code_bytes() &&
              static_cast<size_t>(out.value_code_bytes) == codecs.value_quantizer(layer).code_bytes(),
          "paged_layout_for: code sizes disagree with the quantizers");
  return out;
}

std::vector<uint32_t> packed_sign_bits(const CacheCodecs& codecs, int layer) {
  const CacheLayout& L = codecs.layout();
  detail::require(layer >= 0 && layer < L.n_layers, "packed_sign_bits: layer {} out of range", layer);
  const size_t words = static_cast<size_t>(transform::hadamard_sign_words(L.head_dim));
  std::vector<uint32_t> out(static_cast<size_t>(L.n_kv_heads) * 2 * words);
  for (int h = 0; h < L.n_kv_heads; ++h)
    for (int kind = 0; kind < 2; ++kind) {
      const auto& rot = codecs.rotation(layer, h, kind);
      std::copy(rot.sign_bits(), rot.sign_bits() + words, out.begin() + (static_cast<size_t>(h) * 2 + kind) * words);
    }
  return out;
}

std::vector<float> rope_delta_table(const CacheCodecs& codecs) {
  const int pairs = codecs.rope().rotary_dim() / 2;
  if (pairs == 0) return {};
  const int slots = codecs.layout().head_dim / 2;  // the kernels' fixed row stride
  std::vector<float> out(static_cast<size_t>(kRopeDeltaRows) * static_cast<size_t>(slots) * 4, 0.f);
  const float* table = codecs.rope_table().data();  // [3 levels: 1024, 1024, 2048 rows][pairs][cos, sin]
  const size_t row = static_cast<size_t>(pairs) * 2;
  const float* mid1 = table + (1024 + 1) * row;      // e^{i·1024·θ}
  for (int delta = 0; delta < kRopeDeltaRows; ++delta)
    for (int p = 0; p < pairs; ++p) {
      const float* lo = table + static_cast<size_t>(delta & 1023) * row + 2 * p;
      float c = lo[0], s = lo[1];
      if (delta >= 1024) {
        const double c0 = lo[0], s0 = lo[1], c1 = mid1[2 * p], s1 = mid1[2 * p + 1];
        c = static_cast<float>(c0 * c1 - s0 * s1);
        s = static_cast<float>(c0 * s1 + s0 * c1);
      }
      float* e = &out[(static_cast<size_t>(delta) * slots + static_cast<size_t>(p)) * 4];
      cuda::split_tf32(c, e[0], e[2]);
      cuda::split_tf32(s, e[1], e[3]);
    }
  return out;
}

namespace {

// Number of coded / window tokens of (cache, layer), checking that every head agrees.
void stored_counts(const CompressedKV& c, int layer, int64_t& coded, int64_t& window) {
  const int H = c.layout().n_kv_heads;
  coded = c.coded_tokens(layer, 0);
  window = c.window_tokens(layer, 0);
  for (int h = 1; h < H; ++h)
    detail::require(c.coded_tokens(layer, h) == coded && c.window_tokens(layer, h) == window,
                    "to_paged: per-head position sets of different sizes cannot share pages (layer {})", layer);
}

}  // namespace

PagedLayer to_paged(const std::vector<const CompressedKV*>& batch, int layer, const PagedOptions& options) {
  require(!batch.empty(), "to_paged: empty batch");
  for (const auto* c : batch) require(c != nullptr && c->valid(), "to_paged: null or empty cache in the batch");
  const auto codecs = batch[0]->shared_codecs();
  for (const auto* c : batch)
    require(c->shared_codecs() == codecs, "to_paged: every cache of the batch must share one CacheCodecs");
  const CacheLayout& L = codecs->layout();
  const int H = L.n_kv_heads, d = L.head_dim;
  PagedLayer out;
  out.layout = paged_layout_for(*codecs, layer, options.page_tokens);
  const PagedLayout& PL = out.layout;
  const int B = static_cast<int>(batch.size());
  std::vector<int32_t> coded(static_cast<size_t>(B)), window(static_cast<size_t>(B));
  int64_t max_window = 0;
  for (int b = 0; b < B; ++b) {
    int64_t nc = 0, nw = 0;
    stored_counts(*batch[static_cast<size_t>(b)], layer, nc, nw);
    require(nc <= std::numeric_limits<int32_t>::max() && nw <= std::numeric_limits<int32_t>::max(),
            "to_paged: more than 2^31-1 tokens in one sequence");
    coded[static_cast<size_t>(b)] = static_cast<int32_t>(nc);
    window[static_cast<size_t>(b)] = static_cast<int32_t>(nw);
    max_window = std::max(max_window, nw);
  }
  out.table = make_block_table(coded, options.page_tokens, options.shuffle_seed, options.spare_pages);
  out.pool.assign(static_cast<size_t>(out.table.n_pages) * static_cast<size_t>(PL.page_bytes), options.pool_fill);
  const size_t kcb = static_cast<size_t>(PL.key_code_bytes), vcb = static_cast<size_t>(PL.value_code_bytes);
  for (int b = 0; b < B; ++b) {
    const CompressedKV& c = *batch[static_cast<size_t>(b)];
    const auto& ld = c.layer(layer);
    for (int64_t t = 0; t < coded[static_cast<size_t>(b)]; ++t) {
      const int64_t slot = out.table.slot(b, t);
      uint8_t* page = out.pool.data() + (slot / PL.page_tokens) * PL.page_bytes;
      const int s = static_cast<int>(slot % PL.page_tokens);
      for (int h = 0; h < H; ++h) {
        const auto& hd = ld.heads[static_cast<size_t>(h)];
        std::memcpy(page + PL.key_code_offset(h, s), &hd.key_codes[static_cast<size_t>(t) * kcb], kcb);
        std::memcpy(page + PL.value_code_offset(h, s), &hd.value_codes[static_cast<size_t>(t) * vcb], vcb);
        if (PL.key_gain_bytes == 2) std::memcpy(page + PL.key_gain_offset(h, s), &hd.key_gains[static_cast<size_t>(t)], 2);
        if (PL.key_gain_bytes == 1) page[PL.key_gain_offset(h, s)] = hd.key_gain_codes[static_cast<size_t>(t)];
        if (PL.value_gain_bytes == 2)
          std::memcpy(page + PL.value_gain_offset(h, s), &hd.value_gains[static_cast<size_t>(t)], 2);
        if (PL.value_gain_bytes == 1) page[PL.value_gain_offset(h, s)] = hd.value_gain_codes[static_cast<size_t>(t)];
      }
      for (int set = 0; set < PL.position_sets; ++set) {
        const int32_t p = c.positions(layer, set)[static_cast<size_t>(t)];
        std::memcpy(page + PL.position_offset(set, s), &p, 4);
      }
    }
  }
  out.window_capacity = static_cast<int32_t>(options.window_capacity < 0 ? max_window : options.window_capacity);
  detail::require(out.window_capacity >= max_window,
                  "to_paged: window_capacity {} is smaller than the largest window ({})", out.window_capacity,
                  max_window);
  const size_t cap = static_cast<size_t>(out.window_capacity);
  out.window_keys.assign(static_cast<size_t>(B) * H * cap * d, 0);
  out.window_values.assign(out.window_keys.size(), 0);
  out.window_lens = window;
  out.window_positions.assign(static_cast<size_t>(B) * PL.position_sets * cap, 0);
  out.window_pinned.assign(static_cast<size_t>(B), 0);
  if (L.center) out.means.assign(static_cast<size_t>(B) * H * 2 * d, 0);
  const bool weighted = L.query_weighted_keys && PL.key_gain_bytes != 0;
  if (weighted) out.key_scales.assign(static_cast<size_t>(B) * H * d, 0);
  const bool gain_codes = PL.key_gain_bytes == 1 || PL.value_gain_bytes == 1;
  if (gain_codes) out.gain_refs.assign(static_cast<size_t>(B) * H * 2, 0);
  out.query_energy.resize(static_cast<size_t>(B));
  out.original_tokens.resize(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    const CompressedKV& c = *batch[static_cast<size_t>(b)];
    const auto& ld = c.layer(layer);
    const size_t nw = static_cast<size_t>(window[static_cast<size_t>(b)]);
    out.window_pinned[static_cast<size_t>(b)] = static_cast<int32_t>(ld.pinned);
    for (int h = 0; h < H; ++h) {
      const auto& hd = ld.heads[static_cast<size_t>(h)];
      const size_t base = (static_cast<size_t>(b) * H + h) * cap * d;
      std::copy(hd.window_keys.begin(), hd.window_keys.begin() + nw * d, out.window_keys.begin() + base);
      std::copy(hd.window_values.begin(), hd.window_values.begin() + nw * d, out.window_values.begin() + base);
      if (L.center) {
        const size_t m = (static_cast<size_t>(b) * H + h) * 2 * d;
        require(hd.key_mean.empty() || hd.key_mean.size() == static_cast<size_t>(d), "to_paged: key mean of wrong size");
        require(hd.value_mean.empty() || hd.value_mean.size() == static_cast<size_t>(d), "to_paged: value mean of wrong size");
        std::copy(hd.key_mean.begin(), hd.key_mean.end(), out.means.begin() + m);
        std::copy(hd.value_mean.begin(), hd.value_mean.end(), out.means.begin() + m + d);
      }
      if (!hd.key_channel_scale.empty()) {
        require(weighted && hd.key_channel_scale.size() == static_cast<size_t>(d),
                "to_paged: key channel scales of a layout that does not weight keys, or of wrong size");
        for (uint16_t x : hd.key_channel_scale)
          require((x & 0x7FFFu) != 0, "to_paged: a key channel scale is zero (the paged layout's mark for none)");
        std::copy(hd.key_channel_scale.begin(), hd.key_channel_scale.end(),
                  out.key_scales.begin() + (static_cast<size_t>(b) * H + h) * d);
      }
      if (gain_codes) {
        out.gain_refs[(static_cast<size_t>(b) * H + h) * 2] = hd.key_gain_ref;
        out.gain_refs[(static_cast<size_t>(b) * H + h) * 2 + 1] = hd.value_gain_ref;
      }
    }
    for (const auto& e : ld.query_energy) {
      require(e.size() == static_cast<size_t>(d), "to_paged: pending query energy of wrong size");
      out.query_energy[static_cast<size_t>(b)].insert(out.query_energy[static_cast<size_t>(b)].end(), e.begin(), e.end());
    }
    require(ld.query_energy.empty() || ld.query_energy.size() == static_cast<size_t>(H),
            "to_paged: pending query energies for a different number of heads");
    out.original_tokens[static_cast<size_t>(b)] = ld.original_tokens;
    for (int set = 0; set < PL.position_sets; ++set) {
      const auto& wp = c.window_positions(layer, set);
      std::copy(wp.begin(), wp.end(), out.window_positions.begin() + (static_cast<size_t>(b) * PL.position_sets + set) * cap);
    }
  }
  return out;
}

void from_paged(const PagedLayer& paged, int layer, const std::vector<CompressedKV*>& batch) {
  const PagedLayout& PL = paged.layout;
  detail::require(static_cast<int>(batch.size()) == paged.table.batch(),
                  "from_paged: {} caches given for a batch of {}", batch.size(), paged.table.batch());
  require(paged.pool.size() == static_cast<size_t>(paged.table.n_pages) * static_cast<size_t>(PL.page_bytes),
          "from_paged: pool size disagrees with the block table");
  const int H = PL.kv_heads, d = PL.head_dim;
  const size_t kcb = static_cast<size_t>(PL.key_code_bytes), vcb = static_cast<size_t>(PL.value_code_bytes);
  const size_t cap = static_cast<size_t>(paged.window_capacity);
  const size_t sets = static_cast<size_t>(PL.position_sets);
  require(paged.window_pinned.empty() || paged.window_pinned.size() == batch.size(),
          "from_paged: window_pinned must be empty or hold one count per sequence");
  require(paged.means.empty() || paged.means.size() == batch.size() * H * 2 * d,
          "from_paged: means must be empty or batch x heads x 2 x head_dim");
  require(paged.key_scales.empty() || paged.key_scales.size() == batch.size() * H * d,
          "from_paged: key_scales must be empty or batch x heads x head_dim");
  require(paged.gain_refs.empty() || paged.gain_refs.size() == batch.size() * H * 2,
          "from_paged: gain_refs must be empty or batch x heads x 2");
  require(paged.query_energy.empty() || paged.query_energy.size() == batch.size(),
          "from_paged: query_energy must be empty or hold one entry per sequence");
  require(paged.original_tokens.empty() || paged.original_tokens.size() == batch.size(),
          "from_paged: original_tokens must be empty or hold one count per sequence");
  const bool gain_codes = PL.key_gain_bytes == 1 || PL.value_gain_bytes == 1;
  require(paged.window_lens.size() == batch.size() && paged.window_positions.size() >= batch.size() * sets * cap &&
              paged.window_keys.size() >= batch.size() * H * cap * d &&
              paged.window_values.size() >= batch.size() * H * cap * d,
          "from_paged: window buffers are smaller than batch x heads x window_capacity");
  for (size_t b = 0; b < batch.size(); ++b) {
    require(batch[b] != nullptr && batch[b]->valid(), "from_paged: null or empty cache in the batch");
    CompressedKV& c = *batch[b];
    const PagedLayout expect = paged_layout_for(c.codecs(), layer, PL.page_tokens);
    detail::require(expect.page_bytes == PL.page_bytes && expect.key_code_bytes == PL.key_code_bytes &&
                        expect.value_code_bytes == PL.value_code_bytes && expect.kv_heads == H &&
                        expect.key_gain_bytes == PL.key_gain_bytes && expect.value_gain_bytes == PL.value_gain_bytes &&
                        expect.position_sets == PL.position_sets,
                    "from_paged: cache {} was made with different codecs than the paged layer", b);
    auto& ld = e8kv::detail::CacheStorage::layer(c, layer);
    detail::require(static_cast<int>(ld.positions.size()) == PL.position_sets,
                    "from_paged: cache {} has a different number of position sets", b);
    detail::require(paged.means.empty() != c.layout().center,
                    "from_paged: cache {} and the paged layer disagree on centring", b);
    const bool key_coded = PL.key_gain_bytes != 0, value_coded = PL.value_gain_bytes != 0;
    const int64_t n = paged.table.coded_lens[b];
    const int64_t nw = paged.window_lens[b];
    require(nw >= 0 && static_cast<size_t>(nw) <= cap, "from_paged: window length out of range");
    for (int set = 0; set < PL.position_sets; ++set) {
      ld.positions[static_cast<size_t>(set)].assign(static_cast<size_t>(n), 0);
      const int32_t* wp = paged.window_positions.data() + (b * sets + static_cast<size_t>(set)) * cap;
      ld.window_positions[static_cast<size_t>(set)].assign(wp, wp + nw);
    }
    for (int h = 0; h < H; ++h) {
      auto& hd = ld.heads[static_cast<size_t>(h)];
      hd.key_codes.assign(static_cast<size_t>(n) * kcb, 0);
      hd.value_codes.assign(static_cast<size_t>(n) * vcb, 0);
      hd.key_gains.assign(PL.key_gain_bytes == 2 ? static_cast<size_t>(n) : 0, 0);
      hd.value_gains.assign(PL.value_gain_bytes == 2 ? static_cast<size_t>(n) : 0, 0);
      hd.key_gain_codes.assign(PL.key_gain_bytes == 1 ? static_cast<size_t>(n) : 0, 0);
      hd.value_gain_codes.assign(PL.value_gain_bytes == 1 ? static_cast<size_t>(n) : 0, 0);
      const size_t hrow = b * H + static_cast<size_t>(h);
      hd.key_gain_ref = gain_codes && !paged.gain_refs.empty() ? paged.gain_refs[hrow * 2] : 0;
      hd.value_gain_ref = gain_codes && !paged.gain_refs.empty() ? paged.gain_refs[hrow * 2 + 1] : 0;
      hd.key_channel_scale.clear();
      if (!paged.key_scales.empty() && n > 0) {
        const auto sc = paged.key_scales.begin() + static_cast<std::ptrdiff_t>(hrow * d);
        if (std::any_of(sc, sc + d, [](uint16_t x) { return x != 0; })) hd.key_channel_scale.assign(sc, sc + d);
      }
      const size_t base = (b * H + static_cast<size_t>(h)) * cap * d;
      hd.window_keys.assign(paged.window_keys.begin() + base, paged.window_keys.begin() + base + nw * d);
      hd.window_values.assign(paged.window_values.begin() + base, paged.window_values.begin() + base + nw * d);
      // Means exist once a sequence has coded tokens (the first flush computes them).
      hd.key_mean.clear();
      hd.value_mean.clear();
      if (!paged.means.empty() && n > 0) {
        const auto m = paged.means.begin() + static_cast<std::ptrdiff_t>((b * H + static_cast<size_t>(h)) * 2 * d);
        if (key_coded) hd.key_mean.assign(m, m + d);
        if (value_coded) hd.value_mean.assign(m + d, m + 2 * d);
      }
    }
    ld.pinned = paged.window_pinned.empty() ? 0 : paged.window_pinned[b];
    require(ld.pinned >= 0 && ld.pinned <= nw, "from_paged: pinned count out of range");
    for (int64_t t = 0; t < n; ++t) {
      const int64_t slot = paged.table.slot(static_cast<int>(b), t);
      const uint8_t* page = paged.pool.data() + (slot / PL.page_tokens) * PL.page_bytes;
      const int s = static_cast<int>(slot % PL.page_tokens);
      for (int h = 0; h < H; ++h) {
        auto& hd = ld.heads[static_cast<size_t>(h)];
        std::memcpy(&hd.key_codes[static_cast<size_t>(t) * kcb], page + PL.key_code_offset(h, s), kcb);
        std::memcpy(&hd.value_codes[static_cast<size_t>(t) * vcb], page + PL.value_code_offset(h, s), vcb);
        if (PL.key_gain_bytes == 2) std::memcpy(&hd.key_gains[static_cast<size_t>(t)], page + PL.key_gain_offset(h, s), 2);
        if (PL.key_gain_bytes == 1) hd.key_gain_codes[static_cast<size_t>(t)] = page[PL.key_gain_offset(h, s)];
        if (PL.value_gain_bytes == 2)
          std::memcpy(&hd.value_gains[static_cast<size_t>(t)], page + PL.value_gain_offset(h, s), 2);
        if (PL.value_gain_bytes == 1) hd.value_gain_codes[static_cast<size_t>(t)] = page[PL.value_gain_offset(h, s)];
      }
      for (int set = 0; set < PL.position_sets; ++set)
        std::memcpy(&ld.positions[static_cast<size_t>(set)][static_cast<size_t>(t)], page + PL.position_offset(set, s), 4);
    }
    ld.query_energy.clear();
    if (!paged.query_energy.empty() && !paged.query_energy[b].empty()) {
      detail::require(paged.query_energy[b].size() == static_cast<size_t>(H) * d,
                      "from_paged: query_energy of sequence {} must hold kv_heads x head_dim floats", b);
      for (int h = 0; h < H; ++h)
        ld.query_energy.emplace_back(paged.query_energy[b].begin() + static_cast<std::ptrdiff_t>(h) * d,
                                     paged.query_energy[b].begin() + static_cast<std::ptrdiff_t>(h + 1) * d);
    }
    ld.original_tokens = paged.original_tokens.empty() ? std::max<int64_t>(ld.original_tokens, n + nw)
                                                       : paged.original_tokens[b];
  }
}

}  // namespace e8kv
