// Llama forward pass: embeddings -> [RMSNorm -> fused QKV -> RoPE -> GQA attention -> output
// projection -> RMSNorm -> fused gate/up -> SwiGLU -> down] x layers -> RMSNorm -> logits.
#include "e8kv/llama/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <unordered_set>

#include "e8kv/attention/dense.hpp"
#include "e8kv/error.hpp"
#include "e8kv/parallel.hpp"
#include "e8kv/llama/gguf.hpp"
#include "e8kv/llama/thread_pool.hpp"
#include "kernels.hpp"

namespace e8kv::llama {

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  PackedMatrix qkv, wo, gate_up, down;
};

struct ModelWeights {
  PackedMatrix embedding;  // [vocab][n_embd]
  PackedMatrix output;     // [vocab][n_embd] when not tied
  std::vector<float> output_norm;
  std::vector<LayerWeights> layers;
  const PackedMatrix& logits_matrix(bool tied) const { return tied ? embedding : output; }
};

namespace {

/// The engine's pool as the library's Executor (e8kv::dense_attention takes one).
class PoolExecutor final : public Executor {
 public:
  explicit PoolExecutor(ThreadPool& pool) : pool_(pool) {}
  int concurrency() const override { return pool_.size(); }
  void run(int64_t n, const std::function<void(int64_t)>& fn) override {
    pool_.run(n, [&](int64_t task, int) { fn(task); });
  }

 private:
  ThreadPool& pool_;
};

}  // namespace

// ---- RoPE -------------------------------------------------------------------------------

Rope::Rope(const ModelConfig& c, std::vector<float> freq_factors) : head_dim_(c.head_dim), rope_dim_(c.rope_dim) {
  const int pairs = rope_dim_ / 2;
  if (!(freq_factors.empty() || static_cast<int>(freq_factors.size()) == pairs))
    throw Error("rope frequency factors must have rope_dim / 2 = " + std::to_string(pairs) + " entries");
  inv_freq_.resize(pairs);
  for (int i = 0; i < pairs; ++i) {
    double f = std::pow(c.rope_theta, -2.0 * i / rope_dim_);
    if (!freq_factors.empty()) {
      if (!(std::isfinite(freq_factors[i]) && freq_factors[i] > 0))
        throw Error("rope frequency factors must be finite and > 0");
      f /= freq_factors[i];
    }
    if (c.rope_scaling == RopeScaling::kLinear) f /= c.rope_scaling_factor;
    inv_freq_[i] = f;
  }
}

void Rope::angles(int64_t position, float* cos_out, float* sin_out) const {
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const double a = static_cast<double>(position) * inv_freq_[i];
    cos_out[i] = static_cast<float>(std::cos(a));
    sin_out[i] = static_cast<float>(std::sin(a));
  }
}

void Rope::rotate(float* x, int n_heads, const float* cos_v, const float* sin_v, float sign) const {
  const int pairs = rope_dim_ / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* xh = x + static_cast<int64_t>(h) * head_dim_;
    for (int i = 0; i < pairs; ++i) {
      const float c = cos_v[i], s = sign * sin_v[i];
      const float x0 = xh[2 * i], x1 = xh[2 * i + 1];
      xh[2 * i] = x0 * c - x1 * s;
      xh[2 * i + 1] = x0 * s + x1 * c;
    }
  }
}

void Rope::apply(float* x, int n_heads, int64_t position) const {
  std::vector<float> c(inv_freq_.size()), s(inv_freq_.size());
  angles(position, c.data(), s.data());
  rotate(x, n_heads, c.data(), s.data(), 1.0f);
}

void Rope::remove(float* x, int n_heads, int64_t position) const {
  std::vector<float> c(inv_freq_.size()), s(inv_freq_.size());
  angles(position, c.data(), s.data());
  rotate(x, n_heads, c.data(), s.data(), -1.0f);
}

// ---- loading ----------------------------------------------------------------------------

