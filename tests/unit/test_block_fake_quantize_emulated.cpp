// The block-scaled fake-quantize kernel (templates/block_fake_quantize.cuh: the quantize op's
// 1 x 128 blocks, and Float8 block scaling emulated with 1 x 128, 128 x 1 and 128 x 128 blocks)
// run on the host through tests/support/cuda_host_emulation.h, against the CPU oracle
// (cpu::block_fake_quantize, runtime/cpu/block_quantization.h), bit for bit: bf16 and fp32
// inputs, E4M3 and E5M2, power-of-2 and FP32 scales, an epsilon, shapes with ragged blocks in
// both directions and with fewer rows than one block, random data with per-region magnitudes and
// the same with special values (zero blocks, subnormals, +-Inf, NaN, the largest bf16, a huge
// value). The output is poisoned (0xAB) with guard elements after it. This checks the kernel's
// indexing and arithmetic where no GPU is present; tests/gpu/test_block_emulated_gpu.cpp checks
// the same on a GPU.
#include "cuda_host_emulation.h"  // first: the device built-ins the template uses
// clang-format off
#include "../../templates/block_fake_quantize.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/block_quantization.h"
#include "cpu/numerics.h"
#include "emulated_values.h"

namespace opfuse {
namespace {

using test::emulation::Dim3;
using test::emulation::emulate_launch;

using test::emulation::cast_to;
using test::emulation::value_of;

std::vector<float> values(int rows, int cols, uint64_t seed, bool special) {
  return test::emulation::random_values(rows, cols, seed, special, 128);
}

constexpr uint8_t kPoison = 0xAB;
constexpr size_t kGuard = 64;

struct Settings {
  bool power_of_2 = true;
  float epsilon = 0.0f;
};

// One launch of block_fake_quantize<Input, Fp8, kBlocks> on a rows x cols tensor against the
// oracle.
template <typename Input, typename Fp8, int kBlocks>
void check(int rows, int cols, bool special, Settings settings) {
  const std::vector<float> raw = values(rows, cols, uint64_t(rows * 131 + cols), special);
  std::vector<Input> x(raw.size());
  std::vector<float> x_values(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    x[i] = cast_to<Input>(raw[i]);
    x_values[i] = value_of(x[i]);
  }
  cpu::BlockQuantParams params;
  params.format = std::is_same_v<Fp8, __nv_fp8_e4m3> ? cpu::Fp8Format::E4M3 : cpu::Fp8Format::E5M2;
  params.two_d = kBlocks == launch::kBlockTiles;
  params.power_of_2_scale = settings.power_of_2;
  params.epsilon = settings.epsilon;
  params.value_for_inf =
      std::is_same_v<Input, float> ? std::numeric_limits<float>::max() : cpu::bf16_max_finite();
  const std::vector<float> want =
      cpu::block_fake_quantize(x_values, rows, cols, params, kBlocks == launch::kBlockColumns);
  std::vector<Input> y(raw.size() + kGuard);
  std::memset(static_cast<void*>(y.data()), kPoison, y.size() * sizeof(Input));
  const BlockFakeQuantizeParams<Input, Fp8> p{
      x.data(), y.data(), settings.epsilon, settings.power_of_2 ? 1 : 0, rows, cols};
  const Dim3 grid{
      static_cast<unsigned int>(launch::block_fake_quantize_grid_x(rows, cols, kBlocks)),
      static_cast<unsigned int>(launch::block_fake_quantize_grid_y(rows, kBlocks)), 1};
  emulate_launch(&block_fake_quantize<Input, Fp8, kBlocks>, grid, launch::kBlockFakeQuantizeThreads,
                 p);

  const std::string what =
      std::string(kBlocks == launch::kBlockRows      ? "1x128"
                  : kBlocks == launch::kBlockColumns ? "128x1"
                                                     : "128x128") +
      ", input " + std::to_string(sizeof(Input)) + " B, " +
      (params.format == cpu::Fp8Format::E4M3 ? "e4m3" : "e5m2") + ", " + std::to_string(rows) +
      " x " + std::to_string(cols) + (settings.power_of_2 ? ", power-of-2" : ", fp32 scales") +
      (settings.epsilon > 0 ? ", epsilon" : "") + (special ? ", special values" : "");
  size_t mismatches = 0;
  auto report = [&](const std::string& message) {
    if (++mismatches <= 5) ADD_FAILURE() << what << ": " << message;
  };
  for (size_t i = 0; i < want.size(); ++i) {
    const Input expected = cast_to<Input>(want[i]);
    if (std::memcmp(&expected, &y[i], sizeof(Input)) == 0) continue;
    if (std::isnan(value_of(y[i])) && std::isnan(want[i])) continue;
    report("y[" + std::to_string(i) + "] = " + std::to_string(value_of(y[i])) + ", the oracle's " +
           std::to_string(want[i]));
  }
  for (size_t i = want.size(); i < y.size(); ++i) {
    uint8_t first = 0;
    std::memcpy(&first, &y[i], 1);
    if (first != kPoison) report("y past the end written at " + std::to_string(i));
  }
  EXPECT_EQ(mismatches, 0u) << what;
}

// Rows and columns that fill whole 128-blocks, ragged ones in either direction, fewer rows than
// one block, and an empty tensor.
constexpr int kShapes[][2] = {{0, 128}, {64, 256}, {200, 136}, {256, 264}, {131, 384}};

template <typename Input, typename Fp8, int kBlocks>
void check_shapes(Settings settings = {}) {
  for (const auto& shape : kShapes) {
    for (const bool special : {false, true})
      check<Input, Fp8, kBlocks>(shape[0], shape[1], special, settings);
  }
}

using bf16 = __nv_bfloat16;
using e4m3 = __nv_fp8_e4m3;
using e5m2 = __nv_fp8_e5m2;

TEST(BlockFakeQuantizeEmulated, RowBlocksMatchTheOracle) {
  check_shapes<bf16, e4m3, launch::kBlockRows>();
  check_shapes<bf16, e5m2, launch::kBlockRows>();
  check_shapes<float, e4m3, launch::kBlockRows>({false, 0.0f});
}

TEST(BlockFakeQuantizeEmulated, ColumnBlocksMatchTheOracle) {
  check_shapes<bf16, e4m3, launch::kBlockColumns>();
  check_shapes<bf16, e5m2, launch::kBlockColumns>({false, 0.0f});
  check_shapes<float, e5m2, launch::kBlockColumns>();
}

TEST(BlockFakeQuantizeEmulated, TileBlocksMatchTheOracle) {
  check_shapes<bf16, e4m3, launch::kBlockTiles>();
  check_shapes<bf16, e4m3, launch::kBlockTiles>({false, 0.0f});
  check_shapes<float, e4m3, launch::kBlockTiles>();
}

// An amax floor above a block's amax sets its scale (TE's amax_epsilon): blocks of tiny values
// then keep few codes, the same on both sides.
TEST(BlockFakeQuantizeEmulated, EpsilonFloorsTheBlockAmax) {
  check<bf16, e4m3, launch::kBlockRows>(64, 256, false, {true, 1e-3f});
  check<bf16, e4m3, launch::kBlockColumns>(200, 136, false, {false, 1e-3f});
  check<bf16, e4m3, launch::kBlockTiles>(256, 264, false, {true, 1e-3f});
}

// The column-wise copy's blocks run down the columns: on data whose rows differ in magnitude
// its values are not the row-wise copy's (a kernel that ignored kBlocks would pass the others).
TEST(BlockFakeQuantizeEmulated, ColumnBlocksDifferFromRowBlocks) {
  const int rows = 128, cols = 128;
  const std::vector<float> v = values(rows, cols, 7, false);
  cpu::BlockQuantParams params;
  const std::vector<float> by_rows = cpu::block_fake_quantize(v, rows, cols, params, false);
  const std::vector<float> by_columns = cpu::block_fake_quantize(v, rows, cols, params, true);
  params.two_d = true;
  const std::vector<float> tiles = cpu::block_fake_quantize(v, rows, cols, params, false);
  EXPECT_NE(by_rows, by_columns);
  EXPECT_NE(by_rows, tiles);
  EXPECT_EQ(tiles, cpu::block_fake_quantize(v, rows, cols, params, true))
      << "128 x 128 blocks are the same blocks in both copies";
}

}  // namespace
}  // namespace opfuse
