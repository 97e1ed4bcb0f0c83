// Device building blocks shared by the paged KV kernels: one head vector of D elements spread
// over D/8 consecutive lanes of a warp (lane L of the group owns elements 8L..8L+7, i.e. exactly
// the 8-element block L of the block codes). Each helper performs the float operations of the
// CPU functions in quant/kv_vector_codec.hpp in the same order; the cross-lane steps only fetch
// the partner values with warp shuffles. Every lane of the warp must call a helper that
// shuffles (inactive lanes run it on dummy data).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "e8kv/cache/kv_view.hpp"
#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/numeric/fp.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/quant/codec.hpp"
#include "e8kv/quant/gain_code.hpp"
#include "e8kv/quant/kv_vector_codec.hpp"
#include "e8kv/transform/hadamard.hpp"
#include "e8kv/transform/rope.hpp"

namespace e8kv::cuda::detail {

inline constexpr unsigned kFullMask = 0xffffffffu;

/// The 32 gain-code mantissas (quant/gain_code.hpp) in constant memory; kernels that decode many
/// 8-bit gains copy them to shared memory first (per-lane codes differ).
static __constant__ uint32_t kDeviceGainMantissas[32] = {E8KV_GAIN_CODE_MANTISSA_BITS};

/// Tag for the fp16 "codec" (the vector itself, 2 bytes per element: no rotation, no gain).
struct Fp16Code {
  static constexpr int kIndexBits = 0;
};

template <class Code>
inline constexpr bool kIsFp16 = std::is_same_v<Code, Fp16Code>;

/// Bytes of one 8-element block in the packed codes (16 for fp16).
template <class Code>
inline constexpr int kLaneCodeBytes = kIsFp16<Code> ? 16 : Code::kIndexBits / 8;

// ---- the warp-shared exhaustive searches ---------------------------------------------------------

/// codebook::share_open_searches' warp policy on the device: one lane per thread, shuffles.
struct DeviceSearchWarp {
  static constexpr int kLanes = 1;
  int lane_id = 0;
  __device__ __forceinline__ int lane(int) const { return lane_id; }
  __device__ __forceinline__ uint32_t ballot(const bool (&pred)[1]) const { return __ballot_sync(kFullMask, pred[0]); }
  __device__ __forceinline__ void broadcast(float (&v)[1], int src) const { v[0] = __shfl_sync(kFullMask, v[0], src); }
  template <class T>
  __device__ __forceinline__ void exchange_xor(const T (&v)[1], int m, T (&out)[1]) const {
    out[0] = __shfl_xor_sync(kFullMask, v[0], m);
  }
};

/// The encoders' fallback policy in the paged kernels (codebook/detail/search_fallback.hpp): the
/// warp shares each open block's exhaustive search. Every lane of the warp must call the encoder.
struct DeviceWarpFallback {
  template <class Search>
  __device__ __forceinline__ uint32_t resolve(const float z[8], bool decided, uint32_t index) const {
    float zl[1][8];
#pragma unroll
    for (int i = 0; i < 8; ++i) zl[0][i] = z[i];
    const bool d[1] = {decided};
    uint32_t result[1] = {index};
    codebook::share_open_searches<Search>(DeviceSearchWarp{static_cast<int>(threadIdx.x & 31u)}, zl, d, result);
    return result[0];
  }
};

// ---- reductions over a lane group -------------------------------------------------------------

/// Sum over the kLanes lanes of the group as an xor-butterfly: every lane gets the pairwise tree
/// sum of quant::pairwise_tree_sum (the lower group's value is always the left operand up to
/// commutativity, which IEEE addition has).
template <int kLanes>
__device__ __forceinline__ double lane_tree_sum(double x) {
#pragma unroll
  for (int m = 1; m < kLanes; m <<= 1) x = fp::add(x, __shfl_xor_sync(kFullMask, x, m));
  return x;
}

template <int kLanes>
__device__ __forceinline__ float lane_sum(float x) {
#pragma unroll
  for (int m = 1; m < kLanes; m <<= 1) x += __shfl_xor_sync(kFullMask, x, m);
  return x;
}

// ---- Hadamard and RoPE on a lane group -------------------------------------------------------

/// Orthonormal Sylvester FWHT of the group's vector (x <- H·x/√D): in-register stages for index
/// bits 0-2, shuffle stages for bits 3.., then the scale; the CPU's operations exactly.
template <int kLanes>
__device__ __forceinline__ void lane_fwht(float v[8], int lane) {
  quant::lane_fwht_in_register(v);
#pragma unroll
  for (int m = 1; m < kLanes; m <<= 1) {
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = quant::lane_butterfly(v[r], __shfl_xor_sync(kFullMask, v[r], m), upper);
  }
  constexpr float kScale = transform::detail::inverse_sqrt_dim(8 * kLanes);
#pragma unroll
  for (int r = 0; r < 8; ++r) v[r] = fp::mul(v[r], kScale);
}

/// RoPE at `position` on the group's vector (inverse = removal), table from quant::build_rope_table.
/// Split-half pairs need rotary_dim % 16 == 0 (a lane's partner is then one lane, same register);
/// interleaved pairs are two registers of one lane.
template <int kLanes>
__device__ __forceinline__ void lane_rope(float v[8], int lane, const float* table, int rotary_dim,
                                          transform::RopeLayout layout, int32_t position, bool inverse) {
  const int pairs = rotary_dim / 2;
  const int e0 = 8 * lane;
  if (layout == transform::RopeLayout::kSplitHalf) {
    const int half = rotary_dim / 2;
    const bool inside = e0 < rotary_dim;
    const bool first = e0 < half;
    const int partner_lane = !inside ? lane : (first ? lane + half / 8 : lane - half / 8);
    float partner[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) partner[r] = __shfl_sync(kFullMask, v[r], partner_lane, kLanes);
    if (inside) {
      const int pair0 = first ? e0 : e0 - half;
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        float c = 0.f, s = 0.f;
        quant::rope_table_cos_sin(table, pairs, position, pair0 + r, c, s);
        v[r] = quant::rope_element(v[r], partner[r], c, s, first, inverse);
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < 8; r += 2) {
      if (e0 + r < rotary_dim) {
        float c = 0.f, s = 0.f;
        quant::rope_table_cos_sin(table, pairs, position, (e0 + r) / 2, c, s);
        const float a = v[r], b = v[r + 1];
        v[r] = quant::rope_element(a, b, c, s, true, inverse);
        v[r + 1] = quant::rope_element(b, a, c, s, false, inverse);
      }
    }
  }
}

// ---- element and code loads/stores ------------------------------------------------------------

__device__ __forceinline__ float half_bits_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf16_bits_to_float_dev(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

/// Eight consecutive fp16 values (bits) at p as floats (16-byte load when aligned).
__device__ __forceinline__ void load8_half_bits(const uint16_t* p, float v[8]) {
  if ((reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
    const uint4 w = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = half_bits_to_float(static_cast<uint16_t>(words[k] & 0xFFFFu));
      v[2 * k + 1] = half_bits_to_float(static_cast<uint16_t>(words[k] >> 16));
    }
  } else {
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = half_bits_to_float(p[r]);
  }
}

/// Eight consecutive elements of dtype `dt` starting at element `offset` of `base`, as floats
/// (exact conversions; inputs of the encode kernel and queries).
__device__ __forceinline__ void load8(const void* base, DType dt, int64_t offset, float v[8]) {
  if (dt == DType::kF32) {
    const float* p = static_cast<const float*>(base) + offset;
    if ((reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
      const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
      v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
      v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
      for (int r = 0; r < 8; ++r) v[r] = p[r];
    }
    return;
  }
  const uint16_t* p = static_cast<const uint16_t*>(base) + offset;
  if (dt == DType::kF16) {
    // The shared bit-exact conversion (NaN payloads kept), so the fp16 codec stores exactly
    // the bits the CPU reference stores.
    uint16_t bits[8];
    if ((reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
      const uint4 w = *reinterpret_cast<const uint4*>(p);
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        bits[2 * k] = static_cast<uint16_t>(words[k] & 0xFFFFu);
        bits[2 * k + 1] = static_cast<uint16_t>(words[k] >> 16);
      }
    } else {
#pragma unroll
      for (int r = 0; r < 8; ++r) bits[r] = p[r];
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = fp16_bits_to_float(bits[r]);
    return;
  }
  if ((reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
    const uint4 w = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = __uint_as_float(words[k] << 16);
      v[2 * k + 1] = __uint_as_float(words[k] & 0xFFFF0000u);
    }
  } else {
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = bf16_bits_to_float_dev(p[r]);
  }
}

/// load8, then each value rounded to fp16 and back (round to nearest even, the shared
/// float_to_fp16_bits of numeric/half.hpp): what the CPU's compress()/append() do to every input
/// before coding. fp16 input is already exact; f32 and bf16 lose what fp16 cannot hold (values
/// beyond ±65504 become ±inf, which the codec then treats as non-finite, like the CPU's codec).
__device__ __forceinline__ void load8_as_fp16(const void* base, DType dt, int64_t offset, float v[8]) {
  load8(base, dt, offset, v);
  if (dt != DType::kF16) {
#pragma unroll
    for (int r = 0; r < 8; ++r) v[r] = fp16_bits_to_float(float_to_fp16_bits(v[r]));
  }
}

/// Stores eight floats as dtype `dt` (round to nearest even) at element `offset` of `base`.
__device__ __forceinline__ void store8(void* base, DType dt, int64_t offset, const float v[8]) {
  if (dt == DType::kF32) {
    float* p = static_cast<float*>(base) + offset;
    if ((reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
      reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
      for (int r = 0; r < 8; ++r) p[r] = v[r];
    }
    return;
  }
  uint32_t words[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint16_t lo, hi;
    if (dt == DType::kF16) {
      lo = __half_as_ushort(__float2half_rn(v[2 * k]));
      hi = __half_as_ushort(__float2half_rn(v[2 * k + 1]));
    } else {
      lo = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k]));
      hi = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k + 1]));
    }
    words[k] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
  }
  uint16_t* p = static_cast<uint16_t*>(base) + offset;
  if ((reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      p[2 * k] = static_cast<uint16_t>(words[k] & 0xFFFFu);
      p[2 * k + 1] = static_cast<uint16_t>(words[k] >> 16);
    }
  }
}

