// Dropout on the GPU (templates/dropout.cuh through codegen and the plan executor) against the
// CPU reference: both draw the same Philox4x32-10 words and compare them with the same integer
// threshold, so over two training steps the outputs and input gradients agree bit for bit, and so
// does the mask (read from y, whose inputs are never 0, and checked against the reference's saved
// bits); the second step draws another mask. The same through Session, eagerly and as a recorded
// training step replayed (the step counter is read from device memory), and an inference forward
// passes x through; a session loaded from a state file continues the step's masks. Label `gpu`:
// skips (visibly) where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codegen/plan.h"
#include "cpu/numerics.h"
#include "driver/frontend.h"
#include "gpu/gemm.h"
#include "gpu/plan_executor.h"
#include "gpu_test_support.h"
#include "opfuse/program.h"
#include "reference/dropout.h"
#include "reference/reference_executor.h"
#include "test_support.h"

namespace opfuse::gpu {
namespace {

// 200 rows (a partial row tile) of 200 columns (a partial column tile, and a mask row of 7 words
// whose last is partly used), two dropouts. The ops around them are constant_scale, which the GPU
// computes bit for bit as the reference does (an activation may differ by a bf16 code).
constexpr const char* kProgram = R"(
sequence s(x: bf16[tokens, 200]) -> (y: bf16[tokens, 200]) {
  constant_scale(0.75)
  dropout(p = 0.3, seed = 20260101)
  constant_scale(1.5)
  dropout(0.1) as late
}
)";
constexpr std::int64_t kTokens = 200, kCols = 200;

using test::DeviceArray;

// Never 0, so y = 0 means dropped.
std::vector<float> inputs(std::mt19937_64& rng) {
  std::vector<float> x = test::random_bf16(std::size_t(kTokens * kCols), 1.0, rng, 0.0);
  for (float& v : x) v = std::abs(v) + 0.25f;
  cpu::round_to_bf16(x);
  return x;
}

void expect_same(const std::vector<float>& gpu, const std::vector<float>& cpu,
                 const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    if (gpu[i] == cpu[i]) continue;
    if (++mismatches <= 3)
      ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << ", cpu " << cpu[i];
  }
  EXPECT_EQ(mismatches, 0u) << what;
}

class DropoutGpu : public test::GpuStreamTest {};

TEST_F(DropoutGpu, TwoStepsMatchTheCpuReferenceBitForBit) {
  const auto c = test::compile_program("dropout", kProgram, "bf16");
  ASSERT_NE(c, nullptr);
  const ir::Sequence& seq = c->program.sequences.at(0);
  GemmRunner gemms(stream_);
  SequenceExecutor gpu(c->plan.sequences.at(0), *c->modules, gemms, stream_);
  const cpu::Bindings bindings{{"tokens", kTokens}};
  cpu::ReferenceExecutor<float> ref(seq, bindings);
  gpu.bind({bindings.begin(), bindings.end()});
  const std::map<std::string, DeviceArray*> arrays = allocate_tensors(gpu);
  const std::size_t n = std::size_t(kTokens * kCols);
  std::mt19937_64 rng(11);
  std::vector<std::uint32_t> first_mask;
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<float> x = inputs(rng), dy = test::random_bf16(n, 0.5, rng);
    test::upload_bf16(*arrays.at("x"), x);
    test::upload_bf16(*arrays.at("dy"), dy);
    cpu::Tensor<float> xt = cpu::Tensor<float>::zeros({kTokens, kCols}), dyt = xt;
    xt.data = x;
    dyt.data = dy;
    const std::vector<float> want_y = ref.forward({xt})[0].data;
    const std::vector<float> want_dx = ref.backward({dyt}).inputs[0].data;
    EXPECT_EQ(gpu.dropout_step(), std::uint32_t(step));
    gpu.forward(stream_);
    gpu.backward(stream_);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const std::vector<float> y = test::download_bf16(gpu.output("y"), n);
    expect_same(y, want_y, "y");
    expect_same(test::download_bf16(gpu.input_grad("x"), n), want_dx, "dx");
    // The masks, read from y (x is never 0: y is 0 exactly where either dropout dropped), are
    // the reference's bits.
    const std::vector<std::uint32_t>& first = ref.dropout_mask("dropout_0");
    const std::vector<std::uint32_t>& late = ref.dropout_mask("late");
    const std::int64_t words = (kCols + 31) / 32;
    std::size_t dropped = 0;
    for (std::int64_t r = 0; r < kTokens; ++r) {
      for (std::int64_t col = 0; col < kCols; ++col) {
        const bool kept =
            cpu::dropout_kept(first, words, r, col) && cpu::dropout_kept(late, words, r, col);
        ASSERT_EQ(y[std::size_t(r * kCols + col)] != 0.0f, kept) << r << ", " << col;
        dropped += kept ? 0 : 1;
      }
    }
    // 1 - 0.7 * 0.9 of the elements: far from none and from all.
    EXPECT_GT(dropped, n / 5);
    EXPECT_LT(dropped, n / 2);
    if (step == 0) {
      first_mask = first;
    } else {
      EXPECT_NE(first, first_mask) << "step 2 drew step 1's mask";
    }
    gpu.end_step(stream_);
    ref.step();
  }
  // An inference forward passes x through both dropouts.
  std::mt19937_64 again(12);
  const std::vector<float> x = inputs(again);
  test::upload_bf16(*arrays.at("x"), x);
  gpu.forward(stream_, RunMode::Inference);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  cpu::Tensor<float> xt = cpu::Tensor<float>::zeros({kTokens, kCols});
  xt.data = x;
  expect_same(test::download_bf16(gpu.output("y"), n), ref.forward_inference({xt})[0].data,
              "inference y");
}

