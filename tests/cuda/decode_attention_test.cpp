// paged_decode_attention and paged_dequantize against the CPU reference (e8kv::attend,
// CompressedKV::decompress_head): ragged batches with tails (context 0, 1, not a multiple of the
// page or of a CTA step, one past a split), GQA 1:1 to 16:1, every kernel codec, pre- and
// post-RoPE keys, fp16 windows, query/output dtypes, 128K context, poisoned outputs and
// workspace (every element must be written), CUDA-graph capture; and the paths issue 14 found
// untested (GpuCoverage): Rvq3/Rvq4 values, interleaved and partial RoPE, per-head positions,
// page sizes, GQA 2/3/6/12, positions >= 2^20, > 4 KV heads, batch > 10, plans longer and
// shorter than the real length (status word), unaligned buffers. Skips (exit 77) without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "e8kv/attention/attend.hpp"
#include "cuda/encode_params.hpp"
#include "cuda/gpu_test_main.hpp"
#include "e8kv/cuda/split_plan.hpp"
#include "cuda/paged_gpu_util.hpp"

namespace {
using namespace e8kv;
using namespace e8kv::gputest;

// Tolerances: max |gpu − cpu| over a query row, relative to max |cpu| of that row. The kernels
// decode keys and values bit-identically to the CPU; what differs is the fp32 summation order
// of dots, softmax and accumulation (≈ 1e-6 relative, more over 128K tokens) plus the rounding
// of the output dtype (fp16: 2^-11, bf16: 2^-8 relative).
constexpr double kAttentionTolF32 = 2e-4;
constexpr double kAttentionTolF16 = 2e-3;
constexpr double kAttentionTolBF16 = 1e-2;
// Dequantize: bit-identical decode, so at most one ulp of the output dtype after rounding.
constexpr int kDequantizeMaxUlps = 1;

double tolerance_for(DType t) {
  return t == DType::kF32 ? kAttentionTolF32 : (t == DType::kF16 ? kAttentionTolF16 : kAttentionTolBF16);
}

struct PagedSetup {
  ReferenceBatch ref;
  PagedLayer paged;
  std::unique_ptr<DevicePagedLayer> dev;
  std::unique_ptr<DeviceCodecTables> tables;
};

PagedSetup make_setup(const ModelShape& shape, const Config& cfg, const std::vector<int>& lengths, uint64_t seed, int layer,
                      int page_tokens = 16, int32_t first_position = 0, bool with_queries = false) {
  PagedSetup s;
  s.ref = make_reference_batch(shape, cfg, lengths, seed, first_position, with_queries);
  PagedOptions opt;
  opt.page_tokens = page_tokens;
  opt.shuffle_seed = seed;
  opt.spare_pages = 2;
  opt.pool_fill = 0xFF;  // unused slots are NaN-like garbage: must never be read
  s.paged = to_paged(s.ref.pointers(), layer, opt);
  s.dev = std::make_unique<DevicePagedLayer>(s.paged);
  s.tables = std::make_unique<DeviceCodecTables>(s.ref.caches[0].codecs(), layer);
  return s;
}

std::vector<float> random_queries(int batch, const ModelShape& shape, uint64_t seed, DType dtype) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> q(static_cast<size_t>(batch) * shape.n_q_heads * shape.head_dim);
  for (auto& x : q) x = 2.f * g(rng);
  return round_as(q, dtype);
}

std::vector<float> cpu_attention(const PagedSetup& s, int layer, const std::vector<float>& q) {
  const int row = s.ref.shape.n_q_heads * s.ref.shape.head_dim;
  std::vector<float> out(q.size());
  for (size_t b = 0; b < s.ref.caches.size(); ++b)
    e8kv::attend(s.ref.caches[b], layer, &q[b * row], &out[b * row]);
  return out;
}

std::vector<float> download_as_float(const DeviceBuffer<uint8_t>& buf, DType t, size_t n) {
  const auto bytes = buf.download();
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::kF32) {
      std::memcpy(&out[i], &bytes[4 * i], 4);
    } else {
      uint16_t b;
      std::memcpy(&b, &bytes[2 * i], 2);
      out[i] = from_bits(b, t);
    }
  }
  return out;
}

cuda::DecodeAttentionParams attention_params(const PagedSetup& s, const void* q, DType q_dtype, void* out, DType out_dtype,
                                             int split_tokens) {
  cuda::DecodeAttentionParams p;
  p.codec = s.tables->params;
  p.cache = s.dev->view;
  p.q_heads = s.ref.shape.n_q_heads;
  p.softmax_scale = s.ref.caches[0].layout().effective_softmax_scale();
  p.q = q;
  p.q_dtype = q_dtype;
  p.out = out;
  p.out_dtype = out_dtype;
  p.window_keys = s.dev->window_keys.get();
  p.window_values = s.dev->window_values.get();
  p.window_lens = s.dev->window_lens.get();
  p.window_seq_stride = s.paged.window_seq_stride();
  p.window_head_stride = s.paged.window_head_stride();
  p.window_token_stride = s.paged.window_token_stride();
  p.split_tokens = split_tokens;
  return p;
}

// How one GPU attention call is set up beyond the cache: the split size, buffers moved off
// 16-byte alignment (by whole elements: the kernels' scalar fallbacks), a plan for a different
// length than the real maximum, and a device status word.
struct AttentionRun {
  int split_tokens = 0;
  int q_offset = 0;         ///< elements the query buffer starts past an aligned allocation
  int out_offset = 0;       ///< same for the output
  int window_offset = 0;    ///< same for the two window buffers
  int max_coded_len = -1;   ///< planned length; -1: the real maximum
  int sm_slots = 0;
  bool with_status = false;
  uint32_t status = 0;      ///< read back after the call when with_status
};

