// The block-scaled FP8 cast (templates/block_cast.cuh, TE's Float8BlockScaling) on the GPU against
// the CPU oracle (runtime/cpu/block_quantization.h), bit for bit: every data byte and every
// non-padding scale_inv entry of the row-wise and column-wise copies, for every input dtype x FP8
// format x 1-D/2-D blocks, row-wise only / column-wise only / both, power-of-2 scales on and off,
// epsilon 0 and 1e-3, over ragged shapes (empty, one row, partial tiles in both directions) and two
// kinds of data: random normal values with per-block magnitudes and a few huge ones, and the same
// with special blocks (zero, Inf, NaN, tiny subnormal blocks whose scale overflows). Every output
// buffer is poisoned first (0xAB): bytes the kernel must write and did not, padding grid entries
// it must not write and did, and writes past the end all show. Also the block fake quantization
// of the quantize op and of Float8 block scaling emulated (block_fake_quantize.cuh).
// Label `gpu`: skips (visibly) where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../../templates/common/launch_rules.h"
#include "cpu/block_quantization.h"
#include "cpu/numerics.h"
#include "gpu_test_support.h"
#include "template_params.h"

namespace opfuse {
namespace {

using test::BlockCastParams;

enum class Input { BF16, FP16, FP32 };

struct Combo {
  Input input;
  cpu::Fp8Format output;
};

std::string spelling(Input input) {
  return input == Input::BF16 ? "__nv_bfloat16" : input == Input::FP16 ? "__half" : "float";
}
std::string spelling(cpu::Fp8Format format) {
  return format == cpu::Fp8Format::E4M3 ? "__nv_fp8_e4m3" : "__nv_fp8_e5m2";
}
size_t input_bytes(Input input) { return input == Input::FP32 ? 4 : 2; }
// TE's value_for_inf: the input dtype's largest finite value.
float value_for_inf(Input input) {
  return input == Input::BF16   ? cpu::bf16_max_finite()
         : input == Input::FP16 ? cpu::fp16_max_finite()
                                : FLT_MAX;
}

// Values as the input dtype stores them: its bytes (uploaded) and their float values (what the
// kernel and the oracle both read).
struct HostInput {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

HostInput encode(const std::vector<float>& values, Input input) {
  HostInput out;
  out.values.resize(values.size());
  out.bytes.resize(values.size() * input_bytes(input));
  for (size_t i = 0; i < values.size(); ++i) {
    if (input == Input::FP32) {
      out.values[i] = values[i];
      std::memcpy(&out.bytes[i * 4], &values[i], 4);
      continue;
    }
    const uint16_t bits =
        input == Input::BF16 ? cpu::float_to_bf16(values[i]) : cpu::float_to_fp16(values[i]);
    out.values[i] = input == Input::BF16 ? cpu::bf16_to_float(bits) : cpu::fp16_to_float(bits);
    std::memcpy(&out.bytes[i * 2], &bits, 2);
  }
  return out;
}

// N(0, 1) times a power of 2 per 16 rows x 128 columns (blocks of very different magnitudes), and
// one element in 2000 a huge outlier.
std::vector<float> random_values(int rows, int cols, Input input, std::mt19937_64& rng) {
  const int spread = input == Input::FP16 ? 6 : 20;
  const float outlier = input == Input::FP16 ? 30.0f : 1000.0f;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-spread, spread);
  std::uniform_int_distribution<int> one_in(0, 1999);
  std::vector<int> exponents(size_t((rows + 15) / 16) * size_t((cols + 127) / 128));
  for (int& e : exponents) e = exponent(rng);
  std::vector<float> values(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const int e = exponents[size_t(r / 16) * size_t((cols + 127) / 128) + size_t(c / 128)];
      float v = std::ldexp(normal(rng), e);
      if (one_in(rng) == 0) v *= outlier;
      values[size_t(r) * cols + c] = v;
    }
  }
  return values;
}

// Special blocks on top of random values: zero 1 x 128 blocks (every fifth row's first block) and
// a zero 128 x 128 block; tiny rows, columns and a tiny 128 x 128 block (subnormals of the input
// dtype: for bf16/fp32 the quotient fp8_max / amax overflows, so the scale is value_for_inf unless
// epsilon floors the amax); +-Inf, NaN and the dtype's largest finite value.
void add_special_values(std::vector<float>& values, int rows, int cols, Input input) {
  auto at = [&](int r, int c) -> float& { return values[size_t(r) * cols + c]; };
  const float tiny = input == Input::FP16 ? std::ldexp(1.0f, -24) : std::ldexp(1.0f, -130);
  auto tiny_value = [&](int r, int c) {
    return tiny * float((r + c) % 13 + 1) * ((r + c) % 2 == 0 ? 1.0f : -1.0f);
  };
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      if (r % 5 == 2 && c < 128) at(r, c) = 0.0f;
      if (r % 7 == 4 || c % 9 == 4) at(r, c) = tiny_value(r, c);
      if (r < 128 && c >= 128 && c < 256) at(r, c) = 0.0f;
      if (r >= 128 && r < 256 && c < 128) at(r, c) = tiny_value(r, c);
    }
  }
  if (rows > 1 && cols > 3) {
    at(1, 3) = std::numeric_limits<float>::infinity();
    at(rows - 1, cols - 1) = -std::numeric_limits<float>::infinity();
    at(rows - 1, 0) = value_for_inf(input);
  }
  if (rows > 0 && cols > 7) {
    at(0, 7) = std::numeric_limits<float>::quiet_NaN();
    at(rows / 2, cols / 2) = std::numeric_limits<float>::quiet_NaN();
  }
}

