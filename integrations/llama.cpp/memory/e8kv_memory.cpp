// e8kv's llama.cpp memory: sequences, batches, sequence operations and state (slot files hold
// e8kv containers). See llama-e8kv-memory.h for what a prompt and a decoded token see.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <stdexcept>

#include "e8kv/entropy/container.hpp"
#include "e8kv_memory_impl.hpp"
#include "ggml-backend.h"
#include "llama-context.h"
#include "llama-e8kv-memory.h"
#include "llama-impl.h"
#include "llama-io.h"
#include "llama-model.h"

namespace e8kv_llama {

namespace {
constexpr uint32_t kStateMagic = 0x4d4b3845;  // "E8KM": e8kv memory state
constexpr uint32_t kStateVersion = 1;
constexpr uint64_t kMaxStateBlob = uint64_t(1) << 36;

std::string seq_name(int id) { return "sequence " + std::to_string(id); }
}  // namespace

void SequenceState::reset() { *this = SequenceState(); }

size_t SequenceState::staged_bytes() const {
  size_t n = 0;
  for (const auto& v : prompt_k) n += v.size() * sizeof(uint16_t);
  for (const auto& v : prompt_v) n += v.size() * sizeof(uint16_t);
  for (const auto& v : obs_q) n += v.size() * sizeof(float);
  return n;
}

Memory::Memory(const e8kv::ModelShape& shape, const e8kv::Config& config, uint32_t n_seq_max, int n_threads_batch,
               std::string spec)
    : shape_(shape), config_(config), compressor_(shape, config), spec_(std::move(spec)), seqs_(n_seq_max) {
  layer_ops_.resize(static_cast<size_t>(shape.n_layers));
  for (int il = 0; il < shape.n_layers; ++il) layer_ops_[static_cast<size_t>(il)] = LayerOp{this, il};
  if (n_threads_batch > 1) pool_ = std::make_unique<e8kv::ThreadPool>(n_threads_batch);
}

Memory::~Memory() {
  for (auto& s : seqs_) account(s);
  // At warning level: the tools' default log threshold drops llama.cpp's info lines, and this is
  // the run's size accounting that scripts/llama-cpp-kv-types.sh reads.
  if (run_sequences_ > 0)
    LLAMA_LOG_WARN("e8kv memory: bits per element over the run: %.4f (bytes() of %lld compressed sequences "
                   "holding %lld tokens: %.0f bytes for %.0f key and value elements; spec '%s')\n",
                   8.0 * run_bytes_ / run_elements_, static_cast<long long>(run_sequences_),
                   static_cast<long long>(run_tokens_), run_bytes_, run_elements_, spec_.c_str());
}

void Memory::account(const SequenceState& s) {
  if (s.mode != SequenceState::Mode::kCoded || !s.cache) return;
  const int64_t tokens = static_cast<int64_t>(s.pos_max) - s.pos_min + 1;  // given, evicted ones included
  run_bytes_ += static_cast<double>(s.cache->bytes());
  run_elements_ += 2.0 * static_cast<double>(tokens) * shape_.n_layers * shape_.n_kv_heads * shape_.head_dim;
  run_sequences_ += 1;
  run_tokens_ += tokens;
}

SequenceState& Memory::sequence(llama_seq_id id) {
  if (id < 0 || static_cast<size_t>(id) >= seqs_.size())
    throw std::runtime_error("e8kv memory: sequence id " + std::to_string(id) + " out of range (n_seq_max " +
                             std::to_string(seqs_.size()) + ")");
  return seqs_[static_cast<size_t>(id)];
}

const SequenceState* Memory::find(llama_seq_id id) const {
  if (id < 0 || static_cast<size_t>(id) >= seqs_.size()) return nullptr;
  return &seqs_[static_cast<size_t>(id)];
}

void Memory::fail(SequenceState& s, int id, const std::string& why) {
  LLAMA_LOG_ERROR("e8kv memory: %s: %s; it refuses to decode until removed (llama_memory_seq_rm(mem, %d, -1, -1))\n",
                  seq_name(id).c_str(), why.c_str(), id);
  const int32_t lo = s.pos_min, hi = s.pos_max;
  drop(s);
  s.mode = SequenceState::Mode::kFailed;
  s.failure = why;
  s.pos_min = lo;
  s.pos_max = hi;
}

// ---- batches -----------------------------------------------------------------------------------

llama_memory_context_ptr Memory::init_batch(llama_batch_allocr& balloc, uint32_t n_ubatch, bool /*embd_all*/) {
  balloc.split_reset();
  std::vector<llama_ubatch> ubatches;
  for (;;) {
    llama_ubatch ub = balloc.split_simple(n_ubatch);
    if (ub.n_tokens == 0) break;
    ubatches.push_back(std::move(ub));
  }
  if (balloc.get_n_used() < balloc.get_n_tokens())
    return std::make_unique<MemoryContext>(LLAMA_MEMORY_STATUS_FAILED_PREPARE);
  for (const llama_ubatch& ub : ubatches) {
    for (uint32_t i = 0; i < ub.n_tokens; ++i) {
      if (ub.n_seq_id[i] != 1) {
        LLAMA_LOG_ERROR("e8kv memory: a token belongs to %d sequences at once; e8kv keeps one cache per sequence "
                        "(give each sequence its own tokens)\n", ub.n_seq_id[i]);
        return std::make_unique<MemoryContext>(LLAMA_MEMORY_STATUS_FAILED_COMPUTE);
      }
      const llama_seq_id id = ub.seq_id[i][0];
      const SequenceState* s = find(id);
      if (s == nullptr) {
        LLAMA_LOG_ERROR("e8kv memory: sequence id %d out of range (n_seq_max %zu)\n", id, seqs_.size());
        return std::make_unique<MemoryContext>(LLAMA_MEMORY_STATUS_FAILED_COMPUTE);
      }
      if (s->mode == SequenceState::Mode::kFailed) {
        LLAMA_LOG_ERROR("e8kv memory: %s cannot decode: %s; remove it first (llama_memory_seq_rm(mem, %d, -1, -1))\n",
                        seq_name(id).c_str(), s->failure.c_str(), id);
        return std::make_unique<MemoryContext>(LLAMA_MEMORY_STATUS_FAILED_COMPUTE);
      }
    }
  }
  return std::make_unique<MemoryContext>(this, std::move(ubatches));
}

llama_memory_context_ptr Memory::init_full() { return std::make_unique<MemoryContext>(this); }

llama_memory_context_ptr Memory::init_update(llama_context* /*lctx*/, bool /*optimize*/) {
  return std::make_unique<MemoryContext>(LLAMA_MEMORY_STATUS_NO_UPDATE);
}

bool Memory::begin_ubatch(const llama_ubatch& ubatch) {
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    error_.clear();
  }
  groups_.clear();
  for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
    const int id = ubatch.seq_id[i][0];
    SequenceState& s = seqs_[static_cast<size_t>(id)];
    const int32_t pos = ubatch.pos[i];
    if (s.mode != SequenceState::Mode::kEmpty && pos <= s.pos_max) {
      LLAMA_LOG_ERROR("e8kv memory: %s: position %d does not follow the stored %d (positions only grow)\n",
                      seq_name(id).c_str(), pos, s.pos_max);
      return false;
    }
    if (s.mode == SequenceState::Mode::kEmpty) {
      const size_t L = static_cast<size_t>(shape_.n_layers);
      s.mode = SequenceState::Mode::kPrompt;
      s.prompt_k.assign(L, {});
      s.prompt_v.assign(L, {});
      s.prompt_pos.assign(L, {});
      s.obs_q.assign(L, {});
      s.obs_pos.assign(L, {});
      s.pos_min = pos;
    }
    s.pos_max = pos;
    auto g = std::find_if(groups_.begin(), groups_.end(), [&](const TokenGroup& x) { return x.seq == id; });
    if (g == groups_.end()) {
      groups_.push_back(TokenGroup{id, s.mode == SequenceState::Mode::kPrompt, {}});
      g = groups_.end() - 1;
    }
    g->tokens.push_back(static_cast<int32_t>(i));
  }
  ubatch_ = &ubatch;
  return true;
}

