// Fixed-width bit packing of indices (any width 1..32) into a little-endian bit stream.
//
// Stream layout: index i occupies bits [i·w, (i+1)·w) of the stream, where bit k of the stream
// is bit (k mod 8) of byte k/8 and bit 0 is the least significant bit of byte 0. Within an
// index, its least significant bit comes first. The stream of `count` indices is exactly
// packed_bytes(count, w) = ceil(count·w / 8) bytes; unused high bits of the last byte are 0.
//
// Reads never go past packed_bytes(count, w) bytes: unpack_one(in, i, w) touches only the
// bytes holding bits [i·w, (i+1)·w), and the bulk reader takes 8-byte words only while 8 whole
// bytes remain inside the stream, falling back to single bytes for the tail.
//
// Values wider than `width` bits: pack_bits keeps the low `width` bits (defined, never UB).
// Host code that wants an error instead calls pack_bits_checked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "e8kv/platform.hpp"
#include "e8kv/error.hpp"

namespace e8kv::pack {

/// Bytes needed for `count` indices of `width` bits: ceil(count·width / 8).
E8KV_HD constexpr size_t packed_bytes(size_t count, int width) {
  return (count * static_cast<size_t>(width) + 7) / 8;
}

namespace detail {

/// Mask of the low `width` bits, for width in [1, 32] (64-bit so width 32 needs no special case).
E8KV_HD E8KV_FORCE_INLINE uint64_t low_mask(int width) { return (uint64_t{1} << width) - 1; }

/// Little-endian 64-bit load of 8 bytes at p (p must have 8 readable bytes). The host uses an
/// unaligned memcpy load; the device (no unaligned 64-bit loads) and big-endian hosts use bytes.
E8KV_HD E8KV_FORCE_INLINE uint64_t load_le64(const uint8_t* p) {
#if !E8KV_ON_DEVICE && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
#else
  uint64_t v = 0;
  for (int k = 0; k < 8; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
  return v;
#endif
}

/// Little-endian 32-bit store of v into 4 bytes at p. Byte stores: compilers merge them into
/// one store on little-endian hosts, and they are valid for any alignment on the device.
E8KV_HD E8KV_FORCE_INLINE void store_le32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}

/// Byte-aligned widths (8, 16, 32): plain little-endian byte copies, which compilers vectorize.
template <int Bytes>
E8KV_HD E8KV_FORCE_INLINE void pack_aligned(const uint32_t* values, size_t count, uint8_t* out) {
  for (size_t i = 0; i < count; ++i)
    for (int k = 0; k < Bytes; ++k) out[Bytes * i + k] = static_cast<uint8_t>(values[i] >> (8 * k));
}
template <int Bytes>
E8KV_HD E8KV_FORCE_INLINE void unpack_aligned(const uint8_t* in, size_t count, uint32_t* out) {
  for (size_t i = 0; i < count; ++i) {
    uint32_t v = 0;
    for (int k = 0; k < Bytes; ++k) v |= static_cast<uint32_t>(in[Bytes * i + k]) << (8 * k);
    out[i] = v;
  }
}

}  // namespace detail

/// Packs `count` indices of `width` bits (width in [1, 32]) into out[0, packed_bytes(count, width)).
/// Only the low `width` bits of each value are stored. Writes exactly packed_bytes bytes and no
/// more (the unused high bits of the last byte are zero). A width outside [1, 32] writes nothing;
/// host callers that need validation use pack_bits_checked.
E8KV_HD inline void pack_bits(const uint32_t* values, size_t count, int width, uint8_t* out) {
  if (width < 1 || width > 32) return;
  if (width == 8) return detail::pack_aligned<1>(values, count, out);
  if (width == 16) return detail::pack_aligned<2>(values, count, out);
  if (width == 32) return detail::pack_aligned<4>(values, count, out);
  const uint64_t mask = detail::low_mask(width);
  const size_t total = packed_bytes(count, width);
  uint64_t acc = 0;  // pending bits, LSB first: fewer than 32 between iterations
  int pending = 0;
  size_t pos = 0;
  for (size_t i = 0; i < count; ++i) {
    acc |= (static_cast<uint64_t>(values[i]) & mask) << pending;  // pending + width <= 63
    pending += width;
    // 4 complete bytes lie inside the stream by construction; the explicit bound only lets
    // compilers see that (no -Warray-bounds false positives on small fixed buffers).
    if (pending >= 32 && pos + 4 <= total) {
      detail::store_le32(out + pos, static_cast<uint32_t>(acc));
      pos += 4;
      acc >>= 32;
      pending -= 32;
    }
  }
  while (pending > 0) {  // the tail: fewer than 32 bits
    out[pos++] = static_cast<uint8_t>(acc);
    acc >>= 8;
    pending -= 8;
  }
}

/// Index i of a stream of `width`-bit indices (width in [1, 32]); touches only the bytes that
/// hold bits [i·width, (i+1)·width). Returns 0 for a width outside [1, 32].
E8KV_HD inline uint32_t unpack_one(const uint8_t* in, size_t i, int width) {
  if (width < 1 || width > 32) return 0;
  const size_t bit = i * static_cast<size_t>(width);
  const size_t byte = bit / 8;
  const int shift = static_cast<int>(bit % 8);
  const int nbytes = (shift + width + 7) / 8;  // 1..5
  uint64_t v = 0;
  for (int k = 0; k < nbytes; ++k) v |= static_cast<uint64_t>(in[byte + k]) << (8 * k);
  return static_cast<uint32_t>((v >> shift) & detail::low_mask(width));
}

/// Unpacks `count` indices of `width` bits (width in [1, 32]) from in[0, packed_bytes(count, width)).
/// A width outside [1, 32] writes nothing.
E8KV_HD inline void unpack_bits(const uint8_t* in, size_t count, int width, uint32_t* out) {
  if (width < 1 || width > 32) return;
  if (width == 8) return detail::unpack_aligned<1>(in, count, out);
  if (width == 16) return detail::unpack_aligned<2>(in, count, out);
  if (width == 32) return detail::unpack_aligned<4>(in, count, out);
  const uint64_t mask = detail::low_mask(width);
  const size_t total = packed_bytes(count, width);
  size_t i = 0;
  // Fast path: one unaligned 8-byte load per index while the load stays inside the stream.
  // shift (< 8) + width (<= 32) <= 39 bits, all inside the 64 loaded.
  for (; i < count; ++i) {
    const size_t bit = i * static_cast<size_t>(width);
    const size_t byte = bit / 8;
    if (byte + 8 > total) break;
    out[i] = static_cast<uint32_t>((detail::load_le64(in + byte) >> (bit % 8)) & mask);
  }
  for (; i < count; ++i) out[i] = unpack_one(in, i, width);
}

/// Host wrapper of pack_bits that validates its arguments: throws e8kv::Error when width is
/// outside [1, 32], when a pointer is null with count > 0, or when a value does not fit in
/// `width` bits (naming the first such index). Nothing is written when it throws.
inline void pack_bits_checked(const uint32_t* values, size_t count, int width, uint8_t* out) {
  require(width >= 1 && width <= 32,
          "pack_bits: width must be in [1, 32], got " + std::to_string(width));
  if (count == 0) return;
  require(values != nullptr && out != nullptr, "pack_bits: values and out must be non-null when count > 0");
  if (width < 32) {
    const uint32_t limit = uint32_t{1} << width;
    for (size_t i = 0; i < count; ++i)
      if (values[i] >= limit)
        throw Error("pack_bits: values[" + std::to_string(i) + "] = " + std::to_string(values[i]) +
                    " does not fit in width " + std::to_string(width) + " bits (must be < " + std::to_string(limit) +
                    ")");
  }
  pack_bits(values, count, width, out);
}

/// Host wrapper of unpack_bits: throws e8kv::Error when width is outside [1, 32] or a pointer
/// is null with count > 0.
inline void unpack_bits_checked(const uint8_t* in, size_t count, int width, uint32_t* out) {
  require(width >= 1 && width <= 32,
          "unpack_bits: width must be in [1, 32], got " + std::to_string(width));
  if (count == 0) return;
  require(in != nullptr && out != nullptr, "unpack_bits: in and out must be non-null when count > 0");
  unpack_bits(in, count, width, out);
}

}  // namespace e8kv::pack
