// The offload / transfer container: a compressed cache (CompressedKV) or a plain fp16/bf16 cache
// as one self-describing, versioned, checksummed byte string (docs/format.md is the spec).
//
//   std::vector<uint8_t> bytes = e8kv::container::serialize(cache);           // or into a buffer / ostream
//   e8kv::CompressedKV back = e8kv::container::deserialize(bytes.data(), bytes.size());
//   auto layer3 = e8kv::container::deserialize_layer(bytes.data(), bytes.size(), 3);  // partial read
//
// Layout: a header (magic, format and library version, the whole CacheLayout, a layer table and
// a chunk directory; CRC-32C), then per layer chunks of `chunk_tokens` stored tokens, each with
// its own header, length and CRC-32C, so one layer or one token range decodes alone. Inside a
// chunk every stream (positions, key/value codes, gains, residual window, the code tier's codes
// and gains) gets a reversible transform (delta along tokens and/or byte planes) and then zstd.
//
// Reading never trusts the input: every length, offset, count and enum is checked before use, a
// damaged, truncated, oversized or version-mismatched input raises e8kv::Error naming what is
// wrong, and the memory a read allocates is computed from the header and checked against
// DeserializeOptions::max_decoded_bytes before anything is allocated.
//
// Thread safety: all functions are reentrant; they share no state.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/cache/kv_view.hpp"

