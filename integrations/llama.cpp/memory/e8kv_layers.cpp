// The model's layers in e8kv's terms (e8kv_layers.hpp): architectures, RoPE per layer, windows.
#include "e8kv_layers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "ggml-backend.h"
#include "llama-arch.h"
#include "llama-cparams.h"
#include "llama-model.h"

namespace e8kv_llama {

namespace {

/// What an architecture's graph builder passes to ggml_rope_ext, beyond the hyperparameters every
/// builder reads: the model's frequency factors (rope_freqs, LongRoPE's long/short factors), and
/// the per-layer base and scale of sliding-window layers. Only architectures whose builders give
/// build_attn post-RoPE keys with no other per-layer state are listed; each is tested.
struct ArchRope {
  llm_arch arch;
  bool factors;         ///< passes model.get_rope_factors(cparams, il)
  bool per_layer_base;  ///< passes model.get_rope_freq_base / _scale(cparams, il)
};
constexpr ArchRope kArchitectures[] = {
    {LLM_ARCH_LLAMA, true, false},     // Llama 1-3.x, SmolLM2, Mistral 7B (rope_freqs: Llama-3.1+)
    {LLM_ARCH_MISTRAL3, true, false},  // Ministral / Mistral-Small-3.x (Llama-4 temperature: on the queries)
    {LLM_ARCH_QWEN2, false, false},    // Qwen2 / 2.5 (q/k/v biases: in the keys build_attn gets)
    {LLM_ARCH_QWEN3, false, false},    // Qwen3 dense (QK-norm before RoPE)
    {LLM_ARCH_PHI3, true, false},      // Phi-3 / 3.5 (LongRoPE factors; SWA disabled by llama.cpp)
    {LLM_ARCH_GEMMA3, false, true},    // Gemma-3 (sliding-window layers with their own base)
};

const ArchRope* find_arch(llm_arch arch) {
  for (const auto& a : kArchitectures)
    if (a.arch == arch) return &a;
  return nullptr;
}

std::string supported_names() {
  std::string s;
  for (const auto& a : kArchitectures) s += std::string(s.empty() ? "" : ", ") + llm_arch_name(a.arch);
  return s;
}

bool same_rope(const e8kv::transform::RopeParams& a, const e8kv::transform::RopeParams& b) {
  return a.layout == b.layout && a.rotary_dim == b.rotary_dim && a.theta == b.theta && a.scaling == b.scaling &&
         a.factor == b.factor && a.freq_factors == b.freq_factors;
}

}  // namespace

std::string LayerGroup::describe() const {
  char buf[160];
  std::string ids;
  for (size_t i = 0; i < layers.size(); ++i) {
    const bool run_start = i == 0 || layers[i] != layers[i - 1] + 1;
    const bool run_end = i + 1 == layers.size() || layers[i + 1] != layers[i] + 1;
    if (run_start) ids += (ids.empty() ? "" : ",") + std::to_string(layers[i]);
    if (run_end && !run_start) ids += "-" + std::to_string(layers[i]);
  }
  std::snprintf(buf, sizeof buf, " (%s, RoPE theta %g, %s%s%s)", window > 0 ? ("window " + std::to_string(window)).c_str() : "global",
                rope.theta, rope.layout == e8kv::transform::RopeLayout::kSplitHalf ? "split-half" : "interleaved",
                rope.freq_factors.empty() ? "" : ", per-pair frequency factors",
                rope.scaling == e8kv::transform::RopeScaling::kLinear ? ", linear scaling" : "");
  return "layers " + ids + buf;
}

e8kv::transform::RopeParams rope_params(const GgmlRope& g) {
  e8kv::transform::RopeParams r;
  switch (g.mode) {
    case LLAMA_ROPE_TYPE_NORM: r.layout = e8kv::transform::RopeLayout::kInterleaved; break;  // adjacent pairs
    case LLAMA_ROPE_TYPE_NEOX: r.layout = e8kv::transform::RopeLayout::kSplitHalf; break;
    default:
      throw std::runtime_error("RoPE type " + std::to_string(g.mode) +
                               " (multi-section or vision RoPE) is not supported: e8kv turns NORM and NEOX pairs");
  }
  if (g.n_rot < 2 || g.n_rot % 2 != 0 || g.n_rot > g.head_dim)
    throw std::runtime_error("RoPE over " + std::to_string(g.n_rot) + " of " + std::to_string(g.head_dim) +
                             " dimensions is not supported");
  r.head_dim = g.head_dim;
  r.rotary_dim = g.n_rot;
  if (!(g.freq_base > 1.f) || !(g.freq_scale > 0.f) || !std::isfinite(g.freq_base) || !std::isfinite(g.freq_scale))
    throw std::runtime_error("RoPE base " + std::to_string(g.freq_base) + " / scale " + std::to_string(g.freq_scale) +
                             " are not usable");
  r.theta = g.freq_base;
  const int pairs = g.n_rot / 2;
  if (!g.freq_factors.empty() && static_cast<int>(g.freq_factors.size()) != pairs)
    throw std::runtime_error("RoPE frequency factors: " + std::to_string(g.freq_factors.size()) + " values for " +
                             std::to_string(pairs) + " rotary pairs");
  for (float f : g.freq_factors)
    if (!(f > 0.f) || !std::isfinite(f)) throw std::runtime_error("a RoPE frequency factor of " + std::to_string(f));
  const float ext = g.ext_factor;
  if (!std::isfinite(ext) || ext < 0.f) throw std::runtime_error("YaRN ext_factor " + std::to_string(ext) + " is not usable");
  if (g.freq_factors.empty() && ext == 0.f) {
    if (g.freq_scale != 1.f) {
      r.scaling = e8kv::transform::RopeScaling::kLinear;
      r.factor = 1.0 / static_cast<double>(g.freq_scale);
    }
    return r;
  }
  std::vector<float> factors = g.freq_factors;
  if (factors.empty()) factors.assign(static_cast<size_t>(pairs), 1.f);
  double low = 0, high = 0;
  if (ext != 0.f) {  // ggml_rope_yarn_corr_dims
    if (g.n_ctx_orig <= 0) throw std::runtime_error("YaRN without an original context length");
    auto corr_dim = [&](double rotations) {
      return g.n_rot * std::log(g.n_ctx_orig / (rotations * 2 * M_PI)) / (2 * std::log(static_cast<double>(g.freq_base)));
    };
    low = std::max(0.0, std::floor(corr_dim(g.beta_fast)));
    high = std::min(static_cast<double>(g.n_rot - 1), std::ceil(corr_dim(g.beta_slow)));
  }
  for (int i = 0; i < pairs; ++i) {
    double m = g.freq_scale;
    if (ext != 0.f) {  // rope_yarn: theta_interp·(1 − ramp·ext) + theta_extrap·ramp·ext
      const double y = (i - low) / std::max(0.001, high - low);
      const double ramp = (1.0 - std::min(1.0, std::max(0.0, y))) * ext;
      m = g.freq_scale * (1.0 - ramp) + ramp;
    }
    factors[static_cast<size_t>(i)] = static_cast<float>(factors[static_cast<size_t>(i)] / m);
  }
  r.freq_factors = std::move(factors);
  return r;
}

e8kv::transform::RopeParams rope_of_layer(const llama_model& model, const llama_cparams& cparams, int il) {
  const llama_hparams& hp = model.hparams;
  const ArchRope* arch = find_arch(model.arch);
  if (arch == nullptr) throw std::runtime_error(std::string("architecture '") + llm_arch_name(model.arch) + "' is not mapped");
  GgmlRope g;
  g.mode = hp.rope_type;
  g.n_rot = static_cast<int>(hp.n_rot());  // the graph's n_rot (llm_graph_context::n_rot)
  g.head_dim = static_cast<int>(hp.n_embd_head_k(static_cast<uint32_t>(il)));
  g.freq_base = arch->per_layer_base ? model.get_rope_freq_base(cparams, il) : cparams.rope_freq_base;
  g.freq_scale = arch->per_layer_base ? model.get_rope_freq_scale(cparams, il) : cparams.rope_freq_scale;
  if (arch->factors) {
    const ggml_tensor* t = model.get_rope_factors(cparams, il);
    if (t != nullptr) {
      if (t->type != GGML_TYPE_F32 || ggml_nelements(t) != g.n_rot / 2)
        throw std::runtime_error("the RoPE frequency factors of layer " + std::to_string(il) + " are not " +
                                 std::to_string(g.n_rot / 2) + " floats");
      g.freq_factors.resize(static_cast<size_t>(g.n_rot / 2));
      ggml_backend_tensor_get(t, g.freq_factors.data(), 0, g.freq_factors.size() * sizeof(float));
    }
  }
  g.ext_factor = cparams.yarn_ext_factor;
  g.beta_fast = cparams.yarn_beta_fast;
  g.beta_slow = cparams.yarn_beta_slow;
  g.n_ctx_orig = static_cast<int>(cparams.n_ctx_orig_yarn);
  try {
    return rope_params(g);
  } catch (const std::exception& e) {
    throw std::runtime_error("layer " + std::to_string(il) + ": " + e.what());
  }
}

ModelLayers map_model(const llama_model& model, const llama_cparams& cparams) {
  const llama_hparams& hp = model.hparams;
  auto refuse = [](const std::string& why) { throw std::runtime_error(why); };
  if (find_arch(model.arch) == nullptr)
    refuse(std::string("architecture '") + llm_arch_name(model.arch) + "' is not supported (supported: " +
           supported_names() + "; recurrent, hybrid, MLA and other graphs need llama.cpp's own cache: run without "
           "--kv-e8kv)");
  if (hp.use_alibi || hp.attn_soft_cap) refuse("ALiBi and attention logit soft-capping are not supported");
  if (hp.n_layer_kv_from_start >= 0) refuse("layers that share another layer's cache are not supported");
  if (hp.swa_type != LLAMA_SWA_TYPE_NONE && hp.swa_type != LLAMA_SWA_TYPE_STANDARD)
    refuse("sliding windows of type " + std::to_string(hp.swa_type) + " (chunked or symmetric) are not supported");
  if (hp.swa_type == LLAMA_SWA_TYPE_STANDARD && hp.n_swa == 0) refuse("a sliding window of 0 positions");
  ModelLayers m;
  m.n_kv_heads = static_cast<int>(hp.n_head_kv(0));
  m.n_q_heads = static_cast<int>(hp.n_head(0));
  m.head_dim = static_cast<int>(hp.n_embd_head_k(0));
  for (uint32_t il = 0; il < hp.n_layer(); ++il) {
    if (static_cast<int>(hp.n_head_kv(il)) != m.n_kv_heads || static_cast<int>(hp.n_head(il)) != m.n_q_heads)
      refuse("layers with different head counts are not supported");
    if (hp.n_embd_head_k(il) != hp.n_embd_head_v(il) || static_cast<int>(hp.n_embd_head_k(il)) != m.head_dim)
      refuse("keys and values of different head sizes, or layers of different head sizes, are not supported");
    ggml_backend_dev_t dev = model.dev_layer(static_cast<int>(il));
    if (dev != nullptr && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU)
      refuse("layer " + std::to_string(il) + " is offloaded to " + ggml_backend_dev_name(dev) +
             "; e8kv's memory runs on the CPU backend (use -ngl 0)");
  }
  try {
    e8kv::ModelShape{static_cast<int>(hp.n_layer()), m.n_kv_heads, m.n_q_heads, m.head_dim}.validate();
  } catch (const std::exception& e) {
    refuse(std::string("the model's KV shape is not supported: ") + e.what());
  }
  m.where.resize(hp.n_layer());
  for (uint32_t il = 0; il < hp.n_layer(); ++il) {
    LayerGroup g;
    g.rope = rope_of_layer(model, cparams, static_cast<int>(il));
    g.window = hp.is_swa(il) ? static_cast<int32_t>(hp.n_swa) : 0;
    size_t gi = 0;
    while (gi < m.groups.size() && !(same_rope(m.groups[gi].rope, g.rope) && m.groups[gi].window == g.window)) ++gi;
    if (gi == m.groups.size()) m.groups.push_back(g);
    m.where[il] = {static_cast<int>(gi), static_cast<int>(m.groups[gi].layers.size())};
    m.groups[gi].layers.push_back(static_cast<int>(il));
  }
  return m;
}

}  // namespace e8kv_llama
