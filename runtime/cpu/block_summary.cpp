#include "block_summary.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace opfuse::cpu {

namespace {

void require(bool ok, const char* where, const char* what) {
  if (!ok) throw std::invalid_argument(std::string(where) + ": " + what);
}

// Every block of x ([rows, cols]) in x's orientation, block_rows x block_cols with ragged last
// ones: its amax (as the casts take it) and the decode factor `scale_inv(block_row, block_col)`.
template <typename ScaleInv>
BlockSummary summarize(std::span<const float> x, int64_t rows, int64_t cols, int64_t block_rows,
                       int64_t block_cols, ScaleInv scale_inv) {
  BlockSummary s;
  for (int64_t bi = 0; bi * block_rows < rows; ++bi) {
    for (int64_t bj = 0; bj * block_cols < cols; ++bj) {
      float amax = 0.0f;
      for (int64_t r = bi * block_rows; r < std::min(rows, (bi + 1) * block_rows); ++r)
        for (int64_t c = bj * block_cols; c < std::min(cols, (bj + 1) * block_cols); ++c)
          amax = std::fmax(amax, std::fabs(x[size_t(r * cols + c)]));
      const float inv = scale_inv(bi, bj);
      s.scale_inv_min = s.blocks == 0 ? inv : std::min(s.scale_inv_min, inv);
      s.scale_inv_max = s.blocks == 0 ? inv : std::max(s.scale_inv_max, inv);
      ++s.blocks;
      if (amax == 0.0f) ++s.zero_blocks;
    }
  }
  return s;
}

}  // namespace

BlockSummary summarize_block_copy(const BlockQuantizedCopy& copy, Fp8Format format, bool two_d) {
  constexpr const char* kWhere = "summarize_block_copy";
  const int64_t rows = copy.rows, cols = copy.cols;
  require(rows >= 0 && cols >= 0 && copy.data.size() == size_t(rows * cols) &&
              copy.scale_inv.size() == size_t(scale_grid_shape(rows, cols, two_d).size()),
          kWhere, "the copy's data or scale grid do not fit its shape");
  // A code of +-0 or NaN "amax 0" (NaN elements are skipped by the amax): the block's amax as
  // the summary's zero test (header note) sees it, over the stored matrix's blocks.
  std::vector<float> no_information(copy.data.size());
  for (size_t i = 0; i < copy.data.size(); ++i) {
    const float v = fp8_to_float(copy.data[i], format);
    no_information[i] = v == 0.0f || std::isnan(v) ? 0.0f : 1.0f;
  }
  return summarize(no_information, rows, cols, two_d ? kScaleBlock : 1, kScaleBlock,
                   [&](int64_t bi, int64_t bj) {
                     return copy.scale_inv_at(bi * (two_d ? kScaleBlock : 1), bj * kScaleBlock,
                                              two_d);
                   });
}

BlockSummary summarize_mxfp8_copy(std::span<const float> x, const Mxfp8Copy& copy) {
  constexpr const char* kWhere = "summarize_mxfp8_copy";
  const int64_t rows = copy.rows, cols = copy.cols;
  require(rows >= 0 && cols >= 0 && x.size() == size_t(rows * cols), kWhere,
          "the source's size is not the copy's rows * cols");
  require((copy.columnwise ? rows : cols) % kMxfp8BlockSize == 0 &&
              copy.scales.size() == size_t(rows * cols / kMxfp8BlockSize),
          kWhere, "the copy's scales do not fit its shape");
  if (copy.columnwise) {
    return summarize(x, rows, cols, kMxfp8BlockSize, 1, [&](int64_t bi, int64_t c) {
      return e8m0_to_float(copy.scales[size_t(bi * cols + c)]);
    });
  }
  return summarize(x, rows, cols, 1, kMxfp8BlockSize, [&](int64_t r, int64_t bj) {
    return e8m0_to_float(copy.scales[size_t(r * (cols / kMxfp8BlockSize) + bj)]);
  });
}

BlockSummary summarize_nvfp4_copy(std::span<const float> x, const Nvfp4Copy& copy) {
  constexpr const char* kWhere = "summarize_nvfp4_copy";
  const int64_t rows = copy.rows, cols = copy.cols;
  const Nvfp4Params& p = copy.params;
  require(rows >= 0 && cols >= 0 && x.size() == size_t(rows * cols), kWhere,
          "the source's size is not the copy's rows * cols");
  require((p.columnwise ? rows : cols) % kNvfp4BlockSize == 0 &&
              (!p.two_d || (rows % kNvfp4BlockSize == 0 && cols % kNvfp4BlockSize == 0)) &&
              copy.scales.size() == size_t(rows * cols / kNvfp4BlockSize),
          kWhere, "the copy's scales do not fit its shape");
  // An RHT copy quantizes the transformed columns: its blocks' amaxes are theirs.
  const std::vector<float> transformed = p.rht ? rht_columns(x, rows, cols) : std::vector<float>();
  const std::span<const float> values = p.rht ? std::span<const float>(transformed) : x;
  auto decode = [&](int64_t index) {
    return fp8_to_float(copy.scales[size_t(index)], Fp8Format::E4M3);
  };
  constexpr int64_t kBlock = kNvfp4BlockSize;
  // Scales: rowwise [rows][cols / 16], columnwise [cols][rows / 16]; a 2-D block's on its first
  // row there (it is repeated on the others).
  if (p.two_d) {
    return summarize(values, rows, cols, kBlock, kBlock, [&](int64_t bi, int64_t bj) {
      return p.columnwise ? decode(bj * kBlock * (rows / kBlock) + bi)
                          : decode(bi * kBlock * (cols / kBlock) + bj);
    });
  }
  if (p.columnwise) {
    return summarize(values, rows, cols, kBlock, 1,
                     [&](int64_t bi, int64_t c) { return decode(c * (rows / kBlock) + bi); });
  }
  return summarize(values, rows, cols, 1, kBlock,
                   [&](int64_t r, int64_t bj) { return decode(r * (cols / kBlock) + bj); });
}

std::string block_shape_name(int block_rows, int block_cols) {
  return std::to_string(block_rows) + "x" + std::to_string(block_cols);
}

}  // namespace opfuse::cpu
