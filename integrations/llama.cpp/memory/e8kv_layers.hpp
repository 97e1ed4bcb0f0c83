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

/// What ggml_rope_ext is given for one layer's keys (the arguments e8kv needs of it).
struct GgmlRope {
  int mode = 0;        ///< LLAMA_ROPE_TYPE_NORM (0, adjacent pairs) or LLAMA_ROPE_TYPE_NEOX (2, split halves)
  int n_rot = 0;       ///< rotated dimensions (the rest pass unchanged)
  int head_dim = 0;
  float freq_base = 10000.f, freq_scale = 1.f;
  std::vector<float> freq_factors;  ///< the freq_factors tensor's n_rot/2 values, or empty (none)
  float ext_factor = 0.f;           ///< YaRN's mix (0: off)
  float beta_fast = 32.f, beta_slow = 1.f;
  int n_ctx_orig = 0;
};

/// ggml_rope_ext's rotation in e8kv's terms: pair i turns by p·theta^(−2i/n_rot)·m_i/f_i, f_i the
/// frequency factor, m_i the scale mixed per pair with 1 by YaRN's ramp; everything beyond
/// theta^(−2i/n_rot) becomes e8kv's per-pair frequency factors (a plain linear scale stays
/// e8kv's linear scaling). YaRN's magnitude factor scales keys and queries alike before the
/// memory sees them, so it is not part of the rotation. Throws std::runtime_error for a mode or a
/// value e8kv cannot express.
e8kv::transform::RopeParams rope_params(const GgmlRope& g);

/// Layer il's RoPE as its architecture's graph builder passes it to ggml_rope_ext (base, scale,
/// frequency factors, YaRN), in e8kv's terms (rope_params).
e8kv::transform::RopeParams rope_of_layer(const llama_model& model, const llama_cparams& cparams, int il);

}  // namespace e8kv_llama