namespace e8kv::container {

/// The newest container format version this library reads and writes. Version 2 adds
/// query-weighted keys and 8-bit gains (two layout bytes; per head the key channel scales, the
/// pending query energies and the gain references); version 3 the RoPE-residual key frame
/// (key-frame byte value 2); version 4 pinned fp16 window tokens at any position (the fp16 tier,
/// Config::fp16_tier), where older versions pinned only tokens before every other; version 5 the
/// code tier (Config::code_tier: two layout bytes, a tier token count per position set, four
/// streams per chunk); version 6 the centred code tier (layout byte 23) and RoPE frequency
/// factors (a count and the factors after the per-layer codec ids). A cache is written at the
/// lowest version that holds it, byte for byte as that version always wrote it.
inline constexpr uint16_t kFormatVersion = 6;
/// The 8 magic bytes at offset 0: 0x8B 'E' '8' 'K' 'V' '\r' '\n' 0x1A (a high-bit byte and a
/// CR LF pair detect 7-bit and text-mode mangling, like PNG's signature).
inline constexpr std::array<uint8_t, 8> kMagic = {0x8B, 'E', '8', 'K', 'V', '\r', '\n', 0x1A};

/// What a container holds. Ids are part of the format: never renumber.
enum class ContainerKind : uint16_t {
  kCompressedCache = 1,  ///< a CompressedKV (codes, gains, positions, residual window)
  kPlain = 2,            ///< plain fp16/bf16 tensors [tokens, heads, head_dim] (lossless baseline)
};

/// Streams inside a chunk, in id order (a compressed cache's chunk: 1..7, and from format version
/// 5 on 9..12 after them). Ids are part of the format: never renumber.
enum class StreamKind : uint8_t {
  kPositions = 1,     ///< int32 positions of the chunk's stored tokens, per position set
  kKeyCodes = 2,      ///< key codes of every head (block-code indices, or fp16 for the fp16 codec)
  kValueCodes = 3,
  kKeyGains = 4,      ///< fp16 gain per coded key (absent for the fp16 codec)
  kValueGains = 5,
  kWindowKeys = 6,    ///< residual window keys, fp16 bits
  kWindowValues = 7,
  kPlainValues = 8,   ///< plain container: fp16/bf16 elements
  kTierKeyCodes = 9,  ///< version 5: the code tier's key codes (block-code indices)
  kTierValueCodes = 10,
  kTierKeyGains = 11,  ///< version 5: fp16 gain per tier key (always fp16)
  kTierValueGains = 12,
};
inline constexpr int kStreamKindCount = 12;  ///< ids 1..12
const char* to_string(StreamKind s);

/// A reversible, size-preserving transform applied to one stream before zstd (docs/format.md §3).
/// A stream is a sequence of segments (one per head or position set) of rows (tokens) of
/// fixed-width little-endian elements; deltas run along rows within a segment. Ids: bit 0 = byte
/// planes, bits 1-2 = delta kind. (The transforms themselves are internal to the library.)
enum class Transform : uint8_t {
  kNone = 0,            ///< the bytes as stored in memory
  kShuffle = 1,         ///< byte planes: byte 0 of every element, then byte 1, ...
  kXorDelta = 2,        ///< each row XOR the previous row of its segment (first row kept)
  kXorDeltaShuffle = 3, ///< kXorDelta, then byte planes
  kSubDelta = 4,        ///< each row minus the previous row, modulo 2^(8·width)
  kSubDeltaShuffle = 5, ///< kSubDelta, then byte planes
};
inline constexpr int kTransformCount = 6;
const char* to_string(Transform t);
/// Throws e8kv::Error naming the accepted ids for an unknown id.
Transform transform_from_id(uint32_t id);

/// Transforms per class of stream. The defaults are the measured best on synthetic caches
/// (docs/format.md, "Transforms"); any choice decodes, since each stream records its own.
struct StreamTransforms {
  Transform positions = Transform::kSubDeltaShuffle;
  /// Block-code indices of keys. Unset: xor-delta when keys are coded post-RoPE or uncentred
  /// (their codes then repeat along tokens), none otherwise. Also the code tier's key codes,
  /// whose keys are always coded post-RoPE and uncentred (unset: xor-delta).
  std::optional<Transform> key_codes;
  Transform value_codes = Transform::kNone;  ///< block-code indices of values (both tiers)
  Transform gains = Transform::kShuffle;  ///< fp16 gains, both tiers (8-bit gain codes are stored untransformed)
  Transform fp16 = Transform::kShuffle;  ///< residual windows, fp16-codec codes, plain fp16/bf16
};

struct ContainerOptions {
  /// Stored tokens per chunk (per position set): 1 .. 2^20. Smaller chunks make partial reads
  /// finer and cost some ratio (each chunk compresses alone).
  int chunk_tokens = 256;
  /// zstd level: 1 .. 19, or 0 for zstd's default (3).
  int zstd_level = 3;
  StreamTransforms transforms;
  /// Try every transform for every stream of every chunk and keep the smallest (about 6× the
  /// compression time; the format is the same).
  bool adaptive = false;
  /// A zstd frame is kept only when it saves at least this fraction of the stream's bytes;
  /// otherwise the stream is stored. Lattice codes are nearly incompressible: a frame that saves
  /// under 1.6 % would halve the read speed for nothing. In [0, 1].
  double min_zstd_saving = 1.0 / 64;
  /// Throws e8kv::Error naming the field and the accepted values.
  void validate() const;
};

struct DeserializeOptions {
  /// Upper bound on the memory a read allocates for its result and the codecs it rebuilds,
  /// computed from the header before any allocation (inputs claiming more are rejected).
  uint64_t max_decoded_bytes = uint64_t{1} << 34;  // 16 GiB
  /// Verify the CRC-32C of the header and of every chunk read. Turning it off (trusted storage,
  /// or fuzzing the structural checks) keeps every other check.
  bool verify_checksums = true;
  /// Codecs to give the result when their layout equals the container's (e.g. those of the
  /// local compressor's caches): it saves rebuilding them, which costs milliseconds.
  /// KVCompressor::append accepts the cache either way (any cache of a layout it accepts,
  /// KVCompressor::layout_difference). A different layout raises e8kv::Error naming the first
  /// differing field. Null: fresh codecs are built from the header.
  std::shared_ptr<const CacheCodecs> codecs;
};

/// Empty when the layouts are equal field by field (floats compared bit for bit), otherwise
/// the name of the first differing field and both values.
std::string layout_difference(const CacheLayout& a, const CacheLayout& b);

/// What a container's header says (no chunk is read).
struct ContainerInfo {
  int format_version = 0;
  int library_version = 0;  ///< e8kv::kVersion of the writer
  ContainerKind kind = ContainerKind::kCompressedCache;
  uint64_t total_bytes = 0;
  int chunk_tokens = 0;
  int64_t n_chunks = 0;

  // kCompressedCache
  CacheLayout layout;
  struct Layer {
    int64_t original_tokens = 0;
    int64_t pinned = 0;                  ///< leading window tokens of every set kept in fp16 (sinks)
    std::vector<int64_t> coded_tokens;   ///< per position set (1, or n_kv_heads)
    std::vector<int64_t> tier_tokens;    ///< per position set: code-tier tokens (0 before version 5)
    std::vector<int64_t> window_tokens;  ///< per position set
    int64_t first_chunk = 0;             ///< index of its first chunk in the directory
    int64_t n_chunks = 0;
  };
  std::vector<Layer> layers;

