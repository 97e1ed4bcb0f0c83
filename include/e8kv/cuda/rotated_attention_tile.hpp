// One warp's 16-token tile of decode attention over RoPE-residual / post-RoPE keys, written once
// for the GPU and for the CPU emulation of a warp (cuda/rotated_attention_math.hpp describes the
// math and the fragment layouts). The code is SIMT-generic: a Warp policy W runs every per-lane
// statement for its W::kLanes lanes (1 on the device: the calling thread; 32 in the CPU test) and
// provides the warp-collective steps (mma.sync m16n8k8 .tf32, the max over a column's 8 row
// lanes, __syncwarp). So the kernel's tile code is exactly what tests/cache/
// paged_rotated_attention_test.cpp runs against e8kv::attend, fragment layouts and all.
// No CUDA header is needed: g++ compiles this file as it is.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "e8kv/cache/paged_layout.hpp"
#include "e8kv/cuda/rotated_attention_math.hpp"
#include "e8kv/cuda/split_plan.hpp"
#include "e8kv/quant/gain_code.hpp"
#include "e8kv/quant/kv_vector_codec.hpp"

namespace e8kv::cuda {

/// A compiler barrier for memory accesses: loads of later k-steps are not hoisted above it, which
/// keeps the registers of in-flight loads (and so the kernel's 128-register budget) in check.
E8KV_HD E8KV_FORCE_INLINE void rot_fence() {
#if E8KV_ON_DEVICE
  asm volatile("" ::: "memory");
#endif
}

/// The tag of the fp16 value "codec" (8 halves per block, no gain, no rotation).
struct RotFp16Values {
  static constexpr int kIndexBits = 128;
};

/// Everything the tiles of one CTA share (device: shared and global memory; CPU: host arrays).
struct RotTileArgs {
  const uint8_t* pool = nullptr;
  PagedLayout layout;
  const int32_t* pages = nullptr;  ///< the sequence's page indices (page_indices + page_indptr[b])
  uint32_t page_magic = 0;         ///< t / page_tokens = (t · page_magic) >> page_shift for t < 2^31
  int page_shift = 0;
  int head = 0;
  int end = 0;                     ///< coded tokens of the sequence
  int groups = 0;                  ///< query heads of this chunk (<= 8)
  const uint32_t* e8p_bytes = nullptr;   ///< RotE8pBytes (256 × 4 words, 16-byte aligned)
  const uint32_t* e81b_bytes = nullptr;  ///< RotE81bBytes (256 × 4 words, 16-byte aligned)
  const uint32_t* mantissas = nullptr;   ///< the 32 gain-code mantissas (gain_bits 8)
  const RotF4* bq = nullptr;       ///< [key steps][32 lanes]: q̃ (b0, b1) high parts, then low parts
  const RotF4* bq2 = nullptr;      ///< the same for the second stage (q̃ / s2; Rvq3, Rvq4 keys)
  const RotF4* bshift = nullptr;   ///< [shift steps][32]: block sums of q̃
  const RotF4* bshift2 = nullptr;  ///< block sums of q̃ / s2 (Rvq4 keys)
  const RotF4* bmean = nullptr;    ///< [mean steps][32]: (A, B) high parts, then low parts
  const float* base = nullptr;     ///< [8] constant score term per query head
  const RotF4* delta_table = nullptr;  ///< rope_delta_table: [kRopeDeltaRows][D/2] (zeros beyond the rotary pairs)
  const float* rope_table = nullptr;   ///< the 3-level table (offsets beyond the delta table)
  uint32_t upper = 0;              ///< U of the current coefficients
  /// Tokens [lo, hi) of the sequence are scored by this pass (others masked): a super-tile whose
  /// positions spread beyond the delta table is taken in several passes, each with its own U.
  int lo = 0, hi = 0;
  float value_inv_s2 = 1.f;        ///< 1/s2 of a two-stage value code
};

/// Floats of one warp's weight buffer: [16 tokens][8 heads][4] (p·gain high, low; and / s2 high, low).
inline constexpr int kRotWeightFloats = kRotTileTokens * kRotQueryHeads * 4;

/// One warp's running state over its tiles: the value accumulators (rotated domain, lattice
/// units times gain factors) and the online softmax of the lane's two query heads 2·tig, 2·tig+1.
template <int L, int D>
struct RotWarpState {
  float o[RotShape<D>::kValueTiles][L][4];        ///< value product accumulators, per m-tile
  float os[RotShape<D>::kValueShiftTiles][L][4];  ///< value-shift product accumulators
  float m[L][2];
  float l[L][2];
};

template <int L, int D>
E8KV_HD inline void rot_state_init(RotWarpState<L, D>& st) {
  for (int l = 0; l < L; ++l) {
    E8KV_LANE_UNROLL
    for (int t = 0; t < RotShape<D>::kValueTiles; ++t)
      E8KV_LANE_UNROLL
      for (int r = 0; r < 4; ++r) st.o[t][l][r] = 0.f;
    E8KV_LANE_UNROLL
    for (int t = 0; t < RotShape<D>::kValueShiftTiles; ++t)
      E8KV_LANE_UNROLL
      for (int r = 0; r < 4; ++r) st.os[t][l][r] = 0.f;
    st.m[l][0] = st.m[l][1] = -INFINITY;
    st.l[l][0] = st.l[l][1] = 0.f;
  }
}

// ---- loads ----------------------------------------------------------------------------------------

/// N bytes at p into little-endian words, with accesses of `Align` bytes (p is Align-aligned).
template <int N, int Align>
E8KV_HD E8KV_FORCE_INLINE void rot_load_bytes(const uint8_t* p, uint32_t (&w)[(N + 3) / 4]) {
#if E8KV_ON_DEVICE
  if constexpr (Align >= 16 && N % 16 == 0) {
    E8KV_LANE_UNROLL
    for (int i = 0; i < N / 16; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else if constexpr (Align >= 8 && N % 8 == 0) {
    E8KV_LANE_UNROLL
    for (int i = 0; i < N / 8; ++i) {
      const uint2 v = reinterpret_cast<const uint2*>(p)[i];
      w[2 * i] = v.x, w[2 * i + 1] = v.y;
    }
  } else if constexpr (Align >= 4 && N % 4 == 0) {
    E8KV_LANE_UNROLL
    for (int i = 0; i < N / 4; ++i) w[i] = reinterpret_cast<const uint32_t*>(p)[i];
  } else if constexpr (Align >= 2 && N % 2 == 0) {
    E8KV_LANE_UNROLL
    for (int i = 0; i < (N + 3) / 4; ++i) w[i] = 0;
    E8KV_LANE_UNROLL
    for (int i = 0; i < N / 2; ++i)
      w[i / 2] |= static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[i]) << (16 * (i & 1));
  } else {
    E8KV_LANE_UNROLL
    for (int i = 0; i < (N + 3) / 4; ++i) w[i] = 0;
    E8KV_LANE_UNROLL
    for (int i = 0; i < N; ++i) w[i / 4] |= static_cast<uint32_t>(p[i]) << (8 * (i & 3));
  }
#else
  for (int i = 0; i < (N + 3) / 4; ++i) w[i] = 0;
  std::memcpy(w, p, N);  // little-endian hosts
#endif
}

template <class T>
E8KV_HD E8KV_FORCE_INLINE T rot_load(const uint8_t* p) {
#if E8KV_ON_DEVICE
  return *reinterpret_cast<const T*>(p);
#else
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}

/// Alignment of a lane's slice of `bytes` bytes in a vector of 4 (keys) or 8 (values) slices.
E8KV_HD constexpr int rot_slice_align(int bytes) {
  return bytes % 16 == 0 ? 16 : (bytes % 8 == 0 ? 8 : (bytes % 4 == 0 ? 4 : (bytes % 2 == 0 ? 2 : 1)));
}

/// The page and slot of coded token t of the tile's sequence.
E8KV_HD E8KV_FORCE_INLINE const uint8_t* rot_token_page(const RotTileArgs& a, int t, int& slot) {
  const uint32_t page_of = static_cast<uint32_t>((static_cast<uint64_t>(static_cast<uint32_t>(t)) * a.page_magic) >> a.page_shift);
  slot = t - static_cast<int>(page_of) * a.layout.page_tokens;
  return a.pool + static_cast<int64_t>(a.pages[page_of]) * a.layout.page_bytes;
}

/// The magic number of t / page_tokens for t < 2^31 (Granlund–Montgomery: m = ceil(2^(31+k)/P),
/// k = ceil(log2 P), so m <= 2^32 − 1 except m = 2^31 for powers of two: it fits 32 bits).
inline void rot_page_divider(int page_tokens, uint32_t& magic, int& shift) {
  int k = 0;
  while ((1ll << k) < page_tokens) ++k;
  const unsigned __int128 num = static_cast<unsigned __int128>(1) << (31 + k);
  magic = static_cast<uint32_t>((num + static_cast<unsigned>(page_tokens) - 1) / static_cast<unsigned>(page_tokens));
  shift = 31 + k;
}

/// A gain entry as a float factor: fp16 bits (2 bytes) or an 8-bit code (1 byte, the reference
/// folded elsewhere).
E8KV_HD E8KV_FORCE_INLINE float rot_gain_factor(const uint8_t* p, int bytes, const uint32_t* mantissas) {
  if (bytes == 2) return fp16_bits_to_float(rot_load<uint16_t>(p));
  return quant::gain_code_factor(mantissas, *p);
}

// ---- cos/sin of the mean term ---------------------------------------------------------------------

/// The rope_delta_table row of offset Δ (rows beyond the table are clamped: the callers mask
/// their tokens): entry p holds (cos hi, sin hi, cos lo, sin lo) of Δ·θ_p, zeros beyond the
/// rotary pairs.
template <int D>
E8KV_HD E8KV_FORCE_INLINE const RotF4* rot_delta_row(const RotTileArgs& a, uint32_t delta) {
  constexpr uint32_t kLast = static_cast<uint32_t>(kRopeDeltaRows) - 1u;
  return a.delta_table + static_cast<int64_t>(delta < kLast ? delta : kLast) * (D / 2);
}

// ---- the tile -------------------------------------------------------------------------------------

template <class Code>
inline constexpr bool kRotTwoStage = std::is_same_v<Code, codebook::Rvq3> || std::is_same_v<Code, codebook::Rvq4>;
template <class Code>
inline constexpr bool kRotE8pSecond = std::is_same_v<Code, codebook::Rvq4>;
template <class Code>
inline constexpr int kRotBlockBytes = std::is_same_v<Code, RotFp16Values> ? 16 : Code::kIndexBits / 8;

/// Decoded coordinates of one block of one token: stage 1 (E8P point without shift) and, for
/// two-stage codes, stage 2 (E81B point, or E8P point without shift for Rvq4); fp16: the values.
template <class Code>
struct RotBlock {
  E8pBlock b1;
  E8pBlock b2;                       // Rvq4
  uint32_t w2[4] = {0, 0, 0, 0};     // Rvq3: the E81B point's byte words
  uint32_t h[4] = {0, 0, 0, 0};      // fp16 values: 8 halves
};

template <class Code>
E8KV_HD E8KV_FORCE_INLINE void rot_decode_block(const RotTileArgs& a, const uint32_t* words, int at, RotBlock<Code>& out) {
  if constexpr (std::is_same_v<Code, RotFp16Values>) {
    E8KV_LANE_UNROLL
    for (int i = 0; i < 4; ++i) out.h[i] = words[at / 4 + i];
  } else {
    const uint32_t index = rot_index_at<Code::kIndexBits / 8>(words, at);
    out.b1 = e8p_block(a.e8p_bytes, index & 0xFFFFu);
    if constexpr (kRotE8pSecond<Code>) out.b2 = e8p_block(a.e8p_bytes, index >> 16);
    if constexpr (std::is_same_v<Code, codebook::Rvq3>) {
      const uint32_t* row = a.e81b_bytes + 4 * ((index >> 16) & 0xFFu);
#if E8KV_ON_DEVICE
      const uint4 v = *reinterpret_cast<const uint4*>(row);
      out.w2[0] = v.x, out.w2[1] = v.y, out.w2[2] = v.z, out.w2[3] = v.w;
#else
      for (int e = 0; e < 4; ++e) out.w2[e] = row[e];
#endif
    }
  }
}

/// Coordinate i of stage 1 (fp16: the value).
template <class Code>
E8KV_HD E8KV_FORCE_INLINE float rot_coord1(const RotBlock<Code>& b, int i) {
  if constexpr (std::is_same_v<Code, RotFp16Values>)
    return fp16_bits_to_float(static_cast<uint16_t>(b.h[i >> 1] >> (16 * (i & 1))));
  else
    return e8p_coordinate(b.b1, i);
}

template <class Code>
E8KV_HD E8KV_FORCE_INLINE float rot_coord2(const RotBlock<Code>& b, int i) {
  if constexpr (kRotE8pSecond<Code>)
    return e8p_coordinate(b.b2, i);
  else
    return e81b_coordinate(b.w2, i);
}

/// One 16-token tile starting at coded token t0 of one warp: scores (coded keys, mean term,
/// constant term), the online softmax update, and the value accumulation. kMean: the mean term
/// (RoPE-residual keys with centring). Tokens outside [a.lo, a.hi) and, with the mean term,
/// tokens whose offset from 1024·U is beyond the delta table are masked (loads clamped to a.end).
template <class W, int D, class KeyCode, class ValueCode, bool kMean>
E8KV_HD void rot_tile(W& w, const RotTileArgs& a, float* wbuf, int t0, RotWarpState<W::kLanes, D>& st) {
  using S = RotShape<D>;
  constexpr int L = W::kLanes;
  constexpr int KB = KeyCode::kIndexBits / 8;
  constexpr int KPL = S::kKeyBlocksPerLane;
  constexpr int KN = KPL * KB;  // key bytes a lane reads per token
  constexpr int VB = kRotBlockBytes<ValueCode>;
  constexpr int VPL = S::kValueBlocksPerLane;
  constexpr int VN = VPL * VB;
  constexpr bool kValueCoded = !std::is_same_v<ValueCode, RotFp16Values>;
  const PagedLayout& PL = a.layout;

  // Rows: tokens grp and grp + 8 of the tile (keys, gains, positions).
  uint32_t kw[L][2][(KN + 3) / 4];
  float kf[L][2], vf[L][2];
  uint32_t delta[L][2];
  bool valid[L][2];
  for (int l = 0; l < L; ++l) {
    const int lane = w.lane(l), grp = lane >> 2, tig = lane & 3;
    E8KV_LANE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int t = t0 + grp + 8 * r;
      valid[l][r] = t >= a.lo && t < a.hi;
      int slot = 0;
      const uint8_t* page = rot_token_page(a, t < a.end ? t : a.end - 1, slot);
      rot_load_bytes<KN, rot_slice_align(KN)>(page + PL.key_code_offset(a.head, slot) + tig * KN, kw[l][r]);
      kf[l][r] = rot_gain_factor(page + PL.key_gain_offset(a.head, slot), PL.key_gain_bytes, a.mantissas);
      vf[l][r] = kValueCoded ? rot_gain_factor(page + PL.value_gain_offset(a.head, slot), PL.value_gain_bytes, a.mantissas)
                             : 1.f;
      if constexpr (kMean) {
        const int32_t pos = rot_load<int32_t>(page + PL.position_offset(a.head, slot));
        delta[l][r] = static_cast<uint32_t>(pos < 0 ? 0 : pos) - (a.upper << 10);
        valid[l][r] = valid[l][r] && delta[l][r] < static_cast<uint32_t>(kRopeDeltaRows);
      }
    }
  }

  // Scores: Σ over k-steps of lattice points × q̃ (high and low parts), per stage.
  float qk[L][4];
  float shift1[L][2][KPL], shift2[L][2][KPL];
  for (int l = 0; l < L; ++l)
    E8KV_LANE_UNROLL
    for (int r = 0; r < 4; ++r) qk[l][r] = 0.f;
  E8KV_LANE_UNROLL
  for (int s = 0; s < KPL; ++s) {
    rot_fence();
    RotBlock<KeyCode> blk[L][2];
    for (int l = 0; l < L; ++l)
      E8KV_LANE_UNROLL
      for (int r = 0; r < 2; ++r) {
        rot_decode_block<KeyCode>(a, kw[l][r], s * KB, blk[l][r]);
        shift1[l][r][s] = blk[l][r].b1.shift;
        shift2[l][r][s] = blk[l][r].b2.shift;
      }
    E8KV_LANE_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int kstep = 4 * s + e;
      float fa[L][4], bhi[L][2], blo[L][2];
      for (int l = 0; l < L; ++l) {
        fa[l][0] = rot_coord1(blk[l][0], e);
        fa[l][1] = rot_coord1(blk[l][1], e);
        fa[l][2] = rot_coord1(blk[l][0], e + 4);
        fa[l][3] = rot_coord1(blk[l][1], e + 4);
        const RotF4 b = a.bq[kstep * 32 + w.lane(l)];
        bhi[l][0] = b.x, bhi[l][1] = b.y, blo[l][0] = b.z, blo[l][1] = b.w;
      }
      w.mma(qk, fa, bhi);
      w.mma(qk, fa, blo);
      if constexpr (kRotTwoStage<KeyCode>) {
        for (int l = 0; l < L; ++l) {
          fa[l][0] = rot_coord2(blk[l][0], e);
          fa[l][1] = rot_coord2(blk[l][1], e);
          fa[l][2] = rot_coord2(blk[l][0], e + 4);
          fa[l][3] = rot_coord2(blk[l][1], e + 4);
          const RotF4 b = a.bq2[kstep * 32 + w.lane(l)];
          bhi[l][0] = b.x, bhi[l][1] = b.y, blo[l][0] = b.z, blo[l][1] = b.w;
        }
        w.mma(qk, fa, bhi);
        w.mma(qk, fa, blo);
      }
    }
  }
  // E8P shifts: Σ over blocks of shift × block sum of q̃.
  E8KV_LANE_UNROLL
  for (int sg = 0; sg < S::kShiftSteps; ++sg) {
    float fa[L][4], bhi[L][2], blo[L][2];
    for (int l = 0; l < L; ++l) {
      fa[l][0] = shift1[l][0][2 * sg];
      fa[l][1] = shift1[l][1][2 * sg];
      fa[l][2] = shift1[l][0][2 * sg + 1];
      fa[l][3] = shift1[l][1][2 * sg + 1];
      const RotF4 b = a.bshift[sg * 32 + w.lane(l)];
      bhi[l][0] = b.x, bhi[l][1] = b.y, blo[l][0] = b.z, blo[l][1] = b.w;
    }
    w.mma(qk, fa, bhi);
    w.mma(qk, fa, blo);
    if constexpr (kRotE8pSecond<KeyCode>) {
      for (int l = 0; l < L; ++l) {
        fa[l][0] = shift2[l][0][2 * sg];
        fa[l][1] = shift2[l][1][2 * sg];
        fa[l][2] = shift2[l][0][2 * sg + 1];
        fa[l][3] = shift2[l][1][2 * sg + 1];
        const RotF4 b = a.bshift2[sg * 32 + w.lane(l)];
        bhi[l][0] = b.x, bhi[l][1] = b.y, blo[l][0] = b.z, blo[l][1] = b.w;
      }
      w.mma(qk, fa, bhi);
      w.mma(qk, fa, blo);
    }
  }

