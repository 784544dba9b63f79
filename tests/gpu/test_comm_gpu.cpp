// The NCCL communicator (runtime/comm) on real GPUs: all_reduce (sum, max), all_gather (FP8 as
// bytes too), reduce_scatter and broadcast on known data, in and out of place, in one NCCL group
// and captured in a CUDA graph, with exact expected values (sums of small integers are exact in
// bf16 and fp32). One rank on GPU 0; then, where the machine has 2 or more GPUs, 2 ranks (and 4
// where it has 4) as one process per GPU, bootstrapped through a file as a launcher's ranks are.
// Label `gpu`: skips (visibly) where no GPU is present, and the multi-rank test where fewer than
// 2 GPUs are.
//
// The ranks are separate processes started with fork + exec of this program (CUDA does not
// survive a plain fork once the parent has used it), running the disabled test
// CommGpuChild.DISABLED_Rank with the launcher's variables (OPFUSE_RANK, ...) set.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/nccl_library.h"
#include "cpu/numerics.h"
#include "gpu/device.h"
#include "gpu_test_support.h"
#include "opfuse/error.h"
#include "test_support.h"

extern char** environ;

namespace opfuse::comm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using plan::DType;
using test::DeviceArray;

// Keeps NVLink multicast off unless the caller chose otherwise (communicator.h, "NVLink
// multicast"); before the first communicator, as NCCL reads it at init.
void keep_nvls_off() { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); }

// --- host <-> device in fp32 or bf16 ------------------------------------------------------------

size_t element_bytes(DType dtype) { return static_cast<size_t>(plan::dtype_bytes(dtype)); }

std::unique_ptr<DeviceArray> device_values(const std::vector<float>& values, DType dtype) {
  auto array = std::make_unique<DeviceArray>(values.size() * element_bytes(dtype));
  if (dtype == DType::BF16) {
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = cpu::float_to_bf16(values[i]);
    test::upload_bytes(*array, bits.data(), bits.size() * 2);
  } else {
    test::upload_bytes(*array, values.data(), values.size() * 4);
  }
  return array;
}

std::vector<float> host_values(const void* device, size_t count, DType dtype) {
  std::vector<float> values(count);
  if (dtype == DType::BF16) {
    const std::vector<uint16_t> bits = test::download_bf16_bits(device, count);
    for (size_t i = 0; i < count; ++i) values[i] = cpu::bf16_to_float(bits[i]);
  } else {
    const std::vector<uint8_t> bytes = test::download_bytes(device, count * 4);
    std::memcpy(values.data(), bytes.data(), bytes.size());
  }
  return values;
}

// Expects got == expected element by element, reporting the first few differences only.
void expect_values(const std::vector<float>& got, const std::vector<float>& expected,
                   const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size() && reported < 5; ++i) {
    if (got[i] != expected[i]) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected "
                    << expected[i];
      ++reported;
    }
  }
}

void sync(cudaStream_t stream) { ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess); }

// --- the collectives on known data
// ----------------------------------------------------------------
//
// Rank r contributes (r + 1) * (i % 7 + 1) at element i: the sum over n ranks is
// n(n+1)/2 * (i % 7 + 1) <= 36 * 7 = 252 for n <= 8, an integer bf16 holds exactly; the max is
// n * (i % 7 + 1). Every rank calls the same collectives in the same order.

float contribution(int rank, size_t i) { return static_cast<float>((rank + 1) * (i % 7 + 1)); }
float reduced(int size, size_t i, ReduceOp op) {
  const int factor = op == ReduceOp::Sum ? size * (size + 1) / 2 : size;
  return static_cast<float>(factor * (i % 7 + 1));
}

void check_all_reduce(Communicator& comm, cudaStream_t stream, DType dtype, ReduceOp op) {
  constexpr size_t kCount = 1003;  // not a multiple of anything NCCL might prefer
  const int r = comm.rank(), n = comm.size();
  std::vector<float> send(kCount), expected(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    send[i] = contribution(r, i);
    expected[i] = reduced(n, i, op);
  }
  const auto in = device_values(send, dtype);
  const auto out = device_values(std::vector<float>(kCount, -1.0f), dtype);
  comm.all_reduce(in->data(), out->data(), kCount, dtype, op, stream);
  sync(stream);
  const std::string what = std::string("all_reduce ") + (op == ReduceOp::Sum ? "sum " : "max ") +
                           std::string(plan::dtype_name(dtype));
  expect_values(host_values(out->data(), kCount, dtype), expected, what);
  // In place.
  comm.all_reduce(in->data(), in->data(), kCount, dtype, op, stream);
  sync(stream);
  expect_values(host_values(in->data(), kCount, dtype), expected, what + " in place");
}

