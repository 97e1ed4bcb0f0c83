// The model facts a llama.cpp state does not carry (KV shape, RoPE), read from the model's GGUF,
// and a Config for it: what the tool and the engine tests give KVCompressor.
#pragma once

#include <string>

#include "e8kv/config.hpp"

namespace e8kv::llama_cpp {

struct ModelKv {
  std::string architecture;
  ModelShape shape;
  transform::RopeParams rope;
};

/// Reads a GGUF's header (architecture llama; the llama example's reader): layers, heads,
/// head_dim and RoPE as llama.cpp applies it (adjacent pairs: RopeLayout::kInterleaved).
/// Throws e8kv::Error for what the adapter cannot represent (other architectures, RoPE
/// frequency-factor tensors), naming it.
ModelKv read_model_kv(const std::string& gguf_path);

/// Config::parse(spec) with the model's RoPE.
Config model_config(const std::string& spec, const ModelKv& model);

}  // namespace e8kv::llama_cpp