  // Mean term: cos/sin of Δ·θ (high, low) × coefficients (high, low); three products.
  float mean[L][4];
  for (int l = 0; l < L; ++l)
    E8KV_LANE_UNROLL
    for (int r = 0; r < 4; ++r) mean[l][r] = 0.f;
  if constexpr (kMean) {
    // The lane's entries (pair tig of each k-step) of its two tokens' table rows.
    const RotF4* drow[L][2];
    for (int l = 0; l < L; ++l)
      E8KV_LANE_UNROLL
      for (int r = 0; r < 2; ++r) drow[l][r] = rot_delta_row<D>(a, delta[l][r]) + (w.lane(l) & 3);
    E8KV_LANE_UNROLL
    for (int ms = 0; ms < S::kBlocks; ++ms) {  // pairs 4·ms .. 4·ms + 3 (zeros beyond the rotary ones)
      rot_fence();
      float ahi[L][4], alo[L][4], bhi[L][2], blo[L][2];
      for (int l = 0; l < L; ++l) {
        const int lane = w.lane(l);
        const RotF4 e0 = drow[l][0][4 * ms], e1 = drow[l][1][4 * ms];
        ahi[l][0] = e0.x, ahi[l][1] = e1.x, ahi[l][2] = e0.y, ahi[l][3] = e1.y;
        alo[l][0] = e0.z, alo[l][1] = e1.z, alo[l][2] = e0.w, alo[l][3] = e1.w;
        const RotF4 b = a.bmean[ms * 32 + lane];
        bhi[l][0] = b.x, bhi[l][1] = b.y, blo[l][0] = b.z, blo[l][1] = b.w;
      }
      w.mma(mean, ahi, bhi);
      w.mma(mean, ahi, blo);
      w.mma(mean, alo, bhi);
    }
  }

