// Out-of-line failure paths of the byte reader (src/container/byte_io.hpp).
#include "container/byte_io.hpp"

namespace e8kv::entropy::io {

void fail(const std::string& what) { throw Error("container: " + what); }

void ByteReader::truncated(size_t k, const char* field) const {
  fail(fmt::format("{} is truncated: field '{}' needs {} bytes at offset {}, only {} left", what_, field, k, off_,
                   n_ - off_));
}

}  // namespace e8kv::entropy::io
