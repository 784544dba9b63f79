// The micro-scaled cast kernels (templates/micro_scale.cuh) run on the host through
// tests/support/cuda_host_emulation.h, against the CPU oracle (runtime/cpu/micro_scaling.h), bit
// for bit: codes, compact scales and the decoded copy, for every format, both copies, NVFP4's 2-D
// blocks, Hadamard transform and stochastic rounding, decoded-only launches, bf16 and fp32 inputs,
// over shapes with partial row tiles and column strips, random data and special values; and the
// transformed copy's amax kernel deriving S_enc through a current-scaling record. Every output is
// poisoned (0xAB) with guard bytes after it. This checks the kernels' indexing, layouts and
// arithmetic where no GPU is present; tests/gpu/test_micro_scale_gpu.cpp checks the same on a GPU.
// The suite is named micro_scale_emulated so that `ctest -R micro` selects it.
#include "cuda_host_emulation.h"  // first: the device built-ins the template uses
// clang-format off
#include "../../templates/micro_scale.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/micro_scaling.h"
#include "cpu/numerics.h"
#include "emulated_values.h"

namespace opfuse {
namespace {

using test::emulation::Dim3;
using test::emulation::emulate_launch;

using test::emulation::cast_to;
using test::emulation::value_of;

std::vector<float> values(int rows, int cols, uint64_t seed, bool special) {
  return test::emulation::random_values(rows, cols, seed, special, 32);
}

constexpr uint8_t kPoison = 0xAB;
constexpr size_t kGuard = 64;
constexpr unsigned long long kSeed = 0x243f6a8885a308d3ull;
constexpr unsigned int kStream = 5;
constexpr unsigned int kStep = 17;

// One launch of micro_scale_cast<...> on a rows x cols tensor against the oracle.
template <typename Input, typename Output, int kFormat, bool kColumnwise, bool kTwoD = false,
          bool kRht = false, bool kStochastic = false, bool kWriteCodes = true>
void check_cast(int rows, int cols, bool special, bool null_step = false) {
  const std::vector<float> raw = values(rows, cols, uint64_t(rows * 131 + cols), special);
  std::vector<Input> x(raw.size());
  std::vector<float> x_values(raw.size());
  float finite_amax = 0.0f;
  for (size_t i = 0; i < raw.size(); ++i) {
    x[i] = cast_to<Input>(raw[i]);
    x_values[i] = value_of(x[i]);
    if (std::isfinite(x_values[i])) finite_amax = std::fmax(finite_amax, std::fabs(x_values[i]));
  }
  std::vector<uint8_t> want_codes, want_scales;
  std::vector<float> want_y;
  float tensor_scale = 1.0f;
  if constexpr (kFormat != launch::kMicroScaleE2M1) {
    const cpu::Mxfp8Copy copy = cpu::mxfp8_quantize(
        x_values, rows, cols,
        kFormat == launch::kMicroScaleE4M3 ? cpu::Fp8Format::E4M3 : cpu::Fp8Format::E5M2,
        kColumnwise);
    want_codes = copy.data;
    want_scales = copy.scales;
    want_y = cpu::mxfp8_dequantize(copy);
  } else {
    tensor_scale =
        cpu::nvfp4_tensor_scale(kRht ? cpu::rht_amax(x_values, rows, cols) : finite_amax);
    cpu::Nvfp4Params params;
    params.columnwise = kColumnwise;
    params.two_d = kTwoD;
    params.rht = kRht;
    params.stochastic = kStochastic;
    params.seed = kSeed;
    params.stream = kStream;
    params.step = null_step ? 0u : kStep;
    const cpu::Nvfp4Copy copy = cpu::nvfp4_quantize(x_values, rows, cols, tensor_scale, params);
    want_codes = copy.data;
    want_scales = copy.scales;
    want_y = cpu::nvfp4_dequantize(copy);
  }
  std::vector<uint8_t> codes(raw.size() + kGuard, kPoison);
  std::vector<uint8_t> scales(raw.size() / 16 + kGuard, kPoison);
  std::vector<Output> y(raw.size() + kGuard);
  std::memset(static_cast<void*>(y.data()), kPoison, y.size() * sizeof(Output));
  const unsigned int step = kStep;
  const MicroScaleParams<Input, Output> p{
      x.data(), codes.data(), scales.data(), y.data(), &tensor_scale, null_step ? nullptr : &step,
      nullptr,  nullptr,      kSeed,         kStream,  rows,          cols};
  const Dim3 grid{
      static_cast<unsigned int>(
          launch::micro_scale_grid_x(rows, cols, kFormat, kColumnwise, kTwoD)),
      static_cast<unsigned int>(launch::micro_scale_grid_y(rows, kFormat, kColumnwise, kTwoD)), 1};
  emulate_launch(
      &micro_scale_cast<Input, Output, kFormat, kColumnwise, kTwoD, kRht, kStochastic, kWriteCodes>,
      grid, launch::kMicroScaleThreads, p);

  const std::string what =
      "format " + std::to_string(kFormat) + (kColumnwise ? " columnwise" : " rowwise") +
      (kTwoD ? " 2-D" : "") + (kRht ? " RHT" : "") + (kStochastic ? " SR" : "") +
      (kWriteCodes ? "" : " y only") + ", input " + std::to_string(sizeof(Input)) + " B, output " +
      std::to_string(sizeof(Output)) + " B, " + std::to_string(rows) + " x " +
      std::to_string(cols) + (special ? ", special values" : "");
  size_t mismatches = 0;
  auto report = [&](const std::string& message) {
    if (++mismatches <= 5) ADD_FAILURE() << what << ": " << message;
  };
  for (size_t i = 0; i < want_y.size(); ++i) {
    const Output want = cast_to<Output>(want_y[i]);
    if (std::memcmp(&want, &y[i], sizeof(Output)) == 0) continue;
    if (std::isnan(value_of(y[i])) && std::isnan(want_y[i])) continue;
    report("y[" + std::to_string(i) + "] = " + std::to_string(value_of(y[i])) + ", the oracle's " +
           std::to_string(want_y[i]));
  }
  for (size_t i = want_y.size(); i < y.size(); ++i) {
    uint8_t first = 0;
    std::memcpy(&first, &y[i], 1);
    if (first != kPoison) report("y past the end written at " + std::to_string(i));
  }
  auto compare = [&](const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                     const char* name) {
    for (size_t i = 0; i < got.size(); ++i) {
      const int expected = kWriteCodes && i < want.size() ? want[i] : kPoison;
      if (got[i] != expected)
        report(std::string(name) + " byte " + std::to_string(i) + " = " + std::to_string(got[i]) +
               ", expected " + std::to_string(expected));
    }
  };
  compare(codes, want_codes, "codes");
  compare(scales, want_scales, "scales");
  EXPECT_EQ(mismatches, 0u) << what;
}

// Every dimension a multiple of 32; cols 32 and 96: idle lanes, a partial 64-column strip; rows
// 96, 160, 224: partial row tiles (128 NVFP4 rows, 256 MXFP8 rows per block of 8 warps).
constexpr int kShapes[][2] = {{0, 64}, {32, 32}, {96, 96}, {160, 32}, {224, 320}};

template <typename Input, typename Output, int kFormat, bool kColumnwise, bool kTwoD = false,
          bool kRht = false, bool kStochastic = false, bool kWriteCodes = true>
void check_shapes(bool null_step = false) {
  for (const auto& shape : kShapes) {
    for (const bool special : {false, true}) {
      check_cast<Input, Output, kFormat, kColumnwise, kTwoD, kRht, kStochastic, kWriteCodes>(
          shape[0], shape[1], special, null_step);
    }
  }
}

using bf16 = __nv_bfloat16;

TEST(micro_scale_emulated, Mxfp8MatchesTheOracle) {
  check_shapes<bf16, bf16, launch::kMicroScaleE4M3, false>();
  check_shapes<bf16, bf16, launch::kMicroScaleE4M3, true>();
  check_shapes<float, float, launch::kMicroScaleE5M2, false>();
  check_shapes<float, float, launch::kMicroScaleE5M2, true>();
  check_shapes<bf16, float, launch::kMicroScaleE5M2, true>();
  check_shapes<bf16, bf16, launch::kMicroScaleE4M3, true, false, false, false, false>();
}

TEST(micro_scale_emulated, Nvfp4MatchesTheOracle) {
  check_shapes<bf16, bf16, launch::kMicroScaleE2M1, false>();
  check_shapes<bf16, bf16, launch::kMicroScaleE2M1, true>();
  check_shapes<float, float, launch::kMicroScaleE2M1, false>();
  check_shapes<float, bf16, launch::kMicroScaleE2M1, true>();
  check_shapes<bf16, bf16, launch::kMicroScaleE2M1, false, true>();
  check_shapes<float, float, launch::kMicroScaleE2M1, true, true>();
  check_shapes<bf16, bf16, launch::kMicroScaleE2M1, true, false, true>();
  check_shapes<float, float, launch::kMicroScaleE2M1, true, false, true>();
}

TEST(micro_scale_emulated, Nvfp4StochasticRoundingMatchesTheOracle) {
  check_shapes<bf16, bf16, launch::kMicroScaleE2M1, false, false, false, true>();
  check_shapes<float, float, launch::kMicroScaleE2M1, true, false, false, true>();
  check_shapes<bf16, bf16, launch::kMicroScaleE2M1, true, false, true, true>();
  check_shapes<bf16, float, launch::kMicroScaleE2M1, false, true, false, true>();
  check_shapes<bf16, bf16, launch::kMicroScaleE2M1, true, true, false, true>();
  check_shapes<bf16, bf16, launch::kMicroScaleE2M1, true, false, true, true>(/*null_step=*/true);
  check_shapes<bf16, bf16, launch::kMicroScaleE2M1, true, false, true, true, false>();
}

// micro_scale_rht_amax with a current-scaling record (fp8_max 2688): the measured amax is
// cpu::rht_amax, S_enc = nvfp4_tensor_scale(amax), the running max and arrival count back to 0.
TEST(micro_scale_emulated, RhtAmaxDerivesTheTensorScale) {
  for (const auto& shape : {std::pair{16, 2}, std::pair{48, 96}, std::pair{160, 130}}) {
    const auto [rows, cols] = shape;
    const std::vector<float> raw = values(rows, cols, 7, false);
    std::vector<bf16> x(raw.size());
    std::vector<float> x_values(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      x[i] = __float2bfloat16_rn(raw[i]);
      x_values[i] = __bfloat162float(x[i]);
    }
    float words[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float scale[2] = {0.0f, 0.0f};
    const QuantizerRecord record{
        words, words, scale, scale + 1, 1, kCurrentScaling, cpu::kNvfp4TensorScaleMax, 0, 0.0f, 0};
    const MicroScaleParams<bf16, bf16> p{x.data(),  nullptr, nullptr, nullptr, nullptr, nullptr,
                                         words + 2, &record, 0,       0,       rows,    cols};
    const Dim3 grid{static_cast<unsigned int>(launch::micro_scale_rht_amax_grid_x(cols)),
                    static_cast<unsigned int>(launch::micro_scale_rht_amax_grid_y(rows)), 1};
    emulate_launch(&micro_scale_rht_amax<bf16>, grid, launch::kMicroScaleThreads, p);
    const float want = cpu::rht_amax(x_values, rows, cols);
    unsigned int arrivals = 1;
    std::memcpy(&arrivals, &words[1], 4);
    EXPECT_EQ(words[0], want) << rows << " x " << cols;
    EXPECT_EQ(words[2], 0.0f);
    EXPECT_EQ(arrivals, 0u);
    EXPECT_EQ(scale[0], cpu::nvfp4_tensor_scale(want));
    EXPECT_EQ(scale[1], 1.0f / scale[0]);
  }
}

}  // namespace
}  // namespace opfuse
