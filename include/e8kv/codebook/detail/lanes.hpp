// Lane operations for the certified nearest-point searches (E8P in e8p_certified_search.hpp, E81B
// in rvq.hpp), which are written once against this interface and run one block per lane:
//  - lanes::Scalar: one block, plain float / int32 (host and device), branch-free selects;
//  - lanes::Vector<W>: W = 4 (128-bit, any SSE2 / NEON host) or 8 (AVX2) blocks at once, with
//    GCC/Clang vector extensions (host only, E8KV_HOST_VECTORS).
// Both give F (W floats) and I (W int32; comparisons return masks: all ones or zero per lane),
// arithmetic and bitwise operators, and the named helpers below. Float results of the two may
// differ in the last bit where min/max meet equal values; the searches only use them to choose a
// route, never as the answer (see e8p_certified_search.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "e8kv/platform.hpp"

namespace e8kv::codebook::lanes {

// ---- scalar helpers ------------------------------------------------------------------------------

E8KV_HD E8KV_FORCE_INLINE float abs_value(float x) {
#if E8KV_ON_DEVICE
  return fabsf(x);
#else
  return std::fabs(x);
#endif
}

/// c ? a : b as a bit select (vectorizes where the plain select would become a branch).
E8KV_HD E8KV_FORCE_INLINE float pick(bool c, float a, float b) {
#if E8KV_ON_DEVICE
  return c ? a : b;
#else
  uint32_t ua, ub;
  memcpy(&ua, &a, sizeof ua);
  memcpy(&ub, &b, sizeof ub);
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  const uint32_t r = (ua & mask) | (ub & ~mask);
  float f;
  memcpy(&f, &r, sizeof f);
  return f;
#endif
}

// max(a, b) and min(a, b) of non-NaN values, branch-free: one maxss/minss on x86 hosts (compilers
// turn the plain select into a branch here), fmaxf/fminf on the device. Which of two equal
// values (±0) comes back is not specified; the searches only use the values.
#if !E8KV_ON_DEVICE && (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && \
    defined(__SSE__)
#define E8KV_LANES_X86_MINMAX 1
#else
#define E8KV_LANES_X86_MINMAX 0
#endif
E8KV_HD E8KV_FORCE_INLINE float max_of(float a, float b) {
#if E8KV_ON_DEVICE
  return fmaxf(a, b);
#elif E8KV_LANES_X86_MINMAX && defined(__AVX__)
  float r;
  __asm__("vmaxss {%2, %1, %0|%0, %1, %2}" : "=x"(r) : "x"(a), "x"(b));
  return r;
#elif E8KV_LANES_X86_MINMAX
  __asm__("maxss {%1, %0|%0, %1}" : "+x"(a) : "x"(b));
  return a;
#else
  return a < b ? b : a;
#endif
}
E8KV_HD E8KV_FORCE_INLINE float min_of(float a, float b) {
#if E8KV_ON_DEVICE
  return fminf(a, b);
#elif E8KV_LANES_X86_MINMAX && defined(__AVX__)
  float r;
  __asm__("vminss {%2, %1, %0|%0, %1, %2}" : "=x"(r) : "x"(a), "x"(b));
  return r;
#elif E8KV_LANES_X86_MINMAX
  __asm__("minss {%1, %0|%0, %1}" : "+x"(a) : "x"(b));
  return a;
#else
  return a < b ? a : b;
#endif
}
#undef E8KV_LANES_X86_MINMAX

// ---- one lane --------------------------------------------------------------------------------------

struct Scalar {
  static constexpr int kWidth = 1;
  typedef float F;
  typedef int32_t I;  ///< masks: 0 or −1

