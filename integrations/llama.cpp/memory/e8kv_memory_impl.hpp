// Internals of e8kv's llama.cpp memory (llama-e8kv-memory.h), shared by the memory
// (e8kv_memory.cpp: sequences, batches, state) and its attention (e8kv_attention.cpp: the
// ggml op, the thread gang, the prompt's dense attention).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/parallel.hpp"
#include "llama-batch.h"
#include "llama-graph.h"
#include "llama-memory.h"

namespace e8kv_llama {

/// A reusable barrier for the threads of one ggml op (all of them run the op at once; ggml
/// itself waits for all of them between two ops, so no thread can be a whole op ahead).
class SpinBarrier {
 public:
  void wait(int n);

 private:
  std::atomic<int> count_{0};
  std::atomic<unsigned> generation_{0};
};

/// The threads of one ggml custom op as an e8kv::Executor: thread 0 does the layer's work and
/// hands each parallel loop (attention heads, chunks of codes) to all of the op's threads,
/// which wait in worker() meanwhile. So e8kv runs on llama.cpp's own threads (-t), no pool of
/// its own. Results do not depend on the thread count (e8kv's attention is deterministic).
class OpGang final : public e8kv::Executor {
 public:
  // Every thread of the op passes the op's own thread count (ggml's nth): a worker may reach its
  // first barrier before thread 0 has called begin(), so nothing it waits on may depend on begin().
  void begin(int n_threads);  ///< thread 0, before any run()
  void end();                 ///< thread 0: releases the workers
  void worker(int n_threads); ///< threads 1..n-1: serve run() until end()
  int concurrency() const override { return n_threads_; }
  void run(int64_t n, const std::function<void(int64_t)>& fn) override;

 private:
  void work();
  SpinBarrier barrier_;
  int n_threads_ = 1;
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  std::mutex error_mutex_;
  std::string error_;
};

/// One sequence of the memory.
struct SequenceState {
  enum class Mode { kEmpty, kPrompt, kCoded, kFailed };
  Mode mode = Mode::kEmpty;
  // Mode::kPrompt: the prompt staged by the current llama_decode call, per layer: keys and values
  // as fp16 bits (what llama.cpp's f16 cache holds, in its bytes: staging costs no more than
  // the f16 cache would), [tokens][n_kv_heads·head_dim], positions, and the last
  // kObservationRows query rows (the observation queries of scoring presets).
  std::vector<std::vector<uint16_t>> prompt_k, prompt_v;
  std::vector<std::vector<int32_t>> prompt_pos;
  std::vector<std::vector<float>> obs_q;
  std::vector<std::vector<int32_t>> obs_pos;
  // Mode::kCoded: the compressed cache.
  std::unique_ptr<e8kv::CompressedKV> cache;
  int32_t pos_min = -1, pos_max = -1;  ///< positions given to the memory (evicted ones included)
  std::string failure;                 ///< Mode::kFailed: why the sequence refuses to decode

  void reset();
  size_t staged_bytes() const;
};

class Memory;

/// The user data of one layer's op.
struct LayerOp {
  Memory* memory = nullptr;
  int layer = 0;
};

/// One token group of a ubatch: the tokens of one sequence, in order.
struct TokenGroup {
  int seq = 0;
  bool prompt = false;
  std::vector<int32_t> tokens;  ///< indices into the ubatch
};

class Memory final : public llama_memory_i {
 public:
  static constexpr int kObservationRows = 32;  ///< as e8kv-eval: the prefill's last 32 queries

  Memory(const e8kv::ModelShape& shape, const e8kv::Config& config, uint32_t n_seq_max, int n_threads_batch,
         std::string spec);
  ~Memory() override;  ///< logs the run's bits per element (every compressed sequence's bytes())

