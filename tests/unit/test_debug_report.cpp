// The precision-debug report (debug/report.h) and its log reader (debug/report_logs.h): one
// <svg> per (layer, tensor, GEMM, statistic), points where the values put them (read back from
// the page), escaping, non-finite values left out of the lines and counted, scale-exponent
// histograms as one heatmap per rank with a cell per logged bin, and the same bytes for the same
// records. The command line and the rendered page are test_fusec_debug_report.cpp
// and test_debug_report_screenshot.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "debug/report.h"
#include "debug/report_logs.h"
#include "test_support.h"

namespace opfuse::debug {
namespace {

using test::count;

using L = ChartLayout;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The value of every `attribute="..."` in `text`, in order.
std::vector<std::string> attributes(const std::string& text, const std::string& attribute) {
  std::vector<std::string> values;
  const std::string key = " " + attribute + "=\"";
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    const size_t begin = at + key.size();
    values.push_back(text.substr(begin, text.find('"', begin) - begin));
  }
  return values;
}

// Each chart's <svg>...</svg>, in page order.
std::vector<std::string> charts(const std::string& html) {
  std::vector<std::string> out;
  for (size_t at = html.find("<svg "); at != std::string::npos; at = html.find("<svg ", at + 1))
    out.push_back(html.substr(at, html.find("</svg>", at) - at));
  return out;
}

struct Pixel {
  double x, y;
};
std::vector<Pixel> parse_points(const std::string& points) {
  std::vector<Pixel> out;
  std::istringstream in(points);
  std::string pair;
  while (in >> pair) {
    const size_t comma = pair.find(',');
    out.push_back({std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1))});
  }
  return out;
}

// A chart's axis range from its data-x-axis / data-y-axis attribute.
std::pair<double, double> axis_range(const std::string& svg, const std::string& attribute) {
  std::istringstream in(attributes(svg, attribute).at(0));
  double lo = 0, hi = 0;
  in >> lo >> hi;
  return {lo, hi};
}

// Maps a point of a chart back to (iteration, value).
std::pair<double, double> unmap(const std::string& svg, Pixel p) {
  const auto [x_lo, x_hi] = axis_range(svg, "data-x-axis");
  const auto [y_lo, y_hi] = axis_range(svg, "data-y-axis");
  return {x_lo + (p.x - L::kPlotLeft) / (L::kPlotRight - L::kPlotLeft) * (x_hi - x_lo),
          y_lo + (L::kPlotBottom - p.y) / (L::kPlotBottom - L::kPlotTop) * (y_hi - y_lo)};
}

RankedRecord rec(int rank, const std::string& layer, const std::string& tensor,
                 const std::string& gemm, const std::string& stat, int64_t iteration,
                 double value) {
  return {rank, {layer, tensor, gemm, stat, iteration, value}};
}

// Two layers, four charts; fc1's activation max is 0, 5, 10 at iterations 0, 5, 10.
std::vector<RankedRecord> sample() {
  std::vector<RankedRecord> r;
  for (const int64_t i : {0, 5, 10}) {
    r.push_back(rec(0, "fc1", "activation", "", "max", i, double(i)));
    r.push_back(rec(1, "fc1", "activation", "", "max", i, 2.0 * double(i)));
    r.push_back(rec(0, "fc1", "activation", "", "std", i, 0.25 * double(i)));
    r.push_back(rec(0, "fc1", "weight", "fprop", "underflows%", i, 1.5));
    r.push_back(rec(0, "fc2", "gradient", "", "min", i, -double(i)));
  }
  return r;
}

TEST(DebugReport, OneSvgPerChartInLayerOrder) {
  const std::string html = render_report(sample());
  EXPECT_EQ(count(html, "<svg "), 4u);
  EXPECT_EQ(count(html, "<section "), 2u);
  EXPECT_LT(html.find("Layer fc1"), html.find("Layer fc2"));
  // Charts of a layer: by tensor, then GEMM, then statistic.
  const size_t max = html.find("activation · max"), std = html.find("activation · std"),
               fprop = html.find("weight · underflows% (fprop GEMM)");
  EXPECT_LT(max, std);
  EXPECT_LT(std, fprop);
  ASSERT_NE(fprop, std::string::npos);
  // Nothing from elsewhere: no scripts, links or remote URLs (the SVG namespace is a name).
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(count(html, "http"), count(html, "http://www.w3.org/2000/svg"));
}

