// paged_encode against the CPU reference: every byte of the page pool (codes, gains, positions,
// and the untouched poison everywhere else) must equal what CacheCodecs' shared functions write,
// for random and adversarial inputs, all kernel codecs, head dims, dtypes and input layouts.
// Skips (exit 77) without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <random>
#include <vector>

#include "e8kv/quant/kv_vector_codec.hpp"
#include "cuda/encode_params.hpp"
#include "cuda/gpu_test_main.hpp"
#include "cuda/paged_gpu_util.hpp"

namespace {
using namespace e8kv;
using namespace e8kv::gputest;
using transform::RopeLayout;

constexpr uint8_t kPoison = 0xA5;

struct EncodeCase {
  int head_dim;
  quant::Codec key, value;
  bool pre_rope;
  RopeLayout rope_layout;
  int rotary_dim;
  DType dtype;
  bool hnd;
  bool per_head_positions;
  quant::GainPolicy key_gain, value_gain;
  float key_scale;
  bool center;
};

CacheLayout layout_for(const EncodeCase& c, int kv_heads) {
  CacheLayout L;
  L.n_layers = 1;
  L.n_kv_heads = kv_heads;
  L.n_q_heads = kv_heads;
  L.head_dim = c.head_dim;
  L.key_codec = {c.key};
  L.value_codec = {c.value};
  L.key_gain = c.key_gain;
  L.value_gain = c.value_gain;
  L.key_scale = c.key_scale;
  L.key_frame = c.pre_rope ? transform::KeyFrame::kPreRope : transform::KeyFrame::kPostRope;
  L.rope.layout = c.rope_layout;
  L.rope.rotary_dim = c.rotary_dim;
  L.per_head_positions = c.per_head_positions;
  L.center = c.center;
  L.rotation_seed = 0xE8E8 + c.head_dim;
  return L;
}

// The CPU reference for one vector: the shared functions CacheCodecs calls (without its
// non-finite rejection, so adversarial rows have a reference too).
void reference_encode(const CacheCodecs& codecs, int kind, int h, const float* x, int32_t pos, uint8_t* codes,
                      uint16_t* gain) {
  const quant::Codec c = kind == 0 ? codecs.layout().key_codec[0] : codecs.layout().value_codec[0];
  const int d = codecs.layout().head_dim;
  if (c == quant::Codec::kFp16) {
    for (int i = 0; i < d; ++i) {
      const uint16_t b = float_to_fp16_bits(x[i]);
      std::memcpy(codes + 2 * i, &b, 2);
    }
    *gain = 0;
    return;
  }
  const quant::VectorCodecArgs args = codecs.codec_args(0, h, kind);
  quant::dispatch_block_code(c, [&](auto code) {
    using Code = decltype(code);
    return kind == 0 ? quant::encode_key_vector<Code>(x, args, codecs.key_rope_view(), pos, codes, gain)
                     : quant::encode_value_vector<Code>(x, args, codes, gain);
  });
}

// Keys/values with outliers and norm spread, plus adversarial rows when `adversarial`.
std::vector<float> make_inputs(std::mt19937_64& rng, int n, int H, int d, bool adversarial) {
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n) * H * d);
  for (size_t i = 0; i < x.size(); ++i) x[i] = g(rng) * ((i % d) == 3 ? 9.f : 1.f);
  if (!adversarial) return x;
  const float specials[] = {0.f, 65504.f, -65504.f, 6e-8f, 0.5f, -1.5f, 1e-3f};
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < H; ++h) {
      float* v = &x[(static_cast<size_t>(t) * H + h) * d];
      switch (t % 9) {
        case 0: for (int i = 0; i < d; ++i) v[i] = 0.f; break;                              // all zero
        case 1: for (int i = 0; i < d; ++i) v[i] = i == t % d ? 1000.f : 0.f; break;        // one spike
        case 2: for (int i = 0; i < d; ++i) v[i] = specials[(i + t) % 7]; break;            // extremes
        case 3: for (int i = 0; i < d; ++i) v[i] = 0.5f * static_cast<float>((i % 5) - 2); break;  // lattice-like
        case 4: for (int i = 0; i < d; ++i) v[i] = 1.f; break;                              // constant
        case 5: v[t % d] = std::numeric_limits<float>::quiet_NaN(); break;                  // NaN
        case 6: v[(t + 1) % d] = std::numeric_limits<float>::infinity(); break;             // Inf
        default: break;
      }
    }
  return x;
}

