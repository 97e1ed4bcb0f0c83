// Counter-based, seedable pseudo-random bits: the same (seed, counter) gives the same 64 bits on
// every platform, on the host and on the device, in any order and on any thread.
//
// Built on SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014): a state advanced by the golden-ratio increment and passed through a bijective
// 64-bit finalizer. random_bits(seed, k) is exactly the k-th output (0-based) of the sequential
// SplitMix64 generator started from state `seed`, so it can be jumped to in O(1).
// Not cryptographic.
#pragma once

#include <cstdint>

#include "e8kv/platform.hpp"

namespace e8kv {

namespace detail {

/// Weyl-sequence increment of SplitMix64: 2^64 / golden ratio, odd.
inline constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;

/// The SplitMix64 output function (a bijection of 64-bit words; variant 13 of Stafford's mixers).
E8KV_HD E8KV_FORCE_INLINE constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace detail

/// One SplitMix64 step from state x: mix(x + gamma). A bijection, so distinct inputs always give
/// distinct outputs. splitmix64(0) = 0xE220A8397B1DCDAF (the generator's first output for seed 0).
E8KV_HD inline constexpr uint64_t splitmix64(uint64_t x) {
  return detail::splitmix64_mix(x + detail::kSplitMixGamma);
}

/// A seed for a sub-stream, e.g. derive_seed(config_seed, layer, kv_head). For fixed other
/// arguments it is a bijection of each of `base`, `a` and `b` (chained bijections), so two layers
/// (or two heads) of the same base never share a seed.
E8KV_HD inline constexpr uint64_t derive_seed(uint64_t base, uint64_t a, uint64_t b = 0) {
  return splitmix64(splitmix64(splitmix64(base) ^ a) ^ b);
}

/// 64 random bits for position `counter` of the stream `seed`: the counter-th output (0-based) of
/// SplitMix64 seeded with `seed`, i.e. mix(seed + (counter + 1) · gamma) in 64-bit wrap-around.
E8KV_HD inline constexpr uint64_t random_bits(uint64_t seed, uint64_t counter) {
  return detail::splitmix64_mix(seed + (counter + 1) * detail::kSplitMixGamma);
}

/// The top 53 bits of `bits` as a double uniformly spaced in [0, 1) (multiples of 2^-53).
E8KV_HD inline constexpr double bits_to_unit_double(uint64_t bits) {
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

/// One random sign per element index: -1 when bit (index % 64) of random_bits(seed, index / 64)
/// is set, +1 otherwise (64 signs per 64-bit draw).
E8KV_HD inline constexpr float random_sign(uint64_t seed, uint64_t index) {
  return ((random_bits(seed, index >> 6) >> (index & 63u)) & 1u) ? -1.0f : 1.0f;
}

}  // namespace e8kv
