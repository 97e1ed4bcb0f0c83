// The C ABI (include/e8kv/c_api.h) over the public C++ API.
//
// Every entry point runs its body inside `guarded`, which turns any C++ exception into a status
// and a thread-local message: nothing unwinds into a C caller's frames. The arguments a C caller
// can get wrong in ways C++ callers cannot (null pointers, enum values out of range, a buffer of
// the wrong size, counts that overflow) are checked here first, with messages naming the C
// function and argument; everything else is left to the C++ API, whose e8kv::Error messages
// already name the field and the accepted values.
#include "e8kv/c_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/cache/kv_view.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/config.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "e8kv/parallel.hpp"
#include "e8kv/version.hpp"

// ---- handles ---------------------------------------------------------------------------------

struct e8kv_compressor {
  e8kv::KVCompressor compressor;
  // The compressor's own codecs (taken from an empty cache it made): a deserialized cache given
  // them is recognized by KVCompressor::append without comparing layouts field by field.
  std::shared_ptr<const e8kv::CacheCodecs> codecs;
};

struct e8kv_cache {
  e8kv::CompressedKV kv;
};

struct e8kv_thread_pool {
  explicit e8kv_thread_pool(int threads) : pool(threads) {}
  e8kv::ThreadPool pool;
  // ThreadPool::run may be called from one thread at a time; the C API promises that a pool may
  // be passed by several threads, so each call holds this for as long as it uses the pool.
  std::mutex in_use;
};

