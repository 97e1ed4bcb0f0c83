// e8kv's llama.cpp memory: sequences, batches, sequence operations and state (slot files hold
// e8kv containers). See llama-e8kv-memory.h for what a prompt and a later token see.
#include "e8kv_memory.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>

#include "e8kv/container/checksum.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/llama_cpp/memory_state.hpp"
#include "ggml-backend.h"
#include "llama-impl.h"
#include "llama-e8kv-memory.h"
#include "llama-io.h"
#include "llama-model.h"

namespace e8kv_llama {

namespace {
// The state's format is memory_state.hpp's (one definition, shared with the fleet tool, which
// moves and cuts these states without llama.cpp): read here from llama.cpp's stream piece by piece.
using e8kv::llama_cpp::kMaxMemoryStateBlob;
using e8kv::llama_cpp::kMemoryStateMagic;
using e8kv::llama_cpp::kMemoryStateVersion;

std::string seq_name(int id) { return "sequence " + std::to_string(id); }
}  // namespace

Memory::Memory(ModelLayers layers, const e8kv::Config& config, uint32_t n_seq_max, int n_threads_batch, std::string spec)
    : layers_(std::move(layers)), spec_(std::move(spec)), seqs_(n_seq_max) {
#if defined(__GLIBC__)
  // A sequence's codes grow by a sixteenth per append, each growth a new buffer and the old one
  // freed. glibc raises its mmap threshold (up to 32 MB) as freed mappings come back, so later
  // buffers of hundreds of KB land in the heap, whose holes the next, larger buffers cannot
  // reuse: 66 MB of a 395 MB peak RSS at 16K depth (SmolLM2, llama-bench; 329 MB with the
  // threshold fixed). A fixed threshold (glibc's initial 128 KB; setting it stops the raising)
  // keeps such buffers in mappings of their own, returned when freed. The process's allocator is
  // shared: a user who set MALLOC_MMAP_THRESHOLD_ keeps theirs.
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
  for (size_t g = 0; g < layers_.groups.size(); ++g) {
    GroupCodec gc;
    gc.layers = layers_.groups[g];
    gc.config = config;
    gc.config.rope = gc.layers.rope;
    gc.config.rope.head_dim = layers_.head_dim;
    // Until the graph says otherwise (adopt_softmax_scale): the scale most builders pass.
    gc.config.softmax_scale = 1.0f / std::sqrt(static_cast<float>(layers_.head_dim));
    gc.compressor = std::make_unique<e8kv::KVCompressor>(layers_.shape(static_cast<int>(g)), gc.config);
    groups_.push_back(std::move(gc));
  }
  layer_scale_.assign(layers_.where.size(), 0.f);
  run_group_bytes_.assign(groups_.size(), 0.0);
  run_group_elements_.assign(groups_.size(), 0.0);
  if (n_threads_batch > 1) pool_ = std::make_unique<e8kv::ThreadPool>(n_threads_batch);
}

Memory::~Memory() {
  for (auto& s : seqs_) account(s);
  // At warning level: the tools' default log threshold drops llama.cpp's info lines, and this is
  // the run's size accounting that scripts/llama-cpp-kv-types.sh reads.
  if (run_sequences_ == 0) return;
  std::string per_group;
  if (groups_.size() > 1)
    for (size_t g = 0; g < groups_.size(); ++g)
      per_group += "; " + groups_[g].layers.describe() + ": " +
                   std::to_string(run_group_elements_[g] > 0 ? 8.0 * run_group_bytes_[g] / run_group_elements_[g] : 0.0) +
                   " bits per element given";
  LLAMA_LOG_WARN("e8kv memory: bits per element over the run: %.4f (bytes() of %lld sequences holding %lld tokens: "
                 "%.0f bytes for %.0f key and value elements given to every layer; spec '%s'%s)\n",
                 8.0 * run_bytes_ / run_elements_, static_cast<long long>(run_sequences_),
                 static_cast<long long>(run_tokens_), run_bytes_, run_elements_, spec_.c_str(), per_group.c_str());
}

void Memory::account(const Sequence& s) {
  if (!s.has_codes()) return;
  const int64_t tokens = static_cast<int64_t>(s.pos_max) - s.pos_min + 1;  // given, evicted ones included
  const double per_layer = 2.0 * static_cast<double>(tokens) * layers_.n_kv_heads * layers_.head_dim;
  for (size_t g = 0; g < s.caches.size() && g < groups_.size(); ++g) {
    const double b = s.caches[g] ? static_cast<double>(s.caches[g]->bytes()) : 0.0;
    const double e = per_layer * static_cast<double>(groups_[g].layers.layers.size());
    run_bytes_ += b;
    run_elements_ += e;
    run_group_bytes_[g] += b;
    run_group_elements_[g] += e;
  }
  run_sequences_ += 1;
  run_tokens_ += tokens;
}

Sequence& Memory::sequence(llama_seq_id id) {
  if (id < 0 || static_cast<size_t>(id) >= seqs_.size())
    throw std::runtime_error("e8kv memory: sequence id " + std::to_string(id) + " out of range (n_seq_max " +
                             std::to_string(seqs_.size()) + ")");
  return seqs_[static_cast<size_t>(id)];
}

const Sequence* Memory::find(llama_seq_id id) const {
  if (id < 0 || static_cast<size_t>(id) >= seqs_.size()) return nullptr;
  return &seqs_[static_cast<size_t>(id)];
}

void Memory::return_free_pages() {
  const size_t now = resident_bytes();
  trimmed_at_ = std::min(trimmed_at_, now);  // sequences dropped since: count growth from here
  if (now < trimmed_at_ + kTrimStep) return;
  trimmed_at_ = now;
#if defined(__GLIBC__)
  malloc_trim(0);  // whole free pages of every arena, not only the top of the main heap
#endif
}

bool Memory::any_codes() const {
  return std::any_of(seqs_.begin(), seqs_.end(), [](const Sequence& s) { return s.has_codes(); });
}

void Memory::fail(Sequence& s, int id, const std::string& why) {
  LLAMA_LOG_ERROR("e8kv memory: %s: %s; it refuses to decode until removed (llama_memory_seq_rm(mem, %d, -1, -1))\n",
                  seq_name(id).c_str(), why.c_str(), id);
  const int32_t lo = s.pos_min, hi = s.pos_max;
  drop(s);
  s.mode = Sequence::Mode::kFailed;
  s.failure = why;
  s.pos_min = lo;
  s.pos_max = hi;
}

// ---- batches -----------------------------------------------------------------------------------

llama_memory_context_ptr Memory::init_batch(llama_batch_allocr& balloc, uint32_t n_ubatch, bool /*embd_all*/) {
  if (!broken_.empty()) {
    LLAMA_LOG_ERROR("e8kv memory: %s\n", broken_.c_str());
    return std::make_unique<MemoryContext>(LLAMA_MEMORY_STATUS_FAILED_COMPUTE);
  }
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
      const Sequence* s = find(id);
      if (s == nullptr) {
        LLAMA_LOG_ERROR("e8kv memory: sequence id %d out of range (n_seq_max %zu)\n", id, seqs_.size());
        return std::make_unique<MemoryContext>(LLAMA_MEMORY_STATUS_FAILED_COMPUTE);
      }
      if (s->mode == Sequence::Mode::kFailed) {
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

bool Memory::begin_ubatch(const llama_ubatch& ubatch, std::vector<TokenGroup>& out) {
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    error_.clear();
  }
  out.clear();
  // Check every token first: a refused ubatch changes nothing.
  std::vector<int32_t> last(seqs_.size());
  for (size_t i = 0; i < seqs_.size(); ++i) last[i] = seqs_[i].mode == Sequence::Mode::kEmpty ? -1 : seqs_[i].pos_max;
  for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
    const int id = ubatch.seq_id[i][0];
    const int32_t pos = ubatch.pos[i];
    if (pos < 0 || (last[static_cast<size_t>(id)] >= 0 && pos <= last[static_cast<size_t>(id)])) {
      LLAMA_LOG_ERROR("e8kv memory: %s: position %d does not follow the stored %d (positions only grow)\n",
                      seq_name(id).c_str(), pos, last[static_cast<size_t>(id)]);
      return false;
    }
    last[static_cast<size_t>(id)] = pos;
  }
  for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
    const int id = ubatch.seq_id[i][0];
    Sequence& s = seqs_[static_cast<size_t>(id)];
    const int32_t pos = ubatch.pos[i];
    if (s.mode == Sequence::Mode::kEmpty) {
      s.mode = Sequence::Mode::kPrompt;
      s.caches.resize(groups_.size());
      s.dropped_below.assign(groups_.size(), 0);
      s.pos_min = pos;
    }
    s.pos_max = pos;
    auto g = std::find_if(out.begin(), out.end(), [&](const TokenGroup& x) { return x.seq == id; });
    if (g == out.end()) {
      out.push_back(TokenGroup{id, s.mode == Sequence::Mode::kPrompt, {}});
      g = out.end() - 1;
    }
    g->tokens.push_back(static_cast<int32_t>(i));
  }
  // Each prompt chunk's stage, sized for its rows (the ops fill them, one layer each).
  const size_t L = static_cast<size_t>(ubatch.n_tokens == 0 ? 0 : layers_.where.size());
  const size_t kv_row = static_cast<size_t>(layers_.n_kv_heads) * layers_.head_dim;
  const size_t q_row = static_cast<size_t>(layers_.n_q_heads) * layers_.head_dim;
  size_t staged = 0;
  for (const TokenGroup& g : out) {
    if (!g.prompt) continue;
    PromptStage& st = seqs_[static_cast<size_t>(g.seq)].stage;
    st.clear();
    const size_t n = g.tokens.size();
    const size_t n_obs = std::min(n, static_cast<size_t>(groups_[0].config.obs_window));
    for (int32_t t : g.tokens) st.positions.push_back(ubatch.pos[t]);
    st.obs_positions.assign(st.positions.end() - static_cast<std::ptrdiff_t>(n_obs), st.positions.end());
    st.k.assign(L, std::vector<uint16_t>(n * kv_row));
    st.v.assign(L, std::vector<uint16_t>(n * kv_row));
    st.obs_q.assign(L, std::vector<float>(n_obs * q_row));
    staged += st.bytes();
  }
  staged_peak_ = std::max(staged_peak_, staged);
  return true;
}

