// e8kv's attention inside llama.cpp's graph: one ggml custom op per layer, run on llama.cpp's
// threads. A prompt's tokens attend the staged fp16 prompt densely (causal); every later token
// is appended to the compressed cache and attends its codes right after (e8kv::attend), token by
// token in batch order, so a batch gives what single-token decoding gives.
#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <thread>

#include "e8kv/attention/attend.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv_memory_impl.hpp"
#include "ggml.h"
#include "llama-e8kv-memory.h"
#include "llama-impl.h"

namespace e8kv_llama {

void SpinBarrier::wait(int n) {
  const unsigned generation = generation_.load(std::memory_order_acquire);
  if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
    count_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    return;
  }
  // Spin briefly (the other threads are usually microseconds away), then yield the core.
  for (int spins = 0; generation_.load(std::memory_order_acquire) == generation; ++spins)
    if (spins > 512) std::this_thread::yield();
}

void OpGang::begin(int n_threads) {
  n_threads_ = n_threads < 1 ? 1 : n_threads;
  stop_.store(false, std::memory_order_relaxed);
  job_ = nullptr;
  error_.clear();
}

void OpGang::end() {
  if (n_threads_ <= 1) return;
  stop_.store(true, std::memory_order_relaxed);
  barrier_.wait(n_threads_);  // the workers see stop_ and leave the op
}

void OpGang::worker(int n_threads) {
  for (;;) {
    barrier_.wait(n_threads);  // a job (or stop) published by thread 0
    if (stop_.load(std::memory_order_relaxed)) return;
    work();
    barrier_.wait(n_threads);  // job done
  }
}

void OpGang::work() {
  for (;;) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) return;
    try {
      (*job_)(i);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (error_.empty()) error_ = e.what();
    }
  }
}

void OpGang::run(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n_threads_ <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  job_ = &fn;
  n_ = n;
  next_.store(0, std::memory_order_relaxed);
  barrier_.wait(n_threads_);
  work();
  barrier_.wait(n_threads_);
  job_ = nullptr;
  if (!error_.empty()) {
    std::string e;
    e.swap(error_);
    throw e8kv::Error(e);
  }
}

namespace {

void attention_op(ggml_tensor* dst, int ith, int nth, void* userdata) {
  auto* op = static_cast<LayerOp*>(userdata);
  op->memory->run_layer(op->layer, dst, ith, nth);
}

// q·k with eight partial sums (head_dim is a multiple of 8 for every shape e8kv accepts): the
// compiler vectorizes independent sums, not one serial float reduction.
float dot8(const float* a, const float* b, int d) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < d; i += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[i + l] * b[i + l];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

const float* row(const ggml_tensor* t, int64_t token) {
  return reinterpret_cast<const float*>(static_cast<const char*>(t->data) + token * t->nb[2]);
}

}  // namespace

void Memory::run_layer(int il, ggml_tensor* dst, int ith, int nth) {
  if (ith != 0) {
    gang_.worker(nth);
    return;
  }
  gang_.begin(nth);
  try {
    attend_layer(il, dst->src[0], dst->src[1], dst->src[2], dst);
  } catch (const std::exception& e) {
    record_error("layer " + std::to_string(il) + ": " + e.what());
  } catch (...) {
    record_error("layer " + std::to_string(il) + ": unknown exception");
  }
  gang_.end();
}

void Memory::record_error(const std::string& message) {
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (error_.empty()) error_ = message;
}

