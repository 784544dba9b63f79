// The norm that writes its output's 1 x 128 block-scaled row-wise copy (templates/norm.cuh,
// layernorm_block_fwd / rmsnorm_block_fwd; pattern norm_block_cast) on the GPU against the
// unfused pair it replaces: the norm writing bf16 (layernorm_fwd / rmsnorm_fwd), then
// block_cast_transpose (bit-exact with the CPU oracle in test_block_cast_gpu). The fused kernel
// must write the same bytes: every row-wise code and every non-padding scale_inv entry, the
// rounded output (kWriteColumnwiseSource) identical to the unfused norm's, and mean/rstd the
// unfused norm's; the column-wise copy then made from that output by the column-only cast equals
// the unfused cast's. Over LayerNorm and RMSNorm (zero-centered gamma too), E4M3 and E5M2,
// power-of-2 and FP32 scales, with ragged row counts, one 128-wide row and rows where an outlier
// dominates one block; the kernel without the source (the inference variant) writes the same
// codes and leaves the source untouched. Likewise the MXFP8 norm (layernorm_micro_fwd /
// rmsnorm_micro_fwd; pattern norm_micro_cast) against the norm and micro_scale_cast's decoded
// 1 x 32 row-wise copy. bf16 and fp32 inputs. Outputs are poisoned first (0xAB), so a byte not
// written, or a padding entry written, shows. Label `gpu`: skips (visibly) where no GPU is
// present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../../templates/common/launch_rules.h"
#include "cpu/block_quantization.h"
#include "gpu_test_support.h"
#include "template_params.h"

namespace opfuse {
namespace {

using test::BlockCastParams;
using test::MicroScaleParams;

// Mirrors of the templates' params structs, field for field.
struct NormFwdParams {  // norm.cuh
  const void* x;
  const void* gamma;
  const void* beta;
  void* y;
  void* y_t;
  const float* scale;
  float* amax;
  const void* scale_record;
  float* mean;
  float* rstd;
  float epsilon;
  int rows;
};
struct NormBlockFwdParams {  // norm.cuh
  const void* x;
  const void* gamma;
  const void* beta;
  void* y;
  float* y_scale_inv;
  void* y_hp;
  float* mean;
  float* rstd;
  float epsilon;
  float block_epsilon;
  int power_of_2_scale;
  int rows;
};
static_assert(sizeof(NormBlockFwdParams) == 80);
struct NormMicroFwdParams {  // norm.cuh
  const void* x;
  const void* gamma;
  const void* beta;
  void* y;
  void* y_hp;
  float* mean;
  float* rstd;
  float epsilon;
  int rows;
};
static_assert(sizeof(NormMicroFwdParams) == 64);

constexpr uint8_t kPoison = 0xAB;

// The hidden sizes give the kernel's lane layouts (launch_rules.h): 512 two slots of 32 threads,
// 640 three slots with idle ones, 2048 four slots of 64 threads (two warps a row), 4096 four
// slots of 128 threads; fp32 rows hold 4 values a lane, so a block spans a whole warp's slot.
struct Case {
  bool rms;
  bool zero_centered;
  bool e5m2;
  bool power_of_2;
  int rows;
  int hidden = 512;
  bool fp32 = false;
};

std::string case_name(const Case& c) {
  return std::string(c.rms ? "rmsnorm" : "layernorm") + (c.fp32 ? " fp32" : " bf16") +
         (c.zero_centered ? " (1 + gamma)" : "") + (c.e5m2 ? " -> e5m2" : " -> e4m3") +
         (c.power_of_2 ? ", pow2" : ", fp32 scales") + ", [" + std::to_string(c.rows) + ", " +
         std::to_string(c.hidden) + "]";
}

class BlockNormGpu : public test::GpuStreamTest {
 protected:
  void launch(cudaKernel_t kernel, dim3 grid, int threads, void* params) {
    void* args[] = {params};
    OPFUSE_TEST_CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, dim3(threads),
                                         args, 0, stream_));
  }
  void poison(const test::DeviceArray& a) { fill_bytes(a, kPoison); }
  // x, gamma and beta of a case: random rows with an outlier in one block of every 7th row (its
  // block's scale is small, its neighbours' not).
  struct Inputs {
    test::DeviceArray *x, *gamma, *beta;
  };
  Inputs inputs(const Case& c) {
    const int bytes = c.fp32 ? 4 : 2;
    const plan::DType dtype = c.fp32 ? plan::DType::FP32 : plan::DType::BF16;
    const size_t elems = size_t(c.rows) * c.hidden;
    std::mt19937_64 rng(31 + c.rows + (c.rms ? 1 : 0));
    Inputs in{&new_array(elems * bytes), &new_array(size_t(c.hidden) * bytes),
              &new_array(size_t(c.hidden) * bytes)};
    std::vector<float> xs = test::random_bf16(elems, 1.5, rng, 0.25);
    for (int r = 0; r < c.rows; r += 7) xs[size_t(r) * c.hidden + 130 + r % 100] = 300.0f;
    test::upload_values(*in.x, xs, dtype);
    test::upload_values(*in.gamma,
                        test::random_bf16(c.hidden, 0.5, rng, c.zero_centered ? 0.0 : 1.0), dtype);
    test::upload_values(*in.beta, test::random_bf16(c.hidden, 0.2, rng), dtype);
    return in;
  }