bool Memory::ubatch_computed(const MemoryContext& context) {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    error.swap(error_);
  }
  if (!error.empty()) {
    LLAMA_LOG_ERROR("e8kv memory: attention failed: %s\n", error.c_str());
    // A prompt chunk is dropped (llama.cpp's rollback then removes its positions); a compressed
    // cache may hold the ubatch's tokens in some layers only, so its sequence fails.
    for (const TokenGroup& g : context.groups()) {
      Sequence& s = seqs_[static_cast<size_t>(g.seq)];
      if (g.prompt)
        s.stage.clear();
      else
        fail(s, g.seq, "a decode failed part-way (" + error + ")");
    }
    return false;
  }
  bool ok = true;
  for (const TokenGroup& g : context.groups()) {
    Sequence& s = seqs_[static_cast<size_t>(g.seq)];
    try {
      if (g.prompt)
        commit_stage(s, groups_, layers_, pool_.get());
      else
        drop_outside_windows(s, groups_);
    } catch (const std::exception& e) {
      fail(s, g.seq, std::string(g.prompt ? "compressing the prompt failed: " : "dropping old window positions failed: ") +
                         e.what());
      ok = false;
    }
  }
  return_free_pages();
  return ok;
}

bool Memory::decode_finished() {
  for (Sequence& s : seqs_)
    if (s.mode == Sequence::Mode::kPrompt) s.mode = s.has_codes() ? Sequence::Mode::kCoded : Sequence::Mode::kEmpty;
  return true;
}

