// Tensor parallelism on the GPU (docs/parallel.md): the seed MLP at test sizes, split over 2
// ranks, and over 4 where the machine has 4 GPUs (one process and one GPU each, through NCCL),
// equals the CPU reference of the unsharded
// program: outputs, input gradients, every parameter gradient (sharded ones joined) and the
// output after a step (the amaxes reduced over the ranks). Also one rank of a one-rank plan
// needs no NCCL, and misuse is reported before anything runs.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "api/state_file.h"
#include "comm/bootstrap.h"
#include "cpu/numerics.h"
#include "driver/frontend.h"
#include "gpu/device.h"
#include "gpu_test_support.h"
#include "opfuse/error.h"
#include "opfuse/program.h"
#include "plan/parallel.h"
#include "reference/collectives.h"
#include "reference/reference_executor.h"
#include "test_support.h"

namespace opfuse {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int64_t kTokens = 64;
constexpr int64_t kHidden = 128;

// sp = false: every rank holds the whole input and output (all-reduces instead of the gather
// and reduce-scatter).
std::string mlp(int tp, const std::string& recipe, bool sp = true) {
  const char* rows = tp > 1 && sp ? "tokens / tp" : "tokens";
  return fmt::format(R"(recipe r = {}
sequence mlp(x: bf16[{}, {}]) -> (y: bf16[{}, {}]) uses r with parallel(tp = {}, sp = {}) {{
  layernorm({})
  linear({}, 512, parallel = column) as fc1
  swiglu()
  linear(256, {}, parallel = row) as fc2
}}
)",
                     recipe == "delayed"   ? "delayed_scaling(amax_history = 4)"
                     : recipe == "current" ? "current_scaling()"
                                           : "bf16()",
                     rows, kHidden, rows, kHidden, tp, sp, kHidden, kHidden, kHidden);
}

void write_floats(const fs::path& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
}

