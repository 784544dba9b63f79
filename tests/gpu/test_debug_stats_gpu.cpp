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

class DebugStatsGpu : public GpuStreamTest {};

TEST_F(DebugStatsGpu, RecordsMatchTheReferenceAndRepeatBitForBit) {
  const auto routed_config = routed(kConfig, {"fc1", "fc2"}, false);
  const auto c = compile_program("mlp", kProgram, "", "", &routed_config->routing);
  ASSERT_TRUE(c);
  const ir::Sequence& seq = c->program.sequences[0];
  const plan::SequencePlan& plan = c->plan.sequences[0];
  ASSERT_EQ(plan.stat_slots.size(), 36u);

  gpu::GemmRunner gemms(stream_);
  gpu::SequenceExecutor gpu(plan, *c->modules, gemms, stream_);
  const int64_t tokens = 200;  // not a multiple of the blocks: partial blocks and tiles
  gpu.bind({{"tokens", tokens}});
  std::map<std::string, DeviceArray*> arrays;
  for (const gpu::TensorInfo& info : gpu.tensors()) {
    if (info.role == plan::BufferRole::Result) continue;
    arrays[info.name] = &new_array(info.bytes);
    gpu.set_tensor(info.name, arrays[info.name]->data());
  }
  cpu::ReferenceExecutor<float> ref(seq, {{"tokens", tokens}});
  std::mt19937_64 rng(42);
  for (const std::string& name : ref.param_names()) {
    cpu::Tensor<float>& p = ref.param(name);
    p.data = random_bf16(p.data.size(), p.shape.size() == 2 ? 0.05 : 0.1, rng);
    upload_bf16(*arrays.at(name), p.data);
  }
  ref.params_changed();
  cpu::Tensor<float> x = cpu::Tensor<float>::zeros({tokens, 128});
  x.data = random_bf16(x.data.size(), 1.0, rng);
  x.data[5] = 0.0f;  // zeros are left out of the dynamic ranges
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
  ASSERT_EQ(got.size(), plan.stat_slots.size());
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const plan::StatSlot& slot = plan.stat_slots[i];
    SCOPED_TRACE(slot.layer + " " + slot.tensor + " block " + std::to_string(slot.block_size));
    const TensorMoments& g = got[i];
    const TensorMoments& w = want[i];
    EXPECT_EQ(g.count, w.count);
    // What both sides hold bit for bit: the caller's x (fc1's activation), dy (fc2's gradient)
    // and the weights; the rest each side computes.
    const bool same_bits = (slot.layer == "fc1" && slot.tensor == "activation") ||
                           slot.tensor == "weight" ||
                           (slot.layer == "fc2" && slot.tensor == "gradient");
    const double tol = same_bits ? 1e-5 : 3e-2;
    if (same_bits) {
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

  // Deterministic: the same inputs again give the same bits.
  gpu.forward(stream_);
  gpu.backward(stream_);
  EXPECT_EQ(gpu.stat_records(stream_), first);
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
