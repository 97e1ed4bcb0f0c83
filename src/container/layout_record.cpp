// The layout record (src/container/layout_record.hpp), generated from the field table: every
// SHAPE and SHARED row of src/config_fields.hpp is one field of the record.
#include "container/layout_record.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>

#include "container/format.hpp"
#include "config_fields.hpp"
#include "e8kv/container/container.hpp"

namespace e8kv::container {

namespace {

using namespace detail::fields;
using Record = std::array<uint8_t, kLayoutRecordBytes>;

template <class K, class T>
void check_value(const K& kind, const char* name, const T& value) {
  if (!accepts(kind, value))
    io::fail(fmt::format("layout {} {} is not accepted (accepted: {})", name, print(kind, value), accepted(kind)));
}

// Reads one field at `offset` of the record; a field newer than `version` must be 0 there
// (reserved) and takes the value older versions mean.
template <class K, class T>
void read_field(const Record& rec, const K& kind, const char* name, size_t offset, Wire w, const Since& s,
                uint16_t version, T& field, std::array<bool, kLayoutRecordBytes>& covered) {
  if (version < s.version) {
    if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) field = static_cast<T>(s.absent);
    return;  // its bytes stay uncovered: reserved
  }
  std::fill(covered.begin() + static_cast<std::ptrdiff_t>(offset),
            covered.begin() + static_cast<std::ptrdiff_t>(offset + wire_bytes(w)), true);
  const WireValue v = load_wire(w, rec.data() + offset);
  if (!from_wire(kind, v, field))
    io::fail(fmt::format("layout {} {} is not accepted (accepted: {})", name, show(w, v), accepted(kind)));
  if (value_version(kind, field) > version)
    io::fail(fmt::format("layout {} {} needs format version {}; the container is version {}", name,
                         print(kind, field), value_version(kind, field), version));
}

}  // namespace

uint16_t format_version_for(const CacheLayout& L) {
  uint16_t version = 1;
#define E8KV_VERSION(member, kind, offset, w, since_) version = std::max(version, needed_version(kind, since_, L.member));
#define E8KV_VERSION_SHAPE(shape_member, member, kind, offset, w, since_) E8KV_VERSION(member, kind, offset, w, since_)
#define E8KV_VERSION_SHARED(config_member, member, key, kind, offset, w, since_) \
  E8KV_VERSION(member, kind, offset, w, since_)
  E8KV_LAYOUT_FIELDS(E8KV_VERSION_SHAPE, E8KV_VERSION_SHARED, E8KV_FIELD_IGNORE)
#undef E8KV_VERSION_SHARED
#undef E8KV_VERSION_SHAPE
#undef E8KV_VERSION
  if (!L.rope.freq_factors.empty()) version = std::max(version, kRopeFactorsSince);
  return version;
}

