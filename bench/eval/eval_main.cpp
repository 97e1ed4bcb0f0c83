// e8kv-eval: real-model quality of e8kv and its peers at honest bit rates.
//
// Protocol (per chunk of the corpus): prefill C-1 tokens densely (capturing every layer's K/V and
// the last 32 queries), build each configuration's cache from that prefill (e8kv compresses it;
// peers quantize it), then teacher-force the next T tokens one at a time through every cache in
// one batched decode step (the weights are read once per step). Every scored prediction goes
// through the cache under test. The reference is fp16 (the lossless preset). Reported per
// configuration: continuation perplexity and its Δ% vs fp16 (paired per chunk, 95 % CI), mean
// KL(fp16 ‖ config) of next-token distributions, top-1 agreement, honest bits per element and
// compression ratio of the cache at the end of the chunk, and needle-in-a-haystack recall.
// --at-rest switches to the peer harness's protocol (bench/peers/peers.py): only the prefill is
// compressed, the continuation tokens stay dense, and the rate is the prefill's.
//
// --check FILE is the quality regression check CI runs (ctest eval_quality_check, label model):
// FILE (bench/eval/quality_bounds.txt) gives a small setting and, per configuration, an upper
// bound on its KL; the run fails (exit 1) when a KL exceeds its bound, and exits 77 (skipped)
// when the model or the corpora are absent (exit 1 instead with E8KV_REQUIRE_DATA=1).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends.hpp"
#include "progress.hpp"
#include "report.hpp"
#include "e8kv/compressor.hpp"
#include "e8kv/error.hpp"
#include "e8kv/llama/model.hpp"
#include "e8kv/select/eviction.hpp"
#include "e8kv/select/scorer.hpp"
#include "npy.hpp"

