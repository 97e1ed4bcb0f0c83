/* The error contract of the C ABI (include/e8kv/c_api.h, "ERRORS"), checked for every function on
 * every error path it has, compiled as C99: a failing call returns its status, leaves a message
 * that names the function, sets every handle or buffer it would have returned to NULL (the
 * outputs are pre-set to a sentinel here, so an output left as it was is seen), leaves the cache
 * it was given exactly as it was, and writes nothing into a caller's buffer it refuses. Attention
 * that the library cannot compute (a logit that overflows) is an error status, never zeros.
 * Fixed data (a linear congruential generator with the printed seed). Exit status 0 when every
 * check passes; each failed check prints its line. */
#include "e8kv/c_api.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testing/c_checks.h"

/* A call that must fail with `expected`, its message starting with the function's name. */
#define CHECK_FAILS(call, expected, function)                                                                  \
  do {                                                                                                         \
    e8kv_status status_ = (call);                                                                              \
    ++g_checks;                                                                                                \
    if (status_ != (expected) || strncmp(e8kv_last_error(), function ": ", strlen(function ": ")) != 0) {     \
      ++g_failures;                                                                                            \
      fprintf(stderr, "%s:%d: %s returned %s (expected %s), message \"%s\" (expected to start with %s)\n",     \
              __FILE__, __LINE__, #call, e8kv_status_name(status_), e8kv_status_name(expected), e8kv_last_error(), \
              function);                                                                                       \
    }                                                                                                          \
  } while (0)

enum { kLayers = 2, kKvHeads = 2, kQHeads = 4, kDim = 64, kTokens = 90, kWindow = 4 };
enum { kRow = kKvHeads * kDim, kQRow = kQHeads * kDim };

static const uint32_t kSeed = 4040u;
static uint32_t g_rng;
static float next_value(void) {
  g_rng = g_rng * 1664525u + 1013904223u;
  return (float)((int)((g_rng >> 8) % 511u) - 255) / 64.0f;
}

static float g_keys[kLayers][kTokens * kRow], g_values[kLayers][kTokens * kRow];
static float g_queries[kLayers][kWindow * kQRow];
static const void *g_key_ptrs[kLayers], *g_value_ptrs[kLayers], *g_query_ptrs[kLayers];

static e8kv_kv_input kv_input(int begin, int count) {
  e8kv_kv_input kv;
  int l;
  memset(&kv, 0, sizeof kv);
  kv.dtype = E8KV_DTYPE_F32;
  kv.n_tokens = count;
  kv.first_position = begin;
  for (l = 0; l < kLayers; ++l) {
    g_key_ptrs[l] = g_keys[l] + begin * kRow;
    g_value_ptrs[l] = g_values[l] + begin * kRow;
  }
  kv.keys = g_key_ptrs;
  kv.values = g_value_ptrs;
  return kv;
}

static e8kv_query_input query_input(void) {
  e8kv_query_input q;
  int l;
  memset(&q, 0, sizeof q);
  q.dtype = E8KV_DTYPE_F32;
  q.n_queries = kWindow;
  for (l = 0; l < kLayers; ++l) g_query_ptrs[l] = g_queries[l];
  q.queries = g_query_ptrs;
  return q;
}

/* Sentinels: addresses that are no handle. An output still holding one after a failure is a
 * breach of the contract (a caller that frees on error would free it). */
static int g_sentinel_target;
#define SENTINEL ((void*)&g_sentinel_target)

/* The container of a cache, to see that a failed call left it as it was. */
static unsigned char* snapshot(const e8kv_cache* cache, size_t* size) {
  void* blob = NULL;
  CHECK_OK(e8kv_serialize_alloc(cache, &blob, size));
  return (unsigned char*)blob;
}
static int unchanged(const e8kv_cache* cache, const unsigned char* before, size_t before_size) {
  size_t size = 0;
  unsigned char* now = snapshot(cache, &size);
  const int same = now != NULL && size == before_size && memcmp(now, before, size) == 0;
  e8kv_free(now);
  return same;
}

