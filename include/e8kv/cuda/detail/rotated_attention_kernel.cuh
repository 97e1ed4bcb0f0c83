// The split kernel of paged_decode_attention for block-coded keys stored as RoPE residuals or
// post-RoPE (cuda/rotated_attention_math.hpp: the math; cuda/rotated_attention_tile.hpp: one
// warp's tile, shared with the CPU emulation). Pre-RoPE and fp16 keys keep the lane kernel of
// decode_attention_kernel.cuh.
//
// CTA: 4 warps over one (sequence, KV head, query chunk of <= 8 heads, split of coded tokens); a
// super-tile of 64 tokens gives each warp a 16-token tile. The prologue rotates the query once per
// CTA (q̃ = H·D·S⁻¹·q/α, gain reference and softmax scale folded in) into shared-memory B
// fragments (tf32 high and low parts), with the block sums of q̃ for E8P's shifts and the mean
// coefficients of the first super-tile's upper position part U; the coefficients are formed again
// (all threads, between two barriers) whenever a super-tile starts with another U, i.e. once per
// 1024 positions. Partials and the reduction are those of decode_attention_kernel.cuh: (lse in
// the log2 domain, o normalized) per split, values in the rotated basis, merged by
// decode_attention_reduce_kernel. The window split (fp16 window, engine basis) runs a small
// CUDA-core loop in the same kernel.
#pragma once

#include <cfloat>
#include <cmath>
#include <type_traits>

#include "e8kv/cuda/detail/decode_attention_kernel.cuh"
#include "e8kv/cuda/detail/lane_ops.cuh"
#include "e8kv/cuda/rotated_attention_tile.hpp"

namespace e8kv::cuda::detail {

inline constexpr int kRotThreads = 32 * kRotWarps;

/// The byte tables of the coordinate decoders (rotated_attention_math.hpp), copied to shared
/// memory by every CTA.
static __constant__ RotE8pBytes kDeviceRotE8pBytes = build_rot_e8p_bytes();
static __constant__ RotE81bBytes kDeviceRotE81bBytes = build_rot_e81b_bytes();

struct RotKernelArgs {
  const uint8_t* pool = nullptr;
  PagedLayout layout;
  const int32_t* page_indptr = nullptr;
  const int32_t* page_indices = nullptr;
  const int32_t* coded_lens = nullptr;
  uint32_t page_magic = 0;
  int page_shift = 0;
  const uint16_t* window_keys = nullptr;
  const uint16_t* window_values = nullptr;
  const int32_t* window_lens = nullptr;
  int64_t window_seq_stride = 0, window_head_stride = 0, window_token_stride = 0;
  const void* q = nullptr;
  DType q_dtype = DType::kF32;
  int q_heads = 0, group = 1, q_chunks = 1;
  float scale_log2 = 0.f;
  bool residual = true;                 ///< RoPE-residual keys (else post-RoPE)
  const uint16_t* means = nullptr;      ///< [batch][kv_heads][2][D] fp16 bits, or null
  const uint16_t* key_scales = nullptr; ///< [batch][kv_heads][D] fp16 bits (row of zeros: none), or null
  const uint16_t* gain_refs = nullptr;  ///< [batch][kv_heads][2] fp16 bits (gain_bits 8), or null
  const float* rope_table = nullptr;    ///< 3-level table
  const RotF4* delta_table = nullptr;   ///< rope_delta_table (residual keys with centring)
  int rotary_dim = 0;
  transform::RopeLayout rope_layout = transform::RopeLayout::kSplitHalf;
  const uint32_t* sign_bits = nullptr;
  int sign_words = 0;
  int chunk = 0;
  int coded_splits = 0;
  float* partial = nullptr;
};

/// 1/α of a code (1 for the fp16 values) and 1/s2 of a two-stage code (1 otherwise).
template <class Code>
__host__ __device__ constexpr float rot_inverse_input_scale() {
  if constexpr (std::is_same_v<Code, RotFp16Values>) return 1.f;
  else return Code::kInverseInputScale;
}
template <class Code>
__host__ __device__ constexpr float rot_inverse_residual_scale() {
  if constexpr (kRotTwoStage<Code>) return Code::kInverseResidualScale;
  else return 1.f;
}

/// The warp policy of the device: one lane per thread, the tensor cores, shuffles.
struct DeviceWarp {
  static constexpr int kLanes = 1;
  int lane_id = 0;
  __device__ __forceinline__ int lane(int) const { return lane_id; }
  __device__ __forceinline__ void mma(float (&d)[1][4], const float (&a)[1][4], const float (&b)[1][2]) const {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
        : "r"(__float_as_uint(a[0][0])), "r"(__float_as_uint(a[0][1])), "r"(__float_as_uint(a[0][2])),
          "r"(__float_as_uint(a[0][3])), "r"(__float_as_uint(b[0][0])), "r"(__float_as_uint(b[0][1])));
  }
  /// Maximum over the 8 lanes of a column (same tig: lane bits 2-4).
  __device__ __forceinline__ void max_over_rows(float (&v)[1][2]) const {
#pragma unroll
    for (int gi = 0; gi < 2; ++gi)
#pragma unroll
      for (int m = 4; m < 32; m <<= 1) v[0][gi] = fmaxf(v[0][gi], __shfl_xor_sync(kFullMask, v[0][gi], m));
  }
  /// Sum over the 8 lanes of a column.
  __device__ __forceinline__ void sum_over_rows(float (&v)[1][2]) const {
#pragma unroll
    for (int gi = 0; gi < 2; ++gi)
#pragma unroll
      for (int m = 4; m < 32; m <<= 1) v[0][gi] += __shfl_xor_sync(kFullMask, v[0][gi], m);
  }
  __device__ __forceinline__ void sync() const { __syncwarp(); }
};

