#include "gpu/module.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>
#include <vector>

#include "gpu/cuda_check.h"
#include "opfuse/error.h"

namespace opfuse::gpu {

Module::Module(const jit::CompiledKernel& compiled)
    : compiled_name_(compiled.kernel_name), lowered_names_(compiled.lowered_names) {
  if (compiled.binary.empty()) {
    throw UsageError(
        fmt::format("kernel '{}' has no binary to load: compile it first", compiled.kernel_name));
  }
  OPFUSE_CUDA_CHECK(
      cudaLibraryLoadData(&library_, compiled.binary.data(), nullptr, nullptr, 0, nullptr, nullptr,
                          0),
      fmt::format("loading kernel '{}' built for {}", compiled.kernel_name, compiled.arch));
}

Module::~Module() {
  // Why the error is dropped: destructors must not throw, and at process exit the runtime may
  // already have unloaded everything.
  if (library_ != nullptr && cudaLibraryUnload(library_) != cudaSuccess) (void)cudaGetLastError();
}

Module::Module(Module&& other) noexcept
    : library_(std::exchange(other.library_, nullptr)),
      compiled_name_(std::move(other.compiled_name_)),
      lowered_names_(std::move(other.lowered_names_)) {}

Module& Module::operator=(Module&& other) noexcept {
  if (this != &other) {
    if (library_ != nullptr && cudaLibraryUnload(library_) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    library_ = std::exchange(other.library_, nullptr);
    compiled_name_ = std::move(other.compiled_name_);
    lowered_names_ = std::move(other.lowered_names_);
  }
  return *this;
}

Kernel Module::kernel(const std::string& name_expression) const {
  const auto found = lowered_names_.find(name_expression);
  if (found == lowered_names_.end()) {
    std::vector<std::string> known;
    for (const auto& [expression, lowered] : lowered_names_) known.push_back(expression);
    throw UsageError(fmt::format(
        "kernel module '{}' has no kernel '{}': it was compiled with the name expressions [{}]; "
        "add this expression to the compile request",
        compiled_name_, name_expression, fmt::join(known, ", ")));
  }
  Kernel kernel;
  kernel.name_ = name_expression;
  OPFUSE_CUDA_CHECK(cudaLibraryGetKernel(&kernel.handle_, library_, found->second.c_str()),
                    fmt::format("kernel '{}' of module '{}'", name_expression, compiled_name_));
  // Why: the cubin records each parameter's size, so a host params struct that has drifted from
  // its template is caught here instead of as garbage on the GPU. Unknown (0) if not recorded.
  std::size_t offset = 0, size = 0;
  const auto* function = reinterpret_cast<const void*>(kernel.handle_);
  if (cudaFuncGetParamInfo(function, 0, &offset, &size) == cudaSuccess) {
    kernel.params_bytes_ = size;
  } else {
    (void)cudaGetLastError();
  }
  return kernel;
}

void launch(const Kernel& kernel, dim3 grid, dim3 block, std::size_t dynamic_smem,
            cudaStream_t stream, const void* params, std::size_t params_bytes) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) {
    throw UsageError(fmt::format(
        "launch of '{}' with an empty grid ({}, {}, {}) or block ({}, {}, {}): skip the launch "
        "when there is no work",
        kernel.name(), grid.x, grid.y, grid.z, block.x, block.y, block.z));
  }
  if (kernel.params_bytes() != 0 && kernel.params_bytes() != params_bytes) {
    throw UsageError(fmt::format(
        "launch of '{}' with a {}-byte params struct, but the kernel takes {} bytes: the host "
        "mirror of its params struct is out of step with the template (templates/README.md)",
        kernel.name(), params_bytes, kernel.params_bytes()));
  }
  const auto* function = reinterpret_cast<const void*>(kernel.handle());
  if (dynamic_smem > kernel.dynamic_smem_limit_) {
    OPFUSE_CUDA_CHECK(cudaFuncSetAttribute(function, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(dynamic_smem)),
                      fmt::format("allowing {} bytes of dynamic shared memory for '{}'",
                                  dynamic_smem, kernel.name()));
    kernel.dynamic_smem_limit_ = dynamic_smem;
  }
  // Why const_cast: cudaLaunchKernel takes void** but only reads the argument bytes.
  void* args[] = {const_cast<void*>(params)};
  OPFUSE_CUDA_CHECK(
      cudaLaunchKernel(function, grid, block, args, dynamic_smem, stream),
      fmt::format("launching '{}' with grid ({}, {}, {}), block ({}, {}, {}), {} bytes of dynamic "
                  "shared memory",
                  kernel.name(), grid.x, grid.y, grid.z, block.x, block.y, block.z, dynamic_smem));
}

}  // namespace opfuse::gpu
