// Run-time choice between the baseline x86-64 build of a host loop and a copy compiled for AVX2.
// The baseline build flags stay portable; hot loops get an AVX2 twin, picked per call.
#pragma once

#include <atomic>

#include "e8kv/config.hpp"

// Host code on x86-64 with GCC or Clang, not under nvcc (its host pass gets the baseline loops).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define E8KV_HOST_AVX2_DISPATCH 1
/// An AVX2 twin of a loop: every call inside is inlined into it (flatten), so the whole body is
/// compiled for AVX2. No FMA: results stay bit-identical to the baseline build.
#define E8KV_TARGET_AVX2_FLAT __attribute__((target("avx2"), flatten, noinline))
#else
#define E8KV_HOST_AVX2_DISPATCH 0
#define E8KV_TARGET_AVX2_FLAT
#endif
/// The baseline twin, compiled the same way (flattened) so the two differ only in ISA.
#if defined(__GNUC__) || defined(__clang__)
#define E8KV_TARGET_BASE_FLAT __attribute__((flatten, noinline))
#else
#define E8KV_TARGET_BASE_FLAT
#endif

namespace e8kv {

namespace detail {
inline std::atomic<bool>& baseline_isa_forced() {
  static std::atomic<bool> forced{false};
  return forced;
}
}  // namespace detail

/// Makes every run-time ISA choice take the baseline build (true) or the best one (false, the
/// default). For tests that check the two builds agree bit for bit, and for A/B benchmarks.
inline void force_baseline_isa(bool on) { detail::baseline_isa_forced().store(on, std::memory_order_relaxed); }

/// True when AVX2 code may run here (CPU and OS support, computed once) and the baseline build
/// is not forced.
inline bool cpu_has_avx2() {
#if E8KV_HOST_AVX2_DISPATCH
  static const bool has = [] {
    __builtin_cpu_init();  // needed when the first call comes from a static initializer
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has && !detail::baseline_isa_forced().load(std::memory_order_relaxed);
#else
  return false;
#endif
}

}  // namespace e8kv
