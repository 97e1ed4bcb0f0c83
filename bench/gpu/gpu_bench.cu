// e8kv-gpu-bench: CUDA-event timings of the paged KV kernels on the current device.
//
//   encode    paged_encode of a 32K-token fp16 prefill chunk (8 KV heads, d = 128; 128 MB of
//             K+V, above the 60 MB L2), GB/s of fp16 K+V input, beside a device-to-device
//             cudaMemcpy of the same bytes in the same run
//   decode    paged_decode_attention latency over contexts × batch × head_dim × GQA × codec:
//             k2v2 and k3v2 as the library's default Config stores them (RoPE-residual keys,
//             8-bit gains, key channel scales, centring: the tensor-core kernel), k2v2-post
//             (post-RoPE keys, same kernel), k2v2-pre / k3v2-pre (pre-RoPE keys, fp16 gains: the
//             lane kernel), and fp16 (our fp16 path through the lane kernel's skeleton); 8 KV
//             heads, 16-token pages,
//             no residual window. Each call reads a different copy of the cache (copies rotate
//             until they span 2 × 60 MB), so no measurement runs out of L2. Prints the split plan
//             (splits × chunk, CTAs against the device's slots) and % of 4.3 TB/s (cache bytes
//             per call / time).
//   memory    device bytes of a 32K-token one-layer cache against CompressedKV::bytes()
//
// Every time is the median of individually timed calls (CUDA events) after warm-up calls.
// Options: --quick (a small matrix), --csv FILE (one row per measurement), --iters-ms N (time
// budget per measurement, default 15). Exits 77 without a device.
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
#include "cuda/encode_params.hpp"

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
double g_budget_ms = 15.0;

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

/// The T new tokens of one sequence as paged_encode takes them: positions 0..T-1, slot_of(t) the
/// slot of token t, and token_seq 0 for all.
struct SequenceTokens {
  Dev<int32_t> pos, seq;
  Dev<int64_t> slots;
  template <class SlotOf>
  SequenceTokens(int T, SlotOf slot_of)
      : pos(static_cast<size_t>(T)), seq(static_cast<size_t>(T)), slots(static_cast<size_t>(T)) {
    std::vector<int32_t> host_pos(static_cast<size_t>(T));
    std::vector<int64_t> host_slots(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) {
      host_pos[static_cast<size_t>(t)] = t;
      host_slots[static_cast<size_t>(t)] = slot_of(t);
    }
    pos.upload(host_pos);
    slots.upload(host_slots);
    BENCH_CUDA(cudaMemset(seq.p, 0, seq.n * sizeof(int32_t)));
  }
};

/// Median milliseconds of individually timed calls of f(i) (i counts the calls, for buffer
/// rotation): 3 warm-up calls, then as many as fill the time budget (at least 9, at most 101).
template <class F>
double time_ms(F&& f) {
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  int call = 0;
  for (int i = 0; i < 3; ++i) f(call++);
  BENCH_CUDA(cudaEventRecord(a));
  f(call++);
  BENCH_CUDA(cudaEventRecord(b));
  BENCH_CUDA(cudaEventSynchronize(b));
  float one = 0.f;
  BENCH_CUDA(cudaEventElapsedTime(&one, a, b));
  const int iters = std::clamp(static_cast<int>(g_budget_ms / std::max(one, 1e-3f)), 9, 101);
  std::vector<float> times(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(a));
    f(call++);
    BENCH_CUDA(cudaEventRecord(b));
    BENCH_CUDA(cudaEventSynchronize(b));
    BENCH_CUDA(cudaEventElapsedTime(&times[static_cast<size_t>(i)], a, b));
  }
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  std::nth_element(times.begin(), times.begin() + iters / 2, times.end());
  return static_cast<double>(times[static_cast<size_t>(iters / 2)]);
}

/// H200 HBM bandwidth the bench reports against (the issue's planning figure).
constexpr double kHbmBytesPerS = 4.3e12;
/// Copies of a decode cache rotate until they span this many bytes (the L2 is 60 MB).
constexpr double kRotationBytes = 120e6;

void csv_row(const char* bench, const char* codec, int d, int gqa, int batch, int ctx, double us, double gbps,
             double baseline_us, int splits = 0, int chunk = 0) {
  if (!g_csv) return;
  std::fprintf(g_csv, "%s,%s,%d,%d,%d,%d,%.3f,%.2f,%.3f,%.2f,%d,%d\n", bench, codec, d, gqa, batch, ctx, us, gbps,
               baseline_us, 100.0 * gbps * 1e9 / kHbmBytesPerS, splits, chunk);
  std::fflush(g_csv);
}

