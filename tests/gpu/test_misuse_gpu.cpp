// Misuse of the embedding API on the GPU, one test per kind (docs/embedding.md, "What is
// checked"): each asserts the error's type and message and that the session's next valid call
// still works (an inference forward gives the untouched session's output, bit for bit). The
// faults (a kernel of the application or of opfuse touching memory it must not) kill the CUDA
// context, so they run in child processes (death tests): each asserts that the first opfuse call
// to see the fault says so, that later calls repeat it, and with OPFUSE_CHECK_EACH_STEP=1 that
// the faulting step is named. compute-sanitizer runs this program with
// --target-processes application-only (scripts/gpu_tests.sh): the children fault on purpose.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/state_file.h"
#include "cpu/numerics.h"
#include "gpu_test_support.h"
#include "opfuse/program.h"
#include "test_support.h"

namespace opfuse {
namespace {

constexpr const char* kProgram = test::kSmallFp8Mlp;
constexpr int kTokens = 64;
constexpr std::size_t kXBytes = std::size_t{kTokens} * 256 * 2;  // x, dy and y: bf16[64, 256]

// The message of the `Expected` error `call` throws; fails the test (and returns "") when it
// throws nothing or another type.
template <typename Expected>
std::string thrown(const std::function<void()>& call) {
  try {
    call();
  } catch (const Expected& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "threw nothing";
  return "";
}

#define EXPECT_HAS(message, part) \
  EXPECT_NE((message).find(part), std::string::npos) << "no \"" << (part) << "\" in: " << (message)

class MisuseGpu : public test::GpuStreamTest {
 protected:
  void SetUp() override {
    test::GpuStreamTest::SetUp();
    if (IsSkipped()) return;
    if (!program_) program_ = std::make_unique<Program>(Program::compile(kProgram, "mlp.fuse"));
    std::mt19937_64 rng(5);
    x_ = &new_array(kXBytes);
    dy_ = &new_array(kXBytes);
    test::upload_bf16(*x_, test::random_bf16(kXBytes / 2, 1.0, rng));
    test::upload_bf16(*dy_, test::random_bf16(kXBytes / 2, 1.0, rng));
  }

  // A session with its own parameters (seed 7) and x and dy set: what the misuse happens to.
  Session session() {
    Session s(*program_, "", stream_);
    s.bind({{"tokens", kTokens}});
    s.own_parameters(7, stream_);
    s.set_tensor("x", x_->data());
    s.set_tensor("dy", dy_->data());
    return s;
  }

  std::vector<std::uint8_t> inference_output(Session& s) {
    s.forward(stream_, RunMode::Inference);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return test::download_bytes(s.output("y"), kXBytes);
  }

  // The session's next valid call works: a forward gives an untouched session's output.
  void expect_still_works(Session& s) {
    Session clean = session();
    EXPECT_EQ(inference_output(s), inference_output(clean));
  }

  static std::unique_ptr<Program> program_;
  test::DeviceArray* x_ = nullptr;
  test::DeviceArray* dy_ = nullptr;
};

std::unique_ptr<Program> MisuseGpu::program_;

// ---- sizes -----------------------------------------------------------------------------------

TEST_F(MisuseGpu, SizeZeroOrNegativeOrHugeIsRefusedAndTheOldBindingStays) {
  Session s = session();
  for (const std::int64_t bad : {std::int64_t{0}, std::int64_t{-64}, std::int64_t{1} << 40}) {
    const std::string message = thrown<UsageError>([&] { s.bind({{"tokens", bad}}); });
    EXPECT_HAS(message, "'tokens' = " + std::to_string(bad));
    EXPECT_HAS(message, "sizes must be from 1 to 2147483647");
  }
  expect_still_works(s);
}

TEST_F(MisuseGpu, UnknownSizeNamesTheSequencesSizes) {
  Session s = session();
  const std::string message = thrown<UsageError>([&] { s.bind({{"tokenz", 64}}); });
  EXPECT_HAS(message, "needs a size for 'tokens'");
  const std::string extra = thrown<UsageError>([&] { s.bind({{"tokens", 64}, {"tokenz", 64}}); });
  EXPECT_HAS(extra, "has no size 'tokenz'");
  expect_still_works(s);
}

TEST_F(MisuseGpu, Fp8SizeNotAMultipleOf16NamesTheGemmAndTheLine) {
  Session s = session();
  const std::string message = thrown<UsageError>([&] { s.bind({{"tokens", 24}}); });
  EXPECT_HAS(message, "is not a multiple of 16, which cuBLASLt needs for FP8 GEMMs");
  EXPECT_HAS(message, "mlp.fuse:");
  expect_still_works(s);
}

// ---- names and order -------------------------------------------------------------------------

TEST_F(MisuseGpu, ForwardBeforeItsInputsAreSetNamesThem) {
  Session s(*program_, "", stream_);
  s.bind({{"tokens", kTokens}});
  s.own_parameters(7, stream_);
  const std::string message = thrown<UsageError>([&] { s.forward(stream_); });
  EXPECT_HAS(message, "reads [x], which were not set");
  s.set_tensor("x", x_->data());
  s.set_tensor("dy", dy_->data());
  expect_still_works(s);
}

TEST_F(MisuseGpu, UnknownTensorListsTheTensorsTheSequenceTakes) {
  Session s = session();
  const std::string message = thrown<UsageError>([&] { s.set_tensor("nope", x_->data()); });
  EXPECT_HAS(message, "takes no tensor 'nope'");
  EXPECT_HAS(message, "fc1.weight");
  expect_still_works(s);
}

TEST_F(MisuseGpu, BackwardBeforeForwardAsksForATrainingForward) {
  Session s = session();
  const std::string message = thrown<UsageError>([&] { s.backward(stream_); });
  EXPECT_HAS(message, "needs a forward(stream, RunMode::Training)");
  s.forward(stream_, RunMode::Inference);
  EXPECT_HAS(thrown<UsageError>([&] { s.backward(stream_); }), "RunMode::Training");
  expect_still_works(s);
}

TEST_F(MisuseGpu, UnknownSequenceListsTheProgramsSequences) {
  const std::string message = thrown<UsageError>([&] { Session s(*program_, "other", stream_); });
  EXPECT_HAS(message, "no sequence 'other'");
  EXPECT_HAS(message, "mlp");
}

// ---- pointers --------------------------------------------------------------------------------

TEST_F(MisuseGpu, MisalignedPointerIsRefused) {
  Session s = session();
  const void* misaligned = static_cast<const char*>(x_->data()) + 2;
  const std::string message = thrown<UsageError>([&] { s.set_tensor("x", misaligned); });
  EXPECT_HAS(message, "set_tensor(\"x\")");
  EXPECT_HAS(message, "not 16-byte aligned");
  expect_still_works(s);
}

TEST_F(MisuseGpu, HostPointerIsRefusedNamingTheTensorAndItsBytes) {
  Session s = session();
  std::vector<std::uint16_t> host(kXBytes / 2, 0x3f80);
  const std::string message = thrown<UsageError>([&] { s.set_tensor("x", host.data()); });
  EXPECT_HAS(message, "set_tensor(\"x\") of sequence 'mlp': the input at 0x");
  EXPECT_HAS(message, "not memory CUDA knows: host memory from malloc or new");
  EXPECT_HAS(message, std::to_string(kXBytes) + " bytes");
  expect_still_works(s);
}

TEST_F(MisuseGpu, OutputGradientAsAHostPointerIsRefused) {
  Session s = session();
  auto host = std::make_unique<std::uint16_t[]>(kXBytes / 2);
  const std::string message = thrown<UsageError>([&] { s.set_tensor("dy", host.get()); });
  EXPECT_HAS(message, "the output gradient at");
  EXPECT_HAS(message, "not memory CUDA knows");
  s.forward(stream_);
  s.backward(stream_);  // with the dy set before
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  expect_still_works(s);
}

TEST_F(MisuseGpu, PinnedHostMemoryIsRefused) {
  Session s = session();
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, kXBytes), cudaSuccess);
  const std::string message = thrown<UsageError>([&] { s.set_tensor("x", pinned); });
  EXPECT_HAS(message, "pinned host memory");
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  expect_still_works(s);
}

TEST_F(MisuseGpu, ParameterInASmallerAllocationIsRefused) {
  Session s = session();
  const std::size_t weight_bytes = std::size_t{1024} * 256 * 2;  // fc1.weight: bf16[1024, 256]
  test::DeviceArray& half = new_array(weight_bytes / 2);
  const std::string message = thrown<UsageError>([&] { s.set_tensor("fc1.weight", half.data()); });
  EXPECT_HAS(message, "the parameter at");
  EXPECT_HAS(message, fmt::format("ends {} bytes after it, {} bytes short of the tensor",
                                  weight_bytes / 2, weight_bytes / 2));
  // Inside a larger allocation, from an offset: room to its end is what counts.
  test::DeviceArray& big = new_array(weight_bytes + 4096);
  s.set_tensor("fc1.weight", static_cast<char*>(big.data()) + 4096);
  EXPECT_HAS(thrown<UsageError>(
                 [&] { s.set_tensor("fc1.weight", static_cast<char*>(big.data()) + 8192); }),
             "4096 bytes short");
}

TEST_F(MisuseGpu, FreedAllocationIsRefused) {
  Session s = session();
  void* freed = nullptr;
  ASSERT_EQ(cudaMalloc(&freed, std::size_t{64} << 20), cudaSuccess);
  ASSERT_EQ(cudaFree(freed), cudaSuccess);
  const std::string message = thrown<UsageError>([&] { s.set_tensor("x", freed); });
  EXPECT_HAS(message, "device memory already freed");
  expect_still_works(s);
}

TEST_F(MisuseGpu, APointerTooSmallForANewBindingIsRefusedAtTheForward) {
  Session s = session();
  s.bind({{"tokens", 2 * kTokens}});  // x_ holds 64 tokens
  const std::string message = thrown<UsageError>([&] { s.forward(stream_); });
  EXPECT_HAS(message, "set_tensor(\"x\")");
  EXPECT_HAS(message, fmt::format("{} bytes short of the tensor", kXBytes));
  s.bind({{"tokens", kTokens}});
  expect_still_works(s);
}

// ---- state files -----------------------------------------------------------------------------

class MisuseStateFiles : public MisuseGpu {
 protected:
  void TearDown() override {
    std::filesystem::remove(path_);
    MisuseGpu::TearDown();
  }
  // A saved state of a trained session, damaged by `damage`; load() must refuse it and leave the
  // loading session as it was.
  void expect_refused(const std::function<void(std::vector<char>&)>& damage,
                      const std::string& expected) {
    Session trained = session();
    trained.forward(stream_);
    trained.backward(stream_);
    trained.step(stream_);
    trained.save(path_, stream_);
    std::vector<char> bytes;
    {
      std::ifstream in(path_, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    damage(bytes);
    std::ofstream(path_, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    Session s = session();
    const std::string message = thrown<api::StateFileError>([&] { s.load(path_, stream_); });
    EXPECT_HAS(message, path_);
    EXPECT_HAS(message, expected);
    expect_still_works(s);
  }

  std::string path_ =
      (std::filesystem::temp_directory_path() / fmt::format("opfuse_misuse_{}.state", getpid()))
          .string();
};

TEST_F(MisuseStateFiles, TruncatedFileIsRefusedAndNothingLoads) {
  expect_refused([](std::vector<char>& bytes) { bytes.resize(bytes.size() * 2 / 3); }, "truncated");
}

TEST_F(MisuseStateFiles, BitFlippedFileIsRefusedAndNothingLoads) {
  expect_refused([](std::vector<char>& bytes) { bytes[bytes.size() / 2] ^= 0x04; }, "damaged");
}

// ---- non-finite inputs -----------------------------------------------------------------------

TEST_F(MisuseGpu, NanAndInfInputsUnderDelayedScalingKeepFiniteScalesAndRecover) {
  Session s = session();
  std::vector<float> values(kXBytes / 2, 0.5f);
  values[3] = std::nanf("");
  values[700] = INFINITY;
  values[9000] = -INFINITY;
  test::DeviceArray& poisoned = new_array(kXBytes);
  test::upload_bf16(poisoned, values);
  s.set_tensor("x", poisoned.data());
  for (int i = 0; i < 2; ++i) {
    s.forward(stream_);
    s.backward(stream_);
    s.step(stream_);
  }
  for (const QuantizerStatus& q : s.quantizers(stream_)) {
    EXPECT_TRUE(std::isfinite(q.scale) && q.scale > 0) << q.name << " scale " << q.scale;
    EXPECT_TRUE(std::isfinite(q.scale_inv) && q.scale_inv > 0) << q.name;
  }
  s.set_tensor("x", x_->data());
  for (int i = 0; i < 2; ++i) {
    s.forward(stream_);
    s.backward(stream_);
    s.step(stream_);
  }
  s.forward(stream_, RunMode::Inference);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  for (const float v : test::download_bf16(s.output("y"), kXBytes / 2))
    ASSERT_TRUE(std::isfinite(v)) << "y has " << v << " after clean steps";
}

// ---- faults (child processes) ----------------------------------------------------------------

// In a child: runs `fault` (which must make the context fault), then expects the first opfuse
// call after it to throw ContextFaultError containing every one of `expected`, and every later
// call (the same session, a new session) to repeat that message. Prints the message and exits 0
// when all holds, else prints why and exits 1.
[[noreturn]] void fault_child(Program& program, cudaStream_t stream,
                              const std::function<void(Session&)>& fault,
                              const std::vector<std::string>& expected) {
  const auto fail = [](const std::string& why) {
    std::fprintf(stderr, "child: %s\n", why.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  };
  std::string first;
  try {
    Session s(program, "", stream);
    s.bind({{"tokens", kTokens}});
    s.own_parameters(7, stream);
    try {
      fault(s);
      // Kernels are asynchronous: a fault not yet seen is seen by the next synchronizing call.
      (void)s.quantizers(stream);
      fail("no ContextFaultError");
    } catch (const ContextFaultError& e) {
      first = e.what();
    }
    for (const std::string& part : expected)
      if (first.find(part) == std::string::npos) fail("no \"" + part + "\" in: " + first);
    try {
      s.forward(stream);
      fail("a forward ran after the fault");
    } catch (const ContextFaultError& e) {
      if (e.what() != first) fail(std::string("another message: ") + e.what());
    }
    try {
      Session again(program, "", stream);
      fail("a new session started after the fault");
    } catch (const ContextFaultError& e) {
      if (e.what() != first) fail(std::string("another message: ") + e.what());
    }
  } catch (const std::exception& e) {
    fail(std::string("unexpected error: ") + e.what());
  }
  std::fprintf(stderr, "child: repeated: %s\n", first.c_str());
  std::fflush(stderr);
  std::_Exit(0);
}

class MisuseFaults : public MisuseGpu {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executes the program: CUDA is fresh
    MisuseGpu::SetUp();
  }
};

TEST_F(MisuseFaults, AFaultInTheApplicationsKernelIsNamedAsAFaultAndRepeated) {
  const test::TemplateKernels poke = test::load_template_kernels(
      "extern \"C\" __global__ void poke(int* p) { *p = 1; }\n", {"poke"});
  ASSERT_NE(poke.kernels.at(0), nullptr);
  EXPECT_EXIT(fault_child(*program_, stream_,
                          [&](Session& s) {
                            s.set_tensor("x", x_->data());
                            auto* address = reinterpret_cast<int*>(std::uintptr_t{16});
                            void* args[] = {&address};
                            if (cudaLaunchKernel(reinterpret_cast<const void*>(poke.kernels[0]),
                                                 dim3(1), dim3(1), args, 0, stream_) != cudaSuccess)
                              std::_Exit(2);
                            std::this_thread::sleep_for(std::chrono::milliseconds(200));
                            s.forward(stream_);
                          },
                          {"the CUDA context has faulted: cudaErrorIllegalAddress", "first seen by",
                           "OPFUSE_CHECK_EACH_STEP=1", "restart the process"}),
              ::testing::ExitedWithCode(0), "child: repeated: the CUDA context has faulted");
}

TEST_F(MisuseFaults, UseOfFreedMemoryIsNamedByTheStepThatFaultedUnderCheckEachStep) {
  EXPECT_EXIT(
      {
        setenv("OPFUSE_CHECK_EACH_STEP", "1", 1);
        fault_child(
            *program_, stream_,
            [&](Session& s) {
              void* doomed = nullptr;
              if (cudaMalloc(&doomed, std::size_t{64} << 20) != cudaSuccess) std::_Exit(2);
              if (cudaMemcpy(doomed, x_->data(), kXBytes, cudaMemcpyDeviceToDevice) != cudaSuccess)
                std::_Exit(2);
              s.set_tensor("x", doomed);
              if (cudaFree(doomed) != cudaSuccess) std::_Exit(2);
              s.forward(stream_);
            },
            {"the CUDA context has faulted", "This step faulted, in",
             "OPFUSE_CHECK_EACH_STEP=1 synchronized after it", "mlp.fuse:3",
             "in the forward of sequence 'mlp'", "restart the process"});
      },
      ::testing::ExitedWithCode(0), "child: repeated: the CUDA context has faulted");
}

}  // namespace
}  // namespace opfuse
