// The error helpers and saturating size arithmetic every part of the container uses, and its
// byte reader and writer (include/e8kv/detail/byte_io.hpp; docs/format.md §1). Internal.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "e8kv/detail/byte_io.hpp"
#include "e8kv/error.hpp"

namespace e8kv::container::io {

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

/// The container's readers and writers: e8kv/detail/byte_io.hpp. Construct readers with
/// kPrefix, so that their failures read "container: ..." like io::fail's.
using detail::ByteReader;
using detail::ByteWriter;
inline constexpr const char* kPrefix = "container: ";

}  // namespace e8kv::container::io