  void run(const Case& c) {
    SCOPED_TRACE(case_name(c));
    const std::string family = c.rms ? "rmsnorm" : "layernorm";
    const std::string fp8 = c.e5m2 ? "__nv_fp8_e5m2" : "__nv_fp8_e4m3";
    const std::string t = c.fp32 ? "float" : "__nv_bfloat16";
    const int hidden = c.hidden;
    const int bytes = c.fp32 ? 4 : 2;
    const std::string tail = std::to_string(hidden) + ", " + (c.zero_centered ? "true" : "false");
    const test::TemplateKernels loaded = test::load_template_kernels(
        "#include \"norm.cuh\"\n#include \"block_cast.cuh\"\n",
        {"opfuse::" + family + "_fwd<" + t + ", " + t + ", " + tail + ">",
         "opfuse::block_cast_transpose<" + t + ", " + fp8 + ", false, true>",
         "opfuse::" + family + "_block_fwd<" + t + ", " + fp8 + ", " + tail + ", true>",
         "opfuse::" + family + "_block_fwd<" + t + ", " + fp8 + ", " + tail + ", false>"});
    ASSERT_EQ(loaded.compiled.spill_store_bytes, 0) << "registers: " << loaded.compiled.registers;
    for (const cudaKernel_t k : loaded.kernels) ASSERT_NE(k, nullptr);

    const int rows = c.rows;
    const size_t elems = size_t(rows) * hidden;
    const Inputs in = inputs(c);
    const test::DeviceArray &x = *in.x, &gamma = *in.gamma, &beta = *in.beta;

    const cpu::ScaleGridShape row_grid = cpu::scale_grid_shape(rows, hidden, false);
    const cpu::ScaleGridShape col_grid = cpu::scale_grid_shape(hidden, rows, false);
    struct Outputs {
      test::DeviceArray *y, *y_grid, *y_t, *y_t_grid, *source, *mean, *rstd;
    };
    auto outputs = [&] {
      Outputs o{&new_array(elems),           &new_array(size_t(row_grid.size()) * 4),
                &new_array(elems),           &new_array(size_t(col_grid.size()) * 4),
                &new_array(elems * bytes),   &new_array(size_t(rows) * 4),
                &new_array(size_t(rows) * 4)};
      for (test::DeviceArray* a : {o.y, o.y_grid, o.y_t, o.y_t_grid, o.source, o.mean, o.rstd})
        poison(*a);
      return o;
    };
    const Outputs want = outputs(), got = outputs(), inference = outputs();
    const float* no_beta = nullptr;
    const void* beta_ptr = c.rms ? no_beta : beta.data();
    const int norm_threads = launch::norm_fwd_block_threads(hidden, bytes, false);
    const dim3 norm_grid(
        unsigned(launch::ceil_div(rows, launch::norm_fwd_rows_per_block(hidden, bytes, false))));
    const dim3 cast_grid(launch::block_cast_grid_x(hidden), launch::block_cast_grid_y(rows));

    // Unfused: the norm to bf16, then both copies from it.
    NormFwdParams np{x.data(),
                     gamma.data(),
                     beta_ptr,
                     want.source->data(),
                     nullptr,
                     nullptr,
                     nullptr,
                     nullptr,
                     static_cast<float*>(want.mean->data()),
                     static_cast<float*>(want.rstd->data()),
                     1e-5f,
                     rows};
    launch(loaded.kernels[0], norm_grid, norm_threads, &np);
    BlockCastParams both{want.source->data(),
                         want.y->data(),
                         static_cast<float*>(want.y_grid->data()),
                         want.y_t->data(),
                         static_cast<float*>(want.y_t_grid->data()),
                         0.0f,
                         c.power_of_2 ? 1 : 0,
                         rows,
                         hidden};
    launch(loaded.kernels[1], cast_grid, launch::kBlockCastThreads, &both);

    // Fused (training): the norm writes the row-wise copy and the source, the column-only cast
    // reads the source.
    auto fused = [&](const Outputs& o, bool with_source) {
      NormBlockFwdParams bp{x.data(),
                            gamma.data(),
                            beta_ptr,
                            o.y->data(),
                            static_cast<float*>(o.y_grid->data()),
                            with_source ? o.source->data() : nullptr,
                            static_cast<float*>(o.mean->data()),
                            static_cast<float*>(o.rstd->data()),
                            1e-5f,
                            0.0f,
                            c.power_of_2 ? 1 : 0,
                            rows};
      launch(loaded.kernels[with_source ? 2 : 3], norm_grid, norm_threads, &bp);
    };
    fused(got, true);
    BlockCastParams column{got.source->data(),
                           nullptr,
                           nullptr,
                           got.y_t->data(),
                           static_cast<float*>(got.y_t_grid->data()),
                           0.0f,
                           c.power_of_2 ? 1 : 0,
                           rows,
                           hidden};
    launch(loaded.kernels[1], cast_grid, launch::kBlockCastThreads, &column);
    fused(inference, false);
    OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));

    test::expect_same_bytes(*want.y, *got.y, "row-wise codes");
    test::expect_same_bytes(*want.y_grid, *got.y_grid,
                            "row-wise scale_inv grid (padding poisoned in both)");
    test::expect_same_bytes(*want.source, *got.source, "the output in the input dtype");
    test::expect_same_bytes(*want.y_t, *got.y_t, "column-wise codes");
    test::expect_same_bytes(*want.y_t_grid, *got.y_t_grid, "column-wise scale_inv grid");
    test::expect_same_bytes(*want.rstd, *got.rstd, "rstd");
    if (!c.rms) test::expect_same_bytes(*want.mean, *got.mean, "mean");
    test::expect_same_bytes(*want.y, *inference.y, "row-wise codes (inference)");
    test::expect_same_bytes(*want.y_grid, *inference.y_grid, "row-wise grid (inference)");
    EXPECT_EQ(test::bytes_other_than(*inference.source, kPoison), 0u)
        << "the inference kernel writes no output in the input dtype";
    // Not a vacuous comparison: the codes are not all one byte, the scales not all one value.
    const std::vector<uint8_t> codes = test::download_bytes(got.y->data(), got.y->bytes());
    size_t zeros = 0;
    for (const uint8_t b : codes) zeros += b == 0 ? 1 : 0;
    EXPECT_LT(zeros, codes.size() / 4);
    const size_t inner = size_t(launch::block_scale_grid_inner(rows, hidden, false));
    const std::vector<uint8_t> grid = test::download_bytes(got.y_grid->data(), 8 * inner);
    EXPECT_NE(std::vector<uint8_t>(grid.begin(), grid.begin() + 4),
              std::vector<uint8_t>(grid.begin() + 4 * inner, grid.begin() + 4 * inner + 4))
        << "row 0's first two blocks (the second holds an outlier) have one scale";
  }
  // MXFP8 (pattern norm_micro_cast): the norm writing its output, then micro_scale_cast's
  // decoded 1 x 32 row-wise copy of it, against layernorm_micro_fwd / rmsnorm_micro_fwd writing
  // the decoded copy (and, with kWriteColumnwiseSource, the output) itself. `e5m2` picks the
  // format; the scales are E8M0 whatever `power_of_2` says.
  void run_mxfp8(const Case& c) {
    SCOPED_TRACE("MXFP8 " + case_name(c));
    const std::string family = c.rms ? "rmsnorm" : "layernorm";
    const std::string format = c.e5m2 ? "1" : "0";
    const std::string t = c.fp32 ? "float" : "__nv_bfloat16";
    const int hidden = c.hidden, rows = c.rows, bytes = c.fp32 ? 4 : 2;
    const std::string tail = std::to_string(hidden) + ", " + (c.zero_centered ? "true" : "false");
    const test::TemplateKernels loaded = test::load_template_kernels(
        "#include \"norm.cuh\"\n#include \"micro_scale.cuh\"\n",
        {"opfuse::" + family + "_fwd<" + t + ", " + t + ", " + tail + ">",
         "opfuse::micro_scale_cast<" + t + ", " + t + ", " + format +
             ", false, false, false, false, false>",
         "opfuse::" + family + "_micro_fwd<" + t + ", " + format + ", " + tail + ", true>",
         "opfuse::" + family + "_micro_fwd<" + t + ", " + format + ", " + tail + ", false>"});
    ASSERT_EQ(loaded.compiled.spill_store_bytes, 0) << "registers: " << loaded.compiled.registers;
    for (const cudaKernel_t k : loaded.kernels) ASSERT_NE(k, nullptr);

    const size_t elems = size_t(rows) * hidden;
    const Inputs in = inputs(c);
    struct Outputs {
      test::DeviceArray *y, *source, *mean, *rstd;
    };
    auto outputs = [&] {
      Outputs o{&new_array(elems * bytes), &new_array(elems * bytes), &new_array(size_t(rows) * 4),
                &new_array(size_t(rows) * 4)};
      for (test::DeviceArray* a : {o.y, o.source, o.mean, o.rstd}) poison(*a);
      return o;
    };
    const Outputs want = outputs(), got = outputs(), inference = outputs();
    const void* beta = c.rms ? nullptr : in.beta->data();
    const int norm_threads = launch::norm_fwd_block_threads(hidden, bytes, false);
    const dim3 norm_grid(
        unsigned(launch::ceil_div(rows, launch::norm_fwd_rows_per_block(hidden, bytes, false))));

    NormFwdParams np{in.x->data(),
                     in.gamma->data(),
                     beta,
                     want.source->data(),
                     nullptr,
                     nullptr,
                     nullptr,
                     nullptr,
                     static_cast<float*>(want.mean->data()),
                     static_cast<float*>(want.rstd->data()),
                     1e-5f,
                     rows};
    launch(loaded.kernels[0], norm_grid, norm_threads, &np);
    MicroScaleParams cast{want.source->data(),
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
                          hidden};
    const int format_id = c.e5m2 ? launch::kMicroScaleE5M2 : launch::kMicroScaleE4M3;
    launch(loaded.kernels[1],
           dim3(unsigned(launch::micro_scale_grid_x(rows, hidden, format_id, false, false))),
           launch::kMicroScaleThreads, &cast);
    auto fused = [&](const Outputs& o, bool with_source) {
      NormMicroFwdParams mp{in.x->data(),
                            in.gamma->data(),
                            beta,
                            o.y->data(),
                            with_source ? o.source->data() : nullptr,
                            static_cast<float*>(o.mean->data()),
                            static_cast<float*>(o.rstd->data()),
                            1e-5f,
                            rows};
      launch(loaded.kernels[with_source ? 2 : 3], norm_grid, norm_threads, &mp);
    };
    fused(got, true);
    fused(inference, false);
    OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));

    test::expect_same_bytes(*want.y, *got.y, "decoded row-wise copy");
    test::expect_same_bytes(*want.source, *got.source, "the output in the input dtype");
    test::expect_same_bytes(*want.rstd, *got.rstd, "rstd");
    if (!c.rms) test::expect_same_bytes(*want.mean, *got.mean, "mean");
    test::expect_same_bytes(*want.y, *inference.y, "decoded row-wise copy (inference)");
    EXPECT_EQ(test::bytes_other_than(*inference.source, kPoison), 0u)
        << "the inference kernel writes no output in the input dtype";
    // Not vacuous: quantization moved some values (the copy is not the output), and the copy is
    // not all zeros.
    const std::vector<uint8_t> copy = test::download_bytes(got.y->data(), got.y->bytes());
    const std::vector<uint8_t> source =
        test::download_bytes(got.source->data(), got.source->bytes());
    size_t moved = 0, nonzero_bytes = 0;
    for (size_t i = 0; i < copy.size(); ++i) {
      moved += copy[i] != source[i] ? 1 : 0;
      nonzero_bytes += copy[i] != 0 ? 1 : 0;
    }
    EXPECT_GT(moved, copy.size() / 8) << "MXFP8 keeps 3 (E4M3) or 2 (E5M2) mantissa bits";
    EXPECT_GT(nonzero_bytes, copy.size() / 4) << "fp32 copies keep zeros in their low bytes";
  }
};

