// e8kv's attention inside llama.cpp's graph: one ggml custom op per layer, run on llama.cpp's
// threads (OpGang). A prompt chunk's tokens attend their own staged rows densely (e8kv's dense
// attention: causal, the layer's window) merged with the codes of the chunks before them; the
// tokens of a later call are appended to the codes and attend them as decoding them one at a
// time would, bit for bit (KVCompressor::append_attend shares what they see alike).
#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>

#include "e8kv/attention/attend.hpp"
#include "e8kv/attention/dense.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv_memory.hpp"
#include "ggml.h"
#include "llama-e8kv-memory.h"
#include "llama-impl.h"
#include "llama-model.h"

namespace e8kv_llama {

namespace {

void attention_op(ggml_tensor* dst, int ith, int nth, void* userdata) {
  auto* op = static_cast<LayerOp*>(userdata);
  op->memory->run_layer(*op->context, op->layer, dst, ith, nth);
}

const float* row(const ggml_tensor* t, int64_t token) {
  return reinterpret_cast<const float*>(static_cast<const char*>(t->data) + token * t->nb[2]);
}

float* out_row(ggml_tensor* dst, int64_t token) {
  return reinterpret_cast<float*>(static_cast<char*>(dst->data) + token * dst->nb[1]);
}

// The first non-finite value of a key or value row, as an error naming the position.
void check_finite(const float* k, const float* v, size_t n, int32_t pos) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(k[i]) || !std::isfinite(v[i]))
      throw e8kv::Error("a key or value of position " + std::to_string(pos) + " is not finite");
}

}  // namespace

