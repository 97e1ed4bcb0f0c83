// Shared helpers for CPU tests: fixed, printed seeds.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>

namespace e8kv::test {

/// A seeded engine that prints its seed once per test so any failure can be replayed.
inline std::mt19937_64 seeded_rng(uint64_t seed) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::printf("[seed] %s.%s: %llu\n", info ? info->test_suite_name() : "?", info ? info->name() : "?",
              static_cast<unsigned long long>(seed));
  return std::mt19937_64(seed);
}

}  // namespace e8kv::test
