// The kinds of value a field of the field table (layout_fields.hpp) takes: which values it
// accepts, how a spec string spells them (Config::parse / describe), and how the container's
// layout record stores them. Internal to the library (not installed).
//
// A kind is a small literal value made by a factory (`ints(0, 4096)`, `flag()`, ...), so a
// table row reads like its documentation. Every operation is an overload on (kind, member type):
//   accepts(kind, v)          v is one of the accepted values
//   accepted(kind)            those values in words, for error messages
//   print(kind, v)            the spec spelling (parse(print(v)) == v, bit for bit for floats)
//   parse(kind, text, v)      the spec spelling back; false when malformed or not accepted
//   to_wire / from_wire       the record's little-endian bytes (from_wire checks like accepts)
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "e8kv/cache/kv_view.hpp"
#include "e8kv/config.hpp"

namespace e8kv::detail::fields {

// ---- record wire types ---------------------------------------------------------------------------

enum class Wire : uint8_t { kU8, kU16, kU32, kI32, kU64, kF32, kF64 };

constexpr size_t wire_bytes(Wire w) {
  switch (w) {
    case Wire::kU8: return 1;
    case Wire::kU16: return 2;
    case Wire::kU32:
    case Wire::kI32:
    case Wire::kF32: return 4;
    case Wire::kU64:
    case Wire::kF64: return 8;
  }
  return 0;
}

namespace wire {
inline constexpr Wire u8 = Wire::kU8;
inline constexpr Wire u16 = Wire::kU16;
inline constexpr Wire u32 = Wire::kU32;
inline constexpr Wire i32 = Wire::kI32;
inline constexpr Wire u64 = Wire::kU64;
inline constexpr Wire f32 = Wire::kF32;
inline constexpr Wire f64 = Wire::kF64;
}  // namespace wire

/// Whether a member of type T can be stored as w: integers, flags and enum ids in integer
/// types, uint64_t only as u64, float as f32 and double as f64.
template <class T>
constexpr bool wire_fits(Wire w) {
  if constexpr (std::is_same_v<T, float>) return w == Wire::kF32;
  else if constexpr (std::is_same_v<T, double>) return w == Wire::kF64;
  else if constexpr (std::is_same_v<T, uint64_t>) return w == Wire::kU64;
  else return w == Wire::kU8 || w == Wire::kU16 || w == Wire::kU32 || w == Wire::kI32;
}

/// The format version that introduced a field; older versions store 0 in its bytes (reserved)
/// and mean `absent` (an integer-valued field's value).
struct Since {
  uint16_t version;
  int64_t absent;
};
inline constexpr Since v1{1, 0};
constexpr Since since(uint16_t version, int64_t absent) { return Since{version, absent}; }

// ---- kinds ---------------------------------------------------------------------------------------

/// Integers in [lo, hi] (odd ones only when `odd`).
struct Ints {
  int64_t lo, hi;
  bool odd;
};
constexpr Ints ints(int64_t lo, int64_t hi) { return Ints{lo, hi, false}; }
constexpr Ints odd_ints(int64_t lo, int64_t hi) { return Ints{lo, hi, true}; }
inline constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();

/// One of two integers.
struct OneOf {
  int a, b;
};
constexpr OneOf one_of(int a, int b) { return OneOf{a, b}; }

/// A head dimension the pipeline supports (is_supported_head_dim).
struct HeadDims {};
constexpr HeadDims head_dims() { return {}; }

/// Finite reals in [lo, hi] (or [lo, hi) when hi_open), or > lo when lo_open.
struct Reals {
  double lo, hi;
  bool lo_open, hi_open;
};
constexpr Reals finite() {
  return Reals{-std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(), true, true};
}
constexpr Reals positive() { return Reals{0.0, std::numeric_limits<double>::infinity(), true, true}; }
constexpr Reals fraction_below_one() { return Reals{0.0, 1.0, false, true}; }
/// Config::rate_budget: 0 (off) or bits per element as bytes() counts them (up to 64).
constexpr Reals rate_budget_bits() { return Reals{0.0, 64.0, false, false}; }
/// Config::index_budget: 0 (off) or 2..4 index bits per element (Config::validate checks the gap).
constexpr Reals index_budget_bits() { return Reals{0.0, 4.0, false, false}; }

/// A bool, spelled 0/1 (also true/false, yes/no), or by two names (`off`, `on`) only.
struct Flag {
  const char* off;
  const char* on;
};
constexpr Flag flag() { return Flag{nullptr, nullptr}; }
constexpr Flag flag(const char* off, const char* on) { return Flag{off, on}; }

/// An enum whose ids 0 .. n-1 are named here; an id that needs a newer format version says so.
struct EnumName {
  const char* name;
  uint16_t since = 1;
};
template <class E>
struct Names {
  const EnumName* names;
  int n;
};
template <class E, size_t N>
constexpr Names<E> names(const EnumName (&n)[N]) {
  return Names<E>{n, static_cast<int>(N)};
}

/// An enum named by its own header's to_string (which answers "?" for an unknown id); `since`,
/// when given, is the format version each id needs (ids past its end need version 1).
template <class E>
struct Named {
  const uint16_t* since = nullptr;
  int n_since = 0;
};
template <class E>
constexpr Named<E> named() {
  return {};
}
template <class E, size_t N>
constexpr Named<E> named(const uint16_t (&since)[N]) {
  return Named<E>{since, static_cast<int>(N)};
}

/// Any uint64_t, in decimal.
struct Seed {};
constexpr Seed seed() { return {}; }

/// Per-layer codec pairs (Config::layer_rates): "key/value" per layer, ';' between layers.
struct Rates {};
constexpr Rates rates() { return {}; }

/// A list of finite floats > 0, ';' between them (RopeParams::freq_factors); empty: none.
struct PositiveFloats {};
constexpr PositiveFloats positive_floats() { return {}; }

// ---- accepts / accepted ------------------------------------------------------------------------

template <class T>
bool accepts(const Ints& k, T v) {
  const auto x = static_cast<int64_t>(v);
  return x >= k.lo && x <= k.hi && (!k.odd || x % 2 != 0);
}
inline bool accepts(const OneOf& k, int v) { return v == k.a || v == k.b; }
inline bool accepts(HeadDims, int v) { return is_supported_head_dim(v); }
template <class T>
bool accepts(const Reals& k, T v) {
  const double x = static_cast<double>(v);
  return std::isfinite(x) && (k.lo_open ? x > k.lo : x >= k.lo) && (k.hi_open ? x < k.hi : x <= k.hi);
}
inline bool accepts(const Flag&, bool) { return true; }
template <class E>
bool accepts(const Names<E>& k, E v) {
  return static_cast<int>(v) < k.n;
}
template <class E>
bool accepts(Named<E>, E v) {
  return std::strcmp(to_string(v), "?") != 0;
}
inline bool accepts(Seed, uint64_t) { return true; }
inline bool accepts(Rates, const std::vector<LayerRate>& r) {
  return std::all_of(r.begin(), r.end(), [](const LayerRate& x) {
    return accepts(Named<quant::Codec>{}, x.key) && accepts(Named<quant::Codec>{}, x.value);
  });
}

inline bool accepts(PositiveFloats, const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x) && x > 0.f; });
}

