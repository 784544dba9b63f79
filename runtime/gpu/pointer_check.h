// What a pointer the application hands to set_tensor() is, as CUDA sees it, and whether a tensor
// of a session's device fits there (docs/embedding.md, "What is checked"). Asked once per new
// pointer (cudaPointerGetAttributes and the driver's cuMemGetAddressRange, a microsecond or
// two), never per forward.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace opfuse::gpu {

struct PointerFacts {
  enum class Kind : unsigned char { Device, Managed, PinnedHost, Unregistered };
  Kind kind = Kind::Unregistered;
  int device = -1;  // Device, Managed, PinnedHost: the GPU it belongs to
  // Bytes from the pointer to the end of the allocation holding it; empty where the driver
  // cannot tell (then only the kind and device are checked).
  std::optional<std::size_t> bytes_to_end;
};

// Throws ContextFaultError when the context has faulted (the query is the first call to see it).
PointerFacts pointer_facts(const void* pointer);

// Why `facts` cannot hold a tensor on GPU `device`: "host memory from malloc or new (...)", or
// empty when it can. `bytes` is the tensor's size, or empty before bind() knows it.
std::string pointer_problem(const PointerFacts& facts, int device,
                            std::optional<std::size_t> bytes);

}  // namespace opfuse::gpu