std::vector<float> read_floats(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(in) << path;
  std::vector<float> v(size_t(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  return v;
}

std::string file_name(const std::string& name) {
  std::string out = name;
  for (char& c : out)
    if (c == '.') c = '_';
  return out;
}

// One rank (started by run_ranks): reads the unsharded data the parent wrote, runs its shard
// forward, backward, step and forward on its GPU and writes what it computed.
TEST(ParallelGpuChild, DISABLED_Rank) {
  const ParallelOptions par = ParallelOptions::from_environment();
  ASSERT_GE(par.size, 2) << "run by ParallelGpu tests only";
  ASSERT_EQ(cudaSetDevice(par.rank), cudaSuccess);
  const fs::path dir = std::getenv("OPFUSE_TEST_DATA");
  const std::string recipe = std::getenv("OPFUSE_TEST_RECIPE");
  const bool sp = std::string(std::getenv("OPFUSE_TEST_SP")) == "1";
  const Program program = Program::compile(mlp(par.size, recipe, sp), "mlp_tp.fuse");
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct StreamOwner {  // outlives the session, which frees its memory on the stream
    cudaStream_t stream;
    ~StreamOwner() { cudaStreamDestroy(stream); }
  } owner{stream};
  SessionOptions options;
  options.parallel = par;
  Session session(program, "mlp", stream, options);
  session.bind({{"tokens", kTokens}});
  std::vector<std::unique_ptr<test::DeviceArray>> memory;
  auto upload = [&](const std::string& name, const std::vector<float>& values) {
    memory.push_back(std::make_unique<test::DeviceArray>(values.size() * 2));
    test::upload_bf16(*memory.back(), values);
    session.set_tensor(name, memory.back()->data());
  };
  const int64_t rows = sp ? kTokens / par.size : kTokens;
  auto rank_rows = [&](const std::vector<float>& all) {
    if (!sp) return all;
    return std::vector<float>(all.begin() + par.rank * rows * kHidden,
                              all.begin() + (par.rank + 1) * rows * kHidden);
  };
  upload("x", rank_rows(read_floats(dir / "x.bin")));
  upload("dy", rank_rows(read_floats(dir / "dy.bin")));
  std::vector<TensorInfo> params;
  for (const TensorInfo& t : session.tensors()) {
    if (t.kind != TensorKind::Param) continue;
    params.push_back(t);
    const std::vector<float> full = read_floats(dir / (file_name(t.name) + ".bin"));
    const std::string spec =
        std::string(std::getenv(("OPFUSE_TEST_SHARD_" + file_name(t.name)).c_str()));
    int dim = -1, blocks = 1;
    std::sscanf(spec.c_str(), "%d,%d", &dim, &blocks);
    if (dim < 0) {
      upload(t.name, full);
      continue;
    }
    std::vector<int64_t> full_shape(t.shape.begin(), t.shape.end());
    full_shape[size_t(dim)] *= par.size;
    upload(t.name, plan::take_shard<float>(full, full_shape, plan::ShardSpec{dim, blocks}, par.size,
                                           par.rank));
  }
  const fs::path mine = dir / ("rank" + std::to_string(par.rank));
  fs::create_directories(mine);
  session.forward(stream);
  write_floats(mine / "y.bin", test::download_bf16(session.output("y"), size_t(rows * kHidden)));
  session.backward(stream);
  write_floats(mine / "dx.bin",
               test::download_bf16(session.input_grad("x"), size_t(rows * kHidden)));
  for (const TensorInfo& t : params) {
    size_t count = 1;
    for (int64_t d : t.shape) count *= size_t(d);
    write_floats(mine / ("grad_" + file_name(t.name) + ".bin"),
                 test::download_bf16(session.param_grad(t.name), count));
  }
  session.step(stream);
  session.forward(stream);
  write_floats(mine / "y2.bin", test::download_bf16(session.output("y"), size_t(rows * kHidden)));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  // The rank's checkpoint (its shards, its rank); the parent merges them. A file of another
  // rank (the next one) is refused before anything is copied.
  session.save((mine / "state").string(), stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const fs::path other = dir / ("rank" + std::to_string((par.rank + 1) % par.size)) / "state";
  for (int wait = 0; wait < 600 && !fs::exists(other); ++wait)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  try {
    session.load(other.string(), stream);
    ADD_FAILURE() << "rank " << par.rank << " loaded the other rank's checkpoint";
  } catch (const UsageError& e) {
    EXPECT_TRUE(test::contains(e.what(), "a tensor-parallel checkpoint loads into the same rank"))
        << e.what();
  }
}

double rms_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double d = 0, w = 1e-12;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    w += double(want[i]) * want[i];
  }
  return std::sqrt(d / w);
}

// `env`: more variables for the ranks (OPFUSE_COLLECTIVE_CHUNKS, ...).
void expect_ranks_match_the_reference(int ranks, const std::string& recipe, double tol,
                                      bool sp = true,
                                      const std::vector<std::string>& env_more = {}) {
  SCOPED_TRACE(fmt::format("{} ranks, {}, sp {}, {}", ranks, recipe, sp, fmt::join(env_more, " ")));
  // The unsharded reference, and its data for the ranks.
  SourceManager sources;
  DiagnosticEngine diags(sources);
  const auto whole = load_program_from_source("mlp.fuse", mlp(1, recipe), sources, diags);
  ASSERT_TRUE(whole) << diags.format_all();
  cpu::ReferenceExecutor<float> ref(whole->sequences.at(0), {{"tokens", kTokens}});
  std::mt19937_64 rng(11);
  // Kept when the test fails, for a rank to be rerun by hand (see the ranks' variables below).
  const std::string variant =
      fmt::format("{}-{}{}{}", ranks, recipe, sp ? "" : "-nosp", env_more.empty() ? "" : "-env");
  const fs::path dir = fs::temp_directory_path() / ("opfuse-parallel-gpu-" + variant);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::string> env = {"OPFUSE_TEST_DATA=" + dir.string(),
                                  "OPFUSE_TEST_RECIPE=" + recipe,
                                  std::string("OPFUSE_TEST_SP=") + (sp ? "1" : "0")};
  env.insert(env.end(), env_more.begin(), env_more.end());
  // The shards as the program of `ranks` ranks cuts them.
  SourceManager split_sources;
  DiagnosticEngine split_diags(split_sources);
  const auto split =
      load_program_from_source("mlp_tp.fuse", mlp(ranks, recipe, sp), split_sources, split_diags);
  ASSERT_TRUE(split) << split_diags.format_all();
  std::map<std::string, plan::ShardSpec> shards;
  for (const ir::Value& v : split->sequences.at(0).values)
    if (v.kind == ir::ValueKind::Param) shards[v.name] = v.shard;
  for (const std::string& name : ref.param_names()) {
    cpu::Tensor<float>& p = ref.param(name);
    const bool gamma = name.find("layernorm") != std::string::npos && name.ends_with("weight");
    p.data = test::random_bf16(p.data.size(), 0.05, rng, gamma ? 1.0 : 0.0);
    write_floats(dir / (file_name(name) + ".bin"), p.data);
    const plan::ShardSpec s = shards.at(name);
    env.push_back(fmt::format("OPFUSE_TEST_SHARD_{}={},{}", file_name(name), s.dim, s.blocks));
  }
  ref.params_changed();
  cpu::Tensor<float> x = cpu::Tensor<float>::zeros({kTokens, kHidden});
  cpu::Tensor<float> dy = cpu::Tensor<float>::zeros({kTokens, kHidden});
  x.data = test::random_bf16(x.data.size(), 1.0, rng);
  dy.data = test::random_bf16(dy.data.size(), 0.1, rng);
  write_floats(dir / "x.bin", x.data);
  write_floats(dir / "dy.bin", dy.data);
  const std::vector<float> y = ref.forward({x}).at(0).data;
  const cpu::Gradients<float> g = ref.backward({dy});
  ref.step();
  const std::vector<float> y2 = ref.forward({x}).at(0).data;

  const std::string job = fmt::format("parallel-gpu-{}-{}", ::getpid(), variant);
  test::run_ranks(ranks, "ParallelGpuChild.DISABLED_Rank", dir.string(), job, env, 180s);
  if (::testing::Test::HasFailure()) return;

  auto rank_file = [&](int r, const std::string& file) {
    return dir / ("rank" + std::to_string(r)) / file;
  };
  auto per_rank = [&](const std::string& file) {
    std::vector<std::vector<float>> parts;
    parts.reserve(size_t(ranks));
    for (int r = 0; r < ranks; ++r) parts.push_back(read_floats(rank_file(r, file)));
    return parts;
  };
  auto joined = [&](const std::string& file) {
    std::vector<float> out;
    for (const std::vector<float>& part : per_rank(file))
      out.insert(out.end(), part.begin(), part.end());
    return out;
  };
  if (sp) {
    EXPECT_LE(rms_error(joined("y.bin"), y), tol) << "y";
    EXPECT_LE(rms_error(joined("dx.bin"), g.inputs.at(0).data), tol) << "dx";
    EXPECT_LE(rms_error(joined("y2.bin"), y2), tol) << "y after a step";
  } else {  // every rank holds all of them
    for (int r = 0; r < ranks; ++r) {
      EXPECT_LE(rms_error(read_floats(rank_file(r, "y.bin")), y), tol) << "y of rank " << r;
      EXPECT_LE(rms_error(read_floats(rank_file(r, "dx.bin")), g.inputs.at(0).data), tol)
          << "dx of rank " << r;
      EXPECT_LE(rms_error(read_floats(rank_file(r, "y2.bin")), y2), tol) << "y2 of rank " << r;
    }
  }
  for (size_t i = 0; i < ref.param_names().size(); ++i) {
    const std::string& name = ref.param_names()[i];
    SCOPED_TRACE(name);
    const std::string file = "grad_" + file_name(name) + ".bin";
    const plan::ShardSpec s = shards.at(name);
    if (!s.sharded()) {
      for (int r = 0; r < ranks; ++r)
        EXPECT_LE(rms_error(read_floats(rank_file(r, file)), g.params[i].data), tol) << r;
      continue;
    }
    std::vector<int64_t> shape = ref.param(name).shape;
    shape[size_t(s.dim)] /= ranks;
    const std::vector<std::vector<float>> parts = per_rank(file);
    const std::vector<std::span<const float>> views(parts.begin(), parts.end());
    EXPECT_LE(rms_error(plan::join_shards<float>(views, shape, s), g.params[i].data), tol);
  }
  // The ranks' checkpoints merge into the whole parameters the run started from (no optimizer
  // step ran), with the quantizer state every rank reduced to the same values.
  std::vector<api::StateFile> states;
  states.reserve(size_t(ranks));
  for (int r = 0; r < ranks; ++r)
    states.push_back(api::read_state_file(rank_file(r, "state").string()));
  const api::StateFile merged = api::merge_state_shards(states, "mlp.fuse:mlp");
  for (const api::StateTensor& t : merged.tensors) {
    SCOPED_TRACE(t.name);
    std::vector<float> values(t.bytes.size() / 2);
    for (size_t i = 0; i < values.size(); ++i) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, t.bytes.data() + 2 * i, 2);
      values[i] = cpu::bf16_to_float(bits);
    }
    EXPECT_EQ(values, read_floats(dir / (file_name(t.name) + ".bin")));
  }
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// Skips without `ranks` GPUs (one rank per GPU).
void require_gpus(int ranks) {
  std::string why;
  if (!gpu::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < ranks)
    GTEST_SKIP() << "needs " << ranks << " GPUs for " << ranks << " ranks; this machine has "
                 << count;
}

