// The micro-scaled casts (templates/micro_scale.cuh: MXFP8 and NVFP4 emulated on Hopper) on the GPU
// against the CPU oracle (runtime/cpu/micro_scaling.h), bit for bit: the codes, the compact scales
// and the decoded copy, for MXFP8 E4M3/E5M2 and NVFP4, both copies, NVFP4's 2-D blocks, random
// Hadamard transform and stochastic rounding (the same seed, stream and step give the same bits as
// the CPU), decoded-only launches, bf16 and fp32 inputs, over shapes with partial row tiles and
// column strips, random data with per-region magnitudes and the same with special values (zero
// blocks, NaN, Inf, huge, subnormal). Every output buffer is poisoned first (0xAB), with guard
// bytes after it: entries not written, and writes past the end, show. Also the transformed copy's
// amax kernel, with and without deriving S_enc through a current-scaling record.
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
#include "cpu/micro_scaling.h"
#include "cpu/numerics.h"
#include "emulated_values.h"
#include "gpu_test_support.h"
#include "template_params.h"

namespace opfuse {
namespace {

using test::MicroScaleParams;

// Mirrors templates/common/quantizer_record.cuh's QuantizerRecord.
struct QuantizerRecord {
  float* amax;
  float* amax_history;
  float* scale;
  float* scale_inv;
  int history_length;
  int mode;
  float fp8_max;
  int margin;
  float epsilon;
  int power_of_2_scale;
};
static_assert(sizeof(QuantizerRecord) == 56);

enum class Dtype { BF16, FP32 };

struct Combo {
  Dtype input;
  Dtype output;
};

std::string spelling(Dtype d) { return d == Dtype::BF16 ? "__nv_bfloat16" : "float"; }
size_t bytes_of(Dtype d) { return d == Dtype::BF16 ? 2 : 4; }

struct HostTensor {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // what the kernel reads
};

HostTensor encode(const std::vector<float>& values, Dtype dtype) {
  HostTensor out;
  out.values.resize(values.size());
  out.bytes.resize(values.size() * bytes_of(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == Dtype::FP32) {
      out.values[i] = values[i];
      std::memcpy(&out.bytes[i * 4], &values[i], 4);
    } else {
      const uint16_t bits = cpu::float_to_bf16(values[i]);
      out.values[i] = cpu::bf16_to_float(bits);
      std::memcpy(&out.bytes[i * 2], &bits, 2);
    }
  }
  return out;
}

using test::emulation::region_scaled_values;

// Zero blocks (rows 0-31 of columns 32-63, the first 32 columns of every fifth row), subnormal
// rows, +-Inf, NaN, the largest bf16 and huge values.
void add_special_values(std::vector<float>& v, int rows, int cols) {
  auto at = [&](int r, int c) -> float& { return v[size_t(r) * cols + c]; };
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      if (r < 32 && c >= 32 && c < 64) at(r, c) = 0.0f;
      if (r % 5 == 2 && c < 32) at(r, c) = 0.0f;
      if (r % 7 == 4) at(r, c) = std::ldexp(float((r + c) % 13 + 1), -136) * (c % 2 ? -1.0f : 1.0f);
    }
  }
  if (rows >= 32 && cols >= 32) {
    at(1, 3) = std::numeric_limits<float>::infinity();
    at(rows - 1, cols - 1) = -std::numeric_limits<float>::infinity();
    at(0, 7) = std::numeric_limits<float>::quiet_NaN();
    at(rows / 2, cols / 2) = std::numeric_limits<float>::quiet_NaN();
    at(rows - 3, 5) = cpu::bf16_to_float(0x7F7F);
    at(rows - 4, 9) = -1e30f;
  }
}

struct Variant {
  int format;  // 0 MXFP8 E4M3, 1 MXFP8 E5M2, 2 NVFP4
  bool columnwise;
  bool two_d = false;
  bool rht = false;
  bool stochastic = false;
  bool write_codes = true;
  bool null_step = false;  // stochastic: step pointer nullptr (step 0)

