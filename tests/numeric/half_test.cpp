// Tests of the fp16 / bf16 conversions: every bit pattern decoded against the IEEE formula,
// exact round trips, and float -> half rounding against an independent exact reference (binary
// search over the decoded values, decided at the exactly computed midpoint).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "e8kv/numeric/half.hpp"
#include "testing/test_util.hpp"

namespace {
using e8kv::bf16_bits_to_float;
using e8kv::bf16_t;
using e8kv::float_to_bf16_bits;
using e8kv::float_to_fp16_bits;
using e8kv::fp16_bits_to_float;
using e8kv::fp16_t;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- independent decoders: the textbook formula, evaluated in double -----------------------

/// Value of an fp16 pattern (finite or Inf) from the IEEE 754 definition.
double fp16_reference_value(uint16_t h) {
  const int sign = h >> 15;
  const int exponent = (h >> 10) & 31;
  const int mantissa = h & 1023;
  double v;
  if (exponent == 31) {
    v = std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<double>(mantissa), -24);
  } else {
    v = std::ldexp(static_cast<double>(1024 + mantissa), exponent - 25);
  }
  return sign ? -v : v;
}

/// Value of a bf16 pattern (finite or Inf): 8 exponent bits (bias 127), 7 mantissa bits.
double bf16_reference_value(uint16_t b) {
  const int sign = b >> 15;
  const int exponent = (b >> 7) & 255;
  const int mantissa = b & 127;
  double v;
  if (exponent == 255) {
    v = std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<double>(mantissa), -133);
  } else {
    v = std::ldexp(static_cast<double>(128 + mantissa), exponent - 134);
  }
  return sign ? -v : v;
}

bool fp16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool bf16_is_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

/// Round-to-nearest-even reference for a finite, non-NaN float into a 16-bit format whose
/// positive patterns 0 .. inf_pattern are ordered by value. `value_of(p)` is the exact value of
/// pattern p, with `value_of(inf_pattern)` standing in for the next power of two so overflow
/// follows the same rule (IEEE: round with unbounded exponent, then overflow to Inf).
template <class ValueOf>
uint16_t reference_round(float f, uint16_t inf_pattern, ValueOf value_of) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(f)) return static_cast<uint16_t>(sign | inf_pattern);
  if (a >= value_of(inf_pattern)) return static_cast<uint16_t>(sign | inf_pattern);
  // Largest pattern lo with value(lo) <= a.
  uint32_t lo = 0;
  uint32_t hi = inf_pattern;  // value(hi) > a
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (value_of(static_cast<uint16_t>(mid)) <= a) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  // The sum of two neighbouring half values is exact in double, and so is 2a: compare exactly.
  const double twice = 2.0 * a;
  const double sum = value_of(static_cast<uint16_t>(lo)) + value_of(static_cast<uint16_t>(lo + 1));
  uint32_t r;
  if (twice < sum) {
    r = lo;
  } else if (twice > sum) {
    r = lo + 1;
  } else {
    r = (lo % 2 == 0) ? lo : lo + 1;  // tie: even pattern (even last mantissa bit)
  }
  return static_cast<uint16_t>(sign | r);
}

double fp16_positive_value(uint16_t p) { return p == 0x7c00 ? 65536.0 : fp16_reference_value(p); }
double bf16_positive_value(uint16_t p) { return p == 0x7f80 ? std::ldexp(1.0, 128) : bf16_reference_value(p); }

uint16_t fp16_reference_round(float f) { return reference_round(f, 0x7c00, fp16_positive_value); }
uint16_t bf16_reference_round(float f) { return reference_round(f, 0x7f80, bf16_positive_value); }

// ---- type properties -----------------------------------------------------------------------

TEST(Half, StorageTypesAreTwoByteTrivialStandardLayout) {
  static_assert(sizeof(fp16_t) == 2 && sizeof(bf16_t) == 2);
  static_assert(std::is_trivially_copyable_v<fp16_t> && std::is_trivially_copyable_v<bf16_t>);
  static_assert(std::is_standard_layout_v<fp16_t> && std::is_standard_layout_v<bf16_t>);
  constexpr fp16_t one{0x3c00};
  constexpr bf16_t bone{0x3f80};
  static_assert(one.bits == 0x3c00 && bone.bits == 0x3f80);
  EXPECT_EQ(e8kv::to_float(one), 1.0f);
  EXPECT_EQ(e8kv::to_float(bone), 1.0f);
}

// ---- fp16 ----------------------------------------------------------------------------------

