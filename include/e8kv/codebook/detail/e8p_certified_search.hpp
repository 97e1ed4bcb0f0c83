// E8P's certified class search (one block) and the exhaustive search's dispatch. Included by
// e8p.hpp; the derivation is below.
#pragma once

#include <utility>

#include "e8kv/codebook/detail/e8p_tables.hpp"
#include "e8kv/codebook/detail/lanes.hpp"

namespace e8kv::codebook::e8p_detail {

// ---- the certified class search ------------------------------------------------------------
//
// In exact arithmetic the search key of a pattern has a simple structure. With a = ½ + c
// (code c ∈ {0, 1, 2}), 2·a·w − a² = (w − ¼) + inc(c, w) where inc(0, w) = 0, inc(1, w) = 2w − 2 and
// inc(2, w) = 4w − 6, and a wrong parity costs 4·min_i a_i w_i. So, with W = Σ w_i,
//   key(a) = (W − 2 + offset) + Σ_i inc(c_i, w_i) − [parity(a) ≠ p]·4·min_i a_i w_i.
// The 256 patterns form 8 classes by their codes: c0 all ½ (parity 0); c1..c4 k codes 1 at any
// k positions (parity k mod 2); c5 one code 2 (parity 0); c6 one 2 and one 1 (parity 1); c7 five
// 1s at 29 position sets (parity 1). With w sorted descending (v1 ≥ ... ≥ v8), the best pattern
// of a class puts its large codes on the largest w (ck: top k; c5: v1; c6: 2 on v1, 1 on v2), and
// its parity repair costs 2·v8 (flipping a ½ coordinate at the smallest w is always cheapest);
// c7 is evaluated set by set. Every other pattern of the class is worse by at least a known gap
// (ck: 2(v_k − v_{k+1}); c5: 4(v1 − v2); c6: 2·min(v1 − v2, v2 − v3)), since its repair cannot
// cost less than 2·v8.
//
// certified_search evaluates these class maxima for both shifts in float (c7 only when its bound,
// the top-5 sum, comes within the margin of the leader; otherwise the bound counts as a rival)
// and accepts the leader only when it beats every other pattern, and its sign vector every other
// sign vector of the pattern (by 4(m2 − m1) with wrong parity, else 4(m1 + m2), m1 ≤ m2 the two
// smallest a_i·w_i), by more than margin = 2^-13·(Σ|z_i| + 8). A reference key is a float sum
// of ≤ 12 rounded terms of size ≤ 5W + |offset| + 12.5 (W ≤ Σ|z| + 2, |offset| ≤ ½Σ|z|), so its
// error is below 64·2^-24·(W + |offset| + 1); the estimates use fewer operations on the same
// magnitudes; twice both errors stay below 2^-15·(Σ|z| + 8), a quarter of the margin. Then the
// leader is the unique exact nearest codeword: the exhaustive search returns it (its float keys
// keep the strict order) and so does the fast path when it accepts (it finds the nearest point of
// E8+¼ up to a float error < 2^-19, far below the margin ≥ 2^-10). Otherwise (near-ties, ≈ 0.6 %
// of Gaussian blocks) the caller runs the fast path and the exhaustive search. So encode_lattice
// returns bit for bit what those two reference steps return, whichever route it takes, on the
// host and on the device; the float estimates only choose the route.

/// The three coordinates with |a_i| = ½ of each chosen norm-12 pattern, and its pattern key.
struct NormTwelveSet {
  uint8_t half[3];
  uint16_t key;
};

struct NormTwelveSets {
  NormTwelveSet set[29];
};

constexpr NormTwelveSet norm_twelve_set(int n) {
  NormTwelveSet set{};
  int halves = 0;
  uint32_t key = 0;
  for (int i = 0; i < 8; ++i) {
    if (kNormTwelvePatterns[n][i] == '1') set.half[halves++] = static_cast<uint8_t>(i);
    else key |= 1u << code_shift(i);
  }
  set.key = static_cast<uint16_t>(key);
  return set;
}

constexpr NormTwelveSets build_norm_twelve_sets() {
  NormTwelveSets s{};
  for (int n = 0; n < 29; ++n) s.set[n] = norm_twelve_set(n);
  return s;
}

inline constexpr NormTwelveSets kHostNormTwelveSets = build_norm_twelve_sets();

/// Set n as compile-time constants: the c7 loop indexes w with them, so that on the device w
/// stays in registers (a run-time index, even one read from a table, puts the array in local
/// memory: 160-320 B per thread and 3 local loads per set before).
template <int N>
struct NormTwelveConstants {
  static constexpr NormTwelveSet kSet = norm_twelve_set(N);
  static constexpr int kHalf0 = kSet.half[0], kHalf1 = kSet.half[1], kHalf2 = kSet.half[2];
  static constexpr int32_t kKey = kSet.key;
};

/// The certified class search on the lanes of `O` (lanes.hpp: one block per lane; lanes::Scalar
/// on the device and for single blocks, lanes::Vector<W> in the host batches).
template <class O>
struct CertifiedSearch {
  typedef typename O::F F;
  typedef typename O::I I;

