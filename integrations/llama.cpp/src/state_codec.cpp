// llama.cpp sequence state <-> e8kv compressed state (llama_cpp/state_codec.hpp).
#include "e8kv/llama_cpp/state_codec.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <cstdio>
#include <cstring>
#include <limits>

#include "e8kv/detail/byte_io.hpp"
#include "e8kv/container/checksum.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"

namespace e8kv::llama_cpp {

namespace {

constexpr char kMagic[8] = {'E', '8', 'K', 'V', 'L', 'C', 'P', 'P'};
constexpr const char* kFormat = "e8kv compressed llama.cpp state";

bool readable_type(int32_t t) { return t == kGgmlF32 || t == kGgmlF16 || t == kGgmlBF16; }
size_t type_bytes(int32_t t) { return t == kGgmlF32 ? 4 : 2; }
DType dtype_of(int32_t t) { return t == kGgmlF32 ? DType::kF32 : t == kGgmlF16 ? DType::kF16 : DType::kBF16; }

// What the header records of one KV cache besides its container.
struct CacheHeader {
  uint32_t n_stream = 0, stream = 0;
  bool v_trans = false;
  int32_t seq_id = 0;
  uint32_t cells = 0;
  std::vector<int32_t> k_types, v_types;
  std::vector<uint32_t> order;  ///< cell i of the state is sorted row order[i]; empty: already sorted
};
// The whole header: version 1 holds one cache, version 2 (written only for several) a count first.
struct Header {
  std::vector<CacheHeader> caches;
  std::vector<uint8_t> prefix;
};
constexpr uint32_t kVersionOneCache = 1, kVersionCaches = 2;

// The one stream of a sequence state that holds cells, checked against the compressor's model.
const SeqStateStream& cells_stream(const SeqState& st, const ModelShape& shape, uint32_t* index) {
  const SeqStateStream* found = nullptr;
  for (size_t s = 0; s < st.streams.size(); ++s) {
    if (st.streams[s].cells() == 0) continue;
    if (found != nullptr)
      throw Error("llama.cpp state: cells in streams " + std::to_string(*index) + " and " + std::to_string(s) +
                  "; a sequence's state has them in one stream");
    found = &st.streams[s];
    *index = static_cast<uint32_t>(s);
  }
  if (found == nullptr) throw Error("llama.cpp state: no cells (an empty sequence has nothing to compress)");
  const SeqStateStream& S = *found;
  if (static_cast<int>(S.layers.size()) != shape.n_layers)
    throw Error("llama.cpp state: " + std::to_string(S.layers.size()) + " layers, the compressor's model has " +
                std::to_string(shape.n_layers));
  const uint64_t embd = static_cast<uint64_t>(shape.n_kv_heads) * static_cast<uint64_t>(shape.head_dim);
  for (size_t l = 0; l < S.layers.size(); ++l) {
    const SeqStateLayer& L = S.layers[l];
    for (int32_t t : {L.k_type, L.v_type})
      if (!readable_type(t))
        throw Error("llama.cpp state: layer " + std::to_string(l) + " stores " + ggml_type_name(t) +
                    " rows; e8kv reads f16, bf16 and f32 caches (llama.cpp -ctk/-ctv f16, bf16 or f32), not "
                    "quantized ones");
    const std::string where = "llama.cpp state: layer " + std::to_string(l) + " ";
    if (L.k_row_bytes != embd * type_bytes(L.k_type))
      throw Error(where + "key rows are " + std::to_string(L.k_row_bytes) + " bytes; the model's " +
                  std::to_string(shape.n_kv_heads) + " KV heads × " + std::to_string(shape.head_dim) + " in " +
                  ggml_type_name(L.k_type) + " are " + std::to_string(embd * type_bytes(L.k_type)));
    if (!S.v_trans && L.v_row_bytes != embd * type_bytes(L.v_type))
      throw Error(where + "value rows are " + std::to_string(L.v_row_bytes) + " bytes, expected " +
                  std::to_string(embd * type_bytes(L.v_type)));
    if (S.v_trans && (L.v_embd != embd || L.v_element_bytes != type_bytes(L.v_type)))
      throw Error(where + "transposed values have " + std::to_string(L.v_embd) + " channels of " +
                  std::to_string(L.v_element_bytes) + " bytes, expected " + std::to_string(embd) + " of " +
                  std::to_string(type_bytes(L.v_type)));
  }
  return S;
}

// Cells sorted by position (e8kv stores positions ascending); refuses repeated positions.
std::vector<uint32_t> sorted_order(const std::vector<int32_t>& pos, std::vector<int32_t>* sorted) {
  std::vector<uint32_t> rank(pos.size());
  std::iota(rank.begin(), rank.end(), 0u);
  std::stable_sort(rank.begin(), rank.end(), [&](uint32_t a, uint32_t b) { return pos[a] < pos[b]; });
  sorted->resize(pos.size());
  for (size_t i = 0; i < pos.size(); ++i) {
    (*sorted)[i] = pos[rank[i]];
    if ((*sorted)[i] < 0) throw Error("llama.cpp state: negative position " + std::to_string((*sorted)[i]));
    if (i > 0 && (*sorted)[i] == (*sorted)[i - 1])
      throw Error("llama.cpp state: two cells at position " + std::to_string((*sorted)[i]) +
                  "; e8kv stores one token per position");
  }
  bool identity = true;
  for (size_t i = 0; i < rank.size(); ++i) identity = identity && rank[i] == i;
  if (identity) return {};
  std::vector<uint32_t> order(pos.size());  // cell -> sorted row
  for (size_t i = 0; i < rank.size(); ++i) order[rank[i]] = static_cast<uint32_t>(i);
  return order;
}

// One layer's K and V as NHD rows in sorted order; views alias the state where no copy is needed.
struct LayerRows {
  std::vector<uint8_t> keys, values;  // copies (reordered or untransposed), when used
  LayerKV view;
};
LayerRows layer_rows(const SeqStateStream& S, size_t l, const std::vector<uint32_t>& order, const ModelShape& shape,
                     int64_t first_cell, int64_t n_cells) {
  const SeqStateLayer& L = S.layers[l];
  const int64_t n = n_cells, cells = static_cast<int64_t>(S.cells()), H = shape.n_kv_heads, d = shape.head_dim;
  LayerRows r;
  const size_t kb = type_bytes(L.k_type), vb = type_bytes(L.v_type);
  const size_t krow = static_cast<size_t>(H * d) * kb, vrow = static_cast<size_t>(H * d) * vb;
  // cell of sorted row i (i in [first_cell, first_cell + n))
  std::vector<int64_t> cell_of(static_cast<size_t>(cells));
  if (order.empty()) {
    std::iota(cell_of.begin(), cell_of.end(), int64_t{0});
  } else {
    for (int64_t c = 0; c < cells; ++c) cell_of[order[static_cast<size_t>(c)]] = c;
  }
  const bool k_alias = order.empty();
  if (k_alias) {
    r.view.keys = TensorView::nhd(L.keys.data() + static_cast<size_t>(first_cell) * krow, dtype_of(L.k_type), n, H, d);
  } else {
    r.keys.resize(static_cast<size_t>(n) * krow);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(r.keys.data() + static_cast<size_t>(i) * krow,
                  L.keys.data() + static_cast<size_t>(cell_of[static_cast<size_t>(first_cell + i)]) * krow, krow);
    r.view.keys = TensorView::nhd(r.keys.data(), dtype_of(L.k_type), n, H, d);
  }
  if (!S.v_trans && order.empty()) {
    r.view.values =
        TensorView::nhd(L.values.data() + static_cast<size_t>(first_cell) * vrow, dtype_of(L.v_type), n, H, d);
  } else {
    r.values.resize(static_cast<size_t>(n) * vrow);
    const int64_t embd = H * d;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = cell_of[static_cast<size_t>(first_cell + i)];
      uint8_t* dst = r.values.data() + static_cast<size_t>(i) * vrow;
      if (!S.v_trans) {
        std::memcpy(dst, L.values.data() + static_cast<size_t>(c) * vrow, vrow);
      } else {
        for (int64_t j = 0; j < embd; ++j)
          std::memcpy(dst + static_cast<size_t>(j) * vb, L.values.data() + static_cast<size_t>(j * cells + c) * vb, vb);
      }
    }
    r.view.values = TensorView::nhd(r.values.data(), dtype_of(L.v_type), n, H, d);
  }
  return r;
}

void write_cache_header(detail::ByteWriter& w, const CacheHeader& h) {
  w.put<uint32_t>(h.n_stream);
  w.put<uint32_t>(h.stream);
  w.put<uint32_t>(h.v_trans ? 1 : 0);
  w.put<int32_t>(h.seq_id);
  w.put<uint32_t>(h.cells);
  w.put<uint32_t>(static_cast<uint32_t>(h.k_types.size()));
  for (size_t l = 0; l < h.k_types.size(); ++l) {
    w.put<int32_t>(h.k_types[l]);
    w.put<int32_t>(h.v_types[l]);
  }
  w.put<uint32_t>(h.order.empty() ? 0 : 1);
  for (uint32_t o : h.order) w.put<uint32_t>(o);
}

std::vector<uint8_t> write_packed(const Header& h, const std::vector<std::vector<uint8_t>>& containers) {
  std::vector<uint8_t> out;
  detail::ByteWriter w(out);
  w.bytes(reinterpret_cast<const uint8_t*>(kMagic), sizeof(kMagic));
  const bool one = h.caches.size() == 1;
  w.put<uint32_t>(one ? kVersionOneCache : kVersionCaches);
  if (!one) w.put<uint32_t>(static_cast<uint32_t>(h.caches.size()));
  for (const CacheHeader& c : h.caches) write_cache_header(w, c);
  w.put<uint64_t>(h.prefix.size());
  w.bytes(h.prefix);
  for (const auto& c : containers) w.put<uint64_t>(c.size());
  w.put<uint32_t>(container::crc32c(out.data(), out.size()));
  for (const auto& c : containers) w.bytes(c);
  return out;
}

CacheHeader read_cache_header(detail::ByteReader& r) {
  CacheHeader h;
  h.n_stream = r.get<uint32_t>("n_stream");
  h.stream = r.get<uint32_t>("stream");
  if (h.n_stream == 0 || h.n_stream > 256 || h.stream >= h.n_stream)
    r.fail("stream " + std::to_string(h.stream) + " of " + std::to_string(h.n_stream));
  const uint32_t v_trans = r.get<uint32_t>("v_trans");
  if (v_trans > 1) r.fail("v_trans is " + std::to_string(v_trans));
  h.v_trans = v_trans == 1;
  h.seq_id = r.get<int32_t>("seq_id");
  h.cells = r.get<uint32_t>("cells");
  const uint32_t n_layer = r.get<uint32_t>("n_layer");
  if (n_layer == 0 || n_layer > 4096) r.fail("n_layer is " + std::to_string(n_layer));
  h.k_types.resize(n_layer);
  h.v_types.resize(n_layer);
  for (uint32_t l = 0; l < n_layer; ++l) {
    h.k_types[l] = r.get<int32_t>("k_type");
    h.v_types[l] = r.get<int32_t>("v_type");
    if (!readable_type(h.k_types[l]) || !readable_type(h.v_types[l]))
      r.fail("layer " + std::to_string(l) + " types " + ggml_type_name(h.k_types[l]) + " / " +
             ggml_type_name(h.v_types[l]));
  }
  const uint32_t has_order = r.get<uint32_t>("order flag");
  if (has_order > 1) r.fail("order flag is " + std::to_string(has_order));
  if (has_order) {
    if (uint64_t{h.cells} * 4 > r.remaining()) r.fail("truncated: the cell order");
    h.order.resize(h.cells);
    std::vector<uint8_t> seen(h.cells, 0);
    for (uint32_t c = 0; c < h.cells; ++c) {
      h.order[c] = r.get<uint32_t>("order");
      if (h.order[c] >= h.cells || seen[h.order[c]]++) r.fail("the cell order is not a permutation");
    }
  }
  return h;
}

// Where one cache's container lies in the packed bytes.
struct ContainerSpan {
  size_t offset = 0, size = 0;
};

// Reads the header; `spans` receives each cache's container.
Header read_packed(const uint8_t* p, size_t size, std::vector<ContainerSpan>* spans) {
  if (p == nullptr && size != 0) throw Error("restore_seq_state: null data with size " + std::to_string(size));
  detail::ByteReader r(p, size, kFormat);
  std::vector<uint8_t> magic;
  r.bytes(magic, sizeof(kMagic), "magic");
  if (!std::equal(magic.begin(), magic.end(), kMagic)) r.fail("not a compressed llama.cpp state (wrong magic)");
  const uint32_t version = r.get<uint32_t>("version");
  if (version != kVersionOneCache && version != kVersionCaches)
    r.fail("format version " + std::to_string(version) + "; this build reads versions 1 and 2");
  uint32_t n_caches = 1;
  if (version == kVersionCaches) {
    n_caches = r.get<uint32_t>("cache count");
    if (n_caches != 2) r.fail("version 2 with " + std::to_string(n_caches) + " KV caches; accepted 2");
  }
  Header h;
  for (uint32_t c = 0; c < n_caches; ++c) h.caches.push_back(read_cache_header(r));
  const uint64_t prefix = r.get<uint64_t>("prefix bytes");
  r.bytes(h.prefix, prefix, "prefix");
  std::vector<uint64_t> sizes(n_caches);
  for (auto& s : sizes) s = r.get<uint64_t>("container bytes");
  const size_t header_end = r.offset();
  const uint32_t crc = r.get<uint32_t>("header CRC-32C");
  if (crc != container::crc32c(p, header_end)) r.fail("header CRC-32C mismatch (corrupt header)");
  uint64_t total = 0;
  for (uint64_t s : sizes) {
    if (s > r.remaining()) r.fail("a container of " + std::to_string(s) + " bytes; " + std::to_string(r.remaining()) + " follow");
    total += s;
  }
  if (total != r.remaining())
    r.fail("the containers are " + std::to_string(total) + " bytes, " + std::to_string(r.remaining()) + " follow");
  spans->clear();
  size_t at = r.offset();
  for (uint64_t s : sizes) {
    spans->push_back(ContainerSpan{at, static_cast<size_t>(s)});
    at += static_cast<size_t>(s);
  }
  return h;
}

// Rounds decoded floats to a ggml row type.
void store_elements(const float* x, size_t n, int32_t type, uint8_t* out) {
  if (type == kGgmlF32) {
    std::memcpy(out, x, n * 4);
    return;
  }
  if (type == kGgmlF16) {  // the batch form vectorizes (a restore spends most of its time here otherwise)
    uint16_t bits[256];
    for (size_t i = 0; i < n; i += 256) {
      const size_t m = std::min<size_t>(256, n - i);
      floats_to_fp16_bits(x + i, bits, m);
      std::memcpy(out + 2 * i, bits, 2 * m);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const uint16_t b = float_to_bf16_bits(x[i]);
    std::memcpy(out + 2 * i, &b, 2);
  }
}

CacheHeader cache_header_of(const SeqState& st, const SeqStateStream& S, uint32_t stream,
                            const std::vector<uint32_t>& order) {
  CacheHeader h;
  h.n_stream = static_cast<uint32_t>(st.streams.size());
  h.stream = stream;
  h.v_trans = S.v_trans;
  h.seq_id = S.seq_ids[0];
  for (int32_t id : S.seq_ids)
    if (id != h.seq_id) throw Error("llama.cpp state: cells of sequences " + std::to_string(h.seq_id) + " and " +
                                    std::to_string(id) + "; a sequence's state holds one");
  h.cells = static_cast<uint32_t>(S.cells());
  for (const auto& L : S.layers) {
    h.k_types.push_back(L.k_type);
    h.v_types.push_back(L.v_type);
  }
  h.order = order;
  return h;
}

SequenceKV sequence_of(const SeqStateStream& S, const std::vector<int32_t>& sorted, const std::vector<uint32_t>& order,
                       const ModelShape& shape, int64_t first, int64_t n, std::vector<LayerRows>* rows) {
  SequenceKV seq;
  rows->clear();
  for (size_t l = 0; l < S.layers.size(); ++l) rows->push_back(layer_rows(S, l, order, shape, first, n));
  for (auto& r : *rows) seq.layers.push_back(r.view);
  seq.positions = sorted.data() + first;
  return seq;
}

// The compressors and queries given for a state's caches, checked against each other.
void check_caches(const std::vector<const KVCompressor*>& caches, const StateCompressOptions& options,
                  const char* who) {
  if (caches.empty() || caches.size() > 2)
    throw Error(std::string(who) + ": " + std::to_string(caches.size()) +
                " compressors; give one per KV cache of the model (1, or 2 for interleaved sliding-window attention)");
  for (const KVCompressor* c : caches)
    if (c == nullptr) throw Error(std::string(who) + ": a null compressor");
  if (!options.queries.empty() && options.queries.size() != caches.size())
    throw Error(std::string(who) + ": " + std::to_string(options.queries.size()) + " query sets for " +
                std::to_string(caches.size()) + " KV caches (one per cache, or none)");
}

const std::vector<LayerQueries>* queries_of(const StateCompressOptions& options, size_t cache) {
  return options.queries.empty() ? nullptr : options.queries[cache];
}

// The latest position any layer of one cache stores, -1 when none.
int64_t last_stored_position(const CompressedKV& cache) {
  int64_t last = -1;
  for (int l = 0; l < cache.n_layers(); ++l) last = std::max(last, cache.last_position(l));
  return last;
}

std::string cache_name(size_t c, size_t n) {
  if (n == 1) return "the KV cache";
  return c == 0 ? "KV cache 0 (full attention)" : "KV cache 1 (sliding window)";
}

}  // namespace

std::vector<uint8_t> compress_seq_state(const uint8_t* state, size_t size, const std::vector<const KVCompressor*>& caches,
                                        const StateCompressOptions& options) {
  check_caches(caches, options, "compress_seq_state");
  // llama_state_seq_get_data's frame (magic, sequence id) comes back verbatim, like a slot file's head.
  const size_t frame = seq_data_frame_bytes(state, size);
  Header h;
  h.prefix = options.prefix;
  h.prefix.insert(h.prefix.end(), state, state + frame);
  const std::vector<SeqState> states = parse_seq_caches(state + frame, size - frame, caches.size());
  std::vector<std::vector<uint8_t>> containers;
  for (size_t c = 0; c < caches.size(); ++c) {
    const ModelShape& shape = caches[c]->shape();
    uint32_t stream = 0;
    const SeqStateStream& S = cells_stream(states[c], shape, &stream);
    std::vector<int32_t> sorted;
    const std::vector<uint32_t> order = sorted_order(S.positions, &sorted);
    h.caches.push_back(cache_header_of(states[c], S, stream, order));
    std::vector<LayerRows> rows;
    const SequenceKV seq = sequence_of(S, sorted, order, shape, 0, static_cast<int64_t>(S.cells()), &rows);
    const CompressedKV cache = caches[c]->compress(seq, queries_of(options, c), options.executor);
    containers.push_back(container::serialize(cache, options.container));
  }
  return write_packed(h, containers);
}

std::vector<uint8_t> compress_seq_state(const uint8_t* state, size_t size, const KVCompressor& compressor,
                                        const StateCompressOptions& options) {
  return compress_seq_state(state, size, std::vector<const KVCompressor*>{&compressor}, options);
}

std::vector<uint8_t> extend_compressed_state(const uint8_t* packed, size_t packed_size, const uint8_t* state,
                                             size_t size, const std::vector<const KVCompressor*>& caches,
                                             const StateCompressOptions& options) {
  check_caches(caches, options, "extend_compressed_state");
  std::vector<ContainerSpan> spans;
  Header h = read_packed(packed, packed_size, &spans);
  if (h.caches.size() != caches.size())
    throw Error("extend_compressed_state: the compressed state holds " + std::to_string(h.caches.size()) +
                " KV caches, " + std::to_string(caches.size()) + " compressors were given");
  const size_t frame = seq_data_frame_bytes(state, size);
  const std::vector<SeqState> states = parse_seq_caches(state + frame, size - frame, caches.size());
  std::vector<std::vector<uint8_t>> containers;
  for (size_t c = 0; c < caches.size(); ++c) {
    const std::string name = "extend_compressed_state: " + cache_name(c, caches.size());
    CacheHeader& ch = h.caches[c];
    container::DeserializeOptions dopt;
    CompressedKV cache = container::deserialize(packed + spans[c].offset, spans[c].size, dopt);
    const ModelShape& shape = caches[c]->shape();
    uint32_t stream = 0;
    const SeqStateStream& S = cells_stream(states[c], shape, &stream);
    if (states[c].streams.size() != ch.n_stream || stream != ch.stream || S.v_trans != ch.v_trans)
      throw Error(name + ": the later state's streams or V layout differ from the compressed one's");
    for (size_t l = 0; l < S.layers.size(); ++l)
      if (S.layers[l].k_type != ch.k_types[l] || S.layers[l].v_type != ch.v_types[l])
        throw Error(name + ": layer " + std::to_string(l) + " types differ from the compressed state's");
    if (S.seq_ids[0] != ch.seq_id)
      throw Error(name + ": the later state is sequence " + std::to_string(S.seq_ids[0]) + ", the compressed one " +
                  std::to_string(ch.seq_id));
    std::vector<int32_t> sorted;
    const std::vector<uint32_t> order = sorted_order(S.positions, &sorted);
    // Cells at or before the stored ones are the conversation so far: kept as they were coded.
    // A restored state may hold no cell the later state no longer has. Stored tokens below the
    // later state's first cell left a sliding window (llama.cpp dropped their cells): dropped from
    // the cache too. Any other stored token missing from the later state means the sequence was
    // edited (llama_memory_seq_rm): refused.
    const int32_t first_cell = sorted.empty() ? std::numeric_limits<int32_t>::max() : sorted.front();
    const std::vector<int32_t> stored = cache.stored_positions(0);
    for (int32_t p : stored)
      if (p >= first_cell && !std::binary_search(sorted.begin(), sorted.end(), p))
        throw Error(name + ": position " + std::to_string(p) +
                    " is stored but no longer a cell of the later state (the sequence was edited: cells were "
                    "removed after its first one); compress the later state anew");
    if (!stored.empty() && stored.front() < first_cell) caches[c]->drop_before(cache, first_cell);
    const int64_t last = last_stored_position(cache);
    const int64_t first = std::upper_bound(sorted.begin(), sorted.end(), last) - sorted.begin();
    const int64_t n = static_cast<int64_t>(sorted.size()) - first;
    if (n > 0) {
      std::vector<LayerRows> rows;
      const SequenceKV chunk = sequence_of(S, sorted, order, shape, first, n, &rows);
      caches[c]->extend(cache, chunk, queries_of(options, c), options.executor);
    }
    // The restored state lists the cells sorted: the earlier cells' order is not known any more.
    ch.cells = static_cast<uint32_t>(cache.original_tokens());
    ch.order.clear();
    containers.push_back(container::serialize(cache, options.container));
  }
  return write_packed(h, containers);
}

std::vector<uint8_t> extend_compressed_state(const uint8_t* packed, size_t packed_size, const uint8_t* state,
                                             size_t size, const KVCompressor& compressor,
                                             const StateCompressOptions& options) {
  return extend_compressed_state(packed, packed_size, state, size, std::vector<const KVCompressor*>{&compressor},
                                 options);
}

namespace {

SeqState restore_cache(const CacheHeader& h, const CompressedKV& cache, const std::string& name, Executor* executor) {
  if (cache.n_layers() != static_cast<int>(h.k_types.size()))
    throw Error("restore_seq_state: " + name + ": the container has " + std::to_string(cache.n_layers()) +
                " layers, the header " + std::to_string(h.k_types.size()));
  SeqState st;
  st.streams.resize(h.n_stream);
  SeqStateStream& S = st.streams[h.stream];
  S.v_trans = h.v_trans;
  const std::vector<int32_t> positions = cache.stored_positions(0);
  const size_t n = positions.size();
  // Cell i of the output is sorted row row_of[i]: the original order when nothing was evicted.
  std::vector<uint32_t> row_of(n);
  std::iota(row_of.begin(), row_of.end(), 0u);
  if (!h.order.empty() && n == h.order.size()) row_of = h.order;
  S.positions.resize(n);
  for (size_t i = 0; i < n; ++i) S.positions[i] = positions[row_of[i]];
  S.seq_ids.assign(n, h.seq_id);
  const size_t H = static_cast<size_t>(cache.layout().n_kv_heads), d = static_cast<size_t>(cache.layout().head_dim);
  const size_t embd = H * d;
  S.layers.resize(h.k_types.size());
  // Layers are independent: each task decodes one into its own S.layers[l].
  run_tasks(executor, static_cast<int64_t>(S.layers.size()), [&](int64_t task) {
    const size_t l = static_cast<size_t>(task);
    const DenseLayer dl = cache.decompress_layer(static_cast<int>(l));
    if (dl.positions != positions)
      throw Error("restore_seq_state: " + name + ": layer " + std::to_string(l) +
                  " keeps other tokens than layer 0; llama.cpp's cells are shared by every layer (compress with "
                  "an eviction that keeps one set for all layers: Config::shared_selection)");
    for (float m : dl.mask)
      if (m != 0.f)
        throw Error("restore_seq_state: " + name + ": layer " + std::to_string(l) +
                    " has KV heads that keep different tokens (per-head selection); llama.cpp's cells hold every head");
    SeqStateLayer& L = S.layers[l];
    L.k_type = h.k_types[l];
    L.v_type = h.v_types[l];
    const size_t kb = type_bytes(L.k_type), vb = type_bytes(L.v_type);
    L.k_row_bytes = embd * kb;
    L.keys.resize(n * L.k_row_bytes);
    for (size_t i = 0; i < n; ++i)
      store_elements(dl.keys.data() + row_of[i] * embd, embd, L.k_type, L.keys.data() + i * L.k_row_bytes);
    if (!h.v_trans) {
      L.v_row_bytes = embd * vb;
      L.values.resize(n * L.v_row_bytes);
      for (size_t i = 0; i < n; ++i)
        store_elements(dl.values.data() + row_of[i] * embd, embd, L.v_type, L.values.data() + i * L.v_row_bytes);
    } else {
      L.v_element_bytes = static_cast<uint32_t>(vb);
      L.v_embd = static_cast<uint32_t>(embd);
      L.values.resize(n * embd * vb);
      for (size_t i = 0; i < n; ++i)
        for (size_t j = 0; j < embd; ++j)
          store_elements(&dl.values[row_of[i] * embd + j], 1, L.v_type, L.values.data() + (j * n + i) * vb);
    }
  });
  return st;
}

}  // namespace

std::vector<uint8_t> restore_seq_state(const uint8_t* packed, size_t size, const container::DeserializeOptions& options,
                                       Executor* executor) {
  std::vector<ContainerSpan> spans;
  const Header h = read_packed(packed, size, &spans);
  std::vector<SeqState> states;
  for (size_t c = 0; c < h.caches.size(); ++c) {
    const CompressedKV cache = container::deserialize(packed + spans[c].offset, spans[c].size, options);
    states.push_back(restore_cache(h.caches[c], cache, cache_name(c, h.caches.size()), executor));
  }
  std::vector<uint8_t> out = h.prefix;
  const std::vector<uint8_t> body = write_seq_caches(states);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

CompressedStateInfo read_compressed_state_info(const uint8_t* packed, size_t size) {
  std::vector<ContainerSpan> spans;
  const Header h = read_packed(packed, size, &spans);
  CompressedStateInfo info;
  info.prefix_bytes = h.prefix.size();
  for (size_t c = 0; c < h.caches.size(); ++c) {
    const CacheHeader& ch = h.caches[c];
    CompressedCacheInfo ci;
    ci.n_stream = ch.n_stream;
    ci.stream = ch.stream;
    ci.v_trans = ch.v_trans;
    ci.seq_id = ch.seq_id;
    ci.cells = ch.cells;
    ci.k_types = ch.k_types;
    ci.v_types = ch.v_types;
    ci.container_bytes = spans[c].size;
    ci.container = container::read_info(packed + spans[c].offset, spans[c].size);
    info.container_bytes += spans[c].size;
    info.caches.push_back(std::move(ci));
  }
  return info;
}

size_t seq_file_state_offset(const uint8_t* file, size_t size) {
  detail::ByteReader r(file, size, "llama.cpp sequence file");
  const uint32_t magic = r.get<uint32_t>("magic");
  const uint32_t version = r.get<uint32_t>("version");
  if (magic != kSeqFileMagic) r.fail("magic is 0x" + [&] {
    char b[16];
    std::snprintf(b, sizeof(b), "%08x", magic);
    return std::string(b);
  }() + ", a sequence/slot file has 0x67677371 ('ggsq')");
  if (version != kSeqFileVersion)
    r.fail("version " + std::to_string(version) + "; this build reads llama.cpp's sequence file version " +
           std::to_string(kSeqFileVersion));
  const uint32_t n_tokens = r.get<uint32_t>("token count");
  r.skip(r.product(n_tokens, 4, "tokens"), "tokens");
  return r.offset();
}

std::vector<uint8_t> compress_slot_file(const uint8_t* file, size_t size,
                                        const std::vector<const KVCompressor*>& caches,
                                        const StateCompressOptions& options) {
  const size_t off = seq_file_state_offset(file, size);
  StateCompressOptions o = options;
  o.prefix.assign(file, file + off);
  return compress_seq_state(file + off, size - off, caches, o);
}

std::vector<uint8_t> compress_slot_file(const uint8_t* file, size_t size, const KVCompressor& compressor,
                                        const StateCompressOptions& options) {
  return compress_slot_file(file, size, std::vector<const KVCompressor*>{&compressor}, options);
}

}  // namespace e8kv::llama_cpp
