// GGUF parsing with bounds checks before every read, ggml block dequantization, and a writer.
#include "e8kv/llama/gguf.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "e8kv/error.hpp"

namespace e8kv::llama {

// ---- ggml types -------------------------------------------------------------------------

namespace {

struct TypeTraits {
  const char* name;
  uint32_t block_elements;  // 0: unknown / retired id
  uint32_t block_bytes;
};

// Storage sizes of the ggml types (block of elements -> bytes), from the GGUF format description.
constexpr TypeTraits kTypes[] = {
    {"F32", 1, 4},      {"F16", 1, 2},        {"Q4_0", 32, 18},    {"Q4_1", 32, 20},     {"Q4_2", 0, 0},
    {"Q4_3", 0, 0},     {"Q5_0", 32, 22},     {"Q5_1", 32, 24},    {"Q8_0", 32, 34},     {"Q8_1", 32, 36},
    {"Q2_K", 256, 84},  {"Q3_K", 256, 110},   {"Q4_K", 256, 144},  {"Q5_K", 256, 176},   {"Q6_K", 256, 210},
    {"Q8_K", 256, 292}, {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
    {"IQ4_NL", 32, 18}, {"IQ3_S", 256, 110},  {"IQ2_S", 256, 82},  {"IQ4_XS", 256, 136}, {"I8", 1, 1},
    {"I16", 1, 2},      {"I32", 1, 4},        {"I64", 1, 8},       {"F64", 1, 8},        {"IQ1_M", 256, 56},
    {"BF16", 1, 2},     {"Q4_0_4_4", 0, 0},   {"Q4_0_4_8", 0, 0},  {"Q4_0_8_8", 0, 0},   {"TQ1_0", 256, 54},
    {"TQ2_0", 256, 66},
};
constexpr uint32_t kTypeCount = sizeof(kTypes) / sizeof(kTypes[0]);

const TypeTraits* traits(uint32_t type) {
  if (type >= kTypeCount || kTypes[type].block_elements == 0) return nullptr;
  return &kTypes[type];
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  if (type < kTypeCount) return kTypes[type].name;
  return "unknown(" + std::to_string(type) + ")";
}

bool ggml_type_known(uint32_t type) { return traits(type) != nullptr; }

bool ggml_type_dequantizable(uint32_t type) {
  const auto t = static_cast<GgmlType>(type);
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kQ4_1 || t == GgmlType::kQ8_0;
}

uint64_t ggml_block_elements(uint32_t type) {
  const TypeTraits* t = traits(type);
  require(t != nullptr, "ggml tensor type " + ggml_type_name(type) + " is not a known storage type");
  return t->block_elements;
}

uint64_t ggml_block_bytes(uint32_t type) {
  const TypeTraits* t = traits(type);
  require(t != nullptr, "ggml tensor type " + ggml_type_name(type) + " is not a known storage type");
  return t->block_bytes;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: value = mantissa * 2^-24, exact in fp32
      const float v = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
      std::memcpy(&bits, &v, 4);
      bits |= sign;
    }
  } else if (exponent == 31) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t float_to_half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // NaN
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65536: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): scale to units of 2^-24 and round half to even.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;    // exact (power of two)
    const float r = std::nearbyint(scaled);  // default rounding mode: half to even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  // Normal: drop 13 mantissa bits with round half to even (a carry into the exponent is correct).
  const uint32_t rounded = abs + 0x0FFFu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

void dequantize(uint32_t type, const uint8_t* src, float* dst, uint64_t n) {
  const auto t = static_cast<GgmlType>(type);
  auto read_half = [](const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return half_to_float(h);
  };
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case GgmlType::kF16:
      for (uint64_t i = 0; i < n; ++i) dst[i] = read_half(src + 2 * i);
      return;
    case GgmlType::kQ8_0: {
      require(n % 32 == 0, "Q8_0 dequantize: element count must be a multiple of 32");
      for (uint64_t b = 0; b < n / 32; ++b) {
        const uint8_t* block = src + b * 34;
        const float d = read_half(block);
        const auto* q = reinterpret_cast<const int8_t*>(block + 2);
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = d * static_cast<float>(q[j]);
      }
      return;
    }
    case GgmlType::kQ4_1: {
      require(n % 32 == 0, "Q4_1 dequantize: element count must be a multiple of 32");
      for (uint64_t b = 0; b < n / 32; ++b) {
        const uint8_t* block = src + b * 20;
        const float d = read_half(block);
        const float m = read_half(block + 2);
        const uint8_t* q = block + 4;
        // Low nibbles hold elements 0..15, high nibbles 16..31.
        for (int j = 0; j < 16; ++j) {
          dst[b * 32 + j] = static_cast<float>(q[j] & 0x0F) * d + m;
          dst[b * 32 + 16 + j] = static_cast<float>(q[j] >> 4) * d + m;
        }
      }
      return;
    }
    default:
      throw Error("tensor type " + ggml_type_name(type) +
                  " is not supported by this engine (supported: F32, F16, Q4_1, Q8_0)");
  }
}

