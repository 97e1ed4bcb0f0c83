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
// --svg: per source, the gap to the Shannon bound against bits per element (1.5-5 b) next to
// SQNR over all rates; one colour and marker per codec family, the legend names its tier.
// Progress on stderr: a bar on a terminal, one line per source otherwise; --quiet: none.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "progress.hpp"
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

// A bar on a terminal, one line per source in a log, nothing with --quiet (bench/common/progress.hpp).
using Progress = e8kv::bench::Progress;

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
  for (size_t k = 0; k < jobs.size(); ++k) {
    rows.push_back(jobs[k]());
    if (progress) progress->update(ds.name + " " + rows.back().codec, static_cast<double>(k + 1) / jobs.size());
  }
  if (progress) progress->unit_done(ds.name + " (" + std::to_string(jobs.size()) + " codecs)");
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

// ---- SVG ---------------------------------------------------------------------------------------
// One row per source: the gap to the Shannon bound against bits per element over 1.5-5 bits (the
// view used to compare quantizers: the bound is a horizontal line at 0 and codecs at different
// rates compare directly), and next to it SQNR over 0-9 bits (every codec, q8_0 included). Each
// codec family has its own colour and marker in both; the legend names its tier.

struct CodecStyle {
  const char* family;  // codec name prefix (after an optional "rotated-")
  const char* what;    // legend text after the family name
  const char* tier;    // fast / quality / table-free (e8kv codes) or peer
  const char* colour;
  char marker;  // o circle, s square, d diamond, ^ v triangles, h hexagon, x, +, O S D hollow
};

// Longest prefix first where one family name starts another (lloydmax-vec before lloydmax).
const CodecStyle kCodecStyles[] = {
    {"e8p", "E8P, 2 b", "fast + quality", "#d62728", 'o'},
    {"rvq", "two-stage E8P", "fast", "#ff7f0e", 's'},
    {"ball", "E8 ball, leader index", "quality", "#8c564b", 'd'},
    {"voronoi", "E8 / 2^k E8", "table-free", "#e377c2", 'h'},
    {"lloydmax-vec", "TurboQuant-style", "peer", "#2ca02c", 'x'},
    {"lloydmax", "scalar Lloyd-Max", "peer", "#1f77b4", '^'},
    {"uniform", "scalar uniform", "peer", "#17becf", 'v'},
    {"kivi", "KIVI, groups of 32", "peer", "#9467bd", '+'},
    {"relaxed", "relaxed parity, entropy rate", "peer", "#7f7f7f", 'O'},
    {"q4_0", "llama.cpp", "peer", "#bcbd22", 'S'},
    {"q8_0", "llama.cpp", "peer", "#393b79", 'D'},
};

const CodecStyle& style_of(const std::string& codec) {
  const std::string name = codec.rfind("rotated-", 0) == 0 ? codec.substr(8) : codec;
  for (const auto& st : kCodecStyles)
    if (name.rfind(st.family, 0) == 0) return st;
  static const CodecStyle other{"other", "", "peer", "#000000", 'o'};
  return other;
}

// The family as it appears in this source's rows ("rotated-q4_0" on head-vector sources).
std::string family(const std::string& codec) {
  const CodecStyle& st = style_of(codec);
  return codec.rfind("rotated-", 0) == 0 ? "rotated-" + std::string(st.family) : st.family;
}

bool is_e8kv(const CodecStyle& st) { return std::strcmp(st.tier, "peer") != 0; }

std::string fmt(double v, int decimals = 1) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