static void test_thread_pool_create(void) {
  e8kv_thread_pool* pool = (e8kv_thread_pool*)SENTINEL;
  const int32_t bad[] = {0, -1, 1025, INT32_MIN};
  size_t i;
  for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    pool = (e8kv_thread_pool*)SENTINEL;
    CHECK_FAILS(e8kv_thread_pool_create(bad[i], &pool), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_thread_pool_create");
    CHECK(pool == NULL);
  }
  CHECK_FAILS(e8kv_thread_pool_create(2, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_thread_pool_create");
}

static void test_compressor_create(void) {
  const e8kv_model_shape good = {kLayers, kKvHeads, kQHeads, kDim};
  const e8kv_model_shape bad_shapes[] = {{0, 2, 4, 64}, {2, 0, 4, 64}, {2, 3, 4, 64}, {2, 2, 0, 64}, {-1, 2, 4, 64}};
  const char* bad_specs[] = {"preset=nope", "evict=2", "bogus=1", "key=rvq9", "budget=-1", "index_budget=1.5",
                             "budget=2.5,index_budget=2.5", "code_tier=0.99,fp16_tier=0.5", "preset"};
  const e8kv_model_shape unsupported = {kLayers, kKvHeads, kQHeads, 72};
  e8kv_compressor* c = (e8kv_compressor*)SENTINEL;
  size_t i;
  CHECK_FAILS(e8kv_compressor_create(NULL, "", &c), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_compressor_create");
  CHECK(c == NULL);
  c = (e8kv_compressor*)SENTINEL;
  CHECK_FAILS(e8kv_compressor_create(NULL, NULL, &c), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_compressor_create");
  CHECK(c == NULL);
  c = (e8kv_compressor*)SENTINEL;
  CHECK_FAILS(e8kv_compressor_create(&good, NULL, &c), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_compressor_create");
  CHECK(c == NULL);
  for (i = 0; i < sizeof bad_shapes / sizeof bad_shapes[0]; ++i) {
    c = (e8kv_compressor*)SENTINEL;
    CHECK_FAILS(e8kv_compressor_create(&bad_shapes[i], "", &c), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_compressor_create");
    CHECK(c == NULL);
  }
  for (i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; ++i) {
    c = (e8kv_compressor*)SENTINEL;
    CHECK_FAILS(e8kv_compressor_create(&good, bad_specs[i], &c), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_compressor_create");
    CHECK(c == NULL);
  }
  c = (e8kv_compressor*)SENTINEL;
  CHECK_FAILS(e8kv_compressor_create(&unsupported, "", &c), E8KV_ERROR_UNSUPPORTED, "e8kv_compressor_create");
  CHECK(c == NULL);
  CHECK_FAILS(e8kv_compressor_create(&good, "", NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_compressor_create");
}

static void test_describe(e8kv_compressor* c) {
  char text[8];
  size_t length = 0;
  memset(text, 'x', sizeof text);
  CHECK_FAILS(e8kv_compressor_describe(NULL, text, sizeof text, &length), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_compressor_describe");
  CHECK_FAILS(e8kv_compressor_describe(c, text, sizeof text, NULL), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_compressor_describe");
  CHECK_FAILS(e8kv_compressor_describe(c, NULL, 100, &length), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_compressor_describe");
  CHECK_FAILS(e8kv_compressor_describe(c, text, sizeof text, &length), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_compressor_describe");
  CHECK(length >= sizeof text);
  CHECK(text[0] == 'x' && text[sizeof text - 1] == 'x'); /* "text untouched" */
}

static void test_compress(e8kv_compressor* c) {
  e8kv_kv_input kv = kv_input(0, kTokens);
  e8kv_query_input q = query_input();
  e8kv_cache* cache = (e8kv_cache*)SENTINEL;
  int32_t positions[kTokens];
  int t;
#define EXPECT_NO_CACHE(call)                                                \
  do {                                                                       \
    cache = (e8kv_cache*)SENTINEL;                                           \
    CHECK_FAILS(call, E8KV_ERROR_INVALID_ARGUMENT, "e8kv_compress");         \
    CHECK(cache == NULL);                                                    \
  } while (0)
  EXPECT_NO_CACHE(e8kv_compress(NULL, &kv, &q, NULL, &cache));
  EXPECT_NO_CACHE(e8kv_compress(c, NULL, &q, NULL, &cache));
  EXPECT_NO_CACHE(e8kv_compress(c, NULL, NULL, NULL, &cache));
  EXPECT_NO_CACHE(e8kv_compress(NULL, NULL, NULL, NULL, &cache));
  kv.dtype = 7;
  EXPECT_NO_CACHE(e8kv_compress(c, &kv, &q, NULL, &cache));
  kv = kv_input(0, kTokens);
  kv.n_tokens = -1;
  EXPECT_NO_CACHE(e8kv_compress(c, &kv, &q, NULL, &cache));
  kv = kv_input(0, kTokens);
  kv.keys = NULL;
  EXPECT_NO_CACHE(e8kv_compress(c, &kv, &q, NULL, &cache));
  kv = kv_input(0, kTokens);
  g_value_ptrs[1] = NULL;
  EXPECT_NO_CACHE(e8kv_compress(c, &kv, &q, NULL, &cache));
  kv = kv_input(0, kTokens);
  for (t = 0; t < kTokens; ++t) positions[t] = t == 7 ? 5 : t; /* out of order */
  kv.positions = positions;
  EXPECT_NO_CACHE(e8kv_compress(c, &kv, &q, NULL, &cache));
  kv = kv_input(0, kTokens);
  kv.first_position = -3;
  EXPECT_NO_CACHE(e8kv_compress(c, &kv, &q, NULL, &cache));
  kv = kv_input(0, kTokens);
  q.n_queries = 0;
  EXPECT_NO_CACHE(e8kv_compress(c, &kv, &q, NULL, &cache));
  q = query_input();
  q.dtype = -1;
  EXPECT_NO_CACHE(e8kv_compress(c, &kv, &q, NULL, &cache));
  q = query_input();
  q.queries = NULL;
  EXPECT_NO_CACHE(e8kv_compress(c, &kv, &q, NULL, &cache));
  q = query_input();
  g_values[1][5 * kRow + 3] = NAN;
  EXPECT_NO_CACHE(e8kv_compress(c, &kv, &q, NULL, &cache));
  g_values[1][5 * kRow + 3] = 0.5f;
  g_keys[0][9 * kRow] = 1e9f; /* beyond fp16 */
  EXPECT_NO_CACHE(e8kv_compress(c, &kv, &q, NULL, &cache));
  g_keys[0][9 * kRow] = 0.25f;
  CHECK_FAILS(e8kv_compress(c, &kv, &q, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_compress");
#undef EXPECT_NO_CACHE
  {
    /* A budget the chunk cannot meet (a few tokens stay fp16): refused, no cache, the minimum in
     * the message. */
    const e8kv_model_shape shape = {kLayers, kKvHeads, kQHeads, kDim};
    e8kv_compressor* budget = NULL;
    CHECK_OK(e8kv_compressor_create(&shape, "preset=quant-k3v2,budget=2.5", &budget));
    kv = kv_input(0, 10);
    cache = (e8kv_cache*)SENTINEL;
    CHECK_FAILS(e8kv_compress(budget, &kv, &q, NULL, &cache), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_compress");
    CHECK(cache == NULL);
    CHECK(strstr(e8kv_last_error(), "at least") != NULL);
    e8kv_compressor_destroy(budget);
  }
}

/* extend, append, drop_before: every failure leaves the cache exactly as it was. */
static void test_modifying_calls(e8kv_compressor* c, e8kv_cache* cache) {
  const e8kv_model_shape other_shape = {kLayers, kKvHeads, kQHeads, kDim};
  e8kv_compressor* other = NULL;
  size_t size = 0;
  unsigned char* before = snapshot(cache, &size);
  e8kv_kv_input later = kv_input(kTokens - 10, 10), overlapping = kv_input(kTokens - 20, 10);
  float row[kRow];
  if (!before) return;
  CHECK_OK(e8kv_compressor_create(&other_shape, "preset=quant-k3v2,seed=9", &other));
  CHECK_FAILS(e8kv_extend(NULL, cache, &later, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_extend");
  CHECK_FAILS(e8kv_extend(c, cache, NULL, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_extend");
  CHECK_FAILS(e8kv_extend(c, cache, &overlapping, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_extend");
  CHECK_FAILS(e8kv_extend(other, cache, &later, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_extend");
  later.dtype = 3;
  CHECK_FAILS(e8kv_extend(c, cache, &later, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_extend");
  CHECK(unchanged(cache, before, size));

  memcpy(row, g_keys[0], sizeof row);
  CHECK_FAILS(e8kv_append(NULL, cache, 0, E8KV_DTYPE_F32, row, row, 200), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_append");
  CHECK_FAILS(e8kv_append(c, cache, 2, E8KV_DTYPE_F32, row, row, 200), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_append");
  CHECK_FAILS(e8kv_append(c, cache, -1, E8KV_DTYPE_F32, row, row, 200), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_append");
  CHECK_FAILS(e8kv_append(c, cache, 0, 9, row, row, 200), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_append");
  CHECK_FAILS(e8kv_append(c, cache, 0, E8KV_DTYPE_F32, row, NULL, 200), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_append");
  CHECK_FAILS(e8kv_append(c, cache, 0, E8KV_DTYPE_F32, row, row, kTokens - 11), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_append");
  CHECK_FAILS(e8kv_append(other, cache, 0, E8KV_DTYPE_F32, row, row, 200), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_append");
  row[3] = NAN;
  CHECK_FAILS(e8kv_append(c, cache, 0, E8KV_DTYPE_F32, row, row, 200), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_append");
  CHECK(unchanged(cache, before, size));

  CHECK_FAILS(e8kv_drop_before(NULL, cache, 10), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_drop_before");
  CHECK_FAILS(e8kv_drop_before(c, NULL, 10), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_drop_before");
  CHECK_FAILS(e8kv_drop_before(other, cache, 10), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_drop_before");
  CHECK(unchanged(cache, before, size));
  e8kv_compressor_destroy(other);
  e8kv_free(before);
}

/* Attention: argument errors, and logits beyond float (a finite query near FLT_MAX): an error
 * status with a message, not an all-zero output. */
static void test_attention(const e8kv_cache* cache) {
  float q[2 * kQRow], out[2 * kQRow], lse[2 * kQHeads], out_b[kQRow], lse_b[kQHeads];
  e8kv_attend_request request;
  int i;
  for (i = 0; i < 2 * kQRow; ++i) q[i] = next_value() / 4.0f;
  CHECK_FAILS(e8kv_attend(NULL, 0, q, kTokens, out, lse, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_attend");
  CHECK_FAILS(e8kv_attend(cache, 5, q, kTokens, out, lse, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_attend");
  CHECK_FAILS(e8kv_attend(cache, 0, q, 3, out, lse, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_attend");
  CHECK_FAILS(e8kv_attend(cache, 0, q, -1, out, lse, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_attend");
  for (i = 0; i < kQRow; ++i) q[i] = q[i] < 0 ? -3e38f : 3e38f;
  CHECK_FAILS(e8kv_attend(cache, 0, q, kTokens, out, lse, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_attend");
  CHECK(strstr(e8kv_last_error(), "overflow the float range") != NULL);
  q[5] = INFINITY;
  CHECK_FAILS(e8kv_attend(cache, 0, q, kTokens, out, lse, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_attend");

  memset(&request, 0, sizeof request);
  request.cache = cache;
  request.layer = 1;
  request.n_tokens = 2;
  request.q = q;
  request.out = out;
  request.lse = lse;
  CHECK_FAILS(e8kv_attend_batch(&request, 1, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_attend_batch");
  for (i = 0; i < 2 * kQRow; ++i) q[i] = next_value() / 4.0f;
  CHECK_OK(e8kv_attend_batch(&request, 1, NULL));
  request.n_tokens = 0;
  CHECK_FAILS(e8kv_attend_batch(&request, 1, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_attend_batch");
  request.n_tokens = 1;
  request.layer = kLayers;
  CHECK_FAILS(e8kv_attend_batch(&request, 1, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_attend_batch");
  request.layer = 0;
  request.cache = NULL;
  CHECK_FAILS(e8kv_attend_batch(&request, 1, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_attend_batch");
  CHECK_FAILS(e8kv_attend_batch(NULL, 1, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_attend_batch");

  for (i = 0; i < kQHeads; ++i) lse_b[i] = 0.f;
  memcpy(out_b, out, sizeof out_b);
  CHECK_FAILS(e8kv_merge_attention(out, lse, out_b, lse_b, -1, kDim, out, lse), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_merge_attention");
  CHECK_FAILS(e8kv_merge_attention(out, NULL, out_b, lse_b, kQHeads, kDim, out, lse), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_merge_attention");
}

static void test_queries_and_decompress(const e8kv_cache* cache) {
  int32_t first = 0;
  int64_t n = 0, tokens = 0;
  e8kv_model_shape shape;
  uint64_t bytes = 0;
  double x = 0.0;
  CHECK_FAILS(e8kv_cache_layer_extent(NULL, 0, &first, &n), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_cache_layer_extent");
  CHECK_FAILS(e8kv_cache_layer_extent(cache, kLayers, &first, &n), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_cache_layer_extent");
  CHECK_FAILS(e8kv_cache_layer_extent(cache, 0, NULL, &n), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_cache_layer_extent");
  CHECK_OK(e8kv_cache_layer_extent(cache, 0, &first, &n));
  CHECK_FAILS(e8kv_decompress_layer(NULL, 0, n, NULL, NULL, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_decompress_layer");
  CHECK_FAILS(e8kv_decompress_layer(cache, -1, n, NULL, NULL, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_decompress_layer");
  CHECK_FAILS(e8kv_decompress_layer(cache, 0, n + 1, NULL, NULL, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_decompress_layer");
  CHECK_FAILS(e8kv_cache_shape(NULL, &shape), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_cache_shape");
  CHECK_FAILS(e8kv_cache_shape(cache, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_cache_shape");
  CHECK_FAILS(e8kv_cache_bytes(NULL, &bytes), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_cache_bytes");
  CHECK_FAILS(e8kv_cache_bytes(cache, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_cache_bytes");
  CHECK_FAILS(e8kv_cache_bits_per_element(NULL, &x), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_cache_bits_per_element");
  CHECK_FAILS(e8kv_cache_compression_ratio(cache, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_cache_compression_ratio");
  CHECK_FAILS(e8kv_cache_original_tokens(NULL, &tokens), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_cache_original_tokens");
  CHECK_FAILS(e8kv_cache_stored_tokens(cache, 0, kKvHeads, &tokens), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_cache_stored_tokens");
  CHECK_FAILS(e8kv_cache_stored_tokens(cache, kLayers, 0, &tokens), E8KV_ERROR_INVALID_ARGUMENT,
              "e8kv_cache_stored_tokens");
  CHECK_FAILS(e8kv_cache_stored_tokens(cache, 0, 0, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_cache_stored_tokens");
}

static void test_container(e8kv_compressor* c, const e8kv_cache* cache) {
  const e8kv_model_shape shape = {kLayers, kKvHeads, kQHeads, kDim}, other_shape = {kLayers, kKvHeads, kKvHeads, kDim};
  e8kv_compressor *other = NULL, *narrower = NULL;
  e8kv_cache* back = (e8kv_cache*)SENTINEL;
  void* buffer = SENTINEL;
  size_t size = 0, needed = 0, reported = 0;
  unsigned char *blob = snapshot(cache, &size), *copy;
  unsigned char small[16];
  if (!blob) return;
  copy = (unsigned char*)malloc(size);
  CHECK_FAILS(e8kv_serialized_size(NULL, &needed), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialized_size");
  CHECK_FAILS(e8kv_serialized_size(cache, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialized_size");
  CHECK_FAILS(e8kv_serialized_size_bound(NULL, &needed), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialized_size_bound");
  CHECK_FAILS(e8kv_serialized_size_bound(cache, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialized_size_bound");
  memset(small, 0xAB, sizeof small);
  CHECK_FAILS(e8kv_serialize(cache, small, sizeof small, &reported), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialize");
  CHECK(reported == size); /* the documented exception: the size needed */
  CHECK(small[0] == 0xAB && small[sizeof small - 1] == 0xAB);
  CHECK_FAILS(e8kv_serialize(NULL, copy, size, &reported), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialize");
  CHECK_FAILS(e8kv_serialize(cache, copy, size, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialize");
  CHECK_FAILS(e8kv_serialize(cache, NULL, size, &reported), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialize");

  buffer = SENTINEL;
  CHECK_FAILS(e8kv_serialize_alloc(NULL, &buffer, &size), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialize_alloc");
  CHECK(buffer == NULL);
  buffer = SENTINEL;
  CHECK_FAILS(e8kv_serialize_alloc(NULL, &buffer, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialize_alloc");
  CHECK(buffer == NULL);
  buffer = SENTINEL;
  CHECK_FAILS(e8kv_serialize_alloc(cache, &buffer, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialize_alloc");
  CHECK(buffer == NULL);
  CHECK_FAILS(e8kv_serialize_alloc(cache, NULL, &size), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_serialize_alloc");

#define EXPECT_NO_READ(call, status)                           \
  do {                                                         \
    back = (e8kv_cache*)SENTINEL;                              \
    CHECK_FAILS(call, status, "e8kv_deserialize");             \
    CHECK(back == NULL);                                       \
  } while (0)
  EXPECT_NO_READ(e8kv_deserialize(NULL, 100, NULL, &back), E8KV_ERROR_INVALID_ARGUMENT);
  EXPECT_NO_READ(e8kv_deserialize(NULL, 100, c, &back), E8KV_ERROR_INVALID_ARGUMENT);
  EXPECT_NO_READ(e8kv_deserialize(blob, 0, NULL, &back), E8KV_ERROR_CORRUPT_DATA);
  EXPECT_NO_READ(e8kv_deserialize(blob, size - 1, NULL, &back), E8KV_ERROR_CORRUPT_DATA);
  memcpy(copy, blob, size);
  copy[size / 2] ^= 0x10u;
  EXPECT_NO_READ(e8kv_deserialize(copy, size, NULL, &back), E8KV_ERROR_CORRUPT_DATA);
  memcpy(copy, blob, size);
  copy[8] = 200;
  EXPECT_NO_READ(e8kv_deserialize(copy, size, NULL, &back), E8KV_ERROR_UNSUPPORTED);
  memcpy(copy, blob, size);
  copy[10] = 2;
  EXPECT_NO_READ(e8kv_deserialize(copy, size, NULL, &back), E8KV_ERROR_UNSUPPORTED);
  CHECK_OK(e8kv_compressor_create(&shape, "preset=quant-k2v2", &other));
  EXPECT_NO_READ(e8kv_deserialize(blob, size, other, &back), E8KV_ERROR_INVALID_ARGUMENT);
  CHECK_OK(e8kv_compressor_create(&other_shape, "preset=quant-k3v2", &narrower));
  EXPECT_NO_READ(e8kv_deserialize(blob, size, narrower, &back), E8KV_ERROR_INVALID_ARGUMENT);
  CHECK_FAILS(e8kv_deserialize(blob, size, c, NULL), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_deserialize");
#undef EXPECT_NO_READ
  /* The blob itself reads, with the compressor that wrote it. */
  CHECK_OK(e8kv_deserialize(blob, size, c, &back));
  e8kv_cache_destroy(back);
  e8kv_compressor_destroy(other);
  e8kv_compressor_destroy(narrower);
  free(copy);
  e8kv_free(blob);
}

/* CRC-32C, bit by bit (include/e8kv/entropy/checksum.hpp): the header's checksum. */
static uint32_t crc32c(const unsigned char* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  size_t i;
  int k;
  for (i = 0; i < n; ++i) {
    crc ^= p[i];
    for (k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

/* A container whose data a later call would refuse, its checksum recomputed as an adversary
 * would: the first key mean value of layer 0 head 0 set to +inf (attention's scores would leave
 * the float range). Refused by e8kv_deserialize as corrupt data naming the field, no cache. */
static void test_rechecksummed_container(const e8kv_cache* cache) {
  size_t size = 0, header, table, sets_bytes;
  unsigned char* blob = snapshot(cache, &size);
  e8kv_cache* back = (e8kv_cache*)SENTINEL;
  uint64_t header_bytes;
  uint32_t n_layers, crc;
  uint16_t version, key_mean_length, inf = 0x7C00u;
  if (!blob) return;
  /* docs/format.md §2.1-2.2: the prefix, the 128-byte layout record at 48, 2 codec bytes per
   * layer, from version 6 the RoPE factors, then the layer table. */
  memcpy(&version, blob + 8, 2);
  memcpy(&header_bytes, blob + 16, 8);
  memcpy(&n_layers, blob + 48, 4);
  header = (size_t)header_bytes;
  memcpy(&crc, blob + header - 4, 4);
  CHECK(crc == crc32c(blob, header - 4));
  table = 48 + 128 + 2 * (size_t)n_layers;
  if (version >= 6) {
    uint16_t factors;
    memcpy(&factors, blob + table, 2);
    table += 2 + 4 * (size_t)factors;
  }
  sets_bytes = (blob[48 + 19] ? (size_t)kKvHeads : 1) * (version >= 5 ? 24 : 16);
  memcpy(&key_mean_length, blob + table + 32 + sets_bytes, 2);
  CHECK(key_mean_length == kDim); /* the fixture's heads have their means */
  if (key_mean_length == kDim) {
    memcpy(blob + table + 32 + sets_bytes + 4, &inf, 2);
    crc = crc32c(blob, header - 4);
    memcpy(blob + header - 4, &crc, 4);
    CHECK_FAILS(e8kv_deserialize(blob, size, NULL, &back), E8KV_ERROR_CORRUPT_DATA, "e8kv_deserialize");
    CHECK(back == NULL);
    CHECK(strstr(e8kv_last_error(), "key_mean") != NULL);
  }
  e8kv_free(blob);
}

/* A failing call's message stays until the next failing call: successes leave it. */
static void test_message_persists(e8kv_compressor* c) {
  char kept[256];
  size_t length = 0;
  e8kv_thread_pool* pool = (e8kv_thread_pool*)SENTINEL;
  CHECK_FAILS(e8kv_thread_pool_create(0, &pool), E8KV_ERROR_INVALID_ARGUMENT, "e8kv_thread_pool_create");
  CHECK(pool == NULL);
  snprintf(kept, sizeof kept, "%s", e8kv_last_error());
  CHECK_OK(e8kv_compressor_describe(c, NULL, 0, &length));
  CHECK(strcmp(kept, e8kv_last_error()) == 0);
}

int main(void) {
  const e8kv_model_shape shape = {kLayers, kKvHeads, kQHeads, kDim};
  e8kv_compressor* c = NULL;
  e8kv_cache* cache = NULL;
  e8kv_kv_input kv;
  e8kv_query_input q;
  int l, i;
  printf("[seed] c_api_contract_test: %u\n", (unsigned)kSeed);
  g_rng = kSeed;
  for (l = 0; l < kLayers; ++l) {
    for (i = 0; i < kTokens * kRow; ++i) g_keys[l][i] = next_value();
    for (i = 0; i < kTokens * kRow; ++i) g_values[l][i] = next_value();
    for (i = 0; i < kWindow * kQRow; ++i) g_queries[l][i] = next_value() / 4.0f;
  }
  test_thread_pool_create();
  test_compressor_create();
  CHECK_OK(e8kv_compressor_create(&shape, "preset=quant-k3v2", &c));
  if (!c) return 1;
  test_describe(c);
  test_compress(c);
  kv = kv_input(0, kTokens - 10);
  q = query_input();
  CHECK_OK(e8kv_compress(c, &kv, &q, NULL, &cache));
  if (!cache) return 1;
  test_modifying_calls(c, cache);
  test_attention(cache);
  test_queries_and_decompress(cache);
  test_container(c, cache);
  test_rechecksummed_container(cache);
  test_message_persists(c);
  e8kv_cache_destroy(cache);
  e8kv_compressor_destroy(c);
  if (g_failures) {
    fprintf(stderr, "c_api_contract_test: %d of %d checks failed\n", g_failures, g_checks);
    return 1;
  }
  printf("c_api_contract_test: all %d checks passed\n", g_checks);
  return 0;
}