namespace {
using namespace e8kv;

struct Options {
  std::string model, text;
  // --text-tail N: only the last N bytes of each text. Held-out text: the chunks read each corpus
  // from its start (8 chunks of a 1,024 + 128 setting: each corpus's first ~20 KB), its tail never.
  size_t text_tail = 0;
  int ctx = 2048, cont = 128, chunks = 2, threads = 0;
  bool quick = false, niah = true, ablations = false, verbose = false, quiet = false;
  // --powered: the main job's protocol (scripts/run.sh): ctx 1024, 128 scored tokens per chunk, 8
  // chunks (1,024 scored tokens, the setting docs/accuracy.md ranks configurations on), no needles,
  // the rows of main_rows().
  bool powered = false;
  std::vector<int> niah_sizes = {1024, 2048, 4096};
  std::vector<double> niah_depths = {0.1, 0.3, 0.5, 0.7, 0.9};  // --quick: 0.1, 0.5, 0.9
  std::string csv, md, svg, dump_kv, only, check;
  bool portable = false;  // the model's forward pass without its AVX2/FMA kernels
  // --at-rest: only the prefill is compressed (peers: quantized); the continuation tokens stay
  // dense float rows beside it (e8kv: attention over the codes merged by lse with the dense
  // rows'). The peer harness's protocol (bench/peers/peers.py); bits are counted at the end of
  // the prefill. The needle test keeps the default protocol.
  bool at_rest = false;
  std::vector<std::pair<std::string, std::string>> extra;  // --config NAME=SPEC
  uint64_t seed = 1234;
};

struct ConfigSpec {
  std::string name;
  std::string e8kv_spec;  // empty for peers
  bool is_peer = false;
  eval::PeerKind peer = eval::PeerKind::kQ8_0Rotated;
};

// The report's grouping: which peer a row stands for (its marker in the picture); empty for
// e8kv's own configurations. The TurboQuant-style rows are e8kv specs that stand for a peer.
std::string peer_group_of(const ConfigSpec& c) {
  const bool turbo = c.name.rfind("TurboQuant-style", 0) == 0;
  if (!c.is_peer && !turbo) return "";
  if (turbo) return "TurboQuant-style";
  for (const char* g : {"q8_0", "q4_0", "KIVI", "relaxed"})
    if (c.name.rfind(g, 0) == 0) return g;
  return c.name;
}

std::vector<ConfigSpec> config_list(bool ablations) {
  std::vector<ConfigSpec> v = {
      {"fp16", "preset=lossless"},
      {"e8kv quant-k4v4", "preset=quant-k4v4"},
      {"e8kv quant-k3v3", "preset=quant-k3v3"},
      {"e8kv quant-k4v2", "preset=quant-k4v2"},
      {"e8kv quant-k3v2", "preset=quant-k3v2"},
      {"e8kv quant-k2v2", "preset=quant-k2v2"},
      {"e8kv tier-k3v2", "preset=tier-k3v2"},
      {"e8kv tier-k2v2", "preset=tier-k2v2"},
      {"e8kv high", "preset=high"},
      {"e8kv asym", "preset=asym"},
      {"e8kv balanced", "preset=balanced"},
      {"e8kv max", "preset=max"},
      {"q8_0 (rotated)", "", true, eval::PeerKind::kQ8_0Rotated},
      {"q4_0 (rotated)", "", true, eval::PeerKind::kQ4_0Rotated},
      {"KIVI-4", "", true, eval::PeerKind::kKivi4},
      {"KIVI-2", "", true, eval::PeerKind::kKivi2},
      {"TurboQuant-style LM4", "key=lm4,value=lm4,key_gain=norm,value_gain=norm"},
      {"TurboQuant-style LM3", "key=lm3,value=lm3,key_gain=norm,value_gain=norm"},
      {"relaxed K3V2", "", true, eval::PeerKind::kRelaxedK3V2},
      {"relaxed K2V2", "", true, eval::PeerKind::kRelaxedK2V2},
  };
  if (ablations) {
    v.push_back({"ablation k3v2 post-RoPE", "preset=quant-k3v2,rope=post"});
    v.push_back({"ablation k3v2 gain=ls", "preset=quant-k3v2,key_gain=ls,value_gain=ls"});
    v.push_back({"ablation k3v2 gain=unbiased", "preset=quant-k3v2,key_gain=unbiased,value_gain=unbiased"});
    v.push_back({"ablation k3v2 ball3 keys", "preset=quant-k3v2,key=ball3"});
    v.push_back({"ablation k3v2 protect=2", "preset=quant-k3v2,protect=2"});
    v.push_back({"ablation k3v2 qweight=0", "preset=quant-k3v2,qweight=0"});
    v.push_back({"ablation k3v2 gain_bits=16", "preset=quant-k3v2,gain_bits=16"});
  }
  return v;
}

// The main job's rows (--powered): the reference, llama.cpp's rotated q8_0 / q4_0, KIVI, the
// TurboQuant-style rows, e8kv's quantization and tier presets and one eviction preset.
std::vector<ConfigSpec> main_rows() {
  const char* names[] = {"fp16",           "q8_0 (rotated)",       "q4_0 (rotated)",       "KIVI-4",
                         "KIVI-2",         "TurboQuant-style LM4", "TurboQuant-style LM3", "e8kv quant-k4v4",
                         "e8kv quant-k3v3", "e8kv quant-k3v2",     "e8kv quant-k2v2",      "e8kv tier-k3v2",
                         "e8kv tier-k2v2", "e8kv high"};
  const auto all = config_list(false);
  std::vector<ConfigSpec> v;
  for (const char* n : names)
    for (const auto& c : all)
      if (c.name == n) v.push_back(c);
  return v;
}

// Runs fn(i) for i in [0, n) on `threads` threads (the caller's among them).
template <class Fn>
void parallel_for(size_t n, int threads, Fn&& fn) {
  const size_t t = std::max<size_t>(1, std::min<size_t>(n, static_cast<size_t>(std::max(1, threads))));
  if (t == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  std::exception_ptr error;
  std::mutex m;
  for (size_t w = 1; w < t; ++w)
    pool.emplace_back([&, w] {
      try {
        for (size_t i = w; i < n; i += t) fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(m);
        if (!error) error = std::current_exception();
      }
    });
  try {
    for (size_t i = 0; i < n; i += t) fn(i);
  } catch (...) {
    std::lock_guard<std::mutex> lock(m);
    if (!error) error = std::current_exception();
  }
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

// At rest (--at-rest) a spec without `residual` codes the prefill's last tokens too
// (Config::parse_at_rest): the continuation is dense, the window would only cost bytes.
Config model_config(const std::string& spec, const llama::ModelConfig& mc, bool at_rest) {
  Config c = at_rest ? Config::parse_at_rest(spec) : Config::parse(spec);
  c.rope = llama::rope_params(mc);  // the model's RoPE, read from the GGUF
  return c;
}

// ---- progress ------------------------------------------------------------------------------------
// A bar on a terminal, one line per chunk (and per needle) in a log, nothing with --quiet
// (bench/common/progress.hpp).
using Progress = e8kv::bench::Progress;

// ---- metrics -------------------------------------------------------------------------------------
struct Accum {
  std::vector<double> chunk_nll_sum;  // per chunk
  std::vector<double> chunk_kl;       // per chunk: mean KL over its scored tokens
  std::vector<double> chunk_tokens;
  double kl_sum = 0, tokens = 0, top1 = 0;
  double bits_sum = 0, ratio_sum = 0, chunks = 0;
  int niah_hits = 0, niah_total = 0;
  std::string note;
};

void log_softmax(const float* logits, int n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  double m = -1e300;
  for (int i = 0; i < n; ++i) m = std::max(m, static_cast<double>(logits[i]));
  double z = 0;
  for (int i = 0; i < n; ++i) z += std::exp(logits[i] - m);
  const double lz = m + std::log(z);
  for (int i = 0; i < n; ++i) out[static_cast<size_t>(i)] = logits[i] - lz;
}

int argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

std::unique_ptr<eval::MeasuredBackend> make_backend(const ConfigSpec& c, const KVCompressor* comp,
                                                    const llama::PrefillCapture& cap, const llama::ModelConfig& mc,
                                                    bool at_rest = false) {
  if (c.is_peer) {
    auto peer = std::make_unique<eval::PeerBackend>(c.peer, mc, cap);
    if (at_rest) peer->stop_quantizing();
    return peer;
  }
  return std::make_unique<eval::E8kvBackend>(*comp, cap, mc, at_rest);
}

double elements_of(const llama::ModelConfig& mc, int64_t tokens) {
  return static_cast<double>(tokens) * mc.n_layers * mc.n_kv_heads * mc.head_dim * 2.0;
}

// ---- corpus --------------------------------------------------------------------------------------
std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  require(f.good(), "cannot read text file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// --verbose: how much of the eviction scorer's own evidence 20 % / 40 % eviction throws away. The
// default scorer's scores (observation-window queries, pooled, mean over KV heads) of each layer;
// the lowest-scored tokens that eviction may take (not the sinks, not the recent window) removed;
// their share of the layer's score sum, mean over layers and for layer 0.
void print_evicted_score_share(const llama::PrefillCapture& cap, const llama::ModelConfig& mc, int chunk) {
  const Config dflt;
  const int64_t n = cap.n_tokens, H = mc.n_kv_heads, d = mc.head_dim;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  const double rates[2] = {0.2, 0.4};
  double mean[2] = {0, 0}, first[2] = {0, 0};
  for (int l = 0; l < mc.n_layers; ++l) {
    const auto& q = cap.q_obs[static_cast<size_t>(l)];
    const int64_t W = static_cast<int64_t>(q.size()) / (static_cast<int64_t>(mc.n_heads) * d);
    std::vector<int32_t> qpos(static_cast<size_t>(W));
    for (int64_t w = 0; w < W; ++w) qpos[static_cast<size_t>(w)] = static_cast<int32_t>(n - W + w);
    const LayerQueries lq{TensorView::nhd(q.data(), DType::kF32, W, mc.n_heads, d), qpos.data()};
    const select::ScorerOptions so = dflt.scorer_options();
    const auto scores = select::score_layer(TensorView::nhd(cap.k[static_cast<size_t>(l)].data(), DType::kF32, n, H, d),
                                            pos.data(), &lq, so);
    const std::vector<float> agg = select::aggregate_heads(scores, dflt.head_aggregation);
    const double total = std::accumulate(agg.begin(), agg.end(), 0.0);
    for (int r = 0; r < 2; ++r) {
      select::EvictionOptions eo = dflt.eviction_options();  // what compress keeps at this rate (one set per layer)
      eo.rate = rates[r];
      double kept = 0;
      for (int64_t t : select::select_tokens(agg, eo)) kept += agg[static_cast<size_t>(t)];
      const double share = total > 0 ? (total - kept) / total : 0.0;
      mean[r] += share / mc.n_layers;
      if (l == 0) first[r] = share;
    }
  }
  std::printf("chunk %d: score share evicted at 20 %% / 40 %%: mean over layers %.4f / %.4f, layer 0 %.4f / %.4f\n",
              chunk + 1, mean[0], mean[1], first[0], first[1]);
}

// ---- main pieces ---------------------------------------------------------------------------------
void run_chunks(const Options& o, const llama::Model& model, const std::vector<std::vector<int32_t>>& corpora,
                const std::vector<ConfigSpec>& cfgs, const std::vector<std::unique_ptr<KVCompressor>>& comps,
                std::vector<Accum>& acc, Progress& prog) {
  const auto& mc = model.config();
  const int V = mc.vocab_size;
  const int C = o.ctx, T = o.cont;
  std::vector<double> lp_ref, p_ref, step_kl(cfgs.size());
  std::vector<int> step_top1(cfgs.size());
  for (int chunk = 0; chunk < o.chunks; ++chunk) {
    const auto& toks = corpora[static_cast<size_t>(chunk) % corpora.size()];
    const size_t per = static_cast<size_t>(C + T);
    const size_t slot = static_cast<size_t>(chunk) / corpora.size();
    require((slot + 1) * per <= toks.size(), "corpus too short for " + std::to_string(o.chunks) + " chunks of " +
                                                 std::to_string(per) + " tokens");
    const std::vector<int32_t> seq(toks.begin() + static_cast<ptrdiff_t>(slot * per),
                                   toks.begin() + static_cast<ptrdiff_t>((slot + 1) * per));
    llama::PrefillCapture cap;
    cap.obs_window = 32;
    cap.capture_pre_rope_keys = !o.dump_kv.empty() && chunk == 0;
    const std::vector<int32_t> prompt(seq.begin(), seq.begin() + (C - 1));
    const std::string unit = "chunk " + std::to_string(chunk + 1) + "/" + std::to_string(o.chunks);
    prog.update(unit + " prefill", 0.0);
    model.prefill(prompt, &cap, llama::LogitsMode::kNone);
    if (!o.dump_kv.empty() && chunk == 0) {
      const int64_t n = cap.n_tokens;
      for (int l = 0; l < mc.n_layers; ++l) {
        const std::string p = o.dump_kv + "/layer" + std::to_string(l);
        bench::save_npy(p + "_keys_post_rope.npy", cap.k[l].data(), {size_t(n) * mc.n_kv_heads, size_t(mc.head_dim)});
        bench::save_npy(p + "_keys_pre_rope.npy", cap.k_pre_rope[l].data(), {size_t(n) * mc.n_kv_heads, size_t(mc.head_dim)});
        bench::save_npy(p + "_values.npy", cap.v[l].data(), {size_t(n) * mc.n_kv_heads, size_t(mc.head_dim)});
        const size_t w = cap.q_obs[l].size() / mc.head_dim;
        bench::save_npy(p + "_queries_obs.npy", cap.q_obs[l].data(), {w, size_t(mc.head_dim)});
      }
      std::vector<float> pos(static_cast<size_t>(n));
      std::iota(pos.begin(), pos.end(), 0.f);
      bench::save_npy(o.dump_kv + "/positions.npy", pos.data(), {pos.size()});
      std::ofstream readme(o.dump_kv + "/README");
      readme << "KV dump of e8kv-eval (model " << mc.name << ", first chunk, " << n << " tokens)\n"
             << "layerL_keys_post_rope.npy, layerL_keys_pre_rope.npy, layerL_values.npy: float32 ["
             << n << " * " << mc.n_kv_heads << ", " << mc.head_dim << "], row = token * n_kv_heads + kv_head\n"
             << "layerL_queries_obs.npy: float32 [window * " << mc.n_heads << ", " << mc.head_dim
             << "], post-RoPE queries of the last tokens, row = w * n_q_heads + q_head\n"
             << "positions.npy: float32 [" << n << "], the token positions 0..n-1\n"
             << "RoPE: theta " << mc.rope_theta << ", rope_dim " << mc.rope_dim
             << (mc.rope_adjacent_pairs ? ", adjacent pairs (interleaved)\n" : ", split halves\n")
             << "Use: e8kv-rd --source npy:layer5_keys_pre_rope.npy\n";
    }
    prog.update(unit + " compress", 0.05);
    // Every configuration's cache from the same prefill, on the model's threads (one
    // configuration per thread: each compressor and backend is independent).
    std::vector<std::unique_ptr<eval::MeasuredBackend>> backends(cfgs.size());
    parallel_for(cfgs.size(), model.threads(),
                 [&](size_t i) { backends[i] = make_backend(cfgs[i], comps[i].get(), cap, mc, o.at_rest); });
    // The rate of what is stored: at rest the prefill's cache (the continuation is not stored
    // coded); otherwise the mean over the scored steps of the cache each step's attention read
    // (its bytes after the step's append over the tokens given so far). A snapshot at the chunk's
    // end would depend on where the fp16 window stands in its flush cycle: a window of r + 0..15
    // tokens is counted at its average, not at whichever phase the chunk happens to end in.
    std::vector<double> chunk_bits(cfgs.size(), 0.0);
    auto add_bits = [&](double weight) {
      for (size_t i = 0; i < cfgs.size(); ++i)
        chunk_bits[i] += weight * 8.0 * backends[i]->bytes() / elements_of(mc, backends[i]->original_tokens());
    };
    if (o.at_rest) add_bits(1.0);
    std::vector<llama::KvBackend*> ptrs;
    for (auto& b : backends) ptrs.push_back(b.get());
    if (o.verbose) print_evicted_score_share(cap, mc, chunk);
    std::vector<double> nll(cfgs.size(), 0.0), chunk_kl(cfgs.size(), 0.0);
    for (int t = 0; t < T; ++t) {
      prog.update(unit + " decode", 0.1 + 0.9 * double(t) / T);
      const int64_t pos = C - 1 + t;
      const int32_t in = seq[static_cast<size_t>(pos)], target = seq[static_cast<size_t>(pos + 1)];
      const std::vector<int32_t> tokens(cfgs.size(), in);
      const std::vector<int64_t> positions(cfgs.size(), pos);
      const auto logits = model.decode_batch(tokens, positions, ptrs);
      if (!o.at_rest) add_bits(1.0 / T);
      log_softmax(&logits[0], V, lp_ref);
      const int ref_top = argmax(&logits[0], V);
      p_ref.resize(lp_ref.size());
      for (size_t j = 0; j < lp_ref.size(); ++j) p_ref[j] = std::exp(lp_ref[j]);
      // KL and NLL of every configuration against the reference, on the model's threads.
      parallel_for(cfgs.size(), model.threads(), [&](size_t i) {
        thread_local std::vector<double> lp;
        const float* li = &logits[i * static_cast<size_t>(V)];
        log_softmax(li, V, lp);
        nll[i] -= lp[static_cast<size_t>(target)];
        double kl = 0;
        for (int j = 0; j < V; ++j)
          kl += p_ref[static_cast<size_t>(j)] * (lp_ref[static_cast<size_t>(j)] - lp[static_cast<size_t>(j)]);
        step_kl[i] = std::max(0.0, kl);
        step_top1[i] = argmax(li, V) == ref_top;
      });
      for (size_t i = 0; i < cfgs.size(); ++i) {
        acc[i].kl_sum += step_kl[i];
        chunk_kl[i] += step_kl[i];
        acc[i].top1 += step_top1[i];
        acc[i].tokens += 1;
      }
    }
    if (o.verbose)
      for (size_t i = 1; i < cfgs.size(); ++i)
        std::printf("chunk %d: %-28s KL %.5f\n", chunk + 1, cfgs[i].name.c_str(), chunk_kl[i] / T);
    for (size_t i = 0; i < cfgs.size(); ++i) {
      acc[i].chunk_nll_sum.push_back(nll[i]);
      acc[i].chunk_tokens.push_back(T);
      acc[i].chunk_kl.push_back(chunk_kl[i] / T);
      const double bits = chunk_bits[i];
      acc[i].bits_sum += bits;
      acc[i].ratio_sum += 16.0 / bits;
      acc[i].chunks += 1;
      acc[i].note = backends[i]->rate_note();
    }
    prog.unit_done(unit);
  }
}

// --verbose diagnostics of the fp16 tier in the needle test: the positions of the tokens that
// spell the needle's number (the first run of tokens whose texts, concatenated, are its digits),
// and how many of them each configuration holds pinned in fp16, per layer.
std::vector<int32_t> needle_positions(const llama::Tokenizer& tok, const std::vector<int32_t>& ids, int number) {
  const std::string digits = std::to_string(number);
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string text;
    for (size_t j = i; j < ids.size() && text.size() < digits.size() + 2; ++j) {
      std::string piece = tok.decode({ids[j]}, true);
      piece.erase(std::remove(piece.begin(), piece.end(), ' '), piece.end());
      text += piece;
      if (text == digits) {
        std::vector<int32_t> out;
        for (size_t k = i; k <= j; ++k) out.push_back(static_cast<int32_t>(k));
        return out;
      }
      if (digits.compare(0, text.size(), text) != 0) break;
    }
  }
  return {};
}

void report_pinned_needle(const std::vector<ConfigSpec>& cfgs,
                          const std::vector<std::unique_ptr<eval::MeasuredBackend>>& backends,
                          const std::vector<int32_t>& needle) {
  for (size_t i = 0; i < cfgs.size(); ++i) {
    const auto* e8 = dynamic_cast<const eval::E8kvBackend*>(backends[i].get());
    if (e8 == nullptr || needle.empty()) continue;
    const CompressedKV& c = e8->cache();
    int layers_all = 0, layers_any = 0;
    double held = 0, in_tier = 0;
    for (int l = 0; l < c.n_layers(); ++l) {
      const auto& w = c.window_positions(l, 0);
      const auto& tier = c.tier_positions(l, 0);
      const auto pinned = c.layer(l).pinned;
      int n = 0, t = 0;
      for (int32_t p : needle) {
        n += std::find(w.begin(), w.begin() + pinned, p) != w.begin() + pinned ? 1 : 0;
        t += std::binary_search(tier.begin(), tier.end(), p) ? 1 : 0;
      }
      held += static_cast<double>(n) / needle.size();
      in_tier += static_cast<double>(t) / needle.size();
      layers_all += n == static_cast<int>(needle.size());
      layers_any += n > 0;
    }
    std::fprintf(stderr, "\n[niah] %s: needle tokens %d-%d pinned in fp16 (head 0's set): %.0f %% on average over layers, "
                 "all of them in %d of %d layers, some in %d; in the code tier: %.0f %%\n", cfgs[i].name.c_str(),
                 needle.front(), needle.back(), 100.0 * held / c.n_layers(), layers_all, c.n_layers(), layers_any,
                 100.0 * in_tier / c.n_layers());
  }
}

// Needle in a haystack through the model's chat template; greedy answer, exact match of the number.
void run_niah(const Options& o, const llama::Model& model, const std::vector<int32_t>& haystack_tokens,
              const std::vector<ConfigSpec>& cfgs, const std::vector<std::unique_ptr<KVCompressor>>& comps,
              std::vector<Accum>& acc, Progress& prog) {
  const auto& mc = model.config();
  const auto& tok = model.tokenizer();
  const int V = mc.vocab_size;
  std::mt19937_64 rng(o.seed);
  const int32_t im_end = tok.find("<|im_end|>");
  const size_t total = o.niah_sizes.size() * o.niah_depths.size();
  size_t done = 0;
  for (int size : o.niah_sizes) {
    for (double depth : o.niah_depths) {
      const std::string unit = "needle " + std::to_string(++done) + "/" + std::to_string(total);
      prog.update(unit, 0.0);
      const int number = 100000 + static_cast<int>(rng() % 900000);
      const std::string needle = " The secret number is " + std::to_string(number) + ". ";
      require(haystack_tokens.size() > static_cast<size_t>(size) + 64, "corpus too short for a haystack of " + std::to_string(size));
      std::string hay = tok.decode(std::vector<int32_t>(haystack_tokens.begin(), haystack_tokens.begin() + size));
      size_t cut = static_cast<size_t>(depth * hay.size());
      const size_t dot = hay.find(". ", cut);
      cut = dot == std::string::npos ? cut : dot + 1;
      hay.insert(cut, needle);
      const std::string prompt = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" + hay +
                                 "\n\nWhat is the secret number in the text above? Answer with the number only."
                                 "<|im_end|>\n<|im_start|>assistant\n";
      const auto ids = tok.encode(prompt, /*parse_special=*/true);
      llama::PrefillCapture cap;
      cap.obs_window = 32;
      const std::vector<int32_t> head(ids.begin(), ids.end() - 1);
      model.prefill(head, &cap, llama::LogitsMode::kNone);
      std::vector<std::unique_ptr<eval::MeasuredBackend>> backends;
      backends.resize(cfgs.size());
      parallel_for(cfgs.size(), model.threads(),
                   [&](size_t i) { backends[i] = make_backend(cfgs[i], comps[i].get(), cap, mc); });
      if (o.verbose) report_pinned_needle(cfgs, backends, needle_positions(tok, head, number));
      std::vector<llama::KvBackend*> ptrs;
      for (auto& b : backends) ptrs.push_back(b.get());
      std::vector<std::vector<int32_t>> answers(cfgs.size());
      std::vector<int32_t> next(cfgs.size(), ids.back());
      std::vector<char> finished(cfgs.size(), 0);
      for (int step = 0; step < 24; ++step) {  // "The secret number ... is NNNNNN." fits
        const std::vector<int64_t> positions(cfgs.size(), static_cast<int64_t>(ids.size()) - 1 + step);
        const auto logits = model.decode_batch(next, positions, ptrs);
        for (size_t i = 0; i < cfgs.size(); ++i) {
          next[i] = argmax(&logits[i * static_cast<size_t>(V)], V);
          if (!finished[i]) {
            if (next[i] == im_end || next[i] == mc.eos_id) finished[i] = 1;
            else answers[i].push_back(next[i]);
          }
        }
      }
      for (size_t i = 0; i < cfgs.size(); ++i) {
        const std::string a = tok.decode(answers[i], true);
        if (o.verbose)
          std::fprintf(stderr, "\n[niah] size %d depth %.1f number %d %s answered '%s'\n", size, depth, number,
                       cfgs[i].name.c_str(), a.c_str());
        acc[i].niah_hits += a.find(std::to_string(number)) != std::string::npos;
        acc[i].niah_total += 1;
      }
      prog.unit_done(unit);
    }
  }
}

// Per configuration: the report's row (bench/eval/report.hpp).
std::vector<eval::RowStats> summarize(const std::vector<ConfigSpec>& cfgs, const std::vector<Accum>& acc) {
  std::vector<eval::RowStats> out;
  const auto& ref = acc[0];
  for (size_t i = 0; i < cfgs.size(); ++i) {
    const auto& a = acc[i];
    eval::RowStats r;
    r.name = cfgs[i].name;
    r.peer = peer_group_of(cfgs[i]);
    r.family = i == 0 ? eval::RowFamily::kReference : r.peer.empty() ? eval::RowFamily::kE8kv : eval::RowFamily::kPeer;
    r.note = a.note;
    if (a.chunks > 0) {
      r.bits = a.bits_sum / a.chunks;
      r.ratio = a.ratio_sum / a.chunks;
      const double nll = std::accumulate(a.chunk_nll_sum.begin(), a.chunk_nll_sum.end(), 0.0);
      const double tok = std::accumulate(a.chunk_tokens.begin(), a.chunk_tokens.end(), 0.0);
      r.ppl = std::exp(nll / tok);
      eval::dppl_over_chunks(a.chunk_nll_sum, ref.chunk_nll_sum, a.chunk_tokens, r);
      r.kl = a.kl_sum / a.tokens;
      r.top1 = a.top1 / a.tokens;
      r.chunk_kl = a.chunk_kl;
    }
    if (a.niah_total > 0) r.niah = double(a.niah_hits) / a.niah_total;
    out.push_back(r);
  }
  return out;
}

eval::Protocol protocol_of(const Options& o, const llama::ModelConfig& mc, const std::vector<std::string>& texts,
                           int threads, double seconds) {
  eval::Protocol p;
  // The GGUF's file name says which model and quantization (its general.name is often a run name).
  std::string file = o.model.substr(o.model.find_last_of('/') + 1);
  if (file.size() > 5 && file.compare(file.size() - 5, 5, ".gguf") == 0) file.resize(file.size() - 5);
  p.model = file.empty() ? mc.name : file;
  p.n_layers = mc.n_layers;
  p.n_heads = mc.n_heads;
  p.n_kv_heads = mc.n_kv_heads;
  p.head_dim = mc.head_dim;
  p.ctx = o.ctx;
  p.cont = o.cont;
  p.chunks = o.chunks;
  p.threads = threads;
  p.at_rest = o.at_rest;
  p.seconds = seconds;
  for (const auto& t : texts) p.texts.push_back(t.substr(t.find_last_of('/') + 1));
  return p;
}

void print_outputs(const Options& o, const std::vector<eval::RowStats>& rs, const eval::Protocol& p) {
  std::fputs(eval::text_table(p, rs).c_str(), stdout);
  for (const auto& r : rs)
    if (!r.note.empty() && r.name.find("relaxed") != std::string::npos) {
      std::printf("note: %s\n", r.note.c_str());
      break;
    }
  std::fflush(stdout);
  if (!o.csv.empty()) eval::write_text_file(o.csv, eval::csv_table(rs), "--csv");
  if (!o.md.empty()) eval::write_text_file(o.md, eval::markdown_table(p, rs), "--md");
  if (!o.svg.empty()) eval::write_text_file(o.svg, eval::quality_svg(p, rs), "--svg");
}

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoi(item));
  return v;
}

// ---- quality regression check (--check FILE) -------------------------------------------------
// FILE: '#' starts a comment; "ctx N", "cont N", "chunks N" give the setting (no needles);
// "corpus NAME BYTES FNV1A64" pins each fetched corpus the bounds were recorded on (the fetch
// falls back to another Debian package version when the pinned one is gone: KL would then move
// for reasons that are no regression); each "check | NAME | SPEC | KL_MAX | KL_MEASURED" line adds
// the e8kv configuration SPEC (Config::parse syntax) and its bound. KL_MEASURED is where the
// bound came from (printed only).
struct QualityBound {
  std::string name, spec;
  double kl_max = 0, kl_measured = 0;
};
struct CorpusPin {
  std::string name;
  uint64_t bytes = 0, fnv1a64 = 0;
};
struct QualityCheck {
  int ctx = 0, cont = 0, chunks = 0;
  std::vector<CorpusPin> corpora;
  std::vector<QualityBound> bounds;
};

// FNV-1a, 64 bits: a fingerprint of a corpus (not a security hash; fetch-text.sh checks SHA-256).
uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

double parse_number(const std::string& s, const std::string& where) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  require(!s.empty() && end == s.c_str() + s.size() && std::isfinite(v) && v >= 0, where + ": '" + s +
                                                                                      "' is not a number >= 0");
  return v;
}

