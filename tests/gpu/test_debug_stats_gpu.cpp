// Statistics on the device (templates/tensor_stats.cuh) against the CPU reference: a plan variant
// inspecting every tensor of two layers runs forward and backward on the GPU and on the reference
// from the same inputs and parameters; the records agree (counts, and the min/max/amax/dynamic
// ranges of tensors both sides hold bit for bit, exactly; sums within 1e-5 relative; the tensors
// GEMMs and activations produce, within their own GPU-vs-CPU error), and two runs of the same
// inputs give the same bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <variant>

#include "debug/stats.h"
#include "debug_routing_fixture.h"
#include "gpu/gemm.h"
#include "gpu/plan_executor.h"
#include "gpu_test_support.h"
#include "reference/reference_executor.h"

namespace opfuse::test {
namespace {

using debug::StatKind;
using debug::TensorMoments;

const std::string kProgram = R"(
sequence mlp(x: bf16[tokens, 128]) -> (y: bf16[tokens, 128]) {
  linear(128, 256) as fc1
  gelu()
  linear(256, 128) as fc2
}
)";

const std::string kConfig = R"(
all:
  layers: {layer_types: [fc]}
  transformer_engine:
    LogTensorStats:
      tensors: [activation, weight, output, gradient, dgrad, wgrad]
      stats:
        - max
        - {max_blockwise_dynamic_range: {block_size: 32, dims: 1}}
        - {max_blockwise_dynamic_range: {block_size: 16, dims: 2}}
)";

std::vector<TensorMoments> records_of(const std::vector<unsigned char>& bytes) {
  std::vector<TensorMoments> out(bytes.size() / sizeof(TensorMoments));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(TensorMoments));
  return out;
}

double relative(double got, double want) {
  return std::abs(got - want) / std::max(std::abs(want), 1e-30);
}

// What both sides compare: counts; where both hold the same bits, the extrema exactly and the sums
// within 1e-5 relative; elsewhere (tensors each side computes) within `tol`.
void expect_records_match(const plan::StatSlot& slot, const TensorMoments& g,
                          const TensorMoments& w, bool same_bits, double tol) {
  SCOPED_TRACE(slot.layer + " " + slot.tensor + " block " + std::to_string(slot.block_size));
  EXPECT_EQ(g.count, w.count);
  if (same_bits) {
    tol = 1e-5;
    EXPECT_EQ(g.min, w.min);
    EXPECT_EQ(g.max, w.max);
    EXPECT_EQ(g.amax, w.amax);
    EXPECT_EQ(g.min_nonzero_abs, w.min_nonzero_abs);
    EXPECT_EQ(g.max_nonzero_abs, w.max_nonzero_abs);
    EXPECT_NEAR(g.max_blockwise_dynamic_range, w.max_blockwise_dynamic_range, 1e-12);
  } else {
    EXPECT_LT(relative(g.amax, w.amax), tol);
  }
  for (const StatKind k : {StatKind::Mean, StatKind::Std, StatKind::L1Norm, StatKind::L2Norm}) {
    const double gv = debug::value(g, k), wv = debug::value(w, k);
    if (k == StatKind::Mean && !same_bits) {
      // A mean near 0 has no relative scale: compare against the spread.
      EXPECT_LT(std::abs(gv - wv), tol * debug::value(w, StatKind::Std));
    } else {
      EXPECT_LT(relative(gv, wv), tol) << debug::stat_name(k) << " " << gv << " vs " << wv;
    }
  }
  if (slot.block_size > 0) {
    EXPECT_GT(g.max_blockwise_dynamic_range, 0);
  }
}

// LogTensorStats of `tensors` (a YAML list's items) of both layers: every statistic of a whole
// tensor.
std::string log_tensor_stats(const std::string& tensors) {
  return "all:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n    LogTensorStats:\n"
         "      tensors: [" +
         tensors + "]\n      stats: [min, max, mean, std, l1_norm, l2_norm, dynamic_range]\n";
}