std::vector<uint8_t> quantize_q8_0(const float* x, uint64_t n) {
  require(n % 32 == 0, "quantize_q8_0: n must be a multiple of 32");
  std::vector<uint8_t> out(n / 32 * 34);
  for (uint64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const uint16_t dh = float_to_half(amax / 127.0f);
    const float d = half_to_float(dh);
    uint8_t* block = out.data() + b * 34;
    std::memcpy(block, &dh, 2);
    for (int j = 0; j < 32; ++j) {
      const float q = d > 0 ? std::nearbyint(x[b * 32 + j] / d) : 0.0f;
      block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)));
    }
  }
  return out;
}

std::vector<uint8_t> quantize_q4_1(const float* x, uint64_t n) {
  require(n % 32 == 0, "quantize_q4_1: n must be a multiple of 32");
  std::vector<uint8_t> out(n / 32 * 20);
  for (uint64_t b = 0; b < n / 32; ++b) {
    float lo = x[b * 32], hi = x[b * 32];
    for (int j = 0; j < 32; ++j) {
      lo = std::min(lo, x[b * 32 + j]);
      hi = std::max(hi, x[b * 32 + j]);
    }
    const uint16_t dh = float_to_half((hi - lo) / 15.0f);
    const uint16_t mh = float_to_half(lo);
    const float d = half_to_float(dh), m = half_to_float(mh);
    uint8_t* block = out.data() + b * 20;
    std::memcpy(block, &dh, 2);
    std::memcpy(block + 2, &mh, 2);
    for (int j = 0; j < 16; ++j) {
      auto q = [&](float v) {
        const float r = d > 0 ? std::nearbyint((v - m) / d) : 0.0f;
        return static_cast<uint8_t>(std::clamp(r, 0.0f, 15.0f));
      };
      block[4 + j] = static_cast<uint8_t>(q(x[b * 32 + j]) | (q(x[b * 32 + 16 + j]) << 4));
    }
  }
  return out;
}

// ---- reading ----------------------------------------------------------------------------

namespace {

constexpr uint64_t kMaxDims = 4;                // GGML_MAX_DIMS
constexpr uint64_t kMaxStringBytes = 1u << 30;  // no sane key, token or template is larger

// Bounds-checked little-endian reader over the file image; every failure names the offset
// and the item being read.
class Cursor {
 public:
  Cursor(const std::vector<uint8_t>& b, const std::string& file) : b_(b), file_(file) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return b_.size() - pos_; }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("GGUF file '" + file_ + "': " + what + " (at byte offset " + std::to_string(pos_) + " of " +
                std::to_string(b_.size()) + ")");
  }
  void need(uint64_t n, const std::string& what) const {
    if (n > remaining())
      fail("truncated while reading " + what + ": needs " + std::to_string(n) + " bytes, " +
           std::to_string(remaining()) + " left");
  }
  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what) {
    const uint64_t len = read<uint64_t>(what + " length");
    if (len > kMaxStringBytes) fail(what + " length " + std::to_string(len) + " is absurd (limit 2^30)");
    need(len, what);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const std::vector<uint8_t>& b_;
  const std::string& file_;
  uint64_t pos_ = 0;
};

