// Library identity, compiled into e8kv so consumers can check which build they linked.
#include "e8kv/version.hpp"

namespace e8kv {
const char* version_string() { return E8KV_VERSION_STRING; }
}  // namespace e8kv
