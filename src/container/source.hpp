// Where a reader's bytes come from: memory, or a file read piece by piece (a partial read of a
// file touches only the header and the chunks it needs). Internal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace e8kv::container {

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
  SpanSource(const uint8_t* data, size_t size);
  uint64_t size() const override { return size_; }
  const uint8_t* read(uint64_t offset, size_t) override { return data_ + offset; }

 private:
  const uint8_t* data_;
  size_t size_;
};

class FileSource final : public Source {
 public:
  explicit FileSource(const std::string& path);
  uint64_t size() const override { return size_; }
  const uint8_t* read(uint64_t offset, size_t n) override;

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
  std::vector<uint8_t> buf_;
};

}  // namespace e8kv::container
