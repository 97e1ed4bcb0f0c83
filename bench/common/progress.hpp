// Progress on long bench runs, fit for a terminal and for a log.
//
// On a terminal (stderr is a tty) a bar is redrawn in place with carriage returns, at most ~8
// times a second. Anywhere else (a file, a pipe: CI, `scripts/run.sh > log`) no bar and no
// carriage return: one line per finished unit of work (a chunk, a needle, a source) with i/N, the
// elapsed time and an estimate of the time left. `quiet` silences both. Used by e8kv-eval
// (bench/eval) and e8kv-rd (bench/rd); bench/peers/peers.py follows the same rules.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#if defined(_WIN32)
#include <io.h>
#define E8KV_BENCH_ISATTY(fd) _isatty(fd)
#define E8KV_BENCH_FILENO(f) _fileno(f)
#else
#include <unistd.h>
#define E8KV_BENCH_ISATTY(fd) isatty(fd)
#define E8KV_BENCH_FILENO(f) fileno(f)
#endif

namespace e8kv::bench {

class Progress {
 public:
  enum class Mode { kBar, kLines, kQuiet };

  /// The mode for stderr: kQuiet when `quiet`, kBar on a terminal, kLines otherwise.
  static Mode mode_for_stderr(bool quiet) {
    if (quiet) return Mode::kQuiet;
    return E8KV_BENCH_ISATTY(E8KV_BENCH_FILENO(stderr)) ? Mode::kBar : Mode::kLines;
  }

  /// `tool` prefixes every line ("e8kv-eval"); `total_units` is N of "i/N".
  Progress(std::string tool, int total_units, Mode mode, std::FILE* out = stderr)
      : tool_(std::move(tool)), total_(total_units), mode_(mode), out_(out), start_(Clock::now()) {}

  /// Bar only: where the current unit stands (`within` in [0, 1]) and what it does.
  void update(const std::string& what, double within) {
    if (mode_ != Mode::kBar) return;
    const double s = seconds();
    if (bar_drawn_ && s - last_draw_ < 0.125) return;
    last_draw_ = s;
    bar_drawn_ = true;
    const double frac = total_ > 0 ? std::min(1.0, (done_ + std::max(0.0, std::min(1.0, within))) / total_) : 1.0;
    const int width = 30, filled = static_cast<int>(frac * width);
    std::fprintf(out_, "\r[%s] %-26.26s [%s%s] %3d/%d %5.0f s%-22s", tool_.c_str(), what.c_str(),
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), '.').c_str(), done_ + 1 > total_ ? total_ : done_ + 1,
                 total_, s, eta_text(frac).c_str());
    std::fflush(out_);
  }

  /// One unit finished: a line in log mode, the bar moved on a terminal.
  void unit_done(const std::string& what) {
    ++done_;
    if (mode_ == Mode::kQuiet) return;
    const double frac = total_ > 0 ? static_cast<double>(done_) / total_ : 1.0;
    if (mode_ == Mode::kLines) {
      std::fprintf(out_, "[%s] %d/%d %s: %.0f s elapsed%s\n", tool_.c_str(), done_, total_, what.c_str(), seconds(),
                   eta_text(frac).c_str());
      std::fflush(out_);
      return;
    }
    bar_drawn_ = false;  // draw this state now
    update(what, 0.0);
  }

  /// Ends the bar's line (terminal only), so what follows starts on a fresh line.
  void finish() {
    if (mode_ == Mode::kBar && bar_drawn_) std::fprintf(out_, "\n");
    bar_drawn_ = false;
    std::fflush(out_);
  }

  /// A message that must not be garbled by the bar (`text` ends without a newline).
  void message(const std::string& text) {
    if (mode_ == Mode::kQuiet) return;
    finish();
    std::fprintf(out_, "[%s] %s\n", tool_.c_str(), text.c_str());
    std::fflush(out_);
  }

  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  Mode mode() const { return mode_; }

 private:
  using Clock = std::chrono::steady_clock;
  std::string eta_text(double frac) const {
    if (frac <= 0.0 || frac >= 1.0) return "";
    const double left = seconds() * (1.0 - frac) / frac;
    char buf[48];
    std::snprintf(buf, sizeof buf, ", about %.0f s left", left);
    return buf;
  }

  std::string tool_;
  int total_, done_ = 0;
  Mode mode_;
  std::FILE* out_;
  Clock::time_point start_;
  double last_draw_ = 0;
  bool bar_drawn_ = false;
};

}  // namespace e8kv::bench
