// Seeds for the container fuzzers: valid containers of every format version and preset, made at
// run time (scripts/fuzz.sh asks a fuzzer binary for them) so that no binary corpus is committed.
#pragma once

#include <cstdint>
#include <string>

#include "e8kv/cache/compressed_kv.hpp"
#include "e8kv/config.hpp"

namespace e8kv::fuzz {

/// A small synthetic cache (2 layers, 2 KV heads, 4 query heads): `tokens` tokens, the last
/// `appended` of them appended one by one after compressing the others with `cfg`.
CompressedKV make_seed_cache(int tokens, int head_dim, uint64_t seed, const Config& cfg, int appended);

/// Writes the seeds into `dir` (which exists), each prefixed by an options byte as the fuzz
/// targets read it; returns how many it wrote. Throws e8kv::Error when a file cannot be written.
int write_seed_corpus(const std::string& dir);

/// When the environment variable E8KV_FUZZ_WRITE_SEEDS names a directory, writes the seeds there
/// and exits (status 0); called from LLVMFuzzerInitialize of every target.
void write_seeds_if_asked();

}  // namespace e8kv::fuzz