// Through the public Session: two eager steps, then a recorded training step replayed twice;
// each replay reads the advanced counter, as the reference's third and fourth steps.
TEST_F(DropoutGpu, SessionStepsAndGraphReplaysDrawEachStepsMask) {
  const Program program = Program::compile(kProgram, "dropout.fuse", CompileOptions{});
  Session session(program, "", stream_);
  session.bind({{"tokens", kTokens}});
  const std::size_t n = std::size_t(kTokens * kCols);
  DeviceArray x_dev(n * 2), dy_dev(n * 2);
  session.set_tensor("x", x_dev.data());
  session.set_tensor("dy", dy_dev.data());
  SourceManager sources;
  DiagnosticEngine diags(sources);
  const std::optional<ir::Program> ir_program =
      load_program_from_source("dropout.fuse", kProgram, sources, diags);
  ASSERT_TRUE(ir_program.has_value()) << diags.format_all();
  cpu::ReferenceExecutor<float> ref(ir_program->sequences.at(0), {{"tokens", kTokens}});
  std::mt19937_64 rng(13);
  const std::vector<float> x = inputs(rng), dy = test::random_bf16(n, 0.5, rng);
  test::upload_bf16(x_dev, x);
  test::upload_bf16(dy_dev, dy);
  cpu::Tensor<float> xt = cpu::Tensor<float>::zeros({kTokens, kCols}), dyt = xt;
  xt.data = x;
  dyt.data = dy;
  auto check = [&](const Session& run, const std::string& what) {
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const std::vector<float> want_y = ref.forward({xt})[0].data;
    const std::vector<float> want_dx = ref.backward({dyt}).inputs[0].data;
    expect_same(test::download_bf16(run.output("y"), n), want_y, what + " y");
    expect_same(test::download_bf16(run.input_grad("x"), n), want_dx, what + " dx");
    ref.step();
  };
  for (int step = 0; step < 2; ++step) {
    session.forward(stream_);
    session.backward(stream_);
    session.step(stream_);
    check(session, "eager step " + std::to_string(step));
  }
  session.capture(stream_, Session::GraphScope::TrainingStep);
  for (int replay = 0; replay < 2; ++replay) {
    session.replay(stream_);
    check(session, "replay " + std::to_string(replay));
  }
  session.release_graph();
  // A state file's step count (4) resumes the masks in a new session.
  const std::string path = test::make_temp_dir("dropout_state") + "/state.opfuse";
  session.save(path, stream_);
  Session resumed(program, "", stream_);
  resumed.bind({{"tokens", kTokens}});
  resumed.set_tensor("x", x_dev.data());
  resumed.set_tensor("dy", dy_dev.data());
  resumed.load(path, stream_);
  resumed.forward(stream_);
  resumed.backward(stream_);
  check(resumed, "resumed at step 4");
}

}  // namespace
}  // namespace opfuse::gpu
