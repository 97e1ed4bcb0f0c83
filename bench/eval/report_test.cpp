// e8kv-eval's report on synthetic rows (label cpu, no model): the paired-noise marks, the
// ranking, the Pareto front, and the SVG's well-formedness and content.
#include "report.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

namespace e8kv::eval {
namespace {

// A strict little XML well-formedness check: one root element, every tag closed in order,
// attribute values quoted, '&' only as a known entity or character reference, '<' only as markup.
// Returns an empty string when well-formed, otherwise what is wrong and where.
std::string xml_problem(const std::string& s) {
  std::vector<std::string> stack;
  size_t i = 0, roots = 0;
  auto entity_ok = [&](size_t at) {
    const size_t semi = s.find(';', at);
    if (semi == std::string::npos || semi - at > 10) return false;
    const std::string e = s.substr(at + 1, semi - at - 1);
    if (e == "amp" || e == "lt" || e == "gt" || e == "quot" || e == "apos") return true;
    return e.size() > 1 && e[0] == '#';
  };
  while (i < s.size()) {
    if (s[i] == '&') {
      if (!entity_ok(i)) return "bad entity at " + std::to_string(i);
      ++i;
      continue;
    }
    if (s[i] == '>') return "stray '>' at " + std::to_string(i);
    if (s[i] != '<') {
      if (stack.empty() && !std::isspace(static_cast<unsigned char>(s[i])))
        return "text outside the root at " + std::to_string(i);
      ++i;
      continue;
    }
    if (s.compare(i, 5, "<?xml") == 0) {
      if (i != 0) return "XML declaration not at the start";
      const size_t e = s.find("?>", i);
      if (e == std::string::npos) return "unclosed declaration";
      i = e + 2;
      continue;
    }
    const size_t close = s.find('>', i);
    if (close == std::string::npos) return "unclosed tag at " + std::to_string(i);
    std::string tag = s.substr(i + 1, close - i - 1);
    if (tag.find('<') != std::string::npos) return "'<' inside a tag at " + std::to_string(i);
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name)
        return "</" + name + "> does not close <" + (stack.empty() ? "" : stack.back()) + ">";
      stack.pop_back();
      i = close + 1;
      continue;
    }
    const bool self = !tag.empty() && tag.back() == '/';
    if (self) tag.pop_back();
    size_t p = 0;
    while (p < tag.size() && !std::isspace(static_cast<unsigned char>(tag[p]))) ++p;
    const std::string name = tag.substr(0, p);
    if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0]))))
      return "bad tag name at " + std::to_string(i);
    // Attributes: name="value" or name='value', nothing else.
    while (p < tag.size()) {
      while (p < tag.size() && std::isspace(static_cast<unsigned char>(tag[p]))) ++p;
      if (p >= tag.size()) break;
      const size_t eq = tag.find('=', p);
      if (eq == std::string::npos || eq + 1 >= tag.size()) return "attribute without a value in <" + name + ">";
      const char q = tag[eq + 1];
      if (q != '"' && q != '\'') return "unquoted attribute in <" + name + ">";
      const size_t end = tag.find(q, eq + 2);
      if (end == std::string::npos) return "unterminated attribute in <" + name + ">";
      for (size_t k = eq + 2; k < end; ++k)
        if (tag[k] == '&' && !entity_ok(i + 1 + k)) return "bad entity in an attribute of <" + name + ">";
      p = end + 1;
    }
    if (stack.empty()) ++roots;
    if (!self) stack.push_back(name);
    i = close + 1;
  }
  if (!stack.empty()) return "<" + stack.back() + "> never closed";
  if (roots != 1) return std::to_string(roots) + " root elements";
  return "";
}

TEST(XmlCheck, CatchesWhatItMust) {  // the checker itself can fail
  EXPECT_EQ(xml_problem("<svg><g><text>a &amp; b</text></g></svg>"), "");
  EXPECT_NE(xml_problem("<svg><g></svg>"), "");
  EXPECT_NE(xml_problem("<svg><text>a & b</text></svg>"), "");
  EXPECT_NE(xml_problem("<svg width=3></svg>"), "");
  EXPECT_NE(xml_problem("<svg></svg><svg></svg>"), "");
  EXPECT_NE(xml_problem("<svg><text>q4_0 <rotated></text></svg>"), "");
}

RowStats row(const std::string& name, RowFamily f, const std::string& peer, double bits, std::vector<double> chunk_kl) {
  RowStats r;
  r.name = name;
  r.family = f;
  r.peer = peer;
  r.bits = bits;
  r.ratio = 16.0 / bits;
  r.chunk_kl = std::move(chunk_kl);
  double s = 0;
  for (double k : r.chunk_kl) s += k;
  r.kl = r.chunk_kl.empty() ? 0 : s / r.chunk_kl.size();
  r.top1 = 0.9;
  r.chunk_dppl = std::vector<double>(r.chunk_kl.size(), 1.0);
  r.dppl = 1.0;
  r.dppl_ci = 0.5;
  return r;
}

std::vector<RowStats> sample_rows() {
  return {
      row("fp16", RowFamily::kReference, "", 16.0, {0, 0, 0, 0}),
      row("q4_0 (rotated)", RowFamily::kPeer, "q4_0", 4.5, {0.040, 0.042, 0.039, 0.041}),
      row("q8_0 (rotated)", RowFamily::kPeer, "q8_0", 8.5, {0.0002, 0.0002, 0.0001, 0.0002}),
      // separable from q8_0 (above it) on every chunk
      row("e8kv quant-k4v4", RowFamily::kE8kv, "", 4.3, {0.006, 0.008, 0.006, 0.008}),
      // tied with quant-k4v4 (0.001 higher, inside the noise), separable from q4_0: lower on every chunk
      row("e8kv tier-k3v2", RowFamily::kE8kv, "", 3.06, {0.008, 0.009, 0.007, 0.008}),
      row("KIVI-2 & <co>", RowFamily::kPeer, "KIVI", 4.6, {0.11, 0.12, 0.10, 0.11}),
  };
}

