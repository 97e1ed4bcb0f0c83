// e8kv-fleet-bench: what a llama-server fleet stores and moves per token, how long push and pull
// take against a store, and a bounded concurrent load with every value verified.
//
//   e8kv-fleet-bench sizes --model M.gguf (--slot FILE | --synthetic N) [--presets "a;b,key=v;..."]
//       bytes per token of the raw slot, zstd -3 of it, and each preset's e8kv value
//   e8kv-fleet-bench latency --model M.gguf (--slot FILE | --synthetic N) --store ADDR [--preset P] [--reps R]
//       push (compress + publish) and pull (lookup + fetch + restore) times, and the store part alone
//   e8kv-fleet-bench load --model M.gguf --store ADDR [--clients N] [--seconds S] [--docs D] [--synthetic N]
//       N clients push and pull D documents for S seconds; every hit is compared with the document
//       pushed under its tokens (byte for byte after restore); store errors are counted, never fatal
//       (restart or kill redis-server meanwhile: bench/store_load.sh does). Exit 1 on any wrong value.
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "e8kv/error.hpp"
#include "e8kv/llama/gguf.hpp"
#include "e8kv/llama_cpp/seq_state.hpp"
#include "e8kv/llama_cpp/state_codec.hpp"
#include "fleet.hpp"
#include "model_kv.hpp"
#include "synthetic_state.hpp"

namespace {

using namespace e8kv;
using namespace e8kv::llama_cpp;
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct Args {
  std::string model, slot, store, presets = "quant-k3v2;tier-k3v2,scorer=key-key;quant-k4v4", preset = "quant-k3v2";
  size_t synthetic = 0, chunk = 256, reps = 9, clients = 4, docs = 6;
  double seconds = 20;
};

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A slot file of the model's single cache shape: n tokens (ids from `seed`), f16 K rows with a
// per-channel bias and V rows, Gaussian (synthetic: compresses like noise, not like a real cache).
std::vector<uint8_t> synthetic_slot(const ModelKv& m, size_t n, uint32_t seed) {
  if (m.caches.size() != 1) throw Error("--synthetic: models with one KV cache only");
  const ModelShape& s = m.caches[0].shape;
  synthetic::Gaussian g(seed);
  std::vector<float> bias(static_cast<size_t>(s.n_kv_heads * s.head_dim));
  for (auto& b : bias) b = 2.f * g();
  const SeqState st =
      synthetic::make_f16_state(s.n_layers, s.n_kv_heads, s.head_dim, synthetic::positions(0, n), false, bias, g);
  std::vector<int32_t> tokens(n);
  std::mt19937 trng(seed * 7919u + 1);
  for (auto& t : tokens) t = static_cast<int32_t>(trng() % 49000);
  return synthetic::slot_file(tokens, write_seq_state(st));
}

struct Model {
  ModelKv kv;
  std::vector<store::TensorRecord> tensors;
};
Model load_model(const std::string& path) {
  Model m;
  const llama::GgufFile g = llama::GgufFile::open_header(path);
  m.kv = read_model_kv(path, g);
  for (const auto& t : g.tensors()) m.tensors.push_back({t.name, t.dims, t.type});
  return m;
}
fleet::FleetModel fleet_model(const Model& m, const std::vector<KVCompressor>& c, size_t chunk) {
  fleet::FleetModel fm;
  fm.caches = pointers(c);
  fm.fingerprint = store::model_fingerprint(m.tensors, fleet::layout_string(fm.caches));
  fm.chunk_tokens = chunk;
  return fm;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ';');) if (!x.empty()) out.push_back(x);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int sizes(const Args& a, const Model& m, const std::vector<uint8_t>& slot) {
  const auto sf = fleet::parse_slot_file(slot.data(), slot.size());
  const double n = static_cast<double>(sf.tokens.size());
  std::vector<uint8_t> z(ZSTD_compressBound(slot.size()));
  auto t0 = Clock::now();
  const size_t zn = ZSTD_compress(z.data(), z.size(), slot.data(), slot.size(), 3);
  const double zms = ms_since(t0);
  if (ZSTD_isError(zn)) throw Error("zstd failed");
  std::printf("| stored as | bytes | bytes/token | vs raw | encode ms |\n|---|---:|---:|---:|---:|\n");
  std::printf("| raw slot file (f16) | %zu | %.0f | 1.00x | - |\n", slot.size(), slot.size() / n);
  std::printf("| zstd -3 of the slot file | %zu | %.0f | %.2fx | %.0f |\n", zn, zn / n,
              static_cast<double>(slot.size()) / zn, zms);
  for (const std::string& p : split(a.presets)) {
    const auto c = model_compressors("preset=" + p, m.kv);
    t0 = Clock::now();
    const auto packed = compress_slot_file(slot.data(), slot.size(), pointers(c));
    const double ms = ms_since(t0);
    std::printf("| e8kv %s value | %zu | %.0f | %.2fx | %.0f |\n", p.c_str(), packed.size(), packed.size() / n,
                static_cast<double>(slot.size()) / packed.size(), ms);
  }
  std::printf("(%zu tokens; e8kv values are the compressed state with the slot's token list; the store adds a "
              "~%zu-byte envelope (with the key), and a ~%zu-byte reference per shorter 256-token prefix)\n",
              sf.tokens.size(), size_t{114}, size_t{188});
  return 0;
}

