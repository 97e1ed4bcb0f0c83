// Which of a llama.cpp model's layers e8kv holds, and how: the architectures whose graph builders
// hand build_attn plain post-RoPE keys, each layer's RoPE exactly as ggml_rope_ext applies it
// (NORM / NEOX pairs, partial rotary, linear scaling, YaRN, per-pair frequency factors), and the
// sliding window of SWA layers. Layers that share a RoPE and a window form one group: one e8kv
// cache per sequence (Gemma-3: its sliding-window layers and its global layers, two groups).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "e8kv/config.hpp"
#include "e8kv/transform/rope_params.hpp"

struct llama_model;
struct llama_cparams;

namespace e8kv_llama {

/// Model layers that share one e8kv cache per sequence.
struct LayerGroup {
  std::vector<int> layers;             ///< the model's layer ids, ascending
  e8kv::transform::RopeParams rope;    ///< as ggml_rope_ext turns these layers' keys
  int32_t window = 0;                  ///< sliding window in positions (llama.cpp's n_swa), 0: global
  /// One line for the log: "layers 0-17 (global, RoPE theta 1e+06, split-half)".
  std::string describe() const;
};

struct ModelLayers {
  int n_kv_heads = 0, n_q_heads = 0, head_dim = 0;
  std::vector<LayerGroup> groups;
  std::vector<std::pair<int, int>> where;  ///< per model layer: (group, index in the group)
  e8kv::ModelShape shape(int group) const {
    return {static_cast<int>(groups[static_cast<size_t>(group)].layers.size()), n_kv_heads, n_q_heads, head_dim};
  }
};

/// The layers of `model` in e8kv's terms, or std::runtime_error naming what e8kv cannot hold:
/// an architecture whose graph is not tested with e8kv's memory (recurrent, hybrid, MLA, shared
/// KV layers, attention sinks...), ALiBi, logit soft-capping, chunked or symmetric windows,
/// differing head counts or K/V head sizes, a head size e8kv does not support, a RoPE type other
/// than NORM / NEOX (multi-section, vision), a YaRN factor or frequency factors it cannot
/// express, layers offloaded to a GPU.
ModelLayers map_model(const llama_model& model, const llama_cparams& cparams);

/// Layer il's RoPE as e8kv's parameters: what the architecture's graph builder passes to
/// ggml_rope_ext for that layer (base, scale, frequency factors, YaRN), in e8kv's terms. The
/// factors carry whatever ggml computes per pair beyond theta^(-2i/n_rot): rope_freqs, and
/// YaRN's per-pair mix of interpolation and extrapolation.
e8kv::transform::RopeParams rope_of_layer(const llama_model& model, const llama_cparams& cparams, int il);

}  // namespace e8kv_llama