  /// The best candidate so far, its own runner-up bound, and the largest value of all others.
  struct Leader {
    F best, runner_up, others;
    I winner;  // class (0..6) + 8·shift bit, or for c7 the pattern key | 0x10000 | shift bit << 17
  };

  E8KV_HD static E8KV_FORCE_INLINE void offer(Leader& l, const F& value, const F& runner_up, const I& winner) {
    // Branch-free: the outcome is data dependent and unpredictable.
    const I better = O::gt(value, l.best);
    l.others = O::max_of(l.others, O::select(better, l.best, value));  // the loser joins the others
    l.best = O::max_of(l.best, value);
    l.runner_up = O::select(better, runner_up, l.runner_up);
    l.winner = O::select(better, winner, l.winner);
  }

  /// What the class search keeps of one shift.
  struct Shift {
    F w[8];       // |z − t|
    F sorted[8];  // w sorted descending: v1 ≥ ... ≥ v8
    I odd;        // parity of the number of negative z_i − t, as a mask
    F sum;        // W = Σ w
    F base;       // W − 2 + 2t·Σz
    F c7_bound;   // upper bound of every c7 key
  };

  /// Offers the maxima of classes c0..c6 of one shift and records what c7 and the winner need.
  E8KV_HD static E8KV_FORCE_INLINE void offer_shift(const F z[8], const F& half_sum, int shift_bit, Shift& s,
                                                    Leader& l) {
    const F t = O::splat(shift_bit ? -0.25f : 0.25f);
    const F zero = O::splat(0.0f);
    I odd = O::splat_int(0);
    F sum = zero;
    for (int i = 0; i < 8; ++i) {
      const F d = z[i] - t;  // never −0 (t ≠ 0)
      odd = odd ^ O::lt(d, zero);
      s.w[i] = O::abs_value(d);
      sum = sum + s.w[i];
    }
    s.odd = odd;
    s.sum = sum;
    for (int i = 0; i < 8; ++i) s.sorted[i] = s.w[i];
    lanes::sort_descending<O>(s.sorted);
    const F* v = s.sorted;
    const F two = O::splat(2.0f), four = O::splat(4.0f);
    s.base = (sum - two) + (shift_bit ? -half_sum : half_sum);
    // Parity repair (2·v8) of the even (c0, c2, c4, c5) and the odd (c1, c3, c6, c7) classes.
    const F repair = two * v[7];
    const F even_repair = O::select(odd, repair, zero), odd_repair = O::select(odd, zero, repair);
    const int tag = 8 * shift_bit;
    offer(l, s.base - even_repair, O::splat(-3.0e38f), O::splat_int(tag));
    F inc = zero;  // Σ of the top k increments 2·v − 2 of code 1
    for (int k = 1; k <= 4; ++k) {
      inc = inc + (two * v[k - 1] - two);
      const F value = (s.base + inc) - ((k & 1) ? odd_repair : even_repair);
      offer(l, value, value - two * (v[k - 1] - v[k]), O::splat_int(tag + k));
    }
    s.c7_bound = (s.base + (inc + (two * v[4] - two))) - odd_repair;
    const F inc_two = four * v[0] - O::splat(6.0f);
    F value = (s.base + inc_two) - even_repair;
    offer(l, value, value - four * (v[0] - v[1]), O::splat_int(tag + 5));
    value = (s.base + (inc_two + (two * v[1] - two))) - odd_repair;
    offer(l, value, value - two * O::min_of(v[0] - v[1], v[1] - v[2]), O::splat_int(tag + 6));
  }

  /// What the c7 loop carries from set to set.
  struct NormTwelveBest {
    F best, second;
    I key;
  };