class ParallelGpu : public ::testing::Test {
 protected:
  void SetUp() override { require_gpus(2); }
};

TEST_F(ParallelGpu, TwoRanksMatchTheUnshardedReferenceBf16) {
  expect_ranks_match_the_reference(2, "bf16", 2e-2);
}

TEST_F(ParallelGpu, TwoRanksMatchTheUnshardedReferenceFp8Delayed) {
  expect_ranks_match_the_reference(2, "delayed", 6e-2);
}

// Current scaling over the ranks (note "Current scaling over ranks" in
// runtime/gpu/executor_run.cpp): every measured amax max-reduced before its scale is derived, so
// each rank casts with the scale of the whole tensor, as the unsharded reference does.
TEST_F(ParallelGpu, TwoRanksMatchTheUnshardedReferenceFp8Current) {
  expect_ranks_match_the_reference(2, "current", 6e-2);
}

// Note "Pipelined collectives" (runtime/gpu/executor_run.cpp): the tests above run fc1's and
// fc2's GEMMs in row pieces around their gathers and reduce-scatters (the default stages); these
// run the all-reduces of sp = false pipelined, in uneven stages, and nothing pipelined.
TEST_F(ParallelGpu, TwoRanksWithoutSequenceParallelismMatchTheUnshardedReference) {
  expect_ranks_match_the_reference(2, "bf16", 2e-2, false);
  expect_ranks_match_the_reference(2, "delayed", 6e-2, false);
}

