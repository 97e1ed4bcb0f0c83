// A llama-server fleet sharing slots through a store (e8kv::store): push publishes a saved slot
// file, compressed by e8kv, under the keys of its token prefixes; pull finds the longest stored
// prefix of a prompt and gives back a slot file of exactly those tokens for /slots?action=restore.
//
// Keys: the model's fingerprint (the GGUF's tensor names, shapes and types, and each KV cache's
// shape and e8kv Config) and the prompt's tokens in chunks of chunk_tokens (store/prefix.hpp).
// push stores the cache of the longest whole-chunk prefix of the slot once (data), and a small
// reference under every shorter prefix key; pull then needs one EXISTS batch and one or two GETs.
// A stored value is trusted only after every check: the envelope's CRC-32C and key, the e8kv
// compressed state's own checksums (a full restore), its token list against the prompt; one that
// fails is logged and is a miss.
//
// Two kinds of slot files, kept apart: a server with llama.cpp's own cache (f16) saves cells,
// which push compresses and pull decodes back to cells; a server with e8kv's memory (--kv-e8kv)
// saves e8kv codes (memory_state.hpp), which push stores as they are and pull hands back as they
// are (a shorter prefix is cut from the codes, nothing decoded or re-encoded). The kind and the
// spec are part of the fingerprint, so the two kinds never see each other's entries; a slot of the
// other kind given to push is refused, naming the flag it needs.
//
// Models with two KV caches (interleaved sliding-window attention: Gemma 3) cannot be cut to a
// shorter prefix (the sliding-window cache's cells depend on the sequence's end): their slots are
// published only under their full length, when it is a whole number of chunks, without references.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "e8kv/compressor.hpp"
#include "e8kv/store/prefix.hpp"
#include "e8kv/store/store.hpp"

namespace e8kv::llama_cpp::fleet {

/// A slot file's parts (llama-server --slot-save-path, llama_state_seq_save_file).
struct SlotFile {
  std::vector<int32_t> tokens;
  size_t state_offset = 0;  ///< where the sequence state starts
};
SlotFile parse_slot_file(const uint8_t* file, size_t size);

/// The slot file of the first n_tokens tokens: the token list cut, and the cells at positions
/// >= n_tokens dropped from the (single) KV cache's state. Throws e8kv::Error when the state does
/// not hold exactly positions 0..n_tokens-1 below n_tokens (a context shift, an edited sequence),
/// or has several caches.
std::vector<uint8_t> truncate_slot_file(const uint8_t* file, size_t size, size_t n_tokens);

/// What names the e8kv side of the fingerprint: each cache's shape and Config (describe()).
std::string layout_string(const std::vector<const KVCompressor*>& caches);
/// The same for slots of e8kv's memory: the kind and the spec's Config (describe()).
std::string memory_layout_string(const Config& spec);

/// True when the slot file's state is e8kv memory codes (a --kv-e8kv server's), false when it is
/// llama.cpp's own cache cells. Throws e8kv::Error for a file that is not a slot file.
bool slot_holds_memory_codes(const uint8_t* file, size_t size);

struct FleetModel {
  std::vector<const KVCompressor*> caches;  ///< one per KV cache, llama.cpp's order
  store::Digest fingerprint{};              ///< model_fingerprint(GGUF tensors, layout_string(caches))
  size_t chunk_tokens = 256;
  Executor* executor = nullptr;             ///< compresses and restores the layers in parallel (null: inline)
  /// The slots are e8kv memory codes of servers started with --kv-e8kv `memory_spec` (fingerprint
  /// from memory_layout_string; `caches` unused), not llama.cpp cells.
  bool memory_codes = false;
  Config memory_spec;
};

struct PushResult {
  size_t file_tokens = 0;       ///< tokens in the slot file
  size_t published_tokens = 0;  ///< the prefix published (whole chunks; 0: nothing)
  size_t slot_bytes = 0;        ///< the (cut) slot file's size
  size_t value_bytes = 0;       ///< the value stored (envelope excluded): compressed cells, or the codes' slot file
  store::PublishResult stored;
  std::string note;             ///< why nothing or less was published, if so
};
PushResult push_slot(store::Store& s, const FleetModel& model, const uint8_t* file, size_t size,
                     std::chrono::milliseconds ttl);

struct PullResult {
  size_t n_tokens = 0;             ///< tokens restored (0: miss)
  std::vector<uint8_t> slot_file;  ///< a slot file of the prompt's first n_tokens tokens
  size_t value_bytes = 0;          ///< bytes fetched for the data
  size_t round_trips = 0;
};
PullResult pull_slot(store::Store& s, const FleetModel& model, const std::vector<int32_t>& prompt,
                     const store::MissLog& log = store::log_to_stderr);

}  // namespace e8kv::llama_cpp::fleet

namespace e8kv::llama_cpp::fleet {
/// e8kv-llama-state push|pull (argv[1] is the command); returns the exit code (0 done / hit,
/// 3 pull miss, 2 usage); throws e8kv::Error on failures (store down: named, after its timeout).
int run_cli(int argc, char** argv);
}  // namespace e8kv::llama_cpp::fleet