class DebugStatsGpu : public GpuStreamTest {
 protected:
  // Memory for every tensor the executor names but its results; the parameters, x ([tokens,
  // width], x[5] = 0: zeros are left out of the dynamic ranges) and dy the same random bf16
  // values on both sides.
  void feed(gpu::SequenceExecutor& gpu, cpu::ReferenceExecutor<float>& ref, int64_t tokens,
            int64_t width) {
    const std::map<std::string, DeviceArray*> arrays = allocate_tensors(gpu);
    std::mt19937_64 rng(42);
    random_params(ref, arrays, rng);
    x_ = cpu::Tensor<float>::zeros({tokens, width});
    x_.data = random_bf16(x_.data.size(), 1.0, rng);
    x_.data[5] = 0.0f;
    x_array_ = arrays.at("x");
    dy_ = cpu::Tensor<float>::zeros({tokens, width});
    dy_.data = random_bf16(dy_.data.size(), 0.01, rng);
    if (special_values_) {
      // bf16 subnormals (the smallest nonzero magnitudes, in the upper half of a packed pair in x
      // and the lower half in dy), signed zeros and large values of both signs: the packed
      // extrema (common/stat_record.cuh) must give what the float path gives.
      const float tiny = std::ldexp(1.0f, -133);  // the smallest bf16 subnormal
      x_.data[6] = -0.0f;
      x_.data[9] = -tiny;
      x_.data[12] = std::ldexp(3.0f, -133);
      x_.data[40] = 1000.0f;
      x_.data[41] = -2000.0f;
      dy_.data[2] = tiny;
      dy_.data[3] = -0.0f;
      dy_.data[17] = std::ldexp(5.0f, -133);
      dy_.data[30] = -6.0f;
      dy_.data[131] = 7.0f;
    }
    upload_bf16(*x_array_, x_.data);
    upload_bf16(*arrays.at("dy"), dy_.data);
  }
  // The executor and the reference of `c`'s sequence bound to `tokens`, fed, one forward and one
  // backward each; returns the GPU's record bytes (the reference's: ref_->stat_records()).
  std::vector<unsigned char> run_both(const CompiledProgram& c, int64_t tokens) {
    gemms_ = std::make_unique<gpu::GemmRunner>(stream_);
    gpu_ =
        std::make_unique<gpu::SequenceExecutor>(c.plan.sequences[0], *c.modules, *gemms_, stream_);
    gpu_->bind({{"tokens", tokens}});
    ref_ = std::make_unique<cpu::ReferenceExecutor<float>>(c.program.sequences[0],
                                                           cpu::Bindings{{"tokens", tokens}});
    feed(*gpu_, *ref_, tokens, 128);
    ref_->forward({x_});
    ref_->backward({dy_});
    gpu_->forward(stream_);
    gpu_->backward(stream_);
    return gpu_->stat_records(stream_);
  }
  // Deterministic: the same inputs again give the same bits.
  void expect_repeats(const std::vector<unsigned char>& first) {
    gpu_->forward(stream_);
    gpu_->backward(stream_);
    EXPECT_EQ(gpu_->stat_records(stream_), first);
  }
  void TearDown() override {
    gpu_.reset();
    gemms_.reset();
    GpuStreamTest::TearDown();
  }

  cpu::Tensor<float> x_, dy_;
  bool special_values_ = false;
  DeviceArray* x_array_ = nullptr;
  std::unique_ptr<gpu::GemmRunner> gemms_;
  std::unique_ptr<gpu::SequenceExecutor> gpu_;
  std::unique_ptr<cpu::ReferenceExecutor<float>> ref_;
};

TEST_F(DebugStatsGpu, RecordsMatchTheReferenceAndRepeatBitForBit) {
  const auto routed_config = routed(kConfig, {"fc1", "fc2"}, false);
  const auto c = compile_program("mlp", kProgram, "", "", &routed_config->routing);
  ASSERT_TRUE(c);
  const plan::SequencePlan& plan = c->plan.sequences[0];
  ASSERT_EQ(plan.stat_slots.size(), 36u);
  // 200 tokens, not a multiple of the blocks: partial blocks and tiles.
  const std::vector<unsigned char> first = run_both(*c, 200);
  const std::vector<TensorMoments> got = records_of(first);
  const std::vector<TensorMoments>& want = ref_->stat_records();
  ASSERT_EQ(got.size(), plan.stat_slots.size());
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const plan::StatSlot& slot = plan.stat_slots[i];
    // What both sides hold bit for bit: the caller's x (fc1's activation), dy (fc2's gradient)
    // and the weights; the rest each side computes.
    const bool same_bits = (slot.layer == "fc1" && slot.tensor == "activation") ||
                           slot.tensor == "weight" ||
                           (slot.layer == "fc2" && slot.tensor == "gradient");
    expect_records_match(slot, got[i], want[i], same_bits, 3e-2);
  }
  expect_repeats(first);
}

