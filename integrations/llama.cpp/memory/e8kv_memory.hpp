// e8kv's llama.cpp memory (llama-e8kv-memory.h): the llama_memory_i (sequences, batches, state),
// its memory context (the ubatch being run and its token groups, which the graph's ops read) and
// the graph inputs that carry both to build_attn. The op itself is e8kv_attention.cpp; a
// sequence's caches and stage e8kv_sequence.hpp; the model's layers e8kv_layers.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "e8kv_layers.hpp"
#include "e8kv_op_gang.hpp"
#include "e8kv_sequence.hpp"
#include "llama-batch.h"
#include "llama-graph.h"
#include "llama-memory.h"

namespace e8kv_llama {

/// One token group of a ubatch: the tokens of one sequence, in batch order.
struct TokenGroup {
  int seq = 0;
  bool prompt = false;          ///< staged and attended densely (the sequence's first call)
  std::vector<int32_t> tokens;  ///< indices into the ubatch
};

class Memory;
class MemoryContext;

/// The user data of one layer's op.
struct LayerOp {
  Memory* memory = nullptr;
  const MemoryContext* context = nullptr;
  int layer = 0;
};

class Memory final : public llama_memory_i {
 public:
  Memory(ModelLayers layers, const e8kv::Config& config, uint32_t n_seq_max, int n_threads_batch, std::string spec);
  ~Memory() override;  ///< logs the run's bits per element

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
  /// Checks the ubatch against the sequences and sets out to its token groups (staging the
  /// prompt chunks); false (logged) when the ubatch is refused.
  bool begin_ubatch(const llama_ubatch& ubatch, std::vector<TokenGroup>& out);
  /// After the ubatch's graph ran: compresses its prompt chunks; false (logged) when the op failed.
  bool ubatch_computed(const MemoryContext& context);
  bool decode_finished();  ///< the call's prompt sequences become coded ones

  // The graph's side (e8kv_attention.cpp).
  /// The softmax scale the graph passes for layer il: adopted by the layer's group while nothing
  /// is coded (llama.cpp's graph reservation builds every layer first), an error after that.
  void adopt_softmax_scale(int il, float kq_scale);
  void run_layer(const MemoryContext& context, int il, ggml_tensor* dst, int ith, int nth);
  void record_error(const std::string& message);
  /// The graph asks for what the memory does not do: the running ubatch fails, and every batch after.
  void refuse_graph(const std::string& why);
  const ModelLayers& layers() const { return layers_; }
  size_t resident_bytes() const;
  /// The largest prompt stage any sequence held (bytes), over the memory's life: at most one
  /// ubatch's keys, values and observation rows.
  size_t staged_peak_bytes() const { return staged_peak_; }

 private:
  void attend_layer(const MemoryContext& context, int il, const ggml_tensor* q, const ggml_tensor* k,
                    const ggml_tensor* v, ggml_tensor* dst);
  void attend_prompt(const llama_ubatch& ub, const TokenGroup& tg, int il, const ggml_tensor* q, const ggml_tensor* k,
                     const ggml_tensor* v, ggml_tensor* dst);
  void attend_appended(const llama_ubatch& ub, const std::vector<TokenGroup>& groups, int il, const ggml_tensor* q,
                       const ggml_tensor* k, const ggml_tensor* v, ggml_tensor* dst);
  Sequence& sequence(llama_seq_id id);
  const Sequence* find(llama_seq_id id) const;
  void fail(Sequence& s, int id, const std::string& why);
  /// Adds a sequence about to be dropped to the run's byte count (every sequence the memory ever
  /// held codes for is counted once, as it was when dropped).
  void account(const Sequence& s);
  void drop(Sequence& s) {
    account(s);
    s.reset();
  }
  bool any_codes() const;
  /// Hands the heap's free pages back to the system once the codes have grown by kTrimStep since
  /// the last time. The codes grow a sixteenth at a time, and glibc keeps each freed old block in
  /// its heap once its mmap threshold has risen past it (8K-depth peak RSS: 304 MiB without, 285 with).
  void return_free_pages();
  static constexpr size_t kTrimStep = size_t{8} << 20;
  /// state_read's work: every sequence of the state read and checked, then applied.
  void read_state(llama_io_read_i& io, llama_seq_id seq_id, llama_state_seq_flags flags);