TEST_F(BlockNormGpu, LayerNormMatchesTheUnfusedPair) {
  for (const Case c : {Case{false, false, false, true, 300}, Case{false, true, false, false, 1000},
                       Case{false, false, true, true, 1}, Case{false, false, false, false, 129}}) {
    run(c);
  }
}

TEST_F(BlockNormGpu, RmsNormMatchesTheUnfusedPair) {
  for (const Case c : {Case{true, false, false, true, 300}, Case{true, true, true, false, 517},
                       Case{true, false, false, false, 64}}) {
    run(c);
  }
}

TEST_F(BlockNormGpu, EveryLaneLayoutMatchesTheUnfusedPair) {
  for (const Case c :
       {Case{false, false, false, true, 300, 4096}, Case{true, false, true, false, 77, 4096},
        Case{false, false, false, true, 200, 640}, Case{true, true, false, false, 130, 640},
        Case{true, false, true, true, 9, 2048}, Case{false, false, false, true, 150, 512, true},
        Case{true, false, true, false, 9, 1024, true},
        Case{false, true, false, false, 33, 4096, true}}) {
    run(c);
  }
}

TEST_F(BlockNormGpu, Mxfp8NormMatchesTheUnfusedPair) {
  for (const Case c :
       {Case{false, false, false, true, 300}, Case{true, true, true, false, 517},
        Case{false, false, true, false, 1}, Case{true, false, false, true, 77, 4096},
        Case{false, true, false, false, 130, 640}, Case{true, false, true, true, 9, 2048},
        Case{false, false, false, true, 150, 512, true},
        Case{true, false, true, false, 33, 1024, true}}) {
    run_mxfp8(c);
  }
}

}  // namespace
}  // namespace opfuse