namespace {

// ---- errors ------------------------------------------------------------------------------------

// A fixed buffer, not a std::string: recording a failure must not allocate (it may be reporting
// std::bad_alloc) and a thread-local with a trivial destructor costs nothing at thread exit.
constexpr size_t kMessageCapacity = 2048;
thread_local char t_last_error[kMessageCapacity] = "";

e8kv_status record_failure(const char* function, e8kv_status status, const char* message) noexcept {
  // what() of e8kv::Error starts with "e8kv: "; the C function's name replaces it.
  static const char kPrefix[] = "e8kv: ";
  if (std::strncmp(message, kPrefix, sizeof(kPrefix) - 1) == 0) message += sizeof(kPrefix) - 1;
  std::snprintf(t_last_error, kMessageCapacity, "%s: %s", function, message);
  return status;
}

/// A failure the C layer detects itself, with the status it maps to.
class CallError : public std::runtime_error {
 public:
  CallError(e8kv_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  e8kv_status status() const { return status_; }

 private:
  e8kv_status status_;
};

[[noreturn]] void fail(e8kv_status status, const std::string& message) { throw CallError(status, message); }

void require_argument(bool condition, const char* message) {
  if (!condition) fail(E8KV_ERROR_INVALID_ARGUMENT, message);
}
/// Same, with the message formatted by fmt only on failure.
template <class... Args>
void require_argument(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) fail(E8KV_ERROR_INVALID_ARGUMENT, fmt::format(format, std::forward<Args>(args)...));
}

/// Runs `body`; maps what it throws to a status. `library_failure` is the status an e8kv::Error
/// means in this function: bad input for most, corrupt data for a read.
template <class Body>
e8kv_status guarded(const char* function, e8kv_status library_failure, Body&& body) noexcept {
  try {
    body();
    return E8KV_OK;
  } catch (const CallError& e) {
    return record_failure(function, e.status(), e.what());
  } catch (const e8kv::Error& e) {
    return record_failure(function, library_failure, e.what());
  } catch (const std::bad_alloc&) {
    return record_failure(function, E8KV_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::length_error& e) {  // a container asked for more than max_size()
    return record_failure(function, E8KV_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const std::invalid_argument& e) {  // std::sto* and friends inside the library
    return record_failure(function, library_failure, e.what());
  } catch (const std::out_of_range& e) {
    return record_failure(function, library_failure, e.what());
  } catch (const std::exception& e) {
    return record_failure(function, E8KV_ERROR_INTERNAL, e.what());
  } catch (...) {
    return record_failure(function, E8KV_ERROR_INTERNAL, "an exception that is not a std::exception");
  }
}

// ---- argument conversion -----------------------------------------------------------------------

// dtypes cross the ABI as int32_t: a C caller may pass any value, and an int outside an unscoped
// enum's range would be undefined behaviour once converted to the enum type.
e8kv::DType to_dtype(int32_t dtype, const char* argument) {
  switch (dtype) {
    case E8KV_DTYPE_F32: return e8kv::DType::kF32;
    case E8KV_DTYPE_F16: return e8kv::DType::kF16;
    case E8KV_DTYPE_BF16: return e8kv::DType::kBF16;
    default: break;
  }
  fail(E8KV_ERROR_INVALID_ARGUMENT,
       fmt::format("{} is {}; accepted: E8KV_DTYPE_F32 (0), E8KV_DTYPE_F16 (1), E8KV_DTYPE_BF16 (2)", argument, dtype));
}

/// Executor of an optional pool; `lock` holds the pool for the call.
e8kv::Executor* executor_of(e8kv_thread_pool* pool, std::unique_lock<std::mutex>& lock) {
  if (pool == nullptr) return nullptr;
  lock = std::unique_lock<std::mutex>(pool->in_use);
  return &pool->pool;
}

/// Rows of `rows` vectors of `heads` x head_dim elements must be addressable: the views compute
/// element offsets in int64_t.
void require_addressable(int64_t rows, int64_t heads, int64_t head_dim, const char* argument) {
  const int64_t per_row = heads * head_dim;  // both below 2^31: no overflow
  require_argument(rows <= std::numeric_limits<int64_t>::max() / 4 / std::max<int64_t>(per_row, 1),
                   "{} of {} rows of {} elements exceeds the address space", argument, rows, per_row);
}

struct SequenceInput {
  e8kv::SequenceKV sequence;
  std::vector<e8kv::LayerQueries> queries;
};

SequenceInput convert_input(const e8kv::ModelShape& shape, const e8kv_kv_input* kv, const e8kv_query_input* queries) {
  require_argument(kv != nullptr, "kv is NULL");
  require_argument(kv->n_tokens >= 0 && kv->n_tokens <= std::numeric_limits<int32_t>::max(),
                   "kv->n_tokens is {}; accepted: 0 .. 2^31 - 1 (positions are int32)", kv->n_tokens);
  require_argument(kv->keys != nullptr && kv->values != nullptr,
                   "kv->keys and kv->values must point to n_layers ({}) pointers", shape.n_layers);
  const e8kv::DType dtype = to_dtype(kv->dtype, "kv->dtype");
  const int64_t n = kv->n_tokens;
  require_addressable(n, shape.n_kv_heads, shape.head_dim, "kv");
  SequenceInput in;
  in.sequence.positions = kv->positions;
  in.sequence.first_position = kv->first_position;
  in.sequence.layers.reserve(static_cast<size_t>(shape.n_layers));
  for (int l = 0; l < shape.n_layers; ++l) {
    const void* k = kv->keys[l];
    const void* v = kv->values[l];
    require_argument(n == 0 || (k != nullptr && v != nullptr), "kv->keys[{}] or kv->values[{}] is NULL with {} tokens",
                     l, l, n);
    in.sequence.layers.push_back({e8kv::TensorView::nhd(n == 0 ? nullptr : k, dtype, n, shape.n_kv_heads, shape.head_dim),
                                  e8kv::TensorView::nhd(n == 0 ? nullptr : v, dtype, n, shape.n_kv_heads, shape.head_dim)});
  }
  if (queries != nullptr) {
    require_argument(queries->queries != nullptr, "queries->queries must point to n_layers ({}) pointers",
                     shape.n_layers);
    require_argument(queries->n_queries >= 1 && queries->n_queries <= std::numeric_limits<int32_t>::max(),
                     "queries->n_queries is {}; accepted: 1 .. 2^31 - 1", queries->n_queries);
    const e8kv::DType qtype = to_dtype(queries->dtype, "queries->dtype");
    require_addressable(queries->n_queries, shape.n_q_heads, shape.head_dim, "queries");
    in.queries.reserve(static_cast<size_t>(shape.n_layers));
    for (int l = 0; l < shape.n_layers; ++l) {
      require_argument(queries->queries[l] != nullptr, "queries->queries[{}] is NULL", l);
      in.queries.push_back({e8kv::TensorView::nhd(queries->queries[l], qtype, queries->n_queries, shape.n_q_heads,
                                                  shape.head_dim),
                            queries->positions});
    }
  }
  return in;
}

void require_layer(const e8kv::CompressedKV& cache, int32_t layer) {
  require_argument(layer >= 0 && layer < cache.n_layers(), "layer {} is outside [0, {})", layer, cache.n_layers());
}

void require_query_position(const e8kv::CompressedKV& cache, int32_t layer, int32_t position, const std::string& what) {
  require_argument(position >= 0, "{} {} is negative; accepted: >= 0", what, position);
  const int64_t last = cache.last_position(layer);
  require_argument(position >= last,
                   "{} {} precedes position {} stored in layer {} (a query attends to earlier tokens only)", what,
                   position, last, layer);
}

/// The rows of CompressedKV::decompress_layer: the distinct positions the layer's heads store.
struct Extent {
  int32_t first_position = 0;
  int64_t n_tokens = 0;
};
Extent layer_extent(const e8kv::CompressedKV& cache, int32_t layer) {
  const std::vector<int32_t> rows = cache.stored_positions(layer);
  if (rows.empty()) return {};
  return {rows.front(), static_cast<int64_t>(rows.size())};
}

e8kv::ModelShape shape_of(const e8kv::CompressedKV& cache) {
  const auto& L = cache.layout();
  return {L.n_layers, L.n_kv_heads, L.n_q_heads, L.head_dim};
}

const char* const kStatusNames[] = {"ok", "invalid argument", "unsupported", "corrupt data", "out of memory",
                                    "internal error"};

}  // namespace

// ---- status, errors, versions ---------------------------------------------------------------------

extern "C" {

const char* e8kv_status_name(int32_t status) noexcept {
  const int i = status;
  return i >= 0 && i < static_cast<int>(sizeof(kStatusNames) / sizeof(kStatusNames[0])) ? kStatusNames[i]
                                                                                        : "unknown status";
}

const char* e8kv_last_error(void) noexcept { return t_last_error; }

int32_t e8kv_version(void) noexcept { return e8kv::kVersion; }

const char* e8kv_version_string(void) noexcept { return E8KV_VERSION_STRING; }

int32_t e8kv_format_version(void) noexcept { return e8kv::container::kFormatVersion; }

// ---- thread pool ----------------------------------------------------------------------------------

e8kv_status e8kv_thread_pool_create(int32_t threads, e8kv_thread_pool** pool) noexcept {
  if (pool) *pool = nullptr;
  return guarded("e8kv_thread_pool_create", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(pool != nullptr, "pool (the output) is NULL");
    require_argument(threads >= 1 && threads <= 1024, "threads is {}; accepted: 1 .. 1024", threads);
    *pool = new e8kv_thread_pool(threads);
  });
}

void e8kv_thread_pool_destroy(e8kv_thread_pool* pool) noexcept { delete pool; }

// ---- compressor -----------------------------------------------------------------------------------

e8kv_status e8kv_compressor_create(const e8kv_model_shape* shape, const char* spec,
                                   e8kv_compressor** compressor) noexcept {
  if (compressor) *compressor = nullptr;
  return guarded("e8kv_compressor_create", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(compressor != nullptr, "compressor (the output) is NULL");
    require_argument(shape != nullptr, "shape is NULL");
    require_argument(spec != nullptr, "spec is NULL (\"\" is the default configuration)");
    const e8kv::ModelShape s{shape->n_layers, shape->n_kv_heads, shape->n_q_heads, shape->head_dim};
    if (!e8kv::is_supported_head_dim(s.head_dim))
      fail(E8KV_ERROR_UNSUPPORTED,
           fmt::format("shape->head_dim {} is not supported; accepted: {}", s.head_dim, e8kv::supported_head_dims()));
    s.validate();
    e8kv::KVCompressor c(s, e8kv::Config::parse(spec));
    // A cache of no tokens: the only public way to the compressor's shared codecs.
    e8kv_kv_input none{};
    std::vector<const void*> null_layers(static_cast<size_t>(s.n_layers), nullptr);
    none.dtype = E8KV_DTYPE_F32;
    none.keys = null_layers.data();
    none.values = null_layers.data();
    const SequenceInput empty = convert_input(s, &none, nullptr);
    std::shared_ptr<const e8kv::CacheCodecs> codecs = c.compress(empty.sequence).shared_codecs();
    *compressor = new e8kv_compressor{std::move(c), std::move(codecs)};
  });
}

void e8kv_compressor_destroy(e8kv_compressor* compressor) noexcept { delete compressor; }

e8kv_status e8kv_compressor_describe(const e8kv_compressor* compressor, char* text, size_t capacity,
                                     size_t* length) noexcept {
  return guarded("e8kv_compressor_describe", E8KV_ERROR_INTERNAL, [&] {
    require_argument(compressor != nullptr, "compressor is NULL");
    require_argument(length != nullptr, "length (the output) is NULL");
    const std::string spec = compressor->compressor.config().describe();
    *length = spec.size();
    if (text == nullptr && capacity == 0) return;  // the length only
    require_argument(text != nullptr, "text is NULL with capacity {} (pass NULL and 0 to query the length)", capacity);
    require_argument(capacity > spec.size(), "capacity {} is too small: the spec needs {} bytes with its NUL", capacity,
                     spec.size() + 1);
    std::memcpy(text, spec.c_str(), spec.size() + 1);
  });
}

// ---- compress, extend, append --------------------------------------------------------------------

e8kv_status e8kv_compress(const e8kv_compressor* compressor, const e8kv_kv_input* kv, const e8kv_query_input* queries,
                          e8kv_thread_pool* pool, e8kv_cache** cache) noexcept {
  if (cache) *cache = nullptr;
  return guarded("e8kv_compress", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(cache != nullptr, "cache (the output) is NULL");
    require_argument(compressor != nullptr, "compressor is NULL");
    const SequenceInput in = convert_input(compressor->compressor.shape(), kv, queries);
    std::unique_lock<std::mutex> lock;
    e8kv::Executor* executor = executor_of(pool, lock);
    auto result = std::make_unique<e8kv_cache>();
    result->kv = compressor->compressor.compress(in.sequence, queries ? &in.queries : nullptr, executor);
    *cache = result.release();
  });
}