  // llama_memory_i
  llama_memory_context_ptr init_batch(llama_batch_allocr& balloc, uint32_t n_ubatch, bool embd_all) override;
  llama_memory_context_ptr init_full() override;
  llama_memory_context_ptr init_update(llama_context* lctx, bool optimize) override;
  bool get_can_shift() const override { return false; }
  void clear(bool data) override;
  bool seq_rm(llama_seq_id seq_id, llama_pos p0, llama_pos p1) override;
  void seq_cp(llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1) override;
  void seq_keep(llama_seq_id seq_id) override;
  void seq_add(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos shift) override;
  void seq_div(llama_seq_id seq_id, llama_pos p0, llama_pos p1, int d) override;
  llama_pos seq_pos_min(llama_seq_id seq_id) const override;
  llama_pos seq_pos_max(llama_seq_id seq_id) const override;
  std::map<ggml_backend_buffer_type_t, size_t> memory_breakdown() const override;
  void state_write(llama_io_write_i& io, llama_seq_id seq_id = -1, llama_state_seq_flags flags = 0) const override;
  void state_read(llama_io_read_i& io, llama_seq_id seq_id = -1, llama_state_seq_flags flags = 0) override;

  // The memory context's side.
  bool begin_ubatch(const llama_ubatch& ubatch);  ///< false (logged) when the ubatch is refused
  bool ubatch_computed();                         ///< false (logged) when the op failed
  bool decode_finished();                         ///< compresses the staged prompts

  // The graph's side (e8kv_attention.cpp).
  LayerOp* layer_op(int il) { return &layer_ops_[static_cast<size_t>(il)]; }
  void run_layer(int il, ggml_tensor* dst, int ith, int nth);
  void record_error(const std::string& message);
  const e8kv::ModelShape& shape() const { return shape_; }
  float softmax_scale() const { return config_.softmax_scale; }
  size_t resident_bytes() const;

 private:
  void attend_layer(int il, const ggml_tensor* q, const ggml_tensor* k, const ggml_tensor* v, ggml_tensor* dst);
  void attend_prompt(int il, const TokenGroup& g, const ggml_tensor* q, ggml_tensor* dst);
  SequenceState& sequence(llama_seq_id id);
  const SequenceState* find(llama_seq_id id) const;
  void fail(SequenceState& s, int id, const std::string& why);
  /// Adds a compressed sequence about to be dropped to the run's byte count (account first,
  /// then reset: every sequence the memory ever compressed is counted once, at its largest).
  void account(const SequenceState& s);
  void drop(SequenceState& s) {
    account(s);
    s.reset();
  }

  e8kv::ModelShape shape_;
  e8kv::Config config_;
  e8kv::KVCompressor compressor_;
  std::string spec_;
  std::vector<SequenceState> seqs_;
  std::vector<LayerOp> layer_ops_;
  std::unique_ptr<e8kv::ThreadPool> pool_;  ///< compresses prompts (outside the graph)
  OpGang gang_;
  const llama_ubatch* ubatch_ = nullptr;
  std::vector<TokenGroup> groups_;
  std::mutex error_mutex_;
  std::string error_;
  double run_bytes_ = 0, run_elements_ = 0;
  int64_t run_sequences_ = 0, run_tokens_ = 0;
};

class MemoryContext final : public llama_memory_context_i {
 public:
  explicit MemoryContext(llama_memory_status status) : status_(status) {}
  MemoryContext(Memory* memory, std::vector<llama_ubatch> ubatches)
      : status_(LLAMA_MEMORY_STATUS_SUCCESS), memory_(memory), ubatches_(std::move(ubatches)) {}
  explicit MemoryContext(Memory* memory) : status_(LLAMA_MEMORY_STATUS_SUCCESS), memory_(memory) {}

  bool next() override { return ++i_next_ < ubatches_.size(); }
  bool apply() override;
  const llama_ubatch& get_ubatch() const override;
  llama_memory_status get_status() const override { return status_; }
  Memory* memory() const { return memory_; }

 private:
  llama_memory_status status_;
  Memory* memory_ = nullptr;
  std::vector<llama_ubatch> ubatches_;
  size_t i_next_ = 0;
};

/// The attention input of a graph over e8kv's memory: carries the memory to build_attn.
class GraphInput final : public llm_graph_input_attn_kv {
 public:
  GraphInput(const llama_hparams& hparams, const llama_cparams& cparams, Memory* memory)
      : llm_graph_input_attn_kv(hparams, cparams, nullptr), memory(memory) {}
  void set_input(const llama_ubatch* /*ubatch*/) override {}  // the memory context applied it
  bool can_reuse(const llm_graph_params& /*params*/) override { return false; }
  Memory* memory;
};

}  // namespace e8kv_llama
