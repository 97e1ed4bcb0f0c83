// Layout of the paged compressed KV cache of one layer (docs/paged_layout.md), shared by the
// host conversion helpers (cache/paged_kv.hpp) and the CUDA kernels (cuda/paged_kv.cuh).
//
// A page holds P tokens ("slots") of one layer for all H KV heads. Its bytes, each section
// starting at a multiple of 16:
//
//   key codes     [H][P][key_code_bytes]      block-code indices, little endian (fp16 codec: 2·d bytes)
//   key gains     [H][P] gain entries         uint16 fp16 bits (gain_bits 16) or uint8 log codes around
//                                             a per-(sequence, head, kind) fp16 reference (gain_bits 8,
//                                             quant/gain_code.hpp); absent for the fp16 codec
//   value codes   [H][P][value_code_bytes]
//   value gains   [H][P] gain entries
//   positions     [S][P] int32                S = 1 (one set shared by the heads) or H (per-head sets)
//
// page_bytes is the sum rounded up to 16. A pool is n_pages · page_bytes bytes owned by the
// caller (an engine's page allocator). Sequence b's coded token t lives in page
// page_indices[page_indptr[b] + t / P] at slot t % P (the CSR block table of FlashInfer and vLLM);
// it has coded_lens[b] tokens. A contiguous per-sequence store is the case P = length.
// The encode kernel addresses slots directly: slot = page · P + t % P (vLLM's slot mapping).
#pragma once

#include <cstdint>

#include "e8kv/platform.hpp"

namespace e8kv {

/// Section alignment and page-size granularity in bytes.
inline constexpr int64_t kPagedAlignment = 16;

E8KV_HD constexpr int64_t paged_align_up(int64_t x) { return (x + kPagedAlignment - 1) / kPagedAlignment * kPagedAlignment; }

/// Bytes of one coded head vector: d/8 indices of index_bits/8 bytes, or 2·d for fp16 (index_bits 0).
E8KV_HD constexpr int32_t paged_code_bytes(int head_dim, int index_bits) {
  return index_bits == 0 ? 2 * head_dim : head_dim / 8 * (index_bits / 8);
}

struct PagedLayout {
  int32_t page_tokens = 0;       ///< P
  int32_t kv_heads = 0;          ///< H
  int32_t head_dim = 0;          ///< d
  int32_t key_code_bytes = 0;    ///< per (slot, head)
  int32_t value_code_bytes = 0;
  int32_t key_gain_bytes = 0;    ///< 2 (fp16 gains), 1 (8-bit gain codes), or 0 for the fp16 codec
  int32_t value_gain_bytes = 0;
  int32_t position_sets = 1;     ///< 1 or kv_heads
  int64_t key_codes_offset = 0;
  int64_t key_gains_offset = 0;
  int64_t value_codes_offset = 0;
  int64_t value_gains_offset = 0;
  int64_t positions_offset = 0;
  int64_t page_bytes = 0;

  E8KV_HD int64_t key_code_offset(int head, int slot) const {
    return key_codes_offset + (static_cast<int64_t>(head) * page_tokens + slot) * key_code_bytes;
  }
  E8KV_HD int64_t key_gain_offset(int head, int slot) const {
    return key_gains_offset + (static_cast<int64_t>(head) * page_tokens + slot) * key_gain_bytes;
  }
  E8KV_HD int64_t value_code_offset(int head, int slot) const {
    return value_codes_offset + (static_cast<int64_t>(head) * page_tokens + slot) * value_code_bytes;
  }
  E8KV_HD int64_t value_gain_offset(int head, int slot) const {
    return value_gains_offset + (static_cast<int64_t>(head) * page_tokens + slot) * value_gain_bytes;
  }
  /// Offset of the position of (head, slot): head is ignored when the set is shared.
  E8KV_HD int64_t position_offset(int head, int slot) const {
    const int set = position_sets == 1 ? 0 : head;
    return positions_offset + (static_cast<int64_t>(set) * page_tokens + slot) * 4;
  }
};

/// Rows of rope_delta_table (cache/paged_kv.hpp): offsets Δ = position − 1024·U of a coded token
/// from the reference upper part U of the decode-attention pass that scores it.
inline constexpr int kRopeDeltaRows = 2048;

/// The layout for the given shape. key/value_index_bits: bits per 8-element block index (16, 24
/// or 32), or 0 for the fp16 codec; gain_bits: 16 (fp16 gains) or 8 (8-bit codes, CacheLayout::
/// gain_bits). Returns a layout with page_bytes == 0 when an argument is out of range
/// (page_tokens, kv_heads >= 1; head_dim a positive multiple of 8; bits 0, 8..32 in whole bytes;
/// gain_bits 8 or 16).
E8KV_HD constexpr PagedLayout make_paged_layout(int page_tokens, int kv_heads, int head_dim, int key_index_bits,
                                                int value_index_bits, bool per_head_positions, int gain_bits = 16) {
  PagedLayout L{};
  const bool bits_ok = key_index_bits >= 0 && key_index_bits <= 32 && key_index_bits % 8 == 0 &&
                       value_index_bits >= 0 && value_index_bits <= 32 && value_index_bits % 8 == 0 &&
                       (gain_bits == 8 || gain_bits == 16);
  if (page_tokens < 1 || kv_heads < 1 || head_dim < 8 || head_dim % 8 != 0 || !bits_ok) return L;
  L.page_tokens = page_tokens;
  L.kv_heads = kv_heads;
  L.head_dim = head_dim;
  L.key_code_bytes = paged_code_bytes(head_dim, key_index_bits);
  L.value_code_bytes = paged_code_bytes(head_dim, value_index_bits);
  L.key_gain_bytes = key_index_bits == 0 ? 0 : gain_bits / 8;
  L.value_gain_bytes = value_index_bits == 0 ? 0 : gain_bits / 8;
  L.position_sets = per_head_positions ? kv_heads : 1;
  const int64_t slots = static_cast<int64_t>(kv_heads) * page_tokens;
  int64_t at = 0;
  L.key_codes_offset = at;
  at = paged_align_up(at + slots * L.key_code_bytes);
  L.key_gains_offset = at;
  at = paged_align_up(at + slots * L.key_gain_bytes);
  L.value_codes_offset = at;
  at = paged_align_up(at + slots * L.value_code_bytes);
  L.value_gains_offset = at;
  at = paged_align_up(at + slots * L.value_gain_bytes);
  L.positions_offset = at;
  at = paged_align_up(at + static_cast<int64_t>(L.position_sets) * page_tokens * 4);
  L.page_bytes = at;
  return L;
}

/// Physical slot of token t of sequence b in a CSR block table: page · page_tokens + t % page_tokens.
E8KV_HD inline int64_t paged_slot(const int32_t* page_indptr, const int32_t* page_indices, int b, int64_t t,
                                  int page_tokens) {
  const int64_t page = page_indices[page_indptr[b] + t / page_tokens];
  return page * page_tokens + t % page_tokens;
}

}  // namespace e8kv
