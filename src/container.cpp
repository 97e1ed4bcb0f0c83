// The offload / transfer container (docs/format.md is the spec): serialization of CompressedKV
// and of plain fp16/bf16 tensors into versioned, chunked, checksummed byte strings, with zstd.
#include "e8kv/entropy/container.hpp"

#include <zstd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <utility>

#include "e8kv/entropy/checksum.hpp"
#include "e8kv/error.hpp"
#include "e8kv/version.hpp"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "e8kv containers are written with memcpy of host integers: a little-endian host is required"
#endif

namespace e8kv::entropy {

namespace {

// ---- format constants (docs/format.md) -----------------------------------------------------------

constexpr size_t kPrefixBytes = 48;       // magic .. n_chunks, common to both kinds
constexpr size_t kLayoutFixedBytes = 128;  // CacheLayout without the per-layer codecs
constexpr size_t kPlainFixedBytes = 40;
constexpr size_t kDirectoryEntryBytes = 16;
constexpr size_t kChunkHeaderBytes = 40;
constexpr size_t kStreamDescriptorBytes = 24;
constexpr uint8_t kChunkMagic[4] = {'C', 'H', 'N', 'K'};
constexpr int kCacheStreams = 7;  // StreamKind 1..7 in order
constexpr uint8_t kEntropyStored = 0;
constexpr uint8_t kEntropyZstd = 1;

// Bounds on header fields (far above real models; they keep a hostile header from asking for
// absurd work before max_decoded_bytes is even computed).
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxKvHeads = 4096;
constexpr int64_t kMaxQHeads = 65536;
constexpr int64_t kMaxChunkTokens = int64_t{1} << 20;
constexpr int64_t kMaxSetTokens = std::numeric_limits<int32_t>::max();  // positions are int32
constexpr int64_t kMaxPlainExtent = int64_t{1} << 40;

std::string num(uint64_t v) { return std::to_string(v); }
std::string snum(int64_t v) { return std::to_string(v); }

[[noreturn]] void fail(const std::string& what) { throw Error("container: " + what); }
void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

// Saturating arithmetic for sizes computed from untrusted counts.
uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
uint64_t sat_mul(uint64_t a, uint64_t b) { return (a != 0 && b > UINT64_MAX / a) ? UINT64_MAX : a * b; }

// ---- little-endian byte writer / bounds-checked reader ------------------------------------------

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& buf) : buf_(buf) {}
  template <class T>
  void put(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    buf_.insert(buf_.end(), b, b + sizeof(T));
  }
  void u8(uint8_t v) { put(v); }
  void u16(uint16_t v) { put(v); }
  void u32(uint32_t v) { put(v); }
  void i32(int32_t v) { put(v); }
  void u64(uint64_t v) { put(v); }
  void i64(int64_t v) { put(v); }
  void f32(float v) { put(v); }
  void f64(double v) { put(v); }
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  size_t size() const { return buf_.size(); }

 private:
  std::vector<uint8_t>& buf_;
};

template <class T>
void store_at(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, std::string what) : p_(data), n_(size), what_(std::move(what)) {}
  template <class T>
  T get(const char* field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, p_ + off_, sizeof(T));
    off_ += sizeof(T);
    return v;
  }
  uint8_t u8(const char* f) { return get<uint8_t>(f); }
  uint16_t u16(const char* f) { return get<uint16_t>(f); }
  uint32_t u32(const char* f) { return get<uint32_t>(f); }
  int32_t i32(const char* f) { return get<int32_t>(f); }
  uint64_t u64(const char* f) { return get<uint64_t>(f); }
  int64_t i64(const char* f) { return get<int64_t>(f); }
  float f32(const char* f) { return get<float>(f); }
  double f64(const char* f) { return get<double>(f); }
  size_t offset() const { return off_; }
  size_t remaining() const { return n_ - off_; }
  void need(size_t k, const char* field) const {
    if (k > n_ - off_)
      fail(what_ + " is truncated: field '" + field + "' needs " + num(k) + " bytes at offset " + num(off_) +
           ", only " + num(n_ - off_) + " left");
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
  std::string what_;
};

// ---- transforms -------------------------------------------------------------------------------

// A transform is an optional delta along rows (per segment, per column) followed by optional
// byte planes. Each step is a simple loop the compiler vectorizes; both steps together use one
// temporary buffer.

// XOR of W-byte little-endian integers is bytewise XOR, so the XOR delta works on bytes.
void xor_delta_forward(const StreamShape& s, const uint8_t* in, uint8_t* out) {
  const size_t row = static_cast<size_t>(s.cols) * static_cast<size_t>(s.width);
  size_t at = 0;
  for (int64_t rows : s.segment_rows) {
    const size_t n = static_cast<size_t>(rows) * row;
    if (n == 0) continue;
    std::memcpy(out + at, in + at, row);
    for (size_t i = at + row; i < at + n; ++i) out[i] = in[i] ^ in[i - row];
    at += n;
  }
}
void xor_delta_inverse(const StreamShape& s, const uint8_t* in, uint8_t* out) {
  const size_t row = static_cast<size_t>(s.cols) * static_cast<size_t>(s.width);
  size_t at = 0;
  for (int64_t rows : s.segment_rows) {
    const size_t n = static_cast<size_t>(rows) * row;
    if (n == 0) continue;
    std::memcpy(out + at, in + at, row);
    for (size_t r = at + row; r < at + n; r += row) {
      const uint8_t* prev = out + r - row;
      for (size_t i = 0; i < row; ++i) out[r + i] = in[r + i] ^ prev[i];
    }
    at += n;
  }
}

// Element-wise subtraction / addition modulo 2^(8W) on W-byte little-endian integers.
template <class U>
void sub_delta_typed(bool forward, const StreamShape& s, const uint8_t* in, uint8_t* out) {
  const size_t cols = static_cast<size_t>(s.cols);
  size_t at = 0;  // elements
  for (int64_t rows : s.segment_rows) {
    const size_t n = static_cast<size_t>(rows) * cols;
    if (n == 0) continue;
    std::memcpy(out + at * sizeof(U), in + at * sizeof(U), cols * sizeof(U));
    for (size_t r = at + cols; r < at + n; r += cols) {
      // forward: out = in[r] - in[r-1]; inverse: out = in[r] + out[r-1]
      const uint8_t* prev = forward ? in + (r - cols) * sizeof(U) : out + (r - cols) * sizeof(U);
      for (size_t c = 0; c < cols; ++c) {
        U x, p;
        std::memcpy(&x, in + (r + c) * sizeof(U), sizeof(U));
        std::memcpy(&p, prev + c * sizeof(U), sizeof(U));
        const U y = forward ? static_cast<U>(x - p) : static_cast<U>(x + p);
        std::memcpy(out + (r + c) * sizeof(U), &y, sizeof(U));
      }
    }
    at += n;
  }
}
void sub_delta_generic(bool forward, const StreamShape& s, const uint8_t* in, uint8_t* out) {
  const size_t w = static_cast<size_t>(s.width);
  const uint64_t mask = w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1;
  const size_t cols = static_cast<size_t>(s.cols);
  size_t at = 0;
  for (int64_t rows : s.segment_rows) {
    const size_t n = static_cast<size_t>(rows) * cols;
    if (n == 0) continue;
    std::memcpy(out + at * w, in + at * w, cols * w);
    for (size_t k = at + cols; k < at + n; ++k) {
      uint64_t x = 0, p = 0;
      std::memcpy(&x, in + k * w, w);  // little-endian host
      std::memcpy(&p, (forward ? in : out) + (k - cols) * w, w);
      const uint64_t y = (forward ? x - p : x + p) & mask;
      std::memcpy(out + k * w, &y, w);
    }
    at += n;
  }
}
void sub_delta(bool forward, const StreamShape& s, const uint8_t* in, uint8_t* out) {
  switch (s.width) {
    case 1: sub_delta_typed<uint8_t>(forward, s, in, out); break;
    case 2: sub_delta_typed<uint16_t>(forward, s, in, out); break;
    case 4: sub_delta_typed<uint32_t>(forward, s, in, out); break;
    case 8: sub_delta_typed<uint64_t>(forward, s, in, out); break;
    default: sub_delta_generic(forward, s, in, out); break;
  }
}

// Byte planes: plane b holds byte b of every element.
template <int W>
void planes_typed(bool forward, const uint8_t* in, uint8_t* out, size_t n) {
  for (size_t k = 0; k < n; ++k)
    for (int b = 0; b < W; ++b) {
      if (forward) out[static_cast<size_t>(b) * n + k] = in[k * W + static_cast<size_t>(b)];
      else out[k * W + static_cast<size_t>(b)] = in[static_cast<size_t>(b) * n + k];
    }
}
void planes(bool forward, int width, const uint8_t* in, uint8_t* out, size_t n) {
  switch (width) {
    case 2: planes_typed<2>(forward, in, out, n); break;
    case 3: planes_typed<3>(forward, in, out, n); break;
    case 4: planes_typed<4>(forward, in, out, n); break;
    default:
      for (size_t k = 0; k < n; ++k)
        for (int b = 0; b < width; ++b) {
          if (forward) out[static_cast<size_t>(b) * n + k] = in[k * static_cast<size_t>(width) + static_cast<size_t>(b)];
          else out[k * static_cast<size_t>(width) + static_cast<size_t>(b)] = in[static_cast<size_t>(b) * n + k];
        }
  }
}

void check_shape(const StreamShape& s, const char* where) {
  require(s.width >= 1 && s.width <= 8, std::string(where) + ": StreamShape.width must be in [1, 8], got " +
                                            std::to_string(s.width));
  require(s.cols >= 0, std::string(where) + ": StreamShape.cols must be >= 0");
  for (int64_t r : s.segment_rows) require(r >= 0, std::string(where) + ": StreamShape.segment_rows must be >= 0");
}

template <bool Forward>
void run_transform(Transform t, const StreamShape& s, const uint8_t* in, uint8_t* out) {
  const int id = static_cast<int>(t);
  require(id >= 0 && id < kTransformCount, "transform id " + std::to_string(id) + " is unknown (accepted 0..5)");
  check_shape(s, Forward ? "transform_forward" : "transform_inverse");
  const size_t bytes = s.bytes();
  if (bytes == 0) return;
  const int delta = id >> 1;  // 0 none, 1 xor, 2 subtraction
  const bool shuffle = (id & 1) != 0 && s.width > 1;
  const size_t n = bytes / static_cast<size_t>(s.width);
  auto run_delta = [&](const uint8_t* src, uint8_t* dst) {
    if (delta == 1) {
      if (Forward) xor_delta_forward(s, src, dst);
      else xor_delta_inverse(s, src, dst);
    } else {
      sub_delta(Forward, s, src, dst);
    }
  };
  if (delta == 0 && !shuffle) {
    std::memcpy(out, in, bytes);
  } else if (delta == 0) {
    planes(Forward, s.width, in, out, n);
  } else if (!shuffle) {
    run_delta(in, out);
  } else {
    std::vector<uint8_t> tmp(bytes);
    if (Forward) {
      run_delta(in, tmp.data());
      planes(true, s.width, tmp.data(), out, n);
    } else {
      planes(false, s.width, in, tmp.data(), n);
      run_delta(tmp.data(), out);
    }
  }
}

// ---- zstd -----------------------------------------------------------------------------------------

struct CctxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DctxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};

class Zstd {
 public:
  ZSTD_CCtx* cctx() {
    if (!c_) c_.reset(ZSTD_createCCtx());
    if (!c_) throw Error("container: zstd could not allocate a compression context");
    return c_.get();
  }
  ZSTD_DCtx* dctx() {
    if (!d_) d_.reset(ZSTD_createDCtx());
    if (!d_) throw Error("container: zstd could not allocate a decompression context");
    return d_.get();
  }

 private:
  std::unique_ptr<ZSTD_CCtx, CctxDeleter> c_;
  std::unique_ptr<ZSTD_DCtx, DctxDeleter> d_;
};

// ---- layout validation and codec geometry -------------------------------------------------------

struct CodecGeometry {
  size_t code_bytes = 0;  // per vector
  int width = 2;          // bytes per stream element
  int64_t cols = 0;       // elements per vector
  bool has_gain = false;
  int gain_width = 0;     // bytes per stored gain: 0 (fp16 codec), 2 (fp16 gains) or 1 (8-bit codes)
};

CodecGeometry geometry(quant::Codec c, int head_dim, int gain_bits) {
  CodecGeometry g;
  if (c == quant::Codec::kFp16) {
    g.width = 2;
    g.cols = head_dim;
    g.code_bytes = static_cast<size_t>(2 * head_dim);
    g.has_gain = false;
  } else {
    g.width = quant::index_bits(c) / 8;
    g.cols = head_dim / 8;
    g.code_bytes = static_cast<size_t>(g.width) * static_cast<size_t>(g.cols);
    g.has_gain = true;
    g.gain_width = gain_bits == 8 ? 1 : 2;
  }
  return g;
}

bool finite_d(double v) { return std::isfinite(v); }

