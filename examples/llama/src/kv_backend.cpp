#include "e8kv/llama/kv_backend.hpp"

#include <algorithm>
#include <cmath>

#include "e8kv/error.hpp"
#include "e8kv/llama/model.hpp"
#include "kernels.hpp"

namespace e8kv::llama {

DenseKvBackend::DenseKvBackend(int n_layers, int n_q_heads, int n_kv_heads, int head_dim)
    : n_layers_(n_layers), n_q_heads_(n_q_heads), n_kv_heads_(n_kv_heads), head_dim_(head_dim) {
  if (!(n_layers > 0 && n_q_heads > 0 && n_kv_heads > 0 && head_dim > 0 && n_q_heads % n_kv_heads == 0))
    throw Error(
        "DenseKvBackend: n_layers, n_q_heads, n_kv_heads, head_dim must be > 0 with n_q_heads a multiple of "
        "n_kv_heads");
  k_.resize(static_cast<size_t>(n_layers) * n_kv_heads);
  v_.resize(static_cast<size_t>(n_layers) * n_kv_heads);
}

DenseKvBackend::DenseKvBackend(const ModelConfig& c)
    : DenseKvBackend(c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) {}

DenseKvBackend DenseKvBackend::from_capture(const ModelConfig& config, const PrefillCapture& capture) {
  DenseKvBackend b(config);
  b.seed(capture);
  return b;
}

void DenseKvBackend::check_layer(int layer) const {
  if (!(layer >= 0 && layer < n_layers_))
    throw Error("DenseKvBackend: layer " + std::to_string(layer) + " is outside [0, " + std::to_string(n_layers_) +
                ")");
}

void DenseKvBackend::append(int layer, const float* k, const float* v, int64_t /*position*/) {
  check_layer(layer);
  if (!(k != nullptr && v != nullptr)) throw Error("DenseKvBackend::append: null key or value");
  for (int g = 0; g < n_kv_heads_; ++g) {
    auto& kg = k_[static_cast<size_t>(layer) * n_kv_heads_ + g];
    auto& vg = v_[static_cast<size_t>(layer) * n_kv_heads_ + g];
    kg.insert(kg.end(), k + g * head_dim_, k + (g + 1) * head_dim_);
    vg.insert(vg.end(), v + g * head_dim_, v + (g + 1) * head_dim_);
  }
}

void DenseKvBackend::attend(int layer, const float* q, int64_t /*position*/, float* out) {
  check_layer(layer);
  if (!(q != nullptr && out != nullptr)) throw Error("DenseKvBackend::attend: null query or output");
  const size_t base = static_cast<size_t>(layer) * n_kv_heads_;
  const int64_t n = static_cast<int64_t>(k_[base].size()) / head_dim_;
  if (!(n > 0))
    throw Error("DenseKvBackend::attend: layer " + std::to_string(layer) + " holds no tokens (append first)");
  const int group = n_q_heads_ / n_kv_heads_;
  scratch_.resize(static_cast<size_t>(group) * n);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim_)));
  for (int g = 0; g < n_kv_heads_; ++g)
    attend_group(q + static_cast<int64_t>(g) * group * head_dim_, group, head_dim_, k_[base + g].data(),
                 v_[base + g].data(), head_dim_, n, scale, out + static_cast<int64_t>(g) * group * head_dim_,
                 scratch_.data());
}

void DenseKvBackend::seed(const PrefillCapture& capture) {
  if (!(static_cast<int>(capture.k.size()) == n_layers_ && static_cast<int>(capture.v.size()) == n_layers_))
    throw Error("DenseKvBackend::seed: the capture has " + std::to_string(capture.k.size()) + " layers, the backend " +
                std::to_string(n_layers_));
  const size_t expect = static_cast<size_t>(capture.n_tokens) * n_kv_heads_ * head_dim_;
  for (int l = 0; l < n_layers_; ++l)
    if (!(capture.k[l].size() == expect && capture.v[l].size() == expect))
      throw Error("DenseKvBackend::seed: layer " + std::to_string(l) + " of the capture does not hold n_tokens x " +
                  "n_kv_heads x head_dim values");
  const int64_t n = capture.n_tokens, kvd = static_cast<int64_t>(n_kv_heads_) * head_dim_;
  for (int l = 0; l < n_layers_; ++l)
    for (int g = 0; g < n_kv_heads_; ++g) {
      auto& kg = k_[static_cast<size_t>(l) * n_kv_heads_ + g];
      auto& vg = v_[static_cast<size_t>(l) * n_kv_heads_ + g];
      kg.resize(static_cast<size_t>(n * head_dim_));
      vg.resize(static_cast<size_t>(n * head_dim_));
      for (int64_t t = 0; t < n; ++t) {
        std::copy_n(capture.k[l].data() + t * kvd + g * head_dim_, head_dim_, kg.data() + t * head_dim_);
        std::copy_n(capture.v[l].data() + t * kvd + g * head_dim_, head_dim_, vg.data() + t * head_dim_);
      }
    }
}

void DenseKvBackend::clear() {
  for (auto& k : k_) k.clear();
  for (auto& v : v_) v.clear();
}

int64_t DenseKvBackend::size(int layer) const {
  check_layer(layer);
  return static_cast<int64_t>(k_[static_cast<size_t>(layer) * n_kv_heads_].size()) / head_dim_;
}

uint64_t DenseKvBackend::bytes() const {
  uint64_t b = 0;
  for (size_t i = 0; i < k_.size(); ++i) b += (k_[i].size() + v_[i].size()) * sizeof(float);
  return b;
}

std::vector<float> DenseKvBackend::gather(const std::vector<std::vector<float>>& store, int layer) const {
  check_layer(layer);
  const int64_t n = size(layer), kvd = static_cast<int64_t>(n_kv_heads_) * head_dim_;
  std::vector<float> out(static_cast<size_t>(n * kvd));
  for (int g = 0; g < n_kv_heads_; ++g) {
    const auto& src = store[static_cast<size_t>(layer) * n_kv_heads_ + g];
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(src.data() + t * head_dim_, head_dim_, out.data() + t * kvd + g * head_dim_);
  }
  return out;
}

std::vector<float> DenseKvBackend::keys(int layer) const { return gather(k_, layer); }
std::vector<float> DenseKvBackend::values(int layer) const { return gather(v_, layer); }

}  // namespace e8kv::llama
