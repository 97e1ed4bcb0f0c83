#include "e8kv/llama/kv_backend.hpp"

#include <string>

#include "e8kv/attention/dense.hpp"
#include "e8kv/error.hpp"
#include "e8kv/llama/model.hpp"

namespace e8kv::llama {

DenseKvBackend::DenseKvBackend(int n_layers, int n_q_heads, int n_kv_heads, int head_dim)
    : n_layers_(n_layers), n_q_heads_(n_q_heads), n_kv_heads_(n_kv_heads), head_dim_(head_dim) {
  if (!(n_layers > 0 && n_q_heads > 0 && n_kv_heads > 0 && head_dim > 0 && n_q_heads % n_kv_heads == 0))
    throw Error(
        "DenseKvBackend: n_layers, n_q_heads, n_kv_heads, head_dim must be > 0 with n_q_heads a multiple of "
        "n_kv_heads");
  if (head_dim % 8 != 0)
    throw Error("DenseKvBackend: head_dim " + std::to_string(head_dim) + " is not a multiple of 8 (dense_attention)");
  k_.resize(static_cast<size_t>(n_layers));
  v_.resize(static_cast<size_t>(n_layers));
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
  const size_t kvd = static_cast<size_t>(n_kv_heads_) * head_dim_;
  auto& kl = k_[static_cast<size_t>(layer)];
  auto& vl = v_[static_cast<size_t>(layer)];
  kl.insert(kl.end(), k, k + kvd);
  vl.insert(vl.end(), v, v + kvd);
}

void DenseKvBackend::attend(int layer, const float* q, int64_t /*position*/, float* out) {
  check_layer(layer);
  if (!(q != nullptr && out != nullptr)) throw Error("DenseKvBackend::attend: null query or output");
  const int64_t n = size(layer);
  if (!(n > 0))
    throw Error("DenseKvBackend::attend: layer " + std::to_string(layer) + " holds no tokens (append first)");
  DenseRows rows;  // positions null: row r at position r
  rows.keys = k_[static_cast<size_t>(layer)].data();
  rows.values = v_[static_cast<size_t>(layer)].data();
  rows.dtype = DType::kF32;
  rows.n = n;
  const int32_t last = static_cast<int32_t>(n - 1);  // the query sees every stored token
  dense_attention(rows, DenseShape{n_kv_heads_, n_q_heads_, head_dim_, 0.f, 0}, q, &last, 1, out);
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
  k_ = capture.k;
  v_ = capture.v;
}

void DenseKvBackend::clear() {
  for (auto& k : k_) k.clear();
  for (auto& v : v_) v.clear();
}

int64_t DenseKvBackend::size(int layer) const {
  check_layer(layer);
  return static_cast<int64_t>(k_[static_cast<size_t>(layer)].size() / (static_cast<size_t>(n_kv_heads_) * head_dim_));
}

uint64_t DenseKvBackend::bytes() const {
  uint64_t b = 0;
  for (size_t i = 0; i < k_.size(); ++i) b += (k_[i].size() + v_[i].size()) * sizeof(float);
  return b;
}

std::vector<float> DenseKvBackend::keys(int layer) const {
  check_layer(layer);
  return k_[static_cast<size_t>(layer)];
}
std::vector<float> DenseKvBackend::values(int layer) const {
  check_layer(layer);
  return v_[static_cast<size_t>(layer)];
}

}  // namespace e8kv::llama
