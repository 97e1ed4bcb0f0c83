// zstd, as the container uses it: one frame per stream, with its content size, checked on the
// way in. Internal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace e8kv::container::zstd {

/// The most raw bytes one stored byte of a zstd frame can stand for. A block decodes to at most
/// 128 KiB (Block_Maximum_Size) and takes at least 4 bytes (a 3-byte header and one RLE byte), so
/// no frame expands more than 131072 / 4 = 32768 times. A header whose sizes claim more than
/// this from the bytes it has is lying, and is refused before anything is allocated for it.
inline constexpr uint64_t kMaxExpansion = 32768;

/// Whether `stored` bytes of zstd data can decode to `raw` bytes.
inline bool can_expand_to(uint64_t stored, uint64_t raw) {
  return raw / kMaxExpansion + (raw % kMaxExpansion != 0 ? 1 : 0) <= stored;  // raw <= stored · kMaxExpansion
}

/// Compression and decompression contexts, made on first use (one per encoder or decoder).
class Contexts {
 public:
  Contexts();
  ~Contexts();
  Contexts(const Contexts&) = delete;
  Contexts& operator=(const Contexts&) = delete;

  /// The largest frame compress() writes for n bytes.
  static size_t bound(size_t n);
  /// Compresses src[0, n) into dst[0, cap) (cap >= bound(n)) as one frame that records its
  /// content size; returns the frame's size.
  size_t compress(int level, const uint8_t* src, size_t n, uint8_t* dst, size_t cap);
  /// Decodes `frame` (`stored` bytes) into dst[0, raw). Fails (e8kv::Error naming `where`) unless
  /// it is exactly one frame whose content size is raw and which decodes to exactly raw bytes.
  void decompress(const uint8_t* frame, size_t stored, uint8_t* dst, size_t raw, const std::string& where);

 private:
  struct CctxFree {
    void operator()(ZSTD_CCtx_s* c) const;
  };
  struct DctxFree {
    void operator()(ZSTD_DCtx_s* c) const;
  };
  std::unique_ptr<ZSTD_CCtx_s, CctxFree> c_;
  std::unique_ptr<ZSTD_DCtx_s, DctxFree> d_;
};

}  // namespace e8kv::container::zstd
