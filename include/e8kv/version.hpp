// The single source of the library version; CMake parses these three lines.
#pragma once

#define E8KV_VERSION_MAJOR 0
#define E8KV_VERSION_MINOR 1
#define E8KV_VERSION_PATCH 0

#define E8KV_VERSION_STRING_IMPL2(a, b, c) #a "." #b "." #c
#define E8KV_VERSION_STRING_IMPL(a, b, c) E8KV_VERSION_STRING_IMPL2(a, b, c)
#define E8KV_VERSION_STRING \
  E8KV_VERSION_STRING_IMPL(E8KV_VERSION_MAJOR, E8KV_VERSION_MINOR, E8KV_VERSION_PATCH)

namespace e8kv {
/// Packed as major * 10000 + minor * 100 + patch (written into containers).
inline constexpr int kVersion =
    E8KV_VERSION_MAJOR * 10000 + E8KV_VERSION_MINOR * 100 + E8KV_VERSION_PATCH;
}  // namespace e8kv