// The checks shared by the writer (refuse to write what cannot be read) and the reader.
void validate_layout(const CacheLayout& L) {
  check(L.n_layers >= 0 && L.n_layers <= kMaxLayers,
        "layout n_layers " + snum(L.n_layers) + " is outside [0, " + snum(kMaxLayers) + "]");
  check(L.n_kv_heads >= 1 && L.n_kv_heads <= kMaxKvHeads,
        "layout n_kv_heads " + snum(L.n_kv_heads) + " is outside [1, " + snum(kMaxKvHeads) + "]");
  check(L.n_q_heads >= L.n_kv_heads && L.n_q_heads <= kMaxQHeads && L.n_q_heads % L.n_kv_heads == 0,
        "layout n_q_heads " + snum(L.n_q_heads) + " must be a multiple of n_kv_heads (" + snum(L.n_kv_heads) +
            ") and at most " + snum(kMaxQHeads));
  check(is_supported_head_dim(L.head_dim),
        "layout head_dim " + snum(L.head_dim) + " is not supported (accepted: " + supported_head_dims() + ")");
  check(static_cast<int64_t>(L.key_codec.size()) == L.n_layers && static_cast<int64_t>(L.value_codec.size()) == L.n_layers,
        "layout needs one key and one value codec per layer");
  for (size_t l = 0; l < L.key_codec.size(); ++l) {
    check(static_cast<int>(L.key_codec[l]) < quant::kCodecCount,
          "layout key codec id " + num(static_cast<int>(L.key_codec[l])) + " of layer " + num(l) +
              " is unknown (accepted 0.." + num(quant::kCodecCount - 1) + ")");
    check(static_cast<int>(L.value_codec[l]) < quant::kCodecCount,
          "layout value codec id " + num(static_cast<int>(L.value_codec[l])) + " of layer " + num(l) +
              " is unknown (accepted 0.." + num(quant::kCodecCount - 1) + ")");
  }
  auto gain_ok = [](quant::GainPolicy g) { return static_cast<int>(g) <= 2; };
  check(gain_ok(L.key_gain), "layout key_gain id " + num(static_cast<int>(L.key_gain)) + " is unknown (accepted 0..2)");
  check(gain_ok(L.value_gain),
        "layout value_gain id " + num(static_cast<int>(L.value_gain)) + " is unknown (accepted 0..2)");
  check(std::isfinite(L.key_scale) && L.key_scale > 0.f, "layout key_scale must be finite and > 0");
  check(std::isfinite(L.value_scale) && L.value_scale > 0.f, "layout value_scale must be finite and > 0");
  check(std::isfinite(L.softmax_scale), "layout softmax_scale must be finite (<= 0 means 1/sqrt(head_dim))");
  check(L.residual_length >= 0, "layout residual_length must be >= 0, got " + snum(L.residual_length));
  check(L.flush_block >= 1, "layout flush_block must be >= 1, got " + snum(L.flush_block));
  check(L.mean_tokens >= 1, "layout mean_tokens must be >= 1, got " + snum(L.mean_tokens));
  const auto& r = L.rope;
  check(static_cast<int>(r.layout) <= 1, "layout rope.layout id " + num(static_cast<int>(r.layout)) +
                                             " is unknown (accepted 0 split-half, 1 interleaved)");
  check(static_cast<int>(r.scaling) <= 4, "layout rope.scaling id " + num(static_cast<int>(r.scaling)) +
                                              " is unknown (accepted 0..4: none, linear, dynamic, llama3, yarn)");
  check(r.rotary_dim >= 0 && r.rotary_dim <= L.head_dim,
        "layout rope.rotary_dim " + snum(r.rotary_dim) + " is outside [0, head_dim]");
  check(r.head_dim >= 0 && r.head_dim <= 1024, "layout rope.head_dim " + snum(r.head_dim) + " is outside [0, 1024]");
  check(r.original_max_position >= 0, "layout rope.original_max_position must be >= 0");
  check(finite_d(r.theta) && finite_d(r.factor) && finite_d(r.low_freq_factor) && finite_d(r.high_freq_factor) &&
            finite_d(r.beta_fast) && finite_d(r.beta_slow) && finite_d(r.attention_factor),
        "layout rope parameters must be finite");
}

size_t position_sets(const CacheLayout& L) { return L.per_head_positions ? static_cast<size_t>(L.n_kv_heads) : 1; }

// Rows of one chunk for one position set, as stored-token indices (coded first, then window).
struct ChunkRows {
  int64_t lo = 0, hi = 0;        // unified range [lo, hi)
  int64_t coded_lo = 0, coded_hi = 0;    // coded indices
  int64_t window_lo = 0, window_hi = 0;  // window indices (0-based in the window)
  int64_t coded() const { return coded_hi - coded_lo; }
  int64_t window() const { return window_hi - window_lo; }
};

ChunkRows chunk_rows(int64_t chunk, int64_t chunk_tokens, int64_t coded, int64_t window) {
  const int64_t n = coded + window;
  ChunkRows r;
  r.lo = std::min(chunk * chunk_tokens, n);
  r.hi = std::min(r.lo + chunk_tokens, n);
  r.coded_lo = std::min(r.lo, coded);
  r.coded_hi = std::min(r.hi, coded);
  r.window_lo = std::max(r.lo, coded) - coded;
  r.window_hi = std::max(r.hi, coded) - coded;
  return r;
}

int64_t chunks_for(int64_t tokens, int64_t chunk_tokens) { return (tokens + chunk_tokens - 1) / chunk_tokens; }

// Layer table entry as the writer and the reader see it.
struct LayerCounts {
  int64_t original_tokens = 0;
  int64_t pinned = 0;                  // leading window tokens of every set kept in fp16
  std::vector<int64_t> coded, window;  // per set
  int64_t first_chunk = 0, n_chunks = 0;
  int64_t max_stored() const {
    int64_t m = 0;
    for (size_t s = 0; s < coded.size(); ++s) m = std::max(m, coded[s] + window[s]);
    return m;
  }
};

// Checks the positions of one set: >= 0 and strictly increasing in token order, which is the
// window's first `pinned` tokens (attention sinks), then the coded tokens, then the rest of the
// window.
void check_positions(const std::vector<int32_t>& coded, const std::vector<int32_t>& window, int64_t pinned, int layer,
                     size_t set) {
  const size_t np = static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(pinned, 0), static_cast<int64_t>(window.size())));
  int32_t prev = -1;
  auto run = [&](const int32_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i] <= prev)
        fail("positions of layer " + snum(layer) + ", set " + num(set) + " are not >= 0 and strictly increasing " +
             "(pinned window tokens, coded tokens, window tokens): " + snum(p[i]) + " after " + snum(prev));
      prev = p[i];
    }
  };
  run(window.data(), np);
  run(coded.data(), coded.size());
  run(window.data() + np, window.size() - np);
}

// Writer-side check that a layer's vectors agree with its counts (so gathering never overruns).
LayerCounts checked_counts(const CompressedKV& cache, int l, int64_t chunk_tokens) {
  const CacheLayout& L = cache.layout();
  const auto& ld = cache.layer(l);
  const size_t sets = position_sets(L);
  check(ld.positions.size() == sets && ld.window_positions.size() == sets &&
            ld.heads.size() == static_cast<size_t>(L.n_kv_heads),
        "layer " + snum(l) + " has " + num(ld.positions.size()) + " position sets and " + num(ld.heads.size()) +
            " heads; the layout needs " + num(sets) + " and " + snum(L.n_kv_heads));
  LayerCounts c;
  c.original_tokens = ld.original_tokens;
  c.pinned = ld.pinned;
  for (size_t s = 0; s < sets; ++s) {
    c.coded.push_back(static_cast<int64_t>(ld.positions[s].size()));
    c.window.push_back(static_cast<int64_t>(ld.window_positions[s].size()));
    check(c.coded[s] + c.window[s] <= kMaxSetTokens, "layer " + snum(l) + " stores too many tokens");
    check(c.pinned >= 0 && c.pinned <= c.window[s], "layer " + snum(l) + ": pinned " + snum(c.pinned) +
                                                        " is outside [0, window tokens of set " + num(s) + " = " +
                                                        snum(c.window[s]) + "]");
    check_positions(ld.positions[s], ld.window_positions[s], c.pinned, l, s);
  }
  check(c.original_tokens >= c.max_stored(), "layer " + snum(l) + ": original_tokens " + snum(c.original_tokens) +
                                                 " is below the stored token count " + snum(c.max_stored()));
  const CodecGeometry kg = geometry(L.key_codec[static_cast<size_t>(l)], L.head_dim, L.gain_bits);
  const CodecGeometry vg = geometry(L.value_codec[static_cast<size_t>(l)], L.head_dim, L.gain_bits);
  for (int h = 0; h < L.n_kv_heads; ++h) {
    const auto& hd = ld.heads[static_cast<size_t>(h)];
    const size_t s = sets == 1 ? 0 : static_cast<size_t>(h);
    const size_t nc = static_cast<size_t>(c.coded[s]), nw = static_cast<size_t>(c.window[s]);
    const size_t d = static_cast<size_t>(L.head_dim);
    const bool ok = hd.key_codes.size() == nc * kg.code_bytes && hd.value_codes.size() == nc * vg.code_bytes &&
                    hd.key_gains.size() == (kg.gain_width == 2 ? nc : 0) &&
                    hd.value_gains.size() == (vg.gain_width == 2 ? nc : 0) &&
                    hd.key_gain_codes.size() == (kg.gain_width == 1 ? nc : 0) &&
                    hd.value_gain_codes.size() == (vg.gain_width == 1 ? nc : 0) &&
                    hd.window_keys.size() == nw * d && hd.window_values.size() == nw * d;
    check(ok, "layer " + snum(l) + " head " + snum(h) +
                  ": code, gain or window sizes disagree with its position counts and codecs");
    check((hd.key_mean.empty() || hd.key_mean.size() == d) && (hd.value_mean.empty() || hd.value_mean.size() == d),
          "layer " + snum(l) + " head " + snum(h) + ": key_mean and value_mean must be empty or hold head_dim values");
    for (uint16_t ref : {hd.key_gain_ref, hd.value_gain_ref})
      check(ref == 0 || (L.gain_bits == 8 && std::isfinite(fp16_bits_to_float(ref)) && fp16_bits_to_float(ref) > 0.f),
            "layer " + snum(l) + " head " + snum(h) + ": gain references must be 0 or (gain_bits 8) positive and finite");
    check((kg.gain_width != 1 || nc == 0 || hd.key_gain_ref != 0) && (vg.gain_width != 1 || nc == 0 || hd.value_gain_ref != 0),
          "layer " + snum(l) + " head " + snum(h) + ": 8-bit gains need their reference");
    check(hd.key_channel_scale.empty() || (hd.key_channel_scale.size() == d && L.query_weighted_keys),
          "layer " + snum(l) + " head " + snum(h) + ": key_channel_scale must be empty or hold head_dim values "
          "(and needs layout.query_weighted_keys)");
  }
  check(ld.query_energy.empty() || (ld.query_energy.size() == static_cast<size_t>(L.n_kv_heads) && L.query_weighted_keys),
        "layer " + snum(l) + ": query_energy must be empty or hold one vector per KV head");
  for (const auto& e : ld.query_energy)
    check(e.size() == static_cast<size_t>(L.head_dim), "layer " + snum(l) + ": query_energy vectors must hold head_dim values");
  c.n_chunks = chunks_for(c.max_stored(), chunk_tokens);
  return c;
}

// ---- chunk encoding ---------------------------------------------------------------------------

struct StreamPlan {
  StreamKind kind;
  StreamShape shape;
};

class ChunkEncoder {
 public:
  explicit ChunkEncoder(const ContainerOptions& o) : o_(o) {
    level_ = o.zstd_level == 0 ? ZSTD_CLEVEL_DEFAULT : o.zstd_level;
  }

  // A zstd frame of z bytes for n raw bytes is kept when it saves at least min_zstd_saving.
  bool keep_zstd(size_t z, size_t n) const {
    return z < n && static_cast<double>(n - z) >= o_.min_zstd_saving * static_cast<double>(n);
  }

