// The block-scaled activations (templates/block_activation.cuh: an activation forward, or backward
// with dbias, whose output's 1 x 128 / 128 x 1 block cast is fused) on the GPU against the unfused
// pair they replace: the activation kernel writing bf16 (activation.cuh), then
// block_cast_transpose (block_cast.cuh, bit-exact with the CPU oracle in test_block_cast_gpu).
// The fused kernel must write the same bytes: every code of both copies and every non-padding
// scale_inv entry, over SwiGLU (gated: two planes backward) and GELU (plain), forward and
// backward, with ragged rows, a partial column tile (plain only; the gated backward needs whole
// tiles) and a strided grid; dbias equal to the unfused kernel's within fp32 summation order.
// Likewise the MXFP8 activations (activation_micro_fwd / _bwd, gated_activation_micro_fwd / _bwd;
// patterns activation_micro_cast, dact_micro_cast) against the activation and micro_scale_cast's
// decoded 1 x 32 row-wise copy, bf16 and fp32. Outputs are poisoned first (0xAB), so a byte not
// written, or a padding entry written, shows. Label `gpu`: skips (visibly) where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../templates/common/launch_rules.h"
#include "cpu/block_quantization.h"
#include "gpu_test_support.h"
#include "ir/pointwise_ops.h"
#include "template_params.h"