/// Shared memory of one CTA. The loop's B fragments and the epilogue's merge buffers share space.
template <int D, class KeyCode, class ValueCode>
struct RotSmem {
  using S = RotShape<D>;
  static constexpr bool kKey2 = kRotTwoStage<KeyCode>;
  static constexpr bool kKey2Shift = kRotE8pSecond<KeyCode>;
  struct Loop {
    RotF4 bq[S::kKeySteps * 32];
    RotF4 bq2[kKey2 ? S::kKeySteps * 32 : 1];
    RotF4 bshift[S::kShiftSteps * 32];
    RotF4 bshift2[kKey2Shift ? S::kShiftSteps * 32 : 1];
    RotF4 bmean[S::kBlocks * 32];
  };
  struct Merge {
    float o[kRotWarps][kRotQueryHeads][D];
    float m[kRotWarps][kRotQueryHeads];
    float l[kRotWarps][kRotQueryHeads];
  };
  union {
    Loop loop;
    Merge merge;
  };
  alignas(16) uint32_t e8p_bytes[256 * 4];
  alignas(16) uint32_t e81b_bytes[std::is_same_v<KeyCode, codebook::Rvq3> || std::is_same_v<ValueCode, codebook::Rvq3> ? 256 * 4 : 4];
  uint32_t mantissas[32];
  float base[kRotQueryHeads];
  float wbuf[kRotWarps][kRotWeightFloats];
};

/// Dynamic shared memory above 48 KB (head_dim 256); static below.
template <int D, class KeyCode, class ValueCode>
inline constexpr bool kRotDynamicSmem = sizeof(RotSmem<D, KeyCode, ValueCode>) > 48 * 1024;

/// Query element `offset` (f32, f16 or bf16) as a float.
template <int D>
__device__ __forceinline__ float rot_query_element(const void* q, DType dt, int64_t offset) {
  if (dt == DType::kF32) return static_cast<const float*>(q)[offset];
  const uint16_t bits = static_cast<const uint16_t*>(q)[offset];
  return dt == DType::kF16 ? half_bits_to_float(bits) : bf16_bits_to_float_dev(bits);
}