  // Appends one stream's descriptor (at desc) and data (at the end of out).
  void encode_stream(StreamKind kind, Transform chosen, const StreamShape& shape, const uint8_t* raw,
                     std::vector<uint8_t>& out, size_t desc) {
    const size_t n = shape.bytes();
    Transform best_t = chosen;
    uint8_t entropy = kEntropyStored;
    const size_t data_at = out.size();
    if (n > 0 && !o_.adaptive) {
      const uint8_t* src = raw;
      if (chosen != Transform::kNone) {
        trans_.resize(n);
        run_transform<true>(chosen, shape, raw, trans_.data());
        src = trans_.data();
      }
      const size_t bound = ZSTD_compressBound(n);
      out.resize(data_at + bound);
      const size_t z = ZSTD_compressCCtx(zstd_.cctx(), out.data() + data_at, bound, src, n, level_);
      if (ZSTD_isError(z)) fail(std::string("zstd compression failed: ") + ZSTD_getErrorName(z));
      if (keep_zstd(z, n)) {
        entropy = kEntropyZstd;
        out.resize(data_at + z);
      } else {
        std::memcpy(out.data() + data_at, src, n);
        out.resize(data_at + n);
      }
    } else if (n > 0) {
      size_t best = SIZE_MAX;
      trans_.resize(n);
      for (int t = 0; t < kTransformCount; ++t) {
        const auto tr = static_cast<Transform>(t);
        run_transform<true>(tr, shape, raw, trans_.data());
        const size_t bound = ZSTD_compressBound(n);
        cand_.resize(bound);
        const size_t z = ZSTD_compressCCtx(zstd_.cctx(), cand_.data(), bound, trans_.data(), n, level_);
        if (ZSTD_isError(z)) fail(std::string("zstd compression failed: ") + ZSTD_getErrorName(z));
        const size_t stored = keep_zstd(z, n) ? z : n;
        if (stored < best) {  // ties keep the lower id
          best = stored;
          best_t = tr;
          entropy = keep_zstd(z, n) ? kEntropyZstd : kEntropyStored;
          if (entropy == kEntropyZstd) best_.assign(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(z));
          else best_.assign(trans_.begin(), trans_.end());
        }
      }
      out.insert(out.end(), best_.begin(), best_.end());
    }
    uint8_t* d = out.data() + desc;
    d[0] = static_cast<uint8_t>(kind);
    d[1] = static_cast<uint8_t>(n > 0 ? best_t : Transform::kNone);
    d[2] = entropy;
    std::memset(d + 3, 0, 5);
    store_at<uint64_t>(d + 8, n);
    store_at<uint64_t>(d + 16, out.size() - data_at);
  }

 private:
  const ContainerOptions& o_;
  int level_;
  Zstd zstd_;
  std::vector<uint8_t> trans_, cand_, best_;
};

// Writes the chunk header + descriptors, calls fill(encoder, out, desc_offset(i)) per stream,
// then patches the payload size and the CRC.
template <class Fill>
void write_chunk(std::vector<uint8_t>& out, uint32_t dir_index, uint32_t layer, uint64_t first_token, int n_streams,
                 Fill&& fill) {
  const size_t start = out.size();
  out.resize(start + kChunkHeaderBytes + static_cast<size_t>(n_streams) * kStreamDescriptorBytes);
  uint8_t* h = out.data() + start;
  std::memcpy(h, kChunkMagic, 4);
  store_at<uint32_t>(h + 4, static_cast<uint32_t>(n_streams));
  store_at<uint32_t>(h + 8, dir_index);
  store_at<uint32_t>(h + 12, layer);
  store_at<uint64_t>(h + 16, first_token);
  fill(start + kChunkHeaderBytes);
  h = out.data() + start;
  const uint64_t payload = out.size() - start - kChunkHeaderBytes;
  store_at<uint64_t>(h + 24, payload);
  store_at<uint32_t>(h + 32, 0);
  const uint32_t crc = crc32c(h + kChunkHeaderBytes, payload, crc32c(h, 36));
  store_at<uint32_t>(h + 36, crc);
}

// Version 1 unless the cache uses query-weighted keys (version 2 fields).
// Version 3 adds the RoPE-residual key frame (value 2 of the key-frame byte); version 2 the
// query-weighting flag, channel scales and gain_bits. A cache is written at the lowest version
// that can hold it, so older readers still read what they can represent.
uint16_t format_version_for(const CacheLayout& L) {
  if (L.key_frame == transform::KeyFrame::kRopeResidual) return 3;
  return L.query_weighted_keys || L.gain_bits != 16 ? 2 : 1;
}

void write_prefix(ByteWriter& w, ContainerKind kind, uint64_t chunk_tokens, uint64_t n_chunks, uint16_t version = 1) {
  w.bytes(kMagic.data(), kMagic.size());
  w.u16(version);
  w.u16(static_cast<uint16_t>(kind));
  w.u32(0);  // flags
  w.u64(0);  // header_bytes, patched
  w.u64(0);  // total_bytes, patched
  w.u32(static_cast<uint32_t>(kVersion));
  w.u32(static_cast<uint32_t>(chunk_tokens));
  w.u64(n_chunks);
}

void write_layout(ByteWriter& w, const CacheLayout& L) {
  w.u32(static_cast<uint32_t>(L.n_layers));
  w.u32(static_cast<uint32_t>(L.n_kv_heads));
  w.u32(static_cast<uint32_t>(L.n_q_heads));
  w.u32(static_cast<uint32_t>(L.head_dim));
  w.u8(static_cast<uint8_t>(L.key_gain));
  w.u8(static_cast<uint8_t>(L.value_gain));
  w.u8(static_cast<uint8_t>(L.key_frame));  // 0 post, 1 pre; 2 residual (version 3)
  w.u8(L.per_head_positions ? 1 : 0);
  w.u8(L.center ? 1 : 0);
  w.u8(L.query_weighted_keys ? 1 : 0);  // version 2; reserved (0) in version 1
  w.u8(format_version_for(L) >= 2 ? static_cast<uint8_t>(L.gain_bits) : 0);  // version 2; reserved (0) in version 1
  w.u8(0);
  w.f32(L.key_scale);
  w.f32(L.value_scale);
  w.f32(L.softmax_scale);
  w.i32(L.residual_length);
  w.i32(L.flush_block);
  w.i32(L.mean_tokens);
  w.u64(L.rotation_seed);
  const auto& r = L.rope;
  w.u8(static_cast<uint8_t>(r.layout));
  w.u8(static_cast<uint8_t>(r.scaling));
  w.u16(0);
  w.i32(r.head_dim);
  w.i32(r.rotary_dim);
  w.i32(r.original_max_position);
  w.f64(r.theta);
  w.f64(r.factor);
  w.f64(r.low_freq_factor);
  w.f64(r.high_freq_factor);
  w.f64(r.beta_fast);
  w.f64(r.beta_slow);
  w.f64(r.attention_factor);
  for (int l = 0; l < L.n_layers; ++l) {
    w.u8(static_cast<uint8_t>(L.key_codec[static_cast<size_t>(l)]));
    w.u8(static_cast<uint8_t>(L.value_codec[static_cast<size_t>(l)]));
  }
}

// Layer table entry: counts, then the per-head centring means (u16 lengths, fp16 values).
void write_layer_entry(ByteWriter& w, const LayerCounts& c, const CompressedKV::LayerData& ld, uint16_t version) {
  w.i64(c.original_tokens);
  w.i64(c.pinned);
  w.u64(static_cast<uint64_t>(c.first_chunk));
  w.u64(static_cast<uint64_t>(c.n_chunks));
  for (size_t s = 0; s < c.coded.size(); ++s) {
    w.u64(static_cast<uint64_t>(c.coded[s]));
    w.u64(static_cast<uint64_t>(c.window[s]));
  }
  for (const auto& hd : ld.heads) {
    w.u16(static_cast<uint16_t>(hd.key_mean.size()));
    w.u16(static_cast<uint16_t>(hd.value_mean.size()));
    w.bytes(hd.key_mean.data(), 2 * hd.key_mean.size());
    w.bytes(hd.value_mean.data(), 2 * hd.value_mean.size());
  }
  if (version < 2) return;
  // Version 2: per head, the key channel scales (fp16) and the pending query energy (f32; kept
  // until the first flush turns it into scales).
  for (size_t h = 0; h < ld.heads.size(); ++h) {
    const auto& hd = ld.heads[h];
    w.u16(static_cast<uint16_t>(hd.key_channel_scale.size()));
    w.bytes(hd.key_channel_scale.data(), 2 * hd.key_channel_scale.size());
    const size_t ne = ld.query_energy.empty() ? 0 : ld.query_energy[h].size();
    w.u16(static_cast<uint16_t>(ne));
    for (size_t i = 0; i < ne; ++i) w.f32(ld.query_energy[h][i]);
    w.u16(hd.key_gain_ref);
    w.u16(hd.value_gain_ref);
  }
}

size_t layer_entry_bytes(const CompressedKV::LayerData& ld, size_t sets, uint16_t version) {
  size_t b = 32 + 16 * sets;
  for (const auto& hd : ld.heads) b += 4 + 2 * (hd.key_mean.size() + hd.value_mean.size());
  if (version >= 2)
    for (size_t h = 0; h < ld.heads.size(); ++h)
      b += 8 + 2 * ld.heads[h].key_channel_scale.size() + (ld.query_energy.empty() ? 0 : 4 * ld.query_energy[h].size());
  return b;
}

// Finishes a container: directory, header CRC and sizes. `out` holds the header (without
// directory and CRC) at [0, dir_at), then chunk bodies start at header_bytes.
void finish_container(std::vector<uint8_t>& out, size_t dir_at, size_t header_bytes,
                      const std::vector<uint64_t>& chunk_offsets) {
  const size_t n_chunks = chunk_offsets.size();
  for (size_t i = 0; i < n_chunks; ++i) {
    const uint64_t end = i + 1 < n_chunks ? chunk_offsets[i + 1] : out.size();
    store_at<uint64_t>(out.data() + dir_at + kDirectoryEntryBytes * i, chunk_offsets[i]);
    store_at<uint64_t>(out.data() + dir_at + kDirectoryEntryBytes * i + 8, end - chunk_offsets[i]);
  }
  store_at<uint64_t>(out.data() + 16, header_bytes);
  store_at<uint64_t>(out.data() + 24, out.size());
  store_at<uint32_t>(out.data() + header_bytes - 4, crc32c(out.data(), header_bytes - 4));
}

std::vector<uint8_t> encode_cache(const CompressedKV& cache, const ContainerOptions& o) {
  o.validate();
  require(cache.valid(), "serialize: the cache is empty (default-constructed)");
  const CacheLayout& L = cache.layout();
  validate_layout(L);
  const int64_t T = o.chunk_tokens;
  std::vector<LayerCounts> counts;
  int64_t n_chunks = 0;
  for (int l = 0; l < L.n_layers; ++l) {
    counts.push_back(checked_counts(cache, l, T));
    counts.back().first_chunk = n_chunks;
    n_chunks += counts.back().n_chunks;
  }
  check(n_chunks <= std::numeric_limits<uint32_t>::max(), "too many chunks; raise chunk_tokens");
  std::vector<uint8_t> out;
  ByteWriter w(out);
  const uint16_t version = format_version_for(L);
  write_prefix(w, ContainerKind::kCompressedCache, static_cast<uint64_t>(T), static_cast<uint64_t>(n_chunks), version);
  write_layout(w, L);
  for (int l = 0; l < L.n_layers; ++l) write_layer_entry(w, counts[static_cast<size_t>(l)], cache.layer(l), version);
  const size_t dir_at = out.size();
  const size_t header_bytes = dir_at + kDirectoryEntryBytes * static_cast<size_t>(n_chunks) + 4;
  out.resize(header_bytes);

  ChunkEncoder enc(o);
  std::vector<uint64_t> offsets;
  std::vector<uint8_t> raw;
  const size_t sets = position_sets(L);
  const int H = L.n_kv_heads;
  const size_t d = static_cast<size_t>(L.head_dim);
  for (int l = 0; l < L.n_layers; ++l) {
    const auto& ld = cache.layer(l);
    const auto& c = counts[static_cast<size_t>(l)];
    const CodecGeometry kg = geometry(L.key_codec[static_cast<size_t>(l)], L.head_dim, L.gain_bits);
    const CodecGeometry vg = geometry(L.value_codec[static_cast<size_t>(l)], L.head_dim, L.gain_bits);
    for (int64_t ci = 0; ci < c.n_chunks; ++ci) {
      std::vector<ChunkRows> rows(sets);
      for (size_t s = 0; s < sets; ++s) rows[s] = chunk_rows(ci, T, c.coded[s], c.window[s]);
      auto set_of = [&](int h) { return sets == 1 ? size_t{0} : static_cast<size_t>(h); };
      offsets.push_back(out.size());
      write_chunk(out, static_cast<uint32_t>(c.first_chunk + ci), static_cast<uint32_t>(l),
                  static_cast<uint64_t>(ci * T), kCacheStreams, [&](size_t desc0) {
        size_t desc = desc0;
        auto emit = [&](StreamKind kind, Transform t, StreamShape shape) {
          enc.encode_stream(kind, t, shape, raw.data(), out, desc);
          desc += kStreamDescriptorBytes;
        };
        // Positions: per set, coded then window.
        {
          StreamShape sh{{}, 1, 4};
          raw.clear();
          for (size_t s = 0; s < sets; ++s) {
            const auto& r = rows[s];
            sh.segment_rows.push_back(r.hi - r.lo);
            const auto* cp = ld.positions[s].data();
            const auto* wp = ld.window_positions[s].data();
            const auto* b = reinterpret_cast<const uint8_t*>(cp + r.coded_lo);
            raw.insert(raw.end(), b, b + 4 * static_cast<size_t>(r.coded()));
            b = reinterpret_cast<const uint8_t*>(wp + r.window_lo);
            raw.insert(raw.end(), b, b + 4 * static_cast<size_t>(r.window()));
          }
          emit(StreamKind::kPositions, o.transforms.positions, sh);
        }
        // Codes, gains, window: per head.
        auto per_head = [&](StreamKind kind, Transform t, int64_t cols, int width, bool coded_part, auto&& pick) {
          StreamShape sh{{}, cols, width};
          raw.clear();
          for (int h = 0; h < H; ++h) {
            const auto& r = rows[set_of(h)];
            const int64_t lo = coded_part ? r.coded_lo : r.window_lo;
            const int64_t n = coded_part ? r.coded() : r.window();
            const size_t row_bytes = static_cast<size_t>(cols) * static_cast<size_t>(width);
            sh.segment_rows.push_back(n);
            const uint8_t* src = pick(ld.heads[static_cast<size_t>(h)]);
            if (n > 0 && row_bytes > 0) raw.insert(raw.end(), src + static_cast<size_t>(lo) * row_bytes,
                                  src + static_cast<size_t>(lo + n) * row_bytes);
          }
          emit(kind, t, sh);
        };
        using HD = CompressedKV::HeadData;
        const auto& tf = o.transforms;
        const Transform key_codes = tf.key_codes ? *tf.key_codes
                                                 : (L.key_frame == transform::KeyFrame::kPostRope || !L.center ? Transform::kXorDelta : Transform::kNone);
        per_head(StreamKind::kKeyCodes, kg.has_gain ? key_codes : tf.fp16, kg.cols, kg.width, true,
                 [](const HD& hd) { return hd.key_codes.data(); });
        per_head(StreamKind::kValueCodes, vg.has_gain ? tf.value_codes : tf.fp16, vg.cols, vg.width, true,
                 [](const HD& hd) { return hd.value_codes.data(); });
        per_head(StreamKind::kKeyGains, kg.gain_width == 1 ? Transform::kNone : tf.gains, kg.has_gain ? 1 : 0,
                 kg.gain_width == 1 ? 1 : 2, true, [&](const HD& hd) {
                   return kg.gain_width == 1 ? hd.key_gain_codes.data() : reinterpret_cast<const uint8_t*>(hd.key_gains.data());
                 });
        per_head(StreamKind::kValueGains, vg.gain_width == 1 ? Transform::kNone : tf.gains, vg.has_gain ? 1 : 0,
                 vg.gain_width == 1 ? 1 : 2, true, [&](const HD& hd) {
                   return vg.gain_width == 1 ? hd.value_gain_codes.data()
                                             : reinterpret_cast<const uint8_t*>(hd.value_gains.data());
                 });
        per_head(StreamKind::kWindowKeys, tf.fp16, static_cast<int64_t>(d), 2, false,
                 [](const HD& hd) { return reinterpret_cast<const uint8_t*>(hd.window_keys.data()); });
        per_head(StreamKind::kWindowValues, tf.fp16, static_cast<int64_t>(d), 2, false,
                 [](const HD& hd) { return reinterpret_cast<const uint8_t*>(hd.window_values.data()); });
      });
    }
  }
  finish_container(out, dir_at, header_bytes, offsets);
  return out;
}