// input_offset: the K/V buffers start this many elements past an aligned allocation (the
// kernel's scalar-load fallback must give the same bytes).
void run_encode_case(const EncodeCase& c, bool adversarial, uint64_t seed, int input_offset = 0) {
  SCOPED_TRACE("d " + std::to_string(c.head_dim) + " key " + quant::to_string(c.key) + " value " +
               quant::to_string(c.value) + " pre_rope " + std::to_string(c.pre_rope) + " center " +
               std::to_string(c.center) + " dtype " + to_string(c.dtype) +
               (c.hnd ? " HND" : " NHD") + (adversarial ? " adversarial" : ""));
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const int H = 3, d = c.head_dim, P = 16;
  const CacheCodecs codecs(layout_for(c, H));
  const std::vector<int32_t> prior = {0, 5, 33}, fresh = {1, 20, 47};
  std::vector<int32_t> capacity;
  int n = 0;
  for (size_t b = 0; b < prior.size(); ++b) {
    capacity.push_back(prior[b] + fresh[b]);
    n += fresh[b];
  }
  const PagedBlockTable table = make_block_table(capacity, P, seed, 2);
  const PagedLayout L = paged_layout_for(codecs, 0, P);
  std::vector<uint8_t> expect(static_cast<size_t>(table.n_pages) * L.page_bytes, kPoison);

  // Inputs in the engine's dtype and layout (k, v); the kernel rounds them to fp16 first, as
  // compress() does, so the reference codes the fp16 roundings (k16, v16).
  const std::vector<float> k = round_as(make_inputs(rng, n, H, d, adversarial), c.dtype);
  const std::vector<float> v = round_as(make_inputs(rng, n, H, d, adversarial), c.dtype);
  const std::vector<float> k16 = round_as(k, DType::kF16), v16 = round_as(v, DType::kF16);
  auto to_layout = [&](const std::vector<float>& nhd) {
    if (!c.hnd) return nhd;
    std::vector<float> out(nhd.size());
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < d; ++i) out[(static_cast<size_t>(h) * n + t) * d + i] = nhd[(static_cast<size_t>(t) * H + h) * d + i];
    return out;
  };
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
  for (size_t b = 0; b < prior.size(); ++b)
    for (int i = 0; i < fresh[b]; ++i) {
      positions.push_back(static_cast<int32_t>(b == 2 ? (1 << 20) + 3 * (prior[b] + i) : 1000 * b + prior[b] + i));
      slots.push_back(table.slot(static_cast<int>(b), prior[b] + i));
    }
  slots[7] = -1;  // a skipped token (padding): its slot must stay poisoned
  std::vector<int32_t> token_seq;
  for (size_t b = 0; b < prior.size(); ++b) token_seq.insert(token_seq.end(), fresh[b], static_cast<int32_t>(b));
  // Centring means per (sequence, head, kind), as CompressedKV::flush subtracts them.
  std::vector<uint16_t> means;
  if (c.center) {
    std::normal_distribution<float> g(0.f, 1.f);
    means.resize(prior.size() * H * 2 * d);
    for (auto& m : means) m = float_to_fp16_bits(adversarial ? 0.f : 2.f * g(rng));
  }
  // x − μ in the engine's frame: keys get μ rotated to their position (pre-RoPE keys).
  auto centre = [&](const float* x, int kind, int b, int h, int32_t pos, std::vector<float>& out) {
    out.assign(x, x + d);
    const quant::Codec codec = kind == 0 ? c.key : c.value;
    if (!c.center || codec == quant::Codec::kFp16) return;
    std::vector<float> mu(static_cast<size_t>(d));
    for (int i = 0; i < d; ++i) mu[static_cast<size_t>(i)] = fp16_bits_to_float(means[((static_cast<size_t>(b) * H + h) * 2 + kind) * d + i]);
    if (kind == 0 && c.pre_rope) quant::rope_table_rotate(mu.data(), codecs.key_rope_view(), pos, false);
    for (int i = 0; i < d; ++i) out[static_cast<size_t>(i)] -= mu[static_cast<size_t>(i)];
  };

  for (int j = 0; j < n; ++j) {
    if (slots[static_cast<size_t>(j)] < 0) continue;
    uint8_t* page = expect.data() + slots[static_cast<size_t>(j)] / P * L.page_bytes;
    const int s = static_cast<int>(slots[static_cast<size_t>(j)] % P);
    for (int h = 0; h < H; ++h) {
      const size_t off = (static_cast<size_t>(j) * H + h) * d;
      const int32_t pos = positions[static_cast<size_t>(j)];
      const int b = token_seq[static_cast<size_t>(j)];
      uint16_t gk = 0, gv = 0;
      std::vector<float> kc, vc;
      centre(&k16[off], 0, b, h, pos, kc);
      centre(&v16[off], 1, b, h, pos, vc);
      reference_encode(codecs, 0, h, kc.data(), pos, page + L.key_code_offset(h, s), &gk);
      reference_encode(codecs, 1, h, vc.data(), pos, page + L.value_code_offset(h, s), &gv);
      if (L.key_gain_bytes) std::memcpy(page + L.key_gain_offset(h, s), &gk, 2);
      if (L.value_gain_bytes) std::memcpy(page + L.value_gain_offset(h, s), &gv, 2);
      if (h < L.position_sets) std::memcpy(page + L.position_offset(h, s), &positions[static_cast<size_t>(j)], 4);
    }
  }

  DeviceBuffer<uint8_t> pool(expect.size()), dk, dv;
  pool.fill_bytes(kPoison);
  auto padded = [&](const std::vector<float>& x) {
    std::vector<uint8_t> bytes(static_cast<size_t>(input_offset) * dtype_size(c.dtype), 0);
    const std::vector<uint8_t> packed = pack_as(to_layout(x), c.dtype);
    bytes.insert(bytes.end(), packed.begin(), packed.end());
    return bytes;
  };
  dk.upload(padded(k));
  dv.upload(padded(v));
  DeviceBuffer<int32_t> dpos, dseq;
  DeviceBuffer<int64_t> dslots;
  DeviceBuffer<uint16_t> dmeans;
  dpos.upload(positions);
  dslots.upload(slots);
  dseq.upload(token_seq);
  if (c.center) dmeans.upload(means);
  DeviceCodecTables tables(codecs, 0);
  cuda::EncodeParams p = nhd_encode_params(
      tables.params, L, pool.get(), n, dk.get() + static_cast<size_t>(input_offset) * dtype_size(c.dtype),
      dv.get() + static_cast<size_t>(input_offset) * dtype_size(c.dtype), c.dtype, dpos.get(), dslots.get());
  p.n_pages = table.n_pages;
  if (c.hnd) {
    p.token_stride = d;
    p.head_stride = static_cast<int64_t>(n) * d;
  }
  if (c.center) {
    p.means = dmeans.get();
    p.token_seq = dseq.get();
  }
  E8KV_STATUS_OK(cuda::paged_encode(p, nullptr));
  E8KV_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = pool.download();
  ASSERT_EQ(got.size(), expect.size());
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != expect[i] && mismatches++ == 0) first = i;
  EXPECT_EQ(mismatches, 0u) << "first mismatch at pool byte " << first << " (page " << first / L.page_bytes
                            << ", offset " << first % L.page_bytes << ")";
}