bool Memory::ubatch_computed() {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    error.swap(error_);
  }
  ubatch_ = nullptr;
  if (error.empty()) return true;
  LLAMA_LOG_ERROR("e8kv memory: attention failed: %s\n", error.c_str());
  // A staged prompt is cut back by llama.cpp's rollback (seq_rm of the ubatch's positions); a
  // compressed cache may hold the ubatch's tokens in some layers only, so its sequence fails.
  for (const TokenGroup& g : groups_)
    if (!g.prompt) fail(seqs_[static_cast<size_t>(g.seq)], g.seq, "a decode failed part-way (" + error + ")");
  return false;
}

bool Memory::decode_finished() {
  bool ok = true;
  for (size_t id = 0; id < seqs_.size(); ++id) {
    SequenceState& s = seqs_[id];
    if (s.mode != SequenceState::Mode::kPrompt) continue;
    try {
      const int64_t n = static_cast<int64_t>(s.prompt_pos[0].size());
      e8kv::SequenceKV kv;
      std::vector<e8kv::LayerQueries> queries(static_cast<size_t>(shape_.n_layers));
      for (int il = 0; il < shape_.n_layers; ++il) {
        const size_t l = static_cast<size_t>(il);
        if (static_cast<int64_t>(s.prompt_pos[l].size()) != n)
          throw e8kv::Error("layer " + std::to_string(il) + " staged " + std::to_string(s.prompt_pos[l].size()) +
                            " tokens, layer 0 " + std::to_string(n));
        kv.layers.push_back({e8kv::TensorView::nhd(s.prompt_k[l].data(), e8kv::DType::kF16, n, shape_.n_kv_heads,
                                                   shape_.head_dim),
                             e8kv::TensorView::nhd(s.prompt_v[l].data(), e8kv::DType::kF16, n, shape_.n_kv_heads,
                                                   shape_.head_dim)});
        queries[l].queries = e8kv::TensorView::nhd(s.obs_q[l].data(), e8kv::DType::kF32,
                                                   static_cast<int64_t>(s.obs_pos[l].size()), shape_.n_q_heads,
                                                   shape_.head_dim);
        queries[l].positions = s.obs_pos[l].data();
      }
      kv.positions = s.prompt_pos[0].data();
      auto cache = std::make_unique<e8kv::CompressedKV>(compressor_.compress(kv, &queries, pool_.get()));
      const int32_t lo = s.pos_min, hi = s.pos_max;
      s.reset();
      s.mode = SequenceState::Mode::kCoded;
      s.cache = std::move(cache);
      s.pos_min = lo;
      s.pos_max = hi;
    } catch (const std::exception& e) {
      fail(s, static_cast<int>(id), std::string("compressing the prompt failed: ") + e.what());
      ok = false;
    }
  }
  return ok;
}