TEST_F(ParallelGpu, PipelinedInThreeUnevenStagesOrNotAtAllMatchTheUnshardedReference) {
  // 64 rows (32 per share) in three stages: 21 + 21 + 22 rows, 10 + 10 + 12 per share.
  for (const bool sp : {true, false}) {
    expect_ranks_match_the_reference(2, "bf16", 2e-2, sp, {"OPFUSE_COLLECTIVE_CHUNKS=3"});
    expect_ranks_match_the_reference(2, "current", 6e-2, sp, {"OPFUSE_COLLECTIVE_CHUNKS=3"});
    expect_ranks_match_the_reference(2, "bf16", 2e-2, sp, {"OPFUSE_COLLECTIVE_CHUNKS=1"});
  }
}

// Four ranks: 16 tokens, 128 of fc1's outputs (64 of each SwiGLU half) and 64 of fc2's inputs
// per rank; the collectives and the amax reductions over a group larger than a pair.
class ParallelGpu4 : public ::testing::Test {
 protected:
  void SetUp() override { require_gpus(4); }
};

TEST_F(ParallelGpu4, FourRanksMatchTheUnshardedReferenceBf16) {
  expect_ranks_match_the_reference(4, "bf16", 2e-2);
}

TEST_F(ParallelGpu4, FourRanksMatchTheUnshardedReferenceFp8Delayed) {
  expect_ranks_match_the_reference(4, "delayed", 6e-2);
}

TEST_F(ParallelGpu4, FourRanksMatchTheUnshardedReferenceFp8Current) {
  expect_ranks_match_the_reference(4, "current", 6e-2);
}