int latency(const Args& a, const Model& m, const std::vector<uint8_t>& slot) {
  const auto c = model_compressors("preset=" + a.preset, m.kv);
  fleet::FleetModel fm = fleet_model(m, c, a.chunk);
  const auto sf = fleet::parse_slot_file(slot.data(), slot.size());
  std::vector<double> push_ms, pull_ms, put_ms, get_ms;
  size_t value = 0;
  for (size_t r = 0; r < a.reps; ++r) {
    store::StoreOptions so;
    auto s = store::open_store(a.store, store::credentials_from_environment(so));
    // Unique keys per repetition: another fingerprint (salted layout) so nothing is already there.
    fm.fingerprint = store::model_fingerprint(m.tensors, fleet::layout_string(fm.caches) + std::to_string(r) +
                                                             std::to_string(Clock::now().time_since_epoch().count()));
    auto t0 = Clock::now();
    const auto p = fleet::push_slot(*s, fm, slot.data(), slot.size(), std::chrono::minutes(10));
    push_ms.push_back(ms_since(t0));
    value = p.value_bytes;
    t0 = Clock::now();
    const auto q = fleet::pull_slot(*s, fm, sf.tokens);
    pull_ms.push_back(ms_since(t0));
    if (q.n_tokens != p.published_tokens) throw Error("latency: pull restored " + std::to_string(q.n_tokens));
    // The store part alone: one value of the same size, put and fetched.
    std::vector<uint8_t> bytes(value, static_cast<uint8_t>(r));
    const std::string k = "bench:" + std::to_string(Clock::now().time_since_epoch().count());
    t0 = Clock::now();
    s->put_if_absent(k, bytes, std::chrono::minutes(1));
    put_ms.push_back(ms_since(t0));
    t0 = Clock::now();
    (void)s->get(k);
    get_ms.push_back(ms_since(t0));
    s->remove(k);
  }
  std::printf("| %s | %s | %zu | %zu | %.1f | %.1f | %.2f | %.2f |\n", a.store.substr(0, a.store.find(':')).c_str(),
              a.preset.c_str(), sf.tokens.size(), value, median(push_ms), median(pull_ms), median(put_ms),
              median(get_ms));
  return 0;
}

