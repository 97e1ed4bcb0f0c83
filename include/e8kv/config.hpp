// Compilation environment: the host+device annotation used by all pure-math headers.
#pragma once

#if defined(__CUDACC__)
/// Marks a function usable from host code and from CUDA device code. Under g++ it vanishes,
/// so the same definition is compiled and unit-tested on the CPU.
#define E8KV_HD __host__ __device__
#define E8KV_DEVICE_CODE 1
#else
#define E8KV_HD
#define E8KV_DEVICE_CODE 0
#endif

#if defined(__CUDA_ARCH__)
#define E8KV_ON_DEVICE 1
#else
#define E8KV_ON_DEVICE 0
#endif

#if defined(_MSC_VER)
#define E8KV_FORCE_INLINE __forceinline
#else
#define E8KV_FORCE_INLINE inline __attribute__((always_inline))
#endif