bool MemoryContext::apply() {
  if (memory_ == nullptr || ubatches_.empty()) return true;  // init_full (graph reservation)
  return memory_->begin_ubatch(ubatches_[i_next_]);
}

const llama_ubatch& MemoryContext::get_ubatch() const {
  if (i_next_ >= ubatches_.size()) throw std::runtime_error("e8kv memory context: no ubatch");
  return ubatches_[i_next_];
}

// ---- sequence operations -----------------------------------------------------------------------

void Memory::clear(bool /*data*/) {
  for (auto& s : seqs_) drop(s);
}

bool Memory::seq_rm(llama_seq_id seq_id, llama_pos p0, llama_pos p1) {
  if (p0 < 0) p0 = 0;
  if (p1 < 0) p1 = std::numeric_limits<llama_pos>::max();
  bool ok = true;
  for (size_t id = 0; id < seqs_.size(); ++id) {
    if (seq_id >= 0 && static_cast<size_t>(seq_id) != id) continue;
    SequenceState& s = seqs_[id];
    if (s.mode == SequenceState::Mode::kEmpty || p0 > s.pos_max || p1 <= s.pos_min || p0 >= p1) continue;
    if (p0 <= s.pos_min && p1 > s.pos_max) {  // the whole sequence
      drop(s);
      continue;
    }
    if (s.mode == SequenceState::Mode::kPrompt && p1 > s.pos_max) {  // a staged prompt's tail
      for (size_t l = 0; l < s.prompt_pos.size(); ++l) {
        auto& P = s.prompt_pos[l];
        const size_t keep = static_cast<size_t>(std::lower_bound(P.begin(), P.end(), p0) - P.begin());
        const size_t row = static_cast<size_t>(shape_.n_kv_heads) * static_cast<size_t>(shape_.head_dim);
        P.resize(keep);
        s.prompt_k[l].resize(keep * row);
        s.prompt_v[l].resize(keep * row);
        auto& OP = s.obs_pos[l];
        const size_t okeep = static_cast<size_t>(std::lower_bound(OP.begin(), OP.end(), p0) - OP.begin());
        OP.resize(okeep);
        s.obs_q[l].resize(okeep * static_cast<size_t>(shape_.n_q_heads) * static_cast<size_t>(shape_.head_dim));
      }
      s.pos_max = p0 - 1;
      continue;
    }
    // Codes of later tokens were chosen with the earlier ones (flushes, eviction, tiers): a
    // compressed sequence is removed whole or not at all (llama.cpp then reprocesses the prompt).
    ok = false;
  }
  return ok;
}