TEST(DebugReport, PointsMapTheValuesToTheirCoordinates) {
  const std::vector<std::string> svgs = charts(render_report(sample()));
  ASSERT_EQ(svgs.size(), 4u);
  const std::string& max = svgs[0];  // fc1 activation max: ranks 0 and 1
  EXPECT_EQ(attributes(max, "data-x-axis").at(0), "0 10");
  EXPECT_EQ(attributes(max, "data-y-axis").at(0), "0 20");
  const std::vector<std::string> lines = attributes(max, "points");
  ASSERT_EQ(lines.size(), 2u);  // one line per rank
  // A line and a dot per point (few points) for each rank, rank 0 first.
  EXPECT_EQ(attributes(max, "data-rank"),
            (std::vector<std::string>{"0", "0", "0", "0", "1", "1", "1", "1"}));
  // Rank 0: (0, 0), (5, 5), (10, 10) on a 0..10 x 0..20 frame.
  const double mid_x = (L::kPlotLeft + L::kPlotRight) / 2;
  const double quarter_y = L::kPlotBottom - (L::kPlotBottom - L::kPlotTop) / 4;
  const double half_y = (L::kPlotBottom + L::kPlotTop) / 2;
  const std::vector<Pixel> rank0 = parse_points(lines[0]);
  ASSERT_EQ(rank0.size(), 3u);
  EXPECT_NEAR(rank0[0].x, L::kPlotLeft, 0.01);
  EXPECT_NEAR(rank0[0].y, L::kPlotBottom, 0.01);
  EXPECT_NEAR(rank0[1].x, mid_x, 0.01);
  EXPECT_NEAR(rank0[1].y, quarter_y, 0.01);
  EXPECT_NEAR(rank0[2].x, L::kPlotRight, 0.01);
  EXPECT_NEAR(rank0[2].y, half_y, 0.01);
  // Read back through the axis attributes, every chart's points give the logged values.
  const std::vector<Pixel> rank1 = parse_points(lines[1]);
  for (size_t i = 0; i < 3; ++i) {
    const auto [iteration, value] = unmap(max, rank1[i]);
    EXPECT_NEAR(iteration, 5.0 * double(i), 0.05);
    EXPECT_NEAR(value, 10.0 * double(i), 0.05);
  }
  const std::vector<Pixel> gradient = parse_points(attributes(svgs[3], "points").at(0));
  ASSERT_EQ(gradient.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(unmap(svgs[3], gradient[i]).second, -5.0 * i, 0.05);
}

TEST(DebugReport, ConstantSeriesAndSinglePointSitMidChart) {
  const std::vector<std::string> svgs = charts(render_report(sample()));
  // underflows% is 1.5 throughout: a flat line halfway up.
  const std::vector<Pixel> flat = parse_points(attributes(svgs[2], "points").at(0));
  for (const Pixel& p : flat) EXPECT_NEAR(p.y, (L::kPlotTop + L::kPlotBottom) / 2, 0.01);
  EXPECT_NEAR(unmap(svgs[2], flat[0]).second, 1.5, 1e-3);

  const std::string one = charts(render_report({rec(3, "l", "t", "", "s", 7, 0.0)})).at(0);
  EXPECT_EQ(attributes(one, "points").size(), 0u);  // no line through one point: a dot
  ASSERT_EQ(attributes(one, "cx").size(), 1u);
  EXPECT_NEAR(std::stod(attributes(one, "cx")[0]), (L::kPlotLeft + L::kPlotRight) / 2, 0.01);
  EXPECT_NEAR(std::stod(attributes(one, "cy")[0]), (L::kPlotTop + L::kPlotBottom) / 2, 0.01);
  EXPECT_NE(one.find(">7</text>"), std::string::npos);  // the iteration's tick
}

TEST(DebugReport, TextFromTheLogsIsEscaped) {
  const std::string html = render_report({rec(0, "a<b&\"c", "t'<x>", "g&", "s\"", 1, 1.0)},
                                         {"<script>alert(1)</script>"});
  EXPECT_EQ(html.find("a<b"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("t'<x>"), std::string::npos);
  EXPECT_NE(html.find("Layer a&lt;b&amp;&quot;c</h2>"), std::string::npos);
  EXPECT_NE(html.find("t&#39;&lt;x&gt;"), std::string::npos);
  EXPECT_NE(html.find("<title>&lt;script&gt;alert(1)&lt;/script&gt;</title>"), std::string::npos);
  EXPECT_EQ(html_escape(std::string("a\x01z", 3)), "a&#xFFFD;z");
}

TEST(DebugReport, NonFiniteValuesAreSkippedMarkedAndCounted) {
  std::vector<RankedRecord> r;
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> values = {1, 2, kNaN, 4, inf, 6, -inf};
  for (size_t i = 0; i < values.size(); ++i)
    r.push_back(rec(0, "fc1", "activation", "", "max", int64_t(i), values[i]));
  const std::string html = render_report(r);
  const std::string svg = charts(html).at(0);
  // Broken at each non-finite value: 1,2 | 4 | 6 -> one line of two points and two dots.
  const std::vector<std::string> lines = attributes(svg, "points");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(parse_points(lines[0]).size(), 2u);
  for (const std::string a : {"points", "cx", "cy"})
    for (const std::string& v : attributes(svg, a)) {
      EXPECT_EQ(v.find("nan"), std::string::npos) << v;
      EXPECT_EQ(v.find("inf"), std::string::npos) << v;
    }
  // The y axis comes from the finite values only.
  EXPECT_EQ(attributes(svg, "data-y-axis").at(0), "1 6");
  EXPECT_EQ(count(svg, "class=\"nonfinite\""), 3u);
  EXPECT_NE(svg.find("iteration 2: NaN"), std::string::npos);
  EXPECT_NE(html.find("1 NaN, 1 +Inf, 1 -Inf not drawn"), std::string::npos);
  EXPECT_NE(html.find("3 non-finite values"), std::string::npos);
  // The table's last value is the last logged one, -Inf.
  EXPECT_NE(html.find(">-Inf</td>"), std::string::npos);

  // Only NaN: no line, the markers on a default axis.
  const std::string nan_only = charts(render_report({rec(0, "l", "t", "", "s", 0, kNaN)})).at(0);
  EXPECT_EQ(attributes(nan_only, "points").size(), 0u);
  EXPECT_EQ(count(nan_only, "class=\"nonfinite\""), 1u);
}

TEST(DebugReport, RepeatedIterationsKeepTheLastValue) {
  const std::string svg =
      charts(render_report({rec(0, "l", "t", "", "s", 0, 1.0), rec(0, "l", "t", "", "s", 1, 2.0),
                            rec(0, "l", "t", "", "s", 1, 3.0)}))
          .at(0);
  const std::vector<Pixel> p = parse_points(attributes(svg, "points").at(0));
  ASSERT_EQ(p.size(), 2u);
  EXPECT_NEAR(unmap(svg, p[1]).second, 3.0, 1e-3);
}

TEST(DebugReport, SameRecordsSameBytesInAnyOrder) {
  std::vector<RankedRecord> r = sample();
  const std::string first = render_report(r);
  EXPECT_EQ(render_report(r), first);
  std::reverse(r.begin(), r.end());
  EXPECT_EQ(render_report(r), first);
  EXPECT_NE(render_report({}).find("No records."), std::string::npos);
}

TEST(DebugReport, NiceAxes) {
  const Axis a = nice_axis(0.13, 0.92, false);
  EXPECT_DOUBLE_EQ(a.lo, 0.0);
  EXPECT_DOUBLE_EQ(a.hi, 1.0);
  EXPECT_EQ(a.ticks.size(), 6u);
  std::vector<std::string> labels;
  for (const double t : a.ticks) labels.push_back(tick_label(t, a));
  EXPECT_EQ(labels, (std::vector<std::string>{"0", "0.2", "0.4", "0.6", "0.8", "1"}));
  const Axis iterations = nice_axis(3, 3, true);
  EXPECT_EQ(iterations.ticks, std::vector<double>{3});
  EXPECT_LT(iterations.lo, 3);
  EXPECT_GT(iterations.hi, 3);
  const Axis tiny = nice_axis(1e-7, 5e-7, false);
  EXPECT_EQ(tick_label(tiny.ticks.at(1), tiny), "1e-07");
  const Axis huge = nice_axis(-1e308, 1.7e308, false);  // the spread overflows a double
  EXPECT_TRUE(std::isfinite(huge.lo) && std::isfinite(huge.hi));
  EXPECT_GE(huge.ticks.size(), 2u);
}

// ---- scale-exponent histograms ------------------------------------------------------------------

// The heatmaps of a page: the <svg>s that carry a rank (a line chart's lines carry theirs).
std::vector<std::string> heatmaps(const std::string& html) {
  std::vector<std::string> out;
  for (const std::string& svg : charts(html))
    if (svg.substr(0, svg.find('>')).find(" data-rank=") != std::string::npos) out.push_back(svg);
  return out;
}

struct Cell {
  std::string iteration, exponent, count, fill, title;
  double x, y, width, height;
};
// A heatmap's <rect class="cell">s, in page order.
std::vector<Cell> cells(const std::string& svg) {
  std::vector<Cell> out;
  const std::string open = "<rect class=\"cell\"";
  for (size_t at = svg.find(open); at != std::string::npos; at = svg.find(open, at + 1)) {
    const std::string rect = svg.substr(at, svg.find("</rect>", at) - at);
    const size_t title = rect.find("<title>") + 7;
    out.push_back(
        {attributes(rect, "data-iteration").at(0), attributes(rect, "data-exponent").at(0),
         attributes(rect, "data-count").at(0), attributes(rect, "fill").at(0),
         rect.substr(title, rect.find("</title>") - title), std::stod(attributes(rect, "x").at(0)),
         std::stod(attributes(rect, "y").at(0)), std::stod(attributes(rect, "width").at(0)),
         std::stod(attributes(rect, "height").at(0))});
  }
  return out;
}

// (iteration, exponent, count) of each cell.
std::vector<std::string> cell_keys(const std::string& svg) {
  std::vector<std::string> out;
  for (const Cell& c : cells(svg)) out.push_back(c.iteration + " " + c.exponent + " " + c.count);
  return out;
}

// fc1's activation (fprop GEMM) MXFP8 histogram at iterations 0, 5, 10 on ranks 0 and 1; rank 1
// has non-finite blocks at iteration 10.
std::vector<RankedRecord> histogram_sample() {
  const std::string base = "mxfp8_scale_exponent_histogram_";
  const auto bin = [&](int rank, int64_t iteration, const std::string& name, double count) {
    return rec(rank, "fc1", "activation", "fprop", base + name, iteration, count);
  };
  return {bin(0, 0, "e-3", 10),  bin(0, 0, "e-2", 90),        bin(0, 5, "e-2", 100),
          bin(0, 5, "e-3", 0),   bin(0, 5, "e-9", 0),         bin(0, 10, "e-4", 1),
          bin(0, 10, "e-2", 9),  bin(1, 0, "e-2", 50),        bin(1, 0, "e-1", 50),
          bin(1, 5, "e-2", 100), bin(1, 10, "nonfinite", 10), bin(1, 10, "e-2", 40)};
}

TEST(DebugReportHistogram, OneHeatmapPerRankWithACellPerBin) {
  const std::string html = render_report(histogram_sample());
  // One chart: no line per bin.
  EXPECT_EQ(count(html, "<svg "), 2u);
  EXPECT_EQ(count(html, "<figure "), 1u);
  EXPECT_EQ(html.find("<polyline"), std::string::npos);
  EXPECT_EQ(html.find("histogram_e"), std::string::npos);
  EXPECT_NE(html.find("1 chart,"), std::string::npos);
  const std::vector<std::string> svgs = heatmaps(html);
  ASSERT_EQ(svgs.size(), 2u);
  EXPECT_EQ(attributes(svgs[0], "data-rank").at(0), "0");
  EXPECT_EQ(attributes(svgs[1], "data-rank").at(0), "1");
  EXPECT_NE(svgs[0].find("activation · mxfp8_scale_exponent_histogram (fprop GEMM) · rank 0"),
            std::string::npos);

  // A cell per nonzero (iteration, bin): the logged zeros have none.
  EXPECT_EQ(cell_keys(svgs[0]),
            (std::vector<std::string>{"0 -3 10", "0 -2 90", "5 -2 100", "10 -4 1", "10 -2 9"}));
  EXPECT_EQ(cell_keys(svgs[1]), (std::vector<std::string>{"0 -2 50", "0 -1 50", "5 -2 100",
                                                          "10 -2 40", "10 nonfinite 10"}));
  const std::vector<Cell> rank0 = cells(svgs[0]), rank1 = cells(svgs[1]);
  EXPECT_EQ(rank0[0].title, "iteration 0, 2^-3: 10 blocks (10%)");
  EXPECT_EQ(rank0[3].title, "iteration 10, 2^-4: 1 block (10%)");
  EXPECT_EQ(rank1[4].title, "iteration 10, non-finite: 10 blocks (20%)");
  // The colour is the share of the iteration's blocks, not the count.
  EXPECT_EQ(rank0[2].fill, "#08306b");  // 100%
  EXPECT_NE(rank0[0].fill, rank0[2].fill);
  EXPECT_NE(rank0[0].fill, rank0[1].fill);  // 10% and 90% of one iteration
  EXPECT_EQ(rank0[0].fill, rank0[3].fill);  // 10 of 100 and 1 of 10
  EXPECT_EQ(rank0[1].fill, rank0[4].fill);  // 90 of 100 and 9 of 10
  EXPECT_EQ(rank0[2].fill, rank1[2].fill);

  // Rows -4..-1 (seen on either rank; the logged 0 at e-9 is no row) and the non-finite row on
  // top, on both ranks' heatmaps.
  for (const std::string& svg : svgs) {
    EXPECT_EQ(attributes(svg, "data-y-axis").at(0), "-4.5 0.5");
    EXPECT_EQ(attributes(svg, "data-x-axis").at(0), "0 10");
    EXPECT_NE(svg.find(">NaN/Inf</text>"), std::string::npos);
    EXPECT_EQ(svg.find("2^-9"), std::string::npos);
  }
  // Read back through the axes: iteration 5's column reaches halfway to 0 and to 10, a row is
  // one exponent high.
  const Cell& middle = rank0[2];
  const auto [iteration, exponent] =
      unmap(svgs[0], {middle.x + middle.width / 2, middle.y + middle.height / 2});
  EXPECT_NEAR(iteration, 5, 0.01);
  EXPECT_NEAR(exponent, -2, 0.01);
  EXPECT_NEAR(middle.width, (L::kPlotRight - L::kPlotLeft) / 2, 0.02);
  EXPECT_NEAR(middle.height, (L::kPlotBottom - L::kPlotTop) / 5, 0.02);
  EXPECT_NEAR(rank0[0].x, L::kPlotLeft, 0.01);  // the first column starts at the axis
  const Cell& non_finite = rank1[4];
  EXPECT_NEAR(unmap(svgs[1], {non_finite.x, non_finite.y + non_finite.height / 2}).second, 0, 0.01);

  // The table: a row per rank, the last iteration summarised.
  EXPECT_EQ(count(html, "<tr><td>activation</td>"), 2u);
  EXPECT_NE(html.find("<td>2^-4..2^-2, mode 2^-2 (90%)</td><td class=\"num\">2^-4</td><td "
                      "class=\"num\">2^-2</td><td>0</td>"),
            std::string::npos);
  EXPECT_NE(html.find("<td>2^-2, mode 2^-2 (80%)</td><td class=\"num\">2^-2</td><td "
                      "class=\"num\">2^-1</td><td class=\"bad\">10 blocks</td>"),
            std::string::npos);
  // The ramp's legend.
  EXPECT_NE(html.find("background:#08306b\"></span> 100%"), std::string::npos);
  EXPECT_EQ(count(html, "non-finite blocks</span>"), 1u);  // rank 1's only
}

TEST(DebugReportHistogram, NonFiniteRowOnlyWhenLogged) {
  std::vector<RankedRecord> r = histogram_sample();
  r.erase(
      std::remove_if(r.begin(), r.end(),
                     [](const RankedRecord& x) { return x.record.stat.ends_with("nonfinite"); }),
      r.end());
  for (const std::string& svg : heatmaps(render_report(r))) {
    EXPECT_EQ(attributes(svg, "data-y-axis").at(0), "-4.5 -0.5");
    EXPECT_EQ(svg.find("NaN/Inf"), std::string::npos);
    EXPECT_EQ(svg.find("nonfinite"), std::string::npos);
  }
  // Only non-finite blocks: the one row.
  const std::string html =
      render_report({rec(2, "l", "weight", "", "scale_exponent_histogram_nonfinite", 3, 4)});
  const std::string svg = heatmaps(html).at(0);
  EXPECT_EQ(attributes(svg, "data-y-axis").at(0), "-0.5 0.5");
  EXPECT_EQ(cell_keys(svg), std::vector<std::string>{"3 nonfinite 4"});
  EXPECT_NE(html.find("<td>no finite scale, mode non-finite (100%)</td>"), std::string::npos);
}

TEST(DebugReportHistogram, BasesAreSeparateChartsAndOtherNamesAreLines) {
  std::vector<RankedRecord> r;
  for (const std::string stat :
       {"scale_exponent_histogram_e0", "scale_exponent_histogram_columnwise_e0",
        "mxfp8_scale_exponent_histogram_e1",
        "fp8_block_scaling_scale_exponent_histogram_columnwise_e-3",
        // Not histogram bins: no base, a base without its `_`, the exponent spelled otherwise
        // or out of range, no exponent.
        "foo_e5", "xscale_exponent_histogram_e1", "scale_exponent_histogram_e-012",
        "scale_exponent_histogram_e128", "scale_exponent_histogram_e"})
    r.push_back(rec(0, "fc1", "activation", "", stat, 0, 4));
  const std::string html = render_report(r);
  const std::vector<std::string> maps = heatmaps(html);
  ASSERT_EQ(maps.size(), 4u);
  // In the order of their base names.
  const std::vector<std::string> bases = {
      "fp8_block_scaling_scale_exponent_histogram_columnwise", "mxfp8_scale_exponent_histogram",
      "scale_exponent_histogram", "scale_exponent_histogram_columnwise"};
  const std::vector<std::string> exponents = {"-3", "1", "0", "0"};
  for (size_t i = 0; i < maps.size(); ++i) {
    EXPECT_NE(maps[i].find("<title>activation · " + bases[i] + " · rank 0</title>"),
              std::string::npos)
        << i;
    const std::vector<Cell> c = cells(maps[i]);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].exponent, exponents[i]);
    // One iteration: its column is the whole plot.
    EXPECT_NEAR(c[0].x, L::kPlotLeft, 0.01);
    EXPECT_NEAR(c[0].width, L::kPlotRight - L::kPlotLeft, 0.01);
  }
  EXPECT_EQ(count(html, "<svg "), 9u);
  EXPECT_EQ(count(html, "class=\"cell\""), 4u);
  for (const std::string stat :
       {"foo_e5", "xscale_exponent_histogram_e1", "scale_exponent_histogram_e-012",
        "scale_exponent_histogram_e128", "scale_exponent_histogram_e"})
    EXPECT_NE(html.find("<title>activation · " + stat + "</title>"), std::string::npos) << stat;
  EXPECT_EQ(count(html, "class=\"point\""), 5u);  // a dot each
}

