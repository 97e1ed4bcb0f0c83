// The tensor-core decode attention of RoPE-residual and post-RoPE keys, run on the CPU: the tile
// and split code of cuda/rotated_attention_tile.hpp (what the kernel runs per warp) for all 32
// lanes of each of a CTA's 4 warps, with mma.sync m16n8k8 .tf32 emulated from the PTX ISA's
// fragment layouts, over pages made by to_paged, against e8kv::attend. Plus the pure math of
// cuda/rotated_attention_math.hpp against brute-force references: tf32 rounding and splitting,
// the fragment index maps, the byte-permute coordinate decoders, the page divider, the gain-code
// factors, the RoPE delta table and the mean-term coefficients.
//
// What the emulation does not run: the kernel's prologue (its lane FWHT is replaced by the CPU
// rotation, the fragments are filled with the same placement functions), its fp16-window split
// (computed here in double) and the reduction kernel (split merge with split_plan.hpp's Lse2Merge,
// inverse rotation on the CPU). The GPU tests (tests/cuda/decode_attention_test) cover those.
#include "e8kv/cuda/rotated_attention_tile.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/cache/paged_kv.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/cuda/rotated_attention_math.hpp"
#include "e8kv/cuda/split_plan.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/quant/gain_code.hpp"
#include "testing/synthetic_kv.hpp"
#include "testing/test_util.hpp"

namespace {
using namespace e8kv;
using namespace e8kv::cuda;

// Max |emulated − attend| over a query row, relative to max |attend| of the row: the tensor-core
// form differs from the CPU's only by float rounding (tf32 high/low splits keep ~22 bits of every
// operand, fp32 accumulation in another order, the mean term's cos/sin composed in another
// order), so the GPU tests' fp32 tolerance applies.
constexpr double kEmulationTolerance = 2e-4;

// ---- tf32 ------------------------------------------------------------------------------------------

/// round_tf32's reference: x to 10 explicit mantissa bits, nearest, ties away from zero, in double.
float reference_round_tf32(float x) {
  if (!std::isfinite(x) || x == 0.f) return x;
  int exp = 0;
  std::frexp(static_cast<double>(x), &exp);  // |x| in [2^(exp-1), 2^exp)
  const int e = std::max(exp - 1, -126);     // subnormals keep the exponent of 2^-126
  const double ulp = std::ldexp(1.0, e - 10);
  const double r = std::round(static_cast<double>(x) / ulp) * ulp;  // std::round: ties away
  return static_cast<float>(r);  // exact, or ±inf past the largest tf32 value
}

TEST(RotatedMath, RoundTf32MatchesTheReference) {
  auto rng = test::seeded_rng(701);
  std::vector<float> xs = {0.f, -0.f, 1.f, -1.f, 1.0f + 0x1p-11f, 1.0f + 0x1p-10f + 0x1p-11f, 3.14159265f, 65504.f,
                           std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                           0x1.fffp-127f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu;  // finite
    xs.push_back(e8kv::detail::bits_float(u));
  }
  for (float x : xs) {
    const float got = round_tf32(x), want = reference_round_tf32(x);
    ASSERT_EQ(e8kv::detail::float_bits(got), e8kv::detail::float_bits(want)) << x;
    ASSERT_TRUE(is_tf32(got)) << x;
  }
  EXPECT_TRUE(std::isnan(round_tf32(std::nanf(""))));
  // Ties go away from zero: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(round_tf32(1.0f + 0x1p-11f), 1.0f + 0x1p-10f);
  EXPECT_EQ(round_tf32(-(1.0f + 0x1p-11f)), -(1.0f + 0x1p-10f));
}

TEST(RotatedMath, SplitTf32KeepsTwentyTwoBits) {
  auto rng = test::seeded_rng(702);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> ex(-100, 100);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(mant(rng), ex(rng)) * ((rng() & 1) ? -1.f : 1.f);
    float hi = 0, lo = 0;
    split_tf32(x, hi, lo);
    ASSERT_TRUE(is_tf32(hi) && is_tf32(lo)) << x;
    ASSERT_EQ(hi, round_tf32(x));
    worst = std::max(worst, std::fabs((static_cast<double>(x) - hi - lo) / x));
  }
  EXPECT_LE(worst, std::ldexp(1.0, -22));
  float hi = 1, lo = 1;
  split_tf32(0.f, hi, lo);
  EXPECT_EQ(hi, 0.f);
  EXPECT_EQ(lo, 0.f);
}

// ---- fragment maps ---------------------------------------------------------------------------------

