// e8kv-rd: rate-distortion of every codec on one or more sources, with honest rates.
//
//   e8kv-rd [--source gaussian|laplace|kv-synthetic|npy:PATH]... [--samples N] [--seed S]
//           [--csv FILE] [--svg FILE] [--codecs all|e8]
//
// gaussian / laplace: i.i.d. unit-variance 8-dim blocks through the pure block codes (no gain),
// scalar peers on the same numbers. kv-synthetic (d = 64 and 128, keys and values) and npy:PATH
// ([N, d] float32/float16 head vectors): randomized Hadamard + one fp16 gain per vector + blocks,
// so the rate includes the gain (index bits + 16/d); peers get the same rotation and pay their own
// scales. MSE is per element on unit-power data: Σ‖x − x̂‖² / Σ‖x‖².
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "e8kv/codebook/ball.hpp"
#include "e8kv/codebook/e8p.hpp"
#include "e8kv/codebook/relaxed.hpp"
#include "e8kv/codebook/rvq.hpp"
#include "e8kv/codebook/scalar.hpp"
#include "e8kv/codebook/voronoi.hpp"
#include "e8kv/error.hpp"
#include "e8kv/quant/vector_quantizer.hpp"
#include "testing/synthetic_kv.hpp"
#include "e8kv/transform/hadamard.hpp"
#include "npy.hpp"

