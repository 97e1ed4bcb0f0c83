// E8P's certified class search (one block) and the exhaustive search's dispatch. Included by
// e8p.hpp; the derivation is below.
#pragma once

#include "e8kv/codebook/detail/e8p_tables.hpp"

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

constexpr NormTwelveSets build_norm_twelve_sets() {
  NormTwelveSets s{};
  for (int n = 0; n < 29; ++n) {
    int halves = 0;
    uint32_t key = 0;
    for (int i = 0; i < 8; ++i) {
      if (kNormTwelvePatterns[n][i] == '1') s.set[n].half[halves++] = static_cast<uint8_t>(i);
      else key |= 1u << code_shift(i);
    }
    s.set[n].key = static_cast<uint16_t>(key);
  }
  return s;
}

inline constexpr NormTwelveSets kHostNormTwelveSets = build_norm_twelve_sets();
#if defined(__CUDACC__)
static __constant__ NormTwelveSets kDeviceNormTwelveSets = build_norm_twelve_sets();
#endif

E8KV_HD E8KV_FORCE_INLINE const NormTwelveSets& norm_twelve_sets() {
#if E8KV_ON_DEVICE
  return kDeviceNormTwelveSets;
#else
  return kHostNormTwelveSets;
#endif
}

E8KV_HD E8KV_FORCE_INLINE float abs_value(float x) {
#if E8KV_ON_DEVICE
  return fabsf(x);
#else
  return std::fabs(x);
#endif
}

E8KV_HD E8KV_FORCE_INLINE uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
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
// values (±0) comes back is not specified; the class search only uses the values.
#if !E8KV_ON_DEVICE && (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && \
    defined(__SSE__)
#define E8KV_E8P_X86_MINMAX 1
#else
#define E8KV_E8P_X86_MINMAX 0
#endif
E8KV_HD E8KV_FORCE_INLINE float max_of(float a, float b) {
#if E8KV_ON_DEVICE
  return fmaxf(a, b);
#elif E8KV_E8P_X86_MINMAX && defined(__AVX__)
  float r;
  __asm__("vmaxss {%2, %1, %0|%0, %1, %2}" : "=x"(r) : "x"(a), "x"(b));
  return r;
#elif E8KV_E8P_X86_MINMAX
  __asm__("maxss {%1, %0|%0, %1}" : "+x"(a) : "x"(b));
  return a;
#else
  return a < b ? b : a;
#endif
}
E8KV_HD E8KV_FORCE_INLINE float min_of(float a, float b) {
#if E8KV_ON_DEVICE
  return fminf(a, b);
#elif E8KV_E8P_X86_MINMAX && defined(__AVX__)
  float r;
  __asm__("vminss {%2, %1, %0|%0, %1, %2}" : "=x"(r) : "x"(a), "x"(b));
  return r;
#elif E8KV_E8P_X86_MINMAX
  __asm__("minss {%1, %0|%0, %1}" : "+x"(a) : "x"(b));
  return a;
#else
  return a < b ? a : b;
#endif
}
#undef E8KV_E8P_X86_MINMAX

/// The class id of the norm-12 patterns (c7).
constexpr int kClassC7 = 7;

/// What the class search keeps of one shift.
struct ShiftClasses {
  float w[8];       // |z − t|
  float sorted[8];  // w sorted descending: v1 ≥ ... ≥ v8
  uint32_t odd;     // parity of the number of negative z_i − t
  float sum;        // W = Σ w
  float base;       // W − 2 + 2t·Σz
  float c7_bound;   // upper bound of every c7 key
};

/// The best candidate so far, its own runner-up bound, and the largest value of all others.
struct Leader {
  float best, best_runner_up, others;
  int winner;    // class (0..7) + 8·shift bit
  uint32_t key;  // pattern key of a c7 winner
};

E8KV_HD E8KV_FORCE_INLINE void offer(Leader& l, float value, float runner_up, int winner) {
  // Branch-free: the outcome is data dependent and unpredictable.
  const bool better = value > l.best;
  const int mask = -static_cast<int>(better);
  l.others = max_of(l.others, min_of(l.best, value));  // the loser joins the others
  l.best = max_of(l.best, value);
  l.best_runner_up = pick(better, runner_up, l.best_runner_up);
  l.winner = (winner & mask) | (l.winner & ~mask);
}

