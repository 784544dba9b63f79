// Register counts and stack sizes read from a cubin's ELF equal what ptxas -v reports, and a
// damaged cubin is an error, never a crash. Needs NVRTC, not a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "jit/cubin_info.h"
#include "jit/nvrtc_compiler.h"

namespace opfuse::jit {
namespace {

// Kernels of different sizes without a stack: registers grow with the unroll factor, and under
// -maxrregcount=32 `unrolled<64>` spills.
constexpr const char* kStacklessKernels = R"(
extern "C" __global__ void tiny(float* x) { x[threadIdx.x] = 1.0f; }

template <int N>
__global__ void unrolled(float* out, const float* in, int stride) {
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = in[threadIdx.x + i * stride];
#pragma unroll
  for (int round = 0; round < 4; ++round) {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = acc[i] * acc[(i * 7 + round) % N] + 1.0f;
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) sum += acc[i] * float(i + 1);
  out[threadIdx.x] = sum;
}
)";

// `local_array` indexes an array dynamically (a stack frame without spills); `caller` calls a
// non-inlined callee, whose frame counts in the caller's cumulative stack.
constexpr const char* kStackKernels = R"(
extern "C" __global__ void local_array(float* x, int k) {
  float values[64];
  for (int i = 0; i < 64; ++i) values[i] = x[i];
  for (int i = 0; i < 64; ++i) values[(i * k) & 63] += 1.0f;
  x[threadIdx.x] = values[k & 63];
}

__device__ __noinline__ float callee(const float* p, int n) {
  float values[32];
  for (int i = 0; i < 32; ++i) values[i] = p[i * n];
  return values[n & 31];
}
extern "C" __global__ void caller(float* x, int n) { x[threadIdx.x] = callee(x, n); }
)";

CompileRequest stackless_request() {
  CompileRequest request;
  request.kernel_name = "cubin_info_stackless";
  request.source = kStacklessKernels;
  request.name_expressions = {"tiny", "unrolled<2>", "unrolled<16>"};
  return request;
}

CompileRequest kernels_request(const std::vector<std::string>& extra_options = {}) {
  CompileRequest request;
  request.kernel_name = "cubin_info_kernels";
  request.source = std::string(kStacklessKernels) + kStackKernels;
  request.name_expressions = {"tiny",         "unrolled<2>", "unrolled<16>",
                              "unrolled<64>", "local_array", "caller"};
  request.extra_options = extra_options;
  return request;
}

// What ptxas -v said about one entry function.
struct PtxasReport {
  int registers = -1;
  int frame_bytes = -1;
  int stack_bytes = 0;  // "cumulative stack size", printed only when non-zero
  int spill_stores = -1;
};

// Splits a serial compile's log (where it is complete) at each "Compiling entry function".
std::map<std::string, PtxasReport> ptxas_reports(const std::string& log) {
  static const std::regex kEntry("Compiling entry function '([^']+)'");
  static const std::regex kRegisters("Used ([0-9]+) registers");
  static const std::regex kFrame("([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores");
  static const std::regex kStack("([0-9]+) bytes cumulative stack size");
  std::map<std::string, PtxasReport> reports;
  std::vector<std::smatch> entries(std::sregex_iterator(log.begin(), log.end(), kEntry),
                                   std::sregex_iterator());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto begin = entries[i][0].second;
    const auto end = i + 1 < entries.size() ? entries[i + 1][0].first : log.end();
    const std::string chunk(begin, end);
    PtxasReport& report = reports[entries[i][1].str()];
    std::smatch match;
    if (std::regex_search(chunk, match, kRegisters)) report.registers = std::stoi(match[1]);
    if (std::regex_search(chunk, match, kFrame)) {
      report.frame_bytes = std::stoi(match[1]);
      report.spill_stores = std::stoi(match[2]);
    }
    if (std::regex_search(chunk, match, kStack)) report.stack_bytes = std::stoi(match[1]);
  }
  return reports;
}

const CubinFunction* find_function(const CubinInfo& info, const std::string& name) {
  const auto it =
      std::find_if(info.functions.begin(), info.functions.end(),
                   [&](const CubinFunction& function) { return function.name == name; });
  return it == info.functions.end() ? nullptr : &*it;
}

