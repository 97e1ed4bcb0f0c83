// The layout record (src/container/layout_record.hpp, docs/format.md §2.2), generated from the
// field table: every field of the cache structs is serialized, the record round-trips, the
// version follows the fields that need it, reserved bytes are checked, layout_difference names
// the field, and bytes() counts the descriptor at the size the header has.
#include "container/layout_record.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "config_field_kinds.hpp"
#include "container/container_test_util.hpp"

namespace {

using namespace e8kv;
using namespace e8kv::container_test;

// The container writes every field of these structs. When one of them gains a field, this test
// fails: give CacheLayout's field a row in the field table (src/config_fields.hpp), a
// LayerData / HeadData field its place in the layer table or the streams (src/container/), say so
// in docs/format.md, bump the format version if a value needs it, add golden files, and then
// extend the mirror. (A small field that fits in padding escapes this check; the
// round-trip tests compare fields one by one.)
TEST(ContainerFormat, CoversEveryFieldOfTheCacheStructs) {
  struct HeadMirror {
    std::vector<uint8_t> key_codes, value_codes;
    std::vector<uint16_t> key_gains, value_gains, window_keys, window_values, key_mean, value_mean, key_channel_scale;
    std::vector<uint8_t> key_gain_codes, value_gain_codes;
    std::vector<uint8_t> tier_key_codes, tier_value_codes;  // version 5
    std::vector<uint16_t> tier_key_gains, tier_value_gains;
    uint16_t key_gain_ref, value_gain_ref;
  };
  EXPECT_EQ(sizeof(CompressedKV::HeadData), sizeof(HeadMirror));
  struct LayerMirror {
    std::vector<std::vector<int32_t>> positions, window_positions;
    std::vector<std::vector<int32_t>> tier_positions;  // version 5
    std::vector<CompressedKV::HeadData> heads;
    int64_t original_tokens, pinned;
    std::vector<std::vector<float>> query_energy;
  };
  EXPECT_EQ(sizeof(CompressedKV::LayerData), sizeof(LayerMirror));
  struct RopeMirror {
    transform::RopeLayout layout;
    int head_dim, rotary_dim;
    double theta;
    transform::RopeScaling scaling;
    double factor;
    int original_max_position;
    double low_freq_factor, high_freq_factor, beta_fast, beta_slow, attention_factor;
    std::vector<float> freq_factors;  // version 6
  };
  EXPECT_EQ(sizeof(transform::RopeParams), sizeof(RopeMirror));
  struct LayoutMirror {
    int n_layers, n_kv_heads, n_q_heads, head_dim;
    std::vector<quant::Codec> key_codec, value_codec;
    quant::Codec tier_key_codec, tier_value_codec;  // version 5
    bool tier_centered;                             // version 6
    quant::GainPolicy key_gain, value_gain;
    float key_scale, value_scale;
    transform::KeyFrame key_frame;
    transform::RopeParams rope;
    uint64_t rotation_seed;
    bool per_head_positions;
    int residual_length, flush_block;
    bool center;
    int mean_tokens;
    bool query_weighted_keys;
    int gain_bits;
    float softmax_scale;
  };
  EXPECT_EQ(sizeof(CacheLayout), sizeof(LayoutMirror));
}

TEST(ContainerRoundTrip, LayoutDifferenceNamesTheField) {
  const Made m = make_cache("preset=quant-k3v2", small_spec(2, 2, 4, 64, 8, 1));
  const CacheLayout a = m.cache.layout();
  EXPECT_EQ(ent::layout_difference(a, a), "");
  auto changed = [&](auto&& edit, const std::string& field) {
    CacheLayout b = a;
    edit(b);
    const std::string d = ent::layout_difference(a, b);
    EXPECT_EQ(d.rfind(field, 0), 0u) << "'" << d << "' should start with " << field;
  };
  changed([](CacheLayout& b) { b.head_dim = 128; }, "head_dim");
  changed([](CacheLayout& b) { b.value_codec[1] = quant::Codec::kBall3; }, "value_codec[1]");
  changed([](CacheLayout& b) { b.rotation_seed ^= 1; }, "rotation_seed");
  changed([](CacheLayout& b) { b.softmax_scale = -0.0f; }, "softmax_scale");
  changed([](CacheLayout& b) { b.rope.beta_slow = 2.0; }, "rope.beta_slow");
  changed([](CacheLayout& b) { b.per_head_positions = true; }, "per_head_positions");
  changed([](CacheLayout& b) { b.tier_key_codec = quant::Codec::kRvq4; }, "tier_key_codec");
  changed([](CacheLayout& b) { b.tier_value_codec = quant::Codec::kBall4; }, "tier_value_codec");
  // Two caches with code tiers of different codecs.
  const Made t = make_cache("preset=quant-k3v2,code_tier=0.1", small_spec(2, 2, 4, 64, 8, 1));
  CacheLayout u = t.cache.layout();
  u.tier_key_codec = quant::Codec::kRvq3;
  EXPECT_EQ(ent::layout_difference(t.cache.layout(), u), "tier_key_codec rvq4 vs rvq3");
}

// bytes() counts the descriptor as the container writes it: a version-1 header is exactly the
// 48-byte prefix + descriptor_bytes() + per layer its chunk range (16 bytes) and per head the two
// mean lengths and the fp16 means + 16 bytes per directory entry + the CRC. Both position-set
// modes; a version-5 header (code tier: a tier token count per set, which descriptor_bytes
// counts), whose version-2 fields per head (scale and energy lengths, the scales, the energies,
// two gain references) are not part of the descriptor either; and version-6 headers (the centred
// tier, RoPE frequency factors: a count and the factors, which descriptor_bytes counts).
TEST(ContainerHeader, DescriptorBytesMatchTheSerializedHeader) {
  std::string factors;  // 32 rotary pairs at head_dim 64
  for (int i = 0; i < 32; ++i) factors += (i ? ";" : "") + std::to_string(1.0 + 0.25 * i);
  const struct {
    std::string spec;
    int version;
  } cases[] = {{"preset=high,residual=4,gain_bits=16,qweight=0,rope=pre", 1},
               {"preset=high,residual=4,gain_bits=16,qweight=0,per_head=1,rope=pre", 1},
               {"preset=quant-k3v2,code_tier=0.2,residual=4,tier_center=0", 5},
               {"preset=quant-k3v2,code_tier=0.2,per_head=1,evict=0.3,tier_center=0", 5},
               {"preset=quant-k3v2,code_tier=0.2,residual=4", 6},
               {"preset=quant-k3v2,code_tier=0.2,per_head=1,evict=0.3", 6},
               {"preset=high,residual=4,gain_bits=16,qweight=0,rope=pre,rope_freq_factors=" + factors, 6}};
  for (const auto& c : cases) {
    const std::string& spec = c.spec;
    const Made m = make_cache(spec, small_spec(3, 2, 4, 64, 90, 43), 6);
    const auto bytes = ent::serialize(m.cache);
    const auto info = ent::read_info(bytes.data(), bytes.size());
    const auto& L = m.cache.layout();
    ASSERT_EQ(info.format_version, c.version) << spec;
    ASSERT_EQ(L.format_version(), c.version) << spec;
    if (L.has_code_tier()) {
      ASSERT_GT(m.cache.tier_tokens(1, 1), 0) << spec;
    }
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, bytes.data() + 16, sizeof header_bytes);
    size_t per_head = 0;
    for (int l = 0; l < L.n_layers; ++l) {
      const auto& ld = m.cache.layer(l);
      for (size_t h = 0; h < ld.heads.size(); ++h) {
        const auto& hd = ld.heads[h];
        per_head += 4 + 2 * (hd.key_mean.size() + hd.value_mean.size());
        if (info.format_version >= 2)
          per_head +=
              8 + 2 * hd.key_channel_scale.size() + (ld.query_energy.empty() ? 0 : 4 * ld.query_energy[h].size());
      }
    }
    EXPECT_EQ(header_bytes, 48 + L.descriptor_bytes() + 16 * static_cast<size_t>(L.n_layers) + per_head +
                                16 * static_cast<size_t>(info.n_chunks) + 4)
        << spec;
    EXPECT_EQ(L.position_sets(), L.per_head_positions ? 2u : 1u) << spec;
  }
}

