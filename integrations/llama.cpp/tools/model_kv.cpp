#include "model_kv.hpp"

#include "e8kv/error.hpp"
#include "e8kv/llama/gguf.hpp"
#include "e8kv/llama/model.hpp"

namespace e8kv::llama_cpp {

ModelKv read_model_kv(const std::string& gguf_path) {
  const llama::GgufFile f = llama::GgufFile::open(gguf_path);
  const llama::ModelConfig mc = llama::read_config(f);  // refuses architectures other than llama
  if (mc.rope_freq_factors)
    throw Error(gguf_path + ": RoPE frequency factors (rope_freqs.weight) are not mapped to e8kv's RoPE parameters");
  ModelKv m;
  m.architecture = mc.architecture;
  m.shape = ModelShape{mc.n_layers, mc.n_kv_heads, mc.n_heads, mc.head_dim};
  m.rope = llama::rope_params(mc);  // llama.cpp rotates GGUF llama keys in adjacent pairs too
  return m;
}

Config model_config(const std::string& spec, const ModelKv& model) {
  Config c = Config::parse(spec);
  c.rope = model.rope;
  c.validate(model.shape);
  return c;
}

}  // namespace e8kv::llama_cpp