e8kv_status e8kv_extend(const e8kv_compressor* compressor, e8kv_cache* cache, const e8kv_kv_input* kv,
                        const e8kv_query_input* queries, e8kv_thread_pool* pool) noexcept {
  return guarded("e8kv_extend", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(compressor != nullptr, "compressor is NULL");
    require_argument(cache != nullptr, "cache is NULL");
    const SequenceInput in = convert_input(compressor->compressor.shape(), kv, queries);
    std::unique_lock<std::mutex> lock;
    e8kv::Executor* executor = executor_of(pool, lock);
    compressor->compressor.extend(cache->kv, in.sequence, queries ? &in.queries : nullptr, executor);
  });
}

e8kv_status e8kv_drop_before(const e8kv_compressor* compressor, e8kv_cache* cache, int32_t position) noexcept {
  return guarded("e8kv_drop_before", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(compressor != nullptr, "compressor is NULL");
    require_argument(cache != nullptr, "cache is NULL");
    require_argument(cache->kv.valid(), "the cache holds no layout");
    compressor->compressor.drop_before(cache->kv, position);
  });
}

e8kv_status e8kv_append(const e8kv_compressor* compressor, e8kv_cache* cache, int32_t layer, int32_t dtype,
                        const void* key, const void* value, int32_t position) noexcept {
  return guarded("e8kv_append", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(compressor != nullptr, "compressor is NULL");
    require_argument(cache != nullptr, "cache is NULL");
    require_argument(key != nullptr && value != nullptr, "key or value is NULL");
    const e8kv::DType type = to_dtype(dtype, "dtype");
    require_argument(cache->kv.valid(), "the cache holds no layout");
    require_layer(cache->kv, layer);
    const e8kv::ModelShape& s = compressor->compressor.shape();
    const size_t n = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.head_dim);
    if (type == e8kv::DType::kF32) {
      compressor->compressor.append(cache->kv, layer, static_cast<const float*>(key), static_cast<const float*>(value),
                                    position);
      return;
    }
    // fp16 / bf16 widen to float exactly; append rounds to fp16 as compress does.
    std::vector<float> k(n), v(n);
    const auto kview = e8kv::TensorView::nhd(key, type, 1, s.n_kv_heads, s.head_dim);
    const auto vview = e8kv::TensorView::nhd(value, type, 1, s.n_kv_heads, s.head_dim);
    for (int h = 0; h < s.n_kv_heads; ++h) {
      kview.load(0, h, &k[static_cast<size_t>(h) * static_cast<size_t>(s.head_dim)]);
      vview.load(0, h, &v[static_cast<size_t>(h) * static_cast<size_t>(s.head_dim)]);
    }
    compressor->compressor.append(cache->kv, layer, k.data(), v.data(), position);
  });
}

