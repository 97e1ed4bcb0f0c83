// e8kv-llama-state push | pull: the command line of fleet.hpp.
//
//   e8kv-llama-state push --model M.gguf --store ADDR [--config SPEC | --kv-e8kv SPEC] [--chunk N] [--ttl S] SLOT_FILE
//   (both: [--threads N] compress / restore the layers on N threads, default: every core;
//    [--timeout-ms MS] the store's connect and command timeouts, default 2000)
//   e8kv-llama-state pull --model M.gguf --store ADDR [--config SPEC | --kv-e8kv SPEC] [--chunk N]
//                         (--tokens 1,2,3 | --tokens-file F) OUT_SLOT_FILE
//
// --config SPEC: servers with llama.cpp's own cache (f16): push compresses their slots with SPEC,
// pull decodes back to cells. --kv-e8kv SPEC: servers started with --kv-e8kv SPEC: their slots
// hold e8kv codes, stored and handed back as they are (fleet.hpp).
//
// ADDR: redis://[[user]:password@]host[:port][/db] or unix:///path/redis.sock[?db=N]; the password
// can come from E8KV_STORE_PASSWORD (and E8KV_STORE_USER) instead. pull writes OUT only on a hit and prints
// "restored N tokens"; exit 0 on a hit, 3 on a miss, 1 on an error (store down, bad input).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/parallel.hpp"
#include "e8kv/llama/gguf.hpp"
#include "fleet.hpp"
#include "model_kv.hpp"

namespace e8kv::llama_cpp::fleet {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Every run of digits in `text` is a token id (a comma or space separated list, a JSON array, or
// llama-server's /tokenize answer {"tokens":[...]}).
std::vector<int32_t> parse_tokens(const std::string& text) {
  std::vector<int32_t> t;
  long long v = -1;
  for (char c : text + " ") {
    if (c >= '0' && c <= '9') {
      v = (v < 0 ? 0 : v) * 10 + (c - '0');
      if (v > 0x7fffffff) throw Error("token id out of range in the token list");
    } else if (v >= 0) {
      t.push_back(static_cast<int32_t>(v));
      v = -1;
    }
  }
  return t;
}

int usage() {
  std::fprintf(stderr,
               "usage: e8kv-llama-state push --model M.gguf --store ADDR [--config SPEC | --kv-e8kv SPEC] [--chunk N] [--ttl SECONDS]\n"
               "                             SLOT_FILE\n"
               "       e8kv-llama-state pull --model M.gguf --store ADDR [--config SPEC | --kv-e8kv SPEC] [--chunk N]\n"
               "                             (--tokens 1,2,3 | --tokens-file F) OUT_SLOT_FILE\n"
               "ADDR: redis://[[user]:password@]host[:port][/db] or unix:///path/to/redis.sock[?db=N]; a password\n"
               "can come from E8KV_STORE_PASSWORD (and E8KV_STORE_USER) instead. --chunk: tokens per key chunk (default 256;\n"
               "every server of the fleet must use the same --chunk and --config). pull exits 0 on a hit, 3 on a miss.\n"
               "--config SPEC: servers with llama.cpp's own cache, their slots compressed with SPEC (default\n"
               "preset=quant-k3v2); --kv-e8kv SPEC: servers started with --kv-e8kv SPEC, their codes moved as they are.\n"
               "--threads N: compress / restore on N threads (default: every core); --timeout-ms MS (default 2000).\n");
  return 2;
}

}  // namespace

int run_cli(int argc, char** argv) {
  const std::string cmd = argv[1];
  std::string model_path, address, spec = "preset=quant-k3v2", tokens_arg, tokens_file, memory_spec;
  size_t chunk = 256;
  long long ttl_s = 0, timeout_ms = 2000;
  long long threads = static_cast<long long>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::string> files;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--model" && has) model_path = argv[++i];
    else if (a == "--store" && has) address = argv[++i];
    else if (a == "--config" && has) spec = argv[++i];
    else if (a == "--kv-e8kv" && has) memory_spec = argv[++i];
    else if (a == "--chunk" && has) chunk = std::stoul(argv[++i]);
    else if (a == "--ttl" && has) ttl_s = std::stoll(argv[++i]);
    else if (a == "--timeout-ms" && has) timeout_ms = std::stoll(argv[++i]);
    else if (a == "--threads" && has) threads = std::stoll(argv[++i]);
    else if (a == "--tokens" && has) tokens_arg = argv[++i];
    else if (a == "--tokens-file" && has) tokens_file = argv[++i];
    else if (!a.empty() && a[0] == '-') return usage();
    else files.push_back(a);
  }
  if (model_path.empty() || address.empty() || files.size() != 1) return usage();
  if (ttl_s < 0 || timeout_ms <= 0 || threads < 1 || threads > 1024) return usage();
  const bool memory_codes = !memory_spec.empty();
  if (memory_codes) {
    for (int i = 2; i < argc; ++i)
      if (std::string(argv[i]) == "--config") {
        std::fprintf(stderr, "e8kv-llama-state: --config and --kv-e8kv are two kinds of fleet; give one\n");
        return usage();
      }
    spec = memory_spec;
  }