template <int D>
void check_fragment_maps() {
  using S = RotShape<D>;
  SCOPED_TRACE("D = " + std::to_string(D));
  // Score product: (k-step, column) <-> element is a bijection, and column c is read from the
  // blocks of lane tig = c % 4 only (each lane decodes whole blocks, no other lane's).
  std::vector<int> seen(D, 0);
  for (int ks = 0; ks < S::kKeySteps; ++ks)
    for (int col = 0; col < 8; ++col) {
      const int e = rot_key_element<D>(ks, col);
      ASSERT_GE(e, 0);
      ASSERT_LT(e, D);
      ++seen[e];
      EXPECT_EQ((e / 8) / S::kKeyBlocksPerLane, col & 3);
      EXPECT_EQ(e / 8 % S::kKeyBlocksPerLane, ks / 4) << "k-steps 4s..4s+3 read the lane's block s";
      int ks2 = -1, col2 = -1;
      rot_key_slot<D>(e, ks2, col2);
      EXPECT_EQ(ks2, ks);
      EXPECT_EQ(col2, col);
    }
  for (int e = 0; e < D; ++e) EXPECT_EQ(seen[e], 1) << e;
  // Key shifts: (shift step, column) <-> block, block from lane col % 4, the lane's block 2σ + c/4.
  std::vector<int> blocks(S::kBlocks, 0);
  for (int ss = 0; ss < S::kShiftSteps; ++ss)
    for (int col = 0; col < 8; ++col) {
      const int blk = rot_key_shift_block<D>(ss, col);
      ++blocks[blk];
      EXPECT_EQ(blk / S::kKeyBlocksPerLane, col & 3);
      EXPECT_EQ(blk % S::kKeyBlocksPerLane, 2 * ss + col / 4);
      int ss2 = -1, col2 = -1;
      rot_key_shift_slot<D>(blk, ss2, col2);
      EXPECT_EQ(ss2, ss);
      EXPECT_EQ(col2, col);
    }
  for (int j = 0; j < S::kBlocks; ++j) EXPECT_EQ(blocks[j], 1) << j;
  // Value product: (m-tile, row) <-> element, row r from the blocks of lane grp = r % 8.
  std::fill(seen.begin(), seen.end(), 0);
  for (int mt = 0; mt < S::kValueTiles; ++mt)
    for (int row = 0; row < 16; ++row) {
      const int e = rot_value_element<D>(mt, row);
      ASSERT_GE(e, 0);
      ASSERT_LT(e, D);
      ++seen[e];
      EXPECT_EQ((e / 8) / S::kValueBlocksPerLane, row & 7);
      EXPECT_EQ(e / 8 % S::kValueBlocksPerLane, mt / 4);
      int mt2 = -1, row2 = -1;
      rot_value_slot<D>(e, mt2, row2);
      EXPECT_EQ(mt2, mt);
      EXPECT_EQ(row2, row);
    }
  for (int e = 0; e < D; ++e) EXPECT_EQ(seen[e], 1) << e;
  // Value shifts: every block once, from lane r % 8, the lane's block 2ς + r/8; the rest padding.
  std::fill(blocks.begin(), blocks.end(), 0);
  for (int st = 0; st < S::kValueShiftTiles; ++st)
    for (int row = 0; row < 16; ++row) {
      const int blk = rot_value_shift_block<D>(st, row);
      if (blk < 0) {
        EXPECT_GE(2 * st + row / 8, S::kValueBlocksPerLane);
        continue;
      }
      ++blocks[blk];
      EXPECT_EQ(blk / S::kValueBlocksPerLane, row & 7);
      EXPECT_EQ(blk % S::kValueBlocksPerLane, 2 * st + row / 8);
    }
  for (int j = 0; j < S::kBlocks; ++j) EXPECT_EQ(blocks[j], 1) << j;
}

TEST(RotatedMath, FragmentMapsAreBijectionsOverWholeBlocks) {
  check_fragment_maps<64>();
  check_fragment_maps<128>();
  check_fragment_maps<256>();
}

TEST(RotatedMath, StoreBPutsEachValueInItsLanesRegister) {
  // B fragment of m16n8k8: lane 4·n + k % 4 holds (k, n) in b0 (k < 4) or b1 (k >= 4).
  std::vector<RotF4> frags(2 * 32, RotF4{0, 0, 0, 0});
  const float x = 1.0f + 0x1p-15f;  // not a tf32 value: a non-zero low part
  rot_store_b(frags.data(), 1, 6, 5, x);
  const RotF4& e = frags[32 + 4 * 5 + 2];
  EXPECT_EQ(e.y, round_tf32(x));
  EXPECT_EQ(e.w, x - round_tf32(x));
  EXPECT_EQ(e.x, 0.f);
  EXPECT_EQ(e.z, 0.f);
}

// ---- coordinate decoders -------------------------------------------------------------------------

TEST(RotatedMath, BytePermuteMatchesPrmt) {
  // PRMT's default mode: byte k of the result is byte sel[4k+2:4k] of the 8-byte {b, a}.
  EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x3210u), 0x33221100u);
  EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x7654u), 0x77665544u);
  EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x0415u), 0x00441155u);
}

TEST(RotatedMath, E8pCoordinatesEqualDecodeLatticeForEveryIndex) {
  for (uint32_t index = 0; index < 65536; ++index) {
    const E8pBlock b = e8p_block(&kHostRotE8pBytes.w[0][0], index);
    float z[8];
    codebook::E8P::decode_lattice(index, z);
    for (int i = 0; i < 8; ++i)
      ASSERT_EQ(e8kv::detail::float_bits(e8p_coordinate(b, i) + b.shift), e8kv::detail::float_bits(z[i]))
          << "index " << index << " coordinate " << i;
    ASSERT_TRUE(is_tf32(b.shift));
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(is_tf32(e8p_coordinate(b, i)));
  }
}

TEST(RotatedMath, E81bCoordinatesEqualDecodeLatticeForEveryIndex) {
  for (uint32_t index = 0; index < 256; ++index) {
    float z[8];
    codebook::E81B::decode_lattice(index, z);
    for (int i = 0; i < 8; ++i) {
      const float c = e81b_coordinate(kHostRotE81bBytes.w[index], i);
      ASSERT_EQ(e8kv::detail::float_bits(c), e8kv::detail::float_bits(z[i])) << "index " << index << " coordinate " << i;
      ASSERT_TRUE(is_tf32(c));
    }
  }
}

TEST(RotatedMath, IndexAtReadsLittleEndianIndices) {
  auto rng = test::seeded_rng(703);
  for (int it = 0; it < 1000; ++it) {
    uint32_t w[8];
    for (auto& x : w) x = static_cast<uint32_t>(rng());
    uint8_t bytes[32];
    std::memcpy(bytes, w, sizeof bytes);  // little-endian host
    for (int at = 0; at + 4 <= 28; ++at) {
      auto expect = [&](int n) {
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) v |= static_cast<uint32_t>(bytes[at + k]) << (8 * k);
        return v;
      };
      ASSERT_EQ(rot_index_at<2>(w, at), expect(2)) << at;
      ASSERT_EQ(rot_index_at<3>(w, at), expect(3)) << at;
      ASSERT_EQ(rot_index_at<4>(w, at), expect(4)) << at;
    }
  }
}

TEST(RotatedMath, PageDividerDividesEveryTokenIndex) {
  auto rng = test::seeded_rng(704);
  for (int p = 1; p <= 300; ++p) {
    uint32_t magic = 0;
    int shift = 0;
    rot_page_divider(p, magic, shift);
    RotTileArgs a;
    a.page_magic = magic;
    a.page_shift = shift;
    auto quotient = [&](uint32_t t) { return static_cast<uint32_t>((static_cast<uint64_t>(t) * magic) >> shift); };
    std::vector<uint32_t> ts = {0u, 1u, static_cast<uint32_t>(p) - 1u, static_cast<uint32_t>(p), 0x7fffffffu, 0x7ffffffeu};
    for (int i = 0; i < 20000; ++i) ts.push_back(static_cast<uint32_t>(rng()) & 0x7fffffffu);
    for (uint32_t k = 1; k < 50; ++k) {  // around multiples of p near 2^31
      const uint32_t m = (0x7fffffffu / static_cast<uint32_t>(p) - k) * static_cast<uint32_t>(p);
      ts.push_back(m);
      ts.push_back(m - 1);
    }
    for (uint32_t t : ts) ASSERT_EQ(quotient(t), t / static_cast<uint32_t>(p)) << "P " << p << " t " << t;
  }
}

