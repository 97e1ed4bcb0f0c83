// Run-time choice between the baseline x86-64 build of a host loop and a copy compiled for AVX2.
// The baseline build flags stay portable; hot loops get an AVX2 twin, picked per call.
#pragma once

#include <atomic>

#include "e8kv/platform.hpp"
#if E8KV_HOST_AVX2_DISPATCH
#include <cpuid.h>
#endif


// The twin macros (E8KV_TARGET_*_FLAT, E8KV_HOST_AVX2_DISPATCH) live in e8kv/platform.hpp.

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

/// True when AVX2, FMA and F16C code may run here (computed once) and the baseline build is not
/// forced: the twins marked E8KV_TARGET_AVX2_FMA_FLAT.
inline bool cpu_has_avx2_fma() {
#if E8KV_HOST_AVX2_DISPATCH
  static const bool has = [] {
    __builtin_cpu_init();
    // F16C through cpuid: clang 14's __builtin_cpu_supports does not know "f16c".
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0 && f16c;
  }();
  return has && !detail::baseline_isa_forced().load(std::memory_order_relaxed);
#else
  return false;
#endif
}

}  // namespace e8kv
