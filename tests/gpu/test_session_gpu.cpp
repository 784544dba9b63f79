// The embedding API on the GPU (runtime/include/opfuse/program.h): `fusec run --device gpu`'s
// training loop against the CPU reference's, save/load round trips and refusals, CUDA graph
// replay against eager execution, and misuse reported before anything is launched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "api/state_file.h"
#include "driver/compile.h"
#include "driver/frontend.h"
#include "gpu/device.h"
#include "gpu_test_support.h"
#include "opfuse/program.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "reference/run_driver.h"
#include "run/gpu_run.h"
#include "test_support.h"

namespace opfuse {
namespace {

// The seed MLP's ops at a small size; RECIPE is replaced per test.
constexpr const char* kProgram = R"(recipe fp8 = delayed_scaling(amax_history = 16)
recipe fp8c = current_scaling()
sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) uses RECIPE {
  layernorm(256)
  linear(256, 1024, bias = false) as fc1
  swiglu()
  linear(512, 256, bias = false) as fc2
}
)";

std::string program_text(const std::string& recipe, int hidden = 256) {
  std::string text = std::regex_replace(kProgram, std::regex("RECIPE"), recipe);
  if (hidden != 256) text = std::regex_replace(text, std::regex("256"), std::to_string(hidden));
  return text;
}

class SessionGpu : public test::GpuStreamTest {
 protected:
  // Device memory of `elements` random bf16 values ~ N(0, 1), freed at the end of the test. Its
  // own draws (std::mt19937, float normals), not test::random_bf16's.
  void* random_bf16(std::size_t elements, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<float> values(elements);
    for (float& v : values) v = normal(rng);
    const test::DeviceArray& array = new_array(elements * 2);
    test::upload_bf16(array, values);
    return array.data();
  }

  std::vector<unsigned char> read(const void* device, std::size_t bytes) {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return test::download_bytes(device, bytes);
  }

  // A session on the small MLP with owned parameters from `seed`, inputs x and dy set.
  Session make_session(const Program& program, std::uint64_t seed, int tokens = 64) {
    Session session(program, "", stream_);
    session.bind({{"tokens", tokens}});
    session.own_parameters(seed, stream_);
    const std::size_t elements = static_cast<std::size_t>(tokens) * 256;
    session.set_tensor("x", random_bf16(elements, 11));
    session.set_tensor("dy", random_bf16(elements, 12));
    return session;
  }

  void train_step(Session& session) {
    session.forward(stream_);
    session.backward(stream_);
    session.step(stream_);
  }

  std::size_t y_bytes(int tokens = 64) const { return static_cast<std::size_t>(tokens) * 256 * 2; }
};

std::vector<double> numbers_after(const std::string& text, const std::string& key) {
  std::vector<double> values;
  const std::regex pattern(key + " ([-+0-9.e]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern);
       it != std::sregex_iterator(); ++it)
    values.push_back(std::stod((*it)[1].str()));
  return values;
}