TEST(RotatedMath, GainCodeFactorsAreTheHostTable) {
  const auto& table = quant::gain_code_factors();
  for (uint32_t c = 0; c < 256; ++c)
    ASSERT_EQ(e8kv::detail::float_bits(quant::gain_code_factor(quant::kGainCodeMantissaBits, c)),
              e8kv::detail::float_bits(table[c]))
        << c;
  // The host and device forms of the code agree with gain_to_code.
  auto rng = test::seeded_rng(705);
  std::uniform_real_distribution<double> lg(-30, 30);
  for (int i = 0; i < 100000; ++i) {
    const float g = static_cast<float>(std::exp2(lg(rng))), ref = static_cast<float>(std::exp2(lg(rng) / 8));
    ASSERT_EQ(quant::gain_code_of(g, ref), quant::gain_to_code(g, ref)) << g << " " << ref;
  }
  EXPECT_EQ(quant::gain_code_of(0.f, 1.f), 0);
  EXPECT_EQ(quant::gain_code_of(1.f, 0.f), 0);
  EXPECT_EQ(quant::gain_code_of(std::numeric_limits<float>::infinity(), 1.f), 0);
}

// ---- mean term -------------------------------------------------------------------------------------

/// A one-layer cache of a few synthetic tokens (for its codecs).
CompressedKV small_cache(const Config& cfg, int head_dim) {
  synth::SyntheticSpec sp;
  sp.n_layers = 1;
  sp.n_kv_heads = 1;
  sp.n_q_heads = 1;
  sp.head_dim = head_dim;
  sp.tokens = 4;
  const auto d = synth::make_synthetic_kv(sp);
  SequenceKV seq;
  seq.layers.push_back({TensorView::nhd(d.keys[0].data(), DType::kF32, 4, 1, head_dim),
                        TensorView::nhd(d.values[0].data(), DType::kF32, 4, 1, head_dim)});
  return KVCompressor({1, 1, 1, head_dim}, cfg).compress(seq);
}

TEST(RotatedMath, RopeDeltaTableHoldsCosSinOfEveryOffset) {
  Config cfg = Config::preset("quant-k3v2");
  cfg.rope.rotary_dim = 96;
  const CompressedKV cache = small_cache(cfg, 128);
  const CacheCodecs& codecs = cache.codecs();
  const int pairs = codecs.rope().rotary_dim() / 2;
  ASSERT_EQ(pairs, 48);
  const std::vector<float> table = rope_delta_table(codecs);
  const int slots = 64;  // head_dim / 2: the kernels' row stride
  ASSERT_EQ(table.size(), static_cast<size_t>(kRopeDeltaRows) * slots * 4);
  const float* rope = codecs.rope_table().data();
  double worst = 0;
  for (int delta = 0; delta < kRopeDeltaRows; ++delta)
    for (int p = 0; p < slots; ++p) {
      const float* e = &table[(static_cast<size_t>(delta) * slots + p) * 4];
      for (int k = 0; k < 4; ++k) ASSERT_TRUE(is_tf32(e[k]));
      if (p >= pairs) {  // beyond the rotary pairs: zeros, the mean product's padding
        for (int k = 0; k < 4; ++k) ASSERT_EQ(e[k], 0.f) << delta << " " << p;
        continue;
      }
      float c0 = 0, s0 = 0;  // the CPU's own cos/sin of this offset
      quant::rope_table_cos_sin(rope, pairs, delta, p, c0, s0);
      worst = std::max({worst, std::fabs(static_cast<double>(e[0]) + e[2] - c0), std::fabs(static_cast<double>(e[1]) + e[3] - s0)});
      if (delta < 1024) {  // the low level itself: exact up to the split
        ASSERT_LE(std::fabs(static_cast<double>(e[0]) + e[2] - rope[(static_cast<size_t>(delta) * pairs + p) * 2]), 0x1p-23);
      }
    }
  EXPECT_LT(worst, 4e-7);
}

TEST(RotatedMath, MeanCoefficientsReproduceQDotRotatedMean) {
  auto rng = test::seeded_rng(706);
  std::normal_distribution<double> g(0, 1);
  std::uniform_real_distribution<double> ang(-3.14159, 3.14159);
  for (int i = 0; i < 10000; ++i) {
    const float qa = static_cast<float>(g(rng)), qb = static_cast<float>(g(rng));
    const float ma = static_cast<float>(g(rng)), mb = static_cast<float>(g(rng));
    const double u = ang(rng), dlt = ang(rng);
    float A = 0, B = 0;
    rot_mean_coefficients(qa, qb, ma, mb, static_cast<float>(std::cos(u)), static_cast<float>(std::sin(u)), A, B);
    // q·R(u + δ)·μ in double.
    const double t = u + dlt;
    const double ra = ma * std::cos(t) - mb * std::sin(t), rb = ma * std::sin(t) + mb * std::cos(t);
    const double want = qa * ra + qb * rb;
    const double got = A * std::cos(dlt) + B * std::sin(dlt);
    ASSERT_NEAR(got, want, 1e-5 * (1 + std::fabs(qa) + std::fabs(qb)) * (1 + std::fabs(ma) + std::fabs(mb)));
  }
}

// ---- the emulated warp -----------------------------------------------------------------------------

/// A warp of 32 lanes on the CPU: every per-lane statement of the tile runs for each lane in turn,
/// and the warp-collective steps are emulated.
struct EmulatedWarp {
  static constexpr int kLanes = 32;
  int non_tf32_operands = 0;  ///< operands a tensor core would not read exactly (must stay 0)
  int mma_count = 0;

  int lane(int l) const { return l; }