void expect_cubin_matches_ptxas(const CompiledKernel& kernel) {
  const CubinInfo info = read_cubin_info(kernel.binary);
  const std::map<std::string, PtxasReport> reports = ptxas_reports(kernel.log);
  ASSERT_EQ(reports.size(), kernels_request().name_expressions.size()) << kernel.log;
  ASSERT_EQ(info.entry_functions().size(), reports.size());
  for (const auto& [name, report] : reports) {
    SCOPED_TRACE(name);
    const CubinFunction* function = find_function(info, name);
    ASSERT_NE(function, nullptr);
    EXPECT_TRUE(function->is_entry);
    EXPECT_GT(function->registers, 0);
    EXPECT_EQ(function->registers, report.registers);
    EXPECT_EQ(function->frame_bytes, report.frame_bytes);
    EXPECT_EQ(function->stack_bytes, report.stack_bytes);
  }
}

TEST(CubinInfo, RegisterCountsAndStackEqualPtxasForKernelsOfDifferentSizes) {
  const CompiledKernel kernel = compile_kernel(kernels_request());
  expect_cubin_matches_ptxas(kernel);
  const CubinInfo info = read_cubin_info(kernel.binary);
  const auto registers = [&](const std::string& expression) {
    return find_function(info, kernel.lowered_names.at(expression))->registers;
  };
  // The sizes really differ, so equality with ptxas is not a coincidence of one constant.
  EXPECT_LT(registers("tiny"), registers("unrolled<16>"));
  EXPECT_LT(registers("unrolled<2>"), registers("unrolled<16>"));
  EXPECT_GT(find_function(info, "local_array")->frame_bytes, 0);
}

TEST(CubinInfo, SpillingKernelsUnderARegisterCapStillMatchPtxas) {
  const CompiledKernel kernel = compile_kernel(kernels_request({"-maxrregcount=32"}));
  expect_cubin_matches_ptxas(kernel);
  const std::map<std::string, PtxasReport> reports = ptxas_reports(kernel.log);
  ASSERT_GT(reports.at(kernel.lowered_names.at("unrolled<64>")).spill_stores, 0) << kernel.log;
  int most_spilled = 0, largest_stack = 0;
  for (const auto& [name, report] : reports) {
    most_spilled = std::max(most_spilled, report.spill_stores);
    largest_stack = std::max(largest_stack, report.stack_bytes);
  }
  // compile_kernel's numbers: registers and stack from the cubin, spills from the complete log.
  EXPECT_EQ(kernel.registers, 32);
  EXPECT_EQ(kernel.spill_store_bytes, most_spilled);
  EXPECT_EQ(kernel.stack_bytes, largest_stack);
}

TEST(CubinInfo, CalleeIsAFunctionButNotAnEntry) {
  const CompiledKernel kernel = compile_kernel(kernels_request());
  const CubinInfo info = read_cubin_info(kernel.binary);
  std::vector<std::string> entry_names;
  for (const CubinFunction& entry : info.entry_functions()) entry_names.push_back(entry.name);
  std::vector<std::string> lowered;
  for (const auto& [expression, name] : kernel.lowered_names) lowered.push_back(name);
  std::sort(entry_names.begin(), entry_names.end());
  std::sort(lowered.begin(), lowered.end());
  EXPECT_EQ(entry_names, lowered);
  const auto callee = std::find_if(info.functions.begin(), info.functions.end(),
                                   [](const CubinFunction& f) { return !f.is_entry; });
  ASSERT_NE(callee, info.functions.end());
  EXPECT_NE(callee->name.find("callee"), std::string::npos) << callee->name;
  // The caller's cumulative stack includes the callee's frame.
  EXPECT_GT(find_function(info, "caller")->stack_bytes, 0);
}