namespace {
using namespace e8kv;

struct Row {
  std::string source, codec;
  double bits = 0, mse = 0;
  std::string note;
  double sqnr() const { return 10.0 * std::log10(1.0 / mse); }
  double gap() const { return 6.0206 * bits - sqnr(); }
};

// A dataset: n vectors of dimension d (d = 8 for the pure block sources), unit power overall.
struct Dataset {
  std::string name;
  int d = 8;
  bool blocks = true;  // pure block-code source (no gain, no rotation)
  std::vector<float> x;
  size_t n() const { return x.size() / static_cast<size_t>(d); }
};

class Progress {
 public:
  explicit Progress(size_t total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  void step(const std::string& what) {
    ++done_;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (s > 2.0 || shown_) {
      shown_ = true;
      std::fprintf(stderr, "\r[e8kv-rd] %3zu/%zu %-40s %6.1f s", done_, total_, what.c_str(), s);
      if (done_ == total_) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    }
  }

 private:
  size_t total_, done_ = 0;
  std::chrono::steady_clock::time_point start_;
  bool shown_ = false;
};

double mse_of(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    den += double(x[i]) * x[i];
  }
  return num / den;
}

void normalize_power(std::vector<float>& x) {
  double p = 0;
  for (float v : x) p += double(v) * v;
  const float s = static_cast<float>(1.0 / std::sqrt(p / static_cast<double>(x.size())));
  for (auto& v : x) v *= s;
}

// ---- codecs on a dataset -------------------------------------------------------------------

template <class Code>
Row block_code_row(const Dataset& ds, const char* name) {
  std::vector<float> y(ds.x.size());
  Row r{ds.name, name, static_cast<double>(Code::kIndexBits) / 8.0, 0, ""};
  if (ds.blocks) {
    for (size_t b = 0; b < ds.x.size() / 8; ++b) Code::decode(Code::encode(&ds.x[8 * b]), &y[8 * b]);
  } else {
    // Head vectors: rotation + gain + blocks (what the cache stores), rotated back.
    const transform::RandomizedHadamard rot(ds.d, 0x5EEDull);
    std::vector<float> t(static_cast<size_t>(ds.d));
    std::vector<uint8_t> codes(static_cast<size_t>(ds.d / 8 * Code::kIndexBits / 8));
    for (size_t v = 0; v < ds.n(); ++v) {
      rot.forward(&ds.x[v * ds.d], t.data());
      uint16_t gain = 0;
      quant::encode_vector<Code>(t.data(), ds.d, 1.0f, quant::GainPolicy::kLeastSquares, codes.data(), &gain);
      quant::decode_vector<Code>(codes.data(), gain, ds.d, t.data());
      rot.inverse(t.data(), &y[v * ds.d]);
    }
    r.bits += 16.0 / ds.d;
  }
  r.mse = mse_of(ds.x, y);
  return r;
}

// Rotate (for head-vector sources) then run f on the rotated data and rotate back.
Row rotated_row(const Dataset& ds, const char* name, double bits,
                const std::function<void(const std::vector<float>&, std::vector<float>&)>& f) {
  std::vector<float> in = ds.x, out(ds.x.size());
  std::unique_ptr<transform::RandomizedHadamard> rot;
  if (!ds.blocks) {
    rot = std::make_unique<transform::RandomizedHadamard>(ds.d, 0x5EEDull);
    rot->forward_batch(ds.x.data(), in.data(), ds.n(), static_cast<size_t>(ds.d));
  }
  f(in, out);
  if (rot) rot->inverse_batch(out.data(), out.data(), ds.n(), static_cast<size_t>(ds.d));
  Row r{ds.name, name, bits, mse_of(ds.x, out), ""};
  return r;
}

std::vector<Row> run_source(const Dataset& ds, bool e8_only, Progress* progress) {
  using namespace codebook;
  std::vector<std::function<Row()>> jobs;
  jobs.push_back([&] { return block_code_row<E8P>(ds, "e8p"); });
  jobs.push_back([&] { return block_code_row<Rvq3>(ds, "rvq3"); });
  jobs.push_back([&] { return block_code_row<Rvq4>(ds, "rvq4"); });
  jobs.push_back([&] { return block_code_row<Ball3>(ds, "ball3"); });
  jobs.push_back([&] { return block_code_row<Ball4>(ds, "ball4"); });
  jobs.push_back([&] { return block_code_row<Voronoi<1>>(ds, "voronoi1"); });
  jobs.push_back([&] { return block_code_row<Voronoi<2>>(ds, "voronoi2"); });
  jobs.push_back([&] { return block_code_row<Voronoi<3>>(ds, "voronoi3"); });
  jobs.push_back([&] { return block_code_row<Voronoi<4>>(ds, "voronoi4"); });
  if (!e8_only) {
    jobs.push_back([&] { return block_code_row<LloydMax<2>>(ds, "lloydmax2"); });
    jobs.push_back([&] { return block_code_row<LloydMax<3>>(ds, "lloydmax3"); });
    jobs.push_back([&] { return block_code_row<LloydMax<4>>(ds, "lloydmax4"); });
    jobs.push_back([&] { return block_code_row<UniformScalar<2>>(ds, "uniform2"); });
    jobs.push_back([&] { return block_code_row<UniformScalar<3>>(ds, "uniform3"); });
    jobs.push_back([&] { return block_code_row<UniformScalar<4>>(ds, "uniform4"); });
    const bool vec = !ds.blocks;
    const char* rot = vec ? "rotated-" : "";
    for (int q : {4, 8}) {
      jobs.push_back([&, q, rot] {
        const std::string name = std::string(rot) + (q == 4 ? "q4_0" : "q8_0");
        return rotated_row(ds, name.c_str(), q == 4 ? kQ4_0BitsPerElement : kQ8_0BitsPerElement,
                           [q](const std::vector<float>& in, std::vector<float>& out) {
                             const size_t n = in.size() / 32 * 32;
                             std::vector<uint8_t> buf(q == 4 ? q4_0_bytes(n) : q8_0_bytes(n));
                             if (q == 4) {
                               encode_q4_0(in.data(), n, buf.data());
                               decode_q4_0(buf.data(), n, out.data());
                             } else {
                               encode_q8_0(in.data(), n, buf.data());
                               decode_q8_0(buf.data(), n, out.data());
                             }
                             std::copy(in.begin() + n, in.end(), out.begin() + n);
                           });
      });
    }
    // KIVI: grouped asymmetric scalar, group 32, fp16 scale + zero per group (per token here;
    // on gaussian the 8-blocks are read as rows of 32).
    for (int b : {2, 4}) {
      jobs.push_back([&, b] {
        const int dim = ds.blocks ? 32 : ds.d;
        const int tokens = static_cast<int>(ds.x.size() / dim);
        const double bits = 8.0 * kivi_bytes(KiviAxis::kPerToken, tokens, dim, b) / (double(tokens) * dim);
        std::vector<float> y(ds.x.size());
        const auto q = kivi_quantize_values(ds.x.data(), tokens, dim, b);
        kivi_dequantize(q, y.data());
        Row r{ds.name, "kivi" + std::to_string(b), bits, mse_of(ds.x, y), "per-token groups of 32"};
        return r;
      });
    }
    // TurboQuant-style: rotation + per-vector fp16 norm + Lloyd-Max per coordinate.
    for (int b : {2, 3, 4}) {
      jobs.push_back([&, b, rot] {
        const int dim = ds.blocks ? 128 : ds.d;
        const std::string name = std::string(rot) + "lloydmax-vec" + std::to_string(b);
        return rotated_row(ds, name.c_str(), b + 16.0 / dim, [b, dim](const std::vector<float>& in, std::vector<float>& out) {
          std::vector<uint8_t> buf(64 + static_cast<size_t>(dim));
          for (size_t v = 0; v + dim <= in.size(); v += static_cast<size_t>(dim)) {
            if (b == 2) { LloydMaxVector<2>::encode(&in[v], dim, buf.data()); LloydMaxVector<2>::decode(buf.data(), dim, &out[v]); }
            if (b == 3) { LloydMaxVector<3>::encode(&in[v], dim, buf.data()); LloydMaxVector<3>::decode(buf.data(), dim, &out[v]); }
            if (b == 4) { LloydMaxVector<4>::encode(&in[v], dim, buf.data()); LloydMaxVector<4>::decode(buf.data(), dim, &out[v]); }
          }
        });
      });
    }
    // The reference project's relaxed-parity quantizer: per-vector amax scale (fp16) and its
    // `levels`; no fixed-rate index exists, so its rate is an empirical entropy of its symbols.
    for (int levels : {4, 8, 16}) {
      jobs.push_back([&, levels] {
        const int dim = ds.blocks ? 128 : ds.d;
        std::vector<float> in = ds.x;
        std::unique_ptr<transform::RandomizedHadamard> rot_p;
        if (!ds.blocks) {
          rot_p = std::make_unique<transform::RandomizedHadamard>(ds.d, 0x5EEDull);
          rot_p->forward_batch(ds.x.data(), in.data(), ds.n(), static_cast<size_t>(ds.d));
        }
        const size_t vectors = in.size() / static_cast<size_t>(dim);
        RelaxedOptions o;
        o.levels = levels;
        const auto codes = relaxed_quantize(in.data(), vectors, dim, o);
        std::vector<float> out(in.size());
        relaxed_dequantize(codes, out.data());
        if (rot_p) rot_p->inverse_batch(out.data(), out.data(), ds.n(), static_cast<size_t>(ds.d));
        const auto ent = relaxed_empirical_entropy(in.data(), vectors, dim, o);
        Row r{ds.name, "relaxed-L" + std::to_string(levels), ent.coset_conditional_bits + ent.scale_bits,
              mse_of(ds.x, out),
              "no fixed-rate index: rate = empirical entropy (coset flag + per-coordinate) + fp16 scale; "
              "fixed-length code needs " + std::to_string(ent.fixed_rate_bits) + " b/elem"};
        return r;
      });
    }
  }
  std::vector<Row> rows;
  for (auto& j : jobs) {
    rows.push_back(j());
    if (progress) progress->step(ds.name + " " + rows.back().codec);
  }
  return rows;
}

// ---- sources ---------------------------------------------------------------------------------

Dataset gaussian(size_t blocks, uint64_t seed, bool laplace) {
  Dataset ds;
  ds.name = laplace ? "laplace" : "gaussian";
  ds.x.resize(blocks * 8);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::exponential_distribution<float> e(std::sqrt(2.0f));  // Laplace(b = 1/√2): unit variance
  std::bernoulli_distribution sign(0.5);
  for (auto& v : ds.x) v = laplace ? (sign(rng) ? 1.f : -1.f) * e(rng) : g(rng);
  return ds;
}

std::vector<Dataset> kv_synthetic(size_t blocks, uint64_t seed) {
  std::vector<Dataset> out;
  for (int d : {64, 128}) {
    synth::SyntheticSpec s;
    s.head_dim = d;
    s.n_layers = 1;
    s.n_kv_heads = 4;
    s.n_q_heads = 4;
    s.tokens = static_cast<int>(std::max<size_t>(64, blocks * 8 / d / 4));
    s.seed = seed;
    const auto kv = synth::make_synthetic_kv(s);
    for (int which = 0; which < 2; ++which) {
      Dataset ds;
      ds.name = "kv-synthetic-d" + std::to_string(d) + (which == 0 ? "-keys" : "-values");
      ds.d = d;
      ds.blocks = false;
      ds.x = which == 0 ? kv.keys[0] : kv.values[0];
      normalize_power(ds.x);
      out.push_back(std::move(ds));
    }
  }
  return out;
}

Dataset npy_source(const std::string& path, size_t max_vectors) {
  const auto a = e8kv::bench::load_npy_2d(path);
  require(a.cols % 8 == 0 && transform::is_supported_hadamard_dim(static_cast<int>(a.cols)),
          "npy:" + path + ": head dimension " + std::to_string(a.cols) + " is not supported; accepted: " +
              transform::supported_hadamard_dims());
  Dataset ds;
  ds.name = "npy:" + path.substr(path.find_last_of('/') + 1);
  ds.d = static_cast<int>(a.cols);
  ds.blocks = false;
  const size_t n = std::min(a.rows, max_vectors);
  ds.x.assign(a.data.begin(), a.data.begin() + static_cast<ptrdiff_t>(n * a.cols));
  for (float v : ds.x) require(std::isfinite(v), "npy:" + path + ": non-finite value");
  normalize_power(ds.x);
  return ds;
}

// ---- output ------------------------------------------------------------------------------------

void print_table(const std::vector<Row>& rows) {
  std::printf("%-26s %-22s %8s %10s %9s %9s\n", "source", "codec", "bits/el", "mse", "sqnr_dB", "gap_dB");
  std::string last;
  for (const auto& r : rows) {
    if (r.source != last && !last.empty()) std::printf("\n");
    last = r.source;
    std::printf("%-26s %-22s %8.4f %10.6f %9.3f %9.3f%s%s\n", r.source.c_str(), r.codec.c_str(), r.bits, r.mse,
                r.sqnr(), r.gap(), r.note.empty() ? "" : "  # ", r.note.c_str());
  }
}

void write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  require(f.good(), "--csv: cannot write " + path);
  f << "source,codec,bits_per_element,mse,sqnr_db,shannon_gap_db\n";
  char buf[256];
  for (const auto& r : rows) {
    std::snprintf(buf, sizeof buf, "%s,%s,%.6f,%.8f,%.4f,%.4f\n", r.source.c_str(), r.codec.c_str(), r.bits, r.mse,
                  r.sqnr(), r.gap());
    f << buf;
  }
}

