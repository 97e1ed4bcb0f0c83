/* Tests of the C ABI (include/e8kv/c_api.h), compiled as C99 by the C compiler: round trips
 * (compress -> attend against the decompressed cache, serialize -> deserialize -> attend bit for
 * bit, append, extend, decompress), the three input dtypes, batched attention and the lse merge,
 * and the error paths with their status codes and messages. Exit status 0 when every check
 * passes; each failed check prints its line. */
#include "e8kv/c_api.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define HAVE_PTHREADS 1
#endif

#include "testing/c_checks.h"

/* A call must fail with `expected` and leave a message containing `fragment`. */
#define CHECK_FAILS(call, expected, fragment)                                                        \
  do {                                                                                               \
    e8kv_status status_ = (call);                                                                    \
    ++g_checks;                                                                                      \
    if (status_ != (expected) || strstr(e8kv_last_error(), (fragment)) == NULL) {                    \
      ++g_failures;                                                                                  \
      fprintf(stderr, "%s:%d: %s returned %s (expected %s) with message \"%s\" (expected to contain \"%s\")\n", \
              __FILE__, __LINE__, #call, e8kv_status_name(status_), e8kv_status_name(expected),     \
              e8kv_last_error(), (fragment));                                                        \
    }                                                                                                \
  } while (0)

/* ---- test data ------------------------------------------------------------------------------- */

enum { kLayers = 2, kKvHeads = 2, kQHeads = 4, kDim = 64, kTokens = 100, kWindow = 8 };
enum { kRow = kKvHeads * kDim, kQRow = kQHeads * kDim };

static uint32_t g_rng = 12345u;
/* Multiples of 1/64 in [-255/64, 255/64]: at most 8 significant bits, so exactly representable
 * in fp16 and bf16; the three dtypes then carry the same numbers. */
static float next_value(void) {
  g_rng = g_rng * 1664525u + 1013904223u;
  return (float)((int)((g_rng >> 8) % 511u) - 255) / 64.0f;
}

/* fp16 bits of a float that fp16 represents exactly as a normal number (checked). */
static uint16_t f16_bits(float x) {
  uint16_t sign = x < 0 ? 0x8000u : 0u;
  int exponent;
  float mantissa, fraction;
  if (x == 0.0f) return sign;
  mantissa = frexpf(fabsf(x), &exponent); /* |x| = mantissa * 2^exponent, mantissa in [0.5, 1) */
  fraction = (2.0f * mantissa - 1.0f) * 1024.0f;
  if (fraction != floorf(fraction) || exponent - 1 + 15 < 1 || exponent - 1 + 15 > 30) {
    fprintf(stderr, "f16_bits: %g is not an exact fp16 normal\n", x);
    abort();
  }
  return (uint16_t)(sign | (uint16_t)((exponent - 1 + 15) << 10) | (uint16_t)fraction);
}

/* bf16 bits of a float with at most 8 significant bits (checked). */
static uint16_t bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0xFFFFu) != 0) {
    fprintf(stderr, "bf16_bits: %g is not an exact bf16\n", x);
    abort();
  }
  return (uint16_t)(u >> 16);
}

typedef struct Sequence {
  float keys[kLayers][kTokens * kRow];
  float values[kLayers][kTokens * kRow];
  float queries[kLayers][kWindow * kQRow]; /* observation queries of the last kWindow positions */
  uint16_t keys16[kLayers][kTokens * kRow], values16[kLayers][kTokens * kRow], queries16[kLayers][kWindow * kQRow];
  const void* key_ptrs[kLayers];
  const void* value_ptrs[kLayers];
  const void* query_ptrs[kLayers];
} Sequence;

static Sequence g_seq;

static void make_sequence(void) {
  int l, i;
  for (l = 0; l < kLayers; ++l) {
    for (i = 0; i < kTokens * kRow; ++i) g_seq.keys[l][i] = next_value();
    for (i = 0; i < kTokens * kRow; ++i) g_seq.values[l][i] = next_value();
    /* Queries a quarter as large: a softer softmax, so that many tokens weigh in attention. */
    for (i = 0; i < kWindow * kQRow; ++i) g_seq.queries[l][i] = next_value() / 4.0f;
  }
}

/* kv input over tokens [begin, begin + count) of the sequence, as f32 / f16 / bf16 bits. */
static e8kv_kv_input kv_input(int32_t dtype, int begin, int count) {
  e8kv_kv_input kv;
  int l, i;
  memset(&kv, 0, sizeof kv);
  kv.dtype = dtype;
  kv.n_tokens = count;
  kv.first_position = begin;
  for (l = 0; l < kLayers; ++l) {
    if (dtype == E8KV_DTYPE_F32) {
      g_seq.key_ptrs[l] = g_seq.keys[l] + begin * kRow;
      g_seq.value_ptrs[l] = g_seq.values[l] + begin * kRow;
    } else {
      for (i = 0; i < kTokens * kRow; ++i) {
        g_seq.keys16[l][i] = dtype == E8KV_DTYPE_F16 ? f16_bits(g_seq.keys[l][i]) : bf16_bits(g_seq.keys[l][i]);
        g_seq.values16[l][i] = dtype == E8KV_DTYPE_F16 ? f16_bits(g_seq.values[l][i]) : bf16_bits(g_seq.values[l][i]);
      }
      g_seq.key_ptrs[l] = g_seq.keys16[l] + begin * kRow;
      g_seq.value_ptrs[l] = g_seq.values16[l] + begin * kRow;
    }
  }
  kv.keys = g_seq.key_ptrs;
  kv.values = g_seq.value_ptrs;
  return kv;
}

static e8kv_query_input query_input(int32_t dtype) {
  e8kv_query_input q;
  int l, i;
  memset(&q, 0, sizeof q);
  q.dtype = dtype;
  q.n_queries = kWindow;
  for (l = 0; l < kLayers; ++l) {
    if (dtype == E8KV_DTYPE_F32) {
      g_seq.query_ptrs[l] = g_seq.queries[l];
    } else {
      for (i = 0; i < kWindow * kQRow; ++i)
        g_seq.queries16[l][i] = dtype == E8KV_DTYPE_F16 ? f16_bits(g_seq.queries[l][i]) : bf16_bits(g_seq.queries[l][i]);
      g_seq.query_ptrs[l] = g_seq.queries16[l];
    }
  }
  q.queries = g_seq.query_ptrs;
  return q;
}

static e8kv_compressor* make_compressor(const char* spec) {
  e8kv_model_shape shape = {kLayers, kKvHeads, kQHeads, kDim};
  e8kv_compressor* c = NULL;
  CHECK_OK(e8kv_compressor_create(&shape, spec, &c));
  return c;
}

/* A decode query (post-RoPE), a quarter the size of keys as the observation queries. */
static void make_query(float* q, int n_tokens) {
  int i;
  for (i = 0; i < n_tokens * kQRow; ++i) q[i] = next_value() / 4.0f;
}

/* The container of a cache (caller frees with e8kv_free). */
static unsigned char* serialize(const e8kv_cache* cache, size_t* size) {
  void* blob = NULL;
  CHECK_OK(e8kv_serialize_alloc(cache, &blob, size));
  return (unsigned char*)blob;
}