// ---- the record, byte by byte ------------------------------------------------------------------------

std::vector<uint8_t> record_bytes(const CacheLayout& L, uint16_t version) {
  std::vector<uint8_t> out;
  ent::io::ByteWriter w(out);
  ent::write_layout_record(w, L, version);
  return out;
}

CacheLayout read_record(const std::vector<uint8_t>& b, uint16_t version) {
  ent::io::ByteReader r(b.data(), b.size(), "record");
  CacheLayout L = ent::read_layout_record(r, version);
  EXPECT_EQ(r.remaining(), 0u);
  return L;
}

CacheLayout distinctive_layout() {
  CacheLayout L;
  L.n_layers = 3;
  L.n_kv_heads = 4;
  L.n_q_heads = 12;
  L.head_dim = 96;
  L.key_codec = {quant::Codec::kFp16, quant::Codec::kRvq3, quant::Codec::kBall4};
  L.value_codec = {quant::Codec::kFp16, quant::Codec::kE8P, quant::Codec::kLloydMax4};
  L.key_gain = quant::GainPolicy::kUnbiasedInnerProduct;
  L.value_gain = quant::GainPolicy::kLeastSquares;
  L.key_scale = 1.25f;
  L.value_scale = 0.75f;
  L.key_frame = transform::KeyFrame::kPostRope;
  L.rope.layout = transform::RopeLayout::kInterleaved;
  L.rope.head_dim = 96;
  L.rope.rotary_dim = 64;
  L.rope.theta = 500000.0;
  L.rope.scaling = transform::RopeScaling::kLlama3;
  L.rope.factor = 8.0;
  L.rope.original_max_position = 8192;
  L.rope.low_freq_factor = 1.5;
  L.rope.high_freq_factor = 4.5;
  L.rope.beta_fast = 31.0;
  L.rope.beta_slow = 2.0;
  L.rope.attention_factor = 1.125;
  L.rotation_seed = 0x0123456789ABCDEFull;
  L.per_head_positions = true;
  L.residual_length = 7;
  L.flush_block = 32;
  L.center = true;
  L.mean_tokens = 48;
  L.query_weighted_keys = true;
  L.gain_bits = 8;
  L.softmax_scale = -0.5f;
  return L;
}