void marker(std::ostream& f, char shape, double x, double y, const std::string& colour, double r = 4.5) {
  const bool hollow = shape == 'O' || shape == 'S' || shape == 'D';
  const std::string paint = hollow ? "fill='white' stroke='" + colour + "' stroke-width='1.8'"
                                   : "fill='" + colour + "' stroke='white' stroke-width='0.6'";
  auto polygon = [&](std::initializer_list<std::pair<double, double>> pts) {
    f << "<polygon " << paint << " points='";
    for (const auto& [dx, dy] : pts) f << fmt(x + dx * r, 2) << "," << fmt(y + dy * r, 2) << " ";
    f << "'/>";
  };
  switch (shape) {
    case 'o': case 'O': f << "<circle cx='" << fmt(x, 2) << "' cy='" << fmt(y, 2) << "' r='" << r << "' " << paint << "/>"; break;
    case 's': case 'S': polygon({{-0.85, -0.85}, {0.85, -0.85}, {0.85, 0.85}, {-0.85, 0.85}}); break;
    case 'd': case 'D': polygon({{0, -1.25}, {1.1, 0}, {0, 1.25}, {-1.1, 0}}); break;
    case '^': polygon({{0, -1.2}, {1.1, 0.8}, {-1.1, 0.8}}); break;
    case 'v': polygon({{0, 1.2}, {1.1, -0.8}, {-1.1, -0.8}}); break;
    case 'h': polygon({{1, 0}, {0.5, 0.87}, {-0.5, 0.87}, {-1, 0}, {-0.5, -0.87}, {0.5, -0.87}}); break;
    case 'x': case '+': {
      const double a = shape == 'x' ? 0.9 * r : 1.2 * r;
      const auto line = [&](double x1, double y1, double x2, double y2) {
        f << "<line x1='" << fmt(x1, 2) << "' y1='" << fmt(y1, 2) << "' x2='" << fmt(x2, 2) << "' y2='" << fmt(y2, 2)
          << "' stroke='" << colour << "' stroke-width='2.4'/>";
      };
      if (shape == 'x') { line(x - a, y - a, x + a, y + a); line(x - a, y + a, x + a, y - a); }
      else { line(x - a, y, x + a, y); line(x, y - a, x, y + a); }
      break;
    }
  }
}

// One panel: axes, grid, the codecs' polylines and markers; `value` maps a row to its y value.
struct Panel {
  double left, top, width, height, x0, x1, y0, y1, x_step, y_step;
  double px(double v) const { return left + width * (v - x0) / (x1 - x0); }
  double py(double v) const { return top + height * (1.0 - (v - y0) / (y1 - y0)); }
  bool inside_x(double v) const { return v >= x0 - 1e-9 && v <= x1 + 1e-9; }
};

void draw_axes(std::ostream& f, const Panel& p, const std::string& xlabel, const std::string& ylabel) {
  f << "<rect x='" << p.left << "' y='" << p.top << "' width='" << p.width << "' height='" << p.height
    << "' fill='none' stroke='#999'/>\n";
  for (double v = p.x0; v <= p.x1 + 1e-9; v += p.x_step)
    f << "<line x1='" << fmt(p.px(v), 1) << "' y1='" << p.top << "' x2='" << fmt(p.px(v), 1) << "' y2='"
      << p.top + p.height << "' stroke='#e6e6e6'/><text x='" << fmt(p.px(v), 1) << "' y='" << p.top + p.height + 16
      << "' text-anchor='middle'>" << fmt(v, std::fabs(v - std::round(v)) < 1e-9 ? 0 : 1) << "</text>\n";
  for (double v = p.y0; v <= p.y1 + 1e-9; v += p.y_step)
    f << "<line x1='" << p.left << "' y1='" << fmt(p.py(v), 1) << "' x2='" << p.left + p.width << "' y2='"
      << fmt(p.py(v), 1) << "' stroke='#e6e6e6'/><text x='" << p.left - 6 << "' y='" << fmt(p.py(v) + 4, 1)
      << "' text-anchor='end'>" << fmt(v, 0) << "</text>\n";
  f << "<text x='" << p.left + p.width / 2 << "' y='" << p.top + p.height + 34 << "' text-anchor='middle'>" << xlabel
    << "</text>\n";
  const double cy = p.top + p.height / 2, cx = p.left - 36;
  f << "<text x='" << cx << "' y='" << cy << "' text-anchor='middle' transform='rotate(-90 " << cx << " " << cy << ")'>"
    << ylabel << "</text>\n";
}