  /// One c7 set (compile-time coordinates), in set order: ties keep the earlier set.
  template <int N>
  E8KV_HD static E8KV_FORCE_INLINE void offer_norm_twelve_set(const Shift& s, const F& total, const F& cap,
                                                              const I& wrong_parity, NormTwelveBest& r) {
    typedef NormTwelveConstants<N> C;
    const F zero = O::splat(0.0f), two = O::splat(2.0f);
    const F& a = s.w[C::kHalf0];
    const F& b = s.w[C::kHalf1];
    const F& d = s.w[C::kHalf2];
    // Repair: the cheaper of a ½ coordinate (2·w) and a 3/2 coordinate (6·w, at best 6·v8).
    const F repair = O::min_of(two * O::min_of(O::min_of(a, b), d), cap);
    const F value = (s.base + (total - two * ((a + b) + d))) - O::select(wrong_parity, repair, zero);
    const I better = O::gt(value, r.best);
    r.second = O::max_of(r.second, O::select(better, r.best, value));
    r.best = O::max_of(r.best, value);
    r.key = O::select(better, O::splat_int(C::kKey), r.key);
  }

  template <int... N>
  E8KV_HD static E8KV_FORCE_INLINE void offer_norm_twelve_sets(std::integer_sequence<int, N...>, const Shift& s, const F& total,
                                                               const F& cap, const I& wrong_parity, NormTwelveBest& r) {
    const int in_order[] = {(offer_norm_twelve_set<N>(s, total, cap, wrong_parity, r), 0)...};
    (void)in_order;
  }

  /// Offers the best c7 pattern of one shift, with the second best as its runner-up bound.
  E8KV_HD static E8KV_FORCE_INLINE void offer_norm_twelve(const Shift& s, int shift_bit, Leader& l) {
    const F cap = O::splat(6.0f) * s.sorted[7];
    const I wrong_parity = ~s.odd;  // c7 has parity 1
    const F total = O::splat(2.0f) * s.sum - O::splat(10.0f);
    NormTwelveBest r{O::splat(-3.0e38f), O::splat(-3.0e38f), O::splat_int(0)};
    offer_norm_twelve_sets(std::make_integer_sequence<int, 29>{}, s, total, cap, wrong_parity, r);
    offer(l, r.best, r.second, r.key | O::splat_int(0x10000 | shift_bit << 17));
  }

  /// The certified search on sanitized z (lane k: block k). Returns the mask of the lanes whose
  /// nearest codeword is unique by more than the margin; for those, the codeword's index is
  /// index_of(key, low_bits) of the lane. The caller decides the other lanes.
  E8KV_HD static E8KV_FORCE_INLINE I run(const F z[8], I& key_out, I& low_bits_out) {
    const F zero = O::splat(0.0f);
    F sum = zero, magnitude_sum = zero;
    for (int i = 0; i < 8; ++i) {
      sum = sum + z[i];
      magnitude_sum = magnitude_sum + O::abs_value(z[i]);
    }
    const F half_sum = O::splat(0.5f) * sum;
    // The float error of every key (reference or estimate) stays below ~500·2^-24·(Σ|z| + 4).
    const F margin = (magnitude_sum + O::splat(8.0f)) * O::splat(0x1.0p-13f);
    Leader l{O::splat(-3.0e38f), O::splat(-3.0e38f), O::splat(-3.0e38f), O::splat_int(0)};
    Shift s[2];
    offer_shift(z, half_sum, 0, s[0], l);
    offer_shift(z, half_sum, 1, s[1], l);
    // c7 only where it may win. Written out per shift: s[shift_bit] in a loop that nvcc does not
    // unroll (it holds a branch) would put both Shift records in local memory.
    if (O::any(O::ge(s[0].c7_bound, l.best - margin))) offer_norm_twelve(s[0], 0, l);
    else l.others = O::max_of(l.others, s[0].c7_bound);
    if (O::any(O::ge(s[1].c7_bound, l.best - margin))) offer_norm_twelve(s[1], 1, l);
    else l.others = O::max_of(l.others, s[1].c7_bound);
    I certified = O::gt(l.best - O::max_of(l.runner_up, l.others), margin);
    // One lane: stop at the first failed certificate. W lanes: branch-free to the end (a lane
    // that fails is simply not taken; testing every lane here costs more than it saves).
    if (O::kWidth == 1 && !O::any(certified)) return certified;
    // The winner's pattern key from its class and the sorted magnitudes of its shift: codes 1 on
    // w ≥ v_k for ck (k = 1..4); c5: code 2 on w ≥ v1; c6: 2 on w ≥ v1, 1 on v2 ≤ w < v1. The
    // class gaps are positive, so the thresholds select exactly the right coordinates.
    const I is_c7 = O::ne(l.winner & O::splat_int(0x10000), O::splat_int(0));
    const I shift_bit = O::select(is_c7, l.winner >> 17, l.winner >> 3) & O::splat_int(1);
    const I upper = O::ne(shift_bit, O::splat_int(0));
    const I cls = l.winner & O::splat_int(7);
    F w[8], sorted[4];
    for (int i = 0; i < 8; ++i) w[i] = O::select(upper, s[1].w[i], s[0].w[i]);
    for (int k = 0; k < 4; ++k) sorted[k] = O::select(upper, s[1].sorted[k], s[0].sorted[k]);
    const I odd = O::select(upper, s[1].odd, s[0].odd);
    const F never = O::splat(3.0e38f);
    F one_threshold = never;
    for (int k = 1; k <= 4; ++k) one_threshold = O::select(O::eq(cls, O::splat_int(k)), sorted[k - 1], one_threshold);
    one_threshold = O::select(O::eq(cls, O::splat_int(6)), sorted[1], one_threshold);
    const F two_threshold = O::select(O::eq(cls, O::splat_int(5)) | O::eq(cls, O::splat_int(6)), sorted[0], never);
    I key = O::splat_int(0);
    for (int i = 0; i < 8; ++i) {
      const I code = O::select(O::ge(w[i], two_threshold), O::splat_int(2),
                               O::select(O::ge(w[i], one_threshold), O::splat_int(1), O::splat_int(0)));
      key = key | (code << code_shift(i));
    }
    key = O::select(is_c7, l.winner & O::splat_int(0xFFFF), key);
    // The sign vector: the next best flips the two smallest a_i·w_i (right parity) or the second
    // smallest instead of the smallest (wrong parity); its certificate, then index_for's rule
    // (the first coordinate with the smallest a_i·w_i flips on wrong parity).
    F m1 = never, m2 = never, aw[8];
    I code_sum = O::splat_int(0);
    for (int i = 0; i < 8; ++i) {
      const I code = (key >> code_shift(i)) & O::splat_int(3);
      code_sum = code_sum + code;
      aw[i] = (O::to_float(code) + O::splat(0.5f)) * w[i];
      m2 = O::min_of(m2, O::max_of(m1, aw[i]));
      m1 = O::min_of(m1, aw[i]);
    }
    const I wrong = O::ne(O::ne(code_sum & O::splat_int(1), O::splat_int(0)), odd);
    const F four = O::splat(4.0f);
    const F sign_gap = O::select(wrong, four * (m2 - m1), four * (m1 + m2));
    certified = certified & O::gt(sign_gap, margin);
    if (O::kWidth == 1 && !O::any(certified)) return certified;
    const F t = O::select(upper, O::splat(-0.25f), O::splat(0.25f));
    I negative = O::splat_int(0), found = O::splat_int(0), flip = O::splat_int(0);
    for (int i = 0; i < 8; ++i) {
      negative = negative | (O::lt(z[i] - t, zero) & O::splat_int(1 << i));
      const I first = O::eq(aw[i], m1) & ~found;
      flip = flip | (first & O::splat_int(1 << i));
      found = found | first;
    }
    negative = negative ^ (flip & wrong);
    key_out = key;
    low_bits_out = (negative & O::splat_int(0xFE)) | shift_bit;
    return certified;
  }