  auto t0 = Clock::now();
  ModelKv m;
  std::vector<store::TensorRecord> tensors;
  {  // the GGUF's header read once, for the caches' shapes and the fingerprint; a --kv-e8kv fleet
     // needs no shapes (its codes carry theirs), so any architecture the memory runs is served
    const llama::GgufFile g = llama::GgufFile::open_header(model_path);
    if (!memory_codes) m = read_model_kv(model_path, g);
    for (const auto& t : g.tensors()) tensors.push_back({t.name, t.dims, t.type});
  }
  const std::vector<KVCompressor> compressors = memory_codes ? std::vector<KVCompressor>() : model_compressors(spec, m);
  FleetModel fm;
  if (memory_codes) fm.memory_spec = Config::parse(spec);
  fm.caches = pointers(compressors);
  fm.chunk_tokens = chunk;
  ThreadPool pool(static_cast<int>(threads));
  fm.executor = &pool;
  fm.memory_codes = memory_codes;
  fm.fingerprint = store::model_fingerprint(
      tensors, memory_codes ? memory_layout_string(fm.memory_spec) : layout_string(fm.caches));
  const double model_ms = ms_since(t0);
  store::StoreOptions so;
  so.command_timeout = std::chrono::milliseconds(timeout_ms);
  so.connect_timeout = std::chrono::milliseconds(timeout_ms);
  store::credentials_from_environment(so);  // E8KV_STORE_USER / E8KV_STORE_PASSWORD

  if (cmd == "push") {
    const std::vector<uint8_t> slot = read_file(files[0]);
    t0 = Clock::now();
    auto s = store::open_store(address, so);
    const PushResult r = push_slot(*s, fm, slot.data(), slot.size(), std::chrono::seconds(ttl_s));
    const double push_ms = ms_since(t0);
    if (r.published_tokens == 0) {
      std::printf("push: nothing published: %s\n", r.note.c_str());
      return 0;
    }
    std::printf("push: %zu of %zu tokens published (%zu chunks of %zu), slot %zu bytes -> value %zu bytes (%.2fx), "
                "new data %zu, new references %zu; model %.0f ms, compress+store %.1f ms\n",
                r.published_tokens, r.file_tokens, r.published_tokens / chunk, chunk, r.slot_bytes, r.value_bytes,
                static_cast<double>(r.slot_bytes) / r.value_bytes, r.stored.data_stored, r.stored.references_stored,
                model_ms, push_ms);
    return 0;
  }
  if (cmd == "pull") {
    if (tokens_arg.empty() == tokens_file.empty()) return usage();
    const std::string text = tokens_file.empty() ? tokens_arg : [&] {
      const auto b = read_file(tokens_file);
      return std::string(b.begin(), b.end());
    }();
    const std::vector<int32_t> prompt = parse_tokens(text);
    t0 = Clock::now();
    auto s = store::open_store(address, so);
    const PullResult r = pull_slot(*s, fm, prompt);
    const double pull_ms = ms_since(t0);
    if (r.n_tokens == 0) {
      std::printf("pull: miss (prompt %zu tokens, %zu round trips, %.1f ms)\n", prompt.size(), r.round_trips, pull_ms);
      return 3;
    }
    std::ofstream f(files[0], std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(r.slot_file.data()), static_cast<std::streamsize>(r.slot_file.size()));
    f.close();
    if (!f) throw Error("cannot write " + files[0]);
    std::printf("pull: restored %zu tokens of a %zu-token prompt: value %zu bytes -> slot %zu bytes, %zu round trips, "
                "fetch+restore %.1f ms (model %.0f ms)\n",
                r.n_tokens, prompt.size(), r.value_bytes, r.slot_file.size(), r.round_trips, pull_ms, model_ms);
    return 0;
  }
  return usage();
}

}  // namespace e8kv::llama_cpp::fleet