const EncodeCase kCases[] = {
    {128, quant::Codec::kE8P, quant::Codec::kE8P, true, RopeLayout::kSplitHalf, 0, DType::kF16, false, false,
     quant::GainPolicy::kNormPreserving, quant::GainPolicy::kNormPreserving, 1.f, true},
    {128, quant::Codec::kRvq3, quant::Codec::kE8P, true, RopeLayout::kSplitHalf, 0, DType::kBF16, true, false,
     quant::GainPolicy::kNormPreserving, quant::GainPolicy::kLeastSquares, 1.f, false},
    {64, quant::Codec::kRvq4, quant::Codec::kRvq3, false, RopeLayout::kSplitHalf, 0, DType::kF32, false, false,
     quant::GainPolicy::kUnbiasedInnerProduct, quant::GainPolicy::kLeastSquares, 1.1f, true},
    {256, quant::Codec::kE8P, quant::Codec::kRvq4, true, RopeLayout::kInterleaved, 96, DType::kF16, false, false,
     quant::GainPolicy::kNormPreserving, quant::GainPolicy::kNormPreserving, 0.9f, true},
    {128, quant::Codec::kFp16, quant::Codec::kE8P, true, RopeLayout::kSplitHalf, 0, DType::kF16, false, false,
     quant::GainPolicy::kNormPreserving, quant::GainPolicy::kNormPreserving, 1.f, false},
    {128, quant::Codec::kE8P, quant::Codec::kFp16, true, RopeLayout::kSplitHalf, 64, DType::kBF16, false, true,
     quant::GainPolicy::kNormPreserving, quant::GainPolicy::kNormPreserving, 1.f, true},
    {64, quant::Codec::kFp16, quant::Codec::kFp16, false, RopeLayout::kSplitHalf, 0, DType::kF16, true, false,
     quant::GainPolicy::kNormPreserving, quant::GainPolicy::kNormPreserving, 1.f, false},
    {64, quant::Codec::kRvq3, quant::Codec::kRvq4, true, RopeLayout::kInterleaved, 0, DType::kF16, false, true,
     quant::GainPolicy::kLeastSquares, quant::GainPolicy::kUnbiasedInnerProduct, 1.f, true},
};