  /// The index of a certified lane k.
  E8KV_HD static E8KV_FORCE_INLINE uint32_t index_of(const I& key, const I& low_bits, int k) {
    return static_cast<uint32_t>(pattern_id(static_cast<uint32_t>(O::lane(key, k)))) << 8 |
           static_cast<uint32_t>(O::lane(low_bits, k));
  }
};

/// The certified search on one sanitized z: true (and *index set) when the nearest codeword is
/// unique by more than the margin; false when the caller must decide otherwise.
E8KV_HD inline bool certified_search(const float z[8], uint32_t* index) {
  typedef CertifiedSearch<lanes::Scalar> Search;
  int32_t key = 0, low_bits = 0;
  if (!Search::run(z, key, low_bits)) return false;
  *index = Search::index_of(key, low_bits, 0);
  return true;
}

/// The exhaustive search on a sanitized z, in the caller's execution space.
E8KV_HD E8KV_FORCE_INLINE uint32_t search(const float z[8]) {
#if E8KV_ON_DEVICE
  return search_generic(z);
#else
  return search_host(z);
#endif
}

/// E8P's exhaustive search as the fallback policies take it (search_fallback.hpp).
struct Exhaustive {
  E8KV_HD static E8KV_FORCE_INLINE uint32_t search(const float z[8]) { return e8p_detail::search(z); }
  E8KV_HD static E8KV_FORCE_INLINE SearchCandidate slice(const float z[8], uint32_t slice, uint32_t slices) {
    return search_slice(z, slice, slices);
  }
  /// The index of the winning candidate of all slices.
  E8KV_HD static E8KV_FORCE_INLINE uint32_t index_of(const float z[8], const SearchCandidate& winner) {
    return index_for(z, winner.order & 0xFFu, winner.order >> 8);
  }
};

}  // namespace e8kv::codebook::e8p_detail
