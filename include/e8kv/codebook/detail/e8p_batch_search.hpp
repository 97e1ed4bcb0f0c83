// E8P's host batches: the certified class search on 4 or 8 blocks at once with GCC/Clang vector
// extensions (AVX2 chosen at run time), and encode_batch. Included by e8p.hpp.
#pragma once

#include "e8kv/codebook/detail/e8p_certified_search.hpp"

namespace e8kv::codebook::e8p_detail {

#if E8KV_HOST_VECTORS
// ---- host batches: the class search on W blocks at once (GCC/Clang vector extensions) --------
//
// The same certificate as certified_search, evaluated with W-lane vectors (one block per lane,
// one vector per coordinate; branch-free: c7 runs when any lane needs it). Its float estimates may
// round differently from the scalar code, which does not matter: a certified lane returns the
// exact nearest codeword (the same index as every other route) and an uncertified lane takes the
// scalar fast path + exhaustive search.
namespace vec {

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

// W lanes of float (VF) and of int32 (VI; comparisons return all-ones / zero lane masks). The
// raw vectors sit in structs and helpers take const references: 32-byte vectors passed by value
// outside AVX code would trigger GCC's ABI notes (-Wpsabi), even in always-inline helpers.
template <int W>
struct VF {
  typename Raw<W>::F v;
};
template <int W>
struct VI {
  typename Raw<W>::I v;
};

#define E8KV_VEC_OP(T, R, op)                                                            \
  template <int W>                                                                       \
  E8KV_FORCE_INLINE R<W> operator op(const T<W>& a, const T<W>& b) {                     \
    return R<W>{a.v op b.v};                                                             \
  }
E8KV_VEC_OP(VF, VF, +)
E8KV_VEC_OP(VF, VF, -)
E8KV_VEC_OP(VF, VF, *)
E8KV_VEC_OP(VF, VI, <)
E8KV_VEC_OP(VF, VI, >)
E8KV_VEC_OP(VF, VI, <=)
E8KV_VEC_OP(VF, VI, >=)
E8KV_VEC_OP(VF, VI, ==)
E8KV_VEC_OP(VI, VI, +)
E8KV_VEC_OP(VI, VI, &)
E8KV_VEC_OP(VI, VI, |)
E8KV_VEC_OP(VI, VI, ^)
E8KV_VEC_OP(VI, VI, ==)
E8KV_VEC_OP(VI, VI, !=)
#undef E8KV_VEC_OP
template <int W>
E8KV_FORCE_INLINE VI<W> operator~(const VI<W>& a) {
  return VI<W>{~a.v};
}
template <int W>
E8KV_FORCE_INLINE VF<W> operator-(const VF<W>& a) {
  return VF<W>{-a.v};
}
template <int W>
E8KV_FORCE_INLINE VI<W> operator<<(const VI<W>& a, int n) {
  return VI<W>{a.v << n};
}
template <int W>
E8KV_FORCE_INLINE VI<W> operator>>(const VI<W>& a, int n) {
  return VI<W>{a.v >> n};
}

/// Lane-wise helpers on W lanes.
template <int W>
struct Ops {
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
  static E8KV_FORCE_INLINE F select(const I& mask, const F& a, const F& b) {
    typedef typename Raw<W>::F RF;
    typedef typename Raw<W>::I RI;
    return F{(RF)(((RI)a.v & mask.v) | ((RI)b.v & ~mask.v))};
  }
  static E8KV_FORCE_INLINE I select(const I& mask, const I& a, const I& b) { return I{(a.v & mask.v) | (b.v & ~mask.v)}; }
  static E8KV_FORCE_INLINE F max_of(const F& a, const F& b) { return select(a < b, b, a); }
  static E8KV_FORCE_INLINE F min_of(const F& a, const F& b) { return select(a < b, a, b); }
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
  static E8KV_FORCE_INLINE void order(F& a, F& b) {
    const F hi = max_of(a, b), lo = min_of(a, b);
    a = hi;
    b = lo;
  }
  /// Batcher's odd-even merge sort network for 8 values (19 comparators), descending per lane.
  static E8KV_FORCE_INLINE void sort_descending(F* v) {
    order(v[0], v[1]), order(v[2], v[3]), order(v[4], v[5]), order(v[6], v[7]);
    order(v[0], v[2]), order(v[1], v[3]), order(v[4], v[6]), order(v[5], v[7]);
    order(v[1], v[2]), order(v[5], v[6]);
    order(v[0], v[4]), order(v[1], v[5]), order(v[2], v[6]), order(v[3], v[7]);
    order(v[2], v[4]), order(v[3], v[5]);
    order(v[1], v[2]), order(v[3], v[4]), order(v[5], v[6]);
  }
  /// x[8k + i] of W blocks as lane k of z[i], times scale, sanitized like fp::sanitize.
  static E8KV_FORCE_INLINE void load_sanitized(const float* x, float scale, float limit, F z[8]) {
    const F upper = splat(limit), lower = splat(-limit), zero = splat(0.0f), s = splat(scale);
    for (int i = 0; i < 8; ++i) {
      F v;
      for (int k = 0; k < W; ++k) v.v[k] = x[8 * k + i];
      v = v * s;
      v = select(v == v, v, zero);
      v = select(v > upper, upper, v);
      z[i] = select(v < lower, lower, v);
    }
  }
};

/// The E8P kernel on W lanes (W = 4: 128-bit vectors, any SSE2/NEON host; W = 8: AVX2).
template <int W>
struct Kernel : Ops<W> {
  typedef Ops<W> O;
  typedef VF<W> F;
  typedef VI<W> I;
  using O::abs_value;
  using O::max_of;
  using O::min_of;
  using O::select;
  using O::splat;
  using O::splat_int;