E8KV_HD E8KV_FORCE_INLINE void order_descending(float& a, float& b) {
  const float hi = max_of(a, b), lo = min_of(a, b);
  a = hi;
  b = lo;
}

/// Batcher's odd-even merge sort network for 8 values (19 comparators), descending, branch-free.
E8KV_HD E8KV_FORCE_INLINE void sort_descending(float v[8]) {
  order_descending(v[0], v[1]), order_descending(v[2], v[3]), order_descending(v[4], v[5]), order_descending(v[6], v[7]);
  order_descending(v[0], v[2]), order_descending(v[1], v[3]), order_descending(v[4], v[6]), order_descending(v[5], v[7]);
  order_descending(v[1], v[2]), order_descending(v[5], v[6]);
  order_descending(v[0], v[4]), order_descending(v[1], v[5]), order_descending(v[2], v[6]), order_descending(v[3], v[7]);
  order_descending(v[2], v[4]), order_descending(v[3], v[5]);
  order_descending(v[1], v[2]), order_descending(v[3], v[4]), order_descending(v[5], v[6]);
}

/// Offers the maxima of classes c0..c6 of one shift and records what c7 and the winner need.
E8KV_HD E8KV_FORCE_INLINE void offer_shift(const float z[8], float half_sum, int shift_bit, ShiftClasses& c,
                                           Leader& l) {
  const float t = shift_bit ? -0.25f : 0.25f;
  uint32_t signs = 0;
  c.sum = 0.0f;
  for (int i = 0; i < 8; ++i) {
    const float d = z[i] - t;  // never −0 (t ≠ 0), so the sign bit says d < 0
    signs ^= float_bits(d);
    c.w[i] = abs_value(d);
    c.sorted[i] = c.w[i];
    c.sum += c.w[i];
  }
  c.odd = signs >> 31;
  sort_descending(c.sorted);
  const float* v = c.sorted;
  c.base = (c.sum - 2.0f) + (shift_bit ? -half_sum : half_sum);
  // Parity repair (2·v8) of the even (c0, c2, c4, c5) and the odd (c1, c3, c6, c7) classes.
  const float repair = 2.0f * v[7];
  const float even_repair = c.odd ? repair : 0.0f, odd_repair = c.odd ? 0.0f : repair;
  const int tag = 8 * shift_bit;
  offer(l, c.base - even_repair, -3.0e38f, tag);
  float inc = 0.0f;  // Σ of the top k increments 2·v − 2 of code 1
  for (int k = 1; k <= 4; ++k) {
    inc += 2.0f * v[k - 1] - 2.0f;
    const float value = (c.base + inc) - ((k & 1) ? odd_repair : even_repair);
    offer(l, value, value - 2.0f * (v[k - 1] - v[k]), tag + k);
  }
  c.c7_bound = (c.base + (inc + (2.0f * v[4] - 2.0f))) - odd_repair;
  const float inc_two = 4.0f * v[0] - 6.0f;
  float value = (c.base + inc_two) - even_repair;
  offer(l, value, value - 4.0f * (v[0] - v[1]), tag + 5);
  value = (c.base + (inc_two + (2.0f * v[1] - 2.0f))) - odd_repair;
  offer(l, value, value - 2.0f * min_of(v[0] - v[1], v[1] - v[2]), tag + 6);
}