void validate_layout(const CacheLayout& L) {
#define E8KV_VALIDATE(member, kind) check_value(kind, #member, L.member);
#define E8KV_VALIDATE_SHAPE(shape_member, member, kind, offset, w, since_) E8KV_VALIDATE(member, kind)
#define E8KV_VALIDATE_SHARED(config_member, member, key, kind, offset, w, since_) E8KV_VALIDATE(member, kind)
  E8KV_LAYOUT_FIELDS(E8KV_VALIDATE_SHAPE, E8KV_VALIDATE_SHARED, E8KV_FIELD_IGNORE)
#undef E8KV_VALIDATE_SHARED
#undef E8KV_VALIDATE_SHAPE
#undef E8KV_VALIDATE
  // Relations between fields.
  io::check(L.n_q_heads % L.n_kv_heads == 0, "layout n_q_heads {} is not accepted (accepted: a multiple of n_kv_heads {})",
            L.n_q_heads, L.n_kv_heads);
  io::check(L.rope.rotary_dim <= L.head_dim, "layout rope.rotary_dim {} is not accepted (accepted: 0 .. head_dim {})",
            L.rope.rotary_dim, L.head_dim);
  io::check(static_cast<int64_t>(L.key_codec.size()) == L.n_layers &&
                static_cast<int64_t>(L.value_codec.size()) == L.n_layers,
            "layout has {} key and {} value codecs; accepted: one of each per layer ({})", L.key_codec.size(),
            L.value_codec.size(), L.n_layers);
  // The code tier: both codecs fp16 (none) or both block codes (CacheLayout::has_code_tier).
  io::check((L.tier_key_codec == quant::Codec::kFp16) == (L.tier_value_codec == quant::Codec::kFp16),
            "layout tier_key_codec {} and tier_value_codec {} are not accepted (accepted: both fp16 (0), no code tier; "
            "or both block codes)",
            print(named<quant::Codec>(), L.tier_key_codec), print(named<quant::Codec>(), L.tier_value_codec));
  io::check(!L.tier_centered || (L.has_code_tier() && L.center && L.key_frame != transform::KeyFrame::kPreRope),
            "layout tier_centered 1 is not accepted without a code tier, centring and a key frame other than pre");
  const size_t pairs = static_cast<size_t>(L.rope.rotary_dim == 0 ? L.head_dim : L.rope.rotary_dim) / 2;
  io::check(L.rope.freq_factors.empty() || L.rope.freq_factors.size() == pairs,
            "layout has {} RoPE frequency factors; accepted: none, or one per rotary pair ({})", L.rope.freq_factors.size(),
            pairs);
  if (!accepts(positive_floats(), L.rope.freq_factors))
    io::fail(fmt::format("layout RoPE frequency factors {} are not accepted (accepted: {})",
                         print(positive_floats(), L.rope.freq_factors), accepted(positive_floats())));
  for (size_t l = 0; l < L.key_codec.size(); ++l) {
    for (const auto* codecs : {&L.key_codec, &L.value_codec})
      if (!accepts(named<quant::Codec>(), (*codecs)[l]))
        io::fail(fmt::format("layout {} codec id {} of layer {} is unknown (accepted: {})",
                             codecs == &L.key_codec ? "key" : "value", static_cast<int>((*codecs)[l]), l,
                             accepted(named<quant::Codec>())));
  }
}