TEST(GpuPagedEncode, CodesAreByteIdenticalToTheCpuReference) {
  uint64_t seed = 8100;
  for (const EncodeCase& c : kCases) run_encode_case(c, false, seed++);
}

TEST(GpuPagedEncode, AdversarialInputsAreByteIdenticalToo) {
  uint64_t seed = 8200;
  for (const EncodeCase& c : kCases) run_encode_case(c, true, seed++);
}

TEST(GpuPagedEncode, UnalignedInputsGiveTheSameBytes) {
  uint64_t seed = 8300;
  for (const EncodeCase& c : kCases) run_encode_case(c, false, seed++, 1);  // 2 or 4 bytes off
}

// compress() on f32 input, then to_paged: the pool bytes an engine would get from the CPU. The
// GPU encoder, given the same f32 tokens, positions, slots and means, must write the same codes,
// gains and positions (it rounds the inputs to fp16 first, as compress() does).
TEST(GpuPagedEncode, F32AndBf16InputsGiveTheCodesOfCompress) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const char* preset : {"quant-k2v2", "quant-k3v3"}) {
      SCOPED_TRACE(std::string(preset) + " " + to_string(dtype));
      const ModelShape shape{1, 2, 4, 128};
      Config cfg = Config::preset(preset);
      cfg.gain_bits = 16;
      cfg.query_weighted_keys = false;
      cfg.residual_length = 0;
      cfg.flush_block = 1;
      cfg.mean_tokens = 8;
      const std::vector<int> lengths = {40, 123};
      ReferenceBatch ref = make_reference_batch(shape, cfg, lengths, 8400 + static_cast<uint64_t>(dtype));
      if (dtype == DType::kBF16)  // the engine's bf16 tensors: the CPU reference compresses their exact floats
        for (auto& d : ref.data)
          for (auto* kv : {&d.keys[0], &d.values[0]})
            for (float& x : *kv) x = bf16_bits_to_float(float_to_bf16_bits(x));
      if (dtype == DType::kBF16) {
        ref.caches.clear();
        for (size_t b = 0; b < lengths.size(); ++b) {
          SequenceKV seq;
          seq.layers.push_back({TensorView::nhd(ref.data[b].keys[0].data(), DType::kF32, lengths[b], 2, 128),
                                TensorView::nhd(ref.data[b].values[0].data(), DType::kF32, lengths[b], 2, 128)});
          ref.caches.push_back(ref.compressor->compress(seq));
        }
      }
      PagedOptions opt;
      opt.shuffle_seed = 8401;
      const PagedLayer expect = to_paged(ref.pointers(), 0, opt);
      const PagedLayout& L = expect.layout;
      const int H = 2, d = 128;
      // The coded tokens of every sequence, in order: their positions (= input rows), slots, sequence.
      std::vector<float> k, v;
      std::vector<int32_t> positions, token_seq;
      std::vector<int64_t> slots;
      for (size_t b = 0; b < lengths.size(); ++b) {
        const auto& pos = ref.caches[b].positions(0, 0);
        for (size_t t = 0; t < pos.size(); ++t) {
          const float* kr = &ref.data[b].keys[0][static_cast<size_t>(pos[t]) * H * d];
          const float* vr = &ref.data[b].values[0][static_cast<size_t>(pos[t]) * H * d];
          k.insert(k.end(), kr, kr + H * d);
          v.insert(v.end(), vr, vr + H * d);
          positions.push_back(pos[t]);
          token_seq.push_back(static_cast<int32_t>(b));
          slots.push_back(expect.table.slot(static_cast<int>(b), static_cast<int64_t>(t)));
        }
      }
      const int n = static_cast<int>(positions.size());
      ASSERT_GT(n, 100);
      DeviceCodecTables tables(ref.caches[0].codecs(), 0);
      DeviceBuffer<uint8_t> pool(expect.pool.size()), dk, dv;
      pool.fill_bytes(0);
      dk.upload(pack_as(k, dtype));
      dv.upload(pack_as(v, dtype));
      DeviceBuffer<int32_t> dpos, dseq;
      DeviceBuffer<int64_t> dslots;
      DeviceBuffer<uint16_t> dmeans;
      dpos.upload(positions);
      dseq.upload(token_seq);
      dslots.upload(slots);
      dmeans.upload(expect.means);
      cuda::EncodeParams p = nhd_encode_params(tables.params, L, pool.get(), n, dk.get(), dv.get(), dtype, dpos.get(),
                                               dslots.get(), dmeans.get(), dseq.get());
      p.n_pages = expect.table.n_pages;
      E8KV_STATUS_OK(cuda::paged_encode(p, nullptr));
      E8KV_CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint8_t> got = pool.download();
      size_t compared = 0, mismatches = 0;
      for (int j = 0; j < n; ++j) {
        const size_t page = static_cast<size_t>(slots[static_cast<size_t>(j)] / L.page_tokens) * static_cast<size_t>(L.page_bytes);
        const int sl = static_cast<int>(slots[static_cast<size_t>(j)] % L.page_tokens);
        for (int h = 0; h < H; ++h) {
          const std::pair<int64_t, int32_t> fields[] = {{L.key_code_offset(h, sl), L.key_code_bytes},
                                                        {L.key_gain_offset(h, sl), L.key_gain_bytes},
                                                        {L.value_code_offset(h, sl), L.value_code_bytes},
                                                        {L.value_gain_offset(h, sl), L.value_gain_bytes},
                                                        {L.position_offset(h, sl), 4}};
          for (const auto& [off, len] : fields)
            for (int32_t i = 0; i < len; ++i) {
              ++compared;
              mismatches += got[page + static_cast<size_t>(off + i)] != expect.pool[page + static_cast<size_t>(off + i)];
            }
        }
      }
      EXPECT_EQ(mismatches, 0u) << "of " << compared << " bytes";
    }
  }
}

