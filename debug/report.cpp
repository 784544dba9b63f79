#include "debug/report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <variant>

#include <fmt/format.h>

#include "debug/stats.h"

namespace opfuse::debug {

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        // HTML forbids most control characters; a JSON string may still carry them (\u0001).
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') || c == 0x7f)
          out += "&#xFFFD;";
        else
          out += c;
    }
  }
  return out;
}

Axis nice_axis(double min, double max, bool integer_steps) {
  // long double: the spread of two finite doubles near DBL_MAX would overflow a double.
  long double lo = min, hi = max;
  const long double magnitude = std::max(std::fabs(lo), std::fabs(hi));
  const bool constant = hi - lo <= magnitude * 1e-12L;
  if (constant) {
    // Centre it: half a step either side for iterations, 10% of the value (or 1 for 0) else.
    const long double pad = integer_steps ? 0.5L : (magnitude > 0 ? magnitude * 0.1L : 1.0L);
    lo -= pad;
    hi += pad;
  }
  const long double raw = (hi - lo) / 5;
  const long double power = std::pow(10.0L, std::floor(std::log10(raw)));
  const long double f = raw / power;
  long double step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * power;
  if (integer_steps) step = std::max(step, 1.0L);
  if (!constant) {
    lo = std::floor(lo / step) * step;
    hi = std::ceil(hi / step) * step;
  }
  Axis axis;
  constexpr long double kMax = std::numeric_limits<double>::max();
  axis.lo = static_cast<double>(std::max(lo, -kMax));
  axis.hi = static_cast<double>(std::min(hi, kMax));
  axis.step = static_cast<double>(step);
  const long double first = std::ceil(lo / step - 1e-9L), last = std::floor(hi / step + 1e-9L);
  for (long double k = first; k <= last; ++k) {
    const long double tick = k * step;
    // k == 0 rather than a tiny remainder, so the label reads "0", not "-0" or "1e-17".
    if (tick >= -kMax && tick <= kMax) axis.ticks.push_back(k == 0 ? 0.0 : double(tick));
  }
  return axis;
}

std::string tick_label(double value, const Axis& axis) {
  if (axis.step >= 1 && std::fabs(value) < 1e9 && value == std::floor(value))
    return fmt::format("{}", static_cast<int64_t>(value));
  const double magnitude = std::max(std::fabs(axis.lo), std::fabs(axis.hi));
  const int digits = int(std::floor(std::log10(magnitude)) - std::floor(std::log10(axis.step))) + 1;
  return fmt::format("{:.{}g}", value, std::clamp(digits, 1, 17));
}

