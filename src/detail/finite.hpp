// Finiteness checks of host inputs, shared by every API that rejects NaN and Inf.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace e8kv::detail {

/// Index of the first NaN or ±Inf in x[0..n), or n when every value is finite. The common case
/// (all finite) is one pass of exponent bit tests, which vectorizes; only a hit pays the search.
inline size_t first_non_finite(const float* x, size_t n) {
  uint32_t special = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &x[i], 4);
    special |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
  }
  if (special == 0) return n;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &x[i], 4);
    if ((b & 0x7f800000u) == 0x7f800000u) return i;
  }
  return n;
}

}  // namespace e8kv::detail
