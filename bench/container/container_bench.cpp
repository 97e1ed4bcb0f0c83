// e8kv-container-bench: sizes and speeds of the offload container on synthetic caches, and the
// writer of the golden files in tests/data (--write-golden DIR).
//
//   e8kv-container-bench [--layers 4] [--kv-heads 8] [--q-heads 32] [--head-dim 128]
//                        [--tokens 2048] [--seed 1] [--level 3] [--chunk 256] [--reps 5]
//   e8kv-container-bench --write-golden tests/data
//
// Per cache configuration it prints, in one run:
//   * sizes: raw fp16 K+V, zstd of raw fp16, the plain container, CompressedKV::bytes(), the
//     container (default transforms, adaptive) and per stream kind the stored bytes for every
//     transform candidate, plus "coords-delta" (codes as lattice coordinates, delta along tokens,
//     then zstd: a candidate measured here only);
//   * speeds per core: container serialize / deserialize against plain zstd (same level) on the
//     same bytes (the cache's streams concatenated), MB/s of the cache's bytes, best of --reps
//     runs in thread CPU time. Deserialization reuses the cache's codecs
//     (DeserializeOptions::codecs); building fresh ones is a fixed cost reported separately.
#include <zstd.h>

#include <algorithm>
#include <ctime>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "container/stream_transform.hpp"  // internal: the bench measures transforms outside the format
#include "testing/cache_digest.hpp"
#include "e8kv/cache/cache_codecs.hpp"
#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/container/container.hpp"
#include "e8kv/numeric/half.hpp"
#include "e8kv/quant/codec.hpp"
#include "testing/synthetic_kv.hpp"
#include "e8kv/version.hpp"

namespace {

using namespace e8kv;
using container::StreamKind;
using container::Transform;

struct Args {
  int layers = 4, kv_heads = 8, q_heads = 32, head_dim = 128, tokens = 2048;
  uint64_t seed = 1;
  int level = 3, chunk = 256, reps = 5;
  std::string golden_dir;
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: e8kv-container-bench [--layers N] [--kv-heads N] [--q-heads N] [--head-dim D] [--tokens N]\n"
               "                            [--seed S] [--level L] [--chunk T] [--reps R]\n"
               "       e8kv-container-bench --write-golden DIR\n");
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage();
    const std::string v = argv[++i];
    if (k == "--layers") a.layers = std::stoi(v);
    else if (k == "--kv-heads") a.kv_heads = std::stoi(v);
    else if (k == "--q-heads") a.q_heads = std::stoi(v);
    else if (k == "--head-dim") a.head_dim = std::stoi(v);
    else if (k == "--tokens") a.tokens = std::stoi(v);
    else if (k == "--seed") a.seed = std::stoull(v);
    else if (k == "--level") a.level = std::stoi(v);
    else if (k == "--chunk") a.chunk = std::stoi(v);
    else if (k == "--reps") a.reps = std::stoi(v);
    else if (k == "--write-golden") a.golden_dir = v;
    else usage();
  }
  return a;
}

// ---- caches -----------------------------------------------------------------------------------

struct Made {
  synth::SyntheticKV kv;
  std::vector<std::vector<uint16_t>> fp16;  // [layer*2 + kv] fp16 bits, NHD
  ModelShape shape;
};

Made make_kv(const synth::SyntheticSpec& s) {
  Made m;
  m.kv = synth::make_synthetic_kv(s);
  m.shape = ModelShape{s.n_layers, s.n_kv_heads, s.n_q_heads, s.head_dim};
  for (int l = 0; l < s.n_layers; ++l)
    for (const auto* src : {&m.kv.keys[static_cast<size_t>(l)], &m.kv.values[static_cast<size_t>(l)]}) {
      std::vector<uint16_t> h(src->size());
      for (size_t i = 0; i < h.size(); ++i) h[i] = float_to_fp16_bits((*src)[i]);
      m.fp16.push_back(std::move(h));
    }
  return m;
}