void e8kv_cache_destroy(e8kv_cache* cache) noexcept { delete cache; }

// ---- attention ------------------------------------------------------------------------------------

e8kv_status e8kv_attend(const e8kv_cache* cache, int32_t layer, const float* q, int32_t position, float* out,
                        float* lse, e8kv_thread_pool* pool) noexcept {
  return guarded("e8kv_attend", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(cache != nullptr, "cache is NULL");
    require_argument(q != nullptr && out != nullptr, "q or out is NULL");
    require_argument(cache->kv.valid(), "the cache holds no layout");
    require_layer(cache->kv, layer);
    require_query_position(cache->kv, layer, position, "position");
    std::unique_lock<std::mutex> lock;
    e8kv::AttendOptions options;
    options.executor = executor_of(pool, lock);
    e8kv::attend(cache->kv, layer, q, out, lse, options);
  });
}

e8kv_status e8kv_attend_batch(const e8kv_attend_request* requests, size_t n_requests, e8kv_thread_pool* pool) noexcept {
  return guarded("e8kv_attend_batch", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(requests != nullptr || n_requests == 0, "requests is NULL with n_requests > 0");
    std::vector<e8kv::AttendRequest> batch(n_requests);
    for (size_t i = 0; i < n_requests; ++i) {
      const e8kv_attend_request& r = requests[i];
      require_argument(r.cache != nullptr && r.cache->kv.valid(), "requests[{}].cache is NULL or holds no layout", i);
      require_argument(r.q != nullptr && r.out != nullptr, "requests[{}].q or .out is NULL", i);
      require_argument(r.n_tokens >= 1, "requests[{}].n_tokens is {}; accepted: >= 1", i, r.n_tokens);
      require_argument(r.layer >= 0 && r.layer < r.cache->kv.n_layers(), "requests[{}].layer {} is outside [0, {})", i,
                       r.layer, r.cache->kv.n_layers());
      if (r.positions != nullptr)
        for (int32_t t = 0; t < r.n_tokens; ++t)
          require_query_position(r.cache->kv, r.layer, r.positions[t], fmt::format("requests[{}].positions[{}]", i, t));
      batch[i].cache = &r.cache->kv;
      batch[i].layer = r.layer;
      batch[i].n_tokens = r.n_tokens;
      batch[i].q = r.q;
      batch[i].out = r.out;
      batch[i].lse = r.lse;
    }
    std::unique_lock<std::mutex> lock;
    e8kv::AttendOptions options;
    options.executor = executor_of(pool, lock);
    e8kv::attend_batch(batch, options);
  });
}

