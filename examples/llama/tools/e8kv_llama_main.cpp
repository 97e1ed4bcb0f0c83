// e8kv-llama: greedy generation, perplexity, tokenizer round trip and timing for GGUF Llama models.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "e8kv/error.hpp"
#include "e8kv/llama/gguf.hpp"
#include "e8kv/llama/model.hpp"

namespace {

using e8kv::llama::DenseKvBackend;
using e8kv::llama::KvBackend;
using e8kv::llama::LogitsMode;
using e8kv::llama::Model;
using e8kv::llama::PrefillCapture;
using Clock = std::chrono::steady_clock;

const char* kUsage = R"(usage: e8kv-llama [options]
  --model FILE          GGUF model (default: $E8KV_MODEL or $E8KV_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf)
  --threads N           worker threads (default: all cores)
  --info                print the model configuration
  --prompt TEXT         greedy generation from TEXT
  -n N                  tokens to generate (default 32)
  --chat                wrap the prompt in the model's chat template (special tokens parsed)
  --system TEXT         system message for --chat (default: the template's)
  --perplexity FILE     perplexity of FILE in non-overlapping windows of --ctx tokens
  --ctx N               window / context length (default 512)
  --chunks N            at most N windows (default: all)
  --roundtrip FILE      check decode(encode(text)) == text on FILE and print the token count
  --tokenize TEXT       print the token ids of TEXT
  --tokenize-file FILE  print the token ids of FILE's content (one line)
  --special             --tokenize*: text of special tokens (e.g. <|im_start|>) becomes those tokens
  --logits IDS_FILE     write the logits of the token ids in IDS_FILE (whitespace-separated) to --out
                        as raw little-endian float32 [n][vocab] (prefill; --decode: step by step
                        through DenseKvBackend)
  --out FILE            output of --logits
  --decode              see --logits
  --bench-prefill N     time a prefill of N tokens
  --bench-decode B      time batched decode steps of B sequences after a --ctx token prefill
  --steps N             decode steps for --bench-decode (default 8)
)";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw e8kv::Error("cannot read '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU seconds used by this process (all threads): with other work on the machine, wall time
// overstates the engine's cost; both are reported.
double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

int argmax(const float* v, int n) { return static_cast<int>(std::max_element(v, v + n) - v); }

// -log softmax(logits)[target] in fp64.
double nll(const float* logits, int n, int target) {
  double mx = logits[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return std::log(sum) + mx - logits[target];
}

std::vector<int32_t> sample_tokens(const Model& m, int64_t n) {
  // Real text when the corpus is present, else the model's own vocabulary in order.
  const std::string text_path = e8kv::llama::default_cache_dir() + "/text/fiction.txt";
  std::vector<int32_t> toks;
  if (std::ifstream(text_path)) {
    std::string text = read_file(text_path);
    text.resize(std::min<size_t>(text.size(), static_cast<size_t>(n) * 8));
    toks = m.tokenizer().encode(text);
  }
  for (int64_t i = static_cast<int64_t>(toks.size()); i < n; ++i) toks.push_back(static_cast<int32_t>(100 + i % 1000));
  toks.resize(n);
  return toks;
}

int run(int argc, char** argv) {
  std::string model_path = e8kv::llama::default_model_path(), prompt, system, ppl_file, roundtrip_file, tokenize_text,
              tokenize_file, logits_ids, logits_out;
  int n_predict = 32, threads = 0, ctx = 512, chunks = -1, steps = 8;
  int64_t bench_prefill = 0, bench_decode = 0;
  bool chat = false, info = false, special = false, step_decode = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw e8kv::Error("option " + a + " needs a value");
      return argv[++i];
    };
    auto number = [&]() -> long long {
      const std::string v = value();
      char* end = nullptr;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || x < 0 || x > (1ll << 40))
        throw e8kv::Error("option " + a + ": '" + v + "' is not a non-negative integer");
      return x;
    };
    if (a == "--model")
      model_path = value();
    else if (a == "--prompt")
      prompt = value();
    else if (a == "-n")
      n_predict = static_cast<int>(number());
    else if (a == "--threads")
      threads = static_cast<int>(number());
    else if (a == "--chat")
      chat = true;
    else if (a == "--system")
      system = value();
    else if (a == "--perplexity")
      ppl_file = value();
    else if (a == "--ctx")
      ctx = static_cast<int>(number());
    else if (a == "--chunks")
      chunks = static_cast<int>(number());
    else if (a == "--roundtrip")
      roundtrip_file = value();
    else if (a == "--tokenize")
      tokenize_text = value();
    else if (a == "--tokenize-file")
      tokenize_file = value();
    else if (a == "--special")
      special = true;
    else if (a == "--logits")
      logits_ids = value();
    else if (a == "--out")
      logits_out = value();
    else if (a == "--decode")
      step_decode = true;
    else if (a == "--info")
      info = true;
    else if (a == "--bench-prefill")
      bench_prefill = number();
    else if (a == "--bench-decode")
      bench_decode = number();
    else if (a == "--steps")
      steps = static_cast<int>(number());
    else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else
      throw e8kv::Error("unknown option '" + a + "'\n" + kUsage);
  }
  if (ctx < 2) throw e8kv::Error("--ctx must be at least 2");

  auto t0 = Clock::now();
  Model model = Model::load(model_path, threads);
  std::fprintf(stderr, "[e8kv-llama] loaded %s in %.2f s (%d threads)\n", model_path.c_str(), seconds_since(t0),
               model.threads());
  const auto& c = model.config();
  const auto& tok = model.tokenizer();
  bool did = false;

  if (info) {
    did = true;
    std::printf(
        "name: %s\narchitecture: %s\nlayers: %d\nembedding: %d\nfeed_forward: %d\nheads: %d\nkv_heads: %d\n"
        "head_dim: %d\nrope_dim: %d\nrope_theta: %g\nrope_scaling: %s x%g\nrms_eps: %g\nvocab: %d\n"
        "context_length: %d\ntied_embeddings: %s\ntokenizer_pre: %s\nmerges: %zu\nbos: %d\neos: %d\n",
        c.name.c_str(), c.architecture.c_str(), c.n_layers, c.n_embd, c.n_ff, c.n_heads, c.n_kv_heads, c.head_dim,
        c.rope_dim, c.rope_theta, c.rope_scaling == e8kv::llama::RopeScaling::kLinear ? "linear" : "none",
        c.rope_scaling_factor, c.rms_eps, c.vocab_size, c.context_length, c.tied_embeddings ? "yes" : "no",
        tok.pre_name().c_str(), tok.merge_count(), c.bos_id, c.eos_id);
  }

  if (!tokenize_text.empty()) {
    did = true;
    for (int32_t id : tok.encode(tokenize_text, special || chat)) std::printf("%d ", id);
    std::printf("\n");
  }
  if (!tokenize_file.empty()) {
    did = true;
    std::string line;
    for (int32_t id : tok.encode(read_file(tokenize_file), special)) line += std::to_string(id) + ' ';
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stdout);
  }

  if (!roundtrip_file.empty()) {
    did = true;
    const std::string text = read_file(roundtrip_file);
    t0 = Clock::now();
    const auto ids = tok.encode(text);
    const double te = seconds_since(t0);
    const std::string back = tok.decode(ids);
    const bool ok = back == text;
    std::printf("roundtrip %s: %zu bytes, %zu tokens, encode %.2f s, decode(encode(text)) %s\n", roundtrip_file.c_str(),
                text.size(), ids.size(), te, ok ? "== text (exact)" : "DIFFERS");
    if (!ok) return 1;
  }

  if (!logits_ids.empty()) {
    did = true;
    if (logits_out.empty()) throw e8kv::Error("--logits needs --out FILE");
    std::istringstream in(read_file(logits_ids));
    std::vector<int32_t> ids;
    for (long long v; in >> v;) ids.push_back(static_cast<int32_t>(v));
    if (ids.empty()) throw e8kv::Error("--logits: no token ids in '" + logits_ids + "'");
    std::vector<float> logits;
    t0 = Clock::now();
    if (step_decode) {
      DenseKvBackend kv(c);
      for (size_t i = 0; i < ids.size(); ++i) {
        const auto l = model.decode_step(ids[i], static_cast<int64_t>(i), kv);
        logits.insert(logits.end(), l.begin(), l.end());
      }
    } else {
      logits = model.prefill(ids);
    }
    std::ofstream out(logits_out, std::ios::binary);
    out.write(reinterpret_cast<const char*>(logits.data()),
              static_cast<std::streamsize>(logits.size() * sizeof(float)));
    if (!out) throw e8kv::Error("cannot write '" + logits_out + "'");
    std::fprintf(stderr, "[e8kv-llama] %zu x %d logits (%s) in %.2f s -> %s\n", ids.size(), c.vocab_size,
                 step_decode ? "decode steps" : "prefill", seconds_since(t0), logits_out.c_str());
  }

  if (!prompt.empty()) {
    did = true;
    const std::string text = chat ? tok.chat_prompt(prompt, system) : prompt;
    std::vector<int32_t> ids = tok.encode(text, chat);
    if (ids.empty()) throw e8kv::Error("the prompt has no tokens");
    PrefillCapture cap;
    t0 = Clock::now();
    std::vector<float> logits = model.prefill(ids, &cap, LogitsMode::kLast);
    const double tp = seconds_since(t0);
    DenseKvBackend kv = DenseKvBackend::from_capture(c, cap);
    const int32_t im_end = tok.find("<|im_end|>");
    std::string out;
    t0 = Clock::now();
    int generated = 0;
    int64_t pos = static_cast<int64_t>(ids.size());
    for (; generated < n_predict; ++generated) {
      const int32_t next = argmax(logits.data(), c.vocab_size);
      if (next == c.eos_id || next == im_end) break;
      const std::string piece = tok.decode_token(next, true);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      if (generated + 1 < n_predict) logits = model.decode_step(next, pos++, kv);
    }
    std::printf("\n");
    std::fprintf(stderr, "[e8kv-llama] prompt %zu tokens in %.3f s; %d tokens generated in %.3f s\n", ids.size(), tp,
                 generated, seconds_since(t0));
  }

  if (!ppl_file.empty()) {
    did = true;
    const auto ids = tok.encode(read_file(ppl_file));
    int64_t windows = static_cast<int64_t>(ids.size()) / ctx;
    if (chunks >= 0) windows = std::min<int64_t>(windows, chunks);
    if (windows == 0) throw e8kv::Error("--perplexity: the file has fewer than --ctx tokens");
    double total = 0;
    int64_t count = 0;
    t0 = Clock::now();
    for (int64_t w = 0; w < windows; ++w) {
      std::vector<int32_t> win(ids.begin() + w * ctx, ids.begin() + (w + 1) * ctx);
      const auto logits = model.prefill(win);
      for (int i = 1; i < ctx; ++i)
        total += nll(logits.data() + static_cast<size_t>(i - 1) * c.vocab_size, c.vocab_size, win[i]);
      count += ctx - 1;
      std::fprintf(stderr, "\r[e8kv-llama] perplexity window %lld/%lld: %.4f", static_cast<long long>(w + 1),
                   static_cast<long long>(windows), std::exp(total / count));
    }
    std::fprintf(stderr, "\n");
    std::printf("perplexity %s: %.4f over %lld windows of %d tokens (%lld scored tokens, %zu in file), %.1f s\n",
                ppl_file.c_str(), std::exp(total / count), static_cast<long long>(windows), ctx,
                static_cast<long long>(count), ids.size(), seconds_since(t0));
  }

  if (bench_prefill > 0) {
    did = true;
    const auto ids = sample_tokens(model, bench_prefill);
    model.prefill(std::vector<int32_t>(ids.begin(), ids.begin() + std::min<int64_t>(16, bench_prefill)), nullptr,
                  LogitsMode::kLast);  // warm-up
    t0 = Clock::now();
    double c0 = cpu_seconds();
    model.prefill(ids, nullptr, LogitsMode::kLast);
    const double tl = seconds_since(t0), cl = cpu_seconds() - c0;
    t0 = Clock::now();
    c0 = cpu_seconds();
    model.prefill(ids, nullptr, LogitsMode::kAll);
    const double ta = seconds_since(t0), ca = cpu_seconds() - c0;
    std::printf(
        "prefill %lld tokens, %d threads: %.2f s wall / %.2f s cpu (last logits), %.2f s wall / %.2f s cpu "
        "(all logits); %.0f tokens/s\n",
        static_cast<long long>(bench_prefill), model.threads(), tl, cl, ta, ca, bench_prefill / tl);
  }

  if (bench_decode > 0) {
    did = true;
    const auto ids = sample_tokens(model, ctx + steps);
    PrefillCapture cap;
    std::vector<int32_t> context(ids.begin(), ids.begin() + ctx);
    model.prefill(context, &cap, LogitsMode::kNone);
    std::vector<DenseKvBackend> kvs;
    for (int64_t b = 0; b < bench_decode; ++b) kvs.push_back(DenseKvBackend::from_capture(c, cap));
    std::vector<KvBackend*> ptrs;
    for (auto& k : kvs) ptrs.push_back(&k);
    double best = 1e30, total = 0;
    const double c0 = cpu_seconds();
    for (int s = 0; s < steps; ++s) {
      std::vector<int32_t> toks(bench_decode, ids[ctx + s]);
      std::vector<int64_t> pos(bench_decode, ctx + s);
      t0 = Clock::now();
      model.decode_batch(toks, pos, ptrs);
      const double t = seconds_since(t0);
      best = std::min(best, t);
      total += t;
    }
    const double cpu_step = (cpu_seconds() - c0) / steps;
    t0 = Clock::now();
    DenseKvBackend single = DenseKvBackend::from_capture(c, cap);
    for (int s = 0; s < steps; ++s) model.decode_step(ids[ctx + s], ctx + s, single);
    const double ts = seconds_since(t0) / steps;
    std::printf(
        "decode_batch %lld sequences at context %d, %d threads: %.4f s/step wall mean, %.4f s best, "
        "%.4f s cpu/step (%.1f tokens/s); decode_step single sequence: %.4f s/step\n",
        static_cast<long long>(bench_decode), ctx, model.threads(), total / steps, best, cpu_step,
        bench_decode * steps / total, ts);
  }

  if (!did) std::cout << kUsage;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "e8kv-llama: %s\n", e.what());
    return 2;
  }
}
