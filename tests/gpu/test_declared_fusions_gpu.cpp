// Declared fusions on the GPU (docs/language.md, "Declared fusions"): TE's ForwardAxpy declared
// from C++ (CompileOptions::fusions) runs as one bias_add kernel whose output equals the CPU
// reference's bit for bit (both compute 0.375 * x + r in fp32 and round once), forward and
// backward, and differs from the unfused run only by the rounding of the scaled value.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cpu/numerics.h"
#include "driver/compile.h"
#include "gpu_test_support.h"
#include "opfuse/program.h"
#include "reference/reference_executor.h"
#include "test_support.h"

namespace opfuse {
namespace {

constexpr const char* kProgram = R"(
sequence s(x: bf16[tokens, 256], r: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) {
  constant_scale(0.375)
  add_extra_input(r)
}
)";

class DeclaredFusionsGpu : public test::GpuStreamTest {
 protected:
  void* upload(const std::vector<float>& values) {
    const test::DeviceArray& array = new_array(values.size() * 2);
    test::upload_bf16(array, values);
    return array.data();
  }

  // y, dx and dr of one forward and backward.
  std::vector<float> run(bool fused, const std::vector<float>& x, const std::vector<float>& r,
                         const std::vector<float>& dy, int tokens) {
    CompileOptions options;
    if (fused)
      options.fusions.push_back(
          {"axpy", FusionDeclaration::Phase::Forward, 1, {"constant_scale", "add_extra_input"}});
    const Program program = Program::compile(kProgram, "axpy.fuse", options);
    EXPECT_EQ(test::contains(program.plan_json(), "\"pattern\": \"axpy\""), fused);
    Session session(program, "", stream_);
    session.bind({{"tokens", tokens}});
    session.set_tensor("x", upload(x));
    session.set_tensor("r", upload(r));
    session.set_tensor("dy", upload(dy));
    session.forward(stream_);
    session.backward(stream_);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<float> all = test::download_bf16(session.output("y"), x.size());
    for (const char* name : {"x", "r"}) {
      const std::vector<float> g = test::download_bf16(session.input_grad(name), x.size());
      all.insert(all.end(), g.begin(), g.end());
    }
    return all;
  }
};

TEST_F(DeclaredFusionsGpu, AxpyMatchesTheCpuReferenceBitForBit) {
  const int tokens = 176;  // not a whole number of 64-row tiles
  const std::size_t n = std::size_t(tokens) * 256;
  std::mt19937_64 rng(7);
  const std::vector<float> x = test::random_bf16(n, 1.0, rng), r = test::random_bf16(n, 1.0, rng),
                           dy = test::random_bf16(n, 0.1, rng);
  const std::vector<float> fused = run(true, x, r, dy, tokens);
  const std::vector<float> unfused = run(false, x, r, dy, tokens);
  ASSERT_EQ(fused.size(), 3 * n);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<float> want = {0.375f * x[i] + r[i]};
    cpu::round_to_bf16(want);
    ASSERT_EQ(fused[i], want[0]) << "y[" << i << "]";
    differ += fused[i] != unfused[i] ? 1 : 0;
    ASSERT_NEAR(unfused[i], fused[i], 1e-2 * (std::abs(fused[i]) + 1)) << "y[" << i << "]";
  }
  EXPECT_GT(differ, 0u) << "unfused rounds the scaled value first";
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<float> dx = {0.375f * dy[i]};
    cpu::round_to_bf16(dx);
    ASSERT_EQ(fused[n + i], dx[0]) << "dx[" << i << "]";
    ASSERT_EQ(fused[2 * n + i], dy[i]) << "dr[" << i << "]";
  }
}

}  // namespace
}  // namespace opfuse