e8kv_status e8kv_merge_attention(const float* out_a, const float* lse_a, const float* out_b, const float* lse_b,
                                 int32_t n_heads, int32_t head_dim, float* out, float* lse) noexcept {
  return guarded("e8kv_merge_attention", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(out_a && lse_a && out_b && lse_b && out && lse, "out_a, lse_a, out_b, lse_b, out and lse must not be NULL");
    require_argument(n_heads >= 0 && head_dim >= 0, "n_heads {} and head_dim {} must be >= 0", n_heads, head_dim);
    e8kv::merge_attention(out_a, lse_a, out_b, lse_b, n_heads, head_dim, out, lse);
  });
}

// ---- decompression --------------------------------------------------------------------------------

e8kv_status e8kv_cache_layer_extent(const e8kv_cache* cache, int32_t layer, int32_t* first_position,
                                    int64_t* n_tokens) noexcept {
  return guarded("e8kv_cache_layer_extent", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(cache != nullptr, "cache is NULL");
    require_argument(first_position != nullptr && n_tokens != nullptr, "first_position or n_tokens (outputs) is NULL");
    require_argument(cache->kv.valid(), "the cache holds no layout");
    require_layer(cache->kv, layer);
    const Extent extent = layer_extent(cache->kv, layer);
    *first_position = extent.first_position;
    *n_tokens = extent.n_tokens;
  });
}