void Memory::run_layer(const MemoryContext& context, int il, ggml_tensor* dst, int ith, int nth) {
  if (ith != 0) {
    gang_.worker(nth);
    return;
  }
  gang_.begin(nth);
  try {
    attend_layer(context, il, dst->src[0], dst->src[1], dst->src[2], dst);
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

void Memory::attend_layer(const MemoryContext& context, int il, const ggml_tensor* q, const ggml_tensor* k,
                          const ggml_tensor* v, ggml_tensor* dst) {
  const llama_ubatch* ub = context.applied();
  if (ub == nullptr) throw e8kv::Error("e8kv attention ran without a ubatch applied");
  const int d = layers_.head_dim, n_q = layers_.n_q_heads, n_kv = layers_.n_kv_heads;
  const int64_t n_tokens = q->ne[2];
  if (q->type != GGML_TYPE_F32 || k->type != GGML_TYPE_F32 || v->type != GGML_TYPE_F32 || q->ne[0] != d ||
      q->ne[1] != n_q || k->ne[0] != d || k->ne[1] != n_kv || v->ne[0] != d || v->ne[1] != n_kv ||
      k->ne[2] != n_tokens || v->ne[2] != n_tokens || n_tokens != static_cast<int64_t>(ub->n_tokens))
    throw e8kv::Error("e8kv attention: unexpected q/k/v tensors for the ubatch");
  for (const TokenGroup& g : context.groups())
    if (g.prompt) attend_prompt(*ub, g, il, q, k, v, dst);
  attend_appended(*ub, context.groups(), il, q, k, v, dst);
}

// A prompt chunk: its rows staged as fp16 (what llama.cpp's f16 cache would hold), attended
// densely and causally, merged with the codes of the sequence's earlier chunks in this group.
void Memory::attend_prompt(const llama_ubatch& ub, const TokenGroup& tg, int il, const ggml_tensor* q,
                           const ggml_tensor* k, const ggml_tensor* v, ggml_tensor* dst) {
  Sequence& s = seqs_[static_cast<size_t>(tg.seq)];
  PromptStage& st = s.stage;
  const auto [gi, j] = layers_.where[static_cast<size_t>(il)];
  const GroupCodec& gc = groups_[static_cast<size_t>(gi)];
  const int d = layers_.head_dim, n_q = layers_.n_q_heads, n_kv = layers_.n_kv_heads;
  const size_t kv_row = static_cast<size_t>(n_kv) * d, q_row = static_cast<size_t>(n_q) * d;
  const size_t n = tg.tokens.size();
  const size_t l = static_cast<size_t>(il);
  if (st.positions.size() != n || st.k[l].size() != n * kv_row)
    throw e8kv::Error("the prompt stage of " + std::to_string(tg.seq) + " does not match the ubatch");
  std::vector<float> qbuf(n * q_row), out(n * q_row), lse(n * static_cast<size_t>(n_q));
  for (size_t i = 0; i < n; ++i) {
    const int32_t t = tg.tokens[i];
    const float* kr = row(k, t);
    const float* vr = row(v, t);
    check_finite(kr, vr, kv_row, ub.pos[t]);
    e8kv::floats_to_fp16_bits(kr, st.k[l].data() + i * kv_row, kv_row);
    e8kv::floats_to_fp16_bits(vr, st.v[l].data() + i * kv_row, kv_row);
    std::copy(row(q, t), row(q, t) + q_row, qbuf.data() + i * q_row);
  }
  const size_t n_obs = st.obs_positions.size();
  std::copy(qbuf.end() - static_cast<std::ptrdiff_t>(n_obs * q_row), qbuf.end(), st.obs_q[l].begin());
  e8kv::AttendOptions options;
  options.executor = &gang_;
  const float scale = gc.config.softmax_scale;
  e8kv::DenseRows rows;
  rows.keys = st.k[l].data();
  rows.values = st.v[l].data();
  rows.dtype = e8kv::DType::kF16;
  rows.n = static_cast<int64_t>(n);
  rows.positions = st.positions.data();
  e8kv::dense_attention(rows, e8kv::DenseShape{n_kv, n_q, d, scale, gc.layers.window}, qbuf.data(), st.positions.data(),
                        static_cast<int64_t>(n), out.data(), lse.data(), options);
  const e8kv::CompressedKV* cache = s.caches.empty() ? nullptr : s.caches[static_cast<size_t>(gi)].get();
  if (cache != nullptr && cache->last_position(j) >= 0) {
    std::vector<float> out_codes(n * q_row), lse_codes(n * static_cast<size_t>(n_q));
    std::vector<int32_t> lows;
    if (gc.layers.window > 0)
      for (int32_t p : st.positions) lows.push_back(p - gc.layers.window + 1);
    // Every token of the chunk sees every code (they all precede it): one request per block of
    // tokens, so that the work items (block × chunk of codes) spread over the op's threads even
    // when the codes are one chunk (a request's chunk is one item, whatever its tokens).
    constexpr size_t kBlock = 64;
    std::vector<e8kv::AttendRequest> requests;
    for (size_t b = 0; b < n; b += kBlock) {
      e8kv::AttendRequest r;
      r.cache = cache;
      r.layer = j;
      r.n_tokens = static_cast<int>(std::min(kBlock, n - b));
      r.q = qbuf.data() + b * q_row;
      r.out = out_codes.data() + b * q_row;
      r.lse = lse_codes.data() + b * static_cast<size_t>(n_q);
      if (!lows.empty()) r.token_min_positions = lows.data() + b;
      requests.push_back(r);
    }
    e8kv::attend_batch(requests, options);
    for (size_t i = 0; i < n; ++i)
      e8kv::merge_attention(out.data() + i * q_row, lse.data() + i * n_q, out_codes.data() + i * q_row,
                            lse_codes.data() + i * n_q, n_q, d, out.data() + i * q_row, lse.data() + i * n_q);
  }
  for (size_t i = 0; i < n; ++i) std::copy(out.data() + i * q_row, out.data() + (i + 1) * q_row, out_row(dst, tg.tokens[i]));
}

// The tokens of later calls, every sequence of the ubatch at once: KVCompressor::append_attend
// appends them and attends each as decoding it alone would, bit for bit (in rounds: up to each
// sequence's next flush, then one attend_batch for every sequence's segment).
void Memory::attend_appended(const llama_ubatch& ub, const std::vector<TokenGroup>& groups, int il,
                             const ggml_tensor* q, const ggml_tensor* k, const ggml_tensor* v, ggml_tensor* dst) {
  const auto [gi, j] = layers_.where[static_cast<size_t>(il)];
  const GroupCodec& gc = groups_[static_cast<size_t>(gi)];
  const size_t kv_row = static_cast<size_t>(layers_.n_kv_heads) * layers_.head_dim;
  const size_t q_row = static_cast<size_t>(layers_.n_q_heads) * layers_.head_dim;
  struct Rows {  // a sequence's tokens, gathered contiguous (the ubatch may interleave sequences)
    std::vector<float> q, k, v, out;
    std::vector<int32_t> positions, lows;
  };
  std::vector<Rows> rows;
  std::vector<const TokenGroup*> which;
  std::vector<e8kv::KVCompressor::AppendAttendRequest> requests;
  for (const TokenGroup& g : groups)
    if (!g.prompt) which.push_back(&g);
  rows.resize(which.size());
  for (size_t w = 0; w < which.size(); ++w) {
    const TokenGroup& g = *which[w];
    Sequence& s = seqs_[static_cast<size_t>(g.seq)];
    e8kv::CompressedKV* cache = static_cast<size_t>(gi) < s.caches.size() ? s.caches[static_cast<size_t>(gi)].get() : nullptr;
    if (cache == nullptr) throw e8kv::Error("sequence " + std::to_string(g.seq) + " holds no cache for " + gc.layers.describe());
    Rows& r = rows[w];
    const size_t n = g.tokens.size();
    r.q.resize(n * q_row);
    r.k.resize(n * kv_row);
    r.v.resize(n * kv_row);
    r.out.resize(n * q_row);
    for (size_t i = 0; i < n; ++i) {
      const int32_t t = g.tokens[i];
      std::copy(row(q, t), row(q, t) + q_row, r.q.data() + i * q_row);
      std::copy(row(k, t), row(k, t) + kv_row, r.k.data() + i * kv_row);
      std::copy(row(v, t), row(v, t) + kv_row, r.v.data() + i * kv_row);
      r.positions.push_back(ub.pos[t]);
      if (gc.layers.window > 0) r.lows.push_back(ub.pos[t] - gc.layers.window + 1);
    }
    e8kv::KVCompressor::AppendAttendRequest a;
    a.cache = cache;
    a.layer = j;
    a.n_tokens = static_cast<int>(n);
    a.k = r.k.data();
    a.v = r.v.data();
    a.positions = r.positions.data();
    a.q = r.q.data();
    a.out = r.out.data();
    a.token_min_positions = r.lows.empty() ? nullptr : r.lows.data();
    requests.push_back(a);
  }
  if (requests.empty()) return;
  gc.compressor->append_attend(requests, &gang_);
  for (size_t w = 0; w < which.size(); ++w)
    for (size_t i = 0; i < which[w]->tokens.size(); ++i)
      std::copy(rows[w].out.data() + i * q_row, rows[w].out.data() + (i + 1) * q_row, out_row(dst, which[w]->tokens[i]));
}

void Memory::refuse_graph(const std::string& why) {
  if (broken_.empty()) broken_ = why;
  record_error(why);
}

}  // namespace e8kv_llama

// ---- the graph's entry points (llama-e8kv-memory.h) --------------------------------------------

std::unique_ptr<llm_graph_input_attn_kv> llama_e8kv_graph_input(const llama_memory_context_i* mctx,
                                                                const llama_hparams& hparams,
                                                                const llama_cparams& cparams) {
  const auto* context = dynamic_cast<const e8kv_llama::MemoryContext*>(mctx);
  if (context == nullptr) return nullptr;
  return std::make_unique<e8kv_llama::GraphInput>(hparams, cparams, context->memory(), context);
}

std::unique_ptr<llm_graph_input_attn_kv_iswa> llama_e8kv_graph_input_iswa(const llama_memory_context_i* mctx,
                                                                          const llama_hparams& hparams,
                                                                          const llama_cparams& cparams) {
  const auto* context = dynamic_cast<const e8kv_llama::MemoryContext*>(mctx);
  if (context == nullptr) return nullptr;
  return std::make_unique<e8kv_llama::GraphInputIswa>(hparams, cparams, context->memory(), context);
}

ggml_tensor* llama_e8kv_build_attn(ggml_context* ctx, llm_graph_input_i* inp, ggml_tensor* q, ggml_tensor* k,
                                   ggml_tensor* v, ggml_tensor* kq_b, ggml_tensor* sinks, float kq_scale, int il) {
  e8kv_llama::GraphOps* graph = nullptr;
  if (auto* a = dynamic_cast<e8kv_llama::GraphInput*>(inp)) graph = &a->graph;
  else if (auto* b = dynamic_cast<e8kv_llama::GraphInputIswa*>(inp)) graph = &b->graph;
  if (graph == nullptr) return nullptr;
  e8kv_llama::Memory* memory = graph->memory;
  if (kq_b != nullptr || sinks != nullptr || k == nullptr || v == nullptr)
    // The model's graph asks for what e8kv's memory does not do: refuse its batches loudly.
    memory->refuse_graph("layer " + std::to_string(il) +
                         "'s graph asks for an attention bias, attention sinks or keys shared with another layer, "
                         "which e8kv's memory does not support");
  else
    memory->adopt_softmax_scale(il, kq_scale);
  const auto& m = memory->layers();
  const int64_t n_tokens = ggml_nelements(q) / (static_cast<int64_t>(m.head_dim) * m.n_q_heads);
  auto as_rows = [&](ggml_tensor* t, int heads) {
    if (t == nullptr) t = q;  // refused above: any tensor of the right size keeps the graph valid
    if (!ggml_is_contiguous(t)) t = ggml_cont(ctx, t);
    return ggml_reshape_3d(ctx, t, m.head_dim, heads, ggml_nelements(t) / (static_cast<int64_t>(m.head_dim) * heads));
  };
  ggml_tensor* args[3] = {as_rows(q, m.n_q_heads), as_rows(k, m.n_kv_heads), as_rows(v, m.n_kv_heads)};
  // GGML_N_TASKS_MAX: every thread of the graph runs the op (thread 0 leads, the others serve it).
  return ggml_custom_4d(ctx, GGML_TYPE_F32, static_cast<int64_t>(m.head_dim) * m.n_q_heads, n_tokens, 1, 1, args, 3,
                        e8kv_llama::attention_op, GGML_N_TASKS_MAX, &graph->ops[static_cast<size_t>(il)]);
}
