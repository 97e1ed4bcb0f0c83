// Out-of-line failure paths of the byte reader (include/e8kv/detail/byte_io.hpp).
#include "e8kv/detail/byte_io.hpp"

#include <fmt/format.h>

#include <limits>

#include "e8kv/error.hpp"

namespace e8kv::detail {

uint64_t ByteReader::product(uint64_t rows, uint64_t row_bytes, const char* field) const {
  if (row_bytes != 0 && rows > std::numeric_limits<uint64_t>::max() / row_bytes)
    fail(fmt::format("the size of field '{}' ({} x {} bytes) overflows", field, rows, row_bytes));
  return rows * row_bytes;
}

void ByteReader::fail(const std::string& msg) const {
  throw Error(fmt::format("{}{}: {} (at byte {} of {})", prefix_, what_, msg, off_, n_));
}

void ByteReader::truncated(uint64_t k, const char* field) const {
  throw Error(fmt::format("{}{} is truncated: field '{}' needs {} bytes at offset {}, only {} left", prefix_, what_,
                          field, k, off_, n_ - off_));
}

}  // namespace e8kv::detail