// The same report from both devices: losses and gradient norms agree within the recipe's
// precision (bf16 storage on both; FP8 GEMMs round differently from the CPU's fp32 products).
TEST_F(SessionGpu, FusecRunOnTheGpuMatchesTheCpuReference) {
  for (const std::string recipe : {"bf16", "fp8", "fp8c"}) {
    SCOPED_TRACE(recipe);
    const std::string text = program_text(recipe);
    const Program program = Program::compile(text, "small_mlp.fuse");
    api::GpuRunOptions options;
    options.bindings = {{"tokens", 64}};
    options.steps = 3;
    options.seed = 5;
    options.lr = 0.5;
    const std::string gpu_report = api::run_gpu_training(program, options);

    SourceManager sources;
    DiagnosticEngine diags(sources);
    driver::CompileOptions passes_only;
    passes_only.last_stage = driver::Stage::Passes;
    const auto ir = driver::compile_source("small_mlp.fuse", text, sources, diags, passes_only);
    ASSERT_TRUE(ir.ok()) << diags.format_all();
    cpu::RunOptions cpu_options;
    cpu_options.bindings = {{"tokens", 64}};
    cpu_options.steps = 3;
    cpu_options.seed = 5;
    cpu_options.lr = 0.5;
    const std::string cpu_report =
        cpu::run_reference_training(ir.program.sequences[0], cpu_options);

    const double bound = recipe == "bf16" ? 1e-2 : 3e-2;
    for (const std::string key : {"loss", "\\|g\\|"}) {
      const auto gpu_values = numbers_after(gpu_report, key);
      const auto cpu_values = numbers_after(cpu_report, key);
      ASSERT_EQ(gpu_values.size(), cpu_values.size()) << gpu_report << cpu_report;
      ASSERT_FALSE(gpu_values.empty());
      for (std::size_t i = 0; i < gpu_values.size(); ++i) {
        EXPECT_NEAR(gpu_values[i], cpu_values[i], bound * std::fabs(cpu_values[i]))
            << key << " #" << i << "\n"
            << gpu_report << cpu_report;
      }
    }
    EXPECT_NE(gpu_report.find("peak device memory"), std::string::npos);
    std::printf("[ %s ] GPU report:\n%s", recipe.c_str(), gpu_report.c_str());
  }
}

TEST_F(SessionGpu, SaveThenLoadResumesTrainingBitForBit) {
  const Program program = Program::compile(program_text("fp8"), "small_mlp.fuse");
  const std::string path =
      (std::filesystem::temp_directory_path() / "opfuse_session_gpu.state").string();
  Session a = make_session(program, 1);
  train_step(a);
  train_step(a);
  a.save(path, stream_);
  train_step(a);
  const auto a_y = read(a.output("y"), y_bytes());
  const auto a_quantizers = a.quantizers(stream_);

  Session b = make_session(program, 2);  // other parameters: load must replace them all
  b.load(path, stream_);
  train_step(b);
  EXPECT_EQ(read(b.output("y"), y_bytes()), a_y);
  const auto b_quantizers = b.quantizers(stream_);
  ASSERT_EQ(b_quantizers.size(), a_quantizers.size());
  for (std::size_t i = 0; i < a_quantizers.size(); ++i) {
    EXPECT_EQ(b_quantizers[i].amax_history, a_quantizers[i].amax_history) << a_quantizers[i].name;
    EXPECT_EQ(b_quantizers[i].scale, a_quantizers[i].scale) << a_quantizers[i].name;
  }
  std::filesystem::remove(path);
}

