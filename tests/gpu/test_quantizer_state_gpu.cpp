// The device-resident quantizer state against its CPU twin (reference/cpu_quantizers.h,
// quantizer_math.h), bit for bit over 20 steps, plus the GPU runtime pieces it stands on: module
// loading and launch checks, the memory pool's peak, the device description. Label `gpu`: skips
// (visibly) where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu/device.h"
#include "gpu/device_memory.h"
#include "gpu/module.h"
#include "gpu/quantizer_state.h"
#include "opfuse/error.h"
#include "reference/cpu_quantizers.h"

namespace opfuse::gpu {
namespace {

class QuantizerStateGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "skipping GPU quantizer-state tests: " << why;
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

// The specs HYBRID delayed / current recipes give a tensor (E5M2 for gradients).
plan::QuantSpec delayed_spec(plan::AmaxCompute compute, bool gradient = false) {
  plan::QuantSpec spec;
  spec.scaling = plan::ScalingKind::Delayed;
  spec.format = gradient ? plan::DType::E5M2 : plan::DType::E4M3;
  spec.history_length = 16;
  spec.amax_compute = compute;
  spec.margin = 1;
  return spec;
}

plan::QuantSpec current_spec(bool power_of_2, bool gradient = false) {
  plan::QuantSpec spec;
  spec.scaling = plan::ScalingKind::Current;
  spec.format = gradient ? plan::DType::E5M2 : plan::DType::E4M3;
  spec.epsilon = power_of_2 ? 0.0 : 1e-4;
  spec.power_of_2_scale = power_of_2;
  return spec;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST_F(QuantizerStateGpu, TwentyStepsMatchTheCpuQuantizersBitForBit) {
  // (recipe, is_gradient): delayed max and most_recent in both formats, current scaling with and
  // without power-of-2 scales.
  const std::vector<plan::QuantSpec> quantizers = {
      delayed_spec(plan::AmaxCompute::Max, false),
      delayed_spec(plan::AmaxCompute::Max, true),
      delayed_spec(plan::AmaxCompute::MostRecent, false),
      delayed_spec(plan::AmaxCompute::MostRecent, true),
      current_spec(true, false),
      current_spec(false, true),
  };
  std::vector<QuantizerSettings> settings;
  std::vector<cpu::Quantizer> twins;
  for (std::size_t i = 0; i < quantizers.size(); ++i) {
    const std::string name = "q" + std::to_string(i);
    settings.push_back(quantizer_settings(name, quantizers[i]));
    twins.push_back(cpu::make_quantizer(name, quantizers[i]));
  }
  QuantizerState state(settings, stream_);
  ASSERT_EQ(state.count(), 6);

  std::mt19937 rng(23);
  std::uniform_real_distribution<float> exponent(-30.0f, 12.0f);
  for (int step = 0; step < 20; ++step) {
    for (std::size_t i = 0; i < twins.size(); ++i) {
      float amax = std::exp2(exponent(rng));
      if (step == 3) amax = 0.0f;                // keeps the old scale / scale 1
      if (step == 5 && i % 2 == 1) amax = NAN;   // skipped by max, refused by the others
      if (step == 7 && i == 2) amax = INFINITY;  // keeps the old scale
      if (step == 9 && i == 0) amax = 1e-39f;    // subnormal: the scale overflows
      if (step == 11 && i == 4) amax = 3e-39f;   // current scaling overflow -> FLT_MAX
      cpu::Quantizer& twin = twins[i];
      // What the cast kernels do: max-reduce this step's amax into slot 0 (zeroed by the last
      // update under delayed scaling; written fresh under current scaling).
      twin.state.amax_history[0] = amax;
      if (twin.current_scaling) {
        const cpu::CurrentScale s = cpu::compute_current_scale(
            amax, twin.delayed.fp8_max, twin.amax_epsilon, twin.power_of_2_scale);
        twin.state.scale = s.scale;
        twin.state.scale_inv = s.scale_inv;
      } else {
        cpu::end_step(twin);
      }
      ASSERT_EQ(cudaMemcpyAsync(state.amax(static_cast<int>(i)), &amax, sizeof amax,
                                cudaMemcpyHostToDevice, stream_),
                cudaSuccess);
    }
    state.update(stream_);
    const std::vector<cpu::DelayedScalingState> got = state.download(stream_);
    for (std::size_t i = 0; i < twins.size(); ++i) {
      const cpu::DelayedScalingState& want = twins[i].state;
      ASSERT_TRUE(same_bits(got[i].scale, want.scale))
          << "step " << step << " quantizer " << i << ": scale " << got[i].scale << " vs "
          << want.scale;
      ASSERT_TRUE(same_bits(got[i].scale_inv, want.scale_inv))
          << "step " << step << " quantizer " << i;
      ASSERT_EQ(got[i].amax_history.size(), want.amax_history.size());
      ASSERT_EQ(std::memcmp(got[i].amax_history.data(), want.amax_history.data(),
                            want.amax_history.size() * sizeof(float)),
                0)
          << "step " << step << " quantizer " << i << ": amax history";
    }
  }
  // The scales moved away from their initial 1 (the test would pass vacuously otherwise).
  for (const cpu::Quantizer& twin : twins) EXPECT_NE(twin.state.scale, 1.0f) << twin.name;
}

TEST_F(QuantizerStateGpu, RecordsPointIntoTheOneAllocation) {
  std::vector<QuantizerSettings> settings = {
      quantizer_settings("a", delayed_spec(plan::AmaxCompute::Max)),
      quantizer_settings("b", current_spec(true, true))};
  QuantizerState state(settings, stream_);
  std::vector<QuantizerRecord> records(2);
  ASSERT_EQ(cudaMemcpyAsync(records.data(), state.records(), sizeof(QuantizerRecord) * 2,
                            cudaMemcpyDeviceToHost, stream_),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(records[i].amax, state.amax(i));
    EXPECT_EQ(records[i].amax_history, state.amax_history(i));
    EXPECT_EQ(records[i].scale, state.scale(i));
    EXPECT_EQ(records[i].scale_inv, state.scale_inv(i));
  }
  // Delayed scaling's amax is its slot of the one amaxes section (what a tensor-parallel step
  // all-reduces); current scaling's is word 0 of its own four.
  EXPECT_EQ(state.amax(0), state.amaxes());
  EXPECT_EQ(state.amaxes_floats(), 2 * QuantizerLayout::kScalarSlotBytes / sizeof(float));
  EXPECT_EQ(state.amax(1), state.amax_history(1));
  EXPECT_EQ(records[0].history_length, 16);
  EXPECT_EQ(records[0].mode, 0);
  EXPECT_EQ(records[0].fp8_max, 448.0f);
  EXPECT_EQ(records[0].margin, 1);
  EXPECT_EQ(records[1].mode, 2);
  EXPECT_EQ(records[1].fp8_max, 57344.0f);  // a gradient under HYBRID: E5M2
  EXPECT_EQ(records[1].power_of_2_scale, 1);
  const auto initial = state.download(stream_);
  EXPECT_EQ(initial[0].scale, 1.0f);
  EXPECT_EQ(initial[0].scale_inv, 1.0f);
  EXPECT_EQ(initial[0].amax_history, std::vector<float>(16, 0.0f));
}

TEST_F(QuantizerStateGpu, UploadRoundTripsAndRefusesAMismatchedCheckpoint) {
  std::vector<QuantizerSettings> settings = {
      quantizer_settings("a", delayed_spec(plan::AmaxCompute::Max)),
      quantizer_settings("b", current_spec(false))};
  QuantizerState state(settings, stream_);
  std::vector<cpu::DelayedScalingState> saved(2);
  saved[0].amax_history = {0.0f, 1.5f, 2.5f, 3.0f, 0.25f, 9.0f, 1.0f, 2.0f,
                           3.0f, 4.0f, 5.0f, 6.0f, 7.0f,  8.0f, 9.0f, 10.0f};
  saved[0].scale = 44.8f;
  saved[0].scale_inv = 1.0f / 44.8f;
  saved[1].amax_history = {3.0f};
  saved[1].scale = 149.33333f;
  saved[1].scale_inv = 1.0f / 149.33333f;
  saved[1].measurements = 0xFFFFFFF0u;  // the count stochastic rounding steps by (word 3)
  state.upload(saved, stream_);
  const auto loaded = state.download(stream_);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(loaded[i].amax_history, saved[i].amax_history);
    EXPECT_TRUE(same_bits(loaded[i].scale, saved[i].scale));
    EXPECT_TRUE(same_bits(loaded[i].scale_inv, saved[i].scale_inv));
    EXPECT_EQ(loaded[i].measurements, saved[i].measurements);
  }
  // Where the kernels read it: the record's word 3 (QuantizerState::measurements).
  unsigned int on_device = 0;
  ASSERT_EQ(cudaMemcpy(&on_device, state.measurements(1), sizeof on_device, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(on_device, 0xFFFFFFF0u);
  std::vector<cpu::DelayedScalingState> wrong = saved;
  wrong[0].amax_history.resize(8);
  EXPECT_THROW(state.upload(wrong, stream_), UsageError);
  wrong = saved;
  wrong.pop_back();
  EXPECT_THROW(state.upload(wrong, stream_), UsageError);
  EXPECT_EQ(state.download(stream_)[0].amax_history, saved[0].amax_history) << "nothing loaded";
}

// ---- the pieces under it -----------------------------------------------------------------------

TEST_F(QuantizerStateGpu, ModuleChecksKernelNamesAndParamsSizeBeforeLaunch) {
  jit::CompileRequest request;
  request.kernel_name = "update_scales";
  request.source = "#include \"scale_update.cuh\"\n";
  request.name_expressions = {"opfuse::update_scales<256>"};
  request.arch = current_device().arch;
  const Module module(jit::compile_kernel(request));
  const Kernel kernel = module.kernel("opfuse::update_scales<256>");
  // {const QuantizerRecord*, int} padded to 16. ASSERT: without the check the misuse below
  // would really launch and fault.
  ASSERT_EQ(kernel.params_bytes(), 16u);
  EXPECT_THROW(module.kernel("opfuse::update_scales<128>"), UsageError);
  const struct { const void* records; } too_small{nullptr};
  try {
    launch(kernel, dim3(1), dim3(256), 0, stream_, too_small);
    FAIL() << "an 8-byte params struct was launched";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("8-byte params struct"), std::string::npos)
        << error.what();
  }
  const struct {
    const void* records;
    int count;
  } empty_update{nullptr, 0};
  EXPECT_THROW(launch(kernel, dim3(0), dim3(256), 0, stream_, empty_update), UsageError);
  // count 0: the kernel runs and touches nothing.
  launch(kernel, dim3(1), dim3(256), 0, stream_, empty_update);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

TEST_F(QuantizerStateGpu, PoolReportsPeakUsageOfStreamOrderedBuffers) {
  reset_pool_peak();
  const PoolUsage before = pool_usage();
  constexpr std::size_t kBytes = 64u << 20;
  {
    DeviceBuffer buffer(kBytes, stream_);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % 256, 0u);
    EXPECT_EQ(buffer.size(), kBytes);
    DeviceBuffer moved = std::move(buffer);
    EXPECT_EQ(buffer.data(), nullptr);  // NOLINT(bugprone-use-after-move): checks the move
    EXPECT_EQ(moved.size(), kBytes);
    EXPECT_EQ(cudaMemsetAsync(moved.data(), 0, kBytes, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_GE(pool_usage().used, before.used + kBytes);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const PoolUsage after = pool_usage();
  EXPECT_EQ(after.used, before.used);
  EXPECT_GE(after.used_high, before.used + kBytes);
  reset_pool_peak();
  EXPECT_LT(pool_usage().used_high, before.used + kBytes);
}

TEST_F(QuantizerStateGpu, CurrentDeviceDescribesTheGpu) {
  const DeviceInfo device = current_device();
  EXPECT_FALSE(device.name.empty());
  EXPECT_GT(device.sm_count, 0);
  EXPECT_GT(device.total_memory_bytes, 0u);
  EXPECT_EQ(device.arch, nvrtc_arch_for(device.major, device.minor));
  if (device.major == 9) {
    EXPECT_EQ(device.arch, "sm_90a");
  }
  std::string why = "unchanged";
  EXPECT_TRUE(gpu_available(&why));
  EXPECT_EQ(why, "unchanged");
}

}  // namespace
}  // namespace opfuse::gpu
