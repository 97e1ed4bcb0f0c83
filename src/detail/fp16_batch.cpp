// Batch fp16 conversions with an F16C twin (fp16_batch.hpp).
#include "detail/fp16_batch.hpp"

#include <cstring>

#include "detail/simd.hpp"
#include "e8kv/numeric/cpu_features.hpp"
#include "e8kv/numeric/half.hpp"

#if E8KV_HOST_AVX2_DISPATCH
#include <immintrin.h>
#endif

namespace e8kv::detail {

#if E8KV_HOST_AVX2_DISPATCH
namespace {
__attribute__((target("avx2,f16c"))) void floats_to_fp16_f16c(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  floats_to_fp16_bits(in + i, out + i, n - i);
}
// The read-back is the attention kernels' own eight-lane conversion (simd::IsaAvx2Fma::half8).
__attribute__((target("avx2,fma,f16c"))) void fp16_to_floats_f16c(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const simd::f32x8 v = simd::IsaAvx2Fma::half8(in + i);
    std::memcpy(out + i, &v, sizeof v);
  }
  fp16_bits_to_floats(in + i, out + i, n - i);
}
}  // namespace
#endif

void floats_to_fp16_bits_batch(const float* in, uint16_t* out, size_t n) {
#if E8KV_HOST_AVX2_DISPATCH
  if (cpu_has_avx2_fma()) return floats_to_fp16_f16c(in, out, n);
#endif
  floats_to_fp16_bits(in, out, n);
}

void fp16_bits_to_floats_batch(const uint16_t* in, float* out, size_t n) {
#if E8KV_HOST_AVX2_DISPATCH
  if (cpu_has_avx2_fma()) return fp16_to_floats_f16c(in, out, n);
#endif
  fp16_bits_to_floats(in, out, n);
}

}  // namespace e8kv::detail