// ---- reading: sources ---------------------------------------------------------------------------

class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  /// Bytes [offset, offset + n); the caller has checked the range against size(). Valid until
  /// the next read.
  virtual const uint8_t* read(uint64_t offset, size_t n) = 0;
};

class SpanSource final : public Source {
 public:
  SpanSource(const uint8_t* data, size_t size) : data_(data), size_(size) {
    require(data != nullptr || size == 0, "deserialize: null data with a non-zero size");
  }
  uint64_t size() const override { return size_; }
  const uint8_t* read(uint64_t offset, size_t) override { return data_ + offset; }

 private:
  const uint8_t* data_;
  size_t size_;
};

class FileSource final : public Source {
 public:
  explicit FileSource(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw Error("container: cannot open '" + path + "' for reading");
    in_.seekg(0, std::ios::end);
    const auto end = in_.tellg();
    if (end < 0) throw Error("container: cannot determine the size of '" + path + "'");
    size_ = static_cast<uint64_t>(end);
  }
  uint64_t size() const override { return size_; }
  const uint8_t* read(uint64_t offset, size_t n) override {
    buf_.resize(n);
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(reinterpret_cast<char*>(buf_.data()), static_cast<std::streamsize>(n));
    if (!in_ || static_cast<size_t>(in_.gcount()) != n)
      throw Error("container: reading " + num(n) + " bytes at offset " + num(offset) + " of '" + path_ + "' failed");
    return buf_.data();
  }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
  std::vector<uint8_t> buf_;
};

// ---- reading: header ----------------------------------------------------------------------------

struct DirEntry {
  uint64_t offset = 0, bytes = 0;
};

struct Header {
  ContainerInfo info;
  std::vector<LayerCounts> layers;
  std::vector<std::vector<std::vector<uint16_t>>> key_mean, value_mean;  // [layer][head]
  std::vector<std::vector<std::vector<uint16_t>>> key_channel_scale;     // [layer][head] (version 2)
  std::vector<std::vector<std::vector<float>>> query_energy;             // [layer][head or none] (version 2)
  std::vector<std::vector<std::array<uint16_t, 2>>> gain_ref;             // [layer][head] key, value (version 2)
  std::vector<DirEntry> dir;
  uint64_t header_bytes = 0;
  uint64_t max_chunk_raw = 0;  // largest raw (decoded) chunk payload: scratch bound
};

uint64_t codecs_estimate(const CacheLayout& L) {
  // CacheCodecs: rotations (sign words + multipliers), quantizers, RoPE tables (4096 entries of
  // rotary pairs × cos, sin), plus slack for the objects themselves.
  const uint64_t d = static_cast<uint64_t>(L.head_dim);
  uint64_t b = sat_mul(sat_mul(static_cast<uint64_t>(L.n_layers), static_cast<uint64_t>(L.n_kv_heads)),
                       2 * (d * 4 + d / 8 + 128));
  b = sat_add(b, sat_mul(static_cast<uint64_t>(L.n_layers), 256));
  b = sat_add(b, 4096 * d * 4 + 65536);
  return b;
}

uint64_t layer_head_bytes(const CacheLayout& L, int l, int64_t coded, int64_t window) {
  const CodecGeometry kg = geometry(L.key_codec[static_cast<size_t>(l)], L.head_dim, L.gain_bits);
  const CodecGeometry vg = geometry(L.value_codec[static_cast<size_t>(l)], L.head_dim, L.gain_bits);
  const uint64_t per_coded = kg.code_bytes + vg.code_bytes + static_cast<uint64_t>(kg.gain_width + vg.gain_width);
  const uint64_t per_window = 4 * static_cast<uint64_t>(L.head_dim);
  return sat_add(sat_mul(static_cast<uint64_t>(coded), per_coded), sat_mul(static_cast<uint64_t>(window), per_window));
}

// Decoded bytes of stored tokens [begin, end) of every set of layer l (clamped per set).
uint64_t layer_range_bytes(const CacheLayout& L, int l, const LayerCounts& c, int64_t begin, int64_t end) {
  const size_t sets = c.coded.size();
  uint64_t b = sizeof(CompressedKV::LayerData) + sets * 2 * sizeof(std::vector<int32_t>) +
               static_cast<uint64_t>(L.n_kv_heads) * sizeof(CompressedKV::HeadData);
  for (int h = 0; h < L.n_kv_heads; ++h) {
    const size_t s = sets == 1 ? 0 : static_cast<size_t>(h);
    const int64_t n = c.coded[s] + c.window[s];
    const int64_t lo = std::min(begin, n), hi = std::min(end, n);
    const int64_t coded = std::max<int64_t>(0, std::min(hi, c.coded[s]) - lo);
    const int64_t window = (hi - lo) - coded;
    b = sat_add(b, layer_head_bytes(L, l, coded, window));
  }
  for (size_t s = 0; s < sets; ++s) {
    const int64_t n = c.coded[s] + c.window[s];
    b = sat_add(b, 4 * static_cast<uint64_t>(std::min(end, n) - std::min(begin, n)));
  }
  return b;
}

void read_layout(ByteReader& r, CacheLayout& L, uint16_t version) {
  const uint32_t n_layers = r.u32("n_layers");
  const uint32_t n_kv = r.u32("n_kv_heads");
  const uint32_t n_q = r.u32("n_q_heads");
  const uint32_t d = r.u32("head_dim");
  check(n_layers <= kMaxLayers, "layout n_layers " + num(n_layers) + " is outside [0, " + snum(kMaxLayers) + "]");
  check(n_kv >= 1 && n_kv <= kMaxKvHeads, "layout n_kv_heads " + num(n_kv) + " is outside [1, " + snum(kMaxKvHeads) + "]");
  check(n_q <= kMaxQHeads, "layout n_q_heads " + num(n_q) + " is above " + snum(kMaxQHeads));
  check(d <= 1024, "layout head_dim " + num(d) + " is not supported (accepted: " + supported_head_dims() + ")");
  L.n_layers = static_cast<int>(n_layers);
  L.n_kv_heads = static_cast<int>(n_kv);
  L.n_q_heads = static_cast<int>(n_q);
  L.head_dim = static_cast<int>(d);
  const uint8_t kgain = r.u8("key_gain"), vgain = r.u8("value_gain");
  check(kgain <= 2, "layout key_gain id " + num(kgain) + " is unknown (accepted 0..2)");
  check(vgain <= 2, "layout value_gain id " + num(vgain) + " is unknown (accepted 0..2)");
  L.key_gain = static_cast<quant::GainPolicy>(kgain);
  L.value_gain = static_cast<quant::GainPolicy>(vgain);
  const uint8_t pre = r.u8("key_frame"), per_head = r.u8("per_head_positions"), center = r.u8("center");
  check(pre <= (version >= 3 ? 2 : 1), version >= 3 ? "layout key_frame must be 0 (post), 1 (pre) or 2 (residual), got " + num(pre)
                                                   : "layout keys_pre_rope must be 0 or 1, got " + num(pre));
  check(per_head <= 1, "layout per_head_positions must be 0 or 1, got " + num(per_head));
  check(center <= 1, "layout center must be 0 or 1, got " + num(center));
  const uint8_t qweight = r.u8(version >= 2 ? "query_weighted_keys" : "reserved");
  check(qweight <= (version >= 2 ? 1 : 0),
        version >= 2 ? "layout query_weighted_keys must be 0 or 1, got " + num(qweight) : std::string("layout reserved bytes must be 0"));
  const uint8_t gain_bits = r.u8(version >= 2 ? "gain_bits" : "reserved");
  if (version >= 2)
    check(gain_bits == 8 || gain_bits == 16, "layout gain_bits must be 8 or 16, got " + num(gain_bits));
  else
    check(gain_bits == 0, "layout reserved bytes must be 0");
  check(r.u8("reserved") == 0, "layout reserved bytes must be 0");
  L.query_weighted_keys = qweight == 1;
  L.gain_bits = version >= 2 ? gain_bits : 16;
  L.key_frame = static_cast<transform::KeyFrame>(pre);
  L.per_head_positions = per_head == 1;
  L.center = center == 1;
  L.key_scale = r.f32("key_scale");
  L.value_scale = r.f32("value_scale");
  L.softmax_scale = r.f32("softmax_scale");
  L.residual_length = r.i32("residual_length");
  L.flush_block = r.i32("flush_block");
  L.mean_tokens = r.i32("mean_tokens");
  L.rotation_seed = r.u64("rotation_seed");
  auto& rp = L.rope;
  const uint8_t rl = r.u8("rope.layout"), rs = r.u8("rope.scaling");
  check(rl <= 1, "layout rope.layout id " + num(rl) + " is unknown (accepted 0 split-half, 1 interleaved)");
  check(rs <= 4, "layout rope.scaling id " + num(rs) + " is unknown (accepted 0..4: none, linear, dynamic, llama3, yarn)");
  rp.layout = static_cast<transform::RopeLayout>(rl);
  rp.scaling = static_cast<transform::RopeScaling>(rs);
  check(r.u16("rope.reserved") == 0, "layout rope reserved field must be 0");
  rp.head_dim = r.i32("rope.head_dim");
  rp.rotary_dim = r.i32("rope.rotary_dim");
  rp.original_max_position = r.i32("rope.original_max_position");
  rp.theta = r.f64("rope.theta");
  rp.factor = r.f64("rope.factor");
  rp.low_freq_factor = r.f64("rope.low_freq_factor");
  rp.high_freq_factor = r.f64("rope.high_freq_factor");
  rp.beta_fast = r.f64("rope.beta_fast");
  rp.beta_slow = r.f64("rope.beta_slow");
  rp.attention_factor = r.f64("rope.attention_factor");
  r.need(2 * static_cast<size_t>(n_layers), "codecs");
  for (uint32_t l = 0; l < n_layers; ++l) {
    const uint8_t k = r.u8("key codec"), v = r.u8("value codec");
    check(k < quant::kCodecCount, "layout key codec id " + num(k) + " of layer " + num(l) + " is unknown (accepted 0.." +
                                      num(quant::kCodecCount - 1) + ")");
    check(v < quant::kCodecCount, "layout value codec id " + num(v) + " of layer " + num(l) +
                                      " is unknown (accepted 0.." + num(quant::kCodecCount - 1) + ")");
    L.key_codec.push_back(static_cast<quant::Codec>(k));
    L.value_codec.push_back(static_cast<quant::Codec>(v));
  }
  validate_layout(L);
}

