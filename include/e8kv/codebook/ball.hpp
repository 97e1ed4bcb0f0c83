// Quality-tier block codes: E8 ball cuts with leader indexing.
//
//   Ball3 = E8 ∩ {‖y‖² ≤ 44}:   16,702,321 points, 24-bit index (≈ 3 bits per element)
//   Ball4 = E8 ∩ {‖y‖² ≤ 178}: 4,158,269,521 points, 32-bit index (≈ 4 bits per element)
//
// Index of a point y (twice values t = 2y, see lattice/shells.hpp):
//   index = offset[leader] + arrangement_rank · 2^{sign_bits} + signs
//   * leader: |t| sorted descending; the leaders are in the fixed order of shells.hpp (norm,
//     then lexicographic), so Ball3 indices equal Ball4 indices for the same point.
//   * arrangement_rank: rank of the positions of each distinct absolute value, largest value
//     first, as a mixed-radix number: digit v = colex rank (combinatorial number system) of the
//     positions holding v among the positions not taken by larger values, radix C(n_left, m_v);
//     the first value is the least significant digit.
//   * signs: integer type: one bit per nonzero coordinate (bit b = sign of the b-th nonzero
//     coordinate, 1 = negative); half type: bits 0..6 = signs of coordinates 0..6, the sign of
//     coordinate 7 follows from Σy even.
//   Indices ≥ the ball size (the 2^24 − 16,702,321 unused Ball3 indices, and for Ball3 any
//   index ≥ 2^24) decode to the origin.
//
// Encode is exact: the nearest codeword of s·x (s = kInputScale) under the Euclidean norm.
//   1. y = nearest E8 point of s·x (lattice/e8.hpp). If ‖y‖² ≤ R it is the answer: the code is
//      a subset of the lattice, so no codeword can be closer.
//   2. Otherwise (overload) search the leaders. For one leader ℓ the best point of its orbit
//      maximizes ⟨x, y⟩: put ℓ's values on the coordinates in the order of |x| with the signs of
//      x (rearrangement inequality); a half-type orbit needs an even number of sign flips, and if
//      x's signs have the wrong parity the best fix flips the sign of the smallest |x| (which
//      carries the smallest value of ℓ). The codeword is the leader maximizing
//      2⟨x, y⟩ − ‖y‖². Shells are visited from the largest norm down; a shell of norm n < ‖x‖²
//      cannot beat the best so far once 2‖x‖√n − n is below it (Cauchy–Schwarz), which ends
//      the search. This is exact up to float rounding of the scores (ties: lower leader wins).
//   Overload (step 2) happens for 9.8 % (Ball3) and 3.6 % (Ball4) of i.i.d. N(0,1) blocks at
//   kInputScale.
//
// Non-finite input: NaN coordinates count as 0, ±Inf and |x| > 2^16 are clamped to ±2^16; the
// result is the nearest codeword of the clamped vector (always a valid index).
//
// Tables: per leader a 50-bit key (Σt² in bits 40..49, then the eight descending twice values in
// 5-bit fields, first value highest) and a 32-bit offset. Keys ascend in leader order, so one
// binary search serves encode and one over the offsets serves decode. The host builds the tables
// once on first use (thread-safe); ball_table_host<R>() gives their addresses and sizes for
// upload. Under nvcc each translation unit has device copies (__device__ arrays) that
// upload_ball_tables() fills; decode/encode read them on the device.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "e8kv/platform.hpp"
#include "e8kv/error.hpp"
#include "e8kv/lattice/e8.hpp"
#include "e8kv/lattice/shells.hpp"
#include "e8kv/numeric/fp.hpp"

