#include "gpu/device.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "gpu/cuda_check.h"

namespace opfuse::gpu {

bool gpu_available(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return true;
  // Why: a failed call is also recorded as the thread's last error; later checks must not see it.
  (void)cudaGetLastError();
  if (why != nullptr) {
    if (status == cudaErrorInsufficientDriver) {
      *why =
          "no CUDA driver: the NVIDIA driver library (libcuda.so.1) is missing or older than "
          "this CUDA runtime; GPU work needs a machine with an NVIDIA GPU and a current driver";
    } else if (status == cudaErrorNoDevice || (status == cudaSuccess && count == 0)) {
      *why =
          "no GPU: the CUDA driver is installed but finds no device (check nvidia-smi and "
          "CUDA_VISIBLE_DEVICES)";
    } else {
      *why = fmt::format("no usable GPU: cudaGetDeviceCount failed with {} ({})",
                         cudaGetErrorName(status), cudaGetErrorString(status));
    }
  }
  return false;
}

std::string nvrtc_arch_for(int major, int minor) {
  const bool arch_specific = major == 9 || major == 10;
  return fmt::format("sm_{}{}{}", major, minor, arch_specific ? "a" : "");
}

DeviceInfo current_device() {
  DeviceInfo info;
  OPFUSE_CUDA_CHECK(cudaGetDevice(&info.ordinal));
  cudaDeviceProp prop{};
  OPFUSE_CUDA_CHECK(cudaGetDeviceProperties(&prop, info.ordinal));
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.arch = nvrtc_arch_for(prop.major, prop.minor);
  info.sm_count = prop.multiProcessorCount;
  info.total_memory_bytes = prop.totalGlobalMem;
  info.l2_cache_bytes = static_cast<std::size_t>(prop.l2CacheSize);
  info.max_shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  return info;
}

}  // namespace opfuse::gpu