TEST(GpuPagedEncode, SlotsOutsideThePoolAreFlaggedNotWritten) {
  EncodeCase c = kCases[0];
  const CacheCodecs codecs(layout_for(c, 2));
  DeviceCodecTables tables(codecs, 0);
  const PagedLayout L = paged_layout_for(codecs, 0, 16);
  DeviceBuffer<uint8_t> pool(static_cast<size_t>(L.page_bytes) * 2);  // page 1 is a guard page
  pool.fill_bytes(kPoison);
  DeviceBuffer<uint16_t> x(3 * 2 * 128);
  x.fill_bytes(0x3C);  // fp16 ~1.06
  DeviceBuffer<int32_t> pos;
  pos.upload({0, 1, 2});
  DeviceBuffer<int64_t> slot;
  slot.upload({0, 16, 1});  // the middle token points past a 1-page pool
  DeviceBuffer<uint32_t> status;
  status.upload({0u});
  cuda::EncodeParams p =
      nhd_encode_params(tables.params, L, pool.get(), 3, x.get(), x.get(), DType::kF16, pos.get(), slot.get());
  p.n_pages = 1;
  p.status = status.get();
  E8KV_STATUS_OK(cuda::paged_encode(p, nullptr));
  E8KV_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(status.download()[0], static_cast<uint32_t>(cuda::kDeviceStatusSlotOutOfPool));
  const auto bytes = pool.download();
  EXPECT_TRUE(std::all_of(bytes.begin() + L.page_bytes, bytes.end(), [](uint8_t b) { return b == kPoison; }))
      << "the guard page was written";
  EXPECT_NE(bytes[static_cast<size_t>(L.key_code_offset(0, 1))], kPoison);  // slot 1 of page 0 was
}