// StateParts::Quantizers (what opfuse.torch keeps as extra state beside its own parameters):
// the quantizer state alone, saved and loaded without touching the parameters; a quantizers-only
// file gives the same training step as the whole checkpoint's quantizer state, and a load that
// needs the parameters refuses it.
TEST_F(SessionGpu, QuantizerStateAloneLoadsWithoutTouchingTheParameters) {
  const Program program = Program::compile(program_text("fp8"), "small_mlp.fuse");
  const auto temp = std::filesystem::temp_directory_path();
  const std::string whole = (temp / "opfuse_session_gpu_whole.state").string();
  const std::string alone = (temp / "opfuse_session_gpu_quantizers.state").string();
  Session a = make_session(program, 1);
  train_step(a);
  train_step(a);
  a.save(whole, stream_);
  a.save(alone, stream_, StateParts::Quantizers);
  const auto a_quantizers = a.quantizers(stream_);
  EXPECT_TRUE(api::read_state_file(alone).tensors.empty());
  EXPECT_EQ(api::read_state_file(alone).step, 2);

  const std::size_t weight_bytes = 1024 * 256 * 2;
  Session b = make_session(program, 2);
  const auto b_weight = read(b.parameter("fc1.weight"), weight_bytes);
  b.load(alone, stream_, StateParts::Quantizers);
  EXPECT_EQ(read(b.parameter("fc1.weight"), weight_bytes), b_weight) << "parameters untouched";
  const auto b_quantizers = b.quantizers(stream_);
  ASSERT_EQ(b_quantizers.size(), a_quantizers.size());
  for (std::size_t i = 0; i < a_quantizers.size(); ++i) {
    EXPECT_EQ(b_quantizers[i].amax_history, a_quantizers[i].amax_history) << a_quantizers[i].name;
    EXPECT_EQ(b_quantizers[i].scale, a_quantizers[i].scale) << a_quantizers[i].name;
  }
  try {
    b.load(alone, stream_);
    ADD_FAILURE() << "a whole load took a quantizers-only file";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("holds the quantizer state only"), std::string::npos)
        << error.what();
  }
  train_step(b);

  // The same quantizer state taken from the whole checkpoint: the same step, bit for bit.
  Session c = make_session(program, 2);
  c.load(whole, stream_, StateParts::Quantizers);
  EXPECT_EQ(read(c.parameter("fc1.weight"), weight_bytes), b_weight);
  train_step(c);
  EXPECT_EQ(read(c.output("y"), y_bytes()), read(b.output("y"), y_bytes()));
  // And the loaded scales are what made it: without them the step differs.
  Session d = make_session(program, 2);
  train_step(d);
  EXPECT_NE(read(d.output("y"), y_bytes()), read(b.output("y"), y_bytes()));
  std::filesystem::remove(whole);
  std::filesystem::remove(alone);
}

// NVFP4's stochastic rounding steps its random bits by each quantizer's measurement count: the
// state file keeps the counts (docs/state_files.md), so a session resumed from it rounds the
// gradients of its next step as the uninterrupted one does, weight gradients bit for bit (with
// the counts lost, the resumed draws repeat the first steps' and the gradients differ).
TEST_F(SessionGpu, SaveThenLoadResumesNvfp4StochasticRoundingBitForBit) {
  const std::string text = "recipe fp4 = nvfp4_block_scaling(seed = 9)\n" + program_text("fp4");
  const Program program = Program::compile(text, "small_mlp.fuse");
  const std::string path =
      (std::filesystem::temp_directory_path() / "opfuse_session_gpu_nvfp4.state").string();
  Session a = make_session(program, 1);
  train_step(a);
  train_step(a);
  a.save(path, stream_);
  const api::StateFile saved = api::read_state_file(path);
  std::uint32_t most = 0;
  for (const api::StateQuantizer& q : saved.quantizers) most = std::max(most, q.state.measurements);
  EXPECT_GE(most, 2u) << "two steps measured every gradient's tensor scale";
  train_step(a);
  const std::size_t weight_bytes = 1024 * 256 * 2;
  const auto a_grad = read(a.param_grad("fc1.weight"), weight_bytes);

  Session b = make_session(program, 2);
  b.load(path, stream_);
  train_step(b);
  EXPECT_EQ(read(b.param_grad("fc1.weight"), weight_bytes), a_grad);
  std::filesystem::remove(path);
}

TEST_F(SessionGpu, DamagedOrMismatchedStateFilesAreRefusedAndNothingIsLoaded) {
  const Program program = Program::compile(program_text("fp8"), "small_mlp.fuse");
  const std::string path =
      (std::filesystem::temp_directory_path() / "opfuse_session_gpu_damaged.state").string();
  Session a = make_session(program, 1);
  train_step(a);
  a.save(path, stream_);

  Session b = make_session(program, 2);
  b.forward(stream_, RunMode::Inference);
  const auto before = read(b.output("y"), y_bytes());
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(200);
    char byte = 0;
    file.seekg(200);
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    file.seekp(200);
    file.write(&byte, 1);
  }
  EXPECT_THROW(b.load(path, stream_), Error);
  b.forward(stream_, RunMode::Inference);
  EXPECT_EQ(read(b.output("y"), y_bytes()), before);

  // A file of another program (hidden 512) does not fit: a UsageError naming what differs.
  const Program other = Program::compile(program_text("fp8", 512), "small_mlp.fuse");
  Session c(other, "", stream_);
  c.bind({{"tokens", 64}});
  c.own_parameters(3, stream_);
  c.save(path, stream_);
  try {
    b.load(path, stream_);
    ADD_FAILURE() << "a mismatched file loaded";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("fc1.weight"), std::string::npos) << e.what();
  }
  b.forward(stream_, RunMode::Inference);
  EXPECT_EQ(read(b.output("y"), y_bytes()), before);
  std::filesystem::remove(path);
}

