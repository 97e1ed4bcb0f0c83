// GGUF (v2/v3) reader: every count, length, type, dimension and offset is checked against the
// file size before it is used, so a truncated or corrupt file raises e8kv::Error naming the
// problem instead of reading out of bounds. Tensor data is dequantized to fp32 on request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace e8kv::llama {

/// ggml tensor type ids as stored in GGUF tensor infos (ids 4, 5 and 31..33 are retired).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
};

/// Name of a ggml type id ("Q4_1"), or "unknown(N)".
std::string ggml_type_name(uint32_t type);
/// True when `type` is a ggml type whose storage layout this reader knows (so sizes can be checked).
bool ggml_type_known(uint32_t type);
/// True for the types this engine dequantizes: F32, F16, Q4_1, Q8_0.
bool ggml_type_dequantizable(uint32_t type);
/// Elements per block and bytes per block of a known type (throws e8kv::Error otherwise).
uint64_t ggml_block_elements(uint32_t type);
uint64_t ggml_block_bytes(uint32_t type);

/// Dequantizes `n` elements (a multiple of the block size) of `type` from `src` into `dst`.
/// Throws e8kv::Error naming the type when it is not dequantizable.
void dequantize(uint32_t type, const uint8_t* src, float* dst, uint64_t n);

/// IEEE binary16 bits -> float (subnormals, infinities and NaN included) and back
/// (round to nearest even; overflow to infinity).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

/// GGUF metadata value types.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
std::string gguf_type_name(GgufType t);

/// One metadata value. Scalars keep their stored type; integers are available as int64 or
/// uint64 (range-checked by the getters), floats as double. Arrays (not nested) keep their
/// element type and hold strings, integers or floats.
struct GgufValue {
  GgufType type = GgufType::kU8;
  GgufType element_type = GgufType::kU8;  // arrays only
  int64_t i = 0;                          // signed integer types and bool
  uint64_t u = 0;                         // unsigned integer types
  double f = 0;                           // f32 / f64
  std::string s;                          // string
  std::vector<std::string> strings;       // array of strings
  std::vector<int64_t> ints;              // array of integers or bools (u64 above INT64_MAX rejected)
  std::vector<double> floats;             // array of f32 / f64
  bool is_array() const { return type == GgufType::kArray; }
  uint64_t array_size() const { return strings.size() + ints.size() + floats.size(); }
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // dims[0] is the innermost (contiguous) dimension, as in ggml
  uint32_t type = 0;
  uint64_t offset = 0;  // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  /// Rows of dims[0] elements: product of dims[1..].
  uint64_t rows() const { return dims.empty() ? 0 : n_elements / static_cast<uint64_t>(dims[0]); }
};

class GgufFile {
 public:
  /// Reads and validates the whole file. Throws e8kv::Error (naming the file and the problem).
  static GgufFile open(const std::string& path);
  /// Reads and validates the header alone (metadata and tensor infos; each tensor's extent checked
  /// against the file's size), not the tensor data: what a tool that needs the model's shape and
  /// fingerprint reads of a multi-gigabyte GGUF. tensor_data() and dequantize() then throw.
  static GgufFile open_header(const std::string& path);
  /// Validates an in-memory image; `name` is used in error messages.
  static GgufFile parse(std::vector<uint8_t> bytes, const std::string& name = "<memory>");
  /// False for a file opened with open_header.
  bool has_tensor_data() const { return bytes_.size() == file_size_; }

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::string& name() const { return name_; }
  size_t file_size() const { return static_cast<size_t>(file_size_); }

  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  bool has(const std::string& key) const { return metadata_.count(key) != 0; }
  /// The value of `key`; throws e8kv::Error naming the key when it is absent.
  const GgufValue& get(const std::string& key) const;
  /// Typed getters: throw e8kv::Error naming the key when it is absent, has another type,
  /// or does not fit. The variants with a default return it when the key is absent.
  uint64_t get_uint(const std::string& key) const;
  uint64_t get_uint(const std::string& key, uint64_t fallback) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  const std::string& get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  const std::vector<int64_t>& get_int_array(const std::string& key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// nullptr when absent.
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  /// Raw bytes of a tensor (inside the validated file image).
  /// Throws e8kv::Error for a file opened with open_header.
  const uint8_t* tensor_data(const GgufTensorInfo& t) const;
  /// All elements as fp32 (dims[0] fastest). Throws for types that are not dequantizable.
  std::vector<float> dequantize(const GgufTensorInfo& t) const;
  /// Dequantizes rows [row_begin, row_begin + n_rows) into dst (n_rows * dims[0] floats).
  void dequantize_rows(const GgufTensorInfo& t, uint64_t row_begin, uint64_t n_rows, float* dst) const;

 private:
  std::string name_;
  std::vector<uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;  ///< the whole file's (bytes_ holds only the header after open_header)
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;

  static GgufFile parse_image(std::vector<uint8_t> bytes, const std::string& name, uint64_t file_size);
};

/// Builds GGUF v3 images (used by the tests to write tiny models, and by tools).
class GgufWriter {
 public:
  void add_uint32(const std::string& key, uint32_t v);
  void add_int32(const std::string& key, int32_t v);
  void add_uint64(const std::string& key, uint64_t v);
  void add_float32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_int32_array(const std::string& key, const std::vector<int32_t>& v);
  void add_float32_array(const std::string& key, const std::vector<float>& v);
  /// Adds a tensor of `type` from fp32 values (quantized here for F16, Q4_1, Q8_0).
  void add_tensor(const std::string& name, const std::vector<int64_t>& dims, GgmlType type,
                  const std::vector<float>& values);
  /// Adds a tensor with raw, already-encoded bytes (any type id; used to build bad files).
  void add_raw_tensor(const std::string& name, const std::vector<int64_t>& dims, uint32_t type,
                      std::vector<uint8_t> data);
  void set_alignment(uint32_t alignment);
  std::vector<uint8_t> bytes() const;
  void write(const std::string& path) const;
  static void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t type;
    std::vector<uint8_t> data;
  };
  std::vector<uint8_t> kv_;
  uint64_t kv_count_ = 0;
  uint32_t alignment_ = 32;
  std::vector<Tensor> tensors_;
};

/// Encodes n fp32 values (a multiple of 32) as Q8_0 / Q4_1 blocks (round to nearest).
std::vector<uint8_t> quantize_q8_0(const float* x, uint64_t n);
std::vector<uint8_t> quantize_q4_1(const float* x, uint64_t n);

}  // namespace e8kv::llama