std::string family(const std::string& codec) {
  for (const char* f : {"e8p", "rvq", "ball", "voronoi", "lloydmax-vec", "rotated-lloydmax-vec", "lloydmax", "uniform",
                        "kivi", "relaxed", "q4_0", "q8_0", "rotated-q4_0", "rotated-q8_0"})
    if (codec.rfind(f, 0) == 0) return f;
  return codec;
}

void write_svg(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  require(f.good(), "--svg: cannot write " + path);
  std::vector<std::string> sources;
  for (const auto& r : rows)
    if (std::find(sources.begin(), sources.end(), r.source) == sources.end()) sources.push_back(r.source);
  const int W = 760, H = 440, ml = 60, mr = 190, mt = 40, mb = 50;
  const double xmax = 9.0, ymax = 50.0;
  f << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H * sources.size()
    << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  const std::map<std::string, std::string> colour = {
      {"e8p", "#d62728"}, {"rvq", "#ff7f0e"}, {"ball", "#8c1d1d"}, {"voronoi", "#e377c2"},
      {"lloydmax", "#1f77b4"}, {"uniform", "#17becf"}, {"lloydmax-vec", "#2ca02c"}, {"rotated-lloydmax-vec", "#2ca02c"},
      {"kivi", "#9467bd"}, {"relaxed", "#7f7f7f"}, {"q4_0", "#bcbd22"}, {"q8_0", "#bcbd22"},
      {"rotated-q4_0", "#bcbd22"}, {"rotated-q8_0", "#bcbd22"}};
  for (size_t s = 0; s < sources.size(); ++s) {
    const int y0 = static_cast<int>(s) * H;
    auto px = [&](double b) { return ml + (W - ml - mr) * b / xmax; };
    auto py = [&](double db) { return y0 + mt + (H - mt - mb) * (1.0 - db / ymax); };
    f << "<text x='" << ml << "' y='" << y0 + 24 << "' font-size='15'>" << sources[s]
      << ": SQNR vs honest bits per element (higher and further left is better)</text>\n";
    for (int b = 0; b <= 9; ++b)
      f << "<line x1='" << px(b) << "' y1='" << py(0) << "' x2='" << px(b) << "' y2='" << py(ymax)
        << "' stroke='#eee'/><text x='" << px(b) - 4 << "' y='" << py(0) + 16 << "'>" << b << "</text>\n";
    for (int db = 0; db <= 50; db += 10)
      f << "<line x1='" << px(0) << "' y1='" << py(db) << "' x2='" << px(xmax) << "' y2='" << py(db)
        << "' stroke='#eee'/><text x='" << ml - 28 << "' y='" << py(db) + 4 << "'>" << db << "</text>\n";
    f << "<text x='" << px(4) << "' y='" << py(0) + 34 << "'>bits per element</text>\n";
    f << "<text x='14' y='" << py(25) << "' transform='rotate(-90 14 " << py(25) << ")'>SQNR (dB)</text>\n";
    // Shannon bound for a Gaussian source: 6.02 dB per bit.
    f << "<line x1='" << px(0) << "' y1='" << py(0) << "' x2='" << px(ymax / 6.0206) << "' y2='" << py(ymax)
      << "' stroke='black' stroke-dasharray='5,4'/>\n";
    std::map<std::string, std::vector<const Row*>> fams;
    for (const auto& r : rows)
      if (r.source == sources[s]) fams[family(r.codec)].push_back(&r);
    int legend = 0;
    f << "<text x='" << W - mr + 10 << "' y='" << y0 + mt + 4 << "'>- - Shannon bound (Gaussian)</text>\n";
    for (auto& [fam, pts] : fams) {
      std::sort(pts.begin(), pts.end(), [](const Row* a, const Row* b) { return a->bits < b->bits; });
      const std::string c = colour.count(fam) ? colour.at(fam) : "#333";
      f << "<polyline fill='none' stroke='" << c << "' stroke-width='2' points='";
      for (auto* p : pts)
        if (p->bits <= xmax) f << px(p->bits) << "," << py(std::min(ymax, p->sqnr())) << " ";
      f << "'/>\n";
      for (auto* p : pts)
        if (p->bits <= xmax)
          f << "<circle cx='" << px(p->bits) << "' cy='" << py(std::min(ymax, p->sqnr())) << "' r='3.5' fill='" << c
            << "'><title>" << p->codec << ": " << p->bits << " b, " << p->sqnr() << " dB</title></circle>\n";
      ++legend;
      f << "<circle cx='" << W - mr + 14 << "' cy='" << y0 + mt + 4 + 18 * legend - 4 << "' r='4' fill='" << c
        << "'/><text x='" << W - mr + 24 << "' y='" << y0 + mt + 4 + 18 * legend << "'>" << fam << "</text>\n";
    }
  }
  f << "</svg>\n";
}