namespace {

using L = ChartLayout;

struct Point {
  int64_t iteration = 0;
  double value = 0;
};

// One rank's values of one (layer, tensor, GEMM, statistic).
struct Series {
  std::vector<Point> points;  // by iteration, one per iteration
  int64_t repeated = 0;       // records of an iteration logged before (the last one is kept)
  int64_t nans = 0, pos_infs = 0, neg_infs = 0;
  int64_t non_finite() const { return nans + pos_infs + neg_infs; }
};

// `stat` is a histogram's base name where `histogram` is set; the flag keeps a histogram apart
// from an ordinary statistic that happens to be named like its base.
struct ChartKey {
  std::string tensor, gemm, stat;
  bool histogram = false;
  auto operator<=>(const ChartKey&) const = default;
};

using Chart = std::map<int, Series>;  // by rank

// A histogram's bin: an exponent k in [kMinExponent, kMaxExponent] (kMinExponent also holds
// everything below it) or kNonFiniteRow, which sorts above every exponent: the top row.
constexpr int kMinExponent = -127;
constexpr int kMaxExponent = 127;
constexpr int kNonFiniteRow = kMaxExponent + 1;

// One rank's scale-exponent histogram of one (layer, tensor, GEMM, base).
struct HistogramSeries {
  // Block counts by iteration, then bin. Every iteration with a record is here, even one whose
  // records were all invalid; a count of 0 is a bin without blocks, as an unlogged one.
  std::map<int64_t, std::map<int, double>> iterations;
  int64_t repeated = 0;  // records of a bin and iteration logged before (the last one is kept)
  int64_t invalid = 0;   // records whose value is no block count (NaN, Inf, negative)
};
using Histogram = std::map<int, HistogramSeries>;  // by rank

using Layer = std::map<ChartKey, std::variant<Chart, Histogram>>;

struct HistogramBin {
  std::string_view base;  // "mxfp8_scale_exponent_histogram"
  int bin = 0;
};

// Splits a histogram bin's statistic, "<base>_e<k>" or "<base>_nonfinite" with a base of
// [<prefix>_]scale_exponent_histogram[_columnwise]; nullopt for any other statistic (`foo_e5`).
std::optional<HistogramBin> histogram_bin(std::string_view stat) {
  const size_t underscore = stat.rfind('_');
  if (underscore == std::string_view::npos) return std::nullopt;
  const std::string_view base = stat.substr(0, underscore), suffix = stat.substr(underscore + 1);
  constexpr std::string_view kName = "scale_exponent_histogram", kColumnwise = "_columnwise";
  std::string_view name = base;
  if (name.ends_with(kColumnwise)) name.remove_suffix(kColumnwise.size());
  if (!name.ends_with(kName) ||
      (name.size() > kName.size() && name[name.size() - kName.size() - 1] != '_'))
    return std::nullopt;
  // The logger's spelling only (debug/stats.h: "e-12", not "e-012"), so that a bin has one name.
  const std::optional<int> bin = parse_exponent_bin(suffix);
  if (!bin) return std::nullopt;
  if (*bin == kNonFiniteBin) return HistogramBin{base, kNonFiniteRow};
  return HistogramBin{base, *bin - 127};  // bin b holds the scale_invs of 2^(b - 127)
}

void add_bin(HistogramSeries& s, int64_t iteration, int bin, double count) {
  std::map<int, double>& bins = s.iterations[iteration];
  if (!std::isfinite(count) || count < 0) {
    ++s.invalid;
    return;
  }
  if (!bins.insert_or_assign(bin, count).second) ++s.repeated;
}

// Tableau's palette without its red, which marks non-finite values. A tenth rank repeats the
// colours with dashed lines.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
                                    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr size_t kColours = sizeof kPalette / sizeof kPalette[0];
constexpr const char* kNonFiniteColour = "#d62728";
// Below this many points a series also gets a dot per point (a line alone hides the samples).
constexpr size_t kDotsUpTo = 40;

struct RankStyle {
  const char* colour;
  bool dashed;
};

std::string coord(long double v) { return fmt::format("{:.2f}", static_cast<double>(v)); }

double x_px(const Axis& a, double v) {
  const long double t =
      (static_cast<long double>(v) - a.lo) / (static_cast<long double>(a.hi) - a.lo);
  return static_cast<double>(L::kPlotLeft + t * (L::kPlotRight - L::kPlotLeft));
}
double y_px(const Axis& a, double v) {
  const long double t =
      (static_cast<long double>(v) - a.lo) / (static_cast<long double>(a.hi) - a.lo);
  return static_cast<double>(L::kPlotBottom - t * (L::kPlotBottom - L::kPlotTop));
}

std::string value_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{:.6g}", v);
}

std::string chart_title(const ChartKey& key) {
  return key.gemm.empty() ? fmt::format("{} · {}", key.tensor, key.stat)
                          : fmt::format("{} · {} ({} GEMM)", key.tensor, key.stat, key.gemm);
}