// Runs the GPU attention with poisoned output and workspace; returns the output as floats.
std::vector<float> gpu_attention(const PagedSetup& s, const std::vector<float>& q, DType q_dtype, DType out_dtype,
                                 AttentionRun& run) {
  const size_t n = q.size();
  const size_t qsz = dtype_size(q_dtype), osz = dtype_size(out_dtype);
  DeviceBuffer<uint8_t> dq, dout((n + static_cast<size_t>(run.out_offset)) * osz);
  std::vector<uint8_t> qbytes(static_cast<size_t>(run.q_offset) * qsz, 0);
  const std::vector<uint8_t> packed = pack_as(q, q_dtype);
  qbytes.insert(qbytes.end(), packed.begin(), packed.end());
  dq.upload(qbytes);
  dout.fill_bytes(0xFF);
  cuda::DecodeAttentionParams p =
      attention_params(s, dq.get() + run.q_offset * qsz, q_dtype, dout.get() + run.out_offset * osz, out_dtype,
                       run.split_tokens);
  DeviceBuffer<uint16_t> wk, wv;
  if (run.window_offset > 0) {
    std::vector<uint16_t> k(static_cast<size_t>(run.window_offset), 0), v = k;
    k.insert(k.end(), s.paged.window_keys.begin(), s.paged.window_keys.end());
    v.insert(v.end(), s.paged.window_values.begin(), s.paged.window_values.end());
    k.push_back(0);
    v.push_back(0);
    wk.upload(k);
    wv.upload(v);
    p.window_keys = wk.get() + run.window_offset;
    p.window_values = wv.get() + run.window_offset;
  }
  if (run.max_coded_len >= 0) p.cache.max_coded_len = run.max_coded_len;
  p.sm_slots = run.sm_slots;
  DeviceBuffer<uint32_t> status;
  if (run.with_status) {
    status.upload({0u});
    p.status = status.get();
  }
  size_t ws_bytes = 0;
  EXPECT_EQ(cuda::decode_attention_workspace_bytes(p, &ws_bytes), Status::kSuccess);
  DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));
  ws.fill_bytes(0xFF);
  EXPECT_EQ(cuda::paged_decode_attention(p, ws.get(), ws_bytes, nullptr), Status::kSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (run.with_status) run.status = status.download()[0];
  const std::vector<uint8_t> bytes = dout.download();
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t at = (i + static_cast<size_t>(run.out_offset)) * osz;
    if (out_dtype == DType::kF32) {
      std::memcpy(&out[i], &bytes[at], 4);
    } else {
      uint16_t b;
      std::memcpy(&b, &bytes[at], 2);
      out[i] = from_bits(b, out_dtype);
    }
  }
  return out;
}

std::vector<float> gpu_attention(const PagedSetup& s, const std::vector<float>& q, DType q_dtype, DType out_dtype,
                                 int split_tokens) {
  AttentionRun run;
  run.split_tokens = split_tokens;
  return gpu_attention(s, q, q_dtype, out_dtype, run);
}

// Max over rows of max|a − b| / max|b| (rows of head_dim); every a must be finite.
double worst_row_error(const std::vector<float>& a, const std::vector<float>& b, int d) {
  double worst = 0;
  for (size_t r = 0; r < a.size() / d; ++r) {
    double err = 0, scale = 0;
    for (int i = 0; i < d; ++i) {
      const double x = a[r * d + i], y = b[r * d + i];
      if (!std::isfinite(x)) return INFINITY;
      err = std::max(err, std::fabs(x - y));
      scale = std::max(scale, std::fabs(y));
    }
    worst = std::max(worst, scale > 0 ? err / scale : err);
  }
  return worst;
}

// The GPU attention of f32 queries q (f32 output) at each split size against the CPU's (layer 0):
// the worst row error, reported to print(split, err), stays under kAttentionTolF32 (a failure
// names `name` and the split).
template <class Print>
void expect_splits_match_cpu(const PagedSetup& s, const std::vector<float>& q, std::initializer_list<int> splits,
                             const char* name, Print print) {
  const auto ref = cpu_attention(s, 0, q);
  for (int split : splits) {
    const double err = worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, split), ref, s.ref.shape.head_dim);
    print(split, err);
    EXPECT_LT(err, kAttentionTolF32) << name << " split " << split;
  }
}

// Centring on (per-head fp16 means from the first mean_tokens unpinned tokens) unless `center`
// is false; the first `sinks` = 4 tokens stay pinned in the fp16 window (the presets' defaults).
Config config(const char* preset, int residual, int flush, bool pre_rope = true, bool center = true, int mean_tokens = 1) {
  Config c = Config::preset(preset);
  c.gain_bits = 16;               // the paged layout stores fp16 gains
  c.query_weighted_keys = false;  // and no key channel scales
  c.residual_length = residual;
  c.flush_block = flush;
  c.key_frame = pre_rope ? KeyFrame::kPreRope : KeyFrame::kPostRope;
  c.center = center;
  c.mean_tokens = mean_tokens;
  return c;
}

TEST(GpuDecodeAttention, RaggedBatchesWithTailsMatchTheCpuReference) {
  const ModelShape shape{1, 2, 8, 128};  // GQA 4:1
  // With flush_block 1 every unpinned token is coded; the 4 sinks stay in the window, so the coded
  // lengths are 0, 0, 1 (context 1), 9 (one past a CTA step of 8 tokens at d = 128), 17 (one past
  // a page), 16 (a page), 65 and 257 (one past a split of 64 / 256), 996 and 11. With residual 8
  // and flush 16 a window stays besides.
  struct Run {
    const char* preset;
    int residual, flush;
    bool center;
  };
  const std::vector<int> lengths = {0, 1, 5, 13, 21, 20, 69, 261, 1000, 15};
  uint64_t seed = 9100;
  for (const Run& r : {Run{"quant-k2v2", 0, 1, true}, Run{"quant-k3v2", 8, 16, true}, Run{"quant-k4v2", 0, 1, false},
                       Run{"quant-k2v2", 0, 1, false}, Run{"lossless", 8, 16, true}}) {
    const PagedSetup s = make_setup(shape, config(r.preset, r.residual, r.flush, true, r.center), lengths, seed++, 0);
    if (r.flush == 1) {
      EXPECT_EQ(s.paged.table.coded_lens, (std::vector<int32_t>{0, 0, 1, 9, 17, 16, 65, 257, 996, 11}));
    }
    const auto q = random_queries(static_cast<int>(lengths.size()), shape, seed++, DType::kF32);
    expect_splits_match_cpu(s, q, {0, 64, 256}, r.preset, [&](int split, double err) {
      std::printf("%-10s residual %d center %d split %4d: worst row error %.2e\n", r.preset, r.residual, r.center,
                  split, err);
    });
  }
}

