// Embedding opfuse in a C++ application (docs/embedding.md): compile a .fuse program through the
// kernel cache, then train its sequence for a few steps on a CUDA stream and checkpoint it.
//
//   embed_mlp PROGRAM.fuse [TOKENS] [CHECKPOINT]
//
// Without a GPU it compiles the kernels (NVRTC needs no GPU), says why it cannot run, and exits 0.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <opfuse/program.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

// Stops on a CUDA error of the application's own calls (opfuse throws its own).
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "embed_mlp: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// Device memory holding `info`'s shape of N(0, stddev) bf16 values.
void* random_tensor(const opfuse::TensorInfo& info, float stddev, std::uint32_t seed,
                    cudaStream_t stream) {
  std::vector<__nv_bfloat16> host(info.bytes / sizeof(__nv_bfloat16));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  for (auto& value : host) value = __float2bfloat16(normal(rng));
  void* device = nullptr;
  check(cudaMallocAsync(&device, info.bytes, stream), "cudaMallocAsync");
  check(cudaMemcpyAsync(device, host.data(), info.bytes, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return device;
}

// Three training steps of the program's sequence on `stream`, a checkpoint, and what it used.
void run_session(const opfuse::Program& program, cudaStream_t stream, std::int64_t tokens,
                 const std::string& checkpoint) {
  opfuse::Session session(program, "", stream);
  session.bind({{"tokens", tokens}});
  session.own_parameters(/*seed=*/0, stream);

  std::vector<void*> mine;  // the application's tensors: the input and the output gradient
  for (const opfuse::TensorInfo& info : session.tensors()) {
    if (info.kind == opfuse::TensorKind::Input || info.kind == opfuse::TensorKind::OutputGrad) {
      mine.push_back(random_tensor(info, info.kind == opfuse::TensorKind::Input ? 1.0f : 1e-3f,
                                   static_cast<std::uint32_t>(mine.size()), stream));
      session.set_tensor(info.name, mine.back());
    }
  }
  for (int step = 0; step < 3; ++step) {
    session.forward(stream);
    session.backward(stream);
    session.step(stream);  // one launch updates every FP8 quantizer
  }
  session.save(checkpoint, stream);
  const opfuse::MemoryStats memory = session.memory();
  std::printf("trained %s for 3 steps at tokens=%lld; peak %.1f MiB of activations; saved %s\n",
              session.sequence().c_str(), static_cast<long long>(tokens),
              static_cast<double>(memory.peak_bytes) / (1 << 20), checkpoint.c_str());
  for (const opfuse::QuantizerStatus& q : session.quantizers(stream)) {
    std::printf("  %-24s %s scale %.4g\n", q.name.c_str(),
                std::string(opfuse::tensor_dtype_name(q.format)).c_str(), q.scale);
  }
  for (void* pointer : mine) check(cudaFreeAsync(pointer, stream), "cudaFreeAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: embed_mlp PROGRAM.fuse [TOKENS] [CHECKPOINT]\n");
    return 2;
  }
  const std::string path = argv[1];
  const std::int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 256;
  const std::string checkpoint = argc > 3 ? argv[3] : "embed_mlp.state";
  try {
    const opfuse::Program program = opfuse::Program::compile_file(path);
    const opfuse::BuildStats& build = program.build_stats();
    std::printf("compiled %s for %s: %d kernels (%d from the cache) in %.0f ms\n", path.c_str(),
                program.arch().c_str(), build.kernels, build.cache_hits, build.compile_ms);
    std::string why;
    if (!opfuse::gpu_available(&why)) {
      std::printf("not running: %s\n", why.c_str());
      return 0;
    }

    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    // The session frees its memory on its stream when destroyed: the stream must outlive it.
    run_session(program, stream, tokens, checkpoint);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  } catch (const opfuse::CompileError& e) {
    std::fputs(e.what(), stderr);
    return 1;
  } catch (const opfuse::Error& e) {
    std::fprintf(stderr, "embed_mlp: %s\n", e.what());
    return 1;
  }
  return 0;
}