TEST_F(SessionGpu, GraphReplayOfTrainingStepsEqualsEagerSteps) {
  for (const std::string recipe : {"bf16", "fp8", "fp8c"}) {
    SCOPED_TRACE(recipe);
    const Program program = Program::compile(program_text(recipe), "small_mlp.fuse");
    Session eager = make_session(program, 7);
    Session graphed = make_session(program, 7);
    graphed.capture(stream_, Session::GraphScope::TrainingStep);
    EXPECT_TRUE(graphed.has_graph());
    for (int step = 0; step < 3; ++step) {
      train_step(eager);
      graphed.replay(stream_);
      EXPECT_EQ(read(graphed.output("y"), y_bytes()), read(eager.output("y"), y_bytes()))
          << "step " << step;
      EXPECT_EQ(read(graphed.param_grad("fc1.weight"), 1024 * 256 * 2),
                read(eager.param_grad("fc1.weight"), 1024 * 256 * 2))
          << "step " << step;
    }
    const auto eager_q = eager.quantizers(stream_);
    const auto graphed_q = graphed.quantizers(stream_);
    for (std::size_t i = 0; i < eager_q.size(); ++i)
      EXPECT_EQ(graphed_q[i].scale, eager_q[i].scale) << eager_q[i].name;
    // Eager calls are refused while the graph exists, and work again after release_graph().
    EXPECT_THROW(graphed.forward(stream_), UsageError);
    graphed.release_graph();
    train_step(graphed);
    train_step(eager);
    EXPECT_EQ(read(graphed.output("y"), y_bytes()), read(eager.output("y"), y_bytes()));
  }
}

// NCCL with one rank (ParallelOptions::nccl_id on a one-rank sequence) makes the calls N ranks
// make: every collective step an NCCL call, the amaxes all-reduced before each scale update. Over
// one rank they are the identity, so the results equal the plain path's (collectives as copies)
// bit for bit, eager and replayed from a CUDA graph that captured the NCCL calls.
TEST_F(SessionGpu, OneRankThroughNcclEqualsThePlainPath) {
  try {
    (void)new_parallel_id();
  } catch (const UsageError& e) {
    GTEST_SKIP() << "no NCCL on this machine: " << e.what();
  }
  const Program program = Program::compile(R"(recipe fp8 = delayed_scaling(amax_history = 16)
sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) uses fp8 with parallel(tp = 1, sp = true) {
  layernorm(256)
  all_gather(dim = 0)
  linear(256, 1024, bias = false, parallel = column) as fc1
  swiglu()
  linear(512, 256, parallel = row) as fc2
  all_reduce()
  reduce_scatter(dim = 0)
}
)",
                                           "one_rank.fuse");
  // An NCCL id makes one communicator: each NCCL session gets its own.
  const auto session_with = [&](bool through_nccl) {
    SessionOptions options;
    if (through_nccl) options.parallel.nccl_id = new_parallel_id();
    Session session(program, "", stream_, options);
    session.bind({{"tokens", 64}});
    session.own_parameters(5, stream_);
    session.set_tensor("x", random_bf16(64 * 256, 11));
    session.set_tensor("dy", random_bf16(64 * 256, 12));
    return session;
  };
  Session plain = session_with(false);
  Session nccl = session_with(true);
  Session graphed = session_with(true);
  graphed.capture(stream_, Session::GraphScope::TrainingStep);
  for (int step = 0; step < 3; ++step) {
    train_step(plain);
    train_step(nccl);
    graphed.replay(stream_);
    const auto y = read(plain.output("y"), y_bytes());
    EXPECT_EQ(read(nccl.output("y"), y_bytes()), y) << "step " << step;
    EXPECT_EQ(read(graphed.output("y"), y_bytes()), y) << "step " << step;
    for (const auto& [name, bytes] :
         {std::pair<std::string, std::size_t>{"fc1.weight", 1024 * 256 * 2},
          {"fc2.weight", 256 * 512 * 2},
          {"fc2.bias", 256 * 2}}) {
      const auto grad = read(plain.param_grad(name), bytes);
      EXPECT_EQ(read(nccl.param_grad(name), bytes), grad) << name << ", step " << step;
      EXPECT_EQ(read(graphed.param_grad(name), bytes), grad) << name << ", step " << step;
    }
  }
  const auto plain_q = plain.quantizers(stream_);
  ASSERT_FALSE(plain_q.empty());
  for (const Session* session : {&nccl, &graphed}) {
    const auto q = session->quantizers(stream_);
    ASSERT_EQ(q.size(), plain_q.size());
    for (std::size_t i = 0; i < q.size(); ++i) {
      EXPECT_EQ(q[i].amax_history, plain_q[i].amax_history) << q[i].name;
      EXPECT_EQ(q[i].scale, plain_q[i].scale) << q[i].name;
    }
  }
  // The amaxes were live: three steps of delayed scaling moved the scales off 1.
  EXPECT_NE(plain_q[0].scale, 1.0f) << plain_q[0].name;
  graphed.release_graph();
}