bool MemoryContext::next() {
  applied_ = false;
  return ++i_next_ < ubatches_.size();
}

bool MemoryContext::apply() {
  if (memory_ == nullptr || ubatches_.empty()) return true;  // init_full (graph reservation)
  applied_ = memory_->begin_ubatch(ubatches_[i_next_], groups_);
  return applied_;
}

const llama_ubatch& MemoryContext::get_ubatch() const {
  if (i_next_ >= ubatches_.size()) throw std::runtime_error("e8kv memory context: no ubatch");
  return ubatches_[i_next_];
}

GraphOps::GraphOps(Memory* m, const MemoryContext* context, int n_layers) : memory(m) {
  for (int il = 0; il < n_layers; ++il) ops.push_back(LayerOp{m, context, il});
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
    Sequence& s = seqs_[id];
    if (s.mode == Sequence::Mode::kEmpty || p0 > s.pos_max || p1 <= s.pos_min || p0 >= p1) continue;
    if (p0 <= s.pos_min && p1 > s.pos_max) {  // the whole sequence
      drop(s);
      continue;
    }
    // A tail that nothing coded holds: positions given to a ubatch that failed (llama.cpp's
    // rollback), or a prompt stage's end.
    if (p1 > s.pos_max && p0 > s.last_coded_position() && s.mode != Sequence::Mode::kFailed) {
      PromptStage& st = s.stage;
      while (!st.positions.empty() && st.positions.back() >= p0) st.positions.pop_back();
      if (st.positions.empty()) st.clear();
      s.pos_max = p0 - 1;
      continue;
    }
    // A coded tail: each group keeps its codes below p0 (a server reusing a cached prompt up to
    // where a new one differs). The codes kept were chosen with the tokens removed in view
    // (a chunk's means, tiers and evictions), so the cut cache is not the one a prompt of p0
    // tokens would have made; it is the same codes, read the same way. A range inside the
    // sequence is refused (positions after it would keep codes of tokens before a gap).
    if (p1 > s.pos_max) {
      std::string why;
      if (cut_tail(s, groups_, p0, &why)) continue;
      LLAMA_LOG_WARN("e8kv memory: %s: the tail from position %d cannot be removed (%s); remove the whole sequence\n",
                     seq_name(static_cast<int>(id)).c_str(), p0, why.c_str());
    }
    ok = false;
  }
  return ok;
}