TEST(DebugReportHistogram, RepeatedBinsKeepTheLastCountAndNonCountsAreLeftOut) {
  const std::string stat = "scale_exponent_histogram_e-7";
  const std::string html =
      render_report({rec(0, "l", "t", "", stat, 0, 5), rec(0, "l", "t", "", stat, 0, 7),
                     rec(0, "l", "t", "", "scale_exponent_histogram_e-6", 0, kNaN),
                     rec(0, "l", "t", "", "scale_exponent_histogram_e-5", 1, -1)});
  const std::string svg = heatmaps(html).at(0);
  EXPECT_EQ(cell_keys(svg), std::vector<std::string>{"0 -7 7"});
  EXPECT_EQ(attributes(svg, "data-y-axis").at(0), "-7.5 -6.5");
  EXPECT_NE(html.find("1 repeated record (the last value kept)"), std::string::npos);
  EXPECT_NE(html.find("2 records without a block count not drawn"), std::string::npos);
  // Iteration 1 had only the negative count: in the table, nothing to summarise.
  EXPECT_NE(html.find("<td>no blocks</td>"), std::string::npos);
}

TEST(DebugReportHistogram, SameBytesInAnyOrderAndEscaped) {
  std::vector<RankedRecord> r = histogram_sample();
  for (RankedRecord& x : r) {
    x.record.layer = "a<b&\"c";
    x.record.tensor = "t'<x>";
  }
  r.push_back(rec(0, "a<b&\"c", "t'<x>", "", "max", 0, 1.0));
  const std::string first = render_report(r);
  EXPECT_EQ(render_report(r), first);
  std::reverse(r.begin(), r.end());
  EXPECT_EQ(render_report(r), first);
  EXPECT_EQ(first.find("a<b"), std::string::npos);
  EXPECT_EQ(first.find("t'<x>"), std::string::npos);
  EXPECT_NE(first.find("Layer a&lt;b&amp;&quot;c</h2>"), std::string::npos);
  EXPECT_NE(first.find("<title>t&#39;&lt;x&gt; · mxfp8_scale_exponent_histogram (fprop GEMM) · "
                       "rank 1</title>"),
            std::string::npos);
  EXPECT_NE(first.find("<tr><td>t&#39;&lt;x&gt;</td><td>fprop</td><td>mxfp8_scale_exponent_"
                       "histogram</td>"),
            std::string::npos);
  // Self-contained still: nothing fetched, nothing run.
  EXPECT_EQ(first.find("<script"), std::string::npos);
  EXPECT_EQ(count(first, "http"), count(first, "http://www.w3.org/2000/svg"));
}