void Memory::seq_cp(llama_seq_id src, llama_seq_id dst, llama_pos p0, llama_pos p1) {
  if (src == dst) return;
  try {
    const SequenceState& from = sequence(src);
    SequenceState& to = sequence(dst);
    if (p0 < 0) p0 = 0;
    if (p1 < 0) p1 = std::numeric_limits<llama_pos>::max();
    const bool whole = from.mode == SequenceState::Mode::kEmpty || (p0 <= from.pos_min && p1 > from.pos_max);
    if (!whole || to.mode != SequenceState::Mode::kEmpty) {
      fail(to, dst, "seq_cp of " + std::string(whole ? "a sequence into a non-empty one" : "part of a sequence") +
                        " is not supported by e8kv's memory (copy a whole sequence into an empty one)");
      return;
    }
    const SequenceState& f = from;
    to.mode = f.mode;
    to.prompt_k = f.prompt_k;
    to.prompt_v = f.prompt_v;
    to.prompt_pos = f.prompt_pos;
    to.obs_q = f.obs_q;
    to.obs_pos = f.obs_pos;
    to.cache = f.cache ? std::make_unique<e8kv::CompressedKV>(*f.cache) : nullptr;
    to.pos_min = f.pos_min;
    to.pos_max = f.pos_max;
    to.failure = f.failure;
  } catch (const std::exception& e) {
    LLAMA_LOG_ERROR("e8kv memory: seq_cp %d -> %d: %s\n", src, dst, e.what());
  }
}

void Memory::seq_keep(llama_seq_id seq_id) {
  for (size_t id = 0; id < seqs_.size(); ++id)
    if (static_cast<llama_seq_id>(id) != seq_id) drop(seqs_[id]);
}

void Memory::seq_add(llama_seq_id seq_id, llama_pos p0, llama_pos p1, llama_pos shift) {
  if (shift == 0) return;
  for (size_t id = 0; id < seqs_.size(); ++id) {
    if (seq_id >= 0 && static_cast<size_t>(seq_id) != id) continue;
    SequenceState& s = seqs_[id];
    if (s.mode == SequenceState::Mode::kEmpty || p0 > s.pos_max || (p1 >= 0 && p1 <= s.pos_min)) continue;
    fail(s, static_cast<int>(id),
         "shifting positions (context shift, seq_add) is not supported: e8kv's keys are coded in their positions' "
         "RoPE frame");
  }
}

void Memory::seq_div(llama_seq_id seq_id, llama_pos p0, llama_pos p1, int d) {
  if (d == 1) return;
  for (size_t id = 0; id < seqs_.size(); ++id) {
    if (seq_id >= 0 && static_cast<size_t>(seq_id) != id) continue;
    SequenceState& s = seqs_[id];
    if (s.mode == SequenceState::Mode::kEmpty || p0 > s.pos_max || (p1 >= 0 && p1 <= s.pos_min)) continue;
    fail(s, static_cast<int>(id), "dividing positions (seq_div, self-extend) is not supported by e8kv's memory");
  }
}

llama_pos Memory::seq_pos_min(llama_seq_id seq_id) const {
  const SequenceState* s = find(seq_id);
  return s == nullptr || s->mode == SequenceState::Mode::kEmpty ? -1 : s->pos_min;
}

llama_pos Memory::seq_pos_max(llama_seq_id seq_id) const {
  const SequenceState* s = find(seq_id);
  return s == nullptr || s->mode == SequenceState::Mode::kEmpty ? -1 : s->pos_max;
}

size_t Memory::resident_bytes() const {
  size_t n = 0;
  for (const auto& s : seqs_) n += (s.cache ? s.cache->resident_bytes() : 0) + s.staged_bytes();
  return n;
}

std::map<ggml_backend_buffer_type_t, size_t> Memory::memory_breakdown() const {
  ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  return {{ggml_backend_dev_buffer_type(cpu), resident_bytes()}};
}

// ---- state: one e8kv container per sequence ----------------------------------------------------

