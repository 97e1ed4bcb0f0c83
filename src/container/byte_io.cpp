// The container's failure path (src/container/byte_io.hpp).
#include "container/byte_io.hpp"

namespace e8kv::container::io {

void fail(const std::string& what) { throw Error("container: " + what); }

}  // namespace e8kv::container::io
