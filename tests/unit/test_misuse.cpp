// The embedding API's misuse checks that need no GPU (docs/embedding.md, "What is checked"): the
// sizes bind() takes (gpu/binding_check.h) with messages naming the size, the step and the .fuse
// line; plan expressions that would overflow; a misnamed sequence; what set_tensor() says about
// each kind of pointer (gpu/pointer_check.h, from the facts CUDA would report). State files:
// test_state_file.cpp. The same checks through a Session on the GPU: tests/gpu/test_misuse_gpu.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "driver/compile.h"
#include "gpu/binding_check.h"
#include "gpu/cuda_check.h"
#include "gpu/pointer_check.h"
#include "opfuse/error.h"
#include "opfuse/program.h"
#include "plan/gemm_caps.h"
#include "plan/sym_expr.h"
#include "support/diagnostics.h"
#include "test_support.h"

namespace opfuse {
namespace {

constexpr const char* kMlp = test::kSmallFp8Mlp;

class BindingCheck : public ::testing::Test {
 protected:
  void compile(const std::string& recipe) {
    DiagnosticEngine diags(sources_);
    driver::CompileOptions options;
    options.recipe = recipe;
    options.last_stage = driver::Stage::Plan;
    result_ = driver::compile_source("mlp.fuse", kMlp, sources_, diags, options);
    ASSERT_FALSE(diags.has_errors()) << diags.format_all();
  }

  // The UsageError's message for binding `sizes`, or "" when they are accepted.
  std::string error_for(const std::map<std::string, std::int64_t>& sizes) {
    try {
      (void)gpu::check_binding(result_.plan.sequences.at(0), sizes, plan::gemm_caps("sm_90a"), 132);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  }

  SourceManager sources_;
  driver::CompileResult result_;
};

TEST_F(BindingCheck, GoodSizesGiveEveryValueWithTheDevicesSmCount) {
  compile("fp8");
  const auto values = gpu::check_binding(result_.plan.sequences.at(0), {{"tokens", 4096}},
                                         plan::gemm_caps("sm_90a"), 132);
  EXPECT_EQ(values.at("tokens"), 4096);
  EXPECT_EQ(values.at(plan::kNumSmsSymbol), 132);
}

TEST_F(BindingCheck, SizesOutOfRangeNameTheSizeAndTheRange) {
  compile("fp8");
  for (const std::int64_t bad : {std::int64_t{0}, std::int64_t{-16}, std::int64_t{1} << 40,
                                 std::numeric_limits<std::int64_t>::max()}) {
    const std::string message = error_for({{"tokens", bad}});
    EXPECT_NE(message.find("'tokens' = " + std::to_string(bad)), std::string::npos) << message;
    EXPECT_NE(message.find("sizes must be from 1 to 2147483647"), std::string::npos) << message;
  }
}

TEST_F(BindingCheck, MissingAndUnknownSizesListTheSequencesSizes) {
  compile("fp8");
  std::string message = error_for({});
  EXPECT_NE(message.find("needs a size for 'tokens'"), std::string::npos) << message;
  // The sizes the caller binds, not the SM count the executor binds; and how to bind them.
  EXPECT_NE(message.find("bind every one of [tokens] ("), std::string::npos) << message;
  EXPECT_NE(message.find("--bind tokens=64"), std::string::npos) << message;
  message = error_for({{"tokens", 64}, {"tokenz", 64}});
  EXPECT_NE(message.find("has no size 'tokenz'"), std::string::npos) << message;
  message = error_for({{"tokens", 64}, {"num_sms", 64}});
  EXPECT_NE(message.find("num_sms comes from the device"), std::string::npos) << message;
}

TEST_F(BindingCheck, Fp8GemmSizesNotAMultipleOf16NameTheStepAndTheLine) {
  compile("fp8");
  const std::string message = error_for({{"tokens", 24}});
  EXPECT_NE(message.find("= 24 is not a multiple of 16, which cuBLASLt needs for FP8 GEMMs"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("mlp.fuse:"), std::string::npos) << message;
  EXPECT_EQ(error_for({{"tokens", 32}}), "");
  // BF16 GEMMs take any token count.
  compile("bf16");
  EXPECT_EQ(error_for({{"tokens", 24}}), "");
}

TEST_F(BindingCheck, TensorNamesAreTheProgramsAndAnUnknownOneListsThem) {
  compile("fp8");
  const plan::SequencePlan& plan = result_.plan.sequences.at(0);
  const auto callers = gpu::caller_tensors(plan);
  std::vector<std::string> names;
  for (const auto& [name, id] : callers) {
    names.push_back(name);
    EXPECT_EQ(gpu::caller_tensor(plan, callers, name), id);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"dy", "fc1.weight", "fc2.weight", "layernorm_0.bias",
                                             "layernorm_0.weight", "x"}));
  try {
    (void)gpu::caller_tensor(plan, callers, "fc3.weight");
    ADD_FAILURE() << "an unknown tensor was found";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("takes no tensor 'fc3.weight'"), std::string::npos) << message;
    EXPECT_NE(message.find("[dy, fc1.weight, fc2.weight"), std::string::npos) << message;
  }
}

TEST(PlanExpressions, OverflowIsAnErrorNotAWrappedSize) {
  const std::map<std::string, std::int64_t> huge = {{"tokens", std::int64_t{1} << 40}};
  EXPECT_EQ(plan::evaluate("tokens * 1024", huge), std::int64_t{1} << 50);
  EXPECT_THROW((void)plan::evaluate("tokens * 1048576 * 1024", huge), std::invalid_argument);
  EXPECT_THROW((void)plan::evaluate("99999999999999999999", {}), std::invalid_argument);
  EXPECT_EQ(plan::evaluate("ceil_div(tokens, 3)", {{"tokens", 7}}), 3);
  EXPECT_EQ(plan::evaluate("ceil_div(tokens, 3)", {{"tokens", 9}}), 3);
}

TEST(SessionMisuse, AnUnknownSequenceIsNamedBeforeTheGpuIsAskedFor) {
  CompileOptions options;
  options.arch = "sm_90a";
  const Program program = Program::compile(
      "sequence a(x: bf16[t, 64]) -> (y: bf16[t, 64]) {\n  linear(64, 64, bias = false)\n}\n"
      "sequence b(x: bf16[t, 64]) -> (y: bf16[t, 64]) {\n  linear(64, 64, bias = false)\n}\n",
      "two.fuse", options);
  for (const char* name : {"c", ""}) {
    try {
      Session session(program, name);
      ADD_FAILURE() << "sequence '" << name << "' was accepted";
    } catch (const UsageError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("a, b"), std::string::npos) << message;
      EXPECT_EQ(message.find("needs a CUDA GPU"), std::string::npos) << message;
    }
  }
}

