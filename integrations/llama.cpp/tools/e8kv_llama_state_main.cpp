// e8kv-llama-state: compresses a llama.cpp slot file (llama-server --slot-save-path, or
// llama_state_seq_save_file) or raw sequence-state bytes (llama_state_seq_get_data) into an e8kv
// compressed state, and restores it to the same kind of file for llama.cpp to load.
//
//   e8kv-llama-state compress --model M.gguf [--config SPEC] [--partial] IN OUT
//   e8kv-llama-state extend   --model M.gguf [--config SPEC] [--partial] PACKED LATER_IN OUT
//   e8kv-llama-state restore  IN OUT
//   e8kv-llama-state info     IN
//   e8kv-llama-state push|pull ...   (with e8kv::store: slots shared through Redis, tools/fleet_main.cpp)
//
// SPEC is a Config spec string (default "preset=quant-k3v2"; "preset=lossless" restores an f16
// state byte for byte). The model (llama or gemma3 architecture) gives each KV cache's layers,
// shape and RoPE, which a state does not carry; an iSWA model's two caches are coded apart.
// --partial: the state was saved with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (llama_state_seq_get_data_ext),
// which holds an iSWA model's sliding-window cache alone (the whole cache of other models).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/llama_cpp/state_codec.hpp"
#include "model_kv.hpp"
#ifdef E8KV_HAS_STORE
#include "fleet.hpp"
#endif

namespace {

using e8kv::llama_cpp::kSeqFileMagic;

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw e8kv::Error("cannot open " + path);
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw e8kv::Error("cannot read " + path);
  return b;
}

void write_all(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  f.close();
  if (!f) throw e8kv::Error("cannot write " + path);
}

bool is_seq_file(const std::vector<uint8_t>& b) {
  uint32_t magic = 0;
  if (b.size() >= 4) std::memcpy(&magic, b.data(), 4);
  return magic == kSeqFileMagic;
}

int usage() {
  std::fprintf(stderr,
               "usage: e8kv-llama-state compress --model M.gguf [--config SPEC] [--partial] IN OUT\n"
               "       e8kv-llama-state extend   --model M.gguf [--config SPEC] [--partial] PACKED LATER_IN OUT\n"
               "       e8kv-llama-state restore  IN OUT\n"
               "       e8kv-llama-state info     IN\n"
#ifdef E8KV_HAS_STORE
               "       e8kv-llama-state push|pull ...   (run without arguments after push or pull for theirs)\n"
#endif
               "IN: a llama.cpp slot/sequence file ('ggsq', as llama-server --slot-save-path writes) or the raw\n"
               "bytes of llama_state_seq_get_data. SPEC: an e8kv Config spec (default preset=quant-k3v2).\n"
               "--partial: saved with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (an iSWA model's sliding-window cache).\n");
  return 2;
}

void print_info(const std::vector<uint8_t>& packed) {
  const auto info = e8kv::llama_cpp::read_compressed_state_info(packed.data(), packed.size());
  std::printf("e8kv compressed llama.cpp state: %zu bytes (containers %zu, prefix %zu), %zu KV cache(s)\n",
              packed.size(), info.container_bytes, info.prefix_bytes, info.caches.size());
  for (size_t c = 0; c < info.caches.size(); ++c) {
    const auto& ci = info.caches[c];
    std::printf("  cache %zu: cells %u (sequence %d, stream %u of %u), V %s, layers %zu, K/V types %s/%s\n", c,
                ci.cells, ci.seq_id, ci.stream, ci.n_stream, ci.v_trans ? "transposed" : "rows", ci.k_types.size(),
                e8kv::llama_cpp::ggml_type_name(ci.k_types.at(0)).c_str(),
                e8kv::llama_cpp::ggml_type_name(ci.v_types.at(0)).c_str());
    std::printf("    container %zu bytes: %d layers x %d KV heads x %d, format %d\n", ci.container_bytes,
                ci.container.layout.n_layers, ci.container.layout.n_kv_heads, ci.container.layout.head_dim,
                ci.container.format_version);
  }
}

int run(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
#ifdef E8KV_HAS_STORE
  if (cmd == "push" || cmd == "pull") return e8kv::llama_cpp::fleet::run_cli(argc, argv);
#endif
  std::string model, spec = "preset=quant-k3v2";
  bool partial = false;
  std::vector<std::string> files;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) model = argv[++i];
    else if (a == "--config" && i + 1 < argc) spec = argv[++i];
    else if (a == "--partial") partial = true;
    else if (!a.empty() && a[0] == '-') return usage();
    else files.push_back(a);
  }
  if (cmd == "compress" || cmd == "extend") {
    const size_t want = cmd == "compress" ? 2 : 3;
    if (model.empty() || files.size() != want) return usage();
    const auto m = e8kv::llama_cpp::read_model_kv(model);
    const std::vector<e8kv::KVCompressor> compressors = e8kv::llama_cpp::model_compressors(spec, m);
    std::vector<const e8kv::KVCompressor*> compressor = e8kv::llama_cpp::pointers(compressors);
    if (partial) compressor.erase(compressor.begin(), compressor.end() - 1);  // the last cache alone
    std::vector<uint8_t> out;
    const std::vector<uint8_t> in = read_all(files[want - 2]);
    size_t state_bytes = in.size();
    if (cmd == "compress") {
      if (is_seq_file(in)) {
        out = e8kv::llama_cpp::compress_slot_file(in.data(), in.size(), compressor);
        state_bytes -= e8kv::llama_cpp::seq_file_state_offset(in.data(), in.size());
      } else {
        out = e8kv::llama_cpp::compress_seq_state(in.data(), in.size(), compressor);
      }
    } else {
      const std::vector<uint8_t> packed = read_all(files[0]);
      size_t off = 0;
      if (is_seq_file(in)) {
        off = e8kv::llama_cpp::seq_file_state_offset(in.data(), in.size());
        state_bytes -= off;
      }
      out = e8kv::llama_cpp::extend_compressed_state(packed.data(), packed.size(), in.data() + off, in.size() - off,
                                                     compressor);
    }
    write_all(files.back(), out);
    std::printf("%s: %zu bytes (%zu of them the KV state) -> %zu bytes, %.2fx smaller (every byte counted), %s\n",
                files.back().c_str(), in.size(), state_bytes, out.size(), static_cast<double>(in.size()) / out.size(),
                spec.c_str());
    return 0;
  }
  if (cmd == "restore") {
    if (files.size() != 2) return usage();
    const std::vector<uint8_t> packed = read_all(files[0]);
    const std::vector<uint8_t> out = e8kv::llama_cpp::restore_seq_state(packed.data(), packed.size());
    write_all(files[1], out);
    std::printf("%s: %zu bytes restored from %zu\n", files[1].c_str(), out.size(), packed.size());
    return 0;
  }
  if (cmd == "info") {
    if (files.size() != 1) return usage();
    print_info(read_all(files[0]));
    return 0;
  }
  return usage();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "e8kv-llama-state: %s\n", e.what());
    return 1;
  }
}