e8kv_status e8kv_decompress_layer(const e8kv_cache* cache, int32_t layer, int64_t n_tokens, int32_t* positions,
                                  float* keys, float* values, float* mask) noexcept {
  return guarded("e8kv_decompress_layer", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(cache != nullptr, "cache is NULL");
    require_argument(cache->kv.valid(), "the cache holds no layout");
    require_layer(cache->kv, layer);
    // The rows are decompress_layer's own (one per stored position): decoded once, not counted
    // again here.
    const e8kv::DenseLayer dense = cache->kv.decompress_layer(layer);
    require_argument(n_tokens == dense.tokens, "n_tokens is {}; layer {} stores {} positions (e8kv_cache_layer_extent)",
                     n_tokens, layer, dense.tokens);
    if (positions) std::copy(dense.positions.begin(), dense.positions.end(), positions);
    if (keys) std::copy(dense.keys.begin(), dense.keys.end(), keys);
    if (values) std::copy(dense.values.begin(), dense.values.end(), values);
    if (mask) std::copy(dense.mask.begin(), dense.mask.end(), mask);
  });
}

// ---- container ------------------------------------------------------------------------------------

e8kv_status e8kv_serialized_size(const e8kv_cache* cache, size_t* size) noexcept {
  return guarded("e8kv_serialized_size", E8KV_ERROR_INTERNAL, [&] {
    require_argument(cache != nullptr && cache->kv.valid(), "cache is NULL or holds no layout");
    require_argument(size != nullptr, "size (the output) is NULL");
    *size = e8kv::container::serialized_size(cache->kv);
  });
}

e8kv_status e8kv_serialized_size_bound(const e8kv_cache* cache, size_t* size) noexcept {
  return guarded("e8kv_serialized_size_bound", E8KV_ERROR_INTERNAL, [&] {
    require_argument(cache != nullptr && cache->kv.valid(), "cache is NULL or holds no layout");
    require_argument(size != nullptr, "size (the output) is NULL");
    *size = e8kv::container::serialized_size_bound(cache->kv, e8kv::container::ContainerOptions{});
  });
}