// The library's default Config on the GPU: RoPE-residual keys (the mean term q·R_t·μ on tensor
// cores), 8-bit gains, query-weighted keys (observation queries at compress), every kernel codec
// as key and value; positions beyond 2^20 cross the delta table's windows. The CPU emulation of
// the same tile code is tests/cache/paged_rotated_attention_test.
TEST(GpuDecodeAttention, DefaultConfigResidualKeys) {
  struct Case {
    ModelShape shape;
    const char* spec;
    int32_t first_position;
  };
  const Case cases[] = {
      {{1, 2, 8, 128}, "preset=quant-k2v2", 0},
      {{1, 2, 16, 128}, "preset=quant-k3v2", 0},
      {{1, 2, 8, 128}, "preset=quant-k4v4", (1 << 20) + 777},
      {{1, 2, 8, 64}, "preset=quant-k3v3", 0},
      {{1, 2, 8, 128}, "preset=quant-k4v4,value=fp16", 0},
      {{1, 2, 8, 256}, "preset=quant-k3v2", 0},
      {{1, 1, 12, 64}, "preset=high,rope_layout=interleaved,rope_dim=48", 0},
  };
  uint64_t seed = 9150;
  for (const Case& c : cases) {
    Config cfg = Config::parse(c.spec);  // gain_bits 8, qweight, residual keys: the defaults
    cfg.flush_block = 16;
    cfg.mean_tokens = 16;
    cfg.residual_length = 4;
    const std::vector<int> lengths = {2, 37, 300, 2100};
    const PagedSetup s = make_setup(c.shape, cfg, lengths, seed++, 0, 16, c.first_position, /*with_queries=*/true);
    ASSERT_FALSE(s.paged.key_scales.empty()) << c.spec;
    ASSERT_EQ(s.paged.layout.key_gain_bytes, 1) << c.spec;
    const auto q = random_queries(static_cast<int>(lengths.size()), c.shape, seed++, DType::kF32);
    expect_splits_match_cpu(s, q, {0, 64, 512}, c.spec, [&](int split, double err) {
      std::printf("%-48s split %3d: worst row error %.2e\n", c.spec, split, err);
    });
  }
}

TEST(GpuDecodeAttention, GqaShapesCodecsAndRopeModes) {
  struct Case {
    ModelShape shape;
    const char* preset;
    bool pre_rope;
    int protect;  // 1: layer 0 is fp16/fp16 (layer 1 coded); used with layer 0 or 1
    int layer;
  };
  const Case cases[] = {
      {{1, 4, 4, 64}, "quant-k2v2", true, 0, 0},    // MHA
      {{1, 2, 16, 128}, "quant-k3v2", true, 0, 0},  // GQA 8:1
      {{1, 1, 16, 128}, "quant-k2v2", false, 0, 0}, // MQA 16:1: two query chunks, post-RoPE keys
      {{1, 2, 8, 256}, "quant-k4v2", true, 0, 0},
      {{1, 2, 8, 64}, "quant-k3v2", false, 0, 0},
      {{3, 2, 8, 128}, "quant-k2v2", true, 1, 0},   // protected boundary layer: fp16 through the same skeleton
  };
  uint64_t seed = 9200;
  bool center = false;
  for (const Case& c : cases) {
    center = !center;  // alternate centring on and off
    Config cfg = config(c.preset, 4, 8, c.pre_rope, center, 16);
    cfg.protect_boundary = c.protect;
    const std::vector<int> lengths = {3, 40, 129, 500};
    const PagedSetup s = make_setup(c.shape, cfg, lengths, seed++, c.layer);
    const auto q = random_queries(4, c.shape, seed++, DType::kF32);
    const auto ref = cpu_attention(s, c.layer, q);
    const auto got = gpu_attention(s, q, DType::kF32, DType::kF32, 128);
    const double err = worst_row_error(got, ref, c.shape.head_dim);
    std::printf("d %3d H %d Hq %2d %-10s pre_rope %d: worst row error %.2e\n", c.shape.head_dim, c.shape.n_kv_heads,
                c.shape.n_q_heads, c.preset, c.pre_rope, err);
    EXPECT_LT(err, kAttentionTolF32) << c.preset << " d " << c.shape.head_dim;
  }
}

TEST(GpuDecodeAttention, MixedCodecsPerLayer) {
  const ModelShape shape{2, 2, 8, 128};
  Config cfg = config("quant-k2v2", 0, 1);
  cfg.layer_rates = {{quant::Codec::kFp16, quant::Codec::kE8P}, {quant::Codec::kRvq4, quant::Codec::kFp16}};
  uint64_t seed = 9300;
  for (int layer : {0, 1}) {
    const PagedSetup s = make_setup(shape, cfg, {7, 200}, seed++, layer);
    const auto q = random_queries(2, shape, seed++, DType::kF32);
    const double err = worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, 64), cpu_attention(s, layer, q), 128);
    EXPECT_LT(err, kAttentionTolF32) << "layer " << layer;
  }
}