static int same_container(const e8kv_cache* a, const e8kv_cache* b) {
  size_t na = 0, nb = 0;
  unsigned char* x = serialize(a, &na);
  unsigned char* y = serialize(b, &nb);
  int same = x != NULL && y != NULL && na == nb && memcmp(x, y, na) == 0;
  e8kv_free(x);
  e8kv_free(y);
  return same;
}

/* Attention of one query token over the decompressed layer(s), in double: the reference the
 * codes-reading kernel must reproduce. Any number of caches (disjoint key sets) at once. */
static void reference_attention(const e8kv_cache* const* caches, int n_caches, int layer, const float* q, float* out,
                                float* lse) {
  const int group = kQHeads / kKvHeads;
  const double scale = 1.0 / sqrt((double)kDim);
  int h, c, i, t;
  for (h = 0; h < kQHeads; ++h) {
    double max_logit = -INFINITY, denominator = 0.0, acc[kDim];
    const int kv_head = h / group;
    for (i = 0; i < kDim; ++i) acc[i] = 0.0;
    for (c = 0; c < n_caches; ++c) { /* pass 1: the largest logit */
      int32_t first = 0;
      int64_t n = 0;
      float *k, *v, *mask;
      CHECK_OK(e8kv_cache_layer_extent(caches[c], layer, &first, &n));
      k = (float*)malloc((size_t)(n ? n : 1) * kRow * sizeof(float));
      v = (float*)malloc((size_t)(n ? n : 1) * kRow * sizeof(float));
      mask = (float*)malloc((size_t)(n ? n : 1) * kKvHeads * sizeof(float));
      CHECK_OK(e8kv_decompress_layer(caches[c], layer, n, NULL, k, v, mask));
      for (t = 0; t < n; ++t) {
        double logit = 0.0;
        if (mask[kv_head * n + t] != 0.0f) continue;
        for (i = 0; i < kDim; ++i) logit += (double)q[h * kDim + i] * k[(t * kKvHeads + kv_head) * kDim + i];
        logit *= scale;
        if (logit > max_logit) {
          const double rescale = exp(max_logit - logit);
          denominator *= rescale;
          for (i = 0; i < kDim; ++i) acc[i] *= rescale;
          max_logit = logit;
        }
        denominator += exp(logit - max_logit);
        for (i = 0; i < kDim; ++i) acc[i] += exp(logit - max_logit) * v[(t * kKvHeads + kv_head) * kDim + i];
      }
      free(k);
      free(v);
      free(mask);
    }
    for (i = 0; i < kDim; ++i) out[h * kDim + i] = denominator > 0 ? (float)(acc[i] / denominator) : 0.0f;
    lse[h] = denominator > 0 ? (float)(max_logit + log(denominator)) : -INFINITY;
  }
}

/* Largest |a - b| / (1 + |b|) over n floats. */
static double max_relative_difference(const float* a, const float* b, int n) {
  double worst = 0.0;
  int i;
  for (i = 0; i < n; ++i) {
    const double d = fabs((double)a[i] - b[i]) / (1.0 + fabs((double)b[i]));
    if (!(d <= worst)) worst = d; /* NaN propagates as a failure */
  }
  return worst;
}

/* Float rounding of the kernel (rotated domain, fp32 sums) against the double reference: 50x the
 * largest difference measured here (4e-7), and far below any real mistake (a missing half of the
 * tokens moves outputs by 0.9 here; a wrong token, head or scale by 1e-2 or more). */
static const double kAttendTolerance = 2e-5;

/* ---- tests ----------------------------------------------------------------------------------- */

static void test_versions(void) {
  char expected[32];
  const int32_t v = e8kv_version();
  snprintf(expected, sizeof expected, "%d.%d.%d", (int)(v / 10000), (int)(v / 100 % 100), (int)(v % 100));
  CHECK(strcmp(e8kv_version_string(), expected) == 0);
  CHECK(e8kv_format_version() >= 3); /* this library writes the RoPE-residual key frame (version 3) */
  CHECK(strcmp(e8kv_status_name(E8KV_OK), "ok") == 0);
  CHECK(strcmp(e8kv_status_name(E8KV_ERROR_CORRUPT_DATA), "corrupt data") == 0);
  CHECK(strcmp(e8kv_status_name(E8KV_ERROR_INTERNAL), "internal error") == 0);
  CHECK(strcmp(e8kv_status_name(99), "unknown status") == 0);
  CHECK(strcmp(e8kv_status_name(-1), "unknown status") == 0);
}

/* compress (with eviction) -> attend equals attention over the decompressed layer; decompress
 * masks exactly the evicted positions; the size figures agree with each other. */
static void test_compress_attend_decompress(void) {
  e8kv_compressor* c = make_compressor("preset=high"); /* K3V2 + 35 % eviction, scored by queries */
  e8kv_kv_input kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  e8kv_query_input queries = query_input(E8KV_DTYPE_F32);
  e8kv_cache* cache = NULL;
  float q[kQRow], out[kQRow], lse[kQHeads], ref_out[kQRow], ref_lse[kQHeads];
  int layer, h, t;
  uint64_t bytes = 0;
  double bits = 0, ratio = 0;
  int64_t original = 0;
  CHECK_OK(e8kv_compress(c, &kv, &queries, NULL, &cache));
  CHECK(cache != NULL);
  if (!cache) return;
  for (layer = 0; layer < kLayers; ++layer) {
    int32_t first = -1;
    int64_t n = -1;
    float *mask, *keys;
    int32_t* rows;
    make_query(q, 1);
    CHECK_OK(e8kv_attend(cache, layer, q, kTokens, out, lse, NULL));
    {
      const e8kv_cache* only[1];
      only[0] = cache;
      reference_attention(only, 1, layer, q, ref_out, ref_lse);
    }
    CHECK(max_relative_difference(out, ref_out, kQRow) < kAttendTolerance);
    CHECK(max_relative_difference(lse, ref_lse, kQHeads) < kAttendTolerance);

    CHECK_OK(e8kv_cache_layer_extent(cache, layer, &first, &n));
    CHECK(first == 0);                /* sinks are always kept */
    CHECK(n >= 1 && n <= kTokens);    /* one row per position some head stores */
    mask = (float*)malloc((size_t)n * kKvHeads * sizeof(float));
    keys = (float*)malloc((size_t)n * kRow * sizeof(float));
    rows = (int32_t*)malloc((size_t)n * sizeof(int32_t));
    CHECK_OK(e8kv_decompress_layer(cache, layer, n, rows, keys, NULL, mask));
    CHECK(rows[0] == 0 && rows[n - 1] == kTokens - 1); /* sinks and the recent window are kept */
    for (t = 1; t < n; ++t) CHECK(rows[t] > rows[t - 1]);
    for (t = 0; t < n; ++t) { /* every row is stored by at least one head */
      int any = 0;
      for (h = 0; h < kKvHeads; ++h) any |= mask[h * n + t] == 0.0f;
      CHECK(any);
    }
    for (h = 0; h < kKvHeads; ++h) {
      int64_t stored = 0, present = 0, evicted_zero = 1;
      CHECK_OK(e8kv_cache_stored_tokens(cache, layer, h, &stored));
      for (t = 0; t < n; ++t) {
        const float m = mask[h * n + t];
        CHECK(m == 0.0f || (isinf(m) && m < 0));
        if (m == 0.0f) {
          ++present;
        } else if (keys[(t * kKvHeads + h) * kDim] != 0.0f) {
          evicted_zero = 0;
        }
      }
      CHECK(present == stored);
      CHECK(stored < kTokens);              /* 35 % eviction removed tokens */
      CHECK(stored >= kTokens * 6 / 10);    /* ... about 35 %, not all */
      CHECK(evicted_zero);
    }
    free(mask);
    free(keys);
    free(rows);
  }
  CHECK_OK(e8kv_cache_bytes(cache, &bytes));
  CHECK_OK(e8kv_cache_bits_per_element(cache, &bits));
  CHECK_OK(e8kv_cache_compression_ratio(cache, &ratio));
  CHECK_OK(e8kv_cache_original_tokens(cache, &original));
  CHECK(original == kTokens);
  CHECK(bytes > 0);
  CHECK(fabs(bits - 8.0 * (double)bytes / ((double)kTokens * kLayers * kKvHeads * kDim * 2)) < 1e-9);
  CHECK(fabs(ratio * bits - 16.0) < 1e-9); /* both against the same fp16 baseline */
  CHECK(bits > 0.5 && bits < 16.0);
  {
    e8kv_model_shape shape = {0, 0, 0, 0};
    CHECK_OK(e8kv_cache_shape(cache, &shape));
    CHECK(shape.n_layers == kLayers && shape.n_kv_heads == kKvHeads && shape.n_q_heads == kQHeads &&
          shape.head_dim == kDim);
  }
  e8kv_cache_destroy(cache);
  e8kv_compressor_destroy(c);
}