// Every field at the offset docs/format.md §2.2 gives (written out here, independently of the
// field table).
TEST(ContainerLayoutRecord, FieldsSitAtTheDocumentedOffsets) {
  const CacheLayout L = distinctive_layout();
  const std::vector<uint8_t> rec = record_bytes(L, 2);
  ASSERT_EQ(rec.size(), 128u + 2 * 3);
  const size_t o = kLayoutAt;  // the doc's offsets are from the start of the container
  EXPECT_EQ(get_at<uint32_t>(rec, 48 - o), 3u);
  EXPECT_EQ(get_at<uint32_t>(rec, 52 - o), 4u);
  EXPECT_EQ(get_at<uint32_t>(rec, 56 - o), 12u);
  EXPECT_EQ(get_at<uint32_t>(rec, 60 - o), 96u);
  EXPECT_EQ(rec[64 - o], 2);  // key_gain unbiased
  EXPECT_EQ(rec[65 - o], 0);  // value_gain ls
  EXPECT_EQ(rec[66 - o], 0);  // key_frame post
  EXPECT_EQ(rec[67 - o], 1);  // per_head_positions
  EXPECT_EQ(rec[68 - o], 1);  // center
  EXPECT_EQ(rec[69 - o], 1);  // query_weighted_keys (v2)
  EXPECT_EQ(rec[70 - o], 8);  // gain_bits (v2)
  EXPECT_EQ(rec[71 - o], 0);  // reserved
  EXPECT_EQ(get_at<float>(rec, 72 - o), 1.25f);
  EXPECT_EQ(get_at<float>(rec, 76 - o), 0.75f);
  EXPECT_EQ(get_at<float>(rec, 80 - o), -0.5f);
  EXPECT_EQ(get_at<int32_t>(rec, 84 - o), 7);
  EXPECT_EQ(get_at<int32_t>(rec, 88 - o), 32);
  EXPECT_EQ(get_at<int32_t>(rec, 92 - o), 48);
  EXPECT_EQ(get_at<uint64_t>(rec, 96 - o), 0x0123456789ABCDEFull);
  EXPECT_EQ(rec[104 - o], 1);  // rope.layout interleaved
  EXPECT_EQ(rec[105 - o], 3);  // rope.scaling llama3
  EXPECT_EQ(get_at<uint16_t>(rec, 106 - o), 0);
  EXPECT_EQ(get_at<int32_t>(rec, 108 - o), 96);
  EXPECT_EQ(get_at<int32_t>(rec, 112 - o), 64);
  EXPECT_EQ(get_at<int32_t>(rec, 116 - o), 8192);
  EXPECT_EQ(get_at<double>(rec, 120 - o), 500000.0);
  EXPECT_EQ(get_at<double>(rec, 128 - o), 8.0);
  EXPECT_EQ(get_at<double>(rec, 136 - o), 1.5);
  EXPECT_EQ(get_at<double>(rec, 144 - o), 4.5);
  EXPECT_EQ(get_at<double>(rec, 152 - o), 31.0);
  EXPECT_EQ(get_at<double>(rec, 160 - o), 2.0);
  EXPECT_EQ(get_at<double>(rec, 168 - o), 1.125);
  const uint8_t codecs[] = {0, 0, 2, 1, 5, 11};  // key, value per layer
  EXPECT_EQ(std::memcmp(rec.data() + 128, codecs, 6), 0);
  expect_layout_eq(L, read_record(rec, 2));
  // Version 5: the code tier's codecs in the bytes that were reserved (106, 107).
  CacheLayout T = L;
  T.tier_key_codec = quant::Codec::kRvq3;
  T.tier_value_codec = quant::Codec::kBall4;
  const std::vector<uint8_t> rec5 = record_bytes(T, 5);
  EXPECT_EQ(rec5[106 - o], 2);  // tier_key_codec rvq3
  EXPECT_EQ(rec5[107 - o], 5);  // tier_value_codec ball4
  ASSERT_EQ(rec5.size(), rec.size());
  for (size_t i = 0; i < rec.size(); ++i) {
    if (i != 106 - o && i != 107 - o) {
      EXPECT_EQ(rec[i], rec5[i]) << "byte " << i + o << " moved in version 5";
    }
  }
  expect_layout_eq(T, read_record(rec5, 5));
}