// Documents: each a token list (distinct first chunk) and its slot file, pushed by any client.
int load(const Args& a, const Model& m) {
  const auto c = model_compressors("preset=" + a.preset, m.kv);
  const fleet::FleetModel fm = fleet_model(m, c, a.chunk);
  const size_t n = a.synthetic ? a.synthetic : 2 * a.chunk;
  std::vector<std::vector<uint8_t>> slots, expected;
  std::vector<std::vector<int32_t>> tokens;
  for (size_t d = 0; d < a.docs; ++d) {
    slots.push_back(synthetic_slot(m.kv, n, static_cast<uint32_t>(1000 + d)));
    tokens.push_back(fleet::parse_slot_file(slots.back().data(), slots.back().size()).tokens);
    // What a pull must give back: the slot after the codec (lossy presets decode deterministically).
    const auto packed = compress_slot_file(slots.back().data(), slots.back().size(), pointers(c));
    expected.push_back(restore_seq_state(packed.data(), packed.size()));
  }
  std::atomic<size_t> pushes{0}, hits{0}, misses{0}, errors{0}, wrong{0}, partial{0};
  std::mutex log_mutex;
  std::vector<std::string> first_errors;
  const auto deadline = Clock::now() + std::chrono::duration<double>(a.seconds);
  auto client = [&](size_t id) {
    std::mt19937 rng(static_cast<uint32_t>(id) + 1);
    std::unique_ptr<store::Store> s;
    const store::MissLog quiet = [&](const std::string& k, const std::string& why) {
      std::lock_guard<std::mutex> l(log_mutex);
      if (first_errors.size() < 8) first_errors.push_back("miss " + k + ": " + why);
    };
    while (Clock::now() < deadline) {
      const size_t d = rng() % a.docs;
      try {
        if (!s) {
          store::StoreOptions o;
          o.connect_timeout = o.command_timeout = std::chrono::milliseconds(500);
          s = store::open_store(a.store, store::credentials_from_environment(o));
        }
        if (rng() % 4 == 0) {
          fleet::push_slot(*s, fm, slots[d].data(), slots[d].size(), std::chrono::seconds(120));
          ++pushes;
        } else {
          const auto r = fleet::pull_slot(*s, fm, tokens[d], quiet);
          if (r.n_tokens == 0) {
            ++misses;
          } else if (r.n_tokens == n && r.slot_file == expected[d]) {
            ++hits;
          } else if (r.n_tokens < n && r.slot_file == fleet::truncate_slot_file(expected[d].data(), expected[d].size(), r.n_tokens)) {
            ++hits;
            ++partial;
          } else {
            ++wrong;
          }
        }
      } catch (const std::exception& e) {
        ++errors;
        {
          std::lock_guard<std::mutex> l(log_mutex);
          if (first_errors.size() < 8) first_errors.push_back(e.what());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 0; i < a.clients; ++i) threads.emplace_back(client, i);
  for (auto& t : threads) t.join();
  std::printf("load: %zu clients x %.0f s, %zu docs of %zu tokens (%s): pushes %zu, verified hits %zu (partial %zu), "
              "misses %zu, store errors %zu, WRONG %zu\n",
              a.clients, a.seconds, a.docs, n, a.preset.c_str(), pushes.load(), hits.load(), partial.load(),
              misses.load(), errors.load(), wrong.load());
  for (const auto& e : first_errors) std::printf("  e.g. %s\n", e.c_str());
  return wrong.load() == 0 ? 0 : 1;
}

int run(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string cmd = argv[1];
  Args a;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") a.model = v;
    else if (k == "--slot") a.slot = v;
    else if (k == "--store") a.store = v;
    else if (k == "--presets") a.presets = v;
    else if (k == "--preset") a.preset = v;
    else if (k == "--synthetic") a.synthetic = std::stoul(v);
    else if (k == "--chunk") a.chunk = std::stoul(v);
    else if (k == "--reps") a.reps = std::stoul(v);
    else if (k == "--clients") a.clients = std::stoul(v);
    else if (k == "--docs") a.docs = std::stoul(v);
    else if (k == "--seconds") a.seconds = std::stod(v);
    else throw Error("unknown argument " + k);
  }
  if (a.model.empty()) throw Error("--model is required");
  const Model m = load_model(a.model);
  if (cmd == "load") return load(a, m);
  const std::vector<uint8_t> slot = !a.slot.empty() ? read_file(a.slot) : synthetic_slot(m.kv, a.synthetic, 1);
  if (cmd == "sizes") return sizes(a, m, slot);
  if (cmd == "latency") return latency(a, m, slot);
  throw Error("unknown command " + cmd + " (sizes, latency, load)");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "e8kv-fleet-bench: %s\n", e.what());
    return 1;
  }
}