QualityCheck read_quality_check(const std::string& path) {
  std::ifstream f(path);
  require(f.good(), "--check: cannot read " + path);
  QualityCheck c;
  std::string raw;
  for (int line_no = 1; std::getline(f, raw); ++line_no) {
    const std::string where = path + ":" + std::to_string(line_no);
    const std::string line = trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    if (line.rfind("check", 0) == 0) {
      std::vector<std::string> fields;
      std::stringstream ss(line);
      for (std::string field; std::getline(ss, field, '|');) fields.push_back(trim(field));
      require(fields.size() == 5 && fields[0] == "check" && !fields[1].empty() && !fields[2].empty(),
              where + ": expected 'check | NAME | SPEC | KL_MAX | KL_MEASURED'");
      require(fields[1] != "fp16", where + ": 'fp16' is the reference's name");
      for (const auto& b : c.bounds) require(b.name != fields[1], where + ": " + fields[1] + " is checked twice");
      c.bounds.push_back({fields[1], fields[2], parse_number(fields[3], where), parse_number(fields[4], where)});
      continue;
    }
    std::stringstream ss(line);
    std::string key, value, extra;
    ss >> key >> value;
    if (key == "corpus") {
      CorpusPin pin{value};
      std::string hash;
      ss >> pin.bytes >> hash;
      require(!ss.fail() && !value.empty() && hash.rfind("0x", 0) == 0 && !(ss >> extra),
              where + ": expected 'corpus NAME BYTES 0xFNV1A64'");
      pin.fnv1a64 = std::stoull(hash, nullptr, 16);
      c.corpora.push_back(pin);
      continue;
    }
    require(!(ss >> extra) && (key == "ctx" || key == "cont" || key == "chunks"),
            where + ": expected 'ctx N', 'cont N', 'chunks N', a corpus line or a check line");
    const int v = static_cast<int>(parse_number(value, where));
    (key == "ctx" ? c.ctx : key == "cont" ? c.cont : c.chunks) = v;
  }
  require(c.ctx > 0 && c.cont > 0 && c.chunks > 0, "--check " + path + ": ctx, cont and chunks must all be given");
  require(!c.bounds.empty(), "--check " + path + ": no check lines");
  return c;
}

