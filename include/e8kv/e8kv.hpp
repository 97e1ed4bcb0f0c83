// Umbrella header: e8kv's host API in one include. The compressor (compress / extend / append),
// the compressed cache (storage, decompression, byte accounting), decode attention over it
// (single, batched, with lse and an executor), the cache's codec (CacheCodecs: quantizers,
// rotations, RoPE tables, with the codebooks), the E8 lattice, the offload container, the thread
// pool and the configuration. The lighter headers (compressor.hpp alone, for instance) forward-
// declare CacheCodecs and Executor; include a stage's own header to use it alone. CUDA kernels:
// e8kv/cuda/paged_kv.cuh.
#pragma once

#include "e8kv/attention/attend.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/config.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "e8kv/lattice/e8.hpp"
#include "e8kv/parallel.hpp"
#include "e8kv/select/rate_allocation.hpp"
#include "e8kv/platform.hpp"
#include "e8kv/version.hpp"
