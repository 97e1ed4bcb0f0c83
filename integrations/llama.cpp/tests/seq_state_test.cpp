// llama.cpp sequence state bytes: parsed field by field against bytes written by hand as
// llama_kv_cache::state_write lays them out, written back byte for byte, and every malformed or
// truncated input refused with an e8kv::Error.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "e8kv/error.hpp"
#include "e8kv/llama_cpp/seq_state.hpp"

namespace e8kv::llama_cpp {
namespace {

template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}

// One stream, two cells (positions 5 and 9, sequence 3), one layer of 2 f16 channels; V rows.
std::vector<uint8_t> hand_written(bool v_trans) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, 1);  // n_stream
  put<uint32_t>(b, 2);  // cell_count
  for (int32_t pos : {5, 9}) {
    put<int32_t>(b, pos);
    put<uint32_t>(b, 1);
    put<int32_t>(b, 3);
  }
  put<uint32_t>(b, v_trans ? 1 : 0);
  put<uint32_t>(b, 1);  // n_layer
  put<int32_t>(b, kGgmlF16);
  put<uint64_t>(b, 4);  // 2 channels × 2 bytes
  for (uint16_t x : {0x3C00, 0x4000, 0x4200, 0x4400}) put<uint16_t>(b, x);
  put<int32_t>(b, kGgmlF16);
  if (!v_trans) {
    put<uint64_t>(b, 4);
  } else {
    put<uint32_t>(b, 2);  // element bytes
    put<uint32_t>(b, 2);  // channels
  }
  for (uint16_t x : {0x1111, 0x2222, 0x3333, 0x4444}) put<uint16_t>(b, x);
  return b;
}

TEST(SeqState, ParsesHandWrittenBytesAndWritesThemBack) {
  for (bool v_trans : {false, true}) {
    SCOPED_TRACE(v_trans ? "V transposed" : "V rows");
    const auto b = hand_written(v_trans);
    const SeqState st = parse_seq_state(b.data(), b.size());
    ASSERT_EQ(st.streams.size(), 1u);
    const auto& S = st.streams[0];
    EXPECT_EQ(S.positions, (std::vector<int32_t>{5, 9}));
    EXPECT_EQ(S.seq_ids, (std::vector<int32_t>{3, 3}));
    EXPECT_EQ(S.v_trans, v_trans);
    ASSERT_EQ(S.layers.size(), 1u);
    EXPECT_EQ(S.layers[0].k_type, kGgmlF16);
    EXPECT_EQ(S.layers[0].k_row_bytes, 4u);
    EXPECT_EQ(S.layers[0].keys.size(), 8u);
    EXPECT_EQ(S.layers[0].values.size(), 8u);
    EXPECT_EQ(S.layers[0].v_embd, v_trans ? 2u : 0u);
    EXPECT_EQ(seq_state_kv_bytes(st), 16u);
    EXPECT_EQ(write_seq_state(st), b);
  }
}

SeqState random_state(uint32_t seed, bool v_trans, bool cell_ext, size_t n_stream, size_t with_cells) {
  std::mt19937 rng(seed);
  SeqState st;
  st.streams.resize(n_stream);
  auto& S = st.streams[with_cells];
  const size_t cells = 1 + rng() % 9, layers = 1 + rng() % 3, embd = 8;
  S.v_trans = v_trans;
  for (size_t c = 0; c < cells; ++c) {
    S.positions.push_back(static_cast<int32_t>(rng() % 1000));
    S.seq_ids.push_back(2);
    if (cell_ext) S.cell_ext.push_back(std::vector<uint8_t>(12, static_cast<uint8_t>(rng())));
  }
  for (size_t l = 0; l < layers; ++l) {
    SeqStateLayer L;
    L.k_type = kGgmlF32;
    L.v_type = kGgmlBF16;
    L.k_row_bytes = embd * 4;
    L.keys.resize(cells * L.k_row_bytes);
    if (v_trans) {
      L.v_element_bytes = 2;
      L.v_embd = embd;
    } else {
      L.v_row_bytes = embd * 2;
    }
    L.values.resize(cells * embd * 2);
    for (auto& x : L.keys) x = static_cast<uint8_t>(rng());
    for (auto& x : L.values) x = static_cast<uint8_t>(rng());
    S.layers.push_back(std::move(L));
  }
  return st;
}

