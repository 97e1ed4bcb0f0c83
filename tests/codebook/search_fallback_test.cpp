// The sliced exhaustive searches and the warp-shared fallback (codebook/detail/search_fallback.hpp)
// against the one-lane searches they replace on the device: the same index, bit for bit, near-ties
// and exact ties included. The warp runs emulated on the CPU (32 lanes, the device's shuffles).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cmath>
#include <random>
#include <type_traits>
#include <vector>

#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "testing/test_util.hpp"

namespace {

using e8kv::codebook::E81B;
using e8kv::codebook::E8P;
using e8kv::codebook::SearchCandidate;
namespace e8p_detail = e8kv::codebook::e8p_detail;
namespace e81b_detail = e8kv::codebook::e81b_detail;

std::array<float, 8> sanitized(const std::array<float, 8>& z) {
  std::array<float, 8> s{};
  for (int i = 0; i < 8; ++i) s[i] = e8kv::fp::sanitize(z[i], E8P::kMaxLatticeAbs);
  return s;
}

/// Inputs in lattice units where the exhaustive search decides: exact ties on ¼/⅛ grids,
/// midpoints of two nearby codewords (E8P) or points (E81B) with tiny noise, Gaussian at the
/// code's scale, huge (clamped) and zero coordinates.
template <class Code>
std::vector<std::array<float, 8>> hard_inputs(uint64_t seed, int count) {
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::uniform_int_distribution<int> grid(-10, 10);
  std::uniform_int_distribution<uint32_t> any_index(0, (1u << Code::kIndexBits) - 1);
  std::uniform_int_distribution<int> coordinate(0, 7);
  std::vector<std::array<float, 8>> out;
  for (int n = 0; n < count; ++n) {
    std::array<float, 8> z{};
    switch (n % 5) {
      case 0:
        for (float& v : z) v = grid(rng) * (n % 2 ? 0.25f : 0.125f);
        break;
      case 1: {
        float c[8], d[8], moved[8];
        Code::decode_lattice(any_index(rng), c);
        for (int i = 0; i < 8; ++i) moved[i] = c[i];
        moved[coordinate(rng)] += n % 2 ? 1.f : -1.f;
        moved[coordinate(rng)] += 0.5f;
        Code::decode_lattice(Code::encode_lattice(moved), d);
        const float noise = n % 3 == 0 ? 0.f : 1e-6f;
        for (int i = 0; i < 8; ++i) z[i] = 0.5f * (c[i] + d[i]) + noise * g(rng);
        break;
      }
      case 2:
        for (float& v : z) v = g(rng) * 1.03f;
        break;
      case 3:
        for (int i = 0; i < 8; ++i) z[i] = g(rng) * (i % 3 == 0 ? 1e4f : 3.f);
        break;
      default:
        for (int i = 0; i < 8; ++i) z[i] = (n + i) % 3 == 0 ? 0.f : g(rng) * 0.5f;
        break;
    }
    out.push_back(sanitized(z));
  }
  return out;
}

/// better_candidate() over the slices of `slices`, in ascending slice order or descending.
template <class Search>
SearchCandidate combined(const float* z, uint32_t slices, bool descending) {
  SearchCandidate best{0.f, e8kv::codebook::kNoSearchCandidate};
  for (uint32_t k = 0; k < slices; ++k) {
    const uint32_t s = descending ? slices - 1 - k : k;
    best = e8kv::codebook::better_candidate(best, Search::slice(z, s, slices));
  }
  return best;
}

TEST(SearchFallback, E8pSlicesCombineToTheExhaustiveSearch) {
  const uint64_t seed = 4101;
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  for (const auto& z : hard_inputs<E8P>(seed, 1500)) {
    const uint32_t expect = e8p_detail::search_generic(z.data());
    ASSERT_EQ(e8p_detail::search_host(z.data()), expect);
    for (uint32_t slices : {1u, 3u, 32u, 256u, 300u}) {
      for (bool descending : {false, true}) {
        const SearchCandidate c = combined<e8p_detail::Exhaustive>(z.data(), slices, descending);
        ASSERT_EQ(e8p_detail::Exhaustive::index_of(z.data(), c), expect) << slices << " " << descending;
      }
    }
  }
}

TEST(SearchFallback, E81bSlicesCombineToTheExhaustiveSearch) {
  const uint64_t seed = 4102;
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  for (const auto& z : hard_inputs<E81B>(seed, 1500)) {
    const uint32_t expect = e81b_detail::search_generic(z.data());
    for (uint32_t slices : {1u, 3u, 32u, 256u, 300u}) {
      for (bool descending : {false, true}) {
        const SearchCandidate c = combined<e81b_detail::Exhaustive>(z.data(), slices, descending);
        ASSERT_EQ(e81b_detail::Exhaustive::index_of(z.data(), c), expect) << slices << " " << descending;
      }
    }
  }
}

TEST(SearchFallback, BetterCandidateIsATotalOrderWithTheFirstMaximumOnTop) {
  const SearchCandidate none{5.f, e8kv::codebook::kNoSearchCandidate};
  const SearchCandidate a{1.f, 7}, b{1.f, 3}, c{2.f, 9}, z0{0.f, 4}, zn{-0.f, 2};
  using e8kv::codebook::better_candidate;
  EXPECT_EQ(better_candidate(none, a).order, 7u);
  EXPECT_EQ(better_candidate(a, none).order, 7u);
  EXPECT_EQ(better_candidate(a, b).order, 3u);  // equal keys: the earlier
  EXPECT_EQ(better_candidate(b, a).order, 3u);
  EXPECT_EQ(better_candidate(a, c).order, 9u);  // larger key, whatever the order
  EXPECT_EQ(better_candidate(c, b).order, 9u);
  EXPECT_EQ(better_candidate(z0, zn).order, 2u);  // +0 and −0 are equal keys
}

/// A warp of 32 lanes on the CPU with the device's collective steps (DeviceSearchWarp's).
struct EmulatedSearchWarp {
  static constexpr int kLanes = 32;
  int rounds = 0;  ///< broadcasts of a whole input (one per open block)
  int lane(int l) const { return l; }
  uint32_t ballot(const bool (&pred)[32]) const {
    uint32_t mask = 0;
    for (int l = 0; l < 32; ++l) mask |= static_cast<uint32_t>(pred[l]) << l;
    return mask;
  }
  void broadcast(float (&v)[32], int src) const {
    const float x = v[src];
    for (float& y : v) y = x;
  }
  template <class T>
  void exchange_xor(const T (&v)[32], int m, T (&out)[32]) const {
    for (int l = 0; l < 32; ++l) out[l] = v[l ^ m];
  }
};

/// Runs one warp: the quick searches per lane (certified class search, E8P's fast path), then
/// the shared fallback; returns the lanes' indices and counts the open lanes.
template <class Code, class Search>
std::array<uint32_t, 32> warp_encode(const std::vector<std::array<float, 8>>& in, size_t first, int* open_count,
                                     bool force_open) {
  float z[32][8];
  bool decided[32];
  uint32_t index[32];
  for (int l = 0; l < 32; ++l) {
    const auto& zl = in[(first + static_cast<size_t>(l)) % in.size()];
    for (int i = 0; i < 8; ++i) z[l][i] = zl[i];
    index[l] = 0xDEADBEEFu;
    if constexpr (std::is_same_v<Code, E8P>)
      decided[l] = e8p_detail::certified_search(z[l], &index[l]) || e8p_detail::fast_path(z[l], &index[l]);
    else
      decided[l] = e81b_detail::certified_search(z[l], &index[l]);
    if (force_open) decided[l] = false;
    *open_count += !decided[l];
  }
  EmulatedSearchWarp w;
  e8kv::codebook::share_open_searches<Search>(w, z, decided, index);
  std::array<uint32_t, 32> out{};
  for (int l = 0; l < 32; ++l) out[static_cast<size_t>(l)] = index[l];
  return out;
}

template <class Code, class Search>
void check_warps(uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const auto in = hard_inputs<Code>(seed, 2000);
  int open = 0, forced = 0;
  for (size_t first = 0; first < in.size(); first += 32) {
    const auto got = warp_encode<Code, Search>(in, first, &open, false);
    const auto all_open = warp_encode<Code, Search>(in, first, &forced, true);
    for (size_t l = 0; l < 32; ++l) {
      const float* z = in[(first + l) % in.size()].data();
      ASSERT_EQ(got[l], Code::encode_lattice(z)) << "warp at " << first << " lane " << l;
      // Forced open: the exhaustive search's own answer (on exact ties E8P's fast path may pick
      // another nearest codeword, which encode_lattice keeps).
      ASSERT_EQ(all_open[l], Search::search(z)) << "all open, warp at " << first << " lane " << l;
    }
  }
  // The families must exercise the fallback, not only the quick searches.
  EXPECT_GT(open, 50);
  EXPECT_EQ(forced, 32 * static_cast<int>((in.size() + 31) / 32));
}

TEST(SearchFallback, EmulatedWarpSharesE8pSearchesWithTheOneLaneResult) {
  check_warps<E8P, e8p_detail::Exhaustive>(4103);
}

TEST(SearchFallback, EmulatedWarpSharesE81bSearchesWithTheOneLaneResult) {
  check_warps<E81B, e81b_detail::Exhaustive>(4104);
}

TEST(SearchFallback, EmulatedWarpLeavesDecidedLanesAlone) {
  float z[32][8] = {};
  bool decided[32];
  uint32_t index[32];
  for (int l = 0; l < 32; ++l) {
    decided[l] = true;
    index[l] = 1000u + static_cast<uint32_t>(l);  // not what a search of z would return
  }
  EmulatedSearchWarp w;
  e8kv::codebook::share_open_searches<e8p_detail::Exhaustive>(w, z, decided, index);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(index[l], 1000u + static_cast<uint32_t>(l));
  decided[17] = false;  // one open lane: only it changes, to the exhaustive answer for zero input
  e8kv::codebook::share_open_searches<e8p_detail::Exhaustive>(w, z, decided, index);
  for (int l = 0; l < 32; ++l)
    EXPECT_EQ(index[l], l == 17 ? e8p_detail::search_generic(z[17]) : 1000u + static_cast<uint32_t>(l)) << l;
}

/// Is the block left open by the quick searches (so the fallback runs)?
bool e8p_open(const float* z) {
  float zs[8];
  for (int i = 0; i < 8; ++i) zs[i] = e8kv::fp::sanitize(z[i], E8P::kMaxLatticeAbs);
  uint32_t index = 0;
  return !e8p_detail::certified_search(zs, &index) && !e8p_detail::fast_path(zs, &index);
}
bool e81b_open(const float* z) {
  float zs[8];
  for (int i = 0; i < 8; ++i) zs[i] = e8kv::fp::sanitize(z[i], E81B::kMaxLatticeAbs);
  uint32_t index = 0;
  return !e81b_detail::certified_search(zs, &index);
}

TEST(SearchFallback, OpenBlocksAreRareOnGaussianBlocks) {
  // What the warp-shared fallback saves, on unit Gaussian blocks (a rotated vector's blocks at
  // the encoders' unit scale): per stage, the share of blocks left open. Before, a warp of 32
  // blocks ran the whole one-lane search (512 E8P patterns or 256 E81B points, every lane) when
  // any block was open; now each open block costs one shared pass of 16 (8) keys per lane.
  const uint64_t seed = 4105;
  const int blocks = 200000;
  auto rng = e8kv::test::seeded_rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  int open[5] = {};  // E8P; Rvq3 stage 1, stage 2 (E81B); Rvq4 stage 1, stage 2 (E8P)
  for (int b = 0; b < blocks; ++b) {
    float x[8];
    for (float& v : x) v = g(rng);
    float z[8];
    for (int i = 0; i < 8; ++i) z[i] = e8kv::fp::mul(x[i], E8P::kInputScale);
    open[0] += e8p_open(z);
    for (int rvq = 0; rvq < 2; ++rvq) {
      const float s1 = rvq == 0 ? e8kv::codebook::Rvq3::kInputScale : e8kv::codebook::Rvq4::kInputScale;
      const float s2 = rvq == 0 ? e8kv::codebook::Rvq3::kResidualScale : e8kv::codebook::Rvq4::kResidualScale;
      for (int i = 0; i < 8; ++i) z[i] = e8kv::fp::mul(x[i], s1);
      open[1 + 2 * rvq] += e8p_open(z);
      float c[8], r[8];
      E8P::decode_lattice(E8P::encode_lattice(z), c);
      for (int i = 0; i < 8; ++i) r[i] = e8kv::fp::mul(e8kv::fp::add(z[i], -c[i]), s2);
      open[2 + 2 * rvq] += rvq == 0 ? e81b_open(r) : e8p_open(r);
    }
  }
  const char* names[5] = {"E8P", "Rvq3 stage 1", "Rvq3 stage 2 (E81B)", "Rvq4 stage 1", "Rvq4 stage 2"};
  for (int k = 0; k < 5; ++k) {
    const double p = static_cast<double>(open[k]) / blocks;
    std::printf("[info] %-20s open %.4f %% of %d blocks (seed %llu); warps of 32 blocks with one open: %.2f %%\n",
                names[k], 100.0 * p, blocks, static_cast<unsigned long long>(seed), 100.0 * (1.0 - std::pow(1.0 - p, 32)));
    EXPECT_LT(p, 0.02) << names[k];  // the quick searches settle at least 98 % of blocks
  }
  EXPECT_GT(open[0], 0);  // and near-ties do occur: the fallback is exercised by real data
}

}  // namespace