/// Mean coefficients (A, B) of every (query head, rotary pair) for upper part U, times the
/// softmax scale, split into the B fragments of the mean product. All threads of the CTA.
template <int D, class KeyCode, class ValueCode>
__device__ void rot_fill_mean(const RotKernelArgs& a, RotSmem<D, KeyCode, ValueCode>& sm, int b, int h, int qh0, int gn,
                              uint32_t upper) {
  const int pairs = a.rotary_dim / 2;
  const uint16_t* mu = a.means + (static_cast<int64_t>(b) * a.layout.kv_heads + h) * 2 * D;
  for (int idx = threadIdx.x; idx < gn * pairs; idx += kRotThreads) {
    const int g = idx / pairs, p = idx % pairs;
    int ia = 0, ib = 0;
    transform::rope_pair_indices(a.rope_layout, a.rotary_dim, p, ia, ib);
    const int64_t qrow = (static_cast<int64_t>(b) * a.q_heads + qh0 + g) * D;
    const float qa = rot_query_element<D>(a.q, a.q_dtype, qrow + ia), qb = rot_query_element<D>(a.q, a.q_dtype, qrow + ib);
    float cu = 0.f, su = 0.f, A = 0.f, B = 0.f;
    rot_upper_cos_sin(a.rope_table, pairs, upper, p, cu, su);
    rot_mean_coefficients(qa, qb, half_bits_to_float(mu[ia]), half_bits_to_float(mu[ib]), cu, su, A, B);
    rot_store_mean(sm.loop.bmean, p, g, A, B, a.scale_log2);
  }
}

/// The device's side of rot_coded_split: the calling thread's warp, barriers of the whole CTA.
template <int D, class KeyCode, class ValueCode>
struct DeviceCta {
  using Warp = DeviceWarp;
  static constexpr int kWarps = 1;
  const RotKernelArgs* a;
  RotSmem<D, KeyCode, ValueCode>* sm;
  int b, h, qh0, gn, warp_index;
  DeviceWarp* w;
  RotWarpState<1, D>* st;
  __device__ __forceinline__ int warp_id(int) const { return warp_index; }
  __device__ __forceinline__ DeviceWarp& warp(int) { return *w; }
  __device__ __forceinline__ RotWarpState<1, D>& state(int) { return *st; }
  __device__ __forceinline__ float* wbuf(int) { return sm->wbuf[warp_index]; }
  __device__ __forceinline__ void sync() { __syncthreads(); }
  __device__ __forceinline__ void fill_mean(uint32_t upper) { rot_fill_mean<D, KeyCode, ValueCode>(*a, *sm, b, h, qh0, gn, upper); }
};

/// The window split: fp16 keys and values in the engine basis, one query head at a time, one
/// token per warp step (lanes hold D/32 elements). Writes the CTA's partials like the coded splits.
template <int D, class KeyCode, class ValueCode>
__device__ void rot_window_split(const RotKernelArgs& a, RotSmem<D, KeyCode, ValueCode>& sm, int b, int h, int qh0, int gn) {
  constexpr int E = D / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = a.window_lens[b];
  const int64_t wbase = b * a.window_seq_stride + h * a.window_head_stride + E * lane;
  for (int g = 0; g < gn; ++g) {
    float q[E], acc[E];
    const int64_t qrow = (static_cast<int64_t>(b) * a.q_heads + qh0 + g) * D + E * lane;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      q[i] = rot_query_element<D>(a.q, a.q_dtype, qrow + i);
      acc[i] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int t = warp; t < n; t += kRotWarps) {
      const int64_t off = wbase + t * a.window_token_stride;
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < E; ++i) dot = fmaf(q[i], half_bits_to_float(a.window_keys[off + i]), dot);
#pragma unroll
      for (int s = 1; s < 32; s <<= 1) dot += __shfl_xor_sync(kFullMask, dot, s);
      const float score = dot * a.scale_log2;
      const float m_new = fmaxf(m, score);
      const float alpha = exp2f(m - m_new), p = exp2f(score - m_new);
      l = fmaf(l, alpha, p);
#pragma unroll
      for (int i = 0; i < E; ++i) acc[i] = fmaf(acc[i], alpha, p * half_bits_to_float(a.window_values[off + i]));
      m = m_new;
    }