/* f32, fp16 and bf16 inputs holding the same numbers give the same cache byte for byte. */
static void test_dtypes(void) {
  e8kv_compressor* c = make_compressor("preset=quant-k3v2");
  e8kv_cache* caches[3] = {NULL, NULL, NULL};
  const int32_t dtypes[3] = {E8KV_DTYPE_F32, E8KV_DTYPE_F16, E8KV_DTYPE_BF16};
  int i;
  for (i = 0; i < 3; ++i) {
    e8kv_kv_input kv = kv_input(dtypes[i], 0, kTokens);
    e8kv_query_input queries = query_input(dtypes[i]);
    CHECK_OK(e8kv_compress(c, &kv, &queries, NULL, &caches[i]));
  }
  if (caches[0] && caches[1] && caches[2]) {
    CHECK(same_container(caches[0], caches[1]));
    CHECK(same_container(caches[0], caches[2]));
  }
  for (i = 0; i < 3; ++i) e8kv_cache_destroy(caches[i]);
  e8kv_compressor_destroy(c);
}

/* compress -> serialize -> deserialize -> attend: bit-identical outputs and lse; the caller-buffer
 * and allocating serializers agree; the read-back cache appends like the original. */
static void test_serialize_round_trip(void) {
  e8kv_compressor* c = make_compressor("preset=asym");
  e8kv_kv_input kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  e8kv_query_input queries = query_input(E8KV_DTYPE_F32);
  e8kv_cache *cache = NULL, *back = NULL, *back_shared = NULL;
  size_t size = 0, written = 0, alloc_size = 0, bound = 0;
  unsigned char *buffer, *alloc_blob;
  float q[kQRow], out[kQRow], lse[kQHeads], out2[kQRow], lse2[kQHeads];
  int layer;
  CHECK_OK(e8kv_compress(c, &kv, &queries, NULL, &cache));
  if (!cache) return;
  CHECK_OK(e8kv_serialized_size(cache, &size));
  CHECK(size > 0);
  CHECK_OK(e8kv_serialized_size_bound(cache, &bound));
  CHECK(bound >= size);
  buffer = (unsigned char*)malloc(size);
  CHECK_OK(e8kv_serialize(cache, buffer, size, &written)); /* exactly the size: enough */
  CHECK(written == size);
  alloc_blob = serialize(cache, &alloc_size);
  CHECK(alloc_size == size && alloc_blob != NULL && memcmp(alloc_blob, buffer, size) == 0);
  CHECK(size >= 10 && (int)(buffer[8] | buffer[9] << 8) <= e8kv_format_version());

  CHECK_OK(e8kv_deserialize(buffer, size, NULL, &back));
  CHECK_OK(e8kv_deserialize(buffer, size, c, &back_shared));
  if (back && back_shared) {
    for (layer = 0; layer < kLayers; ++layer) {
      make_query(q, 1);
      CHECK_OK(e8kv_attend(cache, layer, q, kTokens, out, lse, NULL));
      CHECK_OK(e8kv_attend(back, layer, q, kTokens, out2, lse2, NULL));
      CHECK(memcmp(out, out2, sizeof out) == 0 && memcmp(lse, lse2, sizeof lse) == 0);
      CHECK_OK(e8kv_attend(back_shared, layer, q, kTokens, out2, lse2, NULL));
      CHECK(memcmp(out, out2, sizeof out) == 0 && memcmp(lse, lse2, sizeof lse) == 0);
    }
    CHECK(same_container(cache, back));
    /* Decode goes on after the transfer exactly as it would have on the original. */
    for (layer = 0; layer < kLayers; ++layer) {
      const float* k = g_seq.keys[layer];
      const float* v = g_seq.values[layer];
      CHECK_OK(e8kv_append(c, cache, layer, E8KV_DTYPE_F32, k, v, kTokens));
      CHECK_OK(e8kv_append(c, back, layer, E8KV_DTYPE_F32, k, v, kTokens));
      CHECK_OK(e8kv_append(c, back_shared, layer, E8KV_DTYPE_F32, k, v, kTokens));
    }
    CHECK(same_container(cache, back));
    CHECK(same_container(cache, back_shared));
  }
  free(buffer);
  e8kv_free(alloc_blob);
  e8kv_cache_destroy(cache);
  e8kv_cache_destroy(back);
  e8kv_cache_destroy(back_shared);
  e8kv_compressor_destroy(c);
}

/* Compressing a prefix and appending the rest token by token (fp16 here) gives the cache that
 * compressing everything at once gives, byte for byte; attend works between appends. */
static void test_append(void) {
  e8kv_compressor* c = make_compressor("preset=quant-k3v2");
  e8kv_kv_input all = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  e8kv_kv_input prefix = kv_input(E8KV_DTYPE_F32, 0, 70);
  e8kv_cache *whole = NULL, *grown = NULL;
  uint16_t k16[kRow], v16[kRow];
  float q[kQRow], out[kQRow], lse[kQHeads];
  int t, layer, i;
  CHECK_OK(e8kv_compress(c, &all, NULL, NULL, &whole));
  CHECK_OK(e8kv_compress(c, &prefix, NULL, NULL, &grown));
  if (!whole || !grown) return;
  for (t = 70; t < kTokens; ++t)
    for (layer = 0; layer < kLayers; ++layer) {
      for (i = 0; i < kRow; ++i) {
        k16[i] = f16_bits(g_seq.keys[layer][t * kRow + i]);
        v16[i] = f16_bits(g_seq.values[layer][t * kRow + i]);
      }
      CHECK_OK(e8kv_append(c, grown, layer, E8KV_DTYPE_F16, k16, v16, t));
      make_query(q, 1);
      CHECK_OK(e8kv_attend(grown, layer, q, t, out, lse, NULL));
      CHECK(isfinite(lse[0]) && isfinite(out[0]));
    }
  CHECK(same_container(whole, grown));
  e8kv_cache_destroy(whole);
  e8kv_cache_destroy(grown);
  e8kv_compressor_destroy(c);
}