// Statistics fused into kernels (docs/debugging.md): under delayed scaling the SwiGLU kernels
// (forward and backward, their FP8 casts folded) and the casts of dy and of the norm's output
// compute the statistics of the tensors they read or write; 6 of the 12 records come from them
// (the weights', whose casts are cached, are kernels of their own). Their
// records agree with the reference like the separate kernel's, repeat bit for bit, and a NaN in
// the input makes the statistics of every tensor it reaches NaN.
TEST_F(DebugStatsGpu, StatisticsFusedIntoKernelsMatchTheReference) {
  const std::string program = R"(
recipe fp8 = delayed_scaling()
sequence mlp(x: bf16[tokens, 128]) -> (y: bf16[tokens, 128]) uses fp8 {
  layernorm(128)
  linear(128, 512) as fc1
  swiglu()
  linear(256, 128) as fc2
}
)";
  const auto routed_config =
      routed(log_tensor_stats("activation, weight, output, gradient, dgrad, wgrad"), {"fc1", "fc2"},
             false);
  const auto c = compile_program("mlp", program, "", "", &routed_config->routing);
  ASSERT_TRUE(c);
  const plan::SequencePlan& plan = c->plan.sequences[0];
  ASSERT_EQ(plan.stat_slots.size(), 12u);
  int fused_merges = 0;
  for (const plan::Step& st : plan.steps) {
    if (st.what.find("merge the kernel's partial records") != std::string::npos) ++fused_merges;
  }
  EXPECT_EQ(fused_merges, 6);

  // 208 tokens: partial row tiles (FP8 GEMMs need a multiple of 16).
  const std::vector<unsigned char> first = run_both(*c, 208);
  const std::vector<TensorMoments> got = records_of(first);
  const std::vector<TensorMoments>& want = ref_->stat_records();
  ASSERT_EQ(got.size(), 12u);
  ASSERT_EQ(want.size(), 12u);
  for (size_t i = 0; i < got.size(); ++i) {
    const plan::StatSlot& slot = plan.stat_slots[i];
    // Bit for bit on both sides: the weights and dy (dy read by its cast); the layernorm output
    // and everything after it each side computes (FP8 GEMMs).
    const bool same_bits =
        slot.tensor == "weight" || (slot.layer == "fc2" && slot.tensor == "gradient");
    expect_records_match(slot, got[i], want[i], same_bits, 5e-2);
  }
  expect_repeats(first);

  // A NaN in x: the layernorm row, fc1's output and the SwiGLU output carry it.
  std::vector<float> with_nan = x_.data;
  with_nan[3] = std::nanf("");
  upload_bf16(*x_array_, with_nan);
  gpu_->forward(stream_);
  const std::vector<TensorMoments> nan_records = records_of(gpu_->stat_records(stream_));
  for (size_t i = 0; i < plan.stat_slots.size(); ++i) {
    const plan::StatSlot& slot = plan.stat_slots[i];
    const bool reached = (slot.layer == "fc1" && slot.tensor == "activation") ||
                         (slot.layer == "fc1" && slot.tensor == "output") ||
                         (slot.layer == "fc2" && slot.tensor == "activation");
    if (!reached) continue;
    SCOPED_TRACE(slot.layer + " " + slot.tensor);
    EXPECT_TRUE(std::isnan(nan_records[i].max));
    EXPECT_TRUE(std::isnan(nan_records[i].mean));
  }
}

// The tiled kernels with statistics run one wave of blocks over equal runs of the column-major
// tiles (templates/common/elementwise_tile.cuh, flat schedule): at 17008 tokens each block's run
// spans several tiles and crosses from one column tile to the next (17008 is no multiple of the
// 128-row tile, so every column ends in a partial tile); the records still match the reference
// and repeat bit for bit.
TEST_F(DebugStatsGpu, FusedStatisticsOverRunsOfManyTilesMatchTheReference) {
  const std::string program = R"(
recipe fp8 = delayed_scaling()
sequence mlp(x: bf16[tokens, 128]) -> (y: bf16[tokens, 128]) uses fp8 {
  layernorm(128)
  linear(128, 512, bias = false) as fc1
  swiglu()
  linear(256, 128, bias = false) as fc2
}
)";
  const auto routed_config =
      routed(log_tensor_stats("activation, output, gradient, dgrad"), {"fc1", "fc2"}, false);
  const auto c = compile_program("mlp", program, "", "", &routed_config->routing);
  ASSERT_TRUE(c);
  const plan::SequencePlan& plan = c->plan.sequences[0];
  int flat = 0;
  for (const plan::Step& st : plan.steps) {
    const auto* launch = std::get_if<plan::LaunchStep>(&st.body);
    if (launch != nullptr && launch->grid.rule == "tile_stats_flat") ++flat;
  }
  EXPECT_EQ(flat, 4);  // the SwiGLU forward and backward, the casts of x and dy
  const std::vector<unsigned char> first = run_both(*c, 17008);
  const std::vector<TensorMoments> got = records_of(first);
  const std::vector<TensorMoments>& want = ref_->stat_records();
  ASSERT_EQ(got.size(), plan.stat_slots.size());
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const plan::StatSlot& slot = plan.stat_slots[i];
    expect_records_match(slot, got[i], want[i], slot.layer == "fc2" && slot.tensor == "gradient",
                         5e-2);
  }
  expect_repeats(first);
}