int usage() {
  std::fprintf(stderr,
               "usage: e8kv-rd [--source gaussian|laplace|kv-synthetic|npy:PATH]... [--samples N] [--seed S]\n"
               "               [--csv FILE] [--svg FILE] [--codecs all|e8]\n"
               "  defaults: --source gaussian --samples 200000 (8-dim blocks) --seed 1\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> sources;
    size_t samples = 200000;
    uint64_t seed = 1;
    std::string csv, svg;
    bool e8_only = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw Error("missing value after " + a);
        return argv[++i];
      };
      if (a == "--source") sources.push_back(next());
      else if (a == "--samples") samples = std::stoull(next());
      else if (a == "--seed") seed = std::stoull(next());
      else if (a == "--csv") csv = next();
      else if (a == "--svg") svg = next();
      else if (a == "--codecs") {
        const std::string v = next();
        require(v == "all" || v == "e8", "--codecs: accepted all, e8");
        e8_only = v == "e8";
      } else if (a == "-h" || a == "--help") return usage();
      else throw Error("unknown argument '" + a + "'");
    }
    require(samples >= 64, "--samples must be >= 64");
    if (sources.empty()) sources.push_back("gaussian");
    std::vector<Dataset> data;
    for (const auto& s : sources) {
      if (s == "gaussian") data.push_back(gaussian(samples, seed, false));
      else if (s == "laplace") data.push_back(gaussian(samples, seed, true));
      else if (s == "kv-synthetic") for (auto& d : kv_synthetic(samples, seed)) data.push_back(std::move(d));
      else if (s.rfind("npy:", 0) == 0) data.push_back(npy_source(s.substr(4), samples * 8));
      else throw Error("--source '" + s + "' is unknown; accepted: gaussian, laplace, kv-synthetic, npy:PATH");
    }
    std::printf("# e8kv-rd: samples=%zu seed=%llu\n", samples, static_cast<unsigned long long>(seed));
    std::printf("# reference, i.i.d. N(0,1): Shannon D(R) = 2^-2R; Lloyd-Max scalar (exact integrals)\n");
    for (int b = 2; b <= 4; ++b) {
      const double shannon = std::pow(2.0, -2.0 * b);
      const double lm = codebook::gaussian_scalar_mse(codebook::lloyd_max_gaussian_levels(1 << b));
      std::printf("#   %d bits: Shannon mse %.6f (%.2f dB)   Lloyd-Max mse %.6f (%.2f dB)\n", b, shannon,
                  -10 * std::log10(shannon), lm, -10 * std::log10(lm));
    }
    const size_t jobs = data.size() * (e8_only ? 9 : 25);
    Progress progress(jobs);
    std::vector<Row> rows;
    for (const auto& d : data) {
      auto r = run_source(d, e8_only, &progress);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    print_table(rows);
    if (!csv.empty()) write_csv(csv, rows);
    if (!svg.empty()) write_svg(svg, rows);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "e8kv-rd: %s\n", e.what());
    return 1;
  }
}