void Memory::seq_cp(llama_seq_id src, llama_seq_id dst, llama_pos p0, llama_pos p1) {
  if (src == dst) return;
  try {
    const Sequence& from = sequence(src);
    Sequence& to = sequence(dst);
    if (p0 < 0) p0 = 0;
    if (p1 < 0) p1 = std::numeric_limits<llama_pos>::max();
    const bool whole = from.mode == Sequence::Mode::kEmpty || (p0 <= from.pos_min && p1 > from.pos_max);
    if (!whole || to.mode != Sequence::Mode::kEmpty) {
      fail(to, dst, "seq_cp of " + std::string(whole ? "a sequence into a non-empty one" : "part of a sequence") +
                        " is not supported by e8kv's memory (copy a whole sequence into an empty one)");
      return;
    }
    to = from.clone();
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
    Sequence& s = seqs_[id];
    if (s.mode == Sequence::Mode::kEmpty || p0 > s.pos_max || (p1 >= 0 && p1 <= s.pos_min)) continue;
    fail(s, static_cast<int>(id),
         "shifting positions (context shift, seq_add) is not supported: e8kv's keys are coded in their positions' "
         "RoPE frame");
  }
}

void Memory::seq_div(llama_seq_id seq_id, llama_pos p0, llama_pos p1, int d) {
  if (d == 1) return;
  for (size_t id = 0; id < seqs_.size(); ++id) {
    if (seq_id >= 0 && static_cast<size_t>(seq_id) != id) continue;
    Sequence& s = seqs_[id];
    if (s.mode == Sequence::Mode::kEmpty || p0 > s.pos_max || (p1 >= 0 && p1 <= s.pos_min)) continue;
    fail(s, static_cast<int>(id), "dividing positions (seq_div, self-extend) is not supported by e8kv's memory");
  }
}

