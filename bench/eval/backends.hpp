// KV backends for the real-model evaluation: e8kv's compressed cache (attention reads the codes)
// and the peers, which are simulated (quantize, then keep the dequantized rows) with honest byte
// counts of what each peer would store.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "e8kv/codebook/relaxed.hpp"
#include "e8kv/codebook/scalar.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/llama/kv_backend.hpp"
#include "e8kv/llama/model.hpp"
#include "e8kv/transform/hadamard.hpp"
#include "e8kv/transform/rope.hpp"

namespace e8kv::eval {

/// A backend that can say how many bytes a decoder of its cache needs.
class MeasuredBackend : public llama::KvBackend {
 public:
  /// Bytes of the whole cache (all layers, K and V) as stored.
  virtual double bytes() const = 0;
  /// Tokens ever appended to layer 0 (the original token count).
  virtual int64_t original_tokens() const = 0;
  /// Optional note on how the rate was counted.
  virtual std::string rate_note() const { return ""; }
};

/// Attention of one query token over n dense rows [n, n_kv_heads, head_dim] (GQA: query head qh
/// reads KV head qh / (n_q_heads / n_kv_heads)), with the natural-log sum of exp(scale·q·k) per
/// query head (lse; −inf and out = 0 when n is 0), to merge with another key set: the library's
/// e8kv::dense_attention over rows every query sees.
void dense_attention_lse(const float* k, const float* v, int64_t n, int n_kv_heads, int n_q_heads, int head_dim,
                         const float* q, float scale, float* out, float* lse);

/// e8kv: KVCompressor + CompressedKV; append and attend go through the codes. At rest
/// (`at_rest`): only the prefill is compressed; appended tokens stay dense float rows beside the
/// cache, and attention merges e8kv's attention over the codes with the dense rows' (both with
/// their lse): the protocol of a cache compressed once and continued (bench/peers/peers.py).
class E8kvBackend : public MeasuredBackend {
 public:
  E8kvBackend(const KVCompressor& compressor, const llama::PrefillCapture& capture, const llama::ModelConfig& mc,
              bool at_rest = false)
      : c_(compressor), at_rest_(at_rest), H_(mc.n_kv_heads), Q_(mc.n_heads), d_(mc.head_dim),
        tail_k_(static_cast<size_t>(mc.n_layers)), tail_v_(static_cast<size_t>(mc.n_layers)),
        tail_last_(static_cast<size_t>(mc.n_layers), -1) {
    const int64_t n = capture.n_tokens;
    const int H = mc.n_kv_heads, Q = mc.n_heads, d = mc.head_dim;
    SequenceKV seq;
    std::vector<LayerQueries> queries;
    for (int l = 0; l < mc.n_layers; ++l) {
      seq.layers.push_back({TensorView::nhd(capture.k[l].data(), DType::kF32, n, H, d),
                            TensorView::nhd(capture.v[l].data(), DType::kF32, n, H, d)});
      const int64_t w = static_cast<int64_t>(capture.q_obs[l].size()) / (Q * d);
      queries.push_back({TensorView::nhd(capture.q_obs[l].data(), DType::kF32, w, Q, d), nullptr});
    }
    cache_ = c_.compress(seq, &queries);
  }
  void append(int layer, const float* k, const float* v, int64_t position) override;
  void attend(int layer, const float* q, int64_t position, float* out) override;
  /// The compressed cache's bytes (at rest: the prefill's; the dense rows are not stored).
  double bytes() const override { return static_cast<double>(cache_.bytes()); }
  int64_t original_tokens() const override { return cache_.original_tokens(); }
  const CompressedKV& cache() const { return cache_; }

 private:
  const KVCompressor& c_;
  CompressedKV cache_;
  bool at_rest_;
  int H_, Q_, d_;
  std::vector<std::vector<float>> tail_k_, tail_v_;  // at rest: per layer [tokens, H, d]
  std::vector<int64_t> tail_last_;                   // at rest: per layer, the last position appended
  std::vector<float> o_codes_, lse_codes_, o_tail_, lse_tail_;
};

enum class PeerKind { kQ8_0Rotated, kQ4_0Rotated, kKivi2, kKivi4, kRelaxedK3V2, kRelaxedK2V2 };

/// Peers as their projects store them, simulated: every row is quantized when that project would
/// quantize it and kept dequantized for a dense fp32 attention; bytes() counts what they would store.
///  - q8_0 / q4_0 (llama.cpp with its Hadamard rotation): each head vector rotated, blocks of 32
///    with an fp16 scale: 8.5 / 4.5 bits per element.
///  - KIVI-2 / KIVI-4: keys per channel in groups of 32 tokens, values per token in groups of 32
///    channels, fp16 scale and zero per group, the 128 most recent tokens in fp16.
///  - relaxed K3V2 / K2V2: the reference project's quant-only path as nexusquant-kv 0.6.3 runs it
///    (NexusQuantQuantOnly: keys leave RoPE, plain Sylvester Hadamard, relaxed-parity E8 with
///    levels 8 / 4 and one amax scale per vector, back); it has no fixed-rate index, so its rate is
///    the empirical entropy of its symbols (coset flag + per coordinate) plus the fp16 scales.
///    bench/peers/peers.py runs the package itself; docs/accuracy.md compares the two.
class PeerBackend : public MeasuredBackend {
 public:
  PeerBackend(PeerKind kind, const llama::ModelConfig& mc, const llama::PrefillCapture& capture);

  void append(int layer, const float* k, const float* v, int64_t position) override;
  void attend(int layer, const float* q, int64_t position, float* out) override;
  /// At rest: tokens appended from now on are kept as given (not quantized, not flushed).
  void stop_quantizing() { quantize_appended_ = false; }
  double bytes() const override;
  int64_t original_tokens() const override { return n_[0]; }
  std::string rate_note() const override;

 private:
  bool kivi() const { return kind_ == PeerKind::kKivi2 || kind_ == PeerKind::kKivi4; }
  void kivi_flush(int layer);
  void relaxed_key_roundtrip(float* k, int64_t position, std::vector<int16_t>& codes) const;
  size_t at(int layer, int head) const { return static_cast<size_t>(layer) * H_ + head; }

  PeerKind kind_;
  int L_, H_, Q_, d_;
  bool quantize_appended_ = true;
  bool adjacent_pairs_ = false;                  // the engine's keys rotate adjacent pairs (GGUF Llama)
  std::unique_ptr<transform::Rope> relaxed_rope_;  // relaxed peers: the model's RoPE, split halves
  std::vector<transform::RandomizedHadamard> rot_;  // per (layer, head)
  std::vector<int64_t> n_;                           // tokens per layer
  std::vector<std::vector<float>> k_, v_;            // per (layer, head): [tokens][d] as attention sees them
  std::vector<int64_t> kivi_k_done_, kivi_v_done_;   // per layer: tokens already quantized
  std::vector<std::vector<int16_t>> relaxed_codes_k_, relaxed_codes_v_;  // per layer
};

}  // namespace e8kv::eval