  // Scores (log2 domain, scaled), the tile's maximum per query head, the online update.
  float sc[L][2][2], mx[L][2];
  for (int l = 0; l < L; ++l) {
    const int tig = w.lane(l) & 3;
    E8KV_LANE_UNROLL
    for (int gi = 0; gi < 2; ++gi) {
      E8KV_LANE_UNROLL
      for (int r = 0; r < 2; ++r)
        sc[l][r][gi] = valid[l][r] ? qk[l][2 * r + gi] * kf[l][r] + (mean[l][2 * r + gi] + a.base[2 * tig + gi]) : -INFINITY;
      mx[l][gi] = fmaxf(sc[l][0][gi], sc[l][1][gi]);
    }
  }
  w.max_over_rows(mx);
  for (int l = 0; l < L; ++l) {
    const int lane = w.lane(l), grp = lane >> 2, tig = lane & 3;
    E8KV_LANE_UNROLL
    for (int gi = 0; gi < 2; ++gi) {
      const float m_new = fmaxf(st.m[l][gi], mx[l][gi]);  // −inf only while every token so far is masked
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(st.m[l][gi] - m_use);     // 0 on the first scored tile (m = −inf)
      const float p0 = exp2f(sc[l][0][gi] - m_use), p1 = exp2f(sc[l][1][gi] - m_use);
      st.l[l][gi] = st.l[l][gi] * alpha + (p0 + p1);
      st.m[l][gi] = m_new;
      E8KV_LANE_UNROLL
      for (int t = 0; t < S::kValueTiles; ++t) {
        st.o[t][l][gi] *= alpha;
        st.o[t][l][2 + gi] *= alpha;
      }
      E8KV_LANE_UNROLL
      for (int t = 0; t < S::kValueShiftTiles; ++t) {
        st.os[t][l][gi] *= alpha;
        st.os[t][l][2 + gi] *= alpha;
      }
      // The weights p·gain (high, low; and / s2 for two-stage values) of tokens grp and grp + 8.
      const float pr[2] = {p0, p1};
      E8KV_LANE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const float wt = pr[r] * vf[l][r];
        float* out = wbuf + ((grp + 8 * r) * 8 + 2 * tig + gi) * 4;
        split_tf32(wt, out[0], out[1]);
        if constexpr (kRotTwoStage<ValueCode>) split_tf32(wt * a.value_inv_s2, out[2], out[3]);
      }
    }
  }
  w.sync();

  // Values: two k-steps of 8 tokens; the lane decodes its blocks of tokens tig and tig + 4.
  E8KV_LANE_UNROLL
  for (int ks = 0; ks < 2; ++ks) {
    rot_fence();
    uint32_t vw[L][2][(VN + 3) / 4];
    float bhi[L][2], blo[L][2], b2hi[L][2], b2lo[L][2];
    for (int l = 0; l < L; ++l) {
      const int lane = w.lane(l), grp = lane >> 2, tig = lane & 3;
      E8KV_LANE_UNROLL
      for (int u = 0; u < 2; ++u) {
        const int tok = 8 * ks + tig + 4 * u;
        const int t = t0 + tok;
        int slot = 0;
        const uint8_t* page = rot_token_page(a, t < a.end ? t : a.end - 1, slot);
        rot_load_bytes<VN, rot_slice_align(VN)>(page + PL.value_code_offset(a.head, slot) + grp * VN, vw[l][u]);
        const float* wb = wbuf + (tok * 8 + grp) * 4;
        bhi[l][u] = wb[0], blo[l][u] = wb[1];
        if constexpr (kRotTwoStage<ValueCode>) b2hi[l][u] = wb[2], b2lo[l][u] = wb[3];
      }
    }
    float vshift1[L][2][VPL], vshift2[L][2][VPL];
    E8KV_LANE_UNROLL
    for (int vb = 0; vb < VPL; ++vb) {
      RotBlock<ValueCode> blk[L][2];
      for (int l = 0; l < L; ++l)
        E8KV_LANE_UNROLL
        for (int u = 0; u < 2; ++u) {
          rot_decode_block<ValueCode>(a, vw[l][u], vb * VB, blk[l][u]);
          vshift1[l][u][vb] = blk[l][u].b1.shift;
          vshift2[l][u][vb] = blk[l][u].b2.shift;
        }
      E8KV_LANE_UNROLL
      for (int q = 0; q < 4; ++q) {
        const int mt = 4 * vb + q;  // elements q and q + 4 of block vb (rot_value_element)
        float fa[L][4];
        for (int l = 0; l < L; ++l) {
          fa[l][0] = rot_coord1(blk[l][0], q);
          fa[l][1] = rot_coord1(blk[l][0], q + 4);
          fa[l][2] = rot_coord1(blk[l][1], q);
          fa[l][3] = rot_coord1(blk[l][1], q + 4);
        }
        w.mma(st.o[mt], fa, bhi);
        w.mma(st.o[mt], fa, blo);
        if constexpr (kRotTwoStage<ValueCode>) {
          for (int l = 0; l < L; ++l) {
            fa[l][0] = rot_coord2(blk[l][0], q);
            fa[l][1] = rot_coord2(blk[l][0], q + 4);
            fa[l][2] = rot_coord2(blk[l][1], q);
            fa[l][3] = rot_coord2(blk[l][1], q + 4);
          }
          w.mma(st.o[mt], fa, b2hi);
          w.mma(st.o[mt], fa, b2lo);
        }
      }
    }
    if constexpr (kValueCoded) {
      E8KV_LANE_UNROLL
      for (int sg = 0; sg < S::kValueShiftTiles; ++sg) {
        float fa[L][4];
        for (int l = 0; l < L; ++l) {
          const int w0 = 2 * sg, w1 = 2 * sg + 1;
          fa[l][0] = vshift1[l][0][w0];
          fa[l][1] = w1 < VPL ? vshift1[l][0][w1 < VPL ? w1 : 0] : 0.f;
          fa[l][2] = vshift1[l][1][w0];
          fa[l][3] = w1 < VPL ? vshift1[l][1][w1 < VPL ? w1 : 0] : 0.f;
        }
        w.mma(st.os[sg], fa, bhi);
        w.mma(st.os[sg], fa, blo);
        if constexpr (kRotE8pSecond<ValueCode>) {
          for (int l = 0; l < L; ++l) {
            const int w0 = 2 * sg, w1 = 2 * sg + 1;
            fa[l][0] = vshift2[l][0][w0];
            fa[l][1] = w1 < VPL ? vshift2[l][0][w1 < VPL ? w1 : 0] : 0.f;
            fa[l][2] = vshift2[l][1][w0];
            fa[l][3] = w1 < VPL ? vshift2[l][1][w1 < VPL ? w1 : 0] : 0.f;
          }
          w.mma(st.os[sg], fa, b2hi);
          w.mma(st.os[sg], fa, b2lo);
        }
      }
    }
  }
  w.sync();  // the weights buffer is rewritten by the next tile
}


