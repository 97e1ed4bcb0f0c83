/* e8kv C ABI: the compressor, the compressed cache, attention and the container, for C and for
 * any language with a C FFI (Rust, Go, Python ctypes/cffi). C99; no C++ type appears here.
 *
 *   e8kv_model_shape shape = {n_layers, n_kv_heads, n_q_heads, head_dim};
 *   e8kv_compressor* c;   e8kv_compressor_create(&shape, "preset=high", &c);
 *   e8kv_cache* cache;    e8kv_compress(c, &prefill, &observation_queries, NULL, &cache);
 *   e8kv_append(c, cache, layer, E8KV_DTYPE_F16, k, v, position);     (each decoded token)
 *   e8kv_attend(cache, layer, q, position, out, lse, NULL);            (reads the codes)
 *   e8kv_cache_destroy(cache);   e8kv_compressor_destroy(c);
 *
 * The functions are those of the C++ API (compressor.hpp, attention/attend.hpp,
 * entropy/container.hpp); their documentation there applies. This header adds only what a C
 * boundary needs:
 *
 * ERRORS. Every function that can fail returns an e8kv_status; E8KV_OK is 0. On failure,
 * e8kv_last_error() returns a message naming the function, the argument and the accepted values.
 * The message is per thread (thread-local) and stays until the next failing call on the same
 * thread; successful calls leave it unchanged. No C++ exception ever leaves a function of this
 * header. A call that fails leaves its cache exactly as it was (the C++ API's guarantee), sets
 * every handle or buffer pointer it would have returned to NULL, and writes nothing into a caller's
 * buffer it refuses (other scalar outputs are unspecified unless the function says otherwise;
 * tests/c_api_contract_test.c checks every function's error paths).
 *
 * OWNERSHIP. Handles (e8kv_compressor, e8kv_cache, e8kv_thread_pool) are created by their
 * *_create function (caches also by e8kv_compress and e8kv_deserialize) and freed by the matching
 * *_destroy function, which accepts NULL. A cache does not refer to the compressor that made it:
 * either may be destroyed first. Buffers returned by e8kv_serialize_alloc are freed with
 * e8kv_free. Every other pointer argument is the caller's: read or written during the call only,
 * never kept after it returns. Strings returned by the library (messages, names, versions) are
 * owned by it: static, except e8kv_last_error's, valid until the next failing call on the thread.
 *
 * THREAD SAFETY. A compressor is immutable: any number of threads may use one at once. Calls that
 * only read a cache (attend, attend_batch, decompress, serialize, the e8kv_cache_* queries) may run
 * concurrently on one cache; calls that modify it (e8kv_extend, e8kv_append, e8kv_drop_before, e8kv_cache_destroy)
 * must not overlap any other call on that cache. Distinct caches are independent. A thread pool
 * may be passed by several threads at once: the calls that use one pool run one at a time.
 *
 * TENSORS. K, V and queries are row-major NHD, [tokens, heads, head_dim] with head_dim
 * contiguous, in float32, IEEE fp16 bits or bfloat16 bits (e8kv_dtype). Keys and queries are
 * post-RoPE, as engines store them. The library cannot check a buffer's length: each must hold
 * the number of elements its documentation states. Attention inputs and outputs are float32.
 */
