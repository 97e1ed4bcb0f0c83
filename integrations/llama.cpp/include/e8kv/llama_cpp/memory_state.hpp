// The sequence state of e8kv's llama.cpp memory (`--kv-e8kv`; memory/e8kv_memory.cpp writes and
// reads it through llama.cpp's state I/O): what llama_state_seq_get_data returns after its 8-byte
// frame, and what a llama-server slot file holds after its token list. Little-endian:
//
//   u32 magic "E8KM" | u32 version (2; 1 is read) | u32 sequences
//   per sequence: i32 id | i32 pos_min | i32 pos_max | i32 layer groups (version 2) |
//                 u32 CRC-32C of those four i32 (version 2) |
//                 per group: u64 size | an e8kv container of that size (0: the group holds nothing)
//
// Each container carries its own header and chunk checksums (docs/format.md). The fleet tool
// (tools/fleet.hpp) moves these states as they are, and cuts them to a shorter prefix without
// decoding a code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/config.hpp"

namespace e8kv::llama_cpp {

inline constexpr uint32_t kMemoryStateMagic = 0x4d4b3845u;  // "E8KM"
inline constexpr uint32_t kMemoryStateVersion = 2;
/// A container larger than this is refused before it is read (a declared size is a claim).
inline constexpr uint64_t kMaxMemoryStateBlob = uint64_t(1) << 36;

struct MemorySequence {
  int32_t id = 0, pos_min = -1, pos_max = -1;
  std::vector<std::vector<uint8_t>> groups;  ///< per layer group: its container, or empty
};

struct MemoryState {
  uint32_t version = kMemoryStateVersion;
  std::vector<MemorySequence> sequences;
};

/// True when `data` starts with the memory state's magic.
bool is_memory_state(const uint8_t* data, size_t size);

/// Parses a whole memory state (every byte of [data, data + size)): the magic, the version, the
/// record checksums and the sizes. Containers are returned as bytes, not read (see
/// check_memory_state). Throws e8kv::Error naming what is wrong.
MemoryState parse_memory_state(const uint8_t* data, size_t size);

/// The state's bytes, version 2 (a version-1 state is written as version 2).
std::vector<uint8_t> write_memory_state(const MemoryState& state);

/// Reads every container of the state (each one's checksums, its layout, every field a later call
/// would check) and checks that each sequence's positions hold its containers' positions; `also`
/// (optional) is given each container read, once, for checks of its own (the fleet tool's layout
/// check). Throws e8kv::Error naming the sequence and group.
void check_memory_state(const MemoryState& state,
                        const std::function<void(size_t group, const CompressedKV& cache)>& also = {});

/// Empty when `cache` is what e8kv's memory started with --kv-e8kv `spec` makes for a layer group
/// of the cache's own shape, RoPE and softmax scale (a model's, which the fleet's fingerprint already names):
/// the codecs, window, gains, frame and every other field the spec decides; else what differs.
/// What the fleet tool checks a --kv-e8kv server's codes with, for any architecture the memory
/// runs, without llama.cpp's model mapping.
std::string spec_difference(const Config& spec, const CompressedKV& cache);

/// The state of one sequence cut to its positions below `end` (llama.cpp's seq_rm of the tail,
/// done on the bytes): each group's container read, cut with e8kv::keep_positions (codes untouched)
/// and written again; pos_max becomes end - 1. Refused (e8kv::Error) for a state of several
/// sequences, an `end` at or below pos_min, a state of several layer groups (a sliding-window
/// group cannot be cut without knowing its window: such states move only whole), or a cut the
/// cache refuses.
MemoryState cut_memory_state(const MemoryState& state, int32_t end);

}  // namespace e8kv::llama_cpp