e8kv_status e8kv_serialize(const e8kv_cache* cache, void* buffer, size_t capacity, size_t* size) noexcept {
  return guarded("e8kv_serialize", E8KV_ERROR_INTERNAL, [&] {
    require_argument(cache != nullptr && cache->kv.valid(), "cache is NULL or holds no layout");
    require_argument(size != nullptr, "size (the output) is NULL");
    const e8kv::container::ContainerOptions options;
    // One compression pass when the buffer holds the cheap bound; otherwise the exact size first.
    if (capacity < e8kv::container::serialized_size_bound(cache->kv, options)) {
      const size_t needed = e8kv::container::serialized_size(cache->kv, options);
      if (capacity < needed) {
        *size = needed;
        fail(E8KV_ERROR_INVALID_ARGUMENT,
             fmt::format("capacity {} is below the {} bytes the container needs", capacity, needed));
      }
    }
    require_argument(buffer != nullptr, "buffer is NULL");
    *size = e8kv::container::serialize(cache->kv, options, static_cast<uint8_t*>(buffer), capacity);
  });
}

e8kv_status e8kv_serialize_alloc(const e8kv_cache* cache, void** buffer, size_t* size) noexcept {
  if (buffer) *buffer = nullptr;
  return guarded("e8kv_serialize_alloc", E8KV_ERROR_INTERNAL, [&] {
    require_argument(cache != nullptr && cache->kv.valid(), "cache is NULL or holds no layout");
    require_argument(buffer != nullptr && size != nullptr, "buffer or size (outputs) is NULL");
    const e8kv::container::ContainerOptions options;
    const size_t bound = e8kv::container::serialized_size_bound(cache->kv, options);
    // malloc, not new[]: e8kv_free releases it with free().
    std::unique_ptr<void, decltype(&std::free)> data(std::malloc(bound), &std::free);
    if (!data) throw std::bad_alloc();
    const size_t written = e8kv::container::serialize(cache->kv, options, static_cast<uint8_t*>(data.get()), bound);
    // Give back the bound's slack; keeping the larger block is correct when realloc declines.
    if (void* shrunk = std::realloc(data.get(), std::max<size_t>(written, 1))) {
      data.release();
      data.reset(shrunk);
    }
    *size = written;
    *buffer = data.release();
  });
}

void e8kv_free(void* buffer) noexcept { std::free(buffer); }

e8kv_status e8kv_deserialize(const void* data, size_t size, const e8kv_compressor* compressor,
                             e8kv_cache** cache) noexcept {
  if (cache) *cache = nullptr;
  return guarded("e8kv_deserialize", E8KV_ERROR_CORRUPT_DATA, [&] {
    require_argument(cache != nullptr, "cache (the output) is NULL");
    require_argument(data != nullptr || size == 0, "data is NULL with size > 0");
    const auto* bytes = static_cast<const uint8_t*>(data);
    // Well-formed containers this library does not read are "unsupported", not "corrupt": a newer
    // format version, or the plain kind. The prefix says which (docs/format.md §2.1).
    const auto& magic = e8kv::container::kMagic;
    if (size >= magic.size() + 4 && std::memcmp(bytes, magic.data(), magic.size()) == 0) {
      const unsigned version = bytes[8] | (static_cast<unsigned>(bytes[9]) << 8);
      const unsigned kind = bytes[10] | (static_cast<unsigned>(bytes[11]) << 8);
      if (version > e8kv::container::kFormatVersion)
        fail(E8KV_ERROR_UNSUPPORTED,
             fmt::format("container format version {} is newer than this library's (it reads 1 .. {})", version,
                         e8kv::container::kFormatVersion));
      if (kind == static_cast<unsigned>(e8kv::container::ContainerKind::kPlain))
        fail(E8KV_ERROR_UNSUPPORTED,
             "the container holds a plain fp16/bf16 cache (kind 2); this function reads compressed caches (kind 1)");
    }
    e8kv::container::DeserializeOptions options;
    if (compressor != nullptr) {
      const e8kv::container::ContainerInfo info = e8kv::container::read_info(bytes, size, options);
      // The compressor's own check: with a rate budget (budget=, index_budget=) each cache has the
      // per-layer codes its compress chose, which the compressor accepts (KVCompressor::append).
      const std::string diff = compressor->compressor.layout_difference(info.layout);
      if (!diff.empty())
        fail(E8KV_ERROR_INVALID_ARGUMENT,
             "the container was written with another configuration or shape than the compressor's (" + diff + ")");
      // Codecs are shared only when the layouts are equal (a budget's cache has codes of its own).
      if (e8kv::container::layout_difference(info.layout, compressor->codecs->layout()).empty())
        options.codecs = compressor->codecs;
    }
    auto result = std::make_unique<e8kv_cache>();
    result->kv = e8kv::container::deserialize(bytes, size, options);
    *cache = result.release();
  });
}