  E8KV_HD static E8KV_FORCE_INLINE F splat(float x) { return x; }
  E8KV_HD static E8KV_FORCE_INLINE I splat_int(int32_t x) { return x; }
  E8KV_HD static E8KV_FORCE_INLINE I mask(bool c) { return -static_cast<int32_t>(c); }
  E8KV_HD static E8KV_FORCE_INLINE I lt(F a, F b) { return mask(a < b); }
  E8KV_HD static E8KV_FORCE_INLINE I gt(F a, F b) { return mask(a > b); }
  E8KV_HD static E8KV_FORCE_INLINE I le(F a, F b) { return mask(a <= b); }
  E8KV_HD static E8KV_FORCE_INLINE I ge(F a, F b) { return mask(a >= b); }
  E8KV_HD static E8KV_FORCE_INLINE I eq(F a, F b) { return mask(a == b); }
  E8KV_HD static E8KV_FORCE_INLINE I eq(I a, I b) { return mask(a == b); }
  E8KV_HD static E8KV_FORCE_INLINE I ne(I a, I b) { return mask(a != b); }
  E8KV_HD static E8KV_FORCE_INLINE F select(I m, F a, F b) { return pick(m != 0, a, b); }
  E8KV_HD static E8KV_FORCE_INLINE I select(I m, I a, I b) { return (a & m) | (b & ~m); }
  E8KV_HD static E8KV_FORCE_INLINE F max_of(F a, F b) { return lanes::max_of(a, b); }
  E8KV_HD static E8KV_FORCE_INLINE F min_of(F a, F b) { return lanes::min_of(a, b); }
  E8KV_HD static E8KV_FORCE_INLINE F abs_value(F a) { return lanes::abs_value(a); }
  E8KV_HD static E8KV_FORCE_INLINE F to_float(I a) { return static_cast<float>(a); }
  E8KV_HD static E8KV_FORCE_INLINE bool any(I m) { return m != 0; }
  E8KV_HD static E8KV_FORCE_INLINE int32_t lane(I a, int) { return a; }
  E8KV_HD static E8KV_FORCE_INLINE float lane(F a, int) { return a; }
};

// ---- W lanes (host vector extensions) -----------------------------------------------------------

#if E8KV_HOST_VECTORS
typedef float Float4 __attribute__((vector_size(16)));
typedef int32_t Int4 __attribute__((vector_size(16)));
typedef float Float8 __attribute__((vector_size(32)));
typedef int32_t Int8 __attribute__((vector_size(32)));
template <int W>
struct Raw;
template <>
struct Raw<4> {
  typedef Float4 F;
  typedef Int4 I;
};
template <>
struct Raw<8> {
  typedef Float8 F;
  typedef Int8 I;
};

// W lanes of float (VF) and of int32 (VI). The raw vectors sit in structs and helpers take const
// references: 32-byte vectors passed by value outside AVX code would trigger GCC's ABI notes
// (-Wpsabi), even in always-inline helpers.
template <int W>
struct VF {
  typename Raw<W>::F v;
};
template <int W>
struct VI {
  typename Raw<W>::I v;
};

#define E8KV_LANES_OP(T, op)                                                \
  template <int W>                                                          \
  E8KV_FORCE_INLINE T<W> operator op(const T<W>& a, const T<W>& b) {        \
    return T<W>{a.v op b.v};                                                \
  }
E8KV_LANES_OP(VF, +)
E8KV_LANES_OP(VF, -)
E8KV_LANES_OP(VF, *)
E8KV_LANES_OP(VI, +)
E8KV_LANES_OP(VI, &)
E8KV_LANES_OP(VI, |)
E8KV_LANES_OP(VI, ^)
#undef E8KV_LANES_OP
template <int W>
E8KV_FORCE_INLINE VF<W> operator-(const VF<W>& a) {
  return VF<W>{-a.v};
}
template <int W>
E8KV_FORCE_INLINE VI<W> operator~(const VI<W>& a) {
  return VI<W>{~a.v};
}
template <int W>
E8KV_FORCE_INLINE VI<W> operator<<(const VI<W>& a, int n) {
  return VI<W>{a.v << n};
}
template <int W>
E8KV_FORCE_INLINE VI<W> operator>>(const VI<W>& a, int n) {
  return VI<W>{a.v >> n};
}

template <int W>
struct Vector {
  static constexpr int kWidth = W;
  typedef VF<W> F;
  typedef VI<W> I;

