// Byte sources of the readers (src/container/source.hpp).
#include "container/source.hpp"

#include <fmt/format.h>

#include "container/byte_io.hpp"

namespace e8kv::container {

SpanSource::SpanSource(const uint8_t* data, size_t size) : data_(data), size_(size) {
  require(data != nullptr || size == 0, "deserialize: null data with a non-zero size");
}

FileSource::FileSource(const std::string& path) : path_(path), in_(path, std::ios::binary) {
  io::check(static_cast<bool>(in_), "cannot open '{}' for reading", path);
  in_.seekg(0, std::ios::end);
  const auto end = in_.tellg();
  io::check(end >= 0, "cannot determine the size of '{}'", path);
  size_ = static_cast<uint64_t>(end);
}

const uint8_t* FileSource::read(uint64_t offset, size_t n) {
  buf_.resize(n);  // n was checked against the file's size by the caller
  in_.clear();
  in_.seekg(static_cast<std::streamoff>(offset));
  in_.read(reinterpret_cast<char*>(buf_.data()), static_cast<std::streamsize>(n));
  io::check(in_ && static_cast<size_t>(in_.gcount()) == n, "reading {} bytes at offset {} of '{}' failed", n, offset,
            path_);
  return buf_.data();
}

}  // namespace e8kv::container