/// One block index of Code at p (little endian; 2- and 4-byte indices are naturally aligned in
/// the page layout).
template <class Code>
__device__ __forceinline__ uint32_t load_block_index(const uint8_t* p) {
  constexpr int kBytes = Code::kIndexBits / 8;
  if constexpr (kBytes == 2) {
    return *reinterpret_cast<const uint16_t*>(p);
  } else if constexpr (kBytes == 4) {
    return *reinterpret_cast<const uint32_t*>(p);
  } else {
    uint32_t v = 0;
#pragma unroll
    for (int b = 0; b < kBytes; ++b) v |= static_cast<uint32_t>(p[b]) << (8 * b);
    return v;
  }
}

template <class Code>
__device__ __forceinline__ void store_block_index(uint8_t* p, uint32_t index) {
  constexpr int kBytes = Code::kIndexBits / 8;
  if constexpr (kBytes == 2) {
    *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(index);
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<uint32_t*>(p) = index;
  } else {
#pragma unroll
    for (int b = 0; b < kBytes; ++b) p[b] = static_cast<uint8_t>(index >> (8 * b));
  }
}

/// The gain of a coded vector as a float, as the CPU's GainReader gives it: the fp16 bits at p
/// (2-byte entries) or ref · factor(code) of the 8-bit code at p (1-byte entries; mantissas: the
/// 32 gain-code mantissas, quant/gain_code.hpp). 0-byte entries (fp16 codec): 0.
__device__ __forceinline__ float load_gain(const uint8_t* p, int bytes, float ref, const uint32_t* mantissas) {
  if (bytes == 2) return half_bits_to_float(*reinterpret_cast<const uint16_t*>(p));
  if (bytes == 1) return ref * quant::gain_code_factor(mantissas, *p);
  return 0.f;
}

