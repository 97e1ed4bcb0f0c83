// A sequence of e8kv's llama.cpp memory (e8kv_sequence.hpp): the stage, its commit, windows.
#include "e8kv_sequence.hpp"

#include <algorithm>
#include <limits>

#include "e8kv/cache/kv_view.hpp"
#include "e8kv/error.hpp"

namespace e8kv_llama {

namespace {
// Positions a windowed group lets pile up before dropping them: drop_before copies the layer's
// buffers, so it runs once per this many positions, not per token.
constexpr int32_t kDropSlack = 256;
}  // namespace

size_t PromptStage::bytes() const {
  size_t n = positions.capacity() * sizeof(int32_t) + obs_positions.capacity() * sizeof(int32_t);
  for (const auto& x : k) n += x.capacity() * sizeof(uint16_t);
  for (const auto& x : v) n += x.capacity() * sizeof(uint16_t);
  for (const auto& x : obs_q) n += x.capacity() * sizeof(float);
  return n;
}

void PromptStage::clear() { *this = PromptStage(); }

bool Sequence::has_codes() const {
  return std::any_of(caches.begin(), caches.end(), [](const auto& c) { return c != nullptr; });
}

int64_t Sequence::last_coded_position() const {
  int64_t last = -1;
  for (const auto& c : caches)
    if (c)
      for (int l = 0; l < c->n_layers(); ++l) last = std::max(last, c->last_position(l));
  return last;
}

size_t Sequence::bytes() const {
  size_t n = 0;
  for (const auto& c : caches) n += c ? c->bytes() : 0;
  return n;
}

size_t Sequence::resident_bytes() const {
  size_t n = stage.bytes();
  for (const auto& c : caches) n += c ? c->resident_bytes() : 0;
  return n;
}

Sequence Sequence::clone() const {
  Sequence s;
  s.mode = mode;
  s.pos_min = pos_min;
  s.pos_max = pos_max;
  s.failure = failure;
  for (const auto& c : caches) s.caches.push_back(c ? std::make_unique<e8kv::CompressedKV>(*c) : nullptr);
  s.dropped_below = dropped_below;
  s.stage = stage;
  return s;
}

void commit_stage(Sequence& s, const std::vector<GroupCodec>& groups, const ModelLayers& model, e8kv::Executor* pool) {
  PromptStage& st = s.stage;
  if (st.empty()) return;
  if (s.caches.size() != groups.size()) s.caches.resize(groups.size());
  if (s.dropped_below.size() != groups.size()) s.dropped_below.assign(groups.size(), 0);
  const int64_t n = static_cast<int64_t>(st.positions.size());
  const int64_t n_obs = static_cast<int64_t>(st.obs_positions.size());
  // compress and extend leave a cache as it was when they throw; with several groups, one that
  // throws after another was extended leaves the sequence inconsistent: the caller fails it.
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupCodec& gc = groups[g];
    e8kv::SequenceKV kv;
    std::vector<e8kv::LayerQueries> queries;
    for (int il : gc.layers.layers) {
      const size_t l = static_cast<size_t>(il);
      if (static_cast<int64_t>(st.k[l].size()) != n * model.n_kv_heads * model.head_dim)
        throw e8kv::Error("layer " + std::to_string(il) + " staged " +
                          std::to_string(st.k[l].size() / (static_cast<size_t>(model.n_kv_heads) * model.head_dim)) +
                          " tokens of " + std::to_string(n));
      kv.layers.push_back({e8kv::TensorView::nhd(st.k[l].data(), e8kv::DType::kF16, n, model.n_kv_heads, model.head_dim),
                           e8kv::TensorView::nhd(st.v[l].data(), e8kv::DType::kF16, n, model.n_kv_heads, model.head_dim)});
      e8kv::LayerQueries q;
      q.queries = e8kv::TensorView::nhd(st.obs_q[l].data(), e8kv::DType::kF32, n_obs, model.n_q_heads, model.head_dim);
      q.positions = st.obs_positions.data();
      queries.push_back(q);
    }
    kv.positions = st.positions.data();
    if (s.caches[g] == nullptr)
      s.caches[g] = std::make_unique<e8kv::CompressedKV>(gc.compressor->compress(kv, &queries, pool));
    else
      gc.compressor->extend(*s.caches[g], kv, &queries, pool);
  }
  st.clear();
  drop_outside_windows(s, groups);
}

bool cut_tail(Sequence& s, const std::vector<GroupCodec>& groups, int32_t end, std::string* why) {
  if (s.mode != Sequence::Mode::kCoded || !s.stage.empty()) {
    *why = "a prompt is in progress";
    return false;
  }
  // Every group's cut is made on a copy first: a refusal by any group changes none.
  std::vector<std::unique_ptr<e8kv::CompressedKV>> cut(s.caches.size());
  for (size_t g = 0; g < s.caches.size() && g < groups.size(); ++g) {
    if (s.caches[g] == nullptr) continue;
    const int32_t window = groups[g].layers.window;
    const int32_t dropped = g < s.dropped_below.size() ? s.dropped_below[g] : 0;
    if (window > 0 && dropped > end + 1 - window) {
      *why = groups[g].layers.describe() + " dropped the positions below " + std::to_string(dropped) +
             ", which a token at " + std::to_string(end) + " sees (window " + std::to_string(window) + ")";
      return false;
    }
    cut[g] = std::make_unique<e8kv::CompressedKV>(*s.caches[g]);
    try {
      e8kv::keep_positions(*cut[g], std::numeric_limits<int64_t>::min(), end);
    } catch (const std::exception& e) {
      *why = e.what();
      return false;
    }
  }
  for (size_t g = 0; g < cut.size(); ++g)
    if (cut[g]) s.caches[g] = std::move(cut[g]);
  s.pos_max = end - 1;
  return true;
}

void drop_outside_windows(Sequence& s, const std::vector<GroupCodec>& groups) {
  for (size_t g = 0; g < groups.size() && g < s.caches.size(); ++g) {
    const int32_t window = groups[g].layers.window;
    if (window <= 0 || s.caches[g] == nullptr || s.pos_max < 0) continue;
    // The next token (at pos_max + 1 or later) sees positions from pos_max + 2 − window on.
    const int32_t first_visible = s.pos_max + 2 - window;
    if (first_visible - s.dropped_below[g] < kDropSlack) continue;
    groups[g].compressor->drop_before(*s.caches[g], first_visible);
    s.dropped_below[g] = first_visible;
  }
}

}  // namespace e8kv_llama