std::string non_finite_text(const Series& s) {
  std::vector<std::string> parts;
  if (s.nans) parts.push_back(fmt::format("{} NaN", s.nans));
  if (s.pos_infs) parts.push_back(fmt::format("{} +Inf", s.pos_infs));
  if (s.neg_infs) parts.push_back(fmt::format("{} -Inf", s.neg_infs));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// Sorts each series by iteration and keeps one value per iteration (the last logged: a log
// appended to by a rerun ends with the rerun's values), then counts the non-finite ones.
void settle(Series& s) {
  std::stable_sort(s.points.begin(), s.points.end(),
                   [](const Point& a, const Point& b) { return a.iteration < b.iteration; });
  std::vector<Point> kept;
  for (const Point& p : s.points) {
    if (!kept.empty() && kept.back().iteration == p.iteration) {
      kept.back() = p;
      ++s.repeated;
    } else {
      kept.push_back(p);
    }
  }
  s.points = std::move(kept);
  for (const Point& p : s.points) {
    if (std::isnan(p.value)) ++s.nans;
    if (std::isinf(p.value)) ++(p.value > 0 ? s.pos_infs : s.neg_infs);
  }
}

// `y_labels`: the text of each of y's ticks; `y_title`: the y axis's name.
void render_axes(std::string& out, const Axis& x, const Axis& y,
                 const std::vector<std::string>& y_labels, std::string_view y_title) {
  out += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="#fbfbfb" stroke="#888"/>)",
                     L::kPlotLeft, L::kPlotTop, L::kPlotRight - L::kPlotLeft,
                     L::kPlotBottom - L::kPlotTop);
  for (size_t i = 0; i < y.ticks.size(); ++i) {
    const std::string py = coord(y_px(y, y.ticks[i]));
    out += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#e2e2e2"/>)", L::kPlotLeft,
                       py, L::kPlotRight, py);
    out += fmt::format(R"(<text class="tick" x="{}" y="{}" text-anchor="end">{}</text>)",
                       L::kPlotLeft - 6, coord(y_px(y, y.ticks[i]) + 4), html_escape(y_labels[i]));
  }
  for (const double t : x.ticks) {
    const std::string px = coord(x_px(x, t));
    out += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#e2e2e2"/>)", px,
                       L::kPlotTop, px, L::kPlotBottom);
    out += fmt::format(R"(<text class="tick" x="{}" y="{}" text-anchor="middle">{}</text>)", px,
                       L::kPlotBottom + 16, html_escape(tick_label(t, x)));
  }
  out += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">iteration</text>)",
                     (L::kPlotLeft + L::kPlotRight) / 2, L::kHeight - 10);
  out +=
      fmt::format(R"~(<text transform="rotate(-90)" x="{}" y="14" text-anchor="middle">{}</text>)~",
                  -(L::kPlotTop + L::kPlotBottom) / 2, html_escape(y_title));
}

void render_series(std::string& out, int rank, const Series& s, const RankStyle& style,
                   const Axis& x, const Axis& y) {
  const std::string dash = style.dashed ? R"( stroke-dasharray="6 3")" : "";
  // Runs of finite values between non-finite ones: a NaN breaks the line rather than being
  // bridged, so the gap shows where it was.
  std::vector<std::vector<Point>> runs(1);
  for (const Point& p : s.points) {
    if (std::isfinite(p.value))
      runs.back().push_back(p);
    else if (!runs.back().empty())
      runs.emplace_back();
  }
  const bool dots = s.points.size() <= kDotsUpTo;
  for (const std::vector<Point>& run : runs) {
    if (run.size() >= 2) {
      std::string points;
      for (const Point& p : run)
        points += fmt::format("{}{},{}", points.empty() ? "" : " ",
                              coord(x_px(x, double(p.iteration))), coord(y_px(y, p.value)));
      out += fmt::format(
          R"(<polyline class="series" data-rank="{}" fill="none" stroke="{}" stroke-width="1.5"{} points="{}"/>)",
          rank, style.colour, dash, points);
    }
    if (run.size() == 1 || dots) {
      for (const Point& p : run)
        out += fmt::format(
            R"(<circle class="point" data-rank="{}" cx="{}" cy="{}" r="2.5" fill="{}"/>)", rank,
            coord(x_px(x, double(p.iteration))), coord(y_px(y, p.value)), style.colour);
    }
  }
}

// A dashed red line at each iteration with a non-finite value, labelled with the value.
void render_non_finite(std::string& out, const Chart& chart, const Axis& x) {
  // Labels closer than this to one already drawn would overprint it; the line alone marks them.
  constexpr double kLabelSpacing = 28;
  std::vector<double> labelled;
  for (const auto& [rank, series] : chart) {
    for (const Point& p : series.points) {
      if (std::isfinite(p.value)) continue;
      const std::string px = coord(x_px(x, double(p.iteration)));
      out += fmt::format(
          R"(<line class="nonfinite" data-rank="{}" x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="1.5" stroke-dasharray="4 3"><title>rank {}, iteration {}: {}</title></line>)",
          rank, px, L::kPlotTop, px, L::kPlotBottom, kNonFiniteColour, rank, p.iteration,
          value_text(p.value));
      const double at = x_px(x, double(p.iteration));
      if (std::none_of(labelled.begin(), labelled.end(),
                       [at](double l) { return std::fabs(l - at) < kLabelSpacing; })) {
        labelled.push_back(at);
        out += fmt::format(R"(<text class="nonfinite-label" x="{}" y="{}" fill="{}">{}</text>)",
                           coord(x_px(x, double(p.iteration)) + 3), L::kPlotTop + 11,
                           kNonFiniteColour, value_text(p.value));
      }
    }
  }
}