  /// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, D = A·B + C, with the fragment layouts
  /// of the PTX ISA (lane = 4·groupID + threadID_in_group): a0 (g, t), a1 (g+8, t), a2 (g, t+4),
  /// a3 (g+8, t+4); b0 (k = t, n = g), b1 (k = t+4, n = g); c0 (g, 2t), c1 (g, 2t+1),
  /// c2 (g+8, 2t), c3 (g+8, 2t+1). The tf32 products are exact in double; PTX leaves the order
  /// and rounding of the accumulation to the hardware: here the 8 products and C are summed in
  /// double and rounded to float once.
  void mma(float (&d)[32][4], const float (&a)[32][4], const float (&b)[32][2]) {
    float A[16][8], B[8][8], C[16][8];
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      A[g][t] = a[lane][0];
      A[g + 8][t] = a[lane][1];
      A[g][t + 4] = a[lane][2];
      A[g + 8][t + 4] = a[lane][3];
      B[t][g] = b[lane][0];
      B[t + 4][g] = b[lane][1];
      C[g][2 * t] = d[lane][0];
      C[g][2 * t + 1] = d[lane][1];
      C[g + 8][2 * t] = d[lane][2];
      C[g + 8][2 * t + 1] = d[lane][3];
    }
    for (int i = 0; i < 16; ++i)
      for (int k = 0; k < 8; ++k) non_tf32_operands += !is_tf32(A[i][k]);
    for (int k = 0; k < 8; ++k)
      for (int j = 0; j < 8; ++j) non_tf32_operands += !is_tf32(B[k][j]);
    float Dm[16][8];
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        double s = C[i][j];
        for (int k = 0; k < 8; ++k) s += static_cast<double>(A[i][k]) * static_cast<double>(B[k][j]);
        Dm[i][j] = static_cast<float>(s);
      }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      d[lane][0] = Dm[g][2 * t];
      d[lane][1] = Dm[g][2 * t + 1];
      d[lane][2] = Dm[g + 8][2 * t];
      d[lane][3] = Dm[g + 8][2 * t + 1];
    }
    ++mma_count;
  }

  /// The device's xor butterflies over lane bits 2-4 (the 8 lanes of a column), in their order.
  template <class Op>
  static void butterfly(float (&v)[32][2], Op op) {
    for (int m = 4; m < 32; m <<= 1) {
      float next[32][2];
      for (int lane = 0; lane < 32; ++lane)
        for (int gi = 0; gi < 2; ++gi) next[lane][gi] = op(v[lane][gi], v[lane ^ m][gi]);
      std::memcpy(v, next, sizeof next);
    }
  }
  void max_over_rows(float (&v)[32][2]) const { butterfly(v, [](float x, float y) { return std::fmax(x, y); }); }
  void sum_over_rows(float (&v)[32][2]) const { butterfly(v, [](float x, float y) { return x + y; }); }
  void sync() const {}
};

TEST(RotatedMath, EmulatedMmaIsTheMatrixProductOfThePtxLayout) {
  auto rng = test::seeded_rng(707);
  std::uniform_int_distribution<int> small(-64, 64);
  float A[16][8], B[8][8], C[16][8];
  for (auto& r : A)
    for (auto& x : r) x = small(rng) / 8.f;
  for (auto& r : B)
    for (auto& x : r) x = small(rng) / 4.f;
  for (auto& r : C)
    for (auto& x : r) x = small(rng);
  // Fragments from the PTX ISA's figures for m16n8k8 .tf32 (written out, not via the emulator).
  float a[32][4], b[32][2], d[32][4];
  for (int lane = 0; lane < 32; ++lane) {
    const int row = lane / 4, col = lane % 4;
    a[lane][0] = A[row][col];
    a[lane][1] = A[row + 8][col];
    a[lane][2] = A[row][col + 4];
    a[lane][3] = A[row + 8][col + 4];
    b[lane][0] = B[col][row];
    b[lane][1] = B[col + 4][row];
    for (int i = 0; i < 4; ++i) d[lane][i] = C[row + 8 * (i / 2)][2 * col + (i % 2)];
  }
  EmulatedWarp w;
  w.mma(d, a, b);
  EXPECT_EQ(w.non_tf32_operands, 0);
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const int row = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
      double s = C[row][col];
      for (int k = 0; k < 8; ++k) s += static_cast<double>(A[row][k]) * B[k][col];
      ASSERT_EQ(d[lane][i], static_cast<float>(s)) << lane << " " << i;  // small integers/8: exact
    }
  a[3][1] = 1.0f + 0x1p-20f;  // not a tf32 value
  w.mma(d, a, b);
  EXPECT_EQ(w.non_tf32_operands, 1);
}

/// A CTA of kRotWarps emulated warps, run in turn between barriers.
template <int D>
struct EmulatedCta {
  using Warp = EmulatedWarp;
  static constexpr int kWarps = kRotWarps;
  EmulatedWarp warps[kWarps];
  RotWarpState<32, D> states[kWarps];
  std::vector<float> weights = std::vector<float>(static_cast<size_t>(kWarps) * kRotWeightFloats, 0.f);
  std::function<void(uint32_t)> fill;
  std::vector<uint32_t> fills;  ///< upper parts the coefficients were formed for, in order

  int warp_id(int k) const { return k; }
  EmulatedWarp& warp(int k) { return warps[k]; }
  RotWarpState<32, D>& state(int k) { return states[k]; }
  float* wbuf(int k) { return &weights[static_cast<size_t>(k) * kRotWeightFloats]; }
  void sync() {}
  void fill_mean(uint32_t upper) {
    fills.push_back(upper);
    fill(upper);
  }
};

// ---- the emulated kernel ---------------------------------------------------------------------------

template <class Code>
constexpr float inverse_input_scale() {
  if constexpr (std::is_same_v<Code, RotFp16Values>) return 1.f;
  else return Code::kInverseInputScale;
}
template <class Code>
constexpr float inverse_residual_scale() {
  if constexpr (kRotTwoStage<Code>) return Code::kInverseResidualScale;
  else return 1.f;
}

struct EmulationStats {
  int64_t tiles_mma = 0;
  int non_tf32 = 0;
  std::set<int> fills_per_split;  // distinct counts of coefficient fills seen
  int max_fills = 0;
};