/// The lane's 1/s_i of the key channel scales row `scales` (fp16 bits; null or a first entry of
/// 0: none, all ones), as the CPU computes them (1.0f / s, IEEE division).
__device__ __forceinline__ void load8_inverse_scales(const uint16_t* scales, int lane, float inv[8]) {
  const bool none = scales == nullptr || scales[0] == 0;
#pragma unroll
  for (int r = 0; r < 8; ++r) inv[r] = none ? 1.f : 1.0f / half_bits_to_float(scales[8 * lane + r]);
}

/// Decodes the lane's 8 elements of a coded vector: `codes` points at the vector's codes, `gain`
/// is its gain (load_gain). Block codes give the rotated basis (gain·decode, unfused); fp16 the values.
template <class Code>
__device__ __forceinline__ void decode_lane(const uint8_t* codes, float gain, int lane, float v[8]) {
  if constexpr (kIsFp16<Code>) {
    load8_half_bits(reinterpret_cast<const uint16_t*>(codes) + 8 * lane, v);
  } else {
    const uint32_t index = load_block_index<Code>(codes + lane * (Code::kIndexBits / 8));
    quant::decode_block<Code>(index, gain, v);
  }
}

/// decode_lane with the codec chosen at run time (a uniform branch; kernels use it for values).
__device__ __forceinline__ void decode_lane_runtime(quant::Codec codec, const uint8_t* codes, float gain, int lane,
                                                    float v[8]) {
  switch (codec) {
    case quant::Codec::kE8P: decode_lane<codebook::E8P>(codes, gain, lane, v); break;
    case quant::Codec::kRvq3: decode_lane<codebook::Rvq3>(codes, gain, lane, v); break;
    case quant::Codec::kRvq4: decode_lane<codebook::Rvq4>(codes, gain, lane, v); break;
    default: decode_lane<Fp16Code>(codes, gain, lane, v); break;
  }
}

/// True for the codecs the kernels implement.
__host__ __device__ inline bool is_kernel_codec(quant::Codec c) {
  return c == quant::Codec::kFp16 || c == quant::Codec::kE8P || c == quant::Codec::kRvq3 || c == quant::Codec::kRvq4;
}

/// Calls f(Code{}) for a kernel codec (Fp16Code for fp16). The caller validated the codec.
template <class F>
__host__ inline auto dispatch_kernel_codec(quant::Codec c, F&& f) {
  switch (c) {
    case quant::Codec::kE8P: return f(codebook::E8P{});
    case quant::Codec::kRvq3: return f(codebook::Rvq3{});
    case quant::Codec::kRvq4: return f(codebook::Rvq4{});
    default: return f(Fp16Code{});
  }
}

}  // namespace e8kv::cuda::detail