#pragma unroll
    for (int i = 0; i < E; ++i) sm.merge.o[warp][g][E * lane + i] = acc[i];
    if (lane == 0) {
      sm.merge.m[warp][g] = m;
      sm.merge.l[warp][g] = l;
    }
  }
}

/// Merges the CTA's warps (sm.merge) and writes the split's partial rows: o scaled by vscale.
template <int D, class KeyCode, class ValueCode>
__device__ void rot_write_partial(const RotKernelArgs& a, RotSmem<D, KeyCode, ValueCode>& sm, int b, int qh0, int gn,
                                  int split, float vscale) {
  const int64_t g_stride = static_cast<int64_t>(a.coded_splits + 1) * (D + 2);
  float* out = a.partial + (static_cast<int64_t>(b) * a.q_heads + qh0) * g_stride + static_cast<int64_t>(split) * (D + 2);
  for (int idx = threadIdx.x; idx < gn * D; idx += kRotThreads) {
    const int g = idx / D, i = idx % D;
    float m[kRotWarps], l[kRotWarps], o[kRotWarps];
#pragma unroll
    for (int k = 0; k < kRotWarps; ++k) {
      m[k] = sm.merge.m[k][g];
      l[k] = sm.merge.l[k][g];
      o[k] = sm.merge.o[k][g][i];
    }
    float lse = 0.f;
    const float value = rot_merge_warps(m, l, o, vscale, lse);
    float* row = out + g * g_stride;
    row[2 + i] = value;
    if (i == 0) {
      row[0] = lse;
      row[1] = 0.f;
    }
  }
}

