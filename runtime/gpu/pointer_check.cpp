#include "gpu/pointer_check.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "gpu/cuda_check.h"

namespace opfuse::gpu {
namespace {

// cuMemGetAddressRange through the runtime's driver entry point: the runtime never links libcuda
// (runtime/CMakeLists.txt), and the runtime API has no call for an allocation's extent. Null
// where the driver does not offer it.
PFN_cuMemGetAddressRange_v3020 address_range_function() {
  static const PFN_cuMemGetAddressRange_v3020 function = [] {
    void* found = nullptr;
    cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &found, 12000, cudaEnableDefault,
                                         &result) != cudaSuccess ||
        result != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return PFN_cuMemGetAddressRange_v3020{nullptr};
    }
    return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(found);
  }();
  return function;
}

}  // namespace

PointerFacts pointer_facts(const void* pointer) {
  PointerFacts facts;
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, pointer);
  // Why InvalidValue is an answer: drivers before CUDA 11 report memory they do not know so.
  if (status == cudaErrorInvalidValue) {
    (void)cudaGetLastError();
    return facts;
  }
  OPFUSE_CUDA_CHECK(status, "asking CUDA what a pointer given to set_tensor() is");
  facts.device = attributes.device;
  switch (attributes.type) {
    case cudaMemoryTypeDevice:
      facts.kind = PointerFacts::Kind::Device;
      break;
    case cudaMemoryTypeManaged:
      facts.kind = PointerFacts::Kind::Managed;
      break;
    case cudaMemoryTypeHost:
      facts.kind = PointerFacts::Kind::PinnedHost;
      return facts;
    default:
      facts.kind = PointerFacts::Kind::Unregistered;
      facts.device = -1;
      return facts;
  }
  if (const PFN_cuMemGetAddressRange_v3020 range = address_range_function(); range != nullptr) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    const auto address = reinterpret_cast<CUdeviceptr>(pointer);
    if (range(&base, &size, address) == CUDA_SUCCESS && address >= base && address - base <= size) {
      facts.bytes_to_end = static_cast<std::size_t>(base + size - address);
    }
  }
  return facts;
}

std::string pointer_problem(const PointerFacts& facts, int device,
                            std::optional<std::size_t> bytes) {
  switch (facts.kind) {
    case PointerFacts::Kind::Unregistered:
      return "not memory CUDA knows: host memory from malloc or new, or device memory already "
             "freed";
    case PointerFacts::Kind::PinnedHost:
      return "pinned host memory (cudaMallocHost or cudaHostRegister): kernels would read it "
             "over PCIe at every use";
    case PointerFacts::Kind::Device:
      if (facts.device != device) {
        return fmt::format("device memory of GPU {}, but the session runs on GPU {}", facts.device,
                           device);
      }
      break;
    case PointerFacts::Kind::Managed:
      break;
  }
  if (bytes && facts.bytes_to_end && *facts.bytes_to_end < *bytes) {
    return fmt::format("in an allocation that ends {} bytes after it, {} bytes short of the tensor",
                       *facts.bytes_to_end, *bytes - *facts.bytes_to_end);
  }
  return {};
}

}  // namespace opfuse::gpu
