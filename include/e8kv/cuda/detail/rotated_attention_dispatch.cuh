// The closed dispatch of the tensor-core decode kernel (rotated_attention_kernel.cuh) over key ×
// value codec for one head_dim, and the cached occupancy query the split planner uses. Defined
// here, instantiated once per head_dim in kernels/rotated_attention_d{64,128,256}.cu (twelve
// kernels each, a minute or more of nvcc per file: three files compile in parallel), declared
// extern for kernels/decode_attention.cu, which validates, plans and calls them.
#pragma once

#include <atomic>

#include "e8kv/cuda/detail/rotated_attention_kernel.cuh"
#include "e8kv/cuda/paged_kv.cuh"

namespace e8kv::cuda::detail {

/// Keys the tensor-core kernel scores: block codes stored as RoPE residuals or post-RoPE.
inline bool rotated_keys(const LayerCodecParams& c) {
  return c.key_codec != quant::Codec::kFp16 && c.key_frame != transform::KeyFrame::kPreRope;
}

/// Calls f with the value codec's tag (fp16 values: RotFp16Values).
template <class F>
auto dispatch_value_code(quant::Codec c, F&& f) {
  switch (c) {
    case quant::Codec::kE8P: return f(codebook::E8P{});
    case quant::Codec::kRvq3: return f(codebook::Rvq3{});
    case quant::Codec::kRvq4: return f(codebook::Rvq4{});
    default: return f(RotFp16Values{});
  }
}

inline constexpr int kMaxCachedDevices = 64;

/// SMs × CTAs per SM of `kernel` (dynamic shared memory `smem`) on the current device, queried
/// once per device and cache and cached: the occupancy and attribute queries do not synchronize,
/// and later launches (a CUDA graph capture included) reuse the cached value. 0: no device.
template <class Kernel>
int cached_slots(std::atomic<int> (&cached)[kMaxCachedDevices], Kernel kernel, int threads, size_t smem) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) {
    (void)cudaGetLastError();
    return 0;
  }
  if (device < kMaxCachedDevices) {
    const int known = cached[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const int slots = sms * (per_sm > 0 ? per_sm : 1);
  if (device < kMaxCachedDevices) cached[device].store(slots, std::memory_order_relaxed);
  return slots;
}

template <int D, class KeyCode, class ValueCode>
int rotated_kernel_slots() {
  static std::atomic<int> cached[kMaxCachedDevices] = {};
  if (rot_prepare_kernel<D, KeyCode, ValueCode>() != Status::kSuccess) return 0;
  return cached_slots(cached, rotated_attention_split_kernel<D, KeyCode, ValueCode>, kRotThreads,
                      rot_dynamic_smem_bytes<D, KeyCode, ValueCode>());
}

/// The CTA slots of the tensor-core split kernel for c's codecs (block-coded keys only).
template <int D>
int rotated_slots_dim(const LayerCodecParams& c) {
  return dispatch_kernel_codec(c.key_codec, [&](auto key) {
    using K = decltype(key);
    if constexpr (kIsFp16<K>) {
      return 0;  // not reached: fp16 keys take the lane kernel
    } else {
      return dispatch_value_code(c.value_codec, [&](auto value) { return rotated_kernel_slots<D, K, decltype(value)>(); });
    }
  });
}

/// Launches the tensor-core split kernel and the reduction for c's codecs (block-coded keys only).
template <int D>
Status launch_rotated_dim(const LayerCodecParams& c, const RotKernelArgs& a, const ReduceKernelArgs& r, int batch,
                          cudaStream_t stream) {
  return dispatch_kernel_codec(c.key_codec, [&](auto key) {
    using K = decltype(key);
    if constexpr (kIsFp16<K>) {
      return Status::kInvalidArgument;  // not reached: fp16 keys take the lane kernel
    } else {
      return dispatch_value_code(c.value_codec, [&](auto value) {
        return launch_rotated_attention<D, K, decltype(value)>(a, r, batch, c.kv_heads, stream);
      });
    }
  });
}

#define E8KV_ROTATED_DIM(D, EXTERN)                                                                              \
  EXTERN template int rotated_slots_dim<D>(const LayerCodecParams&);                                          \
  EXTERN template Status launch_rotated_dim<D>(const LayerCodecParams&, const RotKernelArgs&, const ReduceKernelArgs&, \
                                               int, cudaStream_t);
E8KV_ROTATED_DIM(64, extern)
E8KV_ROTATED_DIM(128, extern)
E8KV_ROTATED_DIM(256, extern)

}  // namespace e8kv::cuda::detail