// Under `with fp8_weights` the recording holds no weight casts: the weights are cast at capture
// and again when parameters_changed() says so, outside the graph, as the eager session does.
TEST_F(SessionGpu, GraphReplayWithFp8WeightsRecastsOnlyWhenTheParametersChange) {
  for (const std::string recipe : {"fp8", "fp8c"}) {
    SCOPED_TRACE(recipe);
    const std::string text = std::regex_replace(program_text(recipe), std::regex(recipe + " \\{"),
                                                recipe + " with fp8_weights {");
    const Program program = Program::compile(text, "small_mlp.fuse");
    Session eager = make_session(program, 7);
    Session graphed = make_session(program, 7);
    graphed.capture(stream_, Session::GraphScope::TrainingStep);
    for (int step = 0; step < 4; ++step) {
      if (step == 2) {  // an optimizer step: new fc1 weights on both sides
        for (Session* session : {&eager, &graphed}) {
          ASSERT_EQ(
              cudaMemcpyAsync(session->parameter("fc1.weight"), random_bf16(1024 * 256, 40 + step),
                              1024 * 256 * 2, cudaMemcpyDeviceToDevice, stream_),
              cudaSuccess);
          session->parameters_changed();
        }
      }
      train_step(eager);
      graphed.replay(stream_);
      EXPECT_EQ(read(graphed.output("y"), y_bytes()), read(eager.output("y"), y_bytes()))
          << "step " << step;
      const auto eager_q = eager.quantizers(stream_);
      const auto graphed_q = graphed.quantizers(stream_);
      for (std::size_t i = 0; i < eager_q.size(); ++i) {
        EXPECT_EQ(graphed_q[i].amax_history, eager_q[i].amax_history)
            << eager_q[i].name << ", step " << step;
        EXPECT_EQ(graphed_q[i].scale, eager_q[i].scale) << eager_q[i].name << ", step " << step;
      }
    }
    graphed.release_graph();
  }
}

