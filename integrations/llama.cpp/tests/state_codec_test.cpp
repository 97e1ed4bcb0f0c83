// llama.cpp sequence states through e8kv and back, on synthetic states: the lossless preset gives
// f16 states back byte for byte (V rows or transposed, several streams, cells out of position
// order, position holes), quantized presets give the same cells with bounded error, slot files
// keep their token list, multi-turn extension equals compressing the whole state, and every
// unsupported or corrupt input is refused with a message naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "e8kv/error.hpp"
#include "e8kv/llama_cpp/state_codec.hpp"
#include "e8kv/numeric/half.hpp"

namespace e8kv::llama_cpp {
namespace {

const ModelShape kShape{3, 2, 4, 64};

transform::RopeParams model_rope() {
  transform::RopeParams r;
  r.layout = transform::RopeLayout::kInterleaved;
  r.head_dim = 64;
  r.theta = 10000.0;
  return r;
}

Config config(const std::string& spec) {
  Config c = Config::parse_at_rest(spec);  // states at rest (as the tools parse them)
  c.rope = model_rope();
  return c;
}

// Stores a float as a ggml row element.
void put_element(float x, int32_t type, uint8_t* out) {
  if (type == kGgmlF32) {
    std::memcpy(out, &x, 4);
  } else {
    const uint16_t b = type == kGgmlF16 ? float_to_fp16_bits(x) : float_to_bf16_bits(x);
    std::memcpy(out, &b, 2);
  }
}

// A state of `positions` (cells in this order) in stream `stream` of `n_stream`, Gaussian K with a
// per-channel bias (what RoPE'd keys look like to a codec: not centred) and Gaussian V.
SeqState make_state(const std::vector<int32_t>& positions, uint32_t seed, int32_t type = kGgmlF16,
                    bool v_trans = false, size_t n_stream = 1, size_t stream = 0, const ModelShape& shape = kShape) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  const size_t embd = static_cast<size_t>(shape.n_kv_heads * shape.head_dim), eb = type == kGgmlF32 ? 4 : 2;
  const size_t n = positions.size();
  SeqState st;
  st.streams.resize(n_stream);
  SeqStateStream& S = st.streams[stream];
  S.positions = positions;
  S.seq_ids.assign(n, 1);
  S.v_trans = v_trans;
  std::vector<float> bias(embd);
  for (auto& b : bias) b = 2.f * g(rng);
  for (int l = 0; l < shape.n_layers; ++l) {
    SeqStateLayer L;
    L.k_type = L.v_type = type;
    L.k_row_bytes = embd * eb;
    L.keys.resize(n * embd * eb);
    L.values.resize(n * embd * eb);
    if (v_trans) {
      L.v_element_bytes = static_cast<uint32_t>(eb);
      L.v_embd = static_cast<uint32_t>(embd);
    } else {
      L.v_row_bytes = embd * eb;
    }
    for (size_t c = 0; c < n; ++c)
      for (size_t j = 0; j < embd; ++j) {
        put_element(bias[j] + g(rng), type, &L.keys[(c * embd + j) * eb]);
        const size_t vi = v_trans ? j * n + c : c * embd + j;
        put_element(g(rng), type, &L.values[vi * eb]);
      }
    S.layers.push_back(std::move(L));
  }
  return st;
}

std::vector<int32_t> iota_positions(int n, int first = 0) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = first + i;
  return p;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

float element(const std::vector<uint8_t>& b, size_t i, int32_t type) {
  if (type == kGgmlF32) {
    float x;
    std::memcpy(&x, &b[4 * i], 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, &b[2 * i], 2);
  return type == kGgmlF16 ? fp16_bits_to_float(h) : bf16_bits_to_float(h);
}

TEST(StateCodec, LosslessGivesF16StatesBackByteForByte) {
  const KVCompressor c(kShape, config("preset=lossless"));
  // In order; shuffled cells (llama.cpp writes cells in cache order); position holes; one cell.
  std::vector<int32_t> shuffled = iota_positions(40, 3);
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(5));
  std::vector<int32_t> holes;
  for (int i = 0; i < 30; ++i) holes.push_back(i < 10 ? i : 3 * i + 7);
  int seed = 1;
  for (const auto& positions : {iota_positions(37), shuffled, holes, std::vector<int32_t>{12}})
    for (bool v_trans : {false, true})
      for (size_t n_stream : {1u, 4u}) {
        SCOPED_TRACE("cells " + std::to_string(positions.size()) + (v_trans ? ", V transposed" : ", V rows") +
                     ", streams " + std::to_string(n_stream));
        const auto state = write_seq_state(make_state(positions, seed++, kGgmlF16, v_trans, n_stream, n_stream - 1));
        const auto packed = compress_seq_state(state.data(), state.size(), c);
        EXPECT_EQ(restore_seq_state(packed.data(), packed.size()), state);
        const auto info = read_compressed_state_info(packed.data(), packed.size());
        ASSERT_EQ(info.caches.size(), 1u);
        EXPECT_EQ(info.caches[0].cells, positions.size());
        EXPECT_EQ(info.caches[0].stream, n_stream - 1);
        EXPECT_EQ(info.caches[0].v_trans, v_trans);
        EXPECT_EQ(packed[8], 1) << "one cache is written as version 1";
      }
}

TEST(StateCodec, F32AndBf16RowsComeBackRoundedThroughFp16) {
  const KVCompressor c(kShape, config("preset=lossless"));
  for (int32_t type : {kGgmlF32, kGgmlBF16}) {
    SCOPED_TRACE(ggml_type_name(type));
    const SeqState st = make_state(iota_positions(20), 11, type, true);
    const auto state = write_seq_state(st);
    const auto packed = compress_seq_state(state.data(), state.size(), c);
    const auto back_bytes = restore_seq_state(packed.data(), packed.size());
    const SeqState back = parse_seq_state(back_bytes.data(), back_bytes.size());
    ASSERT_EQ(back.streams[0].layers.size(), st.streams[0].layers.size());
    for (size_t l = 0; l < st.streams[0].layers.size(); ++l) {
      const auto& a = st.streams[0].layers[l];
      const auto& b = back.streams[0].layers[l];
      EXPECT_EQ(b.k_type, type);
      EXPECT_EQ(b.v_type, type);
      ASSERT_EQ(a.keys.size(), b.keys.size());
      const size_t n = a.keys.size() / (type == kGgmlF32 ? 4 : 2);
      for (size_t i = 0; i < n; ++i) {
        // fp16 rounding of the input, then the state's type (bf16 of an fp16 value: its rounding).
        const float want_k = fp16_bits_to_float(float_to_fp16_bits(element(a.keys, i, type)));
        const float want_v = fp16_bits_to_float(float_to_fp16_bits(element(a.values, i, type)));
        const float tol_k = type == kGgmlF32 ? 0.f : std::abs(want_k) / 128.f;
        const float tol_v = type == kGgmlF32 ? 0.f : std::abs(want_v) / 128.f;
        ASSERT_NEAR(element(b.keys, i, type), want_k, tol_k) << "layer " << l << " key element " << i;
        ASSERT_NEAR(element(b.values, i, type), want_v, tol_v) << "layer " << l << " value element " << i;
      }
    }
  }
}

double relative_error(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int32_t type) {
  double num = 0, den = 0;
  const size_t n = a.size() / (type == kGgmlF32 ? 4 : 2);
  for (size_t i = 0; i < n; ++i) {
    const double x = element(a, i, type), y = element(b, i, type);
    num += (x - y) * (x - y);
    den += x * x;
  }
  return std::sqrt(num / den);
}

TEST(StateCodec, QuantizedPresetsKeepTheCellsWithBoundedError) {
  // Relative RMS error bounds per preset on Gaussian rows: E8P (2 bits) has SNR ~8.6 dB, i.e.
  // ~0.37 relative error; 3- and 4-bit codes less. Keys carry a bias the centring removes.
  // Size: 16 bits per fp16 element against the code's bits, its gains and the fp16 sinks.
  struct Case {
    const char* spec;
    double max_error;
    double min_ratio;
  };
  for (const Case& cs : {Case{"preset=quant-k2v2", 0.42, 5.5}, Case{"preset=quant-k3v2", 0.42, 4.7},
                         Case{"preset=quant-k4v4", 0.16, 3.2}, Case{"preset=quant-k3v2,rope=post", 0.42, 4.7}}) {
    SCOPED_TRACE(cs.spec);
    const KVCompressor c(kShape, config(cs.spec));
    const SeqState st = make_state(iota_positions(200, 10), 3, kGgmlF16, false);
    const auto state = write_seq_state(st);
    const auto packed = compress_seq_state(state.data(), state.size(), c);
    std::printf("%s: %zu -> %zu bytes (%.2fx)\n", cs.spec, state.size(), packed.size(),
                static_cast<double>(state.size()) / packed.size());
    EXPECT_GT(static_cast<double>(state.size()) / packed.size(), cs.min_ratio);
    const auto back_bytes = restore_seq_state(packed.data(), packed.size());
    const SeqState back = parse_seq_state(back_bytes.data(), back_bytes.size());
    EXPECT_EQ(back.streams[0].positions, st.streams[0].positions);
    EXPECT_EQ(back.streams[0].seq_ids, st.streams[0].seq_ids);
    for (size_t l = 0; l < st.streams[0].layers.size(); ++l) {
      EXPECT_LT(relative_error(st.streams[0].layers[l].keys, back.streams[0].layers[l].keys, kGgmlF16), cs.max_error);
      EXPECT_LT(relative_error(st.streams[0].layers[l].values, back.streams[0].layers[l].values, kGgmlF16),
                cs.max_error);
    }
  }
}

TEST(StateCodec, ThreadsGiveTheSameBytes) {
  // Compressing and restoring the layers on a pool gives the bytes the calling thread alone gives,
  // with V rows and transposed V (the fleet tool runs both on every core).
  ThreadPool pool(3);
  for (const bool v_trans : {false, true}) {
    SCOPED_TRACE(v_trans ? "transposed V" : "V rows");
    const KVCompressor c(kShape, config("preset=tier-k3v2,scorer=key-key"));
    const auto state = write_seq_state(make_state(iota_positions(150, 0), 7, kGgmlF16, v_trans));
    StateCompressOptions threaded;
    threaded.executor = &pool;
    const auto packed = compress_seq_state(state.data(), state.size(), c);
    EXPECT_EQ(compress_seq_state(state.data(), state.size(), c, threaded), packed);
    EXPECT_EQ(restore_seq_state(packed.data(), packed.size(), {}, &pool),
              restore_seq_state(packed.data(), packed.size()));
  }
}

TEST(StateCodec, SlotFilesKeepTheirTokenList) {
  const KVCompressor c(kShape, config("preset=lossless"));
  const auto state = write_seq_state(make_state(iota_positions(17), 9, kGgmlF16, true));
  std::vector<uint8_t> file(12 + 17 * 4);
  const uint32_t head[3] = {kSeqFileMagic, kSeqFileVersion, 17};
  std::memcpy(file.data(), head, 12);
  for (int i = 0; i < 17; ++i) {
    const int32_t tok = 1000 + i;
    std::memcpy(file.data() + 12 + 4 * i, &tok, 4);
  }
  file.insert(file.end(), state.begin(), state.end());
  EXPECT_EQ(seq_file_state_offset(file.data(), file.size()), 12u + 17u * 4u);
  const auto packed = compress_slot_file(file.data(), file.size(), c);
  EXPECT_EQ(restore_seq_state(packed.data(), packed.size()), file);
  EXPECT_EQ(read_compressed_state_info(packed.data(), packed.size()).prefix_bytes, 12u + 17u * 4u);

  auto bad = file;
  bad[0] ^= 1;
  EXPECT_NE(error_of([&] { seq_file_state_offset(bad.data(), bad.size()); }).find("ggsq"), std::string::npos);
  bad = file;
  bad[4] = 2;  // version 2
  EXPECT_NE(error_of([&] { seq_file_state_offset(bad.data(), bad.size()); }).find("version 2"), std::string::npos);
  EXPECT_THROW(seq_file_state_offset(file.data(), 40), Error);  // token list cut
}

TEST(StateCodec, ExtendingEqualsCompressingTheWholeState) {
  for (const char* spec : {"preset=lossless", "preset=quant-k3v2"}) {
    SCOPED_TRACE(spec);
    const KVCompressor c(kShape, config(spec));
    const SeqState whole = make_state(iota_positions(150), 21, kGgmlF16, true);
    // The first turn: the first 90 cells of the same sequence.
    SeqState first = whole;
    auto& S = first.streams[0];
    S.positions.resize(90);
    S.seq_ids.resize(90);
    const size_t embd = static_cast<size_t>(kShape.n_kv_heads * kShape.head_dim);
    for (auto& L : S.layers) {
      L.keys.resize(90 * embd * 2);
      std::vector<uint8_t> v(90 * embd * 2);
      for (size_t j = 0; j < embd; ++j) std::memcpy(&v[j * 90 * 2], &L.values[j * 150 * 2], 90 * 2);
      L.values = v;
    }
    const auto first_bytes = write_seq_state(first), whole_bytes = write_seq_state(whole);
    const auto packed1 = compress_seq_state(first_bytes.data(), first_bytes.size(), c);
    const auto packed2 = extend_compressed_state(packed1.data(), packed1.size(), whole_bytes.data(), whole_bytes.size(), c);
    const auto direct = compress_seq_state(whole_bytes.data(), whole_bytes.size(), c);
    // Compressing a prefix then extending is compressing at once (KVCompressor's guarantee).
    EXPECT_EQ(restore_seq_state(packed2.data(), packed2.size()), restore_seq_state(direct.data(), direct.size()));
    if (std::string(spec) == "preset=lossless") {
      EXPECT_EQ(restore_seq_state(packed2.data(), packed2.size()), whole_bytes);
    }
    // Nothing new: the same state back.
    const auto packed3 = extend_compressed_state(packed2.data(), packed2.size(), whole_bytes.data(), whole_bytes.size(), c);
    EXPECT_EQ(restore_seq_state(packed3.data(), packed3.size()), restore_seq_state(packed2.data(), packed2.size()));
  }
}

TEST(StateCodec, RefusesWhatItCannotRepresentNamingIt) {
  const KVCompressor c(kShape, config("preset=quant-k3v2"));
  auto message = [&](const SeqState& st) {
    const auto b = write_seq_state(st);
    return error_of([&] { compress_seq_state(b.data(), b.size(), c); });
  };
  SeqState q8 = make_state(iota_positions(8), 1);
  q8.streams[0].layers[1].k_type = 8;
  EXPECT_NE(message(q8).find("q8_0"), std::string::npos) << message(q8);
  SeqState wide = make_state(iota_positions(8), 1, kGgmlF16, false, 1, 0, ModelShape{3, 3, 6, 64});
  EXPECT_NE(message(wide).find("key rows are"), std::string::npos) << message(wide);
  SeqState layers = make_state(iota_positions(8), 1, kGgmlF16, false, 1, 0, ModelShape{2, 2, 4, 64});
  EXPECT_NE(message(layers).find("2 layers"), std::string::npos) << message(layers);
  SeqState dup = make_state({0, 1, 2, 2, 3}, 1);
  EXPECT_NE(message(dup).find("two cells at position 2"), std::string::npos) << message(dup);
  SeqState two = make_state(iota_positions(8), 1, kGgmlF16, false, 2, 0);
  two.streams[1] = two.streams[0];
  EXPECT_NE(message(two).find("streams 0 and 1"), std::string::npos) << message(two);
  SeqState empty;
  empty.streams.resize(1);
  EXPECT_NE(message(empty).find("no cells"), std::string::npos) << message(empty);
}

TEST(StateCodec, CorruptOrTruncatedCompressedStatesAreRefused) {
  const KVCompressor c(kShape, config("preset=quant-k3v2"));
  const auto state = write_seq_state(make_state(iota_positions(40), 2, kGgmlF16, false));
  const auto packed = compress_seq_state(state.data(), state.size(), c);
  const auto info = read_compressed_state_info(packed.data(), packed.size());
  const size_t header = packed.size() - info.container_bytes;
  // Every header byte flipped, a sample of container bytes flipped: an error, never a wrong state.
  for (size_t i = 0; i < packed.size(); i += (i < header ? 1 : 97)) {
    auto bad = packed;
    bad[i] ^= 0x20;
    EXPECT_THROW(restore_seq_state(bad.data(), bad.size()), Error) << "byte " << i << " flipped";
  }
  for (size_t n : {size_t{0}, size_t{7}, header - 1, header, packed.size() - 1})
    EXPECT_THROW(restore_seq_state(packed.data(), n), Error) << "truncated to " << n;
  auto longer = packed;
  longer.push_back(0);
  EXPECT_THROW(restore_seq_state(longer.data(), longer.size()), Error);
  EXPECT_NE(error_of([&] { restore_seq_state(state.data(), state.size()); }).find("wrong magic"), std::string::npos);
}

// An iSWA model's state: the full-attention layers' cache (every cell), then the sliding-window
// layers' cache (its own layer count and RoPE, only the window's cells), back to back.
const ModelShape kSwaShape{2, 2, 4, 64};
Config swa_config(const std::string& spec) {
  Config c = config(spec);
  c.rope.theta = 1e6;  // the two caches' RoPE differ, as Gemma 3's do
  return c;
}
std::vector<uint8_t> iswa_state(int cells, int window, uint32_t seed, bool v_trans) {
  return write_seq_caches({make_state(iota_positions(cells), seed, kGgmlF16, v_trans),
                           make_state(iota_positions(window, cells - window), seed + 1, kGgmlF16, v_trans, 1, 0,
                                      kSwaShape)});
}

TEST(StateCodec, SlidingWindowModelsKeepTwoCachesEachCodedApart) {
  for (const char* spec : {"preset=lossless", "preset=quant-k3v2"}) {
    SCOPED_TRACE(spec);
    const KVCompressor full(kShape, config(spec)), swa(kSwaShape, swa_config(spec));
    const std::vector<const KVCompressor*> caches{&full, &swa};
    for (bool v_trans : {false, true}) {
      const auto state = iswa_state(100, 40, 7, v_trans);
      const auto packed = compress_seq_state(state.data(), state.size(), caches);
      EXPECT_EQ(packed[8], 2) << "several caches: version 2";
      const auto info = read_compressed_state_info(packed.data(), packed.size());
      ASSERT_EQ(info.caches.size(), 2u);
      EXPECT_EQ(info.caches[0].cells, 100u);
      EXPECT_EQ(info.caches[1].cells, 40u);
      EXPECT_EQ(info.caches[1].container.layout.n_layers, 2);
      const auto back = restore_seq_state(packed.data(), packed.size());
      if (std::string(spec) == "preset=lossless") {
        EXPECT_EQ(back, state);
      } else {
        const auto a = parse_seq_caches(state.data(), state.size(), 2), b = parse_seq_caches(back.data(), back.size(), 2);
        for (size_t c = 0; c < 2; ++c) {
          EXPECT_EQ(b[c].streams[0].positions, a[c].streams[0].positions);
          for (size_t l = 0; l < a[c].streams[0].layers.size(); ++l)
            EXPECT_LT(relative_error(a[c].streams[0].layers[l].values, b[c].streams[0].layers[l].values, kGgmlF16), 0.42);
        }
      }
    }
  }
  const KVCompressor full(kShape, config("preset=quant-k3v2")), swa(kSwaShape, swa_config("preset=quant-k3v2"));
  const auto state = iswa_state(60, 20, 3, false);
  // One compressor for a two-cache state: the second cache is named as trailing bytes.
  EXPECT_NE(error_of([&] { compress_seq_state(state.data(), state.size(), full); }).find("sliding-window"),
            std::string::npos);
  // The caches' compressors swapped: the layer counts disagree, and the cache is named.
  EXPECT_NE(error_of([&] { compress_seq_state(state.data(), state.size(), {&swa, &full}); }).find("layers"),
            std::string::npos);
  StateCompressOptions one_query_set;
  std::vector<LayerQueries> none;
  one_query_set.queries = {&none};
  EXPECT_NE(error_of([&] { compress_seq_state(state.data(), state.size(), {&full, &swa}, one_query_set); })
                .find("query sets"),
            std::string::npos);
  // Corrupt or truncated two-cache states: an error, never a wrong state.
  const auto packed = compress_seq_state(state.data(), state.size(), {&full, &swa});
  const size_t header = packed.size() - read_compressed_state_info(packed.data(), packed.size()).container_bytes;
  for (size_t i = 0; i < packed.size(); i += (i < header ? 1 : 509)) {
    auto bad = packed;
    bad[i] ^= 0x04;
    EXPECT_THROW(restore_seq_state(bad.data(), bad.size()), Error) << "byte " << i << " flipped";
  }
  for (size_t n : {header - 1, header, packed.size() - 1})
    EXPECT_THROW(restore_seq_state(packed.data(), n), Error) << "truncated to " << n;
}

TEST(StateCodec, ExtendingASlidingWindowCacheDropsTheCellsThatLeftIt) {
  const KVCompressor full(kShape, config("preset=lossless")), swa(kSwaShape, swa_config("preset=lossless"));
  const std::vector<const KVCompressor*> caches{&full, &swa};
  const auto first = iswa_state(60, 30, 5, false);
  const auto packed = compress_seq_state(first.data(), first.size(), caches);
  // The later state: the window still holds every stored cell (window 50 of 80 cells): the new
  // cells of each cache are appended, the stored ones kept as they were coded.
  {
    const auto later_bytes = iswa_state(80, 50, 6, false);
    const auto ext = extend_compressed_state(packed.data(), packed.size(), later_bytes.data(), later_bytes.size(), caches);
    const auto back_bytes = restore_seq_state(ext.data(), ext.size());
    const auto back = parse_seq_caches(back_bytes.data(), back_bytes.size(), 2);
    const auto later = parse_seq_caches(later_bytes.data(), later_bytes.size(), 2);
    const auto before = parse_seq_caches(first.data(), first.size(), 2);
    EXPECT_EQ(back[0].streams[0].positions, iota_positions(80));
    EXPECT_EQ(back[1].streams[0].positions, iota_positions(50, 30));
    const size_t row = static_cast<size_t>(kSwaShape.n_kv_heads * kSwaShape.head_dim) * 2;
    const auto& keys = back[1].streams[0].layers[1].keys;
    // Stored cells (30..59) from the first save, new cells (60..79) from the later one.
    EXPECT_TRUE(std::equal(keys.begin(), keys.begin() + 30 * row, before[1].streams[0].layers[1].keys.begin()));
    EXPECT_TRUE(std::equal(keys.begin() + 30 * row, keys.end(), later[1].streams[0].layers[1].keys.begin() + 30 * row));
  }
  // The window moved past stored cells (the later sliding-window cache holds positions 50..89
  // only): the cells that left it (30..49) are dropped from the cache too (drop_before), 50..59
  // keep their first coding, 60..89 are new.
  {
    const auto later_bytes = iswa_state(90, 40, 5, false);
    const auto ext = extend_compressed_state(packed.data(), packed.size(), later_bytes.data(), later_bytes.size(), caches);
    const auto back_bytes = restore_seq_state(ext.data(), ext.size());
    const auto back = parse_seq_caches(back_bytes.data(), back_bytes.size(), 2);
    const auto later = parse_seq_caches(later_bytes.data(), later_bytes.size(), 2);
    const auto before = parse_seq_caches(first.data(), first.size(), 2);
    EXPECT_EQ(back[0].streams[0].positions, iota_positions(90));
    EXPECT_EQ(back[1].streams[0].positions, iota_positions(40, 50));
    const size_t row = static_cast<size_t>(kSwaShape.n_kv_heads * kSwaShape.head_dim) * 2;
    const auto& keys = back[1].streams[0].layers[1].keys;
    ASSERT_EQ(keys.size(), 40 * row);
    EXPECT_TRUE(std::equal(keys.begin(), keys.begin() + 10 * row, before[1].streams[0].layers[1].keys.begin() + 20 * row));
    EXPECT_TRUE(std::equal(keys.begin() + 10 * row, keys.end(), later[1].streams[0].layers[1].keys.begin() + 10 * row));
  }
  // A stored cell missing after the later state's first one: the sequence was edited, refused.
  std::vector<int32_t> holed = iota_positions(40, 50);
  holed.erase(holed.begin() + 5);  // position 55
  const auto edited = write_seq_caches({make_state(iota_positions(90), 5, kGgmlF16, false),
                                        make_state(holed, 6, kGgmlF16, false, 1, 0, kSwaShape)});
  const std::string e =
      error_of([&] { extend_compressed_state(packed.data(), packed.size(), edited.data(), edited.size(), caches); });
  EXPECT_NE(e.find("edited"), std::string::npos) << e;
  EXPECT_NE(e.find("position 55"), std::string::npos) << e;
}

TEST(StateCodec, PerLayerEvictionCannotBeRestoredIntoSharedCells) {
  // Key-key scoring needs no queries; layers see different keys, so their kept sets differ.
  const KVCompressor c(kShape, config("preset=high,scorer=key-key,sinks=2,recent=4"));
  const auto state = write_seq_state(make_state(iota_positions(120), 4));
  const auto packed = compress_seq_state(state.data(), state.size(), c);
  EXPECT_NE(error_of([&] { restore_seq_state(packed.data(), packed.size()); }).find("shared"), std::string::npos);
}

}  // namespace
}  // namespace e8kv::llama_cpp
