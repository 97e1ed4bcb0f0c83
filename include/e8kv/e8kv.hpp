// Umbrella header: e8kv's host API in one include. The compressor (compress / extend / append),
// the compressed cache (storage, decompression, byte accounting), decode attention over it
// (single, batched, with lse and an executor), the offload container, and the configuration.
// Pure-math headers (lattice/, codebook/, transform/, quant/) are included by these as needed;
// include them directly to use one stage alone. CUDA kernels: e8kv/cuda/paged_kv.cuh.
#pragma once

#include "e8kv/attention/attend.hpp"
#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/config.hpp"
#include "e8kv/entropy/container.hpp"
#include "e8kv/error.hpp"
#include "e8kv/parallel.hpp"
#include "e8kv/select/rate_allocation.hpp"
#include "e8kv/platform.hpp"
#include "e8kv/version.hpp"