TEST(GpuDecodeAttention, QueryAndOutputDtypes) {
  const ModelShape shape{1, 2, 8, 128};
  const PagedSetup s = make_setup(shape, config("quant-k3v2", 8, 16), {100, 333}, 9400, 0);
  for (DType qt : {DType::kF32, DType::kF16, DType::kBF16})
    for (DType ot : {DType::kF32, DType::kF16, DType::kBF16}) {
      const auto q = random_queries(2, shape, 9401, qt);
      const double err = worst_row_error(gpu_attention(s, q, qt, ot, 0), cpu_attention(s, 0, q), 128);
      EXPECT_LT(err, tolerance_for(ot)) << "q " << to_string(qt) << " out " << to_string(ot);
    }
}

TEST(GpuDecodeAttention, LongContext128K) {
  // Keys/values are encoded on the GPU (byte identity is paged_encode_test's job), brought back
  // into a CompressedKV with from_paged, and attended on the CPU.
  const ModelShape shape{1, 2, 8, 128};
  Config cfg = config("quant-k2v2", 0, 1);  // centred: the encoder subtracts the means below
  KVCompressor compressor(shape, cfg);
  const int n = 131072 + 5;
  const int H = 2, d = 128;
  std::mt19937_64 rng(9500);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> k(static_cast<size_t>(n) * H * d), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = g(rng) * ((i % d) < 4 ? 4.f : 1.f);
    v[i] = g(rng);
  }
  SequenceKV empty;
  empty.layers.push_back({TensorView::nhd(nullptr, DType::kF32, 0, H, d), TensorView::nhd(nullptr, DType::kF32, 0, H, d)});
  CompressedKV cache = compressor.compress(empty);  // no tokens yet; the compressor's codecs
  const CacheCodecs& codecs = cache.codecs();
  const PagedLayout L = paged_layout_for(codecs, 0, 16);
  const PagedBlockTable table = make_block_table({n}, 16, 77, 0);
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) {
    positions[static_cast<size_t>(t)] = t;
    slots[static_cast<size_t>(t)] = table.slot(0, t);
  }
  DeviceCodecTables tables(codecs, 0);
  PagedLayer paged;
  paged.layout = L;
  paged.table = table;
  paged.window_lens = {0};
  paged.window_pinned = {0};
  paged.window_positions.clear();
  paged.means.resize(static_cast<size_t>(H) * 2 * d);
  for (size_t i = 0; i < paged.means.size(); ++i) paged.means[i] = float_to_fp16_bits(0.5f * g(rng) + ((i % d) < 4 ? 3.f : 0.f));
  {
    DeviceBuffer<uint8_t> pool(static_cast<size_t>(table.n_pages) * L.page_bytes), dk, dv;
    pool.fill_bytes(0);
    dk.upload(pack_as(k, DType::kF16));
    dv.upload(pack_as(v, DType::kF16));
    DeviceBuffer<int32_t> dpos, dseq;
    DeviceBuffer<int64_t> dslots;
    DeviceBuffer<uint16_t> dmeans;
    dpos.upload(positions);
    dslots.upload(slots);
    dseq.upload(std::vector<int32_t>(static_cast<size_t>(n), 0));
    dmeans.upload(paged.means);
    const cuda::EncodeParams p = nhd_encode_params(tables.params, L, pool.get(), n, dk.get(), dv.get(), DType::kF16,
                                                   dpos.get(), dslots.get(), dmeans.get(), dseq.get());
    E8KV_STATUS_OK(cuda::paged_encode(p, nullptr));
    E8KV_CUDA_OK(cudaDeviceSynchronize());
    paged.pool = pool.download();
  }
  from_paged(paged, 0, {&cache});
  ASSERT_EQ(cache.coded_tokens(0), n);
  ASSERT_EQ(cache.layer(0).heads[1].key_mean.size(), static_cast<size_t>(d));
  PagedSetup s;
  s.ref.shape = shape;
  s.ref.caches.push_back(std::move(cache));
  s.paged = std::move(paged);
  s.dev = std::make_unique<DevicePagedLayer>(s.paged);
  s.tables = std::make_unique<DeviceCodecTables>(s.ref.caches[0].codecs(), 0);
  const auto q = random_queries(1, shape, 9501, DType::kF32);
  const auto ref = cpu_attention(s, 0, q);
  for (int split : {0, 4096}) {
    const double err = worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, split), ref, d);
    std::printf("128K + 5 tokens, split %d: worst row error %.2e\n", split, err);
    EXPECT_LT(err, kAttentionTolF32 * 5);  // 128K-term fp32 sums on the CPU side
  }
}

TEST(GpuDecodeAttention, CapturedInACudaGraphGivesTheSameOutput) {
  const ModelShape shape{1, 2, 8, 128};
  const PagedSetup s = make_setup(shape, config("quant-k2v2", 8, 16), {50, 700}, 9600, 0);
  const auto q = random_queries(2, shape, 9601, DType::kF16);
  const auto direct = gpu_attention(s, q, DType::kF16, DType::kF32, 0);
  DeviceBuffer<uint8_t> dq, dout(q.size() * 4);
  dq.upload(pack_as(q, DType::kF16));
  dout.fill_bytes(0xFF);
  cuda::DecodeAttentionParams p = attention_params(s, dq.get(), DType::kF16, dout.get(), DType::kF32, 0);
  size_t ws_bytes = 0;
  E8KV_STATUS_OK(cuda::decode_attention_workspace_bytes(p, &ws_bytes));
  DeviceBuffer<uint8_t> ws(ws_bytes);
  cudaStream_t stream;
  E8KV_CUDA_OK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  E8KV_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status st = cuda::paged_decode_attention(p, ws.get(), ws_bytes, stream);
  E8KV_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(st, Status::kSuccess);
  cudaGraphExec_t exec;
  E8KV_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) E8KV_CUDA_OK(cudaGraphLaunch(exec, stream));
  E8KV_CUDA_OK(cudaStreamSynchronize(stream));
  const auto got = download_as_float(dout, DType::kF32, q.size());
  EXPECT_EQ(got, direct);  // deterministic: no atomics, same split plan
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// What the argument checks start from: a 20-token k2v2 cache (shape 1, 2, 8, 128) made with
// `seed`, f32 query and output buffers, and the attention params over them.
struct ArgumentCheck {
  PagedSetup s;
  DeviceBuffer<float> dq, dout;
  cuda::DecodeAttentionParams p;