llama_pos Memory::seq_pos_min(llama_seq_id seq_id) const {
  const Sequence* s = find(seq_id);
  return s == nullptr || s->mode == Sequence::Mode::kEmpty ? -1 : s->pos_min;
}

llama_pos Memory::seq_pos_max(llama_seq_id seq_id) const {
  const Sequence* s = find(seq_id);
  return s == nullptr || s->mode == Sequence::Mode::kEmpty ? -1 : s->pos_max;
}

size_t Memory::resident_bytes() const {
  size_t n = 0;
  for (const auto& s : seqs_) n += s.resident_bytes();
  return n;
}

std::map<ggml_backend_buffer_type_t, size_t> Memory::memory_breakdown() const {
  ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  return {{ggml_backend_dev_buffer_type(cpu), resident_bytes()}};
}

void Memory::adopt_softmax_scale(int il, float kq_scale) {
  const size_t g = static_cast<size_t>(layers_.where[static_cast<size_t>(il)].first);
  GroupCodec& gc = groups_[g];
  float& seen = layer_scale_[static_cast<size_t>(il)];
  if (seen == kq_scale && gc.config.softmax_scale == kq_scale) return;  // every graph after the first
  if (!std::isfinite(kq_scale) || !(kq_scale > 0.f)) {
    broken_ = "layer " + std::to_string(il) + "'s graph passes a softmax scale of " + std::to_string(kq_scale);
    return;
  }
  seen = kq_scale;
  // The layers of a group share one scale, fixed once anything is coded with it.
  for (int other : gc.layers.layers) {
    const float s = layer_scale_[static_cast<size_t>(other)];
    if (s != 0.f && s != kq_scale) {
      broken_ = "layers " + std::to_string(other) + " and " + std::to_string(il) + " pass different softmax scales (" +
                std::to_string(s) + ", " + std::to_string(kq_scale) + ") to one layer group";
      return;
    }
  }
  if (gc.config.softmax_scale == kq_scale) return;
  if (any_codes()) {
    broken_ = "layer " + std::to_string(il) + "'s graph passes a softmax scale (" + std::to_string(kq_scale) +
              ") other than the one its caches were made with (" + std::to_string(gc.config.softmax_scale) + ")";
    return;
  }
  gc.config.softmax_scale = kq_scale;
  gc.compressor = std::make_unique<e8kv::KVCompressor>(layers_.shape(static_cast<int>(g)), gc.config);
}

// ---- state: per sequence, one e8kv container per layer group ----------------------------------

void Memory::state_write(llama_io_write_i& io, llama_seq_id seq_id, llama_state_seq_flags /*flags*/) const {
  std::vector<size_t> ids;
  for (size_t id = 0; id < seqs_.size(); ++id) {
    if (seq_id >= 0 && static_cast<size_t>(seq_id) != id) continue;
    const Sequence& s = seqs_[id];
    if (s.mode == Sequence::Mode::kEmpty) continue;
    if (s.mode == Sequence::Mode::kFailed || !s.stage.empty() || !s.has_codes())
      throw std::runtime_error("e8kv memory: " + seq_name(static_cast<int>(id)) + " cannot be saved: " +
                               (s.mode == Sequence::Mode::kFailed ? s.failure : "a decode is in progress"));
    ids.push_back(id);
  }
  const uint32_t header[3] = {kMemoryStateMagic, kMemoryStateVersion, static_cast<uint32_t>(ids.size())};
  io.write(header, sizeof(header));
  for (size_t id : ids) {
    const Sequence& s = seqs_[id];
    int32_t meta[4] = {static_cast<int32_t>(id), s.pos_min, s.pos_max, static_cast<int32_t>(groups_.size())};
    const uint32_t crc = e8kv::container::crc32c(meta, sizeof(meta));
    io.write(meta, 3 * sizeof(int32_t));
    io.write(&meta[3], sizeof(int32_t));
    io.write(&crc, sizeof(crc));
    for (size_t g = 0; g < groups_.size(); ++g) {
      const std::vector<uint8_t> blob =
          g < s.caches.size() && s.caches[g] ? e8kv::container::serialize(*s.caches[g]) : std::vector<uint8_t>();
      const uint64_t size = blob.size();
      io.write(&size, sizeof(size));
      io.write(blob.data(), blob.size());
    }
  }
}