// ---- the log reader -----------------------------------------------------------------------------

std::string make_logs(const std::vector<std::pair<std::string, std::string>>& files) {
  const std::string dir = test::make_temp_dir("debug-report");
  std::filesystem::create_directories(dir + "/opfuse_statistics");
  for (const auto& file : files)
    std::ofstream(dir + "/opfuse_statistics/" + file.first, std::ios::binary) << file.second;
  return dir;
}

std::string line(const StatRecord& r) { return format_json_line(r) + "\n"; }

TEST(DebugReportLogs, ReadsEveryRankInRankOrder) {
  const StatRecord a{"fc1", "activation", "", "max", 0, 1.0};
  const StatRecord b{"fc1", "activation", "", "max", 1, kNaN};
  const std::string dir = make_logs({{"globalrank-10.jsonl", line(a)},
                                     {"globalrank-9.jsonl", line(a) + line(b)},
                                     {"notes.txt", "not a log"}});
  const StatisticsLogs logs = read_statistics_logs(dir);
  ASSERT_TRUE(logs.ok()) << format_log_error(logs.errors.at(0));
  ASSERT_EQ(logs.records.size(), 3u);
  EXPECT_EQ(logs.records[0].rank, 9);
  EXPECT_TRUE(std::isnan(logs.records[1].record.value));
  EXPECT_EQ(logs.records[2].rank, 10);
  EXPECT_EQ(logs.files.size(), 2u);
}