// 77 (CTest's skip code) when the check cannot run for want of fetched data; 1 when the data is
// required (E8KV_REQUIRE_DATA=1, as CI sets it after fetching).
int check_not_run(const std::string& why) {
  const char* required = std::getenv("E8KV_REQUIRE_DATA");
  if (required != nullptr && std::string(required) == "1") {
    std::fprintf(stderr, "e8kv-eval --check: %s, and E8KV_REQUIRE_DATA=1 (scripts/fetch-data.sh fetches it)\n",
                 why.c_str());
    return 1;
  }
  std::printf("SKIPPED: %s (scripts/fetch-data.sh fetches it); exit 77 = skipped\n", why.c_str());
  return 77;
}

// Prints each configuration's KL against its bound; 0 when all hold, 1 otherwise.
int report_check(const QualityCheck& c, const std::vector<eval::RowStats>& rs) {
  std::printf("\n# quality check: mean KL(fp16 || config) against the recorded bounds\n");
  std::printf("%-30s %11s %11s %11s  %s\n", "config", "KL", "bound", "recorded", "result");
  int failures = 0;
  for (const auto& b : c.bounds) {
    const auto it = std::find_if(rs.begin(), rs.end(), [&](const eval::RowStats& r) { return r.name == b.name; });
    require(it != rs.end(), "--check: no result for " + b.name);
    // kl_max 0 means exactly 0 (bit-identical logits); NaN fails.
    const bool ok = it->kl <= b.kl_max;
    failures += !ok;
    std::printf("%-30s %11.6f %11.6f %11.6f  %s\n", b.name.c_str(), it->kl, b.kl_max, b.kl_measured,
                ok ? "ok" : "REGRESSION");
  }
  if (failures > 0)
    std::printf("quality check FAILED: %d configuration(s) above their KL bound\n", failures);
  else
    std::printf("quality check passed (%zu configurations)\n", c.bounds.size());
  return failures > 0 ? 1 : 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: e8kv-eval [--model F.gguf] [--text FILE] [--text-tail BYTES] [--ctx 512|2048|4096] [--cont T] [--chunks N]\n"
               "                 [--powered | --quick] [--no-niah] [--niah-sizes 1024,2048] [--ablations] [--only NAME,...]\n"
               "                 [--config NAME=SPEC ...]   (adds an e8kv configuration, Config::parse syntax)\n"
               "                 [--csv FILE] [--md FILE] [--svg FILE] [--dump-kv DIR] [--threads N] [--portable] [--at-rest]\n"
               "                 [--verbose] [--quiet]\n"
               "       e8kv-eval --check FILE [--model F.gguf] [--threads N] [--portable]\n"
               "                 (quality regression check: setting and KL bounds from FILE; exit 1 above a bound)\n"
               "defaults: the fetched SmolLM2-135M-Instruct and the two fetched corpora (scripts/fetch-data.sh)\n"
               "--text-tail BYTES: only the last BYTES of each text (held-out text: chunks read a corpus from its start)\n"
               "--at-rest: compress the prefill only; continuation tokens stay dense (the peer harness's protocol)\n"
               "--powered: the main job (scripts/run.sh): ctx 1024, 128 scored tokens x 8 chunks, no needles, the\n"
               "           main rows (fp16, q8_0/q4_0 rotated, KIVI, TurboQuant-style, e8kv quant/tier presets, high)\n"
               "--svg FILE: next-token KL (log) against honest bits per element for every row, Pareto front marked\n"
               "progress on stderr: a bar on a terminal, one line per chunk otherwise; --quiet: none\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o;
    bool ctx_set = false, chunks_set = false, cont_set = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw Error("missing value after " + a);
        return argv[++i];
      };
      if (a == "--model") o.model = next();
      else if (a == "--text") o.text = next();
      else if (a == "--text-tail") {
        const long long n = std::stoll(next());
        require(n > 0, "--text-tail takes a positive byte count");
        o.text_tail = static_cast<size_t>(n);
      }
      else if (a == "--ctx") { o.ctx = std::stoi(next()); ctx_set = true; }
      else if (a == "--cont") { o.cont = std::stoi(next()); cont_set = true; }
      else if (a == "--chunks") { o.chunks = std::stoi(next()); chunks_set = true; }
      else if (a == "--quick") o.quick = true;
      else if (a == "--powered") o.powered = true;
      else if (a == "--quiet") o.quiet = true;
      else if (a == "--svg") o.svg = next();
      else if (a == "--no-niah") o.niah = false;
      else if (a == "--ablations") o.ablations = true;
      else if (a == "--verbose") o.verbose = true;
      else if (a == "--niah-sizes") o.niah_sizes = parse_ints(next());
      else if (a == "--only") o.only = next();
      else if (a == "--config") {
        const std::string v = next();
        const auto eq = v.find('=');
        if (eq == std::string::npos || eq == 0) throw Error("--config wants NAME=SPEC (e.g. mine=preset=quant-k3v2,qweight=1)");
        o.extra.emplace_back(v.substr(0, eq), v.substr(eq + 1));
      }
      else if (a == "--csv") o.csv = next();
      else if (a == "--md") o.md = next();
      else if (a == "--dump-kv") o.dump_kv = next();
      else if (a == "--threads") o.threads = std::stoi(next());
      else if (a == "--check") o.check = next();
      else if (a == "--portable") o.portable = true;
      else if (a == "--at-rest") o.at_rest = true;
      else if (a == "-h" || a == "--help") return usage();
      else throw Error("unknown argument '" + a + "'");
    }
    require(!(o.quick && o.powered), "--quick and --powered are two protocols; give one");
    if (o.powered) {
      if (!ctx_set) o.ctx = 1024;
      if (!cont_set) o.cont = 128;
      if (!chunks_set) o.chunks = 8;
      o.niah = false;
      o.ablations = false;
    }
    if (o.quick) {
      if (!ctx_set) o.ctx = 512;
      if (!cont_set) o.cont = 64;
      if (!chunks_set) o.chunks = 2;
      o.niah_sizes = {1024};
      o.niah_depths = {0.1, 0.5, 0.9};
      o.ablations = false;
    }
    QualityCheck check;
    if (!o.check.empty()) {
      require(!ctx_set && !cont_set && !chunks_set && !o.quick && !o.ablations && o.only.empty() && o.extra.empty() &&
                  o.text.empty() && o.text_tail == 0 && !o.at_rest,
              "--check takes the setting, the corpora and the configurations from its file (its bounds are "
              "the default protocol's); drop --ctx/--cont/--chunks/--quick/--ablations/--only/--config/--text/"
              "--text-tail/--at-rest");
      require(!o.powered, "--check takes its setting from its file; drop --powered");
      check = read_quality_check(o.check);
      o.ctx = check.ctx;
      o.cont = check.cont;
      o.chunks = check.chunks;
      o.niah = false;
    }
    require(o.ctx >= 64 && o.cont >= 1 && o.chunks >= 1, "--ctx >= 64, --cont >= 1, --chunks >= 1 required");
    if (o.model.empty()) o.model = llama::default_model_path();
    if (!o.check.empty()) {
      if (!std::ifstream(o.model)) return check_not_run("model absent: " + o.model);
      const std::string base = llama::default_cache_dir() + "/text/";
      for (const char* name : {"tech.txt", "fiction.txt"})
        if (!std::ifstream(base + name)) return check_not_run("corpus absent: " + base + name);
      for (const auto& pin : check.corpora) {
        const std::string text = read_file(base + pin.name);
        char got[64];
        std::snprintf(got, sizeof got, "%zu bytes, 0x%016llx", text.size(), static_cast<unsigned long long>(fnv1a64(text)));
        require(text.size() == pin.bytes && fnv1a64(text) == pin.fnv1a64,
                "--check: " + base + pin.name + " (" + got + ") is not the corpus the bounds were recorded on (" +
                    std::to_string(pin.bytes) + " bytes); scripts/fetch-text.sh warns when it fetched another "
                    "package version. Re-record the bounds on the new corpus");
      }
    }
    if (o.portable) llama::set_simd_enabled(false);
    const auto model = llama::Model::load(o.model, o.threads);
    const auto& mc = model.config();
    require(is_supported_head_dim(mc.head_dim), "model head_dim " + std::to_string(mc.head_dim) + " is not supported");
    std::vector<std::string> texts;
    if (!o.text.empty()) texts.push_back(o.text);
    else {
      const std::string base = llama::default_cache_dir() + "/text/";
      texts = {base + "tech.txt", base + "fiction.txt"};
    }
    std::vector<std::vector<int32_t>> corpora;
    for (const auto& t : texts) {
      std::string body = read_file(t);
      if (o.text_tail > 0) {
        require(o.text_tail <= body.size(), "--text-tail " + std::to_string(o.text_tail) + " exceeds " + t + " (" +
                                                std::to_string(body.size()) + " bytes)");
        body.erase(0, body.size() - o.text_tail);
      }
      corpora.push_back(model.tokenizer().encode(body));
    }
    auto cfgs = o.powered ? main_rows() : config_list(o.ablations);
    if (!o.check.empty()) {
      cfgs.resize(1);  // the fp16 reference
      for (const auto& b : check.bounds) cfgs.push_back({b.name, b.spec});
    }
    if (!o.only.empty()) {
      std::vector<ConfigSpec> keep = {cfgs[0]};
      std::stringstream ss(o.only);
      std::string name;
      while (std::getline(ss, name, ','))
        for (const auto& c : cfgs)
          if (c.name == name && c.name != "fp16") keep.push_back(c);
      cfgs = keep;
    }
    for (const auto& [name, spec] : o.extra) cfgs.push_back({name, spec});
    std::vector<std::unique_ptr<KVCompressor>> comps;
    const ModelShape shape{mc.n_layers, mc.n_kv_heads, mc.n_heads, mc.head_dim};
    for (const auto& c : cfgs)
      comps.push_back(c.is_peer ? nullptr : std::make_unique<KVCompressor>(shape, model_config(c.e8kv_spec, mc, o.at_rest)));
    std::vector<Accum> acc(cfgs.size());
    const int needles = o.niah ? static_cast<int>(o.niah_sizes.size() * o.niah_depths.size()) : 0;
    Progress prog("e8kv-eval", o.chunks + needles, Progress::mode_for_stderr(o.quiet));
    prog.message(std::to_string(cfgs.size()) + " configurations, " + std::to_string(o.chunks) + " chunks of " +
                 std::to_string(o.ctx - 1) + " + " + std::to_string(o.cont) + " tokens" +
                 (needles > 0 ? ", " + std::to_string(needles) + " needles" : "") + ", " +
                 std::to_string(model.threads()) + " threads");
    run_chunks(o, model, corpora, cfgs, comps, acc, prog);
    if (o.niah) run_niah(o, model, corpora.back(), cfgs, comps, acc, prog);
    prog.finish();
    const auto results = summarize(cfgs, acc);
    print_outputs(o, results, protocol_of(o, mc, texts, model.threads(), prog.seconds()));
    return o.check.empty() ? 0 : report_check(check, results);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\ne8kv-eval: %s\n", e.what());
    return 1;
  }
}