void check_all_gather(Communicator& comm, cudaStream_t stream) {
  constexpr size_t kCount = 257;
  const int r = comm.rank(), n = comm.size();
  std::vector<float> send(kCount), expected(kCount * n);
  for (size_t i = 0; i < kCount; ++i)
    send[i] = static_cast<float>(static_cast<size_t>(r) * 1000 + i);
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < kCount; ++i)
      expected[q * kCount + i] = static_cast<float>(static_cast<size_t>(q) * 1000 + i);
  }
  const auto in = device_values(send, DType::FP32);
  const auto out = device_values(std::vector<float>(kCount * n, -1.0f), DType::FP32);
  comm.all_gather(in->data(), out->data(), kCount, DType::FP32, stream);
  sync(stream);
  expect_values(host_values(out->data(), kCount * n, DType::FP32), expected, "all_gather fp32");

  // FP8 moves as bytes: every byte value, NaN codes included, arrives unchanged.
  std::vector<uint8_t> bytes(kCount), expected_bytes(kCount * n);
  for (size_t i = 0; i < kCount; ++i)
    bytes[i] = static_cast<uint8_t>(static_cast<size_t>(r) * 37 + i);
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < kCount; ++i)
      expected_bytes[q * kCount + i] = static_cast<uint8_t>(static_cast<size_t>(q) * 37 + i);
  }
  DeviceArray in8(kCount), out8(kCount * n);
  test::upload_bytes(in8, bytes.data(), kCount);
  comm.all_gather(in8.data(), out8.data(), kCount, DType::E4M3, stream);
  sync(stream);
  EXPECT_EQ(test::download_bytes(out8.data(), kCount * n), expected_bytes) << "all_gather e4m3";
}

void check_reduce_scatter(Communicator& comm, cudaStream_t stream, DType dtype, ReduceOp op) {
  constexpr size_t kRecv = 129;
  const int r = comm.rank(), n = comm.size();
  std::vector<float> send(kRecv * n), expected(kRecv);
  for (size_t j = 0; j < send.size(); ++j) send[j] = contribution(r, j);
  for (size_t i = 0; i < kRecv; ++i) expected[i] = reduced(n, r * kRecv + i, op);
  const auto in = device_values(send, dtype);
  const auto out = device_values(std::vector<float>(kRecv, -1.0f), dtype);
  comm.reduce_scatter(in->data(), out->data(), kRecv, dtype, op, stream);
  sync(stream);
  expect_values(host_values(out->data(), kRecv, dtype), expected,
                std::string("reduce_scatter ") + std::string(plan::dtype_name(dtype)));
}

void check_broadcast(Communicator& comm, cudaStream_t stream, DType dtype) {
  constexpr size_t kCount = 300;
  const int r = comm.rank(), n = comm.size(), root = n - 1;
  std::vector<float> send(kCount), expected(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    send[i] = r == root ? static_cast<float>(i % 100) + 0.5f : -2.0f;
    expected[i] = static_cast<float>(i % 100) + 0.5f;
  }
  const auto in = device_values(send, dtype);
  const auto out = device_values(std::vector<float>(kCount, -1.0f), dtype);
  comm.broadcast(in->data(), out->data(), kCount, dtype, root, stream);
  sync(stream);
  expect_values(host_values(out->data(), kCount, dtype), expected,
                std::string("broadcast ") + std::string(plan::dtype_name(dtype)));
}

// An all_reduce and an all_gather in one NCCL group.
void check_group(Communicator& comm, cudaStream_t stream) {
  constexpr size_t kCount = 64;
  const int r = comm.rank(), n = comm.size();
  std::vector<float> send(kCount), sum(kCount), gathered(kCount * n);
  for (size_t i = 0; i < kCount; ++i) {
    send[i] = contribution(r, i);
    sum[i] = reduced(n, i, ReduceOp::Sum);
  }
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < kCount; ++i) gathered[q * kCount + i] = contribution(q, i);
  }
  const auto in = device_values(send, DType::FP32);
  const auto reduced_out = device_values(std::vector<float>(kCount, -1.0f), DType::FP32);
  const auto gathered_out = device_values(std::vector<float>(kCount * n, -1.0f), DType::FP32);
  {
    GroupScope group(comm);
    comm.all_reduce(in->data(), reduced_out->data(), kCount, DType::FP32, ReduceOp::Sum, stream);
    comm.all_gather(in->data(), gathered_out->data(), kCount, DType::FP32, stream);
    group.end();
  }
  sync(stream);
  expect_values(host_values(reduced_out->data(), kCount, DType::FP32), sum, "grouped all_reduce");
  expect_values(host_values(gathered_out->data(), kCount * n, DType::FP32), gathered,
                "grouped all_gather");
}