Header parse_header(Source& src, const DeserializeOptions& o, ContainerKind expect, bool any_kind = false) {
  const uint64_t size = src.size();
  check(size >= kPrefixBytes, "input of " + num(size) + " bytes is too short for a container (at least " +
                                  num(kPrefixBytes) + " bytes)");
  Header h;
  {
    const uint8_t* p = src.read(0, kPrefixBytes);
    check(std::memcmp(p, kMagic.data(), kMagic.size()) == 0, "bad magic: the input is not an e8kv container");
    ByteReader r(p + 8, kPrefixBytes - 8, "header");
    const uint16_t version = r.u16("format_version");
    check(version >= 1 && version <= kFormatVersion,
          "format version " + num(version) + " is not supported (this library reads versions 1.." + num(kFormatVersion) + ")");
    const uint16_t kind = r.u16("kind");
    check(kind == 1 || kind == 2, "container kind " + num(kind) + " is unknown (accepted 1 compressed cache, 2 plain)");
    h.info.format_version = version;
    h.info.kind = static_cast<ContainerKind>(kind);
    check(any_kind || h.info.kind == expect,
          std::string("the container holds ") + (kind == 1 ? "a compressed cache" : "a plain fp16/bf16 cache") +
              "; use " + (kind == 1 ? "deserialize" : "deserialize_plain"));
    check(r.u32("flags") == 0, "header flags must be 0 in format version 1");
    h.header_bytes = r.u64("header_bytes");
    h.info.total_bytes = r.u64("total_bytes");
    check(h.header_bytes >= kPrefixBytes + 4 && h.header_bytes <= size,
          "header_bytes " + num(h.header_bytes) + " is outside [" + num(kPrefixBytes + 4) + ", input size " + num(size) +
              "] (truncated or corrupted input)");
  }
  const uint8_t* hp = src.read(0, static_cast<size_t>(h.header_bytes));
  const size_t hb = static_cast<size_t>(h.header_bytes);
  if (o.verify_checksums) {
    uint32_t stored;
    std::memcpy(&stored, hp + hb - 4, 4);
    check(crc32c(hp, hb - 4) == stored, "header checksum mismatch (the header is corrupted)");
  }
  check(h.info.total_bytes >= h.header_bytes, "total_bytes " + num(h.info.total_bytes) + " is below header_bytes " +
                                                  num(h.header_bytes));
  check(h.info.total_bytes <= size, "truncated input: the container has " + num(h.info.total_bytes) +
                                        " bytes, the input only " + num(size));
  check(h.info.total_bytes == size, "the input has " + num(size - h.info.total_bytes) +
                                        " trailing bytes after the container's " + num(h.info.total_bytes));
  ByteReader r(hp + 32, hb - 4 - 32, "header");
  h.info.library_version = static_cast<int>(r.u32("library_version"));
  const uint32_t chunk_tokens = r.u32("chunk_tokens");
  check(chunk_tokens >= 1 && chunk_tokens <= kMaxChunkTokens,
        "chunk_tokens " + num(chunk_tokens) + " is outside [1, " + snum(kMaxChunkTokens) + "]");
  h.info.chunk_tokens = static_cast<int>(chunk_tokens);
  const uint64_t n_chunks = r.u64("n_chunks");
  check(n_chunks <= (hb - kPrefixBytes) / kDirectoryEntryBytes,
        "n_chunks " + num(n_chunks) + " does not fit in the header's " + num(hb) + " bytes");
  h.info.n_chunks = static_cast<int64_t>(n_chunks);
  const int64_t T = chunk_tokens;
  uint64_t decoded = 0;
  if (h.info.kind == ContainerKind::kCompressedCache) {
    CacheLayout& L = h.info.layout;
    read_layout(r, L, h.info.format_version);
    const size_t sets = position_sets(L);
    r.need(static_cast<size_t>(L.n_layers) * (32 + 16 * sets + 4 * static_cast<size_t>(L.n_kv_heads)), "layer table");
    int64_t next_chunk = 0;
    decoded = codecs_estimate(L);
    for (int l = 0; l < L.n_layers; ++l) {
      LayerCounts c;
      c.original_tokens = r.i64("original_tokens");
      c.pinned = r.i64("pinned");
      const uint64_t first = r.u64("first_chunk"), count = r.u64("n_chunks");
      for (size_t s = 0; s < sets; ++s) {
        const uint64_t coded = r.u64("coded_tokens"), window = r.u64("window_tokens");
        check(coded <= static_cast<uint64_t>(kMaxSetTokens) && window <= static_cast<uint64_t>(kMaxSetTokens) - coded,
              "layer " + snum(l) + " set " + num(s) + ": token counts " + num(coded) + " + " + num(window) +
                  " exceed " + snum(kMaxSetTokens));
        c.coded.push_back(static_cast<int64_t>(coded));
        c.window.push_back(static_cast<int64_t>(window));
      }
      check(c.original_tokens >= c.max_stored() && c.original_tokens <= (int64_t{1} << 62),
            "layer " + snum(l) + ": original_tokens " + snum(c.original_tokens) + " is below its " +
                snum(c.max_stored()) + " stored tokens or absurdly large");
      for (size_t s = 0; s < sets; ++s)
        check(c.pinned >= 0 && c.pinned <= c.window[s], "layer " + snum(l) + ": pinned " + snum(c.pinned) +
                                                            " is outside [0, window tokens of set " + num(s) + " = " +
                                                            snum(c.window[s]) + "]");
      std::vector<std::vector<uint16_t>> km(static_cast<size_t>(L.n_kv_heads)), vm(static_cast<size_t>(L.n_kv_heads));
      uint64_t means_bytes = 0;
      for (int hh = 0; hh < L.n_kv_heads; ++hh) {
        const uint16_t kl = r.u16("key_mean length"), vl = r.u16("value_mean length");
        check((kl == 0 || kl == L.head_dim) && (vl == 0 || vl == L.head_dim),
              "layer " + snum(l) + " head " + snum(hh) + ": mean lengths " + num(kl) + ", " + num(vl) +
                  " must be 0 or head_dim " + snum(L.head_dim));
        r.need(2 * (static_cast<size_t>(kl) + vl), "means");
        for (auto* m : {&km[static_cast<size_t>(hh)], &vm[static_cast<size_t>(hh)]}) {
          m->resize(m == &km[static_cast<size_t>(hh)] ? kl : vl);
          for (auto& x : *m) x = r.u16("mean");
          means_bytes += 2 * m->size();
        }
      }
      h.key_mean.push_back(std::move(km));
      h.value_mean.push_back(std::move(vm));
      std::vector<std::vector<uint16_t>> ks(static_cast<size_t>(L.n_kv_heads));
      std::vector<std::vector<float>> qe;
      std::vector<std::array<uint16_t, 2>> gr(static_cast<size_t>(L.n_kv_heads), std::array<uint16_t, 2>{0, 0});
      if (h.info.format_version >= 2) {
        for (int hh = 0; hh < L.n_kv_heads; ++hh) {
          const uint16_t sl = r.u16("key_channel_scale length");
          check(sl == 0 || (sl == L.head_dim && L.query_weighted_keys),
                "layer " + snum(l) + " head " + snum(hh) + ": key_channel_scale length " + num(sl) +
                    " must be 0 or head_dim " + snum(L.head_dim) + " (with query_weighted_keys)");
          r.need(2 * static_cast<size_t>(sl), "key channel scales");
          auto& s = ks[static_cast<size_t>(hh)];
          s.resize(sl);
          for (auto& x : s) {
            x = r.u16("key channel scale");
            const float v = fp16_bits_to_float(x);
            check(std::isfinite(v) && v > 0.f, "layer " + snum(l) + " head " + snum(hh) +
                                                   ": key channel scales must be positive and finite");
          }
          const uint16_t el = r.u16("query_energy length");
          check(el == 0 || (el == L.head_dim && L.query_weighted_keys),
                "layer " + snum(l) + " head " + snum(hh) + ": query_energy length " + num(el) + " must be 0 or head_dim");
          check(el == 0 || hh == 0 || !qe.empty(), "layer " + snum(l) + ": query_energy must be given for all heads or none");
          check(el != 0 || qe.empty(), "layer " + snum(l) + ": query_energy must be given for all heads or none");
          r.need(4 * static_cast<size_t>(el), "query energy");
          if (el > 0) {
            std::vector<float> e(el);
            for (auto& x : e) {
              x = r.f32("query energy");
              check(std::isfinite(x) && x >= 0.f, "layer " + snum(l) + ": query energies must be finite and >= 0");
            }
            qe.push_back(std::move(e));
          }
          decoded = sat_add(decoded, 2 * static_cast<uint64_t>(sl) + 4 * static_cast<uint64_t>(el));
          auto& refs = gr[static_cast<size_t>(hh)];
          for (auto& ref : refs) {
            ref = r.u16("gain reference");
            const float f = fp16_bits_to_float(ref);
            check(ref == 0 || (L.gain_bits == 8 && std::isfinite(f) && f > 0.f),
                  "layer " + snum(l) + " head " + snum(hh) + ": gain reference must be 0 or (gain_bits 8) positive and finite");
          }
        }
      }
      h.gain_ref.push_back(std::move(gr));
      h.key_channel_scale.push_back(std::move(ks));
      h.query_energy.push_back(std::move(qe));
      decoded = sat_add(decoded, means_bytes);
      c.n_chunks = chunks_for(c.max_stored(), T);
      check(first == static_cast<uint64_t>(next_chunk) && count == static_cast<uint64_t>(c.n_chunks),
            "layer " + snum(l) + ": chunk range (first " + num(first) + ", count " + num(count) + ") should be (" +
                snum(next_chunk) + ", " + snum(c.n_chunks) + ")");
      c.first_chunk = next_chunk;
      next_chunk += c.n_chunks;
      check(static_cast<uint64_t>(next_chunk) <= n_chunks,
            "the layer table needs more chunks than the header's n_chunks " + num(n_chunks));
      decoded = sat_add(decoded, layer_range_bytes(L, l, c, 0, c.max_stored()));
      // Largest decoded chunk of this layer (the scratch a read needs).
      const int64_t rows = std::min<int64_t>(T, c.max_stored());
      uint64_t chunk_raw = sat_add(layer_head_bytes(L, l, rows, 0), layer_head_bytes(L, l, 0, rows));
      chunk_raw = sat_add(sat_mul(chunk_raw, static_cast<uint64_t>(L.n_kv_heads)), 4 * rows * sets);
      h.max_chunk_raw = std::max(h.max_chunk_raw, chunk_raw);
      ContainerInfo::Layer info;
      info.original_tokens = c.original_tokens;
      info.pinned = c.pinned;
      info.coded_tokens = c.coded;
      info.window_tokens = c.window;
      info.first_chunk = c.first_chunk;
      info.n_chunks = c.n_chunks;
      h.info.layers.push_back(std::move(info));
      h.layers.push_back(std::move(c));
    }
    check(static_cast<uint64_t>(next_chunk) == n_chunks,
          "the header's n_chunks " + num(n_chunks) + " differs from the layer table's " + snum(next_chunk));
  } else {
    const uint8_t dt = r.u8("dtype");
    check(dt == 1 || dt == 2, "plain dtype id " + num(dt) + " is unknown (accepted 1 fp16, 2 bf16)");
    h.info.dtype = dt == 1 ? DType::kF16 : DType::kBF16;
    for (int i = 0; i < 7; ++i) check(r.u8("reserved") == 0, "plain header reserved bytes must be 0");
    const uint64_t nt = r.u64("n_tensors"), tokens = r.u64("tokens"), heads = r.u64("heads"), dim = r.u64("head_dim");
    check(nt <= static_cast<uint64_t>(kMaxPlainExtent) && tokens <= static_cast<uint64_t>(kMaxPlainExtent) &&
              heads <= static_cast<uint64_t>(kMaxPlainExtent) && dim <= static_cast<uint64_t>(kMaxPlainExtent),
          "plain extents are absurdly large");
    h.info.n_tensors = static_cast<int64_t>(nt);
    h.info.tokens = static_cast<int64_t>(tokens);
    h.info.heads = static_cast<int64_t>(heads);
    h.info.head_dim = static_cast<int64_t>(dim);
    const uint64_t row = sat_mul(sat_mul(heads, dim), 2);
    check(row <= static_cast<uint64_t>(kMaxPlainExtent), "plain token rows (heads × head_dim) are absurdly large");
    const uint64_t per_tensor = static_cast<uint64_t>(chunks_for(static_cast<int64_t>(tokens), T));
    check(nt == 0 || row == 0 || sat_mul(nt, per_tensor) == n_chunks,
          "plain n_chunks " + num(n_chunks) + " should be n_tensors × ceil(tokens / chunk_tokens) = " +
              num(sat_mul(nt, per_tensor)));
    check(!(nt == 0 || row == 0) || n_chunks == 0, "plain n_chunks must be 0 for empty tensors");
    decoded = sat_add(sat_mul(sat_mul(nt, tokens), row), sat_mul(nt, sizeof(std::vector<uint16_t>)));
    h.max_chunk_raw = sat_mul(std::min<uint64_t>(tokens, static_cast<uint64_t>(T)), row);
  }
  // Directory.
  check(r.remaining() == kDirectoryEntryBytes * n_chunks,
        "header_bytes " + num(hb) + " does not match its contents (" + num(r.remaining()) + " bytes where the " +
            "chunk directory needs " + num(kDirectoryEntryBytes * n_chunks) + ")");
  h.dir.resize(static_cast<size_t>(n_chunks));
  uint64_t expect_offset = h.header_bytes;
  for (uint64_t i = 0; i < n_chunks; ++i) {
    DirEntry& e = h.dir[static_cast<size_t>(i)];
    e.offset = r.u64("chunk offset");
    e.bytes = r.u64("chunk bytes");
    check(e.offset == expect_offset, "chunk " + num(i) + " offset " + num(e.offset) + " should be " + num(expect_offset) +
                                         " (chunks follow each other)");
    check(e.bytes >= kChunkHeaderBytes && e.bytes <= h.info.total_bytes - e.offset,
          "chunk " + num(i) + " of " + num(e.bytes) + " bytes at offset " + num(e.offset) + " does not fit in the " +
              num(h.info.total_bytes) + "-byte container");
    expect_offset = e.offset + e.bytes;
  }
  check(expect_offset == h.info.total_bytes, "the chunks end at " + num(expect_offset) + " but the container has " +
                                                 num(h.info.total_bytes) + " bytes");
  h.info.decoded_bytes = decoded;
  return h;
}