template <int D, class KeyCode, class ValueCode>
__device__ __forceinline__ void rotated_attention_split(const RotKernelArgs& a, RotSmem<D, KeyCode, ValueCode>& sm) {
  using S = RotShape<D>;
  using Smem = RotSmem<D, KeyCode, ValueCode>;
  constexpr bool kValueCoded = !std::is_same_v<ValueCode, RotFp16Values>;
  const int b = blockIdx.z;
  const int h = static_cast<int>(blockIdx.y) / a.q_chunks;
  const int g0 = (static_cast<int>(blockIdx.y) % a.q_chunks) * kRotQueryHeads;
  const int gn = min(kRotQueryHeads, a.group - g0);
  const int qh0 = h * a.group + g0;
  const int split = blockIdx.x;
  const bool window = split == a.coded_splits;
  int begin = 0, end = 0;
  if (!window) {
    begin = split * a.chunk;
    end = min(begin + a.chunk, a.coded_lens[b]);
  } else {
    end = a.window_lens != nullptr ? a.window_lens[b] : 0;
  }
  if (begin >= end) return;  // uniform over the CTA: nothing to write, the reducer skips it
  const int warp = threadIdx.x >> 5;
  const int64_t bh = static_cast<int64_t>(b) * a.layout.kv_heads + h;

  if (window) {
    rot_window_split<D, KeyCode, ValueCode>(a, sm, b, h, qh0, gn);
    __syncthreads();
    rot_write_partial<D, KeyCode, ValueCode>(a, sm, b, qh0, gn, split, 1.f);
    return;
  }

  // ---- prologue: tables, q̃ fragments, block sums, constant term ----
  for (int i = threadIdx.x; i < 256 * 4; i += kRotThreads) {
    sm.e8p_bytes[i] = kDeviceRotE8pBytes.w[i / 4][i % 4];
    if constexpr (sizeof(sm.e81b_bytes) == 256 * 16) sm.e81b_bytes[i] = kDeviceRotE81bBytes.w[i / 4][i % 4];
  }
  if (threadIdx.x < 32) sm.mantissas[threadIdx.x] = kDeviceGainMantissas[threadIdx.x];
  {
    float* zero = reinterpret_cast<float*>(&sm.loop);
    for (int i = threadIdx.x; i < static_cast<int>(sizeof(typename Smem::Loop) / 4); i += kRotThreads) zero[i] = 0.f;
  }
  const bool gains8 = a.layout.key_gain_bytes == 1;
  const float key_ref = gains8 ? half_bits_to_float(a.gain_refs[bh * 2]) : 1.f;
  const float value_ref = gains8 && kValueCoded ? half_bits_to_float(a.gain_refs[bh * 2 + 1]) : 1.f;
  __syncthreads();
  {
    // q̃ = H·D·S⁻¹·q, one vector per D/8 lanes (lane L holds elements 8L..8L+7), times the
    // softmax scale, 1/α and the gain reference; its block sums for the E8P shifts.
    constexpr int kLanes = D / 8, kGroups = kRotThreads / kLanes;
    const int lane = threadIdx.x % kLanes, grp = threadIdx.x / kLanes;
    const uint32_t signs = quant::lane_sign_byte(a.sign_bits + static_cast<int64_t>(h) * 2 * a.sign_words, lane);
    const bool scaled = a.key_scales != nullptr && a.key_scales[bh * D] != 0;
    const float qf = a.scale_log2 * rot_inverse_input_scale<KeyCode>() * key_ref;
    for (int g = grp; g < ((kRotQueryHeads + kGroups - 1) / kGroups) * kGroups; g += kGroups) {
      // Every lane of the group runs the shuffles; heads beyond gn are zeros (and not stored).
      float v[8];
      const int64_t qrow = (static_cast<int64_t>(b) * a.q_heads + qh0 + (g < gn ? g : 0)) * D + 8 * lane;
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        v[r] = g < gn ? rot_query_element<D>(a.q, a.q_dtype, qrow + r) : 0.f;
        if (scaled) v[r] = v[r] * (1.0f / half_bits_to_float(a.key_scales[bh * D + 8 * lane + r]));
      }
      quant::lane_apply_signs(v, signs);
      lane_fwht<kLanes>(v, lane);
      if (g < gn) {
        float sum = 0.f;
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          const float x = v[r] * qf;
          sum += x;
          int kstep = 0, col = 0;
          rot_key_slot<D>(8 * lane + r, kstep, col);
          rot_store_b(sm.loop.bq, kstep, col, g, x);
          if constexpr (Smem::kKey2) rot_store_b(sm.loop.bq2, kstep, col, g, x * rot_inverse_residual_scale<KeyCode>());
        }
        int sstep = 0, col = 0;
        rot_key_shift_slot<D>(lane, sstep, col);
        rot_store_b(sm.loop.bshift, sstep, col, g, sum);
        if constexpr (Smem::kKey2Shift) rot_store_b(sm.loop.bshift2, sstep, col, g, sum * rot_inverse_residual_scale<KeyCode>());
      }
    }
  }
  const bool centred = a.means != nullptr;
  const bool mean_on = centred && a.residual;
  if (threadIdx.x < kRotQueryHeads) {  // constant term: q·μ over the channels RoPE leaves alone (all, post-RoPE)
    const int g = threadIdx.x;
    float s = 0.f;
    if (centred && g < gn) {
      const uint16_t* mu = a.means + bh * 2 * D;
      const int64_t qrow = (static_cast<int64_t>(b) * a.q_heads + qh0 + g) * D;
      for (int i = a.residual ? a.rotary_dim : 0; i < D; ++i)
        s = fmaf(rot_query_element<D>(a.q, a.q_dtype, qrow + i), half_bits_to_float(mu[i]), s);
    }
    sm.base[g] = s * a.scale_log2;
  }

  RotTileArgs t;
  t.pool = a.pool;
  t.layout = a.layout;
  t.pages = a.page_indices + a.page_indptr[b];
  t.page_magic = a.page_magic;
  t.page_shift = a.page_shift;
  t.head = h;
  t.end = end;
  t.groups = gn;
  t.e8p_bytes = sm.e8p_bytes;
  t.e81b_bytes = sm.e81b_bytes;
  t.mantissas = sm.mantissas;
  t.bq = sm.loop.bq;
  t.bq2 = sm.loop.bq2;
  t.bshift = sm.loop.bshift;
  t.bshift2 = sm.loop.bshift2;
  t.bmean = sm.loop.bmean;
  t.base = sm.base;
  t.delta_table = a.delta_table;
  t.rope_table = a.rope_table;
  t.value_inv_s2 = rot_inverse_residual_scale<ValueCode>();

  DeviceWarp w;
  w.lane_id = threadIdx.x & 31;
  RotWarpState<1, D> st;
  rot_state_init(st);
  DeviceCta<D, KeyCode, ValueCode> cta{&a, &sm, b, h, qh0, gn, warp, &w, &st};
  rot_coded_split<DeviceCta<D, KeyCode, ValueCode>, D, KeyCode, ValueCode>(cta, t, begin, end, mean_on);

  // ---- epilogue: the warp's sums over its rows, then the CTA's merge ----
  float l[1][2] = {{st.l[0][0], st.l[0][1]}};
  w.sum_over_rows(l);
  __syncthreads();  // the loop's buffers become the merge buffers
  const int lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3;
  if (grp == 0) {
#pragma unroll
    for (int gi = 0; gi < 2; ++gi) {
      sm.merge.m[warp][2 * tig + gi] = st.m[0][gi];
      sm.merge.l[warp][2 * tig + gi] = l[0][gi];
    }
  }
  rot_lane_outputs<1, D, kValueCoded>(st, 0, lane, [&](int g, int e, float v) { sm.merge.o[warp][g][e] = v; });
  __syncthreads();
  const float vscale = rot_inverse_input_scale<ValueCode>() * value_ref;
  rot_write_partial<D, KeyCode, ValueCode>(a, sm, b, qh0, gn, split, vscale);
}