// ---- one CTA's coded split -------------------------------------------------------------------------

/// Warps of a CTA and the tokens of one super-tile (each warp takes one 16-token tile of it).
inline constexpr int kRotWarps = 4;
inline constexpr int kRotSuperTile = kRotWarps * kRotTileTokens;

/// Position of coded token t of the tile's sequence (the head's set).
E8KV_HD E8KV_FORCE_INLINE int32_t rot_position(const RotTileArgs& a, int t) {
  int slot = 0;
  const uint8_t* page = rot_token_page(a, t, slot);
  return rot_load<int32_t>(page + a.layout.position_offset(a.head, slot));
}

/// One super-tile: every warp of the CTA scores its 16-token tile.
template <class Cta, int D, class KeyCode, class ValueCode, bool kMean>
E8KV_HD E8KV_FORCE_INLINE void rot_super_tile(Cta& cta, const RotTileArgs& t, int st0, int end) {
  for (int k = 0; k < Cta::kWarps; ++k) {
    const int t0 = st0 + kRotTileTokens * cta.warp_id(k);
    if (t0 < end) rot_tile<typename Cta::Warp, D, KeyCode, ValueCode, kMean>(cta.warp(k), t, cta.wbuf(k), t0, cta.state(k));
  }
}

/// The coded tokens [begin, end) of one CTA (begin < end), written once for the device and the
/// CPU emulation. Cta runs the CTA's warps: on the device one (the caller's) per thread, with
/// __syncthreads; in the emulation all kRotWarps in turn. It provides
///   kWarps, Warp, warp_id(k), warp(k), state(k), wbuf(k): the warps it runs and their state;
///   sync(): a CTA barrier (nothing when the warps run in turn);
///   fill_mean(U): the mean-term coefficients for upper part U into t.bmean (CTA-wide).
/// Without the mean term the loop is one pass over super-tiles. With it (RoPE-residual keys and
/// centring) tokens are scored in passes whose positions lie in [1024·U, 1024·U + kRopeDeltaRows),
/// U the upper part of the pass's first position: the coefficients are formed again when U
/// changes, i.e. once per 1024 positions of a contiguous sequence; a super-tile whose positions
/// spread further is taken in several passes over the tokens [lo, hi) that fit. Positions must
/// not decrease along a sequence (the caches keep them sorted); a token outside its pass's
/// window would be masked.
template <class Cta, int D, class KeyCode, class ValueCode>
E8KV_HD void rot_coded_split(Cta& cta, RotTileArgs& t, int begin, int end, bool mean_on) {
  t.lo = begin;
  t.hi = end;
  if (!mean_on) {
    cta.sync();  // the prologue's fragments
    int st0 = begin;
    do {
      rot_super_tile<Cta, D, KeyCode, ValueCode, false>(cta, t, st0, end);
      st0 += kRotSuperTile;
      // cost-report: per-token loop (scripts/kernel_cost.py finds the loop whose back edge is the next line)
    } while (st0 < end);
    return;
  }
  // One call site of the tile (its code is large). The outer loop sets up a pass (coefficients
  // of a new U; the end of the tokens that fit when a super-tile spreads beyond the window), the
  // inner one runs super-tiles while they lie whole in the window of the same U.
  uint32_t upper = 0xFFFFFFFFu;
  int lo = begin, st0 = begin;
  do {
    int st_end = st0 + kRotSuperTile < end ? st0 + kRotSuperTile : end;
    const uint32_t u = rot_upper(rot_position(t, lo));
    if (u != upper) {
      cta.sync();  // every warp is done with the previous coefficients
      cta.fill_mean(u);
      upper = u;
      cta.sync();
    }
    const int64_t limit = (static_cast<int64_t>(upper) << 10) + kRopeDeltaRows;
    int hi = end;
    if (rot_position(t, st_end - 1) >= limit) {
      // The first token at or beyond the limit (lo's position is below it).
      int lo_s = lo + 1, hi_s = st_end - 1;
      while (lo_s < hi_s) {
        const int mid = (lo_s + hi_s) / 2;
        if (rot_position(t, mid) >= limit) hi_s = mid; else lo_s = mid + 1;
      }
      hi = lo_s;
    }
    t.upper = upper;
    t.hi = hi;
    do {
      t.lo = lo;
      rot_super_tile<Cta, D, KeyCode, ValueCode, true>(cta, t, st0, end);
      if (hi < st_end) {  // a partial pass: the rest of this super-tile needs another U
        lo = hi;
        break;
      }
      st0 += kRotSuperTile;
      lo = st0;
      if (st0 >= end) break;
      st_end = st0 + kRotSuperTile < end ? st0 + kRotSuperTile : end;
      // cost-report: per-token loop (scripts/kernel_cost.py finds the loop whose back edge is the next line)
    } while (rot_upper(rot_position(t, st0)) == upper && rot_position(t, st_end - 1) < limit);
  } while (st0 < end);
}