inline std::string accepted(const Ints& k) {
  const std::string odd = k.odd ? "odd integers " : "";
  if (k.hi >= kIntMax) return fmt::format("{}>= {}", odd, k.lo);
  return fmt::format("{}{} .. {}", odd, k.lo, k.hi);
}
inline std::string accepted(const OneOf& k) { return fmt::format("{} or {}", k.a, k.b); }
inline std::string accepted(HeadDims) { return supported_head_dims(); }
inline std::string accepted(const Reals& k) {
  if (std::isinf(k.lo) && std::isinf(k.hi)) return "finite numbers";
  if (std::isinf(k.hi)) return fmt::format("finite numbers {} {}", k.lo_open ? ">" : ">=", k.lo);
  return fmt::format("{}{}, {}{}", k.lo_open ? "(" : "[", k.lo, k.hi, k.hi_open ? ")" : "]");
}
inline std::string accepted(const Flag& k) {
  return k.on ? fmt::format("{} (0) or {} (1)", k.off, k.on) : "0 or 1";
}
template <class E>
std::string accepted(const Names<E>& k) {
  std::string s;
  for (int i = 0; i < k.n; ++i) s += fmt::format("{}{} ({})", i ? ", " : "", k.names[i].name, i);
  return s;
}
template <class E>
std::string accepted(Named<E>) {
  std::string s;
  for (int i = 0; i < 256; ++i)
    if (accepts(Named<E>{}, static_cast<E>(i))) s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", to_string(static_cast<E>(i)), i);
  return s;
}
inline std::string accepted(Seed) { return "0 .. 18446744073709551615"; }
inline std::string accepted(PositiveFloats) { return "empty, or finite numbers > 0 separated by ';'"; }
inline std::string accepted(Rates) {
  return "empty, or key/value codec names per layer separated by ';' (codecs: " + accepted(Named<quant::Codec>{}) + ")";
}

// ---- print / parse (spec strings) --------------------------------------------------------------

