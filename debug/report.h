// The precision-debug report (`fusec debug-report`): the logged statistics of a run drawn as one
// self-contained HTML page of inline SVG charts. No scripts, fonts or styles from elsewhere, so
// the page can be mailed or attached to a bug; the same records give the same bytes.
//
// Layout: a section per layer (sorted by name); in it one chart per (tensor, GEMM, statistic),
// because statistics of one tensor have unrelated scales (a max next to an underflow percentage
// would flatten one of them); in a chart one line per rank (ranks are not merged: a rank that
// diverges is what one looks for). NaN and +-Inf values are left out of the lines, marked in the
// chart with a dashed red line at their iteration and counted in the legend and the table.
//
// A scale-exponent histogram (docs/debugging.md) comes as one record per non-empty bin, named
// `<base>_e<k>` (k in -127..127, e-127 holding 2^-127 and below) or `<base>_nonfinite`, with a base
// of [<recipe>_]scale_exponent_histogram[_columnwise]; a line per bin would scatter one
// distribution over dozens of charts, so each (tensor, GEMM, base) is one chart instead: a heatmap
// per rank, one below the other on the same axes. Across: the iterations (the line charts' axis),
// a column per logged iteration reaching halfway to its neighbours. Up: a row per exponent between
// the lowest and highest holding blocks anywhere in the histogram, and a top row of non-finite
// blocks where there are any. A cell's colour is the bin's share of that rank's iteration's blocks
// (white to dark blue, the legend gives the ramp); a bin not logged, or logged as 0, has no cell.
// Each cell is a <rect class="cell"> with data-iteration, data-exponent (k, or "nonfinite") and
// data-count, and a <title> for hover; each heatmap's <svg> carries data-rank, and its
// data-y-axis puts row k at [k - 0.5, k + 0.5] (the non-finite row is the one above the highest
// exponent). In the table a histogram has a row per rank: "points" are its iterations, "last
// value" summarises the last iteration as "2^lo..2^hi, mode 2^m (share)" (the exponents holding
// blocks and the bin holding the most, the lower of equal ones), "min" and "max" are the lowest
// and highest exponent of any iteration, "non-finite" the non-finite blocks of all iterations. A
// bin logged twice for an iteration keeps its last count; a value that is no count (NaN, Inf,
// negative) is left out and counted in the legend. A statistic that only ends like a bin (`foo_e5`)
// is an ordinary one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "debug/report_logs.h"

namespace opfuse::debug {

struct ReportOptions {
  std::string title = "opfuse precision-debug report";
};

// Renders `records` (any order; see report_logs.h) as the HTML page.
std::string render_report(const std::vector<RankedRecord>& records,
                          const ReportOptions& options = {});

// ---- exposed for tests: where the chart puts a value ------------------------------------------

// Every chart's SVG is kWidth x kHeight; the plot area spans [kPlotLeft, kPlotRight] x
// [kPlotTop, kPlotBottom] (y grows downwards). Each <svg> also carries its axes' ranges as
// data-x-axis="lo hi" and data-y-axis="lo hi", so a point's coordinates can be mapped back.
struct ChartLayout {
  static constexpr double kWidth = 540;
  static constexpr double kHeight = 290;
  static constexpr double kPlotLeft = 72;
  static constexpr double kPlotRight = 525;
  static constexpr double kPlotTop = 36;
  static constexpr double kPlotBottom = 240;
};

// An axis over [min, max] (finite, min <= max): a range widened to multiples of a 1/2/5 x 10^k
// step and the ticks in it. A constant series (min == max, or a spread below 1e-12 of the
// magnitude) gets a range centred on it, so its line sits mid-chart. `integer_steps`: ticks only
// at whole numbers (iterations).
struct Axis {
  double lo = 0;
  double hi = 1;
  double step = 1;
  std::vector<double> ticks;
};
Axis nice_axis(double min, double max, bool integer_steps);

// A tick's label: as many significant digits as the step needs to tell neighbours apart.
std::string tick_label(double value, const Axis& axis);

// HTML-escapes text for element content and attribute values; control characters become U+FFFD.
std::string html_escape(std::string_view text);

}  // namespace opfuse::debug