TEST(Half, Fp16EveryPatternDecodesToItsIeeeValue) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t p = static_cast<uint16_t>(h);
    const float f = fp16_bits_to_float(p);
    if (fp16_is_nan(p)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
      // The payload is kept in the top float mantissa bits.
      ASSERT_EQ((bits_of(f) >> 13) & 0x3ff, h & 0x3ff) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), fp16_reference_value(p)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
    }
  }
}

TEST(Half, Fp16EveryPatternRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t p = static_cast<uint16_t>(h);
    const uint16_t back = float_to_fp16_bits(fp16_bits_to_float(p));
    if (fp16_is_nan(p)) {
      ASSERT_TRUE(fp16_is_nan(back)) << std::hex << h;        // never Inf
      ASSERT_EQ(back & 0x8000, p & 0x8000) << std::hex << h;  // sign kept
      ASSERT_TRUE(back & 0x200) << std::hex << h;             // quiet
      if (p & 0x200) {
        ASSERT_EQ(back, p) << std::hex << h;  // quiet NaNs exactly
      }
    } else {
      ASSERT_EQ(back, p) << std::hex << h;
    }
  }
}

TEST(Half, Fp16NamedEdgeCases) {
  struct Case {
    float in;
    uint16_t out;
  };
  const float sub = std::ldexp(1.0f, -24);  // smallest fp16 subnormal
  const Case cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {65504.0f, 0x7bff},                                         // max finite
      {std::nextafter(65520.0f, 0.0f), 0x7bff},                   // just below the midpoint
      {65520.0f, 0x7c00},                                         // midpoint, odd lsb: up to Inf
      {-65520.0f, 0xfc00},
      {65536.0f, 0x7c00},
      {std::numeric_limits<float>::max(), 0x7c00},
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xfc00},
      {sub, 0x0001},                                              // 2^-24
      {-sub, 0x8001},
      {sub / 2, 0x0000},                                          // 2^-25: tie to even zero
      {-sub / 2, 0x8000},
      {std::nextafter(sub / 2, 1.0f), 0x0001},
      {sub * 1.5f, 0x0002},                                       // tie 1|2 -> 2
      {sub * 2.5f, 0x0002},                                       // tie 2|3 -> 2
      {sub * 3.5f, 0x0004},                                       // tie 3|4 -> 4
      {sub * 1023.0f, 0x03ff},                                    // largest subnormal
      {sub * 1023.5f, 0x0400},                                    // tie into the smallest normal
      {std::ldexp(1.0f, -14), 0x0400},
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},                     // tie, even lsb stays
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02},                 // tie, odd lsb rounds up
      {std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f), 0x3c01},
      {std::numeric_limits<float>::denorm_min(), 0x0000},
      {-std::numeric_limits<float>::denorm_min(), 0x8000},
      {std::numeric_limits<float>::min(), 0x0000},
      {0.1f, 0x2e66},                                             // 0.0999755859375
      {3.14159265f, 0x4248},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(float_to_fp16_bits(c.in), c.out) << c.in;
    EXPECT_EQ(fp16_reference_round(c.in), c.out) << c.in;  // the reference agrees with the facts
  }
}