// ---- the data-parallel group's amax reduction (SessionOptions::amax_group) ---------------------

// One data-parallel replica (started by run_ranks): the one-rank MLP on its own data, with the
// launcher's group as its amax group; trains one step and writes its quantizers' scales and the
// output after the step.
TEST(ParallelGpuChild, DISABLED_Replica) {
  ParallelOptions group = ParallelOptions::from_environment();
  ASSERT_EQ(group.size, 2) << "run by ParallelGpu tests only";
  ASSERT_EQ(cudaSetDevice(group.rank), cudaSuccess);
  const fs::path dir = std::getenv("OPFUSE_TEST_DATA");
  const Program program = Program::compile(mlp(1, "delayed"), "mlp.fuse");
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct StreamOwner {  // outlives the session, which frees its memory on the stream
    cudaStream_t stream;
    ~StreamOwner() { cudaStreamDestroy(stream); }
  } owner{stream};
  SessionOptions options;
  options.amax_group = group;  // `parallel` stays one rank: the sequence is not split
  Session session(program, "mlp", stream, options);
  session.bind({{"tokens", kTokens}});
  std::vector<std::unique_ptr<test::DeviceArray>> memory;
  auto upload = [&](const std::string& name, const std::vector<float>& values) {
    memory.push_back(std::make_unique<test::DeviceArray>(values.size() * 2));
    test::upload_bf16(*memory.back(), values);
    session.set_tensor(name, memory.back()->data());
  };
  const std::string mine = "replica" + std::to_string(group.rank);
  upload("x", read_floats(dir / (mine + "_x.bin")));
  upload("dy", read_floats(dir / (mine + "_dy.bin")));
  for (const TensorInfo& t : session.tensors())
    if (t.kind == TensorKind::Param)
      upload(t.name, read_floats(dir / (file_name(t.name) + ".bin")));
  session.forward(stream);
  session.backward(stream);
  session.step(stream);
  session.forward(stream);
  std::vector<float> scales;
  for (const QuantizerStatus& q : session.quantizers(stream)) scales.push_back(q.scale);
  write_floats(dir / (mine + "_scales.bin"), scales);
  write_floats(dir / (mine + "_y2.bin"),
               test::download_bf16(session.output("y"), size_t(kTokens * kHidden)));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
}