  std::string expression(const Combo& combo) const {
    auto b = [](bool v) { return std::string(v ? "true" : "false"); };
    return "opfuse::micro_scale_cast<" + spelling(combo.input) + ", " + spelling(combo.output) +
           ", " + std::to_string(format) + ", " + b(columnwise) + ", " + b(two_d) + ", " + b(rht) +
           ", " + b(stochastic) + ", " + b(write_codes) + ">";
  }
  std::string describe() const {
    std::ostringstream out;
    out << (format == 2   ? "NVFP4"
            : format == 0 ? "MXFP8 E4M3"
                          : "MXFP8 E5M2")
        << (columnwise ? " columnwise" : " rowwise") << (two_d ? " 2-D" : "") << (rht ? " RHT" : "")
        << (stochastic ? " SR" : "") << (write_codes ? "" : " y only")
        << (null_step ? " (step nullptr)" : "");
    return out.str();
  }
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> kVariants = {
      {0, false},
      {0, true},
      {1, false},
      {1, true},
      {2, false},
      {2, true},
      {2, false, true},
      {2, true, true},
      {2, true, false, true},
      {2, false, false, false, true},
      {2, true, false, false, true},
      {2, true, false, true, true},
      {2, false, true, false, true},
      {2, true, false, true, true, true, true},
      {0, true, false, false, false, false},
      {2, true, false, true, true, false},
  };
  return kVariants;
}

constexpr uint8_t kPoison = 0xAB;
constexpr size_t kGuard = 64;
constexpr unsigned long long kSeed = 0x243f6a8885a308d3ull;
constexpr unsigned int kStream = 5;
constexpr unsigned int kStep = 17;

class MicroScaleGpu : public test::GpuStreamTest, public ::testing::WithParamInterface<Combo> {
 protected:
  void poison(const test::DeviceArray& a) {
    OPFUSE_TEST_CUDA_OK(cudaMemsetAsync(a.data(), kPoison, a.bytes(), stream_));
  }

  // Bytes [0, want.size()) equal `want`, the guard after them still poisoned.
  size_t compare_bytes(const test::DeviceArray& a, const std::vector<uint8_t>& want,
                       const std::string& what) {
    const std::vector<uint8_t> got = test::download_bytes(a.data(), want.size() + kGuard);
    size_t mismatches = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (got[i] != want[i] && ++mismatches <= 5)
        ADD_FAILURE() << what << ": byte " << i << " is " << int(got[i]) << ", the oracle's "
                      << int(want[i]);
    }
    for (size_t i = want.size(); i < got.size(); ++i) {
      if (got[i] != kPoison && ++mismatches <= 5)
        ADD_FAILURE() << what << ": byte " << i << " past the end written";
    }
    return mismatches;
  }

  // The decoded copy: the oracle's values rounded to the output dtype, bit for bit (any NaN
  // matches any NaN).
  size_t compare_decoded(const test::DeviceArray& a, const std::vector<float>& want, Dtype output,
                         const std::string& what) {
    const size_t n = want.size(), width = bytes_of(output);
    const std::vector<uint8_t> got = test::download_bytes(a.data(), n * width + kGuard);
    const HostTensor expected = encode(want, output);
    size_t mismatches = 0;
    for (size_t i = 0; i < n; ++i) {
      if (std::memcmp(&got[i * width], &expected.bytes[i * width], width) == 0) continue;
      float value = 0.0f;
      if (output == Dtype::FP32) {
        std::memcpy(&value, &got[i * width], 4);
      } else {
        uint16_t bits = 0;
        std::memcpy(&bits, &got[i * width], 2);
        value = cpu::bf16_to_float(bits);
      }
      if (std::isnan(value) && std::isnan(expected.values[i])) continue;
      if (++mismatches <= 5)
        ADD_FAILURE() << what << ": y[" << i << "] = " << value << ", the oracle's "
                      << expected.values[i];
    }
    for (size_t i = n * width; i < got.size(); ++i) {
      if (got[i] != kPoison && ++mismatches <= 5)
        ADD_FAILURE() << what << ": y byte " << i << " past the end written";
    }
    return mismatches;
  }

  size_t expect_untouched(const test::DeviceArray& a, const std::string& what) {
    const std::vector<uint8_t> got = test::download_bytes(a.data(), a.bytes());
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != kPoison) {
        ADD_FAILURE() << what << ": byte " << i << " written";
        return 1;
      }
    }
    return 0;
  }
};