void Memory::state_write(llama_io_write_i& io, llama_seq_id seq_id, llama_state_seq_flags /*flags*/) const {
  std::vector<size_t> ids;
  for (size_t id = 0; id < seqs_.size(); ++id) {
    if (seq_id >= 0 && static_cast<size_t>(seq_id) != id) continue;
    const SequenceState& s = seqs_[id];
    if (s.mode == SequenceState::Mode::kEmpty) continue;
    if (s.mode != SequenceState::Mode::kCoded)
      throw std::runtime_error("e8kv memory: " + seq_name(static_cast<int>(id)) + " cannot be saved: " +
                               (s.mode == SequenceState::Mode::kFailed ? s.failure : "a decode is in progress"));
    ids.push_back(id);
  }
  const uint32_t header[3] = {kStateMagic, kStateVersion, static_cast<uint32_t>(ids.size())};
  io.write(header, sizeof(header));
  for (size_t id : ids) {
    const SequenceState& s = seqs_[id];
    const std::vector<uint8_t> blob = e8kv::entropy::serialize(*s.cache);
    const int32_t meta[3] = {static_cast<int32_t>(id), s.pos_min, s.pos_max};
    const uint64_t size = blob.size();
    io.write(meta, sizeof(meta));
    io.write(&size, sizeof(size));
    io.write(blob.data(), blob.size());
  }
}

void Memory::state_read(llama_io_read_i& io, llama_seq_id seq_id, llama_state_seq_flags /*flags*/) {
  uint32_t header[3] = {0, 0, 0};
  io.read(header, sizeof(header));
  if (header[0] != kStateMagic)
    throw std::runtime_error("e8kv memory: the state was not written by e8kv's memory (was it saved with another "
                             "cache type, without --kv-e8kv?)");
  if (header[1] != kStateVersion)
    throw std::runtime_error("e8kv memory: state version " + std::to_string(header[1]) + ", this build reads " +
                             std::to_string(kStateVersion));
  if (seq_id >= 0 ? header[2] > 1 : header[2] > seqs_.size())
    throw std::runtime_error("e8kv memory: the state holds " + std::to_string(header[2]) + " sequences, more than fit");
  // Everything is read and checked before any sequence changes: a bad state changes nothing.
  std::vector<std::pair<size_t, SequenceState>> restored;
  for (uint32_t i = 0; i < header[2]; ++i) {
    int32_t meta[3];
    uint64_t size = 0;
    io.read(meta, sizeof(meta));
    io.read(&size, sizeof(size));
    if (size == 0 || size > kMaxStateBlob) throw std::runtime_error("e8kv memory: a sequence's blob size is corrupt");
    std::vector<uint8_t> blob(static_cast<size_t>(size));
    io.read(blob.data(), blob.size());
    SequenceState s;
    s.cache = std::make_unique<e8kv::CompressedKV>(e8kv::entropy::deserialize(blob.data(), blob.size()));
    const std::string diff = compressor_.layout_difference(s.cache->layout());
    if (!diff.empty())
      throw std::runtime_error("e8kv memory: the state was written with another e8kv configuration or model (" +
                               diff + ")");
    s.mode = SequenceState::Mode::kCoded;
    s.pos_min = meta[1];
    s.pos_max = meta[2];
    if (s.pos_min < 0 || s.pos_max < s.pos_min) throw std::runtime_error("e8kv memory: corrupt positions in the state");
    const size_t target = seq_id >= 0 ? static_cast<size_t>(seq_id) : static_cast<size_t>(meta[0]);
    if (target >= seqs_.size()) throw std::runtime_error("e8kv memory: the state's sequence id is out of range");
    restored.emplace_back(target, std::move(s));
  }
  if (seq_id < 0) clear(true);
  else drop(seqs_[static_cast<size_t>(seq_id)]);
  for (auto& [target, s] : restored) seqs_[target] = std::move(s);
}

}  // namespace e8kv_llama

// ---- llama.cpp's entry points (llama-e8kv-memory.h) --------------------------------------------

namespace {

e8kv::transform::RopeParams rope_of(const llama_model& model, const llama_cparams& cparams, int head_dim) {
  const llama_hparams& hp = model.hparams;
  e8kv::transform::RopeParams r;
  switch (hp.rope_type) {
    case LLAMA_ROPE_TYPE_NORM: r.layout = e8kv::transform::RopeLayout::kInterleaved; break;  // adjacent pairs
    case LLAMA_ROPE_TYPE_NEOX: r.layout = e8kv::transform::RopeLayout::kSplitHalf; break;
    default: throw std::runtime_error("its RoPE type (" + std::to_string(hp.rope_type) + ") is not mapped to e8kv's");
  }
  r.head_dim = head_dim;
  r.rotary_dim = static_cast<int>(hp.n_rot());
  r.theta = cparams.rope_freq_base;
  if (hp.rope_scaling_type_train == LLAMA_ROPE_SCALING_TYPE_YARN || cparams.yarn_ext_factor > 0.f)
    throw std::runtime_error("YaRN RoPE scaling is not mapped to e8kv's RoPE parameters");
  if (cparams.rope_freq_scale != 1.f) {
    r.scaling = e8kv::transform::RopeScaling::kLinear;
    r.factor = 1.0 / cparams.rope_freq_scale;
  }
  for (const auto& layer : model.layers)
    if (layer.rope_freqs != nullptr)
      throw std::runtime_error("RoPE frequency factors (rope_freqs) are not mapped to e8kv's RoPE parameters");
  return r;
}

}  // namespace