namespace {

std::vector<float> load_tensor(const GgufFile& f, const std::string& name, const std::vector<int64_t>& dims) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (!(t != nullptr)) throw Error("tensor '" + name + "' is missing from '" + f.name() + "'");
  if (t->dims != dims) {
    auto show = [](const std::vector<int64_t>& d) {
      std::string s = "[";
      for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
      return s + "]";
    };
    throw Error("tensor '" + name + "' has shape " + show(t->dims) + ", expected " + show(dims));
  }
  std::vector<float> v = f.dequantize(*t);
  for (size_t i = 0; i < v.size(); ++i)
    if (!(std::isfinite(v[i])))
      throw Error("tensor '" + name + "' holds a non-finite value at element " + std::to_string(i));
  return v;
}

}  // namespace

Model::Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::load(const std::string& path, int threads) { return from_gguf(GgufFile::open(path), threads); }

Model Model::from_gguf(const GgufFile& f, int threads) {
  Model m;
  m.config_ = read_config(f);
  const ModelConfig& c = m.config_;
  m.tokenizer_ = Tokenizer::from_gguf(f);
  if (!(m.tokenizer_.vocab_size() <= c.vocab_size))
    throw Error("the tokenizer has " + std::to_string(m.tokenizer_.vocab_size()) +
                " tokens but token_embd.weight only " + std::to_string(c.vocab_size) + " rows");
  std::vector<float> freq_factors;
  if (c.rope_freq_factors) freq_factors = load_tensor(f, "rope_freqs.weight", {c.rope_dim / 2});
  m.rope_ = std::make_unique<Rope>(c, std::move(freq_factors));
  m.pool_ = std::make_unique<ThreadPool>(threads);

  auto w = std::make_unique<ModelWeights>();
  const int64_t d = c.n_embd, qd = c.n_q_dim(), kvd = c.n_kv_dim(), ff = c.n_ff, vocab = c.vocab_size;
  {
    const auto e = load_tensor(f, "token_embd.weight", {d, vocab});
    w->embedding = pack_matrix(e.data(), vocab, d);
  }
  if (!c.tied_embeddings) {
    const auto o = load_tensor(f, "output.weight", {d, vocab});
    w->output = pack_matrix(o.data(), vocab, d);
  }
  w->output_norm = load_tensor(f, "output_norm.weight", {d});
  w->layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w->layers[l];
    L.attn_norm = load_tensor(f, b + "attn_norm.weight", {d});
    L.ffn_norm = load_tensor(f, b + "ffn_norm.weight", {d});
    {
      const auto q = load_tensor(f, b + "attn_q.weight", {d, qd});
      const auto k = load_tensor(f, b + "attn_k.weight", {d, kvd});
      const auto v = load_tensor(f, b + "attn_v.weight", {d, kvd});
      L.qkv = pack_stacked({&q, &k, &v}, d);
    }
    {
      const auto o = load_tensor(f, b + "attn_output.weight", {qd, d});
      L.wo = pack_matrix(o.data(), d, qd);
    }
    {
      const auto g = load_tensor(f, b + "ffn_gate.weight", {d, ff});
      const auto u = load_tensor(f, b + "ffn_up.weight", {d, ff});
      L.gate_up = pack_stacked({&g, &u}, d);
    }
    {
      const auto dn = load_tensor(f, b + "ffn_down.weight", {ff, d});
      L.down = pack_matrix(dn.data(), d, ff);
    }
  }
  m.weights_ = std::move(w);
  return m;
}

void Model::set_threads(int threads) { pool_ = std::make_unique<ThreadPool>(threads); }
int Model::threads() const { return pool_->size(); }

std::vector<float> Model::embedding(int32_t token) const {
  if (!(token >= 0 && token < config_.vocab_size))
    throw Error("token id " + std::to_string(token) + " is outside [0, " + std::to_string(config_.vocab_size) + ")");
  std::vector<float> out(config_.n_embd);
  weights_->embedding.row(token, out.data());
  return out;
}

// ---- forward ----------------------------------------------------------------------------

