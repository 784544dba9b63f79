// LogFp8TensorStats on the device (templates/quant_stats.cuh) against the CPU reference
// (reference/quant_stats.h): a plan variant of an FP8 program asking every cast of the operands of
// two layers runs forward and backward on the GPU and on the reference from the same inputs and
// parameters. For the tensors both sides hold bit for bit (fc1's activation x, the weights, fc2's
// gradient dy) the records agree: counts and scale_inv min/max exactly, sums within 1e-5
// relative; two runs give the same bits; a NaN gives NaN statistics.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <span>

#include "debug/stats.h"
#include "debug_routing_fixture.h"
#include "gpu/gemm.h"
#include "gpu/plan_executor.h"
#include "gpu_test_support.h"
#include "reference/reference_executor.h"

namespace opfuse::test {
namespace {

using debug::QuantizedMoments;
using debug::TensorMoments;

const std::string kProgram = R"(
recipe fp8 = delayed_scaling()
sequence mlp(x: bf16[tokens, 128]) -> (y: bf16[tokens, 128]) uses fp8 {
  linear(128, 256) as fc1
  gelu()
  linear(256, 128) as fc2
}
)";

const std::string kConfig = R"(
all:
  layers: {layer_types: [fc]}
  transformer_engine:
    LogFp8TensorStats:
      tensors: [activation, weight, gradient]
      stats: [underflows%, overflows%, fp8_current_scaling_mse, fp8_block_scaling_mse,
              fp8_block_scaling_mse_columnwise, mxfp8_mse, mxfp8_mse_columnwise]
)";

std::vector<TensorMoments> records_of(const std::vector<unsigned char>& bytes) {
  std::vector<TensorMoments> out(bytes.size() / sizeof(TensorMoments));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(TensorMoments));
  return out;
}

double relative(double got, double want) {
  return std::abs(got - want) / std::max(std::abs(want), 1e-30);
}

class DebugFp8StatsGpu : public GpuStreamTest {
 protected:
  // `program` under `config`: the GPU's records equal the CPU reference's where both read the
  // same bits, and repeat bit for bit. Returns the plan's slots.
  std::vector<plan::StatSlot> expect_records_match(const std::string& program,
                                                   const std::string& config);
};

// A float8_block_scaling recipe with other settings than the what-if's (FP32 scales, an epsilon,
// 1x128 weight blocks): the layers' own casts have records of their own, on both sides alike.
TEST_F(DebugFp8StatsGpu, OwnBlockCastsWithOtherSettingsMatchTheReference) {
  std::string program = kProgram;
  program.replace(program.find("delayed_scaling()"), 17,
                  "float8_block_scaling(power_of_2_scale = false, amax_epsilon = 0.001, "
                  "w_block = 1)");
  const std::vector<plan::StatSlot> slots = expect_records_match(program, R"(
all:
  layers: {layer_types: [fc]}
  transformer_engine:
    LogFp8TensorStats:
      tensors: [activation, weight, gradient]
      stats: [underflows%, scale_inv_min, scale_inv_max, mse, mse_columnwise,
              fp8_block_scaling_mse]
)");
  int own = 0;
  for (const plan::StatSlot& slot : slots)
    own += slot.cast == plan::QuantStatCast::Quantizer && slot.block_size == 128;
  EXPECT_EQ(own, 2 * 3 * 2) << "per layer and tensor, the own cast row-wise and column-wise";
}

TEST_F(DebugFp8StatsGpu, RecordsMatchTheReferenceAndRepeatBitForBit) {
  const std::vector<plan::StatSlot> slots = expect_records_match(kProgram, kConfig);
  // Per layer and tensor: moments, quantizer, current, block, MXFP8 rowwise and columnwise, and
  // (activation, gradient) block columnwise.
  EXPECT_EQ(slots.size(), 2u * (3 * 6 + 2));
}

// scale_exponent_histogram (debug/stats.h): the partial kernels count each block's scale
// exponent, the final one adds the counts into the records after the cast's.
TEST_F(DebugFp8StatsGpu, ScaleExponentHistogramsMatchTheReference) {
  const std::vector<plan::StatSlot> slots = expect_records_match(kProgram, R"(
all:
  layers: {layer_types: [fc]}
  transformer_engine:
    LogFp8TensorStats:
      tensors: [activation, weight, gradient]
      stats: [mxfp8_scale_exponent_histogram, mxfp8_scale_exponent_histogram_columnwise,
              fp8_block_scaling_scale_exponent_histogram,
              fp8_block_scaling_scale_exponent_histogram_columnwise]
)");
  int histograms = 0;
  for (const plan::StatSlot& slot : slots) histograms += slot.exponent_histogram;
  // Per layer: MXFP8 both ways and block row-wise for the three tensors, block column-wise for
  // the activation and the gradient (a weight's 128x128 blocks serve both copies).
  EXPECT_EQ(histograms, 2 * (3 * 3 + 2));
}

