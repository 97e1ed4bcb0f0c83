// Tests of the plain fp16/bf16 container (docs/format.md §2.3).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "e8kv/numeric/half.hpp"
#include "container/container_test_util.hpp"

namespace {

using namespace e8kv;
using namespace e8kv::container_test;

TEST(ContainerPlain, RoundTripFp16Bf16StridedAndChunked) {
  auto rng = test::seeded_rng(81);
  std::normal_distribution<float> g(0.f, 2.f);
  for (DType dt : {DType::kF16, DType::kBF16})
    for (int tokens : {0, 1, 37, 300}) {
      const int heads = 3, dim = 40;
      // HND storage with a token capacity above `tokens` (strided view), two tensors.
      const int cap = tokens + 5;
      std::vector<std::vector<uint16_t>> store(2, std::vector<uint16_t>(static_cast<size_t>(heads * cap * dim)));
      for (auto& s : store)
        for (auto& x : s) x = dt == DType::kF16 ? float_to_fp16_bits(g(rng)) : float_to_bf16_bits(g(rng));
      std::vector<TensorView> views;
      for (const auto& s : store) views.push_back(TensorView::hnd(s.data(), dt, tokens, heads, dim, cap));
      for (int chunk : {1, 16, 256}) {
        ent::ContainerOptions o;
        o.chunk_tokens = chunk;
        const auto bytes = ent::serialize_plain(views, o);
        EXPECT_EQ(ent::serialized_plain_size(views, o), bytes.size());
        const ent::PlainCache p = ent::deserialize_plain(bytes.data(), bytes.size());
        EXPECT_EQ(p.dtype, dt);
        EXPECT_EQ(p.tokens, tokens);
        EXPECT_EQ(p.heads, heads);
        EXPECT_EQ(p.head_dim, dim);
        ASSERT_EQ(p.tensors.size(), 2u);
        for (size_t i = 0; i < 2; ++i) {
          ASSERT_EQ(p.tensors[i].size(), static_cast<size_t>(tokens * heads * dim));
          for (int t = 0; t < tokens; ++t)
            for (int h = 0; h < heads; ++h)
              for (int e = 0; e < dim; ++e)
                ASSERT_EQ(p.tensors[i][static_cast<size_t>((t * heads + h) * dim + e)],
                          store[i][static_cast<size_t>((h * cap + t) * dim + e)]);
        }
        std::vector<uint8_t> buf(bytes.size());
        EXPECT_EQ(ent::serialize_plain(views, o, buf.data(), buf.size()), bytes.size());
        EXPECT_EQ(buf, bytes);
      }
    }
}

TEST(ContainerPlain, RejectsBadInputAndCorruption) {
  std::vector<float> f32(2 * 2 * 8);
  std::vector<uint16_t> a(2 * 2 * 8), b(3 * 2 * 8);
  expect_error([&] { ent::serialize_plain({TensorView::nhd(f32.data(), DType::kF32, 2, 2, 8)}); }, "f32");
  expect_error(
      [&] {
        ent::serialize_plain({TensorView::nhd(a.data(), DType::kF16, 2, 2, 8), TensorView::nhd(b.data(), DType::kF16, 3, 2, 8)});
      },
      "tensor 1 differs");
  const auto empty = ent::serialize_plain({});
  EXPECT_EQ(ent::deserialize_plain(empty.data(), empty.size()).tensors.size(), 0u);
  const auto bytes = ent::serialize_plain({TensorView::nhd(a.data(), DType::kF16, 2, 2, 8)});
  expect_error([&] { deser(bytes); }, "use deserialize_plain");
  const Made m = make_cache("preset=quant-k2v2", small_spec(1, 1, 1, 64, 4, 1));
  const auto cache_bytes = ent::serialize(m.cache);
  expect_error([&] { ent::deserialize_plain(cache_bytes.data(), cache_bytes.size()); }, "use deserialize");
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(ent::deserialize_plain(bytes.data(), n), Error) << n;
  auto t = bytes;
  put_at<uint8_t>(t, 48, 3);
  fix_header_crc(t);
  expect_error([&] { ent::deserialize_plain(t.data(), t.size()); }, "plain dtype id 3");
  t = bytes;
  put_at<uint64_t>(t, 48 + 16, 1000);  // tokens: the chunk count no longer matches
  fix_header_crc(t);
  expect_error([&] { ent::deserialize_plain(t.data(), t.size()); }, "n_chunks");
}

}  // namespace
