// How the encoders of E8P and E81B finish the blocks that their quick searches leave open.
//
// Both encoders first run searches that settle almost every block (the certified class search,
// and E8P's fast path); the rest, near-ties (≈ 0.2 % of Gaussian E8P blocks, ≈ 0.5 % of Rvq3
// residuals for E81B), need the exhaustive search. The encoders hand that step to a fallback
// policy, which every lane calls, decided or not:
//  - SerialFallback (the default, host and device): the lane searches alone;
//  - cuda::detail::DeviceWarpFallback (the paged encode kernels): the lanes of a warp share the
//    search of each open block, one slice of the search order per lane
//    (cuda/warp_search.hpp), so one open lane no longer takes its whole warp through all 512
//    E8P patterns.
// Slices. Each exhaustive search returns the first maximum of a float key over a fixed order of
// candidates (its reference loop: E8P's search_generic, E81B's with the key −d²). Slice s of n
// holds the candidates whose place in that order is ≡ s (mod n).
// better() keeps the larger key, and on equal keys the earlier candidate: a total order on
// candidates, so combining slices in any grouping gives the reference's answer, bit for bit (the
// keys are the same float operations; inputs are sanitized, so no key is NaN).
#pragma once

#include <cstdint>

#include "e8kv/platform.hpp"

namespace e8kv::codebook {

/// One candidate of an exhaustive search: its key (larger is better) and its place in the order.
struct SearchCandidate {
  float key;
  uint32_t order;
};

/// The order of "no candidate yet" (a slice with nothing in it).
inline constexpr uint32_t kNoSearchCandidate = 0xFFFFFFFFu;

/// The better of two candidates of one search: the larger key; on equal keys the earlier one.
E8KV_HD E8KV_FORCE_INLINE SearchCandidate better_candidate(const SearchCandidate& a, const SearchCandidate& b) {
  if (a.order == kNoSearchCandidate) return b;
  if (b.order == kNoSearchCandidate) return a;
  return (b.key > a.key || (b.key == a.key && b.order < a.order)) ? b : a;
}

/// The lane finishes its own open block: the exhaustive search of `Search` (e8p_detail::Exhaustive,
/// e81b_detail::Exhaustive) on the sanitized input.
struct SerialFallback {
  template <class Search>
  E8KV_HD E8KV_FORCE_INLINE uint32_t resolve(const float z[8], bool decided, uint32_t index) const {
    return decided ? index : Search::search(z);
  }
};

/// Index of the lowest set bit of a non-zero mask.
E8KV_HD E8KV_FORCE_INLINE int lowest_set_bit(uint32_t mask) {
#if E8KV_ON_DEVICE
  return __ffs(static_cast<int>(mask)) - 1;
#else
  int bit = 0;
  while (!((mask >> bit) & 1u)) ++bit;
  return bit;
#endif
}

/// The lanes of a warp share the exhaustive searches of the blocks their quick searches left
/// open. For each open block in turn (lowest lane first): the owner's input goes to every lane,
/// lane l searches slice l of 32, an xor butterfly of better_candidate() hands every lane the
/// winner, and the owner turns it into its index. Decided lanes keep theirs. Written once over a
/// warp policy W, as cuda/rotated_attention_tile.hpp: W::kLanes per-lane statements (1 on the
/// device, cuda::detail::DeviceWarpFallback; 32 in tests/codebook/search_fallback_test.cpp) and
/// W's collective steps: ballot(pred) (bit l: lane l's pred), broadcast(v, src) (every lane gets
/// lane src's value), exchange_xor(v, m, out) (lane l gets lane l^m's value) and lane(l). All 32
/// lanes must call it together.
template <class Search, class W>
E8KV_HD E8KV_FORCE_INLINE void share_open_searches(const W& w, const float (&z)[W::kLanes][8],
                                                   const bool (&decided)[W::kLanes], uint32_t (&index)[W::kLanes]) {
  constexpr int L = W::kLanes;
  bool open_lane[L];
  for (int l = 0; l < L; ++l) open_lane[l] = !decided[l];
  uint32_t open = w.ballot(open_lane);
  while (open != 0u) {  // the same mask on every lane
    const int owner = lowest_set_bit(open);
    // cost-report: per-open-block pass (scripts/kernel_cost.py: one trip of this loop)
    open &= open - 1u;
    float zo[8][L];
    for (int i = 0; i < 8; ++i) {
      for (int l = 0; l < L; ++l) zo[i][l] = z[l][i];
      w.broadcast(zo[i], owner);
    }
    float key[L];
    uint32_t order[L];
    for (int l = 0; l < L; ++l) {
      float zl[8];
      for (int i = 0; i < 8; ++i) zl[i] = zo[i][l];
      const SearchCandidate c = Search::slice(zl, static_cast<uint32_t>(w.lane(l)), 32u);
      key[l] = c.key;
      order[l] = c.order;
    }
    for (int m = 16; m >= 1; m >>= 1) {
      float other_key[L];
      uint32_t other_order[L];
      w.exchange_xor(key, m, other_key);
      w.exchange_xor(order, m, other_order);
      for (int l = 0; l < L; ++l) {
        const SearchCandidate c = better_candidate(SearchCandidate{key[l], order[l]}, SearchCandidate{other_key[l], other_order[l]});
        key[l] = c.key;
        order[l] = c.order;
      }
    }
    for (int l = 0; l < L; ++l) {
      if (w.lane(l) != owner) continue;
      float zl[8];
      for (int i = 0; i < 8; ++i) zl[i] = zo[i][l];
      index[l] = Search::index_of(zl, SearchCandidate{key[l], order[l]});
    }
  }
}

}  // namespace e8kv::codebook
