// Host conversion between CompressedKV (one object per sequence) and the paged format the CUDA
// kernels read (cache/paged_layout.hpp, docs/paged_layout.md): one layer of a ragged batch,
// its pages, CSR block table and fp16 residual window. CPU-only code; tests and benchmarks use
// it to feed the kernels and to compare their results with the CPU reference.
#pragma once

#include <cstdint>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/cache/paged_layout.hpp"

namespace e8kv {

/// A CSR block table on the host: sequence b owns pages page_indices[page_indptr[b] ..
/// page_indptr[b+1]) of a pool of n_pages pages, and coded_lens[b] tokens.
struct PagedBlockTable {
  int32_t page_tokens = 16;
  std::vector<int32_t> page_indptr;
  std::vector<int32_t> page_indices;
  std::vector<int32_t> coded_lens;
  int32_t n_pages = 0;

  int batch() const { return static_cast<int>(coded_lens.size()); }
  /// Physical slot (page · page_tokens + t % page_tokens) of token t of sequence b.
  int64_t slot(int b, int64_t t) const;
};

/// Gives sequence b ceil(capacity_tokens[b] / page_tokens) pages (coded_lens = capacity_tokens),
/// from a pool of those pages plus `spare_pages` never referenced. shuffle_seed == 0 hands out
/// pages in order; any other seed hands out a seeded permutation of the pool (non-contiguous
/// pages, as an engine's allocator produces). Throws e8kv::Error on negative sizes or when the
/// pool would exceed 2^31 − 1 pages.
PagedBlockTable make_block_table(const std::vector<int32_t>& capacity_tokens, int page_tokens,
                                 uint64_t shuffle_seed = 0, int spare_pages = 0);

/// The page layout of `layer` of caches made with `codecs` (per-head position sets when the
/// layout keeps per-head positions; 8-bit gain entries when the layout's gain_bits is 8). Throws
/// e8kv::Error for a codec without a fixed index width.
PagedLayout paged_layout_for(const CacheCodecs& codecs, int layer, int page_tokens);

/// Rotation sign masks of one layer for the kernels: [kv_head][kind: 0 key, 1 value][words],
/// hadamard_sign_words(head_dim) words each.
std::vector<uint32_t> packed_sign_bits(const CacheCodecs& codecs, int layer);

/// The cos/sin table decode attention uses for the mean term of RoPE-residual keys
/// (cuda/paged_kv.cuh, LayerCodecParams::rope_delta_table): for Δ in [0, kRopeDeltaRows) and
/// every pair slot p < head_dim/2, (cos, sin) of Δ·θ_p split into tf32 high and low parts:
/// [Δ][head_dim/2][cos hi, sin hi, cos lo, sin lo] floats, zeros for p at or beyond the rotary
/// pairs (a fixed row stride, no bounds test in the kernel). Rows below 1024 are the low level
/// of CacheCodecs::rope_table() (the CPU's own factors); rows from 1024 compose it with the
/// middle level's first row in double. Empty when the cache has no rotary pairs.
std::vector<float> rope_delta_table(const CacheCodecs& codecs);

struct PagedOptions {
  int page_tokens = 16;
  uint64_t shuffle_seed = 0;  ///< see make_block_table
  int spare_pages = 0;
  uint8_t pool_fill = 0;      ///< byte written to every unused slot and spare page (poison in tests)
  int window_capacity = -1;   ///< tokens per (sequence, head) in the window buffers; -1 = the largest window
};

/// One layer of a ragged batch in the paged format (host memory). The GPU kernels take the pool,
/// the block table, the window and the means (cuda/paged_kv.cuh).
struct PagedLayer {
  PagedLayout layout;
  PagedBlockTable table;
  std::vector<uint8_t> pool;  ///< table.n_pages · layout.page_bytes
  /// Residual fp16 windows: [batch][kv_heads][window_capacity][head_dim] fp16 bits.
  int32_t window_capacity = 0;
  std::vector<uint16_t> window_keys, window_values;
  std::vector<int32_t> window_lens;       ///< [batch]
  std::vector<int32_t> window_positions;  ///< [batch][layout.position_sets][window_capacity]
  std::vector<int32_t> window_pinned;     ///< [batch] leading window tokens pinned in fp16 (sinks)
  /// Centring means (CacheLayout::center): [batch][kv_heads][2: key, value][head_dim] fp16 bits,
  /// keys in their coding frame; zeros where a sequence has none yet or the kind is fp16-coded.
  /// Empty when the layout does not centre.
  std::vector<uint16_t> means;
  /// Key channel scales S (CacheLayout::query_weighted_keys): [batch][kv_heads][head_dim] fp16
  /// bits; a row of zeros stands for none (S = I: no queries, or no coded token yet). Empty when
  /// the layout does not weight keys or the key codec is fp16.
  std::vector<uint16_t> key_scales;
  /// References of the 8-bit gain codes (gain_bits 8): [batch][kv_heads][2: key, value] fp16 bits,
  /// 0 while not set (no coded token yet). Empty for fp16 gains.
  std::vector<uint16_t> gain_refs;
  /// Host-only bookkeeping that makes from_paged(to_paged(x)) equal x byte for byte (never read by
  /// the kernels): per sequence the layer's pending query energies (LayerData::query_energy,
  /// kv_heads × head_dim floats, or empty) and its original token count.
  std::vector<std::vector<float>> query_energy;
  std::vector<int64_t> original_tokens;

  int64_t window_token_stride() const { return layout.head_dim; }
  int64_t window_head_stride() const { return static_cast<int64_t>(window_capacity) * layout.head_dim; }
  int64_t window_seq_stride() const { return window_head_stride() * layout.kv_heads; }
};

/// Copies `layer` of every cache into the paged format. All caches must share one CacheCodecs;
/// with per-head positions every head of a sequence must hold as many coded (and window) tokens.
/// Throws e8kv::Error otherwise.
PagedLayer to_paged(const std::vector<const CompressedKV*>& batch, int layer, const PagedOptions& options = {});

/// The inverse: replaces `layer` of every cache (codes, gains or gain codes and references,
/// positions, window, pinned count, means and key channel scales of sequences with coded tokens,
/// pending query energies) with the contents of `paged`; original_tokens is paged's when it
/// carries them, else at least the stored token count. The caches must use the codecs the layout
/// was made for (checked: code sizes, gain width, heads, position sets, centring, key weighting).
/// from_paged(to_paged(caches)) leaves every cache byte-identical (tested through the container).
void from_paged(const PagedLayer& paged, int layer, const std::vector<CompressedKV*>& batch);

}  // namespace e8kv