  explicit ArgumentCheck(uint64_t seed)
      : s(make_setup(ModelShape{1, 2, 8, 128}, config("quant-k2v2", 0, 1), {20}, seed, 0)),
        dq(8 * 128),
        dout(8 * 128),
        p(attention_params(s, dq.get(), DType::kF32, dout.get(), DType::kF32, 0)) {}
};

TEST(GpuDecodeAttention, BadArgumentsFailLoudly) {
  const ArgumentCheck a(9700);
  const cuda::DecodeAttentionParams& p = a.p;
  size_t ws_bytes = 0;
  E8KV_STATUS_OK(cuda::decode_attention_workspace_bytes(p, &ws_bytes));
  DeviceBuffer<uint8_t> ws(ws_bytes);
  EXPECT_EQ(cuda::paged_decode_attention(p, ws.get(), ws_bytes - 1, nullptr), Status::kInvalidArgument);
  EXPECT_EQ(cuda::paged_decode_attention(p, nullptr, ws_bytes, nullptr), Status::kInvalidArgument);
  cuda::DecodeAttentionParams q = p;
  q.q_heads = 7;
  EXPECT_EQ(cuda::paged_decode_attention(q, ws.get(), ws_bytes, nullptr), Status::kInvalidArgument);
  q = p;
  q.codec.head_dim = 80;
  EXPECT_EQ(cuda::paged_decode_attention(q, ws.get(), ws_bytes, nullptr), Status::kUnsupportedHeadDim);
  q = p;
  q.codec.value_codec = quant::Codec::kVoronoi2;
  EXPECT_EQ(cuda::paged_decode_attention(q, ws.get(), ws_bytes, nullptr), Status::kUnsupportedBits);
  q = p;
  q.out_dtype = static_cast<DType>(9);
  EXPECT_EQ(cuda::paged_decode_attention(q, ws.get(), ws_bytes, nullptr), Status::kUnsupportedDtype);
  q = p;
  q.cache.batch = 0;
  EXPECT_EQ(cuda::paged_decode_attention(q, nullptr, 0, nullptr), Status::kSuccess);
  E8KV_CUDA_OK(cudaDeviceSynchronize());
}

// ---- dequantize --------------------------------------------------------------------------------

int ulps_apart(float a, float b, DType t) {
  const int x = to_bits(a, t), y = to_bits(b, t);
  const int sx = x & 0x8000 ? -(x & 0x7FFF) : x, sy = y & 0x8000 ? -(y & 0x7FFF) : y;
  return std::abs(sx - sy);
}

// Dequantizes every coded token of `s` and compares with decompress_head (within one ulp of
// the output dtype); rows between sequences must stay poisoned. max_coded_len < 0: the real
// maximum. Returns the status word when `status` is given.
void check_dequantize(const PagedSetup& s, DType out, const char* what, int max_coded_len = -1,
                      uint32_t* status_out = nullptr) {
  const int H = s.ref.shape.n_kv_heads, d = s.ref.shape.head_dim;
  std::vector<int64_t> lengths;
  for (const auto& c : s.ref.caches) lengths.push_back(c.coded_tokens(0, 0));
  // Output rows with a gap of 3 tokens between sequences: gaps must stay poisoned.
  std::vector<int64_t> indptr;
  int64_t rows = 0;
  for (int64_t n : lengths) {
    indptr.push_back(rows);
    rows += n + 3;
  }
  DeviceBuffer<int64_t> dindptr;
  dindptr.upload(indptr);
  const size_t elems = static_cast<size_t>(rows) * H * d;
  DeviceBuffer<uint16_t> kout(std::max<size_t>(elems, 1)), vout(std::max<size_t>(elems, 1));
  kout.fill_bytes(0xFF);
  vout.fill_bytes(0xFF);
  DeviceBuffer<uint32_t> status;
  status.upload({0u});
  cuda::DequantizeParams p;
  p.codec = s.tables->params;
  p.cache = s.dev->view;
  if (max_coded_len >= 0) p.cache.max_coded_len = max_coded_len;
  p.keys_out = kout.get();
  p.values_out = vout.get();
  p.out_dtype = out;
  p.out_indptr = dindptr.get();
  p.out_token_stride = static_cast<int64_t>(H) * d;
  p.out_head_stride = d;
  p.status = status_out ? status.get() : nullptr;
  E8KV_STATUS_OK(cuda::paged_dequantize(p, nullptr));
  E8KV_CUDA_OK(cudaDeviceSynchronize());
  if (status_out) *status_out = status.download()[0];
  const int64_t planned = max_coded_len >= 0 ? max_coded_len : std::numeric_limits<int64_t>::max();
  const auto kg = kout.download(), vg = vout.download();
  int worst = 0;
  size_t gap_untouched = 0, gap_total = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    for (int h = 0; h < H; ++h) {
      // decompress_head orders every stored token (pinned sinks included) by position.
      const CompactHead ch = s.ref.caches[b].decompress_head(0, h);
      const auto& coded_positions = s.ref.caches[b].positions(0, h);
      for (size_t t = 0; t < coded_positions.size() && static_cast<int64_t>(t) < planned; ++t) {
        const size_t at = static_cast<size_t>(
            std::find(ch.positions.begin(), ch.positions.end(), coded_positions[t]) - ch.positions.begin());
        ASSERT_LT(at, ch.positions.size());
        for (int i = 0; i < d; ++i) {
          const size_t o = ((indptr[b] + static_cast<int64_t>(t)) * H + h) * d + i;
          worst = std::max({worst, ulps_apart(from_bits(kg[o], out), ch.keys[at * d + i], out),
                            ulps_apart(from_bits(vg[o], out), ch.values[at * d + i], out)});
        }
      }
    }
    // Past the plan (a sequence longer than max_coded_len) nothing is written either.
    for (int64_t t = std::min(lengths[b], planned); t < lengths[b] + 3; ++t)
      for (int i = 0; i < H * d; ++i) {
        const size_t o = (indptr[b] + t) * H * d + i;
        gap_total += 2;
        gap_untouched += (kg[o] == 0xFFFF) + (vg[o] == 0xFFFF);
      }
  }
  std::printf("dequantize %s %s: worst %d ulp\n", what, to_string(out), worst);
  EXPECT_LE(worst, kDequantizeMaxUlps) << what;
  EXPECT_EQ(gap_untouched, gap_total) << what << ": rows outside the sequences (or past the plan) were written";
}