constexpr uint8_t kPoison = 0xAB;
constexpr uint32_t kPoisonWord = 0xABABABABu;
constexpr size_t kGuardBytes = 64;  // poisoned bytes past the end of every output

// Which outputs a launch writes.
enum class Mode {
  kBoth,
  kRowwiseOnly,           // y_t == nullptr
  kColumnwiseOnly,        // y == nullptr
  kTransposeCompiledOut,  // kWriteTranspose = false, y_t given: it must stay untouched
  kBothStridedGrid,       // grid.y = 2: each block walks several row tiles
};

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kBoth:
      return "both copies";
    case Mode::kRowwiseOnly:
      return "row-wise only";
    case Mode::kColumnwiseOnly:
      return "column-wise only";
    case Mode::kTransposeCompiledOut:
      return "kWriteTranspose = false";
    case Mode::kBothStridedGrid:
      return "both copies, grid.y = 2";
  }
  return "?";
}

class BlockCastGpu : public test::GpuStreamTest, public ::testing::WithParamInterface<Combo> {
 protected:
  struct Outputs {
    test::DeviceArray* x;
    test::DeviceArray* y;
    test::DeviceArray* y_grid;
    test::DeviceArray* y_t;
    test::DeviceArray* y_t_grid;
  };

  void poison(const test::DeviceArray& array) {
    OPFUSE_TEST_CUDA_OK(cudaMemsetAsync(array.data(), kPoison, array.bytes(), stream_));
  }