void Memory::state_read(llama_io_read_i& io, llama_seq_id seq_id, llama_state_seq_flags flags) {
  try {
    read_state(io, seq_id, flags);
  } catch (const std::exception& e) {
    // llama.cpp's readers throw at a state's end ("unexpectedly reached end of buffer"): say whose.
    const std::string what = e.what();
    if (what.rfind("e8kv memory", 0) == 0) throw;
    throw std::runtime_error("e8kv memory: the state cannot be read (" + what + "); nothing was changed");
  }
}

void Memory::read_state(llama_io_read_i& io, llama_seq_id seq_id, llama_state_seq_flags /*flags*/) {
  uint32_t header[3] = {0, 0, 0};
  io.read(header, sizeof(header));
  if (header[0] != kMemoryStateMagic)
    throw std::runtime_error("e8kv memory: the state was not written by e8kv's memory (was it saved with another "
                             "cache type, without --kv-e8kv?)");
  if (header[1] != 1 && header[1] != kMemoryStateVersion)
    throw std::runtime_error("e8kv memory: state version " + std::to_string(header[1]) + ", this build reads 1 and " +
                             std::to_string(kMemoryStateVersion));
  if (seq_id >= 0 ? header[2] > 1 : header[2] > seqs_.size())
    throw std::runtime_error("e8kv memory: the state holds " + std::to_string(header[2]) + " sequences, more than fit");
  // Everything is read and checked before any sequence changes: a bad state changes nothing.
  std::vector<std::pair<size_t, Sequence>> restored;
  for (uint32_t i = 0; i < header[2]; ++i) {
    int32_t meta[4] = {0, 0, 0, 1};  // version 1: one container, no checksum of these
    io.read(meta, 3 * sizeof(int32_t));
    if (header[1] >= 2) {
      uint32_t crc = 0;
      io.read(&meta[3], sizeof(int32_t));
      io.read(&crc, sizeof(crc));
      if (crc != e8kv::container::crc32c(meta, sizeof(meta)))
        throw std::runtime_error("e8kv memory: a sequence record of the state is corrupt (checksum mismatch)");
    }
    const uint32_t n_groups = static_cast<uint32_t>(meta[3]);
    if (n_groups != groups_.size())
      throw std::runtime_error("e8kv memory: the state holds " + std::to_string(n_groups) + " layer groups, this "
                               "model's memory " + std::to_string(groups_.size()) + " (another model?)");
    Sequence s;
    s.caches.resize(groups_.size());
    s.dropped_below.assign(groups_.size(), 0);
    for (size_t g = 0; g < groups_.size(); ++g) {
      uint64_t size = 0;
      io.read(&size, sizeof(size));
      if (size > kMaxMemoryStateBlob || (size == 0 && header[1] < 2))
        throw std::runtime_error("e8kv memory: a sequence's blob size is corrupt");
      if (size == 0) continue;
      // Read in pieces: a declared length is a claim, and a short state ends the read (llama.cpp's
      // readers throw at their end) before more than a piece beyond what it holds is allocated.
      std::vector<uint8_t> blob;
      constexpr uint64_t kPiece = uint64_t(16) << 20;
      for (uint64_t done = 0; done < size;) {
        const uint64_t step = std::min(size - done, kPiece);
        blob.resize(static_cast<size_t>(done + step));
        io.read(blob.data() + done, static_cast<size_t>(step));
        done += step;
      }
      std::unique_ptr<e8kv::CompressedKV> cache;
      try {
        cache = std::make_unique<e8kv::CompressedKV>(e8kv::container::deserialize(blob.data(), blob.size()));
      } catch (const std::exception& e) {
        throw std::runtime_error("e8kv memory: the state's cache of " + groups_[g].layers.describe() +
                                 " is refused: " + e.what());
      }
      const std::string diff = groups_[g].compressor->layout_difference(cache->layout());
      if (!diff.empty())
        throw std::runtime_error("e8kv memory: the state was written with another e8kv configuration or model (" +
                                 groups_[g].layers.describe() + ": " + diff + ")");
      s.caches[g] = std::move(cache);
    }
    if (!s.has_codes()) throw std::runtime_error("e8kv memory: a sequence of the state holds no codes");
    s.mode = Sequence::Mode::kCoded;
    s.pos_min = meta[1];
    s.pos_max = meta[2];
    bool inside = s.pos_min >= 0 && s.pos_max >= s.pos_min && s.last_coded_position() <= s.pos_max;
    for (const auto& c : s.caches)
      for (int l = 0; c && inside && l < c->n_layers(); ++l) {
        const std::vector<int32_t> stored = c->stored_positions(l);
        inside = stored.empty() || stored.front() >= s.pos_min;
      }
    if (!inside)
      throw std::runtime_error("e8kv memory: the state's positions (" + std::to_string(s.pos_min) + " .. " +
                               std::to_string(s.pos_max) + ") do not hold its caches' positions");
    const size_t target = seq_id >= 0 ? static_cast<size_t>(seq_id) : static_cast<size_t>(meta[0]);
    if (meta[0] < 0 || target >= seqs_.size()) throw std::runtime_error("e8kv memory: the state's sequence id is out of range");
    restored.emplace_back(target, std::move(s));
  }
  if (seq_id < 0) clear(true);
  else drop(seqs_[static_cast<size_t>(seq_id)]);
  for (auto& [target, s] : restored) seqs_[target] = std::move(s);
}

}  // namespace e8kv_llama

