// Tests of the stream transforms (src/container/stream_transform.hpp, docs/format.md §3): every
// transform against a reference written from the definition, inverses, rejected ids and shapes.
#include "container/stream_transform.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "container/container_test_util.hpp"

namespace {

using namespace e8kv;
using namespace e8kv::container_test;

// Reference transform written from the definition: elements as integers, delta per segment and
// column along rows, then byte planes.
std::vector<uint8_t> reference_forward(ent::Transform t, const ent::StreamShape& s, const std::vector<uint8_t>& in) {
  const int id = static_cast<int>(t);
  const int delta = id >> 1;
  const bool planes = (id & 1) != 0;
  const size_t w = static_cast<size_t>(s.width);
  const size_t n = in.size() / w;
  auto elem = [&](const std::vector<uint8_t>& v, size_t k) {
    uint64_t x = 0;
    for (size_t b = 0; b < w; ++b) x |= static_cast<uint64_t>(v[k * w + b]) << (8 * b);
    return x;
  };
  std::vector<uint64_t> e(n);
  size_t k = 0;
  const uint64_t mask = w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1;
  for (int64_t rows : s.segment_rows)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < s.cols; ++c, ++k) {
        uint64_t x = elem(in, k);
        if (delta != 0 && r > 0) {
          const uint64_t p = elem(in, k - static_cast<size_t>(s.cols));
          x = delta == 1 ? (x ^ p) : ((x - p) & mask);
        }
        e[k] = x;
      }
  std::vector<uint8_t> out(in.size());
  for (size_t i = 0; i < n; ++i)
    for (size_t b = 0; b < w; ++b) {
      const uint8_t byte = static_cast<uint8_t>(e[i] >> (8 * b));
      if (planes) out[b * n + i] = byte;
      else out[i * w + b] = byte;
    }
  return out;
}

TEST(Transform, MatchesDefinitionAndInverts) {
  auto rng = test::seeded_rng(77);
  const std::vector<std::vector<int64_t>> segs = {{}, {0}, {1}, {3}, {0, 2, 0, 5}, {7, 1, 4}};
  for (int w = 1; w <= 8; ++w)
    for (int64_t cols : {0, 1, 3, 16})
      for (const auto& sr : segs)
        for (int t = 0; t < ent::kTransformCount; ++t) {
          const ent::StreamShape s{sr, cols, w};
          std::vector<uint8_t> in(s.bytes()), fwd(s.bytes()), back(s.bytes());
          // Small values so that deltas are often zero (as on correlated data), plus random bytes.
          for (auto& x : in) x = static_cast<uint8_t>(rng() % 4 == 0 ? rng() : rng() % 3);
          ent::transform_forward(static_cast<ent::Transform>(t), s, in.data(), fwd.data());
          EXPECT_EQ(fwd, reference_forward(static_cast<ent::Transform>(t), s, in))
              << "transform " << t << " width " << w << " cols " << cols;
          ent::transform_inverse(static_cast<ent::Transform>(t), s, fwd.data(), back.data());
          EXPECT_EQ(back, in) << "transform " << t << " width " << w << " cols " << cols;
        }
}

TEST(Transform, RejectsUnknownIdsAndBadShapes) {
  uint8_t a[4] = {}, b[4] = {};
  const ent::StreamShape s{{2}, 1, 2};
  expect_error([&] { ent::transform_forward(static_cast<ent::Transform>(6), s, a, b); }, "transform id 6");
  expect_error([&] { ent::transform_inverse(static_cast<ent::Transform>(255), s, a, b); }, "transform id 255");
  expect_error([&] { ent::transform_forward(ent::Transform::kShuffle, ent::StreamShape{{2}, 1, 0}, a, b); }, "width");
  expect_error([&] { ent::transform_forward(ent::Transform::kShuffle, ent::StreamShape{{-1}, 1, 2}, a, b); },
               "segment_rows");
  expect_error([] { ent::transform_from_id(6); }, "accepted 0..5");
  EXPECT_EQ(ent::transform_from_id(3), ent::Transform::kXorDeltaShuffle);
  EXPECT_STREQ(ent::to_string(ent::Transform::kSubDeltaShuffle), "sub-delta+shuffle");
}

}  // namespace