/// The accumulated output of lane l of a warp (rotated domain, lattice units, not normalized),
/// E8P shifts included: calls out(head, element, value) for each of the lane's 2·D/8 elements of
/// its two query heads 2·tig and 2·tig + 1 (heads the chunk does not have are the caller's to
/// skip).
template <int L, int D, bool kValueCoded, class Out>
E8KV_HD E8KV_FORCE_INLINE void rot_lane_outputs(const RotWarpState<L, D>& st, int l, int lane, Out&& out) {
  const int grp = lane >> 2, tig = lane & 3;
  E8KV_LANE_UNROLL
  for (int gi = 0; gi < 2; ++gi)
    E8KV_LANE_UNROLL
    for (int mt = 0; mt < RotShape<D>::kValueTiles; ++mt)
      E8KV_LANE_UNROLL
      for (int half = 0; half < 2; ++half) {
        float v = st.o[mt][l][2 * half + gi];
        if constexpr (kValueCoded) {
          const int wblk = mt >> 2;  // the lane's value block of this m-tile: its shift's row
          v += st.os[wblk >> 1][l][2 * (wblk & 1) + gi];
        }
        out(2 * tig + gi, rot_value_element<D>(mt, grp + 8 * half), v);
      }
}

/// One output element of a CTA from its warps' partial states (m: running maxima, l: sums, o:
/// accumulated outputs; warps without tokens have m = −inf): o normalized by the CTA's sum and
/// times `vscale`, and the CTA's lse (log2 domain). A CTA without any scored token gives o = 0
/// and lse = −inf.
E8KV_HD inline float rot_merge_warps(const float* m, const float* l, const float* o, float vscale, float& lse) {
  float mx = -INFINITY;
  for (int k = 0; k < kRotWarps; ++k) mx = fmaxf(mx, m[k]);
  float sum_acc = 0.f, sum_l = 0.f;
  for (int k = 0; k < kRotWarps; ++k) {
    if (m[k] == -INFINITY) continue;  // a warp without tokens
    const float wgt = exp2f(m[k] - mx);
    sum_acc = fmaf(wgt, o[k], sum_acc);
    sum_l = fmaf(wgt, l[k], sum_l);
  }
  if (!(sum_l > 0.f)) {
    lse = -INFINITY;
    return 0.f;
  }
  lse = partial_lse2(mx, sum_l);
  return vscale * (sum_acc / sum_l);
}

}  // namespace e8kv::cuda