CompressedKV compress(const Made& m, const Config& cfg, int appended = 0) {
  const KVCompressor c(m.shape, cfg);
  const auto& s = m.kv.spec;
  const int prefill = s.tokens - appended;
  SequenceKV seq;
  std::vector<LayerQueries> qs;
  for (int l = 0; l < s.n_layers; ++l) {
    seq.layers.push_back({TensorView::nhd(m.kv.keys[static_cast<size_t>(l)].data(), DType::kF32, prefill, s.n_kv_heads, s.head_dim),
                          TensorView::nhd(m.kv.values[static_cast<size_t>(l)].data(), DType::kF32, prefill, s.n_kv_heads, s.head_dim)});
    qs.push_back({TensorView::nhd(m.kv.queries[static_cast<size_t>(l)].data(), DType::kF32, std::min(s.obs_window, s.tokens),
                                  s.n_q_heads, s.head_dim),
                  m.kv.query_positions.data()});
  }
  CompressedKV cache = c.compress(seq, cfg.eviction_rate > 0 || cfg.fp16_tier > 0 || cfg.code_tier > 0 ? &qs : nullptr);
  const size_t row = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.head_dim);
  for (int t = prefill; t < s.tokens; ++t)
    for (int l = 0; l < s.n_layers; ++l)
      c.append(cache, l, &m.kv.keys[static_cast<size_t>(l)][static_cast<size_t>(t) * row],
               &m.kv.values[static_cast<size_t>(l)][static_cast<size_t>(t) * row], t);
  return cache;
}

// ---- container inspection (docs/format.md offsets) -----------------------------------------------

template <class T>
T rd(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Stored bytes per stream kind, summed over chunks; and raw bytes.
struct StreamSizes {
  std::map<int, uint64_t> stored, raw;
  std::map<int, std::map<int, uint64_t>> by_transform;  // kind -> transform -> count of streams
};

StreamSizes stream_sizes(const std::vector<uint8_t>& c) {
  StreamSizes s;
  const uint64_t header_bytes = rd<uint64_t>(c.data() + 16);
  uint64_t off = header_bytes;
  while (off < c.size()) {
    const uint8_t* h = c.data() + off;
    const uint32_t n_streams = rd<uint32_t>(h + 4);
    const uint64_t payload = rd<uint64_t>(h + 24);
    for (uint32_t i = 0; i < n_streams; ++i) {
      const uint8_t* d = h + 40 + 24 * i;
      s.stored[d[0]] += rd<uint64_t>(d + 16);
      s.raw[d[0]] += rd<uint64_t>(d + 8);
      s.by_transform[d[0]][d[1]] += 1;
    }
    off += 40 + payload;
  }
  return s;
}

// ---- lattice coordinates of codes (for the coords-delta measurement) -----------------------------

// Integer coordinates of one block index; returns the count (8 or 16), 0 if the codec has none.
int block_coords(quant::Codec c, uint32_t index, int8_t* out) {
  float z[8];
  auto put = [&](const float* v, int8_t* o, float f) {
    for (int i = 0; i < 8; ++i) o[i] = static_cast<int8_t>(std::lrint(v[i] * f));
  };
  switch (c) {
    case quant::Codec::kE8P:
      codebook::E8P::decode_lattice(index, z);
      put(z, out, 4.f);
      return 8;
    case quant::Codec::kRvq3:
      codebook::E8P::decode_lattice(index & 0xFFFFu, z);
      put(z, out, 4.f);
      codebook::E81B::decode_lattice(index >> 16, z);
      put(z, out + 8, 2.f);
      return 16;
    case quant::Codec::kRvq4:
      codebook::E8P::decode_lattice(index & 0xFFFFu, z);
      put(z, out, 4.f);
      codebook::E8P::decode_lattice(index >> 16, z);
      put(z, out + 8, 4.f);
      return 16;
    case quant::Codec::kBall3: case quant::Codec::kBall4: case quant::Codec::kVoronoi2: case quant::Codec::kVoronoi3:
    case quant::Codec::kVoronoi4: {
      return quant::dispatch_block_code(c, [&](auto code) {
        using Code = decltype(code);
        Code::decode(index, z);
        put(z, out, 2.f * Code::kInputScale);  // twice the lattice point: integers
        return 8;
      });
    }
    case quant::Codec::kLloydMax2: case quant::Codec::kLloydMax3: case quant::Codec::kLloydMax4: {
      const int b = quant::index_bits(c) / 8;
      for (int i = 0; i < 8; ++i) out[i] = static_cast<int8_t>((index >> (b * i)) & ((1u << b) - 1));
      return 8;
    }
    case quant::Codec::kFp16: break;
  }
  return 0;
}

// zstd size of the coded-token codes of every layer as lattice coordinates, per chunk of T
// tokens (all heads), with or without an arithmetic delta along tokens.
uint64_t coords_size(const CompressedKV& cache, bool keys, int T, int level, bool delta) {
  const CacheLayout& L = cache.layout();
  uint64_t total = 0;
  std::vector<uint8_t> raw, tr, z;
  for (int l = 0; l < L.n_layers; ++l) {
    const quant::Codec c = keys ? L.key_codec[static_cast<size_t>(l)] : L.value_codec[static_cast<size_t>(l)];
    if (c == quant::Codec::kFp16) return 0;
    const int ib = quant::index_bits(c) / 8, blocks = L.head_dim / 8;
    int8_t probe[16];
    const int per_block = block_coords(c, 0, probe);
    const int64_t n = cache.coded_tokens(l, 0);
    for (int64_t t0 = 0; t0 < n; t0 += T) {
      const int64_t t1 = std::min<int64_t>(n, t0 + T);
      container::StreamShape sh{{}, static_cast<int64_t>(blocks) * per_block, 1};
      raw.clear();
      for (int h = 0; h < L.n_kv_heads; ++h) {
        const auto& hd = cache.layer(l).heads[static_cast<size_t>(h)];
        const auto& codes = keys ? hd.key_codes : hd.value_codes;
        sh.segment_rows.push_back(t1 - t0);
        for (int64_t t = t0; t < t1; ++t)
          for (int b = 0; b < blocks; ++b) {
            const uint8_t* p = &codes[(static_cast<size_t>(t) * blocks + b) * ib];
            uint32_t idx = 0;
            for (int k = 0; k < ib; ++k) idx |= static_cast<uint32_t>(p[k]) << (8 * k);
            int8_t co[16];
            block_coords(c, idx, co);
            raw.insert(raw.end(), reinterpret_cast<uint8_t*>(co), reinterpret_cast<uint8_t*>(co) + per_block);
          }
      }
      tr.resize(raw.size());
      container::transform_forward(delta ? Transform::kSubDelta : Transform::kNone, sh, raw.data(), tr.data());
      z.resize(ZSTD_compressBound(tr.size()));
      total += ZSTD_compress(z.data(), z.size(), tr.data(), tr.size(), level);
    }
  }
  return total;
}

// The cache's streams concatenated (what plain zstd is compared on).
std::vector<uint8_t> flat_bytes(const CompressedKV& cache) {
  std::vector<uint8_t> out;
  auto add = [&](const auto& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(v[0]));
  };
  for (int l = 0; l < cache.n_layers(); ++l) {
    const auto& ld = cache.layer(l);
    for (size_t s = 0; s < ld.positions.size(); ++s) {
      add(ld.positions[s]);
      add(ld.window_positions[s]);
    }
    for (const auto& t : ld.tier_positions) add(t);
    for (const auto& h : ld.heads) {
      add(h.key_codes);
      add(h.value_codes);
      add(h.key_gains);
      add(h.value_gains);
      add(h.window_keys);
      add(h.window_values);
      add(h.tier_key_codes);
      add(h.tier_value_codes);
      add(h.tier_key_gains);
      add(h.tier_value_gains);
    }
  }
  return out;
}

