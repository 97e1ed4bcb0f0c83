// zstd frames of the container's streams (src/container/zstd_frame.hpp).
#include "container/zstd_frame.hpp"

#include <zstd.h>

#include "container/byte_io.hpp"

namespace e8kv::container::zstd {

void Contexts::CctxFree::operator()(ZSTD_CCtx_s* c) const { ZSTD_freeCCtx(c); }
void Contexts::DctxFree::operator()(ZSTD_DCtx_s* c) const { ZSTD_freeDCtx(c); }

Contexts::Contexts() = default;
Contexts::~Contexts() = default;

size_t Contexts::bound(size_t n) { return ZSTD_compressBound(n); }

size_t Contexts::compress(int level, const uint8_t* src, size_t n, uint8_t* dst, size_t cap) {
  if (!c_) c_.reset(ZSTD_createCCtx());
  io::check(c_ != nullptr, "zstd could not allocate a compression context");
  const size_t z = ZSTD_compressCCtx(c_.get(), dst, cap, src, n, level);
  if (ZSTD_isError(z)) io::fail(fmt::format("zstd compression failed: {}", ZSTD_getErrorName(z)));
  return z;
}

void Contexts::decompress(const uint8_t* frame, size_t stored, uint8_t* dst, size_t raw, const std::string& where) {
  const unsigned long long content = ZSTD_getFrameContentSize(frame, stored);
  io::check(content == raw, "{}: the zstd frame's content size does not match {} raw bytes", where, raw);
  const size_t frame_bytes = ZSTD_findFrameCompressedSize(frame, stored);
  io::check(!ZSTD_isError(frame_bytes) && frame_bytes == stored, "{}: the zstd data is not exactly one frame", where);
  if (!d_) d_.reset(ZSTD_createDCtx());
  io::check(d_ != nullptr, "zstd could not allocate a decompression context");
  const size_t got = ZSTD_decompressDCtx(d_.get(), dst, raw, frame, stored);
  if (ZSTD_isError(got)) io::fail(fmt::format("{}: zstd decompression failed: {}", where, ZSTD_getErrorName(got)));
  io::check(got == raw, "{}: zstd decompression gave {} bytes, not {}", where, got, raw);
}

}  // namespace e8kv::container::zstd