template <class T>
std::string print(const Ints&, T v) {
  return fmt::format("{}", static_cast<int64_t>(v));
}
inline std::string print(const OneOf&, int v) { return fmt::format("{}", v); }
inline std::string print(HeadDims, int v) { return fmt::format("{}", v); }
/// Shortest decimal that reads back to the same float / double.
template <class T>
std::string print(const Reals&, T v) {
  return fmt::format("{}", v);
}
inline std::string print(const Flag& k, bool v) {
  if (k.on) return v ? k.on : k.off;
  return v ? "1" : "0";
}
template <class E>
std::string print(const Names<E>& k, E v) {
  const int i = static_cast<int>(v);
  return i < k.n ? k.names[i].name : fmt::format("{}", i);
}
template <class E>
std::string print(Named<E>, E v) {
  return accepts(Named<E>{}, v) ? std::string(to_string(v)) : fmt::format("{}", static_cast<int>(v));
}
inline std::string print(Seed, uint64_t v) { return fmt::format("{}", v); }
inline std::string print(Rates, const std::vector<LayerRate>& r) {
  std::string s;
  for (size_t l = 0; l < r.size(); ++l)
    s += fmt::format("{}{}/{}", l ? ";" : "", print(Named<quant::Codec>{}, r[l].key), print(Named<quant::Codec>{}, r[l].value));
  return s;
}

inline std::string print(PositiveFloats, const std::vector<float>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? ";" : "", v[i]);
  return s;
}

/// Decimal integer, the whole text, no sign other than a leading '-', no spaces.
template <class T>
bool parse_integer(const std::string& text, T& out) {
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, out, 10);
  return !text.empty() && r.ec == std::errc() && r.ptr == end;
}

template <class T>
bool parse(const Ints& k, const std::string& text, T& out) {
  int64_t x = 0;
  if (!parse_integer(text, x) || !accepts(k, x)) return false;
  out = static_cast<T>(x);
  return true;
}
inline bool parse(const OneOf& k, const std::string& text, int& out) {
  int x = 0;
  if (!parse_integer(text, x) || !accepts(k, x)) return false;
  out = x;
  return true;
}
inline bool parse(HeadDims, const std::string& text, int& out) {
  int x = 0;
  if (!parse_integer(text, x) || !accepts(HeadDims{}, x)) return false;
  out = x;
  return true;
}
/// strtof for float fields (a float parsed via double could round twice), strtod for double.
template <class T>
bool parse(const Reals& k, const std::string& text, T& out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  T x;
  if constexpr (std::is_same_v<T, float>) x = std::strtof(text.c_str(), &end);
  else x = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !accepts(k, x)) return false;
  out = x;
  return true;
}
inline bool parse(const Flag& k, const std::string& text, bool& out) {
  if (k.on) {
    if (text != k.on && text != k.off) return false;
    out = text == k.on;
    return true;
  }
  if (text == "1" || text == "true" || text == "yes") out = true;
  else if (text == "0" || text == "false" || text == "no") out = false;
  else return false;
  return true;
}
template <class E>
bool parse(const Names<E>& k, const std::string& text, E& out) {
  for (int i = 0; i < k.n; ++i)
    if (text == k.names[i].name) {
      out = static_cast<E>(i);
      return true;
    }
  return false;
}
template <class E>
bool parse(Named<E>, const std::string& text, E& out) {
  for (int i = 0; i < 256; ++i)
    if (accepts(Named<E>{}, static_cast<E>(i)) && text == to_string(static_cast<E>(i))) {
      out = static_cast<E>(i);
      return true;
    }
  return false;
}
inline bool parse(Seed, const std::string& text, uint64_t& out) {
  return !text.empty() && text[0] != '-' && parse_integer(text, out);
}
inline bool parse(Rates, const std::string& text, std::vector<LayerRate>& out) {
  std::vector<LayerRate> r;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find(';', at), text.size());
    const std::string item = text.substr(at, end - at);
    const size_t slash = item.find('/');
    LayerRate x;
    if (slash == std::string::npos || !parse(Named<quant::Codec>{}, item.substr(0, slash), x.key) ||
        !parse(Named<quant::Codec>{}, item.substr(slash + 1), x.value))
      return false;
    r.push_back(x);
    at = end + 1;
  }
  out = std::move(r);
  return true;
}

inline bool parse(PositiveFloats, const std::string& text, std::vector<float>& out) {
  std::vector<float> v;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find(';', at), text.size());
    float x = 0.f;
    if (!parse(positive(), text.substr(at, end - at), x)) return false;
    v.push_back(x);
    at = end + 1;
  }
  out = std::move(v);
  return true;
}