void check_budget(uint64_t need, const DeserializeOptions& o, const char* what) {
  check(need <= o.max_decoded_bytes, std::string(what) + " needs " + num(need) +
                                         " bytes of memory, above DeserializeOptions.max_decoded_bytes = " +
                                         num(o.max_decoded_bytes));
}

// ---- reading: chunks ----------------------------------------------------------------------------

struct StreamView {
  const uint8_t* data = nullptr;  // decoded (inverse-transformed) bytes
  size_t bytes = 0;
};

class ChunkDecoder {
 public:
  ChunkDecoder(Source& src, const Header& h, const DeserializeOptions& o) : src_(src), h_(h), o_(o) {}

  // Reads chunk `index`, checks it, and decodes its streams (expected shapes given, in order).
  void decode(uint64_t index, uint32_t layer, uint64_t first_token, const std::vector<StreamPlan>& plans) {
    const DirEntry& e = h_.dir[static_cast<size_t>(index)];
    const std::string where = "chunk " + num(index);
    const uint8_t* p = src_.read(e.offset, static_cast<size_t>(e.bytes));
    check(std::memcmp(p, kChunkMagic, 4) == 0, where + ": bad chunk magic");
    ByteReader hr(p + 4, kChunkHeaderBytes - 4, where);
    const uint32_t n_streams = hr.u32("n_streams");
    const uint32_t dir_index = hr.u32("directory index");
    const uint32_t lay = hr.u32("layer");
    const uint64_t first = hr.u64("first token");
    const uint64_t payload = hr.u64("payload bytes");
    const uint32_t reserved = hr.u32("reserved");
    const uint32_t crc = hr.u32("crc");
    check(payload == e.bytes - kChunkHeaderBytes,
          where + ": payload of " + num(payload) + " bytes disagrees with the directory's " + num(e.bytes) + "-byte chunk");
    if (o_.verify_checksums)
      check(crc32c(p + kChunkHeaderBytes, static_cast<size_t>(payload), crc32c(p, 36)) == crc,
            where + ": checksum mismatch (the chunk is corrupted)");
    check(n_streams == plans.size(), where + ": " + num(n_streams) + " streams, expected " + num(plans.size()));
    check(dir_index == index && lay == layer && first == first_token && reserved == 0,
          where + ": header (index " + num(dir_index) + ", layer " + num(lay) + ", first token " + num(first) +
              ") should be (" + num(index) + ", " + num(layer) + ", " + num(first_token) + ")");
    ByteReader r(p + kChunkHeaderBytes, static_cast<size_t>(payload), where);
    r.need(kStreamDescriptorBytes * plans.size(), "stream descriptors");
    struct Desc {
      uint8_t kind, transform, entropy;
      uint64_t raw, stored;
    };
    std::vector<Desc> descs;
    for (size_t i = 0; i < plans.size(); ++i) {
      Desc d{};
      d.kind = r.u8("stream kind");
      d.transform = r.u8("transform");
      d.entropy = r.u8("entropy");
      for (int k = 0; k < 5; ++k) check(r.u8("reserved") == 0, where + ": stream descriptor reserved bytes must be 0");
      d.raw = r.u64("raw bytes");
      d.stored = r.u64("stored bytes");
      const std::string sw = where + " stream " + num(i);
      check(d.kind == static_cast<uint8_t>(plans[i].kind),
            sw + ": kind " + num(d.kind) + ", expected " + num(static_cast<int>(plans[i].kind)) + " (" +
                to_string(plans[i].kind) + ")");
      check(d.transform < kTransformCount, sw + ": transform id " + num(d.transform) + " is unknown (accepted 0..5)");
      check(d.entropy == kEntropyStored || d.entropy == kEntropyZstd,
            sw + ": entropy coder id " + num(d.entropy) + " is unknown (accepted 0 stored, 1 zstd)");
      check(d.raw == plans[i].shape.bytes(),
            sw + ": " + num(d.raw) + " raw bytes, the layer table implies " + num(plans[i].shape.bytes()));
      check(d.entropy == kEntropyZstd ? (d.stored > 0 && d.stored <= ZSTD_compressBound(d.raw)) : d.stored == d.raw,
            sw + ": stored size " + num(d.stored) + " is impossible for " + num(d.raw) + " raw bytes");
      descs.push_back(d);
    }
    uint64_t total = 0;
    for (const auto& d : descs) total = sat_add(total, d.stored);
    check(total == r.remaining(), where + ": streams hold " + num(total) + " bytes, the chunk " + num(r.remaining()));
    // Decode into one scratch buffer (views stay valid until the next decode).
    uint64_t raw_total = 0;
    for (const auto& d : descs) raw_total += d.raw;
    out_.resize(static_cast<size_t>(raw_total));
    views_.assign(plans.size(), {});
    const uint8_t* sp = p + kChunkHeaderBytes + kStreamDescriptorBytes * plans.size();
    size_t out_at = 0;
    for (size_t i = 0; i < plans.size(); ++i) {
      const Desc& d = descs[i];
      const size_t raw = static_cast<size_t>(d.raw), stored = static_cast<size_t>(d.stored);
      const uint8_t* transformed = sp;
      uint8_t* dst = out_.data() + out_at;
      const bool plain = d.transform == static_cast<uint8_t>(Transform::kNone);
      if (d.entropy == kEntropyZstd) {
        const std::string sw = where + " stream " + num(i);
        const unsigned long long content = ZSTD_getFrameContentSize(sp, stored);
        check(content == d.raw, sw + ": the zstd frame's content size does not match " + num(d.raw) + " raw bytes");
        const size_t frame = ZSTD_findFrameCompressedSize(sp, stored);
        check(!ZSTD_isError(frame) && frame == stored, sw + ": the zstd data is not exactly one frame");
        if (!plain) zbuf_.resize(raw);
        uint8_t* target = plain ? dst : zbuf_.data();
        const size_t got = ZSTD_decompressDCtx(zstd_.dctx(), target, raw, sp, stored);
        check(!ZSTD_isError(got) && got == raw,
              sw + ": zstd decompression failed" + (ZSTD_isError(got) ? std::string(": ") + ZSTD_getErrorName(got) : ""));
        transformed = target;
      }
      if (raw > 0 && transformed != dst)
        run_transform<false>(static_cast<Transform>(d.transform), plans[i].shape, transformed, dst);
      views_[i] = {out_.data() + out_at, raw};
      out_at += raw;
      sp += stored;
    }
  }
  const StreamView& view(size_t i) const { return views_[i]; }

 private:
  Source& src_;
  const Header& h_;
  const DeserializeOptions& o_;
  Zstd zstd_;
  std::vector<uint8_t> zbuf_, out_;
  std::vector<StreamView> views_;
};

std::vector<StreamPlan> cache_chunk_plans(const CacheLayout& L, int l, const std::vector<ChunkRows>& rows) {
  const size_t sets = rows.size();
  const CodecGeometry kg = geometry(L.key_codec[static_cast<size_t>(l)], L.head_dim, L.gain_bits);
  const CodecGeometry vg = geometry(L.value_codec[static_cast<size_t>(l)], L.head_dim, L.gain_bits);
  std::vector<StreamPlan> plans;
  StreamShape pos{{}, 1, 4};
  for (const auto& r : rows) pos.segment_rows.push_back(r.hi - r.lo);
  plans.push_back({StreamKind::kPositions, pos});
  auto per_head = [&](StreamKind k, int64_t cols, int width, bool coded) {
    StreamShape sh{{}, cols, width};
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const auto& r = rows[sets == 1 ? 0 : static_cast<size_t>(h)];
      sh.segment_rows.push_back(coded ? r.coded() : r.window());
    }
    plans.push_back({k, sh});
  };
  per_head(StreamKind::kKeyCodes, kg.cols, kg.width, true);
  per_head(StreamKind::kValueCodes, vg.cols, vg.width, true);
  per_head(StreamKind::kKeyGains, kg.has_gain ? 1 : 0, kg.gain_width == 1 ? 1 : 2, true);
  per_head(StreamKind::kValueGains, vg.has_gain ? 1 : 0, vg.gain_width == 1 ? 1 : 2, true);
  per_head(StreamKind::kWindowKeys, L.head_dim, 2, false);
  per_head(StreamKind::kWindowValues, L.head_dim, 2, false);
  return plans;
}