TEST(CubinInfo, KernelUsageWithoutTheLogStillHasRegistersFromTheCubin) {
  // The parallel-build failure: ptxas -v lines missing from the NVRTC log.
  CompiledKernel stackless = compile_kernel(stackless_request());
  const int registers = stackless.registers;
  EXPECT_GT(registers, 0);
  stackless.log.clear();
  read_kernel_usage(stackless);
  EXPECT_EQ(stackless.registers, registers);
  EXPECT_EQ(stackless.stack_bytes, 0);
  EXPECT_EQ(stackless.spill_store_bytes, 0);  // no stack, nowhere to spill
  EXPECT_EQ(stackless.spill_load_bytes, 0);

  CompiledKernel with_stack = compile_kernel(kernels_request());
  ASSERT_GT(with_stack.stack_bytes, 0);
  ASSERT_EQ(ptxas_reports(with_stack.log).size(), 6u)
      << "ptxas -v lines missing: did NVRTC's cache serve this compile?\n"
      << with_stack.log;
  EXPECT_EQ(with_stack.spill_store_bytes, 0);  // complete log: the stack holds arrays, not spills
  const int stack_registers = with_stack.registers;
  with_stack.log.clear();
  read_kernel_usage(with_stack);
  EXPECT_EQ(with_stack.registers, stack_registers);
  EXPECT_EQ(with_stack.spill_store_bytes, -1);  // a stack and no log: spills unknown
  EXPECT_EQ(with_stack.spill_load_bytes, -1);
}

TEST(CubinInfo, RegisterCountIsReadFromTheRegcountRecord) {
  CompiledKernel kernel = compile_kernel(kernels_request());
  const int before = find_function(read_cubin_info(kernel.binary), "tiny")->registers;
  // Rewrite every EIATTR_REGCOUNT (format 4, attribute 0x2f, 8 bytes) naming tiny's count.
  const std::string record("\x04\x2f\x08\x00", 4);
  std::vector<char>& cubin = kernel.binary;
  int rewritten = 0;
  for (auto it = std::search(cubin.begin(), cubin.end(), record.begin(), record.end());
       it != cubin.end(); it = std::search(it + 1, cubin.end(), record.begin(), record.end())) {
    const std::size_t value = static_cast<std::size_t>(it - cubin.begin()) + 8;
    if (value + 4 <= cubin.size() && static_cast<unsigned char>(cubin[value]) == before &&
        cubin[value + 1] == 0) {
      cubin[value] = static_cast<char>(before + 100);
      ++rewritten;
    }
  }
  ASSERT_GT(rewritten, 0);
  EXPECT_EQ(find_function(read_cubin_info(cubin), "tiny")->registers, before + 100);
}

// Kernels whose parameter layout is known from C++'s rules: a 48-byte struct (a pointer, an int
// padded to 8, a long long, a pointer array, an int padded to the struct's 8-byte alignment),
// two parameters, and none at all.
constexpr const char* kParamKernels = R"(
struct Params { const float* a; int n; long long c; float* b[2]; int z; };
static_assert(sizeof(Params) == 48, "the layout the test expects");
extern "C" __global__ void by_struct(Params p) { if (p.n) p.b[0][0] = p.a[p.n] + p.c + p.z; }
struct Small { float* a; };
extern "C" __global__ void two_params(Small s, int x) { s.a[threadIdx.x] = x; }
extern "C" __global__ void no_params() {}
)";

TEST(CubinInfo, EntryParamsSizesAndOffsetsFollowTheSignature) {
  CompileRequest request;
  request.kernel_name = "cubin_info_params";
  request.source = kParamKernels;
  request.name_expressions = {"by_struct", "two_params", "no_params"};
  const CompiledKernel kernel = compile_kernel(request);
  const CubinInfo info = read_cubin_info(kernel.binary);

  const CubinFunction* by_struct = find_function(info, "by_struct");
  ASSERT_NE(by_struct, nullptr);
  EXPECT_EQ(by_struct->params_bytes, 48);
  ASSERT_EQ(by_struct->params.size(), 1u);
  EXPECT_EQ(by_struct->params[0].ordinal, 0);
  EXPECT_EQ(by_struct->params[0].offset, 0);
  EXPECT_EQ(by_struct->params[0].bytes, 48);

  const CubinFunction* two = find_function(info, "two_params");
  ASSERT_NE(two, nullptr);
  EXPECT_EQ(two->params_bytes, 12);
  ASSERT_EQ(two->params.size(), 2u);
  EXPECT_EQ(two->params[0].ordinal, 0);
  EXPECT_EQ(two->params[0].offset, 0);
  EXPECT_EQ(two->params[0].bytes, 8);
  EXPECT_EQ(two->params[1].ordinal, 1);
  EXPECT_EQ(two->params[1].offset, 8);
  EXPECT_EQ(two->params[1].bytes, 4);

  const CubinFunction* none = find_function(info, "no_params");
  ASSERT_NE(none, nullptr);
  EXPECT_TRUE(none->params.empty());
  EXPECT_LE(none->params_bytes, 0);
}