void render_chart(std::string& out, const ChartKey& key, const Chart& chart,
                  const std::map<int, RankStyle>& styles) {
  int64_t x_min = std::numeric_limits<int64_t>::max(), x_max = std::numeric_limits<int64_t>::min();
  double y_min = std::numeric_limits<double>::infinity(), y_max = -y_min;
  for (const auto& [rank, series] : chart) {
    for (const Point& p : series.points) {
      x_min = std::min(x_min, p.iteration);
      x_max = std::max(x_max, p.iteration);
      if (!std::isfinite(p.value)) continue;
      y_min = std::min(y_min, p.value);
      y_max = std::max(y_max, p.value);
    }
  }
  const Axis x = nice_axis(double(x_min), double(x_max), /*integer_steps=*/true);
  // Only non-finite values: an axis around 0 with the markers on it.
  const Axis y = y_min <= y_max ? nice_axis(y_min, y_max, false) : nice_axis(0, 0, false);
  const std::string title = html_escape(chart_title(key));
  out += fmt::format(
      R"(<figure class="chart"><svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" role="img" data-x-axis="{2} {3}" data-y-axis="{4} {5}"><title>{6}</title>)",
      L::kWidth, L::kHeight, x.lo, x.hi, y.lo, y.hi, title);
  out += fmt::format(R"(<text class="title" x="{}" y="22">{}</text>)", L::kPlotLeft, title);
  std::vector<std::string> y_labels;
  for (const double t : y.ticks) y_labels.push_back(tick_label(t, y));
  render_axes(out, x, y, y_labels, key.stat);
  render_non_finite(out, chart, x);
  for (const auto& [rank, series] : chart) render_series(out, rank, series, styles.at(rank), x, y);
  out += "</svg><figcaption><ul class=\"legend\">";
  for (const auto& [rank, series] : chart) {
    const RankStyle& style = styles.at(rank);
    const Point& last = series.points.back();
    out += fmt::format(
        R"(<li><span class="swatch" style="border-top-color:{};border-top-style:{}"></span>rank {}: {} point{}, last {} at iteration {})",
        style.colour, style.dashed ? "dashed" : "solid", rank, series.points.size(),
        series.points.size() == 1 ? "" : "s", value_text(last.value), last.iteration);
    if (series.non_finite() > 0)
      out += fmt::format(R"(; <span class="bad">{} not drawn</span>)", non_finite_text(series));
    if (series.repeated > 0)
      out += fmt::format("; {} repeated iteration{} (the last value kept)", series.repeated,
                         series.repeated == 1 ? "" : "s");
    out += "</li>";
  }
  out += "</ul></figcaption></figure>\n";
}

// ---- scale-exponent histograms -------------------------------------------------------------

std::string bin_text(int bin) {
  if (bin == kNonFiniteRow) return "non-finite";
  if (bin == kMinExponent) return fmt::format("2^{} or below", bin);
  return fmt::format("2^{}", bin);
}

// Block counts are whole numbers: written as such, not as 1.23457e+06.
std::string count_text(double count) {
  return count == std::floor(count) && count < 1e15 ? fmt::format("{}", static_cast<int64_t>(count))
                                                    : fmt::format("{:.6g}", count);
}

std::string share_text(double fraction) { return fmt::format("{:.3g}%", 100 * fraction); }

// White to ColorBrewer's darkest blue (#08306b) by the square root of the share of the
// iteration's blocks: a scale spreads its blocks over a handful of exponents, and linear shares of
// 10-30% would all be pale. It starts a little into the ramp so that a bin of a few blocks among
// millions still shows against the plot's background.
std::string ramp_colour(double fraction) {
  constexpr double kFloor = 0.12;
  const double t = kFloor + (1 - kFloor) * std::sqrt(std::clamp(fraction, 0.0, 1.0));
  const auto channel = [t](int dark) {
    return static_cast<int>(std::lround(255 + t * (dark - 255)));
  };
  return fmt::format("#{:02x}{:02x}{:02x}", channel(0x08), channel(0x30), channel(0x6b));
}