uint64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    default:
      return 0;
  }
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kF64); }

// Reads one scalar of type t into v (as int, uint, float or bool).
void read_scalar(Cursor& c, GgufType t, GgufValue& v, const std::string& what) {
  switch (t) {
    case GgufType::kU8:
      v.u = c.read<uint8_t>(what);
      v.i = static_cast<int64_t>(v.u);
      break;
    case GgufType::kI8:
      v.i = c.read<int8_t>(what);
      break;
    case GgufType::kU16:
      v.u = c.read<uint16_t>(what);
      v.i = static_cast<int64_t>(v.u);
      break;
    case GgufType::kI16:
      v.i = c.read<int16_t>(what);
      break;
    case GgufType::kU32:
      v.u = c.read<uint32_t>(what);
      v.i = static_cast<int64_t>(v.u);
      break;
    case GgufType::kI32:
      v.i = c.read<int32_t>(what);
      break;
    case GgufType::kU64:
      v.u = c.read<uint64_t>(what);
      v.i = static_cast<int64_t>(std::min<uint64_t>(v.u, INT64_MAX));
      break;
    case GgufType::kI64:
      v.i = c.read<int64_t>(what);
      break;
    case GgufType::kF32:
      v.f = c.read<float>(what);
      break;
    case GgufType::kF64:
      v.f = c.read<double>(what);
      break;
    case GgufType::kBool: {
      const uint8_t b = c.read<uint8_t>(what);
      if (b > 1) c.fail(what + ": bool value " + std::to_string(b) + " is neither 0 nor 1");
      v.i = b;
      break;
    }
    default:
      c.fail(what + ": not a scalar type");
  }
  if (t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64 || t == GgufType::kBool)
    v.u = v.i >= 0 ? static_cast<uint64_t>(v.i) : 0;
}

GgufValue read_value(Cursor& c, GgufType t, const std::string& key) {
  GgufValue v;
  v.type = t;
  const std::string what = "value of '" + key + "'";
  if (t == GgufType::kString) {
    v.s = c.read_string(what);
  } else if (t == GgufType::kArray) {
    const uint32_t et = c.read<uint32_t>(what + " array element type");
    if (!valid_value_type(et))
      c.fail(what + ": array element type " + std::to_string(et) + " is not a GGUF type (0..12)");
    v.element_type = static_cast<GgufType>(et);
    if (v.element_type == GgufType::kArray) c.fail(what + ": nested arrays are not supported");
    const uint64_t count = c.read<uint64_t>(what + " array length");
    const uint64_t min_elem = v.element_type == GgufType::kString ? 8 : scalar_size(v.element_type);
    if (count > c.remaining() / min_elem)
      c.fail(what + ": array length " + std::to_string(count) + " does not fit in the " +
             std::to_string(c.remaining()) + " bytes left");
    if (v.element_type == GgufType::kString) {
      v.strings.reserve(count);
      for (uint64_t k = 0; k < count; ++k) v.strings.push_back(c.read_string(what + "[" + std::to_string(k) + "]"));
    } else if (v.element_type == GgufType::kF32 || v.element_type == GgufType::kF64) {
      v.floats.reserve(count);
      for (uint64_t k = 0; k < count; ++k) {
        GgufValue e;
        read_scalar(c, v.element_type, e, what);
        v.floats.push_back(e.f);
      }
    } else {
      v.ints.reserve(count);
      for (uint64_t k = 0; k < count; ++k) {
        GgufValue e;
        read_scalar(c, v.element_type, e, what);
        if (v.element_type == GgufType::kU64 && e.u > static_cast<uint64_t>(INT64_MAX))
          c.fail(what + ": u64 array element exceeds the supported range");
        v.ints.push_back(e.i);
      }
    }
  } else {
    read_scalar(c, t, v, what);
  }
  return v;
}

}  // namespace

std::string gguf_type_name(GgufType t) {
  static const char* names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "unknown(" + std::to_string(i) + ")";
}