void draw_codecs(std::ostream& f, const Panel& p, const std::map<std::string, std::vector<const Row*>>& fams,
                 double (*value)(const Row&)) {
  for (const auto& [fam, pts] : fams) {
    const CodecStyle& st = style_of(pts.front()->codec);
    std::vector<const Row*> shown;
    for (const Row* r : pts)
      if (p.inside_x(r->bits)) shown.push_back(r);
    if (shown.empty()) continue;
    const auto y_of = [&](const Row* r) { return p.py(std::min(p.y1, std::max(p.y0, value(*r)))); };
    const auto clipped = [&](const Row* r) { return value(*r) > p.y1 || value(*r) < p.y0; };
    // Lines join neighbouring points that are both in view (a clipped one would draw a false slope).
    for (size_t i = 1; i < shown.size(); ++i)
      if (!clipped(shown[i - 1]) && !clipped(shown[i]))
        f << "<line x1='" << fmt(p.px(shown[i - 1]->bits), 1) << "' y1='" << fmt(y_of(shown[i - 1]), 1) << "' x2='"
          << fmt(p.px(shown[i]->bits), 1) << "' y2='" << fmt(y_of(shown[i]), 1) << "' stroke='" << st.colour
          << "' stroke-width='" << (is_e8kv(st) ? 2.2 : 1.4) << "'" << (is_e8kv(st) ? "" : " stroke-dasharray='5,3'")
          << "/>\n";
    for (const Row* r : shown) {
      f << "<g><title>" << r->codec << ": " << fmt(r->bits, 3) << " b, " << fmt(r->sqnr(), 2) << " dB SQNR, gap "
        << fmt(r->gap(), 2) << " dB</title>";
      marker(f, st.marker, p.px(r->bits), y_of(r), st.colour);
      f << "</g>\n";
      if (clipped(r))  // on the edge of the view: print the real value under (or over) the marker
        f << "<text x='" << fmt(p.px(r->bits), 1) << "' y='" << fmt(y_of(r) + (value(*r) > p.y1 ? 18 : -9), 1)
          << "' text-anchor='middle' font-size='10' fill='" << st.colour << "'>" << r->codec << " "
          << fmt(value(*r), 1) << (value(*r) > p.y1 ? "&#8593;" : "&#8595;") << "</text>\n";
    }
  }
}

double gap_of(const Row& r) { return r.gap(); }
double sqnr_of(const Row& r) { return r.sqnr(); }