// ---- what a cache holds ---------------------------------------------------------------------------

e8kv_status e8kv_cache_shape(const e8kv_cache* cache, e8kv_model_shape* shape) noexcept {
  return guarded("e8kv_cache_shape", E8KV_ERROR_INTERNAL, [&] {
    require_argument(cache != nullptr && cache->kv.valid(), "cache is NULL or holds no layout");
    require_argument(shape != nullptr, "shape (the output) is NULL");
    const e8kv::ModelShape s = shape_of(cache->kv);
    *shape = {s.n_layers, s.n_kv_heads, s.n_q_heads, s.head_dim};
  });
}

e8kv_status e8kv_cache_bytes(const e8kv_cache* cache, uint64_t* bytes) noexcept {
  return guarded("e8kv_cache_bytes", E8KV_ERROR_INTERNAL, [&] {
    require_argument(cache != nullptr && bytes != nullptr, "cache or bytes (the output) is NULL");
    *bytes = cache->kv.bytes();
  });
}

e8kv_status e8kv_cache_bits_per_element(const e8kv_cache* cache, double* bits) noexcept {
  return guarded("e8kv_cache_bits_per_element", E8KV_ERROR_INTERNAL, [&] {
    require_argument(cache != nullptr && bits != nullptr, "cache or bits (the output) is NULL");
    *bits = cache->kv.bits_per_element();
  });
}

e8kv_status e8kv_cache_compression_ratio(const e8kv_cache* cache, double* ratio) noexcept {
  return guarded("e8kv_cache_compression_ratio", E8KV_ERROR_INTERNAL, [&] {
    require_argument(cache != nullptr && ratio != nullptr, "cache or ratio (the output) is NULL");
    *ratio = cache->kv.compression_ratio();
  });
}

e8kv_status e8kv_cache_original_tokens(const e8kv_cache* cache, int64_t* tokens) noexcept {
  return guarded("e8kv_cache_original_tokens", E8KV_ERROR_INTERNAL, [&] {
    require_argument(cache != nullptr && tokens != nullptr, "cache or tokens (the output) is NULL");
    *tokens = cache->kv.original_tokens();
  });
}

e8kv_status e8kv_cache_stored_tokens(const e8kv_cache* cache, int32_t layer, int32_t kv_head,
                                     int64_t* tokens) noexcept {
  return guarded("e8kv_cache_stored_tokens", E8KV_ERROR_INVALID_ARGUMENT, [&] {
    require_argument(cache != nullptr && cache->kv.valid(), "cache is NULL or holds no layout");
    require_argument(tokens != nullptr, "tokens (the output) is NULL");
    require_layer(cache->kv, layer);
    const int n_heads = cache->kv.layout().n_kv_heads;
    require_argument(kv_head >= 0 && kv_head < n_heads, "kv_head {} is outside [0, {})", kv_head, n_heads);
    *tokens = cache->kv.stored_tokens(layer, kv_head);
  });
}

// ---- presets ---------------------------------------------------------------------------------------

const char* e8kv_preset_names(void) noexcept { return e8kv::Config::preset_names(); }

}  // extern "C"
