// Deprecated: the container moved to e8kv/container/checksum.hpp, namespace e8kv::container. This
// header, and the namespace alias e8kv::entropy, remain for one release so that code written
// against 0.1 still builds; they go in the next.
#pragma once

#include "e8kv/container/checksum.hpp"

namespace e8kv {
namespace entropy = container;
}  // namespace e8kv