  ModelLayers layers_;
  std::vector<GroupCodec> groups_;
  std::string spec_;
  std::vector<Sequence> seqs_;
  std::unique_ptr<e8kv::ThreadPool> pool_;  ///< compresses prompt chunks (outside the graph)
  OpGang gang_;
  std::mutex error_mutex_;
  std::string error_;
  std::string broken_;  ///< set when the graph asks for what the memory cannot do; every batch refused
  std::vector<float> layer_scale_;  ///< per model layer: the softmax scale its graph passes (0: not built yet)
  size_t staged_peak_ = 0;
  size_t trimmed_at_ = 0;  ///< resident_bytes() when the heap was last trimmed
  double run_bytes_ = 0, run_elements_ = 0;
  std::vector<double> run_group_bytes_, run_group_elements_;
  int64_t run_sequences_ = 0, run_tokens_ = 0;
};

class MemoryContext final : public llama_memory_context_i {
 public:
  explicit MemoryContext(llama_memory_status status) : status_(status) {}
  MemoryContext(Memory* memory, std::vector<llama_ubatch> ubatches)
      : status_(LLAMA_MEMORY_STATUS_SUCCESS), memory_(memory), ubatches_(std::move(ubatches)) {}
  explicit MemoryContext(Memory* memory) : status_(LLAMA_MEMORY_STATUS_SUCCESS), memory_(memory) {}

  bool next() override;
  bool apply() override;
  const llama_ubatch& get_ubatch() const override;
  llama_memory_status get_status() const override { return status_; }
  Memory* memory() const { return memory_; }
  /// The ubatch apply() set up and its token groups (null: none applied, e.g. graph reservation).
  const llama_ubatch* applied() const { return applied_ ? &ubatches_[i_next_] : nullptr; }
  const std::vector<TokenGroup>& groups() const { return groups_; }

 private:
  llama_memory_status status_;
  Memory* memory_ = nullptr;
  std::vector<llama_ubatch> ubatches_;
  size_t i_next_ = 0;
  bool applied_ = false;
  std::vector<TokenGroup> groups_;
};

/// The layer ops of one graph over e8kv's memory (owned by the graph's input, so they live as long
/// as the graph may run).
struct GraphOps {
  GraphOps(Memory* memory, const MemoryContext* context, int n_layers);
  Memory* memory;
  std::vector<LayerOp> ops;
};

/// The attention input of a graph over e8kv's memory, for builders that take llama.cpp's KV input.
class GraphInput final : public llm_graph_input_attn_kv {
 public:
  GraphInput(const llama_hparams& hparams, const llama_cparams& cparams, Memory* memory, const MemoryContext* context)
      : llm_graph_input_attn_kv(hparams, cparams, nullptr), graph(memory, context, static_cast<int>(hparams.n_layer())) {}
  void set_input(const llama_ubatch* /*ubatch*/) override {}  // the memory context applied it
  bool can_reuse(const llm_graph_params& /*params*/) override { return false; }
  GraphOps graph;
};

/// The same for builders with sliding-window layers (Gemma-3), which take llama.cpp's iSWA input.
class GraphInputIswa final : public llm_graph_input_attn_kv_iswa {
 public:
  GraphInputIswa(const llama_hparams& hparams, const llama_cparams& cparams, Memory* memory, const MemoryContext* context)
      : llm_graph_input_attn_kv_iswa(hparams, cparams, nullptr), graph(memory, context, static_cast<int>(hparams.n_layer())) {}
  void set_input(const llama_ubatch* /*ubatch*/) override {}
  bool can_reuse(const llm_graph_params& /*params*/) override { return false; }
  GraphOps graph;
};

}  // namespace e8kv_llama