namespace e8kv::codebook {

/// The leader tables of one ball, wherever they live (host or device memory).
struct BallTableView {
  const uint64_t* keys = nullptr;     ///< `count` leader keys, strictly ascending
  const uint32_t* offsets = nullptr;  ///< `count + 1` offsets; offsets[count] = ball size
  int32_t count = 0;
};

namespace detail {

inline constexpr int kBallKeyValueBits = 5;  // twice values ≤ 31, i.e. radius² ≤ 240
inline constexpr float kBallInputLimit = 65536.0f;
inline constexpr int kBall3LeaderCount = 305;
inline constexpr int kBall4LeaderCount = 10693;

/// C(n, 0..8) packed 7 bits per entry (all are ≤ 70), evaluated at compile time.
E8KV_HD constexpr uint64_t packed_binomial_row(int n) {
  uint64_t row = 0, c = 1;
  for (int k = 0; k <= n; ++k) {
    row |= c << (7 * k);
    c = c * static_cast<uint64_t>(n - k) / static_cast<uint64_t>(k + 1);
  }
  return row;
}

/// C(n, k) for 0 ≤ n, k ≤ 8 (0 when k > n), from constants: no table in memory, no division.
E8KV_HD E8KV_FORCE_INLINE uint32_t small_binomial(int n, int k) {
  constexpr uint64_t r0 = packed_binomial_row(0), r1 = packed_binomial_row(1), r2 = packed_binomial_row(2);
  constexpr uint64_t r3 = packed_binomial_row(3), r4 = packed_binomial_row(4), r5 = packed_binomial_row(5);
  constexpr uint64_t r6 = packed_binomial_row(6), r7 = packed_binomial_row(7), r8 = packed_binomial_row(8);
  const uint64_t row = n <= 3 ? (n <= 1 ? (n == 0 ? r0 : r1) : (n == 2 ? r2 : r3))
                              : n <= 5 ? (n == 4 ? r4 : r5) : (n == 6 ? r6 : (n == 7 ? r7 : r8));
  return static_cast<uint32_t>((row >> (7 * k)) & 127u);
}

/// Key of a leader (descending twice values, each ≤ 31).
E8KV_HD E8KV_FORCE_INLINE uint64_t ball_leader_key(const int32_t desc[8]) {
  uint64_t norm4 = 0, packed = 0;
  for (int i = 0; i < 8; ++i) {
    norm4 += static_cast<uint64_t>(desc[i]) * static_cast<uint64_t>(desc[i]);
    packed = (packed << kBallKeyValueBits) | static_cast<uint64_t>(desc[i]);
  }
  return (norm4 << (8 * kBallKeyValueBits)) | packed;
}

E8KV_HD E8KV_FORCE_INLINE void ball_leader_from_key(uint64_t key, int32_t desc[8]) {
  for (int i = 7; i >= 0; --i) {
    desc[i] = static_cast<int32_t>(key & ((1u << kBallKeyValueBits) - 1));
    key >>= kBallKeyValueBits;
  }
}

E8KV_HD E8KV_FORCE_INLINE int32_t ball_key_norm4(uint64_t key) {
  return static_cast<int32_t>(key >> (8 * kBallKeyValueBits));
}

/// Sorts 8 values in descending order with a 19-comparator network (Knuth, TAOCP 5.3.4): no
/// data-dependent branches.
E8KV_HD E8KV_FORCE_INLINE void sort_descending8(int32_t v[8]) {
  constexpr int kPairs[19][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {0, 2}, {1, 3}, {4, 6}, {5, 7}, {1, 2}, {5, 6},
                                 {0, 4}, {3, 7}, {1, 5}, {2, 6}, {1, 4}, {3, 6}, {2, 4}, {3, 5}, {3, 4}};
  for (const auto& pair : kPairs) {
    const int32_t a = v[pair[0]], b = v[pair[1]];
    v[pair[0]] = a > b ? a : b;
    v[pair[1]] = a > b ? b : a;
  }
}

/// Leader position of `key`, or -1 when it is not a leader of the ball.
E8KV_HD inline int32_t find_ball_leader(const BallTableView& t, uint64_t key) {
  if (t.count <= 0) return -1;
  // Branch-free lower bound (the first index with keys[i] >= key): the answer stays in
  // [base, base + n] while n halves.
  int32_t base = 0, n = t.count;
  while (n > 1) {
    const int32_t half = n / 2;
    base = t.keys[base + half] < key ? base + half : base;
    n -= half;
  }
  const int32_t lo = base + (t.keys[base] < key ? 1 : 0);
  return (lo < t.count && t.keys[lo] == key) ? lo : -1;
}

/// Index of the ball point `twice` (twice values). Returns 0xFFFFFFFF when the point is not in
/// the ball (not an E8 point, or too long); callers pass ball points only.
E8KV_HD inline uint32_t ball_rank(const BallTableView& t, const int32_t twice[8]) {
  int32_t abs_values[8], desc[8];
  for (int i = 0; i < 8; ++i) {
    abs_values[i] = twice[i] < 0 ? -twice[i] : twice[i];
    if (abs_values[i] >= (1 << kBallKeyValueBits)) return 0xFFFFFFFFu;
    desc[i] = abs_values[i];
  }
  sort_descending8(desc);
  const int32_t leader = find_ball_leader(t, ball_leader_key(desc));
  if (leader < 0) return 0xFFFFFFFFu;
  const bool half = (desc[0] & 1) != 0;

  uint32_t signs = 0;
  int sign_bits = 0;
  if (half) {
    int64_t sum = 0;
    for (int i = 0; i < 8; ++i) sum += twice[i];
    if (sum % 4 != 0) return 0xFFFFFFFFu;  // odd coordinate sum: not in E8
    for (int i = 0; i < 7; ++i) signs |= static_cast<uint32_t>(twice[i] < 0) << i;
    sign_bits = 7;
  } else {
    int64_t sum = 0;
    for (int i = 0; i < 8; ++i) {
      sum += twice[i];
      if (twice[i] != 0) signs |= static_cast<uint32_t>(twice[i] < 0) << sign_bits++;
    }
    if ((sum / 2) % 2 != 0) return 0xFFFFFFFFu;
  }

  // Arrangement rank: per distinct value (largest first), colex rank of its positions among the
  // positions still free, as a mixed-radix digit.
  int32_t free_positions[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  int free_count = 8;
  uint32_t rank = 0, radix = 1;
  for (int i = 0; i < 8;) {
    const int32_t v = desc[i];
    int m = 1;
    while (i + m < 8 && desc[i + m] == v) ++m;
    if (i + m == 8) break;  // the smallest value fills what is left
    uint32_t digit = 0;
    int seen = 0, kept = 0;
    for (int j = 0; j < free_count; ++j) {
      const int32_t p = free_positions[j];
      const bool match = abs_values[p] == v;
      seen += match ? 1 : 0;
      digit += match ? small_binomial(j, seen) : 0u;
      free_positions[kept] = p;  // kept only when not a match
      kept += match ? 0 : 1;
    }
    rank += digit * radix;
    radix *= small_binomial(free_count, m);
    free_count = kept;
    i += m;
  }
  const uint64_t index = uint64_t{t.offsets[leader]} + (uint64_t{rank} << sign_bits) + signs;
  return static_cast<uint32_t>(index);
}

/// The ball point (twice values) with index `index`; the origin when index ≥ ball size.
E8KV_HD inline void ball_unrank(const BallTableView& t, uint32_t index, int32_t twice[8]) {
  for (int i = 0; i < 8; ++i) twice[i] = 0;
  if (t.count <= 0 || index >= t.offsets[t.count]) return;
  // Branch-free search for the last leader with offsets[leader] <= index (offsets[0] = 0).
  int32_t lo = 0, n = t.count;
  while (n > 1) {
    const int32_t half = n / 2;
    lo = t.offsets[lo + half] <= index ? lo + half : lo;
    n -= half;
  }
  int32_t desc[8];
  ball_leader_from_key(t.keys[lo], desc);
  const uint32_t local = index - t.offsets[lo];
  const bool half = (desc[0] & 1) != 0;
  int sign_bits = 7;
  if (!half) {
    sign_bits = 0;
    for (int i = 0; i < 8; ++i) sign_bits += desc[i] != 0;
  }
  const uint32_t signs = local & ((1u << sign_bits) - 1u);
  uint32_t rank = local >> sign_bits;

  int32_t abs_values[8] = {};
  int32_t free_positions[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  int free_count = 8;
  for (int i = 0; i < 8;) {
    const int32_t v = desc[i];
    int m = 1;
    while (i + m < 8 && desc[i + m] == v) ++m;
    if (i + m == 8) {
      for (int j = 0; j < free_count; ++j) abs_values[free_positions[j]] = v;
      break;
    }
    const uint32_t radix = small_binomial(free_count, m);
    uint32_t digit = rank % radix;
    rank /= radix;
    bool chosen[8] = {};
    for (int c = m; c >= 1; --c) {  // colex unrank: largest j < free_count with C(j, c) ≤ digit
      int j = c - 1;                  // C(j, c) increases with j ≥ c − 1: count the ones that fit
      for (int jj = c; jj < 8; ++jj) j += (jj < free_count && small_binomial(jj, c) <= digit) ? 1 : 0;
      chosen[j] = true;
      digit -= small_binomial(j, c);
    }
    int kept = 0;
    for (int j = 0; j < free_count; ++j) {
      if (chosen[j])
        abs_values[free_positions[j]] = v;
      else
        free_positions[kept++] = free_positions[j];
    }
    free_count = kept;
    i += m;
  }

  if (half) {
    int32_t sum = 0;
    for (int i = 0; i < 7; ++i) {
      twice[i] = ((signs >> i) & 1u) ? -abs_values[i] : abs_values[i];
      sum += twice[i];
    }
    twice[7] = ((sum + abs_values[7]) % 4 == 0) ? abs_values[7] : -abs_values[7];
  } else {
    int b = 0;
    for (int i = 0; i < 8; ++i) {
      twice[i] = abs_values[i];
      if (abs_values[i] != 0 && ((signs >> b++) & 1u)) twice[i] = -abs_values[i];
    }
  }
}

/// Exact nearest ball point to x (already scaled and finite) by the leader search described at
/// the top of this file. Visits every leader at worst; used for overloaded inputs.
E8KV_HD inline void ball_nearest_by_leaders(const BallTableView& t, const float x[8], int32_t twice[8]) {
  float sorted_abs[8];
  int32_t position[8];
  bool negative[8];
  for (int i = 0; i < 8; ++i) {
    negative[i] = x[i] < 0.0f;
    sorted_abs[i] = negative[i] ? -x[i] : x[i];
    position[i] = i;
  }
  for (int i = 1; i < 8; ++i) {  // stable: equal magnitudes keep index order
    const float a = sorted_abs[i];
    const int32_t p = position[i];
    int j = i - 1;
    while (j >= 0 && sorted_abs[j] < a) {
      sorted_abs[j + 1] = sorted_abs[j];
      position[j + 1] = position[j];
      --j;
    }
    sorted_abs[j + 1] = a;
    position[j + 1] = p;
  }
  float norm2 = 0.0f;
  for (int i = 0; i < 8; ++i) norm2 = fp::add(norm2, fp::mul(sorted_abs[i], sorted_abs[i]));
  const float norm = sqrtf(norm2);
  // Signs of x in sorted order decide the parity of half-type candidates.
  int32_t negative_sorted[8];
  for (int i = 0; i < 8; ++i) negative_sorted[i] = negative[position[i]] ? 1 : 0;

  float best = -INFINITY;
  int32_t best_leader = 0;
  bool best_flip = false;
  int32_t shell_norm4 = -1;
  for (int32_t leader = t.count - 1; leader >= 0; --leader) {
    const uint64_t key = t.keys[leader];
    const int32_t norm4 = ball_key_norm4(key);
    if (norm4 != shell_norm4) {
      shell_norm4 = norm4;
      const float n = static_cast<float>(norm4) * 0.25f;
      if (n < norm2) {
        const float bound = fp::add(fp::mul(2.0f * norm, sqrtf(n)), -n);
        const float margin = 1e-3f * fp::add(fp::add(1.0f, norm2), n);
        if (bound < fp::add(best, -margin)) break;  // smaller shells are bounded lower still
      }
    }
    int32_t desc[8];
    ball_leader_from_key(key, desc);
    float score = 0.0f;  // 2⟨x, y⟩ with y = leader aligned to x
    for (int i = 0; i < 8; ++i) score = fp::add(score, fp::mul(sorted_abs[i], static_cast<float>(desc[i])));
    bool flip = false;
    if (desc[0] & 1) {
      int32_t signed_sum = 0;
      for (int i = 0; i < 8; ++i) signed_sum += negative_sorted[i] ? -desc[i] : desc[i];
      if (signed_sum % 4 != 0) {
        flip = true;
        score = fp::add(score, -2.0f * fp::mul(sorted_abs[7], static_cast<float>(desc[7])));
      }
    }
    const float objective = fp::add(score, -static_cast<float>(norm4) * 0.25f);
    if (objective >= best) {  // downward scan: a tie goes to the lower leader
      best = objective;
      best_leader = leader;
      best_flip = flip;
    }
  }
  int32_t desc[8];
  ball_leader_from_key(t.keys[best_leader], desc);
  for (int i = 0; i < 8; ++i) twice[position[i]] = negative_sorted[i] ? -desc[i] : desc[i];
  if (best_flip) twice[position[7]] = -twice[position[7]];
}

/// Host storage of one ball's tables.
struct BallTableStorage {
  std::vector<uint64_t> keys;
  std::vector<uint32_t> offsets;
  BallTableView view() const { return {keys.data(), offsets.data(), static_cast<int32_t>(keys.size())}; }
};

inline BallTableStorage build_ball_tables(int max_squared_norm) {
  const lattice::E8LeaderTable leaders = lattice::make_e8_leader_table(max_squared_norm);
  require(leaders.ball_size() <= 0xFFFFFFFFull, "ball code: the ball of radius² " + std::to_string(max_squared_norm) +
                                                    " has more than 2^32 points; accepted radius² ≤ 178");
  BallTableStorage s;
  s.keys.reserve(leaders.leaders.size());
  s.offsets.reserve(leaders.leaders.size() + 1);
  for (size_t i = 0; i < leaders.leaders.size(); ++i) {
    s.keys.push_back(ball_leader_key(leaders.leaders[i].twice_abs));
    s.offsets.push_back(static_cast<uint32_t>(leaders.offsets[i]));
  }
  s.offsets.push_back(static_cast<uint32_t>(leaders.ball_size()));
  return s;
}

}  // namespace detail

/// Host tables of the ball E8 ∩ {‖y‖² ≤ MaxSquaredNorm}, built on first use (thread-safe).
/// Pointers stay valid for the life of the process; this is what CUDA code uploads.
template <int MaxSquaredNorm>
inline BallTableView ball_table_host() {
  static const detail::BallTableStorage storage = detail::build_ball_tables(MaxSquaredNorm);
  return storage.view();
}

#if defined(__CUDACC__)
namespace detail {
// One copy per translation unit (whole-program compilation); filled by upload_ball_tables().
static __device__ uint64_t g_ball3_keys[kBall3LeaderCount];
static __device__ uint32_t g_ball3_offsets[kBall3LeaderCount + 1];
static __device__ uint64_t g_ball4_keys[kBall4LeaderCount];
static __device__ uint32_t g_ball4_offsets[kBall4LeaderCount + 1];
}  // namespace detail

/// Copies the Ball3 and Ball4 tables into this translation unit's device copies. Call it once
/// (per device) from every .cu file whose kernels encode or decode ball codes, before launching.
static inline cudaError_t upload_ball_tables() {
  const BallTableView b3 = ball_table_host<44>();
  const BallTableView b4 = ball_table_host<178>();
  if (b3.count != detail::kBall3LeaderCount || b4.count != detail::kBall4LeaderCount) return cudaErrorInvalidValue;
  cudaError_t e = cudaMemcpyToSymbol(detail::g_ball3_keys, b3.keys, sizeof(detail::g_ball3_keys));
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(detail::g_ball3_offsets, b3.offsets, sizeof(detail::g_ball3_offsets));
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(detail::g_ball4_keys, b4.keys, sizeof(detail::g_ball4_keys));
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(detail::g_ball4_offsets, b4.offsets, sizeof(detail::g_ball4_offsets));
  return e;
}
#endif

/// E8 ∩ {‖y‖² ≤ MaxSquaredNorm} with a leader index of IndexBits bits.
template <int MaxSquaredNorm, int IndexBits>
struct E8BallCode {
  static_assert(MaxSquaredNorm == 44 || MaxSquaredNorm == 178,
                "E8BallCode: device tables exist for radius² 44 (Ball3) and 178 (Ball4)");
  static constexpr int kMaxSquaredNorm = MaxSquaredNorm;
  static constexpr int kIndexBits = IndexBits;
  static constexpr int kLeaderCount = MaxSquaredNorm == 44 ? detail::kBall3LeaderCount : detail::kBall4LeaderCount;

  /// The tables in the memory of the caller (host tables on the host, device copies on the device).
  E8KV_HD static BallTableView table() {
#if E8KV_ON_DEVICE
    if constexpr (MaxSquaredNorm == 44)
      return {detail::g_ball3_keys, detail::g_ball3_offsets, detail::kBall3LeaderCount};
    else
      return {detail::g_ball4_keys, detail::g_ball4_offsets, detail::kBall4LeaderCount};
#else
    return ball_table_host<MaxSquaredNorm>();
#endif
  }

  /// Number of codewords (host).
  static uint64_t size() {
    const BallTableView t = ball_table_host<MaxSquaredNorm>();
    return t.offsets[t.count];
  }

  /// Index of a ball point given as twice values; 0xFFFFFFFF when it is not a ball point.
  E8KV_HD static uint32_t index_of(const int32_t twice[8]) { return detail::ball_rank(table(), twice); }

  /// Ball point (twice values) of an index; the origin for index ≥ size().
  E8KV_HD static void point_of(uint32_t index, int32_t twice[8]) { detail::ball_unrank(table(), index, twice); }

  /// Exact nearest ball point to `scaled` (finite, in lattice units), as twice values.
  E8KV_HD static void nearest_point(const float scaled[8], int32_t twice[8]) {
    int64_t t64[8];
    lattice::nearest_e8_twice(scaled, t64);
    int64_t norm4 = 0;
    for (int i = 0; i < 8; ++i) norm4 += t64[i] * t64[i];
    if (norm4 <= int64_t{4} * MaxSquaredNorm) {
      for (int i = 0; i < 8; ++i) twice[i] = static_cast<int32_t>(t64[i]);
      return;
    }
    detail::ball_nearest_by_leaders(table(), scaled, twice);
  }

  /// Input in lattice units: sanitized (NaN → 0, clamp ±2^16) and multiplied by `scale`.
  E8KV_HD static void scale_input(const float x[8], float scale, float scaled[8]) {
    for (int i = 0; i < 8; ++i) scaled[i] = fp::mul(fp::sanitize(x[i], detail::kBallInputLimit), scale);
  }

  /// The code's encode and decode for an input scale (each ball code fixes its own).
  E8KV_HD static uint32_t encode_scaled(const float x[8], float input_scale) {
    float s[8];
    int32_t t[8];
    scale_input(x, input_scale, s);
    nearest_point(s, t);
    return index_of(t);
  }
  /// half_over_scale: 0.5 / the input scale (points are held as twice values).
  E8KV_HD static void decode_scaled(uint32_t index, float half_over_scale, float y[8]) {
    int32_t t[8];
    point_of(index, t);
    for (int i = 0; i < 8; ++i) y[i] = fp::mul(static_cast<float>(t[i]), half_over_scale);
  }
};

/// 3 bits per element: the 16,702,321 E8 points with ‖y‖² ≤ 44 (24-bit index).
struct Ball3 : E8BallCode<44, 24> {
  static constexpr const char* kName = "ball3";
  /// Scale minimizing the MSE on i.i.d. N(0,1) input (golden-section search, 2·10^5 blocks).
  static constexpr float kInputScale = 1.813f;

  E8KV_HD static uint32_t encode(const float x[8]) { return encode_scaled(x, kInputScale); }
  E8KV_HD static void decode(uint32_t index, float y[8]) { decode_scaled(index, 0.5f / kInputScale, y); }
};

/// 4 bits per element: the 4,158,269,521 E8 points with ‖y‖² ≤ 178 (32-bit index).
struct Ball4 : E8BallCode<178, 32> {
  static constexpr const char* kName = "ball4";
  static constexpr float kInputScale = 3.28f;

  E8KV_HD static uint32_t encode(const float x[8]) { return encode_scaled(x, kInputScale); }
  E8KV_HD static void decode(uint32_t index, float y[8]) { decode_scaled(index, 0.5f / kInputScale, y); }
};

}  // namespace e8kv::codebook
