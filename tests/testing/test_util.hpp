// Shared helpers for CPU tests: fixed, printed seeds.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>

namespace e8kv::test {

/// True in the sanitizer build (scripts/sanitize.sh). A test that checks one property over a
/// large matrix (every split point, every preset x frame x head_dim) runs a subset of it there:
/// the sanitizers need each code path once, the full matrix runs in the optimized build.
#if defined(E8KV_TEST_UNDER_SANITIZER)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif

/// A seeded engine that prints its seed once per test so any failure can be replayed.
inline std::mt19937_64 seeded_rng(uint64_t seed) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::printf("[seed] %s.%s: %llu\n", info ? info->test_suite_name() : "?", info ? info->name() : "?",
              static_cast<unsigned long long>(seed));
  return std::mt19937_64(seed);
}

}  // namespace e8kv::test
