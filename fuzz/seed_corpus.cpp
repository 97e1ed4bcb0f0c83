// Seed corpus of the container fuzzers (fuzz/seed_corpus.hpp): small synthetic caches compressed
// with every preset, written as format version 1 (qweight=0, gain_bits=16, rope=pre), version 2
// (rope=pre), version 3 (rope=residual, the default), version 4 (an fp16 tier), version 5 (a
// code tier coded as is) and version 6 (a centred code tier, RoPE frequency factors), plus
// per-head positions with post-RoPE keys and scaled RoPE, a pending query energy, an empty cache and plain fp16 / bf16 containers. Each blob is at most a few tens of KB.
#include "seed_corpus.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "e8kv/numeric/half.hpp"
#include "testing/synthetic_kv.hpp"

namespace e8kv::fuzz {

namespace {

synth::SyntheticSpec spec(int tokens, int head_dim, uint64_t seed) {
  synth::SyntheticSpec s;
  s.n_layers = 2;
  s.n_kv_heads = 2;
  s.n_q_heads = 4;
  s.head_dim = head_dim;
  s.tokens = tokens;
  s.obs_window = std::max(1, std::min(16, tokens));
  s.seed = seed;
  return s;
}

// Compresses tokens [0, tokens - appended) with queries and appends the rest one by one.
CompressedKV make_cache(const synth::SyntheticSpec& s, const Config& cfg, int appended) {
  const synth::SyntheticKV kv = synth::make_synthetic_kv(s);
  const KVCompressor c(ModelShape{s.n_layers, s.n_kv_heads, s.n_q_heads, s.head_dim}, cfg);
  const int prefill = s.tokens - appended;
  SequenceKV seq;
  std::vector<LayerQueries> qs;
  for (int l = 0; l < s.n_layers; ++l) {
    const size_t li = static_cast<size_t>(l);
    seq.layers.push_back({TensorView::nhd(kv.keys[li].data(), DType::kF32, prefill, s.n_kv_heads, s.head_dim),
                          TensorView::nhd(kv.values[li].data(), DType::kF32, prefill, s.n_kv_heads, s.head_dim)});
    if (s.tokens > 0)
      qs.push_back({TensorView::nhd(kv.queries[li].data(), DType::kF32, s.obs_window, s.n_q_heads, s.head_dim),
                    kv.query_positions.data()});
  }
  CompressedKV cache = c.compress(seq, s.tokens > 0 ? &qs : nullptr);
  const size_t row = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.head_dim);
  for (int t = prefill; t < s.tokens; ++t)
    for (int l = 0; l < s.n_layers; ++l)
      c.append(cache, l, &kv.keys[static_cast<size_t>(l)][static_cast<size_t>(t) * row],
               &kv.values[static_cast<size_t>(l)][static_cast<size_t>(t) * row], t);
  return cache;
}

}  // namespace

CompressedKV make_seed_cache(int tokens, int head_dim, uint64_t seed, const Config& cfg, int appended) {
  return make_cache(spec(tokens, head_dim, seed), cfg, appended);
}

namespace {

class Writer {
 public:
  explicit Writer(std::string dir) : dir_(std::move(dir)) {}
  // One file per options byte: checksums verified (1) or not (0), with codecs reused (3), and a
  // token range start in bits 2-6 (0x2D: start 11).
  void add(const std::string& name, const std::vector<uint8_t>& container) {
    for (uint8_t options : {uint8_t{0x00}, uint8_t{0x01}, uint8_t{0x03}, uint8_t{0x2D}}) {
      const std::string path = dir_ + "/seed-" + name + "-" + std::to_string(options);
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f.put(static_cast<char>(options));
      f.write(reinterpret_cast<const char*>(container.data()), static_cast<std::streamsize>(container.size()));
      if (!f) throw Error("write_seed_corpus: cannot write " + path);
      ++files_;
    }
  }
  int files() const { return files_; }

 private:
  std::string dir_;
  int files_ = 0;
};

}  // namespace