// The writer uses version 1 unless a field needs version 2 (query-weighted keys, 8-bit gains) or
// 3 (the RoPE-residual key frame); a version-1 record leaves the version-2 bytes 0, and reads
// them back as "off" and 16.
TEST(ContainerLayoutRecord, VersionFollowsTheFieldsThatNeedIt) {
  CacheLayout L = distinctive_layout();
  L.query_weighted_keys = false;
  L.gain_bits = 16;
  EXPECT_EQ(ent::format_version_for(L), 1);
  const std::vector<uint8_t> v1 = record_bytes(L, 1);
  EXPECT_EQ(v1[69 - kLayoutAt], 0);
  EXPECT_EQ(v1[70 - kLayoutAt], 0) << "gain_bits is reserved in version 1";
  expect_layout_eq(L, read_record(v1, 1));
  const std::vector<uint8_t> v2 = record_bytes(L, 2);
  EXPECT_EQ(v2[70 - kLayoutAt], 16);
  expect_layout_eq(L, read_record(v2, 2));
  L.query_weighted_keys = true;
  EXPECT_EQ(ent::format_version_for(L), 2);
  L.query_weighted_keys = false;
  L.gain_bits = 8;
  EXPECT_EQ(ent::format_version_for(L), 2);
  // The RoPE-residual key frame (id 2 of the byte that held keys_pre_rope) needs version 3; a
  // version-2 reader refuses it, naming the version it needs.
  L.key_frame = transform::KeyFrame::kRopeResidual;
  EXPECT_EQ(ent::format_version_for(L), 3);
  const std::vector<uint8_t> v3 = record_bytes(L, 3);
  EXPECT_EQ(v3[66 - kLayoutAt], 2);
  expect_layout_eq(L, read_record(v3, 3));
  expect_error([&] { read_record(v3, 2); }, "key_frame residual needs format version 3");
  // The code tier needs version 5: a version-4 reader finds its codec ids in reserved bytes.
  L.tier_key_codec = quant::Codec::kRvq4;
  L.tier_value_codec = quant::Codec::kRvq3;
  EXPECT_EQ(ent::format_version_for(L), 5);
  const std::vector<uint8_t> v5 = record_bytes(L, 5);
  expect_layout_eq(L, read_record(v5, 5));
  expect_error([&] { read_record(v5, 4); }, "reserved byte 58");
}