std::vector<float> Model::forward(const std::vector<int32_t>& tokens, const std::vector<int64_t>& positions,
                                  PrefillCapture* capture, LogitsMode mode,
                                  const std::vector<KvBackend*>* backends) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t d = c.n_embd, qd = c.n_q_dim(), kvd = c.n_kv_dim(), ff = c.n_ff, hd = c.head_dim;
  const int64_t qkv_w = qd + 2 * kvd;
  const int pairs = c.rope_dim / 2;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  ThreadPool& pool = *pool_;
  const ModelWeights& W = *weights_;

  for (int64_t i = 0; i < n; ++i) {
    if (!(tokens[i] >= 0 && tokens[i] < c.vocab_size))
      throw Error("token #" + std::to_string(i) + " = " + std::to_string(tokens[i]) + " is outside [0, " +
                  std::to_string(c.vocab_size) + ")");
    if (!(positions[i] >= 0)) throw Error("position #" + std::to_string(i) + " is negative");
  }

  std::vector<float> x(n * d), h(n * d), qkv(n * qkv_w), att(n * qd), gu(n * 2 * ff), act(n * ff);
  std::vector<float> cosv(n * pairs), sinv(n * pairs);
  for (int64_t i = 0; i < n; ++i) {
    W.embedding.row(tokens[i], x.data() + i * d);
    rope_->angles(positions[i], cosv.data() + i * pairs, sinv.data() + i * pairs);
  }
  const int64_t row_block = 16;
  const int64_t row_tasks = (n + row_block - 1) / row_block;
  auto for_rows = [&](auto&& fn) {
    pool.run(row_tasks, [&](int64_t t, int) {
      for (int64_t i = t * row_block; i < std::min(n, (t + 1) * row_block); ++i) fn(i);
    });
  };

  if (capture) {
    capture->n_tokens = n;
    capture->k.assign(c.n_layers, {});
    capture->v.assign(c.n_layers, {});
    capture->q_obs.assign(c.n_layers, {});
    capture->k_pre_rope.assign(capture->capture_pre_rope_keys ? c.n_layers : 0, {});
    if (!(capture->obs_window >= 0)) throw Error("PrefillCapture::obs_window must be >= 0");
  }
  // Dense causal attention (no backends): query i sees rows 0..i, by index.
  std::vector<int32_t> index;
  std::vector<float> queries;
  if (!backends) {
    index.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) index[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    queries.resize(static_cast<size_t>(n * qd));
  }
  PoolExecutor executor(pool);

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = W.layers[l];
    for_rows([&](int64_t i) { rms_norm(x.data() + i * d, L.attn_norm.data(), d, c.rms_eps, h.data() + i * d); });
    matmul(h.data(), n, d, L.qkv, qkv.data(), qkv_w, false, pool);

    if (capture) {
      auto copy_rows = [&](std::vector<float>& dst, int64_t col, int64_t width, int64_t first) {
        dst.resize(static_cast<size_t>((n - first) * width));
        for (int64_t i = first; i < n; ++i)
          std::memcpy(dst.data() + (i - first) * width, qkv.data() + i * qkv_w + col, width * sizeof(float));
      };
      if (capture->capture_pre_rope_keys) copy_rows(capture->k_pre_rope[l], qd, kvd, 0);
      copy_rows(capture->v[l], qd + kvd, kvd, 0);
    }
    for_rows([&](int64_t i) {
      float* row = qkv.data() + i * qkv_w;
      rope_->rotate(row, c.n_heads, cosv.data() + i * pairs, sinv.data() + i * pairs);
      rope_->rotate(row + qd, c.n_kv_heads, cosv.data() + i * pairs, sinv.data() + i * pairs);
    });
    if (capture) {
      const int64_t first_obs = n - std::min<int64_t>(n, capture->obs_window);
      auto& k = capture->k[l];
      k.resize(static_cast<size_t>(n * kvd));
      for (int64_t i = 0; i < n; ++i) std::memcpy(k.data() + i * kvd, qkv.data() + i * qkv_w + qd, kvd * sizeof(float));
      auto& q = capture->q_obs[l];
      q.resize(static_cast<size_t>((n - first_obs) * qd));
      for (int64_t i = first_obs; i < n; ++i)
        std::memcpy(q.data() + (i - first_obs) * qd, qkv.data() + i * qkv_w, qd * sizeof(float));
    }

    if (!backends) {
      // The library's dense attention over the rows where they lie (row stride qkv_w).
      for_rows([&](int64_t i) { std::memcpy(queries.data() + i * qd, qkv.data() + i * qkv_w, qd * sizeof(float)); });
      DenseRows rows;
      rows.keys = qkv.data() + qd;
      rows.values = qkv.data() + qd + kvd;
      rows.dtype = DType::kF32;
      rows.n = n;
      rows.positions = index.data();
      rows.row_stride = qkv_w;
      AttendOptions options;
      options.executor = &executor;
      dense_attention(rows, DenseShape{c.n_kv_heads, c.n_heads, static_cast<int>(hd), scale, 0}, queries.data(),
                      index.data(), n, att.data(), nullptr, options);
    } else {
      auto step = [&](int64_t b) {
        const float* row = qkv.data() + b * qkv_w;
        KvBackend* kv = (*backends)[b];
        kv->append(l, row + qd, row + qd + kvd, positions[b]);
        kv->attend(l, row, positions[b], att.data() + b * qd);
      };
      if (concurrent_backends_)
        pool.run(n, [&](int64_t b, int) { step(b); });
      else
        for (int64_t b = 0; b < n; ++b) step(b);
    }

    matmul(att.data(), n, qd, L.wo, x.data(), d, true, pool);
    for_rows([&](int64_t i) { rms_norm(x.data() + i * d, L.ffn_norm.data(), d, c.rms_eps, h.data() + i * d); });
    matmul(h.data(), n, d, L.gate_up, gu.data(), 2 * ff, false, pool);
    for_rows([&](int64_t i) { swiglu(gu.data() + i * 2 * ff, gu.data() + i * 2 * ff + ff, ff, act.data() + i * ff); });
    matmul(act.data(), n, ff, L.down, x.data(), d, true, pool);
  }

  if (mode == LogitsMode::kNone || n == 0) return {};
  const int64_t first = mode == LogitsMode::kLast ? n - 1 : 0;
  const int64_t m = n - first;
  for (int64_t i = first; i < n; ++i) rms_norm(x.data() + i * d, W.output_norm.data(), d, c.rms_eps, h.data() + i * d);
  std::vector<float> logits(static_cast<size_t>(m * c.vocab_size));
  matmul(h.data() + first * d, m, d, W.logits_matrix(c.tied_embeddings), logits.data(), c.vocab_size, false, pool);
  return logits;
}

