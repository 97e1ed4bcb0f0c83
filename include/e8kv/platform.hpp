// The one home of e8kv's platform macros (compiler, host/device, ISA dispatch). Every other
// header takes these from here and defines none of its own.
#pragma once

// ---- host and device -------------------------------------------------------------------------
#if defined(__CUDACC__)
/// Marks a function usable from host code and from CUDA device code. Under g++ it vanishes,
/// so the same definition is compiled and unit-tested on the CPU.
#define E8KV_HD __host__ __device__
/// 1 while nvcc compiles a translation unit (both its host and its device pass).
#define E8KV_DEVICE_CODE 1
#else
#define E8KV_HD
#define E8KV_DEVICE_CODE 0
#endif

/// 1 in nvcc's device pass only: code that must differ on the GPU (register arrays, intrinsics).
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

/// Full unrolling of fixed 8-element lane loops on the device (register arrays must be indexed
/// by constants there); host compilers unroll or vectorize them on their own.
#if E8KV_ON_DEVICE
#define E8KV_LANE_UNROLL _Pragma("unroll")
#else
#define E8KV_LANE_UNROLL
#endif

// ---- host vector code ------------------------------------------------------------------------
/// Host batches run on GCC/Clang vector extensions (GCC >= 9 for __builtin_convertvector).
/// Elsewhere, and under nvcc, batches loop over the single-block code.
#ifndef E8KV_HOST_VECTORS
#if !defined(__CUDACC__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 9))
#define E8KV_HOST_VECTORS 1
#else
#define E8KV_HOST_VECTORS 0
#endif
#endif

/// Vector batches with a copy compiled for AVX2 chosen at run time (x86 hosts).
#ifndef E8KV_X86_DISPATCH
#if E8KV_HOST_VECTORS && (defined(__x86_64__) || defined(__i386__))
#define E8KV_X86_DISPATCH 1
#else
#define E8KV_X86_DISPATCH 0
#endif
#endif

/// Host code on x86-64 with GCC or Clang, not under nvcc (its host pass gets the baseline
/// loops): hot loops get an AVX2 twin, picked per call (numeric/cpu_features.hpp).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define E8KV_HOST_AVX2_DISPATCH 1
/// An AVX2 twin of a loop: every call inside is inlined into it (flatten), so the whole body is
/// compiled for AVX2. No FMA: results stay bit-identical to the baseline build.
#define E8KV_TARGET_AVX2_FLAT __attribute__((target("avx2"), flatten, noinline))
/// An AVX2 + FMA twin, for loops whose reference itself is written with fused multiply-adds
/// (std::fma in the portable build), so the two builds still agree bit for bit.
#define E8KV_TARGET_AVX2_FMA_FLAT __attribute__((target("avx2,fma,f16c"), flatten, noinline))
#else
#define E8KV_HOST_AVX2_DISPATCH 0
#define E8KV_TARGET_AVX2_FLAT
#define E8KV_TARGET_AVX2_FMA_FLAT
#endif
/// The baseline twin, compiled the same way (flattened) so the two differ only in ISA.
#if defined(__GNUC__) || defined(__clang__)
#define E8KV_TARGET_BASE_FLAT __attribute__((flatten, noinline))
#else
#define E8KV_TARGET_BASE_FLAT
#endif