/* Multi-turn: compress then extend by a later chunk (first_position, then explicit positions)
 * equals compressing both at once when nothing is evicted. */
static void test_extend(void) {
  e8kv_compressor* c = make_compressor("preset=quant-k4v2");
  e8kv_kv_input all = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  e8kv_kv_input first = kv_input(E8KV_DTYPE_F32, 0, 40);
  e8kv_kv_input second;
  e8kv_cache *whole = NULL, *turns = NULL;
  int32_t positions[kTokens - 40];
  int i;
  CHECK_OK(e8kv_compress(c, &all, NULL, NULL, &whole));
  CHECK_OK(e8kv_compress(c, &first, NULL, NULL, &turns));
  if (!whole || !turns) return;
  second = kv_input(E8KV_DTYPE_F32, 40, 30); /* tokens 40..69 at first_position 40 */
  CHECK_OK(e8kv_extend(c, turns, &second, NULL, NULL));
  second = kv_input(E8KV_DTYPE_F32, 70, kTokens - 70); /* the rest with explicit positions */
  for (i = 0; i < kTokens - 70; ++i) positions[i] = 70 + i;
  second.positions = positions;
  second.first_position = 12345; /* ignored when positions are given */
  CHECK_OK(e8kv_extend(c, turns, &second, NULL, NULL));
  CHECK(same_container(whole, turns));
  e8kv_cache_destroy(whole);
  e8kv_cache_destroy(turns);
  e8kv_compressor_destroy(c);
}

/* Sliding window: e8kv_drop_before removes the tokens below a position from every layer; the
 * rest decode as before, appends go on, and a NULL cache is an error. */
static void test_drop_before(void) {
  e8kv_compressor* c = make_compressor("preset=quant-k3v2,fp16_tier=0.05,scorer=key-key"); /* no queries here */
  e8kv_kv_input all = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  e8kv_cache* cache = NULL;
  int64_t stored = 0, after = 0, n = 0;
  int32_t first = 0, layer;
  CHECK_OK(e8kv_compress(c, &all, NULL, NULL, &cache));
  if (!cache) return;
  CHECK_OK(e8kv_cache_stored_tokens(cache, 0, 0, &stored));
  CHECK(stored == kTokens);
  CHECK_OK(e8kv_drop_before(c, cache, 30));
  CHECK_OK(e8kv_cache_stored_tokens(cache, 0, 0, &after));
  CHECK(after == kTokens - 30);
  for (layer = 0; layer < kLayers; ++layer) {
    CHECK_OK(e8kv_cache_layer_extent(cache, layer, &first, &n));
    CHECK(first == 30 && n == kTokens - 30);
  }
  CHECK(e8kv_drop_before(c, NULL, 30) == E8KV_ERROR_INVALID_ARGUMENT);
  CHECK(e8kv_drop_before(NULL, cache, 30) == E8KV_ERROR_INVALID_ARGUMENT);
  e8kv_cache_destroy(cache);
  e8kv_compressor_destroy(c);
}

/* Two caches holding disjoint halves of a sequence: merging their attentions by lse equals the
 * attention over both; e8kv_attend_batch over several caches and query tokens (with and without
 * a pool) is bit-identical to e8kv_attend token by token. */
static void test_lse_merge_and_batch(void) {
  e8kv_compressor* c = make_compressor("preset=quant-k3v2");
  e8kv_kv_input first_half = kv_input(E8KV_DTYPE_F32, 0, 48);
  e8kv_kv_input second_half;
  e8kv_cache* halves[2] = {NULL, NULL};
  e8kv_thread_pool* pool = NULL;
  enum { kQueryTokens = 3 };
  float q[kQueryTokens * kQRow];
  float out_a[kQRow], lse_a[kQHeads], out_b[kQRow], lse_b[kQHeads], merged[kQRow], merged_lse[kQHeads];
  float ref_out[kQRow], ref_lse[kQHeads];
  float batch_out[2][kQueryTokens * kQRow], batch_lse[2][kQueryTokens * kQHeads];
  int32_t query_positions[kQueryTokens] = {kTokens, kTokens + 1, kTokens + 2};
  e8kv_attend_request requests[2];
  int layer, r, t, use_pool;
  CHECK_OK(e8kv_compress(c, &first_half, NULL, NULL, &halves[0]));
  second_half = kv_input(E8KV_DTYPE_F32, 48, kTokens - 48);
  CHECK_OK(e8kv_compress(c, &second_half, NULL, NULL, &halves[1]));
  CHECK_OK(e8kv_thread_pool_create(3, &pool));
  if (!halves[0] || !halves[1] || !pool) return;
  for (layer = 0; layer < kLayers; ++layer) {
    make_query(q, kQueryTokens);
    CHECK_OK(e8kv_attend(halves[0], layer, q, kTokens, out_a, lse_a, NULL));
    CHECK_OK(e8kv_attend(halves[1], layer, q, kTokens, out_b, lse_b, NULL));
    CHECK_OK(e8kv_merge_attention(out_a, lse_a, out_b, lse_b, kQHeads, kDim, merged, merged_lse));
    {
      const e8kv_cache* both[2];
      both[0] = halves[0];
      both[1] = halves[1];
      reference_attention(both, 2, layer, q, ref_out, ref_lse);
    }
    CHECK(max_relative_difference(merged, ref_out, kQRow) < kAttendTolerance);
    CHECK(max_relative_difference(merged_lse, ref_lse, kQHeads) < kAttendTolerance);
    /* Each half alone differs from the whole: the merge did combine two parts. */
    CHECK(max_relative_difference(out_a, ref_out, kQRow) > 1e-3);
    CHECK(max_relative_difference(out_b, ref_out, kQRow) > 1e-3);
    /* In place: out and lse may alias out_a and lse_a. */
    CHECK_OK(e8kv_merge_attention(out_a, lse_a, out_b, lse_b, kQHeads, kDim, out_a, lse_a));
    CHECK(memcmp(out_a, merged, sizeof merged) == 0 && memcmp(lse_a, merged_lse, sizeof merged_lse) == 0);

    for (use_pool = 0; use_pool < 2; ++use_pool) {
      for (r = 0; r < 2; ++r) {
        requests[r].cache = halves[r];
        requests[r].layer = layer;
        requests[r].n_tokens = kQueryTokens;
        requests[r].q = q;
        requests[r].out = batch_out[r];
        requests[r].lse = batch_lse[r];
        requests[r].positions = query_positions;
      }
      memset(batch_out, 0, sizeof batch_out);
      CHECK_OK(e8kv_attend_batch(requests, 2, use_pool ? pool : NULL));
      for (r = 0; r < 2; ++r)
        for (t = 0; t < kQueryTokens; ++t) {
          float one_out[kQRow], one_lse[kQHeads];
          CHECK_OK(e8kv_attend(halves[r], layer, q + t * kQRow, query_positions[t], one_out, one_lse,
                               use_pool ? pool : NULL));
          CHECK(memcmp(one_out, batch_out[r] + t * kQRow, sizeof one_out) == 0);
          CHECK(memcmp(one_lse, batch_lse[r] + t * kQHeads, sizeof one_lse) == 0);
        }
    }
  }
  CHECK_OK(e8kv_attend_batch(NULL, 0, NULL)); /* an empty batch is a no-op */
  e8kv_thread_pool_destroy(pool);
  e8kv_cache_destroy(halves[0]);
  e8kv_cache_destroy(halves[1]);
  e8kv_compressor_destroy(c);
}

