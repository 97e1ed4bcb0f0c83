// Dot product with a fixed summation order that the compiler can vectorize.
#pragma once

namespace e8kv {

/// Σ a_i·b_i over 8 interleaved partial sums (element i goes to lane i mod 8), combined as a
/// fixed pairwise tree. The order does not depend on the machine, so results are reproducible,
/// and unlike one serial sum the 8 lanes map onto SIMD registers. Host only.
inline float dot_product(const float* a, const float* b, int n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; j < 8 && i + j < n; ++j) acc[j] += a[i + j] * b[i + j];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

}  // namespace e8kv
