// Little-endian byte writer and bounds-checked reader of untrusted bytes, the one byte layer of
// every format e8kv writes or parses: the container (src/container/), the store's envelope and
// keys (src/store/) and the llama.cpp adapter's sequence states (integrations/llama.cpp/). Not a
// stable API: installed only because the adapter library builds on it (out-of-line parts in
// libe8kv, src/detail/byte_io.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "e8kv reads and writes little-endian fields with memcpy of host integers: a little-endian host is required"
#endif

namespace e8kv::detail {

/// Appends little-endian fields to a byte vector.
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
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  void bytes(const std::vector<uint8_t>& b) { buf_.insert(buf_.end(), b.begin(), b.end()); }
  size_t size() const { return buf_.size(); }

 private:
  std::vector<uint8_t>& buf_;
};

/// Reads little-endian fields from [data, data + size); every read is checked against what is
/// left. Failures throw e8kv::Error(prefix + ...) naming the part being read (`what`), the field
/// and the offset: "<prefix><what> is truncated: field 'F' needs K bytes at offset O, only L left",
/// or fail(msg): "<prefix><what>: msg (at byte O of N)".
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, std::string what, const char* prefix = "")
      : p_(data), n_(size), what_(std::move(what)), prefix_(prefix) {}
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
  /// The next n bytes (checked), then skips them.
  const uint8_t* take(uint64_t n, const char* field) {
    need(n, field);
    const uint8_t* p = p_ + off_;
    off_ += static_cast<size_t>(n);
    return p;
  }
  /// Copies the next n bytes (checked) into out.
  void bytes(std::vector<uint8_t>& out, uint64_t n, const char* field) {
    const uint8_t* p = take(n, field);
    out.assign(p, p + n);
  }
  void skip(uint64_t n, const char* field) { take(n, field); }
  /// rows × row_bytes, failing on overflow (the read that follows checks it against what is left).
  uint64_t product(uint64_t rows, uint64_t row_bytes, const char* field) const;
  size_t offset() const { return off_; }
  size_t remaining() const { return n_ - off_; }
  /// Fails unless k more bytes are left.
  void need(uint64_t k, const char* field) const {
    if (k > n_ - off_) truncated(k, field);
  }
  [[noreturn]] void fail(const std::string& msg) const;

 private:
  [[noreturn]] void truncated(uint64_t k, const char* field) const;

  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
  std::string what_;
  const char* prefix_;
};

}  // namespace e8kv::detail
