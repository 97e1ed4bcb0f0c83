// The layout record (src/container/layout_record.hpp, docs/format.md §2.2), generated from the
// field table: every field of the cache structs is serialized, the record round-trips, the
// version follows the fields that need it, reserved bytes are checked, layout_difference names
// the field, and bytes() counts the descriptor at the size the header has.
#include "container/layout_record.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "entropy/container_test_util.hpp"

namespace {

using namespace e8kv;
using namespace e8kv::container_test;

// The container writes every field of these structs. When one of them gains a field, this test
// fails: serialize the field (src/container.cpp, docs/format.md, a format version bump, new golden
// files) and then extend the mirror. (A small field that fits in padding escapes this check; the
// round-trip tests compare fields one by one.)
TEST(ContainerFormat, CoversEveryFieldOfTheCacheStructs) {
  struct HeadMirror {
    std::vector<uint8_t> key_codes, value_codes;
    std::vector<uint16_t> key_gains, value_gains, window_keys, window_values, key_mean, value_mean, key_channel_scale;
    std::vector<uint8_t> key_gain_codes, value_gain_codes;
    uint16_t key_gain_ref, value_gain_ref;
  };
  EXPECT_EQ(sizeof(CompressedKV::HeadData), sizeof(HeadMirror));
  struct LayerMirror {
    std::vector<std::vector<int32_t>> positions, window_positions;
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
  };
  EXPECT_EQ(sizeof(transform::RopeParams), sizeof(RopeMirror));
  struct LayoutMirror {
    int n_layers, n_kv_heads, n_q_heads, head_dim;
    std::vector<quant::Codec> key_codec, value_codec;
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
}

// bytes() counts the descriptor as the container writes it: a version-1 header is exactly the
// 48-byte prefix + descriptor_bytes() + per layer its chunk range (16 bytes) and per head the two
// mean lengths and the fp16 means + 16 bytes per directory entry + the CRC. Both position-set modes.
TEST(ContainerHeader, DescriptorBytesMatchTheSerializedHeader) {
  for (const char* spec : {"preset=high,residual=4,gain_bits=16,qweight=0",
                           "preset=high,residual=4,gain_bits=16,qweight=0,per_head=1"}) {
    const Made m = make_cache(spec, small_spec(3, 2, 4, 64, 90, 43), 6);
    const auto bytes = ent::serialize(m.cache);
    const auto info = ent::read_info(bytes.data(), bytes.size());
    ASSERT_EQ(info.format_version, 1) << spec;
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, bytes.data() + 16, sizeof header_bytes);
    const auto& L = m.cache.layout();
    size_t means = 0;
    for (int l = 0; l < L.n_layers; ++l)
      for (const auto& h : m.cache.layer(l).heads) means += 4 + 2 * (h.key_mean.size() + h.value_mean.size());
    EXPECT_EQ(header_bytes, 48 + L.descriptor_bytes() + 16 * static_cast<size_t>(L.n_layers) + means +
                                16 * static_cast<size_t>(info.n_chunks) + 4)
        << spec;
    EXPECT_EQ(L.position_sets(), L.per_head_positions ? 2u : 1u) << spec;
  }
}

}  // namespace
