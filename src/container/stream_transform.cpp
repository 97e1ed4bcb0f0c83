// Stream transforms (docs/format.md §3): delta along rows (XOR or subtraction, per segment and
// column) and byte planes, forward and inverse.
#include "container/stream_transform.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "e8kv/error.hpp"

namespace e8kv::container {

namespace {

// A transform is an optional delta along rows (per segment, per column) followed by optional
// byte planes. Each step is a simple loop the compiler vectorizes; both steps together use one
// temporary buffer.

// XOR of W-byte little-endian integers is bytewise XOR, so the XOR delta works on bytes.
void xor_delta_forward(const StreamShape& s, const uint8_t* in, uint8_t* out) {
  const size_t row = static_cast<size_t>(s.cols) * static_cast<size_t>(s.width);
  size_t at = 0;
  for (int64_t rows : s.segment_rows) {
    const size_t n = static_cast<size_t>(rows) * row;
    if (n == 0) continue;
    std::memcpy(out + at, in + at, row);
    for (size_t i = at + row; i < at + n; ++i) out[i] = in[i] ^ in[i - row];
    at += n;
  }
}
void xor_delta_inverse(const StreamShape& s, const uint8_t* in, uint8_t* out) {
  const size_t row = static_cast<size_t>(s.cols) * static_cast<size_t>(s.width);
  size_t at = 0;
  for (int64_t rows : s.segment_rows) {
    const size_t n = static_cast<size_t>(rows) * row;
    if (n == 0) continue;
    std::memcpy(out + at, in + at, row);
    for (size_t r = at + row; r < at + n; r += row) {
      const uint8_t* prev = out + r - row;
      for (size_t i = 0; i < row; ++i) out[r + i] = in[r + i] ^ prev[i];
    }
    at += n;
  }
}

// Element-wise subtraction / addition modulo 2^(8W) on W-byte little-endian integers.
template <class U>
void sub_delta_typed(bool forward, const StreamShape& s, const uint8_t* in, uint8_t* out) {
  const size_t cols = static_cast<size_t>(s.cols);
  size_t at = 0;  // elements
  for (int64_t rows : s.segment_rows) {
    const size_t n = static_cast<size_t>(rows) * cols;
    if (n == 0) continue;
    std::memcpy(out + at * sizeof(U), in + at * sizeof(U), cols * sizeof(U));
    for (size_t r = at + cols; r < at + n; r += cols) {
      // forward: out = in[r] - in[r-1]; inverse: out = in[r] + out[r-1]
      const uint8_t* prev = forward ? in + (r - cols) * sizeof(U) : out + (r - cols) * sizeof(U);
      for (size_t c = 0; c < cols; ++c) {
        U x, p;
        std::memcpy(&x, in + (r + c) * sizeof(U), sizeof(U));
        std::memcpy(&p, prev + c * sizeof(U), sizeof(U));
        const U y = forward ? static_cast<U>(x - p) : static_cast<U>(x + p);
        std::memcpy(out + (r + c) * sizeof(U), &y, sizeof(U));
      }
    }
    at += n;
  }
}
void sub_delta_generic(bool forward, const StreamShape& s, const uint8_t* in, uint8_t* out) {
  const size_t w = static_cast<size_t>(s.width);
  const uint64_t mask = w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1;
  const size_t cols = static_cast<size_t>(s.cols);
  size_t at = 0;
  for (int64_t rows : s.segment_rows) {
    const size_t n = static_cast<size_t>(rows) * cols;
    if (n == 0) continue;
    std::memcpy(out + at * w, in + at * w, cols * w);
    for (size_t k = at + cols; k < at + n; ++k) {
      uint64_t x = 0, p = 0;
      std::memcpy(&x, in + k * w, w);  // little-endian host
      std::memcpy(&p, (forward ? in : out) + (k - cols) * w, w);
      const uint64_t y = (forward ? x - p : x + p) & mask;
      std::memcpy(out + k * w, &y, w);
    }
    at += n;
  }
}
void sub_delta(bool forward, const StreamShape& s, const uint8_t* in, uint8_t* out) {
  switch (s.width) {
    case 1: sub_delta_typed<uint8_t>(forward, s, in, out); break;
    case 2: sub_delta_typed<uint16_t>(forward, s, in, out); break;
    case 4: sub_delta_typed<uint32_t>(forward, s, in, out); break;
    case 8: sub_delta_typed<uint64_t>(forward, s, in, out); break;
    default: sub_delta_generic(forward, s, in, out); break;
  }
}

// Byte planes: plane b holds byte b of every element.
template <int W>
void planes_typed(bool forward, const uint8_t* in, uint8_t* out, size_t n) {
  for (size_t k = 0; k < n; ++k)
    for (int b = 0; b < W; ++b) {
      if (forward) out[static_cast<size_t>(b) * n + k] = in[k * W + static_cast<size_t>(b)];
      else out[k * W + static_cast<size_t>(b)] = in[static_cast<size_t>(b) * n + k];
    }
}
void planes(bool forward, int width, const uint8_t* in, uint8_t* out, size_t n) {
  switch (width) {
    case 2: planes_typed<2>(forward, in, out, n); break;
    case 3: planes_typed<3>(forward, in, out, n); break;
    case 4: planes_typed<4>(forward, in, out, n); break;
    default:
      for (size_t k = 0; k < n; ++k)
        for (int b = 0; b < width; ++b) {
          if (forward) out[static_cast<size_t>(b) * n + k] = in[k * static_cast<size_t>(width) + static_cast<size_t>(b)];
          else out[k * static_cast<size_t>(width) + static_cast<size_t>(b)] = in[static_cast<size_t>(b) * n + k];
        }
  }
}

void check_shape(const StreamShape& s, const char* where) {
  if (s.width < 1 || s.width > 8)
    throw Error(fmt::format("{}: StreamShape.width is {}; accepted: 1 .. 8", where, s.width));
  if (s.cols < 0) throw Error(fmt::format("{}: StreamShape.cols is {}; accepted: >= 0", where, s.cols));
  for (int64_t r : s.segment_rows)
    if (r < 0) throw Error(fmt::format("{}: StreamShape.segment_rows holds {}; accepted: >= 0", where, r));
}

template <bool Forward>
void run_transform(Transform t, const StreamShape& s, const uint8_t* in, uint8_t* out) {
  const int id = static_cast<int>(t);
  if (id < 0 || id >= kTransformCount) (void)transform_from_id(static_cast<uint32_t>(id));  // throws, naming the ids
  check_shape(s, Forward ? "transform_forward" : "transform_inverse");
  const size_t bytes = s.bytes();
  if (bytes == 0) return;
  const int delta = id >> 1;  // 0 none, 1 xor, 2 subtraction
  const bool shuffle = (id & 1) != 0 && s.width > 1;
  const size_t n = bytes / static_cast<size_t>(s.width);
  auto run_delta = [&](const uint8_t* src, uint8_t* dst) {
    if (delta == 1) {
      if (Forward) xor_delta_forward(s, src, dst);
      else xor_delta_inverse(s, src, dst);
    } else {
      sub_delta(Forward, s, src, dst);
    }
  };
  if (delta == 0 && !shuffle) {
    std::memcpy(out, in, bytes);
  } else if (delta == 0) {
    planes(Forward, s.width, in, out, n);
  } else if (!shuffle) {
    run_delta(in, out);
  } else {
    std::vector<uint8_t> tmp(bytes);
    if (Forward) {
      run_delta(in, tmp.data());
      planes(true, s.width, tmp.data(), out, n);
    } else {
      planes(false, s.width, in, tmp.data(), n);
      run_delta(tmp.data(), out);
    }
  }
}

}  // namespace

const char* to_string(Transform t) {
  switch (t) {
    case Transform::kNone: return "none";
    case Transform::kShuffle: return "shuffle";
    case Transform::kXorDelta: return "xor-delta";
    case Transform::kXorDeltaShuffle: return "xor-delta+shuffle";
    case Transform::kSubDelta: return "sub-delta";
    case Transform::kSubDeltaShuffle: return "sub-delta+shuffle";
  }
  return "?";
}

Transform transform_from_id(uint32_t id) {
  if (id >= static_cast<uint32_t>(kTransformCount))
    throw Error(fmt::format("transform id {} is unknown (accepted 0..5: none, shuffle, xor-delta, xor-delta+shuffle, "
                            "sub-delta, sub-delta+shuffle)",
                            id));
  return static_cast<Transform>(id);
}

size_t StreamShape::bytes() const {
  uint64_t rows = 0;
  for (int64_t r : segment_rows) rows += static_cast<uint64_t>(std::max<int64_t>(r, 0));
  return static_cast<size_t>(rows * static_cast<uint64_t>(std::max<int64_t>(cols, 0)) * static_cast<uint64_t>(std::max(width, 0)));
}

void transform_forward(Transform t, const StreamShape& shape, const uint8_t* in, uint8_t* out) {
  run_transform<true>(t, shape, in, out);
}
void transform_inverse(Transform t, const StreamShape& shape, const uint8_t* in, uint8_t* out) {
  run_transform<false>(t, shape, in, out);
}

}  // namespace e8kv::container
