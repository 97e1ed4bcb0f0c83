// llama.cpp sequence state bytes <-> SeqState (format: llama_cpp/seq_state.hpp).
#include "e8kv/llama_cpp/seq_state.hpp"

#include <cstring>

#include "e8kv/detail/byte_io.hpp"
#include "e8kv/error.hpp"

namespace e8kv::llama_cpp {

std::string ggml_type_name(int32_t type) {
  static const char* const kNames[] = {
      "f32",     "f16",    "q4_0",    "q4_1",  nullptr, nullptr, "q5_0",   "q5_1",   "q8_0", "q8_1",  "q2_K",
      "q3_K",    "q4_K",   "q5_K",    "q6_K",  "q8_K",  "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s",
      "iq2_s",   "iq4_xs", "i8",      "i16",   "i32",   "i64",   "f64",    "iq1_m",  "bf16", nullptr, nullptr,
      nullptr,   "tq1_0",  "tq2_0",   nullptr, nullptr, nullptr, "mxfp4",  "nvfp4",  "q1_0", "q2_0",
      // 43-45: e8kv's E8 types, in a ggml patched by scripts/fetch-llama-cpp.sh
      "e8p",     "e8r3",   "e8r4"};
  constexpr int32_t n = static_cast<int32_t>(sizeof(kNames) / sizeof(kNames[0]));
  if (type >= 0 && type < n && kNames[type] != nullptr) return kNames[type];
  return "type " + std::to_string(type);
}

namespace {

constexpr size_t kCellExtBytes = 12;  // llama_kv_cell_ext: i32 x, i32 y, i32 token
constexpr const char* kFormat = "llama.cpp sequence state";

}  // namespace

SeqState parse_seq_state(const uint8_t* data, size_t size, const SeqStateOptions& options, size_t* consumed) {
  if (data == nullptr && size != 0) throw Error("parse_seq_state: null data with size " + std::to_string(size));
  detail::ByteReader r(data, size, kFormat);
  SeqState st;
  const uint32_t n_stream = r.get<uint32_t>("n_stream");
  // llama.cpp has one stream per sequence at most (n_seq_max <= 256 in this version: LLAMA_MAX_SEQ).
  if (n_stream == 0 || n_stream > 256)
    r.fail("n_stream is " + std::to_string(n_stream) + "; accepted 1 to 256 (not a KV cache's sequence state?)");
  st.streams.resize(n_stream);
  for (uint32_t s = 0; s < n_stream; ++s) {
    SeqStateStream& S = st.streams[s];
    const uint32_t cells = r.get<uint32_t>("cell_count");
    if (cells == 0) continue;
    const size_t per_cell_min = 4 + 4 + (options.cell_ext ? kCellExtBytes : 0) + 4;
    if (cells > r.remaining() / per_cell_min)
      r.fail("cell_count " + std::to_string(cells) + " does not fit in the bytes left");
    S.positions.resize(cells);
    S.seq_ids.resize(cells);
    if (options.cell_ext) S.cell_ext.resize(cells);
    for (uint32_t c = 0; c < cells; ++c) {
      S.positions[c] = r.get<int32_t>("cell pos");
      const uint32_t n_seq = r.get<uint32_t>("cell n_seq_id");
      if (n_seq != 1)
        r.fail("cell " + std::to_string(c) + " belongs to " + std::to_string(n_seq) +
               " sequences; a sequence's state has exactly one per cell (whole-context states are not read)");
      if (options.cell_ext) r.bytes(S.cell_ext[c], kCellExtBytes, "cell ext");
      S.seq_ids[c] = r.get<int32_t>("cell seq_id");
      if (S.seq_ids[c] < 0) r.fail("cell " + std::to_string(c) + " has a negative sequence id");
    }
    const uint32_t v_trans = r.get<uint32_t>("v_trans");
    if (v_trans > 1) r.fail("v_trans is " + std::to_string(v_trans) + "; accepted 0 or 1");
    S.v_trans = v_trans == 1;
    const uint32_t n_layer = r.get<uint32_t>("n_layer");
    if (n_layer == 0 || n_layer > 4096) r.fail("n_layer is " + std::to_string(n_layer) + "; accepted 1 to 4096");
    S.layers.resize(n_layer);
    for (uint32_t l = 0; l < n_layer; ++l) {
      SeqStateLayer& L = S.layers[l];
      L.k_type = r.get<int32_t>("k_type");
      L.k_row_bytes = r.get<uint64_t>("k_row_bytes");
      if (L.k_row_bytes == 0) r.fail("layer " + std::to_string(l) + ": k_row_bytes is 0");
      r.bytes(L.keys, r.product(cells, L.k_row_bytes, "keys"), "keys");
    }
    for (uint32_t l = 0; l < n_layer; ++l) {
      SeqStateLayer& L = S.layers[l];
      L.v_type = r.get<int32_t>("v_type");
      uint64_t bytes = 0;
      if (!S.v_trans) {
        L.v_row_bytes = r.get<uint64_t>("v_row_bytes");
        if (L.v_row_bytes == 0) r.fail("layer " + std::to_string(l) + ": v_row_bytes is 0");
        bytes = r.product(cells, L.v_row_bytes, "values");
      } else {
        L.v_element_bytes = r.get<uint32_t>("v_element_bytes");
        L.v_embd = r.get<uint32_t>("n_embd_v");
        if (L.v_element_bytes == 0 || L.v_embd == 0)
          r.fail("layer " + std::to_string(l) + ": transposed V with element size " +
                 std::to_string(L.v_element_bytes) + " and " + std::to_string(L.v_embd) + " channels");
        bytes = r.product(r.product(cells, L.v_element_bytes, "values"), L.v_embd, "values");
      }
      r.bytes(L.values, bytes, "values");
    }
  }
  if (consumed != nullptr) {
    *consumed = r.offset();
  } else if (r.remaining() != 0) {
    r.fail(std::to_string(r.remaining()) +
           " bytes follow the KV cache's state: a second memory (the sliding-window cache of an iSWA model, "
           "or a recurrent state) that e8kv does not represent");
  }
  return st;
}

std::vector<SeqState> parse_seq_caches(const uint8_t* data, size_t size, size_t n_caches,
                                       const SeqStateOptions& options) {
  if (n_caches == 0 || n_caches > 2)
    throw Error("parse_seq_caches: " + std::to_string(n_caches) +
                " KV caches; llama.cpp models keep 1 (2 with interleaved sliding-window attention)");
  if (data == nullptr && size != 0) throw Error("parse_seq_caches: null data with size " + std::to_string(size));
  std::vector<SeqState> caches;
  size_t at = 0;
  for (size_t c = 0; c < n_caches; ++c) {
    size_t used = 0;
    try {
      caches.push_back(parse_seq_state(data + at, size - at, options, &used));
    } catch (const Error& e) {
      if (n_caches == 1) throw;
      throw Error("KV cache " + std::to_string(c) + " of " + std::to_string(n_caches) + " (at byte " +
                  std::to_string(at) + "): " + e.what());
    }
    at += used;
  }
  if (at != size)
    throw Error(std::string(kFormat) + ": " + std::to_string(size - at) + " bytes follow the " +
                std::to_string(n_caches) + " KV cache state(s): " +
                (n_caches == 1 ? "a second memory (the sliding-window cache of an iSWA model, or a recurrent state)"
                               : "a memory after the sliding-window cache (a recurrent state?)") +
                " that e8kv does not read here");
  return caches;
}

std::vector<uint8_t> write_seq_caches(const std::vector<SeqState>& caches, const SeqStateOptions& options) {
  std::vector<uint8_t> out;
  for (const SeqState& st : caches) {
    const std::vector<uint8_t> b = write_seq_state(st, options);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

std::vector<uint8_t> write_seq_state(const SeqState& state, const SeqStateOptions& options) {
  std::vector<uint8_t> out;
  detail::ByteWriter w(out);
  w.put<uint32_t>(static_cast<uint32_t>(state.streams.size()));
  for (const SeqStateStream& S : state.streams) {
    const size_t cells = S.cells();
    w.put<uint32_t>(static_cast<uint32_t>(cells));
    if (cells == 0) continue;
    if (S.seq_ids.size() != cells || (options.cell_ext && S.cell_ext.size() != cells))
      throw Error("write_seq_state: a stream's cell lists differ in length");
    for (size_t c = 0; c < cells; ++c) {
      w.put<int32_t>(S.positions[c]);
      w.put<uint32_t>(1);
      if (options.cell_ext) {
        if (S.cell_ext[c].size() != kCellExtBytes) throw Error("write_seq_state: a cell ext is not 12 bytes");
        w.bytes(S.cell_ext[c]);
      }
      w.put<int32_t>(S.seq_ids[c]);
    }
    w.put<uint32_t>(S.v_trans ? 1 : 0);
    w.put<uint32_t>(static_cast<uint32_t>(S.layers.size()));
    for (const SeqStateLayer& L : S.layers) {
      if (L.keys.size() != cells * L.k_row_bytes) throw Error("write_seq_state: keys are not cells × k_row_bytes");
      w.put<int32_t>(L.k_type);
      w.put<uint64_t>(L.k_row_bytes);
      w.bytes(L.keys);
    }
    for (const SeqStateLayer& L : S.layers) {
      w.put<int32_t>(L.v_type);
      if (!S.v_trans) {
        if (L.values.size() != cells * L.v_row_bytes) throw Error("write_seq_state: values are not cells × v_row_bytes");
        w.put<uint64_t>(L.v_row_bytes);
      } else {
        if (L.values.size() != cells * L.v_element_bytes * L.v_embd)
          throw Error("write_seq_state: transposed values are not n_embd_v × cells × element bytes");
        w.put<uint32_t>(L.v_element_bytes);
        w.put<uint32_t>(L.v_embd);
      }
      w.bytes(L.values);
    }
  }
  return out;
}

size_t seq_data_frame_bytes(const uint8_t* data, size_t size) {
  uint32_t magic = 0;
  if (data != nullptr && size >= kSeqDataFrameBytes) std::memcpy(&magic, data, 4);
  return magic == kSeqDataMagic ? kSeqDataFrameBytes : 0;
}

size_t seq_state_kv_bytes(const SeqState& state) {
  size_t n = 0;
  for (const auto& S : state.streams)
    for (const auto& L : S.layers) n += L.keys.size() + L.values.size();
  return n;
}

}  // namespace e8kv::llama_cpp