// The tier codec ids: both 0 (fp16: no code tier) or both block codes; an unknown id is refused.
TEST(ContainerLayoutRecord, TierCodecsAreBothFp16OrBothBlockCodes) {
  CacheLayout L = distinctive_layout();
  L.tier_key_codec = quant::Codec::kRvq4;
  L.tier_value_codec = quant::Codec::kRvq4;
  const std::vector<uint8_t> good = record_bytes(L, 5);
  expect_layout_eq(L, read_record(good, 5));
  std::vector<uint8_t> t = good;
  t[106 - kLayoutAt] = 0;  // fp16 keys, rvq4 values
  expect_error([&] { read_record(t, 5); },
               "layout tier_key_codec fp16 and tier_value_codec rvq4 are not accepted (accepted: both fp16 (0)");
  t = good;
  t[107 - kLayoutAt] = 0;
  expect_error([&] { read_record(t, 5); }, "tier_key_codec rvq4 and tier_value_codec fp16 are not accepted");
  t = good;
  t[106 - kLayoutAt] = 12;
  expect_error([&] { read_record(t, 5); }, "layout tier_key_codec 12 is not accepted (accepted: fp16 (0)");
  t = good;
  t[107 - kLayoutAt] = 0xFF;
  expect_error([&] { read_record(t, 5); }, "layout tier_value_codec 255 is not accepted");
  t[106 - kLayoutAt] = 0;
  t[107 - kLayoutAt] = 0;  // no code tier: a version-5 record may say so
  L.tier_key_codec = L.tier_value_codec = quant::Codec::kFp16;
  expect_layout_eq(L, read_record(t, 5));
  // The writer refuses the same layouts.
  L.tier_value_codec = quant::Codec::kE8P;
  expect_error([&] { ent::validate_layout(L); }, "tier_key_codec fp16 and tier_value_codec e8p2 are not accepted");
}

// Every byte no field of the version covers must be 0.
TEST(ContainerLayoutRecord, ReservedBytesMustBeZero) {
  CacheLayout L = distinctive_layout();
  L.query_weighted_keys = false;
  L.gain_bits = 16;
  const std::vector<uint8_t> v1 = record_bytes(L, 1);
  for (size_t at : {size_t{69}, size_t{70}, size_t{71}, size_t{106}, size_t{107}}) {
    std::vector<uint8_t> t = v1;
    t[at - kLayoutAt] = 1;
    expect_error([&] { read_record(t, 1); }, "reserved byte " + std::to_string(at - kLayoutAt),
                 "offset " + std::to_string(at));
  }
  for (uint16_t version = 2; version <= 4; ++version) {
    const std::vector<uint8_t> v = record_bytes(L, version);
    for (size_t at : {size_t{71}, size_t{106}, size_t{107}}) {
      std::vector<uint8_t> t = v;
      t[at - kLayoutAt] = 0x03;  // rvq4's id: a tier codec in a version without the code tier
      expect_error([&] { read_record(t, version); }, "reserved byte",
                   "offset " + std::to_string(at) + " version " + std::to_string(version));
    }
  }
  const std::vector<uint8_t> v5 = record_bytes(L, 5);
  std::vector<uint8_t> t = v5;
  t[71 - kLayoutAt] = 1;
  expect_error([&] { read_record(t, 5); }, "reserved byte 23");
}