/// Decode attention of sequence b of a paged layer for every query head, the coded tokens scored
/// by the emulated kernel in splits of `chunk` tokens, the window in double, merged as the
/// reduction kernel merges. q: [q_heads][d] post-RoPE.
template <int D, class KeyCode, class ValueCode>
std::vector<float> emulate_attention(const PagedLayer& pl, const CacheCodecs& codecs, int layer, int b, const float* q,
                                     int q_heads, int chunk, EmulationStats& stats) {
  constexpr bool kValueCoded = !std::is_same_v<ValueCode, RotFp16Values>;
  using S = RotShape<D>;
  const PagedLayout& L = pl.layout;
  const CacheLayout& CL = codecs.layout();
  const int H = L.kv_heads, G = q_heads / H;
  const float scale_log2 = static_cast<float>(static_cast<double>(CL.effective_softmax_scale()) * 1.4426950408889634);
  const bool residual = CL.key_frame == transform::KeyFrame::kRopeResidual;
  const bool centred = !pl.means.empty();
  const bool mean_on = centred && residual;
  const int rotary_dim = codecs.rope().rotary_dim();
  const int pairs = rotary_dim / 2;
  const auto rope_layout = codecs.rope().params().layout;
  const std::vector<float> delta_table = mean_on ? rope_delta_table(codecs) : std::vector<float>{};
  const int coded = pl.table.coded_lens[static_cast<size_t>(b)];
  const int window = pl.window_lens[static_cast<size_t>(b)];
  uint32_t magic = 0;
  int shift = 0;
  rot_page_divider(L.page_tokens, magic, shift);
  const bool gains8 = L.key_gain_bytes == 1;
  std::vector<float> out(static_cast<size_t>(q_heads) * D, 0.f);

  for (int h = 0; h < H; ++h) {
    const size_t bh = static_cast<size_t>(b) * H + static_cast<size_t>(h);
    const float key_ref = gains8 ? fp16_bits_to_float(pl.gain_refs[bh * 2]) : 1.f;
    const float value_ref = gains8 && kValueCoded ? fp16_bits_to_float(pl.gain_refs[bh * 2 + 1]) : 1.f;
    const uint16_t* mu = centred ? &pl.means[bh * 2 * D] : nullptr;
    const bool scaled = !pl.key_scales.empty() && pl.key_scales[bh * D] != 0;
    for (int g0 = 0; g0 < G; g0 += kRotQueryHeads) {
      const int gn = std::min(kRotQueryHeads, G - g0);
      const int qh0 = h * G + g0;
      // Prologue: q̃ = H·D·S⁻¹·q·scale/α·ref into the B fragments, block sums, constant term.
      std::vector<RotF4> bq(S::kKeySteps * 32, RotF4{0, 0, 0, 0}), bq2 = bq;
      std::vector<RotF4> bshift(S::kShiftSteps * 32, RotF4{0, 0, 0, 0}), bshift2 = bshift;
      std::vector<RotF4> bmean(S::kBlocks * 32, RotF4{0, 0, 0, 0});
      float base[kRotQueryHeads] = {};
      const float qf = scale_log2 * inverse_input_scale<KeyCode>() * key_ref;
      for (int g = 0; g < gn; ++g) {
        const float* qg = q + static_cast<size_t>(qh0 + g) * D;
        float tmp[D], qt[D];
        for (int i = 0; i < D; ++i)
          tmp[i] = scaled ? qg[i] * (1.0f / fp16_bits_to_float(pl.key_scales[bh * D + i])) : qg[i];
        codecs.rotation(layer, h, 0).forward(tmp, qt);
        for (int blk = 0; blk < S::kBlocks; ++blk) {
          float sum = 0.f;
          for (int r = 0; r < 8; ++r) {
            const int e = 8 * blk + r;
            const float x = qt[e] * qf;
            sum += x;
            int ks = 0, col = 0;
            rot_key_slot<D>(e, ks, col);
            rot_store_b(bq.data(), ks, col, g, x);
            if constexpr (kRotTwoStage<KeyCode>) rot_store_b(bq2.data(), ks, col, g, x * inverse_residual_scale<KeyCode>());
          }
          int ss = 0, col = 0;
          rot_key_shift_slot<D>(blk, ss, col);
          rot_store_b(bshift.data(), ss, col, g, sum);
          if constexpr (kRotE8pSecond<KeyCode>) rot_store_b(bshift2.data(), ss, col, g, sum * inverse_residual_scale<KeyCode>());
        }
        float s = 0.f;
        if (centred)
          for (int i = residual ? rotary_dim : 0; i < D; ++i) s = std::fmaf(qg[i], fp16_bits_to_float(mu[i]), s);
        base[g] = s * scale_log2;
      }
      auto fill = [&](uint32_t upper) {
        for (int g = 0; g < gn; ++g)
          for (int p = 0; p < pairs; ++p) {
            int ia = 0, ib = 0;
            transform::rope_pair_indices(rope_layout, rotary_dim, p, ia, ib);
            const float* qg = q + static_cast<size_t>(qh0 + g) * D;
            float cu = 0, su = 0, A = 0, B = 0;
            rot_upper_cos_sin(codecs.rope_table().data(), pairs, upper, p, cu, su);
            rot_mean_coefficients(qg[ia], qg[ib], fp16_bits_to_float(mu[ia]), fp16_bits_to_float(mu[ib]), cu, su, A, B);
            rot_store_mean(bmean.data(), p, g, A, B, scale_log2);
          }
      };

      RotTileArgs t;
      t.pool = pl.pool.data();
      t.layout = L;
      t.pages = pl.table.page_indices.data() + pl.table.page_indptr[static_cast<size_t>(b)];
      t.page_magic = magic;
      t.page_shift = shift;
      t.head = h;
      t.end = coded;
      t.groups = gn;
      t.e8p_bytes = &kHostRotE8pBytes.w[0][0];
      t.e81b_bytes = &kHostRotE81bBytes.w[0][0];
      t.mantissas = quant::kGainCodeMantissaBits;
      t.bq = bq.data();
      t.bq2 = bq2.data();
      t.bshift = bshift.data();
      t.bshift2 = bshift2.data();
      t.bmean = bmean.data();
      t.base = base;
      t.delta_table = reinterpret_cast<const RotF4*>(delta_table.data());
      t.rope_table = codecs.rope_table().data();
      t.value_inv_s2 = inverse_residual_scale<ValueCode>();

      // Splits of the coded tokens: each a CTA, its partial (lse, normalized o) per query head.
      Lse2Merge merge[kRotQueryHeads];
      std::vector<std::vector<float>> part_o;  // [split][g][D]
      std::vector<std::vector<float>> part_lse;
      for (int begin = 0; begin < coded; begin += chunk) {
        const int end = std::min(begin + chunk, coded);
        auto cta = std::make_unique<EmulatedCta<D>>();
        cta->fill = fill;
        for (auto& st : cta->states) rot_state_init(st);
        rot_coded_split<EmulatedCta<D>, D, KeyCode, ValueCode>(*cta, t, begin, end, mean_on);
        stats.max_fills = std::max(stats.max_fills, static_cast<int>(cta->fills.size()));
        stats.fills_per_split.insert(static_cast<int>(cta->fills.size()));
        // Epilogue: each warp's column sums and outputs, then the CTA's merge.
        std::vector<float> m(kRotWarps * kRotQueryHeads), l(m.size()), o(static_cast<size_t>(kRotWarps) * kRotQueryHeads * D);
        for (int k = 0; k < kRotWarps; ++k) {
          auto& st = cta->states[k];
          stats.non_tf32 += cta->warps[k].non_tf32_operands;
          stats.tiles_mma += cta->warps[k].mma_count;
          float ls[32][2];
          for (int lane = 0; lane < 32; ++lane) ls[lane][0] = st.l[lane][0], ls[lane][1] = st.l[lane][1];
          cta->warps[k].sum_over_rows(ls);
          for (int lane = 0; lane < 4; ++lane)  // grp 0 holds each column's m and sum
            for (int gi = 0; gi < 2; ++gi) {
              m[static_cast<size_t>(k) * kRotQueryHeads + 2 * lane + gi] = st.m[lane][gi];
              l[static_cast<size_t>(k) * kRotQueryHeads + 2 * lane + gi] = ls[lane][gi];
            }
          for (int lane = 0; lane < 32; ++lane)
            rot_lane_outputs<32, D, kValueCoded>(st, lane, lane, [&](int g, int e, float v) {
              o[(static_cast<size_t>(k) * kRotQueryHeads + g) * D + e] = v;
            });
        }
        std::vector<float> po(static_cast<size_t>(kRotQueryHeads) * D), plse(kRotQueryHeads);
        const float vscale = inverse_input_scale<ValueCode>() * value_ref;
        for (int g = 0; g < gn; ++g)
          for (int i = 0; i < D; ++i) {
            float mw[kRotWarps], lw[kRotWarps], ow[kRotWarps];
            for (int k = 0; k < kRotWarps; ++k) {
              mw[k] = m[static_cast<size_t>(k) * kRotQueryHeads + g];
              lw[k] = l[static_cast<size_t>(k) * kRotQueryHeads + g];
              ow[k] = o[(static_cast<size_t>(k) * kRotQueryHeads + g) * D + i];
            }
            float lse = 0;
            po[static_cast<size_t>(g) * D + i] = rot_merge_warps(mw, lw, ow, vscale, lse);
            plse[g] = lse;
          }
        for (int g = 0; g < gn; ++g) merge[g].add(plse[g]);
        part_o.push_back(po);
        part_lse.push_back(plse);
      }
      // The window (fp16, engine basis): one more partial per query head, in double.
      std::vector<std::vector<float>> win_o(gn, std::vector<float>(D, 0.f));
      std::vector<float> win_lse(gn, -INFINITY);
      for (int g = 0; g < gn && window > 0; ++g) {
        const float* qg = q + static_cast<size_t>(qh0 + g) * D;
        const size_t wb = (bh * pl.window_capacity) * D;
        std::vector<double> s(window);
        double mx = -INFINITY;
        for (int tk = 0; tk < window; ++tk) {
          double dot = 0;
          for (int i = 0; i < D; ++i) dot += static_cast<double>(qg[i]) * fp16_bits_to_float(pl.window_keys[wb + tk * D + i]);
          s[tk] = dot * scale_log2;
          mx = std::max(mx, s[tk]);
        }
        double sum = 0;
        std::vector<double> acc(D, 0.0);
        for (int tk = 0; tk < window; ++tk) {
          const double p = std::exp2(s[tk] - mx);
          sum += p;
          for (int i = 0; i < D; ++i) acc[i] += p * fp16_bits_to_float(pl.window_values[wb + tk * D + i]);
        }
        for (int i = 0; i < D; ++i) win_o[g][i] = static_cast<float>(acc[i] / sum);
        win_lse[g] = static_cast<float>(mx + std::log2(sum));
        merge[g].add(win_lse[g]);
      }
      // Reduction: splits by their lse, the inverse rotation of the coded share, μ_v times its mass.
      for (int g = 0; g < gn; ++g) {
        const float lse = merge[g].lse();
        std::vector<float> coded_out(D, 0.f), back(D);
        float mass = 0.f;
        for (size_t sp = 0; sp < part_o.size(); ++sp) {
          const float w = lse2_weight(part_lse[sp][g], lse);
          mass += w;
          for (int i = 0; i < D; ++i) coded_out[i] = std::fmaf(w, part_o[sp][static_cast<size_t>(g) * D + i], coded_out[i]);
        }
        if (kValueCoded) {
          codecs.rotation(layer, h, 1).inverse(coded_out.data(), back.data());
          if (centred)
            for (int i = 0; i < D; ++i) back[i] = std::fmaf(mass, fp16_bits_to_float(pl.means[bh * 2 * D + D + i]), back[i]);
        } else {
          back = coded_out;
        }
        const float ww = window > 0 ? lse2_weight(win_lse[g], lse) : 0.f;
        for (int i = 0; i < D; ++i) out[static_cast<size_t>(qh0 + g) * D + i] = back[i] + ww * win_o[g][i];
      }
    }
  }
  return out;
}

