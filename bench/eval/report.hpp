// The report of e8kv-eval: per-row statistics, the ranked table (stdout and markdown) with the
// protocol in its caption and differences inside the noise marked, the CSV, and the picture of
// quality against size (SVG: next-token KL, log scale, against honest bits per element).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace e8kv::eval {

/// What kind of row a configuration is, for the picture: the reference, one of e8kv's
/// configurations (drawn as one family), or a peer (each peer its own marker).
enum class RowFamily { kReference, kE8kv, kPeer };

struct RowStats {
  std::string name;
  RowFamily family = RowFamily::kE8kv;
  std::string peer;  // peers: the marker group ("q8_0", "q4_0", "KIVI", "TurboQuant-style", "relaxed")
  double bits = 0, ratio = 0, ppl = 0, top1 = 0, niah = -1;
  double kl = 0;                 // mean over every scored token
  double dppl = 0, dppl_ci = 0;  // mean over chunks of ΔPPL % against the reference, 95 % half-width
  std::vector<double> chunk_kl;  // per chunk: mean KL over its scored tokens
  std::vector<double> chunk_dppl;
  std::string note;
};

/// The setting a table was measured in; printed as its caption.
struct Protocol {
  std::string model;
  int n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int ctx = 0, cont = 0, chunks = 0, threads = 0;
  std::vector<std::string> texts;  // corpus names, chunks alternate between them
  bool at_rest = false;
  double seconds = 0;
};

/// A paired difference over chunks: mean of a_c − b_c and the half-width of its 95 % interval
/// (Student t with chunks − 1 degrees of freedom). Inside the noise when the interval holds 0.
struct Paired {
  double mean = 0, half = 0;
  int n = 0;
  bool within_noise() const { return n < 2 || std::abs(mean) <= half; }
};
Paired paired_difference(const std::vector<double>& a, const std::vector<double>& b);
/// The two-sided 95 % Student t quantile for `dof` degrees of freedom.
double t95(int dof);

/// Mean and 95 % half-width of ΔPPL % over chunks, from per-chunk summed NLLs and token counts.
void dppl_over_chunks(const std::vector<double>& nll, const std::vector<double>& ref_nll,
                      const std::vector<double>& tokens, RowStats& out);

/// Indices of rows on the Pareto front of (bits, KL): no other row has both fewer or equal bits
/// and lower or equal KL with one of them strictly. The reference (KL 0) is on it by construction.
std::vector<size_t> pareto_front(const std::vector<RowStats>& rows);

/// The order the table prints: the reference first, then by KL ascending.
std::vector<size_t> ranking(const std::vector<RowStats>& rows);

/// One line (markdown-safe) saying what was measured and how to read the marks.
std::string caption(const Protocol& p, const std::vector<RowStats>& rows);

/// The ranked table: plain text for stdout, or a markdown table (caption above it).
std::string text_table(const Protocol& p, const std::vector<RowStats>& rows);
std::string markdown_table(const Protocol& p, const std::vector<RowStats>& rows);
/// CSV: config,bits_per_element,compression_ratio,ppl,ppl_delta_pct,kl_mean,top1_agree,niah_recall
/// (unchanged columns) then ppl_delta_ci95,pareto.
std::string csv_table(const std::vector<RowStats>& rows);

/// The picture: next-token KL (log scale) against honest bits per element (log scale), every row;
/// e8kv's configurations as one family, each peer its own marker, the reference at KL 0 on the
/// bottom edge, the Pareto front as a dashed staircase with ringed points. Standalone SVG 1.1.
std::string quality_svg(const Protocol& p, const std::vector<RowStats>& rows);

/// Writes `text` to `path`; throws e8kv::Error naming `what` when it cannot.
void write_text_file(const std::string& path, const std::string& text, const std::string& what);

}  // namespace e8kv::eval