int write_seed_corpus(const std::string& dir) {
  Writer w(dir);
  container::ContainerOptions chunks;
  chunks.chunk_tokens = 16;
  // Every preset, each format version it can be written in: 40 tokens, 6 of them appended (a
  // residual window); the tier presets are version 5 in the pre-RoPE key frame (a tier coded as is)
  // and 6 in the residual one (the tier centred on the head's means).
  std::stringstream names(Config::preset_names());
  std::string preset;
  uint64_t seed = 100;
  while (std::getline(names, preset, ',')) {
    preset.erase(0, preset.find_first_not_of(' '));
    // Version 1: no query weighting, fp16 gains; 2: the defaults; 3: the RoPE-residual key frame.
    const std::pair<const char*, const char*> versions[] = {
        {"v1", ",qweight=0,gain_bits=16,rope=pre"}, {"v2", ",rope=pre"}, {"v3", ",rope=residual"}};
    for (const auto& [name, spec_tail] : versions) {
      const Config cfg =
          Config::parse("preset=" + preset + ",mean_tokens=8,residual=4,flush=8,sinks=2,recent=8" + spec_tail);
      const std::vector<uint8_t> bytes = container::serialize(make_cache(spec(40, 64, ++seed), cfg, 6), chunks);
      const int version = container::read_info(bytes.data(), bytes.size()).format_version;
      const int expected = cfg.code_tier > 0 ? (cfg.tier_center && name[1] == '3' ? 6 : 5) : name[1] - '0';
      if (version != expected)
        throw Error("write_seed_corpus: preset " + preset + " " + name + " was written as version " +
                    std::to_string(version));
      w.add(preset + "-" + name, bytes);
    }
  }
  // Per-head positions, post-RoPE keys, one rate per layer, yarn RoPE with partial rotary,
  // head_dim 128, adaptive transforms.
  {
    Config cfg = Config::parse(
        "evict=0.4,per_head=1,rope=post,key_gain=unbiased,value_gain=ls,recent=4,residual=3,flush=8,mean_tokens=8,"
        "sinks=2,layer_rates=ball3/vor2;rvq4/e8p2,rope_scaling=yarn,rope_factor=4,rope_original_max_position=32,"
        "rope_dim=96,softmax_scale=0.1");
    container::ContainerOptions adaptive = chunks;
    adaptive.adaptive = true;
    w.add("perhead-yarn", container::serialize(make_cache(spec(32, 128, 200), cfg, 4), adaptive));
  }
  // Version 4: an fp16 tier (pinned tokens among the coded ones), shared and per-head sets. Seeds
  // of their own (not the preset loop's count), chosen so the tier sits among coded tokens.
  seed = 130;
  for (const char* tail : {"", ",per_head=1,evict=0.3"}) {
    const Config cfg = Config::parse(std::string("preset=quant-k3v2,fp16_tier=0.15,mean_tokens=8,residual=4,flush=8,"
                                                 "sinks=2,recent=4") + tail);
    const std::vector<uint8_t> bytes = container::serialize(make_cache(spec(40, 64, ++seed), cfg, 6), chunks);
    if (container::read_info(bytes.data(), bytes.size()).format_version != 4)
      throw Error("write_seed_corpus: the fp16-tier cache was not written as version 4");
    w.add(std::string("fp16-tier") + (*tail ? "-per-head" : ""), bytes);
  }
  // Version 5: a code tier coded as is (a second code stream per head), shared and per-head sets,
  // beside an fp16 tier. Version 6: the same tier centred on the head's means, and RoPE frequency
  // factors (llama.cpp's rope_freqs).
  const struct {
    const char* name;
    const char* tail;
    int version;
    bool rope_factors;  // one factor per rotary pair of head_dim 64, shaped like Llama-3's
  } tiers[] = {{"code-tier", ",tier_center=0", 5, false},
               {"code-tier-per-head", ",tier_center=0,per_head=1,evict=0.3,fp16_tier=0.05", 5, false},
               {"centred-tier", "", 6, false},
               {"centred-tier-per-head", ",per_head=1,evict=0.3,fp16_tier=0.05", 6, false},
               {"rope-factors", ",tier_center=0", 6, true}};
  for (const auto& t : tiers) {
    Config cfg = Config::parse(std::string("preset=quant-k3v2,code_tier=0.2,mean_tokens=8,residual=4,flush=8,"
                                           "sinks=2,recent=4") + t.tail);
    if (t.rope_factors)
      for (int i = 0; i < 32; ++i) cfg.rope.freq_factors.push_back(i < 8 ? 1.0f : i < 24 ? 1.0f + 0.25f * (i - 7) : 8.0f);
    const std::vector<uint8_t> bytes = container::serialize(make_cache(spec(40, 64, ++seed), cfg, 6), chunks);
    const int version = container::read_info(bytes.data(), bytes.size()).format_version;
    if (version != t.version)
      throw Error(std::string("write_seed_corpus: ") + t.name + " was written as version " + std::to_string(version));
    w.add(t.name, bytes);
  }
  // Nothing flushed yet: the observation queries' energy is pending (version 2).
  w.add("pending-energy", container::serialize(make_cache(spec(6, 64, 201), Config::parse("preset=high"), 0), chunks));
  // No tokens at all.
  w.add("empty", container::serialize(make_cache(spec(0, 64, 202), Config::parse("preset=quant-k2v2"), 0), chunks));
  // Plain fp16 and bf16 tensors.
  {
    const synth::SyntheticKV kv = synth::make_synthetic_kv(spec(20, 64, 203));
    for (DType dt : {DType::kF16, DType::kBF16}) {
      std::vector<std::vector<uint16_t>> bits;
      for (const auto* src : {&kv.keys[0], &kv.values[0]}) {
        std::vector<uint16_t> b(src->size());
        for (size_t i = 0; i < b.size(); ++i)
          b[i] = dt == DType::kF16 ? float_to_fp16_bits((*src)[i]) : float_to_bf16_bits((*src)[i]);
        bits.push_back(std::move(b));
      }
      std::vector<TensorView> views;
      for (const auto& b : bits) views.push_back(TensorView::nhd(b.data(), dt, 20, 2, 64));
      container::ContainerOptions o;
      o.chunk_tokens = 8;
      w.add(dt == DType::kF16 ? "plain-fp16" : "plain-bf16", container::serialize_plain(views, o));
    }
  }
  return w.files();
}

void write_seeds_if_asked() {
  const char* dir = std::getenv("E8KV_FUZZ_WRITE_SEEDS");
  if (dir == nullptr || *dir == '\0') return;
  try {
    const int n = write_seed_corpus(dir);
    std::printf("[fuzz] wrote %d seeds to %s\n", n, dir);
    std::exit(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[fuzz] writing seeds failed: %s\n", e.what());
    std::exit(1);
  }
}

}  // namespace e8kv::fuzz