  // Counts (and reports the first few of) the differences between one copy the kernel wrote and
  // the oracle's: data bytes, non-padding scale_inv entries (bits), padding entries and guard
  // bytes (still poisoned).
  size_t compare_copy(const test::DeviceArray& data, const test::DeviceArray& grid,
                      const cpu::BlockQuantizedCopy& want, bool two_d, const std::string& what) {
    size_t mismatches = 0;
    auto report = [&](const std::string& message) {
      if (++mismatches <= 5) ADD_FAILURE() << what << ": " << message;
    };
    const size_t n = want.data.size();
    const std::vector<uint8_t> got = test::download_bytes(data.data(), n + kGuardBytes);
    for (size_t i = 0; i < n; ++i) {
      if (got[i] != want.data[i]) {
        report("element (" + std::to_string(int64_t(i) / want.cols) + ", " +
               std::to_string(int64_t(i) % want.cols) + "): code " + std::to_string(got[i]) +
               ", the oracle's " + std::to_string(want.data[i]));
      }
    }
    for (size_t i = n; i < n + kGuardBytes; ++i) {
      if (got[i] != kPoison) report("data byte " + std::to_string(i) + " past the end written");
    }
    const cpu::ScaleGridShape shape = cpu::scale_grid_shape(want.rows, want.cols, two_d);
    const int64_t real_inner = two_d ? (want.cols + 127) / 128 : want.rows;
    const size_t grid_bytes = size_t(shape.size()) * 4;
    const std::vector<uint8_t> got_grid =
        test::download_bytes(grid.data(), grid_bytes + kGuardBytes);
    for (int64_t outer = 0; outer < shape.outer; ++outer) {
      for (int64_t inner = 0; inner < shape.inner; ++inner) {
        const size_t index = size_t(outer * shape.inner + inner);
        uint32_t bits = 0;
        std::memcpy(&bits, &got_grid[index * 4], 4);
        auto where = [&] {
          return "scale_inv[" + std::to_string(outer) + "][" + std::to_string(inner) + "]";
        };
        if (inner >= real_inner) {
          if (bits != kPoisonWord) report(where() + " is padding, but was written");
          continue;
        }
        uint32_t want_bits = 0;
        std::memcpy(&want_bits, &want.scale_inv[index], 4);
        if (bits != want_bits) {
          float value = 0.0f;
          std::memcpy(&value, &bits, 4);
          report(where() + " = " + std::to_string(value) + ", the oracle's " +
                 std::to_string(want.scale_inv[index]));
        }
      }
    }
    for (size_t i = grid_bytes; i < grid_bytes + kGuardBytes; ++i) {
      if (got_grid[i] != kPoison)
        report("grid byte " + std::to_string(i) + " past the end written");
    }
    return mismatches;
  }

  // No byte of `array` written (still poisoned).
  size_t expect_untouched(const test::DeviceArray& array, const std::string& what) {
    const std::vector<uint8_t> got = test::download_bytes(array.data(), array.bytes());
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != kPoison) {
        ADD_FAILURE() << what << ": byte " << i << " written";
        return 1;
      }
    }
    return 0;
  }
};

