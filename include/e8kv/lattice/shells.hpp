// Shells of the E8 lattice and their absolute leaders.
//
// Every point y of E8 = D8 ∪ (D8 + ½·1) is a signed permutation of its absolute leader: |y|
// sorted in descending order. Coordinates are handled as "twice values" t = 2y (all even for
// the integer coset, all odd for the half-integer coset), so everything is an integer.
//
//   integer type: t even and Σ t/2 even. Every sign pattern keeps Σy even, so the orbit has
//                 8!/∏m_v! · 2^{#nonzero} points (m_v = multiplicity of the value v).
//   half type:    t odd. Flipping one sign changes Σy by an odd integer, so exactly half of the
//                 2^8 sign patterns are in E8: the orbit has 8!/∏m_v! · 2^7 points.
//
// The shell of squared norm 2m holds 240·σ3(m) points (σ3 = sum of cubes of divisors), because
// the theta series of E8 is the weight-4 Eisenstein series E4.
//
// Leader order (fixed, part of the ball-code index format): ascending squared norm, then
// ascending lexicographic order of the descending twice values. Ordering by norm first makes
// the table of a smaller ball a prefix of the table of a larger one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "e8kv/platform.hpp"
#include "e8kv/error.hpp"

namespace e8kv::lattice {

/// Largest ball radius² accepted by the host enumeration (about 10^6 leaders at the limit).
inline constexpr int kMaxEnumeratedSquaredNorm = 512;

/// One absolute leader of E8.
struct E8Leader {
  int32_t twice_abs[8];  ///< twice the absolute coordinates, descending
  int32_t squared_norm;  ///< ‖y‖² = Σ twice_abs² / 4 (always even)
  bool half_integer;     ///< true for the half-integer coset (all twice values odd)
  uint64_t orbit_size;   ///< number of E8 points whose absolute leader this is
};

/// All absolute leaders of the ball E8 ∩ {‖y‖² ≤ max_squared_norm}, in the fixed leader order.
struct E8LeaderTable {
  int max_squared_norm = 0;
  std::vector<E8Leader> leaders;
  /// offsets[i] = number of ball points with a leader before i; offsets.back() = ball size.
  std::vector<uint64_t> offsets;
  uint64_t ball_size() const { return offsets.empty() ? 0 : offsets.back(); }
};

/// n! / ∏ m_v! for the multiset of 8 values `sorted_values` (sorted, equal values adjacent).
E8KV_HD inline uint32_t e8_arrangement_count(const int32_t sorted_values[8]) {
  uint32_t count = 40320;  // 8!
  int run = 1;
  for (int i = 1; i <= 8; ++i) {
    if (i < 8 && sorted_values[i] == sorted_values[i - 1]) {
      ++run;
    } else {
      for (int f = 2; f <= run; ++f) count /= static_cast<uint32_t>(f);  // exact: multinomial
      run = 1;
    }
  }
  return count;
}

/// Number of E8 points with the absolute leader `twice_abs` (descending twice values; the caller
/// guarantees it is a leader of E8).
E8KV_HD inline uint64_t e8_orbit_size(const int32_t twice_abs[8]) {
  const bool half = (twice_abs[0] & 1) != 0;
  int sign_bits = 7;
  if (!half) {
    sign_bits = 0;
    for (int i = 0; i < 8; ++i) sign_bits += twice_abs[i] != 0;
  }
  return static_cast<uint64_t>(e8_arrangement_count(twice_abs)) << sign_bits;
}

/// Root `index` (0..239) of E8 as twice values: indices 0..111 are ±e_i ± e_j (i < j, pairs in
/// lexicographic order, then sign patterns (+,+), (+,−), (−,+), (−,−)); 112..239 are (±½)^8 with
/// an even number of minus signs, ordered by their sign mask. Computed, not tabulated.
E8KV_HD inline void e8_root_twice(int index, int32_t twice[8]) {
  for (int i = 0; i < 8; ++i) twice[i] = 0;
  if (index < 112) {
    const int pair = index >> 2;
    int i = 0, first_of_row = 0;
    while (pair >= first_of_row + (7 - i)) {  // row i holds the 7 - i pairs (i, j > i)
      first_of_row += 7 - i;
      ++i;
    }
    const int j = i + 1 + (pair - first_of_row);
    twice[i] = (index & 2) ? -2 : 2;
    twice[j] = (index & 1) ? -2 : 2;
    return;
  }
  // The k-th 8-bit mask with even popcount: k's 7 bits plus a parity bit in bit 7.
  const int k = index - 112;
  int parity = 0;
  for (int b = 0; b < 7; ++b) parity ^= (k >> b) & 1;
  const int mask = k | (parity << 7);
  for (int b = 0; b < 8; ++b) twice[b] = ((mask >> b) & 1) ? -1 : 1;
}

/// Number of E8 points with ‖y‖² = squared_norm: 240·σ3(squared_norm / 2), 1 for 0, 0 for odd
/// or negative norms.
E8KV_HD inline uint64_t e8_shell_size(int64_t squared_norm) {
  if (squared_norm < 0 || (squared_norm & 1)) return 0;
  if (squared_norm == 0) return 1;
  const int64_t m = squared_norm / 2;
  uint64_t sigma3 = 0;
  for (int64_t d = 1; d <= m; ++d)
    if (m % d == 0) sigma3 += static_cast<uint64_t>(d) * d * d;
  return 240 * sigma3;
}

namespace detail {

inline void enumerate_leaders(int position, int32_t max_value, int64_t remaining_4norm, bool half,
                              int32_t current[8], std::vector<E8Leader>& out) {
  if (position == 8) {
    E8Leader leader{};
    int64_t sum_twice = 0, norm4 = 0;
    for (int i = 0; i < 8; ++i) {
      leader.twice_abs[i] = current[i];
      sum_twice += current[i];
      norm4 += int64_t{current[i]} * current[i];
    }
    if (!half && (sum_twice / 2) % 2 != 0) return;  // integer type needs an even coordinate sum
    leader.squared_norm = static_cast<int32_t>(norm4 / 4);
    leader.half_integer = half;
    leader.orbit_size = e8_orbit_size(leader.twice_abs);
    out.push_back(leader);
    return;
  }
  // Values of this coordinate: same parity as the coset, at most the previous one, and the
  // smallest possible remaining coordinates (0 or 1 each) must still fit in the norm budget.
  const int32_t min_value = half ? 1 : 0;
  const int64_t tail_min = int64_t{8 - position - 1} * min_value * min_value;
  for (int32_t v = min_value; v <= max_value; v += 2) {
    const int64_t cost = int64_t{v} * v;
    if (cost + tail_min > remaining_4norm) break;
    current[position] = v;
    enumerate_leaders(position + 1, v, remaining_4norm - cost, half, current, out);
  }
}

}  // namespace detail

/// Enumerates the absolute leaders of E8 ∩ {‖y‖² ≤ max_squared_norm} (host; builds a new
/// table each call). Throws e8kv::Error unless 0 ≤ max_squared_norm ≤ kMaxEnumeratedSquaredNorm.
inline E8LeaderTable make_e8_leader_table(int max_squared_norm) {
  require(max_squared_norm >= 0 && max_squared_norm <= kMaxEnumeratedSquaredNorm,
          "make_e8_leader_table: max_squared_norm = " + std::to_string(max_squared_norm) +
              " is out of range; accepted 0.." + std::to_string(kMaxEnumeratedSquaredNorm));
  E8LeaderTable table;
  table.max_squared_norm = max_squared_norm;
  const int64_t budget = int64_t{4} * max_squared_norm;  // Σ twice² ≤ 4R
  int32_t current[8] = {};
  int32_t max_twice = 0;
  while (int64_t{max_twice + 1} * (max_twice + 1) <= budget) ++max_twice;
  for (int coset = 0; coset < 2; ++coset) {
    const bool half = coset == 1;
    const int32_t top = ((max_twice & 1) == (half ? 1 : 0)) ? max_twice : max_twice - 1;
    // Descending sequences: the first coordinate runs over all values, later ones are capped.
    for (int32_t v = top; v >= (half ? 1 : 0); v -= 2) {
      const int64_t cost = int64_t{v} * v;
      const int64_t tail_min = half ? 7 : 0;
      if (cost + tail_min > budget) continue;
      current[0] = v;
      detail::enumerate_leaders(1, v, budget - cost, half, current, table.leaders);
    }
  }
  std::sort(table.leaders.begin(), table.leaders.end(), [](const E8Leader& a, const E8Leader& b) {
    if (a.squared_norm != b.squared_norm) return a.squared_norm < b.squared_norm;
    return std::lexicographical_compare(a.twice_abs, a.twice_abs + 8, b.twice_abs, b.twice_abs + 8);
  });
  table.offsets.resize(table.leaders.size() + 1);
  table.offsets[0] = 0;
  for (size_t i = 0; i < table.leaders.size(); ++i)
    table.offsets[i + 1] = table.offsets[i] + table.leaders[i].orbit_size;
  return table;
}

/// The leader table of E8 ∩ {‖y‖² ≤ max_squared_norm}, built once per radius on first use and
/// kept for the life of the process (thread-safe). Same range check as make_e8_leader_table.
inline const E8LeaderTable& e8_leader_table(int max_squared_norm) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<const E8LeaderTable>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(max_squared_norm);
  if (it == cache.end())
    it = cache.emplace(max_squared_norm, std::make_unique<const E8LeaderTable>(make_e8_leader_table(max_squared_norm)))
             .first;
  return *it->second;
}

}  // namespace e8kv::lattice