// Stored tokens [begin, end) (clamped per set) of layer l, from the chunks overlapping it.
CompressedKV::LayerData read_layer_range(Source& src, const Header& h, const DeserializeOptions& o, int l,
                                         int64_t begin, int64_t end) {
  const CacheLayout& L = h.info.layout;
  const LayerCounts& c = h.layers[static_cast<size_t>(l)];
  const int64_t T = h.info.chunk_tokens;
  const size_t sets = c.coded.size();
  const int H = L.n_kv_heads;
  const size_t d = static_cast<size_t>(L.head_dim);
  const CodecGeometry kg = geometry(L.key_codec[static_cast<size_t>(l)], L.head_dim, L.gain_bits);
  const CodecGeometry vg = geometry(L.value_codec[static_cast<size_t>(l)], L.head_dim, L.gain_bits);

  CompressedKV::LayerData out;
  out.original_tokens = c.original_tokens;
  out.positions.assign(sets, {});
  out.window_positions.assign(sets, {});
  out.heads.assign(static_cast<size_t>(H), {});
  // Reserve exact sizes (already checked against the budget).
  std::vector<size_t> sel_coded(sets), sel_window(sets);
  for (size_t s = 0; s < sets; ++s) {
    const int64_t n = c.coded[s] + c.window[s];
    const int64_t lo = std::min(begin, n), hi = std::min(end, n);
    const int64_t coded = std::max<int64_t>(0, std::min(hi, c.coded[s]) - lo);
    sel_coded[s] = static_cast<size_t>(coded);
    sel_window[s] = static_cast<size_t>(hi - lo - coded);
    out.positions[s].reserve(sel_coded[s]);
    out.window_positions[s].reserve(sel_window[s]);
  }
  for (int hh = 0; hh < H; ++hh) {
    const size_t s = sets == 1 ? 0 : static_cast<size_t>(hh);
    const size_t nc = sel_coded[s], nw = sel_window[s];
    auto& hd = out.heads[static_cast<size_t>(hh)];
    hd.key_codes.reserve(nc * kg.code_bytes);
    hd.value_codes.reserve(nc * vg.code_bytes);
    if (kg.gain_width == 2) hd.key_gains.reserve(nc);
    if (vg.gain_width == 2) hd.value_gains.reserve(nc);
    if (kg.gain_width == 1) hd.key_gain_codes.reserve(nc);
    if (vg.gain_width == 1) hd.value_gain_codes.reserve(nc);
    hd.window_keys.reserve(nw * d);
    hd.window_values.reserve(nw * d);
  }
  for (int hh = 0; hh < H; ++hh) {
    out.heads[static_cast<size_t>(hh)].key_mean = h.key_mean[static_cast<size_t>(l)][static_cast<size_t>(hh)];
    out.heads[static_cast<size_t>(hh)].value_mean = h.value_mean[static_cast<size_t>(l)][static_cast<size_t>(hh)];
    out.heads[static_cast<size_t>(hh)].key_channel_scale = h.key_channel_scale[static_cast<size_t>(l)][static_cast<size_t>(hh)];
    out.heads[static_cast<size_t>(hh)].key_gain_ref = h.gain_ref[static_cast<size_t>(l)][static_cast<size_t>(hh)][0];
    out.heads[static_cast<size_t>(hh)].value_gain_ref = h.gain_ref[static_cast<size_t>(l)][static_cast<size_t>(hh)][1];
  }
  out.query_energy = h.query_energy[static_cast<size_t>(l)];
  out.pinned = c.pinned;  // the layer's count, as original_tokens (window index < pinned: a sink)
  if (begin >= end || c.n_chunks == 0) return out;

  ChunkDecoder dec(src, h, o);
  const int64_t c0 = begin / T;
  const int64_t c1 = std::min(c.n_chunks, (end + T - 1) / T);
  for (int64_t ci = c0; ci < c1; ++ci) {
    std::vector<ChunkRows> rows(sets);
    for (size_t s = 0; s < sets; ++s) rows[s] = chunk_rows(ci, T, c.coded[s], c.window[s]);
    const auto plans = cache_chunk_plans(L, l, rows);
    dec.decode(static_cast<uint64_t>(c.first_chunk + ci), static_cast<uint32_t>(l), static_cast<uint64_t>(ci * T), plans);
    // Selected unified rows of set s: [max(lo, begin), min(hi, end)).
    auto coded_sel = [&](size_t s, int64_t& from, int64_t& count) {  // relative to the chunk's coded rows
      const auto& r = rows[s];
      const int64_t a = std::max(r.coded_lo, begin), b = std::min(r.coded_hi, end);
      from = a - r.coded_lo;
      count = std::max<int64_t>(0, b - a);
    };
    auto window_sel = [&](size_t s, int64_t& from, int64_t& count) {
      const auto& r = rows[s];
      const int64_t C = c.coded[s];
      const int64_t a = std::max(r.window_lo + C, begin), b = std::min(r.window_hi + C, end);
      from = a - (r.window_lo + C);
      count = std::max<int64_t>(0, b - a);
    };
    // Positions: segment s holds the chunk's coded rows then window rows of set s.
    {
      const uint8_t* p = dec.view(0).data;
      for (size_t s = 0; s < sets; ++s) {
        const auto& r = rows[s];
        int64_t from, count;
        coded_sel(s, from, count);
        for (int64_t i = 0; i < count; ++i) {
          int32_t pos;
          std::memcpy(&pos, p + 4 * static_cast<size_t>(from + i), 4);
          out.positions[s].push_back(pos);
        }
        window_sel(s, from, count);
        for (int64_t i = 0; i < count; ++i) {
          int32_t pos;
          std::memcpy(&pos, p + 4 * static_cast<size_t>(r.coded() + from + i), 4);
          out.window_positions[s].push_back(pos);
        }
        p += 4 * static_cast<size_t>(r.hi - r.lo);
      }
    }
    // Per-head streams: segment h holds the chunk's rows of head h.
    auto scatter = [&](size_t stream, size_t row_bytes, bool coded, auto&& dst_of) {
      const uint8_t* p = dec.view(stream).data;
      for (int hh = 0; hh < H; ++hh) {
        const size_t s = sets == 1 ? 0 : static_cast<size_t>(hh);
        const int64_t seg_rows = coded ? rows[s].coded() : rows[s].window();
        int64_t from, count;
        if (coded) coded_sel(s, from, count);
        else window_sel(s, from, count);
        if (row_bytes > 0 && count > 0) {
          const uint8_t* a = p + static_cast<size_t>(from) * row_bytes;
          dst_of(out.heads[static_cast<size_t>(hh)], a, static_cast<size_t>(count) * row_bytes);
        }
        p += static_cast<size_t>(seg_rows) * row_bytes;
      }
    };
    auto append_u8 = [](std::vector<uint8_t>& v, const uint8_t* a, size_t n) { v.insert(v.end(), a, a + n); };
    auto append_u16 = [](std::vector<uint16_t>& v, const uint8_t* a, size_t n) {
      const size_t at = v.size();
      v.resize(at + n / 2);
      std::memcpy(v.data() + at, a, n);
    };
    using HD = CompressedKV::HeadData;
    scatter(1, kg.code_bytes, true, [&](HD& hd, const uint8_t* a, size_t n) { append_u8(hd.key_codes, a, n); });
    scatter(2, vg.code_bytes, true, [&](HD& hd, const uint8_t* a, size_t n) { append_u8(hd.value_codes, a, n); });
    scatter(3, static_cast<size_t>(kg.gain_width), true, [&](HD& hd, const uint8_t* a, size_t n) {
      if (kg.gain_width == 1) append_u8(hd.key_gain_codes, a, n);
      else append_u16(hd.key_gains, a, n);
    });
    scatter(4, static_cast<size_t>(vg.gain_width), true, [&](HD& hd, const uint8_t* a, size_t n) {
      if (vg.gain_width == 1) append_u8(hd.value_gain_codes, a, n);
      else append_u16(hd.value_gains, a, n);
    });
    scatter(5, 2 * d, false, [&](HD& hd, const uint8_t* a, size_t n) { append_u16(hd.window_keys, a, n); });
    scatter(6, 2 * d, false, [&](HD& hd, const uint8_t* a, size_t n) { append_u16(hd.window_values, a, n); });
  }
  for (size_t s = 0; s < sets; ++s) {
    const int64_t n = c.coded[s] + c.window[s];
    const int64_t w0 = std::max(std::min(begin, n), c.coded[s]) - c.coded[s];
    check_positions(out.positions[s], out.window_positions[s], c.pinned - w0, l, s);
  }
  return out;
}

uint64_t scratch_bytes(const Header& h) { return sat_mul(h.max_chunk_raw, 3); }

CompressedKV read_cache(Source& src, const DeserializeOptions& o) {
  const Header h = parse_header(src, o, ContainerKind::kCompressedCache);
  check_budget(sat_add(h.info.decoded_bytes, scratch_bytes(h)), o, "the cache");
  const CacheLayout& L = h.info.layout;
  std::shared_ptr<const CacheCodecs> codecs = o.codecs;
  if (codecs) {
    const std::string diff = layout_difference(codecs->layout(), L);
    check(diff.empty(), "DeserializeOptions.codecs has a different layout than the container: " + diff);
  }
  // Every chunk is read and checked before the (costly) codecs are built.
  std::vector<CompressedKV::LayerData> layers;
  layers.reserve(static_cast<size_t>(L.n_layers));
  for (int l = 0; l < L.n_layers; ++l)
    layers.push_back(read_layer_range(src, h, o, l, 0, h.layers[static_cast<size_t>(l)].max_stored()));
  if (!codecs) codecs = std::make_shared<const CacheCodecs>(L);
  CompressedKV cache(std::move(codecs));
  for (int l = 0; l < L.n_layers; ++l) e8kv::detail::CacheStorage::layer(cache, l) = std::move(layers[static_cast<size_t>(l)]);
  return cache;
}

CompressedKV::LayerData read_range(Source& src, const DeserializeOptions& o, int layer, int64_t begin, int64_t end,
                                   const char* what) {
  const Header h = parse_header(src, o, ContainerKind::kCompressedCache);
  const CacheLayout& L = h.info.layout;
  require(layer >= 0 && layer < L.n_layers, std::string(what) + ": layer " + std::to_string(layer) +
                                                " is out of range [0, " + std::to_string(L.n_layers) + ")");
  require(begin >= 0 && begin <= end, std::string(what) + ": token range [" + std::to_string(begin) + ", " +
                                          std::to_string(end) + ") must satisfy 0 <= begin <= end");
  const LayerCounts& c = h.layers[static_cast<size_t>(layer)];
  const int64_t e = std::min(end, c.max_stored());
  const int64_t b = std::min(begin, e);
  check_budget(sat_add(layer_range_bytes(L, layer, c, b, e), scratch_bytes(h)), o, what);
  return read_layer_range(src, h, o, layer, b, e);
}

// ---- plain containers ---------------------------------------------------------------------------

void check_plain_views(const std::vector<TensorView>& t) {
  if (t.empty()) return;
  const TensorView& a = t[0];
  require(a.dtype() == DType::kF16 || a.dtype() == DType::kBF16,
          std::string("serialize_plain: dtype ") + to_string(a.dtype()) + " is not accepted (accepted: f16, bf16)");
  for (size_t i = 1; i < t.size(); ++i)
    require(t[i].dtype() == a.dtype() && t[i].tokens() == a.tokens() && t[i].heads() == a.heads() &&
                t[i].head_dim() == a.head_dim(),
            "serialize_plain: tensor " + std::to_string(i) + " differs in dtype or shape from tensor 0");
  require(a.tokens() <= kMaxPlainExtent && a.heads() <= kMaxPlainExtent && a.head_dim() <= kMaxPlainExtent &&
              static_cast<int64_t>(t.size()) <= kMaxPlainExtent &&
              sat_mul(static_cast<uint64_t>(a.heads()), static_cast<uint64_t>(a.head_dim()) * 2) <=
                  static_cast<uint64_t>(kMaxPlainExtent),
          "serialize_plain: extents are too large");
}

std::vector<uint8_t> encode_plain(const std::vector<TensorView>& tensors, const ContainerOptions& o) {
  o.validate();
  check_plain_views(tensors);
  const int64_t T = o.chunk_tokens;
  const DType dt = tensors.empty() ? DType::kF16 : tensors[0].dtype();
  const int64_t tokens = tensors.empty() ? 0 : tensors[0].tokens();
  const int64_t heads = tensors.empty() ? 0 : tensors[0].heads();
  const int64_t dim = tensors.empty() ? 0 : tensors[0].head_dim();
  const bool empty = tensors.empty() || heads * dim == 0;
  const int64_t per_tensor = empty ? 0 : chunks_for(tokens, T);
  const uint64_t n_chunks = static_cast<uint64_t>(per_tensor) * tensors.size();
  check(n_chunks <= std::numeric_limits<uint32_t>::max(), "too many chunks; raise chunk_tokens");
  const size_t header_bytes = kPrefixBytes + kPlainFixedBytes + kDirectoryEntryBytes * n_chunks + 4;
  std::vector<uint8_t> out;
  ByteWriter w(out);
  write_prefix(w, ContainerKind::kPlain, static_cast<uint64_t>(T), n_chunks);
  w.u8(dt == DType::kF16 ? 1 : 2);
  for (int i = 0; i < 7; ++i) w.u8(0);
  w.u64(tensors.size());
  w.u64(static_cast<uint64_t>(tokens));
  w.u64(static_cast<uint64_t>(heads));
  w.u64(static_cast<uint64_t>(dim));
  const size_t dir_at = out.size();
  out.resize(header_bytes);
  ChunkEncoder enc(o);
  std::vector<uint64_t> offsets;
  std::vector<uint8_t> raw;
  const size_t row_elems = static_cast<size_t>(heads * dim);
  for (size_t ti = 0; ti < tensors.size() && !empty; ++ti) {
    const TensorView& v = tensors[ti];
    const bool contiguous = v.token_stride() == heads * dim && v.head_stride() == dim;
    for (int64_t ci = 0; ci < per_tensor; ++ci) {
      const int64_t t0 = ci * T, t1 = std::min(tokens, t0 + T);
      raw.resize(static_cast<size_t>(t1 - t0) * row_elems * 2);
      const auto* base = static_cast<const uint8_t*>(v.data());
      if (contiguous) {
        std::memcpy(raw.data(), base + static_cast<size_t>(t0) * row_elems * 2, raw.size());
      } else {
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t hh = 0; hh < heads; ++hh)
            std::memcpy(raw.data() + (static_cast<size_t>(t - t0) * row_elems + static_cast<size_t>(hh * dim)) * 2,
                        base + static_cast<size_t>(t * v.token_stride() + hh * v.head_stride()) * 2,
                        static_cast<size_t>(dim) * 2);
      }
      offsets.push_back(out.size());
      write_chunk(out, static_cast<uint32_t>(offsets.size() - 1), static_cast<uint32_t>(ti),
                  static_cast<uint64_t>(t0), 1, [&](size_t desc) {
                    StreamShape sh{{t1 - t0}, static_cast<int64_t>(row_elems), 2};
                    enc.encode_stream(StreamKind::kPlainValues, o.transforms.fp16, sh, raw.data(), out, desc);
                  });
    }
  }
  finish_container(out, dir_at, header_bytes, offsets);
  return out;
}

PlainCache read_plain(Source& src, const DeserializeOptions& o) {
  const Header h = parse_header(src, o, ContainerKind::kPlain);
  check_budget(sat_add(h.info.decoded_bytes, scratch_bytes(h)), o, "the plain cache");
  PlainCache out;
  out.dtype = h.info.dtype;
  out.tokens = h.info.tokens;
  out.heads = h.info.heads;
  out.head_dim = h.info.head_dim;
  const size_t row_elems = static_cast<size_t>(out.heads * out.head_dim);
  out.tensors.assign(static_cast<size_t>(h.info.n_tensors), {});
  if (h.info.n_chunks == 0) {
    for (auto& t : out.tensors) t.resize(static_cast<size_t>(out.tokens) * row_elems);
    return out;
  }
  const int64_t T = h.info.chunk_tokens;
  const int64_t per_tensor = chunks_for(out.tokens, T);
  ChunkDecoder dec(src, h, o);
  uint64_t index = 0;
  for (size_t ti = 0; ti < out.tensors.size(); ++ti) {
    auto& t = out.tensors[ti];
    t.resize(static_cast<size_t>(out.tokens) * row_elems);
    for (int64_t ci = 0; ci < per_tensor; ++ci, ++index) {
      const int64_t t0 = ci * T, t1 = std::min(out.tokens, t0 + T);
      std::vector<StreamPlan> plans{{StreamKind::kPlainValues, StreamShape{{t1 - t0}, static_cast<int64_t>(row_elems), 2}}};
      dec.decode(index, static_cast<uint32_t>(ti), static_cast<uint64_t>(t0), plans);
      std::memcpy(t.data() + static_cast<size_t>(t0) * row_elems, dec.view(0).data, dec.view(0).bytes);
    }
  }
  return out;
}

}  // namespace