// The lowest and highest exponent holding blocks (lo > hi without any) and the non-finite
// blocks, of one iteration's bins or more.
struct HistogramRange {
  int lo = std::numeric_limits<int>::max();
  int hi = std::numeric_limits<int>::min();
  double non_finite = 0;
  void add(const std::map<int, double>& bins) {
    for (const auto& [bin, count] : bins) {
      if (count == 0) continue;
      if (bin == kNonFiniteRow) {
        non_finite += count;
      } else {
        lo = std::min(lo, bin);
        hi = std::max(hi, bin);
      }
    }
  }
};

HistogramRange histogram_range(const HistogramSeries& s) {
  HistogramRange r;
  for (const auto& entry : s.iterations) r.add(entry.second);
  return r;
}

// One iteration in a line, "2^-14..2^-3, mode 2^-8 (42%)": the exponents holding blocks and the
// bin holding the most (the lowest of equal ones; non-finite blocks count as a bin).
std::string iteration_summary(const std::map<int, double>& bins) {
  double total = 0;
  const std::pair<const int, double>* mode = nullptr;
  for (const auto& entry : bins) {
    total += entry.second;
    if (entry.second > 0 && (mode == nullptr || entry.second > mode->second)) mode = &entry;
  }
  if (mode == nullptr) return "no blocks";
  HistogramRange r;
  r.add(bins);
  const std::string range = r.lo > r.hi    ? "no finite scale"
                            : r.lo == r.hi ? fmt::format("2^{}", r.lo)
                                           : fmt::format("2^{}..2^{}", r.lo, r.hi);
  return fmt::format("{}, mode {} ({})", range, bin_text(mode->first),
                     share_text(mode->second / total));
}

// A column per logged iteration reaching halfway to its neighbours (one iteration wide alone),
// so that the columns tile the plot however sparsely the iterations were logged; a row per bin.
void render_cells(std::string& out, const HistogramSeries& s, const Axis& x, const Axis& y,
                  int non_finite_row) {
  std::vector<int64_t> iterations;
  for (const auto& entry : s.iterations) iterations.push_back(entry.first);
  for (size_t j = 0; j < iterations.size(); ++j) {
    const double at = double(iterations[j]);
    const bool has_previous = j > 0, has_next = j + 1 < iterations.size();
    const double to_next = has_next       ? (double(iterations[j + 1]) - at) / 2
                           : has_previous ? (at - double(iterations[j - 1])) / 2
                                          : 0.5;
    const double to_previous = has_previous ? (at - double(iterations[j - 1])) / 2 : to_next;
    const double left = x_px(x, std::max(at - to_previous, x.lo));
    const double right = x_px(x, std::min(at + to_next, x.hi));
    const std::map<int, double>& bins = s.iterations.at(iterations[j]);
    double total = 0;
    for (const auto& entry : bins) total += entry.second;
    for (const auto& [bin, count] : bins) {
      if (count == 0) continue;
      const int row = bin == kNonFiniteRow ? non_finite_row : bin;
      const double top = y_px(y, row + 0.5);
      out += fmt::format(
          R"(<rect class="cell" data-iteration="{}" data-exponent="{}" data-count="{}" x="{}" y="{}" width="{}" height="{}" fill="{}"><title>iteration {}, {}: {} block{} ({})</title></rect>)",
          iterations[j], bin == kNonFiniteRow ? "nonfinite" : fmt::format("{}", bin),
          count_text(count), coord(left), coord(top), coord(right - left),
          coord(y_px(y, row - 0.5) - top), ramp_colour(count / total), iterations[j], bin_text(bin),
          count_text(count), count == 1 ? "" : "s", share_text(count / total));
    }
  }
}