  // kPlain
  DType dtype = DType::kF16;
  int64_t n_tensors = 0, tokens = 0, heads = 0, head_dim = 0;

  /// Bytes a full deserialize allocates for the result (what max_decoded_bytes is checked against).
  uint64_t decoded_bytes = 0;
};

// ---- compressed caches ---------------------------------------------------------------------

/// Exact size serialize() writes. Does the whole compression (use serialized_size_bound to size
/// a buffer cheaply, or the vector-returning serialize to do the work once).
size_t serialized_size(const CompressedKV& cache, const ContainerOptions& options = {});
/// An upper bound on serialized_size (no compression done): headers, directory and every stream's
/// raw bytes (the encoder keeps a zstd frame only when it is smaller than the stream). It depends
/// only on the layout and the stored token counts, not on the values.
size_t serialized_size_bound(const CompressedKV& cache, const ContainerOptions& options = {});
/// Writes the container into out[0, cap) and returns its size; throws e8kv::Error (naming the
/// needed size) when cap is too small.
size_t serialize(const CompressedKV& cache, const ContainerOptions& options, uint8_t* out, size_t cap);
/// Writes the container to a stream and returns its size; throws e8kv::Error when the stream fails.
size_t serialize(const CompressedKV& cache, const ContainerOptions& options, std::ostream& out);
std::vector<uint8_t> serialize(const CompressedKV& cache, const ContainerOptions& options = {});

/// Reads a whole compressed-cache container. The result owns fresh codecs rebuilt from the
/// header, so it attends and appends exactly like the cache that was written.
CompressedKV deserialize(const uint8_t* data, size_t size, const DeserializeOptions& options = {});
/// The header only.
ContainerInfo read_info(const uint8_t* data, size_t size, const DeserializeOptions& options = {});
/// One layer, equal to deserialize(...).layer(layer); only that layer's chunks are read.
CompressedKV::LayerData deserialize_layer(const uint8_t* data, size_t size, int layer,
                                          const DeserializeOptions& options = {});
/// Stored tokens [begin, end) of every position set of one layer (stored token i of a set is its
/// i-th coded token, then its code-tier tokens, then its window tokens; end is clamped to each
/// set's size). Only the chunks overlapping the range are read. original_tokens, pinned and the
/// centring means are the layer's (window token i of a set is a pinned sink when i < pinned,
/// counting from the window's start, not from the range's); tier_positions has one (possibly
/// empty) vector per set, as positions.
CompressedKV::LayerData deserialize_tokens(const uint8_t* data, size_t size, int layer, int64_t begin, int64_t end,
                                           const DeserializeOptions& options = {});

// ---- plain fp16 / bf16 caches (the lossless baseline) -------------------------------------------

/// n_tensors tensors of one shape [tokens, heads, head_dim], fp16 or bf16 bits, NHD contiguous
/// (e.g. the K and V of every layer).
struct PlainCache {
  DType dtype = DType::kF16;
  int64_t tokens = 0, heads = 0, head_dim = 0;
  std::vector<std::vector<uint16_t>> tensors;
};

/// Views must share dtype (kF16 or kBF16) and shape; any strides.
std::vector<uint8_t> serialize_plain(const std::vector<TensorView>& tensors, const ContainerOptions& options = {});
size_t serialize_plain(const std::vector<TensorView>& tensors, const ContainerOptions& options, uint8_t* out,
                       size_t cap);
size_t serialized_plain_size(const std::vector<TensorView>& tensors, const ContainerOptions& options = {});
PlainCache deserialize_plain(const uint8_t* data, size_t size, const DeserializeOptions& options = {});

// ---- files ---------------------------------------------------------------------------------------

void write_file(const std::string& path, const CompressedKV& cache, const ContainerOptions& options = {});
CompressedKV read_file(const std::string& path, const DeserializeOptions& options = {});
ContainerInfo read_file_info(const std::string& path, const DeserializeOptions& options = {});
/// Reads the header and that layer's chunks only.
CompressedKV::LayerData read_file_layer(const std::string& path, int layer, const DeserializeOptions& options = {});

}  // namespace e8kv::container