// CPU time of this thread (user + system): "per core" figures stay meaningful on a shared,
// loaded machine, where wall time would count the time other processes held the core.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = thread_seconds();
    f();
    best = std::min(best, thread_seconds() - t0);
  }
  return best;
}

double mbps(size_t bytes, double s) { return static_cast<double>(bytes) / s / 1e6; }

void run_bench(const Args& a) {
  synth::SyntheticSpec spec;
  spec.n_layers = a.layers;
  spec.n_kv_heads = a.kv_heads;
  spec.n_q_heads = a.q_heads;
  spec.head_dim = a.head_dim;
  spec.tokens = a.tokens;
  spec.seed = a.seed;
  const Made m = make_kv(spec);
  std::printf("e8kv-container-bench  e8kv %s  zstd %s  crc32c %s\n", E8KV_VERSION_STRING, ZSTD_versionString(),
              container::crc32c_hardware_available() ? "sse4.2" : "portable");
  std::printf("synthetic KV: layers %d, kv_heads %d, q_heads %d, head_dim %d, tokens %d, seed %llu; zstd level %d, "
              "chunk %d tokens, best of %d\n\n",
              a.layers, a.kv_heads, a.q_heads, a.head_dim, a.tokens, static_cast<unsigned long long>(a.seed), a.level,
              a.chunk, a.reps);

  // Raw fp16 and its lossless baselines.
  std::vector<uint8_t> raw16;
  for (const auto& t : m.fp16)
    raw16.insert(raw16.end(), reinterpret_cast<const uint8_t*>(t.data()),
                 reinterpret_cast<const uint8_t*>(t.data()) + 2 * t.size());
  std::vector<uint8_t> z(ZSTD_compressBound(raw16.size()));
  size_t zsize = 0;
  const double zc = best_seconds(a.reps, [&] { zsize = ZSTD_compress(z.data(), z.size(), raw16.data(), raw16.size(), a.level); });
  std::vector<uint8_t> back(raw16.size());
  const double zd = best_seconds(a.reps, [&] { ZSTD_decompress(back.data(), back.size(), z.data(), zsize); });
  container::ContainerOptions po;
  po.zstd_level = a.level;
  po.chunk_tokens = a.chunk;
  std::vector<TensorView> views;
  for (const auto& t : m.fp16) views.push_back(TensorView::nhd(t.data(), DType::kF16, a.tokens, a.kv_heads, a.head_dim));
  std::vector<uint8_t> plain;
  const double pc = best_seconds(a.reps, [&] { plain = container::serialize_plain(views, po); });
  container::PlainCache pback;
  const double pd = best_seconds(a.reps, [&] { pback = container::deserialize_plain(plain.data(), plain.size()); });
  std::printf("lossless fp16 baseline (%zu bytes of K+V):\n", raw16.size());
  std::printf("  plain zstd          %10zu bytes  ratio %.3f  compress %7.0f MB/s  decompress %7.0f MB/s\n", zsize,
              static_cast<double>(raw16.size()) / zsize, mbps(raw16.size(), zc), mbps(raw16.size(), zd));
  std::printf("  plain container     %10zu bytes  ratio %.3f  compress %7.0f MB/s  decompress %7.0f MB/s  "
              "(size vs zstd %+.1f%%)\n",
              plain.size(), static_cast<double>(raw16.size()) / plain.size(), mbps(raw16.size(), pc),
              mbps(raw16.size(), pd), 100.0 * (static_cast<double>(plain.size()) / zsize - 1.0));
  {
    container::ContainerOptions p2 = po;
    std::printf("  plain transforms:  ");
    for (int t = 0; t < container::kTransformCount; ++t) {
      p2.transforms.fp16 = static_cast<Transform>(t);
      std::printf(" %s %zu", container::to_string(static_cast<Transform>(t)), container::serialize_plain(views, p2).size());
    }
    std::printf("\n\n");
  }

  const std::vector<std::pair<std::string, std::string>> configs = {
      {"k2v2 e8p/e8p", "preset=quant-k2v2"},
      {"k3v2 rvq3/e8p", "preset=quant-k3v2"},
      {"k4v2 rvq4/e8p", "preset=quant-k4v2"},
      {"k3v2 post-rope", "preset=quant-k3v2,rope=post"},
      {"k2v2 uncentred", "preset=quant-k2v2,center=0"},
      {"ball4/ball3", "key=ball4,value=ball3"},
      {"vor3/vor2", "key=vor3,value=vor2"},
      {"lm3/lm2", "key=lm3,value=lm2"},
      {"high (evict .35)", "preset=high"},
      {"lossless (fp16)", "preset=lossless"},
      {"k3v2 + code tier", "preset=quant-k3v2,code_tier=0.15"},
  };
  const StreamKind kinds[] = {StreamKind::kPositions,    StreamKind::kKeyCodes,       StreamKind::kValueCodes,
                              StreamKind::kKeyGains,     StreamKind::kValueGains,     StreamKind::kWindowKeys,
                              StreamKind::kWindowValues, StreamKind::kTierKeyCodes,   StreamKind::kTierValueCodes,
                              StreamKind::kTierKeyGains, StreamKind::kTierValueGains};
  for (const auto& [name, spec_str] : configs) {
    const CompressedKV cache = compress(m, Config::parse(spec_str));
    container::ContainerOptions o;
    o.zstd_level = a.level;
    o.chunk_tokens = a.chunk;
    std::vector<uint8_t> c;
    const double sc = best_seconds(a.reps, [&] { c = container::serialize(cache, o); });
    container::DeserializeOptions reuse;
    reuse.codecs = cache.shared_codecs();
    const double sd = best_seconds(a.reps, [&] { const CompressedKV d = container::deserialize(c.data(), c.size(), reuse); });
    const double codecs_s = best_seconds(1, [&] { const CacheCodecs fresh(cache.layout()); });
    container::ContainerOptions ad = o;
    ad.adaptive = true;
    ad.min_zstd_saving = 0;
    const size_t adaptive = container::serialize(cache, ad).size();
    const std::vector<uint8_t> flat = flat_bytes(cache);
    std::vector<uint8_t> fz(ZSTD_compressBound(flat.size()));
    size_t fzs = 0;
    const double fc = best_seconds(a.reps, [&] { fzs = ZSTD_compress(fz.data(), fz.size(), flat.data(), flat.size(), a.level); });
    std::vector<uint8_t> fb(flat.size());
    const double fd = best_seconds(a.reps, [&] { ZSTD_decompress(fb.data(), fb.size(), fz.data(), fzs); });
    const size_t mem = cache.bytes();
    std::printf("%-18s %s\n", name.c_str(), spec_str.c_str());
    std::printf("  bytes(): %zu (%.2f bits/elem, %.2fx vs fp16)  container: %zu (%.2fx vs fp16, %.2fx vs zstd fp16, "
                "%+.1f%% vs bytes())  adaptive: %zu (%+.1f%%)  plain zstd of the streams: %zu\n",
                mem, cache.bits_per_element(), static_cast<double>(raw16.size()) / mem, c.size(),
                static_cast<double>(raw16.size()) / c.size(), static_cast<double>(zsize) / c.size(),
                100.0 * (static_cast<double>(c.size()) / mem - 1.0), adaptive,
                100.0 * (static_cast<double>(adaptive) / mem - 1.0), fzs);
    std::printf("  speed per core (MB/s of %zu cache bytes): container compress %.0f, decompress %.0f;  plain zstd "
                "compress %.0f, decompress %.0f;  building fresh codecs %.1f ms\n",
                flat.size(), mbps(flat.size(), sc), mbps(flat.size(), sd), mbps(flat.size(), fc), mbps(flat.size(), fd),
                1e3 * codecs_s);
    // Per stream kind, every transform candidate (forced on all streams of that kind).
    std::map<int, std::map<int, uint64_t>> table;
    std::map<int, uint64_t> raw;
    for (int t = 0; t < container::kTransformCount; ++t) {
      container::ContainerOptions f = o;
      const auto tr = static_cast<Transform>(t);
      f.transforms = {tr, tr, tr, tr, tr};
      f.min_zstd_saving = 0;  // sizes of the transforms themselves
      const StreamSizes s = stream_sizes(container::serialize(cache, f));
      for (StreamKind k : kinds) {
        table[static_cast<int>(k)][t] = s.stored.count(static_cast<int>(k)) ? s.stored.at(static_cast<int>(k)) : 0;
        raw[static_cast<int>(k)] = s.raw.count(static_cast<int>(k)) ? s.raw.at(static_cast<int>(k)) : 0;
      }
    }
    std::printf("  %-16s %10s", "stream", "raw");
    for (int t = 0; t < container::kTransformCount; ++t) std::printf(" %18s", container::to_string(static_cast<Transform>(t)));
    std::printf(" %14s\n", "coords-delta");
    for (StreamKind k : kinds) {
      const int ki = static_cast<int>(k);
      if (raw[ki] == 0) continue;
      std::printf("  %-16s %10llu", container::to_string(k), static_cast<unsigned long long>(raw[ki]));
      for (int t = 0; t < container::kTransformCount; ++t)
        std::printf(" %10llu (%5.3f)", static_cast<unsigned long long>(table[ki][t]),
                    static_cast<double>(table[ki][t]) / raw[ki]);
      if (k == StreamKind::kKeyCodes || k == StreamKind::kValueCodes) {
        const uint64_t cd = coords_size(cache, k == StreamKind::kKeyCodes, a.chunk, a.level, true);
        const uint64_t cn = coords_size(cache, k == StreamKind::kKeyCodes, a.chunk, a.level, false);
        if (cd > 0) std::printf(" %6llu (%5.3f) [no delta %llu]", static_cast<unsigned long long>(cd),
                                static_cast<double>(cd) / raw[ki], static_cast<unsigned long long>(cn));
      }
      std::printf("\n");
    }
    std::printf("\n");
  }
}

