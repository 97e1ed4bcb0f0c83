// push / pull of llama-server slot files through a store (fleet.hpp).
#include "fleet.hpp"

#include <cstring>
#include <sstream>

#include "e8kv/container/container.hpp"
#include "e8kv/detail/byte_io.hpp"
#include "e8kv/error.hpp"
#include "e8kv/llama_cpp/memory_state.hpp"
#include "e8kv/llama_cpp/seq_state.hpp"
#include "e8kv/llama_cpp/state_codec.hpp"

namespace e8kv::llama_cpp::fleet {

namespace {

uint32_t read_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Keeps the elements of `keep` cells of a row-major [cells, row] block, in order.
std::vector<uint8_t> keep_rows(const std::vector<uint8_t>& b, size_t row, const std::vector<bool>& keep) {
  std::vector<uint8_t> out;
  for (size_t c = 0; c < keep.size(); ++c)
    if (keep[c]) out.insert(out.end(), b.begin() + c * row, b.begin() + (c + 1) * row);
  return out;
}

// A slot file of bare tokens: llama_state_seq_save_file's header, the tokens, then the state as
// llama_state_seq_get_data's frame and the caches' bytes.
std::vector<uint8_t> slot_file_of(const int32_t* tokens, size_t n_tokens, const uint8_t* frame, size_t frame_size,
                                  const uint8_t* body, size_t body_size) {
  std::vector<uint8_t> out;
  out.reserve(12 + 4 * n_tokens + frame_size + body_size);
  detail::ByteWriter w(out);
  w.u32(kSeqFileMagic);
  w.u32(kSeqFileVersion);
  w.u32(static_cast<uint32_t>(n_tokens));
  w.bytes(tokens, 4 * n_tokens);
  w.bytes(frame, frame_size);
  w.bytes(body, body_size);
  return out;
}

// A slot file's state split where its caches begin: the frame llama_state_seq_get_data writes
// (possibly none), then the caches' bytes (llama.cpp's cells, or e8kv's memory state).
struct SlotState {
  const uint8_t* frame = nullptr;
  size_t frame_size = 0;
  const uint8_t* body = nullptr;
  size_t body_size = 0;
};
SlotState slot_state(const uint8_t* file, size_t size, const SlotFile& slot) {
  SlotState st;
  st.frame = file + slot.state_offset;
  const size_t state_size = size - slot.state_offset;
  st.frame_size = seq_data_frame_bytes(st.frame, state_size);
  st.body = st.frame + st.frame_size;
  st.body_size = state_size - st.frame_size;
  return st;
}

// A memory slot's parts: its tokens, the frame before the state, the state parsed.
struct MemorySlot {
  SlotFile slot;
  std::vector<uint8_t> frame;
  MemoryState state;
};

// Parses a --kv-e8kv server's slot file and checks everything a server would check on restore:
// one sequence at positions 0..n-1 for its n tokens, every container read (checksums, fields), and
// each group's layout against this fleet's spec (spec_difference: a slot from a server with another
// spec is refused here rather than stored under this spec's keys).
MemorySlot read_memory_slot(const uint8_t* file, size_t size, const FleetModel& model) {
  MemorySlot m;
  m.slot = parse_slot_file(file, size);
  const SlotState st = slot_state(file, size, m.slot);
  if (!is_memory_state(st.body, st.body_size))
    throw Error("the slot holds llama.cpp's own cache cells (a server without --kv-e8kv): push and pull it with "
                "--config SPEC, not --kv-e8kv");
  m.frame.assign(st.frame, st.frame + st.frame_size);
  m.state = parse_memory_state(st.body, st.body_size);
  if (m.state.sequences.size() != 1)
    throw Error("the slot's memory state holds " + std::to_string(m.state.sequences.size()) + " sequences, not one");
  const MemorySequence& seq = m.state.sequences[0];
  if (seq.pos_min != 0 || static_cast<size_t>(seq.pos_max) + 1 != m.slot.tokens.size())
    throw Error("the slot's sequence spans positions " + std::to_string(seq.pos_min) + ".." + std::to_string(seq.pos_max) +
                " for " + std::to_string(m.slot.tokens.size()) + " tokens (a shifted or edited context)");
  check_memory_state(m.state, [&](size_t g, const CompressedKV& cache) {
    const std::string diff = spec_difference(model.memory_spec, cache);
    if (!diff.empty())
      throw Error("the slot's codes were made with another spec than this --kv-e8kv (layer group " +
                  std::to_string(g) + ": " + diff + ")");
  });
  return m;
}

}  // namespace

bool slot_holds_memory_codes(const uint8_t* file, size_t size) {
  const SlotState st = slot_state(file, size, parse_slot_file(file, size));
  return is_memory_state(st.body, st.body_size);
}

SlotFile parse_slot_file(const uint8_t* file, size_t size) {
  SlotFile s;
  s.state_offset = seq_file_state_offset(file, size);  // checks magic, version and the token list's size
  const uint32_t n = read_u32(file + 8);
  s.tokens.resize(n);
  if (n) std::memcpy(s.tokens.data(), file + 12, size_t{n} * 4);
  // llama-server writes its prompt's packed form, not the bare tokens: -1 (LLAMA_TOKEN_NULL),
  // the format version (1), the token count, the tokens, the count of media chunks (then the
  // chunks). A bare list (llama_state_seq_save_file's other callers, older servers) starts with a
  // token id, never -1. Restoring accepts either form, so truncate_slot_file writes bare tokens.
  if (n > 0 && s.tokens[0] == -1) {
    if (n < 4 || s.tokens[1] != 1)
      throw Error("slot file: llama-server's packed token list has version " +
                  (n < 2 ? std::string("(missing)") : std::to_string(s.tokens[1])) + "; this tool reads version 1");
    const uint32_t count = static_cast<uint32_t>(s.tokens[2]);
    if (count > n - 4)
      throw Error("slot file: llama-server's packed token list claims " + std::to_string(count) + " tokens in " +
                  std::to_string(n) + " words");
    if (s.tokens[3 + count] != 0)
      throw Error("slot file: the slot holds media chunks (a multimodal prompt): not supported");
    s.tokens = std::vector<int32_t>(s.tokens.begin() + 3, s.tokens.begin() + 3 + count);
  }
  return s;
}

std::vector<uint8_t> truncate_slot_file(const uint8_t* file, size_t size, size_t n_tokens) {
  const SlotFile slot = parse_slot_file(file, size);
  if (n_tokens > slot.tokens.size())
    throw Error("truncate_slot_file: " + std::to_string(n_tokens) + " tokens asked, the slot holds " +
                std::to_string(slot.tokens.size()));
  const SlotState st = slot_state(file, size, slot);
  std::vector<SeqState> caches = parse_seq_caches(st.body, st.body_size, 1);
  for (SeqStateStream& S : caches[0].streams) {
    if (S.cells() == 0) continue;
    std::vector<bool> keep(S.cells());
    std::vector<bool> seen(n_tokens, false);
    size_t kept = 0;
    for (size_t c = 0; c < S.cells(); ++c) {
      const int32_t p = S.positions[c];
      keep[c] = p >= 0 && static_cast<size_t>(p) < n_tokens;
      if (!keep[c]) continue;
      if (seen[static_cast<size_t>(p)]) throw Error("truncate_slot_file: position " + std::to_string(p) + " repeated");
      seen[static_cast<size_t>(p)] = true;
      ++kept;
    }
    if (kept != n_tokens)
      throw Error("truncate_slot_file: the state holds " + std::to_string(kept) + " of positions 0.." +
                  std::to_string(n_tokens - 1) + " (a shifted or edited context cannot be cut to a prefix)");
    const size_t old_cells = S.cells();
    std::vector<int32_t> pos, seq;
    std::vector<std::vector<uint8_t>> ext;
    for (size_t c = 0; c < old_cells; ++c) {
      if (!keep[c]) continue;
      pos.push_back(S.positions[c]);
      seq.push_back(S.seq_ids[c]);
      if (!S.cell_ext.empty()) ext.push_back(S.cell_ext[c]);
    }
    S.positions = std::move(pos);
    S.seq_ids = std::move(seq);
    S.cell_ext = std::move(ext);
    for (SeqStateLayer& L : S.layers) {
      L.keys = keep_rows(L.keys, L.k_row_bytes, keep);
      if (!S.v_trans) {
        L.values = keep_rows(L.values, L.v_row_bytes, keep);
      } else {  // channel-major: [v_embd][cells][element]
        std::vector<uint8_t> v;
        v.reserve(size_t{L.v_embd} * n_tokens * L.v_element_bytes);
        for (size_t ch = 0; ch < L.v_embd; ++ch)
          for (size_t c = 0; c < old_cells; ++c)
            if (keep[c]) {
              const auto at = L.values.begin() + (ch * old_cells + c) * L.v_element_bytes;
              v.insert(v.end(), at, at + L.v_element_bytes);
            }
        L.values = std::move(v);
      }
    }
  }
  const std::vector<uint8_t> body = write_seq_caches(caches);
  return slot_file_of(slot.tokens.data(), n_tokens, st.frame, st.frame_size, body.data(), body.size());
}

std::string layout_string(const std::vector<const KVCompressor*>& caches) {
  std::ostringstream s;
  s << "e8kv-llama-fleet-v1;caches=" << caches.size();
  for (const KVCompressor* c : caches) {
    const ModelShape& m = c->shape();
    s << ";shape=" << m.n_layers << "x" << m.n_kv_heads << "x" << m.n_q_heads << "x" << m.head_dim << ";config="
      << c->config().describe();
  }
  return s.str();
}

std::string memory_layout_string(const Config& spec) {
  return "e8kv-llama-memory-v1;config=" + spec.describe();
}

namespace {

// push of a --kv-e8kv server's slot: the codes stored as they are, as a slot file of bare tokens,
// under the key of the longest whole-chunk prefix (with references below it when the codes can
// be cut: one layer group).
PushResult push_memory_slot(store::Store& s, const FleetModel& model, const uint8_t* file, size_t size,
                            std::chrono::milliseconds ttl) {
  PushResult r;
  const MemorySlot m = read_memory_slot(file, size, model);
  const size_t C = model.chunk_tokens;
  r.file_tokens = m.slot.tokens.size();
  const size_t whole = r.file_tokens / C * C;
  if (whole == 0) {
    r.note = "the slot holds " + std::to_string(r.file_tokens) + " tokens, less than one chunk of " + std::to_string(C);
    return r;
  }
  const SlotState st = slot_state(file, size, m.slot);
  const std::vector<uint8_t> value =
      slot_file_of(m.slot.tokens.data(), r.file_tokens, st.frame, st.frame_size, st.body, st.body_size);
  const auto keys = store::prefix_keys(model.fingerprint, m.slot.tokens.data(), whole, C);
  r.published_tokens = whole;
  r.slot_bytes = size;
  r.value_bytes = value.size();
  r.stored = store::publish_prefix(s, keys, C, value, ttl, m.state.sequences[0].groups.size() == 1);
  return r;
}

// pull for a --kv-e8kv server: the stored codes as they are when the prompt starts with every token
// they hold, else cut to the prefix found (nothing decoded).
PullResult pull_memory_slot(store::Store& s, const FleetModel& model, const std::vector<int32_t>& prompt,
                            const store::MissLog& log) {
  PullResult r;
  const size_t C = model.chunk_tokens;
  const auto keys = store::prefix_keys(model.fingerprint, prompt.data(), prompt.size(), C);
  MemorySlot m;
  const store::PayloadCheck check = [&](const uint8_t* p, size_t n) { m = read_memory_slot(p, n, model); };
  store::PrefixHit hit = store::find_longest_prefix(s, keys, C, check, log);
  r.round_trips = hit.round_trips;
  if (hit.chunks == 0) return r;
  const std::vector<int32_t>& held = m.slot.tokens;
  if (held.size() < hit.n_tokens || std::memcmp(held.data(), prompt.data(), hit.n_tokens * 4) != 0) {
    if (log) log(hit.data_key, "its token list differs from the prompt's first " + std::to_string(hit.n_tokens) +
                                   " tokens (a hash collision or a foreign value)");
    return r;
  }
  r.value_bytes = hit.payload.size();
  if (prompt.size() >= held.size() && std::memcmp(held.data(), prompt.data(), held.size() * 4) == 0) {
    r.n_tokens = held.size();  // every token the codes hold begins the prompt: as stored
    r.slot_file = std::move(hit.payload);
    return r;
  }
  MemoryState cut;
  try {
    cut = cut_memory_state(m.state, static_cast<int32_t>(hit.n_tokens));
  } catch (const std::exception& e) {
    if (log) log(hit.data_key, std::string("its codes cannot be cut to the prompt's first ") +
                                   std::to_string(hit.n_tokens) + " tokens: " + e.what());
    return r;
  }
  const std::vector<uint8_t> body = write_memory_state(cut);
  r.n_tokens = hit.n_tokens;
  r.slot_file = slot_file_of(held.data(), hit.n_tokens, m.frame.data(), m.frame.size(), body.data(), body.size());
  return r;
}

}  // namespace

PushResult push_slot(store::Store& s, const FleetModel& model, const uint8_t* file, size_t size,
                     std::chrono::milliseconds ttl) {
  if (model.memory_codes) return push_memory_slot(s, model, file, size, ttl);
  if (slot_holds_memory_codes(file, size))
    throw Error("the slot holds e8kv memory codes (a server with --kv-e8kv): push and pull it with --kv-e8kv SPEC "
                "(the server's spec), not --config");
  PushResult r;
  const SlotFile slot = parse_slot_file(file, size);
  const size_t C = model.chunk_tokens;
  r.file_tokens = slot.tokens.size();
  const size_t whole = r.file_tokens / C * C;
  const bool one_cache = model.caches.size() == 1;
  if (whole == 0) {
    r.note = "the slot holds " + std::to_string(r.file_tokens) + " tokens, less than one chunk of " + std::to_string(C);
    return r;
  }
  if (!one_cache && whole != r.file_tokens) {
    r.note = "a model with " + std::to_string(model.caches.size()) +
             " KV caches is published only at a whole number of chunks (" + std::to_string(r.file_tokens) + " tokens)";
    return r;
  }
  std::vector<uint8_t> cut;
  const uint8_t* src = file;
  size_t src_size = size;
  if (whole != r.file_tokens) {
    cut = truncate_slot_file(file, size, whole);
    src = cut.data();
    src_size = cut.size();
  }
  StateCompressOptions options;
  options.executor = model.executor;
  const std::vector<uint8_t> packed = compress_slot_file(src, src_size, model.caches, options);
  const auto keys = store::prefix_keys(model.fingerprint, slot.tokens.data(), whole, C);
  r.published_tokens = whole;
  r.slot_bytes = src_size;
  r.value_bytes = packed.size();
  r.stored = store::publish_prefix(s, keys, C, packed, ttl, one_cache);
  return r;
}

PullResult pull_slot(store::Store& s, const FleetModel& model, const std::vector<int32_t>& prompt,
                     const store::MissLog& log) {
  if (model.memory_codes) return pull_memory_slot(s, model, prompt, log);
  PullResult r;
  const size_t C = model.chunk_tokens;
  const auto keys = store::prefix_keys(model.fingerprint, prompt.data(), prompt.size(), C);
  std::vector<uint8_t> restored;
  // Every check on the candidate, before it is a hit: the full restore (the compressed state's
  // header CRC and every container chunk's CRC), a slot file, and the cache count of this model.
  const store::PayloadCheck check = [&](const uint8_t* p, size_t n) {
    const auto info = read_compressed_state_info(p, n);
    if (info.caches.size() != model.caches.size())
      throw Error("holds " + std::to_string(info.caches.size()) + " KV caches, the model has " +
                  std::to_string(model.caches.size()));
    restored = restore_seq_state(p, n, {}, model.executor);
    (void)parse_slot_file(restored.data(), restored.size());
  };
  store::PrefixHit hit = store::find_longest_prefix(s, keys, C, check, log);
  r.round_trips = hit.round_trips;
  if (hit.chunks == 0) return r;
  const SlotFile slot = parse_slot_file(restored.data(), restored.size());
  if (slot.tokens.size() < hit.n_tokens ||
      std::memcmp(slot.tokens.data(), prompt.data(), hit.n_tokens * 4) != 0) {
    if (log) log(hit.data_key, "its token list differs from the prompt's first " + std::to_string(hit.n_tokens) +
                                   " tokens (a hash collision or a foreign value)");
    return r;
  }
  if (slot.tokens.size() != hit.n_tokens) {
    if (model.caches.size() != 1) {
      if (log) log(hit.data_key, "a multi-cache state cannot be cut to a shorter prefix");
      return r;
    }
    restored = truncate_slot_file(restored.data(), restored.size(), hit.n_tokens);
  }
  r.n_tokens = hit.n_tokens;
  r.value_bytes = hit.payload.size();
  r.slot_file = std::move(restored);
  return r;
}

}  // namespace e8kv::llama_cpp::fleet