// One heatmap per rank, one below the other on the same axes so that the ranks line up: the
// exponents holding blocks anywhere in the histogram upwards, and a top row for the non-finite
// blocks where there are any.
void render_histogram(std::string& out, const ChartKey& key, const Histogram& histogram) {
  int64_t x_min = std::numeric_limits<int64_t>::max(), x_max = std::numeric_limits<int64_t>::min();
  HistogramRange range;
  for (const auto& [rank, series] : histogram) {
    x_min = std::min(x_min, series.iterations.begin()->first);
    x_max = std::max(x_max, series.iterations.rbegin()->first);
    const HistogramRange r = histogram_range(series);
    range.lo = std::min(range.lo, r.lo);
    range.hi = std::max(range.hi, r.hi);
    range.non_finite += r.non_finite;
  }
  // Without an exponent the rows start at 0.
  if (range.lo > range.hi) range = {0, -1, range.non_finite};
  const bool non_finite = range.non_finite > 0;
  const int non_finite_row = range.hi + 1;
  const Axis x = nice_axis(double(x_min), double(x_max), /*integer_steps=*/true);
  // Row k spans [k - 0.5, k + 0.5], so the axis holds exactly the rows drawn.
  Axis y;
  y.lo = range.lo - 0.5;
  y.hi = std::max(range.hi + (non_finite ? 1.5 : 0.5), y.lo + 1);
  std::vector<std::string> y_labels;
  if (range.lo <= range.hi) {
    const Axis steps = nice_axis(range.lo, range.hi, /*integer_steps=*/true);
    y.step = steps.step;
    for (const double t : steps.ticks) {
      if (t < range.lo || t > range.hi) continue;
      y.ticks.push_back(t);
      y_labels.push_back(fmt::format("2^{}", static_cast<int>(t)));
    }
  }
  if (non_finite) {
    // A label right below the non-finite row's would overprint it.
    constexpr double kLabelSpacing = 12;
    if (!y.ticks.empty() && y_px(y, y.ticks.back()) - y_px(y, non_finite_row) < kLabelSpacing) {
      y.ticks.pop_back();
      y_labels.pop_back();
    }
    y.ticks.push_back(non_finite_row);
    y_labels.emplace_back("NaN/Inf");
  }

  const std::string title = chart_title(key);
  out += "<figure class=\"chart heatmap\">";
  for (const auto& [rank, series] : histogram) {
    const std::string rank_title = html_escape(fmt::format("{} · rank {}", title, rank));
    out += fmt::format(
        R"(<div><svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" role="img" data-rank="{2}" data-x-axis="{3} {4}" data-y-axis="{5} {6}"><title>{7}</title>)",
        L::kWidth, L::kHeight, rank, x.lo, x.hi, y.lo, y.hi, rank_title);
    out += fmt::format(R"(<text class="title" x="{}" y="22">{}</text>)", L::kPlotLeft, rank_title);
    render_axes(out, x, y, y_labels, "scale exponent");
    // Anti-aliased edges would show a seam between every two cells.
    out += R"(<g shape-rendering="crispEdges">)";
    render_cells(out, series, x, y, non_finite_row);
    out += "</g>";
    if (non_finite && range.lo <= range.hi) {
      const std::string py = coord(y_px(y, range.hi + 0.5));
      out += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#888"/>)", L::kPlotLeft,
                         py, L::kPlotRight, py);
    }
    out += "</svg></div>";
  }
  out += "<figcaption><ul class=\"legend\"><li>Colour: the bin's share of the iteration's blocks";
  for (const int percent : {0, 10, 25, 50, 100})
    out += fmt::format(
        R"( <span style="display:inline-block;width:14px;height:10px;vertical-align:middle;border:1px solid #ccc;background:{}"></span> {}%)",
        ramp_colour(percent / 100.0), percent);
  out += "; no cell: no block</li>";
  for (const auto& [rank, series] : histogram) {
    const auto& [last_iteration, last_bins] = *series.iterations.rbegin();
    out += fmt::format("<li>rank {}: {} iteration{}; iteration {}: {}", rank,
                       series.iterations.size(), series.iterations.size() == 1 ? "" : "s",
                       last_iteration, iteration_summary(last_bins));
    const double blocks = histogram_range(series).non_finite;
    if (blocks > 0)
      out += fmt::format(R"(; <span class="bad">{} non-finite block{}</span>)", count_text(blocks),
                         blocks == 1 ? "" : "s");
    if (series.repeated > 0)
      out += fmt::format("; {} repeated record{} (the last value kept)", series.repeated,
                         series.repeated == 1 ? "" : "s");
    if (series.invalid > 0)
      out +=
          fmt::format(R"(; <span class="bad">{} record{} without a block count not drawn</span>)",
                      series.invalid, series.invalid == 1 ? "" : "s");
    out += "</li>";
  }
  out += "</ul></figcaption></figure>\n";
}

