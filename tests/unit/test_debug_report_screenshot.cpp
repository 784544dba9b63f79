// The report page as a browser draws it: headless Chromium screenshots a rendered page, and the
// PNG must show charts, not a blank or broken page (most pixels of the background colour, the
// ranks' line colours and the non-finite markers' red present). Skips visibly where Chromium is
// not installed (scripts/setup.sh installs Debian's `chromium`; OPFUSE_CHROMIUM names another
// browser binary, or none when empty).
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "debug/report.h"
#include "test_support.h"

namespace opfuse {
namespace {

struct Image {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3
  const uint8_t* at(uint32_t x, uint32_t y) const { return &rgb[(size_t(y) * width + x) * 3]; }
};

uint32_t be32(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 |
         uint32_t(uint8_t(s[at + 2])) << 8 | uint32_t(uint8_t(s[at + 3]));
}

int paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

// A minimal PNG reader for what Chromium writes: 8-bit RGB or RGBA, not interlaced (anything
// else is reported in `error`). PNG: chunks of length, type, data, CRC; the image is the zlib
// stream of the IDAT chunks, one filter byte per row.
Image read_png(const std::string& png, std::string& error) {
  Image image;
  if (png.size() < 8 || png.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) {
    error = "not a PNG";
    return image;
  }
  std::string compressed;
  int colour_type = -1;
  for (size_t at = 8; at + 8 <= png.size();) {
    const uint32_t length = be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    if (at + 12 + length > png.size()) break;
    if (type == "IHDR") {
      image.width = be32(png, at + 8);
      image.height = be32(png, at + 12);
      const int depth = uint8_t(png[at + 16]), interlace = uint8_t(png[at + 20]);
      colour_type = uint8_t(png[at + 17]);
      if (depth != 8 || (colour_type != 2 && colour_type != 6) || interlace != 0) {
        error = "unsupported PNG: depth " + std::to_string(depth) + ", colour type " +
                std::to_string(colour_type) + ", interlace " + std::to_string(interlace);
        return image;
      }
    } else if (type == "IDAT") {
      compressed += png.substr(at + 8, length);
    }
    at += 12 + length;
  }
  const size_t channels = colour_type == 6 ? 4 : 3, stride = image.width * channels;
  std::vector<uint8_t> raw((stride + 1) * image.height);
  uLongf raw_size = raw.size();
  if (image.width == 0 ||
      uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(compressed.data()),
                 compressed.size()) != Z_OK ||
      raw_size != raw.size()) {
    error = "bad PNG image data";
    return image;
  }
  std::vector<uint8_t> previous(stride, 0), row(stride);
  image.rgb.resize(size_t(image.width) * image.height * 3);
  for (uint32_t y = 0; y < image.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= channels ? row[i - channels] : 0, b = previous[i];
      const int c = i >= channels ? previous[i - channels] : 0;
      const int predictor = filter == 0   ? 0
                            : filter == 1 ? a
                            : filter == 2 ? b
                            : filter == 3 ? (a + b) / 2
                                          : paeth(a, b, c);
      row[i] = uint8_t(in[i] + predictor);
    }
    for (uint32_t x = 0; x < image.width; ++x)
      for (int k = 0; k < 3; ++k)
        image.rgb[(size_t(y) * image.width + x) * 3 + k] = row[x * channels + k];
    previous.swap(row);
  }
  return image;
}

// Pixels within `tolerance` per channel of #rrggbb.
size_t pixels_near(const Image& image, uint32_t colour, int tolerance) {
  const int r = int(colour >> 16), g = int(colour >> 8 & 0xff), b = int(colour & 0xff);
  size_t n = 0;
  for (size_t i = 0; i < image.rgb.size(); i += 3)
    if (std::abs(image.rgb[i] - r) <= tolerance && std::abs(image.rgb[i + 1] - g) <= tolerance &&
        std::abs(image.rgb[i + 2] - b) <= tolerance)
      ++n;
  return n;
}

std::string find_chromium() {
  if (const char* env = std::getenv("OPFUSE_CHROMIUM")) return env;
  const test::CommandResult r = test::run_command(
      "command -v chromium || command -v chromium-browser || command -v google-chrome");
  return r.exit_code == 0 ? r.output.substr(0, r.output.find('\n')) : "";
}

TEST(DebugReportScreenshot, PageShowsCharts) {
  const std::string chromium = find_chromium();
  if (chromium.empty())
    GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs it): the report page "
                    "is not screenshotted";

  // Two ranks' sine-like curves in two layers, and a NaN that must show as a red marker.
  std::vector<debug::RankedRecord> records;
  for (int rank = 0; rank < 2; ++rank)
    for (int64_t i = 0; i < 60; ++i)
      for (const char* layer : {"fc1", "fc2"}) {
        const double v = (1 + 0.2 * rank) * std::sin(double(i) / 8) + 2;
        records.push_back({rank, {layer, "activation", "", "max", i, v}});
        records.push_back({rank,
                           {layer, "activation", "", "std", i,
                            i == 30 ? std::numeric_limits<double>::quiet_NaN() : v / 4}});
      }
  const std::string dir = test::make_temp_dir("debug-report-screenshot");
  std::ofstream(dir + "/report.html", std::ios::binary) << debug::render_report(records);

  const std::string png_path = dir + "/report.png";
  const test::CommandResult shot = test::run_command(
      "timeout 120 '" + chromium + "' --headless --no-sandbox --disable-gpu --hide-scrollbars " +
      "--user-data-dir='" + dir + "/profile' --screenshot='" + png_path +
      "' --window-size=1200,900 'file://" + dir + "/report.html'");
  std::ifstream in(png_path, std::ios::binary);
  ASSERT_TRUE(in) << "chromium wrote no screenshot (exit " << shot.exit_code << "):\n"
                  << shot.output;
  const std::string png((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string error;
  const Image image = read_png(png, error);
  ASSERT_EQ(error, "");
  ASSERT_EQ(image.width, 1200u);
  ASSERT_EQ(image.height, 900u);

  // The page's background is white (report.cpp's style); a drawn page covers a fair part of it.
  const uint8_t* corner = image.at(0, 0);
  EXPECT_EQ(int(corner[0]) + corner[1] + corner[2], 3 * 255);
  const size_t total = size_t(image.width) * image.height;
  const size_t drawn = total - pixels_near(image, 0xffffff, 0);
  EXPECT_GT(double(drawn) / double(total), 0.05) << drawn << " of " << total << " pixels drawn";
  std::set<uint32_t> colours;
  for (size_t i = 0; i < image.rgb.size(); i += 3)
    colours.insert(uint32_t(image.rgb[i]) << 16 | uint32_t(image.rgb[i + 1]) << 8 |
                   image.rgb[i + 2]);
  EXPECT_GE(colours.size(), 16u);
  // Rank 0's blue and rank 1's orange lines, and the NaN marker's red (report.cpp's palette).
  EXPECT_GT(pixels_near(image, 0x1f77b4, 40), 300u);
  EXPECT_GT(pixels_near(image, 0xff7f0e, 40), 300u);
  EXPECT_GT(pixels_near(image, 0xd62728, 40), 30u);
}

}  // namespace
}  // namespace opfuse