GgufFile GgufFile::open(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  require(static_cast<bool>(in), "cannot open GGUF file '" + path + "'");
  const std::streamoff size = in.tellg();
  require(size >= 0, "cannot determine the size of GGUF file '" + path + "'");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0) in.read(reinterpret_cast<char*>(bytes.data()), size);
  require(static_cast<bool>(in), "cannot read GGUF file '" + path + "'");
  return parse(std::move(bytes), path);
}

GgufFile GgufFile::open_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  require(static_cast<bool>(in), "cannot open GGUF file '" + path + "'");
  const std::streamoff size = in.tellg();
  require(size >= 0, "cannot determine the size of GGUF file '" + path + "'");
  const uint64_t file_size = static_cast<uint64_t>(size);
  // The header's size is known only once it is parsed: read a prefix, and four times more while
  // the parse runs past it (a vocabulary of 150K tokens is a few MB of metadata).
  for (uint64_t want = uint64_t{4} << 20;; want *= 4) {
    const uint64_t n = std::min(want, file_size);
    std::vector<uint8_t> bytes(static_cast<size_t>(n));
    in.clear();
    in.seekg(0);
    if (n > 0) in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(n));
    require(static_cast<bool>(in), "cannot read GGUF file '" + path + "'");
    try {
      return parse_image(std::move(bytes), path, file_size);
    } catch (const Error&) {
      if (n == file_size) throw;  // the whole file: the error is the file's
    }
  }
}

const uint8_t* GgufFile::tensor_data(const GgufTensorInfo& t) const {
  require(has_tensor_data(), "GGUF file '" + name_ + "' was opened for its header only: tensor '" + t.name +
                                 "' has no data here (GgufFile::open reads it)");
  return bytes_.data() + data_offset_ + t.offset;
}

GgufFile GgufFile::parse(std::vector<uint8_t> bytes, const std::string& name) {
  const uint64_t size = bytes.size();
  return parse_image(std::move(bytes), name, size);
}