TEST(Half, Fp16NanStaysNanNeverInf) {
  const uint32_t nans[] = {0x7f800001u, 0x7f801fffu, 0x7fc00000u, 0x7fffffffu, 0x7fa00000u, 0xff800001u,
                           0xffc00000u, 0xffffffffu, 0x7f802000u};
  for (uint32_t n : nans) {
    const uint16_t h = float_to_fp16_bits(float_of(n));
    EXPECT_TRUE(fp16_is_nan(h)) << std::hex << n << " -> " << h;
    EXPECT_EQ((h & 0x8000) != 0, (n & 0x80000000u) != 0) << std::hex << n;
    EXPECT_TRUE(std::isnan(fp16_bits_to_float(h)));
  }
  EXPECT_TRUE(std::isnan(e8kv::to_float(e8kv::fp16_from_float(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Half, Fp16EveryMidpointAndItsNeighboursMatchReference) {
  // For every pair of adjacent positive fp16 values (including max finite | 65536=Inf), the
  // exact midpoint (representable as a float) and the floats just beside it.
  for (uint32_t p = 0; p < 0x7c00; ++p) {
    const double mid = (fp16_positive_value(static_cast<uint16_t>(p)) +
                        fp16_positive_value(static_cast<uint16_t>(p + 1))) / 2;
    const float m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid) << p;
    const uint16_t even = static_cast<uint16_t>(p % 2 == 0 ? p : p + 1);
    for (float s : {1.0f, -1.0f}) {
      const uint16_t sign = s < 0 ? 0x8000 : 0;
      ASSERT_EQ(float_to_fp16_bits(s * m), sign | even) << p;
      ASSERT_EQ(float_to_fp16_bits(s * std::nextafter(m, 0.0f)), sign | p) << p;
      ASSERT_EQ(float_to_fp16_bits(s * std::nextafter(m, 1e30f)), sign | (p + 1)) << p;
    }
  }
}

TEST(Half, Fp16RandomFloatsMatchReference) {
  auto rng = e8kv::test::seeded_rng(0x16f16);
  // Arbitrary bit patterns (every exponent) and floats concentrated in and around fp16's range.
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_int_distribution<int> exponent(-30, 17);
  std::uniform_real_distribution<float> significand(1.0f, 2.0f);
  for (int i = 0; i < 400000; ++i) {
    float f = float_of(any_bits(rng));
    if (i % 2) f = std::ldexp(significand(rng), exponent(rng)) * ((i & 2) ? -1.0f : 1.0f);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_fp16_bits(f), fp16_reference_round(f)) << std::hexfloat << f;
  }
}

#if defined(__FLT16_MAX__)
TEST(Half, Fp16AgreesWithCompilerFloat16) {
  auto rng = e8kv::test::seeded_rng(0xf1016);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_int_distribution<int> exponent(-30, 17);
  std::uniform_real_distribution<float> significand(1.0f, 2.0f);
  for (int i = 0; i < 200000; ++i) {
    float f = float_of(any_bits(rng));
    if (i % 2) f = std::ldexp(significand(rng), exponent(rng));
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, sizeof hb);
    ASSERT_EQ(float_to_fp16_bits(f), hb) << std::hexfloat << f;
    ASSERT_EQ(fp16_bits_to_float(hb), static_cast<float>(h));
  }
}
#endif

// ---- bf16 ----------------------------------------------------------------------------------

TEST(Half, Bf16EveryPatternDecodesAndRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t p = static_cast<uint16_t>(b);
    const float f = bf16_bits_to_float(p);
    const uint16_t back = float_to_bf16_bits(f);
    if (bf16_is_nan(p)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << b;
      ASSERT_EQ(back & 0x8000, p & 0x8000) << std::hex << b;
      ASSERT_TRUE(back & 0x40) << std::hex << b;  // quiet
      if (p & 0x40) {
        ASSERT_EQ(back, p) << std::hex << b;
      }
    } else {
      ASSERT_EQ(static_cast<double>(f), bf16_reference_value(p)) << std::hex << b;
      ASSERT_EQ(std::signbit(f), (b & 0x8000) != 0);
      ASSERT_EQ(back, p) << std::hex << b;
    }
  }
}

TEST(Half, Bf16RoundingEdgeCases) {
  struct Case {
    uint32_t in;
    uint16_t out;
  };
  const Case cases[] = {
      {0x3f808000u, 0x3f80},  // halfway, even lsb: down
      {0x3f818000u, 0x3f82},  // halfway, odd lsb: up
      {0x3f808001u, 0x3f81},  // just above halfway
      {0x3f807fffu, 0x3f80},  // just below halfway
      {0xbf818000u, 0xbf82},  // negative, odd lsb
      {0x7f7f7fffu, 0x7f7f},  // below the midpoint under Inf
      {0x7f7f8000u, 0x7f80},  // midpoint, odd lsb: overflows to Inf
      {0x7f7fffffu, 0x7f80},  // FLT_MAX -> Inf
      {0xff7fffffu, 0xff80},
      {0x7f7e8000u, 0x7f7e},  // midpoint, even lsb: stays finite
      {0x7f800000u, 0x7f80},  // Inf
      {0xff800000u, 0xff80},
      {0x00008000u, 0x0000},  // float subnormal tie to even zero
      {0x00018000u, 0x0002},  // subnormal tie, odd lsb: up
      {0x80000000u, 0x8000},  // -0
      {0x007fffffu, 0x0080},  // largest float subnormal rounds to the smallest normal
      {0x3dcccccdu, 0x3dcd},  // 0.1f
  };
  for (const Case& c : cases) {
    EXPECT_EQ(float_to_bf16_bits(float_of(c.in)), c.out) << std::hex << c.in;
    EXPECT_EQ(bf16_reference_round(float_of(c.in)), c.out) << std::hex << c.in;
  }
  for (uint32_t n : {0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fc00000u, 0x7fffffffu}) {
    const uint16_t b = float_to_bf16_bits(float_of(n));
    EXPECT_TRUE(bf16_is_nan(b)) << std::hex << n << " -> " << b;  // never Inf
    EXPECT_EQ((b & 0x8000) != 0, (n & 0x80000000u) != 0);
    EXPECT_TRUE(b & 0x40);
  }
}

