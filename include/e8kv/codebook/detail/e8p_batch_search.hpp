// E8P's host batches: the certified class search on 4 or 8 blocks at once (lanes::Vector, AVX2
// chosen at run time), and encode_batch. Included by e8p.hpp.
#pragma once

#include "e8kv/codebook/detail/e8p_certified_search.hpp"

namespace e8kv::codebook::e8p_detail {

#if E8KV_HOST_VECTORS
// ---- host batches: the class search on W blocks at once ----------------------------------------
//
// The certified search of e8p_certified_search.hpp on lanes::Vector<W> (one block per lane;
// branch-free: c7 runs when any lane needs it). Its float estimates may round differently from
// the one-lane run, which does not matter: a certified lane returns the exact nearest codeword
// (the same index as every other route) and an uncertified lane takes the fast path +
// exhaustive search.
namespace vec {

/// The E8P kernel on W lanes (W = 4: 128-bit vectors, any SSE2/NEON host; W = 8: AVX2).
template <int W>
struct Kernel {
  typedef lanes::Vector<W> O;

  /// Encodes W blocks x[0..8W) (scaled by `scale`, then sanitized); writes index[0..count).
  static E8KV_FORCE_INLINE void encode(const float* x, float scale, uint32_t* index, int count = W) {
    typename O::F z[8];
    O::load_sanitized(x, scale, kMaxLatticeAbs, z);
    typename O::I key, low_bits;
    const typename O::I certified = CertifiedSearch<O>::run(z, key, low_bits);
    for (int k = 0; k < count; ++k) {
      if (O::lane(certified, k)) {
        index[k] = CertifiedSearch<O>::index_of(key, low_bits, k);
        continue;
      }
      float zk[8];
      for (int i = 0; i < 8; ++i) zk[i] = O::lane(z[i], k);
      if (!fast_path(zk, &index[k])) index[k] = search(zk);
    }
  }
};

/// Batches of any length for a W-lane kernel (Kernel<W>::encode takes W blocks, or fewer with a
/// count): whole groups of W in place, the tail through a zero-padded copy. Shared by the E8P and
/// E81B kernels, with their two builds: 128-bit vectors (every SSE2 / NEON host) and, on x86,
/// 256-bit AVX2 vectors chosen at run time (no FMA: the same results).
template <template <int> class Kernel>
struct BatchEncoder {
  template <int W>
  static E8KV_FORCE_INLINE void run(const float* x, float scale, size_t count, uint32_t* index) {
    size_t b = 0;
    for (; b + W <= count; b += W) Kernel<W>::encode(x + 8 * b, scale, index + b);
    if (b < count) {
      float tail[8 * W] = {};
      uint32_t tail_index[W];
      for (size_t k = 0; k < 8 * (count - b); ++k) tail[k] = x[8 * b + k];
      Kernel<W>::encode(tail, scale, tail_index, static_cast<int>(count - b));
      for (size_t k = 0; k < count - b; ++k) index[b + k] = tail_index[k];
    }
  }
  static void portable(const float* x, float scale, size_t count, uint32_t* index) { run<4>(x, scale, count, index); }
#if E8KV_X86_DISPATCH
  __attribute__((target("avx2"), noinline)) static void avx2(const float* x, float scale, size_t count, uint32_t* index) {
    run<8>(x, scale, count, index);
  }
#endif
  /// The AVX2 build where the CPU has it, else the portable one.
  static void host(const float* x, float scale, size_t count, uint32_t* index) {
#if E8KV_X86_DISPATCH
    if (cpu_has_avx2()) return avx2(x, scale, count, index);
#endif
    portable(x, scale, count, index);
  }
};

}  // namespace vec

/// E8P host batches: Batch::portable, Batch::avx2 (x86), Batch::host (run-time choice).
using Batch = vec::BatchEncoder<vec::Kernel>;
#endif  // E8KV_HOST_VECTORS

/// index[b] = exact nearest codeword of sanitize(fl(scale·x[8b + i])) for b < count.
E8KV_HD inline void encode_batch(const float* x, float scale, size_t count, uint32_t* index) {
#if E8KV_HOST_VECTORS && !E8KV_ON_DEVICE
  Batch::host(x, scale, count, index);
#else
  for (size_t b = 0; b < count; ++b) {
    float z[8];
    for (int i = 0; i < 8; ++i) z[i] = fp::sanitize(fp::mul(x[8 * b + i], scale), kMaxLatticeAbs);
    uint32_t result = 0;
    if (!certified_search(z, &result) && !fast_path(z, &result)) result = search(z);
    index[b] = result;
  }
#endif
}

}  // namespace e8kv::codebook::e8p_detail