void Memory::attend_layer(int il, const ggml_tensor* q, const ggml_tensor* k, const ggml_tensor* v, ggml_tensor* dst) {
  if (ubatch_ == nullptr) throw e8kv::Error("e8kv attention ran without a ubatch applied");
  const int d = shape_.head_dim, n_q = shape_.n_q_heads, n_kv = shape_.n_kv_heads;
  const int64_t n_tokens = q->ne[2];
  if (q->type != GGML_TYPE_F32 || k->type != GGML_TYPE_F32 || v->type != GGML_TYPE_F32 || q->ne[0] != d ||
      q->ne[1] != n_q || k->ne[0] != d || k->ne[1] != n_kv || v->ne[0] != d || v->ne[1] != n_kv ||
      k->ne[2] != n_tokens || v->ne[2] != n_tokens || n_tokens != static_cast<int64_t>(ubatch_->n_tokens))
    throw e8kv::Error("e8kv attention: unexpected q/k/v tensors for the ubatch");
  const size_t qrow = static_cast<size_t>(n_q) * static_cast<size_t>(d);
  for (const TokenGroup& g : groups_) {
    SequenceState& s = seqs_[static_cast<size_t>(g.seq)];
    if (g.prompt) {
      auto& K = s.prompt_k[static_cast<size_t>(il)];
      auto& V = s.prompt_v[static_cast<size_t>(il)];
      auto& P = s.prompt_pos[static_cast<size_t>(il)];
      auto& O = s.obs_q[static_cast<size_t>(il)];
      auto& OP = s.obs_pos[static_cast<size_t>(il)];
      const size_t kvrow = static_cast<size_t>(n_kv) * static_cast<size_t>(d);
      for (int32_t t : g.tokens) {
        const float* kr = row(k, t);
        const float* vr = row(v, t);
        for (size_t i = 0; i < kvrow; ++i) {
          if (!std::isfinite(kr[i]) || !std::isfinite(vr[i]))
            throw e8kv::Error("a key or value of position " + std::to_string(ubatch_->pos[t]) + " is not finite");
          K.push_back(e8kv::float_to_fp16_bits(kr[i]));
          V.push_back(e8kv::float_to_fp16_bits(vr[i]));
        }
        P.push_back(ubatch_->pos[t]);
        const float* qr = row(q, t);
        O.insert(O.end(), qr, qr + qrow);
        OP.push_back(ubatch_->pos[t]);
      }
      if (OP.size() > static_cast<size_t>(kObservationRows)) {
        const size_t drop = OP.size() - static_cast<size_t>(kObservationRows);
        OP.erase(OP.begin(), OP.begin() + static_cast<std::ptrdiff_t>(drop));
        O.erase(O.begin(), O.begin() + static_cast<std::ptrdiff_t>(drop * qrow));
      }
      attend_prompt(il, g, q, dst);
    } else {
      e8kv::AttendOptions options;
      options.executor = &gang_;
      for (int32_t t : g.tokens) {
        compressor_.append(*s.cache, il, row(k, t), row(v, t), ubatch_->pos[t]);
        float* out = reinterpret_cast<float*>(static_cast<char*>(dst->data) + t * dst->nb[1]);
        e8kv::attend(*s.cache, il, row(q, t), out, nullptr, options);
      }
    }
  }
}

// The prompt's own attention: what a prefill over llama.cpp's f16 cache computes (the staged fp16
// keys and values, causal by position), in fp32. Work items are (a run of kPromptRun tokens, a kv
// head): the rows the run's last token sees are widened to fp32 once per item and shared by the
// run's tokens and the kv head's query heads, so widening costs 1/(kPromptRun·group) of the dot
// products.
void Memory::attend_prompt(int il, const TokenGroup& g, const ggml_tensor* q, ggml_tensor* dst) {
  constexpr size_t kPromptRun = 8;
  const SequenceState& s = seqs_[static_cast<size_t>(g.seq)];
  const int d = shape_.head_dim, n_q = shape_.n_q_heads, n_kv = shape_.n_kv_heads;
  const int group = n_q / n_kv;
  const auto& K = s.prompt_k[static_cast<size_t>(il)];
  const auto& V = s.prompt_v[static_cast<size_t>(il)];
  const auto& P = s.prompt_pos[static_cast<size_t>(il)];
  const float scale = config_.softmax_scale;
  const size_t n_runs = (g.tokens.size() + kPromptRun - 1) / kPromptRun;
  const size_t stride = static_cast<size_t>(n_kv) * static_cast<size_t>(d);
  const auto seen = [&](int32_t pos) {  // causal: the staged rows up to this position
    size_t n = 0;
    while (n < P.size() && P[n] <= pos) ++n;
    return n;
  };
  gang_.run(static_cast<int64_t>(n_runs) * n_kv, [&](int64_t w) {
    const size_t first = static_cast<size_t>(w / n_kv) * kPromptRun;
    const size_t last = std::min(first + kPromptRun, g.tokens.size());
    const int kvh = static_cast<int>(w % n_kv);
    int32_t run_max = std::numeric_limits<int32_t>::min();
    for (size_t i = first; i < last; ++i) run_max = std::max(run_max, ubatch_->pos[g.tokens[i]]);
    const size_t n_run = seen(run_max);
    thread_local std::vector<float> kf, vf, scores;
    kf.resize(n_run * static_cast<size_t>(d));
    vf.resize(n_run * static_cast<size_t>(d));
    scores.resize(n_run);
    const size_t head_off = static_cast<size_t>(kvh) * static_cast<size_t>(d);
    for (size_t j = 0; j < n_run; ++j) {
      e8kv::fp16_bits_to_floats(K.data() + j * stride + head_off, kf.data() + j * static_cast<size_t>(d),
                                static_cast<size_t>(d));
      e8kv::fp16_bits_to_floats(V.data() + j * stride + head_off, vf.data() + j * static_cast<size_t>(d),
                                static_cast<size_t>(d));
    }
    for (size_t i = first; i < last; ++i) {
      const int32_t t = g.tokens[i];
      const int32_t pos = ubatch_->pos[t];
      const size_t n = seen(pos);
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const float* qh = row(q, t) + static_cast<size_t>(h) * static_cast<size_t>(d);
        float* out = reinterpret_cast<float*>(static_cast<char*>(dst->data) + t * dst->nb[1]) +
                     static_cast<size_t>(h) * static_cast<size_t>(d);
        float m = -std::numeric_limits<float>::infinity();
        for (size_t j = 0; j < n; ++j) {
          scores[j] = dot8(qh, kf.data() + j * static_cast<size_t>(d), d) * scale;
          if (!std::isfinite(scores[j]))
            throw e8kv::Error("prompt attention: the scores of position " + std::to_string(pos) +
                              " overflow the float range");
          m = std::max(m, scores[j]);
        }
        for (int c = 0; c < d; ++c) out[c] = 0.f;
        float sum = 0.f;
        for (size_t j = 0; j < n; ++j) {
          const float e = std::exp(scores[j] - m);
          sum += e;
          const float* vr = vf.data() + j * static_cast<size_t>(d);
          for (int c = 0; c < d; ++c) out[c] += e * vr[c];
        }
        const float inv = n > 0 ? 1.f / sum : 0.f;
        for (int c = 0; c < d; ++c) out[c] *= inv;
      }
    }
  });
}

}  // namespace e8kv_llama

