// e8kv-gpu-bench: CUDA-event timings of the paged KV kernels on the current device.
//
//   encode    paged_encode of a 32K-token fp16 prefill chunk (8 KV heads, d = 128), GB/s of fp16
//             K+V input, beside a device-to-device cudaMemcpy of the same bytes in the same run
//   decode    paged_decode_attention latency over contexts × batch × head_dim × GQA × codec
//             (k2v2, k3v2 and fp16: our fp16 path through the same kernel skeleton); 8 KV heads,
//             16-token pages, no residual window
//   memory    device bytes of a 32K-token one-layer cache against CompressedKV::bytes()
//
// Options: --quick (a small matrix), --csv FILE (one row per measurement), --iters-ms N (time
// budget per measurement, default 40). Exits 77 without a device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "e8kv/cache/paged_kv.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/cuda/device_info.cuh"
#include "e8kv/cuda/paged_kv.cuh"
#include "e8kv/numeric/half.hpp"

namespace {
using namespace e8kv;

#define BENCH_CUDA(expr)                                                                        \
  do {                                                                                          \
    const cudaError_t e_ = (expr);                                                              \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)
#define BENCH_STATUS(expr)                                                                          \
  do {                                                                                              \
    const ::e8kv::Status s_ = (expr);                                                               \
    if (s_ != ::e8kv::Status::kSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, ::e8kv::to_string(s_));    \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

FILE* g_csv = nullptr;
double g_budget_ms = 40.0;

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t count) : n(count) { BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (p) cudaFree(p);
  }
  void upload(const std::vector<T>& h) { BENCH_CUDA(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
};

/// Mean milliseconds per call of f over enough calls to fill the time budget (CUDA events).
template <class F>
double time_ms(F&& f) {
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  f();  // warm-up
  BENCH_CUDA(cudaEventRecord(a));
  f();
  BENCH_CUDA(cudaEventRecord(b));
  BENCH_CUDA(cudaEventSynchronize(b));
  float one = 0.f;
  BENCH_CUDA(cudaEventElapsedTime(&one, a, b));
  const int iters = std::clamp(static_cast<int>(g_budget_ms / std::max(one, 1e-3f)), 3, 200);
  BENCH_CUDA(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  BENCH_CUDA(cudaEventRecord(b));
  BENCH_CUDA(cudaEventSynchronize(b));
  float total = 0.f;
  BENCH_CUDA(cudaEventElapsedTime(&total, a, b));
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  return static_cast<double>(total) / iters;
}

void csv_row(const char* bench, const char* codec, int d, int gqa, int batch, int ctx, double us, double gbps,
             double baseline_us) {
  if (!g_csv) return;
  std::fprintf(g_csv, "%s,%s,%d,%d,%d,%d,%.3f,%.2f,%.3f\n", bench, codec, d, gqa, batch, ctx, us, gbps, baseline_us);
  std::fflush(g_csv);
}

struct CodecChoice {
  const char* name;
  quant::Codec key, value;
};
const CodecChoice kK2V2{"k2v2", quant::Codec::kE8P, quant::Codec::kE8P};
const CodecChoice kK3V2{"k3v2", quant::Codec::kRvq3, quant::Codec::kE8P};
const CodecChoice kFp16{"fp16", quant::Codec::kFp16, quant::Codec::kFp16};

CacheLayout layout_for(const CodecChoice& c, int kv_heads, int q_heads, int d) {
  CacheLayout L;
  L.n_layers = 1;
  L.n_kv_heads = kv_heads;
  L.n_q_heads = q_heads;
  L.head_dim = d;
  L.key_codec = {c.key};
  L.value_codec = {c.value};
  L.rotation_seed = 42;
  return L;
}

/// Device copies of a layer's rope table and sign bits, and the codec params pointing at them.
struct Tables {
  Dev<float> rope;
  Dev<uint32_t> signs;
  cuda::LayerCodecParams params;
  Tables(const CacheCodecs& codecs) : rope(codecs.rope_table().size()), signs(packed_sign_bits(codecs, 0).size()) {
    rope.upload(codecs.rope_table());
    signs.upload(packed_sign_bits(codecs, 0));
    params = cuda::layer_codec_params(codecs, 0, rope.p, signs.p);
  }
};

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

/// Fills n_words 32-bit words of the pool with pseudo-random bits.
__global__ void fill_random(uint32_t* words, size_t n_words, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n_words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    words[i] = hash32(seed + i);
}

/// Makes every slot decode to finite values: gains 0.1, fp16 codes in ±[0.5, 1), positions.
__global__ void sanitize_slots(uint8_t* pool, PagedLayout L, int64_t n_pages, bool key_fp16, bool value_fp16) {
  const int64_t total = n_pages * L.page_tokens * L.kv_heads;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t page = i / (L.page_tokens * L.kv_heads);
    const int h = static_cast<int>(i / L.page_tokens % L.kv_heads);
    const int s = static_cast<int>(i % L.page_tokens);
    uint8_t* p = pool + page * L.page_bytes;
    if (L.key_gain_bytes) *reinterpret_cast<uint16_t*>(p + L.key_gain_offset(h, s)) = 0x2E66;
    if (L.value_gain_bytes) *reinterpret_cast<uint16_t*>(p + L.value_gain_offset(h, s)) = 0x2E66;
    if (key_fp16) {
      uint16_t* c = reinterpret_cast<uint16_t*>(p + L.key_code_offset(h, s));
      for (int e = 0; e < L.head_dim; ++e) c[e] = static_cast<uint16_t>((c[e] & 0x83FFu) | 0x3800u);
    }
    if (value_fp16) {
      uint16_t* c = reinterpret_cast<uint16_t*>(p + L.value_code_offset(h, s));
      for (int e = 0; e < L.head_dim; ++e) c[e] = static_cast<uint16_t>((c[e] & 0x83FFu) | 0x3800u);
    }
    if (h < L.position_sets) *reinterpret_cast<int32_t*>(p + L.position_offset(h, s)) = static_cast<int32_t>(page * L.page_tokens + s);
  }
}

// ---- encode --------------------------------------------------------------------------------------

void bench_encode() {
  const int T = 32768, H = 8, d = 128, P = 16;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<uint16_t> host(static_cast<size_t>(T) * H * d);
  for (auto& x : host) x = float_to_fp16_bits(g(rng));
  const size_t bytes = host.size() * 2;
  Dev<uint16_t> k(host.size()), v(host.size()), copy(2 * host.size());
  k.upload(host);
  v.upload(host);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::vector<int64_t> slots(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) {
    pos[static_cast<size_t>(t)] = t;
    slots[static_cast<size_t>(t)] = t;
  }
  Dev<int32_t> dpos(pos.size()), dseq(pos.size());
  Dev<int64_t> dslots(slots.size());
  Dev<uint16_t> means(static_cast<size_t>(H) * 2 * d);  // centring (CacheLayout::center), zeros
  dpos.upload(pos);
  dslots.upload(slots);
  BENCH_CUDA(cudaMemset(dseq.p, 0, pos.size() * sizeof(int32_t)));
  BENCH_CUDA(cudaMemset(means.p, 0, means.n * sizeof(uint16_t)));
  const double copy_ms = time_ms([&] {
    BENCH_CUDA(cudaMemcpyAsync(copy.p, k.p, bytes, cudaMemcpyDeviceToDevice));
    BENCH_CUDA(cudaMemcpyAsync(copy.p + host.size(), v.p, bytes, cudaMemcpyDeviceToDevice));
  });
  const double in_bytes = 2.0 * static_cast<double>(bytes);
  std::printf("\nencode: %d tokens x %d KV heads x d %d, fp16 NHD input (%.1f MB of K+V)\n", T, H, d, in_bytes / 1e6);
  std::printf("  %-6s %10s %10s %12s\n", "codec", "time_us", "GB/s", "vs_copy");
  std::printf("  %-6s %10.1f %10.1f %12s\n", "copy", copy_ms * 1e3, in_bytes / copy_ms / 1e6, "1.00");
  csv_row("encode", "copy", d, 0, 1, T, copy_ms * 1e3, in_bytes / copy_ms / 1e6, copy_ms * 1e3);
  for (const CodecChoice& c : {kK2V2, kK3V2, kFp16}) {
    const CacheCodecs codecs(layout_for(c, H, H, d));
    Tables tables(codecs);
    const PagedLayout L = paged_layout_for(codecs, 0, P);
    Dev<uint8_t> pool(static_cast<size_t>(T / P) * L.page_bytes);
    cuda::EncodeParams p;
    p.codec = tables.params;
    p.layout = L;
    p.pool = pool.p;
    p.n_tokens = T;
    p.keys = k.p;
    p.values = v.p;
    p.dtype = DType::kF16;
    p.token_stride = H * d;
    p.head_stride = d;
    p.positions = dpos.p;
    p.slot_mapping = dslots.p;
    p.means = means.p;
    p.token_seq = dseq.p;
    const double ms = time_ms([&] { BENCH_STATUS(cuda::paged_encode(p, nullptr)); });
    std::printf("  %-6s %10.1f %10.1f %12.3f\n", c.name, ms * 1e3, in_bytes / ms / 1e6, copy_ms / ms);
    csv_row("encode", c.name, d, 0, 1, T, ms * 1e3, in_bytes / ms / 1e6, copy_ms * 1e3);
  }
}

// ---- decode attention ---------------------------------------------------------------------------

struct DecodeShape {
  int ctx, batch, d, gqa;
};

void bench_decode(const std::vector<int>& contexts, const std::vector<int>& batches, const std::vector<int>& dims,
                  const std::vector<int>& gqas) {
  const int H = 8, P = 16;
  // One pool for the largest configuration (fp16 at the largest context and batch).
  size_t max_pool = 0;
  for (int d : dims) {
    const PagedLayout L = make_paged_layout(P, H, d, 0, 0, false);
    max_pool = std::max(max_pool, static_cast<size_t>(*std::max_element(contexts.begin(), contexts.end()) / P) *
                                      static_cast<size_t>(*std::max_element(batches.begin(), batches.end())) *
                                      static_cast<size_t>(L.page_bytes));
  }
  Dev<uint8_t> pool(max_pool + 16);
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int max_q = max_batch * H * *std::max_element(gqas.begin(), gqas.end()) * *std::max_element(dims.begin(), dims.end());
  Dev<uint16_t> q(static_cast<size_t>(max_q)), out(static_cast<size_t>(max_q));
  // Centring means (CacheLayout::center is on by default): zeros, the work is the same.
  Dev<uint16_t> means(static_cast<size_t>(max_batch) * H * 2 * *std::max_element(dims.begin(), dims.end()));
  BENCH_CUDA(cudaMemset(means.p, 0, means.n * sizeof(uint16_t)));
  {
    std::mt19937_64 rng(2);
    std::normal_distribution<float> g(0.f, 1.f);
    std::vector<uint16_t> hq(static_cast<size_t>(max_q));
    for (auto& x : hq) x = float_to_fp16_bits(g(rng));
    q.upload(hq);
  }
  std::printf("\ndecode attention: %d KV heads, %d-token pages, fp16 query and output, no window (latency per call)\n",
              H, P);
  std::printf("  %7s %5s %4s %4s %10s %10s %10s %9s %9s\n", "context", "batch", "d", "gqa", "k2v2_us", "k3v2_us",
              "fp16_us", "k2v2/fp16", "k3v2/fp16");
  for (int d : dims)
    for (int gqa : gqas)
      for (int batch : batches)
        for (int ctx : contexts) {
          double us[3] = {0, 0, 0};
          int which = 0;
          for (const CodecChoice& c : {kK2V2, kK3V2, kFp16}) {
            const CacheCodecs codecs(layout_for(c, H, H * gqa, d));
            Tables tables(codecs);
            const PagedLayout L = paged_layout_for(codecs, 0, P);
            const int pages_per_seq = (ctx + P - 1) / P;
            const int64_t n_pages = static_cast<int64_t>(pages_per_seq) * batch;
            fill_random<<<1024, 256>>>(reinterpret_cast<uint32_t*>(pool.p), static_cast<size_t>(n_pages * L.page_bytes / 4), 7);
            sanitize_slots<<<1024, 256>>>(pool.p, L, n_pages, c.key == quant::Codec::kFp16, c.value == quant::Codec::kFp16);
            BENCH_CUDA(cudaGetLastError());
            std::vector<int32_t> indptr(static_cast<size_t>(batch) + 1), indices(static_cast<size_t>(n_pages)), lens(static_cast<size_t>(batch), ctx);
            for (int b = 0; b <= batch; ++b) indptr[static_cast<size_t>(b)] = b * pages_per_seq;
            for (int64_t i = 0; i < n_pages; ++i) indices[static_cast<size_t>(i)] = static_cast<int32_t>(i);
            Dev<int32_t> dindptr(indptr.size()), dindices(indices.size()), dlens(lens.size());
            dindptr.upload(indptr);
            dindices.upload(indices);
            dlens.upload(lens);
            cuda::DecodeAttentionParams p;
            p.codec = tables.params;
            p.cache.layout = L;
            p.cache.pool = pool.p;
            p.cache.page_indptr = dindptr.p;
            p.cache.page_indices = dindices.p;
            p.cache.coded_lens = dlens.p;
            p.cache.batch = batch;
            p.cache.max_coded_len = ctx;
            p.cache.means = means.p;
            p.q_heads = H * gqa;
            p.q = q.p;
            p.q_dtype = DType::kF16;
            p.out = out.p;
            p.out_dtype = DType::kF16;
            size_t ws_bytes = 0;
            BENCH_STATUS(cuda::decode_attention_workspace_bytes(p, &ws_bytes));
            Dev<uint8_t> ws(ws_bytes);
            const double ms = time_ms([&] { BENCH_STATUS(cuda::paged_decode_attention(p, ws.p, ws_bytes, nullptr)); });
            us[which++] = ms * 1e3;
            const double cache_bytes = static_cast<double>(n_pages) * L.page_bytes;
            csv_row("decode", c.name, d, gqa, batch, ctx, ms * 1e3, cache_bytes / ms / 1e6, 0.0);
          }
          std::printf("  %7d %5d %4d %4d %10.1f %10.1f %10.1f %9.2f %9.2f\n", ctx, batch, d, gqa, us[0], us[1], us[2],
                      us[2] / us[0], us[2] / us[1]);
        }
}

// ---- memory ---------------------------------------------------------------------------------------

void bench_memory() {
  const int T = 32768, H = 8, d = 128, P = 16;
  const ModelShape shape{1, H, 4 * H, d};
  Config cfg = Config::preset("quant-k2v2");
  cfg.gain_bits = 16;                  // the paged layout stores fp16 gains
  cfg.query_weighted_keys = false;     // and no key channel scales
  cfg.residual_length = 0;
  cfg.flush_block = 1;
  KVCompressor compressor(shape, cfg);
  SequenceKV empty;
  empty.layers.push_back({TensorView::nhd(nullptr, DType::kF32, 0, H, d), TensorView::nhd(nullptr, DType::kF32, 0, H, d)});
  CompressedKV cache = compressor.compress(empty);
  const CacheCodecs& codecs = cache.codecs();
  Tables tables(codecs);
  const PagedLayout L = paged_layout_for(codecs, 0, P);
  const PagedBlockTable table = make_block_table({T}, P);
  size_t free0 = 0, free1 = 0, total = 0;
  BENCH_CUDA(cudaDeviceSynchronize());
  BENCH_CUDA(cudaMemGetInfo(&free0, &total));
  const size_t pool_bytes = static_cast<size_t>(table.n_pages) * L.page_bytes;
  const size_t table_bytes = 4 * (table.page_indptr.size() + table.page_indices.size() + table.coded_lens.size());
  const size_t means_bytes = static_cast<size_t>(H) * 2 * d * 2;  // centring means of the sequence
  Dev<uint8_t> pool(pool_bytes);
  Dev<int32_t> indptr(table.page_indptr.size()), indices(table.page_indices.size()), lens(1);
  Dev<uint16_t> means(static_cast<size_t>(H) * 2 * d);
  BENCH_CUDA(cudaMemGetInfo(&free1, &total));
  std::vector<uint16_t> host_means(means.n);
  {
    std::mt19937_64 mr(4);
    std::normal_distribution<float> mg(0.f, 0.3f);
    for (auto& m : host_means) m = float_to_fp16_bits(mg(mr));
  }
  means.upload(host_means);
  // Fill it through the encoder (random fp16 keys/values) and account it on the CPU.
  std::mt19937_64 rng(3);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<uint16_t> host(static_cast<size_t>(T) * H * d);
  for (auto& x : host) x = float_to_fp16_bits(g(rng));
  Dev<uint16_t> k(host.size()), v(host.size());
  k.upload(host);
  v.upload(host);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::vector<int64_t> slots(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) {
    pos[static_cast<size_t>(t)] = t;
    slots[static_cast<size_t>(t)] = table.slot(0, t);
  }
  Dev<int32_t> dpos(pos.size()), dseq(pos.size());
  Dev<int64_t> dslots(slots.size());
  dpos.upload(pos);
  dslots.upload(slots);
  BENCH_CUDA(cudaMemset(dseq.p, 0, pos.size() * sizeof(int32_t)));
  cuda::EncodeParams p;
  p.codec = tables.params;
  p.layout = L;
  p.pool = pool.p;
  p.n_tokens = T;
  p.keys = k.p;
  p.values = v.p;
  p.dtype = DType::kF16;
  p.token_stride = H * d;
  p.head_stride = d;
  p.positions = dpos.p;
  p.slot_mapping = dslots.p;
  p.means = means.p;
  p.token_seq = dseq.p;
  BENCH_STATUS(cuda::paged_encode(p, nullptr));
  PagedLayer paged;
  paged.layout = L;
  paged.table = table;
  paged.pool.resize(pool_bytes);
  paged.window_lens = {0};
  paged.window_pinned = {0};
  paged.means = host_means;
  BENCH_CUDA(cudaMemcpy(paged.pool.data(), pool.p, pool_bytes, cudaMemcpyDeviceToHost));
  from_paged(paged, 0, {&cache});
  const size_t accounted = cache.bytes();
  std::printf("\nmemory: one layer, %d tokens, %d KV heads, d %d, k2v2, %d-token pages\n", T, H, d, P);
  std::printf("  CompressedKV::bytes()          %12zu\n", accounted);
  const size_t device_bytes = pool_bytes + table_bytes + means_bytes;
  std::printf("  paged pool + block table + means %11zu  (%.4fx bytes(); positions stored 4 B/token)\n",
              device_bytes, static_cast<double>(device_bytes) / accounted);
  std::printf("  cudaMemGetInfo delta            %12zu  (allocation granularity included)\n", free0 - free1);
  std::printf("  fp16 K+V of the same tokens     %12zu  (%.2fx bytes())\n", static_cast<size_t>(T) * H * d * 4,
              static_cast<double>(T) * H * d * 4 / accounted);
  csv_row("memory", "k2v2", d, 0, 1, T, 0.0, static_cast<double>(device_bytes), static_cast<double>(accounted));
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  std::string item;
  for (const char* c = s;; ++c) {
    if (*c == ',' || *c == '\0') {
      if (!item.empty()) out.push_back(std::atoi(item.c_str()));
      item.clear();
      if (*c == '\0') break;
    } else {
      item += *c;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (e8kv::cuda::usable_device_count() == 0) {
    std::printf("no usable CUDA device: skipping\n");
    return 77;
  }
  std::vector<int> contexts = {4096, 16384, 32768, 131072}, batches = {1, 8, 32}, dims = {64, 128}, gqas = {4, 8};
  bool do_encode = true, do_decode = true, do_memory = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick") {
      contexts = {4096, 32768};
      batches = {1, 8};
      dims = {128};
      gqas = {4};
    } else if (a == "--csv") {
      g_csv = std::fopen(next(), "w");
      if (!g_csv) {
        std::perror("--csv");
        return 2;
      }
      std::fprintf(g_csv, "bench,codec,head_dim,gqa,batch,context,time_us,gbps,baseline_us\n");
    } else if (a == "--iters-ms") {
      g_budget_ms = std::atof(next());
    } else if (a == "--contexts") {
      contexts = parse_list(next());
    } else if (a == "--batches") {
      batches = parse_list(next());
    } else if (a == "--dims") {
      dims = parse_list(next());
    } else if (a == "--gqa") {
      gqas = parse_list(next());
    } else if (a == "--only") {
      const std::string w = next();
      do_encode = w == "encode";
      do_decode = w == "decode";
      do_memory = w == "memory";
    } else {
      std::fprintf(stderr,
                   "usage: e8kv-gpu-bench [--quick] [--csv FILE] [--iters-ms N] [--contexts a,b] [--batches a,b] "
                   "[--dims a,b] [--gqa a,b] [--only encode|decode|memory]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.1f GB\n", prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1e9);
  if (do_encode) bench_encode();
  if (do_decode) bench_decode(contexts, batches, dims, gqas);
  if (do_memory) bench_memory();
  if (g_csv) std::fclose(g_csv);
  return 0;
}