TEST(GpuDequantize, MatchesDecompressHeadWithinOneUlp) {
  struct Case {
    ModelShape shape;
    const char* preset;
    bool pre_rope;
    DType out;
  };
  const Case cases[] = {{{1, 2, 8, 128}, "quant-k2v2", true, DType::kF16},
                        {{1, 2, 8, 128}, "quant-k3v2", false, DType::kBF16},
                        {{1, 3, 6, 64}, "quant-k4v2", true, DType::kF16},
                        {{1, 2, 4, 256}, "quant-k3v2", true, DType::kBF16},
                        {{1, 2, 8, 64}, "lossless", true, DType::kF16}};
  uint64_t seed = 9800;
  for (const Case& c : cases) {
    const PagedSetup s = make_setup(c.shape, config(c.preset, 0, 1, c.pre_rope), {0, 1, 17, 300}, seed++, 0);
    check_dequantize(s, c.out, (std::string(c.preset) + " d " + std::to_string(c.shape.head_dim)).c_str());
  }
}

// ---- paths no test ran before (issue 14) ----------------------------------------------------------

TEST(GpuCoverage, Rvq3AndRvq4AsValueCodec) {
  const ModelShape shape{1, 2, 8, 128};
  uint64_t seed = 10100;
  for (const char* preset : {"quant-k3v3", "quant-k4v4"})
    for (bool pre_rope : {true, false}) {
      const PagedSetup s = make_setup(shape, config(preset, 4, 8, pre_rope), {5, 77, 300}, seed++, 0);
      ASSERT_NE(s.tables->params.value_codec, quant::Codec::kE8P);
      const auto q = random_queries(3, shape, seed++, DType::kF32);
      const double err = worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, 0), cpu_attention(s, 0, q), 128);
      std::printf("%s pre_rope %d: worst row error %.2e\n", preset, pre_rope, err);
      EXPECT_LT(err, kAttentionTolF32) << preset << " pre_rope " << pre_rope;
      check_dequantize(s, DType::kF16, preset);
    }
}

TEST(GpuCoverage, InterleavedAndPartialRope) {
  struct Case {
    int d;
    transform::RopeLayout layout;
    int rotary_dim;  // 0: all of head_dim
  };
  const Case cases[] = {{128, transform::RopeLayout::kInterleaved, 0},
                        {128, transform::RopeLayout::kInterleaved, 96},
                        {128, transform::RopeLayout::kSplitHalf, 64},
                        {64, transform::RopeLayout::kSplitHalf, 32},
                        {256, transform::RopeLayout::kInterleaved, 128}};
  uint64_t seed = 10200;
  for (const Case& c : cases) {
    const ModelShape shape{1, 2, 8, c.d};
    Config cfg = config("quant-k3v2", 4, 8);
    cfg.rope.layout = c.layout;
    cfg.rope.rotary_dim = c.rotary_dim;
    const PagedSetup s = make_setup(shape, cfg, {9, 140, 333}, seed++, 0);
    ASSERT_EQ(s.tables->params.rope_layout, c.layout);
    const auto q = random_queries(3, shape, seed++, DType::kF32);
    const double err = worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, 64), cpu_attention(s, 0, q), c.d);
    const std::string what = "d " + std::to_string(c.d) + (c.layout == transform::RopeLayout::kInterleaved ? " interleaved" : " split-half") +
                             " rotary " + std::to_string(c.rotary_dim);
    std::printf("%s: worst row error %.2e\n", what.c_str(), err);
    EXPECT_LT(err, kAttentionTolF32) << what;
    check_dequantize(s, DType::kBF16, what.c_str());
  }
}

TEST(GpuCoverage, PerHeadPositions) {
  // Per-head eviction (key-norm scores: no queries needed): each KV head keeps its own 65 %
  // of the tokens, so positions differ per head and the pages store one position set per head.
  const ModelShape shape{1, 4, 8, 128};
  Config cfg = config("quant-k2v2", 0, 1);
  cfg.eviction_rate = 0.35;
  cfg.scorer = select::ScorerKind::kKeyNorm;
  cfg.per_head_selection = true;
  cfg.recent_window = 8;
  const PagedSetup s = make_setup(shape, cfg, {60, 257, 700}, 10300, 0);
  ASSERT_EQ(s.paged.layout.position_sets, shape.n_kv_heads);
  ASSERT_NE(s.ref.caches[2].positions(0, 0), s.ref.caches[2].positions(0, 1));  // the sets really differ
  const auto q = random_queries(3, shape, 10301, DType::kF32);
  for (int split : {0, 64}) {
    const double err = worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, split), cpu_attention(s, 0, q), 128);
    std::printf("per-head positions split %d: worst row error %.2e\n", split, err);
    EXPECT_LT(err, kAttentionTolF32);
  }
  check_dequantize(s, DType::kF16, "per-head positions");
}