struct CodecChoice {
  const char* name;
  quant::Codec key, value;
  transform::KeyFrame frame = transform::KeyFrame::kPreRope;
  /// The default Config's storage: 8-bit gain codes and query-weighted key channel scales.
  bool default_storage = false;
};
const CodecChoice kK2V2{"k2v2", quant::Codec::kE8P, quant::Codec::kE8P, transform::KeyFrame::kRopeResidual, true};
const CodecChoice kK3V2{"k3v2", quant::Codec::kRvq3, quant::Codec::kE8P, transform::KeyFrame::kRopeResidual, true};
const CodecChoice kK2V2Post{"k2v2-post", quant::Codec::kE8P, quant::Codec::kE8P, transform::KeyFrame::kPostRope};
const CodecChoice kK2V2Pre{"k2v2-pre", quant::Codec::kE8P, quant::Codec::kE8P, transform::KeyFrame::kPreRope};
const CodecChoice kK3V2Pre{"k3v2-pre", quant::Codec::kRvq3, quant::Codec::kE8P, transform::KeyFrame::kPreRope};
const CodecChoice kFp16{"fp16", quant::Codec::kFp16, quant::Codec::kFp16, transform::KeyFrame::kPostRope};

CacheLayout layout_for(const CodecChoice& c, int kv_heads, int q_heads, int d) {
  CacheLayout L;
  L.n_layers = 1;
  L.n_kv_heads = kv_heads;
  L.n_q_heads = q_heads;
  L.head_dim = d;
  L.key_codec = {c.key};
  L.value_codec = {c.value};
  L.key_frame = c.frame;
  if (c.default_storage) {
    L.gain_bits = 8;
    L.query_weighted_keys = true;
  }
  L.rotation_seed = 42;
  return L;
}