// A histogram's row of the table per rank: its iterations, the last one's summary
// (iteration_summary), the lowest and highest exponent of any iteration, the non-finite blocks.
void render_histogram_rows(std::string& out, const ChartKey& key, const Histogram& histogram) {
  for (const auto& [rank, series] : histogram) {
    const HistogramRange r = histogram_range(series);
    const auto& [last_iteration, last_bins] = *series.iterations.rbegin();
    out += fmt::format(
        R"(<tr><td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td><td{}>{}</td></tr>)",
        html_escape(key.tensor), key.gemm.empty() ? "—" : html_escape(key.gemm),
        html_escape(key.stat), rank, series.iterations.size(), last_iteration,
        iteration_summary(last_bins), r.lo <= r.hi ? fmt::format("2^{}", r.lo) : "—",
        r.lo <= r.hi ? fmt::format("2^{}", r.hi) : "—", r.non_finite > 0 ? R"( class="bad")" : "",
        r.non_finite > 0
            ? fmt::format("{} block{}", count_text(r.non_finite), r.non_finite == 1 ? "" : "s")
            : "0");
    out += "\n";
  }
}

// The last value (and range) of every series of a layer; a histogram's rows summarise it.
void render_table(std::string& out, const Layer& layer) {
  out +=
      "<table><thead><tr><th>tensor</th><th>GEMM</th><th>statistic</th><th>rank</th>"
      "<th>points</th><th>last iteration</th><th>last value</th><th>min</th><th>max</th>"
      "<th>non-finite</th></tr></thead><tbody>\n";
  for (const auto& [key, entry] : layer) {
    const Chart* chart = std::get_if<Chart>(&entry);
    if (chart == nullptr) {
      render_histogram_rows(out, key, std::get<Histogram>(entry));
      continue;
    }
    for (const auto& [rank, series] : *chart) {
      double lo = std::numeric_limits<double>::infinity(), hi = -lo;
      for (const Point& p : series.points) {
        if (!std::isfinite(p.value)) continue;
        lo = std::min(lo, p.value);
        hi = std::max(hi, p.value);
      }
      const Point& last = series.points.back();
      out += fmt::format(
          R"(<tr><td>{}</td><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num{}">{}</td><td class="num">{}</td><td class="num">{}</td><td{}>{}</td></tr>)",
          html_escape(key.tensor), key.gemm.empty() ? "—" : html_escape(key.gemm),
          html_escape(key.stat), rank, series.points.size(), last.iteration,
          std::isfinite(last.value) ? "" : " bad", value_text(last.value),
          lo <= hi ? value_text(lo) : "—", lo <= hi ? value_text(hi) : "—",
          series.non_finite() ? R"( class="bad")" : "",
          series.non_finite() ? non_finite_text(series) : "0");
      out += "\n";
    }
  }
  out += "</tbody></table>\n";
}

constexpr const char* kStyle =
    "body{font-family:sans-serif;margin:24px;color:#222;background:#fff}"
    "h1{font-size:22px;margin:0 0 8px}h2{font-size:18px;border-bottom:1px solid #ccc;"
    "padding-bottom:4px;margin-top:32px}"
    ".charts{display:flex;flex-wrap:wrap;gap:16px}"
    "figure{margin:0;border:1px solid #ddd;padding:8px;background:#fff}"
    "svg text{font-family:sans-serif;font-size:11px;fill:#333}"
    "svg text.title{font-size:13px;font-weight:bold}"
    ".legend{list-style:none;padding:0;margin:4px 0 0;font-size:12px;max-width:540px}"
    ".swatch{display:inline-block;width:24px;height:0;border-top-width:3px;"
    "vertical-align:middle;margin-right:6px}"
    ".bad{color:#d62728;font-weight:bold}"
    "table{border-collapse:collapse;font-size:12px;margin-top:16px}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}";

}  // namespace