// ---- the graph's entry points (llama-e8kv-memory.h) --------------------------------------------

std::unique_ptr<llm_graph_input_attn_kv> llama_e8kv_graph_input(const llama_memory_context_i* mctx,
                                                                const llama_hparams& hparams,
                                                                const llama_cparams& cparams) {
  const auto* context = dynamic_cast<const e8kv_llama::MemoryContext*>(mctx);
  if (context == nullptr) return nullptr;
  return std::make_unique<e8kv_llama::GraphInput>(hparams, cparams, context->memory());
}

ggml_tensor* llama_e8kv_build_attn(ggml_context* ctx, llm_graph_input_attn_kv* inp, ggml_tensor* q, ggml_tensor* k,
                                   ggml_tensor* v, ggml_tensor* kq_b, ggml_tensor* sinks, float kq_scale, int il) {
  auto* input = dynamic_cast<e8kv_llama::GraphInput*>(inp);
  if (input == nullptr) return nullptr;
  e8kv_llama::Memory* memory = input->memory;
  const float expected = memory->softmax_scale();
  if (kq_b != nullptr || sinks != nullptr || std::fabs(kq_scale - expected) > 1e-6f * expected) {
    // The model's graph asks for what e8kv's memory was not created for: fail the ubatch loudly.
    memory->record_error("layer " + std::to_string(il) +
                         ": the graph asks for an attention bias, attention sinks or a softmax scale (" +
                         std::to_string(kq_scale) + ") that the e8kv memory was not created with (" +
                         std::to_string(expected) + ")");
  }
  const e8kv::ModelShape& shape = memory->shape();
  const int64_t n_tokens = ggml_nelements(q) / (static_cast<int64_t>(shape.head_dim) * shape.n_q_heads);
  auto as_rows = [&](ggml_tensor* t, int heads) {
    if (!ggml_is_contiguous(t)) t = ggml_cont(ctx, t);
    return ggml_reshape_3d(ctx, t, shape.head_dim, heads, n_tokens);
  };
  ggml_tensor* args[3] = {as_rows(q, shape.n_q_heads), as_rows(k, shape.n_kv_heads), as_rows(v, shape.n_kv_heads)};
  // GGML_N_TASKS_MAX: every thread of the graph runs the op (thread 0 leads, the others serve it).
  return ggml_custom_4d(ctx, GGML_TYPE_F32, static_cast<int64_t>(shape.head_dim) * shape.n_q_heads, n_tokens, 1, 1,
                        args, 3, e8kv_llama::attention_op, GGML_N_TASKS_MAX, memory->layer_op(il));
}