TEST(GpuCoverage, PageSizesOtherThan16) {
  const ModelShape shape{1, 2, 8, 128};
  uint64_t seed = 10400;
  for (int page : {1, 3, 8, 32, 48}) {
    const PagedSetup s = make_setup(shape, config("quant-k2v2", 4, 8), {1, 50, 129, 400}, seed++, 0, page);
    ASSERT_EQ(s.paged.layout.page_tokens, page);
    const auto q = random_queries(4, shape, seed++, DType::kF32);
    const double err = worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, 0), cpu_attention(s, 0, q), 128);
    std::printf("page %d: worst row error %.2e\n", page, err);
    EXPECT_LT(err, kAttentionTolF32) << "page " << page;
    check_dequantize(s, DType::kF16, ("page " + std::to_string(page)).c_str());
  }
}

TEST(GpuCoverage, GroupSizes2_3_6_12) {
  uint64_t seed = 10500;
  for (int g : {2, 3, 6, 12}) {  // 12: two query chunks of 8 and 4 heads
    const ModelShape shape{1, 2, 2 * g, 128};
    for (bool pre_rope : {true, false}) {
      const PagedSetup s = make_setup(shape, config("quant-k3v2", 4, 8, pre_rope), {33, 290}, seed++, 0);
      const auto q = random_queries(2, shape, seed++, DType::kF32);
      const double err = worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, 0), cpu_attention(s, 0, q), 128);
      std::printf("GQA %d pre_rope %d: worst row error %.2e\n", g, pre_rope, err);
      EXPECT_LT(err, kAttentionTolF32) << "GQA " << g << " pre_rope " << pre_rope;
    }
  }
}

TEST(GpuCoverage, PositionsBeyond2To20) {
  // The RoPE table's 11 + 10 + 10-bit levels: positions from 2^20 + 12345 use all three.
  const ModelShape shape{1, 2, 8, 128};
  const int32_t first = (1 << 20) + 12345;
  uint64_t seed = 10600;
  for (const char* preset : {"quant-k2v2", "quant-k4v4"}) {
    const PagedSetup s = make_setup(shape, config(preset, 4, 8), {20, 500}, seed++, 0, 16, first);
    ASSERT_GE(s.ref.caches[1].positions(0, 0).front(), 1 << 20);
    const auto q = random_queries(2, shape, seed++, DType::kF32);
    const double err = worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, 128), cpu_attention(s, 0, q), 128);
    std::printf("%s positions >= 2^20: worst row error %.2e\n", preset, err);
    EXPECT_LT(err, kAttentionTolF32) << preset;
    check_dequantize(s, DType::kF16, "positions >= 2^20");
  }
}

TEST(GpuCoverage, MoreThanFourKvHeadsAndBatchAbove10) {
  struct Case {
    ModelShape shape;
    int batch;
  };
  const Case cases[] = {{{1, 8, 32, 128}, 3}, {{1, 6, 12, 64}, 2}, {{1, 2, 8, 128}, 13}, {{1, 8, 16, 128}, 11}};
  uint64_t seed = 10700;
  for (const Case& c : cases) {
    std::vector<int> lengths;
    for (int b = 0; b < c.batch; ++b) lengths.push_back(1 + (b * 97 + 13) % 420);
    const PagedSetup s = make_setup(c.shape, config("quant-k2v2", 4, 8), lengths, seed++, 0);
    const auto q = random_queries(c.batch, c.shape, seed++, DType::kF32);
    const double err = worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, 0), cpu_attention(s, 0, q),
                                       c.shape.head_dim);
    std::printf("H %d Hq %d batch %d: worst row error %.2e\n", c.shape.n_kv_heads, c.shape.n_q_heads, c.batch, err);
    EXPECT_LT(err, kAttentionTolF32) << "H " << c.shape.n_kv_heads << " batch " << c.batch;
    check_dequantize(s, DType::kF16, "many heads / batch");
  }
}

TEST(GpuCoverage, PlannedLengthLargerThanTheRealOne) {
  const ModelShape shape{1, 2, 8, 128};
  const PagedSetup s = make_setup(shape, config("quant-k2v2", 4, 8), {10, 300}, 10800, 0);
  const auto q = random_queries(2, shape, 10801, DType::kF32);
  const auto ref = cpu_attention(s, 0, q);
  for (int extra : {1, 1000, 50000}) {
    AttentionRun run;
    run.max_coded_len = s.dev->view.max_coded_len + extra;
    run.with_status = true;
    const double err = worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, run), ref, 128);
    EXPECT_LT(err, kAttentionTolF32) << "plan + " << extra;
    EXPECT_EQ(run.status, 0u) << "plan + " << extra;
  }
  uint32_t word = 1;
  check_dequantize(s, DType::kF16, "plan longer", s.dev->view.max_coded_len + 77, &word);
  EXPECT_EQ(word, 0u);
}

TEST(GpuCoverage, SequenceBeyondThePlanIsFlaggedNotTruncated) {
  const ModelShape shape{1, 2, 8, 128};
  // Coded lengths 16 and 400 (flush 1, 4 sinks in the window): plan for 300 tokens.
  const PagedSetup s = make_setup(shape, config("quant-k2v2", 0, 1), {20, 404}, 10900, 0);
  ASSERT_EQ(s.dev->view.max_coded_len, 400);
  const auto q = random_queries(2, shape, 10901, DType::kF32);
  const auto ref = cpu_attention(s, 0, q);
  for (int split : {0, 64}) {
    AttentionRun run;
    run.split_tokens = split;
    run.max_coded_len = 300;  // 5 splits of 64 either way (the automatic minimum): 320 tokens, not 400
    run.with_status = true;
    const auto got = gpu_attention(s, q, DType::kF32, DType::kF32, run);
    EXPECT_EQ(run.status, static_cast<uint32_t>(cuda::kDeviceStatusBeyondPlan)) << "split " << split;
    EXPECT_EQ(cuda::device_status(run.status), Status::kBeyondPlan);
    const size_t row = static_cast<size_t>(shape.n_q_heads) * 128;
    // Sequence 0 fits: correct. Sequence 1 does not: every element NaN, never a truncated softmax.
    EXPECT_LT(worst_row_error(std::vector<float>(got.begin(), got.begin() + row),
                              std::vector<float>(ref.begin(), ref.begin() + row), 128),
              kAttentionTolF32);
    EXPECT_TRUE(std::all_of(got.begin() + row, got.end(), [](float x) { return std::isnan(x); }));
  }
  uint32_t word = 0;
  check_dequantize(s, DType::kF16, "beyond plan", 300, &word);  // writes the first 300 tokens only
  EXPECT_EQ(word, static_cast<uint32_t>(cuda::kDeviceStatusBeyondPlan));
}