using EmulateFn = std::vector<float> (*)(const PagedLayer&, const CacheCodecs&, int, int, const float*, int, int,
                                         EmulationStats&);

/// The instantiation for a layer's head_dim and codecs (the ones the tests use), or null.
EmulateFn emulation_for(int d, quant::Codec key, quant::Codec value) {
  using quant::Codec;
#define E8KV_EMULATION(D, K, KT, V, VT) \
  if (d == D && key == K && value == V) return &emulate_attention<D, KT, VT>;
  E8KV_EMULATION(64, Codec::kE8P, codebook::E8P, Codec::kE8P, codebook::E8P)
  E8KV_EMULATION(64, Codec::kRvq3, codebook::Rvq3, Codec::kE8P, codebook::E8P)
  E8KV_EMULATION(64, Codec::kRvq4, codebook::Rvq4, Codec::kRvq4, codebook::Rvq4)
  E8KV_EMULATION(64, Codec::kRvq3, codebook::Rvq3, Codec::kRvq3, codebook::Rvq3)
  E8KV_EMULATION(64, Codec::kE8P, codebook::E8P, Codec::kFp16, RotFp16Values)
  E8KV_EMULATION(128, Codec::kE8P, codebook::E8P, Codec::kE8P, codebook::E8P)
  E8KV_EMULATION(128, Codec::kRvq3, codebook::Rvq3, Codec::kE8P, codebook::E8P)
  E8KV_EMULATION(128, Codec::kRvq4, codebook::Rvq4, Codec::kRvq4, codebook::Rvq4)
  E8KV_EMULATION(128, Codec::kRvq3, codebook::Rvq3, Codec::kRvq3, codebook::Rvq3)
  E8KV_EMULATION(128, Codec::kRvq4, codebook::Rvq4, Codec::kFp16, RotFp16Values)
  E8KV_EMULATION(256, Codec::kRvq3, codebook::Rvq3, Codec::kE8P, codebook::E8P)
#undef E8KV_EMULATION
  return nullptr;
}