/// Offers the best c7 pattern of one shift, with the second best as its runner-up bound.
E8KV_HD inline void offer_norm_twelve(const ShiftClasses& c, int shift_bit, Leader& l) {
  const bool wrong_parity = c.odd == 0u;  // c7 has parity 1
  const float cap = 6.0f * c.sorted[7];
  const float total = 2.0f * c.sum - 10.0f;
  float best = -3.0e38f, second = -3.0e38f;
  uint32_t key = 0;
  for (int n = 0; n < 29; ++n) {
    const NormTwelveSet& set = norm_twelve_sets().set[n];
    const float a = c.w[set.half[0]], b = c.w[set.half[1]], d = c.w[set.half[2]];
    // Repair: the cheaper of a ½ coordinate (2·w) and a 3/2 coordinate (6·w, at best 6·v8).
    const float repair = min_of(2.0f * min_of(min_of(a, b), d), cap);
    const float value = (c.base + (total - 2.0f * ((a + b) + d))) - (wrong_parity ? repair : 0.0f);
    const bool better = value > best;
    second = max_of(second, min_of(best, value));
    best = max_of(best, value);
    key = better ? set.key : key;
  }
  const bool better = best > l.best;
  offer(l, best, second, kClassC7 + 8 * shift_bit);
  l.key = better ? key : l.key;
}

/// The pattern key of a certified winner of classes c0..c6: its class gaps are positive, so the
/// thresholds select exactly the right coordinates (ck: code 1 on w ≥ v_k; c5: code 2 on w ≥ v1;
/// c6: code 2 on w ≥ v1 and code 1 on v2 ≤ w < v1).
E8KV_HD inline uint32_t winner_key(const ShiftClasses& c, int cls) {
  const float one = cls >= 1 && cls <= 4 ? c.sorted[cls - 1] : cls == 6 ? c.sorted[1] : 3.0e38f;
  const float two = cls == 5 || cls == 6 ? c.sorted[0] : 3.0e38f;
  uint32_t key = 0;
  for (int i = 0; i < 8; ++i) {
    const uint32_t code = c.w[i] >= two ? 2u : (c.w[i] >= one ? 1u : 0u);
    key |= code << code_shift(i);
  }
  return key;
}

/// The certified search on a sanitized z: true (and *index set) when the nearest codeword is
/// unique by more than the margin; false when the caller must decide otherwise.
E8KV_HD inline bool certified_search(const float z[8], uint32_t* index) {
  float sum = 0.0f, magnitude_sum = 0.0f;
  for (int i = 0; i < 8; ++i) {
    sum += z[i];
    magnitude_sum += abs_value(z[i]);
  }
  const float half_sum = 0.5f * sum;
  // The float error of every key (reference or estimate) stays below ~500·2^-24·(Σ|z| + 4).
  const float margin = (magnitude_sum + 8.0f) * 0x1.0p-13f;
  Leader l{-3.0e38f, -3.0e38f, -3.0e38f, 0, 0u};
  ShiftClasses c[2];
  offer_shift(z, half_sum, 0, c[0], l);
  offer_shift(z, half_sum, 1, c[1], l);
  for (int shift_bit = 0; shift_bit < 2; ++shift_bit) {  // c7 only where it may win
    if (c[shift_bit].c7_bound >= l.best - margin) offer_norm_twelve(c[shift_bit], shift_bit, l);
    else l.others = max_of(l.others, c[shift_bit].c7_bound);
  }
  if (!(l.best - max_of(l.best_runner_up, l.others) > margin)) return false;
  const int shift_bit = l.winner >> 3, cls = l.winner & 7;
  const ShiftClasses& s = c[shift_bit];
  const uint32_t key = cls == kClassC7 ? l.key : winner_key(s, cls);
  // The sign vector of the winner: the next best flips the two smallest a_i·w_i (right parity)
  // or the second smallest instead of the smallest (wrong parity).
  float m1 = 3.0e38f, m2 = 3.0e38f;
  uint32_t code_sum = 0;
  for (int i = 0; i < 8; ++i) {
    const uint32_t code = (key >> code_shift(i)) & 3u;
    code_sum += code;
    const float aw = (static_cast<float>(code) + 0.5f) * s.w[i];
    m2 = min_of(m2, max_of(m1, aw));
    m1 = min_of(m1, aw);
  }
  const float sign_gap = (code_sum & 1u) != s.odd ? 4.0f * (m2 - m1) : 4.0f * (m1 + m2);
  if (!(sign_gap > margin)) return false;
  *index = index_for(z, static_cast<uint32_t>(pattern_id(key)), static_cast<uint32_t>(shift_bit));
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

}  // namespace e8kv::codebook::e8p_detail