TEST(GpuPagedEncode, UnsupportedCombinationsFailLoudly) {
  EncodeCase c = kCases[0];
  const CacheCodecs codecs(layout_for(c, 2));
  DeviceCodecTables tables(codecs, 0);
  const PagedLayout L = paged_layout_for(codecs, 0, 16);
  DeviceBuffer<uint8_t> pool(static_cast<size_t>(L.page_bytes));
  DeviceBuffer<uint16_t> x(2 * 128);
  DeviceBuffer<int32_t> pos(1);
  DeviceBuffer<int64_t> slot(1);
  pos.fill_bytes(0);
  slot.fill_bytes(0);
  const cuda::EncodeParams p =
      nhd_encode_params(tables.params, L, pool.get(), 1, x.get(), x.get(), DType::kF16, pos.get(), slot.get());
  EXPECT_EQ(cuda::paged_encode(p, nullptr), Status::kSuccess);
  cuda::EncodeParams q = p;
  q.codec.head_dim = 96;
  EXPECT_EQ(cuda::paged_encode(q, nullptr), Status::kUnsupportedHeadDim);
  q = p;
  q.codec.key_codec = quant::Codec::kBall3;
  EXPECT_EQ(cuda::paged_encode(q, nullptr), Status::kUnsupportedBits);
  q = p;
  q.dtype = static_cast<DType>(7);
  EXPECT_EQ(cuda::paged_encode(q, nullptr), Status::kUnsupportedDtype);
  q = p;
  q.codec.rotary_dim = 24;  // split-half pairs need rotary_dim % 16 == 0
  EXPECT_EQ(cuda::paged_encode(q, nullptr), Status::kInvalidArgument);
  q = p;
  q.layout.page_bytes += 16;  // not the layout of this codec
  EXPECT_EQ(cuda::paged_encode(q, nullptr), Status::kInvalidArgument);
  q = p;
  q.codec.sign_bits = nullptr;
  EXPECT_EQ(cuda::paged_encode(q, nullptr), Status::kInvalidArgument);
  q = p;
  q.means = x.get();
  q.token_seq = nullptr;  // means without token_seq
  EXPECT_EQ(cuda::paged_encode(q, nullptr), Status::kInvalidArgument);
  q = p;
  q.pool = pool.get() + 8;  // pools are read and written with 16-byte accesses
  EXPECT_EQ(cuda::paged_encode(q, nullptr), Status::kMisaligned);
  q = p;
  q.n_pages = -1;
  EXPECT_EQ(cuda::paged_encode(q, nullptr), Status::kInvalidArgument);
  q = p;
  q.n_tokens = 0;
  q.keys = nullptr;
  EXPECT_EQ(cuda::paged_encode(q, nullptr), Status::kSuccess);  // nothing to do
  E8KV_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace

int main(int argc, char** argv) { return e8kv_gpu_test_main(argc, argv); }