TEST(Half, Bf16RandomFloatsMatchReference) {
  auto rng = e8kv::test::seeded_rng(0xbf16);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 400000; ++i) {
    uint32_t u = any_bits(rng);
    if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    const float f = float_of(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16_bits(f), bf16_reference_round(f)) << std::hex << u;
  }
}

// ---- load / store helpers ------------------------------------------------------------------

TEST(Half, LoadAndStoreAsFloat) {
  const float values[] = {0.0f, -1.5f, 65504.0f, 1e-7f, 3.14159265f, 1e30f, -0.0f};
  for (float v : values) {
    float f = 0;
    e8kv::store_from_float(&f, v);
    EXPECT_EQ(bits_of(e8kv::load_as_float(&f)), bits_of(v));

    fp16_t h{0};
    e8kv::store_from_float(&h, v);
    EXPECT_EQ(h.bits, float_to_fp16_bits(v));
    EXPECT_EQ(bits_of(e8kv::load_as_float(&h)), bits_of(fp16_bits_to_float(h.bits)));
    EXPECT_EQ(e8kv::fp16_from_float(v).bits, h.bits);

    bf16_t b{0};
    e8kv::store_from_float(&b, v);
    EXPECT_EQ(b.bits, float_to_bf16_bits(v));
    EXPECT_EQ(bits_of(e8kv::load_as_float(&b)), bits_of(bf16_bits_to_float(b.bits)));
    EXPECT_EQ(e8kv::bf16_from_float(v).bits, b.bits);
  }
  // Arrays: storing then loading an fp16 array is the rounding of each element.
  std::vector<fp16_t> buf(5);
  for (int i = 0; i < 5; ++i) e8kv::store_from_float(&buf[static_cast<size_t>(i)], 0.1f * static_cast<float>(i));
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(e8kv::load_as_float(&buf[static_cast<size_t>(i)]),
              static_cast<float>(fp16_reference_value(fp16_reference_round(0.1f * static_cast<float>(i)))));
}

}  // namespace

// The batch (branch-free) conversions give the scalar conversions' bits: every fp16 pattern;
// floats on a stride through all 2^32 patterns, every float whose low 13 bits sit at a rounding
// boundary, and a sweep of the fp16-subnormal range (both signs).
namespace {
class BatchChecker {
 public:
  void add(uint32_t bits) {
    patterns_.push_back(bits);
    if (patterns_.size() == (1u << 16)) flush();
  }
  void flush() {
    in_.resize(patterns_.size());
    out_.resize(patterns_.size());
    for (size_t i = 0; i < in_.size(); ++i) std::memcpy(&in_[i], &patterns_[i], 4);
    e8kv::floats_to_fp16_bits(in_.data(), out_.data(), in_.size());
    for (size_t i = 0; i < in_.size(); ++i)
      if (out_[i] != e8kv::float_to_fp16_bits(in_[i]) && ++mismatches_ <= 5)
        ADD_FAILURE() << "float bits 0x" << std::hex << patterns_[i];
    checked_ += patterns_.size();
    patterns_.clear();
  }
  size_t checked() const { return checked_; }

 private:
  std::vector<uint32_t> patterns_;
  std::vector<float> in_;
  std::vector<uint16_t> out_;
  size_t checked_ = 0, mismatches_ = 0;
};
}  // namespace

TEST(Half, BatchFp16DecodeMatchesScalarOnEveryPattern) {
  std::vector<uint16_t> in(65536);
  for (uint32_t i = 0; i < 65536; ++i) in[i] = static_cast<uint16_t>(i);
  std::vector<float> out(in.size());
  e8kv::fp16_bits_to_floats(in.data(), out.data(), in.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const float ref = e8kv::fp16_bits_to_float(static_cast<uint16_t>(i));
    ASSERT_EQ(std::memcmp(&out[i], &ref, 4), 0) << "fp16 bits 0x" << std::hex << i;
  }
}

TEST(Half, BatchFp16EncodeMatchesScalar) {
  BatchChecker c;
  for (uint64_t x = 0; x <= 0xffffffffull; x += 251) c.add(static_cast<uint32_t>(x));
  for (uint32_t high = 0; high < (1u << 19); ++high)
    for (uint32_t low : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu}) c.add(high << 13 | low);
  for (uint32_t x = 0; x < 0x38800000u; x += 53) {
    c.add(x);
    c.add(x | 0x80000000u);
  }
  c.flush();
  EXPECT_GT(c.checked(), 50000000u);
}
