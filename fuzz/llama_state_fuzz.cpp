// libFuzzer target for the llama.cpp adapter's readers (scripts/fuzz.sh builds and runs it beside
// the container targets): llama.cpp sequence states (what a slot file or
// llama_state_seq_get_data holds: integrations/llama.cpp/include/e8kv/llama_cpp/seq_state.hpp)
// and e8kv's compressed llama.cpp states (state_codec.hpp), both untrusted bytes from disk or a
// network.
//
// The first input byte selects: bit 4 set, the state of e8kv's own llama.cpp memory (`E8KM`,
// memory_state.hpp: what `--kv-e8kv` writes into slot files and llama_state_seq_get_data) through
// parse_memory_state, which must write back byte for byte when it parses a version-2 state, then
// check_memory_state (every container read, positions against the records, spec_difference on
// each) and, bit 0 set, cut_memory_state to half its positions, whose result must parse and check
// again; bit 2 set, a compressed state through restore_seq_state and read_compressed_state_info
// (bit 3: verify the containers' checksums); else a sequence state through parse_seq_caches
// (bit 0: two KV caches, as an iSWA model writes; bit 1: cells with extensions), which must write
// back byte for byte when it parses. Every entry point must return or throw e8kv::Error: anything
// else (a crash, a sanitizer report, another exception type, an allocation past -malloc_limit_mb)
// is a bug.
//
// E8KV_FUZZ_WRITE_SEEDS=dir writes valid inputs of every kind (one and two caches, V rows and
// transposed, lossless and quantized presets; memory states of one and two sequences and groups)
// and exits.
#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "e8kv/container/container.hpp"
#include "e8kv/error.hpp"
#include "e8kv/llama_cpp/memory_state.hpp"
#include "e8kv/llama_cpp/state_codec.hpp"
#include "seed_corpus.hpp"
#include "synthetic_state.hpp"

namespace {

namespace lc = e8kv::llama_cpp;

// A small f16 state: `cells` cells from position `first`, Gaussian K (with a bias) and V.
lc::SeqState make_state(int layers, int heads, int dim, int cells, int first, bool v_trans, uint32_t seed) {
  lc::synthetic::Gaussian g(seed);
  return lc::synthetic::make_f16_state(layers, heads, dim, lc::synthetic::positions(first, static_cast<size_t>(cells)),
                                       v_trans, 1.5f, g);
}

e8kv::Config config(const std::string& spec, double theta) {
  e8kv::Config c = e8kv::Config::parse(spec);
  c.rope.layout = e8kv::transform::RopeLayout::kSplitHalf;
  c.rope.head_dim = 64;
  c.rope.theta = theta;
  return c;
}

void write_seed(const std::string& dir, const std::string& name, uint8_t mode, const std::vector<uint8_t>& body) {
  std::ofstream f(dir + "/" + name, std::ios::binary);
  f.put(static_cast<char>(mode));
  f.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size()));
  if (!f) throw e8kv::Error("cannot write seed " + name);
}

