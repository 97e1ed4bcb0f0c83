// Argument checks whose messages are formatted with fmt only on failure. Internal: the public
// e8kv::require (include/e8kv/error.hpp) takes a built message and must not depend on fmt.
#pragma once

#include <fmt/format.h>

#include <utility>

#include "e8kv/error.hpp"

namespace e8kv::detail {

/// Throws e8kv::Error(fmt::format(format, args...)) unless ok; the message is formatted only on
/// failure, so a check on a hot path costs the test alone.
template <class... Args>
void require(bool ok, fmt::format_string<Args...> format, Args&&... args) {
  if (!ok) throw Error(fmt::format(format, std::forward<Args>(args)...));
}

/// Always throws e8kv::Error(fmt::format(format, args...)).
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace e8kv::detail
