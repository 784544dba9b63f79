// Device memory from CUDA's stream-ordered pool (docs/design.md, "GPU-less machines":
// cudaMallocAsync, no home-made allocator), and the pool's usage for "peak memory" reports.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace opfuse::gpu {

// One cudaMallocAsync allocation, freed with cudaFreeAsync on its stream when destroyed. The pool
// hands out 256-byte aligned blocks. Stream order is the caller's job: work on other streams that
// touches the buffer must be ordered after the allocating stream (and before the freeing one),
// e.g. with events; set_stream() moves the free to another stream. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` on `stream` (0 bytes: no allocation, data() is null). Throws CudaError.
  DeviceBuffer(std::size_t bytes, cudaStream_t stream);
  ~DeviceBuffer();

  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t size() const { return size_; }
  cudaStream_t stream() const { return stream_; }
  // The stream the destructor frees on.
  void set_stream(cudaStream_t stream) { stream_ = stream; }
  // Frees now (stream-ordered) and becomes empty.
  void reset() noexcept;

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  cudaStream_t stream_ = nullptr;
};

// Usage of the current device's memory pool (the one cudaMallocAsync draws from), in bytes.
struct PoolUsage {
  std::uint64_t used = 0;           // handed out to allocations now
  std::uint64_t used_high = 0;      // most ever handed out since the last reset_pool_peak()
  std::uint64_t reserved = 0;       // held by the pool from the driver now
  std::uint64_t reserved_high = 0;  // most ever held since the last reset_pool_peak()
};

PoolUsage pool_usage();
// Restarts the two high-water marks from the current usage.
void reset_pool_peak();
// Keeps freed memory in the pool instead of returning it to the driver at each synchronization
// (the default release threshold is 0), so steady-state steps allocate without driver calls.
void retain_pool_memory();

}  // namespace opfuse::gpu