TEST_F(SessionGpu, GraphReplayOfAnInferenceForwardEqualsEager) {
  const Program program = Program::compile(program_text("fp8"), "small_mlp.fuse");
  Session eager = make_session(program, 9);
  Session graphed = make_session(program, 9);
  graphed.capture(stream_, Session::GraphScope::InferenceForward);
  graphed.release_graph();  // a recording never launched is dropped cleanly
  graphed.capture(stream_, Session::GraphScope::InferenceForward);
  for (int i = 0; i < 3; ++i) {
    eager.forward(stream_, RunMode::Inference);
    graphed.replay(stream_);
    EXPECT_EQ(read(graphed.output("y"), y_bytes()), read(eager.output("y"), y_bytes()));
  }
}

// `fusec build` output loaded without NVRTC runs like the program compiled from source: a
// checkpoint of the compiled session loaded into zeroed parameters gives the same output.
TEST_F(SessionGpu, ALoadedBuildDirectoryRunsLikeTheCompiledProgram) {
  const std::string dir = test::make_temp_dir("session_build");
  const std::string source = dir + "/small_mlp.fuse";
  { std::ofstream(source) << program_text("fp8"); }
  const auto built =
      test::run_command("OPFUSE_CACHE_DIR=" + dir + "/cache " + test::fusec_path() + " build " +
                        source + " -o " + dir + "/out --arch " + gpu::current_device().arch);
  ASSERT_EQ(built.exit_code, 0) << built.output;

  const Program compiled = Program::compile(program_text("fp8"), "small_mlp.fuse");
  Session a = make_session(compiled, 4);
  train_step(a);
  a.save(dir + "/a.state", stream_);
  a.forward(stream_, RunMode::Inference);
  const auto want = read(a.output("y"), y_bytes());

  const Program loaded = Program::load_build(dir + "/out");
  EXPECT_EQ(loaded.build_stats().compiled, 0);
  Session b(loaded, "", stream_);
  b.bind({{"tokens", 64}});
  // The plan carries each parameter's initializer: a build directory starts from the same values.
  b.own_parameters(4, stream_);
  Session fresh = make_session(compiled, 4);
  const std::pair<const char*, std::size_t> weights[] = {{"fc1.weight", 1024 * 256 * 2},
                                                         {"fc2.weight", 256 * 512 * 2}};
  for (const auto& [param, bytes] : weights) {
    EXPECT_EQ(read(b.parameter(param), bytes), read(fresh.parameter(param), bytes)) << param;
  }
  b.allocate_parameters(stream_);
  b.set_tensor("x", random_bf16(64 * 256, 11));
  b.load(dir + "/a.state", stream_);
  b.forward(stream_, RunMode::Inference);
  EXPECT_EQ(read(b.output("y"), y_bytes()), want);
  std::filesystem::remove_all(dir);
}

TEST_F(SessionGpu, MisuseIsReportedBeforeAnythingRuns) {
  const Program program = Program::compile(program_text("fp8"), "small_mlp.fuse");
  Session session(program, "", stream_);
  EXPECT_THROW(session.forward(stream_), UsageError);        // before bind()
  EXPECT_THROW(session.bind({{"tokens", 8}}), UsageError);   // FP8 GEMMs need multiples of 16
  EXPECT_THROW(session.bind({{"tokenz", 64}}), UsageError);  // unknown size
  session.bind({{"tokens", 64}});
  EXPECT_THROW(session.forward(stream_), UsageError);  // x was never given
  EXPECT_THROW(session.parameter("fc1.weight"), UsageError);
  EXPECT_THROW(session.set_tensor("nope", random_bf16(16, 1)), UsageError);
  EXPECT_THROW(session.capture(nullptr, Session::GraphScope::TrainingStep), UsageError);
  EXPECT_THROW(Session(program, "other", stream_), UsageError);
  const std::string arch = gpu::current_device().arch == "sm_89" ? "sm_90a" : "sm_89";
  CompileOptions options;
  options.arch = arch;
  const Program foreign = Program::compile(program_text("bf16"), "small_mlp.fuse", options);
  try {
    Session wrong(foreign, "", stream_);
    ADD_FAILURE() << "a program for " << arch << " ran on " << gpu::current_device().arch;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("compiled for " + arch), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace opfuse
