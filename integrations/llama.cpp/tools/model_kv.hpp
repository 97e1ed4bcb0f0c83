// The model facts a llama.cpp state does not carry (which layers each KV cache holds, their shape
// and RoPE), read from the model's GGUF, and a Config per cache: what the tool and the engine
// tests give KVCompressor.
#pragma once

#include <string>
#include <vector>

#include "e8kv/compressor.hpp"
#include "e8kv/config.hpp"
#include "e8kv/llama/gguf.hpp"

namespace e8kv::llama_cpp {

/// One KV cache of llama.cpp's memory for a model.
struct ModelKvCache {
  std::vector<int> layers;  ///< the model's layers it holds, ascending (the state's layer order)
  ModelShape shape;         ///< shape.n_layers == layers.size()
  transform::RopeParams rope;
  int sliding_window = 0;   ///< tokens a query sees (0: full attention)
};

struct ModelKv {
  std::string architecture;
  int n_layers = 0;  ///< the model's
  /// In the order llama.cpp writes them: one cache, or for interleaved sliding-window attention
  /// (iSWA) the full-attention layers' cache, then the sliding-window layers'.
  std::vector<ModelKvCache> caches;
};

/// Reads a GGUF's header: llama (the llama example's reader; keys and queries rotated in adjacent
/// pairs, RopeLayout::kInterleaved) and gemma3 (llama.cpp's reading of it: sliding-window layers
/// where il % pattern < pattern - 1, pattern 6 unless the file says otherwise, RoPE base
/// rope.freq_base_swa (default 10000) there and rope.freq_base with the file's linear scaling on
/// the global layers, split-half rotation). Throws e8kv::Error for what the adapter cannot
/// represent (other architectures, RoPE frequency-factor tensors, other scaling types), naming it.
ModelKv read_model_kv(const std::string& gguf_path);
/// The same, from a GGUF already read (its path for messages).
ModelKv read_model_kv(const std::string& gguf_path, const llama::GgufFile& f);

/// Config::parse_at_rest(spec) (a state at rest: no fp16 window unless the spec sets `residual`)
/// with the cache's RoPE, validated against its shape.
Config model_config(const std::string& spec, const ModelKvCache& cache);

/// One compressor per KV cache of the model, in llama.cpp's order.
std::vector<KVCompressor> model_compressors(const std::string& spec, const ModelKv& model);
/// Pointers to them, as compress_seq_state takes them.
std::vector<const KVCompressor*> pointers(const std::vector<KVCompressor>& compressors);

}  // namespace e8kv::llama_cpp
