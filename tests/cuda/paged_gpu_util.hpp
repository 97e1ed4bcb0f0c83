// Helpers for the paged KV GPU tests: RAII device buffers, a PagedLayer and its codec tables on
// the device, reference caches built on the CPU. Included by tests/cuda/*_test.cu only.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/cache/paged_kv.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/cuda/paged_kv.cuh"
#include "e8kv/numeric/half.hpp"
#include "testing/synthetic_kv.hpp"

namespace e8kv::gputest {

#define E8KV_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())
#define E8KV_STATUS_OK(expr) ASSERT_EQ((expr), ::e8kv::Status::kSuccess) << #expr

/// Owning device allocation of n elements of T.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { allocate(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  void allocate(size_t n) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    n_ = n;
    if (n > 0 && cudaMalloc(&ptr_, n * sizeof(T)) != cudaSuccess) {
      ptr_ = nullptr;
      n_ = 0;
      ADD_FAILURE() << "cudaMalloc of " << n * sizeof(T) << " bytes failed";
    }
  }
  void upload(const std::vector<T>& host) {
    allocate(host.size());
    if (!host.empty() && ptr_) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }
  /// Fills every byte with `byte` (0xFF: NaN for floats and fp16/bf16).
  void fill_bytes(int byte) {
    if (n_ > 0) {
      EXPECT_EQ(cudaMemset(ptr_, byte, n_ * sizeof(T)), cudaSuccess);
    }
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

/// One layer's tables on the device: the RoPE table, the packed sign bits and the RoPE delta
/// table of the mean term (RoPE-residual keys).
struct DeviceCodecTables {
  DeviceBuffer<float> rope_table;
  DeviceBuffer<uint32_t> sign_bits;
  DeviceBuffer<float> rope_delta_table;
  cuda::LayerCodecParams params;

  DeviceCodecTables(const CacheCodecs& codecs, int layer) {
    rope_table.upload(codecs.rope_table());
    sign_bits.upload(packed_sign_bits(codecs, layer));
    rope_delta_table.upload(e8kv::rope_delta_table(codecs));
    params = cuda::layer_codec_params(codecs, layer, rope_table.get(), sign_bits.get(), rope_delta_table.get());
  }
};

/// A PagedLayer on the device.
struct DevicePagedLayer {
  DeviceBuffer<uint8_t> pool;
  DeviceBuffer<int32_t> page_indptr, page_indices, coded_lens, window_lens;
  DeviceBuffer<uint16_t> window_keys, window_values, means, key_scales, gain_refs;
  cuda::PagedCacheView view;

  explicit DevicePagedLayer(const PagedLayer& p) {
    pool.upload(p.pool);
    page_indptr.upload(p.table.page_indptr);
    page_indices.upload(p.table.page_indices.empty() ? std::vector<int32_t>{0} : p.table.page_indices);
    coded_lens.upload(p.table.coded_lens);
    window_lens.upload(p.window_lens);
    window_keys.upload(p.window_keys.empty() ? std::vector<uint16_t>{0} : p.window_keys);
    window_values.upload(p.window_values.empty() ? std::vector<uint16_t>{0} : p.window_values);
    view.layout = p.layout;
    view.pool = pool.get();
    view.page_indptr = page_indptr.get();
    view.page_indices = page_indices.get();
    view.coded_lens = coded_lens.get();
    view.batch = p.table.batch();
    view.max_coded_len = 0;
    for (int32_t n : p.table.coded_lens) view.max_coded_len = std::max(view.max_coded_len, n);
    if (!p.means.empty()) {
      means.upload(p.means);
      view.means = means.get();
    }
    if (!p.key_scales.empty()) {
      key_scales.upload(p.key_scales);
      view.key_scales = key_scales.get();
    }
    if (!p.gain_refs.empty()) {
      gain_refs.upload(p.gain_refs);
      view.gain_refs = gain_refs.get();
    }
  }
};

/// A ragged batch of synthetic sequences compressed on the CPU (the reference).
struct ReferenceBatch {
  ModelShape shape;
  std::unique_ptr<KVCompressor> compressor;
  std::vector<synth::SyntheticKV> data;
  std::vector<CompressedKV> caches;

  std::vector<const CompressedKV*> pointers() const {
    std::vector<const CompressedKV*> out;
    for (const auto& c : caches) out.push_back(&c);
    return out;
  }
};

/// first_position: the position of every sequence's first token (positions run on from it).
/// with_queries: observation queries at compress (query-weighted keys get their channel scales).
inline ReferenceBatch make_reference_batch(const ModelShape& shape, const Config& cfg, const std::vector<int>& lengths,
                                           uint64_t seed, int32_t first_position = 0, bool with_queries = false) {
  ReferenceBatch out;
  out.shape = shape;
  out.compressor = std::make_unique<KVCompressor>(shape, cfg);
  for (size_t b = 0; b < lengths.size(); ++b) {
    synth::SyntheticSpec s;
    s.n_layers = shape.n_layers;
    s.n_kv_heads = shape.n_kv_heads;
    s.n_q_heads = shape.n_q_heads;
    s.head_dim = shape.head_dim;
    s.tokens = lengths[b];
    s.obs_window = 4;
    s.seed = seed + 17 * b;
    out.data.push_back(synth::make_synthetic_kv(s));
  }
  for (size_t b = 0; b < lengths.size(); ++b) {
    SequenceKV seq;
    seq.first_position = first_position;
    const auto& d = out.data[b];
    for (int l = 0; l < shape.n_layers; ++l)
      seq.layers.push_back({TensorView::nhd(d.keys[l].data(), DType::kF32, lengths[b], shape.n_kv_heads, shape.head_dim),
                            TensorView::nhd(d.values[l].data(), DType::kF32, lengths[b], shape.n_kv_heads, shape.head_dim)});
    std::vector<LayerQueries> queries;
    for (int l = 0; l < shape.n_layers && with_queries; ++l) {
      LayerQueries lq;
      lq.queries = TensorView::nhd(d.queries[l].data(), DType::kF32, static_cast<int64_t>(d.query_positions.size()),
                                   shape.n_q_heads, shape.head_dim);
      lq.positions = d.query_positions.data();
      queries.push_back(lq);
    }
    out.caches.push_back(out.compressor->compress(seq, with_queries && lengths[b] > 0 ? &queries : nullptr));
  }
  return out;
}

/// float -> storage bits of dtype (fp16 / bf16), and back.
inline uint16_t to_bits(float x, DType t) { return t == DType::kF16 ? float_to_fp16_bits(x) : float_to_bf16_bits(x); }
inline float from_bits(uint16_t b, DType t) { return t == DType::kF16 ? fp16_bits_to_float(b) : bf16_bits_to_float(b); }

/// Host copy of n floats in dtype t (f32: the bytes of the floats).
inline std::vector<uint8_t> pack_as(const std::vector<float>& x, DType t) {
  std::vector<uint8_t> out(x.size() * dtype_size(t));
  for (size_t i = 0; i < x.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(&out[4 * i], &x[i], 4);
    } else {
      const uint16_t b = to_bits(x[i], t);
      std::memcpy(&out[2 * i], &b, 2);
    }
  }
  return out;
}

/// The values a dtype round trip gives (what the kernels see).
inline std::vector<float> round_as(const std::vector<float>& x, DType t) {
  if (t == DType::kF32) return x;
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = from_bits(to_bits(x[i], t), t);
  return out;
}

}  // namespace e8kv::gputest