TEST(DebugReportLogs, MalformedLinesAreLocated) {
  const StatRecord a{"fc1", "activation", "", "max", 0, 1.0};
  const std::string dir =
      make_logs({{"globalrank-0.jsonl", line(a) + "{\"layer\":\"fc1\"}\n" + line(a) + "{\"lay"}});
  const StatisticsLogs logs = read_statistics_logs(dir);
  ASSERT_EQ(logs.errors.size(), 2u);
  EXPECT_EQ(logs.malformed_lines, 2);
  const std::string file = dir + "/opfuse_statistics/globalrank-0.jsonl";
  EXPECT_EQ(format_log_error(logs.errors[0]), file + ":2: error: missing key \"tensor\"");
  EXPECT_EQ(format_log_error(logs.errors[1]), file + ":4: error: not a JSON object");
}

TEST(DebugReportLogs, NoLogsIsAnError) {
  const std::string none = test::make_temp_dir("debug-report");
  StatisticsLogs logs = read_statistics_logs(none);
  ASSERT_EQ(logs.errors.size(), 1u);
  EXPECT_NE(logs.errors[0].message.find("opfuse_statistics is not a directory"), std::string::npos);
  logs = read_statistics_logs(make_logs({{"other.jsonl", "x"}}));
  ASSERT_EQ(logs.errors.size(), 1u);
  EXPECT_NE(logs.errors[0].message.find("no globalrank-{rank}.jsonl files"), std::string::npos);
  logs = read_statistics_logs(make_logs({{"globalrank-0.jsonl", ""}}));
  ASSERT_EQ(logs.errors.size(), 1u);
  EXPECT_NE(logs.errors[0].message.find("1 globalrank-{rank}.jsonl file without a single record"),
            std::string::npos);
  logs = read_statistics_logs(make_logs({{"globalrank-x.jsonl", ""}}));
  ASSERT_FALSE(logs.ok());
  EXPECT_NE(logs.errors[0].message.find("not globalrank-{rank}.jsonl"), std::string::npos);
}

TEST(DebugReportLogs, ErrorsAreCappedButCounted) {
  std::string garbage;
  for (int i = 0; i < 100; ++i) garbage += "garbage\n";
  const StatisticsLogs logs = read_statistics_logs(make_logs({{"globalrank-0.jsonl", garbage}}));
  EXPECT_EQ(logs.errors.size(), kMaxReportedErrors);
  EXPECT_EQ(logs.malformed_lines, 100);
}

}  // namespace
}  // namespace opfuse::debug