template <int D, class KeyCode, class ValueCode>
__global__ void __launch_bounds__(kRotThreads, D <= 128 ? 4 : 2) rotated_attention_split_kernel(const RotKernelArgs a) {
  if constexpr (kRotDynamicSmem<D, KeyCode, ValueCode>) {
    extern __shared__ __align__(16) unsigned char rot_dynamic_smem[];
    rotated_attention_split<D, KeyCode, ValueCode>(a, *reinterpret_cast<RotSmem<D, KeyCode, ValueCode>*>(rot_dynamic_smem));
  } else {
    __shared__ RotSmem<D, KeyCode, ValueCode> sm;
    rotated_attention_split<D, KeyCode, ValueCode>(a, sm);
  }
}

/// Dynamic shared memory bytes of an instantiation (0: static).
template <int D, class KeyCode, class ValueCode>
constexpr size_t rot_dynamic_smem_bytes() {
  return kRotDynamicSmem<D, KeyCode, ValueCode> ? sizeof(RotSmem<D, KeyCode, ValueCode>) : 0;
}

/// Opts the instantiation into its dynamic shared memory (once; no-op when static).
template <int D, class KeyCode, class ValueCode>
inline Status rot_prepare_kernel() {
  if constexpr (kRotDynamicSmem<D, KeyCode, ValueCode>) {
    static const cudaError_t err = cudaFuncSetAttribute(rotated_attention_split_kernel<D, KeyCode, ValueCode>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        static_cast<int>(sizeof(RotSmem<D, KeyCode, ValueCode>)));
    if (err != cudaSuccess) return Status::kCudaError;
  }
  return Status::kSuccess;
}

template <int D, class KeyCode, class ValueCode>
Status launch_rotated_attention(const RotKernelArgs& a, const ReduceKernelArgs& r, int batch, int kv_heads,
                                cudaStream_t stream) {
  E8KV_RETURN_IF_ERROR((rot_prepare_kernel<D, KeyCode, ValueCode>()));
  const dim3 grid(static_cast<unsigned>(a.coded_splits + 1), static_cast<unsigned>(kv_heads * a.q_chunks),
                  static_cast<unsigned>(batch));
  rotated_attention_split_kernel<D, KeyCode, ValueCode>
      <<<grid, kRotThreads, rot_dynamic_smem_bytes<D, KeyCode, ValueCode>(), stream>>>(a);
  E8KV_RETURN_IF_ERROR(launch_status());
  decode_attention_reduce_kernel<D><<<dim3(static_cast<unsigned>(r.q_heads), static_cast<unsigned>(batch)), D, 0, stream>>>(r);
  return launch_status();
}

}  // namespace e8kv::cuda::detail