GgufFile GgufFile::parse_image(std::vector<uint8_t> bytes, const std::string& name, uint64_t file_size) {
  GgufFile f;
  f.name_ = name;
  f.bytes_ = std::move(bytes);
  f.file_size_ = file_size;
  Cursor c(f.bytes_, f.name_);

  c.need(4, "magic");
  if (std::memcmp(f.bytes_.data(), "GGUF", 4) != 0) c.fail("bad magic: not a GGUF file (expected the bytes 'GGUF')");
  c.read<uint32_t>("magic");
  f.version_ = c.read<uint32_t>("version");
  if (f.version_ != 2 && f.version_ != 3)
    c.fail("unsupported GGUF version " + std::to_string(f.version_) + " (this reader accepts 2 and 3)");
  const uint64_t tensor_count = c.read<uint64_t>("tensor count");
  const uint64_t kv_count = c.read<uint64_t>("metadata count");
  // Smallest possible entries: a key/value is 8 (key length) + 1 + 4 (type) + 1 bytes; a tensor
  // info is 8 + 1 (name) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset) bytes.
  if (kv_count > c.remaining() / 14) c.fail("metadata count " + std::to_string(kv_count) + " cannot fit in the file");
  if (tensor_count > c.remaining() / 33)
    c.fail("tensor count " + std::to_string(tensor_count) + " cannot fit in the file");

  for (uint64_t k = 0; k < kv_count; ++k) {
    std::string key = c.read_string("metadata key #" + std::to_string(k));
    if (key.empty()) c.fail("metadata key #" + std::to_string(k) + " is empty");
    const uint32_t t = c.read<uint32_t>("type of '" + key + "'");
    if (!valid_value_type(t))
      c.fail("metadata '" + key + "' has value type " + std::to_string(t) + ", not a GGUF type (0..12)");
    GgufValue v = read_value(c, static_cast<GgufType>(t), key);
    if (f.metadata_.count(key)) c.fail("duplicate metadata key '" + key + "'");
    f.metadata_.emplace(std::move(key), std::move(v));
  }

  if (auto it = f.metadata_.find("general.alignment"); it != f.metadata_.end()) {
    const GgufValue& a = it->second;
    if (a.type != GgufType::kU32) c.fail("general.alignment must be a u32, found " + gguf_type_name(a.type));
    if (a.u == 0 || (a.u & (a.u - 1)) != 0 || a.u > (1u << 20))
      c.fail("general.alignment " + std::to_string(a.u) + " is not a power of two up to 2^20");
    f.alignment_ = a.u;
  }

  f.tensors_.reserve(tensor_count);
  for (uint64_t k = 0; k < tensor_count; ++k) {
    GgufTensorInfo t;
    t.name = c.read_string("name of tensor #" + std::to_string(k));
    if (t.name.empty()) c.fail("tensor #" + std::to_string(k) + " has an empty name");
    const std::string what = "tensor '" + t.name + "'";
    const uint32_t n_dims = c.read<uint32_t>(what + " dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      c.fail(what + " has " + std::to_string(n_dims) + " dimensions (accepted: 1..4)");
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.read<uint64_t>(what + " dimension " + std::to_string(d));
      if (dim == 0 || dim > (uint64_t{1} << 40))
        c.fail(what + " dimension " + std::to_string(d) + " is " + std::to_string(dim) + " (accepted: 1..2^40)");
      if (n_elements > (uint64_t{1} << 50) / dim) c.fail(what + " has an absurd element count");
      n_elements *= dim;
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    t.type = c.read<uint32_t>(what + " type");
    if (!ggml_type_known(t.type))
      c.fail(what + " has tensor type id " + std::to_string(t.type) + " (" + ggml_type_name(t.type) +
             "), which is not a known ggml type");
    const uint64_t block = ggml_block_elements(t.type);
    if (static_cast<uint64_t>(t.dims[0]) % block != 0)
      c.fail(what + " of type " + ggml_type_name(t.type) + " has a first dimension " + std::to_string(t.dims[0]) +
             " that is not a multiple of its block size " + std::to_string(block));
    t.n_elements = n_elements;
    t.n_bytes = n_elements / block * ggml_block_bytes(t.type);
    t.offset = c.read<uint64_t>(what + " offset");
    if (t.offset % f.alignment_ != 0)
      c.fail(what + " offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
             std::to_string(f.alignment_));
    if (f.tensor_index_.count(t.name)) c.fail("duplicate tensor name '" + t.name + "'");
    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t header_end = c.pos();
  const uint64_t data_offset = (header_end + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  if (!f.tensors_.empty() && data_offset > f.file_size_)
    throw Error("GGUF file '" + name + "': truncated: the data section would start at byte " +
                std::to_string(data_offset) + " but the file has " + std::to_string(f.file_size_) + " bytes");
  f.data_offset_ = std::min<uint64_t>(data_offset, f.file_size_);
  const uint64_t data_size = f.file_size_ - f.data_offset_;

  std::vector<const GgufTensorInfo*> by_offset;
  for (const auto& t : f.tensors_) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      throw Error("GGUF file '" + name + "': tensor '" + t.name + "' (" + std::to_string(t.n_bytes) +
                  " bytes at data offset " + std::to_string(t.offset) +
                  ") extends past the end of the file "
                  "(data section has " +
                  std::to_string(data_size) + " bytes): truncated or corrupt");
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k)
    if (by_offset[k - 1]->offset + by_offset[k - 1]->n_bytes > by_offset[k]->offset)
      throw Error("GGUF file '" + name + "': tensors '" + by_offset[k - 1]->name + "' and '" + by_offset[k]->name +
                  "' overlap");
  return f;
}

const GgufValue& GgufFile::get(const std::string& key) const {
  auto it = metadata_.find(key);
  require(it != metadata_.end(), "GGUF file '" + name_ + "': metadata key '" + key + "' is missing");
  return it->second;
}

namespace {
bool is_integer(GgufType t) {
  return t == GgufType::kU8 || t == GgufType::kI8 || t == GgufType::kU16 || t == GgufType::kI16 ||
         t == GgufType::kU32 || t == GgufType::kI32 || t == GgufType::kU64 || t == GgufType::kI64;
}
bool is_signed(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}
}  // namespace

uint64_t GgufFile::get_uint(const std::string& key) const {
  const GgufValue& v = get(key);
  require(is_integer(v.type), "GGUF metadata '" + key + "' must be an integer, found " + gguf_type_name(v.type));
  require(!is_signed(v.type) || v.i >= 0,
          "GGUF metadata '" + key + "' must be non-negative, found " + std::to_string(v.i));
  return is_signed(v.type) ? static_cast<uint64_t>(v.i) : v.u;
}

uint64_t GgufFile::get_uint(const std::string& key, uint64_t fallback) const {
  return has(key) ? get_uint(key) : fallback;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = get(key);
  require(is_integer(v.type), "GGUF metadata '" + key + "' must be an integer, found " + gguf_type_name(v.type));
  require(v.type != GgufType::kU64 || v.u <= static_cast<uint64_t>(INT64_MAX),
          "GGUF metadata '" + key + "' is out of range");
  return v.i;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type == GgufType::kF32 || v.type == GgufType::kF64) return v.f;
  require(is_integer(v.type), "GGUF metadata '" + key + "' must be a number, found " + gguf_type_name(v.type));
  return is_signed(v.type) ? static_cast<double>(v.i) : static_cast<double>(v.u);
}

double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const GgufValue& v = get(key);
  require(v.type == GgufType::kBool, "GGUF metadata '" + key + "' must be a bool, found " + gguf_type_name(v.type));
  return v.i != 0;
}