// Two replicas on two GPUs train on different data (the second's rows carry a spike the
// LayerNorm keeps, and smaller gradients): with an amax group their step() max-reduces every
// delayed amax over NCCL, so both use the scales of the CPU reference's two replicas joined by
// a simulated amax group, which differ from what either replica derives alone.
TEST_F(ParallelGpu, DataParallelReplicasShareTheirDelayedScales) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  const auto whole = load_program_from_source("mlp.fuse", mlp(1, "delayed"), sources, diags);
  ASSERT_TRUE(whole) << diags.format_all();
  const fs::path dir = fs::temp_directory_path() / "opfuse-parallel-gpu-replicas";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::mt19937_64 rng(13);
  std::map<std::string, std::vector<float>> params;
  {
    cpu::ReferenceExecutor<float> shapes(whole->sequences.at(0), {{"tokens", kTokens}});
    for (const std::string& name : shapes.param_names()) {
      const bool gamma = name.find("layernorm") != std::string::npos && name.ends_with("weight");
      params[name] =
          test::random_bf16(shapes.param(name).data.size(), 0.05, rng, gamma ? 1.0 : 0.0);
      write_floats(dir / (file_name(name) + ".bin"), params[name]);
    }
  }
  std::vector<float> x[2], dy[2];
  for (int r = 0; r < 2; ++r) {
    x[r] = test::random_bf16(size_t(kTokens * kHidden), 1.0, rng);
    dy[r] = test::random_bf16(size_t(kTokens * kHidden), r == 0 ? 0.1 : 0.02, rng);
  }
  for (int64_t row = 0; row < kTokens; ++row) x[1][size_t(row * kHidden + row % kHidden)] = 40.0f;
  for (int r = 0; r < 2; ++r) {
    write_floats(dir / fmt::format("replica{}_x.bin", r), x[r]);
    write_floats(dir / fmt::format("replica{}_dy.bin", r), dy[r]);
  }
  // The reference replicas, alone and grouped.
  auto reference = [&](bool grouped) {
    cpu::SimulatedGroup group(2);
    std::vector<cpu::ReferenceExecutor<float>> replicas;
    for (int r = 0; r < 2; ++r) {
      cpu::ReferenceOptions o;
      if (grouped) o.amax_group = &group.rank(r);
      replicas.emplace_back(whole->sequences.at(0), cpu::Bindings{{"tokens", kTokens}}, o);
      for (const auto& [name, v] : params) replicas.back().param(name).data = v;
      replicas.back().params_changed();
    }
    std::vector<std::vector<float>> scales(2), y2(2);
    std::vector<std::thread> threads;
    threads.reserve(2);
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        cpu::ReferenceExecutor<float>& e = replicas[size_t(r)];
        cpu::Tensor<float> in = cpu::Tensor<float>::zeros({kTokens, kHidden});
        cpu::Tensor<float> grad = in;
        in.data = x[r];
        grad.data = dy[r];
        e.forward({in});
        e.backward({grad});
        e.step();
        y2[size_t(r)] = e.forward({in}).at(0).data;
        for (const cpu::QuantizerInfo& q : e.quantizers()) scales[size_t(r)].push_back(q.scale);
      });
    for (std::thread& t : threads) t.join();
    return std::pair{scales, y2};
  };
  const auto [alone, alone_y2] = reference(false);
  const auto [grouped, grouped_y2] = reference(true);
  ASSERT_NE(alone[0], alone[1]) << "the replicas' data must give different amaxes";

  const std::string job = fmt::format("parallel-gpu-replicas-{}", ::getpid());
  test::run_ranks(2, "ParallelGpuChild.DISABLED_Replica", dir.string(), job,
                  {"OPFUSE_TEST_DATA=" + dir.string()}, 180s);
  if (::testing::Test::HasFailure()) return;
  const std::vector<float> gpu0 = read_floats(dir / "replica0_scales.bin");
  const std::vector<float> gpu1 = read_floats(dir / "replica1_scales.bin");
  EXPECT_EQ(gpu0, gpu1) << "the replicas' scales must agree bit for bit";
  ASSERT_EQ(gpu0.size(), grouped[0].size());
  for (size_t i = 0; i < gpu0.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_NEAR(gpu0[i], grouped[0][i], 1e-2 * grouped[0][i]);
  }
  for (int r = 0; r < 2; ++r)
    EXPECT_LE(
        rms_error(read_floats(dir / fmt::format("replica{}_y2.bin", r)), grouped_y2[size_t(r)]),
        6e-2)
        << "replica " << r << ": y after the step";
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// Misuse found before any NCCL or launch: a tensor-parallel sequence in a one-rank process.
TEST(ParallelGpuMisuse, ATensorParallelSequenceNeedsItsRanks) {
  std::string why;
  if (!gpu::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const Program program = Program::compile(mlp(2, "bf16"), "mlp_tp.fuse");
  try {
    Session session(program);
    FAIL() << "a tp = 2 sequence ran in one process";
  } catch (const UsageError& e) {
    EXPECT_TRUE(test::contains(e.what(), "built for 2 ranks, but this process is rank 0 of 1"))
        << e.what();
  }
}

// An amax group whose place is not in it is refused before any NCCL call (no peer to wait for).
TEST(ParallelGpuMisuse, AnAmaxGroupPlaceMustBeInTheGroup) {
  std::string why;
  if (!gpu::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const Program program = Program::compile(mlp(1, "delayed"), "mlp.fuse");
  for (const auto& [rank, size] : {std::pair{2, 2}, std::pair{-1, 2}, std::pair{0, 0}}) {
    SessionOptions options;
    options.amax_group.rank = rank;
    options.amax_group.size = size;
    options.amax_group.nccl_id = new_parallel_id();
    try {
      Session session(program, "mlp", nullptr, options);
      ADD_FAILURE() << "rank " << rank << " of " << size << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_TRUE(test::contains(
          e.what(), fmt::format("SessionOptions::amax_group: rank {} of {}", rank, size)))
          << e.what();
    }
  }
}

}  // namespace
}  // namespace opfuse
