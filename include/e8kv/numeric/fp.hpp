// Floating-point building blocks whose results are identical on the CPU and the GPU:
// round-half-to-even and multiply/add that the compiler may not contract into FMA.
#pragma once

#include <cmath>

#include "e8kv/platform.hpp"

namespace e8kv::fp {

/// Round to the nearest integer, ties to even, for |x| < 2^23 (float) / 2^52 (double);
/// larger magnitudes are already integers and are returned unchanged. Branch-free on the
/// host (adding and subtracting 2^23 uses the FPU's round-to-nearest-even), rint on device.
/// The sign of a zero result is not specified.
E8KV_HD E8KV_FORCE_INLINE float round_half_even(float x) {
#if E8KV_ON_DEVICE
  return rintf(x);
#else
  const float big = 8388608.0f;  // 2^23
  const float t = std::copysign(big, x);
  const float r = (x + t) - t;
  return std::fabs(x) < big ? r : x;
#endif
}

E8KV_HD E8KV_FORCE_INLINE double round_half_even(double x) {
#if E8KV_ON_DEVICE
  return rint(x);
#else
  const double big = 4503599627370496.0;  // 2^52
  const double t = std::copysign(big, x);
  const double r = (x + t) - t;
  return std::fabs(x) < big ? r : x;
#endif
}

/// a*b rounded once, never fused with a following add (so CPU and GPU agree bit for bit).
E8KV_HD E8KV_FORCE_INLINE float mul(float a, float b) {
#if E8KV_ON_DEVICE
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
E8KV_HD E8KV_FORCE_INLINE double mul(double a, double b) {
#if E8KV_ON_DEVICE
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

/// a+b rounded once, never fused with a preceding multiply.
E8KV_HD E8KV_FORCE_INLINE float add(float a, float b) {
#if E8KV_ON_DEVICE
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
E8KV_HD E8KV_FORCE_INLINE double add(double a, double b) {
#if E8KV_ON_DEVICE
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

/// Clamp into [-limit, limit]; NaN maps to 0. Used to give non-finite input a defined result.
template <class T>
E8KV_HD E8KV_FORCE_INLINE T sanitize(T x, T limit) {
  if (!(x == x)) return T(0);
  return x > limit ? limit : (x < -limit ? -limit : x);
}

}  // namespace e8kv::fp