// ---- cases -----------------------------------------------------------------------------------------

struct Case {
  std::string what;
  int head_dim = 128;
  int kv_heads = 2;
  int group = 4;
  std::string spec = "preset=quant-k2v2";  ///< Config::parse spec on top of the test's settings
  std::vector<int> lengths;                ///< prefill tokens per sequence
  int residual_length = 0;
  bool queries = true;                     ///< observation queries at compress (key channel scales)
  int32_t first_position = 0;
  int max_gap = 0;                         ///< > 0: coded positions remapped with gaps up to this
  int chunk = 64;                          ///< coded tokens per split (a multiple of 32)
  std::vector<int32_t> expect_coded;       ///< coded tokens per sequence, when the case pins them
};

struct Prepared {
  ModelShape shape;
  std::unique_ptr<KVCompressor> compressor;
  std::vector<synth::SyntheticKV> data;
  std::vector<CompressedKV> caches;
};

/// Gives the coded tokens of `layer` new increasing positions with gaps in [1, max_gap] (the
/// window's positions continue after them). Codes keep their meaning: attend and the pages
/// read the same positions.
void remap_positions(CompressedKV& cache, int layer, std::mt19937_64& rng, int max_gap) {
  auto& ld = e8kv::detail::CacheStorage::layer(cache, layer);
  std::uniform_int_distribution<int> gap(1, max_gap);
  for (size_t set = 0; set < ld.positions.size(); ++set) {
    int32_t p = ld.positions[set].empty() ? 0 : ld.positions[set][0];
    for (auto& x : ld.positions[set]) {
      x = p;
      p += gap(rng);
    }
    // The window holds the pinned sinks (before the coded tokens) and recent tokens after them.
    for (size_t i = static_cast<size_t>(ld.pinned); i < ld.window_positions[set].size(); ++i)
      ld.window_positions[set][i] = p++;
  }
}

Prepared prepare(const Case& c, uint64_t seed) {
  Prepared out;
  Config cfg = Config::parse(c.spec);
  cfg.residual_length = c.residual_length;
  cfg.flush_block = 1;   // coded counts exactly as the case asks
  cfg.mean_tokens = 1;
  cfg.sinks = 0;
  out.shape = ModelShape{1, c.kv_heads, c.kv_heads * c.group, c.head_dim};
  out.compressor = std::make_unique<KVCompressor>(out.shape, cfg);
  std::mt19937_64 rng(seed);
  for (size_t b = 0; b < c.lengths.size(); ++b) {
    synth::SyntheticSpec sp;
    sp.n_layers = 1;
    sp.n_kv_heads = c.kv_heads;
    sp.n_q_heads = c.kv_heads * c.group;
    sp.head_dim = c.head_dim;
    sp.tokens = c.lengths[b];
    sp.obs_window = std::max(1, std::min(8, c.lengths[b]));
    sp.seed = seed + 31 * b;
    out.data.push_back(synth::make_synthetic_kv(sp));
    const auto& d = out.data.back();
    SequenceKV seq;
    seq.first_position = c.first_position;
    seq.layers.push_back({TensorView::nhd(d.keys[0].data(), DType::kF32, sp.tokens, c.kv_heads, c.head_dim),
                          TensorView::nhd(d.values[0].data(), DType::kF32, sp.tokens, c.kv_heads, c.head_dim)});
    std::vector<LayerQueries> queries(1);
    queries[0].queries = TensorView::nhd(d.queries[0].data(), DType::kF32, static_cast<int64_t>(d.query_positions.size()),
                                         sp.n_q_heads, c.head_dim);
    queries[0].positions = d.query_positions.data();
    out.caches.push_back(out.compressor->compress(seq, c.queries && sp.tokens > 0 ? &queries : nullptr));
    if (c.max_gap > 0) remap_positions(out.caches.back(), 0, rng, c.max_gap);
  }
  return out;
}

struct Outcome {
  double worst = 0;
  EmulationStats stats;
};

