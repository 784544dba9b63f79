// `fusec train --device gpu` (tools/run/gpu_train.h) against the CPU reference's run
// (reference/train_driver.h) at a tiny size: the same teacher, batches and SGD, so the bf16 eval
// curves agree up to the order of sums and bf16 roundings.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "test_support.h"

namespace opfuse {
namespace {

nlohmann::json train(const std::string& dir, const std::string& device) {
  const std::string file = dir + "/stack.fuse";
  std::ofstream(file, std::ios::binary) << test::kTrainStack;
  const std::string json = dir + "/" + device + ".json";
  const auto r = test::fusec("train " + test::shell_quoted(file) + " --device " + device +
                             " --recipe bf16 --recipe fp8 --bind tokens=128 --steps 40 "
                             "--eval-every 10 --lr 2 --json " +
                             test::shell_quoted(json));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(test::read_text(json));
}

TEST(TrainGpu, Bf16CurveMatchesTheCpuReference) {
  std::string why;
  if (!gpu::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const std::string dir = test::make_temp_dir("train_gpu");
  const nlohmann::json gpu = train(dir, "gpu");
  const nlohmann::json cpu = train(dir, "cpu");
  EXPECT_NEAR(gpu["noise_floor"].get<double>(), cpu["noise_floor"].get<double>(), 1e-9);
  EXPECT_NEAR(gpu["teacher"]["output_rms"].get<double>(),
              cpu["teacher"]["output_rms"].get<double>(), 0.01);
  const auto g = gpu["recipes"][0]["eval_loss"].get<std::vector<double>>();
  const auto c = cpu["recipes"][0]["eval_loss"].get<std::vector<double>>();
  ASSERT_EQ(g.size(), c.size());
  // 2%: the teachers differ by bf16 roundings of the GEMM sums, and 40 steps of SGD carry the
  // students' rounding differences along; a wrong gradient or update is off by far more (the loss
  // falls by a third over these steps).
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], c[i], 0.02 * c[i]) << "point " << i;
  EXPECT_LT(g.back(), 0.85 * g.front());
  // FP8 delayed scaling on the GPU ends near the GPU's bf16 run.
  const double fp8 = gpu["recipes"][1]["final_eval_loss"].get<double>();
  EXPECT_NEAR(fp8, g.back(), 0.05 * g.back());
  // The final weights in the bf16 teacher's session: bf16's agree with its own last point (an
  // inference forward against the training forward of the same weights) and with the CPU's;
  // fp8's are its trained weights without its forward's quantization.
  const double bf16_in_bf16 = gpu["recipes"][0]["final_bf16_forward_loss"].get<double>();
  EXPECT_NEAR(bf16_in_bf16, g.back(), 1e-6 * g.back());
  EXPECT_NEAR(bf16_in_bf16, cpu["recipes"][0]["final_bf16_forward_loss"].get<double>(),
              0.02 * bf16_in_bf16);
  const double fp8_in_bf16 = gpu["recipes"][1]["final_bf16_forward_loss"].get<double>();
  EXPECT_NE(fp8_in_bf16, fp8);
  EXPECT_NEAR(fp8_in_bf16, fp8, 0.05 * fp8);
}

}  // namespace
}  // namespace opfuse
