// GGUF reader: fp16 conversion, dequantization against hand-built blocks, writer/reader round
// trip, and rejection (e8kv::Error naming the problem) of truncated and corrupt images.
#include "e8kv/llama/gguf.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/llama/testing.hpp"
#include "testing/test_util.hpp"

namespace {

using e8kv::llama::float_to_half;
using e8kv::llama::GgmlType;
using e8kv::llama::GgufFile;
using e8kv::llama::GgufType;
using e8kv::llama::GgufWriter;
using e8kv::llama::half_to_float;

// Expects parse to throw e8kv::Error whose message contains `needle`.
void expect_rejected(const std::vector<uint8_t>& image, const std::string& needle) {
  try {
    GgufFile::parse(image, "bad.gguf");
    ADD_FAILURE() << "accepted a corrupt image (expected an error mentioning '" << needle << "')";
  } catch (const e8kv::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

// Byte-level builder for hand-made (possibly invalid) GGUF images.
struct Raw {
  std::vector<uint8_t> b;
  template <class T>
  Raw& put(T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
    return *this;
  }
  Raw& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  Raw& kv_u32(const std::string& key, uint32_t v) { return str(key).put<uint32_t>(4).put<uint32_t>(v); }
  Raw& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) put<uint64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  Raw& pad_to(size_t alignment) {
    b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
    return *this;
  }
  Raw& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

// A small valid image: metadata of several types and four tensors of the supported types.
std::vector<uint8_t> sample_image(std::vector<float>* f32_values = nullptr) {
  GgufWriter w;
  w.add_string("general.architecture", "test");
  w.add_uint32("test.count", 7);
  w.add_int32("test.negative", -5);
  w.add_uint64("test.big", uint64_t{1} << 40);
  w.add_float32("test.float", 0.25f);
  w.add_bool("test.flag", true);
  w.add_string_array("test.strings", {"a", "", "ccc"});
  w.add_int32_array("test.ints", {1, -2, 3});
  w.add_float32_array("test.floats", {0.5f, -1.5f});
  std::vector<float> v(64 * 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
  if (f32_values) *f32_values = v;
  w.add_tensor("f32", {64, 2}, GgmlType::kF32, v);
  w.add_tensor("f16", {64, 2}, GgmlType::kF16, v);
  w.add_tensor("q8", {64, 2}, GgmlType::kQ8_0, v);
  w.add_tensor("q41", {32, 4}, GgmlType::kQ4_1, v);
  return w.bytes();
}

TEST(Half, KnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(half_to_float(0xC000), -2.0f);
  EXPECT_EQ(half_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isinf(half_to_float(0xFC00)) && half_to_float(0xFC00) < 0);
  EXPECT_TRUE(std::isnan(half_to_float(0x7E00)));
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
}

TEST(Half, RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1.0).
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(float_to_half(65519.0f), 0x7BFF);  // below the halfway point to 65536
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // halfway: rounds to even = infinity
  EXPECT_EQ(float_to_half(1e10f), 0x7C00);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // halfway to the smallest subnormal: even (0)
  EXPECT_EQ(float_to_half(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: ties to even (2)
}

TEST(Half, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Dequantize, Q8_0HandBuiltBlock) {
  // d = 0.5 (fp16 0x3800), q_j = j - 16 for j < 32.
  std::vector<uint8_t> block(34);
  block[0] = 0x00;
  block[1] = 0x38;
  for (int j = 0; j < 32; ++j) block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  std::vector<float> out(32);
  e8kv::llama::dequantize(static_cast<uint32_t>(GgmlType::kQ8_0), block.data(), out.data(), 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 0.5f * static_cast<float>(j - 16)) << j;
}

TEST(Dequantize, Q4_1HandBuiltBlock) {
  // d = 0.25 (0x3400), m = -1 (0xBC00); byte j holds element j (low nibble) and j + 16 (high).
  std::vector<uint8_t> block(20);
  block[0] = 0x00;
  block[1] = 0x34;
  block[2] = 0x00;
  block[3] = 0xBC;
  for (int j = 0; j < 16; ++j) block[4 + j] = static_cast<uint8_t>((j & 0xF) | ((15 - j) << 4));
  std::vector<float> out(32);
  e8kv::llama::dequantize(static_cast<uint32_t>(GgmlType::kQ4_1), block.data(), out.data(), 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.25f * j - 1.0f) << j;
    EXPECT_EQ(out[16 + j], 0.25f * (15 - j) - 1.0f) << j;
  }
}

TEST(Dequantize, QuantizersStayWithinHalfAStep) {
  auto rng = e8kv::test::seeded_rng(11);
  std::normal_distribution<float> g(0.0f, 2.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x(32 * 4);
    for (auto& v : x) v = g(rng);
    if (trial == 0) std::fill(x.begin(), x.end(), 0.0f);  // all-zero block: d = 0
    if (trial == 1) std::fill(x.begin(), x.end(), 1.5f);  // constant block
    const auto q8 = e8kv::llama::quantize_q8_0(x.data(), x.size());
    const auto q4 = e8kv::llama::quantize_q4_1(x.data(), x.size());
    std::vector<float> y8(x.size()), y4(x.size());
    e8kv::llama::dequantize(static_cast<uint32_t>(GgmlType::kQ8_0), q8.data(), y8.data(), x.size());
    e8kv::llama::dequantize(static_cast<uint32_t>(GgmlType::kQ4_1), q4.data(), y4.data(), x.size());
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float amax = 0, lo = x[b * 32], hi = x[b * 32];
      for (int j = 0; j < 32; ++j) {
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
      }
      const float step8 = amax / 127, step4 = (hi - lo) / 15;
      for (int j = 0; j < 32; ++j) {
        const size_t i = b * 32 + j;
        EXPECT_LE(std::fabs(y8[i] - x[i]), 0.5f * step8 * 1.01f + 1e-3f * amax + 1e-7f) << i;
        EXPECT_LE(std::fabs(y4[i] - x[i]), 0.5f * step4 * 1.01f + 2e-3f * (std::fabs(lo) + step4) + 1e-7f) << i;
      }
    }
  }
}

TEST(Dequantize, UnsupportedTypeIsNamed) {
  std::vector<uint8_t> raw(210);
  float out[256];
  try {
    e8kv::llama::dequantize(static_cast<uint32_t>(GgmlType::kQ6_K), raw.data(), out, 256);
    FAIL() << "Q6_K accepted";
  } catch (const e8kv::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q6_K"), std::string::npos) << e.what();
  }
}

TEST(Gguf, WriterReaderRoundTrip) {
  std::vector<float> v;
  const auto image = sample_image(&v);
  const GgufFile f = GgufFile::parse(image);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.get_string("general.architecture"), "test");
  EXPECT_EQ(f.get_uint("test.count"), 7u);
  EXPECT_EQ(f.get_int("test.negative"), -5);
  EXPECT_EQ(f.get_uint("test.big"), uint64_t{1} << 40);
  EXPECT_EQ(f.get_float("test.float"), 0.25);
  EXPECT_TRUE(f.get_bool("test.flag", false));
  EXPECT_EQ(f.get_string_array("test.strings"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f.get_int_array("test.ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.get("test.floats").floats, (std::vector<double>{0.5, -1.5}));
  EXPECT_EQ(f.get_uint("absent", 9), 9u);
  EXPECT_THROW(f.get_uint("test.negative"), e8kv::Error);  // negative as unsigned
  EXPECT_THROW(f.get_string("test.count"), e8kv::Error);   // wrong type
  EXPECT_THROW(f.get("absent"), e8kv::Error);

  ASSERT_EQ(f.tensors().size(), 4u);
  const auto* t32 = f.find_tensor("f32");
  const auto* t16 = f.find_tensor("f16");
  const auto* t8 = f.find_tensor("q8");
  const auto* t4 = f.find_tensor("q41");
  ASSERT_TRUE(t32 && t16 && t8 && t4);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  EXPECT_EQ(t32->dims, (std::vector<int64_t>{64, 2}));
  EXPECT_EQ(t4->dims, (std::vector<int64_t>{32, 4}));
  EXPECT_EQ(t32->n_bytes, 512u);
  EXPECT_EQ(t16->n_bytes, 256u);
  EXPECT_EQ(t8->n_bytes, 4u * 34);
  EXPECT_EQ(t4->n_bytes, 4u * 20);
  EXPECT_EQ(f.dequantize(*t32), v);
  const auto h = f.dequantize(*t16);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(h[i], half_to_float(float_to_half(v[i])));
  const auto q8 = f.dequantize(*t8);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(q8[i], v[i], 3.0f / 127);
  // Rows: dequantize_rows of row 1 equals the second half of the whole tensor.
  std::vector<float> row(64);
  f.dequantize_rows(*t8, 1, 1, row.data());
  EXPECT_TRUE(std::equal(row.begin(), row.end(), q8.begin() + 64));
  EXPECT_THROW(f.dequantize_rows(*t8, 2, 1, row.data()), e8kv::Error);
}

TEST(Gguf, CustomAlignmentAndUnsupportedTensorType) {
  GgufWriter w;
  w.set_alignment(64);
  w.add_tensor("a", {32}, GgmlType::kF32, std::vector<float>(32, 1.0f));
  w.add_raw_tensor("q6k", {256}, static_cast<uint32_t>(GgmlType::kQ6_K), std::vector<uint8_t>(210, 0));
  const GgufFile f = GgufFile::parse(w.bytes());
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  const auto* t = f.find_tensor("q6k");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->offset % 64, 0u);
  try {
    f.dequantize(*t);
    FAIL() << "Q6_K dequantized";
  } catch (const e8kv::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q6_K"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("q6k"), std::string::npos) << e.what();
  }
}

TEST(Gguf, EveryTruncationIsRejected) {
  const auto image = sample_image();
  for (size_t len = 0; len < image.size(); ++len) {
    std::vector<uint8_t> cut(image.begin(), image.begin() + static_cast<std::ptrdiff_t>(len));
    EXPECT_THROW(GgufFile::parse(cut), e8kv::Error) << "prefix of " << len << " bytes accepted";
  }
  // The tiny model too (a realistic layout), at a sample of lengths.
  const auto model = e8kv::llama::make_tiny_llama_gguf();
  for (size_t len = 0; len < model.size(); len += 1 + len / 16) {
    std::vector<uint8_t> cut(model.begin(), model.begin() + static_cast<std::ptrdiff_t>(len));
    EXPECT_THROW(GgufFile::parse(cut), e8kv::Error) << "prefix of " << len << " bytes accepted";
  }
  EXPECT_NO_THROW(GgufFile::parse(model));
}

TEST(Gguf, HeaderErrorsAreNamed) {
  auto image = sample_image();
  auto bad = image;
  bad[0] = 'X';
  expect_rejected(bad, "bad magic");
  for (uint32_t version : {0u, 1u, 4u, 0xFFFFFFFFu}) {
    bad = image;
    std::memcpy(bad.data() + 4, &version, 4);
    expect_rejected(bad, "unsupported GGUF version " + std::to_string(version));
  }
  bad = image;
  const uint64_t huge = uint64_t{1} << 60;
  std::memcpy(bad.data() + 8, &huge, 8);
  expect_rejected(bad, "tensor count");
  bad = image;
  std::memcpy(bad.data() + 16, &huge, 8);
  expect_rejected(bad, "metadata count");
  expect_rejected({}, "truncated while reading magic");
}

TEST(Gguf, MetadataErrorsAreNamed) {
  expect_rejected(Raw().header(0, 1).str("k").put<uint32_t>(13).put<uint32_t>(0).zeros(32).b, "value type 13");
  expect_rejected(Raw().header(0, 1).put<uint64_t>(uint64_t{1} << 62).zeros(64).b, "absurd");
  expect_rejected(Raw().header(0, 1).str("k").put<uint32_t>(8).put<uint64_t>(1000).zeros(32).b, "truncated");
  expect_rejected(
      Raw().header(0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(uint64_t{1} << 61).zeros(64).b,
      "array length");
  expect_rejected(Raw().header(0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(1).zeros(64).b,
                  "nested arrays");
  expect_rejected(Raw().header(0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(1).zeros(64).b,
                  "element type 77");
  expect_rejected(Raw().header(0, 1).str("b").put<uint32_t>(7).put<uint8_t>(2).zeros(32).b, "bool value 2");
  expect_rejected(Raw().header(0, 2).kv_u32("same", 1).kv_u32("same", 2).zeros(32).b, "duplicate metadata key 'same'");
  expect_rejected(Raw().header(0, 1).kv_u32("", 1).zeros(32).b, "empty");
  expect_rejected(Raw().header(0, 1).kv_u32("general.alignment", 0).zeros(32).b, "general.alignment");
  expect_rejected(Raw().header(0, 1).kv_u32("general.alignment", 3).zeros(32).b, "power of two");
  expect_rejected(Raw().header(0, 1).str("general.alignment").put<uint32_t>(5).put<int32_t>(32).zeros(32).b,
                  "must be a u32");
  // A valid metadata-only file parses.
  EXPECT_NO_THROW(GgufFile::parse(Raw().header(0, 1).kv_u32("x", 1).b));
}

TEST(Gguf, TensorErrorsAreNamed) {
  auto one = [](std::vector<uint64_t> dims, uint32_t type, uint64_t offset, size_t data) {
    Raw r;
    r.header(1, 0).tensor("t", std::move(dims), type, offset).pad_to(32).zeros(data);
    return r.b;
  };
  EXPECT_NO_THROW(GgufFile::parse(one({8}, 0, 0, 32)));
  expect_rejected(one({}, 0, 0, 32), "0 dimensions");
  expect_rejected(one({1, 1, 1, 1, 1}, 0, 0, 32), "5 dimensions");
  expect_rejected(one({0}, 0, 0, 32), "dimension 0 is 0");
  expect_rejected(one({uint64_t{1} << 41}, 0, 0, 32), "accepted: 1..2^40");
  expect_rejected(one({uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0, 32), "absurd element count");
  expect_rejected(one({8}, 4, 0, 32), "not a known ggml type");  // retired id
  expect_rejected(one({8}, 99, 0, 32), "unknown(99)");
  expect_rejected(one({16}, 8, 0, 64), "not a multiple of its block size 32");  // Q8_0 row of 16
  expect_rejected(one({8}, 0, 8, 64), "not a multiple of the alignment");
  expect_rejected(one({8}, 0, 64, 32), "extends past the end");
  expect_rejected(one({9}, 0, 0, 32), "extends past the end");  // 36 bytes in a 32-byte section
  {
    Raw r;
    r.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad_to(32).zeros(128);
    expect_rejected(r.b, "overlap");
  }
  {
    Raw r;
    r.header(2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).pad_to(32).zeros(64);
    expect_rejected(r.b, "duplicate tensor name 'a'");
  }
  {
    Raw r;
    r.header(1, 0).tensor("", {8}, 0, 0).pad_to(32).zeros(32);
    expect_rejected(r.b, "empty name");
  }
  {
    Raw r;  // the data section would start past the end of the file
    r.header(1, 0).tensor("t", {8}, 0, 0);
    expect_rejected(r.b, "truncated");
  }
}

TEST(Gguf, RandomCorruptionNeverCrashes) {
  const auto image = sample_image();
  auto rng = e8kv::test::seeded_rng(2024);
  const size_t header_end = GgufFile::parse(image).data_offset();
  std::uniform_int_distribution<size_t> where(0, header_end - 1);
  std::uniform_int_distribution<int> byte(0, 255), count(1, 4);
  int rejected = 0, accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto bad = image;
    for (int k = count(rng); k > 0; --k) bad[where(rng)] = static_cast<uint8_t>(byte(rng));
    try {
      const GgufFile f = GgufFile::parse(bad);
      for (const auto& t : f.tensors())  // whatever was accepted must be readable in bounds
        if (e8kv::llama::ggml_type_dequantizable(t.type)) (void)f.dequantize(t);
      ++accepted;
    } catch (const e8kv::Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  std::printf("[corruption] %d rejected, %d still valid\n", rejected, accepted);
}

// open_header reads the header alone: the same metadata and tensor infos as open, the tensors'
// extents checked against the file's size, no tensor data. A header past the first read (a large
// vocabulary) is read in larger pieces; a file cut inside its data section is refused.
TEST(Gguf, OpenHeaderReadsNoTensorData) {
  GgufWriter w;
  w.add_string("general.architecture", "test");
  std::vector<std::string> vocab(400000);  // about 6 MB of metadata: past the first 4 MB read
  for (size_t i = 0; i < vocab.size(); ++i) vocab[i] = "token" + std::to_string(i);
  w.add_string_array("test.vocab", vocab);
  std::vector<float> v(64 * 80000, 0.5f);  // 20 MB of data: more than the second read (16 MB) takes
  w.add_tensor("big", {64, 80000}, GgmlType::kF32, v);
  const std::vector<uint8_t> image = w.bytes();
  const std::string path = ::testing::TempDir() + "/e8kv_open_header.gguf";
  auto write = [&](size_t n) {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(image.data(), 1, n, f), n);
    std::fclose(f);
  };
  ASSERT_NO_FATAL_FAILURE(write(image.size()));
  const GgufFile whole = GgufFile::open(path), header = GgufFile::open_header(path);
  EXPECT_TRUE(whole.has_tensor_data());
  EXPECT_FALSE(header.has_tensor_data());
  EXPECT_EQ(header.file_size(), image.size());
  EXPECT_EQ(header.data_offset(), whole.data_offset());
  EXPECT_EQ(header.get_string_array("test.vocab"), vocab);
  ASSERT_EQ(header.tensors().size(), 1u);
  EXPECT_EQ(header.tensors()[0].dims, whole.tensors()[0].dims);
  EXPECT_EQ(header.tensors()[0].offset, whole.tensors()[0].offset);
  try {
    header.dequantize(header.tensors()[0]);
    FAIL() << "tensor data read from a header-only file";
  } catch (const e8kv::Error& e) {
    EXPECT_NE(std::string(e.what()).find("header only"), std::string::npos) << e.what();
  }
  ASSERT_NO_FATAL_FAILURE(write(image.size() - 100));  // cut inside the tensor's data
  try {
    GgufFile::open_header(path);
    FAIL() << "a truncated file was accepted";
  } catch (const e8kv::Error& e) {
    EXPECT_NE(std::string(e.what()).find("extends past the end"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(Gguf, OpenReportsMissingFile) {
  try {
    GgufFile::open("/nonexistent/dir/model.gguf");
    FAIL();
  } catch (const e8kv::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/model.gguf"), std::string::npos);
  }
}

}  // namespace
