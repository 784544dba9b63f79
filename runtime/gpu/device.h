// Which GPU the runtime is on, and whether there is one. Machines without a GPU or driver are a
// normal state (docs/design.md, "GPU-less machines"): gpu_available() says so without throwing.
#pragma once

#include <cstddef>
#include <string>

namespace opfuse::gpu {

// True when the CUDA runtime sees at least one GPU. Otherwise false, and `why` (when not null)
// receives a sentence for the user: "no CUDA driver: ..." where the driver library is missing or
// too old, "no GPU: ..." where the driver finds no device, or the CUDA error otherwise.
bool gpu_available(std::string* why = nullptr);

struct DeviceInfo {
  int ordinal = 0;
  std::string name;          // e.g. "NVIDIA H100 80GB HBM3"
  int major = 0, minor = 0;  // compute capability
  std::string arch;          // NVRTC target, nvrtc_arch_for(major, minor)
  int sm_count = 0;
  std::size_t total_memory_bytes = 0;
  std::size_t l2_cache_bytes = 0;
  std::size_t max_shared_memory_per_block_optin = 0;  // dynamic smem limit after opting in
};

// The NVRTC arch for a compute capability: "sm_<major><minor>a" for 9.x and 10.x (the
// arch-specific cubins that wgmma and tcgen05 need; such a cubin runs only on that exact
// capability, so 10.3 gets sm_103a, not sm_100a), plain "sm_<major><minor>" otherwise.
std::string nvrtc_arch_for(int major, int minor);

// The current device of the calling thread. Throws CudaError when there is no usable GPU.
DeviceInfo current_device();

}  // namespace opfuse::gpu