// Random valid layouts (every field anywhere in its accepted range) survive write -> read at the
// version they need and at every newer one, and layout_difference finds no difference.
TEST(ContainerLayoutRecord, RandomValidLayoutsRoundTrip) {
  auto rng = test::seeded_rng(2718);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  auto real = [&]() {
    const double x = std::ldexp(std::uniform_real_distribution<double>(-1.0, 1.0)(rng), static_cast<int>(pick(200)) - 100);
    return pick(8) == 0 ? -0.0 : x;
  };
  const int dims[] = {64, 80, 96, 128, 256};
  for (int i = 0; i < 2000; ++i) {
    CacheLayout L;
    L.n_layers = static_cast<int>(pick(7));
    L.n_kv_heads = 1 + static_cast<int>(pick(pick(2) == 0 ? 8 : 4096));
    L.n_q_heads = L.n_kv_heads * (1 + static_cast<int>(pick(65536 / L.n_kv_heads)));
    L.head_dim = dims[pick(5)];
    for (int l = 0; l < L.n_layers; ++l) {
      L.key_codec.push_back(static_cast<quant::Codec>(pick(quant::kCodecCount)));
      L.value_codec.push_back(static_cast<quant::Codec>(pick(quant::kCodecCount)));
    }
    L.key_gain = static_cast<quant::GainPolicy>(pick(3));
    L.value_gain = static_cast<quant::GainPolicy>(pick(3));
    L.key_scale = std::fabs(static_cast<float>(real())) + 1e-30f;
    L.value_scale = std::ldexp(1.0f + static_cast<float>(pick(1000)), -static_cast<int>(pick(100)));
    L.key_frame = static_cast<transform::KeyFrame>(pick(3));
    L.rope.layout = static_cast<transform::RopeLayout>(pick(2));
    L.rope.head_dim = static_cast<int>(pick(1025));
    L.rope.rotary_dim = static_cast<int>(pick(L.head_dim + 1));
    L.rope.theta = real();
    L.rope.scaling = static_cast<transform::RopeScaling>(pick(5));
    L.rope.factor = real();
    L.rope.original_max_position = static_cast<int>(pick(std::numeric_limits<int32_t>::max()));
    L.rope.low_freq_factor = real();
    L.rope.high_freq_factor = real();
    L.rope.beta_fast = real();
    L.rope.beta_slow = real();
    L.rope.attention_factor = real();
    L.rotation_seed = rng();
    L.per_head_positions = pick(2) == 1;
    L.residual_length = static_cast<int>(pick(std::numeric_limits<int32_t>::max()));
    L.flush_block = 1 + static_cast<int>(pick(std::numeric_limits<int32_t>::max() - 1));
    L.center = pick(2) == 1;
    L.mean_tokens = 1 + static_cast<int>(pick(1 << 20));
    L.query_weighted_keys = pick(2) == 1;
    L.gain_bits = pick(2) == 0 ? 8 : 16;
    L.softmax_scale = static_cast<float>(real());
    if (pick(2) == 1) {  // a code tier: two block codes
      L.tier_key_codec = static_cast<quant::Codec>(1 + pick(quant::kCodecCount - 1));
      L.tier_value_codec = static_cast<quant::Codec>(1 + pick(quant::kCodecCount - 1));
    }
    ASSERT_NO_THROW(ent::validate_layout(L)) << "layout " << i;
    for (uint16_t v = ent::format_version_for(L); v <= ent::kFormatVersion; ++v) {
      const CacheLayout back = read_record(record_bytes(L, v), v);
      expect_layout_eq(L, back);
      EXPECT_EQ(ent::layout_difference(L, back), "") << "layout " << i << " version " << v;
    }
    if (::testing::Test::HasFailure()) return;
  }
}