std::string render_report(const std::vector<RankedRecord>& records, const ReportOptions& options) {
  std::map<std::string, Layer> layers;
  for (const RankedRecord& r : records) {
    const StatRecord& s = r.record;
    Layer& layer = layers[s.layer];
    if (const std::optional<HistogramBin> bin = histogram_bin(s.stat)) {
      const ChartKey key{s.tensor, s.gemm, std::string(bin->base), /*histogram=*/true};
      auto& histogram =
          std::get<Histogram>(layer.try_emplace(key, std::in_place_type<Histogram>).first->second);
      add_bin(histogram[r.rank], s.iteration, bin->bin, s.value);
    } else {
      std::get<Chart>(layer[{s.tensor, s.gemm, s.stat}])[r.rank].points.push_back(
          {s.iteration, s.value});
    }
  }
  std::map<int, RankStyle> styles;
  int64_t non_finite = 0, first_iteration = 0, last_iteration = 0;
  size_t charts = 0;
  bool any = false, histograms = false;
  const auto seen = [&](int rank, int64_t first, int64_t last) {
    styles.emplace(rank, RankStyle{});
    first_iteration = any ? std::min(first_iteration, first) : first;
    last_iteration = any ? std::max(last_iteration, last) : last;
    any = true;
  };
  for (auto& [name, layer] : layers) {
    for (auto& [key, entry] : layer) {
      ++charts;
      if (Chart* chart = std::get_if<Chart>(&entry)) {
        for (auto& [rank, series] : *chart) {
          settle(series);
          non_finite += series.non_finite();
          seen(rank, series.points.front().iteration, series.points.back().iteration);
        }
      } else {
        histograms = true;
        for (const auto& [rank, series] : std::get<Histogram>(entry))
          seen(rank, series.iterations.begin()->first, series.iterations.rbegin()->first);
      }
    }
  }
  // Colours by the rank's position among the ranks, so rank 0 is the same blue in every chart.
  size_t index = 0;
  std::string rank_list;
  for (auto& [rank, style] : styles) {
    style = {kPalette[index % kColours], index >= kColours};
    rank_list += fmt::format("{}{}", index == 0 ? "" : ", ", rank);
    ++index;
  }

  const std::string title = html_escape(options.title);
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{0}</title>"
      "<style>{1}</style></head><body>\n<h1>{0}</h1>\n",
      title, kStyle);
  if (!any) {
    out += "<p>No records.</p>\n</body></html>\n";
    return out;
  }
  out += fmt::format(
      "<p>{} records from {} rank{} ({}), {} layer{}, {} chart{}, iterations {} to {}. One chart "
      "per tensor, GEMM and statistic; one line per rank.{}</p>\n",
      records.size(), styles.size(), styles.size() == 1 ? "" : "s", rank_list, layers.size(),
      layers.size() == 1 ? "" : "s", charts, charts == 1 ? "" : "s", first_iteration,
      last_iteration,
      histograms ? " A scale-exponent histogram is one chart, a heatmap per rank: per iteration "
                   "the share of the blocks whose scale has each exponent."
                 : "");
  if (non_finite > 0)
    out += fmt::format(
        "<p class=\"bad\">{} non-finite value{} (NaN, +-Inf): left out of the lines, marked "
        "with dashed red lines.</p>\n",
        non_finite, non_finite == 1 ? "" : "s");
  out += "<nav><ul>\n";
  size_t id = 0;
  for (const auto& [name, layer] : layers)
    out += fmt::format("<li><a href=\"#layer-{}\">{}</a> ({} chart{})</li>\n", id++,
                       html_escape(name), layer.size(), layer.size() == 1 ? "" : "s");
  out += "</ul></nav>\n";
  id = 0;
  for (const auto& [name, layer] : layers) {
    out += fmt::format("<section id=\"layer-{}\"><h2>Layer {}</h2>\n<div class=\"charts\">\n", id++,
                       html_escape(name));
    for (const auto& [key, entry] : layer) {
      if (const Chart* chart = std::get_if<Chart>(&entry))
        render_chart(out, key, *chart, styles);
      else
        render_histogram(out, key, std::get<Histogram>(entry));
    }
    out += "</div>\n";
    render_table(out, layer);
    out += "</section>\n";
  }
  out += "</body></html>\n";
  return out;
}

}  // namespace opfuse::debug
