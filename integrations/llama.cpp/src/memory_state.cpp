// The memory state's bytes (memory_state.hpp).
#include "e8kv/llama_cpp/memory_state.hpp"

#include <cstring>
#include <limits>
#include <string>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/container/checksum.hpp"
#include "e8kv/detail/byte_io.hpp"
#include "e8kv/error.hpp"

namespace e8kv::llama_cpp {

namespace {
uint32_t record_crc(const MemorySequence& s) {
  const int32_t meta[4] = {s.id, s.pos_min, s.pos_max, static_cast<int32_t>(s.groups.size())};
  return container::crc32c(meta, sizeof(meta));
}
}  // namespace

bool is_memory_state(const uint8_t* data, size_t size) {
  uint32_t magic = 0;
  if (data == nullptr || size < 4) return false;
  std::memcpy(&magic, data, 4);
  return magic == kMemoryStateMagic;
}

MemoryState parse_memory_state(const uint8_t* data, size_t size) {
  detail::ByteReader r(data, size, "e8kv memory state", "llama.cpp state: ");
  MemoryState st;
  if (r.u32("magic") != kMemoryStateMagic)
    r.fail("not e8kv's memory state (no E8KM magic: was it saved without --kv-e8kv?)");
  st.version = r.u32("version");
  if (st.version != 1 && st.version != kMemoryStateVersion)
    r.fail("version " + std::to_string(st.version) + "; this build reads 1 and " + std::to_string(kMemoryStateVersion));
  const uint32_t n = r.u32("sequences");
  if (n > r.remaining() / 16) r.fail("declares " + std::to_string(n) + " sequences, more than its bytes can hold");
  for (uint32_t i = 0; i < n; ++i) {
    MemorySequence s;
    s.id = r.i32("sequence id");
    s.pos_min = r.i32("pos_min");
    s.pos_max = r.i32("pos_max");
    int32_t groups = 1;
    if (st.version >= 2) {
      groups = r.i32("layer groups");
      s.groups.resize(groups > 0 && groups <= 64 ? static_cast<size_t>(groups) : 0);
      if (r.u32("record checksum") != record_crc(s) || groups <= 0 || groups > 64)
        r.fail("sequence record " + std::to_string(i) + " is corrupt (checksum mismatch)");
    } else {
      s.groups.resize(1);
    }
    for (auto& blob : s.groups) {
      const uint64_t bytes = r.u64("container size");
      if (bytes > kMaxMemoryStateBlob || (bytes == 0 && st.version < 2))
        r.fail("a container size of " + std::to_string(bytes) + " bytes is corrupt");
      r.bytes(blob, bytes, "container");
    }
    st.sequences.push_back(std::move(s));
  }
  if (r.remaining() != 0) r.fail(std::to_string(r.remaining()) + " bytes follow the last sequence");
  return st;
}

std::vector<uint8_t> write_memory_state(const MemoryState& state) {
  std::vector<uint8_t> out;
  detail::ByteWriter w(out);
  w.u32(kMemoryStateMagic);
  w.u32(kMemoryStateVersion);
  w.u32(static_cast<uint32_t>(state.sequences.size()));
  for (const MemorySequence& s : state.sequences) {
    w.i32(s.id);
    w.i32(s.pos_min);
    w.i32(s.pos_max);
    w.i32(static_cast<int32_t>(s.groups.size()));
    w.u32(record_crc(s));
    for (const auto& blob : s.groups) {
      w.u64(blob.size());
      w.bytes(blob);
    }
  }
  return out;
}

void check_memory_state(const MemoryState& state, const std::function<void(size_t, const CompressedKV&)>& also) {
  for (const MemorySequence& s : state.sequences) {
    const std::string who = "sequence " + std::to_string(s.id);
    bool any = false;
    for (size_t g = 0; g < s.groups.size(); ++g) {
      if (s.groups[g].empty()) continue;
      any = true;
      CompressedKV cache;
      try {
        cache = container::deserialize(s.groups[g].data(), s.groups[g].size());
      } catch (const std::exception& e) {
        throw Error("e8kv memory state: " + who + ", layer group " + std::to_string(g) + ": " + e.what());
      }
      for (int l = 0; l < cache.n_layers(); ++l) {
        const std::vector<int32_t> stored = cache.stored_positions(l);
        if (!stored.empty() && (stored.front() < s.pos_min || stored.back() > s.pos_max))
          throw Error("e8kv memory state: " + who + " spans positions " + std::to_string(s.pos_min) + ".." +
                      std::to_string(s.pos_max) + ", its layer group " + std::to_string(g) + " stores " +
                      std::to_string(stored.front()) + ".." + std::to_string(stored.back()));
      }
      if (also) also(g, cache);
    }
    if (!any) throw Error("e8kv memory state: " + who + " holds no codes");
  }
}

std::string spec_difference(const Config& spec, const CompressedKV& cache) {
  const CacheLayout& L = cache.layout();
  Config c = spec;
  c.rope = L.rope;  // the model's, as the softmax scale (the memory takes both from llama.cpp's graph)
  c.softmax_scale = L.softmax_scale;
  try {
    const KVCompressor mine(ModelShape{L.n_layers, L.n_kv_heads, L.n_q_heads, L.head_dim}, c);
    return mine.layout_difference(L);
  } catch (const std::exception& e) {
    return std::string("the spec does not hold for this shape: ") + e.what();
  }
}

MemoryState cut_memory_state(const MemoryState& state, int32_t end) {
  if (state.sequences.size() != 1)
    throw Error("cut_memory_state: the state holds " + std::to_string(state.sequences.size()) +
                " sequences; a cut takes one");
  const MemorySequence& s = state.sequences[0];
  if (end <= s.pos_min || end > s.pos_max + 1)
    throw Error("cut_memory_state: position " + std::to_string(end) + " is outside the sequence's " +
                std::to_string(s.pos_min) + ".." + std::to_string(s.pos_max) + " (+1)");
  if (s.groups.size() != 1)
    throw Error("cut_memory_state: the state holds " + std::to_string(s.groups.size()) +
                " layer groups (a sliding-window model): it cannot be cut to a shorter prefix");
  MemoryState out = state;
  MemorySequence& o = out.sequences[0];
  o.pos_max = end - 1;
  for (auto& blob : o.groups) {
    if (blob.empty()) continue;
    CompressedKV cache = container::deserialize(blob.data(), blob.size());
    keep_positions(cache, std::numeric_limits<int64_t>::min(), end);
    blob = container::serialize(cache);
  }
  return out;
}

}  // namespace e8kv::llama_cpp