llama_memory_i* llama_e8kv_memory_create(const llama_model& model, const llama_cparams& cparams, const char* spec) {
  const llama_hparams& hp = model.hparams;
  const std::string what = "e8kv memory (--kv-e8kv '" + std::string(spec) + "'): ";
  auto refuse = [&](const std::string& why) { throw std::runtime_error(what + why); };
  // Only the graphs the adapter is tested with: other builders read llama.cpp's own KV-cache
  // context (sliding-window, recurrent, hybrid, MLA, V-less layers) and are refused by name.
  if (model.arch != LLM_ARCH_LLAMA)
    refuse(std::string("architecture '") + llm_arch_name(model.arch) +
           "' is not supported (llama only; Gemma-3's sliding-window layers and recurrent or hybrid memories need "
           "llama.cpp's own cache: run without --kv-e8kv)");
  if (hp.swa_type != LLAMA_SWA_TYPE_NONE) refuse("sliding-window attention layers are not supported");
  if (hp.use_alibi || hp.attn_soft_cap) refuse("ALiBi and attention logit soft-capping are not supported");
  if (hp.n_layer_kv_from_start >= 0) refuse("layers that share another layer's cache are not supported");
  for (uint32_t il = 0; il < hp.n_layer(); ++il) {
    if (hp.n_head_kv(il) != hp.n_head_kv(0) || hp.n_head(il) != hp.n_head(0))
      refuse("layers with different head counts are not supported");
    if (hp.n_embd_head_k(il) != hp.n_embd_head_v(il)) refuse("keys and values of different head sizes are not supported");
    ggml_backend_dev_t dev = model.dev_layer(static_cast<int>(il));
    if (dev != nullptr && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU)
      refuse("layer " + std::to_string(il) + " is offloaded to " + ggml_backend_dev_name(dev) +
             "; e8kv's memory runs on the CPU backend (use -ngl 0)");
  }
  e8kv::ModelShape shape{static_cast<int>(hp.n_layer()), static_cast<int>(hp.n_head_kv(0)),
                         static_cast<int>(hp.n_head(0)), static_cast<int>(hp.n_embd_head_k(0))};
  try {
    shape.validate();
  } catch (const std::exception& e) {
    refuse(std::string("the model's KV shape is not supported: ") + e.what());
  }
  e8kv::Config config;
  try {
    config = e8kv::Config::parse(spec);
  } catch (const std::exception& e) {
    refuse(e.what());
  }
  try {
    config.rope = rope_of(model, cparams, shape.head_dim);
  } catch (const std::exception& e) {
    refuse(e.what());
  }
  config.softmax_scale = hp.f_attention_scale == 0.0f ? 1.0f / std::sqrt(static_cast<float>(shape.head_dim))
                                                      : hp.f_attention_scale;
  try {
    auto* memory = new e8kv_llama::Memory(shape, config, cparams.n_seq_max,
                                          static_cast<int>(cparams.n_threads_batch), spec);
    LLAMA_LOG_INFO("%s: e8kv memory: spec '%s', %d layers x %d KV heads x %d dims, %u sequences; the KV "
                   "buffer grows with the tokens (e8kv's resident bytes), none is allocated ahead\n",
                   __func__, spec, shape.n_layers, shape.n_kv_heads, shape.head_dim, cparams.n_seq_max);
    return memory;
  } catch (const std::exception& e) {
    refuse(e.what());
  }
  return nullptr;
}

bool llama_e8kv_ubatch_computed(llama_memory_context_i* mctx) {
  auto* context = dynamic_cast<e8kv_llama::MemoryContext*>(mctx);
  return context == nullptr || context->memory() == nullptr || context->memory()->ubatch_computed();
}

bool llama_e8kv_decode_finished(llama_memory_i* memory) {
  auto* m = dynamic_cast<e8kv_llama::Memory*>(memory);
  return m == nullptr || m->decode_finished();
}