std::vector<plan::StatSlot> DebugFp8StatsGpu::expect_records_match(const std::string& program,
                                                                   const std::string& config) {
  const auto routed_config = routed(config, {"fc1", "fc2"}, true);
  const auto c = compile_program("mlp", program, "", "", &routed_config->routing);
  EXPECT_TRUE(c);
  if (!c) return {};
  const ir::Sequence& seq = c->program.sequences[0];
  const plan::SequencePlan& plan = c->plan.sequences[0];

  gpu::GemmRunner gemms(stream_);
  gpu::SequenceExecutor gpu(plan, *c->modules, gemms, stream_);
  // FP8 GEMMs need a multiple of 16; 208 leaves partial blocks of 128 (and 32) down the columns.
  const int64_t tokens = 208;
  gpu.bind({{"tokens", tokens}});
  const std::map<std::string, DeviceArray*> arrays = allocate_tensors(gpu);
  cpu::ReferenceExecutor<float> ref(seq, {{"tokens", tokens}});
  std::mt19937_64 rng(42);
  random_params(ref, arrays, rng);
  cpu::Tensor<float> x = cpu::Tensor<float>::zeros({tokens, 128});
  x.data = random_bf16(x.data.size(), 1.0, rng);
  // Magnitudes down to 2^-30 so that every cast underflows somewhere.
  for (size_t i = 0; i < x.data.size(); ++i) x.data[i] *= std::ldexp(1.0f, -int(i / 128 % 31));
  x.data[5] = 0.0f;
  upload_bf16(*arrays.at("x"), x.data);
  cpu::Tensor<float> dy = cpu::Tensor<float>::zeros({tokens, 128});
  dy.data = random_bf16(dy.data.size(), 0.01, rng);
  upload_bf16(*arrays.at("dy"), dy.data);

  ref.forward({x});
  ref.backward({dy});
  gpu.forward(stream_);
  gpu.backward(stream_);
  const std::vector<unsigned char> first = gpu.stat_records(stream_);
  const std::vector<TensorMoments> got = records_of(first);
  const std::vector<TensorMoments>& want = ref.stat_records();
  EXPECT_EQ(got.size(), plan.stat_slots.size());
  EXPECT_EQ(want.size(), got.size());
  if (got.size() != plan.stat_slots.size() || want.size() != got.size()) return {};
  int64_t underflows = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const plan::StatSlot& slot = plan.stat_slots[i];
    const bool same_bits = (slot.layer == "fc1" && slot.tensor == "activation") ||
                           slot.tensor == "weight" ||
                           (slot.layer == "fc2" && slot.tensor == "gradient");
    if (slot.exponent_histogram && same_bits) {
      // The scale-exponent histogram in the parts after the record: bin for bin, and every
      // scaled block counted once.
      SCOPED_TRACE(slot.layer + " " + slot.tensor + " histogram of " +
                   std::string(plan::name(slot.cast)));
      const auto parts = [&](const std::vector<TensorMoments>& r) {
        return debug::histogram_of(std::span(r).subspan(i + 1, debug::kExponentHistogramRecords));
      };
      const debug::ExponentHistogram g = parts(got), w = parts(want);
      int64_t total = 0, nonzero_bins = 0;
      for (int b = 0; b < debug::kExponentBins; ++b) {
        EXPECT_EQ(g.bins[b], w.bins[b]) << "bin " << debug::exponent_bin_name(b);
        total += g.bins[b];
        nonzero_bins += g.bins[b] != 0;
      }
      EXPECT_EQ(total, debug::as_quantized(got[i]).scaled_blocks);
      // fc1's input spans 2^0 to 2^-30 down its rows: the row-wise casts see it all.
      if (slot.layer == "fc1" && slot.tensor == "activation" && !slot.columnwise) {
        EXPECT_GT(nonzero_bins, 20) << "a spread of scales";
      }
    }
    if (slot.record != plan::StatRecordKind::Quantized) continue;
    SCOPED_TRACE(slot.layer + " " + slot.tensor + " " + std::string(plan::name(slot.cast)) +
                 (slot.columnwise ? " columnwise" : ""));
    const QuantizedMoments g = debug::as_quantized(got[i]);
    const QuantizedMoments w = debug::as_quantized(want[i]);
    EXPECT_EQ(g.count, w.count);
    EXPECT_EQ(g.blocks, w.blocks);
    if (!same_bits) continue;
    EXPECT_EQ(g.underflows, w.underflows);
    EXPECT_EQ(g.overflows, w.overflows);
    EXPECT_EQ(g.underflow_blocks, w.underflow_blocks);
    EXPECT_EQ(g.scaled_blocks, w.scaled_blocks);
    EXPECT_EQ(g.scale_inv_min, w.scale_inv_min);
    EXPECT_EQ(g.scale_inv_max, w.scale_inv_max);
    EXPECT_LT(relative(g.sq_err, w.sq_err), 1e-5) << g.sq_err << " vs " << w.sq_err;
    EXPECT_LT(relative(g.log2_scale_inv_sum, w.log2_scale_inv_sum), 1e-5);
    EXPECT_LT(relative(g.log2_scale_inv_sq_sum, w.log2_scale_inv_sq_sum), 1e-5);
    underflows += g.underflows;
  }
  EXPECT_GT(underflows, 0);  // the counts compared were not all zero

  // Deterministic: the same inputs again give the same bits (the delayed scales have moved after
  // the first step on both sides alike, so compare the GPU with itself only).
  gpu.forward(stream_);
  gpu.backward(stream_);
  const std::vector<unsigned char> second = gpu.stat_records(stream_);
  gpu.forward(stream_);
  gpu.backward(stream_);
  EXPECT_EQ(gpu.stat_records(stream_), second);
  return plan.stat_slots;
}