  /// Running leader of the class search per lane.
  struct Leader {
    F best, runner_up, others;
    I winner;  // class + 8·shift bit, or for c7 the pattern key | 0x10000 | shift bit << 17
  };

  static E8KV_FORCE_INLINE void offer(Leader& l, const F& value, const F& runner_up, const I& winner) {
    const I better = value > l.best;
    l.others = max_of(l.others, select(better, l.best, value));
    l.best = max_of(l.best, value);
    l.runner_up = select(better, runner_up, l.runner_up);
    l.winner = select(better, winner, l.winner);
  }

  struct Shift {
    F w[8];
    F sorted[8];
    I odd;  // parity of the number of negative z_i − t, as a mask
    F sum, base, c7_bound;
  };

  static E8KV_FORCE_INLINE void offer_shift(const F z[8], const F& half_sum, int shift_bit, Shift& s, Leader& l) {
    const F t = splat(shift_bit ? -0.25f : 0.25f);
    const F zero = splat(0.0f);
    I odd = splat_int(0);
    F sum = zero;
    for (int i = 0; i < 8; ++i) {
      const F d = z[i] - t;
      odd = odd ^ (d < zero);
      s.w[i] = abs_value(d);
      sum = sum + s.w[i];
    }
    s.odd = odd;
    s.sum = sum;
    F* v = s.sorted;
    for (int i = 0; i < 8; ++i) v[i] = s.w[i];
    O::sort_descending(v);
    const F two = splat(2.0f), four = splat(4.0f);
    s.base = (sum - two) + (shift_bit ? -half_sum : half_sum);
    const F repair = two * v[7];
    const F even_repair = select(odd, repair, zero), odd_repair = select(odd, zero, repair);
    const int tag = 8 * shift_bit;
    offer(l, s.base - even_repair, splat(-3.0e38f), splat_int(tag));
    F inc = zero;
    for (int k = 1; k <= 4; ++k) {
      inc = inc + (two * v[k - 1] - two);
      const F value = (s.base + inc) - ((k & 1) ? odd_repair : even_repair);
      offer(l, value, value - two * (v[k - 1] - v[k]), splat_int(tag + k));
    }
    s.c7_bound = (s.base + (inc + (two * v[4] - two))) - odd_repair;
    const F inc_two = four * v[0] - splat(6.0f);
    F value = (s.base + inc_two) - even_repair;
    offer(l, value, value - four * (v[0] - v[1]), splat_int(tag + 5));
    value = (s.base + (inc_two + (two * v[1] - two))) - odd_repair;
    offer(l, value, value - two * min_of(v[0] - v[1], v[1] - v[2]), splat_int(tag + 6));
  }

