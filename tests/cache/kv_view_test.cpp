// Views over caller memory (cache/kv_view.hpp): SequenceKV positions near the int32 limit, and
// the strided layouts the views describe.
#include "e8kv/cache/kv_view.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "e8kv/error.hpp"

namespace {

using e8kv::DType;
using e8kv::SequenceKV;
using e8kv::TensorView;

constexpr int32_t kMax = std::numeric_limits<int32_t>::max();

TEST(SequenceKVPosition, ImplicitPositionsCountFromFirstPosition) {
  SequenceKV s;
  s.first_position = 7;
  EXPECT_EQ(s.position(0), 7);
  EXPECT_EQ(s.position(1), 8);
  EXPECT_EQ(s.position(1000), 1007);
}

TEST(SequenceKVPosition, ExplicitPositionsAreReturnedAsGiven) {
  const int32_t pos[] = {3, 10, kMax};
  SequenceKV s;
  s.positions = pos;
  s.first_position = kMax;  // ignored when positions are given
  EXPECT_EQ(s.position(0), 3);
  EXPECT_EQ(s.position(1), 10);
  EXPECT_EQ(s.position(2), kMax);
}

// Before the fix, first_position + int32(t) overflowed a signed int here (undefined behaviour;
// in practice a negative position), and only UBSan noticed.
TEST(SequenceKVPosition, LastRepresentablePositionIsAccepted) {
  SequenceKV s;
  s.first_position = kMax - 2;
  EXPECT_EQ(s.position(0), kMax - 2);
  EXPECT_EQ(s.position(2), kMax);
}

TEST(SequenceKVPosition, PositionPastInt32MaxThrows) {
  SequenceKV s;
  s.first_position = kMax - 2;
  EXPECT_THROW(s.position(3), e8kv::Error);
  EXPECT_THROW(s.position(1000), e8kv::Error);
  s.first_position = kMax;
  EXPECT_THROW(s.position(1), e8kv::Error);
}

// A token index past 2^31 must not be truncated to int32 before the addition (it used to be).
TEST(SequenceKVPosition, TokenIndexPastInt32IsNotTruncated) {
  SequenceKV s;
  s.first_position = 0;
  EXPECT_THROW(s.position(int64_t{1} << 32), e8kv::Error);  // int32(2^32) would be 0
  s.first_position = -5;
  EXPECT_EQ(s.position(int64_t{kMax} + 5), kMax);  // -5 + (2^31 + 4): in range once computed in 64 bits
}

TEST(SequenceKVPosition, NegativeTokenIndexThrows) {
  SequenceKV s;
  EXPECT_THROW(s.position(-1), e8kv::Error);
}

TEST(SequenceKVPosition, ErrorMessageNamesTheArguments) {
  SequenceKV s;
  s.first_position = kMax;
  try {
    s.position(4);
    FAIL() << "no exception";
  } catch (const e8kv::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("first_position"), std::string::npos) << what;
    EXPECT_NE(what.find("2147483647"), std::string::npos) << what;
  }
}

// ---- strided layouts ---------------------------------------------------------------------

// Element (t, h, i) of a [tokens, heads, dim] tensor holds t * 100 + h * 10 + i.
float tagged(int64_t t, int64_t h, int64_t i) { return static_cast<float>(t * 100 + h * 10 + i); }

TEST(TensorView, NhdAndHndAddressTheSameElements) {
  const int64_t T = 3, H = 2, D = 4, capacity = 5;
  std::vector<float> nhd(static_cast<size_t>(T * H * D)), hnd(static_cast<size_t>(H * capacity * D), -1.f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D; ++i) {
        nhd[static_cast<size_t>((t * H + h) * D + i)] = tagged(t, h, i);
        hnd[static_cast<size_t>((h * capacity + t) * D + i)] = tagged(t, h, i);
      }
  const TensorView a = TensorView::nhd(nhd.data(), DType::kF32, T, H, D);
  const TensorView b = TensorView::hnd(hnd.data(), DType::kF32, T, H, D, capacity);
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      b.load(t, h, row.data());
      for (int64_t i = 0; i < D; ++i) {
        EXPECT_EQ(a.at(t, h, i), tagged(t, h, i));
        EXPECT_EQ(row[static_cast<size_t>(i)], tagged(t, h, i));
      }
    }
}

TEST(TensorView, TokenSliceStartsAtItsFirstToken) {
  const int64_t T = 4, H = 1, D = 2;
  std::vector<float> x(static_cast<size_t>(T * H * D));
  std::iota(x.begin(), x.end(), 0.f);
  const TensorView v = TensorView::nhd(x.data(), DType::kF32, T, H, D);
  const TensorView s = v.token_slice(1, 2);
  EXPECT_EQ(s.tokens(), 2);
  EXPECT_EQ(s.at(0, 0, 0), 2.f);
  EXPECT_EQ(s.at(1, 0, 1), 5.f);
  EXPECT_EQ(v.token_slice(4, 0).tokens(), 0);  // empty slice at the end
  EXPECT_THROW(v.token_slice(3, 2), e8kv::Error);
  EXPECT_THROW(v.token_slice(-1, 1), e8kv::Error);
}

TEST(TensorView, RejectsNegativeExtentsAndNullDataForNonEmptyViews) {
  EXPECT_THROW(TensorView(nullptr, DType::kF32, -1, 1, 8, 8, 8), e8kv::Error);
  EXPECT_THROW(TensorView::nhd(nullptr, DType::kF16, 1, 1, 8), e8kv::Error);
  EXPECT_NO_THROW(TensorView::nhd(nullptr, DType::kF16, 0, 1, 8));
}

}  // namespace
