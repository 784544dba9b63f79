// A C entry point to a whole opfuse Session, loaded with ctypes by bench/peers/mlp_interleaved.py
// so that an opfuse forward and torch.compile's forward of the same MLP are timed in one process,
// on the same inputs and stream, call by call (issue 6: the large-size goals sit within the 2-3%
// that the GPU's clock and power state move from one run to the next). Built into the same
// module as gemm_shim.cpp (opfuse_gemm_shim.so). Not part of the installed runtime.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/cuda_check.h"
#include "opfuse/program.h"
#include "shim_errors.h"

namespace {

struct BenchSession {
  opfuse::Program program;
  opfuse::Session session;
};

}  // namespace

extern "C" {

// Loads a `fusec build` directory (the plan fusec built and its kernels: their compile stays out
// of the timing process; the session still JIT-compiles its quantizer-update kernel), opens its
// only sequence on `stream` and binds `size_name` = `size`; nonzero `gemm_autotune` sets
// SessionOptions::gemm_autotune (`fusec bench --gemm-autotune`). The caller gives every parameter
// (set_tensor). Returns the session, or nullptr with the reason in `error`.
void* opfuse_session_load(const char* build_dir, const char* size_name, std::int64_t size,
                          int gemm_autotune, void* stream, char* error, int error_bytes) {
  BenchSession* bench = nullptr;
  opfuse::bench::report_errors(error, error_bytes, [&] {
    opfuse::Program program = opfuse::Program::load_build(build_dir);
    opfuse::SessionOptions options;
    options.gemm_autotune = gemm_autotune != 0;
    opfuse::Session session(program, {}, static_cast<cudaStream_t>(stream), options);
    session.bind({{size_name, size}});
    bench = new BenchSession{std::move(program), std::move(session)};
  });
  return bench;
}

// Points tensor `name` (an input or a parameter) at `data`. Returns 0, or 1 with the reason.
int opfuse_session_set_tensor(void* handle, const char* name, const void* data, char* error,
                              int error_bytes) {
  return opfuse::bench::report_errors(error, error_bytes, [&] {
    static_cast<BenchSession*>(handle)->session.set_tensor(name, data);
  });
}

// Points input `input_name` at `data` and enqueues one inference forward on `stream`, as
// `fusec bench --mode fwd` times it (the FP8 weight copies are cast by the first forward and kept
// while the parameter pointers stay). Returns 0, or 1 with the reason in `error`.
int opfuse_session_forward(void* handle, const char* input_name, const void* data, void* stream,
                           char* error, int error_bytes) {
  return opfuse::bench::report_errors(error, error_bytes, [&] {
    auto* bench = static_cast<BenchSession*>(handle);
    bench->session.set_tensor(input_name, data);
    bench->session.forward(static_cast<cudaStream_t>(stream), opfuse::RunMode::Inference);
  });
}

// Runs `steps` training forwards on the inputs set last, each followed by step(): delayed
// scaling's amax histories and scales then come from the data, as after that many training
// steps (inference forwards alone never step, so their quantizers keep the initial scale of 1).
// Returns 0, or 1 with the reason in `error`.
int opfuse_session_calibrate(void* handle, int steps, void* stream, char* error, int error_bytes) {
  return opfuse::bench::report_errors(error, error_bytes, [&] {
    auto* bench = static_cast<BenchSession*>(handle);
    const auto s = static_cast<cudaStream_t>(stream);
    for (int i = 0; i < steps; ++i) {
      bench->session.forward(s, opfuse::RunMode::Training);
      bench->session.step(s);
    }
  });
}

// Copies `bytes` of output `name` of the last forward to `dst` (device memory) on `stream` and
// waits for it. Returns 0, or 1 with the reason in `error`.
int opfuse_session_copy_output(void* handle, const char* name, void* dst, std::size_t bytes,
                               void* stream, char* error, int error_bytes) {
  return opfuse::bench::report_errors(error, error_bytes, [&] {
    const void* output = static_cast<BenchSession*>(handle)->session.output(name);
    const auto s = static_cast<cudaStream_t>(stream);
    OPFUSE_CUDA_CHECK(cudaMemcpyAsync(dst, output, bytes, cudaMemcpyDeviceToDevice, s));
    OPFUSE_CUDA_CHECK(cudaStreamSynchronize(s));
  });
}

void opfuse_session_close(void* handle) { delete static_cast<BenchSession*>(handle); }

}  // extern "C"