Protocol sample_protocol() {
  Protocol p;
  p.model = "SmolLM2-135M-Instruct.Q4_1";
  p.n_layers = 30, p.n_heads = 9, p.n_kv_heads = 3, p.head_dim = 64;
  p.ctx = 1024, p.cont = 128, p.chunks = 4, p.threads = 2;
  p.texts = {"tech.txt", "fiction.txt"};
  p.seconds = 300;
  return p;
}

TEST(Report, PairedDifference) {
  const Paired a = paired_difference({1, 2, 3, 4}, {0, 1, 2, 3});  // constant +1: far outside the noise
  EXPECT_DOUBLE_EQ(a.mean, 1.0);
  EXPECT_DOUBLE_EQ(a.half, 0.0);
  EXPECT_FALSE(a.within_noise());
  const Paired b = paired_difference({1, -1, 1, -1}, {0, 0, 0, 0});
  EXPECT_DOUBLE_EQ(b.mean, 0.0);
  EXPECT_TRUE(b.within_noise());
  // mean 0.5, sd of {1, 0} = 0.7071, n 2: half = 12.706 * 0.7071 / sqrt(2) = 6.353
  const Paired c = paired_difference({1, 0}, {0, 0});
  EXPECT_NEAR(c.half, 6.353, 1e-3);
  EXPECT_NEAR(t95(7), 2.365, 1e-9);
}

TEST(Report, RankingAndFront) {
  const auto rows = sample_rows();
  const auto order = ranking(rows);
  ASSERT_EQ(order.size(), rows.size());
  EXPECT_EQ(rows[order[0]].name, "fp16");
  for (size_t k = 2; k < order.size(); ++k) EXPECT_LE(rows[order[k - 1]].kl, rows[order[k]].kl);
  const auto front = pareto_front(rows);
  auto on = [&](const std::string& n) {
    for (size_t i : front)
      if (rows[i].name == n) return true;
    return false;
  };
  EXPECT_TRUE(on("fp16"));
  EXPECT_TRUE(on("e8kv tier-k3v2"));
  EXPECT_TRUE(on("e8kv quant-k4v4"));  // 4.3 bits, 0.007: nothing lower at fewer bits
  EXPECT_TRUE(on("q8_0 (rotated)"));
  EXPECT_FALSE(on("q4_0 (rotated)"));  // tier-k3v2 has fewer bits and lower KL
  EXPECT_FALSE(on("KIVI-2 & <co>"));
}

TEST(Report, TableMarksNoiseAndPrintsProtocol) {
  const auto rows = sample_rows();
  const std::string md = markdown_table(sample_protocol(), rows);
  // The caption says the protocol.
  EXPECT_NE(md.find("ctx 1024"), std::string::npos);
  EXPECT_NE(md.find("512 scored tokens"), std::string::npos);  // 4 chunks x 128
  EXPECT_NE(md.find("ranks nothing"), std::string::npos);      // fewer than 1,024
  // q8_0 is rank 1; quant-k4v4 (rank 2) is separable from it; tier-k3v2 (rank 3) is not from k4v4.
  EXPECT_NE(md.find("| 1 | q8_0 (rotated) *"), std::string::npos) << md;
  EXPECT_NE(md.find("| 2 | e8kv quant-k4v4 *"), std::string::npos) << md;
  EXPECT_NE(md.find("| ≈3 | e8kv tier-k3v2 *"), std::string::npos) << md;
  // tier-k3v2 against q4_0: 0.2x, not within the noise; no ± column anywhere.
  EXPECT_NE(md.find("| 0.20 |"), std::string::npos) << md;
  EXPECT_EQ(md.substr(md.find("| # |")).find("±"), std::string::npos);
  Protocol p = sample_protocol();
  p.chunks = 8;
  EXPECT_EQ(markdown_table(p, rows).find("ranks nothing"), std::string::npos);
  const std::string csv = csv_table(rows);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "config,bits_per_element,compression_ratio,ppl,ppl_delta_pct,kl_mean,top1_agree,niah_recall,"
            "ppl_delta_ci95,pareto");
}

TEST(Report, SvgIsWellFormedAndComplete) {
  const auto rows = sample_rows();
  const std::string svg = quality_svg(sample_protocol(), rows);
  EXPECT_EQ(xml_problem(svg), "") << svg;
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  // Every row labelled (e8kv rows without the prefix), the escaped name, the legend, the front.
  for (const char* label : {">fp16 (KL 0)<", ">q4_0 (rotated)<", ">q8_0 (rotated)<", ">tier-k3v2<", ">quant-k4v4<",
                            ">KIVI-2 &amp; &lt;co&gt;<", ">e8kv presets<", ">Pareto front<", "log scale"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  EXPECT_NE(svg.find("stroke-dasharray=\"6,4\""), std::string::npos);  // the front's staircase
  // Degenerate inputs still give a well-formed picture.
  EXPECT_EQ(xml_problem(quality_svg(sample_protocol(), {rows[0]})), "");
  EXPECT_EQ(xml_problem(quality_svg(sample_protocol(), {})), "");
}

}  // namespace
}  // namespace e8kv::eval