void write_seeds_if_asked() {
  const char* dir = std::getenv("E8KV_FUZZ_WRITE_SEEDS");
  if (dir == nullptr || *dir == '\0') return;
  try {
    int n = 0;
    const e8kv::ModelShape full{2, 1, 2, 64}, swa{1, 1, 2, 64};
    for (bool v_trans : {false, true}) {
      const std::string t = v_trans ? "-vtrans" : "-vrows";
      const auto one = lc::write_seq_caches({make_state(2, 1, 64, 24, 0, v_trans, 1)});
      const auto two = lc::write_seq_caches({make_state(2, 1, 64, 24, 0, v_trans, 2), make_state(1, 1, 64, 9, 15, v_trans, 3)});
      write_seed(dir, "state-one" + t, 0, one);
      write_seed(dir, "state-two" + t, 1, two);
      n += 2;
      for (const char* spec : {"preset=lossless", "preset=quant-k3v2"}) {
        const e8kv::KVCompressor cf(full, config(spec, 1e6)), cs(swa, config(spec, 1e4));
        const std::string s = std::string(spec).substr(7) + t;
        write_seed(dir, "packed-one-" + s, 4 | 8, lc::compress_seq_state(one.data(), one.size(), cf));
        write_seed(dir, "packed-two-" + s, 4 | 8, lc::compress_seq_state(two.data(), two.size(), {&cf, &cs}));
        n += 2;
      }
    }
    // Memory states: one sequence of one group (cut-able), one of two groups, two sequences.
    for (const char* spec : {"preset=quant-k3v2", "preset=lossless"}) {
      const e8kv::Config cfg = e8kv::Config::parse(spec);
      const auto a = e8kv::container::serialize(e8kv::fuzz::make_seed_cache(40, 64, 11, cfg, 6));
      const auto b = e8kv::container::serialize(e8kv::fuzz::make_seed_cache(24, 64, 12, cfg, 3));
      lc::MemoryState one, groups, seqs;
      one.sequences.push_back({0, 0, 39, {a}});
      groups.sequences.push_back({0, 0, 39, {a, {}}});
      seqs.sequences.push_back({0, 0, 39, {a}});
      seqs.sequences.push_back({3, 0, 23, {b}});
      const std::string s = std::string(spec).substr(7);
      write_seed(dir, "memory-one-" + s, 16 | 1, lc::write_memory_state(one));
      write_seed(dir, "memory-groups-" + s, 16, lc::write_memory_state(groups));
      write_seed(dir, "memory-seqs-" + s, 16, lc::write_memory_state(seqs));
      n += 3;
    }
    std::printf("[fuzz] wrote %d llama.cpp state seeds to %s\n", n, dir);
    std::exit(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[fuzz] writing seeds failed: %s\n", e.what());
    std::exit(1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  write_seeds_if_asked();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  try {
    if (mode & 16) {
      const lc::MemoryState state = lc::parse_memory_state(p, n);
      if (state.version == lc::kMemoryStateVersion) {
        const std::vector<uint8_t> again = lc::write_memory_state(state);
        if (again.size() != n || std::memcmp(again.data(), p, n) != 0) std::abort();
      }
      const e8kv::Config spec = e8kv::Config::parse("preset=quant-k3v2");
      lc::check_memory_state(state, [&](size_t, const e8kv::CompressedKV& cache) { (void)lc::spec_difference(spec, cache); });
      if ((mode & 1) && state.sequences.size() == 1) {
        const lc::MemorySequence& s = state.sequences[0];
        // In 64 bits: a hostile record's positions may lie anywhere in int32's range.
        const int64_t mid = (int64_t{s.pos_min} + int64_t{s.pos_max}) / 2 + 1;
        const int32_t end = static_cast<int32_t>(std::min<int64_t>(mid, INT32_MAX));
        const lc::MemoryState cut = lc::cut_memory_state(state, end);
        // A cut that succeeded must be a state the memory reads back: a throw here is a bug.
        try {
          const std::vector<uint8_t> bytes = lc::write_memory_state(cut);
          lc::check_memory_state(lc::parse_memory_state(bytes.data(), bytes.size()));
        } catch (const e8kv::Error& e) {
          std::fprintf(stderr, "a cut memory state does not read back: %s\n", e.what());
          std::abort();
        }
      }
    } else if (mode & 4) {
      e8kv::container::DeserializeOptions o;
      o.verify_checksums = (mode & 8) != 0;
      // Below -malloc_limit_mb: a read within this budget is legitimate, one past it is a bug.
      o.max_decoded_bytes = uint64_t{256} << 20;
      const std::vector<uint8_t> state = lc::restore_seq_state(p, n, o);
      const lc::CompressedStateInfo info = lc::read_compressed_state_info(p, n);
      if (info.caches.empty() || state.size() < info.prefix_bytes) std::abort();
    } else {
      lc::SeqStateOptions o;
      o.cell_ext = (mode & 2) != 0;
      const std::vector<lc::SeqState> caches = lc::parse_seq_caches(p, n, (mode & 1) ? 2 : 1, o);
      const std::vector<uint8_t> again = lc::write_seq_caches(caches, o);
      if (again.size() != n || (n != 0 && std::memcmp(again.data(), p, n) != 0)) std::abort();
    }
  } catch (const e8kv::Error&) {
    // refused with a message: what untrusted bytes should get
  }
  return 0;
}