  /// c7 for every lane of one shift: the best set as the candidate, the second best as its
  /// runner-up bound.
  static E8KV_FORCE_INLINE void offer_norm_twelve(const Shift& s, int shift_bit, Leader& l) {
    const F zero = splat(0.0f), two = splat(2.0f);
    const F cap = splat(6.0f) * s.sorted[7];
    const I wrong_parity = ~s.odd;  // c7 has parity 1
    const F total = two * s.sum - splat(10.0f);
    F best = splat(-3.0e38f), second = best;
    I key = splat_int(0);
    for (int n = 0; n < 29; ++n) {
      const NormTwelveSet& set = kHostNormTwelveSets.set[n];
      const F& a = s.w[set.half[0]];
      const F& b = s.w[set.half[1]];
      const F& d = s.w[set.half[2]];
      const F repair = min_of(two * min_of(min_of(a, b), d), cap);
      const F value = (s.base + (total - two * ((a + b) + d))) - select(wrong_parity, repair, zero);
      const I better = value > best;
      second = max_of(second, select(better, best, value));
      best = max_of(best, value);
      key = select(better, splat_int(set.key), key);
    }
    offer(l, best, second, key | splat_int(0x10000 | shift_bit << 17));
  }

  /// Encodes W blocks x[0..8W) (scaled by `scale`, then sanitized); writes index[0..count).
  static E8KV_FORCE_INLINE void encode(const float* x, float scale, uint32_t* index, int count = W) {
    F z[8];
    const F zero = splat(0.0f);
    O::load_sanitized(x, scale, kMaxLatticeAbs, z);
    F sum = zero, magnitude_sum = zero;
    for (int i = 0; i < 8; ++i) {
      sum = sum + z[i];
      magnitude_sum = magnitude_sum + abs_value(z[i]);
    }
    const F half_sum = splat(0.5f) * sum;
    const F margin = (magnitude_sum + splat(8.0f)) * splat(0x1.0p-13f);
    Leader l{splat(-3.0e38f), splat(-3.0e38f), splat(-3.0e38f), splat_int(0)};
    Shift s[2];
    offer_shift(z, half_sum, 0, s[0], l);
    offer_shift(z, half_sum, 1, s[1], l);
    for (int shift_bit = 0; shift_bit < 2; ++shift_bit) {
      if (O::any(s[shift_bit].c7_bound >= l.best - margin)) offer_norm_twelve(s[shift_bit], shift_bit, l);
      else l.others = max_of(l.others, s[shift_bit].c7_bound);
    }
    I certified = l.best - max_of(l.runner_up, l.others) > margin;
    // The winner's pattern key from its class and the sorted magnitudes of its shift.
    const I is_c7 = (l.winner & splat_int(0x10000)) != splat_int(0);
    const I shift_bit = select(is_c7, l.winner >> 17, l.winner >> 3) & splat_int(1);
    const I upper = shift_bit != splat_int(0);
    const I cls = l.winner & splat_int(7);
    F w[8], sorted[5];
    for (int i = 0; i < 8; ++i) w[i] = select(upper, s[1].w[i], s[0].w[i]);
    for (int k = 0; k < 5; ++k) sorted[k] = select(upper, s[1].sorted[k], s[0].sorted[k]);
    const I odd = select(upper, s[1].odd, s[0].odd);
    // Codes 1 on w ≥ v_k for c1..c4; c5: code 2 on w ≥ v1; c6: 2 on w ≥ v1, 1 on w ≥ v2.
    const F never = splat(3.0e38f);
    F one_threshold = never;
    for (int k = 1; k <= 4; ++k) one_threshold = select(cls == splat_int(k), sorted[k - 1], one_threshold);
    one_threshold = select(cls == splat_int(6), sorted[1], one_threshold);
    const F two_threshold = select((cls == splat_int(5)) | (cls == splat_int(6)), sorted[0], never);
    I key = splat_int(0);
    for (int i = 0; i < 8; ++i) {
      const I code = select(w[i] >= two_threshold, splat_int(2), select(w[i] >= one_threshold, splat_int(1), splat_int(0)));
      key = key | (code << code_shift(i));
    }
    key = select(is_c7, l.winner & splat_int(0xFFFF), key);
    // The sign vector: its certificate, the negative bits and the parity repair (index_for's
    // rule: the first coordinate with the smallest a_i·w_i flips).
    F m1 = never, m2 = never, aw[8];
    I code_sum = splat_int(0);
    for (int i = 0; i < 8; ++i) {
      const I code = (key >> code_shift(i)) & splat_int(3);
      code_sum = code_sum + code;
      aw[i] = (O::to_float(code) + splat(0.5f)) * w[i];
      m2 = min_of(m2, max_of(m1, aw[i]));
      m1 = min_of(m1, aw[i]);
    }
    const I wrong = ((code_sum & splat_int(1)) != splat_int(0)) != odd;
    const F four = splat(4.0f);
    const F sign_gap = select(wrong, four * (m2 - m1), four * (m1 + m2));
    certified = certified & (sign_gap > margin);
    const F t = select(upper, splat(-0.25f), splat(0.25f));
    I negative = splat_int(0), found = splat_int(0), flip = splat_int(0);
    for (int i = 0; i < 8; ++i) {
      negative = negative | ((z[i] - t < zero) & splat_int(1 << i));
      const I first = (aw[i] == m1) & ~found;
      flip = flip | (first & splat_int(1 << i));
      found = found | first;
    }
    negative = negative ^ (flip & wrong);
    const I low_bits = (negative & splat_int(0xFE)) | shift_bit;
    for (int k = 0; k < count; ++k) {
      if (certified.v[k]) {
        index[k] = static_cast<uint32_t>(pattern_id(static_cast<uint32_t>(key.v[k]))) << 8 |
                   static_cast<uint32_t>(low_bits.v[k]);
        continue;
      }
      float zk[8];
      for (int i = 0; i < 8; ++i) zk[i] = z[i].v[k];
      if (!fast_path(zk, &index[k])) index[k] = search(zk);
    }
  }

};

/// Batches of any length for a W-lane kernel (Kernel<W>::encode takes W blocks, or fewer with a
/// count): whole groups of W in place, the tail through a zero-padded copy. Shared by the E8P and
/// E81B kernels, with their two builds: 128-bit vectors (every SSE2 / NEON host) and, on x86,
/// 256-bit AVX2 vectors chosen at run time (no FMA: the same results).
template <template <int> class Kernel>
struct BatchEncoder {
  template <int W>
  static E8KV_FORCE_INLINE void run(const float* x, float scale, size_t count, uint32_t* index) {
    size_t b = 0;
    for (; b + W <= count; b += W) Kernel<W>::encode(x + 8 * b, scale, index + b);
    if (b < count) {
      float tail[8 * W] = {};
      uint32_t tail_index[W];
      for (size_t k = 0; k < 8 * (count - b); ++k) tail[k] = x[8 * b + k];
      Kernel<W>::encode(tail, scale, tail_index, static_cast<int>(count - b));
      for (size_t k = 0; k < count - b; ++k) index[b + k] = tail_index[k];
    }
  }
  static void portable(const float* x, float scale, size_t count, uint32_t* index) { run<4>(x, scale, count, index); }
#if E8KV_X86_DISPATCH
  __attribute__((target("avx2"), noinline)) static void avx2(const float* x, float scale, size_t count, uint32_t* index) {
    run<8>(x, scale, count, index);
  }
#endif
  /// The AVX2 build where the CPU has it, else the portable one.
  static void host(const float* x, float scale, size_t count, uint32_t* index) {
#if E8KV_X86_DISPATCH
    if (cpu_has_avx2()) return avx2(x, scale, count, index);
#endif
    portable(x, scale, count, index);
  }
};

}  // namespace vec

/// E8P host batches: Batch::portable, Batch::avx2 (x86), Batch::host (run-time choice).
using Batch = vec::BatchEncoder<vec::Kernel>;
#endif  // E8KV_HOST_VECTORS

/// index[b] = exact nearest codeword of sanitize(fl(scale·x[8b + i])) for b < count.
E8KV_HD inline void encode_batch(const float* x, float scale, size_t count, uint32_t* index) {
#if E8KV_HOST_VECTORS && !E8KV_ON_DEVICE
  Batch::host(x, scale, count, index);
#else
  for (size_t b = 0; b < count; ++b) {
    float z[8];
    for (int i = 0; i < 8; ++i) z[i] = fp::sanitize(fp::mul(x[8 * b + i], scale), kMaxLatticeAbs);
    uint32_t result = 0;
    if (!certified_search(z, &result) && !fast_path(z, &result)) result = search(z);
    index[b] = result;
  }
#endif
}

}  // namespace e8kv::codebook::e8p_detail