/* A pool changes nothing in what compress writes. */
static void test_thread_pool(void) {
  e8kv_compressor* c = make_compressor("preset=balanced");
  e8kv_kv_input kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  e8kv_query_input queries = query_input(E8KV_DTYPE_F32);
  e8kv_thread_pool* pool = NULL;
  e8kv_cache *serial = NULL, *parallel = NULL;
  CHECK_OK(e8kv_thread_pool_create(4, &pool));
  CHECK_OK(e8kv_compress(c, &kv, &queries, NULL, &serial));
  CHECK_OK(e8kv_compress(c, &kv, &queries, pool, &parallel));
  if (serial && parallel) CHECK(same_container(serial, parallel));
  e8kv_cache_destroy(serial);
  e8kv_cache_destroy(parallel);
  e8kv_thread_pool_destroy(pool);
  e8kv_compressor_destroy(c);
}

/* A cache of no tokens: attention gives 0 and lse -inf, the extent is empty, sizes are 0 per
 * element; describe reproduces the configuration. */
static void test_empty_cache_and_describe(void) {
  e8kv_compressor* c = make_compressor("preset=quant-k2v2,evict=0.25");
  e8kv_kv_input none = kv_input(E8KV_DTYPE_F32, 0, 0);
  e8kv_cache* cache = NULL;
  float q[kQRow], out[kQRow], lse[kQHeads];
  int32_t first = -1;
  int64_t n = -1;
  double bits = -1;
  size_t length = 0;
  char* text;
  int i;
  CHECK_OK(e8kv_compress(c, &none, NULL, NULL, &cache));
  if (!cache) return;
  make_query(q, 1);
  for (i = 0; i < kQRow; ++i) out[i] = 1.0f;
  CHECK_OK(e8kv_attend(cache, 0, q, 0, out, lse, NULL));
  for (i = 0; i < kQRow; ++i) CHECK(out[i] == 0.0f);
  for (i = 0; i < kQHeads; ++i) CHECK(isinf(lse[i]) && lse[i] < 0);
  CHECK_OK(e8kv_cache_layer_extent(cache, 1, &first, &n));
  CHECK(first == 0 && n == 0);
  CHECK_OK(e8kv_decompress_layer(cache, 1, 0, NULL, NULL, NULL, NULL));
  CHECK_OK(e8kv_cache_bits_per_element(cache, &bits));
  CHECK(bits == 0.0);

  CHECK_OK(e8kv_compressor_describe(c, NULL, 0, &length));
  CHECK(length > 0);
  text = (char*)malloc(length + 1);
  CHECK_OK(e8kv_compressor_describe(c, text, length + 1, &length));
  CHECK(strlen(text) == length && strstr(text, "evict=0.25") != NULL);
  {  /* the description makes an equal compressor: its caches read back with it */
    e8kv_compressor* again = make_compressor(text);
    e8kv_kv_input kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
    e8kv_query_input queries = query_input(E8KV_DTYPE_F32);
    e8kv_cache *a = NULL, *b = NULL;
    CHECK_OK(e8kv_compress(c, &kv, &queries, NULL, &a));
    CHECK_OK(e8kv_compress(again, &kv, &queries, NULL, &b));
    if (a && b) CHECK(same_container(a, b));
    e8kv_cache_destroy(a);
    e8kv_cache_destroy(b);
    e8kv_compressor_destroy(again);
  }
  free(text);
  e8kv_cache_destroy(cache);
  e8kv_compressor_destroy(c);
}

/* ---- error paths ------------------------------------------------------------------------------ */