TEST_F(DebugFp8StatsGpu, NanGivesNanStatistics) {
  const auto routed_config = routed(
      "a:\n  layers: {layer_types: [fc1]}\n  transformer_engine:\n"
      "    LogFp8TensorStats: {tensors: [activation], stats: [fp8_current_scaling_mse, "
      "fp8_block_scaling_mse, mxfp8_scale_inv_min]}\n",
      {"fc1", "fc2"}, true);
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
    upload_bf16(a, values);
    gpu.set_tensor(info.name, a.data());
  }
  gpu.forward(stream_);
  const auto records = records_of(gpu.stat_records(stream_));
  ASSERT_EQ(records.size(), 4u);  // moments, current, block, MXFP8
  for (size_t i = 1; i < 4; ++i) {
    const QuantizedMoments q = debug::as_quantized(records[i]);
    EXPECT_EQ(q.count, 32 * 128) << i;
    EXPECT_TRUE(std::isnan(q.sq_err)) << i;
  }
  EXPECT_TRUE(std::isnan(debug::as_quantized(records[3]).scale_inv_min));
}

TEST_F(DebugFp8StatsGpu, NanBlocksAreCountedAsNonFinite) {
  const auto routed_config = routed(
      "a:\n  layers: {layer_types: [fc1]}\n  transformer_engine:\n"
      "    LogFp8TensorStats: {tensors: [activation], stats: [mxfp8_scale_exponent_histogram]}\n",
      {"fc1", "fc2"}, true);
  const auto c = compile_program("mlp", kProgram, "", "", &routed_config->routing);
  ASSERT_TRUE(c);
  gpu::GemmRunner gemms(stream_);
  gpu::SequenceExecutor gpu(c->plan.sequences[0], *c->modules, gemms, stream_);
  gpu.bind({{"tokens", 32}});
  for (const gpu::TensorInfo& info : gpu.tensors()) {
    if (info.role == plan::BufferRole::Result) continue;
    DeviceArray& a = new_array(info.bytes);
    std::vector<float> values(info.bytes / 2, 0.5f);
    if (info.name == "x") {
      values[3] = std::nanf("");
      for (size_t k = 128; k < 160; ++k) values[k] = 0.0f;  // one block of zeros: not counted
    }
    upload_bf16(a, values);
    gpu.set_tensor(info.name, a.data());
  }
  gpu.forward(stream_);
  const auto records = records_of(gpu.stat_records(stream_));
  ASSERT_EQ(records.size(), 2u + size_t(debug::kExponentHistogramRecords));
  const debug::ExponentHistogram h =
      debug::histogram_of(std::span(records).subspan(2, debug::kExponentHistogramRecords));
  // 32 x 128 in 1 x 32 blocks: 128 blocks, one NaN, one of zeros; the others have amax 0.5:
  // 0.5 / 448 rounds up to 2^-9.
  debug::ExponentHistogram want;
  want.bins[debug::kNonFiniteBin] = 1;
  want.bins[127 - 9] = 126;
  EXPECT_EQ(h, want);
}

}  // namespace
}  // namespace opfuse::test