void write_layout_record(io::ByteWriter& w, const CacheLayout& L, uint16_t version) {
  Record rec{};  // reserved bytes, and the bytes of fields newer than `version`, stay 0
#define E8KV_WRITE(member, kind, offset, wire_type, since_)                               \
  static_assert(wire_fits<decltype(L.member)>(wire_type), #member ": wrong wire type"); \
  if (version >= since_.version) store_wire(wire_type, L.member, rec.data() + (offset));
#define E8KV_WRITE_SHAPE(shape_member, member, kind, offset, w, since_) E8KV_WRITE(member, kind, offset, w, since_)
#define E8KV_WRITE_SHARED(config_member, member, key, kind, offset, w, since_) E8KV_WRITE(member, kind, offset, w, since_)
  E8KV_LAYOUT_FIELDS(E8KV_WRITE_SHAPE, E8KV_WRITE_SHARED, E8KV_FIELD_IGNORE)
#undef E8KV_WRITE_SHARED
#undef E8KV_WRITE_SHAPE
#undef E8KV_WRITE
  w.bytes(rec.data(), rec.size());
  for (int l = 0; l < L.n_layers; ++l) {
    w.u8(static_cast<uint8_t>(L.key_codec[static_cast<size_t>(l)]));
    w.u8(static_cast<uint8_t>(L.value_codec[static_cast<size_t>(l)]));
  }
  if (version >= kRopeFactorsSince) {
    w.u16(static_cast<uint16_t>(L.rope.freq_factors.size()));
    for (float f : L.rope.freq_factors) w.f32(f);
  }
}

CacheLayout read_layout_record(io::ByteReader& r, uint16_t version) {
  Record rec;
  std::copy_n(r.take(rec.size(), "layout record"), rec.size(), rec.begin());
  std::array<bool, kLayoutRecordBytes> covered{};
  CacheLayout L;
#define E8KV_READ(member, kind, offset, w, since_) read_field(rec, kind, #member, offset, w, since_, version, L.member, covered);
#define E8KV_READ_SHAPE(shape_member, member, kind, offset, w, since_) E8KV_READ(member, kind, offset, w, since_)
#define E8KV_READ_SHARED(config_member, member, key, kind, offset, w, since_) E8KV_READ(member, kind, offset, w, since_)
  E8KV_LAYOUT_FIELDS(E8KV_READ_SHAPE, E8KV_READ_SHARED, E8KV_FIELD_IGNORE)
#undef E8KV_READ_SHARED
#undef E8KV_READ_SHAPE
#undef E8KV_READ
  for (size_t i = 0; i < rec.size(); ++i)
    io::check(covered[i] || rec[i] == 0, "layout reserved byte {} (offset {}) must be 0 in format version {}, got {}", i,
              48 + i, version, rec[i]);
  r.need(2 * static_cast<size_t>(L.n_layers), "codecs");
  for (int l = 0; l < L.n_layers; ++l) {
    L.key_codec.push_back(static_cast<quant::Codec>(r.u8("key codec")));
    L.value_codec.push_back(static_cast<quant::Codec>(r.u8("value codec")));
  }
  if (version >= kRopeFactorsSince) {
    const uint16_t n = r.u16("RoPE frequency factor count");
    r.need(sizeof(float) * n, "RoPE frequency factors");
    for (uint16_t i = 0; i < n; ++i) L.rope.freq_factors.push_back(r.f32("RoPE frequency factor"));
  }
  validate_layout(L);
  return L;
}

std::string layout_difference(const CacheLayout& a, const CacheLayout& b) {
  // The model's shape, then the codecs, then the rest: the first difference is the telling one.
#define E8KV_DIFF(member, kind)                                                                          \
  if (!same_value(a.member, b.member))                                                                   \
    return fmt::format("{} {} vs {}", #member, print(kind, a.member), print(kind, b.member));
#define E8KV_DIFF_SHAPE(shape_member, member, kind, offset, w, since_) E8KV_DIFF(member, kind)
#define E8KV_DIFF_SHARED(config_member, member, key, kind, offset, w, since_) E8KV_DIFF(member, kind)
  E8KV_LAYOUT_FIELDS(E8KV_DIFF_SHAPE, E8KV_FIELD_IGNORE, E8KV_FIELD_IGNORE)
  // The record's variable part: two codec ids per layer.
  for (const bool keys : {true, false}) {
    const auto& x = keys ? a.key_codec : a.value_codec;
    const auto& y = keys ? b.key_codec : b.value_codec;
    const char* name = keys ? "key_codec" : "value_codec";
    for (size_t l = 0; l < std::max(x.size(), y.size()); ++l) {
      const std::string cx = l < x.size() ? print(named<quant::Codec>(), x[l]) : "(none)";
      const std::string cy = l < y.size() ? print(named<quant::Codec>(), y[l]) : "(none)";
      if (l >= x.size() || l >= y.size() || x[l] != y[l]) return fmt::format("{}[{}] {} vs {}", name, l, cx, cy);
    }
  }
  E8KV_LAYOUT_FIELDS(E8KV_FIELD_IGNORE, E8KV_DIFF_SHARED, E8KV_FIELD_IGNORE)
  if (!same_value(a.rope.freq_factors, b.rope.freq_factors))
    return fmt::format("rope.freq_factors {} vs {}", print(positive_floats(), a.rope.freq_factors),
                       print(positive_floats(), b.rope.freq_factors));
#undef E8KV_DIFF_SHARED
#undef E8KV_DIFF_SHAPE
#undef E8KV_DIFF
  return {};
}

}  // namespace e8kv::container

uint16_t e8kv::CacheLayout::format_version() const { return container::format_version_for(*this); }
