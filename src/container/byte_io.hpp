// Little-endian byte writer and bounds-checked reader of the container (docs/format.md §1), plus
// the error helpers and saturating size arithmetic every part of the container uses. Internal.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "e8kv/error.hpp"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "e8kv containers are written with memcpy of host integers: a little-endian host is required"
#endif

namespace e8kv::entropy::io {

/// Throws e8kv::Error("container: " + what).
[[noreturn]] void fail(const std::string& what);
/// fail(what) unless ok. `what` is built by the caller: use on per-container paths, not per
/// element (test first there, then format the message).
inline void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
}
/// fail(fmt::format(...)) unless ok; the message is formatted only on failure.
template <class... Args>
void check(bool ok, fmt::format_string<Args...> format, Args&&... args) {
  if (!ok) fail(fmt::format(format, std::forward<Args>(args)...));
}

/// Saturating arithmetic for sizes computed from untrusted counts.
inline uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
inline uint64_t sat_mul(uint64_t a, uint64_t b) { return (a != 0 && b > UINT64_MAX / a) ? UINT64_MAX : a * b; }

template <class T>
void store_at(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <class T>
T load_at(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

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
  size_t size() const { return buf_.size(); }

 private:
  std::vector<uint8_t>& buf_;
};

/// Reads little-endian fields from [data, data + size); every read is checked against what is
/// left, and a short input fails naming the field (`what` names the part being read).
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
  /// The next n bytes (checked), then skips them.
  const uint8_t* take(size_t n, const char* field) {
    need(n, field);
    const uint8_t* p = p_ + off_;
    off_ += n;
    return p;
  }
  size_t offset() const { return off_; }
  size_t remaining() const { return n_ - off_; }
  /// Fails unless k more bytes are left.
  void need(size_t k, const char* field) const {
    if (k > n_ - off_) truncated(k, field);
  }

 private:
  [[noreturn]] void truncated(size_t k, const char* field) const;

  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
  std::string what_;
};

}  // namespace e8kv::entropy::io