#ifndef E8KV_C_API_H
#define E8KV_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define E8KV_NOEXCEPT noexcept
extern "C" {
#else
#define E8KV_NOEXCEPT
#endif

#if defined(__GNUC__) || defined(__clang__)
#define E8KV_C_EXPORT __attribute__((visibility("default")))
#else
#define E8KV_C_EXPORT
#endif

/* ---- status, errors, versions --------------------------------------------------------------- */

typedef enum e8kv_status {
  E8KV_OK = 0,
  E8KV_ERROR_INVALID_ARGUMENT = 1, /* a null pointer, a value out of range, a bad spec string,
                                      a shape mismatch, a non-finite input, a buffer of the wrong size */
  E8KV_ERROR_UNSUPPORTED = 2,      /* well-formed but not supported by this build: a head_dim, a
                                      newer container format version, a container kind */
  E8KV_ERROR_CORRUPT_DATA = 3,     /* a container that is damaged, truncated or inconsistent */
  E8KV_ERROR_OUT_OF_MEMORY = 4,
  E8KV_ERROR_INTERNAL = 5          /* a failure that is a bug of e8kv: please report the message */
} e8kv_status;

/* A static name of a status ("ok", "invalid argument", ...); "unknown status" for other values. */
E8KV_C_EXPORT const char* e8kv_status_name(int32_t status) E8KV_NOEXCEPT;
/* The message of the last failed call on the calling thread; "" when none has failed. */
E8KV_C_EXPORT const char* e8kv_last_error(void) E8KV_NOEXCEPT;

/* The library version packed as major * 10000 + minor * 100 + patch (e8kv::kVersion). */
E8KV_C_EXPORT int32_t e8kv_version(void) E8KV_NOEXCEPT;
/* "major.minor.patch". */
E8KV_C_EXPORT const char* e8kv_version_string(void) E8KV_NOEXCEPT;
/* The newest container format version this library reads and writes (it reads every older one). */
E8KV_C_EXPORT int32_t e8kv_format_version(void) E8KV_NOEXCEPT;

/* ---- types ---------------------------------------------------------------------------------- */

/* Element types. They cross the ABI as int32_t (struct fields and arguments), so that any value a
 * caller passes is a defined one to check: an unknown value gives E8KV_ERROR_INVALID_ARGUMENT. */
typedef enum e8kv_dtype {
  E8KV_DTYPE_F32 = 0,  /* float */
  E8KV_DTYPE_F16 = 1,  /* IEEE binary16 bits in a uint16_t */
  E8KV_DTYPE_BF16 = 2  /* bfloat16 bits in a uint16_t */
} e8kv_dtype;

typedef struct e8kv_model_shape {
  int32_t n_layers;   /* >= 1 */
  int32_t n_kv_heads; /* >= 1 */
  int32_t n_q_heads;  /* a multiple of n_kv_heads (GQA; equal: MHA) */
  int32_t head_dim;   /* 64, 80, 96, 128 or 256 */
} e8kv_model_shape;

typedef struct e8kv_compressor e8kv_compressor;
typedef struct e8kv_cache e8kv_cache;
typedef struct e8kv_thread_pool e8kv_thread_pool;

/* K and V of every layer for n_tokens tokens of one sequence (a prefill or a later chunk). */
typedef struct e8kv_kv_input {
  int32_t dtype;              /* an e8kv_dtype, of keys and values */
  int64_t n_tokens;           /* >= 0 */
  const void* const* keys;    /* n_layers pointers, each to [n_tokens, n_kv_heads, head_dim] post-RoPE;
                                 an entry may be NULL only when n_tokens is 0 */
  const void* const* values;  /* n_layers pointers, each to [n_tokens, n_kv_heads, head_dim] */
  const int32_t* positions;   /* n_tokens absolute positions, >= 0 and strictly increasing, or NULL */
  int32_t first_position;     /* when positions is NULL: token t is at first_position + t */
} e8kv_kv_input;

/* Observation queries (the last queries of the prefill), one block per layer: attention scorers
 * need them for eviction, and query-weighted keys (on by default) for their channel scales. */
typedef struct e8kv_query_input {
  int32_t dtype;              /* an e8kv_dtype */
  int64_t n_queries;          /* >= 1: the observation window */
  const void* const* queries; /* n_layers pointers, each to [n_queries, n_q_heads, head_dim] post-RoPE */
  const int32_t* positions;   /* n_queries absolute positions, or NULL: the last n_queries
                                 positions of the sequence */
} e8kv_query_input;

/* ---- thread pool ---------------------------------------------------------------------------- */

/* A pool of `threads` workers (1 .. 1024), the calling thread being one of them. e8kv starts no
 * thread otherwise; results never depend on the pool or its size. */
E8KV_C_EXPORT e8kv_status e8kv_thread_pool_create(int32_t threads, e8kv_thread_pool** pool) E8KV_NOEXCEPT;
E8KV_C_EXPORT void e8kv_thread_pool_destroy(e8kv_thread_pool* pool) E8KV_NOEXCEPT;

/* ---- compressor ----------------------------------------------------------------------------- */

/* spec: a Config::parse string (config.hpp), e.g. "preset=high", "preset=quant-k3v2,evict=0.5,
 * rope_theta=500000"; "" is the default configuration. The default keeps the latest 16-31 tokens
 * in fp16 for decoding; a cache compressed to be stored and restored into a dense cache can add
 * "residual=0" (what Config::parse_at_rest does). */
E8KV_C_EXPORT e8kv_status e8kv_compressor_create(const e8kv_model_shape* shape, const char* spec,
                                                 e8kv_compressor** compressor) E8KV_NOEXCEPT;
E8KV_C_EXPORT void e8kv_compressor_destroy(e8kv_compressor* compressor) E8KV_NOEXCEPT;
/* The full configuration as a spec string (Config::describe). *length receives its length
 * without the terminating NUL. text NULL and capacity 0: only the length. Otherwise capacity must
 * be at least *length + 1 (else E8KV_ERROR_INVALID_ARGUMENT, text untouched). */
E8KV_C_EXPORT e8kv_status e8kv_compressor_describe(const e8kv_compressor* compressor, char* text, size_t capacity,
                                                   size_t* length) E8KV_NOEXCEPT;

/* ---- compress, extend, append --------------------------------------------------------------- */

/* Scores, evicts and quantizes a prefill into a new cache. queries may be NULL (then eviction
 * scores keys only and keys are coded without query weighting); pool may be NULL. */
E8KV_C_EXPORT e8kv_status e8kv_compress(const e8kv_compressor* compressor, const e8kv_kv_input* kv,
                                        const e8kv_query_input* queries, e8kv_thread_pool* pool,
                                        e8kv_cache** cache) E8KV_NOEXCEPT;
/* Multi-turn: compresses a later chunk into `cache`, whose positions must all precede the chunk's.
 * Stored tokens are never re-quantized; eviction applies to the chunk only. */
E8KV_C_EXPORT e8kv_status e8kv_extend(const e8kv_compressor* compressor, e8kv_cache* cache, const e8kv_kv_input* kv,
                                      const e8kv_query_input* queries, e8kv_thread_pool* pool) E8KV_NOEXCEPT;
/* Sliding window: removes every token the cache stores below `position`, from every layer (coded,
 * fp16 window, pinned sinks, fp16-tier and code-tier tokens), as an engine with sliding-window attention
 * drops cells that left the window; the others keep their codes. E8KV_ERROR_INVALID_ARGUMENT
 * (the cache unchanged) when per-KV-head position sets would keep different numbers of pinned
 * tokens. */
E8KV_C_EXPORT e8kv_status e8kv_drop_before(const e8kv_compressor* compressor, e8kv_cache* cache,
                                           int32_t position) E8KV_NOEXCEPT;
/* Appends one token of one layer: key and value are [n_kv_heads, head_dim] of `dtype` (key
 * post-RoPE); position must follow every position stored in the layer. The cache must have been
 * made by this compressor or by one of the same configuration and shape. */
E8KV_C_EXPORT e8kv_status e8kv_append(const e8kv_compressor* compressor, e8kv_cache* cache, int32_t layer,
                                      int32_t dtype, const void* key, const void* value,
                                      int32_t position) E8KV_NOEXCEPT;
E8KV_C_EXPORT void e8kv_cache_destroy(e8kv_cache* cache) E8KV_NOEXCEPT;

/* ---- attention ------------------------------------------------------------------------------ */

/* Decode attention of one query token at `position` over every token `layer` stores: q is
 * [n_q_heads, head_dim] post-RoPE; out receives [n_q_heads, head_dim]; lse (NULL, or n_q_heads
 * floats) the natural-log sum of exp(scale * q.k) per query head, to merge partial attentions
 * (e8kv_merge_attention). position must be >= 0 and may not precede a stored position (the
 * query would see its future). A layer with no stored token gives out = 0 and lse = -inf. pool may be NULL. */
E8KV_C_EXPORT e8kv_status e8kv_attend(const e8kv_cache* cache, int32_t layer, const float* q, int32_t position,
                                      float* out, float* lse, e8kv_thread_pool* pool) E8KV_NOEXCEPT;

/* One sequence's share of a batch: n_tokens query tokens attending to every token `layer` stores. */
typedef struct e8kv_attend_request {
  const e8kv_cache* cache;
  int32_t layer;
  int32_t n_tokens;         /* >= 1 */
  const float* q;           /* [n_tokens, n_q_heads, head_dim] */
  float* out;               /* [n_tokens, n_q_heads, head_dim] */
  float* lse;               /* [n_tokens, n_q_heads] or NULL */
  const int32_t* positions; /* n_tokens query positions, each checked as by e8kv_attend, or NULL:
                               no check */
} e8kv_attend_request;

/* Every request in one call, its work spread over the pool (NULL: the calling thread). Each
 * request's results are bit-identical to e8kv_attend on its tokens one by one. Requests may share
 * a cache; their outputs must not overlap. */
E8KV_C_EXPORT e8kv_status e8kv_attend_batch(const e8kv_attend_request* requests, size_t n_requests,
                                            e8kv_thread_pool* pool) E8KV_NOEXCEPT;

/* The attention over the union of two disjoint key sets from each set's out and lse: per head,
 * out = (e^lse_a * out_a + e^lse_b * out_b) / (e^lse_a + e^lse_b), lse = log of the denominator.
 * out_*: [n_heads, head_dim]; lse_*: [n_heads]. out and lse may alias out_a and lse_a. */
E8KV_C_EXPORT e8kv_status e8kv_merge_attention(const float* out_a, const float* lse_a, const float* out_b,
                                               const float* lse_b, int32_t n_heads, int32_t head_dim, float* out,
                                               float* lse) E8KV_NOEXCEPT;

/* ---- decompression -------------------------------------------------------------------------- */

/* The dense view of a layer has one row per position that some head of the layer stores:
 * *n_tokens rows, the first at *first_position (0 and 0 when the layer stores none). Its size
 * follows the stored tokens, not the span of their positions. */
E8KV_C_EXPORT e8kv_status e8kv_cache_layer_extent(const e8kv_cache* cache, int32_t layer, int32_t* first_position,
                                                  int64_t* n_tokens) E8KV_NOEXCEPT;
/* Decodes a layer to dense float32 rows; n_tokens must equal the extent's. positions: [n_tokens],
 * the position of each row, ascending; keys and values: [n_tokens, n_kv_heads, head_dim] (keys
 * post-RoPE); mask: [n_kv_heads, n_tokens], 0 where the head stores the row's position and
 * -INFINITY where it does not (evicted; keys and values are 0 there). Any of positions, keys,
 * values, mask may be NULL to skip it. */
E8KV_C_EXPORT e8kv_status e8kv_decompress_layer(const e8kv_cache* cache, int32_t layer, int64_t n_tokens,
                                                int32_t* positions, float* keys, float* values,
                                                float* mask) E8KV_NOEXCEPT;

/* ---- container (docs/format.md): serialize, deserialize ------------------------------------- */

/* The exact size e8kv_serialize writes (it compresses the whole cache to know it). */
E8KV_C_EXPORT e8kv_status e8kv_serialized_size(const e8kv_cache* cache, size_t* size) E8KV_NOEXCEPT;
/* An upper bound on that size without compressing: header, layer table and chunk directory exact,
 * every stream at its raw size (a stream is stored as it is unless zstd makes it smaller). It depends only on the
 * cache's layout and stored token counts, not on the values, so caches of one configuration and token
 * count share it: a fixed-size slot (LMCache's serde buffers) sized by it always holds the container. */
E8KV_C_EXPORT e8kv_status e8kv_serialized_size_bound(const e8kv_cache* cache, size_t* size) E8KV_NOEXCEPT;
/* Writes the container into buffer[0, capacity); *size receives its size. A capacity below it
 * gives E8KV_ERROR_INVALID_ARGUMENT with *size set to the size needed. */
E8KV_C_EXPORT e8kv_status e8kv_serialize(const e8kv_cache* cache, void* buffer, size_t capacity,
                                         size_t* size) E8KV_NOEXCEPT;
/* Writes the container into a buffer the library allocates: *buffer (free it with e8kv_free) and
 * *size. On failure *buffer is NULL. */
E8KV_C_EXPORT e8kv_status e8kv_serialize_alloc(const e8kv_cache* cache, void** buffer, size_t* size) E8KV_NOEXCEPT;
/* Frees a buffer from e8kv_serialize_alloc; NULL is a no-op. */
E8KV_C_EXPORT void e8kv_free(void* buffer) E8KV_NOEXCEPT;
/* Reads a compressed-cache container into a new cache. Nothing in `data` is trusted: damage,
 * truncation and inconsistency give E8KV_ERROR_CORRUPT_DATA. compressor (may be NULL): the
 * container's configuration and shape must then be one the compressor accepts for e8kv_append
 * (its own; with budget= or index_budget=, with the per-layer codes that cache's compress chose),
 * else E8KV_ERROR_INVALID_ARGUMENT naming the first differing field; the cache then shares the
 * compressor's codecs where the layouts are equal, which saves rebuilding them. The result
 * attends and appends exactly like the cache that was written. */
E8KV_C_EXPORT e8kv_status e8kv_deserialize(const void* data, size_t size, const e8kv_compressor* compressor,
                                           e8kv_cache** cache) E8KV_NOEXCEPT;

/* ---- what a cache holds --------------------------------------------------------------------- */

E8KV_C_EXPORT e8kv_status e8kv_cache_shape(const e8kv_cache* cache, e8kv_model_shape* shape) E8KV_NOEXCEPT;
/* Every byte a decoder needs: codes, gains, means, positions, fp16 window, descriptor. */
E8KV_C_EXPORT e8kv_status e8kv_cache_bytes(const e8kv_cache* cache, uint64_t* bytes) E8KV_NOEXCEPT;
/* 8 * bytes / (original tokens * layers * kv heads * head_dim * 2); 0 for an empty cache. */
E8KV_C_EXPORT e8kv_status e8kv_cache_bits_per_element(const e8kv_cache* cache, double* bits) E8KV_NOEXCEPT;
/* fp16 bytes of K and V of every original token divided by bytes; 0 for an empty cache. */
E8KV_C_EXPORT e8kv_status e8kv_cache_compression_ratio(const e8kv_cache* cache, double* ratio) E8KV_NOEXCEPT;
/* Tokens ever given (before eviction), the largest over layers. */
E8KV_C_EXPORT e8kv_status e8kv_cache_original_tokens(const e8kv_cache* cache, int64_t* tokens) E8KV_NOEXCEPT;
/* Tokens a (layer, kv_head) stores after eviction: coded, code tier and fp16 window. */
E8KV_C_EXPORT e8kv_status e8kv_cache_stored_tokens(const e8kv_cache* cache, int32_t layer, int32_t kv_head,
                                                   int64_t* tokens) E8KV_NOEXCEPT;

/* ---- presets -------------------------------------------------------------------------------- */

/* The names `preset=NAME` accepts in a spec, comma-separated ("lossless, quant-k4v4, ..."):
 * static (Config::preset_names). */
E8KV_C_EXPORT const char* e8kv_preset_names(void) E8KV_NOEXCEPT;

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* E8KV_C_API_H */