TEST(SeqState, RoundTripsStreamsLayoutsAndCellExtensions) {
  uint32_t seed = 20261202;
  std::printf("seed %u\n", seed);
  for (bool v_trans : {false, true})
    for (bool ext : {false, true})
      for (size_t n_stream : {1u, 3u}) {
        const SeqState st = random_state(seed++, v_trans, ext, n_stream, n_stream - 1);
        SeqStateOptions o;
        o.cell_ext = ext;
        const auto b = write_seq_state(st, o);
        const SeqState back = parse_seq_state(b.data(), b.size(), o);
        EXPECT_EQ(write_seq_state(back, o), b);
        EXPECT_EQ(back.streams.size(), n_stream);
        EXPECT_EQ(back.streams[n_stream - 1].positions, st.streams[n_stream - 1].positions);
        EXPECT_EQ(back.streams[n_stream - 1].cell_ext, st.streams[n_stream - 1].cell_ext);
      }
}

TEST(SeqState, EveryTruncationIsAnError) {
  const SeqState st = random_state(7, true, false, 2, 1);
  const auto b = write_seq_state(st);
  for (size_t n = 0; n < b.size(); ++n) EXPECT_THROW(parse_seq_state(b.data(), n), Error) << "size " << n;
}

TEST(SeqState, TrailingBytesAreASecondMemoryNotSkipped) {
  auto b = hand_written(false);
  const size_t size = b.size();
  b.push_back(0);
  try {
    parse_seq_state(b.data(), b.size());
    FAIL() << "trailing byte accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second memory"), std::string::npos) << e.what();
  }
  size_t consumed = 0;
  parse_seq_state(b.data(), b.size(), {}, &consumed);
  EXPECT_EQ(consumed, size);
}

TEST(SeqState, RefusesMalformedFields) {
  const auto good = hand_written(false);
  auto patched = [&](size_t offset, uint32_t value) {
    auto b = good;
    std::memcpy(b.data() + offset, &value, 4);
    return b;
  };
  struct Case {
    const char* what;
    size_t offset;
    uint32_t value;
    const char* message;
  };
  // Offsets: n_stream 0, cell_count 4, cell 0 at 8 (pos, n_seq_id 12, seq 16), v_trans 32, n_layer 36.
  for (const Case& c : {Case{"no stream", 0, 0, "n_stream"}, Case{"too many streams", 0, 100000, "n_stream"},
                        Case{"huge cell count", 4, 0x7fffffff, "cell_count"},
                        Case{"cell in two sequences", 12, 2, "2 sequences"},
                        Case{"negative sequence", 16, 0xffffffffu, "negative"}, Case{"v_trans 2", 32, 2, "v_trans"},
                        Case{"no layer", 36, 0, "n_layer"}}) {
    SCOPED_TRACE(c.what);
    const auto b = patched(c.offset, c.value);
    try {
      parse_seq_state(b.data(), b.size());
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_seq_state(nullptr, 4), Error);
}

TEST(SeqState, NamesGgmlTypes) {
  EXPECT_EQ(ggml_type_name(kGgmlF16), "f16");
  EXPECT_EQ(ggml_type_name(kGgmlBF16), "bf16");
  EXPECT_EQ(ggml_type_name(8), "q8_0");
  EXPECT_EQ(ggml_type_name(2), "q4_0");
  EXPECT_EQ(ggml_type_name(4), "type 4");
  EXPECT_EQ(ggml_type_name(43), "e8p");
  EXPECT_EQ(ggml_type_name(45), "e8r4");
  EXPECT_EQ(ggml_type_name(46), "type 46");
  EXPECT_EQ(ggml_type_name(-1), "type -1");
  EXPECT_EQ(ggml_type_name(1000), "type 1000");
}

}  // namespace
}  // namespace e8kv::llama_cpp
