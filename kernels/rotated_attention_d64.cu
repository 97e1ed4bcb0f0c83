// The tensor-core decode kernels of head_dim 64 (every key × value codec), in a file of their own
// so the head dims compile in parallel (include/e8kv/cuda/detail/rotated_attention_dispatch.cuh).
#include "e8kv/cuda/detail/rotated_attention_dispatch.cuh"

namespace e8kv::cuda::detail {
E8KV_ROTATED_DIM(64, )
}  // namespace e8kv::cuda::detail