TEST(GpuCoverage, UnalignedBuffersUseTheScalarFallbacks) {
  const ModelShape shape{1, 2, 8, 128};
  const PagedSetup s = make_setup(shape, config("quant-k3v2", 8, 16), {30, 250}, 11000, 0);
  ASSERT_GT(s.paged.window_lens[1], 0);  // the window split reads the moved window buffers
  for (DType t : {DType::kF16, DType::kF32, DType::kBF16}) {
    const auto q = random_queries(2, shape, 11001, t);
    const auto aligned = gpu_attention(s, q, t, t, 0);
    AttentionRun run;
    run.q_offset = 1;  // 2 or 4 bytes past a 16-byte boundary
    run.out_offset = 3;
    run.window_offset = 1;
    const auto moved = gpu_attention(s, q, t, t, run);
    EXPECT_EQ(moved, aligned) << "dtype " << to_string(t);  // same arithmetic, only the loads differ
    EXPECT_LT(worst_row_error(moved, cpu_attention(s, 0, q), 128), tolerance_for(t));
  }
}

TEST(GpuCoverage, MisalignedPoolsAndWorkspacesAreRefused) {
  const ArgumentCheck a(11100);
  const PagedSetup& s = a.s;
  const cuda::DecodeAttentionParams& p = a.p;
  size_t ws_bytes = 0;
  E8KV_STATUS_OK(cuda::decode_attention_workspace_bytes(p, &ws_bytes));
  DeviceBuffer<uint8_t> ws(ws_bytes + 16);
  EXPECT_EQ(cuda::paged_decode_attention(p, ws.get() + 16, ws_bytes, nullptr), Status::kSuccess);
  EXPECT_EQ(cuda::paged_decode_attention(p, ws.get() + 4, ws_bytes, nullptr), Status::kMisaligned);
  cuda::DecodeAttentionParams q = p;
  q.cache.pool = s.dev->view.pool + 8;
  EXPECT_EQ(cuda::paged_decode_attention(q, ws.get(), ws_bytes, nullptr), Status::kMisaligned);
  DeviceBuffer<uint32_t> status(2);
  q = p;
  q.status = reinterpret_cast<uint32_t*>(reinterpret_cast<uint8_t*>(status.get()) + 2);
  EXPECT_EQ(cuda::paged_decode_attention(q, ws.get(), ws_bytes, nullptr), Status::kMisaligned);
  cuda::DequantizeParams dp;
  DeviceBuffer<uint16_t> kout(20 * 2 * 128);
  DeviceBuffer<int64_t> indptr;
  indptr.upload({0});
  dp.codec = s.tables->params;
  dp.cache = s.dev->view;
  dp.cache.pool = s.dev->view.pool + 8;
  dp.keys_out = kout.get();
  dp.out_indptr = indptr.get();
  dp.out_token_stride = 2 * 128;
  dp.out_head_stride = 128;
  EXPECT_EQ(cuda::paged_dequantize(dp, nullptr), Status::kMisaligned);
  E8KV_CUDA_OK(cudaDeviceSynchronize());
}

TEST(GpuCoverage, AutomaticPlanFitsOneWaveOfTheDevice) {
  const ModelShape shape{1, 8, 32, 128};  // 8 KV heads, GQA 4
  std::vector<int> lengths(8, 2000);
  const PagedSetup s = make_setup(shape, config("quant-k2v2", 4, 8), lengths, 11200, 0);
  DeviceBuffer<float> dq(8 * 32 * 128), dout(8 * 32 * 128);
  cuda::DecodeAttentionParams p = attention_params(s, dq.get(), DType::kF32, dout.get(), DType::kF32, 0);
  const int slots = cuda::decode_attention_slots(p);
  int sms = 0;
  E8KV_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("device slots for split<128, E8P>: %d (%d SMs)\n", slots, sms);
  ASSERT_GE(slots, sms);
  ASSERT_EQ(slots % sms, 0);
  int chunk = 0;
  const int splits = cuda::decode_attention_splits(p, &chunk);
  const int64_t rows = 8 * 8;  // batch x KV heads x one query chunk
  EXPECT_LE(rows * (splits + 1), std::max<int64_t>(slots, rows * 2)) << "more CTAs than one wave";
  const cuda::SplitPlan expect = cuda::plan_decode_splits(p.cache.max_coded_len, rows, slots, true, 0);
  EXPECT_EQ(splits, expect.splits);
  EXPECT_EQ(chunk, expect.chunk);
  // An explicit slot budget is used as given.
  p.sm_slots = 1000;
  EXPECT_EQ(cuda::decode_attention_splits(p, &chunk), cuda::plan_decode_splits(p.cache.max_coded_len, rows, 1000, true, 0).splits);
  // And the output is right with the automatic plan.
  const auto q = random_queries(8, shape, 11201, DType::kF32);
  EXPECT_LT(worst_row_error(gpu_attention(s, q, DType::kF32, DType::kF32, 0), cpu_attention(s, 0, q), 128),
            kAttentionTolF32);
}

}  // namespace

int main(int argc, char** argv) { return e8kv_gpu_test_main(argc, argv); }