// The table's kinds: a value newer than its field (as the key frame's "residual" id needs format
// version 3) makes the writer choose that version and a reader of an older version
// refuse it; parse and print agree; integers, reals, flags and seeds reject what they must.
TEST(ContainerLayoutRecord, FieldKindsAcceptWhatTheySayAndNoMore) {
  namespace f = e8kv::detail::fields;
  enum class Frame : uint8_t { kPost = 0, kPre = 1, kResidual = 2 };
  static constexpr f::EnumName kNames[] = {{"post"}, {"pre"}, {"residual", 3}};
  const auto frame = f::names<Frame>(kNames);
  EXPECT_EQ(f::needed_version(frame, f::v1, Frame::kPre), 1);
  EXPECT_EQ(f::needed_version(frame, f::v1, Frame::kResidual), 3);
  Frame x = Frame::kPost;
  EXPECT_TRUE(f::parse(frame, "residual", x));
  EXPECT_EQ(x, Frame::kResidual);
  EXPECT_EQ(f::print(frame, x), "residual");
  EXPECT_FALSE(f::parse(frame, "sideways", x));
  f::WireValue w;
  w.i = 3;
  EXPECT_FALSE(f::from_wire(frame, w, x)) << "id 3 is unknown";
  EXPECT_EQ(f::accepted(frame), "post (0), pre (1), residual (2)");
  // since(2, 16): the value older versions mean needs no newer version.
  EXPECT_EQ(f::needed_version(f::one_of(8, 16), f::since(2, 16), 16), 1);
  EXPECT_EQ(f::needed_version(f::one_of(8, 16), f::since(2, 16), 8), 2);

  int i = 0;
  EXPECT_TRUE(f::parse(f::ints(0, 10), "10", i));
  for (const char* bad : {"11", "-1", "", " 1", "1 ", "+1", "1.0", "0x1", "99999999999999999999"})
    EXPECT_FALSE(f::parse(f::ints(0, 10), bad, i)) << bad;
  EXPECT_FALSE(f::parse(f::odd_ints(1, 99), "4", i));
  double d = 0;
  EXPECT_TRUE(f::parse(f::fraction_below_one(), "0", d));
  for (const char* bad : {"1", "-0.1", "nan", "inf", "0.5x", ""}) EXPECT_FALSE(f::parse(f::fraction_below_one(), bad, d)) << bad;
  float fl = 0;
  for (const char* bad : {"0", "-1", "1e39", "nan"}) EXPECT_FALSE(f::parse(f::positive(), bad, fl)) << bad;
  // Shortest round-trip spelling, bit for bit, for awkward floats and doubles.
  for (float v : {0.1f, 1.0f / 3.0f, 3.4028235e38f, 1e-45f, -0.0f, 16777217.0f}) {
    float back = 1;
    ASSERT_TRUE(f::parse(f::finite(), f::print(f::finite(), v), back)) << v;
    EXPECT_TRUE(same_bits(v, back)) << f::print(f::finite(), v);
  }
  for (double v : {0.1, 1.0 / 3.0, 1.7976931348623157e308, 5e-324, -0.0, 0.35}) {
    double back = 1;
    ASSERT_TRUE(f::parse(f::finite(), f::print(f::finite(), v), back)) << v;
    EXPECT_TRUE(same_bits(v, back)) << f::print(f::finite(), v);
  }
  uint64_t seed = 0;
  EXPECT_TRUE(f::parse(f::seed(), "18446744073709551615", seed));
  EXPECT_EQ(seed, UINT64_MAX);
  for (const char* bad : {"-1", "18446744073709551616", "abc", "", "1.5"}) EXPECT_FALSE(f::parse(f::seed(), bad, seed)) << bad;
}

}  // namespace
