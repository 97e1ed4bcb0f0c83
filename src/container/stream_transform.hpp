// The reversible, size-preserving transforms a stream gets before zstd (docs/format.md §3):
// an optional delta along rows followed by optional byte planes. Internal to the library; the
// public header names the transforms (Transform, StreamTransforms) for ContainerOptions only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "e8kv/container/container.hpp"

namespace e8kv::container {

/// Shape of one stream for the transforms: a sequence of segments (one per head or position
/// set) of rows (tokens) × cols elements of `width` bytes (little-endian integers).
struct StreamShape {
  std::vector<int64_t> segment_rows;  ///< rows of each segment; delta restarts at each segment
  int64_t cols = 0;                   ///< elements per row
  int width = 1;                      ///< bytes per element: 1..8
  /// Total bytes: sum(segment_rows) · cols · width.
  size_t bytes() const;
};

/// out = T(in) and in = T⁻¹(out); in and out must not overlap and hold shape.bytes() bytes.
/// Every byte string of the right length is valid input for both directions. Throws
/// e8kv::Error for an unknown transform id or a bad shape.
void transform_forward(Transform t, const StreamShape& shape, const uint8_t* in, uint8_t* out);
void transform_inverse(Transform t, const StreamShape& shape, const uint8_t* in, uint8_t* out);

}  // namespace e8kv::container
