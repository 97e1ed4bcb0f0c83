/* Minimal C consumer: a C-only project (the C compiler and linker, no C++ enabled) links e8kv::c
 * (libe8kv_c) from the package and compresses, attends, serializes and reads back a tiny cache. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "e8kv/c_api.h"

#define CHECK(call)                                                                             \
  do {                                                                                          \
    if ((call) != E8KV_OK) {                                                                    \
      printf("%s failed: %s\n", #call, e8kv_last_error());                                      \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

enum { kTokens = 80, kHeads = 1, kDim = 64 };

int main(void) {
  static float keys[kTokens * kHeads * kDim], values[kTokens * kHeads * kDim];
  float q[kHeads * kDim], out[kHeads * kDim], out_back[kHeads * kDim], lse[kHeads];
  const void* key_layers[1] = {keys};
  const void* value_layers[1] = {values};
  e8kv_model_shape shape = {1, kHeads, kHeads, kDim};
  e8kv_kv_input kv;
  e8kv_compressor* compressor = NULL;
  e8kv_cache *cache = NULL, *back = NULL;
  void* blob = NULL;
  size_t size = 0;
  int i;
  for (i = 0; i < kTokens * kHeads * kDim; ++i) {
    keys[i] = (float)sin(0.37 * i);
    values[i] = (float)cos(0.11 * i);
  }
  for (i = 0; i < kHeads * kDim; ++i) q[i] = (float)sin(0.05 * i);
  memset(&kv, 0, sizeof kv);
  kv.dtype = E8KV_DTYPE_F32;
  kv.n_tokens = kTokens;
  kv.keys = key_layers;
  kv.values = value_layers;

  CHECK(e8kv_compressor_create(&shape, "preset=quant-k3v2", &compressor));
  CHECK(e8kv_compress(compressor, &kv, NULL, NULL, &cache));
  CHECK(e8kv_attend(cache, 0, q, kTokens, out, lse, NULL));
  CHECK(e8kv_serialize_alloc(cache, &blob, &size));
  CHECK(e8kv_deserialize(blob, size, compressor, &back));
  CHECK(e8kv_attend(back, 0, q, kTokens, out_back, NULL, NULL));
  if (memcmp(out, out_back, sizeof out) != 0 || !(lse[0] > -INFINITY)) {
    printf("the read-back cache attends differently\n");
    return 1;
  }
  if (strcmp(e8kv_version_string(), E8KV_CONSUMER_EXPECTED_VERSION) != 0) {
    printf("linked e8kv %s, the package says %s\n", e8kv_version_string(), E8KV_CONSUMER_EXPECTED_VERSION);
    return 1;
  }
  printf("e8kv %s C consumer OK (%zu-byte container)\n", e8kv_version_string(), size);
  e8kv_free(blob);
  e8kv_cache_destroy(back);
  e8kv_cache_destroy(cache);
  e8kv_compressor_destroy(compressor);
  return 0;
}