// An all_reduce captured in a CUDA graph, the graph launched twice on new inputs.
void check_graph_capture(Communicator& comm, cudaStream_t stream) {
  constexpr size_t kCount = 512;
  const int r = comm.rank(), n = comm.size();
  std::vector<float> send(kCount, 0.0f);
  const auto in = device_values(send, DType::BF16);
  const auto out = device_values(std::vector<float>(kCount, -1.0f), DType::BF16);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  comm.all_reduce(in->data(), out->data(), kCount, DType::BF16, ReduceOp::Sum, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int launch = 1; launch <= 2; ++launch) {
    std::vector<float> expected(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      send[i] = contribution(r, i) * static_cast<float>(launch);
      expected[i] = reduced(n, i, ReduceOp::Sum) * static_cast<float>(launch);
    }
    const auto fresh = device_values(send, DType::BF16);
    ASSERT_EQ(cudaMemcpy(in->data(), fresh->data(), kCount * 2, cudaMemcpyDeviceToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    sync(stream);
    expect_values(host_values(out->data(), kCount, DType::BF16), expected,
                  "graph-captured all_reduce, launch " + std::to_string(launch));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Everything above, then the checks made before NCCL is called.
void run_collectives(Communicator& comm, cudaStream_t stream) {
  SCOPED_TRACE("rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()));
  for (const DType dtype : {DType::FP32, DType::BF16}) {
    for (const ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      check_all_reduce(comm, stream, dtype, op);
      check_reduce_scatter(comm, stream, dtype, op);
    }
    check_broadcast(comm, stream, dtype);
  }
  check_all_gather(comm, stream);
  check_group(comm, stream);
  check_graph_capture(comm, stream);

  // A zero count is no call at all (null pointers are fine); FP8 reductions and a bad root are
  // refused before NCCL sees them, on every rank alike.
  comm.all_reduce(nullptr, nullptr, 0, DType::FP32, ReduceOp::Sum, stream);
  comm.all_gather(nullptr, nullptr, 0, DType::BF16, stream);
  comm.reduce_scatter(nullptr, nullptr, 0, DType::FP32, ReduceOp::Max, stream);
  comm.broadcast(nullptr, nullptr, 0, DType::FP32, 0, stream);
  DeviceArray scratch(256);
  EXPECT_THROW(
      comm.all_reduce(scratch.data(), scratch.data(), 16, DType::E4M3, ReduceOp::Sum, stream),
      UsageError);
  EXPECT_THROW(
      comm.reduce_scatter(scratch.data(), scratch.data(), 16, DType::E5M2, ReduceOp::Max, stream),
      UsageError);
  EXPECT_THROW(comm.broadcast(scratch.data(), scratch.data(), 16, DType::FP32, comm.size(), stream),
               UsageError);
  sync(stream);
  EXPECT_NO_THROW(comm.check_async());
}

// --- one rank
// --------------------------------------------------------------------------------------

class CommGpuTest : public test::GpuStreamTest {
 protected:
  void SetUp() override {
    keep_nvls_off();
    test::GpuStreamTest::SetUp();
  }
};

TEST_F(CommGpuTest, OneRankCollectivesGiveExactValues) {
  const NcclLibrary& nccl = nccl_library();
  std::printf("NCCL %s from %s\n", nccl_version_text(nccl.version).c_str(), nccl.path.c_str());
  Communicator comm(new_unique_id(), 0, 1);
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  run_collectives(comm, stream_);
}

TEST_F(CommGpuTest, BadRankIsAUsageError) {
  EXPECT_THROW(Communicator(UniqueId{}, 1, 1), UsageError);
  EXPECT_THROW(Communicator(UniqueId{}, 0, 0), UsageError);
}

// --- several ranks: one process per GPU
// -----------------------------------------------------------

// One rank of a multi-rank run, in a process of its own (see the top of this file): reads the
// launcher's variables, bootstraps, runs the collectives. Failures make the process exit nonzero.
TEST(CommGpuChild, DISABLED_Rank) {
  keep_nvls_off();
  const std::optional<LaunchEnv> env = launch_env_from_environment();
  ASSERT_TRUE(env.has_value()) << "run by CommGpuMultiRank only, which sets OPFUSE_WORLD_SIZE";
  ASSERT_EQ(cudaSetDevice(env->local_device), cudaSuccess);
  const UniqueId id = exchange_unique_id(env->dir, env->job, env->rank, env->size, 60s);
  Communicator comm(id, env->rank, env->size);
  if (env->rank == 0) remove_unique_id_file(env->dir, env->job);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  run_collectives(comm, stream);
  cudaStreamDestroy(stream);
}

TEST(CommGpuMultiRank, OneProcessPerGpu) {
  std::string why;
  if (!gpu::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "needs 2 GPUs for a multi-rank run; this machine has " << count;
  for (const int size : {2, 4}) {
    if (size > count) break;
    const std::string dir = test::make_temp_dir("comm_gpu");
    const std::string job = "comm-gpu-" + std::to_string(::getpid()) + "-" + std::to_string(size);
    test::run_ranks(size, "CommGpuChild.DISABLED_Rank", dir, job, {}, 120s);
    EXPECT_FALSE(fs::exists(unique_id_file(dir, job))) << "rank 0 removes the id file";
  }
}

}  // namespace
}  // namespace opfuse::comm