// The extrema of bf16 tensors are taken on packed pairs (common/stat_record.cuh): subnormals,
// signed zeros and large values in either half of a pair give exactly the reference's min, max,
// amax and smallest nonzero magnitude, in the kernels of their own (x and dy under bf16) and in a
// tiled kernel (dy read by its FP8 cast under delayed scaling).
TEST_F(DebugStatsGpu, ExtremaOfSpecialBf16ValuesMatchTheReference) {
  special_values_ = true;
  const std::string fp8_program = R"(
recipe fp8 = delayed_scaling()
sequence mlp(x: bf16[tokens, 128]) -> (y: bf16[tokens, 128]) uses fp8 {
  linear(128, 256) as fc1
  gelu()
  linear(256, 128) as fc2
}
)";
  const auto routed_config =
      routed(log_tensor_stats("activation, gradient"), {"fc1", "fc2"}, false);
  const float tiny = std::ldexp(1.0f, -133);
  for (const std::string& program : {kProgram, fp8_program}) {
    SCOPED_TRACE(program);
    const auto c = compile_program("mlp", program, "", "", &routed_config->routing);
    ASSERT_TRUE(c);
    const plan::SequencePlan& plan = c->plan.sequences[0];
    const std::vector<TensorMoments> got = records_of(run_both(*c, 208));
    const std::vector<TensorMoments>& want = ref_->stat_records();
    ASSERT_EQ(got.size(), plan.stat_slots.size());
    ASSERT_EQ(want.size(), got.size());
    int checked = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const plan::StatSlot& slot = plan.stat_slots[i];
      const bool x = slot.layer == "fc1" && slot.tensor == "activation";
      const bool dy = slot.layer == "fc2" && slot.tensor == "gradient";
      if (!x && !dy) continue;
      ++checked;
      // The inputs hold what was planted (so the comparison below covers it).
      EXPECT_EQ(want[i].min_nonzero_abs, tiny);
      EXPECT_EQ(want[i].min, x ? -2000.0 : -6.0);
      EXPECT_EQ(want[i].max, x ? 1000.0 : 7.0);
      expect_records_match(slot, got[i], want[i], true, 0);
    }
    EXPECT_EQ(checked, 2);
  }
}

TEST_F(DebugStatsGpu, NonFiniteValuesGiveNonFiniteStatistics) {
  const auto routed_config = routed(
      "a:\n  layers: {layer_types: [fc1]}\n  transformer_engine:\n"
      "    LogTensorStats: {tensors: [activation], stats: [max, {max_blockwise_dynamic_range: "
      "{block_size: 32}}]}\n",
      {"fc1", "fc2"}, false);
  const auto c = compile_program("mlp", kProgram, "", "", &routed_config->routing);
  ASSERT_TRUE(c);
  gpu::GemmRunner gemms(stream_);
  gpu::SequenceExecutor gpu(c->plan.sequences[0], *c->modules, gemms, stream_);
  gpu.bind({{"tokens", 32}});
  for (const gpu::TensorInfo& info : gpu.tensors()) {
    if (info.role == plan::BufferRole::Result) continue;
    DeviceArray& a = new_array(info.bytes);
    std::vector<float> values(info.bytes / 2, 0.5f);
    if (info.name == "x") values[3] = std::nanf("");
    if (info.name == "x") values[70] = INFINITY;
    upload_bf16(a, values);
    gpu.set_tensor(info.name, a.data());
  }
  gpu.forward(stream_);
  const auto records = records_of(gpu.stat_records(stream_));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].count, 32 * 128);
  EXPECT_TRUE(std::isnan(records[0].max));
  EXPECT_TRUE(std::isnan(records[0].mean));
  EXPECT_TRUE(std::isnan(records[1].max_blockwise_dynamic_range));
}

}  // namespace
}  // namespace opfuse::test