TEST_P(BlockCastGpu, MatchesTheCpuOracleBitForBit) {
  const Combo combo = GetParam();
  const std::string in = spelling(combo.input), out = spelling(combo.output);
  // Kernels [two_d * 2 + (kWriteTranspose ? 0 : 1)].
  std::vector<std::string> expressions;
  for (const char* two_d : {"false", "true"}) {
    for (const char* write_transpose : {"true", "false"}) {
      std::string expression = "opfuse::block_cast_transpose<";
      expression += in;
      expression += ", ";
      expression += out;
      expression += ", ";
      expression += two_d;
      expression += ", ";
      expression += write_transpose;
      expression += ">";
      expressions.push_back(expression);
    }
  }
  const test::TemplateKernels loaded =
      test::load_template_kernels("#include \"block_cast.cuh\"\n", expressions);
  ASSERT_EQ(loaded.compiled.spill_store_bytes, 0);
  for (const cudaKernel_t kernel : loaded.kernels) ASSERT_NE(kernel, nullptr);

  // (0, 128): empty; (1, 16): one partial block; (127, 144), (300, 272): partial tiles both ways,
  // rows % 16 != 0 (byte and 4-byte stores of the transposed copy); (128, 128): one whole tile;
  // (256, 400): 16-byte stores, a partial column tile; (1000, 4096): many tiles; (4, 0): no
  // columns.
  const int shapes[][2] = {{0, 128},   {1, 16},    {127, 144},   {128, 128},
                           {256, 400}, {300, 272}, {1000, 4096}, {4, 0}};
  std::mt19937_64 rng(2024);
  size_t launches = 0;
  for (const auto& shape : shapes) {
    const int rows = shape[0], cols = shape[1];
    const size_t n = size_t(rows) * cols;
    const cpu::ScaleGridShape row_grid = cpu::scale_grid_shape(rows, cols, false);
    const cpu::ScaleGridShape row_grid_2d = cpu::scale_grid_shape(rows, cols, true);
    const cpu::ScaleGridShape col_grid = cpu::scale_grid_shape(cols, rows, false);
    const cpu::ScaleGridShape col_grid_2d = cpu::scale_grid_shape(cols, rows, true);
    const size_t grid_bytes = 4 * size_t(std::max({row_grid.size(), row_grid_2d.size(),
                                                   col_grid.size(), col_grid_2d.size()})) +
                              kGuardBytes;
    const Outputs buffers{&new_array(n * input_bytes(combo.input)), &new_array(n + kGuardBytes),
                          &new_array(grid_bytes), &new_array(n + kGuardBytes),
                          &new_array(grid_bytes)};
    for (const bool special : {false, true}) {
      std::vector<float> values = random_values(rows, cols, combo.input, rng);
      if (special) add_special_values(values, rows, cols, combo.input);
      const HostInput x = encode(values, combo.input);
      test::upload_bytes(*buffers.x, x.bytes.data(), x.bytes.size());
      for (const bool two_d : {false, true}) {
        for (const bool pow2 : {false, true}) {
          for (const float epsilon : {0.0f, 1e-3f}) {
            cpu::BlockQuantParams params;
            params.format = combo.output;
            params.two_d = two_d;
            params.power_of_2_scale = pow2;
            params.epsilon = epsilon;
            params.value_for_inf = value_for_inf(combo.input);
            const cpu::BlockQuantizedCopy rowwise =
                cpu::block_quantize_rowwise(x.values, rows, cols, params);
            const cpu::BlockQuantizedCopy columnwise =
                cpu::block_quantize_columnwise(x.values, rows, cols, params);
            for (const Mode mode : {Mode::kBoth, Mode::kRowwiseOnly, Mode::kColumnwiseOnly,
                                    Mode::kTransposeCompiledOut, Mode::kBothStridedGrid}) {
              dim3 grid(launch::block_cast_grid_x(cols), launch::block_cast_grid_y(rows));
              if (mode == Mode::kBothStridedGrid) {
                if (grid.y <= 2) continue;
                grid.y = 2;
              }
              std::ostringstream description;
              description << in << " -> " << out << ", " << rows << " x " << cols
                          << (special ? ", special values" : ", random values")
                          << (two_d ? ", 2-D" : ", 1-D") << (pow2 ? ", pow2" : "") << ", epsilon "
                          << epsilon << ", " << mode_name(mode);
              const std::string what = description.str();
              const bool rowwise_out = mode != Mode::kColumnwiseOnly;
              const bool columnwise_out =
                  mode != Mode::kRowwiseOnly && mode != Mode::kTransposeCompiledOut;
              poison(*buffers.y);
              poison(*buffers.y_grid);
              poison(*buffers.y_t);
              poison(*buffers.y_t_grid);
              BlockCastParams p{buffers.x->data(),
                                rowwise_out ? buffers.y->data() : nullptr,
                                rowwise_out ? static_cast<float*>(buffers.y_grid->data()) : nullptr,
                                columnwise_out || mode == Mode::kTransposeCompiledOut
                                    ? buffers.y_t->data()
                                    : nullptr,
                                columnwise_out || mode == Mode::kTransposeCompiledOut
                                    ? static_cast<float*>(buffers.y_t_grid->data())
                                    : nullptr,
                                epsilon,
                                pow2 ? 1 : 0,
                                rows,
                                cols};
              void* args[] = {&p};
              const cudaKernel_t kernel =
                  loaded.kernels[(two_d ? 2 : 0) + (mode == Mode::kTransposeCompiledOut ? 1 : 0)];
              OPFUSE_TEST_CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid,
                                                   dim3(launch::kBlockCastThreads), args, 0,
                                                   stream_));
              OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
              ++launches;
              size_t mismatches = 0;
              if (rowwise_out) {
                mismatches += compare_copy(*buffers.y, *buffers.y_grid, rowwise, two_d,
                                           what + ", row-wise copy");
              }
              if (columnwise_out) {
                mismatches += compare_copy(*buffers.y_t, *buffers.y_t_grid, columnwise, two_d,
                                           what + ", column-wise copy");
              }
              if (mode == Mode::kTransposeCompiledOut) {
                mismatches += expect_untouched(*buffers.y_t, what + ", y_t");
                mismatches += expect_untouched(*buffers.y_t_grid, what + ", y_t_scale_inv");
              }
              ASSERT_EQ(mismatches, 0u) << what;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(launches, 400u);
}

// The quantize op under block scaling (templates/block_fake_quantize.cuh): y = the row-wise 1 x 128
// block cast decoded with its block's scale_inv and rounded to the input dtype, bit for bit with
// the CPU reference's block fake quantization (block_quantize_rowwise, block_dequantize).
TEST_P(BlockCastGpu, FakeQuantizeMatchesTheCpuOracleBitForBit) {
  const Combo combo = GetParam();
  const std::string in = spelling(combo.input), out = spelling(combo.output);
  const test::TemplateKernels loaded =
      test::load_template_kernels("#include \"block_fake_quantize.cuh\"\n",
                                  {"opfuse::block_fake_quantize<" + in + ", " + out + ">"});
  ASSERT_NE(loaded.kernels.at(0), nullptr);
  std::mt19937_64 rng(7);
  const int shapes[][2] = {{1, 16}, {127, 144}, {300, 272}, {64, 4096}};
  for (const auto& shape : shapes) {
    const int rows = shape[0], cols = shape[1];
    const size_t n = size_t(rows) * cols;
    test::DeviceArray& x = new_array(n * input_bytes(combo.input));
    test::DeviceArray& y = new_array(n * input_bytes(combo.input) + kGuardBytes);
    for (const bool special : {false, true}) {
      std::vector<float> values = random_values(rows, cols, combo.input, rng);
      if (special) add_special_values(values, rows, cols, combo.input);
      const HostInput host = encode(values, combo.input);
      test::upload_bytes(x, host.bytes.data(), host.bytes.size());
      for (const bool pow2 : {false, true}) {
        cpu::BlockQuantParams params;
        params.format = combo.output;
        params.power_of_2_scale = pow2;
        params.epsilon = 1e-3f;
        params.value_for_inf = value_for_inf(combo.input);
        const std::vector<float> decoded = cpu::block_dequantize(
            cpu::block_quantize_rowwise(host.values, rows, cols, params), combo.output, false);
        const HostInput want = encode(decoded, combo.input);
        poison(y);
        struct {
          const void* x;
          void* y;
          float epsilon;
          int power_of_2_scale;
          int rows;
          int cols;
        } p{x.data(), y.data(), params.epsilon, pow2 ? 1 : 0, rows, cols};
        void* args[] = {&p};
        const long long blocks = (static_cast<long long>(rows) * launch::block_row_count(cols) +
                                  launch::kBlockFakeQuantizeWarps - 1) /
                                 launch::kBlockFakeQuantizeWarps;
        OPFUSE_TEST_CUDA_OK(cudaLaunchKernel(
            reinterpret_cast<const void*>(loaded.kernels[0]), dim3(static_cast<unsigned>(blocks)),
            dim3(launch::kBlockFakeQuantizeWarps * 32), args, 0, stream_));
        OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
        const std::vector<uint8_t> got =
            test::download_bytes(y.data(), want.bytes.size() + kGuardBytes);
        size_t mismatches = 0;
        for (size_t i = 0; i < want.bytes.size(); ++i) mismatches += got[i] != want.bytes[i];
        for (size_t i = want.bytes.size(); i < got.size(); ++i) mismatches += got[i] != kPoison;
        EXPECT_EQ(mismatches, 0u) << in << " -> " << out << ", " << rows << " x " << cols
                                  << (special ? ", special values" : "") << (pow2 ? ", pow2" : "");
      }
    }
  }
}

// Float8 block scaling emulated (note "Emulated block scaling" in docs/architecture.md): the
// decoded copies a BF16 GEMM reads, from block_fake_quantize<Input, Fp8, kBlocks> with 1 x 128,
// 128 x 1 and 128 x 128 blocks, bit for bit with cpu::block_fake_quantize (the column-wise copy
// in x's layout, not transposed), over ragged shapes in both directions.
TEST_P(BlockCastGpu, EmulatedCopiesMatchTheCpuOracleBitForBit) {
  const Combo combo = GetParam();
  const std::string in = spelling(combo.input), out = spelling(combo.output);
  std::vector<std::string> expressions;
  for (const int blocks : {launch::kBlockRows, launch::kBlockColumns, launch::kBlockTiles})
    expressions.push_back("opfuse::block_fake_quantize<" + in + ", " + out + ", " +
                          std::to_string(blocks) + ">");
  const test::TemplateKernels loaded =
      test::load_template_kernels("#include \"block_fake_quantize.cuh\"\n", expressions);
  std::mt19937_64 rng(11);
  const int shapes[][2] = {{1, 16}, {127, 144}, {300, 272}, {256, 384}, {64, 4096}};
  size_t launches = 0;
  for (const auto& shape : shapes) {
    const int rows = shape[0], cols = shape[1];
    const size_t n = size_t(rows) * cols;
    test::DeviceArray& x = new_array(n * input_bytes(combo.input));
    test::DeviceArray& y = new_array(n * input_bytes(combo.input) + kGuardBytes);
    for (const bool special : {false, true}) {
      std::vector<float> values = random_values(rows, cols, combo.input, rng);
      if (special) add_special_values(values, rows, cols, combo.input);
      const HostInput host = encode(values, combo.input);
      test::upload_bytes(x, host.bytes.data(), host.bytes.size());
      for (const int blocks : {launch::kBlockRows, launch::kBlockColumns, launch::kBlockTiles}) {
        ASSERT_NE(loaded.kernels.at(size_t(blocks)), nullptr);
        for (const bool pow2 : {false, true}) {
          cpu::BlockQuantParams params;
          params.format = combo.output;
          params.two_d = blocks == launch::kBlockTiles;
          params.power_of_2_scale = pow2;
          params.epsilon = pow2 ? 0.0f : 1e-3f;
          params.value_for_inf = value_for_inf(combo.input);
          const HostInput want = encode(cpu::block_fake_quantize(host.values, rows, cols, params,
                                                                 blocks == launch::kBlockColumns),
                                        combo.input);
          poison(y);
          struct {
            const void* x;
            void* y;
            float epsilon;
            int power_of_2_scale;
            int rows;
            int cols;
          } p{x.data(), y.data(), params.epsilon, pow2 ? 1 : 0, rows, cols};
          void* args[] = {&p};
          const dim3 grid(
              static_cast<unsigned>(launch::block_fake_quantize_grid_x(rows, cols, blocks)),
              static_cast<unsigned>(launch::block_fake_quantize_grid_y(rows, blocks)));
          OPFUSE_TEST_CUDA_OK(
              cudaLaunchKernel(reinterpret_cast<const void*>(loaded.kernels[size_t(blocks)]), grid,
                               dim3(launch::kBlockFakeQuantizeThreads), args, 0, stream_));
          OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
          ++launches;
          const std::vector<uint8_t> got =
              test::download_bytes(y.data(), want.bytes.size() + kGuardBytes);
          size_t mismatches = 0;
          for (size_t i = 0; i < want.bytes.size(); ++i) mismatches += got[i] != want.bytes[i];
          for (size_t i = want.bytes.size(); i < got.size(); ++i) mismatches += got[i] != kPoison;
          EXPECT_EQ(mismatches, 0u)
              << expressions[size_t(blocks)] << ", " << rows << " x " << cols
              << (special ? ", special values" : "") << (pow2 ? ", pow2" : ", epsilon 1e-3");
        }
      }
    }
  }
  EXPECT_EQ(launches, 5u * 2 * 3 * 2);
}

INSTANTIATE_TEST_SUITE_P(Templates, BlockCastGpu,
                         ::testing::Values(Combo{Input::BF16, cpu::Fp8Format::E4M3},
                                           Combo{Input::BF16, cpu::Fp8Format::E5M2},
                                           Combo{Input::FP16, cpu::Fp8Format::E4M3},
                                           Combo{Input::FP16, cpu::Fp8Format::E5M2},
                                           Combo{Input::FP32, cpu::Fp8Format::E4M3},
                                           Combo{Input::FP32, cpu::Fp8Format::E5M2}),
                         [](const ::testing::TestParamInfo<Combo>& info) {
                           const Combo& c = info.param;
                           return std::string(c.input == Input::BF16   ? "bf16"
                                              : c.input == Input::FP16 ? "fp16"
                                                                       : "fp32") +
                                  (c.output == cpu::Fp8Format::E4M3 ? "_e4m3" : "_e5m2");
                         });

}  // namespace
}  // namespace opfuse
