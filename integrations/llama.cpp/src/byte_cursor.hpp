// Little-endian byte cursors for the adapter's formats (llama.cpp state bytes and the compressed
// state's header): every read is checked against the bytes left, every failure names the field,
// the offset and the format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "e8kv/error.hpp"

namespace e8kv::llama_cpp::detail {

class ByteReader {
 public:
  ByteReader(const uint8_t* p, size_t n, const char* format) : p_(p), n_(n), format_(format) {}
  size_t offset() const { return off_; }
  size_t left() const { return n_ - off_; }
  const uint8_t* here() const { return p_ + off_; }
  template <class T>
  T scalar(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + off_, sizeof(T));
    off_ += sizeof(T);
    return v;
  }
  void bytes(std::vector<uint8_t>& out, uint64_t count, const char* what) {
    need(count, what);
    out.assign(p_ + off_, p_ + off_ + count);
    off_ += static_cast<size_t>(count);
  }
  void skip(uint64_t count, const char* what) {
    need(count, what);
    off_ += static_cast<size_t>(count);
  }
  /// rows × row_bytes, failing on overflow (the read that follows checks it against what is left).
  uint64_t product(uint64_t rows, uint64_t row_bytes, const char* what) const {
    if (row_bytes != 0 && rows > std::numeric_limits<uint64_t>::max() / row_bytes)
      fail(std::string(what) + ": size overflows");
    return rows * row_bytes;
  }
  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(std::string(format_) + ": " + msg + " (at byte " + std::to_string(off_) + " of " +
                std::to_string(n_) + ")");
  }

 private:
  void need(uint64_t count, const char* what) const {
    if (count > left())
      fail(std::string("truncated: ") + what + " needs " + std::to_string(count) + " bytes, " +
           std::to_string(left()) + " left");
  }
  const uint8_t* p_;
  size_t n_;
  const char* format_;
  size_t off_ = 0;
};

struct ByteWriter {
  template <class T>
  void scalar(T v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), b, b + sizeof(T));
  }
  void bytes(const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); }
  void bytes(const std::vector<uint8_t>& b) { out.insert(out.end(), b.begin(), b.end()); }
  std::vector<uint8_t> out;
};

}  // namespace e8kv::llama_cpp::detail
