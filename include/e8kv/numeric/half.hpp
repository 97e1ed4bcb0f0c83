// fp16 (IEEE binary16) and bf16 (bfloat16) storage types with bit-exact conversions.
//
// Everything is integer bit manipulation (no _Float16, no F16C, no cuda_fp16.h), so the host and
// the device produce identical bits, and the header works without CUDA.
//
// float -> fp16 / bf16 rounds to nearest, ties to even. Rules for special values:
//   * overflow rounds to ±Inf (fp16: |x| >= 65520, the midpoint above 65504; bf16: above the
//     midpoint between FLT_MAX's neighbours, as RNE dictates);
//   * fp16 subnormals are produced exactly (smallest 2^-24; 2^-25 ties to even, i.e. to ±0);
//   * NaN stays NaN: the result is a quiet NaN with the input's sign and the top payload bits
//     that fit (it never becomes Inf);
//   * the sign of zero is kept.
// fp16 / bf16 -> float is exact (every value is representable); NaN payloads are kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "e8kv/platform.hpp"

namespace e8kv {

/// IEEE 754 binary16 storage: 1 sign, 5 exponent, 10 mantissa bits. Trivial, standard layout.
struct fp16_t {
  uint16_t bits;
};

/// bfloat16 storage: the top 16 bits of a float (1 sign, 8 exponent, 7 mantissa bits).
struct bf16_t {
  uint16_t bits;
};

static_assert(sizeof(fp16_t) == 2 && std::is_trivial_v<fp16_t> && std::is_standard_layout_v<fp16_t>);
static_assert(sizeof(bf16_t) == 2 && std::is_trivial_v<bf16_t> && std::is_standard_layout_v<bf16_t>);

namespace detail {

E8KV_HD E8KV_FORCE_INLINE uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

E8KV_HD E8KV_FORCE_INLINE float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace detail

/// Exact conversion of an fp16 bit pattern to float (subnormals normalized, NaN payload kept).
E8KV_HD inline float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return detail::bits_float(sign | 0x7f800000u | (mantissa << 13));  // Inf/NaN
  if (exponent != 0) return detail::bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return detail::bits_float(sign);  // ±0
  // Subnormal: mantissa · 2^-24. Shift the leading one into the implicit-bit position.
  uint32_t float_exponent = 113;  // exponent field of 2^-14 as if the implicit bit were set
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --float_exponent;
  }
  return detail::bits_float(sign | (float_exponent << 23) | ((mantissa & 0x3ffu) << 13));
}

/// float -> fp16 bits, round to nearest even; overflow to ±Inf; exact subnormals; NaN stays
/// a quiet NaN with the same sign.
E8KV_HD inline uint16_t float_to_fp16_bits(float f) {
  const uint32_t x = detail::float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u)  // NaN: quiet bit forced on, top 9 payload bits kept
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x1ffu));
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (and Inf)
  if (magnitude >= 0x38800000u) {  // normal fp16 range: |x| >= 2^-14
    // Rebias the exponent (127 -> 15) and drop 13 mantissa bits; a carry out of the mantissa
    // correctly increments the exponent (never up to Inf: that case returned above).
    uint32_t h = (magnitude - (112u << 23)) >> 13;
    const uint32_t rest = magnitude & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  const uint32_t float_exponent = magnitude >> 23;
  if (float_exponent < 102u) return sign;  // |x| < 2^-25: rounds to zero
  // Subnormal fp16: the result is round(|x| / 2^-24) = round(significand >> shift).
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - float_exponent;  // in [14, 24]
  uint32_t h = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (h & 1u))) ++h;  // may carry into the smallest normal: fine
  return static_cast<uint16_t>(sign | h);
}

/// Host batch form of float_to_fp16_bits: the same bits for every input, branch-free so the
/// compiler vectorizes it (the scalar form branches per element on the value's range). The
/// fp16-subnormal case uses the FPU: |x| + 0.5 rounds |x| to a multiple of 2^-24 (the float
/// spacing in [0.5, 1)) to nearest even, which is the subnormal rounding, assuming the default
/// rounding mode and no denormals-are-zero for results (inputs below 2^-25 give 0 either way).
inline void floats_to_fp16_bits(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = detail::float_bits(in[i]);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t magnitude = x & 0x7fffffffu;
    const uint32_t nan = 0x7e00u | ((magnitude >> 13) & 0x1ffu);
    const uint32_t normal = (magnitude - (112u << 23) + 0xfffu + ((magnitude >> 13) & 1u)) >> 13;
    const uint32_t tiny = detail::float_bits(detail::bits_float(magnitude) + 0.5f) - 0x3f000000u;
    uint32_t h = magnitude >= 0x38800000u ? normal : tiny;
    h = magnitude >= 0x477ff000u ? 0x7c00u : h;
    h = magnitude > 0x7f800000u ? nan : h;
    out[i] = static_cast<uint16_t>(sign | h);
  }
}

/// Host batch form of fp16_bits_to_float (the same floats, NaN payloads included), branch-free.
inline void fp16_bits_to_floats(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t h = in[i];
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    // Zero and subnormals: mantissa·2^-24, exact in float.
    const uint32_t small = detail::float_bits(static_cast<float>(static_cast<int32_t>(mantissa)) * 5.9604644775390625e-8f);
    uint32_t f = (exponent + 112u) << 23 | mantissa << 13;
    f = exponent == 0x1fu ? (0x7f800000u | mantissa << 13) : f;
    f = exponent == 0u ? small : f;
    out[i] = detail::bits_float(sign | f);
  }
}

/// Exact conversion of a bf16 bit pattern to float.
E8KV_HD inline float bf16_bits_to_float(uint16_t b) {
  return detail::bits_float(static_cast<uint32_t>(b) << 16);
}

/// float -> bf16 bits, round to nearest even; overflow to ±Inf; NaN stays a quiet NaN with the
/// same sign.
E8KV_HD inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = detail::float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding_bias) >> 16);  // no overflow: x < 0xff800000 here
}

E8KV_HD inline float to_float(fp16_t h) { return fp16_bits_to_float(h.bits); }
E8KV_HD inline float to_float(bf16_t b) { return bf16_bits_to_float(b.bits); }
E8KV_HD inline fp16_t fp16_from_float(float f) { return fp16_t{float_to_fp16_bits(f)}; }
E8KV_HD inline bf16_t bf16_from_float(float f) { return bf16_t{float_to_bf16_bits(f)}; }

/// True for the element types the KV views accept: float, fp16_t, bf16_t.
template <class T>
inline constexpr bool is_kv_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t>;

/// Reads one element of type T (float, fp16_t or bf16_t) as a float (exact).
template <class T>
E8KV_HD inline float load_as_float(const T* p) {
  static_assert(is_kv_element_v<T>, "load_as_float: T must be float, e8kv::fp16_t or e8kv::bf16_t");
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else {
    return to_float(*p);
  }
}

/// Stores a float into one element of type T, rounding to nearest even for fp16_t / bf16_t.
template <class T>
E8KV_HD inline void store_from_float(T* p, float value) {
  static_assert(is_kv_element_v<T>, "store_from_float: T must be float, e8kv::fp16_t or e8kv::bf16_t");
  if constexpr (std::is_same_v<T, float>) {
    *p = value;
  } else if constexpr (std::is_same_v<T, fp16_t>) {
    *p = fp16_from_float(value);
  } else {
    *p = bf16_from_float(value);
  }
}

}  // namespace e8kv