std::vector<float> Model::prefill(const std::vector<int32_t>& tokens, PrefillCapture* capture, LogitsMode mode) const {
  std::vector<int64_t> positions(tokens.size());
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int64_t>(i);
  return forward(tokens, positions, capture, mode, nullptr);
}

std::vector<float> Model::decode_step(int32_t token, int64_t position, KvBackend& kv) const {
  return decode_batch({token}, {position}, {&kv});
}

std::vector<float> Model::decode_batch(const std::vector<int32_t>& tokens, const std::vector<int64_t>& positions,
                                       const std::vector<KvBackend*>& backends) const {
  if (!(tokens.size() == positions.size() && tokens.size() == backends.size()))
    throw Error("decode_batch: tokens, positions and backends must have the same length (got " +
                std::to_string(tokens.size()) + ", " + std::to_string(positions.size()) + ", " +
                std::to_string(backends.size()) + ")");
  std::unordered_set<const KvBackend*> seen;
  for (const KvBackend* b : backends) {
    if (!(b != nullptr)) throw Error("decode_batch: a backend is null");
    if (!(seen.insert(b).second)) throw Error("decode_batch: the same backend appears twice in one batch");
  }
  return forward(tokens, positions, nullptr, LogitsMode::kAll, &backends);
}

}  // namespace e8kv::llama