// ---- golden files ---------------------------------------------------------------------------------

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) throw Error("cannot write " + path);
}

std::string codecs_string(const CacheLayout& L) {
  std::string s;
  for (int l = 0; l < L.n_layers; ++l) {
    if (l) s += ",";
    s += std::string(quant::to_string(L.key_codec[static_cast<size_t>(l)])) + "/" +
         quant::to_string(L.value_codec[static_cast<size_t>(l)]);
  }
  return s;
}

void write_golden(const std::string& dir) {
  std::string manifest =
      "# Golden containers written by e8kv-container-bench --write-golden.\n"
      "# name kind digest n_layers n_kv_heads n_q_heads head_dim per_head key_frame codecs [format_version]\n"
      "# (key_frame: 0 post, 1 pre, 2 residual; format_version is omitted for version 1; digests of later\n"
      "# versions also cover the version-2 fields, of version 5 also the code tier, of version 6 also\n"
      "# the tier's centring and the RoPE frequency factors)\n";
  auto cache_entry = [&](const std::string& name, const synth::SyntheticSpec& s, const Config& cfg, int appended,
                         const container::ContainerOptions& o) {
    const Made m = make_kv(s);
    const CompressedKV cache = compress(m, cfg, appended);
    const auto bytes = container::serialize(cache, o);
    write_bytes(dir + "/" + name, bytes);
    const CacheLayout& L = cache.layout();
    const int version = container::read_info(bytes.data(), bytes.size()).format_version;
    manifest += name + " cache " + test::cache_digest_for_version(cache, version) + " " +
                std::to_string(L.n_layers) + " " + std::to_string(L.n_kv_heads) + " " + std::to_string(L.n_q_heads) +
                " " + std::to_string(L.head_dim) + " " + (L.per_head_positions ? "1" : "0") + " " +
                std::to_string(static_cast<int>(L.key_frame)) + " " + codecs_string(L) +
                (version == 1 ? std::string() : " " + std::to_string(version)) + "\n";
    std::printf("%s: %zu bytes (bytes() %zu)\n", name.c_str(), bytes.size(), cache.bytes());
  };
  synth::SyntheticSpec s;
  s.n_layers = 2;
  s.n_kv_heads = 2;
  s.n_q_heads = 4;
  s.head_dim = 64;
  s.tokens = 100;
  s.obs_window = 16;
  s.seed = 11;
  container::ContainerOptions o;
  o.chunk_tokens = 32;
  // Eviction with a shared position set, a residual window, appended tokens.
  cache_entry("k3v2_evict_window.e8kv", s, Config::parse("preset=high,rope=pre,residual=8,flush=16,sinks=2,recent=8,mean_tokens=16,qweight=0,gain_bits=16"), 12, o);
  // Per-head positions, post-RoPE keys, one rate per layer (ball/voronoi, rvq4/e8p), yarn RoPE
  // scaling, partial rotary, gain policies; every transform chosen adaptively.
  {
    synth::SyntheticSpec s2 = s;
    s2.head_dim = 128;
    s2.tokens = 48;
    s2.seed = 12;
    Config cfg = Config::parse("evict=0.4,per_head=1,rope=post,key_gain=unbiased,value_gain=ls,recent=8,"
                               "residual=3,flush=8,mean_tokens=8,sinks=3,qweight=0,gain_bits=16");
    cfg.layer_rates = {LayerRate{quant::Codec::kBall3, quant::Codec::kVoronoi2},
                       LayerRate{quant::Codec::kRvq4, quant::Codec::kE8P}};
    cfg.rope.scaling = transform::RopeScaling::kYarn;
    cfg.rope.factor = 4.0;
    cfg.rope.original_max_position = 32;
    cfg.rope.rotary_dim = 96;
    cfg.softmax_scale = 0.1f;
    container::ContainerOptions o2;
    o2.chunk_tokens = 16;
    o2.adaptive = true;
    cache_entry("perhead_ball_vor.e8kv", s2, cfg, 4, o2);
  }
  // Lossless preset (fp16 codes) with a window.
  {
    synth::SyntheticSpec s3 = s;
    s3.tokens = 20;
    s3.seed = 13;
    cache_entry("lossless_fp16.e8kv", s3, Config::parse("preset=lossless,rope=pre,residual=4,flush=8,sinks=2,qweight=0,gain_bits=16"), 0, o);
  }
  // Format version 2: query-weighted keys (key channel scales) and 8-bit gains (codes and
  // references), the defaults since version 2; and a cache whose query energy is still pending
  // (6 tokens, means from 8: nothing flushed yet).
  {
    synth::SyntheticSpec s5 = s;
    s5.tokens = 64;
    s5.seed = 15;
    container::ContainerOptions o5;
    o5.chunk_tokens = 16;
    cache_entry("k3v2_qweight_gain8.e8kv", s5, Config::parse("preset=high,rope=pre,residual=8,flush=16,sinks=2,recent=8,mean_tokens=16"),
                8, o5);
    synth::SyntheticSpec s6 = s;
    s6.tokens = 6;
    s6.seed = 16;
    cache_entry("pending_energy.e8kv", s6, Config::parse("preset=high,rope=pre,mean_tokens=8,residual=0"), 0, o);
    // Format version 3: keys coded in the RoPE-residual frame.
    synth::SyntheticSpec s7 = s5;
    s7.seed = 17;
    cache_entry("k3v2_residual.e8kv", s7,
                Config::parse("preset=high,rope=residual,residual=8,flush=16,sinks=2,recent=8,mean_tokens=16"), 8, o5);
    // Format version 4: the fp16 tier, pinned tokens among the coded ones.
    synth::SyntheticSpec s8 = s5;
    s8.seed = 18;
    cache_entry("k3v2_fp16_tier.e8kv", s8,
                Config::parse("preset=quant-k3v2,fp16_tier=0.1,residual=8,flush=16,sinks=2,recent=8,mean_tokens=16"), 8,
                o5);
    // Format version 5: the code tier (rvq4 keys and values of promoted tokens in their own
    // streams, uncentred as version 5 coded them) beside an fp16 tier.
    synth::SyntheticSpec s9 = s5;
    s9.seed = 19;
    cache_entry("k3v2_code_tier.e8kv", s9,
                Config::parse("preset=quant-k3v2,code_tier=0.15,fp16_tier=0.05,residual=8,flush=16,sinks=2,recent=8,"
                              "mean_tokens=16,tier_center=0"),
                8, o5);
    // Format version 6: the code tier centred on the heads' means, and RoPE frequency factors
    // (llama.cpp's rope_freqs), one per rotary pair.
    synth::SyntheticSpec s10 = s5;
    s10.seed = 20;
    Config c10 = Config::parse("preset=quant-k3v2,code_tier=0.15,residual=8,flush=16,sinks=2,recent=8,mean_tokens=16");
    for (int i = 0; i < s10.head_dim / 2; ++i) c10.rope.freq_factors.push_back(1.0f + 0.125f * static_cast<float>(i % 9));
    cache_entry("k3v2_centred_tier_rope_factors.e8kv", s10, c10, 8, o5);
  }
  // Plain bf16 tensors.
  {
    synth::SyntheticSpec s4 = s;
    s4.tokens = 24;
    s4.seed = 14;
    const auto kv = synth::make_synthetic_kv(s4);
    std::vector<std::vector<uint16_t>> t;
    for (const auto* src : {&kv.keys[0], &kv.values[0]}) {
      std::vector<uint16_t> h(src->size());
      for (size_t i = 0; i < h.size(); ++i) h[i] = float_to_bf16_bits((*src)[i]);
      t.push_back(std::move(h));
    }
    std::vector<TensorView> v;
    for (const auto& x : t) v.push_back(TensorView::nhd(x.data(), DType::kBF16, s4.tokens, s4.n_kv_heads, s4.head_dim));
    container::ContainerOptions o4;
    o4.chunk_tokens = 10;
    const auto bytes = container::serialize_plain(v, o4);
    write_bytes(dir + "/plain_bf16.e8kv", bytes);
    container::PlainCache p;
    p.dtype = DType::kBF16;
    p.tokens = s4.tokens;
    p.heads = s4.n_kv_heads;
    p.head_dim = s4.head_dim;
    p.tensors = t;
    manifest += "plain_bf16.e8kv plain " + test::plain_digest(p) + " 2 " + std::to_string(s4.n_kv_heads) + " 0 " +
                std::to_string(s4.head_dim) + " 0 0 -\n";
    std::printf("plain_bf16.e8kv: %zu bytes\n", bytes.size());
  }
  std::ofstream f(dir + "/golden.txt", std::ios::trunc);
  f << manifest;
  if (!f) throw Error("cannot write " + dir + "/golden.txt");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse_args(argc, argv);
    if (!a.golden_dir.empty()) write_golden(a.golden_dir);
    else run_bench(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