TEST_P(MicroScaleGpu, MatchesTheCpuOracleBitForBit) {
  const Combo combo = GetParam();
  std::vector<std::string> expressions;
  for (const Variant& v : variants()) expressions.push_back(v.expression(combo));
  const test::TemplateKernels loaded =
      test::load_template_kernels("#include \"micro_scale.cuh\"\n", expressions);
  ASSERT_EQ(loaded.compiled.spill_store_bytes, 0);
  for (const cudaKernel_t kernel : loaded.kernels) ASSERT_NE(kernel, nullptr);

  // Every dimension a multiple of 32 (what every variant needs); cols 96 and 32: partial 64-column
  // strips (idle lanes); rows 96, 160, 224: partial row tiles (128 NVFP4 rows, 256 MXFP8 rows
  // per block of 8 warps).
  const int shapes[][2] = {{0, 64},    {32, 32},  {96, 96},   {160, 32},
                           {224, 320}, {512, 64}, {256, 1024}};
  std::mt19937_64 rng(2026);
  size_t launches = 0;
  test::DeviceArray& tensor_scale = new_array(4);
  test::DeviceArray& step = new_array(4);
  test::upload_bytes(step, &kStep, 4);
  for (const auto& shape : shapes) {
    const int rows = shape[0], cols = shape[1];
    const size_t n = size_t(rows) * cols;
    test::DeviceArray& x = new_array(n * bytes_of(combo.input));
    test::DeviceArray& codes = new_array(n + kGuard);
    test::DeviceArray& scales = new_array(n / 16 + kGuard);
    test::DeviceArray& y = new_array(n * bytes_of(combo.output) + kGuard);
    for (const bool special : {false, true}) {
      std::vector<float> raw = region_scaled_values(rows, cols, rng);
      if (special) add_special_values(raw, rows, cols);
      const HostTensor input = encode(raw, combo.input);
      test::upload_bytes(x, input.bytes.data(), input.bytes.size());
      float finite_amax = 0.0f;
      for (const float v : input.values)
        if (std::isfinite(v)) finite_amax = std::max(finite_amax, std::fabs(v));
      for (size_t k = 0; k < variants().size(); ++k) {
        const Variant& v = variants()[k];
        const std::string what = spelling(combo.input) + " -> " + spelling(combo.output) + ", " +
                                 std::to_string(rows) + " x " + std::to_string(cols) +
                                 (special ? ", special values, " : ", random values, ") +
                                 v.describe();
        std::vector<uint8_t> want_codes, want_scales;
        std::vector<float> want_y;
        float s_enc = 1.0f;
        if (v.format != 2) {
          const cpu::Fp8Format format = v.format == 0 ? cpu::Fp8Format::E4M3 : cpu::Fp8Format::E5M2;
          const cpu::Mxfp8Copy copy =
              cpu::mxfp8_quantize(input.values, rows, cols, format, v.columnwise);
          want_codes = copy.data;
          want_scales = copy.scales;
          want_y = cpu::mxfp8_dequantize(copy);
        } else {
          // S_enc from the amax the runtime would measure (the finite one, so special data keep a
          // realistic scale; the oracle takes any S_enc).
          s_enc = cpu::nvfp4_tensor_scale(v.rht ? cpu::rht_amax(input.values, rows, cols)
                                                : finite_amax);
          cpu::Nvfp4Params params;
          params.columnwise = v.columnwise;
          params.two_d = v.two_d;
          params.rht = v.rht;
          params.stochastic = v.stochastic;
          params.seed = kSeed;
          params.stream = kStream;
          params.step = v.null_step ? 0u : kStep;
          const cpu::Nvfp4Copy copy = cpu::nvfp4_quantize(input.values, rows, cols, s_enc, params);
          want_codes = copy.data;
          want_scales = copy.scales;
          want_y = cpu::nvfp4_dequantize(copy);
        }
        test::upload_bytes(tensor_scale, &s_enc, 4);
        poison(codes);
        poison(scales);
        poison(y);
        MicroScaleParams p{x.data(),
                           static_cast<unsigned char*>(codes.data()),
                           static_cast<unsigned char*>(scales.data()),
                           y.data(),
                           static_cast<const float*>(tensor_scale.data()),
                           v.null_step ? nullptr : static_cast<const unsigned int*>(step.data()),
                           nullptr,
                           nullptr,
                           kSeed,
                           kStream,
                           rows,
                           cols};
        void* args[] = {&p};
        for (const bool strided : {false, true}) {
          dim3 grid(launch::micro_scale_grid_x(rows, cols, v.format, v.columnwise, v.two_d),
                    launch::micro_scale_grid_y(rows, v.format, v.columnwise, v.two_d));
          if (strided) {  // fewer blocks than work: grid-stride loops
            if (grid.x * grid.y <= 1) continue;
            if (grid.y > 1) {
              grid.y = 1;
            } else if (!launch::micro_scale_uses_patches(v.columnwise, v.two_d)) {
              grid.x = 1;
            } else {
              continue;
            }
            poison(codes);
            poison(scales);
            poison(y);
          }
          OPFUSE_TEST_CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(loaded.kernels[k]),
                                               grid, dim3(launch::kMicroScaleThreads), args, 0,
                                               stream_));
          OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
          ++launches;
          const std::string label = what + (strided ? ", strided grid" : "");
          size_t mismatches = compare_decoded(y, want_y, combo.output, label);
          if (v.write_codes) {
            mismatches += compare_bytes(codes, want_codes, label + ", codes");
            mismatches += compare_bytes(scales, want_scales, label + ", scales");
          } else {
            mismatches += expect_untouched(codes, label + ", codes");
            mismatches += expect_untouched(scales, label + ", scales");
          }
          ASSERT_EQ(mismatches, 0u) << label;
        }
      }
    }
  }
  EXPECT_GT(launches, 200u);
}

