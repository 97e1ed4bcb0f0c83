// A llama.cpp sequence state compressed by e8kv, and back: prompt caches, llama-server slot files,
// multi-turn offload. llama.cpp stays unmodified: the bytes of llama_state_seq_get_data (or of a
// slot file) go in, the same kind of bytes come out for llama_state_seq_set_data.
//
//   e8kv::KVCompressor c(shape, config);            // config.rope = the model's RoPE
//   auto packed = e8kv::llama_cpp::compress_seq_state(state.data(), state.size(), c);
//   auto state2 = e8kv::llama_cpp::restore_seq_state(packed.data(), packed.size());
//   llama_state_seq_set_data(ctx, state2.data(), state2.size(), seq_id);
//
// What it reads: a sequence state (llama_cpp/seq_state.hpp) of one KV cache, or of the two of a
// model with interleaved sliding-window attention (iSWA: Gemma 2/3, Cohere2, ...; give one
// compressor per cache, full-attention layers first: each cache has its own layers and RoPE; a
// state saved with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY holds the sliding-window cache alone),
// whose K and V rows are f16, bf16 or f32 (llama.cpp's -ctk/-ctv f16, bf16, f32), V transposed
// (flash attention off) or not, any number of streams with the cells in one of them. Keys are
// post-RoPE, as llama.cpp stores them; each compressor's config.rope must be its layers' RoPE
// (llama.cpp's "normal" rotation is RopeLayout::kInterleaved, "neox" kSplitHalf) for any key frame
// but "post".
// What it refuses, naming it: quantized cache types (q8_0, q4_0, ...), memories after the caches
// named (recurrent states), cells in several streams, repeated positions, rows whose size is not
// the model's n_kv_heads × head_dim; extending a cache whose later state lacks a stored cell after
// its own first cell (the sequence was edited). Cells of M-RoPE and per-layer-embedding models carry an
// extension the bytes do not announce: the tool refuses those architectures by name; through this
// API their bytes fail the parser's checks.
//
// Cells are shared by every layer in llama.cpp, so an evicting Config must keep one token set for
// all layers (Config::shared_selection); a cache whose layers keep different tokens is refused at
// restore. Restored rows are the decoded values rounded to the state's types: with the "lossless"
// preset an f16 state comes back byte for byte, bf16 and f32 rows are rounded through fp16.
//
// The compressed state ("E8KVLCPP"): a small header (per KV cache the state's stream layout,
// types, sequence id and the cells' order; any bytes that preceded the state verbatim, such as a
// slot file's token list; each container's size) with its CRC-32C, then per KV cache e8kv's
// container (container/container.hpp) holding the codes. Version 1 holds one cache, version 2 (a
// cache count after the version) several; one cache is always written as version 1. Every byte
// is in the returned vector: its size is the compressed size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/cache/kv_view.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/llama_cpp/seq_state.hpp"
#include "e8kv/parallel.hpp"

namespace e8kv::llama_cpp {

struct StateCompressOptions {
  /// Observation queries for the attention scorers and query-weighted keys, per KV cache (empty:
  /// none): one LayerQueries per layer of the cache, post-RoPE (llama.cpp's "Qcur-<layer>"
  /// tensors, captured with cb_eval).
  std::vector<const std::vector<LayerQueries>*> queries;
  Executor* executor = nullptr;  ///< plans the layers in parallel (KVCompressor::compress)
  container::ContainerOptions container;    ///< chunking, zstd level of the codes
  /// Bytes that preceded the state and come back before it on restore, verbatim (a slot file's
  /// magic, version and token list: compress_slot_file sets them).
  std::vector<uint8_t> prefix;
};

/// Compresses one sequence state, `caches` the compressor of each KV cache of the model in
/// llama.cpp's order: the bytes of llama_state_seq_get_data (their 8-byte frame is kept and
/// restored verbatim) or a bare state (seq_state.hpp).
std::vector<uint8_t> compress_seq_state(const uint8_t* state, size_t size,
                                        const std::vector<const KVCompressor*>& caches,
                                        const StateCompressOptions& options = {});
/// A model with one KV cache.
std::vector<uint8_t> compress_seq_state(const uint8_t* state, size_t size, const KVCompressor& compressor,
                                        const StateCompressOptions& options = {});

/// Multi-turn: the compressed state `packed` extended with the cells of a later state of the same
/// sequence whose positions follow the stored ones (KVCompressor::extend: stored tokens are never
/// re-coded). The later state must have the same streams, types and V layout; `compressor` must be
/// the one (or an equal one) that made `packed`. Stored cells below the later state's first cell
/// left a sliding window: they are dropped from the stored cache (KVCompressor::drop_before). A
/// stored cell missing at or after it (llama_memory_seq_rm edited the sequence) is refused.
std::vector<uint8_t> extend_compressed_state(const uint8_t* packed, size_t packed_size, const uint8_t* state,
                                             size_t size, const std::vector<const KVCompressor*>& caches,
                                             const StateCompressOptions& options = {});
std::vector<uint8_t> extend_compressed_state(const uint8_t* packed, size_t packed_size, const uint8_t* state,
                                             size_t size, const KVCompressor& compressor,
                                             const StateCompressOptions& options = {});

/// The decoded state: bytes for llama_state_seq_set_data, preceded by the prefix given at
/// compress time. Throws e8kv::Error on truncated, corrupt or foreign bytes. With an executor the
/// layers are decoded in parallel (the same bytes as without).
std::vector<uint8_t> restore_seq_state(const uint8_t* packed, size_t size,
                                       const container::DeserializeOptions& options = {}, Executor* executor = nullptr);

/// What a compressed state holds, read from its header and container headers only.
struct CompressedCacheInfo {
  uint32_t n_stream = 0, stream = 0;  ///< streams of the state, the one holding the cells
  bool v_trans = false;
  int32_t seq_id = 0;
  uint32_t cells = 0;                 ///< cells of the original state (before eviction)
  std::vector<int32_t> k_types, v_types;  ///< per layer
  size_t container_bytes = 0;
  container::ContainerInfo container;
};
struct CompressedStateInfo {
  std::vector<CompressedCacheInfo> caches;  ///< per KV cache, in llama.cpp's order
  size_t prefix_bytes = 0;
  size_t container_bytes = 0;  ///< all caches' containers
};
CompressedStateInfo read_compressed_state_info(const uint8_t* packed, size_t size);

/// llama.cpp slot / sequence files (llama_state_seq_save_file, llama-server --slot-save-path):
/// magic "ggsq", version 3, the token list, then the sequence state.
inline constexpr uint32_t kSeqFileMagic = 0x67677371u;  // LLAMA_FILE_MAGIC_GGSQ
inline constexpr uint32_t kSeqFileVersion = 3;          // LLAMA_STATE_SEQ_VERSION
/// Splits a sequence file's bytes: returns the offset of the state (after the token list).
/// Throws e8kv::Error naming the magic or version found when the file is not one.
size_t seq_file_state_offset(const uint8_t* file, size_t size);
/// A slot file compressed: its token list kept verbatim, its state compressed.
std::vector<uint8_t> compress_slot_file(const uint8_t* file, size_t size,
                                        const std::vector<const KVCompressor*>& caches,
                                        const StateCompressOptions& options = {});
std::vector<uint8_t> compress_slot_file(const uint8_t* file, size_t size, const KVCompressor& compressor,
                                        const StateCompressOptions& options = {});
/// restore_seq_state of a compressed slot file gives the slot file back (prefix + state).

}  // namespace e8kv::llama_cpp