const std::string& GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = get(key);
  require(v.type == GgufType::kString, "GGUF metadata '" + key + "' must be a string, found " + gguf_type_name(v.type));
  return v.s;
}

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

const std::vector<std::string>& GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = get(key);
  require(v.type == GgufType::kArray && v.element_type == GgufType::kString,
          "GGUF metadata '" + key + "' must be an array of strings");
  return v.strings;
}

const std::vector<int64_t>& GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = get(key);
  require(v.type == GgufType::kArray && (is_integer(v.element_type) || v.element_type == GgufType::kBool),
          "GGUF metadata '" + key + "' must be an array of integers");
  return v.ints;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view tensor_name) const {
  auto it = tensor_index_.find(tensor_name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> GgufFile::dequantize(const GgufTensorInfo& t) const {
  std::vector<float> out(t.n_elements);
  dequantize_rows(t, 0, t.rows(), out.data());
  return out;
}

void GgufFile::dequantize_rows(const GgufTensorInfo& t, uint64_t row_begin, uint64_t n_rows, float* dst) const {
  require(row_begin <= t.rows() && n_rows <= t.rows() - row_begin,
          "dequantize_rows: rows out of range for tensor '" + t.name + "'");
  require(ggml_type_dequantizable(t.type),
          "tensor '" + t.name + "' has type " + ggml_type_name(t.type) +
              ", which this engine does not support (supported: F32, F16, Q4_1, Q8_0)");
  const uint64_t row_elements = static_cast<uint64_t>(t.dims[0]);
  const uint64_t row_bytes = row_elements / ggml_block_elements(t.type) * ggml_block_bytes(t.type);
  llama::dequantize(t.type, tensor_data(t) + row_begin * row_bytes, dst, n_rows * row_elements);
}

// ---- writing ----------------------------------------------------------------------------

namespace {
template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}
void put_key(std::vector<uint8_t>& out, const std::string& key, GgufType t) {
  put_string(out, key);
  put<uint32_t>(out, static_cast<uint32_t>(t));
}
}  // namespace

void GgufWriter::add_uint32(const std::string& key, uint32_t v) {
  put_key(kv_, key, GgufType::kU32);
  put(kv_, v);
  ++kv_count_;
}
void GgufWriter::add_int32(const std::string& key, int32_t v) {
  put_key(kv_, key, GgufType::kI32);
  put(kv_, v);
  ++kv_count_;
}
void GgufWriter::add_uint64(const std::string& key, uint64_t v) {
  put_key(kv_, key, GgufType::kU64);
  put(kv_, v);
  ++kv_count_;
}
void GgufWriter::add_float32(const std::string& key, float v) {
  put_key(kv_, key, GgufType::kF32);
  put(kv_, v);
  ++kv_count_;
}
void GgufWriter::add_bool(const std::string& key, bool v) {
  put_key(kv_, key, GgufType::kBool);
  put<uint8_t>(kv_, v ? 1 : 0);
  ++kv_count_;
}
void GgufWriter::add_string(const std::string& key, const std::string& v) {
  put_key(kv_, key, GgufType::kString);
  put_string(kv_, v);
  ++kv_count_;
}

void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  put_key(kv_, key, GgufType::kArray);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::kString));
  put<uint64_t>(kv_, v.size());
  for (const auto& s : v) put_string(kv_, s);
  ++kv_count_;
}

