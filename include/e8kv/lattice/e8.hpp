// Nearest point of the lattices D8 and E8 = D8 ∪ (D8 + ½·1) (Conway & Sloane, 1982).
//
// Tie rules (fixed, shared by CPU and GPU so codes are byte-identical):
//   * coordinates round half to even;
//   * the parity repair moves the coordinate farthest from an integer; the first such
//     index wins a tie; a coordinate with zero rounding error is moved by +1;
//   * when both cosets are equally close, the integer coset (D8) wins.
// Squared distances are summed in index order with unfused multiply/add.
//
// Non-finite or huge input: every coordinate is first clamped to ±kMaxAbs (NaN becomes 0),
// and the result is the nearest lattice point to that clamped vector. This is defined,
// documented behaviour; callers that must reject such input check it themselves.
#pragma once

#include <cstdint>

#include "e8kv/platform.hpp"
#include "e8kv/numeric/fp.hpp"

namespace e8kv::lattice {

template <class T>
struct LatticeLimits;
template <>
struct LatticeLimits<float> {
  /// Inputs are clamped to ±kMaxAbs: far below 2^23, so x - round(x) stays exact.
  static constexpr float kMaxAbs = 1048576.0f;  // 2^20
};
template <>
struct LatticeLimits<double> {
  static constexpr double kMaxAbs = 1099511627776.0;  // 2^40
};

namespace detail {

/// Nearest point of D8 to x (already sanitized), written as integers. Returns nothing;
/// r receives the point. Shared by the D8 and both E8 cosets.
template <class T>
E8KV_HD E8KV_FORCE_INLINE void nearest_d8_int(const T x[8], int64_t r[8]) {
  int64_t parity = 0;
  T best_abs = T(-1);
  int best = 0;
  T best_delta = T(0);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 8; ++i) {
    const T ri = fp::round_half_even(x[i]);
    const T d = x[i] - ri;
    const T a = d < T(0) ? -d : d;
    r[i] = static_cast<int64_t>(ri);
    parity += r[i];
    if (a > best_abs) {  // strict: the first index wins a tie
      best_abs = a;
      best = i;
      best_delta = d;
    }
  }
  const int64_t repair = (parity & 1) ? ((best_delta >= T(0)) ? 1 : -1) : 0;
#if defined(__CUDA_ARCH__)
  // A select per coordinate: r[best] with a run-time index would put r in local memory.
#pragma unroll
  for (int i = 0; i < 8; ++i) r[i] += i == best ? repair : 0;
#else
  r[best] += repair;
#endif
}

template <class T>
E8KV_HD E8KV_FORCE_INLINE T squared_distance_twice(const T x[8], const int64_t twice_y[8]) {
  T acc = T(0);
  for (int i = 0; i < 8; ++i) {
    const T d = x[i] - static_cast<T>(twice_y[i]) * T(0.5);
    acc = fp::add(acc, fp::mul(d, d));
  }
  return acc;
}

}  // namespace detail

/// Nearest point of D8 = {z ∈ Z^8 : Σz even}.
template <class T>
E8KV_HD inline void nearest_d8(const T x[8], T y[8]) {
  T xs[8];
  for (int i = 0; i < 8; ++i) xs[i] = fp::sanitize(x[i], LatticeLimits<T>::kMaxAbs);
  int64_t r[8];
  detail::nearest_d8_int(xs, r);
  for (int i = 0; i < 8; ++i) y[i] = static_cast<T>(r[i]);
}

/// Nearest point of E8, returned as twice its coordinates (all even for the integer
/// coset, all odd for the half-integer coset). Returns the coset: 0 = D8, 1 = D8 + ½.
template <class T>
E8KV_HD inline int nearest_e8_twice(const T x[8], int64_t twice_y[8]) {
  T xs[8], xh[8];
  for (int i = 0; i < 8; ++i) {
    xs[i] = fp::sanitize(x[i], LatticeLimits<T>::kMaxAbs);
    xh[i] = xs[i] - T(0.5);
  }
  int64_t a[8], b[8];
  detail::nearest_d8_int(xs, a);
  detail::nearest_d8_int(xh, b);
  for (int i = 0; i < 8; ++i) {
    a[i] *= 2;
    b[i] = 2 * b[i] + 1;
  }
  const T da = detail::squared_distance_twice(xs, a);
  const T db = detail::squared_distance_twice(xs, b);
  const bool integer_wins = !(db < da);  // tie -> integer coset
  for (int i = 0; i < 8; ++i) twice_y[i] = integer_wins ? a[i] : b[i];
  return integer_wins ? 0 : 1;
}

/// Nearest point of E8 = D8 ∪ (D8 + ½·1). Returns the coset: 0 = D8, 1 = D8 + ½.
template <class T>
E8KV_HD inline int nearest_e8(const T x[8], T y[8]) {
  int64_t t[8];
  const int coset = nearest_e8_twice(x, t);
  for (int i = 0; i < 8; ++i) y[i] = static_cast<T>(t[i]) * T(0.5);
  return coset;
}

/// True when y (given as twice its coordinates) is a point of E8: all even or all odd,
/// and the coordinate sum Σy = Σ(twice)/2 is even.
E8KV_HD inline bool is_e8_twice(const int64_t twice_y[8]) {
  const int64_t p0 = twice_y[0] & 1;
  int64_t s = 0;
  for (int i = 0; i < 8; ++i) {
    if ((twice_y[i] & 1) != p0) return false;
    s += twice_y[i];
  }
  return (s % 4) == 0;
}

/// True when y is a point of E8 (coordinates exactly integers or exactly half-integers).
template <class T>
E8KV_HD inline bool is_e8(const T y[8]) {
  int64_t t[8];
  for (int i = 0; i < 8; ++i) {
    const T twice = y[i] * T(2);
    if (!(twice == twice) || twice != fp::round_half_even(twice)) return false;
    if (twice > T(4e15) || twice < T(-4e15)) return false;
    t[i] = static_cast<int64_t>(twice);
  }
  return is_e8_twice(t);
}

}  // namespace e8kv::lattice