Outcome run_case(const Case& c, uint64_t seed) {
  Prepared p = prepare(c, seed);
  std::vector<const CompressedKV*> in;
  for (const auto& x : p.caches) in.push_back(&x);
  PagedOptions opt;
  opt.page_tokens = 16;
  opt.shuffle_seed = seed;
  opt.spare_pages = 1;
  opt.pool_fill = 0xFF;  // unused slots are garbage: never read into a result
  const PagedLayer pl = to_paged(in, 0, opt);
  if (!c.expect_coded.empty()) {
    EXPECT_EQ(pl.table.coded_lens, c.expect_coded) << c.what;
  }
  const CacheCodecs& codecs = p.caches[0].codecs();
  const CacheLayout& CL = codecs.layout();
  const EmulateFn fn = emulation_for(c.head_dim, CL.key_codec[0], CL.value_codec[0]);
  Outcome r;
  if (fn == nullptr) {
    ADD_FAILURE() << "no emulation instantiated for this codec pair";
    return r;
  }
  std::mt19937_64 rng(seed + 99);
  std::normal_distribution<float> gauss(0.f, 2.f);
  const int q_heads = p.shape.n_q_heads, d = c.head_dim;
  for (size_t b = 0; b < p.caches.size(); ++b) {
    std::vector<float> q(static_cast<size_t>(q_heads) * d), ref(q.size());
    for (auto& x : q) x = gauss(rng);
    e8kv::attend(p.caches[b], 0, q.data(), ref.data());
    const std::vector<float> got = fn(pl, codecs, 0, static_cast<int>(b), q.data(), q_heads, c.chunk, r.stats);
    for (int row = 0; row < q_heads; ++row) {
      double err = 0, mag = 0;
      for (int i = 0; i < d; ++i) {
        const size_t at = static_cast<size_t>(row) * d + static_cast<size_t>(i);
        err = std::max(err, std::fabs(static_cast<double>(got[at]) - ref[at]));
        mag = std::max(mag, std::fabs(static_cast<double>(ref[at])));
      }
      const double rel = mag > 0 ? err / mag : err;
      EXPECT_LT(rel, kEmulationTolerance) << c.what << ": sequence " << b << " (" << p.caches[b].coded_tokens(0, row / c.group)
                                          << " coded) query head " << row;
      r.worst = std::max(r.worst, rel);
    }
  }
  EXPECT_EQ(r.stats.non_tf32, 0) << c.what << ": an mma operand is not a tf32 value";
  int64_t coded = 0;
  for (int32_t n : pl.table.coded_lens) coded += n;
  EXPECT_GT(coded, 0) << c.what << ": no coded token to score";
  EXPECT_GT(r.stats.tiles_mma, 0) << c.what << ": no tile ran";
  return r;
}

// Coded counts 0, 1, 15, 16, 17 (and past a super-tile and a split): flush_block 1, no sinks, a
// residual window of 3 tokens, so n prefill tokens leave n − 3 coded.
const std::vector<int> kEdgeLengths = {3, 4, 18, 19, 20, 70, 200};

TEST(RotatedAttention, EdgeSizesGroupsAndHeadDims) {
  const uint64_t seed = 710;
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  for (int d : {64, 128})
    for (int group : {1, 4, 8}) {
      Case c;
      c.what = "K2V2 d" + std::to_string(d) + " GQA " + std::to_string(group);
      c.head_dim = d;
      c.group = group;
      c.lengths = kEdgeLengths;
      c.residual_length = 3;
      c.expect_coded = {0, 1, 15, 16, 17, 67, 197};
      const Outcome r = run_case(c, seed + static_cast<uint64_t>(d + group));
      std::printf("  %-28s worst %.2e (tolerance %.0e)\n", c.what.c_str(), r.worst, kEmulationTolerance);
    }
}

TEST(RotatedAttention, EveryCodecPairKeyFrameAndGainWidth) {
  const uint64_t seed = 720;
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  std::vector<Case> cases;
  auto add = [&](std::string what, int d, int group, std::string spec) {
    Case c;
    c.what = std::move(what);
    c.head_dim = d;
    c.group = group;
    c.spec = std::move(spec);
    c.lengths = {1, 17, 150};
    c.residual_length = 2;
    cases.push_back(c);
  };
  for (int d : {64, 128}) {
    const std::string dd = " d" + std::to_string(d);
    add("K3V2" + dd, d, 4, "preset=quant-k3v2");
    add("K4V4" + dd, d, 4, "preset=quant-k4v4");
    add("K3V3" + dd, d, 8, "preset=quant-k3v3");
    add("K2V2 post-RoPE" + dd, d, 4, "preset=quant-k2v2,rope=post");
    add("K3V2 post-RoPE uncentred" + dd, d, 2, "preset=quant-k3v2,rope=post,center=0");
    add("K2V2 residual uncentred" + dd, d, 4, "preset=quant-k2v2,center=0");
    add("K2V2 fp16 gains, no qweight" + dd, d, 4, "preset=quant-k2v2,gain_bits=16,qweight=0");
  }
  add("K2 + fp16 values d64", 64, 4, "preset=quant-k2v2,value=fp16");
  add("K4 + fp16 values d128", 128, 8, "preset=quant-k4v4,value=fp16");
  add("K3V2 d256", 256, 4, "preset=quant-k3v2");
  add("K3V2 interleaved partial RoPE d128", 128, 4, "preset=quant-k3v2,rope_layout=interleaved,rope_dim=96");
  add("K3V2 split-half partial RoPE d64", 64, 4, "preset=quant-k3v2,rope_dim=32");
  add("K2V2 GQA 12 (two query chunks) d64", 64, 12, "preset=quant-k2v2");
  uint64_t s = seed;
  for (const Case& c : cases) {
    const Outcome r = run_case(c, ++s);
    std::printf("  %-40s worst %.2e\n", c.what.c_str(), r.worst);
  }
}

TEST(RotatedAttention, PassesOverDistantAndSparsePositions) {
  const uint64_t seed = 730;
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  {
    // Positions beyond 2^20 crossing upper-part boundaries: one pass per 1024 positions.
    Case c;
    c.what = "positions >= 2^20";
    c.lengths = {1500, 300};
    c.first_position = (1 << 20) + 700;
    c.chunk = 512;
    const Outcome r = run_case(c, seed);
    EXPECT_GE(r.stats.max_fills, 2) << "a split crossing 1024·U should form the coefficients again";
    std::printf("  %-28s worst %.2e, coefficient fills per split up to %d\n", c.what.c_str(), r.worst, r.stats.max_fills);
  }
  {
    // Gaps up to 3000 positions: super-tiles that spread beyond the delta table, taken in passes.
    Case c;
    c.what = "sparse positions";
    c.lengths = {400, 90};
    c.max_gap = 3000;
    c.chunk = 128;
    const Outcome r = run_case(c, seed + 1);
    EXPECT_GE(r.stats.max_fills, 20) << "gaps beyond the delta table should split super-tiles into passes";
    std::printf("  %-28s worst %.2e, coefficient fills per split up to %d\n", c.what.c_str(), r.worst, r.stats.max_fills);
  }
  {
    // Per-head position sets from per-head eviction, with gaps.
    Case c;
    c.what = "per-head sets, evicted";
    c.spec = "preset=quant-k3v2,per_head=1,evict=0.4,scorer=key-norm,recent=8";
    c.lengths = {260, 120};
    c.max_gap = 700;
    c.chunk = 96;
    const Outcome r = run_case(c, seed + 2);
    std::printf("  %-28s worst %.2e\n", c.what.c_str(), r.worst);
  }
}

}  // namespace