static void test_errors_null_pointers(void) {
  e8kv_model_shape shape = {kLayers, kKvHeads, kQHeads, kDim};
  e8kv_compressor* c = make_compressor("preset=quant-k3v2");
  e8kv_compressor* not_made = (e8kv_compressor*)&shape; /* must come back NULL */
  e8kv_cache* cache = NULL;
  e8kv_cache* not_made_cache = (e8kv_cache*)&shape;
  e8kv_kv_input kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  float q[kQRow], out[kQRow], lse[kQHeads];
  size_t size = 0;
  void* blob = &size;
  CHECK_FAILS(e8kv_compressor_create(NULL, "", &not_made), E8KV_ERROR_INVALID_ARGUMENT, "shape is NULL");
  CHECK(not_made == NULL);
  CHECK_FAILS(e8kv_compressor_create(&shape, NULL, &not_made), E8KV_ERROR_INVALID_ARGUMENT, "spec is NULL");
  CHECK_FAILS(e8kv_compressor_create(&shape, "", NULL), E8KV_ERROR_INVALID_ARGUMENT, "compressor (the output)");
  CHECK_FAILS(e8kv_compress(NULL, &kv, NULL, NULL, &not_made_cache), E8KV_ERROR_INVALID_ARGUMENT, "compressor is NULL");
  CHECK(not_made_cache == NULL);
  CHECK_FAILS(e8kv_compress(c, NULL, NULL, NULL, &cache), E8KV_ERROR_INVALID_ARGUMENT, "kv is NULL");
  CHECK_FAILS(e8kv_compress(c, &kv, NULL, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT, "cache (the output)");
  kv.keys = NULL;
  CHECK_FAILS(e8kv_compress(c, &kv, NULL, NULL, &cache), E8KV_ERROR_INVALID_ARGUMENT, "kv->keys");
  kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  g_seq.value_ptrs[1] = NULL;
  CHECK_FAILS(e8kv_compress(c, &kv, NULL, NULL, &cache), E8KV_ERROR_INVALID_ARGUMENT, "kv->values[1]");
  kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  CHECK_OK(e8kv_compress(c, &kv, NULL, NULL, &cache));
  if (!cache) return;
  make_query(q, 1);
  CHECK_FAILS(e8kv_attend(NULL, 0, q, kTokens, out, lse, NULL), E8KV_ERROR_INVALID_ARGUMENT, "cache is NULL");
  CHECK_FAILS(e8kv_attend(cache, 0, NULL, kTokens, out, lse, NULL), E8KV_ERROR_INVALID_ARGUMENT, "q or out is NULL");
  CHECK_FAILS(e8kv_attend(cache, 0, q, kTokens, NULL, lse, NULL), E8KV_ERROR_INVALID_ARGUMENT, "q or out is NULL");
  CHECK_OK(e8kv_attend(cache, 0, q, kTokens, out, NULL, NULL)); /* lse is optional */
  CHECK_FAILS(e8kv_append(c, cache, 0, E8KV_DTYPE_F32, NULL, g_seq.values[0], kTokens), E8KV_ERROR_INVALID_ARGUMENT,
              "key or value is NULL");
  CHECK_FAILS(e8kv_extend(c, NULL, &kv, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT, "cache is NULL");
  CHECK_FAILS(e8kv_serialized_size(cache, NULL), E8KV_ERROR_INVALID_ARGUMENT, "size (the output) is NULL");
  CHECK_FAILS(e8kv_serialize_alloc(NULL, &blob, &size), E8KV_ERROR_INVALID_ARGUMENT, "cache is NULL");
  CHECK(blob == NULL);
  CHECK_FAILS(e8kv_deserialize(NULL, 100, NULL, &not_made_cache), E8KV_ERROR_INVALID_ARGUMENT,
              "data is NULL with size > 0");
  CHECK_FAILS(e8kv_merge_attention(out, lse, NULL, lse, kQHeads, kDim, out, lse), E8KV_ERROR_INVALID_ARGUMENT,
              "must not be NULL");
  CHECK_FAILS(e8kv_cache_layer_extent(cache, 0, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT, "first_position or n_tokens");
  CHECK_FAILS(e8kv_thread_pool_create(2, NULL), E8KV_ERROR_INVALID_ARGUMENT, "pool (the output)");
  CHECK_FAILS(e8kv_attend_batch(NULL, 2, NULL), E8KV_ERROR_INVALID_ARGUMENT, "requests is NULL");
  /* Destroying NULL handles is a no-op. */
  e8kv_cache_destroy(NULL);
  e8kv_compressor_destroy(NULL);
  e8kv_thread_pool_destroy(NULL);
  e8kv_free(NULL);
  e8kv_cache_destroy(cache);
  e8kv_compressor_destroy(c);
}

static void test_errors_spec_and_shape(void) {
  e8kv_model_shape shape = {kLayers, kKvHeads, kQHeads, kDim};
  e8kv_compressor* c = NULL;
  CHECK_FAILS(e8kv_compressor_create(&shape, "preset=nope", &c), E8KV_ERROR_INVALID_ARGUMENT, "quant-k3v2");
  CHECK_FAILS(e8kv_compressor_create(&shape, "evict=2", &c), E8KV_ERROR_INVALID_ARGUMENT, "evict");
  CHECK_FAILS(e8kv_compressor_create(&shape, "bogus=1", &c), E8KV_ERROR_INVALID_ARGUMENT, "bogus");
  CHECK_FAILS(e8kv_compressor_create(&shape, "key=rvq9", &c), E8KV_ERROR_INVALID_ARGUMENT, "rvq3");
  CHECK_FAILS(e8kv_compressor_create(&shape, "seed=abc", &c), E8KV_ERROR_INVALID_ARGUMENT, "seed");
  CHECK(c == NULL);
  shape.head_dim = 100;
  CHECK_FAILS(e8kv_compressor_create(&shape, "", &c), E8KV_ERROR_UNSUPPORTED, "64, 80, 96, 128, 256");
  shape.head_dim = kDim;
  shape.n_q_heads = 3;
  CHECK_FAILS(e8kv_compressor_create(&shape, "", &c), E8KV_ERROR_INVALID_ARGUMENT, "n_q_heads");
  shape.n_q_heads = kQHeads;
  shape.n_layers = 0;
  CHECK_FAILS(e8kv_compressor_create(&shape, "", &c), E8KV_ERROR_INVALID_ARGUMENT, "n_layers");
  shape.n_layers = kLayers;
  CHECK_FAILS(e8kv_thread_pool_create(0, NULL), E8KV_ERROR_INVALID_ARGUMENT, "pool (the output)");
  {
    e8kv_thread_pool* pool = NULL;
    CHECK_FAILS(e8kv_thread_pool_create(0, &pool), E8KV_ERROR_INVALID_ARGUMENT, "1 .. 1024");
    CHECK(pool == NULL);
  }
  CHECK_OK(e8kv_compressor_create(&shape, "", &c)); /* "" is the default configuration */
  e8kv_compressor_destroy(c);
}

/* Arguments that disagree with the model or the cache. */
static void test_errors_wrong_shapes(void) {
  e8kv_compressor* c = make_compressor("preset=quant-k3v2");
  e8kv_compressor* other = make_compressor("preset=quant-k2v2");
  e8kv_kv_input kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  e8kv_query_input queries = query_input(E8KV_DTYPE_F32);
  e8kv_cache *cache = NULL, *back = NULL;
  float q[kQRow], out[kQRow];
  unsigned char* blob;
  size_t size = 0;
  int32_t first = 0;
  int64_t n = 0;
  float* dense;
  e8kv_attend_request request;
  CHECK_OK(e8kv_compress(c, &kv, NULL, NULL, &cache));
  if (!cache) return;
  make_query(q, 1);
  CHECK_FAILS(e8kv_attend(cache, kLayers, q, kTokens, out, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT,
              "layer 2 is outside [0, 2)");
  CHECK_FAILS(e8kv_append(c, cache, -1, E8KV_DTYPE_F32, g_seq.keys[0], g_seq.values[0], kTokens),
              E8KV_ERROR_INVALID_ARGUMENT, "layer -1 is outside [0, 2)");
  CHECK_FAILS(e8kv_cache_stored_tokens(cache, 0, kKvHeads, &n), E8KV_ERROR_INVALID_ARGUMENT, "kv_head 2 is outside");
  CHECK_FAILS(e8kv_append(c, cache, 0, 7, g_seq.keys[0], g_seq.values[0], kTokens), E8KV_ERROR_INVALID_ARGUMENT,
              "dtype is 7; accepted: E8KV_DTYPE_F32 (0)");
  kv.dtype = 3;
  CHECK_FAILS(e8kv_compress(c, &kv, NULL, NULL, &back), E8KV_ERROR_INVALID_ARGUMENT, "kv->dtype is 3");
  kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  kv.n_tokens = -1;
  CHECK_FAILS(e8kv_compress(c, &kv, NULL, NULL, &back), E8KV_ERROR_INVALID_ARGUMENT, "kv->n_tokens is -1");
  kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  queries.n_queries = 0;
  CHECK_FAILS(e8kv_compress(c, &kv, &queries, NULL, &back), E8KV_ERROR_INVALID_ARGUMENT, "queries->n_queries is 0");
  queries = query_input(E8KV_DTYPE_F32);
  {  /* positions must increase */
    int32_t positions[kTokens];
    int i;
    for (i = 0; i < kTokens; ++i) positions[i] = i;
    positions[50] = 49;
    kv.positions = positions;
    CHECK_FAILS(e8kv_compress(c, &kv, NULL, NULL, &back), E8KV_ERROR_INVALID_ARGUMENT, "strictly increasing");
    kv.positions = NULL;
  }
  /* Decompression into a buffer of the wrong size. */
  CHECK_OK(e8kv_cache_layer_extent(cache, 0, &first, &n));
  dense = (float*)malloc((size_t)n * kRow * sizeof(float));
  CHECK_FAILS(e8kv_decompress_layer(cache, 0, n - 1, NULL, dense, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT,
              "stores 100 positions");
  free(dense);
  /* A batch request with an empty token range or a position before the stored ones. */
  request.cache = cache;
  request.layer = 0;
  request.n_tokens = 0;
  request.q = q;
  request.out = out;
  request.lse = NULL;
  request.positions = NULL;
  CHECK_FAILS(e8kv_attend_batch(&request, 1, NULL), E8KV_ERROR_INVALID_ARGUMENT, "requests[0].n_tokens is 0");
  {
    const int32_t early = 10;
    request.n_tokens = 1;
    request.positions = &early;
    CHECK_FAILS(e8kv_attend_batch(&request, 1, NULL), E8KV_ERROR_INVALID_ARGUMENT, "requests[0].positions[0] 10 precedes");
  }
  /* A container read for a compressor of another configuration. */
  blob = serialize(cache, &size);
  CHECK_FAILS(e8kv_deserialize(blob, size, other, &back), E8KV_ERROR_INVALID_ARGUMENT, "another configuration");
  CHECK_FAILS(e8kv_deserialize(blob, size, other, &back), E8KV_ERROR_INVALID_ARGUMENT, "codec");
  CHECK(back == NULL);
  /* A cache of another configuration cannot be appended to by this compressor. */
  CHECK_FAILS(e8kv_append(other, cache, 0, E8KV_DTYPE_F32, g_seq.keys[0], g_seq.values[0], kTokens),
              E8KV_ERROR_INVALID_ARGUMENT, "another layout");
  e8kv_free(blob);
  e8kv_cache_destroy(cache);
  e8kv_compressor_destroy(c);
  e8kv_compressor_destroy(other);
}

/* Non-finite inputs are rejected and leave the cache as it was; so are positions out of order,
 * including the one after a window that holds only pinned sinks. */
static void test_errors_nan_and_positions(void) {
  e8kv_compressor* c = make_compressor("preset=quant-k3v2");
  /* 4 sinks + 64 tokens: the 64 coded at once (mean_tokens), the window holds the sinks only. */
  e8kv_kv_input kv = kv_input(E8KV_DTYPE_F32, 0, 68);
  e8kv_cache *cache = NULL, *before = NULL, *rejected = NULL;
  float q[kQRow], out[kQRow];
  float bad_row[kRow];
  int32_t last_layer1 = 67;
  CHECK_OK(e8kv_compress(c, &kv, NULL, NULL, &cache));
  CHECK_OK(e8kv_compress(c, &kv, NULL, NULL, &before));
  if (!cache || !before) return;

  g_seq.values[1][5 * kRow + 3] = NAN;
  CHECK_FAILS(e8kv_compress(c, &kv, NULL, NULL, &rejected), E8KV_ERROR_INVALID_ARGUMENT, "non-finite");
  CHECK(strstr(e8kv_last_error(), "values of layer 1") != NULL);
  CHECK(rejected == NULL);
  g_seq.values[1][5 * kRow + 3] = 0.5f;
  {  /* extend with an infinity in a later chunk: rejected, cache unchanged */
    e8kv_kv_input later = kv_input(E8KV_DTYPE_F32, 68, 20);
    g_seq.keys[0][80 * kRow] = INFINITY;
    CHECK_FAILS(e8kv_extend(c, cache, &later, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT, "non-finite");
    g_seq.keys[0][80 * kRow] = 1.0f;
    CHECK(same_container(cache, before));
  }
  memcpy(bad_row, g_seq.keys[0], sizeof bad_row);
  bad_row[kDim + 1] = NAN;
  CHECK_FAILS(e8kv_append(c, cache, 0, E8KV_DTYPE_F32, bad_row, g_seq.values[0], 68), E8KV_ERROR_INVALID_ARGUMENT,
              "non-finite");
  CHECK(same_container(cache, before));
  make_query(q, 1);
  q[kDim * 2 + 7] = NAN;
  CHECK_FAILS(e8kv_attend(cache, 0, q, 68, out, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT, "non-finite query");

  /* Positions: the window holds sinks 0..3 only, the coded tokens reach 67. */
  CHECK_FAILS(e8kv_append(c, cache, 1, E8KV_DTYPE_F32, g_seq.keys[1], g_seq.values[1], 10),
              E8KV_ERROR_INVALID_ARGUMENT, "follow position 67");
  CHECK_FAILS(e8kv_append(c, cache, 1, E8KV_DTYPE_F32, g_seq.keys[1], g_seq.values[1], last_layer1),
              E8KV_ERROR_INVALID_ARGUMENT, "follow position 67");
  {
    e8kv_kv_input overlapping = kv_input(E8KV_DTYPE_F32, 30, 10);
    CHECK_FAILS(e8kv_extend(c, cache, &overlapping, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT,
                "first position 30 does not follow position 67");
  }
  make_query(q, 1);
  CHECK_FAILS(e8kv_attend(cache, 1, q, 20, out, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT,
              "position 20 precedes position 67");
  CHECK_FAILS(e8kv_attend(cache, 1, q, -1, out, NULL, NULL), E8KV_ERROR_INVALID_ARGUMENT,
              "position -1 is negative");
  CHECK(same_container(cache, before));
  CHECK_OK(e8kv_append(c, cache, 1, E8KV_DTYPE_F32, g_seq.keys[1], g_seq.values[1], 68));
  CHECK_OK(e8kv_attend(cache, 1, q, 68, out, NULL, NULL));
  e8kv_cache_destroy(cache);
  e8kv_cache_destroy(before);
  e8kv_compressor_destroy(c);
}

/* Damaged containers and buffers of the wrong size. */
static void test_errors_container(void) {
  e8kv_compressor* c = make_compressor("preset=quant-k3v2");
  e8kv_kv_input kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  e8kv_cache *cache = NULL, *back = NULL;
  unsigned char *blob, *copy;
  size_t size = 0, needed = 0, reported = 0;
  char fragment[64];
  CHECK_OK(e8kv_compress(c, &kv, NULL, NULL, &cache));
  if (!cache) return;
  blob = serialize(cache, &size);
  if (!blob) return;
  copy = (unsigned char*)malloc(size);

  memcpy(copy, blob, size);
  copy[size / 2] ^= 0x40u; /* one bit in a chunk */
  back = (e8kv_cache*)copy;
  CHECK_FAILS(e8kv_deserialize(copy, size, NULL, &back), E8KV_ERROR_CORRUPT_DATA, "checksum");
  CHECK(back == NULL);
  memcpy(copy, blob, size);
  copy[60] ^= 0x01u; /* one bit in the header's layout record */
  CHECK_FAILS(e8kv_deserialize(copy, size, NULL, &back), E8KV_ERROR_CORRUPT_DATA, "header checksum");
  memcpy(copy, blob, size);
  copy[0] = 'x';
  CHECK_FAILS(e8kv_deserialize(copy, size, NULL, &back), E8KV_ERROR_CORRUPT_DATA, "magic");
  CHECK_FAILS(e8kv_deserialize(blob, size - 1, NULL, &back), E8KV_ERROR_CORRUPT_DATA, "truncated");
  CHECK_FAILS(e8kv_deserialize(blob, 20, NULL, &back), E8KV_ERROR_CORRUPT_DATA, "too short");
  CHECK_FAILS(e8kv_deserialize(blob, 0, NULL, &back), E8KV_ERROR_CORRUPT_DATA, "too short");
  memcpy(copy, blob, size);
  copy[8] = 99; /* format version 99 */
  copy[9] = 0;
  CHECK_FAILS(e8kv_deserialize(copy, size, NULL, &back), E8KV_ERROR_UNSUPPORTED, "version 99 is newer");
  memcpy(copy, blob, size);
  copy[10] = 2; /* the plain kind */
  CHECK_FAILS(e8kv_deserialize(copy, size, NULL, &back), E8KV_ERROR_UNSUPPORTED, "plain");
  CHECK(back == NULL);
  CHECK_OK(e8kv_deserialize(blob, size, NULL, &back)); /* the undamaged blob reads */
  e8kv_cache_destroy(back);

  /* A caller buffer one byte short: refused, the needed size reported in *size and the message. */
  CHECK_OK(e8kv_serialized_size(cache, &needed));
  CHECK(needed == size);
  snprintf(fragment, sizeof fragment, "below the %zu bytes", needed);
  CHECK_FAILS(e8kv_serialize(cache, copy, size - 1, &reported), E8KV_ERROR_INVALID_ARGUMENT, fragment);
  CHECK(reported == needed);
  reported = 0;
  CHECK_FAILS(e8kv_serialize(cache, NULL, 0, &reported), E8KV_ERROR_INVALID_ARGUMENT, fragment);
  CHECK(reported == needed);
  {
    char small[4];
    size_t length = 0;
    CHECK_FAILS(e8kv_compressor_describe(c, small, sizeof small, &length), E8KV_ERROR_INVALID_ARGUMENT, "too small");
    CHECK(length > sizeof small);
  }
  free(copy);
  e8kv_free(blob);
  e8kv_cache_destroy(cache);
  e8kv_compressor_destroy(c);
}

#ifdef HAVE_PTHREADS
/* Threads attending to one cache at once, all through one pool (the documented guarantees:
 * reads of a cache may overlap; a pool may be passed by several threads). */
enum { kReaders = 4, kReads = 10 };
typedef struct Reader {
  const e8kv_cache* cache;
  e8kv_thread_pool* pool;
  const float* q;        /* [kReads, kQRow] */
  const float* expected; /* [kReads, kQRow] from the calling thread, without a pool */
  int mismatches;
} Reader;

static void* read_concurrently(void* arg) {
  Reader* r = (Reader*)arg;
  float out[kQRow];
  int i;
  for (i = 0; i < kReads; ++i) {
    if (e8kv_attend(r->cache, i % kLayers, r->q + i * kQRow, kTokens, out, NULL, r->pool) != E8KV_OK ||
        memcmp(out, r->expected + i * kQRow, sizeof out) != 0)
      ++r->mismatches;
  }
  return NULL;
}

static void test_concurrent_reads(void) {
  e8kv_compressor* c = make_compressor("preset=high");
  e8kv_kv_input kv = kv_input(E8KV_DTYPE_F32, 0, kTokens);
  e8kv_query_input queries = query_input(E8KV_DTYPE_F32);
  e8kv_cache* cache = NULL;
  e8kv_thread_pool* pool = NULL;
  static float q[kReads * kQRow], expected[kReads * kQRow];
  Reader readers[kReaders];
  pthread_t threads[kReaders];
  int i;
  CHECK_OK(e8kv_compress(c, &kv, &queries, NULL, &cache));
  CHECK_OK(e8kv_thread_pool_create(2, &pool));
  if (!cache || !pool) return;
  make_query(q, kReads);
  for (i = 0; i < kReads; ++i)
    CHECK_OK(e8kv_attend(cache, i % kLayers, q + i * kQRow, kTokens, expected + i * kQRow, NULL, NULL));
  for (i = 0; i < kReaders; ++i) {
    readers[i].cache = cache;
    readers[i].pool = i % 2 ? pool : NULL; /* half through the shared pool, half inline */
    readers[i].q = q;
    readers[i].expected = expected;
    readers[i].mismatches = 0;
    CHECK(pthread_create(&threads[i], NULL, read_concurrently, &readers[i]) == 0);
  }
  for (i = 0; i < kReaders; ++i) {
    CHECK(pthread_join(threads[i], NULL) == 0);
    CHECK(readers[i].mismatches == 0);
  }
  e8kv_thread_pool_destroy(pool);
  e8kv_cache_destroy(cache);
  e8kv_compressor_destroy(c);
}

static void* fail_on_another_thread(void* message_copy) {
  e8kv_thread_pool* pool = NULL;
  if (e8kv_thread_pool_create(5000, &pool) == E8KV_ERROR_INVALID_ARGUMENT)
    snprintf((char*)message_copy, 256, "%s", e8kv_last_error());
  return NULL;
}
#endif

/* The last error is per thread, and a successful call leaves it. */
static void test_last_error_per_thread(void) {
  e8kv_model_shape shape = {kLayers, kKvHeads, kQHeads, 100};
  e8kv_compressor* c = NULL;
  CHECK_FAILS(e8kv_compressor_create(&shape, "", &c), E8KV_ERROR_UNSUPPORTED, "head_dim 100");
  CHECK(strncmp(e8kv_last_error(), "e8kv_compressor_create: ", 24) == 0);
  c = make_compressor("");
  CHECK(strstr(e8kv_last_error(), "head_dim 100") != NULL);
  e8kv_compressor_destroy(c);
#ifdef HAVE_PTHREADS
  {
    char other[256] = "";
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, fail_on_another_thread, other) == 0);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(strstr(other, "threads is 5000; accepted: 1 .. 1024") != NULL);
    CHECK(strstr(e8kv_last_error(), "head_dim 100") != NULL); /* this thread's message is its own */
  }
#endif
}

/* e8kv_preset_names lists every name `preset=NAME` accepts: each one makes a compressor, and a
 * name outside the list is refused with the list in the message. */
static void test_preset_names(void) {
  const char* names = e8kv_preset_names();
  e8kv_model_shape shape = {kLayers, kKvHeads, kQHeads, kDim};
  char list[512], spec[96];
  e8kv_compressor* c = NULL;
  int count = 0;
  CHECK(names != NULL && strstr(names, "lossless") != NULL && strstr(names, "quant-k3v2") != NULL);
  snprintf(list, sizeof list, "%s", names);
  for (char* name = strtok(list, ", "); name != NULL; name = strtok(NULL, ", ")) {
    snprintf(spec, sizeof spec, "preset=%s", name);
    CHECK_OK(e8kv_compressor_create(&shape, spec, &c));
    e8kv_compressor_destroy(c);
    ++count;
  }
  CHECK(count >= 12);
  CHECK_FAILS(e8kv_compressor_create(&shape, "preset=no-such-preset", &c), E8KV_ERROR_INVALID_ARGUMENT, names);
}

int main(void) {
  make_sequence();
  test_versions();
  test_compress_attend_decompress();
  test_dtypes();
  test_serialize_round_trip();
  test_append();
  test_extend();
  test_drop_before();
  test_lse_merge_and_batch();
  test_thread_pool();
  test_empty_cache_and_describe();
  test_errors_null_pointers();
  test_errors_spec_and_shape();
  test_errors_wrong_shapes();
  test_errors_nan_and_positions();
  test_errors_container();
  test_last_error_per_thread();
  test_preset_names();
#ifdef HAVE_PTHREADS
  test_concurrent_reads();
#endif
  if (g_failures) {
    fprintf(stderr, "c_api_test: %d of %d checks failed\n", g_failures, g_checks);
    return 1;
  }
  printf("c_api_test: all %d checks passed\n", g_checks);
  return 0;
}