// ---- llama.cpp's entry points (llama-e8kv-memory.h) --------------------------------------------

llama_memory_i* llama_e8kv_memory_create(const llama_model& model, const llama_cparams& cparams, const char* spec) {
  const std::string what = "e8kv memory (--kv-e8kv '" + std::string(spec) + "'): ";
  auto refuse = [&](const std::string& why) { throw std::runtime_error(what + why); };
  e8kv_llama::ModelLayers layers;
  try {
    layers = e8kv_llama::map_model(model, cparams);
  } catch (const std::exception& e) {
    refuse(e.what());
  }
  e8kv::Config config;
  try {
    config = e8kv::Config::parse(spec);
  } catch (const std::exception& e) {
    refuse(e.what());
  }
  try {
    auto* memory = new e8kv_llama::Memory(layers, config, cparams.n_seq_max, static_cast<int>(cparams.n_threads_batch), spec);
    std::string groups;
    for (const auto& g : layers.groups) groups += "; " + g.describe();
    LLAMA_LOG_INFO("%s: e8kv memory: spec '%s', %zu layers x %d KV heads x %d dims, %u sequences%s; the KV buffer "
                   "grows with the tokens (e8kv's resident bytes), none is allocated ahead\n",
                   __func__, spec, layers.where.size(), layers.n_kv_heads, layers.head_dim, cparams.n_seq_max,
                   groups.c_str());
    return memory;
  } catch (const std::exception& e) {
    refuse(e.what());
  }
  return nullptr;
}

bool llama_e8kv_ubatch_computed(llama_memory_context_i* mctx) {
  auto* context = dynamic_cast<e8kv_llama::MemoryContext*>(mctx);
  if (context == nullptr || context->memory() == nullptr || context->applied() == nullptr) return true;
  return context->memory()->ubatch_computed(*context);
}

bool llama_e8kv_decode_finished(llama_memory_i* memory) {
  auto* m = dynamic_cast<e8kv_llama::Memory*>(memory);
  return m == nullptr || m->decode_finished();
}

size_t llama_e8kv_memory_staged_peak(const llama_memory_i* memory) {
  const auto* m = dynamic_cast<const e8kv_llama::Memory*>(memory);
  return m == nullptr ? 0 : m->staged_peak_bytes();
}
