// One sequence of e8kv's llama.cpp memory: per layer group a compressed cache, and the prompt
// chunk the current ubatch stages (at most one ubatch of rows). A sequence's first llama_decode
// call is its prompt: each of its ubatches is staged, attended densely beside the codes of the
// chunks before it, and compressed when the ubatch has run (compress, then extend). Every later
// call appends its tokens to the codes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv_layers.hpp"

namespace e8kv {
class Executor;
}

namespace e8kv_llama {

/// A layer group's codec: its compressor (the spec with the group's RoPE and softmax scale).
struct GroupCodec {
  LayerGroup layers;
  e8kv::Config config;
  std::unique_ptr<e8kv::KVCompressor> compressor;
};

/// The prompt chunk of the running ubatch, for one sequence.
struct PromptStage {
  std::vector<int32_t> positions;           ///< the chunk's tokens, in order
  std::vector<std::vector<uint16_t>> k, v;  ///< per model layer: [tokens][n_kv_heads·head_dim], fp16 bits
  std::vector<std::vector<float>> obs_q;    ///< per model layer: the chunk's last observation rows [n][n_q_heads·head_dim]
  std::vector<int32_t> obs_positions;
  bool empty() const { return positions.empty(); }
  size_t bytes() const;
  void clear();  ///< frees the buffers
};

struct Sequence {
  enum class Mode { kEmpty, kPrompt, kCoded, kFailed };
  Mode mode = Mode::kEmpty;
  int32_t pos_min = -1, pos_max = -1;  ///< positions given (evicted and dropped ones included)
  std::string failure;                 ///< Mode::kFailed: why the sequence refuses to decode
  std::vector<std::unique_ptr<e8kv::CompressedKV>> caches;  ///< per group; null before its first chunk
  std::vector<int32_t> dropped_below;  ///< per group: positions below this left the group's window
  PromptStage stage;

  void reset() { *this = Sequence(); }
  bool has_codes() const;
  /// The largest position any group's cache holds, -1 when none.
  int64_t last_coded_position() const;
  size_t bytes() const;           ///< every group's CompressedKV::bytes()
  size_t resident_bytes() const;  ///< heap bytes of the caches and the stage
  Sequence clone() const;         ///< a deep copy (seq_cp)
};

/// Compresses the staged chunk into each group's cache (compress for a group's first chunk,
/// extend after), then frees the stage, then drops from windowed groups the positions no later
/// query can see. `pool` (optional) plans the layers in parallel. Throws e8kv::Error (the failed
/// group's cache unchanged, earlier groups' extended: the caller fails the sequence).
void commit_stage(Sequence& s, const std::vector<GroupCodec>& groups, const ModelLayers& model, e8kv::Executor* pool);

/// Cuts a coded sequence to its positions below `end` (llama.cpp's seq_rm of a tail: a server
/// reusing a cached prompt up to where the new one differs, a fleet's shorter prefix): each
/// group's cache keeps its codes below `end` (e8kv::keep_positions; nothing re-encoded), and the
/// next call appends from there. Refused, the sequence unchanged, with the reason in `why`: a
/// sequence with a stage (a prompt in progress), a windowed group that already dropped positions
/// the token at `end` would see, per-head sets that would keep different pinned counts.
bool cut_tail(Sequence& s, const std::vector<GroupCodec>& groups, int32_t end, std::string* why);

/// Drops from each windowed group the positions that left its window (a token at p sees no
/// position below p − window + 1), once enough have left to be worth the copy.
void drop_outside_windows(Sequence& s, const std::vector<GroupCodec>& groups);

}  // namespace e8kv_llama
