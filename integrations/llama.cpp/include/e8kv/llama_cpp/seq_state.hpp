// llama.cpp's sequence state, as bytes: what llama_state_seq_get_data() returns and
// llama_state_seq_set_data() takes after their 8-byte frame (u32 magic 0xaf143cd8, i32 sequence
// id), and what a slot file of llama-server holds after its token list; parsed into cells and K/V
// rows and written back byte for byte.
//
// The format is that of llama.cpp commit 0c1e57098bba (ggml 0.25.3; PyPI llama-cpp-python 0.3.36,
// scripts/fetch-llama-cpp.sh), llama_kv_cache::state_write with a sequence id:
//
//   u32 n_stream
//   per stream:  u32 cell_count; when > 0:
//     per cell:  i32 pos, u32 n_seq_id (1 for one sequence's state), [cell ext], n_seq_id × i32 seq id
//     u32 v_trans, u32 n_layer
//     per layer: i32 k_type, u64 k_row_bytes, cell_count rows of K (the cells in cache order)
//     v_trans 0, per layer: i32 v_type, u64 v_row_bytes, cell_count rows of V
//     v_trans 1, per layer: i32 v_type, u32 v_element_bytes, u32 n_embd_v, then for each of the
//                n_embd_v channels the cell_count elements of that channel (V transposed: llama.cpp
//                without flash attention)
//
// Nothing in the bytes says which model wrote them: the caller states the cell extension (M-RoPE
// and per-layer-embedding models write one) and checks rows against its model (llama_cpp/
// state_codec.hpp does). The parser accepts any ggml type; the codec refuses all but f32, f16 and
// bf16. A model with interleaved sliding-window attention (iSWA: Gemma 2/3, Cohere2, ...) keeps
// two KV caches, and its state is two such states back to back (llama_kv_cache_iswa::state_write:
// the full-attention layers' cache, then the sliding-window layers'): parse_seq_caches reads them
// when the caller names the count. Bytes after the caches named (a recurrent state, a cache the
// caller did not announce) are refused as trailing bytes, never skipped.
//
// Every count and size is checked against the bytes left before anything is allocated: a
// truncated, corrupt or foreign blob raises e8kv::Error naming the field and its offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace e8kv::llama_cpp {

/// ggml's type ids (ggml.h, enum ggml_type) of the row types the codec reads.
enum GgmlType : int32_t { kGgmlF32 = 0, kGgmlF16 = 1, kGgmlBF16 = 30 };
/// ggml's name of a type id ("f16", "q4_0", ...; 43-45 are the E8 types e8kv patches into ggml:
/// "e8p", "e8r3", "e8r4"), or "type <id>" for an id ggml 0.25.3 does not have.
std::string ggml_type_name(int32_t type);

struct SeqStateOptions {
  /// Cells carry llama_kv_cell_ext (12 bytes: x, y, token) after n_seq_id: models with M-RoPE
  /// (n_pos_per_embd > 1) or per-layer embeddings (hparams.ple_n_heads > 0).
  bool cell_ext = false;
};

struct SeqStateLayer {
  int32_t k_type = 0, v_type = 0;
  uint64_t k_row_bytes = 0;
  uint64_t v_row_bytes = 0;      ///< v_trans 0
  uint32_t v_element_bytes = 0;  ///< v_trans 1
  uint32_t v_embd = 0;           ///< v_trans 1: channels (n_embd_v_gqa)
  std::vector<uint8_t> keys;     ///< cell_count × k_row_bytes
  std::vector<uint8_t> values;   ///< cell_count × v_row_bytes, or v_embd × cell_count × v_element_bytes
};

struct SeqStateStream {
  std::vector<int32_t> positions;  ///< one per cell, in the cache's order
  std::vector<int32_t> seq_ids;    ///< one per cell (the sequence the state was saved from)
  std::vector<std::vector<uint8_t>> cell_ext;  ///< one 12-byte record per cell with cell_ext, else empty
  bool v_trans = false;
  std::vector<SeqStateLayer> layers;
  size_t cells() const { return positions.size(); }
};

struct SeqState {
  std::vector<SeqStateStream> streams;  ///< n_stream entries; a stream without cells has none
};

/// Parses one KV cache's sequence state from data[0, size). Throws e8kv::Error on truncated or
/// malformed bytes, on a cell shared by several sequences (n_seq_id != 1: that is a whole-context
/// state, not a sequence's) and on bytes left after the state. `consumed`, when given, receives
/// the bytes read and trailing bytes are then allowed.
SeqState parse_seq_state(const uint8_t* data, size_t size, const SeqStateOptions& options = {},
                         size_t* consumed = nullptr);

/// The bytes llama.cpp would write for `state` (parse_seq_state's inverse, byte for byte).
std::vector<uint8_t> write_seq_state(const SeqState& state, const SeqStateOptions& options = {});

/// The `n_caches` KV caches' states of a model's memory, back to back in llama.cpp's order (1 for
/// most models; 2 for iSWA: full-attention layers, then sliding-window layers). Throws like
/// parse_seq_state, and on bytes left after the last cache.
std::vector<SeqState> parse_seq_caches(const uint8_t* data, size_t size, size_t n_caches,
                                       const SeqStateOptions& options = {});
/// parse_seq_caches' inverse, byte for byte.
std::vector<uint8_t> write_seq_caches(const std::vector<SeqState>& caches, const SeqStateOptions& options = {});

/// llama_state_seq_get_data's frame: u32 magic, i32 sequence id, then the state.
inline constexpr uint32_t kSeqDataMagic = 0xaf143cd8u;
inline constexpr size_t kSeqDataFrameBytes = 8;
/// kSeqDataFrameBytes when `data` starts with llama_state_seq_get_data's frame, else 0 (a bare
/// state starts with n_stream <= 256, never the magic).
size_t seq_data_frame_bytes(const uint8_t* data, size_t size);

/// Bytes of K and V rows in the state (what an fp16 cache of these cells holds), and all bytes.
size_t seq_state_kv_bytes(const SeqState& state);

}  // namespace e8kv::llama_cpp