TEST(CubinInfo, CalleesHaveNoParamsRecords) {
  const CubinInfo info = read_cubin_info(compile_kernel(kernels_request()).binary);
  for (const CubinFunction& function : info.functions) {
    SCOPED_TRACE(function.name);
    if (function.is_entry) {
      EXPECT_GT(function.params_bytes, 0);  // every kernel of kernels_request takes parameters
      EXPECT_FALSE(function.params.empty());
    } else {
      EXPECT_EQ(function.params_bytes, -1);
      EXPECT_TRUE(function.params.empty());
    }
  }
}

void expect_format_error(const std::vector<char>& bytes, const std::string& message_part) {
  try {
    read_cubin_info(bytes);
    FAIL() << "expected CubinFormatError";
  } catch (const CubinFormatError& error) {
    EXPECT_NE(std::string(error.what()).find(message_part), std::string::npos) << error.what();
  }
}

std::uint64_t little_endian(const std::vector<char>& bytes, std::size_t offset, int width) {
  std::uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes.at(offset + i));
  }
  return value;
}

TEST(CubinInfo, TruncationBeforeTheSectionHeadersEndIsAFormatError) {
  const std::vector<char> cubin = compile_kernel(kernels_request()).binary;
  const CubinInfo whole = read_cubin_info(cubin);
  expect_format_error({}, "ELF header");
  expect_format_error(std::vector<char>(cubin.begin(), cubin.begin() + 63), "ELF header");
  // e_shoff + e_shnum * e_shentsize: NVRTC puts only the program headers after this table.
  const std::uint64_t table_end =
      little_endian(cubin, 0x28, 8) + little_endian(cubin, 0x3c, 2) * little_endian(cubin, 0x3a, 2);
  ASSERT_LE(table_end, cubin.size());
  for (std::size_t size = 0; size < cubin.size(); ++size) {
    SCOPED_TRACE(size);
    const std::span<const char> prefix(cubin.data(), size);
    if (size < table_end) {
      EXPECT_THROW(read_cubin_info(prefix), CubinFormatError);
    } else {
      // Program headers are not read: losing them changes nothing.
      EXPECT_EQ(read_cubin_info(prefix).functions.size(), whole.functions.size());
    }
  }
}

TEST(CubinInfo, OtherFilesAreRejectedByName) {
  std::vector<char> cubin = compile_kernel(kernels_request()).binary;
  std::vector<char> not_elf = cubin;
  not_elf[1] = 'X';
  expect_format_error(not_elf, "not an ELF file");
  std::vector<char> host_machine = cubin;
  host_machine[18] = 62;  // EM_X86_64
  host_machine[19] = 0;
  expect_format_error(host_machine, "not EM_CUDA");
  std::vector<char> big_endian = cubin;
  big_endian[5] = 2;
  expect_format_error(big_endian, "64-bit little-endian");
}

TEST(CubinInfo, BitFlippedCubinsGiveAnErrorOrAResultNeverACrash) {
  const std::vector<char> cubin = compile_kernel(kernels_request()).binary;
  std::mt19937_64 random(20240601);
  int errors = 0, parsed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<char> damaged = cubin;
    for (int flip = 0; flip <= trial % 8; ++flip) {
      damaged[random() % damaged.size()] ^= static_cast<char>(1u << (random() % 8));
    }
    // Half the trials hit the headers and tables, where damage matters most.
    if (trial % 2 == 0) damaged[random() % 64] ^= static_cast<char>(1u << (random() % 8));
    try {
      const CubinInfo info = read_cubin_info(damaged);
      ++parsed;
      for (const CubinFunction& function : info.functions) EXPECT_GE(function.registers, -1);
    } catch (const CubinFormatError&) {
      ++errors;
    }
  }
  // Both outcomes occur: flips in code bytes are harmless, flips in the tables are caught.
  EXPECT_GT(errors, 0);
  EXPECT_GT(parsed, 0);
}

}  // namespace
}  // namespace opfuse::jit
