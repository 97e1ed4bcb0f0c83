#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "e8kv/error.hpp"

namespace e8kv::eval {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// KL to three significant digits, without an exponent down to 1e-4.
std::string kl_text(double kl) {
  if (kl == 0) return "0";
  if (!std::isfinite(kl)) return "nan";
  if (kl >= 1e-4) {
    const int digits = std::max(0, 2 - static_cast<int>(std::floor(std::log10(kl))));
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", digits, kl);
    return buf;
  }
  return fmt("%.2e", kl);
}

std::string with_commas(long long v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

const RowStats* find_q4(const std::vector<RowStats>& rows) {
  for (const auto& r : rows)
    if (r.peer == "q4_0") return &r;
  return nullptr;
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&apos;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

// One table row's cells, shared by the text and markdown forms.
struct Cells {
  std::string rank, name, bits, ratio, kl, vs_q4, top1, dppl, niah;
};

std::vector<Cells> table_cells(const std::vector<RowStats>& rows) {
  const auto order = ranking(rows);
  const auto front = pareto_front(rows);
  const RowStats* q4 = find_q4(rows);
  std::vector<Cells> out;
  int rank = 0;
  const RowStats* above = nullptr;
  for (size_t i : order) {
    const RowStats& r = rows[i];
    Cells c;
    if (r.family == RowFamily::kReference) {
      c.rank = "ref";
    } else {
      ++rank;
      const bool tie = above != nullptr && above->family != RowFamily::kReference &&
                       paired_difference(r.chunk_kl, above->chunk_kl).within_noise();
      c.rank = (tie ? "≈" : "") + std::to_string(rank);
    }
    above = &r;
    const bool on_front = std::find(front.begin(), front.end(), i) != front.end();
    c.name = r.name + (on_front ? " *" : "");
    c.bits = fmt("%.3f", r.bits);
    c.ratio = fmt("%.2f", r.ratio);
    c.kl = kl_text(r.kl);
    if (q4 != nullptr && q4->kl > 0 && r.family == RowFamily::kReference)
      c.vs_q4 = "-";
    else if (q4 != nullptr && q4->kl > 0) {
      const double x = r.kl / q4->kl;
      c.vs_q4 = x >= 0.1 ? fmt("%.2f", x) : fmt("%.1g", x);
      if (&r != q4 && r.family != RowFamily::kReference && paired_difference(r.chunk_kl, q4->chunk_kl).within_noise())
        c.vs_q4 += " ≈";
    }
    c.top1 = fmt("%.3f", r.top1);
    if (r.family == RowFamily::kReference)
      c.dppl = "0";
    else {
      c.dppl = fmt("%+.2f", r.dppl);
      if (r.chunk_dppl.size() < 2 || std::abs(r.dppl) <= r.dppl_ci) c.dppl += " ≈0";
    }
    c.niah = r.niah >= 0 ? fmt("%.2f", r.niah) : "-";
    out.push_back(c);
  }
  return out;
}

bool any_niah(const std::vector<RowStats>& rows) {
  return std::any_of(rows.begin(), rows.end(), [](const RowStats& r) { return r.niah >= 0; });
}

// Display width of a UTF-8 string (code points; the table's marks are one column each).
size_t width_of(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string pad(const std::string& s, size_t w, bool right) {
  const size_t n = width_of(s);
  if (n >= w) return s;
  return right ? std::string(w - n, ' ') + s : s + std::string(w - n, ' ');
}

}  // namespace

double t95(int dof) {
  static const double table[] = {0,     12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                 2.201, 2.179,  2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080,
                                 2.074, 2.069,  2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (dof < 1) return 0;
  if (dof <= 30) return table[dof];
  return 1.96 + 2.4 / dof;  // within 0.3 % of the quantile above 30
}

Paired paired_difference(const std::vector<double>& a, const std::vector<double>& b) {
  Paired p;
  p.n = static_cast<int>(std::min(a.size(), b.size()));
  if (p.n == 0) return p;
  std::vector<double> d(static_cast<size_t>(p.n));
  for (size_t i = 0; i < d.size(); ++i) d[i] = a[i] - b[i];
  p.mean = std::accumulate(d.begin(), d.end(), 0.0) / p.n;
  if (p.n < 2) return p;
  double var = 0;
  for (double x : d) var += (x - p.mean) * (x - p.mean);
  p.half = t95(p.n - 1) * std::sqrt(var / (p.n - 1) / p.n);
  return p;
}

void dppl_over_chunks(const std::vector<double>& nll, const std::vector<double>& ref_nll,
                      const std::vector<double>& tokens, RowStats& out) {
  out.chunk_dppl.clear();
  for (size_t c = 0; c < nll.size() && c < ref_nll.size() && c < tokens.size(); ++c)
    out.chunk_dppl.push_back(100.0 * (std::exp((nll[c] - ref_nll[c]) / tokens[c]) - 1.0));
  const std::vector<double> zero(out.chunk_dppl.size(), 0.0);
  const Paired p = paired_difference(out.chunk_dppl, zero);
  out.dppl = p.mean;
  out.dppl_ci = p.half;
}

std::vector<size_t> pareto_front(const std::vector<RowStats>& rows) {
  std::vector<size_t> front;
  for (size_t i = 0; i < rows.size(); ++i) {
    bool dominated = false;
    for (size_t j = 0; j < rows.size() && !dominated; ++j) {
      if (j == i) continue;
      const auto& a = rows[j];
      const auto& b = rows[i];
      dominated = a.bits <= b.bits && a.kl <= b.kl && (a.bits < b.bits || a.kl < b.kl);
    }
    if (!dominated) front.push_back(i);
  }
  return front;
}

std::vector<size_t> ranking(const std::vector<RowStats>& rows) {
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const bool ra = rows[a].family == RowFamily::kReference, rb = rows[b].family == RowFamily::kReference;
    if (ra != rb) return ra;
    if (rows[a].kl != rows[b].kl) return rows[a].kl < rows[b].kl;
    return rows[a].bits < rows[b].bits;
  });
  return order;
}

std::string caption(const Protocol& p, const std::vector<RowStats>& rows) {
  std::ostringstream s;
  const long long scored = static_cast<long long>(p.cont) * p.chunks;
  s << p.model << " (" << p.n_layers << " layers, " << p.n_heads << "/" << p.n_kv_heads << " heads, head_dim "
    << p.head_dim << "), ctx " << p.ctx << ": per chunk a " << with_commas(p.ctx - 1) << "-token prefill, then "
    << p.cont << " teacher-forced tokens scored";
  if (p.at_rest)
    s << " beside the compressed prefill (at rest: continuation dense, bits the prefill's)";
  else
    s << ", each through the cache under test (appended tokens coded too; bits: mean over the scored steps)";
  s << "; " << p.chunks << " chunk" << (p.chunks == 1 ? "" : "s");
  if (!p.texts.empty()) {
    s << " alternating ";
    for (size_t i = 0; i < p.texts.size(); ++i) s << (i ? " / " : "") << p.texts[i];
  }
  s << " = " << with_commas(scored) << " scored tokens; " << p.threads << " thread" << (p.threads == 1 ? "" : "s")
    << ", " << fmt("%.0f", p.seconds) << " s. ";
  s << "Ranked by KL(fp16 ‖ row), mean per scored token. Marks: ≈N = KL not separable from the row above "
       "(paired over the "
    << p.chunks << " chunks, 95 % t interval holds 0)";
  if (find_q4(rows) != nullptr) s << "; ÷q4_0 ≈ = not separable from rotated q4_0";
  s << "; ΔPPL ≈0 = its 95 % interval over chunks holds 0; * = on the Pareto front of bits and KL. "
       "Bits count every byte a decoder needs.";
  if (scored < 1024)
    s << " Fewer than 1,024 scored tokens: KL moves by ±20 % between equally good rows here, so this ranks "
         "nothing (docs/accuracy.md; scripts/run.sh runs the powered protocol).";
  return s.str();
}

std::string text_table(const Protocol& p, const std::vector<RowStats>& rows) {
  const auto cells = table_cells(rows);
  const bool q4 = find_q4(rows) != nullptr, niah = any_niah(rows);
  size_t wn = 6;
  for (const auto& c : cells) wn = std::max(wn, width_of(c.name));
  std::ostringstream s;
  s << "\n" << caption(p, rows) << "\n\n";
  s << pad("#", 4, true) << "  " << pad("config", wn, false) << " " << pad("bits/el", 8, true) << " "
    << pad("ratio", 6, true) << " " << pad("KL", 9, true) << (q4 ? " " + pad("÷q4_0", 7, true) : "") << " "
    << pad("top-1", 6, true) << " " << pad("ΔPPL %", 10, true) << (niah ? " " + pad("NIAH", 5, true) : "") << "\n";
  for (const auto& c : cells) {
    s << pad(c.rank, 4, true) << "  " << pad(c.name, wn, false) << " " << pad(c.bits, 8, true) << " "
      << pad(c.ratio, 6, true) << " " << pad(c.kl, 9, true) << (q4 ? " " + pad(c.vs_q4, 7, true) : "") << " "
      << pad(c.top1, 6, true) << " " << pad(c.dppl, 10, true) << (niah ? " " + pad(c.niah, 5, true) : "") << "\n";
  }
  return s.str();
}

std::string markdown_table(const Protocol& p, const std::vector<RowStats>& rows) {
  const auto cells = table_cells(rows);
  const bool q4 = find_q4(rows) != nullptr, niah = any_niah(rows);
  std::ostringstream s;
  s << caption(p, rows) << "\n\n";
  s << "| # | config | bits/elem | ratio | KL |" << (q4 ? " KL ÷ q4_0 |" : "") << " top-1 | ΔPPL % |"
    << (niah ? " NIAH |" : "") << "\n";
  s << "|---|---|---|---|---|" << (q4 ? "---|" : "") << "---|---|" << (niah ? "---|" : "") << "\n";
  for (const auto& c : cells) {
    s << "| " << c.rank << " | " << c.name << " | " << c.bits << " | " << c.ratio << " | " << c.kl << " |"
      << (q4 ? " " + c.vs_q4 + " |" : "") << " " << c.top1 << " | " << c.dppl << " |"
      << (niah ? " " + c.niah + " |" : "") << "\n";
  }
  return s.str();
}

std::string csv_table(const std::vector<RowStats>& rows) {
  const auto front = pareto_front(rows);
  std::ostringstream s;
  s << "config,bits_per_element,compression_ratio,ppl,ppl_delta_pct,kl_mean,top1_agree,niah_recall,ppl_delta_ci95,"
       "pareto\n";
  char buf[512];
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const std::string niah = r.niah >= 0 ? std::to_string(r.niah) : "";
    const bool on = std::find(front.begin(), front.end(), i) != front.end();
    std::snprintf(buf, sizeof buf, "%s,%.4f,%.4f,%.5f,%.4f,%.6f,%.5f,%s,%.4f,%d\n", r.name.c_str(), r.bits, r.ratio,
                  r.ppl, r.dppl, r.kl, r.top1, niah.c_str(), r.dppl_ci, on ? 1 : 0);
    s << buf;
  }
  return s.str();
}

// ---- the picture ---------------------------------------------------------------------------------
namespace {

struct Box {
  double x0, y0, x1, y1;
  bool overlaps(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
  double overlap_area(const Box& o) const {
    const double w = std::min(x1, o.x1) - std::max(x0, o.x0), h = std::min(y1, o.y1) - std::max(y0, o.y0);
    return w > 0 && h > 0 ? w * h : 0.0;
  }
};

struct Style {
  std::string shape, color, legend;
};

// Each peer its own marker; e8kv one family; the reference apart.
Style style_of(const RowStats& r) {
  if (r.family == RowFamily::kReference) return {"ring", "#000000", "fp16 (reference; KL 0)"};
  if (r.family == RowFamily::kE8kv) return {"circle", "#1f5fbf", "e8kv presets"};
  if (r.peer == "q8_0") return {"square", "#e08a00", "llama.cpp q8_0, rotated"};
  if (r.peer == "q4_0") return {"diamond", "#c0282d", "llama.cpp q4_0, rotated"};
  if (r.peer == "KIVI") return {"triangle", "#2a9d3a", "KIVI (2 / 4 bit)"};
  if (r.peer == "TurboQuant-style") return {"triangle-down", "#8a4fbf", "TurboQuant-style (Lloyd-Max)"};
  if (r.peer == "relaxed") return {"cross", "#8c564b", "relaxed parity (NexusQuant)"};
  return {"square", "#666666", r.peer.empty() ? "other" : r.peer};
}

std::string marker(const std::string& shape, const std::string& color, double x, double y, double s = 5.5) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(1);
  if (shape == "circle")
    o << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"" << s << "\" fill=\"" << color
      << "\" stroke=\"#ffffff\" stroke-width=\"1\"/>";
  else if (shape == "ring")
    o << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"" << s << "\" fill=\"#ffffff\" stroke=\"" << color
      << "\" stroke-width=\"2\"/>";
  else if (shape == "square")
    o << "<rect x=\"" << x - s << "\" y=\"" << y - s << "\" width=\"" << 2 * s << "\" height=\"" << 2 * s
      << "\" fill=\"" << color << "\" stroke=\"#ffffff\" stroke-width=\"1\"/>";
  else if (shape == "diamond")
    o << "<polygon points=\"" << x << "," << y - s * 1.35 << " " << x + s * 1.35 << "," << y << " " << x << ","
      << y + s * 1.35 << " " << x - s * 1.35 << "," << y << "\" fill=\"" << color
      << "\" stroke=\"#ffffff\" stroke-width=\"1\"/>";
  else if (shape == "triangle")
    o << "<polygon points=\"" << x << "," << y - s * 1.3 << " " << x + s * 1.2 << "," << y + s * 0.9 << " "
      << x - s * 1.2 << "," << y + s * 0.9 << "\" fill=\"" << color << "\" stroke=\"#ffffff\" stroke-width=\"1\"/>";
  else if (shape == "triangle-down")
    o << "<polygon points=\"" << x << "," << y + s * 1.3 << " " << x + s * 1.2 << "," << y - s * 0.9 << " "
      << x - s * 1.2 << "," << y - s * 0.9 << "\" fill=\"" << color << "\" stroke=\"#ffffff\" stroke-width=\"1\"/>";
  else  // cross
    o << "<path d=\"M" << x - s << "," << y - s << " L" << x + s << "," << y + s << " M" << x - s << "," << y + s
      << " L" << x + s << "," << y - s << "\" stroke=\"" << color << "\" stroke-width=\"2.5\" fill=\"none\"/>";
  return o.str();
}

std::string label_of(const RowStats& r) {
  if (r.family == RowFamily::kE8kv && r.name.rfind("e8kv ", 0) == 0) return r.name.substr(5);
  return r.name;
}

}  // namespace

std::string quality_svg(const Protocol& p, const std::vector<RowStats>& rows) {
  // Canvas: plot on the left, legend on the right, the KL = 0 strip under the log axis.
  const double W = 960, H = 580, left = 78, right = 620, top = 64, log_bottom = 440, zero_y = 468;
  const double char_w = 6.4, font = 12;  // label box estimate at 12 px sans-serif
  double bmin = 1e9, bmax = 0, kmin = 1e9, kmax = 0;
  for (const auto& r : rows) {
    if (!(r.bits > 0) || !std::isfinite(r.bits)) continue;
    bmin = std::min(bmin, r.bits);
    bmax = std::max(bmax, r.bits);
    if (r.kl > 0 && std::isfinite(r.kl)) {
      kmin = std::min(kmin, r.kl);
      kmax = std::max(kmax, r.kl);
    }
  }
  if (bmax <= 0) bmin = 1, bmax = 16;
  if (kmax <= 0) kmin = 1e-3, kmax = 1e-1;
  const double lx0 = std::log2(bmin) - 0.25, lx1 = std::log2(bmax) + 0.2;
  const double ly0 = std::floor(std::log10(kmin) - 0.05), ly1 = std::ceil(std::log10(kmax) + 0.05);
  auto X = [&](double bits) { return left + (std::log2(bits) - lx0) / (lx1 - lx0) * (right - left); };
  auto Y = [&](double kl) {
    if (!(kl > 0)) return zero_y;
    return log_bottom - (std::log10(kl) - ly0) / (ly1 - ly0) * (log_bottom - top);
  };

  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(1);
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  o << "<title>e8kv-eval: next-token KL against honest bits per element</title>\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << W << "\" height=\"" << H << "\" fill=\"#ffffff\"/>\n";
  o << "<text x=\"" << left
    << "\" y=\"26\" font-size=\"16\" font-weight=\"bold\">Quality against size: next-token KL vs "
       "honest bits per element</text>\n";
  {
    std::ostringstream sub;
    sub << p.model << ", ctx " << p.ctx << ", " << with_commas(static_cast<long long>(p.cont) * p.chunks)
        << " scored tokens (" << p.chunks << " chunks × " << p.cont << ")"
        << (p.at_rest ? ", at rest" : ", every token through the cache") << "; lower-left is better";
    o << "<text x=\"" << left << "\" y=\"46\" font-size=\"12\" fill=\"#444444\">" << xml_escape(sub.str())
      << "</text>\n";
  }
  // Grid and axes.
  o << "<g stroke=\"#e4e4e4\" stroke-width=\"1\">\n";
  for (int d = static_cast<int>(ly0); d < static_cast<int>(ly1); ++d)
    for (int m : {2, 5}) {
      const double y = Y(m * std::pow(10.0, d));
      o << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << right << "\" y2=\"" << y << "\"/>\n";
    }
  o << "</g>\n<g stroke=\"#c8c8c8\" stroke-width=\"1\">\n";
  for (int d = static_cast<int>(ly0); d <= static_cast<int>(ly1); ++d) {
    const double y = Y(std::pow(10.0, d));
    o << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << right << "\" y2=\"" << y << "\"/>\n";
  }
  const double xticks[] = {0.5, 0.75, 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 12, 16, 24, 32};
  for (double t : xticks) {
    if (std::log2(t) < lx0 || std::log2(t) > lx1) continue;
    o << "<line x1=\"" << X(t) << "\" y1=\"" << top << "\" x2=\"" << X(t) << "\" y2=\"" << zero_y + 10 << "\"/>\n";
  }
  o << "</g>\n";
  // Axes box, the axis break between the log region and the KL = 0 strip.
  o << "<g stroke=\"#333333\" stroke-width=\"1.2\" fill=\"none\">\n";
  o << "<path d=\"M" << left << "," << top << " L" << left << "," << log_bottom + 8 << " M" << left << "," << zero_y - 8
    << " L" << left << "," << zero_y + 10 << " L" << right << "," << zero_y + 10 << "\"/>\n";
  o << "<path d=\"M" << left - 5 << "," << log_bottom + 10 << " L" << left + 5 << "," << log_bottom + 6 << " M"
    << left - 5 << "," << zero_y - 6 << " L" << left + 5 << "," << zero_y - 10 << "\"/>\n";
  o << "</g>\n";
  o << "<line x1=\"" << left << "\" y1=\"" << zero_y << "\" x2=\"" << right << "\" y2=\"" << zero_y
    << "\" stroke=\"#bbbbbb\" stroke-dasharray=\"2,3\"/>\n";
  // Tick labels.
  o << "<g font-size=\"12\" fill=\"#222222\">\n";
  for (int d = static_cast<int>(ly0); d <= static_cast<int>(ly1); ++d) {
    const double v = std::pow(10.0, d);
    char t[32];
    std::snprintf(t, sizeof t, "%.*f", d < 0 ? -d : 0, v);
    o << "<text x=\"" << left - 8 << "\" y=\"" << Y(v) + 4 << "\" text-anchor=\"end\">" << t << "</text>\n";
  }
  o << "<text x=\"" << left - 8 << "\" y=\"" << zero_y + 4 << "\" text-anchor=\"end\">0</text>\n";
  for (double t : xticks) {
    if (std::log2(t) < lx0 || std::log2(t) > lx1) continue;
    o << "<text x=\"" << X(t) << "\" y=\"" << zero_y + 26 << "\" text-anchor=\"middle\">" << fmt("%g", t)
      << "</text>\n";
  }
  o << "</g>\n";
  o << "<text x=\"" << (left + right) / 2 << "\" y=\"" << zero_y + 50
    << "\" font-size=\"13\" text-anchor=\"middle\">bits per element (log scale; every stored byte counted)</text>\n";
  o << "<text transform=\"translate(22," << (top + log_bottom) / 2
    << ") rotate(-90)\" font-size=\"13\" text-anchor=\"middle\">next-token KL(fp16 ‖ row), log scale</text>\n";

  // The Pareto front: a dashed staircase through its points (by bits), then rings.
  auto front = pareto_front(rows);
  std::sort(front.begin(), front.end(), [&](size_t a, size_t b) { return rows[a].bits < rows[b].bits; });
  std::vector<Box> taken;  // what labels must not cover: markers, rings, the front's segments
  auto segment = [&](double xa, double ya, double xb, double yb) {
    taken.push_back({std::min(xa, xb) - 2, std::min(ya, yb) - 2, std::max(xa, xb) + 2, std::max(ya, yb) + 2});
  };
  for (size_t k = 1; k < front.size(); ++k) {
    const auto &a = rows[front[k - 1]], &b = rows[front[k]];
    segment(X(a.bits), Y(a.kl), X(b.bits), Y(a.kl));
    segment(X(b.bits), Y(a.kl), X(b.bits), Y(b.kl));
  }
  if (front.size() > 1) {
    o << "<path d=\"";
    for (size_t k = 0; k < front.size(); ++k) {
      const auto& r = rows[front[k]];
      if (k == 0)
        o << "M" << X(r.bits) << "," << Y(r.kl);
      else
        o << " L" << X(r.bits) << "," << Y(rows[front[k - 1]].kl) << " L" << X(r.bits) << "," << Y(r.kl);
    }
    o << "\" fill=\"none\" stroke=\"#555555\" stroke-width=\"1.3\" stroke-dasharray=\"6,4\"/>\n";
  }
  for (size_t i : front)
    o << "<circle cx=\"" << X(rows[i].bits) << "\" cy=\"" << Y(rows[i].kl)
      << "\" r=\"10\" fill=\"none\" stroke=\"#555555\" stroke-width=\"1.3\"/>\n";

  // Markers, then labels placed where they overlap nothing drawn so far.
  // e8kv's points first, peers over them, the reference last: where two coincide both stay visible
  // (the smaller peer marker on the larger disc), and a note under the axis names them.
  const size_t first_marker = taken.size();
  for (size_t i = 0; i < rows.size(); ++i) {
    const double x = X(rows[i].bits), y = Y(rows[i].kl);
    const double ring = std::find(front.begin(), front.end(), i) != front.end() ? 11 : 7;
    taken.push_back({x - ring, y - ring, x + ring, y + ring});
  }
  for (RowFamily f : {RowFamily::kE8kv, RowFamily::kPeer, RowFamily::kReference})
    for (const auto& r : rows)
      if (r.family == f)
        o << marker(style_of(r).shape, style_of(r).color, X(r.bits), Y(r.kl), f == RowFamily::kPeer ? 4.5 : 5.5)
          << "\n";
  std::vector<std::string> coincide;
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = i + 1; j < rows.size(); ++j)
      if (std::hypot(X(rows[i].bits) - X(rows[j].bits), Y(rows[i].kl) - Y(rows[j].kl)) < 10)
        coincide.push_back(label_of(rows[i]) + " (" + fmt("%.3f", rows[i].bits) + " bits, KL " + kl_text(rows[i].kl) +
                           ") and " + label_of(rows[j]) + " (" + fmt("%.3f", rows[j].bits) + ", " +
                           kl_text(rows[j].kl) + ")");
  auto dist_to_box = [](double px, double py, const Box& b) {
    const double dx = std::max({b.x0 - px, 0.0, px - b.x1}), dy = std::max({b.y0 - py, 0.0, py - b.y1});
    return std::hypot(dx, dy);
  };
  const Box plot{left, top - 4, right + 110, zero_y + 12};
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Crowded points first: rows sorted by bits so neighbours compete in a fixed, reproducible order.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rows[a].bits < rows[b].bits; });
  o << "<g font-size=\"" << font << "\" fill=\"#222222\">\n";
  for (size_t i : order) {
    const auto& r = rows[i];
    std::string text = label_of(r);
    if (r.family == RowFamily::kReference) text += " (KL 0)";
    const double x = X(r.bits), y = Y(r.kl), w = char_w * width_of(text), h = font;
    struct Cand {
      double tx, ty;
      const char* anchor;
      Box box;
    };
    std::vector<Cand> cands;
    for (double dy : {0.0, -14.0, 14.0, -26.0, 26.0}) {
      cands.push_back({x + 14, y + 4 + dy, "start", {x + 14, y - 7 + dy, x + 14 + w, y - 7 + dy + h + 1}});
      cands.push_back({x - 14, y + 4 + dy, "end", {x - 14 - w, y - 7 + dy, x - 14, y - 7 + dy + h + 1}});
    }
    cands.push_back({x, y - 15, "middle", {x - w / 2, y - 26, x + w / 2, y - 13}});
    cands.push_back({x, y + 25, "middle", {x - w / 2, y + 14, x + w / 2, y + 27}});
    size_t best = 0;
    double best_cost = 1e300;
    for (size_t k = 0; k < cands.size(); ++k) {
      const Box& b = cands[k].box;
      double cost = 0;
      if (b.x0 < plot.x0 || b.x1 > plot.x1 || b.y0 < plot.y0 || b.y1 > plot.y1) cost += 1e6;
      for (size_t t = 0; t < taken.size(); ++t)
        if (t != first_marker + i) cost += b.overlap_area(taken[t]) * 10;
      cost += static_cast<double>(k);  // prefer the earlier (nearer) places
      // A label must sit nearer its own point than any other point, or it names the wrong one.
      const double own = dist_to_box(x, y, b);
      for (size_t j = 0; j < rows.size(); ++j) {
        const double xj = X(rows[j].bits), yj = Y(rows[j].kl);
        if (j != i && std::hypot(xj - x, yj - y) >= 10 && dist_to_box(xj, yj, b) < own + 2) cost += 5000;
      }
      if (cost < best_cost) best_cost = cost, best = k;
    }
    const Cand& c = cands[best];
    taken.push_back(c.box);
    if (std::abs(c.ty - (y + 4)) > 15) {  // a label moved away from its point gets a leader line
      const double bx = std::min(std::max(x, c.box.x0), c.box.x1), by = std::min(std::max(y, c.box.y0), c.box.y1);
      const double d = std::hypot(bx - x, by - y);
      if (d > 8)
        o << "<line x1=\"" << x + (bx - x) * 6 / d << "\" y1=\"" << y + (by - y) * 6 / d << "\" x2=\"" << bx
          << "\" y2=\"" << by << "\" stroke=\"#777777\" stroke-width=\"0.8\"/>\n";
    }
    o << "<text x=\"" << c.tx << "\" y=\"" << c.ty << "\" text-anchor=\"" << c.anchor << "\""
      << (r.family == RowFamily::kE8kv ? " fill=\"#1f4f9f\"" : "") << ">" << xml_escape(text) << "</text>\n";
  }
  o << "</g>\n";
  if (!coincide.empty()) {
    std::string note = "Coinciding points: ";
    for (size_t k = 0; k < coincide.size(); ++k) note += (k ? "; " : "") + coincide[k];
    o << "<text x=\"" << left << "\" y=\"" << H - 12 << "\" font-size=\"11\" fill=\"#444444\">" << xml_escape(note)
      << ".</text>\n";
  }

  // Legend: one entry per family or peer present, then the front.
  std::vector<Style> seen;
  std::vector<size_t> by_family(rows.size());
  std::iota(by_family.begin(), by_family.end(), size_t{0});
  std::stable_sort(by_family.begin(), by_family.end(), [&](size_t a, size_t b) {
    return static_cast<int>(rows[a].family) < static_cast<int>(rows[b].family);
  });
  for (size_t i : by_family) {
    const Style s = style_of(rows[i]);
    if (std::none_of(seen.begin(), seen.end(), [&](const Style& t) { return t.legend == s.legend; })) seen.push_back(s);
  }
  const double lx = right + 130, ly = top + 4;
  o << "<g font-size=\"12\" fill=\"#222222\">\n";
  o << "<rect x=\"" << lx - 12 << "\" y=\"" << ly - 16 << "\" width=\"" << W - lx << "\" height=\""
    << 24 * (seen.size() + 1) + 14 << "\" fill=\"#ffffff\" stroke=\"#cccccc\"/>\n";
  double yy = ly;
  for (const auto& s : seen) {
    o << marker(s.shape, s.color, lx + 2, yy - 4, 5) << "\n";
    o << "<text x=\"" << lx + 16 << "\" y=\"" << yy << "\">" << xml_escape(s.legend) << "</text>\n";
    yy += 24;
  }
  o << "<path d=\"M" << lx - 8 << "," << yy - 4 << " L" << lx + 12 << "," << yy - 4
    << "\" stroke=\"#555555\" stroke-width=\"1.3\" stroke-dasharray=\"6,4\"/>\n";
  o << "<circle cx=\"" << lx + 2 << "\" cy=\"" << yy - 4 << "\" r=\"7\" fill=\"none\" stroke=\"#555555\"/>\n";
  o << "<text x=\"" << lx + 16 << "\" y=\"" << yy << "\">Pareto front</text>\n";
  o << "</g>\n";
  o << "</svg>\n";
  return o.str();
}

void write_text_file(const std::string& path, const std::string& text, const std::string& what) {
  std::ofstream f(path, std::ios::binary);
  require(f.good(), what + ": cannot write " + path);
  f << text;
  f.flush();
  require(f.good(), what + ": writing " + path + " failed");
}

}  // namespace e8kv::eval