TEST(PointerProblem, EachKindOfPointerIsSaidPlainly) {
  using Kind = gpu::PointerFacts::Kind;
  gpu::PointerFacts facts;
  facts.kind = Kind::Unregistered;
  EXPECT_NE(gpu::pointer_problem(facts, 0, 1024)
                .find("host memory from malloc or new, or device "
                      "memory already freed"),
            std::string::npos);
  facts.kind = Kind::PinnedHost;
  facts.device = 0;
  EXPECT_NE(gpu::pointer_problem(facts, 0, 1024).find("pinned host memory"), std::string::npos);
  facts.kind = Kind::Device;
  facts.device = 1;
  EXPECT_EQ(gpu::pointer_problem(facts, 0, 1024),
            "device memory of GPU 1, but the session runs on GPU 0");
  facts.device = 0;
  facts.bytes_to_end = 4096;
  EXPECT_EQ(gpu::pointer_problem(facts, 0, 4096), "");
  EXPECT_EQ(gpu::pointer_problem(facts, 0, std::nullopt), "");  // before bind(): kind only
  EXPECT_EQ(gpu::pointer_problem(facts, 0, 6144),
            "in an allocation that ends 4096 bytes after it, 2048 bytes short of the tensor");
  facts.bytes_to_end.reset();  // the driver could not tell: the kind decides
  EXPECT_EQ(gpu::pointer_problem(facts, 0, 6144), "");
  facts.kind = Kind::Managed;
  facts.device = 1;
  EXPECT_EQ(gpu::pointer_problem(facts, 0, 6144), "");
}

TEST(ErrorHierarchy, AFaultedContextIsACudaError) {
  const ContextFaultError fault("the CUDA context has faulted", "CUDA", 700);
  const CudaError& as_cuda = fault;
  EXPECT_EQ(as_cuda.code(), 700);
  EXPECT_EQ(as_cuda.library(), "CUDA");
}

// Note "Faulted context" (gpu/cuda_check.h), which needs no GPU to record and repeat a fault: in a
// child process (the record is the process's), the first fault names the call and the
// operations running (innermost first), and every later check, of any status, and
// throw_if_faulted() repeat it verbatim; errors that are not faults stay ordinary CudaErrors.
[[noreturn]] void faulted_context_child() {
  const auto fail = [](const char* why) {
    std::fprintf(stderr, "child: %s\n", why);
    std::_Exit(1);
  };
  try {  // not a fault: an ordinary CudaError, nothing recorded
    gpu::check_cuda(cudaErrorInvalidValue, "cudaMemcpyAsync(...)", "a.cpp", 1);
  } catch (const ContextFaultError&) {
    fail("an invalid value was taken for a fault");
  } catch (const CudaError&) {
  }
  gpu::throw_if_faulted();
  std::string first;
  try {
    const gpu::OperationScope outer("the forward of sequence 'mlp'");
    const gpu::OperationScope inner("step 3 (fc1 fprop)");
    gpu::check_cuda(cudaErrorIllegalAddress, "cudaLaunchKernel(...)", "run.cpp", 7,
                    "launching 'k'");
    fail("no throw");
  } catch (const ContextFaultError& e) {
    first = e.what();
  }
  const char* parts[] = {
      "the CUDA context has faulted: cudaErrorIllegalAddress",
      ("first seen by cudaLaunchKernel(...) at run.cpp:7 (launching 'k') during step 3 (fc1 "
       "fprop) of the forward of sequence 'mlp'"),
      "OPFUSE_CHECK_EACH_STEP=1", "restart the process"};
  for (const char* part : parts)
    if (first.find(part) == std::string::npos) fail(("missing: " + first).c_str());
  for (const cudaError_t later : {cudaErrorInvalidValue, cudaErrorIllegalAddress}) {
    try {
      gpu::check_cuda(later, "cudaFree(p)", "b.cpp", 2);
    } catch (const ContextFaultError& e) {
      if (first != e.what()) fail("a later check said something else");
    }
  }
  try {
    gpu::throw_if_faulted();
    fail("throw_if_faulted() let a call through");
  } catch (const ContextFaultError& e) {
    if (first != e.what()) fail("throw_if_faulted() said something else");
  }
  std::fprintf(stderr, "child: ok\n");
  std::_Exit(0);
}

TEST(FaultedContext, TheFirstFaultIsRecordedNamedAndRepeated) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(faulted_context_child(), ::testing::ExitedWithCode(0), "child: ok");
}

}  // namespace
}  // namespace opfuse