// ---- record bytes --------------------------------------------------------------------------------

/// The integer, unsigned or floating value of a record field, as read.
struct WireValue {
  int64_t i = 0;   // u8, u16, u32, i32
  uint64_t u = 0;  // u64
  double f = 0;    // f32, f64
};

inline WireValue load_wire(Wire w, const uint8_t* p) {
  WireValue v;
  switch (w) {
    case Wire::kU8: v.i = p[0]; break;
    case Wire::kU16: { uint16_t x; std::memcpy(&x, p, 2); v.i = x; break; }
    case Wire::kU32: { uint32_t x; std::memcpy(&x, p, 4); v.i = x; break; }
    case Wire::kI32: { int32_t x; std::memcpy(&x, p, 4); v.i = x; break; }
    case Wire::kU64: std::memcpy(&v.u, p, 8); break;
    case Wire::kF32: { float x; std::memcpy(&x, p, 4); v.f = x; break; }
    case Wire::kF64: std::memcpy(&v.f, p, 8); break;
  }
  return v;
}

inline std::string show(Wire w, const WireValue& v) {
  if (w == Wire::kU64) return fmt::format("{}", v.u);
  if (w == Wire::kF32 || w == Wire::kF64) return fmt::format("{}", v.f);
  return fmt::format("{}", v.i);
}

template <class T>
void store_wire(Wire w, const T& value, uint8_t* p) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, uint64_t>) {
    std::memcpy(p, &value, sizeof(T));  // wire_fits: f32 / f64 / u64
  } else {
    const auto x = static_cast<int64_t>(value);
    switch (w) {
      case Wire::kU8: p[0] = static_cast<uint8_t>(x); break;
      case Wire::kU16: { const auto y = static_cast<uint16_t>(x); std::memcpy(p, &y, 2); break; }
      case Wire::kU32: { const auto y = static_cast<uint32_t>(x); std::memcpy(p, &y, 4); break; }
      case Wire::kI32: { const auto y = static_cast<int32_t>(x); std::memcpy(p, &y, 4); break; }
      default: break;  // not reachable: wire_fits
    }
  }
}

/// Sets `out` from a record value; false when the kind does not accept it (or it does not fit).
template <class K, class T>
bool from_wire(const K& kind, const WireValue& v, T& out) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    const T x = static_cast<T>(v.f);  // exact: f32 into float, f64 into double
    if (!accepts(kind, x)) return false;
    out = x;
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    if (!accepts(kind, v.u)) return false;
    out = v.u;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (v.i != 0 && v.i != 1) return false;
    out = v.i == 1;
  } else if constexpr (std::is_enum_v<T>) {
    if (v.i < 0 || v.i > 255 || !accepts(kind, static_cast<T>(v.i))) return false;
    out = static_cast<T>(v.i);
  } else {
    if (v.i < std::numeric_limits<T>::min() || v.i > std::numeric_limits<T>::max() ||
        !accepts(kind, static_cast<T>(v.i)))
      return false;
    out = static_cast<T>(v.i);
  }
  return true;
}

/// The oldest format version that can store v (an enum id may be newer than its field).
template <class K, class T>
uint16_t value_version(const K&, const T&) {
  return 1;
}
template <class E>
uint16_t value_version(const Names<E>& k, E v) {
  const int i = static_cast<int>(v);
  return i < k.n ? k.names[i].since : 1;
}
template <class E>
uint16_t value_version(const Named<E>& k, E v) {
  const int i = static_cast<int>(v);
  return i < k.n_since ? k.since[i] : 1;
}

/// The version a field with `since` needs for v: its own when v differs from what older versions
/// mean, and at least what the value needs.
template <class K, class T>
uint16_t needed_version(const K& kind, const Since& s, const T& v) {
  uint16_t need = value_version(kind, v);
  if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    if (s.version > 1 && static_cast<int64_t>(v) != s.absent) need = std::max(need, s.version);
  } else {
    if (s.version > 1 && v != static_cast<T>(s.absent)) need = std::max(need, s.version);
  }
  return need;
}

/// Bit-for-bit equality (so -0.0 differs from 0.0 and the layouts compare like their bytes).
template <class T>
bool same_value(const T& a, const T& b) {
  if constexpr (std::is_floating_point_v<T>) return std::memcmp(&a, &b, sizeof(T)) == 0;
  else return a == b;
}
inline bool same_value(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}
inline bool same_value(const std::vector<LayerRate>& a, const std::vector<LayerRate>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](const LayerRate& x, const LayerRate& y) {
           return x.key == y.key && x.value == y.value;
         });
}

}  // namespace e8kv::detail::fields