/// Device copies of a layer's rope tables and sign bits, and the codec params pointing at them.
struct Tables {
  Dev<float> rope, rope_delta;
  Dev<uint32_t> signs;
  cuda::LayerCodecParams params;
  Tables(const CacheCodecs& codecs)
      : rope(codecs.rope_table().size()), rope_delta(rope_delta_table(codecs).size()),
        signs(packed_sign_bits(codecs, 0).size()) {
    rope.upload(codecs.rope_table());
    rope_delta.upload(rope_delta_table(codecs));
    signs.upload(packed_sign_bits(codecs, 0));
    params = cuda::layer_codec_params(codecs, 0, rope.p, signs.p, rope_delta.p);
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

/// Makes every slot decode to finite values: gains 0.1 (fp16 gains) or the reference (8-bit gain
/// code 128), fp16 codes in ±[0.5, 1), positions.
__global__ void sanitize_slots(uint8_t* pool, PagedLayout L, int64_t n_pages, bool key_fp16, bool value_fp16) {
  const int64_t total = n_pages * L.page_tokens * L.kv_heads;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t page = i / (L.page_tokens * L.kv_heads);
    const int h = static_cast<int>(i / L.page_tokens % L.kv_heads);
    const int s = static_cast<int>(i % L.page_tokens);
    uint8_t* p = pool + page * L.page_bytes;
    if (L.key_gain_bytes == 2) *reinterpret_cast<uint16_t*>(p + L.key_gain_offset(h, s)) = 0x2E66;
    if (L.key_gain_bytes == 1) p[L.key_gain_offset(h, s)] = 128;
    if (L.value_gain_bytes == 2) *reinterpret_cast<uint16_t*>(p + L.value_gain_offset(h, s)) = 0x2E66;
    if (L.value_gain_bytes == 1) p[L.value_gain_offset(h, s)] = 128;
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
  const SequenceTokens tokens(T, [](int t) { return static_cast<int64_t>(t); });
  Dev<uint16_t> means(static_cast<size_t>(H) * 2 * d);  // centring (CacheLayout::center), zeros
  BENCH_CUDA(cudaMemset(means.p, 0, means.n * sizeof(uint16_t)));
  const double copy_ms = time_ms([&](int) {
    BENCH_CUDA(cudaMemcpyAsync(copy.p, k.p, bytes, cudaMemcpyDeviceToDevice));
    BENCH_CUDA(cudaMemcpyAsync(copy.p + host.size(), v.p, bytes, cudaMemcpyDeviceToDevice));
  });
  const double in_bytes = 2.0 * static_cast<double>(bytes);
  std::printf("\nencode: %d tokens x %d KV heads x d %d, fp16 NHD input (%.1f MB of K+V)\n", T, H, d, in_bytes / 1e6);
  std::printf("  %-6s %10s %10s %12s\n", "codec", "time_us", "GB/s", "vs_copy");
  std::printf("  %-6s %10.1f %10.1f %12s\n", "copy", copy_ms * 1e3, in_bytes / copy_ms / 1e6, "1.00");
  csv_row("encode", "copy", d, 0, 1, T, copy_ms * 1e3, in_bytes / copy_ms / 1e6, copy_ms * 1e3);
  // The default storage's key channel scales (ones) and 8-bit gain references (0.1) of the one
  // sequence, as paged_estimate_state would leave them.
  Dev<uint16_t> key_scales(static_cast<size_t>(H) * d), gain_refs(static_cast<size_t>(H) * 2);
  key_scales.upload(std::vector<uint16_t>(key_scales.n, 0x3C00));
  gain_refs.upload(std::vector<uint16_t>(gain_refs.n, 0x2E66));
  for (const CodecChoice& c : {kK2V2, kK3V2, kK2V2Pre, kFp16}) {
    const CacheCodecs codecs(layout_for(c, H, H, d));
    Tables tables(codecs);
    const PagedLayout L = paged_layout_for(codecs, 0, P);
    Dev<uint8_t> pool(static_cast<size_t>(T / P) * L.page_bytes);
    cuda::EncodeParams p = gputest::nhd_encode_params(tables.params, L, pool.p, T, k.p, v.p, DType::kF16, tokens.pos.p,
                                                      tokens.slots.p, means.p, tokens.seq.p);
    if (c.default_storage) {
      p.key_scales = key_scales.p;
      p.gain_refs = gain_refs.p;
    }
    const double ms = time_ms([&](int) { BENCH_STATUS(cuda::paged_encode(p, nullptr)); });
    std::printf("  %-6s %10.1f %10.1f %12.3f\n", c.name, ms * 1e3, in_bytes / ms / 1e6, copy_ms / ms);
    csv_row("encode", c.name, d, 0, 1, T, ms * 1e3, in_bytes / ms / 1e6, copy_ms * 1e3);
  }
}

// ---- decode attention ---------------------------------------------------------------------------

void bench_decode(const std::vector<int>& contexts, const std::vector<int>& batches, const std::vector<int>& dims,
                  const std::vector<int>& gqas) {
  const int H = 8, P = 16;
  const std::vector<CodecChoice> codecs = {kK2V2, kK3V2, kK2V2Post, kK2V2Pre, kK3V2Pre, kFp16};
  const int max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int max_d = *std::max_element(dims.begin(), dims.end());
  // One pool region for the largest configuration (fp16 at the largest context and batch, or
  // the rotation span, whichever is larger): smaller caches rotate copies inside it.
  size_t region = static_cast<size_t>(kRotationBytes) + 16;
  for (int d : dims) {
    const PagedLayout L = make_paged_layout(P, H, d, 0, 0, false);
    region = std::max(region, static_cast<size_t>((max_ctx + P - 1) / P) * static_cast<size_t>(max_batch) *
                                  static_cast<size_t>(L.page_bytes));
  }
  Dev<uint8_t> pool(region);
  const int max_q = max_batch * H * *std::max_element(gqas.begin(), gqas.end()) * max_d;
  Dev<uint16_t> q(static_cast<size_t>(max_q)), out(static_cast<size_t>(max_q));
  // Centring means (CacheLayout::center is on by default): zeros, the work is the same. The
  // default storage's key channel scales (ones) and 8-bit gain references (0.1) likewise.
  Dev<uint16_t> means(static_cast<size_t>(max_batch) * H * 2 * max_d);
  BENCH_CUDA(cudaMemset(means.p, 0, means.n * sizeof(uint16_t)));
  Dev<uint16_t> key_scales(static_cast<size_t>(max_batch) * H * max_d), gain_refs(static_cast<size_t>(max_batch) * H * 2);
  key_scales.upload(std::vector<uint16_t>(key_scales.n, 0x3C00));
  gain_refs.upload(std::vector<uint16_t>(gain_refs.n, 0x2E66));
  {
    std::mt19937_64 rng(2);
    std::normal_distribution<float> g(0.f, 1.f);
    std::vector<uint16_t> hq(static_cast<size_t>(max_q));
    for (auto& x : hq) x = float_to_fp16_bits(g(rng));
    q.upload(hq);
  }
  std::printf("\ndecode attention: %d KV heads, %d-token pages, fp16 query and output, no window; median latency per "
              "call, %% of %.1f TB/s = cache bytes / time; plan = splits x chunk tokens, CTAs / device slots\n",
              H, P, kHbmBytesPerS / 1e12);
  std::printf("  %7s %5s %4s %3s %-9s %10s %7s %9s %16s\n", "context", "batch", "d", "gqa", "codec", "median_us", "%HBM",
              "vs_fp16", "plan");
  for (int d : dims)
    for (int gqa : gqas)
      for (int batch : batches)
        for (int ctx : contexts) {
          double fp16_us = 0;
          std::vector<std::string> lines;
          for (const CodecChoice& c : codecs) {
            const CacheCodecs cc(layout_for(c, H, H * gqa, d));
            Tables tables(cc);
            const PagedLayout L = paged_layout_for(cc, 0, P);
            const int pages_per_seq = (ctx + P - 1) / P;
            const int64_t n_pages = static_cast<int64_t>(pages_per_seq) * batch;
            const double cache_bytes = static_cast<double>(n_pages) * static_cast<double>(L.page_bytes);
            const int64_t copies = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(kRotationBytes / cache_bytes)), 1,
                                                       static_cast<int64_t>(region / static_cast<size_t>(L.page_bytes)) / n_pages);
            const int64_t total_pages = copies * n_pages;
            fill_random<<<1024, 256>>>(reinterpret_cast<uint32_t*>(pool.p), static_cast<size_t>(total_pages * L.page_bytes / 4), 7);
            sanitize_slots<<<1024, 256>>>(pool.p, L, total_pages, c.key == quant::Codec::kFp16, c.value == quant::Codec::kFp16);
            BENCH_CUDA(cudaGetLastError());
            std::vector<int32_t> indptr(static_cast<size_t>(batch) + 1), indices(static_cast<size_t>(total_pages)),
                lens(static_cast<size_t>(batch), ctx);
            for (int b = 0; b <= batch; ++b) indptr[static_cast<size_t>(b)] = b * pages_per_seq;
            for (int64_t i = 0; i < total_pages; ++i) indices[static_cast<size_t>(i)] = static_cast<int32_t>(i);
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
            if (c.default_storage) {
              p.cache.key_scales = key_scales.p;
              p.cache.gain_refs = gain_refs.p;
            }
            p.q_heads = H * gqa;
            p.q = q.p;
            p.q_dtype = DType::kF16;
            p.out = out.p;
            p.out_dtype = DType::kF16;
            size_t ws_bytes = 0;
            BENCH_STATUS(cuda::decode_attention_workspace_bytes(p, &ws_bytes));
            Dev<uint8_t> ws(ws_bytes);
            int chunk = 0;
            const int splits = cuda::decode_attention_splits(p, &chunk);
            const int slots = cuda::decode_attention_slots(p);
            const int64_t ctas = static_cast<int64_t>(batch) * H * ((gqa + 7) / 8) * (splits + 1);
            const double ms = time_ms([&](int call) {
              cuda::DecodeAttentionParams pc = p;  // copy call % copies: its own page indices
              pc.cache.page_indices = dindices.p + (call % copies) * n_pages;
              BENCH_STATUS(cuda::paged_decode_attention(pc, ws.p, ws_bytes, nullptr));
            });
            const double us = ms * 1e3, gbps = cache_bytes / ms / 1e6;
            if (c.key == quant::Codec::kFp16) fp16_us = us;
            csv_row("decode", c.name, d, gqa, batch, ctx, us, gbps, 0.0, splits, chunk);
            char plan[64], line[256];
            std::snprintf(plan, sizeof plan, "%dx%d %lld/%d", splits, chunk, static_cast<long long>(ctas), slots);
            std::snprintf(line, sizeof line, "  %7d %5d %4d %3d %-9s %10.1f %6.1f%%", ctx, batch, d, gqa, c.name, us,
                          100.0 * gbps * 1e9 / kHbmBytesPerS);
            lines.push_back(std::string(line) + "|" + plan + "|" + std::to_string(us));
          }
          for (const std::string& l : lines) {  // the fp16 row is timed last: ratios printed after it
            const size_t bar = l.find('|'), bar2 = l.rfind('|');
            const double us = std::atof(l.c_str() + bar2 + 1);
            std::printf("%s %8.2fx %16s\n", l.substr(0, bar).c_str(), fp16_us > 0 ? fp16_us / us : 0.0,
                        l.substr(bar + 1, bar2 - bar - 1).c_str());
          }
          std::fflush(stdout);
        }
}

// ---- memory ---------------------------------------------------------------------------------------

void bench_memory() {
  const int T = 32768, H = 8, d = 128, P = 16;
  const ModelShape shape{1, H, 4 * H, d};
  Config cfg = Config::preset("quant-k2v2");
  // fp16 gains, no key channel scales: this row's device accounting (pool + table + means). The
  // default's 8-bit gains store 1 B less per token-head and kind, its key scales d fp16 more per
  // sequence and KV head.
  cfg.gain_bits = 16;
  cfg.query_weighted_keys = false;
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
  const SequenceTokens tokens(T, [&](int t) { return table.slot(0, t); });
  const cuda::EncodeParams p = gputest::nhd_encode_params(tables.params, L, pool.p, T, k.p, v.p, DType::kF16,
                                                          tokens.pos.p, tokens.slots.p, means.p, tokens.seq.p);
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
  std::vector<int> contexts = {4096, 16384, 32768, 131072}, batches = {1, 8, 32}, dims = {128}, gqas = {4, 8};
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
      std::fprintf(g_csv, "bench,codec,head_dim,gqa,batch,context,time_us,gbps,baseline_us,pct_hbm,splits,chunk\n");
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
