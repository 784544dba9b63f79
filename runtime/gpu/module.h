// Loading JIT-compiled kernels and launching them through the CUDA runtime's library API
// (cudaLibraryLoadData / cudaLibraryGetKernel), never libcuda (docs/design.md, "GPU-less
// machines"). Every opfuse kernel takes one params struct by value (templates/README.md,
// "Conventions").
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <string>
#include <type_traits>

#include "jit/nvrtc_compiler.h"

namespace opfuse::gpu {

// One kernel of a loaded Module; valid while the Module lives. Cheap to copy.
class Kernel {
 public:
  cudaKernel_t handle() const { return handle_; }
  const std::string& name() const { return name_; }  // the name expression it was found by
  // Size of the kernel's single by-value parameter as the cubin records it (0: unknown).
  std::size_t params_bytes() const { return params_bytes_; }

 private:
  friend class Module;
  friend void launch(const Kernel&, dim3, dim3, std::size_t, cudaStream_t, const void*,
                     std::size_t);
  cudaKernel_t handle_ = nullptr;
  std::string name_;
  std::size_t params_bytes_ = 0;
  // The dynamic shared memory the kernel has been allowed so far (0: not set yet). Why not the
  // 48 KiB default: that bounds static plus dynamic, so a kernel with static shared memory of its
  // own (block_cast.cuh's 21 KiB) may take less dynamic memory than 48 KiB without the attribute
  // (a staged block cast, tried and dropped, failed to launch so: bench/RESULTS.md).
  mutable std::size_t dynamic_smem_limit_ = 0;
};

// A loaded cubin (or PTX, JIT-compiled by the driver at load). Move-only; unloads on destruction.
class Module {
 public:
  // Loads `compiled.binary` on the current device. Throws CudaError (e.g. a cubin for another
  // arch) naming the kernel.
  explicit Module(const jit::CompiledKernel& compiled);
  ~Module();
  Module(Module&& other) noexcept;
  Module& operator=(Module&& other) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The kernel compiled from `name_expression` (one of the request's name_expressions, e.g.
  // "opfuse::update_scales<256>"). Throws UsageError for an expression the module was not
  // compiled with, listing the ones it was.
  Kernel kernel(const std::string& name_expression) const;
  const std::string& name() const { return compiled_name_; }

 private:
  cudaLibrary_t library_ = nullptr;
  std::string compiled_name_;
  std::map<std::string, std::string> lowered_names_;
};

// Enqueues `kernel` on `stream` with `params` (the kernel's params struct, `params_bytes` long)
// passed by value. Raises the kernel's dynamic shared memory limit first when `dynamic_smem`
// exceeds 48 KiB. Throws UsageError, before launching, for an empty grid or block or when
// `params_bytes` differs from the kernel's parameter size (a host mirror out of step with its
// template); CudaError when the launch fails.
void launch(const Kernel& kernel, dim3 grid, dim3 block, std::size_t dynamic_smem,
            cudaStream_t stream, const void* params, std::size_t params_bytes);

template <typename Params>
void launch(const Kernel& kernel, dim3 grid, dim3 block, std::size_t dynamic_smem,
            cudaStream_t stream, const Params& params) {
  static_assert(std::is_trivially_copyable_v<Params>, "kernel params are copied byte for byte");
  launch(kernel, grid, block, dynamic_smem, stream, &params, sizeof(Params));
}

}  // namespace opfuse::gpu