// micro_scale_rht_amax: the amax of the transformed columns, bit for bit with cpu::rht_amax, and
// with a current-scaling record (fp8_max 2688) S_enc = nvfp4_tensor_scale(amax), the record's
// running max and arrival count back to 0.
TEST_P(MicroScaleGpu, RhtAmaxAndTensorScale) {
  const Combo combo = GetParam();
  const test::TemplateKernels loaded =
      test::load_template_kernels("#include \"micro_scale.cuh\"\n",
                                  {"opfuse::micro_scale_rht_amax<" + spelling(combo.input) + ">"});
  ASSERT_NE(loaded.kernels.at(0), nullptr);
  std::mt19937_64 rng(99);
  const int shapes[][2] = {{16, 2}, {48, 96}, {160, 130}, {1024, 512}};
  test::DeviceArray& words = new_array(16);
  test::DeviceArray& scale = new_array(8);
  test::DeviceArray& record = new_array(sizeof(QuantizerRecord));
  const QuantizerRecord host_record{static_cast<float*>(words.data()),
                                    static_cast<float*>(words.data()),
                                    static_cast<float*>(scale.data()),
                                    static_cast<float*>(scale.data()) + 1,
                                    1,
                                    2,
                                    cpu::kNvfp4TensorScaleMax,
                                    0,
                                    0.0f,
                                    0};
  test::upload_bytes(record, &host_record, sizeof(host_record));
  for (const auto& shape : shapes) {
    const int rows = shape[0], cols = shape[1];
    const size_t n = size_t(rows) * cols;
    test::DeviceArray& x = new_array(n * bytes_of(combo.input));
    for (const bool special : {false, true}) {
      std::vector<float> raw = region_scaled_values(rows, cols, rng);
      if (special && rows >= 32 && cols >= 32) raw[5] = std::numeric_limits<float>::quiet_NaN();
      const HostTensor input = encode(raw, combo.input);
      test::upload_bytes(x, input.bytes.data(), input.bytes.size());
      const float want = cpu::rht_amax(input.values, rows, cols);
      for (const bool with_record : {false, true}) {
        OPFUSE_TEST_CUDA_OK(cudaMemsetAsync(words.data(), 0, 16, stream_));
        MicroScaleParams p{x.data(),
                           nullptr,
                           nullptr,
                           nullptr,
                           nullptr,
                           nullptr,
                           static_cast<float*>(words.data()) + 2,
                           with_record ? record.data() : nullptr,
                           0,
                           0,
                           rows,
                           cols};
        void* args[] = {&p};
        const dim3 grid(launch::micro_scale_rht_amax_grid_x(cols),
                        launch::micro_scale_rht_amax_grid_y(rows));
        OPFUSE_TEST_CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(loaded.kernels[0]), grid,
                                             dim3(launch::kMicroScaleThreads), args, 0, stream_));
        OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
        float got[4] = {};
        const std::vector<uint8_t> bytes = test::download_bytes(words.data(), 16);
        std::memcpy(got, bytes.data(), 16);
        const std::string what = std::to_string(rows) + " x " + std::to_string(cols) +
                                 (special ? ", a NaN" : "") + (with_record ? ", record" : "");
        if (!with_record) {
          EXPECT_EQ(got[2], want) << what;
          continue;
        }
        EXPECT_EQ(got[0], want) << what;
        EXPECT_EQ(got[1], 0.0f) << what;  // arrival count back to 0
        EXPECT_EQ(got[2], 0.0f) << what;  // running max taken
        float s[2] = {};
        const std::vector<uint8_t> scale_bytes = test::download_bytes(scale.data(), 8);
        std::memcpy(s, scale_bytes.data(), 8);
        EXPECT_EQ(s[0], cpu::nvfp4_tensor_scale(want)) << what;
        EXPECT_EQ(s[1], 1.0f / cpu::nvfp4_tensor_scale(want)) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Templates, MicroScaleGpu,
                         ::testing::Values(Combo{Dtype::BF16, Dtype::BF16},
                                           Combo{Dtype::FP32, Dtype::FP32},
                                           Combo{Dtype::BF16, Dtype::FP32}),
                         [](const ::testing::TestParamInfo<Combo>& info) {
                           return std::string(info.param.input == Dtype::BF16 ? "bf16" : "fp32") +
                                  (info.param.output == Dtype::BF16 ? "_to_bf16" : "_to_fp32");
                         });

}  // namespace
}  // namespace opfuse