void write_svg(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  require(f.good(), "--svg: cannot write " + path);
  std::vector<std::string> sources;
  for (const auto& r : rows)
    if (std::find(sources.begin(), sources.end(), r.source) == sources.end()) sources.push_back(r.source);
  const int W = 1400, H = 490;
  f << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H * sources.size()
    << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  for (size_t s = 0; s < sources.size(); ++s) {
    const double y0 = static_cast<double>(s) * H;
    std::map<std::string, std::vector<const Row*>> fams;
    for (const auto& r : rows)
      if (r.source == sources[s]) fams[family(r.codec)].push_back(&r);
    for (auto& [fam, pts] : fams)
      std::sort(pts.begin(), pts.end(), [](const Row* a, const Row* b) { return a->bits < b->bits; });

    // Gap view: 1.5-5 bits; the y range fits the gaps shown (whole dB, 0 dB always in view) up to
    // 8 dB, so the codecs within a few dB of the bound stay apart; a larger gap (KIVI-2, about
    // 10-13 dB) sits on the top edge with its value printed.
    Panel gap{80, y0 + 62, 500, 330, 1.5, 5.0, 0, 0, 0.5, 1};
    double lo = 0, hi = 4;
    for (const auto& r : rows)
      if (r.source == sources[s] && gap.inside_x(r.bits)) {
        lo = std::min(lo, r.gap());
        hi = std::max(hi, r.gap());
      }
    gap.y0 = std::floor(lo);
    gap.y1 = std::min(8.0, std::ceil(hi + 0.3));
    gap.y_step = gap.y1 - gap.y0 > 10 ? 2 : 1;
    f << "<text x='" << gap.left - 60 << "' y='" << y0 + 24 << "' font-size='16' font-weight='bold'>" << sources[s]
      << "</text>\n<text x='" << gap.left << "' y='" << y0 + 48
      << "' font-size='13'>gap to the Shannon bound, 6.02&#183;R &#8722; SQNR (dB): lower is better</text>\n";
    draw_axes(f, gap, "bits per element (honest: index + gains + scales)", "gap to Shannon bound (dB)");
    f << "<line x1='" << gap.left << "' y1='" << fmt(gap.py(0), 1) << "' x2='" << gap.left + gap.width << "' y2='"
      << fmt(gap.py(0), 1) << "' stroke='black' stroke-width='1.5'/><text x='" << gap.left + gap.width - 4 << "' y='"
      << fmt(gap.py(0) - 5, 1) << "' text-anchor='end' font-size='11'>Shannon bound, Gaussian D(R) = 2^-2R</text>\n";
    draw_codecs(f, gap, fams, gap_of);
    std::string off;  // codecs whose rate is outside the gap view
    for (const auto& r : rows)
      if (r.source == sources[s] && !gap.inside_x(r.bits))
        off += (off.empty() ? "" : ", ") + r.codec + " (" + fmt(r.bits, 2) + " b, " + fmt(r.gap(), 1) + " dB)";
    if (!off.empty())
      f << "<text x='" << gap.left << "' y='" << y0 + H - 16 << "' font-size='11' fill='#555'>outside 1.5-5 b: " << off
        << "</text>\n";
    if (sources[s] != "gaussian")
      f << "<text x='" << gap.left << "' y='" << y0 + H - 30 << "' font-size='11' fill='#555'>not Gaussian: the bound "
        << "is the Gaussian one at equal variance, above this source's D(R), so a gap may be negative</text>\n";

    // SQNR view: every codec, 0-9 bits.
    const Panel sq{690, y0 + 62, 330, 330, 0, 9, 0, 50, 1, 10};
    f << "<text x='" << sq.left << "' y='" << y0 + 48 << "' font-size='13'>SQNR (dB), all rates: higher is better</text>\n";
    draw_axes(f, sq, "bits per element", "SQNR (dB)");
    f << "<line x1='" << sq.px(0) << "' y1='" << sq.py(0) << "' x2='" << fmt(sq.px(50 / 6.0206), 1) << "' y2='"
      << sq.py(50) << "' stroke='black' stroke-dasharray='5,4'/>\n";
    draw_codecs(f, sq, fams, sqnr_of);

    // Legend: e8kv codes by tier first, then the peers.
    double ly = y0 + 70;
    const double lx = 1050;
    f << "<line x1='" << lx << "' y1='" << ly - 4 << "' x2='" << lx + 22 << "' y2='" << ly - 4
      << "' stroke='black' stroke-width='1.5'/><text x='" << lx + 30 << "' y='" << ly
      << "'>Shannon bound (0 dB left, dashed right)</text>\n";
    for (const bool e8 : {true, false}) {
      ly += 26;
      f << "<text x='" << lx << "' y='" << ly << "' font-weight='bold'>" << (e8 ? "e8kv (tier)" : "peers")
        << "</text>\n";
      for (const auto& want : kCodecStyles)  // in the table's order, not the map's
        for (const auto& [fam, pts] : fams) {
          const CodecStyle& st = style_of(pts.front()->codec);
          if (&st != &want || is_e8kv(st) != e8) continue;
          ly += 20;
          f << "<line x1='" << lx << "' y1='" << ly - 4 << "' x2='" << lx + 22 << "' y2='" << ly - 4 << "' stroke='"
            << st.colour << "' stroke-width='" << (e8 ? 2.2 : 1.4) << "'" << (e8 ? "" : " stroke-dasharray='5,3'")
            << "/>";
          marker(f, st.marker, lx + 11, ly - 4, st.colour);
          f << "<text x='" << lx + 30 << "' y='" << ly << "'>" << fam << " <tspan fill='#555'>"
            << (e8 ? std::string(st.tier) + ": " : "") << st.what << "</tspan></text>\n";
        }
    }
  }
  f << "</svg>\n";
}

int usage() {
  std::fprintf(stderr,
               "usage: e8kv-rd [--source gaussian|laplace|kv-synthetic|npy:PATH]... [--samples N] [--seed S]\n"
               "               [--csv FILE] [--svg FILE] [--codecs all|e8] [--quiet]\n"
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
    bool e8_only = false, quiet = false;
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
      else if (a == "--quiet") quiet = true;
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
    Progress progress("e8kv-rd", static_cast<int>(data.size()), Progress::mode_for_stderr(quiet));
    std::vector<Row> rows;
    for (const auto& d : data) {
      auto r = run_source(d, e8_only, &progress);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    progress.finish();
    print_table(rows);
    if (!csv.empty()) write_csv(csv, rows);
    if (!svg.empty()) write_svg(svg, rows);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "e8kv-rd: %s\n", e.what());
    return 1;
  }
}