// ---- public API ---------------------------------------------------------------------------------

std::string layout_difference(const CacheLayout& a, const CacheLayout& b) {
  auto bits32 = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  };
  auto bits64 = [](double v) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    return u;
  };
  auto fmt = [](double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  auto ints = [](const char* f, int64_t x, int64_t y) {
    return x == y ? std::string() : std::string(f) + " " + std::to_string(x) + " vs " + std::to_string(y);
  };
  std::string d;
  auto first = [&](const std::string& s) {
    if (d.empty()) d = s;
  };
  first(ints("n_layers", a.n_layers, b.n_layers));
  first(ints("n_kv_heads", a.n_kv_heads, b.n_kv_heads));
  first(ints("n_q_heads", a.n_q_heads, b.n_q_heads));
  first(ints("head_dim", a.head_dim, b.head_dim));
  for (size_t l = 0; l < std::max(a.key_codec.size(), b.key_codec.size()) && d.empty(); ++l) {
    const int x = l < a.key_codec.size() ? static_cast<int>(a.key_codec[l]) : -1;
    const int y = l < b.key_codec.size() ? static_cast<int>(b.key_codec[l]) : -1;
    first(ints(("key_codec[" + std::to_string(l) + "]").c_str(), x, y));
  }
  for (size_t l = 0; l < std::max(a.value_codec.size(), b.value_codec.size()) && d.empty(); ++l) {
    const int x = l < a.value_codec.size() ? static_cast<int>(a.value_codec[l]) : -1;
    const int y = l < b.value_codec.size() ? static_cast<int>(b.value_codec[l]) : -1;
    first(ints(("value_codec[" + std::to_string(l) + "]").c_str(), x, y));
  }
  first(ints("key_gain", static_cast<int>(a.key_gain), static_cast<int>(b.key_gain)));
  first(ints("value_gain", static_cast<int>(a.value_gain), static_cast<int>(b.value_gain)));
  auto f32 = [&](const char* f, float x, float y) {
    if (bits32(x) != bits32(y)) first(std::string(f) + " " + fmt(x) + " vs " + fmt(y));
  };
  auto f64 = [&](const char* f, double x, double y) {
    if (bits64(x) != bits64(y)) first(std::string(f) + " " + fmt(x) + " vs " + fmt(y));
  };
  f32("key_scale", a.key_scale, b.key_scale);
  f32("value_scale", a.value_scale, b.value_scale);
  first(ints("key_frame", static_cast<int>(a.key_frame), static_cast<int>(b.key_frame)));
  first(ints("rotation_seed", static_cast<int64_t>(a.rotation_seed), static_cast<int64_t>(b.rotation_seed)));
  first(ints("per_head_positions", a.per_head_positions, b.per_head_positions));
  first(ints("residual_length", a.residual_length, b.residual_length));
  first(ints("flush_block", a.flush_block, b.flush_block));
  first(ints("center", a.center, b.center));
  first(ints("query_weighted_keys", a.query_weighted_keys, b.query_weighted_keys));
  first(ints("gain_bits", a.gain_bits, b.gain_bits));
  first(ints("mean_tokens", a.mean_tokens, b.mean_tokens));
  f32("softmax_scale", a.softmax_scale, b.softmax_scale);
  const auto& p = a.rope;
  const auto& q = b.rope;
  first(ints("rope.layout", static_cast<int>(p.layout), static_cast<int>(q.layout)));
  first(ints("rope.head_dim", p.head_dim, q.head_dim));
  first(ints("rope.rotary_dim", p.rotary_dim, q.rotary_dim));
  f64("rope.theta", p.theta, q.theta);
  first(ints("rope.scaling", static_cast<int>(p.scaling), static_cast<int>(q.scaling)));
  f64("rope.factor", p.factor, q.factor);
  first(ints("rope.original_max_position", p.original_max_position, q.original_max_position));
  f64("rope.low_freq_factor", p.low_freq_factor, q.low_freq_factor);
  f64("rope.high_freq_factor", p.high_freq_factor, q.high_freq_factor);
  f64("rope.beta_fast", p.beta_fast, q.beta_fast);
  f64("rope.beta_slow", p.beta_slow, q.beta_slow);
  f64("rope.attention_factor", p.attention_factor, q.attention_factor);
  return d;
}

const char* to_string(StreamKind s) {
  switch (s) {
    case StreamKind::kPositions: return "positions";
    case StreamKind::kKeyCodes: return "key codes";
    case StreamKind::kValueCodes: return "value codes";
    case StreamKind::kKeyGains: return "key gains";
    case StreamKind::kValueGains: return "value gains";
    case StreamKind::kWindowKeys: return "window keys";
    case StreamKind::kWindowValues: return "window values";
    case StreamKind::kPlainValues: return "plain values";
  }
  return "?";
}

const char* to_string(Transform t) {
  switch (t) {
    case Transform::kNone: return "none";
    case Transform::kShuffle: return "shuffle";
    case Transform::kXorDelta: return "xor-delta";
    case Transform::kXorDeltaShuffle: return "xor-delta+shuffle";
    case Transform::kSubDelta: return "sub-delta";
    case Transform::kSubDeltaShuffle: return "sub-delta+shuffle";
  }
  return "?";
}

Transform transform_from_id(uint32_t id) {
  if (id >= static_cast<uint32_t>(kTransformCount))
    throw Error("transform id " + std::to_string(id) + " is unknown (accepted 0..5: none, shuffle, xor-delta, "
                "xor-delta+shuffle, sub-delta, sub-delta+shuffle)");
  return static_cast<Transform>(id);
}

size_t StreamShape::bytes() const {
  uint64_t rows = 0;
  for (int64_t r : segment_rows) rows += static_cast<uint64_t>(std::max<int64_t>(r, 0));
  return static_cast<size_t>(rows * static_cast<uint64_t>(std::max<int64_t>(cols, 0)) * static_cast<uint64_t>(std::max(width, 0)));
}

void transform_forward(Transform t, const StreamShape& shape, const uint8_t* in, uint8_t* out) {
  run_transform<true>(t, shape, in, out);
}
void transform_inverse(Transform t, const StreamShape& shape, const uint8_t* in, uint8_t* out) {
  run_transform<false>(t, shape, in, out);
}

void ContainerOptions::validate() const {
  require(chunk_tokens >= 1 && chunk_tokens <= kMaxChunkTokens,
          "ContainerOptions.chunk_tokens must be in [1, " + std::to_string(kMaxChunkTokens) + "], got " +
              std::to_string(chunk_tokens));
  require(zstd_level >= -7 && zstd_level <= 22,
          "ContainerOptions.zstd_level must be in [-7, 22] (0 = zstd's default 3), got " + std::to_string(zstd_level));
  require(min_zstd_saving >= 0.0 && min_zstd_saving <= 1.0,
          "ContainerOptions.min_zstd_saving must be in [0, 1], got " + std::to_string(min_zstd_saving));
  const std::pair<const char*, Transform> fields[] = {{"positions", transforms.positions},
                                                      {"key_codes", transforms.key_codes.value_or(Transform::kNone)},
                                                      {"value_codes", transforms.value_codes},
                                                      {"gains", transforms.gains},
                                                      {"fp16", transforms.fp16}};
  for (const auto& [name, t] : fields) {
    const int id = static_cast<int>(t);
    require(id >= 0 && id < kTransformCount, std::string("ContainerOptions.transforms.") + name + ": id " +
                                                 std::to_string(id) + " is unknown (accepted 0..5)");
  }
}

size_t serialized_size(const CompressedKV& cache, const ContainerOptions& options) {
  return encode_cache(cache, options).size();
}

size_t serialized_size_bound(const CompressedKV& cache, const ContainerOptions& options) {
  options.validate();
  require(cache.valid(), "serialized_size_bound: the cache is empty (default-constructed)");
  const CacheLayout& L = cache.layout();
  validate_layout(L);
  const int64_t T = options.chunk_tokens;
  uint64_t n_chunks = 0, body = 0, header = kPrefixBytes + kLayoutFixedBytes + 2 * static_cast<uint64_t>(L.n_layers) + 4;
  for (int l = 0; l < L.n_layers; ++l) {
    const LayerCounts c = checked_counts(cache, l, T);
    n_chunks += static_cast<uint64_t>(c.n_chunks);
    header += layer_entry_bytes(cache.layer(l), c.coded.size(), format_version_for(L)) + kDirectoryEntryBytes * static_cast<uint64_t>(c.n_chunks);
    for (int64_t ci = 0; ci < c.n_chunks; ++ci) {
      std::vector<ChunkRows> rows;
      for (size_t s = 0; s < c.coded.size(); ++s) rows.push_back(chunk_rows(ci, T, c.coded[s], c.window[s]));
      body += kChunkHeaderBytes + kStreamDescriptorBytes * kCacheStreams;
      for (const auto& p : cache_chunk_plans(L, l, rows)) body += ZSTD_compressBound(p.shape.bytes());
    }
  }
  (void)n_chunks;
  return static_cast<size_t>(header + body);
}

std::vector<uint8_t> serialize(const CompressedKV& cache, const ContainerOptions& options) {
  return encode_cache(cache, options);
}

size_t serialize(const CompressedKV& cache, const ContainerOptions& options, uint8_t* out, size_t cap) {
  const std::vector<uint8_t> bytes = encode_cache(cache, options);
  require(out != nullptr || cap == 0, "serialize: null output buffer");
  require(bytes.size() <= cap, "serialize: the output buffer holds " + std::to_string(cap) +
                                   " bytes, the container needs " + std::to_string(bytes.size()));
  std::memcpy(out, bytes.data(), bytes.size());
  return bytes.size();
}

size_t serialize(const CompressedKV& cache, const ContainerOptions& options, std::ostream& out) {
  const std::vector<uint8_t> bytes = encode_cache(cache, options);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  require(static_cast<bool>(out), "serialize: writing " + std::to_string(bytes.size()) + " bytes to the stream failed");
  return bytes.size();
}

CompressedKV deserialize(const uint8_t* data, size_t size, const DeserializeOptions& options) {
  SpanSource src(data, size);
  return read_cache(src, options);
}

ContainerInfo read_info(const uint8_t* data, size_t size, const DeserializeOptions& options) {
  SpanSource src(data, size);
  return parse_header(src, options, ContainerKind::kCompressedCache, true).info;
}

CompressedKV::LayerData deserialize_layer(const uint8_t* data, size_t size, int layer, const DeserializeOptions& options) {
  SpanSource src(data, size);
  return read_range(src, options, layer, 0, std::numeric_limits<int64_t>::max(), "deserialize_layer");
}

CompressedKV::LayerData deserialize_tokens(const uint8_t* data, size_t size, int layer, int64_t begin, int64_t end,
                                           const DeserializeOptions& options) {
  SpanSource src(data, size);
  return read_range(src, options, layer, begin, end, "deserialize_tokens");
}

std::vector<uint8_t> serialize_plain(const std::vector<TensorView>& tensors, const ContainerOptions& options) {
  return encode_plain(tensors, options);
}

size_t serialize_plain(const std::vector<TensorView>& tensors, const ContainerOptions& options, uint8_t* out,
                       size_t cap) {
  const std::vector<uint8_t> bytes = encode_plain(tensors, options);
  require(out != nullptr || cap == 0, "serialize_plain: null output buffer");
  require(bytes.size() <= cap, "serialize_plain: the output buffer holds " + std::to_string(cap) +
                                   " bytes, the container needs " + std::to_string(bytes.size()));
  std::memcpy(out, bytes.data(), bytes.size());
  return bytes.size();
}

size_t serialized_plain_size(const std::vector<TensorView>& tensors, const ContainerOptions& options) {
  return encode_plain(tensors, options).size();
}

PlainCache deserialize_plain(const uint8_t* data, size_t size, const DeserializeOptions& options) {
  SpanSource src(data, size);
  return read_plain(src, options);
}

void write_file(const std::string& path, const CompressedKV& cache, const ContainerOptions& options) {
  const std::vector<uint8_t> bytes = encode_cache(cache, options);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  require(static_cast<bool>(f), "write_file: cannot open '" + path + "' for writing");
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  f.close();
  require(!f.fail(), "write_file: writing " + std::to_string(bytes.size()) + " bytes to '" + path + "' failed");
}

CompressedKV read_file(const std::string& path, const DeserializeOptions& options) {
  FileSource src(path);
  return read_cache(src, options);
}

ContainerInfo read_file_info(const std::string& path, const DeserializeOptions& options) {
  FileSource src(path);
  return parse_header(src, options, ContainerKind::kCompressedCache, true).info;
}

CompressedKV::LayerData read_file_layer(const std::string& path, int layer, const DeserializeOptions& options) {
  FileSource src(path);
  return read_range(src, options, layer, 0, std::numeric_limits<int64_t>::max(), "read_file_layer");
}

}  // namespace e8kv::entropy