  static E8KV_FORCE_INLINE F splat(float x) {
    F r;
    for (int k = 0; k < W; ++k) r.v[k] = x;
    return r;
  }
  static E8KV_FORCE_INLINE I splat_int(int32_t x) {
    I r;
    for (int k = 0; k < W; ++k) r.v[k] = x;
    return r;
  }
  static E8KV_FORCE_INLINE I lt(const F& a, const F& b) { return I{a.v < b.v}; }
  static E8KV_FORCE_INLINE I gt(const F& a, const F& b) { return I{a.v > b.v}; }
  static E8KV_FORCE_INLINE I le(const F& a, const F& b) { return I{a.v <= b.v}; }
  static E8KV_FORCE_INLINE I ge(const F& a, const F& b) { return I{a.v >= b.v}; }
  static E8KV_FORCE_INLINE I eq(const F& a, const F& b) { return I{a.v == b.v}; }
  static E8KV_FORCE_INLINE I eq(const I& a, const I& b) { return I{a.v == b.v}; }
  static E8KV_FORCE_INLINE I ne(const I& a, const I& b) { return I{a.v != b.v}; }
  static E8KV_FORCE_INLINE F select(const I& mask, const F& a, const F& b) {
    typedef typename Raw<W>::F RF;
    typedef typename Raw<W>::I RI;
    return F{(RF)(((RI)a.v & mask.v) | ((RI)b.v & ~mask.v))};
  }
  static E8KV_FORCE_INLINE I select(const I& mask, const I& a, const I& b) { return I{(a.v & mask.v) | (b.v & ~mask.v)}; }
  static E8KV_FORCE_INLINE F max_of(const F& a, const F& b) { return select(lt(a, b), b, a); }
  static E8KV_FORCE_INLINE F min_of(const F& a, const F& b) { return select(lt(a, b), a, b); }
  static E8KV_FORCE_INLINE F abs_value(const F& a) {
    typedef typename Raw<W>::F RF;
    typedef typename Raw<W>::I RI;
    return F{(RF)((RI)a.v & splat_int(0x7FFFFFFF).v)};
  }
  static E8KV_FORCE_INLINE F to_float(const I& a) {
    typedef typename Raw<W>::F RF;
    return F{__builtin_convertvector(a.v, RF)};
  }
  static E8KV_FORCE_INLINE bool any(const I& mask) {
    bool r = false;
    for (int k = 0; k < W; ++k) r |= mask.v[k] != 0;
    return r;
  }
  static E8KV_FORCE_INLINE int32_t lane(const I& a, int k) { return a.v[k]; }
  static E8KV_FORCE_INLINE float lane(const F& a, int k) { return a.v[k]; }

  /// x[8k + i] of W blocks as lane k of z[i], times scale, sanitized like fp::sanitize.
  static E8KV_FORCE_INLINE void load_sanitized(const float* x, float scale, float limit, F z[8]) {
    const F upper = splat(limit), lower = splat(-limit), zero = splat(0.0f), s = splat(scale);
    for (int i = 0; i < 8; ++i) {
      F v;
      for (int k = 0; k < W; ++k) v.v[k] = x[8 * k + i];
      v = v * s;
      v = select(eq(v, v), v, zero);
      v = select(gt(v, upper), upper, v);
      z[i] = select(lt(v, lower), lower, v);
    }
  }
};
#endif  // E8KV_HOST_VECTORS

// ---- on any lanes --------------------------------------------------------------------------------

template <class O>
E8KV_HD E8KV_FORCE_INLINE void order_descending(typename O::F& a, typename O::F& b) {
  const typename O::F hi = O::max_of(a, b), lo = O::min_of(a, b);
  a = hi;
  b = lo;
}

/// Batcher's odd-even merge sort network for 8 values (19 comparators), descending per lane,
/// branch-free.
template <class O>
E8KV_HD E8KV_FORCE_INLINE void sort_descending(typename O::F v[8]) {
#define E8KV_LANES_ORDER(i, j) order_descending<O>(v[i], v[j])
  E8KV_LANES_ORDER(0, 1), E8KV_LANES_ORDER(2, 3), E8KV_LANES_ORDER(4, 5), E8KV_LANES_ORDER(6, 7);
  E8KV_LANES_ORDER(0, 2), E8KV_LANES_ORDER(1, 3), E8KV_LANES_ORDER(4, 6), E8KV_LANES_ORDER(5, 7);
  E8KV_LANES_ORDER(1, 2), E8KV_LANES_ORDER(5, 6);
  E8KV_LANES_ORDER(0, 4), E8KV_LANES_ORDER(1, 5), E8KV_LANES_ORDER(2, 6), E8KV_LANES_ORDER(3, 7);
  E8KV_LANES_ORDER(2, 4), E8KV_LANES_ORDER(3, 5);
  E8KV_LANES_ORDER(1, 2), E8KV_LANES_ORDER(3, 4), E8KV_LANES_ORDER(5, 6);
#undef E8KV_LANES_ORDER
}

}  // namespace e8kv::codebook::lanes