void GgufWriter::add_int32_array(const std::string& key, const std::vector<int32_t>& v) {
  put_key(kv_, key, GgufType::kArray);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::kI32));
  put<uint64_t>(kv_, v.size());
  for (int32_t x : v) put(kv_, x);
  ++kv_count_;
}

void GgufWriter::add_float32_array(const std::string& key, const std::vector<float>& v) {
  put_key(kv_, key, GgufType::kArray);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::kF32));
  put<uint64_t>(kv_, v.size());
  for (float x : v) put(kv_, x);
  ++kv_count_;
}

void GgufWriter::add_tensor(const std::string& name, const std::vector<int64_t>& dims, GgmlType type,
                            const std::vector<float>& values) {
  uint64_t n = 1;
  for (int64_t d : dims) n *= static_cast<uint64_t>(d);
  require(n == values.size(), "GgufWriter::add_tensor: " + name + " has " + std::to_string(values.size()) +
                                  " values for " + std::to_string(n) + " elements");
  std::vector<uint8_t> data;
  switch (type) {
    case GgmlType::kF32:
      data.resize(n * 4);
      std::memcpy(data.data(), values.data(), n * 4);
      break;
    case GgmlType::kF16:
      data.resize(n * 2);
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t h = float_to_half(values[i]);
        std::memcpy(data.data() + 2 * i, &h, 2);
      }
      break;
    case GgmlType::kQ8_0:
      data = quantize_q8_0(values.data(), n);
      break;
    case GgmlType::kQ4_1:
      data = quantize_q4_1(values.data(), n);
      break;
    default:
      throw Error("GgufWriter::add_tensor: type " + ggml_type_name(static_cast<uint32_t>(type)) + " not supported");
  }
  add_raw_tensor(name, dims, static_cast<uint32_t>(type), std::move(data));
}

void GgufWriter::add_raw_tensor(const std::string& name, const std::vector<int64_t>& dims, uint32_t type,
                                std::vector<uint8_t> data) {
  tensors_.push_back({name, dims, type, std::move(data)});
}

void GgufWriter::set_alignment(uint32_t alignment) {
  require(alignment > 0 && (alignment & (alignment - 1)) == 0, "GgufWriter::set_alignment: power of two required");
  alignment_ = alignment;
  add_uint32("general.alignment", alignment);
}

std::vector<uint8_t> GgufWriter::bytes() const {
  std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_count_);
  out.insert(out.end(), kv_.begin(), kv_.end());
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const auto& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(out, static_cast<uint64_t>(d));
    put<uint32_t>(out, t.type);
    put<uint64_t>(out, offset);
    offsets.push_back(offset);
    offset = (offset + t.data.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  out.resize((out.size() + alignment_ - 1) / alignment_ * alignment_, 0);
  const size_t data_start = out.size();
  for (size_t k = 0; k < tensors_.size(); ++k) {
    out.resize(data_start + offsets[k], 0);
    out.insert(out.end(), tensors_[k].data.begin(), tensors_[k].data.end());
  }
  return out;
}

void GgufWriter::write(const std::string& path) const { write_bytes(path, bytes()); }

void GgufWriter::write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary);
  require(static_cast<bool>(out), "cannot write '" + path + "'");
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  require(static_cast<bool>(out), "cannot write '" + path + "'");
}

}  // namespace e8kv::llama
