// RandomizedHadamard's batch transforms: the closed dispatch over the supported dims, each dim's
// fully unrolled FWHT instantiated once here for the portable and the AVX2 target (the AVX2 twin
// runs the same adds, subtracts and sign multiplies, so the same floats; see
// numeric/cpu_features.hpp), chosen per call.
#include "e8kv/transform/hadamard.hpp"

#include <string>

#include "detail/require.hpp"

namespace e8kv::transform {
namespace {

template <int D, bool Inverse>
E8KV_FORCE_INLINE void run_body(const float* mult, const float* in, float* out, size_t n, size_t stride) {
  for (size_t v = 0; v < n; ++v) {
    const float* src = in + v * stride;
    float* dst = out + v * stride;
    if (!Inverse) {
      // Multiplying by ±1 is exact and equals the sign flip of the device path.
      for (int i = 0; i < D; ++i) dst[i] = src[i] * mult[i];
      fwht_orthonormal<D>(dst);
    } else {
      if (dst != src)
        for (int i = 0; i < D; ++i) dst[i] = src[i];
      fwht_orthonormal_inverse<D>(dst);
      for (int i = 0; i < D; ++i) dst[i] = dst[i] * mult[i];
    }
  }
}

template <int D, bool Inverse>
E8KV_TARGET_BASE_FLAT void run_base(const float* mult, const float* in, float* out, size_t n, size_t stride) {
  run_body<D, Inverse>(mult, in, out, n, stride);
}

template <int D, bool Inverse>
E8KV_TARGET_AVX2_FLAT void run_avx2(const float* mult, const float* in, float* out, size_t n, size_t stride) {
  run_body<D, Inverse>(mult, in, out, n, stride);
}

template <bool Inverse>
void run(int dim, const float* mult, const float* in, float* out, size_t n, size_t stride) {
  const bool avx2 = cpu_has_avx2();
  switch (dim) {
#define E8KV_HADAMARD_RUN_CASE(N)                                       \
  case N:                                                               \
    if (avx2) return run_avx2<N, Inverse>(mult, in, out, n, stride);    \
    return run_base<N, Inverse>(mult, in, out, n, stride);
    E8KV_HADAMARD_RUN_CASE(32)
    E8KV_HADAMARD_RUN_CASE(64)
    E8KV_HADAMARD_RUN_CASE(80)
    E8KV_HADAMARD_RUN_CASE(96)
    E8KV_HADAMARD_RUN_CASE(112)
    E8KV_HADAMARD_RUN_CASE(128)
    E8KV_HADAMARD_RUN_CASE(160)
    E8KV_HADAMARD_RUN_CASE(192)
    E8KV_HADAMARD_RUN_CASE(256)
    E8KV_HADAMARD_RUN_CASE(512)
#undef E8KV_HADAMARD_RUN_CASE
    default:
      // The constructor admits only supported dims; a new dim missing here is a bug, not input.
      e8kv::detail::fail("RandomizedHadamard: dim = {} has no batch kernel", dim);
  }
}

}  // namespace

void RandomizedHadamard::forward_batch(const float* x, float* y, size_t n, size_t stride) const {
  check_batch("forward_batch", x, y, n, stride);
  if (n == 0) return;
  run<false>(dim_, multipliers_.data(), x, y, n, stride);
}

void RandomizedHadamard::inverse_batch(const float* y, float* x, size_t n, size_t stride) const {
  check_batch("inverse_batch", y, x, n, stride);
  if (n == 0) return;
  run<true>(dim_, multipliers_.data(), y, x, n, stride);
}

void RandomizedHadamard::check_batch(const char* what, const float* in, const float* out, size_t n,
                                     size_t stride) const {
  if (n == 0) return;
  // Messages are built only on failure: this runs once per (batch of) vector(s).
  if (in == nullptr || out == nullptr)
    e8kv::detail::fail("RandomizedHadamard::{}: input and output pointers must be non-null", what);
  if (n != 1 && stride < static_cast<size_t>(dim_))
    e8kv::detail::fail("RandomizedHadamard::{}: stride = {} must be >= dim = {} when n > 1", what, stride, dim_);
}

}  // namespace e8kv::transform