namespace opfuse {
namespace {

using test::BlockCastParams;

// Mirrors of the templates' params structs, field for field.
struct ActivationFwdParams {  // activation.cuh, <bf16, bf16>
  const void* x;
  void* y;
  void* y_t;
  const float* scale;
  float* amax;
  const void* scale_record;
  int rows;
  int cols;
  void* in_stats;
  void* out_stats;
};
struct ActivationBwdParams {  // activation.cuh, <bf16, bf16>
  const void* dy;
  const void* x;
  void* dx;
  void* dx_t;
  const float* scale;
  float* amax;
  const void* scale_record;
  float* dbias_partial;
  int rows;
  int cols;
  void* in_stats;
  void* out_stats;
};
struct BlockActivationParams {  // block_activation.cuh
  const void* dy;
  const void* x;
  void* y;
  float* y_scale_inv;
  void* y_t;
  float* y_t_scale_inv;
  float* dbias_partial;
  float epsilon;
  int power_of_2_scale;
  int rows;
  int cols;
};
static_assert(sizeof(BlockActivationParams) == 72);
struct ActivationMicroBwdParams {  // activation.cuh
  const void* dy;
  const void* x;
  void* dx;
  void* dx_hp;
  int rows;
  int cols;
  const void* learned[8] = {};
};
struct ActivationMicroFwdParams {  // activation.cuh
  const void* x;
  void* y;
  void* y_hp;
  int rows;
  int cols;
  const void* learned[8] = {};
};

constexpr uint8_t kPoison = 0xAB;

struct Case {
  const char* functor;  // opfuse::pointwise_<name>
  bool gated;
  bool backward;
  int rows, cols;  // cols: one output plane's width
  int grid_y;      // 0: block_cast_grid_y(rows)
};

std::string case_name(const Case& c) {
  return std::string(c.functor) + (c.backward ? " backward " : " forward ") +
         std::to_string(c.rows) + "x" + std::to_string(c.cols) +
         (c.grid_y ? ", grid.y " + std::to_string(c.grid_y) : "");
}

class BlockActivationGpu : public test::GpuStreamTest {
 protected:
  void launch(cudaKernel_t kernel, dim3 grid, int threads, void* params, int smem = 0) {
    void* args[] = {params};
    const void* function = reinterpret_cast<const void*>(kernel);
    if (smem > 48 * 1024) {
      OPFUSE_TEST_CUDA_OK(
          cudaFuncSetAttribute(function, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    }
    OPFUSE_TEST_CUDA_OK(
        cudaLaunchKernel(function, grid, dim3(threads), args, size_t(smem), stream_));
  }

  void poison(const test::DeviceArray& a) { fill_bytes(a, kPoison); }

  // MXFP8 (pattern activation_micro_cast): the activation writing its output, then
  // micro_scale_cast's decoded 1 x 32 row-wise copy of it, against activation_micro_fwd /
  // gated_activation_micro_fwd writing the decoded copy and the output (and, as the inference
  // variant, the copy alone). bf16 or fp32; cols a multiple of 32, not necessarily of the
  // tile's 64.
  void run_mxfp8(const char* name, bool gated, int rows, int n, bool e5m2, bool fp32,
                 bool backward = false) {
    SCOPED_TRACE(std::string("MXFP8 ") + name + (backward ? " backward " : " forward ") +
                 std::to_string(rows) + "x" + std::to_string(n) + (e5m2 ? " e5m2" : " e4m3") +
                 (fp32 ? " fp32" : " bf16"));
    const std::string functor = std::string("opfuse::pointwise_") + name;
    const std::string t = fp32 ? "float" : "__nv_bfloat16";
    const std::string format = e5m2 ? "1" : "0";
    const std::string kind = gated ? "opfuse::gated_activation_" : "opfuse::activation_";
    const test::TemplateKernels loaded = test::load_template_kernels(
        "#include \"activation.cuh\"\n#include \"micro_scale.cuh\"\n" +
            *ir::pointwise_functor_source(functor),
        {kind + (backward ? "bwd<" : "fwd<") + functor + ", " + t + ", " + t + ", false>",
         "opfuse::micro_scale_cast<" + t + ", " + t + ", " + format +
             ", false, false, false, false, false>",
         kind + (backward ? "micro_bwd<" : "micro_fwd<") + functor + ", " + t + ", " + format +
             ", true>",
         kind + (backward ? "micro_bwd<" : "micro_fwd<") + functor + ", " + t + ", " + format +
             ", false>"});
    ASSERT_EQ(loaded.compiled.spill_store_bytes, 0) << "registers: " << loaded.compiled.registers;
    for (const cudaKernel_t k : loaded.kernels) ASSERT_NE(k, nullptr);

    const int bytes = fp32 ? 4 : 2;
    const int x_cols = gated ? 2 * n : n;
    const int out_cols = backward ? x_cols : n;  // the quantized tensor's width
    const size_t elems = size_t(rows) * out_cols;
    std::mt19937_64 rng(91 + rows + n);
    test::DeviceArray& x = new_array(size_t(rows) * x_cols * bytes);
    std::vector<float> xs = test::random_bf16(size_t(rows) * x_cols, 2.0, rng);
    for (int r = 0; r < rows; r += 5) xs[size_t(r) * x_cols + (r * 7) % x_cols] = 150.0f;
    test::upload_values(x, xs, fp32 ? plan::DType::FP32 : plan::DType::BF16);
    test::DeviceArray& dy = new_array(size_t(rows) * n * bytes);
    test::upload_values(dy, test::random_bf16(size_t(rows) * n, 0.5, rng),
                        fp32 ? plan::DType::FP32 : plan::DType::BF16);
    struct Outputs {
      test::DeviceArray *y, *source;
    };
    auto outputs = [&] {
      Outputs o{&new_array(elems * bytes), &new_array(elems * bytes)};
      poison(*o.y);
      poison(*o.source);
      return o;
    };
    const Outputs want = outputs(), got = outputs(), inference = outputs();
    const dim3 tile_grid(launch::tile_grid_x(n), launch::tile_grid_y(rows));
    if (backward) {
      ActivationBwdParams p{dy.data(), x.data(), want.source->data(),
                            nullptr,   nullptr,  nullptr,
                            nullptr,   nullptr,  rows,
                            n,         nullptr,  nullptr};
      launch(loaded.kernels[0], tile_grid, launch::kTileThreads, &p);
    } else {
      ActivationFwdParams p{
          x.data(), want.source->data(), nullptr, nullptr, nullptr, nullptr, rows, n, nullptr,
          nullptr};
      launch(loaded.kernels[0], tile_grid, launch::kTileThreads, &p);
    }
    const int format_id = e5m2 ? launch::kMicroScaleE5M2 : launch::kMicroScaleE4M3;
    test::MicroScaleParams cast{want.source->data(),
                                nullptr,
                                nullptr,
                                want.y->data(),
                                nullptr,
                                nullptr,
                                nullptr,
                                nullptr,
                                0,
                                0,
                                rows,
                                out_cols};
    launch(loaded.kernels[1],
           dim3(unsigned(launch::micro_scale_grid_x(rows, out_cols, format_id, false, false))),
           launch::kMicroScaleThreads, &cast);
    for (const bool with_source : {true, false}) {
      const Outputs& o = with_source ? got : inference;
      void* source = with_source ? o.source->data() : nullptr;
      if (backward) {
        ActivationMicroBwdParams mp{dy.data(), x.data(), o.y->data(), source, rows, n};
        launch(loaded.kernels[with_source ? 2 : 3], tile_grid, launch::kTileThreads, &mp);
      } else {
        ActivationMicroFwdParams mp{x.data(), o.y->data(), source, rows, n};
        launch(loaded.kernels[with_source ? 2 : 3], tile_grid, launch::kTileThreads, &mp);
      }
    }
    OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
    test::expect_same_bytes(*want.y, *got.y, "decoded row-wise copy");
    test::expect_same_bytes(*want.source, *got.source, "the output");
    test::expect_same_bytes(*want.y, *inference.y, "decoded row-wise copy (inference)");
    EXPECT_EQ(test::bytes_other_than(*inference.source, kPoison), 0u)
        << "without kWriteColumnwiseSource the kernel writes no output";
    // Not vacuous: quantization moved values, and the copy is not all zeros.
    const std::vector<uint8_t> copy = test::download_bytes(got.y->data(), got.y->bytes());
    const std::vector<uint8_t> source =
        test::download_bytes(got.source->data(), got.source->bytes());
    size_t moved = 0, nonzero_bytes = 0;
    for (size_t i = 0; i < copy.size(); ++i) {
      moved += copy[i] != source[i] ? 1 : 0;
      nonzero_bytes += copy[i] != 0 ? 1 : 0;
    }
    EXPECT_GT(moved, copy.size() / 8);
    EXPECT_GT(nonzero_bytes, copy.size() / 4);
  }

  void run(const Case& c) {
    SCOPED_TRACE(case_name(c));
    const std::string functor = std::string("opfuse::pointwise_") + c.functor;
    const std::string fp8 = c.backward ? "__nv_fp8_e5m2" : "__nv_fp8_e4m3";
    const std::string unfused = std::string(c.gated ? "opfuse::gated_" : "opfuse::") +
                                "activation_" + (c.backward ? "bwd<" : "fwd<") + functor +
                                ", __nv_bfloat16, __nv_bfloat16, false" +
                                (c.backward ? ", true>" : ">");
    const std::string fused = std::string(c.gated ? "opfuse::block_gated_" : "opfuse::block_") +
                              "activation_" + (c.backward ? "bwd<" : "fwd<") + functor +
                              ", __nv_bfloat16, " + fp8 + ", true" + (c.backward ? ", true>" : ">");
    const std::string cast =
        "opfuse::block_cast_transpose<__nv_bfloat16, " + fp8 + ", false, true>";
    const test::TemplateKernels loaded = test::load_template_kernels(
        "#include \"block_activation.cuh\"\n" + *ir::pointwise_functor_source(functor),
        {unfused, cast, fused});
    ASSERT_EQ(loaded.compiled.spill_store_bytes, 0) << "registers: " << loaded.compiled.registers;
    for (const cudaKernel_t k : loaded.kernels) ASSERT_NE(k, nullptr);

    const int rows = c.rows, n = c.cols;
    const int x_cols = c.gated ? 2 * n : n;        // the forward input's width
    const int out_cols = c.backward ? x_cols : n;  // the cast tensor's width
    const size_t out_elems = size_t(rows) * out_cols;
    std::mt19937_64 rng(77 + rows + n);
    test::DeviceArray& x = new_array(size_t(rows) * x_cols * 2);
    test::upload_bf16(x, test::random_bf16(size_t(rows) * x_cols, 2.0, rng));
    test::DeviceArray& dy = new_array(size_t(rows) * n * 2);
    test::upload_bf16(dy, test::random_bf16(size_t(rows) * n, 0.5, rng));

    const cpu::ScaleGridShape row_grid = cpu::scale_grid_shape(rows, out_cols, false);
    const cpu::ScaleGridShape col_grid = cpu::scale_grid_shape(out_cols, rows, false);
    const int grid_y = c.grid_y ? c.grid_y : launch::block_cast_grid_y(rows);
    struct Outputs {
      test::DeviceArray *y, *y_grid, *y_t, *y_t_grid, *dbias;
    };
    auto outputs = [&] {
      Outputs o{&new_array(out_elems), &new_array(size_t(row_grid.size()) * 4),
                &new_array(out_elems), &new_array(size_t(col_grid.size()) * 4),
                &new_array(size_t(grid_y) * out_cols * 4)};
      for (test::DeviceArray* a : {o.y, o.y_grid, o.y_t, o.y_t_grid}) poison(*a);
      return o;
    };
    const Outputs want = outputs(), got = outputs();

    // Unfused: the activation to bf16 (dbias partials over its own tile grid), then the cast.
    test::DeviceArray& mid = new_array(out_elems * 2);
    const int tile_grid_y = launch::tile_grid_y(rows);
    test::DeviceArray& tile_dbias = new_array(size_t(tile_grid_y) * out_cols * 4);
    const dim3 tile_grid(launch::tile_grid_x(n), tile_grid_y);
    if (c.backward) {
      ActivationBwdParams p{dy.data(), x.data(), mid.data(), nullptr,
                            nullptr,   nullptr,  nullptr,    static_cast<float*>(tile_dbias.data()),
                            rows,      n,        nullptr,    nullptr};
      launch(loaded.kernels[0], tile_grid, launch::kTileThreads, &p);
    } else {
      ActivationFwdParams p{x.data(), mid.data(), nullptr, nullptr, nullptr,
                            nullptr,  rows,       n,       nullptr, nullptr};
      launch(loaded.kernels[0], tile_grid, launch::kTileThreads, &p);
    }
    BlockCastParams cp{mid.data(),
                       want.y->data(),
                       static_cast<float*>(want.y_grid->data()),
                       want.y_t->data(),
                       static_cast<float*>(want.y_t_grid->data()),
                       0.0f,
                       1,
                       rows,
                       out_cols};
    launch(loaded.kernels[1],
           dim3(launch::block_cast_grid_x(out_cols), launch::block_cast_grid_y(rows)),
           launch::kBlockCastThreads, &cp);

    BlockActivationParams fp{c.backward ? dy.data() : nullptr,
                             x.data(),
                             got.y->data(),
                             static_cast<float*>(got.y_grid->data()),
                             got.y_t->data(),
                             static_cast<float*>(got.y_t_grid->data()),
                             c.backward ? static_cast<float*>(got.dbias->data()) : nullptr,
                             0.0f,
                             1,
                             rows,
                             n};
    const int planes = c.gated && c.backward ? 2 : 1;
    const int loads = (c.gated ? 2 : 1) + (c.backward ? 1 : 0);
    launch(loaded.kernels[2], dim3(launch::block_cast_grid_x(n), grid_y),
           launch::block_activation_threads(planes), &fp,
           launch::block_activation_smem_bytes(loads, planes, c.backward));
    OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));

    test::expect_same_bytes(*want.y, *got.y, "row-wise codes");
    test::expect_same_bytes(*want.y_grid, *got.y_grid,
                            "row-wise scale_inv grid (padding poisoned in both)");
    test::expect_same_bytes(*want.y_t, *got.y_t, "column-wise codes");
    test::expect_same_bytes(*want.y_t_grid, *got.y_t_grid, "column-wise scale_inv grid");
    // Not a vacuous comparison: the codes are not all one byte.
    const std::vector<uint8_t> codes = test::download_bytes(got.y->data(), got.y->bytes());
    size_t zeros = 0;
    for (const uint8_t b : codes) zeros += b == 0 ? 1 : 0;
    EXPECT_LT(zeros, codes.size() / 4);

    if (c.backward) {
      auto column_sums = [&](const test::DeviceArray& partials, int partial_rows) {
        const std::vector<uint8_t> bytes =
            test::download_bytes(partials.data(), size_t(partial_rows) * out_cols * 4);
        std::vector<double> sums(size_t(out_cols), 0.0);
        for (int r = 0; r < partial_rows; ++r) {
          for (int col = 0; col < out_cols; ++col) {
            float v = 0.0f;
            std::memcpy(&v, &bytes[(size_t(r) * out_cols + col) * 4], 4);
            sums[size_t(col)] += v;
          }
        }
        return sums;
      };
      const std::vector<double> a = column_sums(tile_dbias, tile_grid_y);
      const std::vector<double> b = column_sums(*got.dbias, grid_y);
      double largest = 0.0;
      for (const double v : a) largest = std::fmax(largest, std::fabs(v));
      ASSERT_GT(largest, 0.0);
      for (int col = 0; col < out_cols; ++col) {
        ASSERT_NEAR(b[size_t(col)], a[size_t(col)],
                    1e-5 * largest + 1e-4 * std::fabs(a[size_t(col)]))
            << "dbias column " << col;
      }
    }
  }
};

TEST_F(BlockActivationGpu, SwigluForwardMatchesTheUnfusedPair) {
  for (const Case c :
       {Case{"swiglu", true, false, 300, 256, 0}, Case{"swiglu", true, false, 128, 128, 0},
        Case{"swiglu", true, false, 1000, 384, 3}, Case{"swiglu", true, false, 64, 200, 0}}) {
    run(c);
  }
}

TEST_F(BlockActivationGpu, SwigluBackwardMatchesTheUnfusedPair) {
  for (const Case c :
       {Case{"swiglu", true, true, 300, 256, 0}, Case{"swiglu", true, true, 1000, 384, 2},
        Case{"swiglu", true, true, 1, 128, 0}}) {
    run(c);
  }
}

TEST_F(BlockActivationGpu, GeluForwardAndBackwardMatchTheUnfusedPair) {
  for (const Case c :
       {Case{"gelu", false, false, 300, 264, 0}, Case{"gelu", false, true, 300, 264, 0},
        Case{"gelu", false, true, 517, 1024, 2}, Case{"gelu", false, false, 1, 128, 0}}) {
    run(c);
  }
}

TEST_F(BlockActivationGpu, Mxfp8ForwardMatchesTheUnfusedPair) {
  run_mxfp8("swiglu", true, 300, 256, false, false);
  run_mxfp8("swiglu", true, 77, 96, true, false);  // a partial second column tile
  run_mxfp8("swiglu", true, 1, 32, false, false);
  run_mxfp8("gelu", false, 129, 384, false, false);
  run_mxfp8("gelu", false, 64, 160, true, true);
  run_mxfp8("swiglu", true, 33, 224, false, true);
}

TEST_F(BlockActivationGpu, Mxfp8BackwardMatchesTheUnfusedPair) {
  run_mxfp8("swiglu", true, 300, 256, true, false, true);  // both planes of the gradient
  run_mxfp8("swiglu", true, 77, 96, true, false, true);
  run_mxfp8("gelu", false, 129, 384, true, false, true);
  run_mxfp8("gelu", false, 64, 160, false, true, true);
  run_mxfp8("swiglu", true, 33, 224, true, true, true);
}

}  // namespace
}  // namespace opfuse
